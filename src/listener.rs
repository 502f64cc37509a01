//! Caller listeners: accept, TLS, decide who the connection belongs to, and serve HTTP/1.1
//! and HTTP/2 on it under the connection limits.
//!
//! Every connection is bounded in time when it is not working: a first request must come
//! within `limits.first_request_timeout_ms`, and a connection with no request in flight
//! closes after `limits.idle_timeout_ms`. Identity is decided once the TLS handshake is done:
//! a certificate that no paired peer holds gets its one answer (`PAIRING_REQUIRED` or
//! `FORBIDDEN`, from the stack) on a connection that closes after it and lives at most
//! `first_request_timeout_ms`. The [`ConnectionTable`] keeps such connections, and every
//! other unpaired one, from ever locking out a paired peer; when the peer store changes, the
//! connections of peers it no longer holds as active are closed.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::future::Either;
use futures_util::FutureExt;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tower::util::Oneshot;
use tower::{Service, ServiceExt};

use carapace_filters::identity::{ConnectionIdentity, PeerCertificate, PeerDirectory};

use crate::caller_body::{self, BodyExpectation, CallerBody, Unread};
use crate::config::Loaded;
use crate::connections::{CertificateHolder, ConnectionTable, HeadWatch, RequestGuard, Slot};
use crate::edge::HttpStack;
use crate::lingering::Lingering;
use crate::server::drain::{Drain, DrainWatch};
use crate::server::shared::Shared;

/// Streams per HTTP/2 connection, at most (and never more than the in-flight limit).
const MAX_STREAMS_PER_CONNECTION: usize = 128;

/// How long a connection may last, and whether it serves more than one request.
#[derive(Clone, Copy)]
struct Lifetime {
    first_request: Duration,
    idle: Duration,
    /// HTTP/1: time for a request head to complete once its first byte arrived.
    head: Duration,
    /// An unpaired certificate's connection: one answer, then closed.
    single_answer: bool,
}

impl Lifetime {
    fn of(cfg: &Loaded) -> Self {
        let l = &cfg.config.limits;
        Lifetime {
            first_request: Duration::from_millis(l.first_request_timeout_ms),
            idle: Duration::from_millis(l.idle_timeout_ms),
            head: Duration::from_millis(l.header_read_timeout_ms),
            single_answer: false,
        }
    }

    /// How long the connection may sit idle: an unpaired certificate's, no longer than it
    /// waits for its first request.
    fn idle(&self) -> Duration {
        if self.single_answer {
            self.first_request
        } else {
            self.idle
        }
    }
}

