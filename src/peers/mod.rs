//! The peer store: one record per paired peer, persisted as a JSON file.
//!
//! Until the pairing handshake writes it, the operator edits the file; the records carry the
//! fields the Remote Tool Protocol's peer model lists so that pairing can fill them in. The
//! identity layer reads the store: a certificate whose fingerprint is not an `active` record
//! fails closed, and so does one whose record says it has expired (`mtls_cert_not_after`, by
//! the store's clock).
//!
//! The store also keeps, in memory, when each peer last made an accepted call, and writes it
//! to the records' `last_seen_at` at most once per peer per [`SEEN_WRITE_INTERVAL_MS`] (the
//! housekeeping task calls [`PeerStore::flush_seen`]); never once per request.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use carapace_filters::call::Principal;
use carapace_filters::signature::UnixClock;
use load::{parse, read, Snapshot};
use seen::SeenLog;

/// The store's tables, looked up on every call: their keys are the store's own records, not a
/// caller's input, so a hash seeded per process is enough.
type Table<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

mod record;
pub use record::{PeerFile, PeerRecord};
mod directory;
mod load;
mod seen;
#[cfg(test)]
mod tests;

/// Principal ids carapace gives callers itself; a peer may not use them.
pub const RESERVED_IDS: [&str; 2] = ["local", "anonymous"];

/// The status of a record that is accepted.
pub const ACTIVE: &str = "active";
/// The status of a record the gateway wrote during a pairing it has not yet seen the peer
/// activate; never accepted, made `active` or removed when the pairing ends, removed at start.
pub const PENDING: &str = "pending";
/// The status of a revoked record; never accepted.
pub const REVOKED: &str = "revoked";

/// `last_seen_at` of a peer is written at most this often (Unix ms).
pub const SEEN_WRITE_INTERVAL_MS: u64 = 60_000;
/// A certificate this close to its expiry (days) is warned about.
pub const EXPIRY_WARNING_DAYS: i64 = 14;
/// The warning about a peer's certificate is repeated at most this often (Unix ms).
pub const EXPIRY_WARNING_INTERVAL_MS: u64 = 24 * 3600 * 1000;
const DAY_MS: i64 = 24 * 3600 * 1000;

/// The peer file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PeerStoreError {
    #[error("peer store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("peer store {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// The loaded peer store.
pub struct PeerStore {
    path: PathBuf,
    snapshot: ArcSwap<Snapshot>,
    /// Serializes read-modify-write changes of the file.
    writer: Mutex<()>,
    /// Wall clock (Unix ms) for certificate expiry.
    clock: UnixClock,
    seen: Mutex<SeenLog>,
    /// When each peer's certificate was last warned about (Unix ms).
    expiry_warned: Mutex<HashMap<String, u64>>,
    /// Told each time a new snapshot is served.
    changed: tokio::sync::watch::Sender<()>,
}

impl std::fmt::Debug for PeerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl PeerStore {
    /// Load the store; a missing file is an empty store (nothing paired yet).
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, PeerStoreError> {
        let path = path.into();
        let snapshot = read(&path)?;
        Ok(Self::with_snapshot(path, snapshot))
    }

