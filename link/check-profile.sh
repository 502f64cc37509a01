#!/bin/sh
# Whether a release build was optimised with link/carapace.profdata, in two counts, and whether
# they are within bounds (MAX empty: report only):
#
# - crates: the profile names each function by its crate's compiler hash, which changes with
#   the crate's dependencies, features and the toolchain. A crate whose hash changed since the
#   profile was taken gets none of it, and the compiler says nothing. link/profile-crates.txt
#   (written with the profile) lists the crates the profile was taken from, as their code units
#   are named (crate.hash-cgu.N); each must be among the binary's own (its debug information
#   names them). Any missing fails when MAX is given.
# - changed functions: a function whose code changed since the profile was taken is compiled
#   without its part (the compiler warns "function control flow change detected (hash
#   mismatch)" for each, counted from the build's log); at most MAX.
#
# Either way the build is correct, only slower where the code is hot. Regenerate with
# `python3 bench/pgo.py`, then `python3 bench/symbol_order.py`.
#
#   cargo build --release --bin carapace 2>&1 | tee build.log
#   link/check-profile.sh build.log target/release/carapace [MAX]
set -eu
log=$1
bin=$2
max=${3:-}
crates=$(dirname "$0")/profile-crates.txt
have=$(mktemp)
trap 'rm -f "$have"' EXIT
readelf --debug-dump=info "$bin" 2>/dev/null \
  | grep -o '[A-Za-z0-9_]*\.[0-9a-z]*-cgu\.[0-9]*' | LC_ALL=C sort -u > "$have"
if [ ! -s "$have" ]; then
  echo "profile: $bin names no code units (no debug information, or no readelf)" >&2
fi
total=$(grep -c . "$crates")
missing=$(LC_ALL=C sort -u "$crates" | LC_ALL=C comm -23 - "$have")
lost=$(printf '%s' "$missing" | grep -c . || true)
echo "profile: $((total - lost)) of the $total crates it was taken from are in $bin"
for unit in $missing; do
  echo "profile: ${unit%%.*} ($unit) is not this build's (another hash, or not linked): it gets none of the profile"
done
changed=$(grep -c 'hash mismatch' "$log" || true)
echo "profile: $changed functions changed since link/carapace.profdata was taken"
if [ -n "$max" ] && { [ -n "$missing" ] || [ "$changed" -gt "$max" ]; }; then
  echo "profile: does not match this build: regenerate link/carapace.profdata (python3 bench/pgo.py)" >&2
  exit 1
fi
