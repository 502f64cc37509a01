#!/usr/bin/env python3
"""Where a request's time goes inside a proxy at a fixed rate, from its system calls.

    python3 bench/path_time.py [--only carapace-full,carapace-fwd,nginx,haproxy]
                               [--rate 1000] [--duration 4] [--rounds 1] [--baseline BIN]

Same setup as bench/compare.py (its certificates, configurations, pinning and load
generator): the app and the proxy on core 0, the load generator on core 1, one worker each,
mTLS, 32 connections. For each target it records the proxy's system calls (`perf record` of
`raw_syscalls:sys_enter` and `sys_exit`, every thread) over the measured window of a fixed-rate
load, finds which sockets lead to the app (`ss`, at the window's end), and reports per request,
as medians and 90th percentiles in µs:

- request half: from the return of the read that brought the caller's request to the entry of
  the write that hands it to the app (TLS, HTTP, the filters, the back's encoding);
- answer half: from the return of the read that brought the app's answer to the entry of the
  write to the caller;
- hand-off: from the return of the write to the app to the proxy's next `epoll_wait` (the time
  it keeps the core the app shares with it before the app can answer);
- wake-up: from `epoll_wait`'s return to the read of the app's answer;
- each kind of read and write: how long it took in the kernel (a write on loopback carries the
  bytes to the other socket and wakes its reader).

The tracing adds its own cost to every system call, alike for every proxy (and so more to a proxy
that makes more of them): read the figures against each other, not as absolute latencies.
Results go to bench/out/path_time.json and a table to stdout.
"""

import json
import os
import re
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as c  # noqa: E402

# x86_64 system call numbers of the calls followed.
CALLS = {0: "read", 1: "write", 19: "readv", 20: "writev", 44: "sendto", 45: "recvfrom",
         46: "sendmsg", 47: "recvmsg", 232: "epoll_wait", 281: "epoll_pwait",
         441: "epoll_pwait2"}
READS = {"read", "recvfrom", "readv", "recvmsg"}
WRITES = {"write", "writev", "sendto", "sendmsg"}
EVENT = re.compile(r"^\s*\S+\s+(\d+)\s+(?:\[\d+\]\s+)?([\d.]+):\s+raw_syscalls:sys_(enter|exit):"
                   r"\s+NR (\d+) (?:\(([0-9a-f]+)|= (-?\d+))")
PHASES = ["request half", "answer half", "hand-off", "wake-up"]


def app_sockets(pids):
    """The proxy's file descriptors connected to the app."""
    out = subprocess.run(["ss", "-tnpH", "dst", f"{c.APP_ADDR[0]}:{c.APP_ADDR[1]}"],
                         capture_output=True, text=True).stdout
    return {int(fd) for pid, fd in re.findall(r"pid=(\d+),fd=(\d+)", out) if int(pid) in pids}


def quantile(xs, f):
    return round(sorted(xs)[int(len(xs) * f)], 1) if xs else None


