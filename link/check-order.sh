#!/bin/sh
# How many of the functions link/hot-symbols.txt orders a carapace binary has, and whether
# that is at least MIN percent (default 0: report only). The names carry their crates' hashes,
# which change with the toolchain, the dependencies and their features; an order that no
# longer matches leaves the binary's hot code spread over its text (more of it resident).
# Regenerate with `python3 bench/symbol_order.py`.
#
#   link/check-order.sh target/release/carapace [MIN]
set -eu
bin=$1
min=${2:-0}
order=$(dirname "$0")/hot-symbols.txt
have=$(mktemp)
trap 'rm -f "$have"' EXIT
nm --defined-only "$bin" | awk 'NF == 3 { print $3 }' | LC_ALL=C sort -u > "$have"
total=$(grep -c . "$order")
found=$(LC_ALL=C sort -u "$order" | LC_ALL=C comm -12 - "$have" | wc -l)
echo "function order: $found of the $total ordered symbols are in $bin ($((found * 100 / total))%)"
if [ $((found * 100)) -lt $((total * min)) ]; then
  echo "function order: under $min%: regenerate link/hot-symbols.txt (python3 bench/symbol_order.py)" >&2
  exit 1
fi
