#!/usr/bin/env python3
"""Soak run of carapace (issue 13): two fronts on one Redis under a steady mix of good and bad
calls for a long while, with reloads, a kill-switch and a Redis restart in the middle.

    python3 bench/soak.py [--minutes 30] [--no-build]

Builds carapace (release) unless --no-build, writes certificates, keys, the peer store and the
configurations to bench/out/soak/, and starts:

* a redis-server on a Unix socket in a temporary directory (`maxmemory-policy noeviction`,
  append-only file),
* the sample memory tool host (`carapace sample-app`) on a free loopback port,
* carapace "tools": a tools-v1 front over mTLS, the client certificate paired in its peer store
  (plus a revoked one; a third certificate is not in the store at all), shared state on Redis,
  a per-peer rate limit, a tight rate limit on `memory.delete`, `memory.query` cut off at 1 s,
* carapace "skill": a skill-v1 front on loopback with HMAC signatures, nonces and the same
  `memory.delete` limit on Redis, `memory.query` cut off at 1 s.

A driver of a few Python threads (stdlib only) sends a steady mix to both fronts: good calls
(query, append, tool list / manifest), bad arguments, bad envelopes, malformed JSON, unknown
tools, no route, wrong method, bodies over the limit, a credential header sent twice, an
unpaired and a revoked certificate, bursts over the `memory.delete` rate limit, calls slower
than the tool's timeout (the sample app's `delay_ms`), and on skill-v1 also bad signatures,
stale timestamps, replayed nonces and an unsupported protocol version. Every answer is checked
against the code that kind of call should get at that moment; anything else is counted as
unexpected (with the first examples kept as evidence). Around a change of state (a reload, the
kill-switch, Redis going down or coming back) a call in flight may get the code of either side.

In the middle: five reloads alternating two configurations that change the rate limits
(`carapace reload -c FILE` for tools, SIGHUP for skill), the kill-switch engaged on
`memory.append` for a while on both fronts (`carapace kill-switch engage/release --tool`), and
one Redis restart (stopped, down a few seconds: calls that need Redis must be refused with the
shared-state code, then started again: calls must recover).

Every 10 s: RSS (VmRSS) and open file descriptors of each carapace process (and, for context,
of the app and Redis), answers by code, unexpected answers, latency of good calls. Results go
to bench/out/soak.json, the table to bench/out/soak.md and stdout. Exits 1 if any answer was
unexpected. Everything started is stopped on exit, Ctrl-C or error.
"""

import argparse
import atexit
import datetime
import hashlib
import hmac
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True  # no bench/__pycache__ left behind
from compare import log, machine_info  # noqa: E402  (same logging and machine description)

ROOT = os.path.dirname(BENCH)
OUT = os.path.join(BENCH, "out")
SOAK = os.path.join(OUT, "soak")
CARAPACE = os.path.join(ROOT, "target", "release", "carapace")

SKILL_ID = "demo.memory"
SAMPLE_S = 10
QUERY_TIMEOUT_MS = 1000  # tools.memory.query.timeout_ms_max on both fronts
SLOW_DELAY_MS = 2500     # what a slow call asks the app to sleep
MAX_BODY = 65536         # limits.max_body_bytes on both fronts
DELETE_RATE = 1          # memory.delete: per second, both fronts, both configurations
BURST = {"A": 2, "B": 3}  # memory.delete burst in configuration A and B
BURST_CALLS = 5          # calls in one burst
BURST_EVERY_S = 5.0      # > max burst / rate, so each burst starts with a full bucket
REDIS_DOWN_S = 6
RECOVERY_GRACE_S = 5.0   # after Redis answers PING again, calls may still fail this long

STARTED = []  # (name, Popen), each the leader of its own process group


def p(*parts):
    return os.path.join(SOAK, *parts)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# 1. certificates, keys, peer store, configurations


def make_certs():
    """An EC P-256 CA; a server certificate for IP 127.0.0.1; three client certificates:
    `paired` (active in the peer store), `revoked` (its record is revoked) and `unpaired` (no
    record); the peer store; the HMAC secret of the skill-v1 front."""
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(["openssl", "req", "-x509", *ec, "-keyout", p("ca.key"), "-out", p("ca.pem"),
         "-days", "30", "-subj", "/CN=soak-ca"], **quiet)
    with open(p("server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                "extendedKeyUsage=serverAuth\n")
    with open(p("client.ext"), "w") as f:
        f.write("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    names = [("server", "127.0.0.1", "server"), ("paired", "gw_soak", "client"),
             ("revoked", "gw_revoked", "client"), ("unpaired", "gw_unpaired", "client")]
    for name, cn, ext in names:
        run(["openssl", "req", "-new", *ec, "-keyout", p(f"{name}.key"), "-out",
             p(f"{name}.csr"), "-subj", f"/CN={cn}"], **quiet)
        run(["openssl", "x509", "-req", "-in", p(f"{name}.csr"), "-CA", p("ca.pem"), "-CAkey",
             p("ca.key"), "-CAcreateserial", "-out", p(f"{name}.crt"), "-days", "30",
             "-extfile", p(f"{ext}.ext")], **quiet)

    def fingerprint(name):
        out = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in",
                              p(f"{name}.crt")], check=True, capture_output=True, text=True)
        return "sha256:" + out.stdout.strip().split("=", 1)[1].replace(":", "").lower()

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    peers = {"version": 1, "peers": [
        {"component_type": "gateway", "component_id": cid, "role": "gateway",
         "endpoint": None, "public_key_ed25519": None, "public_key_x25519": None,
         "mtls_cert_fingerprint": fingerprint(name), "status": status, "paired_at": now,
         "last_seen_at": None, "policy": None}
        for name, cid, status in [("paired", "gw_soak", "active"),
                                  ("revoked", "gw_revoked", "revoked")]]}
    with open(p("peers.json"), "w") as f:
        json.dump(peers, f, indent=1)
    with open(p("hmac.key"), "w") as f:
        f.write(os.urandom(24).hex())
    os.chmod(p("hmac.key"), 0o600)


