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

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use carapace_filters::authorization::{default_role, Permissions, Policy};
use carapace_filters::call::Principal;
use carapace_filters::identity::{PeerCertificate, PeerDirectory};
use carapace_filters::signature::UnixClock;
use carapace_filters::Rejection;

use crate::pairing::wire::GoTime;

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

/// One paired peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerRecord {
    /// `gateway`, `tool_host`, `subscriber`, `operator`, ...
    pub component_type: String,
    pub component_id: String,
    /// Authorization role (`gateway`, `tool_host`, `subscriber`, `listener`, `cli_admin`).
    #[serde(default)]
    pub role: Option<String>,
    /// Where the peer was paired (its pairing endpoint), if known.
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub public_key_ed25519: Option<String>,
    #[serde(default)]
    pub public_key_x25519: Option<String>,
    /// `sha256:<hex>` of the peer's mTLS certificate DER (compared case-insensitively); `""`
    /// when the record pins a CA instead.
    #[serde(default)]
    pub mtls_cert_fingerprint: String,
    /// `sha256:<hex>` of the CA whose certificates naming `urn:carapace:gateway:<component_id>`
    /// are this peer (how a tool host knows the gateway it paired with, whose own client
    /// certificate is not part of the handshake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtls_ca_fingerprint: Option<String>,
    /// RFC 3339 end of validity of the certificate `mtls_cert_fingerprint` names, when carapace
    /// knows it (the gateway records it for the certificates it issues). Calls are refused
    /// from then on, even on a connection opened before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtls_cert_not_after: Option<String>,
    /// `active` records are accepted; anything else (`revoked`, `pending`) is refused.
    pub status: String,
    #[serde(default)]
    pub paired_at: Option<String>,
    #[serde(default)]
    pub last_seen_at: Option<String>,
    /// Per-peer authorization overrides: `allow`, `deny` and temporary `leases`.
    #[serde(default)]
    pub policy: Option<Policy>,
}

/// The file format.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerFile {
    pub version: u32,
    #[serde(default)]
    pub peers: Vec<PeerRecord>,
}

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

/// A record with the principal it makes and its certificate's end of validity (Unix ms).
type Entry = Arc<(PeerRecord, Arc<Principal>, Option<i64>)>;

#[derive(Debug, Default)]
struct Snapshot {
    by_fingerprint: HashMap<String, Entry>,
    /// Records that pin a CA, by (CA fingerprint, gateway id).
    by_ca: HashMap<(String, String), Entry>,
    all: Vec<Entry>,
    /// SHA-256 of the file's bytes (`None`: no file), to notice every change.
    digest: Option<[u8; 32]>,
}

/// When peers made their last accepted call, and what of it was written.
#[derive(Debug, Default)]
struct SeenLog {
    /// Latest accepted call per `component_id` (Unix ms).
    seen: HashMap<String, u64>,
    /// Per `component_id`: when its `last_seen_at` was last written, and the value written.
    written: HashMap<String, (u64, u64)>,
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

