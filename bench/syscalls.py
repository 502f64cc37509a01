#!/usr/bin/env python3
"""System calls and context switches per request, for carapace and its peers.

    python3 bench/syscalls.py [--no-build] [--only carapace-full,carapace-fwd,nginx,haproxy]
                              [--duration 5] [--rounds 1] [--allocations] [--baseline BIN]

Same setup as bench/compare.py (it reuses its certificates, configurations, pinning and load
generator): the app and the proxy on core 0, the load generator on core 1, one worker each,
mTLS, 32 connections. For each target and each load (saturation, closed loop; a fixed
3,000/s) it counts, with `perf stat` attached to the proxy's processes (every thread) for the
measured window only, the system calls entered (`raw_syscalls:sys_enter`, and the main ones
by name) and the context switches, and divides them by the requests answered in that window.
It also counts the TCP segments the whole machine sent in that window (`/proc/net/snmp`
`OutSegs`: caller to proxy, proxy to app and back, all on loopback) and, of those, the pure
acknowledgements (`TCPPureAcks` of `/proc/net/netstat`: on loopback every segment sent is
received), per request: a segment is a pass through the kernel's TCP stack, paid in the
sender's system time. Results go to bench/out/syscalls.json and a table to stdout.

`--allocations` also counts carapace's heap allocations per request (uprobes on the entry
points of its allocator, `perf probe`), at a fixed 300/s on 4 connections only: a uprobe
costs microseconds, so under saturation the count would follow how requests bunch up.
`--baseline BIN` measures the carapace targets a second time run by another build.
"""

import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as c  # noqa: E402

NAMED = ["read", "write", "writev", "recvfrom", "sendto", "epoll_wait", "futex",
         "sched_yield"]
EVENTS = ["raw_syscalls:sys_enter", "context-switches",
          *[f"syscalls:sys_enter_{n}" for n in NAMED]]
LOADS = [("saturation", ["--mode", "closed", "--connections", "32"]),
         ("3000/s", ["--mode", "rate", "--rate", "3000", "--connections", "32"])]
ALLOCATION_LOADS = [("300/s", ["--mode", "rate", "--rate", "300", "--connections", "4"])]


def allocation_probes(binaries):
    """Uprobes on the allocator of each carapace binary; the events to count."""
    subprocess.run(["perf", "probe", "-q", "-d", "alloc:*"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    events = []
    for i, binary in enumerate(binaries):
        for func in c.allocator_entries(binary):
            event = f"alloc:{func.removeprefix('mi_')}{i}"
            subprocess.run(["perf", "probe", "-q", "-x", binary, "-a", f"{event}={func}"],
                           check=True)
            events.append(event)
    return events


def tcp_counters():
    """The machine's TCP segments sent and pure acknowledgements received, so far."""
    values = {}
    for path, prefix in (("/proc/net/snmp", "Tcp:"), ("/proc/net/netstat", "TcpExt:")):
        with open(path) as f:
            rows = [line.split() for line in f if line.startswith(prefix)]
        for names, numbers in zip(rows[::2], rows[1::2]):
            values.update(zip(names[1:], (int(n) for n in numbers[1:])))
    return {"segments": values["OutSegs"], "pure_acks": values.get("TCPPureAcks", 0)}


def counted(target, pids, extra, duration, warmup):
    """Run the load; `perf stat` over `pids` for the measured window. Per-request counts."""
    out = c.p("perf-stat.csv")
    perf = {}

    def begin():
        perf["tcp"] = tcp_counters()
        perf["proc"] = subprocess.Popen(
            ["perf", "stat", "-x", ",", "-o", out, "-e", ",".join(EVENTS),
             "-p", ",".join(str(x) for x in pids)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def end():
        perf["proc"].send_signal(signal.SIGINT)
        perf["proc"].wait()
        after = tcp_counters()
        perf["tcp"] = {k: after[k] - v for k, v in perf["tcp"].items()}

    res = c.loadgen_window(target, extra, duration, warmup, begin, end)
    if "error" in res or res.get("errors"):
        return {"error": res.get("error") or res.get("first_error")}
    requests = res["throughput_rps"] * res["window_s"]
    counts = {}
    with open(out) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) < 3 or not parts[0].replace(".", "").isdigit():
                continue
            counts[parts[2]] = float(parts[0])
    per = {k.replace("syscalls:sys_enter_", ""): v / requests for k, v in counts.items()}
    allocations = {k: per.pop(k) for k in list(per) if k.startswith("alloc:")}
    return {"requests": requests, "throughput_rps": res["throughput_rps"],
            "syscalls": per.pop("raw_syscalls:sys_enter", None),
            "context_switches": per.pop("context-switches", None), "by_name": per,
            "allocations": sum(allocations.values()) if allocations else None,
            "tcp_segments": perf["tcp"]["segments"] / requests,
            "pure_acks": perf["tcp"]["pure_acks"] / requests}


def main():
    ap = c.script_arguments(__doc__, duration=5)
    ap.add_argument("--allocations", action="store_true",
                    help="count carapace's heap allocations per request (at 300/s only)")
    ap.add_argument("--baseline", metavar="BIN",
                    help="also run the carapace targets with this carapace binary")
    args = ap.parse_args()
    keep = c.select(args.only)
    if args.baseline:
        c.add_baseline(os.path.abspath(args.baseline), keep)
    loads = LOADS
    if args.allocations:
        loads = ALLOCATION_LOADS
        EVENTS.extend(allocation_probes([c.CARAPACE, *sorted(set(c.BINARY.values()))]))
    c.prepare(not args.no_build)
    results = {}
    try:
        for rnd in range(args.rounds):
            for load, extra in loads:
                c.stop_all()
                procs, failed = c.start_targets()
                for name, _, port in c.TARGETS:
                    if name in failed:
                        results.setdefault(name, {})[load] = [{"error": failed[name]}]
                        continue
                    target = (name, port)
                    c.loadgen(target, ["--mode", "rate", "--rate", "20", "--connections", "1"],
                              0.5, 0)
                    pids = c.proc_tree(procs[name].pid)
                    r = counted(target, pids, extra, args.duration, 1)
                    results.setdefault(name, {}).setdefault(load, []).append(r)
                    c.log(f"round {rnd + 1} {load} {name}: {json.dumps(r)}")
    finally:
        c.stop_all()
        if args.allocations:
            subprocess.run(["perf", "probe", "-q", "-d", "alloc:*"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(c.p("syscalls.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("| target | load | req/s | syscalls / req | context switches / req | "
          + " | ".join(NAMED) + " | TCP segments / req | pure ACKs / req | allocations / req |")
    print("|---|---|---:|---:|---:|" + "---:|" * len(NAMED) + "---:|---:|---:|")
    for name, loads in results.items():
        for load, runs in loads.items():
            ok = [r for r in runs if "error" not in r]
            if not ok:
                print(f"| {name} | {load} | error: {runs[0]['error']} |")
                continue
            med = sorted(ok, key=lambda r: r["syscalls"])[len(ok) // 2]
            named = " | ".join(f"{med['by_name'].get(n, 0):.2f}" for n in NAMED)
            allocs = med.get("allocations")
            allocs = "" if allocs is None or name not in c.CARAPACES else f"{allocs:.1f}"
            print(f"| {c.LABEL[name]} | {load} | {med['throughput_rps']:,.0f} | "
                  f"{med['syscalls']:.2f} | {med['context_switches']:.2f} | {named} | "
                  f"{med['tcp_segments']:.2f} | {med['pure_acks']:.2f} | {allocs} |")


if __name__ == "__main__":
    c.script(main)
