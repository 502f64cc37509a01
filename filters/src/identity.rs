//! Identity: map the connection's peer certificate to a paired peer and fail closed. The
//! principal goes on in the request's extensions; the headers that tell the app who called are
//! built from it by each back ([`crate::call::app_headers`]). Headers of that name sent by the
//! caller are removed here, never passed through.

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use http::{HeaderName, HeaderValue};
use tower::{Layer, Service};

use crate::call::Principal;
use crate::future::ReadyOr;
use crate::Rejection;

/// Prefix of every header carapace sets for the app. Caller headers with it are dropped.
pub const HEADER_PREFIX: &str = "x-carapace-";
/// The calling peer's `component_id` (`local` on the Unix socket).
pub const PEER_ID: HeaderName = HeaderName::from_static("x-carapace-peer-id");
/// The calling peer's `component_type`.
pub const PEER_TYPE: HeaderName = HeaderName::from_static("x-carapace-peer-type");
/// `sha256:<hex>` of the calling peer's certificate (absent on the Unix socket).
pub const PEER_FINGERPRINT: HeaderName = HeaderName::from_static("x-carapace-peer-fingerprint");

/// How the connection a request came on was authenticated; the listener puts one in the
/// extensions of every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionIdentity {
    /// The local Unix socket: no authentication, by the protocol's local mode.
    Local,
    /// TLS with a verified client certificate (shared: every request on the connection
    /// carries it).
    Certificate(Arc<PeerCertificate>),
    /// TLS or loopback TCP without a client certificate (signed fronts only), from this
    /// address.
    Anonymous { remote_ip: Option<std::net::IpAddr> },
}

/// What the listener knows of a verified client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCertificate {
    /// `sha256:<hex>` of the certificate's DER.
    pub fingerprint: String,
    /// The gateway id of a `urn:carapace:gateway:<id>` URI name in the certificate: how a
    /// gateway's pairing CA marks the gateway's own client certificate (it never copies such
    /// a name from a peer's CSR).
    pub gateway_id: Option<String>,
    /// `sha256:<hex>` of the CA the listener verified it against, when the listener trusts
    /// exactly one CA.
    pub ca_fingerprint: Option<String>,
}

/// Resolves a verified client certificate to a paired peer.
pub trait PeerDirectory: Send + Sync + 'static {
    /// `Ok` with the peer if it is paired and active; `PairingRequired` when nothing is paired
    /// yet; `Forbidden` for an unknown or revoked identity.
    fn resolve(&self, cert: &PeerCertificate) -> Result<Arc<Principal>, Rejection>;
}

/// Headers that carry a credential on some front: a request may carry each at most once, so
/// that what is checked is the only value there is.
pub static CREDENTIAL_HEADERS: [HeaderName; 6] = [
    http::header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("x-skill-signature"),
    HeaderName::from_static("x-skill-timestamp"),
    HeaderName::from_static("x-skill-nonce"),
    HeaderName::from_static("x-skill-key-id"),
];

/// The first credential header (of [`CREDENTIAL_HEADERS`] and `extra`) sent more than once.
pub fn repeated_credential<'a>(
    headers: &http::HeaderMap,
    extra: &'a [HeaderName],
) -> Option<&'a HeaderName> {
    // No header of the request is repeated (the usual case): no lookup is needed.
    if headers.keys_len() == headers.len() {
        return None;
    }
    CREDENTIAL_HEADERS
        .iter()
        .chain(extra)
        .find(|h| headers.get_all(*h).iter().nth(1).is_some())
}

