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

The CPU valgrind presents has no SHA extensions, so under callgrind the `sha2` crate's SHA-256
(the HMAC, receipts' and the ledger's hashes) runs its portable code, about 4,000 instructions
a 64-byte block in carapace's release build, where the native run, on a CPU with them (`sha_ni`
in /proc/cpuinfo), runs the SHA-NI code (`sha2::sha256::x86::digest_blocks` in `perf`), a small
fraction of that. The table's "portable SHA-256" column is the part of each count spent in the
portable code: a count less that column is closer to what the native run executes. (The
peers' TLS 1.3 records are not hashed per request; their handshakes are not counted here.)

`--cache-sim` also has callgrind simulate the caches and the branch predictor (its model of
this machine's L1 instruction and data caches and last level, per process: no kernel, no other
process evicting anything, so a floor of the native misses) and adds per request: L1
instruction-cache misses, L1 data-cache misses, last-level misses and mispredicted branches.
Where two programs run about the same instructions at different speeds, these say why.

`--atomics` also counts the atomic read-modify-write instructions executed per request (every
lock-prefixed instruction, and `xchg` with memory, which locks without the prefix: reference
counts, mutexes, wakers). Each is a full barrier that waits for the core's pending stores, so
a few hundred of them are a measurable part of a call. Callgrind records every instruction's
count (`--dump-instr=yes`); each object's instructions are read with `objdump`. The sites
executed most, with the functions and lines they were inlined from, go to
bench/out/atomics-TARGET.txt.
"""

import argparse
import collections
import glob
import json
import os
import re
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


def under_callgrind(cache_sim, atomics=False):
    """Start the targets under callgrind (instrumentation off until switched on; nginx's worker
    is a child of its master)."""
    plain = c.start
    sim = ["--cache-sim=yes", "--branch-sim=yes"] if cache_sim else []
    if atomics:
        sim.append("--dump-instr=yes")

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
    dump = newest_dump(pid)
    events = None
    for line in open(dump):
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("summary:", "totals:")) and events:
            return dict(zip(events, map(int, line.split()[1:])))
    raise RuntimeError(f"no totals in {dump}")


def newest_dump(pid):
    return sorted(glob.glob(c.p(f"callgrind.*.{pid}*")), key=os.path.getmtime)[-1]


def executed(dump):
    """How many times each instruction ran in a dump made with `--dump-instr=yes`:
    {(object, address): count}. Positions are absolute (`0x...`) or relative to the last
    (`+n`, `-n`, `*`); the line after `calls=` is the call's inclusive cost, not an
    instruction's, and is skipped."""
    names, counts = {}, collections.Counter()
    obj, addr, call_cost = None, 0, False
    for line in open(dump):
        head = line[:1]
        if head.isdigit() or head in "+-*":
            parts = line.split()
            pos = parts[0]
            if pos.startswith("0x"):
                addr = int(pos, 16)
            elif pos[0] in "+-":
                addr += int(pos, 0)
            if call_cost:
                call_cost = False
            elif len(parts) >= 2:
                counts[(obj, addr)] += int(parts[-1])
        elif line.startswith(("ob=", "cob=")):
            # An object is named where it first appears, which may be as a call's target.
            m = re.match(r"c?ob=\((\d+)\)(?: (.*))?", line.strip())
            if m.group(2):
                names[m.group(1)] = m.group(2)
            if line.startswith("ob="):
                obj = names[m.group(1)]
        elif line.startswith("calls="):
            call_cost = True
    return counts


def locked_instructions(obj):
    """The addresses of `obj`'s atomic read-modify-write instructions."""
    if not os.path.isfile(obj):
        return {}
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj], capture_output=True,
                         text=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s+([0-9a-f]+):\s+(.*)", line)
        if m:
            ins = m.group(2).strip()
            if ins.startswith("lock ") or (ins.startswith("xchg") and "(" in ins):
                found[int(m.group(1), 16)] = ins
    return found


