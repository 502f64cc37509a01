//! Fault-injecting apps (issue 13): a fake app written on raw TCP, so it can break HTTP at the
//! byte level, answers discovery correctly and each call with a chosen fault. For every fault
//! and every front that applies, the caller gets the documented code within the call's
//! timeout, no answer of the broken app reaches the caller, the metrics count the failure, and
//! nothing leaks: after the fault the app behaves again and the next call succeeds, with no
//! connection to the app left open beyond the pool's idle connections and no concurrency slot
//! held (`max_in_flight` is 2 and every fault is hit 3 times, more than `pool.max_idle`).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use carapace::client::{signed_run, Client, Reply, Transport};
use carapace::server::Running;
use common::{call, code, Env};
use http::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The tool of the tools-v1 app.
const TOOL: &str = "fault.echo";
/// The skill id and only capability of the skill-v1 app, and the skill-v1 front's skill id.
const SKILL: &str = "demo.echo";
const SECRET: &[u8] = b"front-secret";
/// Every call's timeout (the tools' `timeout_ms_max`).
const TIMEOUT_MS: u64 = 300;
/// `limits.max_response_bytes`: discovery answers are far below it.
const MAX_RESPONSE: usize = 4096;
/// `app.pool.max_idle`.
const MAX_IDLE: usize = 2;
/// Calls per fault: more than `MAX_IDLE` and than `limits.max_in_flight`.
const REPEAT: usize = 3;
/// Marks every answer the app writes: it must never reach the caller of a failed call.
const APP_MARK: &str = "written-by-the-app";

// ---------------------------------------------------------------------------------------------
// The fake app.

/// How the app answers calls (discovery is always answered correctly).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// A correct answer, keeping the connection alive.
    Good,
    /// Reads the request, then closes without a byte of answer.
    CloseBeforeAnswer,
    /// Closes after part of the status line and headers.
    CloseInHead,
    /// Closes after half the body announced by `Content-Length`.
    CloseInBody,
    /// Never answers (keeps the connection open until carapace closes it).
    Silent,
    /// Writes a correct answer one byte every 20 ms: several seconds in all.
    Drip,
    /// A correct answer padded beyond `max_response_bytes`, with its `Content-Length`.
    Oversized,
    /// The same, chunked (no length known in advance).
    OversizedChunked,
    /// A 200 whose body is not JSON.
    InvalidJson,
    /// `Content-Length` 10 bytes shorter than the body written (the rest trails on the
    /// connection, which is kept alive).
    ShortLength,
    /// `Content-Length` 50 bytes longer than the body, then the connection is closed.
    LongLengthThenClose,
    /// `Content-Length` 50 bytes longer than the body, and the connection stays open.
    LongLengthThenSilent,
    /// A correct HTTP/1.0 answer, its body delimited by closing the connection.
    Http10,
    /// `100 Continue`, then nothing.
    ContinueThenSilent,
    /// The headers of a correct answer, then a reset (`SO_LINGER` 0 and close).
    ResetAfterHead,
    /// Part of the status line, then a reset.
    ResetInHead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AppKind {
    ToolsV1,
    SkillV1,
}

struct FaultApp {
    kind: AppKind,
    fault: Mutex<Fault>,
    /// Connections accepted and not yet closed (by either side).
    open: AtomicUsize,
    /// Calls (not discovery) read whole.
    calls: AtomicUsize,
}

