#!/usr/bin/env bash
# Lint docker/Dockerfile, build the image with podman, and inspect it: user, entrypoint,
# command, size, no shell, and the binary runs as the non-root user inside the image's own
# file system (chroot; no container is started).
#
#   docker/check-image.sh            # bases from docker/local-bases.sh
#   BASES=registry docker/check-image.sh   # the Dockerfile's default bases
set -euo pipefail
cd "$(dirname "$0")/.."

image=localhost/carapace:check
max_mb=${MAX_IMAGE_MB:-60}

echo "== hadolint"
hadolint docker/Dockerfile

# The function order (link/hot-symbols.txt) must match the image's binary: a stale one costs
# several MB of resident code and nothing else would show it. Likewise the profile
# (link/carapace.profdata): a function changed since it was taken is optimised without it, and
# a crate whose hash changed (a dependency added, say) gets none of it.
args=(--build-arg SYMBOL_ORDER_MIN=90 --build-arg PROFILE_CHANGED_MAX=100)
if [ "${BASES:-local}" = local ]; then
  bash docker/local-bases.sh
  args+=(--build-arg RUST_IMAGE=localhost/carapace-rust-base
         --build-arg RUNTIME_IMAGE=localhost/carapace-runtime-base)
fi

fail() { echo "image check failed: $*" >&2; exit 1; }

echo "== podman build"
log=$(mktemp)
if ! podman build --isolation chroot -f docker/Dockerfile "${args[@]}" -t "$image" . >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  rm -f "$log"
  fail "podman build"
fi
grep -E '^(function order|profile):' "$log" || true
rm -f "$log"

user=$(podman image inspect --format '{{.Config.User}}' "$image")
entrypoint=$(podman image inspect --format '{{json .Config.Entrypoint}}' "$image")
cmd=$(podman image inspect --format '{{json .Config.Cmd}}' "$image")
size=$(podman image inspect --format '{{.Size}}' "$image")
mb=$(( size / 1000000 ))
echo "user=$user entrypoint=$entrypoint cmd=$cmd size=${mb}MB"
[ "$user" = "65532:65532" ] || fail "runs as '$user', not 65532:65532"
[ "$entrypoint" = '["/usr/local/bin/carapace"]' ] || fail "entrypoint $entrypoint"
[ "$cmd" = '["serve","--config","/etc/carapace/carapace.yaml"]' ] || fail "command $cmd"
[ "$mb" -le "$max_mb" ] || fail "${mb} MB is over ${max_mb} MB"

root=$(podman image mount "$image")
trap 'podman image unmount "$image" >/dev/null || true' EXIT
for sh in bin/sh bin/bash usr/bin/sh usr/bin/bash bin/dash usr/bin/dash bin/busybox; do
  [ ! -e "$root/$sh" ] || fail "the image has a shell: /$sh"
done
for tool in apt-get dpkg; do
  [ -z "$(find "$root" -name "$tool" -type f 2>/dev/null)" ] || fail "the image has $tool"
done
[ -x "$root/usr/local/bin/carapace" ] || fail "no /usr/local/bin/carapace"
[ "$(stat -c %u "$root/usr/local/bin/carapace")" = 0 ] || fail "the binary is writable by its user"
# A new volume mounted at the state directory starts as the image's: the user's, or carapace
# cannot make its state directory there.
[ "$(stat -c %u:%g "$root/var/lib/carapace")" = 65532:65532 ] || fail "/var/lib/carapace is not 65532's"
# The binary runs with the image's own libraries, as the image's user.
chroot --userspec=65532:65532 "$root" /usr/local/bin/carapace config-schema \
  | python3 -c 'import json,sys; s=json.load(sys.stdin); assert "shared_state" in s["properties"], s.keys()' \
  || fail "carapace does not run inside the image"
echo "image ok: ${mb} MB, user 65532, no shell"