def config_text(front, variant, ports, redis_sock):
    """The configuration of one front (`tools` or `skill`) in variant A or B (B: a lower
    per-peer limit and a larger burst on memory.delete)."""
    burst = BURST[variant]
    per_peer = {"A": "{ per_second: 1000, burst: 2000 }",
                "B": "{ per_second: 800, burst: 1600 }"}[variant]
    common = f"""\
app: {{ protocol: tools-v1, address: "http://127.0.0.1:{ports['app']}" }}
ops: {{ address: "127.0.0.1:{ports[front + '_ops']}" }}
admin: {{ socket: {p(front, 'admin.sock')} }}
shared_state:
  backend: redis
  redis: {{ url: "unix://{redis_sock}", key_prefix: "soak-{front}:", timeout_ms: 250 }}
limits: {{ max_body_bytes: {MAX_BODY} }}
tools:
  memory.query: {{ timeout_ms_max: {QUERY_TIMEOUT_MS} }}
log: {{ format: text, level: info }}
"""
    if front == "tools":
        return f"""\
# soak configuration {variant}
state_dir: {p('tools', 'state')}
front: {{ protocol: tools-v1 }}
listeners:
  tcp:
    address: "127.0.0.1:{ports['tools']}"
    tls: {{ cert_file: {p('server.crt')}, key_file: {p('server.key')}, client_ca_file: {p('ca.pem')} }}
peers: {{ file: {p('peers.json')} }}
rate_limits:
  per_peer: {per_peer}
  tools:
    memory.delete: {{ per_second: {DELETE_RATE}, burst: {burst} }}
""" + common
    return f"""\
# soak configuration {variant}
state_dir: {p('skill', 'state')}
front:
  protocol: skill-v1
  skill_id: {SKILL_ID}
  auth: {{ mode: hmac, keys: [ {{ id: k0, secret: {{ file: {p('hmac.key')} }} }} ] }}
listeners:
  tcp: {{ address: "127.0.0.1:{ports['skill']}" }}
rate_limits:
  tools:
    memory.delete: {{ per_second: {DELETE_RATE}, burst: {burst} }}
""" + common


def write_config(front, variant, ports, redis_sock):
    """Write atomically (a reload must never read a torn file); keep both variants beside it
    for reference."""
    text = config_text(front, variant, ports, redis_sock)
    with open(p(front, f"carapace.{variant}.yaml"), "w") as f:
        f.write(text)
    tmp = p(front, "carapace.yaml.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, p(front, "carapace.yaml"))


# ---------------------------------------------------------------------------------------------
# 2. processes


def start(name, cmd):
    logf = open(p(f"{name}.log"), "a")
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, cwd=SOAK)
    STARTED.append((name, proc))
    return proc


def stop(proc, timeout=10):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def stop_all():
    for _, proc in reversed(STARTED):
        stop(proc, timeout=5)
    STARTED.clear()


