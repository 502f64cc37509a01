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
//! `ttl + 1s`). The table is a [`std::collections::HashMap`] with an identity
//! hasher (the key is already a keyed hash). It starts small and grows with
//! the live set, never past what `capacity` entries need (see
//! [Growth](#growth)).
//!
//! Bytes per entry, for the hashbrown table behind `HashMap`:
//!
//! * payload: 8 bytes of hash + 4 bytes of expiry = **12 bytes**. The hash is
//!   stored as two `u32` halves so the `(key, expiry)` tuple has alignment 4
//!   and no padding; a plain `(u64, u32)` would be padded to 16 bytes. A
//!   compile-time assertion pins the 12.
//! * plus **1 control byte** per bucket: 13 bytes per bucket;
//! * hashbrown keeps at most 7/8 of its buckets full, and the bucket count is
//!   a power of two: `buckets = next_power_of_two(capacity * 8 / 7)`, so
//!   `capacity * 8/7 <= buckets < 2 * capacity * 8/7`;
//! * plus 16 trailing control bytes per table (one SIMD group).
//!
//! Per entry of a full store that is between `13 * 8/7 = 14.9` and
//! `13 * 16/7 = 29.7` bytes (plus `16 / capacity`), i.e. at most 32 bytes for
//! every capacity >= 3. For example 1 000 → 2 048 buckets → 26.6 B/entry;
//! 100 000 → 131 072 buckets → 17.0 B/entry; 1 000 000 → 2 097 152 buckets →
//! 27.3 B/entry. [`NonceStore::bytes_per_entry_upper_bound`] computes this
//! from the table capacity a full store has. (Stores of 1 or 2 entries take 68
//! bytes in total.) If a journal holds more live entries than `capacity` (the
//! store was restarted with a smaller capacity), all of them are loaded —
//! dropping a live nonce would allow a replay — and the table grows past this
//! bound until they expire; no new nonce is accepted meanwhile.
//!
//! # Growth
//!
//! The table starts at [`INITIAL_TABLE_CAPACITY`] entries (or `capacity`, if
//! smaller), so a store that is never busy stays small: a preallocated million
//! entries would be 27 MB, resident as soon as nonces land across it. When an
//! insert would make the table grow (or rehash, once removals have used up its
//! free slots), the live entries are copied into a fresh table, twice as
//! large if more than 3/4 of the old one is live, else the same size; the
//! expired ones are left behind. So the table follows the live set (nonces
//! per second × TTL), not the number ever accepted, and the next copy is at
//! least a quarter of the table's inserts away: amortised O(1) per insert.
//! Doubling stops at the table a full store of `capacity` entries needs, so
//! the bound above holds for every store; while a copy runs both tables exist
//! (at most 1.5 times the bound). The table does not shrink when the rate
//! drops: it keeps the size of the busiest window until the process restarts.
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
//! append-only file (opened with `O_APPEND`, mode 0600; a missing directory is
//! created with mode 0700). Layout, all integers little-endian:
//!
//! ```text
//! header: b"CNONCE01" (8 bytes) | SipHash key (16 bytes)      = 24 bytes
//! record: hash (u64)            | expiry, unix seconds (u32)  = 12 bytes
//! ```
//!
//! Every accepted nonce is appended, as one `write_all` of one record, before
//! [`NonceStore::check_and_insert`] returns `Ok`. If that write fails the
//! nonce is not recorded and the call fails with [`NonceError::Journal`] (fail
//! closed). A failed write may have left part of a record in the file, so the
//! next insert first rewrites the journal from memory; if that fails too, it
//! fails closed as well.
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
//! and restarts (the data is in the kernel once `write` returns), but a power
//! loss or kernel crash can lose the most recent records. One journal file
//! must be used by one process at a time.
//!
//! # Time
//!
//! The clock is injected: every method takes `now_unix_ms`, milliseconds
//! since the Unix epoch, so the store never reads the system clock itself.
//! Expiries are `u32` unix seconds and saturate in the year 2106.

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::RngCore;
use siphasher::sip::SipHasher24;

/// The replay window Skill Gateway v1 prescribes: 5 minutes.
pub const DEFAULT_TTL: Duration = Duration::from_secs(5 * 60);

