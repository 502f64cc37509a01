use super::*;
use crate::call::SkillCredential;
use crate::canonical::hmac_sha256_hex;
use crate::nonce::NonceStoreConfig;
use std::sync::atomic::{AtomicU64, Ordering};

const NOW: u64 = 1_735_689_600_000;

/// A verifier over the local store `store`, or over `shared` when given.
fn verifier_with(
    mode: AuthMode,
    clock: Arc<AtomicU64>,
    shared: Option<Arc<dyn SharedNonces>>,
) -> (SignatureVerifier, Arc<NonceStore>) {
    let store = NonceStore::open(
        NonceStoreConfig {
            capacity: 16,
            ttl: Duration::from_secs(300),
            journal: None,
        },
        NOW,
    )
    .unwrap();
    let store = Arc::new(store);
    let replay = match shared {
        Some(store) => ReplayGuard::Shared {
            store,
            ttl: Duration::from_secs(300),
        },
        None => ReplayGuard::Local(store.clone()),
    };
    let v = SignatureVerifier::new(
        mode,
        vec![
            SigningKey {
                id: "old".into(),
                secret: Arc::from(&b"old-secret"[..]),
            },
            SigningKey {
                id: "new".into(),
                secret: Arc::from(&b"new-secret"[..]),
            },
        ],
        Duration::from_secs(120),
        replay,
        Arc::new(move || clock.load(Ordering::SeqCst)),
    );
    (v, store)
}

/// A verifier over a local store, which `verify_now` and `nonces` reach.
struct Local(SignatureVerifier, Arc<NonceStore>);

impl Local {
    fn verify(&self, c: &Credential) -> Result<String, Rejection> {
        match self.0.verify(c)? {
            Verified::Now(key) => Ok(key.to_string()),
            Verified::Pending(_) => panic!("a local store decides at once"),
        }
    }
    fn nonces(&self) -> &NonceStore {
        &self.1
    }
}

fn verifier(mode: AuthMode, clock: Arc<AtomicU64>) -> Local {
    let (v, store) = verifier_with(mode, clock, None);
    Local(v, store)
}

#[test]
fn the_verifiers_debug_names_its_keys_and_shows_none_of_their_secrets() {
    for mode in [AuthMode::Hmac, AuthMode::ApiKey] {
        let v = verifier(mode, Arc::new(AtomicU64::new(NOW)));
        let shown = format!("{:?}", v.0);
        assert!(shown.contains("old") && shown.contains("new"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
    }
}

fn signed(secret: &[u8], nonce: &str, ts: i64) -> Credential {
    let canonical = format!(r#"{{"nonce":"{nonce}","timestamp":{ts}}}"#);
    Credential::Skill(Box::new(SkillCredential {
        api_key: None,
        header_signature: None,
        signature_hex: hmac_sha256_hex(secret, canonical.as_bytes()),
        canonical,
        timestamp_ms: ts,
        nonce: nonce.into(),
        scope: "demo.echo".into(),
    }))
}

#[test]
fn every_active_key_verifies_and_replays_are_refused() {
    let v = verifier(AuthMode::Hmac, Arc::new(AtomicU64::new(NOW)));
    assert_eq!(
        v.verify(&signed(b"old-secret", "n1", NOW as i64)).unwrap(),
        "old"
    );
    assert_eq!(
        v.verify(&signed(b"new-secret", "n2", NOW as i64)).unwrap(),
        "new"
    );
    assert!(matches!(
        v.verify(&signed(b"new-secret", "n2", NOW as i64)),
        Err(Rejection::NonceReplay)
    ));
}

#[test]
fn a_bad_signature_does_not_burn_the_nonce() {
    let v = verifier(AuthMode::Hmac, Arc::new(AtomicU64::new(NOW)));
    assert!(matches!(
        v.verify(&signed(b"wrong", "n1", NOW as i64)),
        Err(Rejection::AuthFailed(_))
    ));
    assert_eq!(v.nonces().len(), 0);
    // The honest request with that nonce still goes through.
    assert!(v.verify(&signed(b"new-secret", "n1", NOW as i64)).is_ok());
}

#[test]
fn the_timestamp_window_is_checked_before_the_nonce_is_recorded() {
    let clock = Arc::new(AtomicU64::new(NOW));
    let v = verifier(AuthMode::Hmac, clock.clone());
    let edge = NOW as i64 - 120_000;
    assert!(v.verify(&signed(b"new-secret", "edge", edge)).is_ok());
    assert!(matches!(
        v.verify(&signed(b"new-secret", "late", edge - 1)),
        Err(Rejection::StaleTimestamp { .. })
    ));
    assert!(matches!(
        v.verify(&signed(b"new-secret", "early", NOW as i64 + 120_001)),
        Err(Rejection::StaleTimestamp { .. })
    ));
    assert_eq!(v.nonces().len(), 1);
    // Time moves on: the same signed request is now stale, not a replay.
    clock.store(NOW + 200_000, Ordering::SeqCst);
    assert!(matches!(
        v.verify(&signed(b"new-secret", "edge", edge)),
        Err(Rejection::StaleTimestamp { .. })
    ));
}

#[test]
fn header_signature_must_equal_the_body_signature() {
    let v = verifier(AuthMode::Hmac, Arc::new(AtomicU64::new(NOW)));
    let Credential::Skill(mut c) = signed(b"new-secret", "n1", NOW as i64) else {
        unreachable!()
    };
    c.header_signature = Some("00".repeat(32));
    assert!(matches!(
        v.verify(&Credential::Skill(c)),
        Err(Rejection::AuthFailed(_))
    ));
}

#[test]
fn api_key_mode_checks_the_header_against_every_key() {
    let v = verifier(AuthMode::ApiKey, Arc::new(AtomicU64::new(NOW)));
    let with_key = |k: Option<&str>, nonce: &str| {
        let Credential::Skill(mut c) = signed(b"irrelevant", nonce, NOW as i64) else {
            unreachable!()
        };
        c.api_key = k.map(str::to_owned);
        c.signature_hex = "api_key".into();
        Credential::Skill(c)
    };
    assert_eq!(v.verify(&with_key(Some("old-secret"), "a")).unwrap(), "old");
    assert!(matches!(
        v.verify(&with_key(Some("old-secre"), "b")),
        Err(Rejection::AuthFailed("bad API key"))
    ));
    assert!(matches!(
        v.verify(&with_key(None, "c")),
        Err(Rejection::AuthFailed("missing API key"))
    ));
    assert!(matches!(
        v.verify(&Credential::None),
        Err(Rejection::AuthFailed(_))
    ));
}
