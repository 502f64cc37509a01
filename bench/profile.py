#!/usr/bin/env python3
"""Where a proxy's CPU goes at saturation (or at a fixed rate): `perf record -g` on one target of
bench/compare.py.

    python3 bench/profile.py [--no-build] [--target carapace-full] [--duration 5] [--rate N]

Same setup as bench/compare.py (its certificates, configurations, pinning and load generator):
the app and the proxy on core 0, the load generator on core 1, one worker each, mTLS, 32
connections in a closed loop (with `--rate N`, at N requests per second instead, sampled
more often: the work of a request that arrives to a core doing nothing else, its caches
cooled by whatever ran between two requests). `perf record -g` samples the proxy's processes (every thread)
for the measured window only. Writes bench/out/profile-TARGET.data, and to
bench/out/profile-TARGET.txt the share of samples by binary (kernel, the proxy, libc) and the
top functions by exclusive (self) samples, with the flat view kept as the grouping.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as c  # noqa: E402


def sampling(dwarf, allocations, rate=None):
    """`perf record`'s options: CPU samples, or every allocation (an uprobe on the
    allocator's entry point) with the stack that made it."""
    if allocations:
        subprocess.run(["perf", "probe", "-q", "-d", "probe_carapace:*"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        entries = c.allocator_entries(c.CARAPACE)
        subprocess.run(["perf", "probe", "-q", "-x", c.CARAPACE,
                        *[a for f in entries for a in ("-a", f)]], check=True)
        return [*[a for f in entries for a in ("-e", f"probe_carapace:{f}")], "-c", "1",
                "--call-graph", "dwarf,8192"]
    if dwarf:
        return ["--call-graph", "dwarf,16384", "-F", "499"]
    # At a fixed rate the proxy runs a few percent of the time: sample it more often.
    return ["-g", "-F", "19999" if rate else "2999"]


def record(target, pids, duration, warmup, data, options, rate=None):
    perf = {}

    def begin():
        perf["proc"] = subprocess.Popen(
            ["perf", "record", *options, "-o", data,
             "-p", ",".join(str(x) for x in pids)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def end():
        perf["proc"].send_signal(signal.SIGINT)
        perf["proc"].wait()

    load = (["--mode", "rate", "--rate", str(rate)] if rate else ["--mode", "closed"])
    res = c.loadgen_window(target, [*load, "--connections", "32"], duration, warmup, begin,
                           end)
    return res


def report(data, what):
    out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--stdio",
                          "--sort", what, "-g", "none", "--percent-limit", "0.3"],
                         capture_output=True, text=True)
    return "\n".join(line.rstrip() for line in out.stdout.splitlines()
                     if line.strip() and not line.startswith("#"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="carapace-full")
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--dwarf", action="store_true",
                    help="DWARF call graphs (callers of Rust functions; large data, slow)")
    ap.add_argument("--allocations", action="store_true",
                    help="sample allocations instead of CPU time (uprobe; carapace targets "
                         "only; the load runs far slower, so read shares, not rates)")
    ap.add_argument("--rate", type=int,
                    help="load at this many requests per second instead of a closed loop")
    args = ap.parse_args()
    c.TARGETS[:] = [t for t in c.TARGETS if t[0] == args.target]
    if not c.TARGETS:
        raise SystemExit(f"unknown target {args.target}")
    c.prepare(not args.no_build)
    kind = ("allocations-" if args.allocations else "") + (f"rate{args.rate}-" if args.rate
                                                              else "")
    data = c.p(f"profile-{kind}{args.target}.data")
    try:
        procs, failed = c.start_targets()
        if failed:
            raise SystemExit(f"{args.target}: {failed[args.target]}")
        name, _, port = c.TARGETS[0]
        c.loadgen((name, port), ["--mode", "rate", "--rate", "20", "--connections", "1"], 0.5, 0)
        res = record((name, port), c.proc_tree(procs[name].pid), args.duration, 1, data,
                     sampling(args.dwarf, args.allocations, args.rate), args.rate)
    finally:
        c.stop_all()
    if "error" in res or res.get("errors"):
        raise SystemExit(f"load failed: {res}")
    text = (f"# {c.LABEL[args.target]}: {res['throughput_rps']:,.0f} req/s, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
            f"## by binary\n{report(data, 'dso')}\n\n## by function (self)\n"
            f"{report(data, 'dso,symbol')}\n")
    with open(c.p(f"profile-{kind}{args.target}.txt"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    c.script(main)