/// Counts a connection as open while it lives.
struct OpenGuard(Arc<FaultApp>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FaultApp {
    async fn start(kind: AppKind) -> (Arc<FaultApp>, SocketAddr) {
        let app = Arc::new(FaultApp {
            kind,
            fault: Mutex::new(Fault::Good),
            open: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
        });
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let a = app.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                a.open.fetch_add(1, Ordering::SeqCst);
                let guard = OpenGuard(a.clone());
                tokio::spawn(a.clone().serve(s, guard));
            }
        });
        (app, addr)
    }

    fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    fn discovery(&self) -> Value {
        match self.kind {
            AppKind::ToolsV1 => json!({
                "version": "v1",
                "service": "faults",
                "tools": [{
                    "name": TOOL,
                    "description": "answers with a chosen fault",
                    "input_schema": {"type": "object"},
                    "output_schema": {"type": "object"},
                }],
            }),
            AppKind::SkillV1 => json!({
                "gateway_protocol_version": "1.0",
                "id": SKILL,
                "version": "1.0.0",
                "capabilities": [{
                    "capability": SKILL,
                    "description": "answers with a chosen fault",
                    "input_schema": {"type": "object"},
                    "output_schema": {"type": "object"},
                }],
            }),
        }
    }

    /// A correct answer to `request`, padded with `pad` bytes.
    fn answer(&self, request: &[u8], pad: usize) -> Vec<u8> {
        let req: Value = serde_json::from_slice(request).unwrap_or(Value::Null);
        let output = json!({"mark": APP_MARK, "pad": "x".repeat(pad)});
        let v = match self.kind {
            AppKind::ToolsV1 => json!({
                "version": "v1",
                "call_id": req["call_id"],
                "tool_name": req["tool_name"],
                "status": "ok",
                "result": output,
                "duration_ms": 1,
            }),
            AppKind::SkillV1 => json!({"ok": true, "output": output, "meta": {}}),
        };
        v.to_string().into_bytes()
    }

    async fn serve(self: Arc<Self>, mut s: TcpStream, _open: OpenGuard) {
        let mut buf = Vec::new();
        while let Some((method, body)) = read_request(&mut s, &mut buf).await {
            if method == "GET" {
                let doc = self.discovery().to_string().into_bytes();
                if s.write_all(&[head(doc.len()), doc].concat()).await.is_err() {
                    return;
                }
                continue;
            }
            self.calls.fetch_add(1, Ordering::SeqCst);
            let fault = *self.fault.lock().unwrap();
            let good = self.answer(&body, 0);
            let keep_alive = match fault {
                Fault::Good => write(&mut s, &[head(good.len()), good].concat()).await,
                Fault::CloseBeforeAnswer => false,
                Fault::CloseInHead => {
                    write(&mut s, b"HTTP/1.1 200 OK\r\ncontent-type: appl").await;
                    false
                }
                Fault::CloseInBody => {
                    let half = &good[..good.len() / 2];
                    write(&mut s, &[head(good.len()), half.to_vec()].concat()).await;
                    false
                }
                Fault::Silent => {
                    until_closed(&mut s).await;
                    false
                }
                Fault::Drip => {
                    for b in [head(good.len()), good].concat() {
                        if s.write_all(&[b]).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    true
                }
                Fault::Oversized => {
                    let big = self.answer(&body, 2 * MAX_RESPONSE);
                    write(&mut s, &[head(big.len()), big].concat()).await
                }
                Fault::OversizedChunked => {
                    let big = self.answer(&body, 2 * MAX_RESPONSE);
                    let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                    for chunk in big.chunks(1024) {
                        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                        out.extend_from_slice(chunk);
                        out.extend_from_slice(b"\r\n");
                    }
                    out.extend_from_slice(b"0\r\n\r\n");
                    write(&mut s, &out).await
                }
                Fault::InvalidJson => {
                    let bad = format!("{{\"mark\": \"{APP_MARK}\", oops").into_bytes();
                    write(&mut s, &[head(bad.len()), bad].concat()).await
                }
                Fault::ShortLength => write(&mut s, &[head(good.len() - 10), good].concat()).await,
                Fault::LongLengthThenClose => {
                    write(&mut s, &[head(good.len() + 50), good].concat()).await;
                    false
                }
                Fault::LongLengthThenSilent => {
                    write(&mut s, &[head(good.len() + 50), good].concat()).await;
                    until_closed(&mut s).await;
                    false
                }
                Fault::Http10 => {
                    let h = b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n";
                    write(&mut s, &[h.to_vec(), good].concat()).await;
                    false
                }
                Fault::ContinueThenSilent => {
                    write(&mut s, b"HTTP/1.1 100 Continue\r\n\r\n").await;
                    until_closed(&mut s).await;
                    false
                }
                Fault::ResetAfterHead => {
                    write(&mut s, &head(good.len())).await;
                    let _ = s.set_zero_linger();
                    false
                }
                Fault::ResetInHead => {
                    write(&mut s, b"HTTP/1.1 2").await;
                    let _ = s.set_zero_linger();
                    false
                }
            };
            if !keep_alive {
                return;
            }
        }
    }
}

