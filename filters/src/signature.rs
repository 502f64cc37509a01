//! Skill Gateway v1 authentication: API key or HMAC-SHA256 over the canonical JSON of the six
//! signed fields, with several active keys (rotation), a timestamp window and a nonce store.
//!
//! Order of checks: credential first, then the timestamp window, and only then is the nonce
//! recorded, so an attacker without a key can neither fill the store nor burn a nonce.
//!
//! Nonces go to a [`ReplayGuard`]: the embedded [`NonceStore`] (one process), or a
//! [`SharedNonces`] that every replica uses, so a request accepted at one replica is refused
//! at all the others. A shared store that cannot answer refuses the call
//! ([`Rejection::SharedStateUnavailable`]).

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use subtle::ConstantTimeEq;
use tower::{Layer, Service};

use crate::call::{Credential, ToolCall};
use crate::canonical::HmacSha256Key;
use crate::future::Gated;
use crate::nonce::{NonceError, NonceStore};
use crate::shared::SharedNonces;
use crate::{BoxFuture, Rejection};

/// Longest nonce accepted (Vagus sends 32 hex characters).
pub const MAX_NONCE_LEN: usize = 128;

/// A shared secret with a name for logs and rotation (the secret itself is never logged).
#[derive(Clone)]
pub struct SigningKey {
    pub id: String,
    pub secret: Arc<[u8]>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({}, <redacted>)", self.id)
    }
}

/// How calls authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// The raw secret in a header (`X-API-Key` by default).
    ApiKey,
    /// HMAC-SHA256 signature in the body (and optionally repeated in a header).
    Hmac,
}

/// Function returning the current Unix time in milliseconds (injected for tests).
pub type UnixClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Where verified nonces are recorded.
#[derive(Clone)]
pub enum ReplayGuard {
    /// The embedded store of this process.
    Local(Arc<NonceStore>),
    /// A store shared by every replica; nonces live there for `ttl`.
    Shared {
        store: Arc<dyn SharedNonces>,
        ttl: Duration,
    },
}

/// The outcome of [`SignatureVerifier::verify`]: decided now, or once the shared store answers.
pub enum Verified {
    /// The credential is good and its nonce recorded: the id of the key that matched.
    Now(Arc<str>),
    /// The credential is good; the call may go on once this resolves to `Ok`.
    Pending(BoxFuture<Result<(), Rejection>>),
}

/// A [`SigningKey`] made ready for checks: its HMAC pads hashed and its digest (for API
/// keys) computed once, not on every call.
struct PreparedKey {
    id: Arc<str>,
    hmac: HmacSha256Key,
    digest: [u8; 32],
}

impl PreparedKey {
    fn new(key: &SigningKey) -> Self {
        use sha2::{Digest, Sha256};
        PreparedKey {
            id: key.id.as_str().into(),
            hmac: HmacSha256Key::new(&key.secret),
            digest: Sha256::digest(&key.secret).into(),
        }
    }
}

impl std::fmt::Debug for PreparedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({}, <redacted>)", self.id)
    }
}

/// Verifies the credential of signed calls.
pub struct SignatureVerifier {
    mode: AuthMode,
    keys: Vec<PreparedKey>,
    skew: Duration,
    replay: ReplayGuard,
    clock: UnixClock,
}

impl std::fmt::Debug for SignatureVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignatureVerifier")
            .field("mode", &self.mode)
            .field("keys", &self.keys)
            .field("skew", &self.skew)
            .finish()
    }
}

impl SignatureVerifier {
    /// `keys` are all accepted (rotation: add the new key, move callers over, drop the old).
    pub fn new(
        mode: AuthMode,
        keys: Vec<SigningKey>,
        skew: Duration,
        replay: ReplayGuard,
        clock: UnixClock,
    ) -> Self {
        SignatureVerifier {
            mode,
            keys: keys.iter().map(PreparedKey::new).collect(),
            skew,
            replay,
            clock,
        }
    }

