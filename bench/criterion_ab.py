#!/usr/bin/env python3
"""Two builds of one criterion benchmark, run interleaved on one core: the before/after table
of every benchmark both builds have.

    cargo bench -p carapace-filters --bench filters --no-run      # in each checkout
    python3 bench/criterion_ab.py BEFORE_BIN AFTER_BIN [--rounds 2] [--core 1] [--filter F]

Each round runs the before binary, then the after one (`--bench --noplot`, criterion's own
warm-up and sampling), pinned with `taskset` to `--core`. A benchmark's figure per build is the
median over the rounds of criterion's point estimate; the table also shows each round's
estimate, so the spread between rounds is in view. The two binaries must be built with the
same profile settings (e.g. `CARGO_PROFILE_BENCH_DEBUG=false` for both) for the comparison to
be of the code.
"""

import argparse
import re
import statistics
import subprocess

UNITS = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}
# criterion prints the benchmark's id on its own line (or before the figures when it is
# short), then `time:   [low estimate high]`.
TIME = re.compile(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]")


def run(binary, core, filt):
    """{benchmark id: estimate in ns} of one run of `binary`."""
    cmd = ["taskset", "-c", str(core), binary, "--bench", "--noplot"]
    if filt:
        cmd.append(filt)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    found, last_id = {}, None
    for line in out.splitlines():
        m = TIME.search(line)
        if m:
            head = line[: m.start()].strip()
            name = head or last_id
            found[name] = float(m.group(1)) * UNITS[m.group(2)]
            last_id = None
        elif line.strip() and not line.startswith((" ", "Benchmarking", "Found", "Gnuplot",
                                                   "WARNING")):
            last_id = line.strip()
    return found


def fmt(ns):
    return f"{ns / 1e3:.2f} µs" if ns >= 1e3 else f"{ns:.1f} ns"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--core", type=int, default=1)
    ap.add_argument("--filter", help="only benchmarks whose id matches this regular "
                    "expression (criterion's filter)")
    args = ap.parse_args()
    rounds = {"before": [], "after": []}
    for _ in range(args.rounds):
        for which in ("before", "after"):
            rounds[which].append(run(getattr(args, which), args.core, args.filter))
    every = rounds["before"] + rounds["after"]
    common = [n for n in rounds["after"][0] if all(n in r for r in every)]
    print("| benchmark | before (rounds) | after (rounds) | after / before |")
    print("|---|---:|---:|---:|")
    for name in common:
        b = [r[name] for r in rounds["before"]]
        a = [r[name] for r in rounds["after"]]
        mb, ma = statistics.median(b), statistics.median(a)
        print(f"| {name} | {fmt(mb)} ({', '.join(fmt(x) for x in b)}) | {fmt(ma)} "
              f"({', '.join(fmt(x) for x in a)}) | {ma / mb:.3f} |")
    only = sorted(set(rounds["after"][0]) - set(common))
    if only:
        print(f"\nOnly in the after build: {', '.join(only)}")


if __name__ == "__main__":
    main()
