//! A stdio MCP server that carapace starts and supervises: a cleared environment (only the
//! variables the configuration names), its own working directory and resource limits;
//! restarted with backoff when it exits; its stderr logged under the app's name, bounded;
//! stopped when the [`StdioServer`] is dropped (shutdown, or a reload that replaces it).
//!
//! Requests get carapace's own ids, so answers are matched to callers whatever ids the callers
//! used. When the child exits, every request in flight fails at once with
//! `DEPENDENCY_UNAVAILABLE`; a request dropped before its answer (timeout, caller gone) is
//! cancelled at the server with `notifications/cancelled`.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot, watch};

use carapace_filters::{BoxFuture, Rejection};

use super::lines::{Line, LineReader};
use super::relay::CallerStream;
use super::upstream::{Answer, Notices, Outgoing, Reply, Transport};
use crate::config::{ChildLimits, ChildSpec};

/// Longest line read from the server's stdout.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// Longest stderr line logged (the rest is cut).
const MAX_LOG_LINE: usize = 2048;
/// Most stderr lines logged per second; the rest are counted.
const LOG_LINES_PER_S: u32 = 50;
/// Messages queued for the child's stdin.
const QUEUE: usize = 256;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A child that ran this long starts the backoff over.
const HEALTHY_AFTER: Duration = Duration::from_secs(30);

type Pending = HashMap<u64, oneshot::Sender<Result<Reply, Rejection>>>;

/// What the supervisor and the requests share.
struct Link {
    name: String,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
    out: mpsc::Sender<Bytes>,
    /// The running child's generation; 0 while none runs.
    up: watch::Sender<u64>,
    notices: Notices,
    /// The callers' streams of the requests in flight that have one, oldest first.
    relays: Mutex<Vec<(u64, CallerStream)>>,
    /// The requests in flight that are carapace's own `subscriptions/listen`, not a caller's.
    listens: Mutex<Vec<u64>>,
}

/// A supervised stdio MCP server.
pub struct StdioServer {
    link: Arc<Link>,
    _stop: oneshot::Sender<()>,
}

impl StdioServer {
    /// Start supervising `spec` (the first start happens in the background).
    pub fn start(spec: ChildSpec, notices: Notices) -> Self {
        let (out, out_rx) = mpsc::channel(QUEUE);
        let (stop, stop_rx) = oneshot::channel();
        let link = Arc::new(Link {
            name: spec.name.clone(),
            pending: Mutex::default(),
            next_id: AtomicU64::new(1),
            out,
            up: watch::channel(0).0,
            notices,
            relays: Mutex::default(),
            listens: Mutex::default(),
        });
        tokio::spawn(supervise(spec, link.clone(), out_rx, stop_rx));
        StdioServer { link, _stop: stop }
    }
}

impl Transport for StdioServer {
    fn generation(&self) -> u64 {
        *self.link.up.borrow()
    }

    fn request(&self, msg: Outgoing) -> BoxFuture<Result<Answer, Rejection>> {
        let link = self.link.clone();
        Box::pin(async move {
            wait_up(&link).await?;
            let id = link.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            link.pending.lock().expect("lock").insert(id, tx);
            if let Some(relay) = msg.relay {
                link.relays.lock().expect("lock").push((id, relay));
            }
            if msg.method == "subscriptions/listen" {
                link.listens.lock().expect("lock").push(id);
            }
            let guard = InFlight {
                link: &link,
                id,
                answered: false,
            };
            let line =
                json!({"jsonrpc": "2.0", "id": id, "method": msg.method, "params": msg.params});
            guard.link.send(&line).await?;
            let reply = rx.await.unwrap_or_else(|_| {
                Err(Rejection::AppUnavailable(format!(
                    "the MCP server `{}` stopped",
                    guard.link.name
                )))
            });
            let mut guard = guard;
            guard.answered = true;
            Ok(Answer::Reply {
                reply: reply?,
                session: None,
            })
        })
    }

    fn notify(&self, msg: Outgoing) -> BoxFuture<Result<(), Rejection>> {
        let link = self.link.clone();
        Box::pin(async move {
            wait_up(&link).await?;
            let line = json!({"jsonrpc": "2.0", "method": msg.method, "params": msg.params});
            link.send(&line).await
        })
    }
}

