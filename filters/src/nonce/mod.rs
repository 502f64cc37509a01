//! Replay protection for signed requests: [`NonceStore`].
//!
//! Skill Gateway v1 requires that a nonce reused inside its TTL (default
//! [`DEFAULT_TTL`], 5 minutes) is refused. The caller verifies the request
//! signature first and only then calls [`NonceStore::check_and_insert`], a
//! single atomic check-and-insert: it fails with [`NonceError::Replay`] if
//! `(scope, nonce)` is still live, and otherwise records it until
//! `now + ttl`. Nonces are only recorded for requests whose signature was
//! verified, so an unauthenticated client cannot fill the store.
//!
//! # Bounded, never evicting
//!
//! The store holds at most `capacity` entries. When it is full it first drops
//! expired entries; if it is still full the new nonce is *refused* with
//! [`NonceError::Full`], whose `retry_after` is the time until the earliest
//! entry expires. A live nonce is never evicted: evicting one would let its
//! request be replayed. The earliest expiry is tracked so that a refused
//! request costs O(1): the table is rescanned only once the clock has reached
//! that earliest expiry.
//!
//! # Entries and memory
//!
//! An entry is not the nonce itself but a 64-bit keyed SipHash-2-4 of
//! `(scope, nonce)` (each string prefixed by its length as a little-endian
//! `u64`, so `("ab", "c")` and `("a", "bc")` differ), under a random 128-bit
//! key, mapped to the expiry in unix seconds as a `u32`, rounded *up* so the
//! TTL is never shortened (a nonce is refused for at least `ttl` and less than
//! `ttl + 1s`). The table (`table.rs`) is open addressing over buckets of one
//! cache line: five entries of 12 bytes (hash and expiry) in 64 bytes, so a
//! call touches one line of the table, not a line of control bytes and
//! another of entries. It starts small and grows with the live set, never
//! past what `capacity` entries need (see [Growth](#growth)).
//!
//! A table holds at most 4 entries per bucket (80% of its slots), and the
//! bucket count is a power of two: `buckets = next_power_of_two(ceil(capacity
//! / 4))`, so a full store takes `64 * buckets` bytes, between 16 and 32 bytes
//! per entry, below 32 for every capacity of 2 or more (a store of 1 entry
//! takes one bucket, 64 bytes). For example 1 000 → 256 buckets → 16.4
//! B/entry; 100 000 → 32 768 buckets → 21.0 B/entry; 1 000 000 → 262 144
//! buckets → 16.8 B/entry. [`NonceStore::bytes_per_entry_upper_bound`]
//! computes this for the configured capacity. If a journal holds more live
//! entries than `capacity` (the store was restarted with a smaller capacity),
//! all of them are loaded — dropping a live nonce would allow a replay — and
//! the table grows past this bound until they expire; no new nonce is accepted
//! meanwhile.
//!
//! Before the signature of a call is checked, [`NonceStore::key`] hashes its
//! nonce and starts loading the nonce's bucket into the cache, without the
//! lock; [`NonceStore::check_and_insert_key`] then finds it there. In a store
//! larger than the CPU's caches the load is a miss on every call, and it runs
//! while the signature is checked. Nothing is recorded before that second
//! step.
//!
//! # Growth
//!
//! The table starts at [`INITIAL_TABLE_CAPACITY`] entries (or `capacity`, if
//! smaller), so a store that is never busy stays small: a full table of a
//! million entries is 16.8 MB, resident as soon as nonces land across it. When
//! an insert would take the table past its 4 entries per bucket, the live
//! entries are copied into a fresh table, twice as large if more than 3/4 of
//! the old one is live, else the same size; the expired ones are left behind.
//! So the table follows the live set (nonces per second × TTL), not the
//! number ever accepted, and the next copy is at least a quarter of the
//! table's inserts away: amortised O(1) per insert. Doubling stops at the
//! table a full store of `capacity` entries needs, so the bound above holds
//! for every store; while a copy runs both tables exist (at most 1.5 times the
//! bound). Expired entries are dropped in place.
//! The table does not shrink when the rate drops: it keeps the size of the
//! busiest window until the process restarts.
//!
//! # Hash collisions
//!
//! Storing a 64-bit hash instead of the nonce has one failure mode: an honest,
//! never-seen nonce whose hash equals that of a live entry is refused as a
//! replay. For each request this happens with probability about
//! `live_entries / 2^64` (about 5e-14 with a million live entries). The
//! opposite error is impossible: a replayed `(scope, nonce)` always hashes to
//! the same value, so it is always refused. The hash key is secret (random per
//! store, kept only in the mode-0600 journal) so collisions cannot be aimed.
//!
//! # Journal (surviving restarts)
//!
//! With [`NonceStoreConfig::journal`] set, the store is persisted to an
//! append-only file (mode 0600; a missing directory is created with mode
//! 0700). Layout, all integers little-endian:
//!
//! ```text
//! header: b"CNONCE01" (8 bytes) | SipHash key (16 bytes)      = 24 bytes
//! record: hash (u64)            | expiry, unix seconds (u32)  = 12 bytes
//! ```
//!
//! Every accepted nonce is appended, as one record, before
//! [`NonceStore::check_and_insert`] returns `Ok`. On ext4, XFS and tmpfs the
//! record is stored into a shared mapping of the file's tail (see `tail.rs`:
//! a copy into the page cache, no system call), which is allocated ahead
//! 256 KiB at a time; after the last record the file reads as zeros, and a
//! record whose expiry is 0 is not live, so loading skips that space. On
//! other filesystems, or where the file cannot be mapped, each record is one
//! `write` instead. If the append fails (the space cannot
//! be allocated, a `write` fails) the nonce is not recorded and the call
//! fails with [`NonceError::Journal`] (fail closed). A failed `write` may have
//! left part of a record in the file, so the next insert first rewrites the
//! journal from memory; if that fails too, it fails closed as well.
//!
//! [`NonceStore::open`] validates the header (a bad magic or a truncated
//! header is an error: the store never silently starts empty), loads every
//! record whose expiry is still ahead, ignores a trailing partial record left
//! by a crash, and compacts: header + live records are written to
//! `<path>.tmp`, fsynced, renamed over `<path>`, the directory is fsynced, and
//! appends go on in the new file. The store compacts the same way while running
//! whenever the file holds more than `2 * capacity` records (inline, under
//! the lock; this is rare and amortised O(1) per insert). If such a running
//! compaction fails, the old journal stays valid and in use, and compaction
//! is retried after another `capacity` appends.
//!
//! Appends are not fsynced one by one: the journal survives process crashes
//! and restarts (a record is in the kernel's page cache once it is stored),
//! but a power loss or kernel crash can lose the most recent records. One
//! journal file must be used by one process at a time.
//!
//! # Time
//!
//! The clock is injected: every method takes `now_unix_ms`, milliseconds
//! since the Unix epoch, so the store never reads the system clock itself.
//! Expiries are `u32` unix seconds and saturate in the year 2106.

