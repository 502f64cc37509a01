#!/usr/bin/env bash
# Run every fuzz target for SECONDS (default 30) on a copy of its seed corpus, so that the
# checkout is never written to. Installs the nightly toolchain and cargo-fuzz when missing.
# A crash (or leak, timeout, out-of-memory) fails the run; the input is kept under
# fuzz/artifacts/<target>/ and printed.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#   fuzz/run.sh --build              # install the tools and build every target, run none
#
# FUZZ_JOBS=N runs N targets at a time (default 1), each for SECONDS on a core of its own:
# give it no more than the cores that are free.
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=false
if [ "${1:-}" = --build ]; then
  build_only=true
  shift
fi
seconds=${1:-30}
jobs=${FUZZ_JOBS:-1}
# No sanitizer by default: carapace is safe Rust, and the coverage-guided search is what finds
# its bugs (panics, hangs, memory growth); FUZZ_SANITIZER=address adds ASan for a deeper run.
sanitizer=${FUZZ_SANITIZER:-none}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  # One line per target: the target's file is fuzz/fuzz_targets/<name>.rs, its seeds
  # fuzz/corpus/<name>/.
  targets=(
    tools_v1_request
    skill_v1_request
    canonical_hmac
    pairing_wire
    peer_store
    config
    app_responses
    mcp_request
    mcp_stdio_framing
    mcp_response
    bearer_token
    www_authenticate
    http_signature
    secret_guard
    eat_catalog
    eat_jws
    eat_openapi
    caller_tools
    receipt
    app_answer
  )
fi

if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

cargo +nightly fuzz build -s "$sanitizer"
if $build_only; then
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One target: its report goes to $work/<target>.report, printed in the targets' order below.
fuzz_one() {
  local t=$1 report="$work/$1.report"
  echo "== fuzz $t (${seconds}s)" >"$report"
  if ! mkdir -p "$work/$t" || ! cp -r "fuzz/corpus/$t/." "$work/$t/" 2>>"$report"; then
    echo "fuzz target $t: no seed corpus fuzz/corpus/$t/" >>"$report"
    return 1
  fi
  # -print_final_stats gives the executions per second; the summary line is kept.
  if ! cargo +nightly fuzz run -s "$sanitizer" "$t" "$work/$t" -- -max_total_time="$seconds" \
      -rss_limit_mb=2048 -print_final_stats=1 >"$work/$t.log" 2>&1; then
    tail -n 60 "$work/$t.log" >>"$report"
    echo "fuzz target $t failed (input under fuzz/artifacts/$t/)" >>"$report"
    return 1
  fi
  grep -E '^(Done|stat::number_of_executed_units|stat::average_exec_per_sec)' "$work/$t.log" \
    >>"$report" || true
  echo "corpus: $(find "$work/$t" -type f | wc -l) files" >>"$report"
}
export -f fuzz_one
export work seconds sanitizer

status=0
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'fuzz_one "$1"' _ {} || status=1
for t in "${targets[@]}"; do
  cat "$work/$t.report" 2>/dev/null || echo "== fuzz $t: not run"
done
[ "$status" = 0 ] || { echo "fuzzing failed" >&2; exit 1; }