/// Sets `Arc<Principal>` in the request extensions and removes every caller-sent
/// `x-carapace-*` header. Refuses a request that repeats a credential header
/// ([`CREDENTIAL_HEADERS`] and the ones named with [`IdentityLayer::credential_header`]).
///
/// ```
/// use std::sync::Arc;
/// use carapace_filters::call::Principal;
/// use carapace_filters::identity::{
///     ConnectionIdentity, IdentityLayer, PeerCertificate, PeerDirectory,
/// };
/// use carapace_filters::Rejection;
/// use tower::{Layer, ServiceExt};
///
/// /// No peer is paired: every certificate is refused.
/// struct NoPeers;
/// impl PeerDirectory for NoPeers {
///     fn resolve(&self, _: &PeerCertificate) -> Result<Arc<Principal>, Rejection> {
///         Err(Rejection::Forbidden("unknown peer".into()))
///     }
/// }
///
/// // The app sees the principal and whether any `x-carapace-*` header reached it.
/// let app = tower::service_fn(|req: http::Request<()>| async move {
///     let who = req.extensions().get::<Arc<Principal>>().map(|p| p.id.clone());
///     let forged = req.headers().keys().any(|k| k.as_str().starts_with("x-carapace-"));
///     Ok::<_, Rejection>((who, forged))
/// });
/// let svc = IdentityLayer::new(Arc::new(NoPeers), false).layer(app);
/// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
///
/// // On the local socket the caller is the local principal; its forged header is removed.
/// let mut local = http::Request::builder()
///     .header("x-carapace-peer-id", "admin")
///     .body(())
///     .unwrap();
/// local.extensions_mut().insert(ConnectionIdentity::Local);
/// let seen = rt.block_on(svc.clone().oneshot(local)).unwrap();
/// assert_eq!(seen, (Some("local".into()), false));
///
/// // A request without a connection identity never reaches the app.
/// let refused = rt.block_on(svc.oneshot(http::Request::new(())));
/// assert!(matches!(refused, Err(Rejection::Internal(_))));
/// ```
pub struct IdentityLayer {
    directory: Arc<dyn PeerDirectory>,
    allow_anonymous: bool,
    credential_headers: Arc<[HeaderName]>,
}

impl IdentityLayer {
    /// `allow_anonymous`: whether connections without a client certificate may go on (as the
    /// `anonymous` principal) because a later layer authenticates each call (signed fronts).
    pub fn new(directory: Arc<dyn PeerDirectory>, allow_anonymous: bool) -> Self {
        IdentityLayer {
            directory,
            allow_anonymous,
            credential_headers: Arc::from([]),
        }
    }

    /// Also treat `name` (a configured API key or signature header) as a credential header.
    pub fn credential_header(mut self, name: HeaderName) -> Self {
        let mut all = self.credential_headers.to_vec();
        all.push(name);
        self.credential_headers = all.into();
        self
    }
}

impl<S> Layer<S> for IdentityLayer {
    type Service = Identity<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Identity {
            inner,
            directory: self.directory.clone(),
            allow_anonymous: self.allow_anonymous,
            credential_headers: self.credential_headers.clone(),
        }
    }
}

/// Service of [`IdentityLayer`].
#[derive(Clone)]
pub struct Identity<S> {
    inner: S,
    directory: Arc<dyn PeerDirectory>,
    allow_anonymous: bool,
    credential_headers: Arc<[HeaderName]>,
}

impl<S> Identity<S> {
    fn principal<B>(&self, req: &http::Request<B>) -> Result<Arc<Principal>, Rejection> {
        match req.extensions().get::<ConnectionIdentity>() {
            Some(ConnectionIdentity::Local) => Ok(Arc::new(Principal::local())),
            Some(ConnectionIdentity::Certificate(cert)) => self.directory.resolve(cert),
            Some(ConnectionIdentity::Anonymous { remote_ip }) if self.allow_anonymous => {
                Ok(Arc::new(Principal {
                    id: "anonymous".into(),
                    kind: "anonymous".into(),
                    fingerprint: None,
                    remote_ip: *remote_ip,
                    permissions: Some(Arc::new(crate::authorization::Permissions::all_tools(
                        "signed_caller",
                    ))),
                    identity_values: Default::default(),
                }))
            }
            Some(ConnectionIdentity::Anonymous { .. }) => Err(Rejection::Forbidden(
                "a client certificate is required".into(),
            )),
            None => Err(Rejection::Internal("connection identity missing".into())),
        }
    }
}

