//! RFC 9421 HTTP Message Signatures for fronts whose bodies carry no signature (tools-v1, MCP).
//!
//! Every request that does not come over the local socket must carry a `Signature-Input` and
//! `Signature` whose covered components include `@method`, `@target-uri` and (for a request
//! with a body) `content-digest` (RFC 9530), with the `created`, `nonce` and `keyid`
//! parameters. The key is `hmac-sha256` (a configured shared key, rotated like the Skill
//! Gateway v1 keys) or `ed25519` (a paired peer's identity key, `keyid` its component id).
//! Order of checks, as for Skill Gateway v1 signatures: the signature first, then the
//! `created` window, then the content digest, and only then is the nonce recorded (in the same
//! store, embedded or shared), so a caller without a key can neither fill the store nor burn
//! a nonce.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use tower::{Layer, Service};

use crate::call::Principal;
use crate::identity::ConnectionIdentity;
use crate::nonce::NonceError;
use crate::signature::{ReplayGuard, UnixClock};
use crate::{BoxFuture, Rejection};

pub mod message;

pub use message::{content_digest, MessageSignature, RequestView, SignatureError};

/// Longest accepted nonce.
pub const MAX_NONCE_LEN: usize = 128;

/// A key a signature can be checked with.
#[derive(Clone)]
pub enum VerifyKey {
    /// A shared secret (`alg="hmac-sha256"`), its HMAC pads hashed once
    /// ([`VerifyKey::hmac_sha256`]).
    HmacSha256(crate::canonical::HmacSha256Key),
    /// A 32-byte Ed25519 public key (`alg="ed25519"`).
    Ed25519(Vec<u8>),
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VerifyKey::HmacSha256(_) => "HmacSha256(<redacted>)",
            VerifyKey::Ed25519(_) => "Ed25519",
        })
    }
}

impl VerifyKey {
    /// The key of a shared secret.
    pub fn hmac_sha256(secret: &[u8]) -> Self {
        VerifyKey::HmacSha256(crate::canonical::HmacSha256Key::new(secret))
    }

    fn alg(&self) -> &'static str {
        match self {
            VerifyKey::HmacSha256(_) => "hmac-sha256",
            VerifyKey::Ed25519(_) => "ed25519",
        }
    }

    /// Whether `signature` signs `base` (constant time for HMAC).
    fn verifies(&self, base: &[u8], signature: &[u8]) -> bool {
        match self {
            VerifyKey::HmacSha256(key) => key.verify(base, signature),
            VerifyKey::Ed25519(public) => {
                ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public)
                    .verify(base, signature)
                    .is_ok()
            }
        }
    }
}

/// A signer's key, and for a peer's key the principal it speaks for.
#[derive(Debug, Clone)]
pub struct SignerKey {
    pub key: VerifyKey,
    pub principal: Option<Arc<Principal>>,
}

/// Where signing keys are found, by `keyid`.
pub trait SignatureKeys: Send + Sync + 'static {
    fn key(&self, keyid: &str) -> Option<SignerKey>;
}

/// The window, the scheme requests arrive by, and the nonce store.
#[derive(Clone)]
pub struct HttpSignaturePolicy {
    /// Accepted difference between `created` and now.
    pub skew: Duration,
    /// `https` on a TLS listener, else `http`: the scheme of `@target-uri`.
    pub scheme: &'static str,
    /// The `host:port` names this server answers to, lowercased; when any is given, a signed
    /// request naming another is refused (a request signed for one host, replayed to another
    /// that knows the same key). Empty: any.
    pub authorities: Vec<String>,
    pub replay: ReplayGuard,
}