impl Link {
    async fn send(&self, msg: &Value) -> Result<(), Rejection> {
        let mut line = serde_json::to_vec(msg).expect("JSON values serialize");
        line.push(b'\n');
        self.out.send(Bytes::from(line)).await.map_err(|_| {
            Rejection::AppUnavailable(format!("the MCP server `{}` stopped", self.name))
        })
    }

    /// Fail every request in flight: the child is gone.
    fn fail_pending(&self, why: &str) {
        let pending = std::mem::take(&mut *self.pending.lock().expect("lock"));
        for (_, tx) in pending {
            let _ = tx.send(Err(Rejection::AppUnavailable(why.to_owned())));
        }
    }

    /// One message (or batch) from the child's stdout.
    fn incoming(self: &Arc<Self>, msg: Value) {
        for m in classify(msg) {
            match m {
                Incoming::Response { id, reply } => {
                    let tx = id.and_then(|id| self.pending.lock().expect("lock").remove(&id));
                    match tx {
                        Some(tx) => {
                            let _ = tx.send(Ok(reply));
                        }
                        None => tracing::debug!(app = %self.name, "answer to no request in flight"),
                    }
                }
                Incoming::Request { method, id, params } => self.server_request(method, id, params),
                Incoming::Notification { method, params } => {
                    if !self.notices.take(&method, &params) {
                        self.notification(&method, params)
                    }
                }
                Incoming::Invalid(why) => {
                    tracing::warn!(app = %self.name, "mcp_server_message_invalid: {why}")
                }
            }
        }
    }

    /// A notification: progress goes to the call whose token it names. A log message names
    /// no request on stdio: it goes to the caller of the one request in flight, and is
    /// dropped when several are (it could be any caller's).
    fn notification(&self, method: &str, params: Value) {
        let relays = self.relays.lock().expect("lock");
        let to = match method {
            "notifications/progress" => params
                .get("progressToken")
                .and_then(|t| relays.iter().find(|(_, r)| r.owns_token(t)))
                .map(|(_, r)| r),
            "notifications/message" => self.sole_caller(&relays),
            _ => None,
        };
        match to {
            Some(relay) => relay.notify(method, params),
            None => tracing::debug!(app = %self.name, "mcp_server_notification method={method}"),
        }
    }

    /// The caller's stream of the one request in flight (of a caller: carapace's own listen
    /// is not one), if exactly one is and it has one.
    fn sole_caller<'a>(&self, relays: &'a [(u64, CallerStream)]) -> Option<&'a CallerStream> {
        let listens = self.listens.lock().expect("lock").len();
        let in_flight = self
            .pending
            .lock()
            .expect("lock")
            .len()
            .saturating_sub(listens);
        match relays {
            [(_, relay)] if in_flight == 1 => Some(relay),
            _ => None,
        }
    }

    /// A request from the server to its client. It names no request on stdio either: it is
    /// put to the caller of the one request in flight when that caller can answer it, and
    /// answered with an error at once otherwise (never to a caller it may not be about).
    fn server_request(self: &Arc<Self>, method: String, id: Value, params: Value) {
        let relay = {
            let relays = self.relays.lock().expect("lock");
            self.sole_caller(&relays)
                .filter(|r| r.answers(&method))
                .cloned()
        };
        let link = self.clone();
        tokio::spawn(async move {
            let reply = match (method.as_str(), relay) {
                ("ping", _) => Reply::Result(json!({})),
                (_, Some(relay)) => relay.ask(&method, params).await,
                _ => Reply::Error {
                    code: -32601,
                    message: format!("no caller of carapace can answer `{method}` now"),
                    data: None,
                },
            };
            let answer = reply.into_response(id);
            if link.send(&answer).await.is_err() {
                tracing::debug!(app = %link.name, "answer to the server's `{method}` not delivered");
            }
        });
    }
}

