#!/usr/bin/env python3
"""Write link/carapace.profdata: the profile of carapace's request paths that release builds
are optimised with (profile-guided optimisation: LLVM lays out branches, inlines and splits
hot from cold code by what the profile saw run).

A build instrumented with `-Cprofile-generate` runs every carapace target of the benchmark
(full stack, forwarding, MCP front, full stack with the ledger, and with receipts) under the
benchmark's own load, as bench/compare.py sends it: closed-loop saturation, a fixed rate and
new mTLS connections, a few seconds each. Each target is stopped with SIGTERM, so it writes its
counters on the way out, and `llvm-profdata merge` (rustup component `llvm-tools`, the
toolchain's own LLVM) joins them into the file build.rs hands to the compiler.

Regenerate after a change on the request path, of the toolchain or of dependencies: a function
whose code changed since the profile was taken is compiled without it, as before, and the
compiler warns; and a crate whose compiler hash changed (its dependencies, features, or the
toolchain) gets none of the profile, silently. So the profile comes with link/profile-crates.txt,
the crates it was taken from, and `link/check-profile.sh` checks a build against both: those
crates are the binary's, and the warnings in its log are few (the image check bounds them).
Then regenerate link/hot-symbols.txt (bench/symbol_order.py): the profile changes
what is inlined, and so the binary's function names.

    python3 bench/pgo.py          # builds the instrumented binary and the load generator
"""

import argparse
import glob
import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as c  # noqa: E402

PROFILE = c.PROFILE
CRATES = os.path.join(c.ROOT, "link", "profile-crates.txt")
TARGETS = ["carapace-full", "carapace-fwd", "carapace-mcp", "carapace-ledger",
           "carapace-provable", "carapace-batched"]
INSTRUMENTED = os.path.join(c.ROOT, "target", "pgo-generate")
RAW = os.path.join(c.OUT, "pgo-raw")


def sysroot_tool(name):
    """A tool of the active toolchain's `llvm-tools` component."""
    sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True,
                             check=True).stdout.strip()
    host = next(line.split()[1] for line in subprocess.run(
        ["rustc", "-vV"], capture_output=True, text=True, check=True).stdout.splitlines()
        if line.startswith("host:"))
    path = os.path.join(sysroot, "lib", "rustlib", host, "bin", name)
    if not os.access(path, os.X_OK):
        c.run(["rustup", "component", "add", "llvm-tools"])
    return path


def build_instrumented():
    """The release binary, instrumented; in a target directory of its own (other flags)."""
    env = dict(os.environ, CARGO_TARGET_DIR=INSTRUMENTED,
               RUSTFLAGS=f"-Cprofile-generate={RAW}")
    c.run(["cargo", "build", "--release", "--bin", "carapace"], cwd=c.ROOT, env=env)
    return os.path.join(INSTRUMENTED, "release", "carapace")


def train(binary, name, port, seconds):
    """Run target `name` on `binary` under the benchmark's loads, then stop it cleanly."""
    env = dict(os.environ, LLVM_PROFILE_FILE=os.path.join(RAW, f"{name}-%p.profraw"))
    proc = c.start(f"pgo-{name}", [binary, "serve", "-c", c.p(name, "carapace.yaml")], env)
    try:
        c.wait_port(port, proc, name, timeout=60)
        c.warm_up(name, port)
        for extra in (["--mode", "closed", "--connections", "32"],
                      ["--mode", "rate", "--rate", "1000", "--connections", "32"],
                      ["--mode", "connect", "--connections", "16"]):
            res = c.loadgen((name, port), extra, seconds, 0.5)
            if "error" in res or res.get("errors"):
                raise SystemExit(f"{name}: load failed: {res}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}; its counters may be lost")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="each load, per target")
    ap.add_argument("--no-build", action="store_true",
                    help="use target/pgo-generate/release/carapace as it is")
    args = ap.parse_args()
    merge = sysroot_tool("llvm-profdata")
    c.ensure_deps()
    binary = os.path.join(INSTRUMENTED, "release", "carapace")
    if not args.no_build:
        binary = build_instrumented()
        c.run(["cargo", "build", "--release", "--example", "loadgen"], cwd=c.ROOT,
              env=dict(os.environ, CARGO_TARGET_DIR=c.LOADGEN_TARGET))
    shutil.rmtree(RAW, ignore_errors=True)
    c.make_certs()
    c.make_configs()
    # Only the app is started with the others; each target runs on its own. The app is the
    # instrumented binary's sample app (a fresh machine has no other build), its counters kept
    # apart: they are not carapace's request paths.
    c.TARGETS = [t for t in c.TARGETS if t[0] == "direct"]
    c.CARAPACE = binary
    os.environ["LLVM_PROFILE_FILE"] = os.path.join(c.OUT, "pgo-app-%p.profraw")
    c.start_targets()
    try:
        for name in TARGETS:
            train(binary, name, c.PORT[name], args.seconds)
            c.log(f"{name}: trained")
    finally:
        c.stop_all()
    raw = glob.glob(os.path.join(RAW, "*.profraw"))
    if not raw:
        raise SystemExit(f"no counters in {RAW}")
    # Sparse: only the functions that ran (a fifth of the size).
    c.run([merge, "merge", "--sparse", "-o", PROFILE, *raw])
    c.log(f"{PROFILE}: {os.path.getsize(PROFILE) // 1024} KiB from {len(raw)} runs")
    write_crates(merge)


def write_crates(merge):
    """link/profile-crates.txt: the code units (crate.hash-cgu.N) the profile names functions
    of: a function local to its unit is named `unit;symbol` in it."""
    out = subprocess.run([merge, "show", "--all-functions", PROFILE], capture_output=True,
                         text=True, check=True).stdout
    units = sorted({line.strip().split(";", 1)[0] for line in out.splitlines()
                    if line.startswith("  ") and not line.startswith("   ") and ";" in line})
    with open(CRATES, "w") as f:
        f.writelines(u + "\n" for u in units)
    c.log(f"{CRATES}: {len(units)} crates")


if __name__ == "__main__":
    main()