/// Magic at the start of a journal file (the version is part of it).
const MAGIC: &[u8; 8] = b"CNONCE01";
/// Magic + 16-byte SipHash key.
const HEADER_LEN: usize = 8 + 16;
/// u64 hash + u32 expiry.
const RECORD_LEN: usize = 12;
/// Bytes of one `(Key, u32)` table entry.
const ENTRY_BYTES: usize = 12;
/// Entries the table is created for; it grows from there as needed.
pub const INITIAL_TABLE_CAPACITY: usize = 4096;
/// Control bytes hashbrown allocates past the last bucket (one SIMD group:
/// 16 with SSE2, 8 elsewhere; 16 is the upper bound).
const TRAILING_CTRL_BYTES: usize = 16;

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

/// A 64-bit hash stored as two `u32` halves, so that `(Key, u32)` is 12 bytes
/// with alignment 4 instead of a padded 16-byte `(u64, u32)`.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Key {
    lo: u32,
    hi: u32,
}

const _: () = assert!(std::mem::size_of::<(Key, u32)>() == ENTRY_BYTES);

impl Key {
    fn new(hash: u64) -> Self {
        Self {
            lo: hash as u32,
            hi: (hash >> 32) as u32,
        }
    }

    fn get(self) -> u64 {
        u64::from(self.lo) | (u64::from(self.hi) << 32)
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.get());
    }
}

/// Passes a `u64` through unchanged: table keys are already keyed SipHash
/// values, hashing them again would only cost time.
#[derive(Default)]
struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Not reached for `Key`, which only calls `write_u64`.
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

type Table = HashMap<Key, u32, BuildHasherDefault<IdentityHasher>>;

/// The open journal file and its bookkeeping.
struct Journal {
    path: PathBuf,
    /// The SipHash key, written into every rewritten header.
    key: [u8; 16],
    writer: Box<dyn Write + Send>,
    /// Records in the file (after the header).
    records: u64,
    /// Compact once `records` exceeds this.
    compact_above: u64,
    /// A failed append may have left a partial record: rewrite the file from
    /// memory before appending again.
    dirty: bool,
    /// Exclusive lock on `<path>.lock`, held while the store lives: two processes
    /// appending to one journal would each miss the other's nonces.
    _lock: File,
}

struct Inner {
    map: Table,
    /// Lower bound of the smallest expiry in `map` (`u32::MAX` when empty).
    /// It is exact whenever it lies in the future: it only becomes stale when
    /// an expired entry is overwritten, and then it is already in the past.
    earliest: u32,
    journal: Option<Journal>,
    /// Entries the table's allocation holds (`HashMap::capacity` right after
    /// it was built; removals make `capacity()` smaller until a rehash).
    table_capacity: usize,
    /// Full-table scans done (for tests of the O(1) refusal path).
    rescans: u64,
}