fn http_builder(cfg: &Loaded, h2_only: bool, single_answer: bool) -> auto::Builder<TokioExecutor> {
    let l = &cfg.config.limits;
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        // Heads are bounded from their first byte by the connection's watch instead
        // (`HeadWatch`): hyper's clock would also run while a keep-alive connection waits.
        .header_read_timeout(None)
        .max_buf_size(l.max_header_bytes.max(8192))
        // An answer's head and body copied into one buffer and written with one `write`: over
        // TLS a vectored write makes rustls collect the slices into a `Vec` for every answer,
        // an allocation that costs more than copying a body of a few hundred bytes.
        .writev(false)
        .keep_alive(!single_answer);
    // HTTP/2: pings find dead peers; streams and header lists are capped.
    b.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(Duration::from_secs(20))
        .max_header_list_size(u32::try_from(l.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(
            u32::try_from(l.max_in_flight.min(MAX_STREAMS_PER_CONNECTION)).unwrap_or(u32::MAX),
        );
    if h2_only {
        b = b.http2_only();
    }
    b
}

/// A connection's copy of its listener's stack, made once and made again only when the stack
/// was replaced (a reload or an installed pairing), so that every request runs on the stack
/// current when it arrived without copying the stack per request.
struct ConnectionStack {
    stacks: Arc<ArcSwap<HttpStack>>,
    copy: Mutex<(Arc<HttpStack>, HttpStack)>,
}

type StackFuture = <HttpStack as Service<Request<CallerBody>>>::Future;
/// A request waiting for its stack's readiness on a copy of its own.
type WaitingFuture = Pin<Box<Oneshot<HttpStack, Request<CallerBody>>>>;

impl ConnectionStack {
    fn new(stacks: Arc<ArcSwap<HttpStack>>) -> Self {
        let current = stacks.load_full();
        let copy = Mutex::new((current.clone(), current.as_ref().clone()));
        ConnectionStack { stacks, copy }
    }

    /// Start `req` on the current stack.
    fn call(&self, req: Request<CallerBody>) -> Either<StackFuture, WaitingFuture> {
        let current = self.stacks.load();
        let mut copy = self.copy.lock().unwrap_or_else(|e| e.into_inner());
        if !Arc::ptr_eq(&copy.0, &current) {
            *copy = (Arc::clone(&current), current.as_ref().clone());
        }
        // Every layer is ready at once (limits are taken in `call`); should one not be, the
        // request waits for readiness on a copy of its own (boxed: it holds the request, and
        // held inline would make every request's future, which hyper moves into place, as
        // large).
        match copy.1.ready().now_or_never() {
            Some(Ok(svc)) => Either::Left(svc.call(req)),
            _ => Either::Right(Box::pin(copy.1.clone().oneshot(req))),
        }
    }
}

/// Serve one accepted connection, watched by the drain, until it ends, the
/// table evicts it, or it sits idle past its lifetime.
async fn serve_connection<IO>(
    io: IO,
    identity: ConnectionIdentity,
    h2_only: bool,
    slot: Slot,
    lifetime: Lifetime,
    (shared, stacks): (Arc<Shared>, Arc<ArcSwap<HttpStack>>),
    drain: DrainWatch,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    shared
        .metrics
        .worker_connection(crate::server::worker_index());
    let cfg = shared.config.load_full();
    let builder = http_builder(&cfg, h2_only, lifetime.single_answer);
    let requests = slot.requests();
    let stack = ConnectionStack::new(stacks);
    // An unpaired certificate's one answer ends its connection: HTTP/1 by `keep_alive(false)`,
    // HTTP/2 (many streams on one connection) by a GOAWAY once the first answer is made.
    let answered = lifetime
        .single_answer
        .then(|| Arc::new(tokio::sync::Notify::new()));
    let first_answer = answered.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let expectation = BodyExpectation::of(&req);
        let (mut parts, body) = req.into_parts();
        parts.extensions.insert(identity.clone());
        let (body, unread) = CallerBody::new(body);
        let req = Request::from_parts(parts, body);
        let guard = requests.start();
        let call = stack.call(req);
        answer(call, first_answer.clone(), unread, expectation, guard)
    });
    let watch = (!h2_only).then(|| slot.requests());
    let io = TokioIo::new(Lingering::new(HeadWatch::new(io, watch)));
    let conn = builder.serve_connection(io, svc).into_owned();
    let watch = slot.closing(lifetime.first_request, lifetime.idle(), lifetime.head);
    let (_watch, mut closing, mut draining) = ConnectionWatch::spawn(watch, drain);
    let mut conn = std::pin::pin!(conn);
    let (mut drained, mut answer_made) = (false, false);
    // Armed once an unpaired certificate's answer is made.
    let mut cutoff: Option<Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        tokio::select! {
            biased;
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("connection ended: {e}");
                }
                return;
            }
            _ = &mut closing => {
                tracing::debug!("connection closed: idle, or its place was needed");
                return;
            }
            r = &mut draining, if !drained => {
                drained = true;
                if r.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
            _ = async { answered.as_ref().expect("checked").notified().await },
                if answered.is_some() && !answer_made =>
            {
                answer_made = true;
                conn.as_mut().graceful_shutdown();
                // HTTP/2's GOAWAY waits for the client's answer to a PING: one that never
                // answers is closed anyway. Not before an HTTP/1 answer's lingering close
                // (reading what the client still sends, so that it gets the answer) is over.
                let after = lifetime.head + crate::lingering::LINGER_TIME;
                cutoff = Some(Box::pin(tokio::time::sleep(after)));
            }
            _ = async { cutoff.as_mut().expect("armed").await }, if cutoff.is_some() => {
                tracing::debug!("connection closed: its one answer was made");
                return;
            }
        }
    }
}

/// A request's answer on its connection: once it is made, an unpaired certificate's
/// connection is told (`first_answer`), and what the caller left unread of its body is
/// settled against it; the request is in flight (`guard`) until then.
async fn answer(
    call: Either<StackFuture, WaitingFuture>,
    first_answer: Option<Arc<tokio::sync::Notify>>,
    unread: Option<Unread>,
    expectation: BodyExpectation,
    guard: RequestGuard,
) -> <StackFuture as Future>::Output {
    let mut resp = call.await;
    if let Some(answered) = first_answer {
        answered.notify_one();
    }
    if let (Ok(resp), Some(rest)) = (&mut resp, unread.and_then(Unread::take)) {
        caller_body::settle(rest, expectation, resp);
    }
    drop(guard);
    resp
}

