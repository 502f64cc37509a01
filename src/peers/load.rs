//! Reading and checking the peer file into an indexed snapshot.

use std::path::Path;
use std::sync::Arc;

use carapace_filters::authorization::{default_role, Permissions};
use carapace_filters::call::Principal;
use sha2::{Digest, Sha256};

use super::record::{PeerFile, PeerRecord};
use super::{PeerStoreError, Table, RESERVED_IDS};
use crate::pairing::wire::GoTime;

/// A record with the principal it makes and its certificate's end of validity (Unix ms).
type Entry = Arc<(PeerRecord, Arc<Principal>, Option<i64>)>;

#[derive(Debug, Default)]
pub(super) struct Snapshot {
    pub(super) by_fingerprint: Table<String, Entry>,
    /// Records that pin a CA, by (CA fingerprint, gateway id).
    pub(super) by_ca: Table<(String, String), Entry>,
    pub(super) all: Vec<Entry>,
    /// SHA-256 of the file's bytes (`None`: no file), to notice every change.
    pub(super) digest: Option<[u8; 32]>,
}
pub(super) fn read(path: &Path) -> Result<Snapshot, PeerStoreError> {
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

pub(super) fn parse(path: &Path, bytes: &[u8]) -> Result<Snapshot, PeerStoreError> {
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
    let mut by_fingerprint = Table::default();
    let mut by_ca = Table::default();
    let mut all = Vec::new();
    for (i, rec) in file.peers.into_iter().enumerate() {
        let invalid = |message: String| PeerStoreError::Invalid {
            path: path.into(),
            message: format!("peers[{i}]: {message}"),
        };
        let (fp, ca, entry) = entry_of(rec).map_err(invalid)?;
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

/// A fingerprint as the peer file must write it: `sha256:` and 64 hex digits.
fn valid_fingerprint(fp: &str) -> bool {
    fp.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// One record checked: its certificate's and its CA's fingerprints (lower case; the first is
/// empty when the record pins only a CA) and its entry.
fn entry_of(rec: PeerRecord) -> Result<(String, Option<String>, Entry), String> {
    let fp = rec.mtls_cert_fingerprint.to_ascii_lowercase();
    let ca = rec
        .mtls_ca_fingerprint
        .as_ref()
        .map(|c| c.to_ascii_lowercase());
    match (&fp[..], &ca) {
        ("", None) => return Err("mtls_cert_fingerprint or mtls_ca_fingerprint is required".into()),
        (f, _) if !f.is_empty() && !valid_fingerprint(f) => {
            return Err(format!(
                "mtls_cert_fingerprint must be sha256:<64 hex>, got `{}`",
                rec.mtls_cert_fingerprint
            ))
        }
        (_, Some(c)) if !valid_fingerprint(c) => {
            return Err(format!(
                "mtls_ca_fingerprint must be sha256:<64 hex>, got `{c}`"
            ))
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
        return Err(format!(
            "component_id `{}` / component_type `{}` is reserved or not a valid header value",
            rec.component_id, rec.component_type
        ));
    }
    let not_after =
        match &rec.mtls_cert_not_after {
            None => None,
            Some(t) => Some(unix_ms(t).ok_or_else(|| {
                format!("mtls_cert_not_after must be an RFC 3339 time, got `{t}`")
            })?),
        };
    let principal = Arc::new(Principal {
        id: rec.component_id.as_str().into(),
        kind: rec.component_type.clone(),
        fingerprint: (!fp.is_empty()).then(|| fp.clone()),
        remote_ip: None,
        permissions: Some(Arc::new(Permissions::new(
            rec.role
                .clone()
                .unwrap_or_else(|| default_role(&rec.component_type).to_string()),
            rec.policy.clone().unwrap_or_default(),
        ))),
        identity_values: Default::default(),
    });
    Ok((fp, ca, Arc::new((rec, principal, not_after))))
}

/// An RFC 3339 time as Unix milliseconds.
pub(super) fn unix_ms(t: &str) -> Option<i64> {
    let (secs, nanos) = GoTime::parse_rfc3339(t)?.unix_timestamp();
    secs.checked_mul(1000)?
        .checked_add(i64::from(nanos / 1_000_000))
}