/// Verifies RFC 9421 signatures on collected requests. Sits after the body limit (the body is
/// needed for `content-digest`) and after identity: on a connection without a certificate
/// the signer becomes the principal (a peer by its own key, else the anonymous signed
/// caller); on a peer's connection, a peer key must be that peer's.
///
/// ```
/// use std::sync::Arc;
/// use carapace_filters::http_signature::*;
/// use carapace_filters::nonce::{NonceStore, NonceStoreConfig};
/// use carapace_filters::signature::ReplayGuard;
///
/// struct Keys;
/// impl SignatureKeys for Keys {
///     fn key(&self, keyid: &str) -> Option<SignerKey> {
///         (keyid == "k1").then(|| SignerKey {
///             key: VerifyKey::hmac_sha256(b"a shared secret of enough bytes"),
///             principal: None,
///         })
///     }
/// }
/// let policy = HttpSignaturePolicy {
///     skew: std::time::Duration::from_secs(120),
///     scheme: "https",
///     authorities: vec!["tools.example.com:8443".into()],
///     replay: ReplayGuard::Local(Arc::new(NonceStore::open(
///         NonceStoreConfig { capacity: 1000, ttl: std::time::Duration::from_secs(300), journal: None },
///         carapace_filters::unix_now_ms(),
///     ).unwrap())),
/// };
/// let clock: carapace_filters::signature::UnixClock = Arc::new(carapace_filters::unix_now_ms);
/// let stack = tower::ServiceBuilder::new()
///     .layer(HttpSignatureLayer::new(Arc::new(Keys), policy, clock))
///     .service_fn(|_: http::Request<bytes::Bytes>| async {
///         Ok::<_, carapace_filters::Rejection>(http::Response::new(()))
///     });
/// # let _ = stack;
/// ```
#[derive(Clone)]
pub struct HttpSignatureLayer {
    keys: Arc<dyn SignatureKeys>,
    policy: Arc<HttpSignaturePolicy>,
    clock: UnixClock,
}

impl HttpSignatureLayer {
    pub fn new(
        keys: Arc<dyn SignatureKeys>,
        policy: HttpSignaturePolicy,
        clock: UnixClock,
    ) -> Self {
        HttpSignatureLayer {
            keys,
            policy: Arc::new(policy),
            clock,
        }
    }
}

impl<S> Layer<S> for HttpSignatureLayer {
    type Service = HttpSignature<S>;
    fn layer(&self, inner: S) -> Self::Service {
        HttpSignature {
            inner,
            layer: self.clone(),
        }
    }
}

/// Service of [`HttpSignatureLayer`].
#[derive(Clone)]
pub struct HttpSignature<S> {
    inner: S,
    layer: HttpSignatureLayer,
}

/// A signature checked up to its nonce: who signed and what to record.
struct Checked {
    keyid: String,
    nonce: String,
    signer: Option<Arc<Principal>>,
}

fn joined(headers: &http::HeaderMap, name: &str) -> Result<Option<String>, SignatureError> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str())
        .collect::<Result<_, _>>()
        .map_err(|_| SignatureError::Malformed)?;
    Ok((!values.is_empty()).then(|| values.join(", ")))
}