/// What a message from the server is.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    /// An answer; `id` is carapace's request id when it is one carapace could have sent.
    Response {
        id: Option<u64>,
        reply: Reply,
    },
    /// A request of the server to its client.
    Request {
        method: String,
        id: Value,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    Invalid(&'static str),
}

/// Sort one message, or each message of a batch.
pub fn classify(msg: Value) -> Vec<Incoming> {
    match msg {
        Value::Array(items) => items.into_iter().map(classify_one).collect(),
        one => vec![classify_one(one)],
    }
}

fn classify_one(msg: Value) -> Incoming {
    if !msg.is_object() {
        return Incoming::Invalid("not a JSON-RPC object");
    }
    let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
    match (method, msg.get("id")) {
        (None, Some(id)) => match Reply::from_response(&msg) {
            Some(reply) => Incoming::Response {
                id: id.as_u64(),
                reply,
            },
            None => Incoming::Invalid("a response without result or error"),
        },
        (Some(method), Some(id)) => Incoming::Request {
            method,
            id: id.clone(),
            params: msg.get("params").cloned().unwrap_or(Value::Null),
        },
        (Some(method), None) => Incoming::Notification {
            method,
            params: msg.get("params").cloned().unwrap_or(Value::Null),
        },
        (None, None) => Incoming::Invalid("neither a request nor a response"),
    }
}

/// Removes a request that will not be answered (dropped), and cancels it at the server.
struct InFlight<'a> {
    link: &'a Arc<Link>,
    id: u64,
    answered: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.link
            .relays
            .lock()
            .expect("lock")
            .retain(|(id, _)| *id != self.id);
        self.link
            .listens
            .lock()
            .expect("lock")
            .retain(|id| *id != self.id);
        if self.answered {
            return;
        }
        if self
            .link
            .pending
            .lock()
            .expect("lock")
            .remove(&self.id)
            .is_some()
        {
            let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": self.id, "reason": "the caller is gone or timed out"}});
            let mut line = serde_json::to_vec(&cancel).expect("JSON values serialize");
            line.push(b'\n');
            let _ = self.link.out.try_send(Bytes::from(line));
        }
    }
}

async fn wait_up(link: &Link) -> Result<(), Rejection> {
    let mut up = link.up.subscribe();
    let running = up.wait_for(|g| *g != 0).await.is_ok();
    if running {
        Ok(())
    } else {
        Err(Rejection::AppUnavailable(format!(
            "the MCP server `{}` stopped",
            link.name
        )))
    }
}

