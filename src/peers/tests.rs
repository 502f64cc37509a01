use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use carapace_filters::call::Principal;
use carapace_filters::identity::{PeerCertificate, PeerDirectory};
use carapace_filters::Rejection;

use super::load::unix_ms;
use super::record::{PeerFile, PeerRecord};
use super::{PeerStore, ACTIVE, DAY_MS, REVOKED};

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
    assert_eq!(&*p.id, "gw_home");
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
    assert_eq!(&*who.id, "gw_home");
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
fn clocked(dir: &Path, not_after: Option<&str>) -> (PeerStore, Arc<std::sync::atomic::AtomicU64>) {
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
        identity_values: Default::default(),
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
