//! Load generator for carapace and the proxies it is compared with.
//!
//! Speaks HTTP/1.1 or HTTP/2 over TLS 1.3 with a client certificate (or plain HTTP), and runs
//! in one of three modes:
//!
//! * `closed`: every connection sends its next request as soon as the last answer arrived
//!   (saturation throughput);
//! * `rate`: requests are scheduled at a fixed rate and each is timed from its *scheduled* send
//!   time, so a stalled server is charged for every request it delayed (no coordinated
//!   omission); a request waits for a free connection when all are busy, and that wait counts;
//! * `connect`: every request on a new TCP connection with a full TLS handshake (no session
//!   resumption), for the new-connection rate.
//!
//! With `--sign-secret`, each request is a Skill Gateway v1 `/run` body signed with a fresh
//! nonce and the current timestamp, so HMAC and replay checks run for real; otherwise each
//! request is a tools-v1 call with a fresh `call_id`.
//!
//! It prints one JSON object: requests, errors, throughput and latency percentiles in µs.
//!
//! ```text
//! cargo run --release --example loadgen -- --url https://127.0.0.1:7443/v1/tools/call \
//!     --ca ca.pem --cert client.crt --key client.key --mode rate --rate 1000 --duration 10
//! ```

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;

mod schedule;

use schedule::Schedule;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Closed,
    Rate,
    Connect,
}

#[derive(Parser)]
#[command(about = "Load generator: HTTP/1.1 or h2 over mTLS, fixed rate or saturation")]
struct Args {
    /// `https://IP:PORT/PATH` or `http://IP:PORT/PATH`.
    #[arg(long)]
    url: String,
    /// Threads generating load (connections are spread over them).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// CA that signed the server's certificate.
    #[arg(long)]
    ca: Option<PathBuf>,
    /// Client certificate (PEM) for mTLS.
    #[arg(long)]
    cert: Option<PathBuf>,
    /// Client key (PEM) for mTLS.
    #[arg(long)]
    key: Option<PathBuf>,
    /// Server name to verify (default: the IP of the URL).
    #[arg(long)]
    server_name: Option<String>,
    /// HTTP/2 (one connection carries `--streams` requests at a time).
    #[arg(long)]
    http2: bool,
    #[arg(long, value_enum, default_value = "closed")]
    mode: Mode,
    /// Requests per second (mode `rate`).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Mode `rate`: wait for each request's time by yielding instead of sleeping, so the load
    /// generator never idles and sees each answer as it arrives (its own wake-up is not timed).
    /// For a load generator with a core of its own: it keeps that core busy.
    #[arg(long)]
    busy_poll: bool,
    /// Connections.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Requests in flight per HTTP/2 connection.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Seconds of measurement.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of warm-up before measuring (same load, not recorded).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Sign each request as a Skill Gateway v1 `/run` with the secret in this file.
    #[arg(long)]
    sign_secret: Option<PathBuf>,
    /// Skill id of signed requests.
    #[arg(long, default_value = "demo.memory")]
    skill_id: String,
    /// Tool (tools-v1) or capability (skill-v1) called.
    #[arg(long, default_value = "memory.query")]
    tool: String,
    /// Arguments of each call (JSON).
    #[arg(long, default_value = r#"{"query":"bench"}"#)]
    args: String,
    /// Send each call as an MCP 2026-07-28 `tools/call` (with its mirrored headers).
    #[arg(long)]
    mcp: bool,
}

/// What each request is made of.
struct Target {
    address: std::net::SocketAddr,
    authority: String,
    path: String,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    http2: bool,
    secret: Option<Vec<u8>>,
    skill_id: String,
    tool: String,
    args: serde_json::Value,
    mcp: bool,
}

