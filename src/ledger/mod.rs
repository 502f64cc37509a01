//! The invocation ledger: every call either side of carapace handled, in an embedded SQLite
//! database (WAL) in the state directory, each row chained to the one before by its hash
//! ([`store`]).
//!
//! Writes never sit on the call path: the [`LedgerLayer`] hands each finished call's
//! [`Record`] (its fields in one buffer) to a bounded queue ([`queue`]), and one thread takes
//! what has queued up every [`WRITE_INTERVAL`] and writes it in one transaction (group commit;
//! calls never wake it).
//! When the queue is full, `ledger.on_full` decides: `drop` the entry (counted in
//! `carapace_ledger_dropped_total`) or `refuse` new calls until there is room (a place in the
//! queue is taken when a call starts, so an accepted call is always recorded).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use std::time::Duration;

pub mod layer;
pub mod queue;
pub mod record;
pub mod store;

pub use layer::LedgerLayer;
pub use queue::Place;
pub use record::Record;
pub use store::{Entry, Row};

use crate::config::{LedgerConfig, LedgerFull};
use queue::RecordQueue;

/// The ledger's file in `state_dir` unless `ledger.path` says otherwise.
pub const LEDGER_FILE: &str = "ledger.sqlite3";

/// Where the ledger of a configuration is.
pub fn path_of(cfg: &crate::config::Config) -> Option<PathBuf> {
    let l = cfg.ledger.as_ref()?;
    Some(
        l.path
            .clone()
            .unwrap_or_else(|| cfg.state_dir.join(LEDGER_FILE)),
    )
}

/// The ledger's counters, as the metrics endpoint shows them.
#[derive(Debug, Default)]
pub struct LedgerCounters {
    pub written: Counter,
    pub dropped: Counter,
    pub refused: Counter,
}

impl LedgerCounters {
    /// Register the counters in `registry` (`ledger_rows_written`, `ledger_dropped`,
    /// `ledger_refused_calls`).
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "ledger_rows_written",
            "Ledger rows written",
            self.written.clone(),
        );
        registry.register(
            "ledger_dropped",
            "Ledger entries dropped (queue full under on_full: drop, or a failed write)",
            self.dropped.clone(),
        );
        registry.register(
            "ledger_refused_calls",
            "Calls refused because the ledger's queue was full (on_full: refuse)",
            self.refused.clone(),
        );
    }
}

/// The handle calls record through.
pub struct Ledger {
    queue: Arc<RecordQueue>,
    on_full: LedgerFull,
    pub counters: Arc<LedgerCounters>,
    /// Entries queued, and entries the writer has finished with (written or failed).
    queued: AtomicU64,
    settled: Arc<AtomicU64>,
    /// What each consumer had been charged when the ledger was opened: (consumer, total,
    /// today).
    pub spend: Vec<(String, u64, u64)>,
}

/// The ledger's queue has no room (`on_full: refuse`).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the ledger's queue is full")]
pub struct QueueFull;

/// Opening the ledger failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("ledger {path}: {source}")]
    Store {
        path: PathBuf,
        source: store::StoreError,
    },
    #[error("ledger writer thread: {0}")]
    Thread(std::io::Error),
}

impl Ledger {
    /// Open (or create) the database and start its writer thread.
    pub fn open(
        path: &Path,
        cfg: &LedgerConfig,
        counters: Arc<LedgerCounters>,
    ) -> Result<Self, OpenError> {
        let err = |source| OpenError::Store {
            path: path.to_path_buf(),
            source,
        };
        let mut conn = store::open(path).map_err(err)?;
        // Retention once at start, then after every batch at most once a minute.
        let now = carapace_filters::unix_now_ms();
        store::retain(
            &mut conn,
            retention_cutoff(cfg, now),
            cfg.retention.max_rows,
        )
        .map_err(err)?;
        let spend = store::spend(&conn, store::day_of(now)).map_err(err)?;
        let queue = RecordQueue::new(cfg.queue);
        let settled = Arc::new(AtomicU64::new(0));
        let writer = Writer {
            settled: settled.clone(),
            conn,
            queue: queue.clone(),
            batch_max: cfg.batch_max,
            counters: counters.clone(),
            cfg: cfg.clone(),
        };
        std::thread::Builder::new()
            .name("carapace-ledger".into())
            .spawn(move || writer.run())
            .map_err(OpenError::Thread)?;
        Ok(Ledger {
            queue,
            on_full: cfg.on_full,
            counters,
            queued: AtomicU64::new(0),
            settled,
            spend,
        })
    }