/// The head of a 200 JSON answer of `len` bytes.
fn head(len: usize) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n")
        .into_bytes()
}

/// Write and flush `bytes`; whether the connection is still usable.
async fn write(s: &mut TcpStream, bytes: &[u8]) -> bool {
    s.write_all(bytes).await.is_ok() && s.flush().await.is_ok()
}

/// Read (and discard) until the peer closes.
async fn until_closed(s: &mut TcpStream) {
    let mut b = [0u8; 1024];
    while let Ok(n) = s.read(&mut b).await {
        if n == 0 {
            return;
        }
    }
}

/// Read one whole request (head and `Content-Length` body): its method and body. `None` once
/// the connection is closed.
async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let method = head.split(' ').next()?.to_string();
    let len: usize = head
        .split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = buf[head_end..head_end + len].to_vec();
    buf.drain(..head_end + len);
    Some((method, body))
}

// ---------------------------------------------------------------------------------------------
// The cases.

/// What the caller must get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// The app's answer.
    Ok,
    /// A broken answer: not retryable (the app may have acted on the call).
    Broken,
    /// The call's timeout.
    Timeout,
}

const CASES: &[(Fault, Expect)] = &[
    (Fault::Good, Expect::Ok),
    (Fault::CloseBeforeAnswer, Expect::Broken),
    (Fault::CloseInHead, Expect::Broken),
    (Fault::CloseInBody, Expect::Broken),
    (Fault::Silent, Expect::Timeout),
    (Fault::Drip, Expect::Timeout),
    (Fault::Oversized, Expect::Broken),
    (Fault::OversizedChunked, Expect::Broken),
    (Fault::InvalidJson, Expect::Broken),
    (Fault::ShortLength, Expect::Broken),
    (Fault::LongLengthThenClose, Expect::Broken),
    (Fault::LongLengthThenSilent, Expect::Timeout),
    (Fault::Http10, Expect::Ok),
    (Fault::ContinueThenSilent, Expect::Timeout),
    (Fault::ResetAfterHead, Expect::Broken),
    (Fault::ResetInHead, Expect::Broken),
];

/// A front and the app behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    /// tools-v1 front over a tools-v1 app; the paired gateway calls over mTLS.
    ToolsOverTools,
    /// tools-v1 front over a skill-v1 app; a local caller on the Unix socket.
    ToolsOverSkill,
    /// skill-v1 front over a tools-v1 app; signed `/run` on loopback TCP.
    SkillOverTools,
    /// MCP front (2026-07-28) over a tools-v1 app; a local caller on the Unix socket.
    McpOverTools,
}

impl Setup {
    fn front(self) -> &'static str {
        match self {
            Setup::SkillOverTools => "skill-v1",
            Setup::McpOverTools => "mcp",
            _ => "tools-v1",
        }
    }

    fn tool(self) -> &'static str {
        match self {
            Setup::ToolsOverSkill => SKILL,
            _ => TOOL,
        }
    }

    /// The caller's error code, status or HTTP status, and carapace's reason, as the README's
    /// error tables give them.
    fn expected(self, e: Expect) -> Option<(&'static str, &'static str, &'static str)> {
        let tools = self.front() == "tools-v1";
        let mcp = self.front() == "mcp";
        match e {
            Expect::Ok => None,
            Expect::Broken if mcp => Some(("DEPENDENCY_UNAVAILABLE", "isError", "app_invalid")),
            Expect::Timeout if mcp => Some(("TIMEOUT", "isError", "timeout")),
            Expect::Broken if tools => Some(("DEPENDENCY_UNAVAILABLE", "error", "app_invalid")),
            Expect::Broken => Some(("SKILL_HTTP_ERROR", "502", "app_invalid")),
            Expect::Timeout if tools => Some(("TIMEOUT", "timeout", "timeout")),
            Expect::Timeout => Some(("SKILL_TIMEOUT", "504", "timeout")),
        }
    }
}