impl Target {
    fn from_args(a: &Args) -> Result<Target, String> {
        let (secure, rest) = match (
            a.url.strip_prefix("https://"),
            a.url.strip_prefix("http://"),
        ) {
            (Some(r), _) => (true, r),
            (_, Some(r)) => (false, r),
            _ => return Err("--url must start with https:// or http://".into()),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let address: std::net::SocketAddr = authority
            .parse()
            .map_err(|_| format!("`{authority}` is not IP:PORT"))?;
        let tls = if secure {
            Some((connector(a)?, server_name(a, address)?))
        } else {
            None
        };
        let secret = match &a.sign_secret {
            Some(p) => {
                let mut s = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
                if s.ends_with(b"\n") {
                    s.pop();
                }
                Some(s)
            }
            None => None,
        };
        Ok(Target {
            address,
            authority: authority.to_string(),
            path: path.to_string(),
            tls,
            http2: a.http2,
            secret,
            skill_id: a.skill_id.clone(),
            tool: a.tool.clone(),
            args: serde_json::from_str(&a.args).map_err(|e| format!("--args: {e}"))?,
            mcp: a.mcp,
        })
    }

    /// A fresh request: a new nonce and timestamp, or a new call id.
    fn request(&self, seq: u64) -> Request<Full<Bytes>> {
        let body = match &self.secret {
            Some(secret) => {
                let nonce = hex::encode(rand::random::<[u8; 16]>());
                carapace::client::signed_run(
                    secret,
                    &self.skill_id,
                    &self.tool,
                    self.args.clone(),
                    carapace_filters::unix_now_ms(),
                    &nonce,
                )
            }
            None if self.mcp => json!({
                "jsonrpc": "2.0", "id": seq, "method": "tools/call",
                "params": {"name": self.tool, "arguments": self.args, "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                }},
            }),
            None => json!({
                "version": "v1",
                "call_id": format!("load-{seq}"),
                "tool_name": self.tool,
                "tenant_id": "bench",
                "args": self.args,
                "context": {"agent_id": "loadgen", "session_id": "bench"},
            }),
        };
        let mut b = Request::builder()
            .method(Method::POST)
            .header("content-type", "application/json");
        if self.mcp {
            b = b
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/call")
                .header("mcp-name", &self.tool);
        }
        if self.http2 {
            let scheme = if self.tls.is_some() { "https" } else { "http" };
            b = b.uri(format!("{scheme}://{}{}", self.authority, self.path));
        } else {
            b = b.uri(&self.path).header("host", &self.authority);
        }
        b.body(Full::new(Bytes::from(body.to_string())))
            .expect("request")
    }
}

fn connector(a: &Args) -> Result<tokio_rustls::TlsConnector, String> {
    let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut roots = rustls::RootCertStore::empty();
    let ca = a.ca.as_ref().ok_or("--ca is required for https")?;
    for c in CertificateDer::pem_slice_iter(&read(ca)?) {
        roots
            .add(c.map_err(|e| format!("--ca: {e}"))?)
            .map_err(|e| format!("--ca: {e}"))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(carapace::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match (&a.cert, &a.key) {
        (Some(cert), Some(key)) => {
            let certs = CertificateDer::pem_slice_iter(&read(cert)?)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("--cert: {e}"))?;
            let key =
                PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| format!("--key: {e}"))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| e.to_string())?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err("--cert and --key go together".into()),
    };
    // Every new connection is a full handshake (mode `connect` measures exactly that).
    config.resumption = rustls::client::Resumption::disabled();
    config.alpn_protocols = vec![if a.http2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

fn server_name(a: &Args, address: std::net::SocketAddr) -> Result<ServerName<'static>, String> {
    match &a.server_name {
        Some(n) => ServerName::try_from(n.clone()).map_err(|e| format!("--server-name: {e}")),
        None => Ok(ServerName::from(address.ip())),
    }
}

/// A connection that sends requests and reads whole answers.
#[derive(Clone)]
enum Conn {
    H1(Arc<tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Full<Bytes>>>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Conn {
    async fn open(t: &Target) -> Result<Conn, String> {
        let tcp = tokio::net::TcpStream::connect(t.address)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        match &t.tls {
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| format!("TLS: {e}"))?;
                Conn::handshake(t.http2, TokioIo::new(tls)).await
            }
            None => Conn::handshake(t.http2, TokioIo::new(tcp)).await,
        }
    }

    async fn handshake<I>(http2: bool, io: I) -> Result<Conn, String>
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        if http2 {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| format!("h2: {e}"))?;
            tokio::spawn(conn);
            Ok(Conn::H2(send))
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| format!("http1: {e}"))?;
            tokio::spawn(conn);
            Ok(Conn::H1(Arc::new(tokio::sync::Mutex::new(send))))
        }
    }

