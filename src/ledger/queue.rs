//! The ledger's queue: finished calls' records waiting for the writer.
//!
//! A call's record is pushed onto a vector under a mutex held for the push; the writer takes
//! the whole vector once a tick, swapping in the (emptied) one it wrote last. So a call pays
//! one uncontended lock and a push, and the writer one lock per tick, not a channel's slot,
//! semaphore and waker per record. The queue is bounded by its places: a place is taken when a
//! record is pushed, or earlier by [`RecordQueue::reserve`] (a call under `on_full: refuse`
//! takes its place when it starts), and given back when the writer takes the record.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::Record;

/// Records waiting for the writer, at most `capacity` places taken.
#[derive(Debug)]
pub struct RecordQueue {
    records: Mutex<Vec<Record>>,
    /// Places taken: records queued, and places reserved for records to come.
    taken: AtomicUsize,
    capacity: usize,
    /// Nothing more will be pushed (the ledger's handle is gone).
    closed: AtomicBool,
}

/// A place in the queue, reserved for one record; given back if dropped unused.
#[derive(Debug)]
pub struct Place {
    queue: Arc<RecordQueue>,
    filled: bool,
}

impl RecordQueue {
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(RecordQueue {
            records: Mutex::new(Vec::with_capacity(capacity.min(4096))),
            taken: AtomicUsize::new(0),
            capacity,
            closed: AtomicBool::new(false),
        })
    }

    /// Take a place, if one is free (never counting past the capacity, so that a refused
    /// call cannot make another one see the queue full).
    fn take_place(&self) -> bool {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .is_ok()
    }

    /// A place for a record to come; `None` when the queue is full.
    pub fn reserve(self: &Arc<Self>) -> Option<Place> {
        self.take_place().then(|| Place {
            queue: Arc::clone(self),
            filled: false,
        })
    }

    /// Queue `record` in a free place; `false` (the record dropped) when there is none.
    pub fn push(&self, record: Record) -> bool {
        if !self.take_place() {
            return false;
        }
        self.append(record);
        true
    }

    fn append(&self, record: Record) {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record);
    }

    /// Move every queued record into `into` (which the queue keeps, emptied, for the next
    /// records: `into` must be empty) and give their places back.
    pub fn take(&self, into: &mut Vec<Record>) {
        debug_assert!(into.is_empty());
        std::mem::swap(
            &mut *self.records.lock().unwrap_or_else(|e| e.into_inner()),
            into,
        );
        self.taken.fetch_sub(into.len(), Ordering::AcqRel);
    }

    /// Nothing more will be pushed.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

impl Place {
    /// Queue `record` in this place.
    pub fn fill(mut self, record: Record) {
        self.queue.append(record);
        self.filled = true;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if !self.filled {
            self.queue.taken.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