struct Harness {
    setup: Setup,
    env: Env,
    running: Running,
    app: Arc<FaultApp>,
}

impl Harness {
    async fn start(setup: Setup) -> Harness {
        let env = Env::new().await;
        let kind = match setup {
            Setup::ToolsOverSkill => AppKind::SkillV1,
            _ => AppKind::ToolsV1,
        };
        let (app, addr) = FaultApp::start(kind).await;
        let d = env.path().display().to_string();
        let common = format!(
            r#"limits: {{ max_response_bytes: {MAX_RESPONSE}, max_in_flight: 2 }}
tools: {{ {tool}: {{ timeout_ms_max: {TIMEOUT_MS} }} }}
ops: {{ address: "127.0.0.1:0" }}
"#,
            tool = setup.tool()
        );
        let pool = format!(
            "pool: {{ max_idle: {MAX_IDLE}, connect_timeout_ms: 1000 }}, discovery: {{ interval_s: 0 }}"
        );
        let tools_front = format!(
            r#"front: {{ protocol: tools-v1 }}
listeners:
  unix: {{ path: {d}/tools.sock }}
  tcp:
    address: "127.0.0.1:0"
    tls: {{ cert_file: {d}/server.crt, key_file: {d}/server.key, client_ca_file: {d}/ca.pem }}
peers: {{ file: {d}/peers.json }}
"#
        );
        let yaml = match setup {
            Setup::McpOverTools => format!(
                "state_dir: {d}/state\n{}app: {{ protocol: tools-v1, address: \"http://{addr}\", {pool} }}\n{common}",
                tools_front.replace("protocol: tools-v1", "protocol: mcp")
            ),
            Setup::ToolsOverTools => format!(
                "state_dir: {d}/state\n{tools_front}app: {{ protocol: tools-v1, address: \"http://{addr}\", {pool} }}\n{common}"
            ),
            Setup::ToolsOverSkill => format!(
                r#"state_dir: {d}/state
{tools_front}app:
  protocol: skill-v1
  address: "http://{addr}"
  {pool_block}
  skill: {{ skill_id: {SKILL}, capabilities: [{SKILL}], timeout_ms_default: {TIMEOUT_MS}, timeout_ms_max: {TIMEOUT_MS} }}
{common}"#,
                pool_block = pool.replace(", discovery", "\n  discovery"),
            ),
            Setup::SkillOverTools => {
                std::fs::write(env.path().join("k0"), SECRET).unwrap();
                format!(
                    r#"state_dir: {d}/state
front: {{ protocol: skill-v1, skill_id: {SKILL}, auth: {{ mode: hmac, keys: [ {{ id: k0, secret: {{ file: {d}/k0 }} }} ] }} }}
listeners: {{ tcp: {{ address: "127.0.0.1:0" }} }}
app: {{ protocol: tools-v1, address: "http://{addr}", {pool} }}
{common}"#
                )
            }
        };
        let running = env.start(&yaml).await;
        Harness {
            setup,
            env,
            running,
            app,
        }
    }