/// A connection's watch, in a task of its own, so that the connection's many wake-ups poll
/// only two channels, not its timer, its notifications and the drain's watch. It tells the
/// connection to close (idle, or its place needed) or to finish its request and close (the
/// drain began), and holds the drain's watch until the connection has ended: the task ends
/// when this handle is dropped.
struct ConnectionWatch(tokio::task::JoinHandle<()>);

/// The watch's word to its connection: close now, or begin to drain.
type Told = tokio::sync::oneshot::Receiver<()>;

impl ConnectionWatch {
    /// Watch `closing` (the slot's idle and head timers) and `drain`; the two receivers hear
    /// when the connection is to close, and when the drain began.
    fn spawn(
        closing: impl Future<Output = ()> + Send + 'static,
        mut drain: DrainWatch,
    ) -> (Self, Told, Told) {
        let (closed, closing_told) = tokio::sync::oneshot::channel::<()>();
        let (began, draining_told) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut closing = std::pin::pin!(closing);
            tokio::select! {
                _ = closing.as_mut() => {}
                _ = drain.began() => {
                    let _ = began.send(());
                    closing.await;
                }
            }
            let _ = closed.send(());
            // Dropped (with the drain's watch) only when the connection has ended.
            std::future::pending::<()>().await;
        });
        (ConnectionWatch(task), closing_told, draining_told)
    }
}

impl Drop for ConnectionWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A new connection's watch of the drain, unless the drain has begun.
async fn drain_watch(drain: &tokio::sync::Mutex<Option<Drain>>) -> Option<DrainWatch> {
    drain.lock().await.as_ref().map(Drain::watch)
}

/// Serve a Unix socket: every connection is the local principal.
pub async fn accept_unix(
    l: UnixListener,
    shared: Arc<Shared>,
    stacks: Arc<ArcSwap<HttpStack>>,
    mut shutdown: watch::Receiver<bool>,
    drain: Arc<tokio::sync::Mutex<Option<Drain>>>,
    max_conns: usize,
) {
    let table = ConnectionTable::new(max_conns, max_conns);
    loop {
        let (stream, _) = tokio::select! {
            r = l.accept() => match r {
                Ok(s) => s,
                Err(e) => { tracing::warn!("unix accept: {e}"); tokio::time::sleep(Duration::from_millis(50)).await; continue; }
            },
            _ = shutdown.changed() => return,
        };
        // Local callers are trusted: at the cap a new one is refused, none evicted.
        let slot = match table.admit() {
            Ok(slot) if slot.identify("local", true).is_ok() => slot,
            _ => {
                tracing::warn!("connection limit reached; closing a new unix connection");
                continue;
            }
        };
        let Some(watch) = drain_watch(&drain).await else {
            return;
        };
        let lifetime = Lifetime::of(&shared.config.load());
        let parts = (shared.clone(), stacks.clone());
        shared.workers.serve(stream, move |stream| {
            let local = ConnectionIdentity::Local;
            serve_connection(stream, local, false, slot, lifetime, parts, watch)
        });
    }
}

/// What a TCP listener serves: its stack and its TLS.
#[derive(Clone)]
pub enum TcpEndpoint {
    /// The tool-host role's listener: the inbound stack, and the TLS of the current pairing
    /// (or the configured files), which an installed pairing replaces.
    Inbound,
    /// The outbound role's endpoint for remote agents (`outbound.listen`): its own TLS, no
    /// client certificates.
    Outbound(Arc<crate::tls::ListenerTls>),
}

impl TcpEndpoint {
    fn parts(
        &self,
        shared: &Arc<Shared>,
    ) -> (
        Arc<ArcSwap<HttpStack>>,
        Option<Arc<crate::tls::ListenerTls>>,
    ) {
        match self {
            TcpEndpoint::Inbound => (shared.stack.clone(), shared.tls.load_full()),
            TcpEndpoint::Outbound(tls) => (shared.outbound_stack.clone(), Some(tls.clone())),
        }
    }
}

