//! Pools of HTTP/1.1 connections to one target, one pool per worker, driven by hyper's
//! connection API: a call takes an idle connection of its own worker (or opens one there),
//! sends on it, and gives it back once the answer has been read to its end. A connection's
//! task runs on the worker that opened it, so a call and its connection share one thread.
//! When other calls of the worker are already waiting on the app, a call writes its request
//! after the rest of the event loop's turn (`waiting.rs`).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use carapace_filters::clock;
use tokio::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

use super::exchange::{self, Answer, Conn, ExchangeError};
use super::waiting::{Waiting, WaitingCalls};
use super::{AppConnector, AppStream};

type Sender = SendRequest<Full<Bytes>>;

/// Why a request got no answer.
pub(super) enum Failure {
    /// Nothing was written: no connection, or hyper gave the request back unsent.
    Unsent(String),
    /// The request was (or may have been) written: the app may have acted on it.
    Sent(String),
    /// The answer is larger than allowed.
    TooLarge(String),
}

/// One idle connection.
struct Idle {
    sender: Sender,
    since: Instant,
}

/// One idle connection of the exchanges carapace drives itself (`exchange.rs`).
struct IdleConn {
    conn: Conn,
    since: Instant,
}

/// The idle connections of one worker (its locks are only ever taken on that worker's thread,
/// so they are never contended).
#[derive(Default)]
struct Pool {
    idle: Mutex<Vec<Idle>>,
    idle_conns: Mutex<Vec<IdleConn>>,
    /// A sweeper closes this pool's connections idle past the timeout.
    sweeping: AtomicBool,
    /// This worker's calls waiting on the app.
    waiting: WaitingCalls,
}

/// Whether a busy worker's calls write after the rest of its event loop's turn (`waiting.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Writes {
    /// The app (which shares the machine's cores) through one pool per worker: batch a busy
    /// worker's writes.
    AfterTheTurn,
    /// A remote target, or a pool every worker shares (whose one count would make a call wait
    /// on another worker's calls): every call writes at once.
    AtOnce,
}

/// Per-worker pools to one target.
pub(super) struct Pools {
    per_worker: Box<[Pool]>,
    connector: AppConnector,
    idle_timeout: Duration,
    max_idle: usize,
    writes: Writes,
}

impl Pools {
    pub(super) fn new(
        workers: usize,
        connector: AppConnector,
        idle_timeout: Duration,
        max_idle: usize,
        writes: Writes,
    ) -> Pools {
        Pools {
            per_worker: (0..workers.max(1)).map(|_| Pool::default()).collect(),
            connector,
            idle_timeout,
            max_idle,
            writes,
        }
    }

    pub(super) fn connector(&self) -> &AppConnector {
        &self.connector
    }

    fn home(&self) -> usize {
        crate::server::worker_index() % self.per_worker.len()
    }