    /// One call, bounded well past its timeout so that a hang fails instead of blocking.
    async fn call(&self) -> Result<(Reply, Duration), String> {
        let started = Instant::now();
        let input = json!({"message": "hi"});
        let sent = async {
            match self.setup {
                Setup::ToolsOverTools | Setup::ToolsOverSkill => {
                    let mut c = call(self.setup.tool(), input);
                    c["timeout_ms"] = json!(60_000);
                    let client = match self.setup {
                        Setup::ToolsOverTools => self.env.gateway(&self.running),
                        _ => self.env.local(&self.running),
                    };
                    client.post_json("/v1/tools/call", &[], &c).await
                }
                Setup::McpOverTools => {
                    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                        "params": {"name": TOOL, "arguments": input, "_meta": {
                            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                            "io.modelcontextprotocol/clientCapabilities": {}}}});
                    let headers = [
                        ("mcp-protocol-version", "2026-07-28"),
                        ("mcp-method", "tools/call"),
                        ("mcp-name", TOOL),
                    ];
                    self.env
                        .local(&self.running)
                        .post_json("/mcp", &headers, &body)
                        .await
                }
                Setup::SkillOverTools => {
                    let nonce = hex::encode(rand::random::<[u8; 16]>());
                    let now = carapace_filters::unix_now_ms();
                    let body = signed_run(SECRET, SKILL, TOOL, input, now, &nonce);
                    Client::new(Transport::Tcp(self.running.tcp_address.unwrap()))
                        .post_json("/run", &[], &body)
                        .await
                }
            }
        };
        let bound = Duration::from_millis(TIMEOUT_MS + 3_000);
        match tokio::time::timeout(bound, sent).await {
            Err(_) => Err(format!("no answer within {} ms", bound.as_millis())),
            Ok(Err(e)) => Err(format!("transport failure: {e}")),
            Ok(Ok(reply)) => Ok((reply, started.elapsed())),
        }
    }

    /// Check `reply` against `expect`.
    fn check(&self, reply: &Reply, expect: Expect) -> Result<(), String> {
        let body = String::from_utf8_lossy(&reply.body);
        let v = reply.json();
        if self.setup == Setup::McpOverTools {
            return check_mcp(reply, self.setup.expected(expect), expect);
        }
        let tools = self.setup.front() == "tools-v1";
        let Some((want_code, want_status, want_reason)) = self.setup.expected(expect) else {
            let ok = if tools {
                reply.status == StatusCode::OK
                    && v["status"] == "ok"
                    && v["result"]["mark"] == APP_MARK
            } else {
                reply.status == StatusCode::OK && v["ok"] == true && v["output"]["mark"] == APP_MARK
            };
            return if ok {
                Ok(())
            } else {
                Err(format!(
                    "expected the app's answer, got {} {body}",
                    reply.status
                ))
            };
        };
        if body.contains(APP_MARK) {
            return Err(format!(
                "the broken app's answer reached the caller: {body}"
            ));
        }
        let got_status = if tools {
            if reply.status != StatusCode::OK {
                return Err(format!("HTTP {} (expected 200): {body}", reply.status));
            }
            v["status"].as_str().unwrap_or("").to_string()
        } else {
            reply.status.as_u16().to_string()
        };
        if code(reply) != want_code || got_status != want_status {
            return Err(format!(
                "expected {want_code} / {want_status}, got {} / {got_status}: {body}",
                code(reply)
            ));
        }
        let details = if tools {
            &v["error"]["details"]
        } else {
            &v["details"]
        };
        if details["reason"] != want_reason {
            return Err(format!(
                "details.reason is {}, expected {want_reason}: {body}",
                details["reason"]
            ));
        }
        if tools {
            let retryable = v["error"]["retryable"].as_bool();
            let want = Some(expect == Expect::Timeout);
            if retryable != want {
                return Err(format!(
                    "retryable is {retryable:?}, expected {want:?}: {body}"
                ));
            }
        }
        Ok(())
    }

    /// `carapace_requests_total` for this front's tool with `outcome` and `reason`.
    async fn counter(&self, outcome: &str, reason: &str) -> u64 {
        let m = self
            .env
            .ops(&self.running)
            .send(Method::GET, "/metrics", &[], "")
            .await
            .unwrap();
        let line = format!(
            r#"carapace_requests_total{{front="{}",tool="{}",outcome="{outcome}",reason="{reason}"}} "#,
            self.setup.front(),
            self.setup.tool()
        );
        String::from_utf8_lossy(&m.body)
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .map_or(0, |n| n.trim().parse::<f64>().unwrap() as u64)
    }

    /// Run one fault `REPEAT` times and check everything; the slowest answer's time.
    async fn run_case(&self, fault: Fault, expect: Expect) -> Result<Duration, String> {
        let (outcome, reason) = match self.setup.expected(expect) {
            Some((code, _, reason)) => (code, reason),
            None => ("ok", ""),
        };
        let before = self.counter(outcome, reason).await;
        self.app.set(fault);
        let mut slowest = Duration::ZERO;
        for i in 0..REPEAT {
            let (reply, took) = self.call().await.map_err(|e| format!("call {i}: {e}"))?;
            self.check(&reply, expect)
                .map_err(|e| format!("call {i}: {e}"))?;
            let bound = Duration::from_millis(TIMEOUT_MS + 1_500);
            if took > bound {
                return Err(format!("call {i} took {took:?}, past {bound:?}"));
            }
            slowest = slowest.max(took);
        }
        let after = self.counter(outcome, reason).await;
        if after != before + REPEAT as u64 {
            return Err(format!(
                "carapace_requests_total{{outcome=\"{outcome}\",reason=\"{reason}\"}} went from {before} to {after}, expected +{REPEAT}"
            ));
        }
        // The app behaves again: the next call succeeds, on a pool with nothing left behind.
        self.app.set(Fault::Good);
        for i in 0..REPEAT {
            let (reply, _) = self
                .call()
                .await
                .map_err(|e| format!("good call {i} after the fault: {e}"))?;
            self.check(&reply, Expect::Ok)
                .map_err(|e| format!("good call {i} after the fault: {e}"))?;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.app.open() > MAX_IDLE {
            if Instant::now() > deadline {
                return Err(format!(
                    "{} connections to the app still open, more than pool.max_idle {MAX_IDLE}",
                    self.app.open()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(slowest)
    }
}

/// The MCP front's answer: a tool result, the app's output or `isError` with carapace's code.
fn check_mcp(
    reply: &Reply,
    expected: Option<(&str, &str, &str)>,
    expect: Expect,
) -> Result<(), String> {
    let body = String::from_utf8_lossy(&reply.body);
    let result = &reply.json()["result"];
    if reply.status != StatusCode::OK {
        return Err(format!("HTTP {} (expected 200): {body}", reply.status));
    }
    let Some((want_code, _, want_reason)) = expected else {
        return match result["structuredContent"]["mark"] == APP_MARK && result["isError"] == false {
            true => Ok(()),
            false => Err(format!("expected the app's answer, got {body}")),
        };
    };
    if body.contains(APP_MARK) {
        return Err(format!(
            "the broken app's answer reached the caller: {body}"
        ));
    }
    let error = &result["_meta"]["dev.carapace/error"];
    if result["isError"] != true || error["code"] != want_code {
        return Err(format!("expected isError with {want_code}: {body}"));
    }
    if error["details"]["reason"] != want_reason {
        return Err(format!("reason is not {want_reason}: {body}"));
    }
    if error["retryable"].as_bool() != Some(expect == Expect::Timeout) {
        return Err(format!("retryable is wrong: {body}"));
    }
    Ok(())
}

/// Every case through `setup`: all failures are reported together, one line per case.
async fn run_all(setup: Setup) {
    let h = Harness::start(setup).await;
    let mut failures = Vec::new();
    for &(fault, expect) in CASES {
        let expected = match setup.expected(expect) {
            Some((code, status, _)) => format!("{code} {status}"),
            None => "ok".into(),
        };
        match h.run_case(fault, expect).await {
            Ok(took) => println!(
                "{setup:?} | {fault:?} | {expected} | slowest {} ms",
                took.as_millis()
            ),
            Err(e) => failures.push(format!(
                "{setup:?}, fault {fault:?} (expected {expected}): {e}"
            )),
        }
    }
    assert!(
        h.app.calls.load(Ordering::SeqCst) >= CASES.len() * REPEAT,
        "calls did not reach the app"
    );
    h.running.shutdown().await;
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[tokio::test]
async fn tools_v1_front_over_a_faulty_tools_v1_app() {
    run_all(Setup::ToolsOverTools).await;
}

#[tokio::test]
async fn tools_v1_front_over_a_faulty_skill_v1_app() {
    run_all(Setup::ToolsOverSkill).await;
}

#[tokio::test]
async fn skill_v1_front_over_a_faulty_tools_v1_app() {
    run_all(Setup::SkillOverTools).await;
}

#[tokio::test]
async fn mcp_front_over_a_faulty_tools_v1_app() {
    run_all(Setup::McpOverTools).await;
}