    /// Re-read the file and swap it in if its content changed. The whole file is read and
    /// hashed each time (it is small), so no edit is missed whatever the file system's
    /// timestamp granularity. A bad file keeps the old store (and says why).
    pub fn reload_if_changed(&self) -> Result<bool, PeerStoreError> {
        let next = read(&self.path)?;
        if next.digest == self.snapshot.load().digest {
            return Ok(false);
        }
        self.snapshot.store(Arc::new(next));
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
        self.snapshot.store(Arc::new(read(&self.path)?));
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

    /// Note that the peer `principal` made an accepted call at `now_ms` (in memory only; see
    /// [`flush_seen`](Self::flush_seen)). Callers that are not paired peers are ignored.
    pub fn note_seen(&self, principal: &Principal, now_ms: u64) {
        if principal.fingerprint.is_none() {
            return;
        }
        let mut log = lock(&self.seen);
        match log.seen.get_mut(&principal.id) {
            Some(t) => *t = (*t).max(now_ms),
            None => {
                log.seen.insert(principal.id.clone(), now_ms);
            }
        }
    }

    /// Write `last_seen_at` of the peers seen since it was last written for them, unless
    /// that was less than [`SEEN_WRITE_INTERVAL_MS`] before `now_ms`: one file write for all
    /// of them, or none. Returns how many peers' times were written.
    pub fn flush_seen(&self, now_ms: u64) -> Result<usize, PeerStoreError> {
        let due: BTreeMap<String, u64> = {
            let log = lock(&self.seen);
            log.seen
                .iter()
                .filter(|(id, &t)| match log.written.get(*id) {
                    None => true,
                    Some(&(at, value)) => {
                        t > value && now_ms.saturating_sub(at) >= SEEN_WRITE_INTERVAL_MS
                    }
                })
                .map(|(id, &t)| (id.clone(), t))
                .collect()
        };
        if due.is_empty() {
            return Ok(0);
        }
        self.modify(|f| {
            for p in f.peers.iter_mut().filter(|p| p.status == ACTIVE) {
                if let Some(&t) = due.get(&p.component_id) {
                    p.last_seen_at = rfc3339_ms(t);
                }
            }
        })?;
        let mut log = lock(&self.seen);
        for (id, t) in &due {
            log.written.insert(id.clone(), (now_ms, *t));
        }
        Ok(due.len())
    }

    /// Days (rounded down, negative once expired) until the certificate of each active peer
    /// whose record gives its expiry, by `component_id` (the soonest if it has several).
    pub fn certificate_expiry_days(&self, now_ms: u64) -> BTreeMap<String, i64> {
        let mut days = BTreeMap::new();
        for e in self.snapshot.load().all.iter() {
            let (Some(not_after), ACTIVE) = (e.2, e.0.status.as_str()) else {
                continue;
            };
            let d = (not_after - now_ms as i64).div_euclid(DAY_MS);
            let slot = days.entry(e.0.component_id.clone()).or_insert(d);
            *slot = (*slot).min(d);
        }
        days
    }

    /// Of `days` (see [`certificate_expiry_days`](Self::certificate_expiry_days)), the peers
    /// with fewer than [`EXPIRY_WARNING_DAYS`] left that were not warned about in the last
    /// [`EXPIRY_WARNING_INTERVAL_MS`]; they count as warned from `now_ms`.
    pub fn expiry_warnings_due(
        &self,
        days: &BTreeMap<String, i64>,
        now_ms: u64,
    ) -> Vec<(String, i64)> {
        let mut warned = lock(&self.expiry_warned);
        warned.retain(|id, _| days.contains_key(id));
        days.iter()
            .filter(|(_, &d)| d < EXPIRY_WARNING_DAYS)
            .filter(|(id, _)| {
                let due = warned
                    .get(*id)
                    .is_none_or(|&at| now_ms.saturating_sub(at) >= EXPIRY_WARNING_INTERVAL_MS);
                if due {
                    warned.insert((*id).clone(), now_ms);
                }
                due
            })
            .map(|(id, &d)| (id.clone(), d))
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `ms` (Unix) as RFC 3339 in UTC.
fn rfc3339_ms(ms: u64) -> Option<String> {
    let secs = i64::try_from(ms / 1000).ok()?;
    GoTime::from_unix(secs, (ms % 1000) as u32 * 1_000_000)?.to_rfc3339_nano()
}

fn read(path: &Path) -> Result<Snapshot, PeerStoreError> {
    use carapace_filters::state_file::{read_bounded, MAX_STORE_BYTES};
    match read_bounded(path, MAX_STORE_BYTES) {
        Ok(bytes) => parse(path, &bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Snapshot::default()),
        Err(source) => Err(PeerStoreError::Io {
            path: path.into(),
            source,
        }),
    }
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Snapshot, PeerStoreError> {
    let digest = Some(Sha256::digest(bytes).into());
    let file: PeerFile = serde_json::from_slice(bytes).map_err(|e| PeerStoreError::Invalid {
        path: path.into(),
        message: e.to_string(),
    })?;
    if !matches!(file.version, 0 | 1) {
        return Err(PeerStoreError::Invalid {
            path: path.into(),
            message: format!("unsupported version {}", file.version),
        });
    }
    let mut by_fingerprint = HashMap::new();
    let mut by_ca = HashMap::new();
    let mut all = Vec::new();
    let valid_fp = |fp: &str| {
        fp.strip_prefix("sha256:")
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    for (i, rec) in file.peers.into_iter().enumerate() {
        let invalid = |message: String| PeerStoreError::Invalid {
            path: path.into(),
            message: format!("peers[{i}]: {message}"),
        };
        let fp = rec.mtls_cert_fingerprint.to_ascii_lowercase();
        let ca = rec
            .mtls_ca_fingerprint
            .as_ref()
            .map(|c| c.to_ascii_lowercase());
        match (&fp[..], &ca) {
            ("", None) => {
                return Err(invalid(
                    "mtls_cert_fingerprint or mtls_ca_fingerprint is required".into(),
                ))
            }
            (f, _) if !f.is_empty() && !valid_fp(f) => {
                return Err(invalid(format!(
                    "mtls_cert_fingerprint must be sha256:<64 hex>, got `{}`",
                    rec.mtls_cert_fingerprint
                )))
            }
            (_, Some(c)) if !valid_fp(c) => {
                return Err(invalid(format!(
                    "mtls_ca_fingerprint must be sha256:<64 hex>, got `{c}`"
                )))
            }
            _ => {}
        }
        // The id goes to the app in a header: it must be a valid header value, and it must
        // not pass for one of the principals carapace itself names.
        let id_ok = !rec.component_id.is_empty()
            && !RESERVED_IDS.contains(&rec.component_id.as_str())
            && http::HeaderValue::from_str(&rec.component_id).is_ok()
            && http::HeaderValue::from_str(&rec.component_type).is_ok();
        if !id_ok {
            return Err(invalid(format!(
                "component_id `{}` / component_type `{}` is reserved or not a valid header value",
                rec.component_id, rec.component_type
            )));
        }
        let not_after = match &rec.mtls_cert_not_after {
            None => None,
            Some(t) => Some(unix_ms(t).ok_or_else(|| {
                invalid(format!(
                    "mtls_cert_not_after must be an RFC 3339 time, got `{t}`"
                ))
            })?),
        };
        let principal = Arc::new(Principal {
            id: rec.component_id.clone(),
            kind: rec.component_type.clone(),
            fingerprint: (!fp.is_empty()).then(|| fp.clone()),
            remote_ip: None,
            permissions: Some(Arc::new(Permissions::new(
                rec.role
                    .clone()
                    .unwrap_or_else(|| default_role(&rec.component_type).to_string()),
                rec.policy.clone().unwrap_or_default(),
            ))),
        });
        let entry = Arc::new((rec, principal, not_after));
        if !fp.is_empty() && by_fingerprint.insert(fp, entry.clone()).is_some() {
            return Err(invalid("fingerprint listed twice".into()));
        }
        if let Some(ca) = ca {
            let key = (ca, entry.0.component_id.clone());
            if by_ca.insert(key, entry.clone()).is_some() {
                return Err(invalid("CA and component_id listed twice".into()));
            }
        }
        all.push(entry);
    }
    Ok(Snapshot {
        by_fingerprint,
        by_ca,
        all,
        digest,
    })
}

/// An RFC 3339 time as Unix milliseconds.
fn unix_ms(t: &str) -> Option<i64> {
    let (secs, nanos) = GoTime::parse_rfc3339(t)?.unix_timestamp();
    secs.checked_mul(1000)?
        .checked_add(i64::from(nanos / 1_000_000))
}

impl PeerDirectory for PeerStore {
    fn resolve(&self, cert: &PeerCertificate) -> Result<Arc<Principal>, Rejection> {
        let snap = self.snapshot.load();
        if snap.all.is_empty() {
            return Err(Rejection::PairingRequired);
        }
        let exact = snap
            .by_fingerprint
            .get(&cert.fingerprint.to_ascii_lowercase());
        let by_ca = || {
            let ca = cert.ca_fingerprint.as_ref()?.to_ascii_lowercase();
            snap.by_ca.get(&(ca, cert.gateway_id.clone()?))
        };
        let (entry, pinned_ca) = match exact {
            Some(e) => (e, false),
            None => match by_ca() {
                Some(e) => (e, true),
                // No record: this certificate's holder has not paired (the protocol's
                // `PAIRING_REQUIRED`); a record that is not active is `FORBIDDEN` below.
                None => return Err(Rejection::PairingRequired),
            },
        };
        if entry.0.status != ACTIVE {
            return Err(Rejection::Forbidden(format!(
                "peer {} is {}",
                entry.0.component_id, entry.0.status
            )));
        }
        // Valid through its `notAfter` second, as X.509 has it.
        if entry.2.is_some_and(|t| (self.clock)() as i64 > t) {
            return Err(Rejection::Forbidden(format!(
                "the certificate of peer {} expired at {}; pair it again",
                entry.0.component_id,
                entry.0.mtls_cert_not_after.as_deref().unwrap_or_default()
            )));
        }
        if pinned_ca {
            // Tell the app which certificate it was.
            let mut p = (*entry.1).clone();
            p.fingerprint = Some(cert.fingerprint.to_ascii_lowercase());
            return Ok(Arc::new(p));
        }
        Ok(entry.1.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP: &str = "sha256:cb7fcdc361abd781db9c3bb64306d58140bdafd6a9ccfca45f465f5261169cdf";

    fn leaf(fp: &str) -> PeerCertificate {
        PeerCertificate {
            fingerprint: fp.to_string(),
            gateway_id: None,
            ca_fingerprint: None,
        }
    }

    fn write(dir: &Path, status: &str) -> PathBuf {
        let p = dir.join("peers.json");
        let body = serde_json::json!({"version": 1, "peers": [{
            "component_type": "gateway", "component_id": "gw_home",
            "mtls_cert_fingerprint": FP, "status": status,
            "paired_at": "2026-01-02T03:04:05Z"
        }]});
        std::fs::write(&p, serde_json::to_vec(&body).unwrap()).unwrap();
        p
    }

    #[test]
    fn unknown_certificates_require_pairing() {
        let dir = tempfile::tempdir().unwrap();
        let store = PeerStore::open(dir.path().join("none.json")).unwrap();
        assert!(matches!(
            store.resolve(&leaf(FP)),
            Err(Rejection::PairingRequired)
        ));
        let store = PeerStore::open(write(dir.path(), "active")).unwrap();
        assert_eq!(store.records().len(), 1);
        let p = store
            .resolve(&leaf(&FP.to_ascii_uppercase().replace("SHA256", "sha256")))
            .unwrap();
        assert_eq!(p.id, "gw_home");
        assert!(matches!(
            store.resolve(&leaf(&FP.replace("cb7f", "0000"))),
            Err(Rejection::PairingRequired)
        ));
    }

    #[test]
    fn revoked_peers_fail_after_reload() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "active");
        let store = PeerStore::open(&path).unwrap();
        assert!(store.resolve(&leaf(FP)).is_ok());
        // Rewritten at once (same mtime on a coarse file system): still noticed.
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        write(dir.path(), "revoked");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(before)
            .unwrap();
        assert!(store.reload_if_changed().unwrap());
        assert!(!store.reload_if_changed().unwrap());
        assert!(matches!(
            store.resolve(&leaf(FP)),
            Err(Rejection::Forbidden(_))
        ));
    }

    #[test]
    fn revoke_writes_the_file_and_takes_effect_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "active");
        let store = PeerStore::open(&path).unwrap();
        assert_eq!(store.revoke("gw_home").unwrap(), 1);
        assert!(matches!(
            store.resolve(&leaf(FP)),
            Err(Rejection::Forbidden(_))
        ));
        assert_eq!(store.revoke("gw_home").unwrap(), 0);
        assert_eq!(store.revoke("nobody").unwrap(), 0);
        // Persisted: a fresh load sees it too.
        let again = PeerStore::open(&path).unwrap();
        assert_eq!(again.records()[0].status, "revoked");
        // A change that would break the file is refused and nothing is written.
        let before = std::fs::read(&path).unwrap();
        let err = store.modify(|f| f.peers[0].mtls_cert_fingerprint = "md5:00".into());
        assert!(err.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn a_record_can_pin_a_ca_and_a_gateway_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("peers.json");
        let ca = FP.replace("cb7f", "ca00");
        let rec = serde_json::json!({"version": 1, "peers": [{
            "component_type": "gateway", "component_id": "gw_home",
            "mtls_ca_fingerprint": ca, "status": "active"}]});
        std::fs::write(&p, rec.to_string()).unwrap();
        let store = PeerStore::open(&p).unwrap();
        let cert = |cn: Option<&str>, ca: Option<&str>| PeerCertificate {
            fingerprint: FP.to_string(),
            gateway_id: cn.map(str::to_owned),
            ca_fingerprint: ca.map(str::to_owned),
        };
        let who = store.resolve(&cert(Some("gw_home"), Some(&ca))).unwrap();
        assert_eq!(who.id, "gw_home");
        assert_eq!(who.fingerprint.as_deref(), Some(FP));
        // Another holder of a certificate from the same CA is not the gateway.
        for other in [
            cert(Some("memory-east"), Some(&ca)),
            cert(Some("gw_home"), None),
            cert(Some("gw_home"), Some(FP)),
        ] {
            assert!(matches!(
                store.resolve(&other),
                Err(Rejection::PairingRequired)
            ));
        }
    }

    fn record(fp: &str) -> PeerRecord {
        PeerRecord {
            component_type: "tool_host".into(),
            component_id: "memory-east".into(),
            role: None,
            endpoint: None,
            public_key_ed25519: None,
            public_key_x25519: None,
            mtls_cert_fingerprint: fp.into(),
            mtls_ca_fingerprint: None,
            mtls_cert_not_after: None,
            status: ACTIVE.into(),
            paired_at: None,
            last_seen_at: None,
            policy: None,
        }
    }

    #[test]
    fn a_pending_record_is_refused_until_activated_and_an_active_one_stays_until_then() {
        let dir = tempfile::tempdir().unwrap();
        let store = PeerStore::open(dir.path().join("peers.json")).unwrap();
        let old = FP.replace("cb7f", "0001");
        store.modify(|f| f.peers.push(record(&old))).unwrap();
        store.add_pending(record(FP)).unwrap();
        assert_eq!(store.records().len(), 2);
        // The pending certificate is not accepted; the active one still is.
        assert!(matches!(
            store.resolve(&leaf(FP)),
            Err(Rejection::Forbidden(_))
        ));
        assert!(store.resolve(&leaf(&old)).is_ok());
        assert_eq!(
            store.active("memory-east").unwrap().mtls_cert_fingerprint,
            old
        );
        assert_eq!(store.status_of("memory-east").as_deref(), Some(ACTIVE));
        // Activated: the only record of the id.
        let upper = FP.to_ascii_uppercase().replace("SHA256", "sha256");
        let active = store
            .activate_pending("memory-east", &upper)
            .unwrap()
            .unwrap();
        assert_eq!(active.status, ACTIVE);
        assert_eq!(store.records(), vec![active]);
        assert!(store.resolve(&leaf(FP)).is_ok());
        assert!(store.activate_pending("memory-east", FP).unwrap().is_none());
        // Rolled back: the pending record goes, nothing else.
        store.add_pending(record(&old)).unwrap();
        assert_eq!(store.records().len(), 2);
        store.remove_pending("memory-east", &old).unwrap();
        assert_eq!(store.records().len(), 1);
        // At start every pending record is removed.
        store.add_pending(record(&old)).unwrap();
        assert_eq!(store.remove_all_pending().unwrap(), 1);
        assert_eq!(store.remove_all_pending().unwrap(), 0);
        assert_eq!(store.revoke("memory-east").unwrap(), 1);
        assert_eq!(store.status_of("memory-east").as_deref(), Some(REVOKED));
        assert_eq!(store.status_of("nobody"), None);
    }

    #[test]
    fn malformed_records_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("peers.json");
        std::fs::write(&p, r#"{"version":1,"peers":[{"component_type":"gateway","component_id":"x","mtls_cert_fingerprint":"md5:00","status":"active"}]}"#).unwrap();
        assert!(PeerStore::open(&p).is_err());
        std::fs::write(&p, r#"{"version":1,"peers":[],"extra":1}"#).unwrap();
        assert!(PeerStore::open(&p).is_err());
        for id in ["local", "anonymous", "bad\nid", ""] {
            let rec = serde_json::json!({"version": 1, "peers": [{
                "component_type": "gateway", "component_id": id,
                "mtls_cert_fingerprint": FP, "status": "active"}]});
            std::fs::write(&p, rec.to_string()).unwrap();
            assert!(PeerStore::open(&p).is_err(), "{id:?} accepted");
        }
    }

    /// A store of one active `memory-east` record whose certificate expires at `not_after`,
    /// with a clock the test sets.
    fn clocked(
        dir: &Path,
        not_after: Option<&str>,
    ) -> (PeerStore, Arc<std::sync::atomic::AtomicU64>) {
        let p = dir.join("peers.json");
        let mut rec = record(FP);
        rec.mtls_cert_not_after = not_after.map(str::to_owned);
        let body = PeerFile {
            version: 1,
            peers: vec![rec],
        };
        std::fs::write(&p, serde_json::to_vec(&body).unwrap()).unwrap();
        let now = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let n = now.clone();
        let store = PeerStore::open(&p).unwrap().with_clock(Arc::new(move || {
            n.load(std::sync::atomic::Ordering::SeqCst)
        }));
        (store, now)
    }

    const NOT_AFTER: &str = "2030-01-31T00:00:00Z";
    const NOT_AFTER_MS: u64 = 1_896_048_000_000;

    #[test]
    fn a_peer_whose_certificate_expired_is_refused_and_told_when() {
        use std::sync::atomic::Ordering::SeqCst;
        let dir = tempfile::tempdir().unwrap();
        let (store, now) = clocked(dir.path(), Some(NOT_AFTER));
        now.store(NOT_AFTER_MS, SeqCst);
        assert!(store.resolve(&leaf(FP)).is_ok(), "valid through notAfter");
        now.store(NOT_AFTER_MS + 1, SeqCst);
        match store.resolve(&leaf(FP)) {
            Err(Rejection::Forbidden(m)) => {
                assert!(m.contains("certificate") && m.contains("expired"), "{m}");
                assert!(m.contains(NOT_AFTER), "{m}");
            }
            other => panic!("{other:?}"),
        }
        // Without a known expiry nothing changes (older files stay valid as they were).
        let dir = tempfile::tempdir().unwrap();
        let (store, now) = clocked(dir.path(), None);
        now.store(u64::MAX / 2, SeqCst);
        assert!(store.resolve(&leaf(FP)).is_ok());
        assert!(store.certificate_expiry_days(0).is_empty());
        // The field is written only when known.
        let text = std::fs::read_to_string(dir.path().join("peers.json")).unwrap();
        assert!(!text.contains("mtls_cert_not_after"));
    }

    #[test]
    fn a_malformed_certificate_expiry_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("peers.json");
        let rec = serde_json::json!({"version": 1, "peers": [{
            "component_type": "gateway", "component_id": "gw",
            "mtls_cert_fingerprint": FP, "status": "active",
            "mtls_cert_not_after": "next tuesday"}]});
        std::fs::write(&p, rec.to_string()).unwrap();
        let err = PeerStore::open(&p).unwrap_err().to_string();
        assert!(err.contains("mtls_cert_not_after"), "{err}");
    }

    #[test]
    fn certificate_expiry_is_counted_in_days_and_warned_about_once_a_day() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = clocked(dir.path(), Some(NOT_AFTER));
        let day = DAY_MS as u64;
        let at = |days_before: u64| NOT_AFTER_MS - days_before * day;
        let days = store.certificate_expiry_days(at(20));
        assert_eq!(days, BTreeMap::from([("memory-east".to_string(), 20)]));
        assert!(store.expiry_warnings_due(&days, at(20)).is_empty());
        // 13 days and a half left: 13, warned once.
        let t = at(14) + day / 2;
        let days = store.certificate_expiry_days(t);
        assert_eq!(days["memory-east"], 13);
        assert_eq!(
            store.expiry_warnings_due(&days, t),
            [("memory-east".to_string(), 13)]
        );
        assert!(store.expiry_warnings_due(&days, t + day - 1).is_empty());
        let t = t + day;
        let days = store.certificate_expiry_days(t);
        assert_eq!(
            store.expiry_warnings_due(&days, t),
            [("memory-east".to_string(), 12)]
        );
        // Expired an hour ago: -1, still warned (daily).
        let t = NOT_AFTER_MS + 3_600_000;
        let days = store.certificate_expiry_days(t);
        assert_eq!(days["memory-east"], -1);
        assert_eq!(store.expiry_warnings_due(&days, t).len(), 1);
        // Revoked peers are no longer counted.
        store.revoke("memory-east").unwrap();
        assert!(store.certificate_expiry_days(t).is_empty());
    }

    fn principal(id: &str) -> Principal {
        Principal {
            id: id.into(),
            kind: "tool_host".into(),
            fingerprint: Some(FP.into()),
            remote_ip: None,
            permissions: None,
        }
    }

    #[test]
    fn last_seen_is_written_once_for_many_calls_and_again_a_minute_later() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = clocked(dir.path(), None);
        let path = dir.path().join("peers.json");
        let t0 = 1_900_000_000_000;
        // Many accepted calls: nothing written per call.
        let before = std::fs::read(&path).unwrap();
        for i in 0..1_000 {
            store.note_seen(&principal("memory-east"), t0 + i);
        }
        store.note_seen(&Principal::local(), t0);
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // One write, with the last call's time.
        assert_eq!(store.flush_seen(t0 + 1_000).unwrap(), 1);
        let written = std::fs::read(&path).unwrap();
        let last_seen = store.records()[0].last_seen_at.clone().unwrap();
        assert_eq!(unix_ms(&last_seen), Some(t0 as i64 + 999));
        // More calls within the minute: held in memory, not written.
        for i in 0..100 {
            store.note_seen(&principal("memory-east"), t0 + 2_000 + i);
        }
        assert_eq!(store.flush_seen(t0 + 1_000).unwrap(), 0);
        assert_eq!(store.flush_seen(t0 + 60_999).unwrap(), 0);
        assert_eq!(std::fs::read(&path).unwrap(), written);
        // A minute after the first write: the second.
        assert_eq!(store.flush_seen(t0 + 61_000).unwrap(), 1);
        let last_seen = store.records()[0].last_seen_at.clone().unwrap();
        assert_eq!(unix_ms(&last_seen), Some(t0 as i64 + 2_099));
        // Nothing new: nothing written, however long it waits.
        assert_eq!(store.flush_seen(t0 + 10 * 60_000).unwrap(), 0);
        // Peers without a record are not added.
        store.note_seen(&principal("nobody"), t0 + 3_000_000);
        store.flush_seen(t0 + 3_000_000).unwrap();
        assert_eq!(store.records().len(), 1);
    }
}