    /// Send and read the whole answer; `Ok(status)`. With `must_contain`, an answer without
    /// those bytes is an error (an MCP tool result with `isError` is HTTP 200).
    async fn send(
        &self,
        req: Request<Full<Bytes>>,
        must_contain: Option<&[u8]>,
    ) -> Result<u16, String> {
        let resp = match self {
            Conn::H1(s) => {
                let mut s = s.lock().await;
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
            Conn::H2(s) => {
                let mut s = s.clone();
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
        }
        .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if let Some(needle) = must_contain {
            if !body.windows(needle.len()).any(|w| w == needle) {
                return Err(format!(
                    "answer without {}",
                    String::from_utf8_lossy(needle)
                ));
            }
        }
        Ok(status)
    }
}

/// What the workers record.
struct Record {
    latency: Mutex<Histogram<u64>>,
    /// Mode `rate`: how late each measured request was handed to its connection, from its
    /// scheduled time (the load generator's own part of the latency).
    late: Mutex<Histogram<u64>>,
    ok: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Record {
    fn new() -> Record {
        Record {
            // 1 µs to 60 s, 3 significant digits.
            latency: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram")),
            late: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram")),
            ok: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            first_error: Mutex::new(None),
        }
    }

    fn add(&self, local: &mut Histogram<u64>, late: &Histogram<u64>, ok: u64, errors: u64) {
        self.latency
            .lock()
            .unwrap()
            .add(&*local)
            .expect("same bounds");
        local.reset();
        self.late.lock().unwrap().add(late).expect("same bounds");
        self.ok.fetch_add(ok, Ordering::Relaxed);
        self.errors.fetch_add(errors, Ordering::Relaxed);
    }

    fn error(&self, e: String) {
        self.first_error.lock().unwrap().get_or_insert(e);
    }
}

/// The clock of one run: warm-up, then the measured window.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    measure_from: Instant,
    end: Instant,
}

/// This process's CPU time so far, every thread: (user, system) in milliseconds.
fn cpu_ms() -> (f64, f64) {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` fills the struct it is given; `RUSAGE_SELF` cannot fail.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    (ms(usage.ru_utime), ms(usage.ru_stime))
}

/// The CPU time this process spends in the measured window, read by a thread of its own that
/// sleeps until the window starts and until it ends.
fn cpu_over(w: Window) -> std::thread::JoinHandle<(f64, f64)> {
    std::thread::spawn(move || {
        let until = |t: Instant| std::thread::sleep(t.saturating_duration_since(Instant::now()));
        until(w.measure_from);
        let (user, system) = cpu_ms();
        until(w.end);
        let (user_end, system_end) = cpu_ms();
        (user_end - user, system_end - system)
    })
}

/// A worker's schedule in mode `rate`; the other modes send at once.
fn schedule(args: &Args) -> Result<Option<Schedule>, String> {
    match args.mode {
        Mode::Rate => Schedule::new(args.rate, args.busy_poll)
            .map(Some)
            .map_err(|e| format!("timerfd: {e}")),
        _ => Ok(None),
    }
}

/// One worker: sends requests until the end of the window, on `conn` (an HTTP/2 connection
/// shared with other workers), on its own connection, or on a new one per request (`connect`).
/// A connection that fails is replaced.
async fn worker(
    t: Arc<Target>,
    mode: Mode,
    w: Window,
    next: Arc<AtomicU64>,
    rec: Arc<Record>,
    mut conn: Option<Conn>,
    schedule: Option<Schedule>,
) {
    let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
    let mut late = local.clone();
    let (mut ok, mut errors) = (0u64, 0u64);
    loop {
        let seq = next.fetch_add(1, Ordering::Relaxed);
        // Made before it is due: building and signing a request is the client's work, and
        // timing it would charge the targets that take signed requests for it.
        let req = t.request(seq);
        // When the request is due: its slot in the schedule, or now.
        let due = match &schedule {
            Some(s) => s.due(w.start, seq),
            None => Instant::now(),
        };
        if due >= w.end {
            break;
        }
        if let Some(s) = &schedule {
            s.until(due).await;
        }
        let measured = due >= w.measure_from;
        if mode == Mode::Connect {
            conn = None;
        }
        if conn.is_none() {
            match Conn::open(&t).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    errors += u64::from(measured);
                    rec.error(e);
                    continue;
                }
            }
        }
        if measured && schedule.is_some() {
            let us = u64::try_from(due.elapsed().as_micros()).unwrap_or(u64::MAX);
            late.saturating_record(us.max(1));
        }
        let must_contain = t.mcp.then_some(&b"\"isError\":false"[..]);
        let result = conn
            .as_ref()
            .expect("connected")
            .send(req, must_contain)
            .await;
        let done = Instant::now();
        match result {
            Ok(status) if (200..300).contains(&status) => {
                if measured {
                    ok += 1;
                    let us = u64::try_from((done - due).as_micros()).unwrap_or(u64::MAX);
                    local.saturating_record(us.max(1));
                }
            }
            Ok(status) => {
                errors += u64::from(measured);
                rec.error(format!("HTTP {status}"));
            }
            Err(e) => {
                errors += u64::from(measured);
                rec.error(e);
                conn = None;
            }
        }
    }
    rec.add(&mut local, &late, ok, errors);
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let target = match Target::from_args(&args) {
        Ok(t) => Arc::new(t),
        Err(e) => {
            eprintln!("loadgen: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if args.mode == Mode::Rate && args.rate == 0 {
        eprintln!("loadgen: --rate must be at least 1");
        return std::process::ExitCode::from(2);
    }
    // One thread by default: the load generator gets one core, pinned by the caller.
    let rt = match args.threads {
        0 | 1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    }
    .enable_all()
    .build()
    .expect("runtime");
    let rec = Arc::new(Record::new());
    let streams = if args.http2 { args.streams.max(1) } else { 1 };
    let start = Instant::now() + Duration::from_millis(50);
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let w = Window {
        start,
        measure_from,
        end: measure_from + Duration::from_secs_f64(args.duration),
    };
    let own_cpu = cpu_over(w);
    let summary = rt.block_on(async {
        let next = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        if args.http2 && args.mode != Mode::Connect {
            // `streams` workers share each HTTP/2 connection.
            for _ in 0..args.connections {
                let conn = match Conn::open(&target).await {
                    Ok(c) => c,
                    Err(e) => return Err(e),
                };
                for _ in 0..streams {
                    let (t, n, r) = (target.clone(), next.clone(), rec.clone());
                    let c = Some(conn.clone());
                    let a = schedule(&args)?;
                    tasks.push(tokio::spawn(worker(t, args.mode, w, n, r, c, a)));
                }
            }
        } else {
            for _ in 0..args.connections {
                let (t, n, r) = (target.clone(), next.clone(), rec.clone());
                let a = schedule(&args)?;
                tasks.push(tokio::spawn(worker(t, args.mode, w, n, r, None, a)));
            }
        }
        for t in tasks {
            let _ = t.await;
        }
        Ok(w)
    });
    let w = match summary {
        Ok(w) => w,
        Err(e) => {
            eprintln!("loadgen: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let h = rec.latency.lock().unwrap();
    let late = rec.late.lock().unwrap();
    let ok = rec.ok.load(Ordering::Relaxed);
    let errors = rec.errors.load(Ordering::Relaxed);
    let seconds = (w.end - w.measure_from).as_secs_f64();
    let (cpu_user, cpu_system) = own_cpu.join().unwrap_or_default();
    let out = json!({
        "mode": match args.mode { Mode::Closed => "closed", Mode::Rate => "rate", Mode::Connect => "connect" },
        "protocol": if args.http2 { "h2" } else { "http/1.1" },
        "connections": args.connections,
        "target_rate": if args.mode == Mode::Rate { Some(args.rate) } else { None },
        "seconds": seconds,
        "requests": ok,
        "errors": errors,
        "first_error": *rec.first_error.lock().unwrap(),
        "throughput_rps": ok as f64 / seconds,
        "latency_us": {
            "p50": h.value_at_quantile(0.50),
            "p90": h.value_at_quantile(0.90),
            "p99": h.value_at_quantile(0.99),
            "p999": h.value_at_quantile(0.999),
            "max": h.max(),
            "mean": h.mean(),
        },
        // What the load generator itself spent in the window: where it shares the cores with
        // the server (`--workers`), this is taken from the server's CPU.
        "cpu_ms": { "user": cpu_user, "system": cpu_system },
        "send_late_us": (args.mode == Mode::Rate).then(|| json!({
            "p50": late.value_at_quantile(0.50),
            "p99": late.value_at_quantile(0.99),
            "max": late.max(),
        })),
        "percentiles_us": (0..=60).map(|i| {
            // 0, 50, 75, 87.5, ... percent: the tail gets as many points as the middle.
            let q = 1.0 - 0.5f64.powf(f64::from(i) / 4.0);
            [q * 100.0, h.value_at_quantile(q) as f64]
        }).collect::<Vec<_>>(),
    });
    println!("{out}");
    std::process::ExitCode::SUCCESS
}