def wait_port(port, proc, name, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see {p(name + '.log')}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on {port} within {timeout}s")


def http_get(port, path, timeout=2):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


def wait_ready(ops_port, proc, name, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see {p(name + '.log')}")
        if http_get(ops_port, "/readyz")[0] == 200:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready within {timeout}s; see {p(name + '.log')}")


class Redis:
    """redis-server on a Unix socket in a temporary directory, with its append-only file there
    (a restart keeps the nonces and limits, as the README asks of a production Redis)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="carapace-soak-redis-")
        self.sock = os.path.join(self.dir, "redis.sock")
        self.proc = None

    def start(self):
        self.proc = start("redis", [
            "redis-server", "--port", "0", "--unixsocket", self.sock, "--unixsocketperm", "700",
            "--dir", self.dir, "--maxmemory-policy", "noeviction", "--save", "",
            "--appendonly", "yes", "--appendfsync", "everysec"])
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.cli("ping").startswith("PONG"):
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING within 10 s")

    def cli(self, *args):
        r = subprocess.run(["redis-cli", "-s", self.sock, *args], capture_output=True,
                           text=True)
        return r.stdout.strip()

    def stop(self):
        stop(self.proc)

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def proc_status(pid):
    """(VmRSS kB, open fds) of a process, None if it is gone."""
    try:
        rss = 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------
# 3. what each kind of call should get


class State:
    """What the fronts are doing now (Redis down, tools killed, configuration variant), and
    the transitions: while one is open, and for calls that overlap it, either side's answer
    is right."""

    def __init__(self):
        self.lock = threading.Lock()
        self.cur = {"redis_down": False, "killed": frozenset(), "variant": "A"}
        self.transitions = []  # [t0, t1 or None, old, new]

    def now(self):
        with self.lock:
            return self.cur

    def begin(self, **change):
        with self.lock:
            old = self.cur
            self.cur = dict(old, **change)
            tr = [time.monotonic(), None, old, self.cur]
            self.transitions.append(tr)
            return tr

    def end(self, tr):
        with self.lock:
            tr[1] = time.monotonic()

    def states_during(self, s, e, at_start, at_end):
        out = [at_start, at_end]
        with self.lock:
            for t0, t1, old, new in self.transitions:
                if t0 <= e and (t1 is None or t1 >= s):
                    out += [old, new]
        return out


SHARED = {"tools": ("DEPENDENCY_UNAVAILABLE", "shared_state_unavailable"),
          "skill": ("SKILL_HTTP_ERROR", "shared_state_unavailable")}

# front -> kind -> (expected code, reason or None for any, whether the call needs Redis).
# The order of the filters (README, "How a call goes through") decides what needs Redis:
# tools-v1 has a per-peer limit (stage 4), so every call of the paired peer asks Redis before
# the body is read; skill-v1 has no per-peer limit, so only the memory.delete limit (stage 7)
# and the nonce of a call whose signature and timestamp verified (stage 8) ask Redis.
EXPECT = {
    "tools": {
        "query": ("ok", None, True),
        "append": ("ok", None, True),
        "list": ("ok", None, True),
        "bad_args": ("INVALID_ARGS", "input_schema", True),
        "bad_envelope": ("INVALID_ARGS", "invalid_request", True),
        "malformed_json": ("INVALID_ARGS", "invalid_request", True),
        "unknown_tool": ("TOOL_NOT_FOUND", None, True),
        "no_route": ("INVALID_ARGS", "no_route", True),
        "wrong_method": ("INVALID_ARGS", "method_not_allowed", True),
        "too_large": ("INVALID_ARGS", "payload_too_large", True),
        "dup_credential": ("UNAUTHORIZED", None, False),
        "unpaired": ("PAIRING_REQUIRED", None, False),
        "revoked": ("FORBIDDEN", None, False),
        "slow": ("TIMEOUT", "timeout", True),
        "burst_allowed": ("NOT_FOUND", None, True),  # the app's own answer, passed through
        "burst_limited": ("RATE_LIMITED", "rate_limited", True),
    },
    "skill": {
        "query": ("ok", None, True),
        "append": ("ok", None, True),
        "list": ("ok", None, False),  # GET /manifest
        "bad_args": ("SCHEMA_VALIDATION_FAILED", "input_schema", True),
        "malformed_json": ("SCHEMA_VALIDATION_FAILED", "invalid_request", False),
        "unknown_tool": ("ROUTING_FAILED", None, False),
        "no_route": ("ROUTING_FAILED", "no_route", False),
        # README: "ROUTING_FAILED 404 (405 for a wrong method)"; the skill-v1 front answers
        # GET /run 404 no_route. The code is right; the status is counted in http_by_kind.
        "wrong_method": ("ROUTING_FAILED", None, False),
        "too_large": ("SCHEMA_VALIDATION_FAILED", "payload_too_large", False),
        "dup_credential": ("SKILL_AUTH_FAILED", None, False),
        "bad_signature": ("SKILL_AUTH_FAILED", "auth_failed", False),
        "bad_version": ("PROTOCOL_VERSION_UNSUPPORTED", None, False),
        "stale": ("NONCE_REPLAY", "stale_timestamp", False),
        "replay_first": ("ok", None, True),
        "replay": ("NONCE_REPLAY", "nonce_replay", True),
        "slow": ("SKILL_TIMEOUT", "timeout", True),
        "burst_allowed": ("NOT_FOUND", None, True),
        "burst_limited": ("SKILL_HTTP_ERROR", "rate_limited", True),
    },
}
KILLED_TOOL = "memory.append"
KILLED = {"tools": ("DEPENDENCY_UNAVAILABLE", "kill_switch"),
          "skill": ("GATEWAY_DISABLED", "kill_switch")}


def expected(front, kind, st):
    code, reason, needs_redis = EXPECT[front][kind]
    killed = kind == "append" and KILLED_TOOL in st["killed"]
    # tools-v1: the per-peer limit (Redis) comes before the per-tool kill-switch;
    # skill-v1: the per-tool kill-switch comes before the nonce (Redis).
    if killed and front == "skill":
        return KILLED[front]
    if st["redis_down"] and needs_redis:
        return SHARED[front]
    if killed:
        return KILLED[front]
    return (code, reason)


def matches(got, exp):
    code, reason = got
    return code == exp[0] and (exp[1] is None or reason == exp[1])


# ---------------------------------------------------------------------------------------------
# 4. the driver


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.total = {}        # front -> code -> n
        self.window = {}       # front -> code -> n, since the last sample
        self.by_kind = {}      # "front kind" -> code -> n
        self.unexpected = 0
        self.unexpected_window = 0
        self.unexpected_by = {}  # "front kind: got code/reason" -> n
        self.examples = []
        self.reconnects = 0
        self.reconnect_by = {}   # "error after <previous call on the connection>" -> n
        self.http_by_kind = {}   # "front kind" -> HTTP status -> n
        self.latency = {"tools": [], "skill": []}  # good calls in this window, ms
        self.first_ok_after = {}  # front -> monotonic time of the first good ok after a mark
        self.mark = None

    def record(self, front, kind, got, ok, detail, dur_ms):
        code = got[0]
        with self.lock:
            h = self.http_by_kind.setdefault(f"{front} {kind}", {})
            h[str(detail["http"])] = h.get(str(detail["http"]), 0) + 1
            for d in (self.total, self.window):
                d.setdefault(front, {}).setdefault(code, 0)
                d[front][code] += 1
            k = self.by_kind.setdefault(f"{front} {kind}", {})
            k[code] = k.get(code, 0) + 1
            if kind in ("query", "append") and code == "ok":
                self.latency[front].append(dur_ms)
                if self.mark is not None and front not in self.first_ok_after:
                    self.first_ok_after[front] = time.monotonic()
            if not ok:
                self.unexpected += 1
                self.unexpected_window += 1
                key = f"{front} {kind}: got {got[0]}/{got[1]}"
                self.unexpected_by[key] = self.unexpected_by.get(key, 0) + 1
                if len(self.examples) < 50:
                    self.examples.append(detail)

    def take_window(self):
        with self.lock:
            w, self.window = self.window, {}
            u, self.unexpected_window = self.unexpected_window, 0
            lat, self.latency = self.latency, {"tools": [], "skill": []}
        return w, u, lat


def tls_context(cert):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(p("ca.pem"))
    ctx.load_cert_chain(p(f"{cert}.crt"), p(f"{cert}.key"))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class Conn:
    """One keep-alive HTTP/1.1 connection (TLS with a client certificate, or plain)."""

    def __init__(self, port, ctx, stats):
        self.port, self.ctx, self.stats = port, ctx, stats
        self.c, self.used = None, 0
        self.last = None  # what the previous request on this connection was, and its answer

    def close(self):
        if self.c is not None:
            self.c.close()
        self.c, self.used = None, 0

    def _open(self):
        if self.ctx is None:
            self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        else:
            self.c = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=15,
                                                 context=self.ctx)
        self.used = 0

    def request(self, method, path, body=None, headers=(), fresh=False, label=""):
        """Send and read the whole answer: (HTTP status, body bytes). `body` may be a
        function (called for each attempt: a signed body gets a fresh nonce). A failure on a
        connection already used once is retried once on a new one (the server may have closed
        it while idle); every such retry is counted."""
        if fresh:
            self.close()
        for attempt in (0, 1):
            if self.c is None:
                self._open()
            reused = self.used > 0
            data = body() if callable(body) else body
            try:
                self.c.putrequest(method, path, skip_accept_encoding=True)
                for k, v in headers:
                    self.c.putheader(k, v)
                if data is not None:
                    self.c.putheader("Content-Type", "application/json")
                    self.c.putheader("Content-Length", str(len(data)))
                self.c.endheaders(data)
                r = self.c.getresponse()
                out = r.read()
                self.used += 1
                if r.will_close:
                    self.close()
                else:
                    self.last = f"{label} {r.status}"
                return r.status, out
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                    ssl.SSLEOFError) as e:
                last = self.last
                self.close()
                if reused and attempt == 0:
                    key = f"{type(e).__name__} after {last}"
                    with self.stats.lock:
                        self.stats.reconnects += 1
                        self.stats.reconnect_by[key] = self.stats.reconnect_by.get(key, 0) + 1
                    continue
                raise e
            except Exception:
                self.close()
                raise


def canonical(v):
    """JavaScript-compatible canonical JSON for the values the driver signs (ASCII strings,
    small integers, objects, arrays)."""
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def now_ms():
    return int(time.time() * 1000)


class Driver:
    def __init__(self, ports, stats, state, secret):
        self.ports, self.stats, self.state = ports, stats, state
        self.secret = secret.encode()
        self.stop = threading.Event()
        self.burst_lock = threading.Lock()  # reloads wait for a burst to finish
        self.ctx = {c: tls_context(c) for c in ("paired", "revoked", "unpaired")}
        self.threads = []

    # -- bodies

    def tools_call(self, tool, args, **extra):
        body = {"version": "v1", "call_id": str(uuid.uuid4()), "tool_name": tool,
                "tenant_id": "soak", "args": args,
                "context": {"agent_id": "soak", "session_id": "soak"}}
        body.update(extra)
        return json.dumps(body).encode()

    def signed(self, capability, inp, ts=None, nonce=None, version="1.0", tamper=False):
        body = {"gateway_protocol_version": version, "skill_id": SKILL_ID,
                "capability": capability, "input": inp,
                "timestamp": now_ms() if ts is None else ts,
                "nonce": nonce or uuid.uuid4().hex}
        sig = hmac.new(self.secret, canonical(body).encode(), hashlib.sha256).hexdigest()
        if tamper:
            sig = ("0" if sig[0] != "0" else "1") + sig[1:]
        body["signature"] = sig
        return json.dumps(body).encode()

    # -- one call: send, classify, check

    def call(self, front, kind, conn, method, path, body=None, headers=(), fresh=False,
             exp_override=None):
        st0 = self.state.now()
        s = time.monotonic()
        http_status = None
        try:
            http_status, data = conn.request(method, path, body, headers, fresh,
                                             label=f"{front} {kind}")
            got = classify(front, http_status, data)
            text = data[:300].decode("utf-8", "replace")
        except Exception as e:  # noqa: BLE001 - a transport failure is an answer to count
            got = (f"TRANSPORT:{type(e).__name__}", str(e)[:100])
            text = str(e)[:300]
        e_ = time.monotonic()
        st1 = self.state.now()
        if exp_override is not None:
            exps = exp_override(self.state.states_during(s, e_, st0, st1))
        else:
            exps = {expected(front, kind, st) for st in
                    self.state.states_during(s, e_, st0, st1)}
        ok = any(matches(got, x) for x in exps)
        detail = {"at": datetime.datetime.now().isoformat(timespec="milliseconds"),
                  "front": front, "kind": kind, "http": http_status, "got": list(got),
                  "expected": sorted(list(x) for x in exps), "answer": text,
                  "duration_ms": round((e_ - s) * 1000, 1)}
        self.stats.record(front, kind, got, ok, detail, (e_ - s) * 1000)
        return got

    # -- threads

    def spawn(self, name, fn):
        t = threading.Thread(target=self.loop, args=(name, fn), name=name, daemon=True)
        self.threads.append(t)
        t.start()

    def loop(self, name, fn):
        while not self.stop.is_set():
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a driver bug must not end the soak quietly
                log(f"{name}: driver error {type(e).__name__}: {e}")
                time.sleep(1)

    def start(self):
        for i in range(2):
            self.spawn(f"tools-good-{i}", self.tools_good(Conn(self.ports["tools"],
                                                               self.ctx["paired"], self.stats)))
            self.spawn(f"skill-good-{i}", self.skill_good(Conn(self.ports["skill"], None,
                                                               self.stats)))
        self.spawn("tools-bad", self.tools_bad())
        self.spawn("skill-bad", self.skill_bad())
        self.spawn("tools-burst", self.burst("tools"))
        self.spawn("skill-burst", self.burst("skill"))
        self.spawn("tools-slow", self.slow("tools"))
        self.spawn("skill-slow", self.slow("skill"))

    def halt(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=20)

    def pause(self, s):
        self.stop.wait(s)

    def tools_good(self, conn):
        rnd = random.Random()

        def step():
            r = rnd.random()
            if r < 0.8:
                self.call("tools", "query", conn, "POST", "/v1/tools/call",
                          self.tools_call("memory.query", {"query": "soak", "limit": 5}))
            elif r < 0.9:
                self.call("tools", "append", conn, "POST", "/v1/tools/call",
                          self.tools_call("memory.append",
                                          {"text": f"soak {uuid.uuid4().hex[:8]}",
                                           "tags": ["soak"]}))
            else:
                self.call("tools", "list", conn, "GET", "/v1/tools")
            self.pause(0.03)
        return step

    def skill_good(self, conn):
        rnd = random.Random()

        def step():
            r = rnd.random()
            if r < 0.85:
                self.call("skill", "query", conn, "POST", "/run",
                          lambda: self.signed("memory.query", {"query": "soak", "limit": 5}))
            elif r < 0.95:
                self.call("skill", "append", conn, "POST", "/run",
                          lambda: self.signed("memory.append",
                                              {"text": f"soak {uuid.uuid4().hex[:8]}"}))
            else:
                self.call("skill", "list", conn, "GET", "/manifest")
            self.pause(0.03)
        return step

    def tools_bad(self):
        conn = Conn(self.ports["tools"], self.ctx["paired"], self.stats)
        fresh_paired = Conn(self.ports["tools"], self.ctx["paired"], self.stats)
        unpaired = Conn(self.ports["tools"], self.ctx["unpaired"], self.stats)
        revoked = Conn(self.ports["tools"], self.ctx["revoked"], self.stats)
        big = json.dumps({"version": "v1", "call_id": "big", "tool_name": "memory.append",
                          "tenant_id": "soak", "args": {"text": "x" * (MAX_BODY + 4096)},
                          "context": {"agent_id": "soak", "session_id": "soak"}}).encode()
        call = "/v1/tools/call"
        cases = [
            lambda: self.call("tools", "bad_args", conn, "POST", call,
                              self.tools_call("memory.query", {"query": 5})),
            lambda: self.call("tools", "bad_envelope", conn, "POST", call,
                              json.dumps({"version": "v1", "call_id": "x",
                                          "tool_name": "memory.query",
                                          "args": {"query": "a"}}).encode()),
            lambda: self.call("tools", "malformed_json", conn, "POST", call,
                              b'{"version": "v1", "call_id": '),
            lambda: self.call("tools", "unknown_tool", conn, "POST", call,
                              self.tools_call("memory.nope", {})),
            lambda: self.call("tools", "no_route", conn, "GET", "/v1/nope"),
            lambda: self.call("tools", "wrong_method", conn, "GET", call),
            lambda: self.call("tools", "too_large", fresh_paired, "POST", call, big,
                              fresh=True),
            lambda: self.call("tools", "dup_credential", conn, "POST", call,
                              self.tools_call("memory.query", {"query": "a"}),
                              headers=[("Authorization", "Bearer a"),
                                       ("Authorization", "Bearer b")]),
            lambda: self.call("tools", "unpaired", unpaired, "POST", call,
                              self.tools_call("memory.query", {"query": "a"}), fresh=True),
            lambda: self.call("tools", "revoked", revoked, "POST", call,
                              self.tools_call("memory.query", {"query": "a"}), fresh=True),
        ]
        i = [0]

        def step():
            cases[i[0] % len(cases)]()
            i[0] += 1
            self.pause(0.05)
        return step

    def skill_bad(self):
        conn = Conn(self.ports["skill"], None, self.stats)
        fresh = Conn(self.ports["skill"], None, self.stats)
        big = self.signed("memory.append", {"text": "x" * (MAX_BODY + 4096)})
        stale = now_ms() - 600_000

        def replay():
            body = self.signed("memory.query", {"query": "soak"})
            self.call("skill", "replay_first", conn, "POST", "/run", body)
            self.call("skill", "replay", conn, "POST", "/run", body)

        cases = [
            lambda: self.call("skill", "bad_args", conn, "POST", "/run",
                              lambda: self.signed("memory.query", {"query": 5})),
            lambda: self.call("skill", "malformed_json", conn, "POST", "/run",
                              b'{"gateway_protocol_version": "1.0", '),
            lambda: self.call("skill", "unknown_tool", conn, "POST", "/run",
                              lambda: self.signed("memory.nope", {})),
            lambda: self.call("skill", "no_route", conn, "POST", "/nope", b"{}"),
            lambda: self.call("skill", "wrong_method", conn, "GET", "/run"),
            lambda: self.call("skill", "too_large", fresh, "POST", "/run", big, fresh=True),
            lambda: self.call("skill", "dup_credential", conn, "POST", "/run",
                              lambda: self.signed("memory.query", {"query": "a"}),
                              headers=[("X-Skill-Signature", "a"),
                                       ("X-Skill-Signature", "b")]),
            lambda: self.call("skill", "bad_signature", conn, "POST", "/run",
                              lambda: self.signed("memory.query", {"query": "a"},
                                                  tamper=True)),
            lambda: self.call("skill", "bad_version", conn, "POST", "/run",
                              lambda: self.signed("memory.query", {"query": "a"},
                                                  version="9.9")),
            lambda: self.call("skill", "stale", conn, "POST", "/run",
                              lambda: self.signed("memory.query", {"query": "a"}, ts=stale)),
            replay,
        ]
        i = [0]

        def step():
            cases[i[0] % len(cases)]()
            i[0] += 1
            self.pause(0.05)
        return step

    def burst(self, front):
        """BURST_CALLS memory.delete calls back to back, every BURST_EVERY_S: the first
        `burst` of them reach the app (which answers NOT_FOUND: no such entry), the rest are
        rate limited. A call more than 0.9 s after the burst began may have been let through
        by the refill, so it may get either."""
        conn = Conn(self.ports[front], self.ctx["paired"] if front == "tools" else None,
                    self.stats)
        path = "/v1/tools/call" if front == "tools" else "/run"

        def body():
            if front == "tools":
                return self.tools_call("memory.delete", {"id": "none"})
            return self.signed("memory.delete", {"id": "none"})

        def step():
            with self.burst_lock:
                b = BURST[self.state.now()["variant"]]
                t0 = time.monotonic()
                for i in range(BURST_CALLS):
                    def exp(states, i=i):
                        late = time.monotonic() - t0 > 0.9
                        out = set()
                        for st in states:
                            kinds = ["burst_allowed", "burst_limited"] if late else \
                                ["burst_allowed" if i < b else "burst_limited"]
                            out |= {expected(front, k, st) for k in kinds}
                        return out
                    kind = "burst_allowed" if i < b else "burst_limited"
                    self.call(front, kind, conn, "POST", path, body, exp_override=exp)
            self.pause(BURST_EVERY_S)
        return step

    def slow(self, front):
        conn = Conn(self.ports[front], self.ctx["paired"] if front == "tools" else None,
                    self.stats)

        def step():
            if front == "tools":
                self.call(front, "slow", conn, "POST", "/v1/tools/call",
                          self.tools_call("memory.query",
                                          {"query": "soak", "delay_ms": SLOW_DELAY_MS},
                                          timeout_ms=5000))
            else:
                self.call(front, "slow", conn, "POST", "/run",
                          lambda: self.signed("memory.query",
                                              {"query": "soak", "delay_ms": SLOW_DELAY_MS}))
            self.pause(1.0)
        return step


def classify(front, status, data):
    """(code, reason) of an answer: `ok`, the error code, or HTTP_<status> when the answer is
    not the front's JSON."""
    try:
        doc = json.loads(data)
    except ValueError:
        return (f"HTTP_{status}", None)
    if not isinstance(doc, dict):
        return (f"HTTP_{status}", None)
    if front == "tools":
        if status == 200 and isinstance(doc.get("tools"), list):
            return ("ok", None)
        if doc.get("status") == "ok":
            return ("ok", None)
        err = doc.get("error")
        if isinstance(err, dict) and err.get("code"):
            details = err.get("details") or {}
            return (err["code"], details.get("reason") if isinstance(details, dict) else None)
        return (f"HTTP_{status}", None)
    if doc.get("ok") is True:
        return ("ok", None)
    if status == 200 and "capabilities" in doc:
        return ("ok", None)
    if doc.get("error_code"):
        details = doc.get("details") or {}
        return (doc["error_code"], details.get("reason") if isinstance(details, dict) else None)
    return (f"HTTP_{status}", None)


# ---------------------------------------------------------------------------------------------
# 5. the run


def reloads_ok(ops_port):
    _, text = http_get(ops_port, "/metrics")
    m = re.search(r'^carapace_config_reloads_total\{result="ok"\} (\d+)', text or "", re.M)
    return int(m.group(1)) if m else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30, help="length of the run (default 30)")
    ap.add_argument("--no-build", action="store_true", help="skip cargo build --release")
    args = ap.parse_args()
    D = args.minutes * 60
    for tool in ("redis-server", "redis-cli", "openssl"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is needed (Debian: redis-server, openssl)")
    if not args.no_build:
        log("cargo build --release --bin carapace")
        run(["cargo", "build", "--release", "--bin", "carapace"], cwd=ROOT)
    if os.path.exists(SOAK):
        shutil.rmtree(SOAK)
    for d in ("tools", "skill"):
        os.makedirs(p(d), exist_ok=True)
    make_certs()

    ports = {k: free_port() for k in ("app", "tools", "skill", "tools_ops", "skill_ops")}
    redis = Redis()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    atexit.register(redis.cleanup)
    atexit.register(stop_all)
    for front in ("tools", "skill"):
        for v in ("B", "A"):
            write_config(front, v, ports, redis.sock)
        r = subprocess.run([CARAPACE, "check", "-c", p(front, "carapace.B.yaml")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"configuration B of {front} does not validate:\n{r.stderr}")

    log(f"redis on {redis.sock}; app :{ports['app']}; tools :{ports['tools']} (mTLS); "
        f"skill :{ports['skill']}")
    redis.start()
    app = start("app", [CARAPACE, "sample-app", "--listen", f"127.0.0.1:{ports['app']}"])
    wait_port(ports["app"], app, "app")
    procs = {}
    for front in ("tools", "skill"):
        procs[front] = start(front, [CARAPACE, "serve", "-c", p(front, "carapace.yaml")])
    for front in ("tools", "skill"):
        wait_ready(ports[f"{front}_ops"], procs[front], front)

    stats, state = Stats(), State()
    driver = Driver(ports, stats, state, open(p("hmac.key")).read())
    events = []

    t_start = time.monotonic()
    wall_start = datetime.datetime.now(datetime.timezone.utc)

    def at():
        return round(time.monotonic() - t_start, 1)

    def event(what):
        events.append({"t_s": at(), "event": what})
        log(what)

    # --- the schedule, as fractions of the run (kept apart so that no two overlap)
    warmup = min(30.0, max(5.0, D * 0.05))
    kill_len = min(120.0, max(8.0, D * 0.07))
    schedule = [
        (0.15 * D, "reload", "B"), (0.25 * D, "kill", None),
        (0.25 * D + kill_len, "release", None), (0.42 * D, "reload", "A"),
        (0.50 * D, "reload", "B"), (0.58 * D, "redis", None), (0.72 * D, "reload", "A"),
        (0.86 * D, "reload", "B"),
    ]

    def reload(variant):
        with driver.burst_lock:
            tr = state.begin(variant=variant)
            for front in ("tools", "skill"):
                write_config(front, variant, ports, redis.sock)
            r = subprocess.run([CARAPACE, "reload", "-c", p("tools", "carapace.yaml")],
                               capture_output=True, text=True)
            tools_res = f"carapace reload exit {r.returncode} {r.stdout.strip()[:200]}"
            before = reloads_ok(ports["skill_ops"])
            os.kill(procs["skill"].pid, signal.SIGHUP)
            deadline = time.time() + 15
            while reloads_ok(ports["skill_ops"]) <= before and time.time() < deadline:
                time.sleep(0.05)
            skill_res = ("SIGHUP applied" if reloads_ok(ports["skill_ops"]) > before
                         else "SIGHUP: no successful reload seen within 15 s")
            time.sleep(0.2)
            state.end(tr)
        event(f"reload to configuration {variant} (memory.delete burst {BURST[variant]}): "
              f"tools: {tools_res}; skill: {skill_res}")

    def kill_switch(action):
        killed = frozenset({KILLED_TOOL}) if action == "engage" else frozenset()
        tr = state.begin(killed=killed)
        res = []
        for front in ("tools", "skill"):
            r = subprocess.run([CARAPACE, "kill-switch", action, "--tool", KILLED_TOOL, "-c",
                                p(front, "carapace.yaml")], capture_output=True, text=True)
            res.append(f"{front}: exit {r.returncode}")
        time.sleep(0.2)
        state.end(tr)
        event(f"kill-switch {action} --tool {KILLED_TOOL} ({', '.join(res)})")

    def redis_restart(record):
        tr = state.begin(redis_down=True)
        t0 = time.monotonic()
        redis.stop()
        time.sleep(0.3)
        state.end(tr)
        event(f"redis stopped (SIGTERM, exited in {time.monotonic() - t0:.2f} s); "
              f"down for {REDIS_DOWN_S} s")
        driver.pause(REDIS_DOWN_S)
        tr = state.begin(redis_down=False)
        with stats.lock:
            stats.first_ok_after = {}
            stats.mark = time.monotonic()
        redis.start()
        up = time.monotonic()
        event(f"redis started again (PING answered {up - stats.mark:.2f} s after the start)")
        driver.pause(RECOVERY_GRACE_S)
        state.end(tr)
        with stats.lock:
            rec = {f: round(t - stats.mark, 2) for f, t in stats.first_ok_after.items()}
            stats.mark = None
        record["redis_recovery_s"] = rec
        event(f"first good call ok, seconds after redis-server was started again: {rec}")

    samples = []
    result = {"machine": machine_info(), "settings": {
        "minutes": args.minutes, "sample_s": SAMPLE_S, "warmup_s": warmup,
        "kill_switch_s": kill_len, "redis_down_s": REDIS_DOWN_S,
        "recovery_grace_s": RECOVERY_GRACE_S, "query_timeout_ms": QUERY_TIMEOUT_MS,
        "slow_delay_ms": SLOW_DELAY_MS, "max_body_bytes": MAX_BODY,
        "delete_limit": {v: {"per_second": DELETE_RATE, "burst": b} for v, b in BURST.items()},
        "burst_calls": BURST_CALLS, "burst_every_s": BURST_EVERY_S, "ports": ports,
        "started": wall_start.isoformat(timespec="seconds")},
        "events": events, "samples": samples}

    def sample():
        w, u, lat = stats.take_window()
        s = {"t_s": at(), "codes": w, "unexpected": u, "redis_down": state.now()["redis_down"],
             "processes": {}}
        for name, proc in [("tools", procs["tools"]), ("skill", procs["skill"]), ("app", app),
                           ("redis", redis.proc)]:
            st = proc_status(proc.pid)
            s["processes"][name] = ({"rss_kb": st[0], "fds": st[1]} if st
                                    else {"gone": proc.poll()})
        for front, v in lat.items():
            if v:
                v.sort()
                s.setdefault("good_latency_ms", {})[front] = {
                    "n": len(v), "p50": round(v[len(v) // 2], 2),
                    "p99": round(v[min(len(v) - 1, int(len(v) * 0.99))], 2),
                    "max": round(v[-1], 2)}
        samples.append(s)
        n = sum(sum(c.values()) for c in w.values())
        log(f"sample t={s['t_s']:.0f}s: {n} answers, {u} unexpected; " + ", ".join(
            f"{k} {v.get('rss_kb', 0) / 1024:.1f} MB / {v.get('fds', '?')} fds"
            for k, v in s["processes"].items() if k in ("tools", "skill")))
        for front in ("tools", "skill"):
            if procs[front].poll() is not None:
                event(f"carapace {front} exited with {procs[front].returncode}: run ended early")
                return False
        return True

    result["metrics_start"] = {f: http_get(ports[f"{f}_ops"], "/metrics")[1]
                               for f in ("tools", "skill")}
    driver.start()
    event(f"driver started; run of {D / 60:.1f} min, warm-up {warmup:.0f} s")
    try:
        driver.pause(warmup)
        stats.take_window()  # the warm-up is not a sample
        with stats.lock:
            warm_total = {f: dict(c) for f, c in stats.total.items()}
        result["warmup_codes"] = warm_total
        alive = sample()
        next_sample = time.monotonic() + SAMPLE_S
        end = t_start + D
        while alive and time.monotonic() < end:
            now = time.monotonic()
            if schedule and now - t_start >= schedule[0][0]:
                _, what, arg = schedule.pop(0)
                if what == "reload":
                    reload(arg)
                elif what == "kill":
                    kill_switch("engage")
                elif what == "release":
                    kill_switch("release")
                elif what == "redis":
                    redis_restart(result)
                continue
            if now >= next_sample:
                alive = sample()
                next_sample += SAMPLE_S
                continue
            due = min([next_sample, end] + [t_start + x[0] for x in schedule[:1]])
            time.sleep(max(0.0, due - time.monotonic()))
        if alive:
            sample()
    finally:
        driver.halt()
        event("driver stopped")
        result["metrics_end"] = {f: http_get(ports[f"{f}_ops"], "/metrics")[1]
                                 for f in ("tools", "skill")}
        result["duration_s"] = at()
        for front in ("tools", "skill"):
            result.setdefault("exit", {})[front] = procs[front].poll()
        stop_all()
        for front in ("tools", "skill"):
            with open(p(f"{front}.log"), errors="replace") as f:
                lines = f.readlines()
            result.setdefault("logs", {})[front] = {
                "lines": len(lines),
                "panics": [ln.strip()[:300] for ln in lines if "panicked" in ln][:20],
                "errors": [ln.strip()[:300] for ln in lines if " ERROR " in ln][:20],
                "error_lines": sum(1 for ln in lines if " ERROR " in ln),
                "warn_lines": sum(1 for ln in lines if " WARN " in ln)}
        with stats.lock:
            result["totals"] = stats.total
            result["by_kind"] = stats.by_kind
            result["unexpected"] = stats.unexpected
            result["unexpected_by"] = stats.unexpected_by
            result["unexpected_examples"] = stats.examples
            result["reconnects"] = stats.reconnects
            result["reconnect_by"] = stats.reconnect_by
            result["http_by_kind"] = stats.http_by_kind
        with open(os.path.join(OUT, "soak.json"), "w") as f:
            json.dump(result, f, indent=1)
    table = report(result)
    with open(os.path.join(OUT, "soak.md"), "w") as f:
        f.write(table)
    print()
    print(table)
    log(f"wrote {os.path.join(OUT, 'soak.json')} and {os.path.join(OUT, 'soak.md')}")
    return 0 if result["unexpected"] == 0 else 1


# ---------------------------------------------------------------------------------------------
# 6. report


def slope_kb_per_min(samples, name, key):
    """Least-squares slope of a process's figure over the second half of the run."""
    pts = [(s["t_s"], s["processes"][name][key]) for s in samples
           if key in s["processes"].get(name, {})]
    pts = pts[len(pts) // 2:]
    if len(pts) < 3:
        return None
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den * 60 if den else None


def report(r):
    S = r["samples"]
    total = sum(sum(c.values()) for c in r["totals"].values())
    lines = [
        f"Soak: {r['duration_s'] / 60:.1f} min, {total:,} requests "
        f"({total / r['duration_s']:.0f}/s), {r['unexpected']} unexpected answers, "
        f"{r['reconnects']} keep-alive reconnects.",
        "",
        "| front | code | answers |",
        "|---|---|---:|",
    ]
    for front in ("tools", "skill"):
        for code, n in sorted(r["totals"].get(front, {}).items(), key=lambda x: -x[1]):
            lines.append(f"| {front} | {code} | {n:,} |")
    lines += ["", "| process | RSS start MB | RSS end MB | RSS max MB | RSS slope, 2nd half, "
              "kB/min | fds start | fds end | fds max |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("tools", "skill"):
        rss = [s["processes"][name]["rss_kb"] for s in S if "rss_kb" in s["processes"][name]]
        fds = [s["processes"][name]["fds"] for s in S if "fds" in s["processes"][name]]
        if not rss:
            continue
        sl = slope_kb_per_min(S, name, "rss_kb")
        lines.append(f"| carapace {name} | {rss[0] / 1024:.1f} | {rss[-1] / 1024:.1f} | "
                     f"{max(rss) / 1024:.1f} | {'n/a' if sl is None else f'{sl:+.1f}'} | "
                     f"{fds[0]} | {fds[-1]} | {max(fds)} |")
    if r.get("reconnect_by"):
        lines += ["", "Keep-alive connections found closed by the server (the call was sent "
                  "again on a new connection):", ""]
        for k, n in sorted(r["reconnect_by"].items(), key=lambda x: -x[1]):
            lines.append(f"- {k}: {n}")
    if r["unexpected"]:
        lines += ["", "Unexpected answers:", ""]
        for k, n in sorted(r["unexpected_by"].items(), key=lambda x: -x[1]):
            lines.append(f"- {k}: {n}")
    lines += ["", "Events:", ""] + [f"- {e['t_s']:.0f} s: {e['event']}" for e in r["events"]]
    for front, lg in r.get("logs", {}).items():
        if lg["panics"] or lg["error_lines"]:
            lines.append(f"- carapace {front} log: {len(lg['panics'])} panics, "
                         f"{lg['error_lines']} ERROR lines")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        stop_all()
        sys.exit(130)
