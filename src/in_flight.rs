//! Calls in flight that their caller may cancel: a tools-v1 `POST /v1/tools/cancel`, an MCP
//! `notifications/cancelled`. A cancelled call is dropped, and with it its request to the app.

use std::collections::{hash_map, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

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
    /// The key is shared with the table (the caller may keep a copy, to name the call).
    pub async fn run<T>(&self, key: Arc<CallKey>, call: impl Future<Output = T>) -> Finished<T> {
        let (tx, cancelled) = oneshot::channel();
        self.lock().insert(key.clone(), tx);
        let _entry = Entry { table: self, key };
        tokio::select! {
            out = call => Finished::Done(out),
            Ok(()) = cancelled => Finished::Cancelled,
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
}