/// Bounded, thread-safe, optionally persistent replay-protection store. See
/// the [module docs](self) for the design.
pub struct NonceStore {
    inner: Mutex<Inner>,
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
            .field("len", &inner.map.len())
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
        let mut map = Table::with_capacity_and_hasher(
            config.capacity.min(INITIAL_TABLE_CAPACITY),
            Default::default(),
        );

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
                let (writer, records) = rewrite_journal(&path, &key, &map)?;
                sync_parent_dir(&path)?;
                let journal = Journal {
                    path,
                    key,
                    writer: Box::new(writer),
                    records,
                    compact_above: compact_threshold(config.capacity),
                    dirty: false,
                    _lock: lock,
                };
                (key, Some(journal))
            }
        };

        let earliest = map.values().copied().min().unwrap_or(u32::MAX);
        let (k0, k1) = split_key(&key);
        Ok(Self {
            inner: Mutex::new(Inner {
                table_capacity: map.capacity(),
                map,
                earliest,
                journal,
                rescans: 0,
            }),
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
        let key = self.key_for(scope, nonce);
        let expiry = expiry_secs(now_unix_ms, self.ttl_ms);
        let mut guard = self.lock();
        let inner = &mut *guard;

        match inner.map.get(&key) {
            Some(&old) if is_live(old, now_unix_ms) => return Err(NonceError::Replay),
            // An expired entry that was not purged yet: its slot is reused.
            Some(_) => {}
            None => {
                if inner.map.len() >= self.capacity {
                    inner.purge(now_unix_ms);
                    if inner.map.len() >= self.capacity {
                        let retry_ms = secs_to_ms(inner.earliest).saturating_sub(now_unix_ms);
                        return Err(NonceError::Full {
                            retry_after: Duration::from_millis(retry_ms.max(1)),
                        });
                    }
                }
                if inner.map.len() >= inner.map.capacity() {
                    inner.make_room(now_unix_ms, self.capacity);
                }
            }
        }

        // Journal first: if the write fails the table was never touched, which
        // is the rollback.
        if let Some(journal) = inner.journal.as_mut() {
            journal.append(key, expiry, &inner.map, now_unix_ms)?;
        }
        inner.map.insert(key, expiry);
        inner.earliest = inner.earliest.min(expiry);

        if inner
            .journal
            .as_ref()
            .is_some_and(|j| j.records > j.compact_above)
        {
            inner.purge(now_unix_ms);
            if let Some(journal) = inner.journal.as_mut() {
                journal.compact(&inner.map, self.capacity);
            }
        }
        Ok(())
    }

    /// Number of entries held: live ones plus expired ones not purged yet.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether the store holds no entry at all.
    pub fn is_empty(&self) -> bool {
        self.lock().map.is_empty()
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
    /// docs) divided by `capacity`. At most 32 for capacity >= 3.
    pub fn bytes_per_entry_upper_bound(&self) -> f64 {
        table_bytes(self.capacity) as f64 / self.capacity as f64
    }

    /// Bytes the in-memory table takes now (it grows with the live set).
    pub fn table_bytes(&self) -> usize {
        table_bytes(self.lock().table_capacity)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves `Inner` consistent, so a panic in
        // another thread does not invalidate it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn key_for(&self, scope: &str, nonce: &str) -> Key {
        Key::new(hash_pair(self.k0, self.k1, scope, nonce))
    }

    /// Replaces the journal writer, to simulate write failures.
    #[cfg(test)]
    fn set_journal_writer(&self, writer: Box<dyn Write + Send>) {
        self.lock()
            .journal
            .as_mut()
            .expect("store has a journal")
            .writer = writer;
    }
}

impl Inner {
    /// Called when one more entry would make hashbrown grow or rehash the
    /// table (it is full, or removals left it short of free slots): copies
    /// the live entries into a fresh table, twice as large if more than 3/4
    /// of the old one is live, else the same size. The fresh table has at
    /// least a quarter of its slots free, so this is amortised O(1) per
    /// insert. The caller has checked `len < capacity`; the table never grows
    /// past the one `capacity` entries need.
    fn make_room(&mut self, now_ms: u64, capacity: usize) {
        self.rescans += 1;
        let full = self.table_capacity;
        let live = self
            .map
            .values()
            .filter(|&&expiry| is_live(expiry, now_ms))
            .count();
        let entries = if live > full - full / 4 {
            (full + 1).min(capacity)
        } else {
            full
        };
        let mut fresh = Table::with_capacity_and_hasher(entries.max(live + 1), Default::default());
        let mut earliest = u32::MAX;
        for (&key, &expiry) in &self.map {
            if is_live(expiry, now_ms) {
                fresh.insert(key, expiry);
                earliest = earliest.min(expiry);
            }
        }
        self.table_capacity = fresh.capacity();
        self.map = fresh;
        self.earliest = earliest;
    }

    /// Removes expired entries if any may exist; recomputes `earliest`.
    fn purge(&mut self, now_ms: u64) -> usize {
        if now_ms < secs_to_ms(self.earliest) {
            return 0;
        }
        self.rescans += 1;
        let before = self.map.len();
        let mut earliest = u32::MAX;
        self.map.retain(|_, &mut expiry| {
            let live = is_live(expiry, now_ms);
            if live {
                earliest = earliest.min(expiry);
            }
            live
        });
        self.earliest = earliest;
        before - self.map.len()
    }
}

impl Journal {
    /// Appends one record, after repairing the file if an earlier append
    /// failed. On error nothing may be recorded in memory.
    fn append(&mut self, key: Key, expiry: u32, map: &Table, now_ms: u64) -> io::Result<()> {
        if self.dirty {
            let live = map.iter().filter(|&(_, &e)| is_live(e, now_ms));
            let (file, records) = rewrite_journal(&self.path, &self.key, live)?;
            self.install(file, records);
        }
        let record = encode_record(key.get(), expiry);
        match self
            .writer
            .write_all(&record)
            .and_then(|()| self.writer.flush())
        {
            Ok(()) => {
                self.records += 1;
                Ok(())
            }
            Err(e) => {
                self.dirty = true;
                Err(e)
            }
        }
    }

    /// Rewrites the file from `map` (already purged). On failure the current
    /// file stays in use and compaction is retried `capacity` appends later.
    fn compact(&mut self, map: &Table, capacity: usize) {
        match rewrite_journal(&self.path, &self.key, map) {
            Ok((file, records)) => {
                self.install(file, records);
                self.compact_above = compact_threshold(capacity);
            }
            Err(_) => {
                self.compact_above = self
                    .records
                    .saturating_add(capacity as u64)
                    .max(compact_threshold(capacity));
            }
        }
    }

    fn install(&mut self, file: File, records: u64) {
        self.writer = Box::new(file);
        self.records = records;
        self.dirty = false;
        // The rename is done; an fsync failure of the directory only weakens
        // durability against power loss, the new file is the one in use.
        let _ = sync_parent_dir(&self.path);
    }
}

fn compact_threshold(capacity: usize) -> u64 {
    (capacity as u64).saturating_mul(2)
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

/// Allocation of a hashbrown table of `(Key, u32)` that holds
/// `table_capacity` elements (`HashMap::capacity`).
fn table_bytes(table_capacity: usize) -> usize {
    if table_capacity == 0 {
        return 0;
    }
    // hashbrown: capacity = buckets - 1 below 8 buckets, buckets * 7/8 above.
    let buckets = if table_capacity < 8 {
        (table_capacity + 1).next_power_of_two()
    } else {
        (table_capacity * 8 / 7).next_power_of_two()
    };
    buckets * (ENTRY_BYTES + 1) + TRAILING_CTRL_BYTES
}

fn encode_record(hash: u64, expiry: u32) -> [u8; RECORD_LEN] {
    let mut record = [0u8; RECORD_LEN];
    record[..8].copy_from_slice(&hash.to_le_bytes());
    record[8..].copy_from_slice(&expiry.to_le_bytes());
    record
}

fn invalid_data(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Reads and validates the header; returns the hash key.
fn read_header(reader: &mut impl Read) -> io::Result<[u8; 16]> {
    let mut header = [0u8; HEADER_LEN];
    let n = read_up_to(reader, &mut header)?;
    if n < HEADER_LEN {
        return Err(invalid_data("nonce journal header is truncated"));
    }
    if &header[..8] != MAGIC {
        return Err(invalid_data(
            "not a nonce journal (bad magic; expected CNONCE01)",
        ));
    }
    let mut key = [0u8; 16];
    key.copy_from_slice(&header[8..]);
    Ok(key)
}

/// Loads the live records of a journal into `map`; returns its hash key.
fn load_journal(file: File, map: &mut Table, now_ms: u64) -> io::Result<[u8; 16]> {
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let key = read_header(&mut reader)?;
    let mut record = [0u8; RECORD_LEN];
    // A short read can only be the last record, torn by a crash: ignore it.
    while read_up_to(&mut reader, &mut record)? == RECORD_LEN {
        let mut hash = [0u8; 8];
        let mut expiry = [0u8; 4];
        hash.copy_from_slice(&record[..8]);
        expiry.copy_from_slice(&record[8..]);
        let expiry = u32::from_le_bytes(expiry);
        if is_live(expiry, now_ms) {
            // The same nonce may appear twice (reused after expiry): keep the
            // later expiry.
            let slot = map.entry(Key::new(u64::from_le_bytes(hash))).or_insert(0);
            *slot = (*slot).max(expiry);
        }
    }
    Ok(key)
}

/// Like `read_exact`, but returns how many bytes were read before EOF.
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    PathBuf::from(tmp)
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

fn create_parent_dir(path: &Path) -> io::Result<()> {
    let dir = parent_dir(path);
    if dir.exists() {
        return Ok(());
    }
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Take the exclusive lock beside the journal, or fail if another process holds it.
fn lock_journal(path: &Path) -> io::Result<File> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path.with_file_name(name))?;
    lock.try_lock().map_err(|_| {
        io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("{} is in use by another process", path.display()),
        )
    })?;
    Ok(lock)
}

fn sync_parent_dir(path: &Path) -> io::Result<()> {
    File::open(parent_dir(path))?.sync_all()
}

/// Writes header + `entries` to `<path>.tmp` (mode 0600), fsyncs it and
/// renames it over `path`. Returns the new file, opened with `O_APPEND`, and
/// the number of records written. The caller fsyncs the directory. On error
/// `path` is untouched.
fn rewrite_journal<'a>(
    path: &Path,
    key: &[u8; 16],
    entries: impl IntoIterator<Item = (&'a Key, &'a u32)>,
) -> io::Result<(File, u64)> {
    let tmp = tmp_path(path);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // `create_new` so the mode applies (and no stale file or symlink is
    // reused); the same O_APPEND handle later takes the appends, so there is
    // no window in which the renamed file is not open.
    let file = OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = (|| {
        let mut out = BufWriter::with_capacity(64 * 1024, &file);
        out.write_all(MAGIC)?;
        out.write_all(key)?;
        let mut records = 0u64;
        for (key, &expiry) in entries {
            out.write_all(&encode_record(key.get(), expiry))?;
            records += 1;
        }
        out.flush()?;
        drop(out);
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        Ok(records)
    })();
    match written {
        Ok(records) => Ok((file, records)),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::{Arc, Barrier};

    const T0: u64 = 1_700_000_000_000;
    const TTL: Duration = DEFAULT_TTL;
    const TTL_MS: u64 = 300_000;

    fn mem_store(capacity: usize) -> NonceStore {
        NonceStore::open(NonceStoreConfig::new(capacity), T0).unwrap()
    }

    fn journal_config(path: &Path, capacity: usize) -> NonceStoreConfig {
        NonceStoreConfig {
            capacity,
            ttl: TTL,
            journal: Some(path.to_path_buf()),
        }
    }

    fn file_len(path: &Path) -> u64 {
        fs::metadata(path).unwrap().len()
    }

    fn journal_size(records: u64) -> u64 {
        HEADER_LEN as u64 + records * RECORD_LEN as u64
    }

    struct FailingWriter;

    impl Write for FailingWriter {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("disk on fire"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn replay_refused_inside_ttl() {
        let store = mem_store(10);
        store.check_and_insert("k1", "n1", T0).unwrap();
        assert!(matches!(
            store.check_and_insert("k1", "n1", T0),
            Err(NonceError::Replay)
        ));
        assert!(matches!(
            store.check_and_insert("k1", "n1", T0 + TTL_MS - 1),
            Err(NonceError::Replay)
        ));
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn accepted_again_after_ttl() {
        let store = mem_store(10);
        store.check_and_insert("k1", "n1", T0).unwrap();
        // T0 is a whole second, so the expiry is exactly T0 + TTL.
        assert!(matches!(
            store.check_and_insert("k1", "n1", T0 + TTL_MS - 1),
            Err(NonceError::Replay)
        ));
        store.check_and_insert("k1", "n1", T0 + TTL_MS).unwrap();
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn expiry_is_rounded_up_never_down() {
        let store = mem_store(10);
        let now = T0 + 1_500;
        store.check_and_insert("k", "n", now).unwrap();
        // Deadline now + ttl = T0 + 301.5 s rounds up to T0 + 302 s.
        assert!(matches!(
            store.check_and_insert("k", "n", now + TTL_MS),
            Err(NonceError::Replay)
        ));
        assert!(matches!(
            store.check_and_insert("k", "n", T0 + 301_999),
            Err(NonceError::Replay)
        ));
        store.check_and_insert("k", "n", T0 + 302_000).unwrap();
    }

    #[test]
    fn scopes_are_independent() {
        let store = mem_store(10);
        store.check_and_insert("scope-a", "n", T0).unwrap();
        store.check_and_insert("scope-b", "n", T0).unwrap();
        // Length prefixes: ("ab", "c") and ("a", "bc") are different entries.
        store.check_and_insert("ab", "c", T0).unwrap();
        store.check_and_insert("a", "bc", T0).unwrap();
        store.check_and_insert("", "abc", T0).unwrap();
        store.check_and_insert("abc", "", T0).unwrap();
        assert_eq!(store.len(), 6);
        assert!(matches!(
            store.check_and_insert("scope-b", "n", T0 + 1),
            Err(NonceError::Replay)
        ));
    }

    #[test]
    fn full_store_refuses_without_evicting() {
        let store = mem_store(3);
        store.check_and_insert("k", "a", T0).unwrap();
        store.check_and_insert("k", "b", T0 + 10_000).unwrap();
        store.check_and_insert("k", "c", T0 + 20_000).unwrap();

        match store.check_and_insert("k", "d", T0 + 30_000) {
            Err(NonceError::Full { retry_after }) => {
                assert_eq!(retry_after, Duration::from_millis(TTL_MS - 30_000));
            }
            other => panic!("expected Full, got {other:?}"),
        }
        match store.check_and_insert("k", "d", T0 + TTL_MS - 1) {
            Err(NonceError::Full { retry_after }) => {
                assert_eq!(retry_after, Duration::from_millis(1));
            }
            other => panic!("expected Full, got {other:?}"),
        }
        // Nothing was evicted: all three are still refused as replays.
        for n in ["a", "b", "c"] {
            assert!(matches!(
                store.check_and_insert("k", n, T0 + TTL_MS - 1),
                Err(NonceError::Replay)
            ));
        }
        assert_eq!(store.len(), 3);

        // Refusals did not rescan the table: the earliest expiry is known.
        assert_eq!(store.lock().rescans, 0);
        for i in 0..100 {
            let _ = store.check_and_insert("k", &format!("x{i}"), T0 + 40_000);
        }
        assert_eq!(store.lock().rescans, 0);
    }

    #[test]
    fn full_store_accepts_after_expiry() {
        let store = mem_store(3);
        store.check_and_insert("k", "a", T0).unwrap();
        store.check_and_insert("k", "b", T0 + 10_000).unwrap();
        store.check_and_insert("k", "c", T0 + 20_000).unwrap();
        assert!(matches!(
            store.check_and_insert("k", "d", T0 + 1),
            Err(NonceError::Full { .. })
        ));

        // "a" has expired: the refusal path purges it once and accepts "d".
        store.check_and_insert("k", "d", T0 + TTL_MS).unwrap();
        assert_eq!(store.len(), 3);
        assert_eq!(store.lock().rescans, 1);
        // Full again; "b" expires 10 s later.
        match store.check_and_insert("k", "e", T0 + TTL_MS) {
            Err(NonceError::Full { retry_after }) => {
                assert_eq!(retry_after, Duration::from_secs(10));
            }
            other => panic!("expected Full, got {other:?}"),
        }
        assert!(matches!(
            store.check_and_insert("k", "b", T0 + TTL_MS),
            Err(NonceError::Replay)
        ));
    }

    #[test]
    fn purge_expired_counts_and_len() {
        let store = mem_store(10);
        assert!(store.is_empty());
        store.check_and_insert("k", "a", T0).unwrap();
        store.check_and_insert("k", "b", T0 + 60_000).unwrap();
        assert_eq!(store.purge_expired(T0 + TTL_MS - 1), 0);
        assert_eq!(store.purge_expired(T0 + TTL_MS), 1);
        assert_eq!(store.len(), 1);
        assert_eq!(store.purge_expired(T0 + TTL_MS + 60_000), 1);
        assert!(store.is_empty());
        assert_eq!(store.capacity(), 10);
    }

    #[test]
    fn zero_capacity_is_rejected() {
        let err = NonceStore::open(NonceStoreConfig::new(0), T0).unwrap_err();
        assert!(matches!(err, NonceError::Journal(e) if e.kind() == io::ErrorKind::InvalidInput));
    }

    #[test]
    fn one_journal_serves_one_store_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nonces.journal");
        let first = NonceStore::open(journal_config(&path, 100), T0).unwrap();
        let err = NonceStore::open(journal_config(&path, 100), T0).unwrap_err();
        assert!(
            matches!(&err, NonceError::Journal(e) if e.kind() == io::ErrorKind::WouldBlock),
            "{err:?}"
        );
        drop(first);
        NonceStore::open(journal_config(&path, 100), T0).unwrap();
    }

    #[test]
    fn restart_keeps_live_nonces_and_compacts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nonces.journal");
        {
            let store = NonceStore::open(journal_config(&path, 100), T0).unwrap();
            store.check_and_insert("k", "old", T0).unwrap();
            store.check_and_insert("k", "live", T0 + 200_000).unwrap();
            assert_eq!(file_len(&path), journal_size(2));
        }
        // "old" expired at T0 + 300 s, "live" lives until T0 + 500 s.
        let now = T0 + 350_000;
        let store = NonceStore::open(journal_config(&path, 100), now).unwrap();
        assert_eq!(store.len(), 1, "the expired record must not be reloaded");
        assert_eq!(file_len(&path), journal_size(1), "compacted on open");
        assert!(!tmp_path(&path).exists());
        assert!(matches!(
            store.check_and_insert("k", "live", now),
            Err(NonceError::Replay)
        ));
        store.check_and_insert("k", "old", now).unwrap();
        assert_eq!(file_len(&path), journal_size(2));
        drop(store);

        // And a third generation still knows both.
        let store = NonceStore::open(journal_config(&path, 100), now + 1).unwrap();
        for n in ["live", "old"] {
            assert!(matches!(
                store.check_and_insert("k", n, now + 1),
                Err(NonceError::Replay)
            ));
        }
    }

    #[test]
    fn torn_trailing_record_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nonces.journal");
        {
            let store = NonceStore::open(journal_config(&path, 100), T0).unwrap();
            store.check_and_insert("k", "a", T0).unwrap();
            store.check_and_insert("k", "b", T0).unwrap();
        }
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&[0xAB; 7]).unwrap();
        drop(file);
        assert_eq!(file_len(&path), journal_size(2) + 7);

        let store = NonceStore::open(journal_config(&path, 100), T0 + 1).unwrap();
        assert_eq!(store.len(), 2);
        assert_eq!(file_len(&path), journal_size(2));
        for n in ["a", "b"] {
            assert!(matches!(
                store.check_and_insert("k", n, T0 + 1),
                Err(NonceError::Replay)
            ));
        }
    }

    #[test]
    fn bad_magic_or_truncated_header_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nonces.journal");
        let mut bad = b"XNONCE01".to_vec();
        bad.extend_from_slice(&[0u8; 16]);
        bad.extend_from_slice(&encode_record(1, u32::MAX));
        for contents in [bad, b"CNONCE01\0\0\0".to_vec(), Vec::new()] {
            fs::write(&path, &contents).unwrap();
            let err = NonceStore::open(journal_config(&path, 100), T0).unwrap_err();
            assert!(
                matches!(&err, NonceError::Journal(e) if e.kind() == io::ErrorKind::InvalidData),
                "{err:?}"
            );
            // The corrupt file is left alone for inspection.
            assert_eq!(fs::read(&path).unwrap(), contents);
        }
    }

    #[test]
    fn journal_write_failure_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nonces.journal");
        let store = NonceStore::open(journal_config(&path, 100), T0).unwrap();
        store.check_and_insert("k", "a", T0).unwrap();

        store.set_journal_writer(Box::new(FailingWriter));
        let err = store.check_and_insert("k", "b", T0).unwrap_err();
        assert!(matches!(err, NonceError::Journal(_)), "{err:?}");
        assert_eq!(store.len(), 1, "the failed insert was rolled back");

        // Not recorded: the next attempt is not a replay. It first rewrites
        // the journal (the failed write may have torn a record), then appends.
        store.check_and_insert("k", "b", T0).unwrap();
        assert_eq!(file_len(&path), journal_size(2));
        drop(store);

        let store = NonceStore::open(journal_config(&path, 100), T0 + 1).unwrap();
        assert_eq!(store.len(), 2);
        for n in ["a", "b"] {
            assert!(matches!(
                store.check_and_insert("k", n, T0 + 1),
                Err(NonceError::Replay)
            ));
        }
    }

    #[test]
    fn journal_that_cannot_be_repaired_keeps_failing_closed() {
        let dir = tempfile::tempdir().unwrap();
        let jdir = dir.path().join("j");
        let path = jdir.join("nonces.journal");
        let store = NonceStore::open(journal_config(&path, 100), T0).unwrap();
        store.check_and_insert("k", "a", T0).unwrap();

        store.set_journal_writer(Box::new(FailingWriter));
        fs::remove_dir_all(&jdir).unwrap();
        for _ in 0..3 {
            let err = store.check_and_insert("k", "b", T0).unwrap_err();
            assert!(matches!(err, NonceError::Journal(_)), "{err:?}");
        }
        assert_eq!(store.len(), 1);
        // Replays are still detected from memory.
        assert!(matches!(
            store.check_and_insert("k", "a", T0),
            Err(NonceError::Replay)
        ));
    }

    #[test]
    fn journal_is_compacted_while_running() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nonces.journal");
        let config = NonceStoreConfig {
            capacity: 2,
            ttl: Duration::from_secs(1),
            journal: Some(path.clone()),
        };
        let store = NonceStore::open(config, T0).unwrap();
        // One nonce every 2 s: each has expired when the next arrives.
        for i in 0..4u64 {
            store
                .check_and_insert("k", &format!("n{i}"), T0 + i * 2_000)
                .unwrap();
            assert_eq!(file_len(&path), journal_size(i + 1));
        }
        // The fifth record exceeds 2 * capacity: the file is rewritten with
        // the one live entry.
        store.check_and_insert("k", "n4", T0 + 8_000).unwrap();
        assert_eq!(file_len(&path), journal_size(1));
        assert_eq!(store.len(), 1);
        store.check_and_insert("k", "n5", T0 + 8_000).unwrap();
        assert_eq!(file_len(&path), journal_size(2));
        drop(store);

        let config = NonceStoreConfig {
            capacity: 2,
            ttl: Duration::from_secs(1),
            journal: Some(path.clone()),
        };
        let store = NonceStore::open(config, T0 + 8_500).unwrap();
        assert!(matches!(
            store.check_and_insert("k", "n5", T0 + 8_500),
            Err(NonceError::Replay)
        ));
    }

    #[test]
    fn journal_file_mode_is_0600_and_new_dirs_0700() {
        let dir = tempfile::tempdir().unwrap();
        let jdir = dir.path().join("state").join("nonces");
        let path = jdir.join("nonces.journal");
        let store = NonceStore::open(journal_config(&path, 10), T0).unwrap();
        store.check_and_insert("k", "a", T0).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&jdir), 0o700);
        assert_eq!(mode(jdir.parent().unwrap()), 0o700);
        drop(store);
        // Still 0600 after the compaction of a reopen.
        let _store = NonceStore::open(journal_config(&path, 10), T0 + 1).unwrap();
        assert_eq!(mode(&path), 0o600);
        let bytes = fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], MAGIC);
        assert_eq!(bytes.len() as u64, journal_size(1));
    }

    #[test]
    fn concurrent_inserts_of_one_nonce_accept_exactly_one() {
        let store = Arc::new(mem_store(100));
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let store = Arc::clone(&store);
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    store.check_and_insert("k", "same", T0)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
        assert_eq!(
            results
                .iter()
                .filter(|r| matches!(r, Err(NonceError::Replay)))
                .count(),
            7
        );
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn bytes_per_entry_at_most_32() {
        assert_eq!(std::mem::size_of::<(Key, u32)>(), 12);
        for capacity in [1_000, 100_000, 1_000_000] {
            let store = mem_store(capacity);
            let bytes = store.bytes_per_entry_upper_bound();
            assert!(bytes <= 32.0, "capacity {capacity}: {bytes} bytes/entry");
        }
        // Filled to the brim, the table is the one the bound was computed
        // for, and a refused nonce does not make it grow.
        let store = mem_store(100_000);
        for i in 0..100_000 {
            store.check_and_insert("k", &i.to_string(), T0).unwrap();
        }
        let full = store.table_bytes();
        assert_eq!(full, table_bytes(100_000));
        assert!(full as f64 / 100_000.0 <= 32.0);
        assert!(matches!(
            store.check_and_insert("k", "one more", T0),
            Err(NonceError::Full { .. })
        ));
        assert_eq!(store.table_bytes(), full);
    }

    #[test]
    fn an_idle_store_is_small_whatever_its_capacity() {
        let store = mem_store(1_000_000);
        assert!(store.table_bytes() <= table_bytes(INITIAL_TABLE_CAPACITY));
        assert!(store.table_bytes() < 128 * 1024, "{}", store.table_bytes());
        assert_eq!(mem_store(10).table_bytes(), table_bytes(10));
    }

    #[test]
    fn the_table_follows_the_live_set_not_the_total() {
        // 1,000 nonces a second for 100 s with a 10 s TTL: at most 11,000
        // live at once (expiries round up), 100,000 accepted in all.
        let config = NonceStoreConfig {
            ttl: Duration::from_secs(10),
            ..NonceStoreConfig::new(1_000_000)
        };
        let store = NonceStore::open(config, T0).unwrap();
        let mut peak_len = 0;
        for i in 0..100_000u64 {
            let now = T0 + i;
            store.check_and_insert("k", &i.to_string(), now).unwrap();
            peak_len = peak_len.max(store.len());
        }
        let table = store.lock().table_capacity;
        // Never sized for the 100,000 accepted: at most one doubling above
        // the 4/3 x live set that triggers growth.
        assert!(table >= 11_000, "{table}");
        assert!(table <= 28_672, "{table}");
        assert!(peak_len <= table, "{peak_len} {table}");
        // Purges are amortised: each one is at least a quarter table apart.
        let rescans = store.lock().rescans;
        assert!(rescans <= 100_000 / (7_168 / 4), "{rescans} purges");
        // Every live nonce is still refused.
        for i in 100_000 - 9_000..100_000u64 {
            assert!(matches!(
                store.check_and_insert("k", &i.to_string(), T0 + 100_000),
                Err(NonceError::Replay)
            ));
        }
    }

    #[test]
    fn growth_stops_at_the_table_capacity_entries_need() {
        let store = mem_store(20_000);
        for i in 0..20_000 {
            store.check_and_insert("k", &i.to_string(), T0).unwrap();
        }
        assert_eq!(store.table_bytes(), table_bytes(20_000));
        assert!(store.lock().table_capacity < 2 * 20_000);
    }
}
