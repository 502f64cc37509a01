#!/usr/bin/env python3
"""Write link/hot-symbols.txt: the functions of the release binary that carapace's start-up
and request paths run, hottest first. build.rs hands the file to the LLVM linker
(`--symbol-ordering-file`), which lays those functions out next to each other, so that the
code pages carapace keeps resident are few (idle RSS: the kernel maps a file's pages around
each one touched, so code spread over the whole text is resident almost whole).

Each carapace target of the benchmark (full stack, forwarding, MCP front, full stack with the
ledger) is started under valgrind's callgrind from its first instruction, warmed up as
bench/compare.py does (20 requests/s for a second), and stopped; every function it ran that is
a symbol of the binary is kept, ordered by the instructions it ran. Regenerate after a change
of toolchain or dependencies (symbol names carry their crate's hash); `--check` says how many
of the file's symbols a binary still has.

    python3 bench/symbol_order.py            # needs target/release/carapace and loadgen
    python3 bench/symbol_order.py --check target/release/carapace
"""

import argparse
import collections
import glob
import os
import re
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as c  # noqa: E402

ORDER = os.path.join(c.ROOT, "link", "hot-symbols.txt")
TARGETS = ["carapace-full", "carapace-fwd", "carapace-mcp", "carapace-ledger"]
LINE = re.compile(r"\s*([\d,]+) \([ \d.]+%\)\s+\S*?:(\S+)(?: \[(.*)\])?\s*$")


def symbols(binary):
    """The text symbols of `binary`, as the linker names them."""
    out = subprocess.run(["nm", binary], capture_output=True, text=True, check=True).stdout
    return {p[2] for p in (line.split() for line in out.splitlines())
            if len(p) == 3 and p[1] in "tTwW"}


def profile(name, port):
    """{symbol: instructions} of target `name` from start-up through its warm-up."""
    out = c.p(f"order.{name}.callgrind")
    for f in glob.glob(out + "*"):
        os.remove(f)
    cmd = ["valgrind", "--tool=callgrind", "--demangle=no", f"--callgrind-out-file={out}",
           c.CARAPACE, "serve", "-c", c.p(name, "carapace.yaml")]
    proc = c.start(f"order-{name}", cmd)
    try:
        c.wait_port(port, proc, name, timeout=180)
        c.warm_up(name, port)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    text = subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no", out],
                          capture_output=True, text=True, check=True).stdout
    costs = collections.Counter()
    for line in text.splitlines():
        m = LINE.match(line)
        if m and "PROGRAM TOTALS" not in line:
            costs[m.group(2)] += int(m.group(1).replace(",", ""))
    return costs


def check(binary):
    """link/check-order.sh: how many of the ordered symbols `binary` has."""
    subprocess.run([os.path.join(c.ROOT, "link", "check-order.sh"), binary], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", metavar="BIN")
    args = ap.parse_args()
    if args.check:
        return check(args.check)
    c.ensure_deps({"valgrind": "valgrind", "callgrind_annotate": "valgrind"})
    c.make_certs()
    c.make_configs()
    # Only the app is started with the others; each target runs under callgrind on its own.
    c.TARGETS = [t for t in c.TARGETS if t[0] == "direct"]
    c.start_targets()
    total = collections.Counter()
    try:
        for name in TARGETS:
            costs = profile(name, c.PORT[name])
            c.log(f"{name}: {len(costs)} functions ran")
            total.update(costs)
    finally:
        c.stop_all()
    have = symbols(c.CARAPACE)
    ordered = [s for s, _ in total.most_common() if s in have]
    os.makedirs(os.path.dirname(ORDER), exist_ok=True)
    with open(ORDER, "w") as f:
        f.writelines(s + "\n" for s in ordered)
    c.log(f"{ORDER}: {len(ordered)} symbols")


if __name__ == "__main__":
    main()