    /// The store the file `bytes` hold, checked as [`PeerStore::open`] checks the file at
    /// `path` (which is not read; changes would be written there).
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: &[u8]) -> Result<Self, PeerStoreError> {
        let path = path.into();
        let snapshot = parse(&path, bytes)?;
        Ok(Self::with_snapshot(path, snapshot))
    }

    fn with_snapshot(path: PathBuf, snapshot: Snapshot) -> Self {
        PeerStore {
            path,
            snapshot: ArcSwap::from_pointee(snapshot),
            writer: Mutex::new(()),
            clock: Arc::new(carapace_filters::unix_now_ms),
            seen: Mutex::default(),
            expiry_warned: Mutex::default(),
            changed: tokio::sync::watch::Sender::new(()),
        }
    }

    /// The store with `clock` (Unix ms) instead of the system clock.
    pub fn with_clock(mut self, clock: UnixClock) -> Self {
        self.clock = clock;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serve `next` and tell whoever watches the store.
    fn serve(&self, next: Snapshot) {
        self.snapshot.store(Arc::new(next));
        self.changed.send_replace(());
    }

    /// A watch that sees each change of the store (a peer paired, revoked, or the file
    /// reloaded): listeners close the connections of peers no longer active.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Re-read the file and swap it in if its content changed. The whole file is read and
    /// hashed each time (it is small), so no edit is missed whatever the file system's
    /// timestamp granularity. A bad file keeps the old store (and says why). Serialized with
    /// [`PeerStore::modify`]: a file read before a change was written cannot be stored after
    /// it (which would bring back, say, a peer just revoked).
    pub fn reload_if_changed(&self) -> Result<bool, PeerStoreError> {
        let _writer = lock(&self.writer);
        let next = read(&self.path)?;
        if next.digest == self.snapshot.load().digest {
            return Ok(false);
        }
        self.serve(next);
        Ok(true)
    }

    /// Every record, as stored.
    pub fn records(&self) -> Vec<PeerRecord> {
        let mut v: Vec<PeerRecord> = self
            .snapshot
            .load()
            .all
            .iter()
            .map(|e| e.0.clone())
            .collect();
        v.sort_by(|a, b| a.component_id.cmp(&b.component_id));
        v
    }

    /// The active record of `component_id`, if there is one.
    pub fn active(&self, component_id: &str) -> Option<PeerRecord> {
        self.snapshot
            .load()
            .all
            .iter()
            .find(|e| e.0.component_id == component_id && e.0.status == ACTIVE)
            .map(|e| e.0.clone())
    }

    /// The record whose operator settings (`role`, `policy`) a component keeps when it pairs
    /// again: its active record, else a revoked one (a deny list outlives a revocation).
    pub fn settings_of(&self, component_id: &str) -> Option<PeerRecord> {
        let snapshot = self.snapshot.load();
        let of_id = || {
            snapshot
                .all
                .iter()
                .filter(|e| e.0.component_id == component_id)
        };
        of_id()
            .find(|e| e.0.status == ACTIVE)
            .or_else(|| of_id().find(|e| e.0.status == REVOKED))
            .map(|e| e.0.clone())
    }

    /// A revoked record of `component_id`, or of any id with the Ed25519 key `public_key`:
    /// the component may not pair again until the operator deletes it.
    pub fn revoked(&self, component_id: &str, public_key: &str) -> Option<PeerRecord> {
        self.snapshot
            .load()
            .all
            .iter()
            .find(|e| e.0.revokes(component_id, Some(public_key)))
            .map(|e| e.0.clone())
    }

    /// The Ed25519 identity key (32 bytes) and principal of the active peer `component_id`,
    /// when its record holds a key and its certificate has not expired (as the identity layer
    /// checks it): how the peer signs RFC 9421 requests.
    pub fn signing_peer(&self, component_id: &str) -> Option<(Vec<u8>, Arc<Principal>)> {
        use base64::Engine;
        let snap = self.snapshot.load();
        let entry = snap
            .all
            .iter()
            .find(|e| e.0.component_id == component_id && e.0.status == ACTIVE)?;
        if entry.2.is_some_and(|t| (self.clock)() as i64 > t) {
            return None;
        }
        let key = base64::engine::general_purpose::STANDARD
            .decode(entry.0.public_key_ed25519.as_deref()?)
            .ok()
            .filter(|k| k.len() == 32)?;
        Some((key, entry.1.clone()))
    }

    /// Change the file: read its current content, apply `change`, validate the result, write
    /// it atomically, then serve it. Changes are serialized; a change that would make the
    /// file invalid is refused and nothing is written.
    pub fn modify<T>(&self, change: impl FnOnce(&mut PeerFile) -> T) -> Result<T, PeerStoreError> {
        let _writer = lock(&self.writer);
        let mut file = match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| PeerStoreError::Invalid {
                path: self.path.clone(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => PeerFile {
                version: 1,
                peers: Vec::new(),
            },
            Err(source) => {
                return Err(PeerStoreError::Io {
                    path: self.path.clone(),
                    source,
                })
            }
        };
        let out = change(&mut file);
        let bytes = serde_json::to_vec_pretty(&file).expect("serializable");
        // Validate exactly what will be served before writing it.
        parse(&self.path, &bytes)?;
        carapace_filters::state_file::write_atomically(&self.path, &bytes).map_err(|source| {
            PeerStoreError::Io {
                path: self.path.clone(),
                source,
            }
        })?;
        self.serve(read(&self.path)?);
        Ok(out)
    }

    /// The status that decides how `component_id` is treated: `active` if a record of it is,
    /// else `revoked` if one is, else that of its other records (`pending`); `None` without
    /// records.
    pub fn status_of(&self, component_id: &str) -> Option<String> {
        let snap = self.snapshot.load();
        let statuses: Vec<&str> = snap
            .all
            .iter()
            .filter(|e| e.0.component_id == component_id)
            .map(|e| e.0.status.as_str())
            .collect();
        [ACTIVE, REVOKED]
            .into_iter()
            .find(|s| statuses.contains(s))
            .or(statuses.first().copied())
            .map(str::to_owned)
    }

    /// Add `record` as `pending`, replacing earlier pending records of its id; an active
    /// record of the id stays in force until [`activate_pending`](Self::activate_pending).
    pub fn add_pending(&self, mut record: PeerRecord) -> Result<(), PeerStoreError> {
        record.status = PENDING.into();
        self.modify(move |f| {
            f.version = 1;
            f.peers
                .retain(|p| !(p.component_id == record.component_id && p.status == PENDING));
            f.peers.push(record);
        })
    }

    /// Make the pending record of `component_id` with `fingerprint` the peer's only record,
    /// `active`. Returns it, or `None` if there is no such pending record (then nothing
    /// changed).
    pub fn activate_pending(
        &self,
        component_id: &str,
        fingerprint: &str,
    ) -> Result<Option<PeerRecord>, PeerStoreError> {
        self.modify(|f| {
            let is_it = |p: &PeerRecord| {
                p.component_id == component_id
                    && p.status == PENDING
                    && p.mtls_cert_fingerprint.eq_ignore_ascii_case(fingerprint)
            };
            let mut record = f.peers.iter().find(|p| is_it(p)).cloned()?;
            record.status = ACTIVE.into();
            f.peers.retain(|p| p.component_id != component_id);
            f.peers.push(record.clone());
            Some(record)
        })
    }

    /// Remove the pending record of `component_id` with `fingerprint` (a pairing that did not
    /// complete); other records of the id are kept.
    pub fn remove_pending(
        &self,
        component_id: &str,
        fingerprint: &str,
    ) -> Result<(), PeerStoreError> {
        self.modify(|f| {
            f.peers.retain(|p| {
                !(p.component_id == component_id
                    && p.status == PENDING
                    && p.mtls_cert_fingerprint.eq_ignore_ascii_case(fingerprint))
            })
        })
    }

    /// Remove every pending record (at start: no pairing is running). Returns how many.
    pub fn remove_all_pending(&self) -> Result<usize, PeerStoreError> {
        if !self.records().iter().any(|p| p.status == PENDING) {
            return Ok(0);
        }
        self.modify(|f| {
            let before = f.peers.len();
            f.peers.retain(|p| p.status != PENDING);
            before - f.peers.len()
        })
    }

    /// Mark every record of `component_id` revoked; its next request fails. Returns how many
    /// records changed.
    pub fn revoke(&self, component_id: &str) -> Result<usize, PeerStoreError> {
        self.modify(|f| {
            let mut n = 0;
            for p in f
                .peers
                .iter_mut()
                .filter(|p| p.component_id == component_id)
            {
                if p.status != REVOKED {
                    p.status = REVOKED.into();
                    n += 1;
                }
            }
            n
        })
    }

    /// Number of records (any status).
    pub fn len(&self) -> usize {
        self.snapshot.load().all.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