mod journal;
mod table;
mod tail;

use std::fs::File;
use std::hash::Hasher;
use std::io;
#[cfg(test)]
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::RngCore;
use siphasher::sip::SipHasher24;

use table::Table;

use journal::{
    compact_threshold, create_parent_dir, load_journal, lock_journal, rewrite_journal,
    sync_parent_dir, Appender, Journal,
};

/// The replay window Skill Gateway v1 prescribes: 5 minutes.
pub const DEFAULT_TTL: Duration = Duration::from_secs(5 * 60);

/// Entries the table is created for; it grows from there as needed.
pub const INITIAL_TABLE_CAPACITY: usize = 4096;

/// Configuration of a [`NonceStore`].
#[derive(Debug, Clone)]
pub struct NonceStoreConfig {
    /// Maximum number of entries kept (live or not yet purged). Must be at
    /// least 1. Memory grows with the live set up to this many entries.
    pub capacity: usize,
    /// How long a nonce stays refused after it was first accepted (rounded up
    /// to whole seconds of the absolute expiry). Skill Gateway v1 uses
    /// [`DEFAULT_TTL`].
    pub ttl: Duration,
    /// Append-only journal file that makes the store survive restarts; `None`
    /// keeps the store in memory only.
    pub journal: Option<PathBuf>,
}

impl NonceStoreConfig {
    /// An in-memory store of `capacity` entries with the default TTL.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            ttl: DEFAULT_TTL,
            journal: None,
        }
    }
}

