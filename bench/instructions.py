#!/usr/bin/env python3
"""Instructions carapace executes per request, counted by callgrind: a figure that does not
move with the machine's noise, for comparing two builds on a change too small for req/s.

    python3 bench/instructions.py [--no-build] [--only carapace-full,carapace-fwd,carapace-mcp]
                                  [--baseline BIN] [--rate 100] [--duration 10]
    python3 bench/instructions.py --only carapace-fwd,nginx,haproxy [--cache-sim]
    python3 bench/instructions.py --only carapace-full,carapace-receipts --closed 32

Same setup as bench/compare.py (its certificates, configurations and load generator; the app
runs natively). Each target (carapace's, and nginx and HAProxy when named: their worker
process is the one counted) runs under `valgrind --tool=callgrind` with
instrumentation off while it starts; it is then switched on, a warm-up load is sent at
`--rate` (so every code path of a call is translated), the counters are zeroed, and the
measured window is counted and dumped. The result is the user-space instructions (Ir) of
the window divided by the requests answered in it: all of the proxy's own work for a call,
its TLS, HTTP, JSON and the event loop's turns, and nothing of the kernel's. At a fixed, low
rate every request is served on its own, so the event loop's cost per wake-up is included.
`--closed N` loads with N connections in a closed loop instead (each sends its next request as
soon as its last is answered): the proxy, slowed by callgrind, always has calls waiting, so the
work that is shared by calls that end together (a batch of receipts' one signature, a turn of
the event loop) is counted as it is spread at saturation.
Writes bench/out/instructions.json and a table to stdout; the dumps stay in bench/out.

`--cache-sim` also has callgrind simulate the caches and the branch predictor (its model of
this machine's L1 instruction and data caches and last level, per process: no kernel, no other
process evicting anything, so a floor of the native misses) and adds per request: L1
instruction-cache misses, L1 data-cache misses, last-level misses and mispredicted branches.
Where two programs run about the same instructions at different speeds, these say why.
"""

import argparse
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as c  # noqa: E402

DEFAULT_TARGETS = "carapace-full,carapace-fwd,carapace-mcp"
# Peers that can be counted too.
PEERS = ["nginx", "haproxy"]


# What `--cache-sim` reports per request: a column's name and the callgrind events it sums.
SIMULATED = [
    ("I1 misses", ["I1mr"]),
    ("D1 misses", ["D1mr", "D1mw"]),
    ("LL misses", ["ILmr", "DLmr", "DLmw"]),
    ("mispredicted branches", ["Bcm", "Bim"]),
]


def under_callgrind(cache_sim):
    """Start the targets under callgrind (instrumentation off until switched on; nginx's worker
    is a child of its master)."""
    plain = c.start
    sim = ["--cache-sim=yes", "--branch-sim=yes"] if cache_sim else []

    def start(name, cmd, env=None):
        if name in c.CARAPACES or name in PEERS:
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=yes",
                   *sim, f"--callgrind-out-file={c.p(f'callgrind.{name}.%p')}", *cmd]
        return plain(name, cmd, env)

    c.start = start


def control(pid, *args):
    subprocess.run(["callgrind_control", *args, str(pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def totals(pid):
    """Every event's total in the newest dump of `pid` (its `events:` and `summary:`/`totals:`
    lines), by event name."""
    dumps = sorted(glob.glob(c.p(f"callgrind.*.{pid}*")), key=os.path.getmtime)
    events = None
    for line in open(dumps[-1]):
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("summary:", "totals:")) and events:
            return dict(zip(events, map(int, line.split()[1:])))
    raise RuntimeError(f"no totals in {dumps[-1]}")


def measure(target, pid, rate, duration, closed=None):
    load = (["--mode", "closed", "--connections", str(closed)] if closed
            else ["--mode", "rate", "--rate", str(rate), "--connections", "4"])
    control(pid, "-i", "on")
    warm = c.loadgen(target, load, 5, 0)
    if "error" in warm or warm.get("errors"):
        return {"error": warm.get("error") or warm.get("first_error")}
    res = c.loadgen_window(target, load, duration, 1.0,
                           lambda: control(pid, "-z"), lambda: control(pid, "-d"))
    if "error" in res or res.get("errors"):
        return {"error": res.get("error") or res.get("first_error")}
    requests = res["throughput_rps"] * res["window_s"]
    events = totals(pid)
    ir = events["Ir"]
    out = {"requests": requests, "instructions": ir, "per_request": ir / requests}
    for column, names in SIMULATED:
        if all(n in events for n in names):
            out[column] = sum(events[n] for n in names) / requests
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=DEFAULT_TARGETS)
    ap.add_argument("--baseline", metavar="BIN",
                    help="also count the same targets run by this carapace binary")
    ap.add_argument("--rate", type=int, default=100)
    ap.add_argument("--closed", type=int, metavar="N",
                    help="load with N connections in a closed loop instead of at --rate")
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--cache-sim", action="store_true",
                    help="also simulate the caches and branch predictor (slower)")
    args = ap.parse_args()
    keep = args.only.split(",")
    c.TARGETS[:] = [t for t in c.TARGETS
                    if t[0] in keep and (t[0] in c.CARAPACES or t[0] in PEERS)]
    if args.baseline:
        c.add_baseline(os.path.abspath(args.baseline), keep)
    c.prepare(not args.no_build, {"valgrind": "valgrind", "callgrind_control": "valgrind"})
    for f in glob.glob(c.p("callgrind.*")):
        os.remove(f)
    under_callgrind(args.cache_sim)
    results = {}
    try:
        procs, failed = c.start_targets()
        for name, _, port in c.TARGETS:
            if name in failed:
                results[name] = {"error": failed[name]}
                continue
            # The process that serves: nginx's worker (the last of its tree), else the one.
            pid = c.proc_tree(procs[name].pid)[-1]
            results[name] = measure((name, port), pid, args.rate, args.duration, args.closed)
            c.log(f"{name}: {json.dumps(results[name])}")
    finally:
        c.stop_all()
    with open(c.p("instructions.json"), "w") as f:
        json.dump(results, f, indent=1)
    columns = [col for col, _ in SIMULATED if args.cache_sim]
    print("| target | requests counted | instructions / request |"
          + "".join(f" {col} / request |" for col in columns))
    print("|---|---:|---:|" + "---:|" * len(columns))
    for name, r in results.items():
        if "error" in r:
            print(f"| {c.LABEL[name]} | error: {r['error']} | |" + " |" * len(columns))
            continue
        print(f"| {c.LABEL[name]} | {r['requests']:,.0f} | {r['per_request']:,.0f} |"
              + "".join(f" {r.get(col, 0):,.1f} |" for col in columns))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        c.stop_all()
        sys.exit(130)