/// Start, watch and restart the child until stopped.
async fn supervise(
    spec: ChildSpec,
    link: Arc<Link>,
    mut out: mpsc::Receiver<Bytes>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut backoff = BACKOFF_MIN;
    let mut generation = 0u64;
    loop {
        let started = Instant::now();
        let ended = match spawn(&spec) {
            Ok(child) => {
                generation += 1;
                tracing::info!(app = %spec.name, "mcp_server_started pid={}", child.id().unwrap_or(0));
                run(child, &link, generation, &mut out, &mut stop).await
            }
            Err(e) => {
                tracing::error!(app = %spec.name, "mcp_server_start_failed: {e}");
                Ended::Exited(format!("could not start: {e}"))
            }
        };
        link.up.send_replace(0);
        let why = match &ended {
            Ended::Stopped => format!("the MCP server `{}` was stopped", spec.name),
            Ended::Exited(how) => format!("the MCP server `{}` exited ({how})", spec.name),
        };
        link.fail_pending(&why);
        // What was queued for the old child is not for the next one.
        while out.try_recv().is_ok() {}
        if matches!(ended, Ended::Stopped) {
            return;
        }
        if started.elapsed() > HEALTHY_AFTER {
            backoff = BACKOFF_MIN;
        }
        tracing::warn!(app = %spec.name, "mcp_server_exited: {why}; restarting in {} ms", backoff.as_millis());
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = &mut stop => return,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

enum Ended {
    Stopped,
    Exited(String),
}

fn spawn(spec: &ChildSpec) -> std::io::Result<Child> {
    let (program, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(dir) = &spec.working_dir {
        cmd.current_dir(dir);
    }
    // Its own process group: a signal to carapace's group does not reach it first.
    cmd.process_group(0);
    let limits = spec.limits.clone();
    // SAFETY: between fork and exec only async-signal-safe calls (setrlimit) are made.
    unsafe {
        cmd.pre_exec(move || set_limits(&limits));
    }
    cmd.spawn()
}

fn set_limits(l: &ChildLimits) -> std::io::Result<()> {
    for (resource, value) in [
        (libc::RLIMIT_AS, l.memory_bytes),
        (libc::RLIMIT_CPU, l.cpu_seconds),
        (libc::RLIMIT_NOFILE, l.open_files),
    ] {
        if let Some(v) = value {
            let lim = libc::rlimit {
                rlim_cur: v as libc::rlim_t,
                rlim_max: v as libc::rlim_t,
            };
            // SAFETY: a valid resource and a pointer to a live rlimit.
            if unsafe { libc::setrlimit(resource, &lim) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Serve one child until it exits or carapace stops it.
async fn run(
    mut child: Child,
    link: &Arc<Link>,
    generation: u64,
    out: &mut mpsc::Receiver<Bytes>,
    stop: &mut oneshot::Receiver<()>,
) -> Ended {
    let mut stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let logger = tokio::spawn(log_stderr(link.name.clone(), stderr));
    let mut lines = LineReader::new(BufReader::new(stdout), MAX_LINE_BYTES);
    let mut garbage = 0u64;
    link.up.send_replace(generation);
    let ended = loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(Line::Text(l))) if l.iter().all(u8::is_ascii_whitespace) => {}
                Ok(Some(Line::Text(l))) => match serde_json::from_slice::<Value>(&l) {
                    Ok(msg) => link.incoming(msg),
                    Err(_) => {
                        garbage += 1;
                        if garbage.is_power_of_two() {
                            tracing::warn!(app = %link.name, "mcp_server_stdout_garbage lines={garbage}: not JSON-RPC, skipped");
                        }
                    }
                },
                Ok(Some(Line::TooLong(n))) => {
                    tracing::warn!(app = %link.name, "mcp_server_line_too_long bytes={n}: skipped");
                }
                Ok(None) | Err(_) => break wait_exit(&mut child).await,
            },
            msg = out.recv() => {
                let Some(msg) = msg else { break Ended::Stopped };
                if stdin.write_all(&msg).await.is_err() || stdin.flush().await.is_err() {
                    break wait_exit(&mut child).await;
                }
            }
            status = child.wait() => break Ended::Exited(describe(status)),
            _ = &mut *stop => break Ended::Stopped,
        }
    };
    if matches!(ended, Ended::Stopped) {
        stop_child(&mut child).await;
    }
    logger.abort();
    ended
}

/// Close stdin and give the child a moment to exit, as the specification's shutdown says,
/// then kill it.
async fn stop_child(child: &mut Child) {
    drop(child.stdin.take());
    if tokio::time::timeout(Duration::from_secs(2), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

async fn wait_exit(child: &mut Child) -> Ended {
    match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
        Ok(status) => Ended::Exited(describe(status)),
        Err(_) => {
            let _ = child.kill().await;
            Ended::Exited("closed its stdout; killed".into())
        }
    }
}

fn describe(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => e.to_string(),
    }
}

/// Log the child's stderr under its name: lines cut at [`MAX_LOG_LINE`], at most
/// [`LOG_LINES_PER_S`] a second (the rest counted).
async fn log_stderr(name: String, stderr: tokio::process::ChildStderr) {
    let mut lines = LineReader::new(BufReader::new(stderr), MAX_LOG_LINE);
    let mut window = Instant::now();
    let (mut logged, mut dropped) = (0u32, 0u64);
    while let Ok(Some(line)) = lines.next_line().await {
        if window.elapsed() >= Duration::from_secs(1) {
            if dropped > 0 {
                tracing::warn!(app = %name, "mcp_server_stderr_dropped lines={dropped}");
            }
            window = Instant::now();
            (logged, dropped) = (0, 0);
        }
        if logged >= LOG_LINES_PER_S {
            dropped += 1;
            continue;
        }
        logged += 1;
        match line {
            Line::Text(l) => tracing::info!(app = %name, "stderr: {}", String::from_utf8_lossy(&l)),
            Line::TooLong(n) => tracing::info!(app = %name, "stderr: <a line of {n} bytes, cut>"),
        }
    }
}
