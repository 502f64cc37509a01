//! The caller connections of a TCP listener: how many are open, whose they are, and which
//! may be closed to make room.
//!
//! A connection is admitted at accept while fewer than `max` are open. At the cap, the
//! oldest connection that is *evictable* (not a paired peer's, and with no request in
//! flight: a TLS handshake in progress, an unpaired certificate, an anonymous caller waiting
//! between requests) is told to close and the new one takes its place; only when none is
//! evictable is the new connection closed. So connections that send nothing, or whose
//! certificate is not paired, can never lock a paired peer out. Once a connection's peer is
//! known, at most `max_per_peer` connections are held per peer (a paired peer's
//! `component_id`, otherwise the caller's address).

pub mod address;

pub use address::{AddressPlace, AddressPlaces};

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::Notify;

use carapace_filters::identity::PeerCertificate;

/// The open connections of one listener.
#[derive(Debug)]
pub struct ConnectionTable {
    max: usize,
    max_per_peer: usize,
    epoch: Instant,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    /// By id, so in order of acceptance: the first evictable one is the oldest.
    open: BTreeMap<u64, Arc<Activity>>,
    per_peer: HashMap<String, usize>,
}

/// What the table and the connection's own tasks share about one connection.
#[derive(Debug)]
pub struct Activity {
    /// Requests being served on the connection.
    in_flight: AtomicUsize,
    /// When the last request ended (or the connection was accepted), in ms since the
    /// table's epoch.
    last_active_ms: AtomicU64,
    /// A paired peer's connection: never evicted.
    trusted: AtomicBool,
    /// At least one request ended.
    served: AtomicBool,
    /// When the first byte of a request head arrived while no request was in flight (ms since
    /// the table's epoch), or [`NO_HEAD`].
    head_started_ms: AtomicU64,
    /// Set when the table wants the connection closed.
    close: Notify,
    /// Set when the first request ends (the idle deadline replaces the first-request one).
    ended: Notify,
    peer: Mutex<Option<String>>,
    /// A paired peer's connection: the certificate it was paired by.
    certificate: Mutex<Option<Arc<PeerCertificate>>>,
}

/// No request head is arriving.
const NO_HEAD: u64 = u64::MAX;

/// Why a connection was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("connection limit reached and no connection can be closed to make room")]
    Full,
    #[error("peer {0} holds its most connections")]
    PeerFull(String),
    #[error("its peer is no longer paired")]
    NoLongerPaired,
}

/// Whose a connection with a client certificate is ([`Slot::identify_certificate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateHolder {
    /// A paired peer's: trusted, closed when the certificate no longer pairs it.
    Paired,
    /// The certificate pairs no one: held by the caller's address.
    Unpaired,
}

impl ConnectionTable {
    pub fn new(max: usize, max_per_peer: usize) -> Arc<Self> {
        Arc::new(ConnectionTable {
            max: max.max(1),
            max_per_peer: max_per_peer.max(1),
            epoch: Instant::now(),
            inner: Mutex::new(Inner::default()),
        })
    }