    /// The calls counted as waiting, on every worker.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.per_worker.iter().map(|p| p.waiting.count()).sum()
    }

    /// Count a call to the app as waiting on worker `home` (after the rest of the turn when
    /// the worker is busy); a call to a remote target is not counted and goes at once.
    async fn enter(&self, home: usize) -> Option<Waiting<'_>> {
        match self.writes {
            Writes::AfterTheTurn => Some(self.per_worker[home].waiting.enter().await),
            Writes::AtOnce => None,
        }
    }

    /// The most recently used idle connection of this worker that can take a request.
    async fn checkout(&self, home: usize) -> Option<Sender> {
        loop {
            let Idle { mut sender, since } = lock(&self.per_worker[home].idle).pop()?;
            // Ready at once unless its connection closed (then it is dropped here).
            if clock::elapsed(since) < self.idle_timeout && sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    /// Send `req` on a pooled connection, or a new one. A pooled connection the app closed
    /// meanwhile gives the request back unsent; it then goes on the next one.
    pub(super) async fn send(
        self: &Arc<Self>,
        mut req: Request<Full<Bytes>>,
    ) -> Result<(Response<Incoming>, Lease), Failure> {
        let home = self.home();
        // Counted until the answer's head: a streamed body (SSE) may last as long as it likes.
        let _waiting = self.enter(home).await;
        loop {
            let (mut sender, fresh) = match self.checkout(home).await {
                Some(s) => (s, false),
                None => (self.connect().await?, true),
            };
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    let lease = Lease {
                        sender: Some(sender),
                        pools: self.clone(),
                        home,
                    };
                    return Ok((resp, lease));
                }
                Err(mut e) => match e.take_message() {
                    Some(unsent) if !fresh => req = unsent,
                    Some(_) => return Err(Failure::Unsent(error_chain(&e.into_error()))),
                    None => return Err(Failure::Sent(error_chain(&e.into_error()))),
                },
            }
        }
    }

    /// One exchange driven in the calling task (`exchange.rs`), on this worker's most recently
    /// used idle connection that is still open, or a new one; the answer's headers kept with
    /// `keep_headers`.
    pub(super) async fn exchange(
        self: &Arc<Self>,
        request: &[u8],
        method: &http::Method,
        max: usize,
        keep_headers: bool,
    ) -> Result<Answer, Failure> {
        let home = self.home();
        let _waiting = self.enter(home).await;
        let mut conn = match self.checkout_conn(home) {
            Some(c) => c,
            // Boxed: a connection is made rarely, and its future is most of this one's size,
            // which every call's future would carry (and copy as it is moved) otherwise.
            None => Conn::new(
                Box::pin(self.connector.connect())
                    .await
                    .map_err(|e| Failure::Unsent(error_chain(&e)))?,
            ),
        };
        let answer = exchange::exchange(&mut conn, request, method, max, keep_headers)
            .await
            .map_err(|e| match e {
                ExchangeError::TooLarge(_) => Failure::TooLarge(e.to_string()),
                e => Failure::Sent(e.to_string()),
            })?;
        if answer.reusable {
            self.checkin_conn(home, conn);
        }
        Ok(answer)
    }

    fn checkout_conn(&self, home: usize) -> Option<Conn> {
        let mut idle = lock(&self.per_worker[home].idle_conns);
        while let Some(IdleConn { mut conn, since }) = idle.pop() {
            if clock::elapsed(since) < self.idle_timeout && !conn.is_closed() {
                return Some(conn);
            }
        }
        None
    }

    fn checkin_conn(self: &Arc<Self>, home: usize, conn: Conn) {
        let pool = &self.per_worker[home];
        let mut idle = lock(&pool.idle_conns);
        if idle.len() >= self.max_idle {
            return;
        }
        idle.push(IdleConn {
            conn,
            since: clock::now(),
        });
        drop(idle);
        self.keep_swept(home);
    }

    /// Start worker `home`'s sweeper unless it runs. Read first: a swap is a locked
    /// instruction, and the sweeper runs while connections are idle, so a checkin nearly always
    /// finds it running. (It stops only with both lists locked and empty: a connection pushed
    /// after it looked is seen here as not swept.)
    fn keep_swept(self: &Arc<Self>, home: usize) {
        let sweeping = &self.per_worker[home].sweeping;
        if !sweeping.load(Ordering::Acquire) && !sweeping.swap(true, Ordering::AcqRel) {
            tokio::spawn(sweep(self.clone(), home));
        }
    }

    /// A new connection on this worker, its task spawned here.
    async fn connect(&self) -> Result<Sender, Failure> {
        let stream: AppStream = self
            .connector
            .connect()
            .await
            .map_err(|e| Failure::Unsent(error_chain(&e)))?;
        let (mut sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Failure::Unsent(error_chain(&e)))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("app connection ended: {e}");
            }
        });
        sender
            .ready()
            .await
            .map_err(|e| Failure::Unsent(error_chain(&e)))?;
        Ok(sender)
    }

    /// Take a connection back after its answer was read to the end.
    fn checkin(self: &Arc<Self>, home: usize, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let pool = &self.per_worker[home];
        let mut idle = lock(&pool.idle);
        if idle.len() >= self.max_idle {
            return;
        }
        idle.push(Idle {
            sender,
            since: clock::now(),
        });
        drop(idle);
        self.keep_swept(home);
    }
}

/// Close the connections of one pool idle past the timeout, until the pool is empty.
async fn sweep(pools: Arc<Pools>, home: usize) {
    let pool = &pools.per_worker[home];
    loop {
        tokio::time::sleep(pools.idle_timeout).await;
        // Oldest first: connections are given back in the order they were used.
        let mut idle = lock(&pool.idle);
        let stale = idle.partition_point(|i| i.since.elapsed() >= pools.idle_timeout);
        idle.drain(..stale);
        idle.retain(|i| !i.sender.is_closed());
        let mut conns = lock(&pool.idle_conns);
        let stale = conns.partition_point(|i| i.since.elapsed() >= pools.idle_timeout);
        conns.drain(..stale);
        if idle.is_empty() && conns.is_empty() {
            pool.sweeping.store(false, Ordering::Release);
            return;
        }
    }
}

fn lock<T>(m: &Mutex<Vec<T>>) -> std::sync::MutexGuard<'_, Vec<T>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection lent to one answer: back to its pool when the answer's body has ended.
pub(super) struct Lease {
    sender: Option<Sender>,
    pools: Arc<Pools>,
    home: usize,
}

impl Lease {
    fn release(&mut self) {
        if let Some(sender) = self.sender.take() {
            self.pools.checkin(self.home, sender);
        }
    }
}

/// An answer's body; its connection goes back to the pool when the body has been read to
/// its end (a body dropped earlier closes its connection).
pub struct AppBody {
    inner: Incoming,
    lease: Lease,
}

impl AppBody {
    pub(super) fn new(inner: Incoming, lease: Lease) -> AppBody {
        AppBody { inner, lease }
    }
}

impl Body for AppBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if frame.is_none() {
            this.lease.release();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
