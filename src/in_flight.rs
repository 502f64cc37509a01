//! Calls in flight that their caller may cancel: a tools-v1 `POST /v1/tools/cancel`, an MCP
//! `notifications/cancelled`. A cancelled call is dropped, and with it its request to the app.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use carapace_filters::nonce::IdentityHasher;
use futures_util::task::AtomicWaker;

/// Who may cancel a call and how it is named: the front, the caller (a principal, or an MCP
/// session) and the call's id. Shared strings: a call's name is its principal's and its own
/// id, held without a copy.
pub type CallKey = (&'static str, Arc<str>, Arc<str>);

/// A call's name with its hash, taken once when the call starts: the table hashes only this
/// number, so a call leaves it without hashing its name again.
#[derive(PartialEq, Eq)]
struct Name {
    hash: u64,
    key: CallKey,
}

impl Hash for Name {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// A call in the table: its name and how it learns it was cancelled (one allocation).
struct Slot {
    name: Name,
    cancelled: AtomicBool,
    waker: AtomicWaker,
}

/// The table holds each call's slot, found by its name.
struct Listed(Arc<Slot>);

impl Borrow<Name> for Listed {
    fn borrow(&self) -> &Name {
        &self.0.name
    }
}
impl Hash for Listed {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}
impl PartialEq for Listed {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}
impl Eq for Listed {}

/// A [`Name`]'s hash is already one: the table takes it as it is.
type Table = HashSet<Listed, BuildHasherDefault<IdentityHasher>>;

/// The cancellable calls in flight in this process. Every call goes in and out of the table,
/// so names are hashed with foldhash (seeded at random per process, as the peer table's)
/// rather than SipHash, which cost three times as much per call. Call ids are the callers',
/// and foldhash resists only simple flooding; the table holds at most the calls in flight
/// (`limits.max_in_flight`), so colliding ids cannot make it long.
#[derive(Default)]
pub struct InFlightCalls {
    table: Mutex<Table>,
    hasher: foldhash::fast::RandomState,
}

impl std::fmt::Debug for InFlightCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlightCalls")
            .field("calls", &self.lock().len())
            .finish()
    }
}

/// How a cancellable call ended.
pub enum Finished<T> {
    Done(T),
    /// Cancelled, with the name it ran under.
    Cancelled(CallKey),
}

impl InFlightCalls {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn name(&self, key: CallKey) -> Name {
        Name {
            hash: self.hasher.hash_one(&key),
            key,
        }
    }

    /// Run `call` under `key` until it ends or [`cancel`](Self::cancel) names it. A second
    /// call under the same key takes the name over (callers must not reuse an id in flight).
    /// The name is taken here, not when the returned future is first polled.
    pub fn run<F: Future>(&self, key: CallKey, call: F) -> InFlight<'_, F> {
        let slot = Arc::new(Slot {
            name: self.name(key),
            cancelled: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        });
        self.lock().replace(Listed(slot.clone()));
        InFlight {
            call,
            named: Named { table: self, slot },
        }
    }

    /// Cancel the call named `key`; whether one was in flight.
    pub fn cancel(&self, key: &CallKey) -> bool {
        let name = self.name(key.clone());
        let Some(Listed(slot)) = self.lock().take(&name) else {
            return false;
        };
        slot.cancelled.store(true, Ordering::Release);
        slot.waker.wake();
        true
    }
}

pin_project_lite::pin_project! {
    /// A call that its caller may cancel (see [`InFlightCalls::run`]).
    pub struct InFlight<'a, F> {
        #[pin]
        call: F,
        named: Named<'a>,
    }
}

impl<F: Future> Future for InFlight<'_, F> {
    type Output = Finished<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.call.poll(cx) {
            return Poll::Ready(Finished::Done(out));
        }
        let slot = &this.named.slot;
        slot.waker.register(cx.waker());
        if slot.cancelled.load(Ordering::Acquire) {
            return Poll::Ready(Finished::Cancelled(slot.name.key.clone()));
        }
        Poll::Pending
    }
}

/// The call's place in the table, given up when the call ends (unless a newer call under the
/// same name took it over, or a cancel took it out).
struct Named<'a> {
    table: &'a InFlightCalls,
    slot: Arc<Slot>,
}

impl Drop for Named<'_> {
    fn drop(&mut self) {
        let mut table = self.table.lock();
        // One lookup: the name is almost always this call's; a newer call's is put back.
        if let Some(listed) = table.take(&self.slot.name) {
            if !Arc::ptr_eq(&listed.0, &self.slot) {
                table.insert(listed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    fn key(id: &str) -> CallKey {
        ("test", "caller".into(), id.into())
    }

    fn holds(table: &InFlightCalls, key: &CallKey) -> bool {
        table.lock().contains(&table.name(key.clone()))
    }

    #[tokio::test]
    async fn a_cancelled_call_is_dropped_and_a_finished_one_cannot_be_cancelled() {
        let table = std::sync::Arc::new(InFlightCalls::default());
        let t = table.clone();
        let slow = tokio::spawn(async move { t.run(key("a"), std::future::pending::<()>()).await });
        while !holds(&table, &key("a")) {
            tokio::task::yield_now().await;
        }
        assert!(table.cancel(&key("a")));
        assert!(matches!(slow.await.unwrap(), Finished::Cancelled(k) if k == key("a")));
        assert!(matches!(
            table.run(key("b"), async { 7 }).await,
            Finished::Done(7)
        ));
        assert!(!table.cancel(&key("b")), "finished calls leave the table");
        assert!(table.lock().is_empty());
    }

    #[tokio::test]
    async fn a_newer_call_under_the_same_name_takes_it_over_and_the_older_one_still_ends() {
        let table = InFlightCalls::default();
        let (older_tx, older_rx) = oneshot::channel::<u8>();
        let mut older = Box::pin(table.run(key("a"), older_rx));
        assert!(futures_util::poll!(older.as_mut()).is_pending());
        let mut newer = Box::pin(table.run(key("a"), std::future::pending::<()>()));
        assert!(futures_util::poll!(newer.as_mut()).is_pending());
        // The name is the newer call's: cancelling it ends that one only.
        assert!(table.cancel(&key("a")));
        assert!(matches!(newer.await, Finished::Cancelled(_)));
        assert!(futures_util::poll!(older.as_mut()).is_pending());
        older_tx.send(3).unwrap();
        assert!(matches!(older.await, Finished::Done(Ok(3))));
        assert!(table.lock().is_empty());
    }

    #[test]
    fn a_call_gives_its_name_up_when_it_ends_unless_a_newer_one_took_it() {
        let table = InFlightCalls::default();
        let older = table.run(key("a"), std::future::pending::<()>());
        let newer = table.run(key("a"), std::future::pending::<()>());
        drop(older);
        assert!(holds(&table, &key("a")), "the newer call keeps the name");
        drop(newer);
        assert!(!holds(&table, &key("a")));
        assert!(!table.cancel(&key("a")));
    }
}