    /// Check one call's credential and record its nonce. With a shared store the nonce is
    /// recorded by the returned future.
    pub fn verify(&self, credential: &Credential) -> Result<Verified, Rejection> {
        // The nonce's place in a local store starts loading into the cache now, while the
        // signature is checked; nothing is recorded before that check passed.
        let early = match (&self.replay, credential) {
            (ReplayGuard::Local(store), Credential::Skill(c))
                if (1..=MAX_NONCE_LEN).contains(&c.nonce.len()) =>
            {
                Some(store.key(&c.scope, &c.nonce))
            }
            _ => None,
        };
        let (key_id, scope, nonce, now) = self.check_credential(credential)?;
        match &self.replay {
            ReplayGuard::Local(store) => match store
                .check_and_insert_key(early.unwrap_or_else(|| store.key(scope, nonce)), now)
            {
                Ok(()) => Ok(Verified::Now(key_id)),
                Err(NonceError::Replay) => Err(Rejection::NonceReplay),
                Err(NonceError::Full { retry_after }) => {
                    Err(Rejection::NonceStoreFull { retry_after })
                }
                Err(NonceError::Journal(e)) => {
                    Err(Rejection::Internal(format!("nonce journal: {e}")))
                }
            },
            ReplayGuard::Shared { store, ttl } => {
                let insert = store.insert_if_absent(scope, nonce, *ttl);
                Ok(Verified::Pending(Box::pin(async move {
                    match insert.await {
                        Ok(true) => {
                            tracing::debug!(key_id = %key_id, "signature verified");
                            Ok(())
                        }
                        Ok(false) => Err(Rejection::NonceReplay),
                        Err(e) => Err(Rejection::SharedStateUnavailable(e.0)),
                    }
                })))
            }
        }
    }

    /// Everything but the nonce record: key, timestamp window, nonce shape. Returns the key
    /// id, the scope, the nonce and the time of the check.
    fn check_credential<'c>(
        &self,
        credential: &'c Credential,
    ) -> Result<(Arc<str>, &'c str, &'c str, u64), Rejection> {
        let Credential::Skill(cred) = credential else {
            return Err(Rejection::AuthFailed("missing credential"));
        };
        let key_id = match self.mode {
            AuthMode::ApiKey => {
                let presented = cred
                    .api_key
                    .as_deref()
                    .ok_or(Rejection::AuthFailed("missing API key"))?;
                self.match_api_key(presented.as_bytes())
                    .ok_or(Rejection::AuthFailed("bad API key"))?
            }
            AuthMode::Hmac => {
                if let Some(header) = &cred.header_signature {
                    // A header signature, when sent, must be the body signature.
                    if !bool::from(header.as_bytes().ct_eq(cred.signature_hex.as_bytes())) {
                        return Err(Rejection::AuthFailed("header and body signatures differ"));
                    }
                }
                self.match_hmac(cred.canonical.as_bytes(), &cred.signature_hex)
                    .ok_or(Rejection::AuthFailed("bad signature"))?
            }
        };
        let now = (self.clock)();
        let skew_ms = u64::try_from(self.skew.as_millis()).unwrap_or(u64::MAX);
        let in_window =
            u64::try_from(cred.timestamp_ms).is_ok_and(|ts| ts.abs_diff(now) <= skew_ms);
        if !in_window {
            return Err(Rejection::StaleTimestamp { window: self.skew });
        }
        if cred.nonce.is_empty() || cred.nonce.len() > MAX_NONCE_LEN {
            return Err(Rejection::invalid(format!(
                "nonce must be 1 to {MAX_NONCE_LEN} characters"
            )));
        }
        Ok((key_id, &cred.scope, &cred.nonce, now))
    }

    /// Compare against every key without stopping early, in constant time per key. Digests
    /// are compared so that neither the time nor an early length check tells the key's length.
    fn match_api_key(&self, presented: &[u8]) -> Option<Arc<str>> {
        use sha2::{Digest, Sha256};
        let presented = Sha256::digest(presented);
        let mut found = None;
        for key in &self.keys {
            if bool::from(presented.as_slice().ct_eq(&key.digest)) && found.is_none() {
                found = Some(key.id.clone());
            }
        }
        found
    }

    fn match_hmac(&self, canonical: &[u8], signature_hex: &str) -> Option<Arc<str>> {
        let signature = crate::canonical::decode_signature_hex(signature_hex)?;
        let mut found = None;
        for key in &self.keys {
            if key.hmac.verify(canonical, &signature) && found.is_none() {
                found = Some(key.id.clone());
            }
        }
        found
    }
}

/// Verifies each [`ToolCall`]'s credential with a [`SignatureVerifier`].
#[derive(Debug, Clone)]
pub struct SignatureLayer {
    verifier: Arc<SignatureVerifier>,
}

impl SignatureLayer {
    pub fn new(verifier: Arc<SignatureVerifier>) -> Self {
        SignatureLayer { verifier }
    }
}

impl<S> Layer<S> for SignatureLayer {
    type Service = Signature<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Signature {
            inner,
            verifier: self.verifier.clone(),
        }
    }
}