def analyse(path, app):
    """The phases and the time in each kind of call, from a `perf record` of the proxy."""
    script = subprocess.run(["perf", "script", "-i", path, "--ns", "-F",
                             "comm,tid,time,event,trace"],
                            capture_output=True, text=True, check=True).stdout
    phases = {p: [] for p in PHASES}
    calls = {}
    entered, at = {}, {}
    for line in script.splitlines():
        m = EVENT.match(line)
        if not m or int(m.group(4)) not in CALLS:
            continue
        tid, t, kind, nr, fd, ret = m.groups()
        t = float(t) * 1e6
        name = CALLS[int(nr)]
        s = at.setdefault(tid, {})
        if kind == "enter":
            entered[tid] = (t, int(fd, 16), name)
            if name.startswith("epoll") and "handed" in s:
                phases["hand-off"].append(t - s.pop("handed"))
            continue
        if tid not in entered:
            continue
        t0, fd, name = entered.pop(tid)
        if name.startswith("epoll"):
            s["woke"] = t
            continue
        ret = int(ret)
        side = "app" if fd in app else "caller"
        calls.setdefault(f"{name} {side}" + ("" if ret > 0 else " (nothing)"), []).append(t - t0)
        woke = s.pop("woke", None)
        if woke is not None and name in READS and fd in app:
            phases["wake-up"].append(t0 - woke)
        if ret <= 0:
            continue
        if name in READS:
            s["answer" if fd in app else "request"] = t
        elif name in WRITES and fd in app:
            s["handed"] = t
            if "request" in s:
                phases["request half"].append(t0 - s.pop("request"))
        elif name in WRITES and "answer" in s:
            phases["answer half"].append(t0 - s.pop("answer"))
    return {
        "phases": {p: {"n": len(v), "p50": quantile(v, .5), "p90": quantile(v, .9)}
                   for p, v in phases.items()},
        "calls": {k: {"n": len(v), "p50": quantile(v, .5), "p90": quantile(v, .9)}
                  for k, v in sorted(calls.items())},
    }


def traced(target, pids, rate, duration):
    """A fixed-rate load with the proxy's system calls recorded over its measured window."""
    threads = [int(t) for pid in pids for t in os.listdir(f"/proc/{pid}/task")]
    data = c.p(f"path-time-{target[0]}.data")
    perf = {}

    def begin():
        perf["proc"] = subprocess.Popen(
            ["perf", "record", "-q", "-o", data, "-t", ",".join(map(str, threads)),
             "-e", "raw_syscalls:sys_enter,raw_syscalls:sys_exit"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def end():
        perf["proc"].send_signal(signal.SIGINT)
        perf["proc"].wait()

    load = ["--mode", "rate", "--rate", str(rate), "--connections", "32"]
    res = c.loadgen_window(target, load, duration, 1, begin, end)
    if "error" in res or res.get("errors"):
        return {"error": res.get("error") or res.get("first_error")}
    out = analyse(data, app_sockets(set(pids)))
    os.remove(data)
    return out


def main():
    ap = c.script_arguments(__doc__, duration=4)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--baseline", metavar="BIN",
                    help="also run the carapace targets with this carapace binary")
    args = ap.parse_args()
    keep = c.select(args.only)
    if args.baseline:
        c.add_baseline(os.path.abspath(args.baseline), keep)
    c.prepare(not args.no_build)
    results = {}
    try:
        for rnd in range(args.rounds):
            c.stop_all()
            procs, failed = c.start_targets()
            for name, _, port in c.TARGETS:
                if port is None or name in failed:
                    continue
                target = (name, port)
                # Warm up (the app connections open on demand at the measured rate).
                c.loadgen(target, ["--mode", "rate", "--rate", str(args.rate),
                                   "--connections", "32"], 1, 0)
                r = traced(target, c.proc_tree(procs[name].pid), args.rate, args.duration)
                results.setdefault(name, []).append(r)
                c.log(f"round {rnd + 1} {name}: {json.dumps(r.get('phases', r))}")
    finally:
        c.stop_all()
    with open(c.p("path_time.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"At {args.rate}/s, µs per request, p50 / p90 (the first round's):\n")
    print("| target | " + " | ".join(PHASES) + " | kernel: each read and write (p50) |")
    print("|---|" + "---:|" * len(PHASES) + "---|")
    for name, runs in results.items():
        r = runs[0]
        if "error" in r:
            print(f"| {c.LABEL[name]} | error: {r['error']} |")
            continue
        cells = [f"{r['phases'][p]['p50']} / {r['phases'][p]['p90']}" for p in PHASES]
        calls = ", ".join(f"{k} {v['p50']}" for k, v in r["calls"].items() if v["n"] > 10)
        print(f"| {c.LABEL[name]} | " + " | ".join(cells) + f" | {calls} |")


if __name__ == "__main__":
    c.script(main)