    /// A place in the queue for a call about to run, under `on_full: refuse`; `Err` when the
    /// queue is full (the call is refused). `Ok(None)` under `drop`.
    pub fn reserve(&self) -> Result<Option<Place>, QueueFull> {
        match self.on_full {
            LedgerFull::Drop => Ok(None),
            LedgerFull::Refuse => match self.queue.reserve() {
                Some(p) => Ok(Some(p)),
                None => {
                    self.counters.refused.inc();
                    Err(QueueFull)
                }
            },
        }
    }

    /// Queue `entry`, into its reserved place when there is one.
    pub fn record(&self, entry: Record, reserved: Option<Place>) {
        let sent = match reserved {
            Some(p) => {
                p.fill(entry);
                true
            }
            None => self.queue.push(entry),
        };
        match sent {
            true => self.queued.fetch_add(1, Ordering::Release),
            false => self.counters.dropped.inc(),
        };
    }

    /// Wait (up to `limit`) until every entry queued so far is written; `false` if some are
    /// not by then.
    pub async fn flush(&self, limit: Duration) -> bool {
        let target = self.queued.load(Ordering::Acquire);
        let deadline = tokio::time::Instant::now() + limit;
        while self.settled.load(Ordering::Acquire) < target {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }
}

fn retention_cutoff(cfg: &LedgerConfig, now_ms: u64) -> u64 {
    now_ms.saturating_sub(cfg.retention.max_age_s.saturating_mul(1000))
}

impl Drop for Ledger {
    /// The writer writes what is queued and ends.
    fn drop(&mut self) {
        self.queue.close();
    }
}

/// The writer thread: one transaction per batch of what has queued up.
struct Writer {
    conn: rusqlite::Connection,
    queue: Arc<RecordQueue>,
    batch_max: usize,
    counters: Arc<LedgerCounters>,
    settled: Arc<AtomicU64>,
    cfg: LedgerConfig,
}

/// How often the writer takes what has queued up. Calls never wake it: an entry is a push
/// onto the queue and nothing more, and the writer commits one transaction per tick.
pub const WRITE_INTERVAL: Duration = Duration::from_millis(10);

impl Writer {
    fn run(mut self) {
        let mut taken = Vec::new();
        let mut last_retention = std::time::Instant::now();
        loop {
            std::thread::sleep(WRITE_INTERVAL);
            // Read before the take: whatever was queued before the ledger closed is taken now.
            let closed = self.queue.is_closed();
            // Everything queued now, in transactions of at most `batch_max` rows.
            self.queue.take(&mut taken);
            for batch in taken.chunks(self.batch_max.max(1)) {
                self.write(batch);
            }
            taken.clear();
            if last_retention.elapsed() >= Duration::from_secs(60) {
                last_retention = std::time::Instant::now();
                let cutoff = retention_cutoff(&self.cfg, carapace_filters::unix_now_ms());
                if let Err(e) = store::retain(&mut self.conn, cutoff, self.cfg.retention.max_rows) {
                    tracing::error!("ledger retention failed: {e}");
                }
            }
            // Every handle is gone (carapace stopping) and what was queued is written.
            if closed {
                return;
            }
        }
    }

    fn write(&mut self, batch: &[Record]) {
        match store::append(&mut self.conn, batch) {
            Ok(_) => {
                self.counters.written.inc_by(batch.len() as u64);
            }
            Err(e) => {
                self.counters.dropped.inc_by(batch.len() as u64);
                tracing::error!(rows = batch.len(), "ledger write failed: {e}");
            }
        };
        self.settled
            .fetch_add(batch.len() as u64, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