/// Service of [`SignatureLayer`].
#[derive(Debug, Clone)]
pub struct Signature<S> {
    inner: S,
    verifier: Arc<SignatureVerifier>,
}

impl<S> Service<ToolCall> for Signature<S>
where
    S: Service<ToolCall, Error = Rejection> + Clone,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = Gated<S, ToolCall, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let span = tracing::debug_span!("signature");
        let verified = span.in_scope(|| self.verifier.verify(&call.credential));
        match verified {
            Ok(Verified::Now(key_id)) => {
                tracing::debug!(call_id = %call.call_id, key_id = %key_id, "signature verified");
                Gated::inner(self.inner.call(call))
            }
            Ok(Verified::Pending(check)) => {
                // The ready service goes with the call; a clone takes its place here.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                Gated::checking(check, ready, call)
            }
            Err(r) => Gated::reject(r),
        }
    }
}

#[cfg(test)]
mod tests {
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
}

#[cfg(test)]
mod shared_tests {
    use super::*;
    use crate::call::SkillCredential;
    use crate::canonical::hmac_sha256_hex;
    use crate::shared::SharedStateError;
    use std::collections::HashSet;
    use std::sync::Mutex;

    const NOW: u64 = 1_735_689_600_000;

    /// A shared ledger in memory that records what it was asked, or fails every call.
    #[derive(Default)]
    struct FakeLedger {
        seen: Mutex<HashSet<(String, String)>>,
        asked: Mutex<Vec<Duration>>,
        down: bool,
    }

    impl SharedNonces for FakeLedger {
        fn insert_if_absent(
            &self,
            scope: &str,
            nonce: &str,
            ttl: Duration,
        ) -> BoxFuture<Result<bool, SharedStateError>> {
            self.asked.lock().unwrap().push(ttl);
            let r = if self.down {
                Err(SharedStateError("connection refused".into()))
            } else {
                Ok(self
                    .seen
                    .lock()
                    .unwrap()
                    .insert((scope.to_owned(), nonce.to_owned())))
            };
            Box::pin(async move { r })
        }
    }

    fn verifier(ledger: Arc<FakeLedger>) -> SignatureVerifier {
        SignatureVerifier::new(
            AuthMode::Hmac,
            vec![SigningKey {
                id: "k".into(),
                secret: Arc::from(&b"secret"[..]),
            }],
            Duration::from_secs(120),
            ReplayGuard::Shared {
                store: ledger,
                ttl: Duration::from_secs(300),
            },
            Arc::new(|| NOW),
        )
    }

    fn signed(secret: &[u8], nonce: &str) -> Credential {
        let canonical = format!(r#"{{"nonce":"{nonce}","timestamp":{NOW}}}"#);
        Credential::Skill(Box::new(SkillCredential {
            api_key: None,
            header_signature: None,
            signature_hex: hmac_sha256_hex(secret, canonical.as_bytes()),
            canonical,
            timestamp_ms: NOW as i64,
            nonce: nonce.into(),
            scope: "demo.echo".into(),
        }))
    }

    async fn outcome(v: &SignatureVerifier, c: &Credential) -> Result<(), Rejection> {
        match v.verify(c)? {
            Verified::Now(_) => panic!("a shared store answers later"),
            Verified::Pending(f) => f.await,
        }
    }

    #[tokio::test]
    async fn the_shared_ledger_decides_replays_with_the_configured_ttl() {
        let ledger = Arc::new(FakeLedger::default());
        let v = verifier(ledger.clone());
        outcome(&v, &signed(b"secret", "n1")).await.unwrap();
        assert!(matches!(
            outcome(&v, &signed(b"secret", "n1")).await,
            Err(Rejection::NonceReplay)
        ));
        assert_eq!(*ledger.asked.lock().unwrap(), [Duration::from_secs(300); 2]);
    }

    #[tokio::test]
    async fn a_forged_call_never_reaches_the_shared_ledger() {
        let ledger = Arc::new(FakeLedger::default());
        let v = verifier(ledger.clone());
        assert!(matches!(
            v.verify(&signed(b"wrong", "n1")),
            Err(Rejection::AuthFailed(_))
        ));
        assert!(ledger.asked.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_unreachable_ledger_refuses_the_call() {
        let ledger = Arc::new(FakeLedger {
            down: true,
            ..Default::default()
        });
        let v = verifier(ledger);
        assert!(matches!(
            outcome(&v, &signed(b"secret", "n1")).await,
            Err(Rejection::SharedStateUnavailable(_))
        ));
    }
}
