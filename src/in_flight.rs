//! Calls in flight that their caller may cancel: a tools-v1 `POST /v1/tools/cancel`, an MCP
//! `notifications/cancelled`. A cancelled call is dropped, and with it its request to the app.

use std::collections::{hash_map, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::sync::oneshot;

/// Who may cancel a call and how it is named: the front, the caller (a principal, or an MCP
/// session) and the call's id.
pub type CallKey = (&'static str, String, String);

/// The table's map. Every call goes in and out of it, so its keys are hashed with foldhash
/// (seeded at random per process, as the peer table's) rather than SipHash, which cost three
/// times as much per call. Call ids are the callers', and foldhash resists only simple flooding;
/// the table holds at most the calls in flight (`limits.max_in_flight`), so colliding ids
/// cannot make it long.
type Table = HashMap<Arc<CallKey>, oneshot::Sender<()>, foldhash::fast::RandomState>;

/// The cancellable calls in flight in this process.
#[derive(Debug, Default)]
pub struct InFlightCalls(Mutex<Table>);

/// How a cancellable call ended.
pub enum Finished<T> {
    Done(T),
    Cancelled,
}

impl InFlightCalls {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `call` under `key` until it ends or [`cancel`](Self::cancel) names it. A second
    /// call under the same key takes the name over (callers must not reuse an id in flight).
    /// The key is shared with the table (the caller may keep a copy, to name the call). The
    /// name is taken here, not when the returned future is first polled.
    pub fn run<F: Future>(&self, key: Arc<CallKey>, call: F) -> InFlight<'_, F> {
        let (tx, cancelled) = oneshot::channel();
        self.lock().insert(key.clone(), tx);
        InFlight {
            call,
            cancelled: Some(cancelled),
            _entry: Entry { table: self, key },
        }
    }

    /// Cancel the call named `key`; whether one was in flight.
    pub fn cancel(&self, key: &CallKey) -> bool {
        match self.lock().remove(key) {
            Some(tx) => tx.send(()).is_ok(),
            None => false,
        }
    }
}

pin_project_lite::pin_project! {
    /// A call in flight under its name (see [`InFlightCalls::run`]): no larger than the call
    /// itself and a few words, so moving it costs no more than moving the call.
    pub struct InFlight<'a, F> {
        #[pin]
        call: F,
        // `None` once the table dropped its sender (a newer call took the name over).
        cancelled: Option<oneshot::Receiver<()>>,
        // Last: the receiver is dropped first, so that the entry finds its sender closed.
        _entry: Entry<'a>,
    }
}

impl<F: Future> Future for InFlight<'_, F> {
    type Output = Finished<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.call.poll(cx) {
            return Poll::Ready(Finished::Done(out));
        }
        if let Some(cancelled) = this.cancelled {
            match Pin::new(cancelled).poll(cx) {
                Poll::Ready(Ok(())) => return Poll::Ready(Finished::Cancelled),
                Poll::Ready(Err(_)) => *this.cancelled = None,
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }
}

/// Takes a call's name out of the table when the call ends, however it ends.
struct Entry<'a> {
    table: &'a InFlightCalls,
    key: Arc<CallKey>,
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        // Only its own entry: a newer call under the same name keeps its place. One lookup:
        // the entry is found by the key it was inserted with.
        if let hash_map::Entry::Occupied(e) = self.table.lock().entry(self.key.clone()) {
            if e.get().is_closed() {
                e.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> Arc<CallKey> {
        Arc::new(("test", "caller".into(), id.into()))
    }

    #[tokio::test]
    async fn a_cancelled_call_is_dropped_and_a_finished_one_cannot_be_cancelled() {
        let table = std::sync::Arc::new(InFlightCalls::default());
        let t = table.clone();
        let slow = tokio::spawn(async move { t.run(key("a"), std::future::pending::<()>()).await });
        while !table.lock().contains_key(&key("a")) {
            tokio::task::yield_now().await;
        }
        assert!(table.cancel(&key("a")));
        assert!(matches!(slow.await.unwrap(), Finished::Cancelled));
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
        assert!(matches!(newer.await, Finished::Cancelled));
        assert!(futures_util::poll!(older.as_mut()).is_pending());
        older_tx.send(3).unwrap();
        assert!(matches!(older.await, Finished::Done(Ok(3))));
        assert!(table.lock().is_empty());
    }
}
