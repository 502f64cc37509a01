#!/usr/bin/env bash
# Make the two base images docker/Dockerfile names, from Debian packages, for a machine that
# reaches Debian's package archive but no container registry:
#
#   localhost/carapace-runtime-base  what distroless/cc is: glibc, libgcc, CA certificates,
#                                    passwd/group with "nonroot" (65532), no shell, no apt
#   localhost/carapace-rust-base     Debian (minbase) with gcc, this machine's Rust toolchain
#                                    at /usr/local/rust (CARGO_HOME /usr/local/cargo) and its
#                                    CA bundle (cargo reaches crates.io as this machine does)
#
# Then: podman build --isolation chroot -f docker/Dockerfile \
#         --build-arg RUST_IMAGE=localhost/carapace-rust-base \
#         --build-arg RUNTIME_IMAGE=localhost/carapace-runtime-base -t carapace .
#
# Needs root, podman, debootstrap and dpkg-deb. The Debian mirror is the one apt uses here.
set -euo pipefail

suite=bookworm
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mirror=$(apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages' 2>/dev/null \
  | grep -v -- '-security' | grep -m1 '/debian/$' || true)
if [ -z "$mirror" ]; then
  echo "cannot tell the Debian mirror apt uses" >&2
  exit 1
fi

# --- runtime base ------------------------------------------------------------------------
if ! podman image exists localhost/carapace-runtime-base; then
  echo "== runtime base from Debian packages"
  mkdir -p "$work/debs" "$work/runtime"
  (cd "$work/debs" && apt-get download libc6 libgcc-s1 ca-certificates netbase tzdata >/dev/null)
  for deb in "$work"/debs/*.deb; do
    dpkg-deb -x "$deb" "$work/runtime"
  done
  r="$work/runtime"
  # ca-certificates ships the certificates; the bundle is normally made by its postinst.
  mkdir -p "$r/etc/ssl/certs"
  find "$r/usr/share/ca-certificates" -name '*.crt' -print0 | sort -z | xargs -0 cat \
    > "$r/etc/ssl/certs/ca-certificates.crt"
  # Only what a dynamically linked program needs: no shell, no package manager, no docs.
  rm -rf "$r/usr/share/doc" "$r/usr/share/man" "$r/usr/share/lintian" "$r/usr/share/locale" \
    "$r/usr/sbin" "$r/sbin" "$r/usr/bin" "$r/bin" "$r/usr/libexec" \
    "$r/usr/lib/x86_64-linux-gnu/gconv" "$r/usr/share/ca-certificates" \
    "$r/usr/share/zoneinfo/right" "$r/usr/share/zoneinfo/posix"
  mkdir -p "$r/tmp" "$r/home/nonroot" "$r/var/lib/carapace" "$r/etc/carapace"
  chmod 1777 "$r/tmp"
  chown 65532:65532 "$r/home/nonroot" "$r/var/lib/carapace"
  chmod 0700 "$r/var/lib/carapace"
  cat > "$r/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
  cat > "$r/etc/group" <<'GROUP'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
GROUP
  echo 'hosts: files dns' > "$r/etc/nsswitch.conf"
  tar --numeric-owner -C "$r" -cf - . | podman import \
    --change 'USER=65532:65532' --change 'WORKDIR=/home/nonroot' \
    --change 'ENV=SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
    - localhost/carapace-runtime-base >/dev/null
fi

# --- builder base ------------------------------------------------------------------------
if ! podman image exists localhost/carapace-rust-base; then
  echo "== builder base: debootstrap $suite and this machine's Rust toolchain"
  b="$work/builder"
  debootstrap --variant=minbase --include=gcc,libc6-dev,binutils,ca-certificates \
    "$suite" "$b" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  sysroot=$(rustc --print sysroot)
  mkdir -p "$b/usr/local/rust" "$b/usr/local/cargo"
  for part in bin lib libexec; do
    if [ -d "$sysroot/$part" ]; then
      cp -a "$sysroot/$part" "$b/usr/local/rust/"
    fi
  done
  rm -rf "$b/var/cache/apt/archives"/*.deb "$b/usr/share/doc" "$b/usr/share/man"
  # cargo fetches crates as this machine does, so it trusts the CAs this machine trusts.
  cp /etc/ssl/certs/ca-certificates.crt "$b/etc/ssl/certs/ca-certificates.crt"
  tar --numeric-owner -C "$b" -cf - . | podman import \
    --change 'ENV=PATH=/usr/local/rust/bin:/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV=CARGO_HOME=/usr/local/cargo' \
    - localhost/carapace-rust-base >/dev/null
fi

podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep carapace- || true