impl HttpSignatureLayer {
    /// Everything but the nonce record.
    fn check(&self, req: &Request<Bytes>, now_ms: u64) -> Result<Checked, Rejection> {
        let fail = |e: SignatureError| Rejection::AuthFailed(e.text());
        let h = req.headers();
        let (Some(input), Some(signature)) = (
            joined(h, "signature-input").map_err(fail)?,
            joined(h, "signature").map_err(fail)?,
        ) else {
            return Err(fail(SignatureError::Missing));
        };
        let has_body = !req.body().is_empty()
            || matches!(
                *req.method(),
                http::Method::POST | http::Method::PUT | http::Method::PATCH
            );
        // A session id, when sent, is part of what is signed: a relayed request cannot be
        // pointed at another session.
        let session = h.contains_key("mcp-session-id");
        let covers = |s: &MessageSignature| {
            let c = |id: &str| s.components.iter().any(|x| x == id);
            c("@method")
                && c("@target-uri")
                && (!has_body || c("content-digest"))
                && (!session || c("mcp-session-id"))
        };
        let sigs = message::parse(&input, &signature).map_err(fail)?;
        let sig = sigs
            .into_iter()
            .find(covers)
            .ok_or_else(|| fail(SignatureError::Coverage))?;
        if sig.nonce.is_empty() || sig.nonce.len() > MAX_NONCE_LEN {
            return Err(fail(SignatureError::Nonce));
        }
        let signer = self
            .keys
            .key(&sig.keyid)
            .ok_or_else(|| fail(SignatureError::UnknownKey))?;
        if sig.alg.as_deref().is_some_and(|a| a != signer.key.alg()) {
            return Err(fail(SignatureError::Algorithm));
        }
        let view = RequestView {
            method: req.method(),
            scheme: self.policy.scheme,
            uri: req.uri(),
            headers: h,
        };
        let base = message::signature_base(&sig, &view).map_err(fail)?;
        if !signer.key.verifies(base.as_bytes(), &sig.signature) {
            return Err(fail(SignatureError::Mismatch));
        }
        let authorities = &self.policy.authorities;
        if !authorities.is_empty() && !view.authority().is_some_and(|a| authorities.contains(&a)) {
            return Err(fail(SignatureError::OtherHost));
        }
        let now_s = (now_ms / 1000) as i64;
        let skew = self.policy.skew.as_secs() as i64;
        if sig.created.abs_diff(now_s) > skew as u64 {
            return Err(Rejection::StaleTimestamp {
                window: self.policy.skew,
            });
        }
        if sig.expires.is_some_and(|e| e <= now_s) {
            return Err(fail(SignatureError::Expired));
        }
        if sig.components.iter().any(|c| c == "content-digest") {
            let digest = joined(h, "content-digest")
                .map_err(fail)?
                .ok_or_else(|| fail(SignatureError::Digest))?;
            message::check_content_digest(&digest, req.body()).map_err(fail)?;
        }
        Ok(Checked {
            keyid: sig.keyid,
            nonce: sig.nonce,
            signer: signer.principal,
        })
    }
}

/// Record the nonce: now (embedded store) or once the shared store answers.
fn record(
    replay: &ReplayGuard,
    c: &Checked,
    now_ms: u64,
) -> Result<Option<BoxFuture<Result<(), Rejection>>>, Rejection> {
    let scope = format!("httpsig:{}", c.keyid);
    match replay {
        ReplayGuard::Local(store) => match store.check_and_insert(&scope, &c.nonce, now_ms) {
            Ok(()) => Ok(None),
            Err(NonceError::Replay) => Err(Rejection::NonceReplay),
            Err(NonceError::Full { retry_after }) => Err(Rejection::NonceStoreFull { retry_after }),
            Err(NonceError::Journal(e)) => Err(Rejection::Internal(format!("nonce journal: {e}"))),
        },
        ReplayGuard::Shared { store, ttl } => {
            let insert = store.insert_if_absent(&scope, &c.nonce, *ttl);
            Ok(Some(Box::pin(async move {
                match insert.await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(Rejection::NonceReplay),
                    Err(e) => Err(Rejection::SharedStateUnavailable(e.0)),
                }
            })))
        }
    }
}