/// Why a nonce was refused, or why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum NonceError {
    /// `(scope, nonce)` was already accepted and has not expired yet.
    #[error("nonce already used")]
    Replay,
    /// The store holds `capacity` live entries; nothing is evicted, so the
    /// nonce is refused. One entry expires after `retry_after`.
    #[error("nonce store is full; retry after {retry_after:?}")]
    Full {
        /// Time until the earliest entry expires (at least 1 ms).
        retry_after: Duration,
    },
    /// Reading, writing or compacting the journal failed; the nonce was not
    /// recorded. Also returned by [`NonceStore::open`] for a corrupt journal
    /// (`InvalidData`) or a capacity of 0 (`InvalidInput`).
    #[error("nonce journal: {0}")]
    Journal(#[from] io::Error),
}

/// The store's key for one `(scope, nonce)`: its keyed hash, from
/// [`NonceStore::key`]. A key is only meaningful to the store that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NonceKey(u64);

/// Passes a `u64` through unchanged, for tables whose keys are already hashes (the in-flight
/// calls' table keys names by their foldhash; hashing again would only cost time). The nonce
/// store's own table indexes its buckets with the keyed hash directly.
#[derive(Default)]
pub struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Not reached for keys that only call `write_u64`; a plain fold, not a panic.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

struct Inner {
    table: Table,
    /// Lower bound of the smallest expiry in `table` (`u32::MAX` when empty).
    /// It is exact whenever it lies in the future: it only becomes stale when
    /// an expired entry is taken over, and then it is already in the past.
    earliest: u32,
    journal: Option<Journal>,
    /// Full-table scans done (for tests of the O(1) refusal path).
    rescans: u64,
}

/// Bounded, thread-safe, optionally persistent replay-protection store. See
/// the [module docs](self) for the design.
pub struct NonceStore {
    inner: Mutex<Inner>,
    /// Where the table is and its bucket mask, read without the lock to
    /// prefetch a nonce's bucket (see [`NonceStore::key`]); stored whenever the
    /// table is replaced. A stale pair only prefetches a useless line.
    table_at: [AtomicUsize; 2],
    capacity: usize,
    ttl_ms: u64,
    k0: u64,
    k1: u64,
}

impl std::fmt::Debug for NonceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The hash key is deliberately left out.
        let inner = self.lock();
        f.debug_struct("NonceStore")
            .field("capacity", &self.capacity)
            .field("ttl_ms", &self.ttl_ms)
            .field("len", &inner.table.len())
            .field("journal", &inner.journal.as_ref().map(|j| &j.path))
            .finish_non_exhaustive()
    }
}