/// The refusal's text for a repeated credential header (a static text, as the header names
/// are few and fixed).
fn repeated_message(h: &HeaderName) -> &'static str {
    match h.as_str() {
        "authorization" => "the Authorization header is repeated",
        "x-api-key" => "the X-API-Key header is repeated",
        "x-skill-signature" => "the X-Skill-Signature header is repeated",
        _ => "a credential header is repeated",
    }
}

/// `s` as an identity header's value: its bytes when a header value may hold every one of them
/// (the rule `HeaderValue::from_str` checks: no control character but tab), else `invalid`.
/// A header line written from it is the line [`IdentityValues`]' value would give.
pub(crate) fn identity_value(s: &str) -> &[u8] {
    // Every byte looked at, with no early exit, so that the compiler checks many at a time (a
    // fingerprint is 71 bytes; a loop stopping at the first bad byte takes them one by one).
    let sendable = s.bytes().fold(true, |ok, b| {
        ok & (((b >= b' ') & (b != 0x7f)) | (b == b'\t'))
    });
    if sendable {
        s.as_bytes()
    } else {
        b"invalid"
    }
}

/// The values of a principal's identity headers, made the first time they are sent and
/// shared by every later request of that principal (a header value's copy is a reference
/// count). Values that no longer match the principal's fields (changed after they were made)
/// are never sent: the principal's current fields are.
#[derive(Default)]
pub struct IdentityValues(OnceLock<[Option<HeaderValue>; 3]>);

impl IdentityValues {
    /// `x-carapace-peer-id`, `-type` and `-fingerprint`'s values for `p`.
    pub(crate) fn of(&self, p: &Principal) -> [Option<HeaderValue>; 3] {
        let value = |s: &str| {
            HeaderValue::from_bytes(identity_value(s)).expect("checked as a header value")
        };
        let made = || {
            [
                Some(value(&p.id)),
                Some(value(&p.kind)),
                p.fingerprint.as_deref().map(value),
            ]
        };
        let values = self.0.get_or_init(made);
        let same = |v: &Option<HeaderValue>, s: Option<&str>| match (v, s) {
            (Some(v), Some(s)) => v.as_bytes() == s.as_bytes(),
            (None, None) => true,
            _ => false,
        };
        let [id, kind, fingerprint] = values;
        if same(id, Some(&p.id))
            && same(kind, Some(&p.kind))
            && same(fingerprint, p.fingerprint.as_deref())
        {
            values.clone()
        } else {
            made()
        }
    }
}

impl Clone for IdentityValues {
    fn clone(&self) -> Self {
        IdentityValues::default()
    }
}

/// A cache: principals are equal by their fields, whatever was sent for them.
impl PartialEq for IdentityValues {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for IdentityValues {}

impl std::fmt::Debug for IdentityValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdentityValues")
    }
}

/// Remove every caller-sent `x-carapace-*` header and set the ones describing `principal`.
pub(crate) fn set_identity_headers(headers: &mut http::HeaderMap, principal: &Principal) {
    remove_carapace_headers(headers);
    let [id, kind, fingerprint] = principal.identity_values.of(principal);
    for (name, value) in [
        (PEER_ID, id),
        (PEER_TYPE, kind),
        (PEER_FINGERPRINT, fingerprint),
    ] {
        if let Some(v) = value {
            headers.insert(name, v);
        }
    }
}

/// Remove every `x-carapace-*` header: only carapace sets them.
fn remove_carapace_headers(headers: &mut http::HeaderMap) {
    let foreign: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with(HEADER_PREFIX))
        .cloned()
        .collect();
    for k in foreign {
        headers.remove(&k);
    }
}