impl<S> Service<Request<Bytes>> for HttpSignature<S>
where
    S: Service<Request<Bytes>, Error = Rejection> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = BoxFuture<Result<S::Response, Rejection>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let identity = req.extensions().get::<ConnectionIdentity>().cloned();
        if matches!(identity, Some(ConnectionIdentity::Local)) {
            return Box::pin(inner.call(req));
        }
        let now_ms = (self.layer.clock)();
        let checked = self.layer.check(&req, now_ms).and_then(|c| {
            let current = req.extensions().get::<Arc<Principal>>().cloned();
            match (&identity, &c.signer, current) {
                // A peer's connection signed with another peer's key (or with no peer known).
                (Some(ConnectionIdentity::Certificate(_)), Some(signer), conn)
                    if conn.as_ref().is_none_or(|conn| signer.id != conn.id) =>
                {
                    Err(Rejection::AuthFailed(SignatureError::OtherPeer.text()))
                }
                _ => Ok(c),
            }
        });
        let pending = checked.and_then(|c| {
            let pending = record(&self.layer.policy.replay, &c, now_ms)?;
            if let Some(ConnectionIdentity::Anonymous { remote_ip }) = &identity {
                // The signer is the caller: a peer by its own key, else the holder of a shared
                // key, named by it (so that two key holders are never one principal).
                let signer = c.signer.clone().unwrap_or_else(|| {
                    Arc::new(Principal {
                        id: format!("signed:{}", c.keyid).into(),
                        kind: "signed_caller".into(),
                        fingerprint: None,
                        remote_ip: *remote_ip,
                        permissions: Some(Arc::new(crate::authorization::Permissions::all_tools(
                            "signed_caller",
                        ))),
                        identity_values: Default::default(),
                    })
                });
                req.extensions_mut().insert(signer);
            }
            tracing::debug!(keyid = %c.keyid, "HTTP message signature verified");
            Ok(pending)
        });
        Box::pin(async move {
            if let Some(p) = pending? {
                p.await?;
            }
            inner.call(req).await
        })
    }
}

/// A key carapace signs its own requests with (the outbound role's, to a peer whose front
/// asks for RFC 9421 signatures).
pub trait MessageSigner: Send + Sync + 'static {
    /// The `keyid` the verifier knows the key by.
    fn keyid(&self) -> &str;
    /// `hmac-sha256` or `ed25519`.
    fn alg(&self) -> &'static str;
    /// The signature of `base`.
    fn sign(&self, base: &[u8]) -> Vec<u8>;
}

/// Sign `req` (whose body is `body`) as [`HttpSignatureLayer`] asks: `Content-Digest` for a
/// request with a body, and one signature `sig1` over `@method`, `@target-uri` (and
/// `content-digest`) with `created`, `keyid`, `alg` and `nonce`. `scheme` is how the request
/// travels (`https` over TLS); the authority is the URI's, else the `Host` header's.
pub fn sign_request<B>(
    req: &mut Request<B>,
    body: &[u8],
    scheme: &str,
    signer: &dyn MessageSigner,
    created_s: u64,
    nonce: &str,
) {
    use base64::Engine;
    let with_body = !body.is_empty()
        || matches!(
            *req.method(),
            http::Method::POST | http::Method::PUT | http::Method::PATCH
        );
    let mut components = vec!["@method".to_owned(), "@target-uri".to_owned()];
    if with_body {
        if let Ok(v) = http::HeaderValue::from_str(&content_digest(body)) {
            req.headers_mut().insert("content-digest", v);
        }
        components.push("content-digest".into());
    }
    let list = components
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(" ");
    // keyid and nonce are carapace's own (an id and hex), never needing escapes.
    let params = format!(
        "({list});created={created_s};keyid=\"{}\";alg=\"{}\";nonce=\"{nonce}\"",
        signer.keyid(),
        signer.alg()
    );
    let sig = MessageSignature {
        label: "sig1".into(),
        components,
        keyid: signer.keyid().to_owned(),
        created: created_s as i64,
        nonce: nonce.to_owned(),
        alg: Some(signer.alg().to_owned()),
        expires: None,
        params: params.clone(),
        signature: Vec::new(),
    };
    let view = RequestView {
        method: req.method(),
        scheme,
        uri: req.uri(),
        headers: req.headers(),
    };
    let Ok(base) = message::signature_base(&sig, &view) else {
        return;
    };
    let signature = base64::engine::general_purpose::STANDARD.encode(signer.sign(base.as_bytes()));
    let h = req.headers_mut();
    if let Ok(v) = http::HeaderValue::from_str(&format!("sig1={params}")) {
        h.insert("signature-input", v);
    }
    if let Ok(v) = http::HeaderValue::from_str(&format!("sig1=:{signature}:")) {
        h.insert("signature", v);
    }
}

#[cfg(test)]
mod tests;