impl NonceStore {
    /// Opens a store. Without a journal it starts empty with a fresh random
    /// hash key. With one, an existing journal is validated and its live
    /// records are loaded, then it is compacted; a missing journal (and
    /// directory) is created.
    ///
    /// # Errors
    ///
    /// [`NonceError::Journal`] if the journal cannot be read, created or
    /// compacted, if it is corrupt (bad magic, truncated header:
    /// `InvalidData`), or if `capacity` is 0 (`InvalidInput`).
    pub fn open(config: NonceStoreConfig, now_unix_ms: u64) -> Result<Self, NonceError> {
        if config.capacity == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "nonce store capacity must be at least 1",
            )
            .into());
        }
        let ttl_ms = u64::try_from(config.ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        let mut map = Table::with_capacity(config.capacity.min(INITIAL_TABLE_CAPACITY));

        let (key, journal) = match config.journal {
            None => (random_key(), None),
            Some(path) => {
                create_parent_dir(&path)?;
                let lock = lock_journal(&path)?;
                let key = match File::open(&path) {
                    Ok(file) if !file.metadata()?.is_file() => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "the nonce journal is not a regular file",
                        )
                        .into())
                    }
                    Ok(file) => load_journal(file, &mut map, now_unix_ms)?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => random_key(),
                    Err(e) => return Err(e.into()),
                };
                let (file, records) = rewrite_journal(&path, &key, map.iter())?;
                sync_parent_dir(&path)?;
                let journal = Journal {
                    path,
                    key,
                    appender: Appender::for_file(file, records),
                    records,
                    compact_above: compact_threshold(config.capacity),
                    dirty: false,
                    _lock: lock,
                };
                (key, Some(journal))
            }
        };

        let earliest = map.iter().map(|(_, e)| e).min().unwrap_or(u32::MAX);
        let (k0, k1) = split_key(&key);
        let (base, mask) = map.layout();
        Ok(Self {
            inner: Mutex::new(Inner {
                table: map,
                earliest,
                journal,
                rescans: 0,
            }),
            table_at: [AtomicUsize::new(base), AtomicUsize::new(mask)],
            capacity: config.capacity,
            ttl_ms,
            k0,
            k1,
        })
    }

    /// Atomically: `Err(Replay)` if `(scope, nonce)` is live; else records it
    /// with expiry `now + ttl` (rounded up to a whole second).
    ///
    /// Call it only after the request's signature was verified. With a
    /// journal, the entry is appended to it before `Ok` is returned.
    ///
    /// # Errors
    ///
    /// * [`NonceError::Replay`]: the nonce is live in this scope;
    /// * [`NonceError::Full`]: `capacity` live entries and none expired; the
    ///   nonce is not recorded and nothing is evicted;
    /// * [`NonceError::Journal`]: the journal write failed; the nonce is not
    ///   recorded (fail closed).
    pub fn check_and_insert(
        &self,
        scope: &str,
        nonce: &str,
        now_unix_ms: u64,
    ) -> Result<(), NonceError> {
        self.check_and_insert_key(NonceKey(self.hash(scope, nonce)), now_unix_ms)
    }

    /// The store's key for `(scope, nonce)`; its bucket starts loading into
    /// the cache, without the lock. Made before a call's signature is checked,
    /// so that [`check_and_insert_key`](Self::check_and_insert_key), after it,
    /// finds the bucket there. It records nothing.
    pub fn key(&self, scope: &str, nonce: &str) -> NonceKey {
        let key = self.hash(scope, nonce);
        let at = (
            self.table_at[0].load(Ordering::Relaxed),
            self.table_at[1].load(Ordering::Relaxed),
        );
        table::prefetch(at, key);
        NonceKey(key)
    }

    /// [`check_and_insert`](Self::check_and_insert) for a key from
    /// [`key`](Self::key). Call it only after the request's signature was
    /// verified.
    ///
    /// # Errors
    ///
    /// As [`check_and_insert`](Self::check_and_insert).
    pub fn check_and_insert_key(
        &self,
        NonceKey(key): NonceKey,
        now_unix_ms: u64,
    ) -> Result<(), NonceError> {
        let expiry = expiry_secs(now_unix_ms, self.ttl_ms);
        let mut guard = self.lock();
        let inner = &mut *guard;

        // An expired entry of this nonce, or of another on its way, is taken over.
        let mut at = inner.table.find_reusing(key, live_after(now_unix_ms));
        if at.expiry != 0 && is_live(at.expiry, now_unix_ms) {
            return Err(NonceError::Replay);
        }
        if at.free {
            if inner.table.len() >= self.capacity {
                inner.purge(now_unix_ms);
                if inner.table.len() >= self.capacity {
                    let retry_ms = secs_to_ms(inner.earliest).saturating_sub(now_unix_ms);
                    return Err(NonceError::Full {
                        retry_after: Duration::from_millis(retry_ms.max(1)),
                    });
                }
                at = inner.table.find(key);
            }
            if inner.table.len() >= inner.table.capacity() {
                if inner.make_room(now_unix_ms, self.capacity) {
                    self.publish(&inner.table);
                }
                at = inner.table.find(key);
            }
        }

        // Journal first: if the write fails the table was never touched, which
        // is the rollback.
        if let Some(journal) = inner.journal.as_mut() {
            journal.append(key, expiry, &inner.table, now_unix_ms)?;
        }
        inner.table.put(at, key, expiry);
        inner.earliest = inner.earliest.min(expiry);

        if inner
            .journal
            .as_ref()
            .is_some_and(|j| j.records > j.compact_above)
        {
            inner.purge(now_unix_ms);
            if let Some(journal) = inner.journal.as_mut() {
                journal.compact(&inner.table, self.capacity);
            }
        }
        Ok(())
    }

    /// Number of entries held: live ones plus expired ones not purged yet.
    pub fn len(&self) -> usize {
        self.lock().table.len()
    }

    /// Whether the store holds no entry at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configured maximum number of entries.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Drops expired entries from memory and returns how many were removed.
    /// Scans only if some entry may have expired. Full stores purge by
    /// themselves; this is for keeping [`len`](Self::len) meaningful. The
    /// journal is compacted separately.
    pub fn purge_expired(&self, now_unix_ms: u64) -> usize {
        self.lock().purge(now_unix_ms)
    }

    /// Bytes of the in-memory table per entry of a full store: the
    /// allocation of the table that holds `capacity` entries (see the module
    /// docs) divided by `capacity`. At most 32 for capacity >= 2.
    pub fn bytes_per_entry_upper_bound(&self) -> f64 {
        table::bytes_for(self.capacity) as f64 / self.capacity as f64
    }

    /// Bytes the in-memory table takes now (it grows with the live set).
    pub fn table_bytes(&self) -> usize {
        self.lock().table.bytes()
    }

    /// Makes a new table's place the one [`key`](Self::key) prefetches from.
    fn publish(&self, table: &Table) {
        let (base, mask) = table.layout();
        self.table_at[0].store(base, Ordering::Relaxed);
        self.table_at[1].store(mask, Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves `Inner` consistent, so a panic in
        // another thread does not invalidate it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn hash(&self, scope: &str, nonce: &str) -> u64 {
        hash_pair(self.k0, self.k1, scope, nonce)
    }

    /// Replaces the journal's appender with `writer`, to simulate write failures.
    #[cfg(test)]
    fn set_journal_writer(&self, writer: Box<dyn Write + Send>) {
        self.lock()
            .journal
            .as_mut()
            .expect("store has a journal")
            .appender = Appender::Written(writer);
    }

    /// Whether the journal's records are stored into its mapped tail.
    #[cfg(test)]
    fn journal_is_mapped(&self) -> bool {
        let inner = self.lock();
        let journal = inner.journal.as_ref().expect("store has a journal");
        matches!(journal.appender, Appender::Mapped(_))
    }
}