impl<S, B> Service<http::Request<B>> for Identity<S>
where
    S: Service<http::Request<B>, Error = Rejection>,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = ReadyOr<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        if let Some(h) = repeated_credential(req.headers(), &self.credential_headers) {
            return ReadyOr::reject(Rejection::AuthFailed(repeated_message(h)));
        }
        match self.principal(&req) {
            Ok(principal) => {
                remove_carapace_headers(req.headers_mut());
                req.extensions_mut().insert(principal);
                ReadyOr::inner(self.inner.call(req))
            }
            Err(r) => ReadyOr::reject(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    /// The raw value written for a field is the one `HeaderValue::from_str` takes, or
    /// `invalid` where it refuses, for every ASCII character and some that are not.
    #[test]
    fn an_identity_value_is_what_a_header_value_takes() {
        let chars = (0u8..=0x7f).map(char::from).chain(['é', '€', '\u{1F600}']);
        for c in chars {
            let field = format!("a{c}b");
            let expected = match HeaderValue::from_str(&field) {
                Ok(v) => v.as_bytes().to_vec(),
                Err(_) => b"invalid".to_vec(),
            };
            assert_eq!(identity_value(&field), expected, "{:?}", c);
        }
        assert_eq!(identity_value(""), b"");
    }

    struct OnePeer;
    impl PeerDirectory for OnePeer {
        fn resolve(&self, cert: &PeerCertificate) -> Result<Arc<Principal>, Rejection> {
            let fingerprint = cert.fingerprint.as_str();
            if fingerprint == "sha256:aa" {
                Ok(Arc::new(Principal {
                    id: "gw".into(),
                    kind: "gateway".into(),
                    fingerprint: Some(fingerprint.into()),
                    remote_ip: None,
                    permissions: None,
                    identity_values: Default::default(),
                }))
            } else {
                Err(Rejection::Forbidden("unknown peer".into()))
            }
        }
    }

    /// What reached the service behind the layer: the request's headers and its principal.
    type Reached = (http::HeaderMap, Option<Arc<Principal>>);

    fn svc(anon: bool) -> impl Service<http::Request<()>, Response = Reached, Error = Rejection> {
        IdentityLayer::new(Arc::new(OnePeer), anon).layer(tower::service_fn(
            |req: http::Request<()>| async move {
                let who = req.extensions().get::<Arc<Principal>>().cloned();
                Ok((req.headers().clone(), who))
            },
        ))
    }

    /// No `x-carapace-*` header reached the service: the caller's were removed, none were set.
    fn assert_no_identity_headers(h: &http::HeaderMap) {
        assert!(
            h.keys().all(|k| !k.as_str().starts_with(HEADER_PREFIX)),
            "{h:?}"
        );
    }

    fn cert(fingerprint: &str) -> ConnectionIdentity {
        ConnectionIdentity::Certificate(Arc::new(PeerCertificate {
            fingerprint: fingerprint.into(),
            gateway_id: None,
            ca_fingerprint: None,
        }))
    }

    fn req(id: Option<ConnectionIdentity>) -> http::Request<()> {
        let mut r = http::Request::builder()
            .header("x-carapace-peer-id", "admin")
            .header("X-Carapace-Anything", "1")
            .body(())
            .unwrap();
        if let Some(id) = id {
            r.extensions_mut().insert(id);
        }
        r
    }

    /// The principal goes on in the extensions; the caller's forged `x-carapace-*` headers
    /// never do, and none are set in their place (each back builds the app's from the principal).
    #[tokio::test]
    async fn the_principal_goes_on_and_caller_identity_headers_never_do() {
        let (h, who) = svc(false)
            .oneshot(req(Some(cert("sha256:aa"))))
            .await
            .unwrap();
        let who = who.expect("a principal");
        assert_eq!((&*who.id, who.kind.as_str()), ("gw", "gateway"));
        assert_eq!(who.fingerprint.as_deref(), Some("sha256:aa"));
        assert_no_identity_headers(&h);
        let (h, who) = svc(false)
            .oneshot(req(Some(ConnectionIdentity::Local)))
            .await
            .unwrap();
        assert_eq!(&*who.expect("a principal").id, "local");
        assert_no_identity_headers(&h);
    }

    #[test]
    fn a_principal_sends_its_own_values_and_a_changed_copy_its_new_ones() {
        let gw = Principal {
            fingerprint: Some("sha256:aa".into()),
            ..Principal::local()
        };
        let mut h = http::HeaderMap::new();
        h.insert(PEER_FINGERPRINT, HeaderValue::from_static("sha256:forged"));
        set_identity_headers(&mut h, &gw);
        assert_eq!(h[PEER_FINGERPRINT], "sha256:aa");
        // Made once, sent again from the same values.
        let mut again = http::HeaderMap::new();
        set_identity_headers(&mut again, &gw);
        assert_eq!(again[PEER_ID], "local");
        assert_eq!(again[PEER_FINGERPRINT], "sha256:aa");
        // A copy changed after the original's values were made sends its own.
        let mut other = gw.clone();
        other.fingerprint = Some("sha256:bb".into());
        other.id = "gw-2".into();
        let mut h = http::HeaderMap::new();
        set_identity_headers(&mut h, &other);
        assert_eq!(h[PEER_ID], "gw-2");
        assert_eq!(h[PEER_FINGERPRINT], "sha256:bb");
        other.fingerprint = None;
        let mut h = http::HeaderMap::new();
        set_identity_headers(&mut h, &Principal { ..other });
        assert!(h.get(PEER_FINGERPRINT).is_none());
    }

    #[tokio::test]
    async fn unknown_or_missing_identity_fails_closed() {
        let e = svc(false)
            .oneshot(req(Some(cert("sha256:bb"))))
            .await
            .unwrap_err();
        assert!(matches!(e, Rejection::Forbidden(_)));
        let e = svc(false)
            .oneshot(req(Some(ConnectionIdentity::Anonymous { remote_ip: None })))
            .await
            .unwrap_err();
        assert!(matches!(e, Rejection::Forbidden(_)));
        let e = svc(false).oneshot(req(None)).await.unwrap_err();
        assert!(matches!(e, Rejection::Internal(_)));
        let (h, who) = svc(true)
            .oneshot(req(Some(ConnectionIdentity::Anonymous { remote_ip: None })))
            .await
            .unwrap();
        assert_eq!(&*who.expect("a principal").id, "anonymous");
        assert_no_identity_headers(&h);
    }

    #[tokio::test]
    async fn a_repeated_credential_header_is_refused() {
        for name in [
            "x-skill-signature",
            "X-API-Key",
            "authorization",
            "x-custom-key",
        ] {
            let mut r = req(Some(cert("sha256:aa")));
            r.headers_mut().append(name, HeaderValue::from_static("a"));
            r.headers_mut().append(name, HeaderValue::from_static("b"));
            let e = IdentityLayer::new(Arc::new(OnePeer), false)
                .credential_header(HeaderName::from_static("x-custom-key"))
                .layer(tower::service_fn(|_: http::Request<()>| async {
                    Ok::<_, Rejection>(())
                }))
                .oneshot(r)
                .await
                .unwrap_err();
            assert!(matches!(e, Rejection::AuthFailed(_)), "{name}: {e:?}");
        }
        // Once is fine, also when another header is repeated.
        let mut r = req(Some(cert("sha256:aa")));
        r.headers_mut()
            .append("x-skill-signature", HeaderValue::from_static("a"));
        assert!(svc(false).oneshot(r).await.is_ok());
        let mut r = req(Some(cert("sha256:aa")));
        for (name, value) in [("accept", "a"), ("accept", "b"), ("x-skill-signature", "a")] {
            r.headers_mut()
                .append(name, HeaderValue::from_static(value));
        }
        assert!(svc(false).oneshot(r).await.is_ok());
    }
}