def count_atomics(name, pid, requests):
    """Atomic read-modify-writes per request in the newest dump of `pid`; the sites executed
    at least once per 20 requests written to bench/out/atomics-NAME.txt."""
    counts = executed(newest_dump(pid))
    sites = []
    for obj in sorted({o for o, _ in counts}):
        locked = locked_instructions(obj)
        sites += [(n, obj, a, locked[a]) for (o, a), n in counts.items()
                  if o == obj and a in locked and n]
    sites.sort(reverse=True)
    shown = [s for s in sites if s[0] >= requests / 20]
    where = {}
    for obj in {o for _, o, _, _ in shown}:
        addrs = [a for _, o, a, _ in shown if o == obj]
        out = subprocess.run(["addr2line", "-f", "-i", "-C", "-a", "-e", obj,
                              *map(hex, addrs)], capture_output=True, text=True).stdout
        for block in re.split(r"^(?=0x[0-9a-f]+$)", out, flags=re.M):
            lines = block.split("\n")
            if lines[0].startswith("0x"):
                # The innermost frames: the atomic operation and what it belongs to.
                where[(obj, int(lines[0], 16))] = " < ".join(
                    f"{fn[:80]} ({loc.rsplit('/', 1)[-1]})"
                    for fn, loc in list(zip(lines[1::2], lines[2::2]))[:10] if fn)
    with open(c.p(f"atomics-{name}.txt"), "w") as f:
        f.write(f"# {name}: atomic read-modify-writes per request, by site\n")
        for n, obj, a, ins in shown:
            f.write(f"{n / requests:7.2f}  {os.path.basename(obj)} {a:#x} {ins}\n"
                    f"         {where.get((obj, a), '')}\n")
    return sum(n for n, *_ in sites) / requests


def portable_sha256(pid):
    """The instructions of the newest dump of `pid` spent in the `sha2` crate's portable
    SHA-256 (its `soft` module's lines, wherever they were inlined)."""
    out = subprocess.run(["callgrind_annotate", "--threshold=100", newest_dump(pid)],
                         capture_output=True, text=True).stdout
    total = 0
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+(\S.*)$", line)
        if not m or m.group(2).startswith("=>"):
            continue
        where = m.group(2)
        if "/sha2-" in where and "/sha256/soft.rs:" in where or ":sha2::sha256::soft::" in where:
            total += int(m.group(1).replace(",", ""))
    return total


def measure(target, pid, rate, duration, closed=None, atomics=False):
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
    out = {"requests": requests, "instructions": ir, "per_request": ir / requests,
           "portable SHA-256": portable_sha256(pid) / requests}
    for column, names in SIMULATED:
        if all(n in events for n in names):
            out[column] = sum(events[n] for n in names) / requests
    if atomics:
        out["atomics"] = count_atomics(target[0], pid, requests)
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
    ap.add_argument("--atomics", action="store_true",
                    help="also count atomic read-modify-write instructions per request")
    args = ap.parse_args()
    keep = args.only.split(",")
    c.TARGETS[:] = [t for t in c.TARGETS
                    if t[0] in keep and (t[0] in c.CARAPACES or t[0] in PEERS)]
    if args.baseline:
        c.add_baseline(os.path.abspath(args.baseline), keep)
    c.prepare(not args.no_build, {"valgrind": "valgrind", "callgrind_control": "valgrind"})
    for f in glob.glob(c.p("callgrind.*")):
        os.remove(f)
    under_callgrind(args.cache_sim, args.atomics)
    results = {}
    try:
        procs, failed = c.start_targets()
        for name, _, port in c.TARGETS:
            if name in failed:
                results[name] = {"error": failed[name]}
                continue
            # The process that serves: nginx's worker (the last of its tree), else the one.
            pid = c.proc_tree(procs[name].pid)[-1]
            results[name] = measure((name, port), pid, args.rate, args.duration, args.closed,
                                    args.atomics)
            c.log(f"{name}: {json.dumps(results[name])}")
    finally:
        c.stop_all()
    with open(c.p("instructions.json"), "w") as f:
        json.dump(results, f, indent=1)
    columns = ([col for col, _ in SIMULATED if args.cache_sim]
               + (["atomics"] if args.atomics else []))
    print("| target | requests counted | instructions / request | of which portable SHA-256 |"
          + "".join(f" {col} / request |" for col in columns))
    print("|---|---:|---:|---:|" + "---:|" * len(columns))
    for name, r in results.items():
        if "error" in r:
            print(f"| {c.LABEL[name]} | error: {r['error']} | | |" + " |" * len(columns))
            continue
        print(f"| {c.LABEL[name]} | {r['requests']:,.0f} | {r['per_request']:,.0f} |"
              f" {r['portable SHA-256']:,.0f} |"
              + "".join(f" {r.get(col, 0):,.1f} |" for col in columns))


if __name__ == "__main__":
    c.script(main)