/// Serve a TCP listener (mTLS, or plain loopback for a signed front).
pub async fn accept_tcp(
    l: TcpListener,
    endpoint: TcpEndpoint,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
    drain: Arc<tokio::sync::Mutex<Option<Drain>>>,
) {
    let limits = shared.config.load().config.limits.clone();
    let table = ConnectionTable::new(limits.max_connections, limits.max_connections_per_peer);
    let mut peers_changed = shared.peers.changes();
    loop {
        let (stream, peer) = tokio::select! {
            r = l.accept() => match r {
                Ok(s) => s,
                Err(e) => { tracing::warn!("tcp accept: {e}"); tokio::time::sleep(Duration::from_millis(50)).await; continue; }
            },
            _ = shutdown.changed() => return,
            Ok(()) = peers_changed.changed() => {
                let closed = table.close_unpaired(|cert| shared.peers.resolve(cert).is_ok());
                if closed > 0 {
                    tracing::info!(closed, "closed the connections of peers no longer paired");
                }
                continue;
            }
        };
        let slot = match table.admit() {
            Ok(slot) => slot,
            Err(e) => {
                tracing::warn!(%peer, "closing a new connection: {e}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if drain.lock().await.is_none() {
            return;
        }
        let (endpoint, drain, to) = (endpoint.clone(), drain.clone(), shared.clone());
        shared.workers.serve(stream, move |stream| {
            serve_tcp(stream, peer, slot, endpoint, to, drain)
        });
    }
}

/// One TCP connection: the TLS handshake (bounded), who it is, then HTTP.
async fn serve_tcp(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    slot: Slot,
    endpoint: TcpEndpoint,
    shared: Arc<Shared>,
    drain: Arc<tokio::sync::Mutex<Option<Drain>>>,
) {
    let mut lifetime = Lifetime::of(&shared.config.load());
    let (stacks, tls) = endpoint.parts(&shared);
    let parts = (shared.clone(), stacks);
    let Some(listener_tls) = tls else {
        // A signed front on loopback: every call is authenticated by its signature.
        if let Err(e) = slot.identify(
            &carapace_filters::call::AddressBlock(peer.ip()).to_string(),
            false,
        ) {
            tracing::info!(%peer, "closing a connection: {e}");
            return;
        }
        let identity = ConnectionIdentity::Anonymous {
            remote_ip: Some(peer.ip()),
        };
        let Some(watch) = drain_watch(&drain).await else {
            return;
        };
        return serve_connection(stream, identity, false, slot, lifetime, parts, watch).await;
    };
    let handshake =
        Duration::from_millis(shared.config.load().config.limits.tls_handshake_timeout_ms);
    let accept = tokio::time::timeout(handshake, listener_tls.acceptor.accept(stream));
    let tls = tokio::select! {
        r = accept => match r {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => return tracing::info!(%peer, "TLS handshake failed: {e}"),
            Err(_) => return tracing::info!(%peer, "TLS handshake timed out"),
        },
        // The first request's deadline runs from accept, through the handshake.
        _ = slot.closing(lifetime.first_request, lifetime.idle, lifetime.head) => {
            return tracing::debug!(%peer, "closed in the TLS handshake: too slow, or its place was needed")
        }
    };
    let (_, conn) = tls.get_ref();
    let identity = match conn.peer_certificates().and_then(|c| c.first()) {
        Some(cert) => ConnectionIdentity::Certificate(Arc::new(PeerCertificate {
            fingerprint: crate::tls::fingerprint(cert),
            gateway_id: crate::tls::gateway_id(cert),
            ca_fingerprint: listener_tls.client_ca_fingerprint.clone(),
        })),
        None => ConnectionIdentity::Anonymous {
            remote_ip: Some(peer.ip()),
        },
    };
    // Who holds the connection: a paired peer by its id, anyone else by address.
    let address = carapace_filters::call::AddressBlock(peer.ip()).to_string();
    let holder = match &identity {
        ConnectionIdentity::Certificate(cert) => slot
            .identify_certificate(cert, &address, |c| {
                shared.peers.resolve(c).ok().map(|p| p.id.clone())
            })
            .map(Some),
        _ => slot.identify(&address, false).map(|()| None),
    };
    match holder {
        // Answered (PAIRING_REQUIRED or FORBIDDEN) once, then closed.
        Ok(Some(CertificateHolder::Unpaired)) => lifetime.single_answer = true,
        Ok(_) => {}
        Err(e) => return tracing::info!(%peer, "closing a connection: {e}"),
    }
    let h2 = conn.alpn_protocol() == Some(b"h2");
    // Watched for the drain only from here: a handshake never holds a shutdown up.
    let Some(watch) = drain_watch(&drain).await else {
        return;
    };
    serve_connection(tls, identity, h2, slot, lifetime, parts, watch).await
}
