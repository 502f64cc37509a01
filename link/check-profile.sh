#!/bin/sh
# How many functions a release build compiled without their part of link/carapace.profdata
# because their code changed since the profile was taken (the compiler warns "function control
# flow change detected (hash mismatch)" for each), from the build's log; and whether that is at
# most MAX (default: report only). Such a function is optimised as without a profile: the
# build is correct, only slower where the changed code is hot. Regenerate with
# `python3 bench/pgo.py`.
#
#   cargo build --release --bin carapace 2>&1 | tee build.log
#   link/check-profile.sh build.log [MAX]
set -eu
log=$1
max=${2:-}
changed=$(grep -c 'hash mismatch' "$log" || true)
echo "profile: $changed functions changed since link/carapace.profdata was taken"
if [ -n "$max" ] && [ "$changed" -gt "$max" ]; then
  echo "profile: over $max: regenerate link/carapace.profdata (python3 bench/pgo.py)" >&2
  exit 1
fi