impl Inner {
    /// Called when one more entry would take the table past its 4 entries
    /// per bucket: the expired entries go, and if more than 3/4 of the table
    /// is live, the live ones are copied into a table twice as large. Either
    /// way at least a quarter of its room is then free, so this is amortised
    /// O(1) per insert. The caller has checked `len < capacity`; the table
    /// never grows past the one `capacity` entries need. Returns whether the
    /// table was replaced.
    fn make_room(&mut self, now_ms: u64, capacity: usize) -> bool {
        self.rescans += 1;
        let full = self.table.capacity();
        let live = self
            .table
            .iter()
            .filter(|&(_, expiry)| is_live(expiry, now_ms))
            .count();
        if live > full - full / 4 && full < capacity {
            let (fresh, earliest) = self
                .table
                .grown((full + 1).min(capacity), live_after(now_ms));
            self.table = fresh;
            self.earliest = earliest;
            return true;
        }
        let (_, earliest) = self.table.retain_after(live_after(now_ms));
        self.earliest = earliest;
        false
    }

    /// Removes expired entries (in place) if any may exist; recomputes
    /// `earliest`.
    fn purge(&mut self, now_ms: u64) -> usize {
        if now_ms < secs_to_ms(self.earliest) {
            return 0;
        }
        self.rescans += 1;
        let (removed, earliest) = self.table.retain_after(live_after(now_ms));
        self.earliest = earliest;
        removed
    }
}

/// Keyed SipHash-2-4 of `(scope, nonce)`, each prefixed by its length.
fn hash_pair(k0: u64, k1: u64, scope: &str, nonce: &str) -> u64 {
    let mut h = SipHasher24::new_with_keys(k0, k1);
    h.write(&(scope.len() as u64).to_le_bytes());
    h.write(scope.as_bytes());
    h.write(&(nonce.len() as u64).to_le_bytes());
    h.write(nonce.as_bytes());
    h.finish()
}

fn random_key() -> [u8; 16] {
    let mut key = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut key);
    key
}

fn split_key(key: &[u8; 16]) -> (u64, u64) {
    let mut k0 = [0u8; 8];
    let mut k1 = [0u8; 8];
    k0.copy_from_slice(&key[..8]);
    k1.copy_from_slice(&key[8..]);
    (u64::from_le_bytes(k0), u64::from_le_bytes(k1))
}

/// `ceil((now + ttl) / 1s)`, saturating at `u32::MAX`.
fn expiry_secs(now_ms: u64, ttl_ms: u64) -> u32 {
    let secs = now_ms.saturating_add(ttl_ms).div_ceil(1000);
    u32::try_from(secs).unwrap_or(u32::MAX)
}

fn secs_to_ms(secs: u32) -> u64 {
    u64::from(secs) * 1000
}

fn is_live(expiry: u32, now_ms: u64) -> bool {
    secs_to_ms(expiry) > now_ms
}

/// The second an entry must expire after to be live at `now_ms`: `is_live(e, now_ms)` is
/// `e > live_after(now_ms)`.
fn live_after(now_ms: u64) -> u32 {
    u32::try_from(now_ms / 1000).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
