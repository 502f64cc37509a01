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
mod tests;

#[cfg(test)]
mod shared_tests;