    fn now_ms(&self) -> u64 {
        carapace_filters::clock::elapsed(self.epoch).as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Open connections.
    pub fn len(&self) -> usize {
        self.lock().open.len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Admit a new connection, closing the oldest evictable one when at the cap.
    pub fn admit(self: &Arc<Self>) -> Result<Slot, Refused> {
        let mut inner = self.lock();
        if inner.open.len() >= self.max {
            let victim = inner
                .open
                .iter()
                .find(|(_, a)| a.evictable())
                .map(|(id, _)| *id)
                .ok_or(Refused::Full)?;
            let evicted = inner.open.remove(&victim).expect("found above");
            release_peer(&mut inner, &evicted);
            evicted.close.notify_one();
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let activity = Arc::new(Activity {
            in_flight: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(self.now_ms()),
            trusted: AtomicBool::new(false),
            served: AtomicBool::new(false),
            head_started_ms: AtomicU64::new(NO_HEAD),
            close: Notify::new(),
            ended: Notify::new(),
            peer: Mutex::new(None),
            certificate: Mutex::new(None),
        });
        inner.open.insert(id, activity.clone());
        Ok(Slot {
            table: self.clone(),
            id,
            activity,
        })
    }
}

impl ConnectionTable {
    /// Close the connections of paired peers whose certificate `still_paired` no longer
    /// accepts (the peer revoked, gone from the store, or paired again with another
    /// certificate), requests in flight or not: a revocation ends what the peer has open, not
    /// only its next request. Returns how many were closed.
    pub fn close_unpaired(&self, still_paired: impl Fn(&PeerCertificate) -> bool) -> usize {
        let mut inner = self.lock();
        let gone: Vec<u64> = inner
            .open
            .iter()
            .filter(|(_, a)| {
                a.trusted.load(Ordering::Acquire)
                    && a.certificate
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_deref()
                        .is_some_and(|c| !still_paired(c))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &gone {
            let closed = inner.open.remove(id).expect("listed above");
            release_peer(&mut inner, &closed);
            closed.close.notify_one();
        }
        gone.len()
    }
}

impl Activity {
    fn evictable(&self) -> bool {
        !self.trusted.load(Ordering::Acquire) && self.in_flight.load(Ordering::Acquire) == 0
    }
}

fn release_peer(inner: &mut Inner, a: &Activity) {
    let peer = a.peer.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(peer) = peer {
        if let Some(n) = inner.per_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                inner.per_peer.remove(&peer);
            }
        }
    }
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct Slot {
    table: Arc<ConnectionTable>,
    id: u64,
    activity: Arc<Activity>,
}

impl Slot {
    /// Say whose connection this is. `trusted`: a paired peer's, never evicted.
    pub fn identify(&self, peer: &str, trusted: bool) -> Result<(), Refused> {
        let mut inner = self.table.lock();
        if !inner.open.contains_key(&self.id) {
            // Already evicted: it is closing.
            return Ok(());
        }
        let held = inner.per_peer.get(peer).copied().unwrap_or(0);
        if held >= self.table.max_per_peer {
            return Err(Refused::PeerFull(peer.to_string()));
        }
        release_peer(&mut inner, &self.activity);
        *inner.per_peer.entry(peer.to_string()).or_default() += 1;
        *self.activity.peer.lock().unwrap_or_else(|e| e.into_inner()) = Some(peer.to_string());
        self.activity.trusted.store(trusted, Ordering::Release);
        Ok(())
    }

    /// Say this is the connection of the paired peer `peer`, by `certificate`: trusted, and
    /// closed when the certificate no longer pairs it ([`ConnectionTable::close_unpaired`]).
    fn identify_paired(
        &self,
        peer: &str,
        certificate: Arc<PeerCertificate>,
    ) -> Result<(), Refused> {
        *self
            .activity
            .certificate
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(certificate);
        self.identify(peer, true)
    }

    /// Say whose connection this is by its client certificate: the paired peer `paired_id`
    /// names for `certificate`, or else the caller's `address` block. A paired peer's slot is
    /// looked up again once it is the peer's: a revocation between the first lookup and the
    /// claim found no peer on this slot to close ([`ConnectionTable::close_unpaired`] closes
    /// only paired ones), so it is seen here ([`Refused::NoLongerPaired`]); one after it
    /// finds the slot paired and closes it.
    pub fn identify_certificate<Id: AsRef<str>>(
        &self,
        certificate: &Arc<PeerCertificate>,
        address: &str,
        paired_id: impl Fn(&PeerCertificate) -> Option<Id>,
    ) -> Result<CertificateHolder, Refused> {
        let Some(peer) = paired_id(certificate) else {
            self.identify(address, false)?;
            return Ok(CertificateHolder::Unpaired);
        };
        self.identify_paired(peer.as_ref(), certificate.clone())?;
        if paired_id(certificate).is_none() {
            return Err(Refused::NoLongerPaired);
        }
        Ok(CertificateHolder::Paired)
    }

    /// A handle the connection's request service marks requests with.
    pub fn requests(&self) -> RequestTracker {
        RequestTracker {
            table: self.table.clone(),
            activity: self.activity.clone(),
        }
    }

    /// Resolves when the connection should close: the table evicted it, or it sat idle (no
    /// request in flight) for `idle` since its last request ended, or for `first` after it
    /// was accepted when no request came at all, or a request head began to arrive (see
    /// [`HeadWatch`]) and was not complete within `head`. A head that begins while this
    /// waits is noticed at the next check, at most `head` later: slow heads are closed
    /// within twice `head`, with no wake-up per request.
    ///
    /// The future holds what it watches, not the slot: it can run in a task of its own.
    pub fn closing(
        &self,
        first: Duration,
        idle: Duration,
        head: Duration,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let activity = self.activity.clone();
        let epoch = self.table.epoch;
        async move { watch_closing(&activity, epoch, first, idle, head).await }
    }
}

/// [`Slot::closing`].
async fn watch_closing(
    a: &Activity,
    epoch: Instant,
    first: Duration,
    idle: Duration,
    head: Duration,
) {
    loop {
        let last = a.last_active_ms.load(Ordering::Acquire);
        let allowed = if a.served.load(Ordering::Acquire) {
            idle
        } else {
            first
        };
        let idle_deadline = epoch + Duration::from_millis(last) + allowed;
        let head_at = a.head_started_ms.load(Ordering::Acquire);
        let check = match head_at {
            NO_HEAD => Instant::now() + head,
            at => epoch + Duration::from_millis(at) + head,
        };
        tokio::select! {
            _ = a.close.notified() => return,
            _ = a.ended.notified() => continue,
            _ = tokio::time::sleep_until(idle_deadline.min(check)) => {}
        }
        let busy = a.in_flight.load(Ordering::Acquire) > 0;
        let head_now = a.head_started_ms.load(Ordering::Acquire);
        let head_late =
            head_now != NO_HEAD && epoch + Duration::from_millis(head_now) + head <= Instant::now();
        if !busy && head_late {
            return;
        }
        let idle_over = Instant::now() >= idle_deadline;
        if !busy && idle_over && a.last_active_ms.load(Ordering::Acquire) == last {
            return;
        }
        if busy {
            // A long call: the clock starts again when it ends.
            tokio::select! {
                _ = a.close.notified() => return,
                _ = wait_idle(a) => {}
            }
        }
    }
}

/// Wait until no request is in flight (polled at a coarse interval: only long calls get
/// here, and only to restart the idle clock).
async fn wait_idle(a: &Activity) {
    while a.in_flight.load(Ordering::Acquire) > 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.table.lock();
        if inner.open.remove(&self.id).is_some() {
            release_peer(&mut inner, &self.activity);
        }
    }
}

/// Marks the requests served on one connection.
#[derive(Debug, Clone)]
pub struct RequestTracker {
    table: Arc<ConnectionTable>,
    activity: Arc<Activity>,
}

impl RequestTracker {
    /// A request started; it ends when the guard is dropped.
    pub fn start(&self) -> RequestGuard {
        self.activity.in_flight.fetch_add(1, Ordering::AcqRel);
        self.activity
            .head_started_ms
            .store(NO_HEAD, Ordering::Release);
        RequestGuard(self.clone())
    }

    /// Bytes arrived on the connection: with no request in flight, a request head has begun.
    fn bytes_arrived(&self) {
        let a = &self.activity;
        if a.in_flight.load(Ordering::Acquire) == 0
            && a.head_started_ms.load(Ordering::Acquire) == NO_HEAD
        {
            a.head_started_ms
                .store(self.table.now_ms(), Ordering::Release);
        }
    }
}

pin_project_lite::pin_project! {
    /// An HTTP/1 connection's transport, telling its [`RequestTracker`] when bytes arrive, so
    /// that a request head is bounded from its first byte (`limits.header_read_timeout_ms`)
    /// while a connection waiting for its next request is bounded by the idle timeout. A
    /// connection that opens with the HTTP/2 preface is not watched (HTTP/2 frames arrive
    /// between requests: pings, settings).
    #[derive(Debug)]
    pub struct HeadWatch<T> {
        #[pin]
        io: T,
        tracker: Option<RequestTracker>,
        first_read: bool,
    }
}

impl<T> HeadWatch<T> {
    /// `tracker`: `None` for a connection known to be HTTP/2 (ALPN).
    pub fn new(io: T, tracker: Option<RequestTracker>) -> Self {
        HeadWatch {
            io,
            tracker,
            first_read: true,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }
}

impl<T: tokio::io::AsyncRead> tokio::io::AsyncRead for HeadWatch<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let polled = this.io.poll_read(cx, buf);
        let new = &buf.filled()[before..];
        if !new.is_empty() {
            if std::mem::take(this.first_read) && new.starts_with(b"PRI * HTTP/2.0") {
                *this.tracker = None;
            }
            if let Some(t) = this.tracker {
                t.bytes_arrived();
            }
        }
        polled
    }
}

impl<T: tokio::io::AsyncWrite> tokio::io::AsyncWrite for HeadWatch<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        b: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.project().io.poll_write(cx, b)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

/// One request in flight on a connection.
#[derive(Debug)]
pub struct RequestGuard(RequestTracker);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let t = &self.0;
        t.activity
            .last_active_ms
            .store(t.table.now_ms(), Ordering::Release);
        t.activity.in_flight.fetch_sub(1, Ordering::AcqRel);
        // Only the first request's end can bring the deadline closer (from the first-request
        // deadline to the idle one); later ends only move it on, which the watcher finds when
        // it wakes. No wake-up per request.
        if !t.activity.served.swap(true, Ordering::AcqRel) {
            t.activity.ended.notify_one();
        }
    }
}

#[cfg(test)]
mod tests;
