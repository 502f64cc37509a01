#!/usr/bin/env python3
"""Where the shared core's time goes per request, for carapace and its peers.

    python3 bench/core_split.py [--no-build] [--only carapace-full,carapace-fwd,nginx,haproxy]
                                [--rounds 3] [--duration 8] [--peer-headers]

Same setup as bench/compare.py (it reuses its certificates, configurations, pinning and load
generator): the app and the proxy share core 0, the load generator runs on core 1, one worker
each, mTLS, 32 connections in a closed loop. At saturation core 0 is the limit, so a target's
requests per second are set by everything that core does per request, not only by the
proxy's own CPU (what compare.py reports). For the measured window of each target this reads
the CPU time of the proxy's processes and of the app's (user and kernel, /proc/PID/stat) and
core 0's idle, softirq and steal time (/proc/stat), and divides each by the requests answered
in the window.

The kernel accounts CPU time by the tick on most configurations (no
CONFIG_IRQ_TIME_ACCOUNTING): a tick that lands in a softirq counts both as the core's softirq
and as kernel time of the process it interrupted. The softirq column (the loopback network's
receive path, mostly) is therefore part of the two kernel columns, not beside them, and proxy
+ app + idle make up the core's total.

`--peer-headers` makes Envoy, nginx and HAProxy send the app the identity headers and request
id carapace adds to each request (see compare.py). Results go to bench/out/core-split.json
(core-split-peer-headers.json; with other targets than the default, core-split-only*.json),
with the settings, and a table of the rounds' medians to stdout.
"""

import datetime
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as c  # noqa: E402

# The fields of a core's line in /proc/stat, in order.
CORE_FIELDS = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
COLUMNS = [("proxy_user", "proxy user"), ("proxy_kernel", "proxy kernel"),
           ("app_user", "app user"), ("app_kernel", "app kernel"),
           ("core_softirq", "of the kernel columns: softirq"), ("core_idle", "idle"),
           ("core_steal", "steal"), ("core_total", "core 0 total")]


def core_ms(core):
    """Core `core`'s time so far in ms, by /proc/stat field."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{core} "):
                ticks = map(int, line.split()[1:1 + len(CORE_FIELDS)])
                return {k: v * 1000.0 / c.CLK_TCK for k, v in zip(CORE_FIELDS, ticks)}
    raise SystemExit(f"no cpu{core} in /proc/stat")


def split(target, proxy, app, duration, core):
    """Run the load; the core's time per request (µs) in the measured window, by account."""
    at = {}

    def reading():
        return {"proxy": c.cpu_ms(proxy), "app": c.cpu_ms(app), "core": core_ms(core)}

    res = c.loadgen_window(target, ["--mode", "closed", "--connections", "32"], duration, 1,
                           lambda: at.update(start=reading()), lambda: at.update(end=reading()))
    if "error" in res or res.get("errors"):
        return {"error": res.get("error") or res.get("first_error")}
    requests = res["throughput_rps"] * res["window_s"]
    start, end = at["start"], at["end"]

    def us(ms):
        return ms / requests * 1000

    out = {"throughput_rps": res["throughput_rps"]}
    for who in ("proxy", "app"):
        out[f"{who}_user"] = us(end[who][0] - start[who][0])
        out[f"{who}_kernel"] = us(end[who][1] - start[who][1])
    spent = {k: end["core"][k] - start["core"][k] for k in CORE_FIELDS}
    out["core_softirq"] = us(spent["softirq"])
    out["core_idle"] = us(spent["idle"])
    out["core_steal"] = us(spent["steal"])
    out["core_total"] = us(sum(spent.values()))
    return out


def main():
    ap = c.script_arguments(__doc__, duration=8, rounds=3)
    ap.add_argument("--peer-headers", action="store_true",
                    help="the peers send the app carapace's identity headers and a request id")
    args = ap.parse_args()
    c.PEER_HEADERS = args.peer_headers
    c.select(args.only)
    c.TARGETS[:] = [t for t in c.TARGETS if t[2] is not None]
    if not c.TARGETS:
        raise SystemExit(f"no proxy among --only {args.only}")
    c.prepare(not args.no_build)
    core = int(c.PROXY_CORE)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results = {}
    try:
        for rnd in range(args.rounds):
            c.stop_all()
            procs, failed = c.start_targets()
            app = c.proc_tree(procs["direct"].pid)
            order = c.TARGETS[rnd % len(c.TARGETS):] + c.TARGETS[:rnd % len(c.TARGETS)]
            for name, _, port in order:
                if name in failed:
                    results.setdefault(name, []).append({"error": failed[name]})
                    continue
                target = (name, port)
                c.warm_up(name, port)
                r = split(target, c.proc_tree(procs[name].pid), app, args.duration, core)
                results.setdefault(name, []).append(r)
                c.log(f"round {rnd + 1} {name}: {json.dumps(r)}")
    finally:
        c.stop_all()
    only = args.only != c.SCRIPT_TARGETS
    out = c.p(c.named("core-split-only.json" if only else "core-split.json"))
    settings = {"targets": [t[0] for t in c.TARGETS], "rounds": args.rounds,
                "duration_s": args.duration, "peer_headers": args.peer_headers,
                "core": core, "started": started}
    with open(out, "w") as f:
        json.dump({"settings": settings, "targets": results}, f, indent=1)
    print("| target | req/s | " + " | ".join(label for _, label in COLUMNS) + " |")
    print("|---|---:|" + "---:|" * len(COLUMNS))
    for name, runs in results.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            print(f"| {c.LABEL[name]} | error: {runs[0]['error']} |")
            continue
        cells = [f"{statistics.median(r['throughput_rps'] for r in ok):,.0f}"]
        cells += [f"{statistics.median(r[k] for r in ok):.2f}" for k, _ in COLUMNS]
        print(f"| {c.LABEL[name]} | " + " | ".join(cells) + " |")
    print(f"\nµs of core {core} per request, medians of {args.rounds} rounds"
          + (" (peers sending carapace's headers)" if args.peer_headers else "")
          + "; softirq is counted inside the kernel columns")


if __name__ == "__main__":
    c.script(main)
