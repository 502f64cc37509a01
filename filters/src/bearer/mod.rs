//! OAuth 2.1 bearer tokens: carapace as the resource server the MCP authorization
//! specification (2026-07-28) describes.
//!
//! On a connection without a client certificate, every request needs an
//! `Authorization: Bearer` JWT that [`token`] accepts; its scopes become the caller's
//! permissions through a [`ScopeMap`]. A request without one is answered 401 with a
//! `WWW-Authenticate` challenge naming the protected-resource metadata (RFC 9728), which this
//! layer serves itself at its well-known paths, to anyone. A call the token's scopes do not
//! allow is answered 403 `insufficient_scope` with the scope it needs. The `Authorization`
//! header is removed from every request, on every connection: a token never reaches the app.
//! Paired peers (mTLS) and the local socket are untouched otherwise.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use jsonwebtoken::jwk::JwkSet;
use tower::{Layer, Service};

use crate::authorization::Denial;
use crate::call::Principal;
use crate::identity::ConnectionIdentity;
use crate::signature::UnixClock;
use crate::{BoxFuture, Rejection};

pub mod cache;
pub mod challenge;
pub mod scopes;
pub mod token;

pub use challenge::Challenge;
pub use scopes::ScopeMap;
pub use token::{TokenError, TokenRules};

/// Where the issuer's public keys come from.
pub trait KeySource: Send + Sync + 'static {
    /// The keys held now.
    fn keys(&self) -> Arc<JwkSet>;
    /// Fetch the keys again (a token names a key not held): at most as often as the source
    /// allows. The keys after, which are the same ones when no fetch was made or it failed.
    fn refresh(&self) -> BoxFuture<Arc<JwkSet>>;
}

/// Keys that never change (a JWKS file).
#[derive(Debug, Clone)]
pub struct StaticKeys(pub Arc<JwkSet>);

impl KeySource for StaticKeys {
    fn keys(&self) -> Arc<JwkSet> {
        self.0.clone()
    }
    fn refresh(&self) -> BoxFuture<Arc<JwkSet>> {
        let keys = self.0.clone();
        Box::pin(async move { keys })
    }
}

/// What the resource server checks and answers.
#[derive(Debug, Clone)]
pub struct BearerPolicy {
    pub rules: TokenRules,
    pub scopes: ScopeMap,
    /// The `scope` of the 401 challenge: what basic use of this resource needs.
    pub challenge_scope: Option<String>,
    /// The URL of the protected-resource metadata, as challenges name it.
    pub resource_metadata: String,
    /// The paths the metadata is served at (`/.well-known/oauth-protected-resource[/path]`).
    pub metadata_paths: Vec<String>,
    /// The metadata document (JSON).
    pub metadata: Bytes,
}

/// Answers a denied action with the narrowest scope that grants it.
#[derive(Debug)]
struct ScopeDenial {
    scopes: ScopeMap,
    resource_metadata: String,
}

impl Denial for ScopeDenial {
    fn refusal(&self, who: &str, action: &str) -> Rejection {
        match self.scopes.needed_for(action) {
            Some(scope) => Rejection::InsufficientScope {
                challenge: Challenge {
                    error: Some("insufficient_scope"),
                    description: Some(format!("{action} needs the scope {scope}")),
                    scope: Some(scope.to_owned()),
                    resource_metadata: self.resource_metadata.clone(),
                }
                .header_value(),
                action: action.to_owned(),
            },
            // No scope grants it: asking for another token cannot help.
            None => Rejection::Forbidden(format!("{who} may not {action}")),
        }
    }
}

/// Checks bearer tokens on connections without a client certificate. Sits right after
/// [`crate::identity::IdentityLayer`] (built with `allow_anonymous`), whose anonymous
/// principal it replaces (in the request's extensions: a back sets the app's identity headers
/// from the call's principal, [`crate::call::app_headers`]).
///
/// ```
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use carapace_filters::bearer::{BearerLayer, BearerPolicy, ScopeMap, StaticKeys, TokenRules};
///
/// let policy = BearerPolicy {
///     rules: TokenRules {
///         issuer: "https://auth.example.com".into(),
///         audiences: vec!["https://tools.example.com/mcp".into()],
///         skew: std::time::Duration::from_secs(60),
///     },
///     scopes: ScopeMap::default(),
///     challenge_scope: None,
///     resource_metadata: "https://tools.example.com/.well-known/oauth-protected-resource/mcp".into(),
///     metadata_paths: vec!["/.well-known/oauth-protected-resource/mcp".into()],
///     metadata: Bytes::from_static(b"{}"),
/// };
/// let keys = Arc::new(StaticKeys(Arc::new(jsonwebtoken::jwk::JwkSet { keys: vec![] })));
/// let clock: carapace_filters::signature::UnixClock = Arc::new(carapace_filters::unix_now_ms);
/// let stack = tower::ServiceBuilder::new()
///     .layer(BearerLayer::new(policy, keys, clock))
///     .service_fn(|_: http::Request<()>| async {
///         Ok::<_, carapace_filters::Rejection>(http::Response::new(http_body_util::Full::new(Bytes::new())))
///     });
/// # let _ = stack;
/// ```
#[derive(Clone)]
pub struct BearerLayer {
    policy: Arc<BearerPolicy>,
    keys: Arc<dyn KeySource>,
    clock: UnixClock,
    denial: Arc<dyn Denial>,
    verified: Arc<cache::TokenCache>,
}

impl BearerLayer {
    pub fn new(policy: BearerPolicy, keys: Arc<dyn KeySource>, clock: UnixClock) -> Self {
        let denial = Arc::new(ScopeDenial {
            scopes: policy.scopes.clone(),
            resource_metadata: policy.resource_metadata.clone(),
        });
        BearerLayer {
            policy: Arc::new(policy),
            keys,
            clock,
            denial,
            verified: Arc::default(),
        }
    }
}

impl<S> Layer<S> for BearerLayer {
    type Service = Bearer<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Bearer {
            inner,
            layer: self.clone(),
        }
    }
}

/// Service of [`BearerLayer`].
#[derive(Clone)]
pub struct Bearer<S> {
    inner: S,
    layer: BearerLayer,
}

/// The token of an `Authorization: Bearer` header; `None` when there is none (or another
/// scheme). The header is removed either way.
fn take_token(headers: &mut http::HeaderMap) -> Option<String> {
    let value = headers.remove(http::header::AUTHORIZATION)?;
    let value = value.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
}

impl BearerLayer {
    fn challenge(&self, error: Option<&'static str>, description: Option<String>) -> Rejection {
        let description_text = description
            .clone()
            .unwrap_or_else(|| "a bearer token is required".into());
        Rejection::BearerToken {
            challenge: Challenge {
                error,
                description,
                scope: self.policy.challenge_scope.clone(),
                resource_metadata: self.policy.resource_metadata.clone(),
            }
            .header_value(),
            description: description_text,
        }
    }

    fn invalid(&self, e: &TokenError) -> Rejection {
        self.challenge(Some("invalid_token"), Some(e.to_string()))
    }

    /// The principal a valid `token` stands for.
    async fn principal(&self, token: &str) -> Result<Principal, Rejection> {
        let now_s = (self.clock)() / 1000;
        let skew_s = self.policy.rules.skew.as_secs();
        let mut keys = self.keys.keys();
        let holder = match self.verified.get(token, &keys, now_s, skew_s) {
            Some(holder) => holder,
            None => {
                let (alg, kid) = token::header(token).map_err(|e| self.invalid(&e))?;
                if token::key_for(&keys, alg, kid.as_deref()).is_none() {
                    keys = self.keys.refresh().await;
                }
                let jwk = token::key_for(&keys, alg, kid.as_deref())
                    .ok_or_else(|| self.invalid(&TokenError::UnknownKey))?;
                let holder = token::verify(token, alg, jwk, &self.policy.rules, now_s)
                    .map_err(|e| self.invalid(&e))?;
                self.verified.put(token, &keys, &holder);
                holder
            }
        };
        let permissions = self
            .policy
            .scopes
            .permissions(&holder.scopes)
            .with_denial(self.denial.clone());
        Ok(Principal {
            id: format!("oauth:{}", holder.subject).into(),
            kind: "oauth".into(),
            fingerprint: None,
            remote_ip: None,
            permissions: Some(Arc::new(permissions)),
            identity_values: Default::default(),
        })
    }

    fn metadata<ResBody: From<Bytes>>(&self) -> Response<ResBody> {
        let mut r = Response::new(ResBody::from(self.policy.metadata.clone()));
        *r.status_mut() = StatusCode::OK;
        let h = r.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("public, max-age=300"),
        );
        r
    }
}

impl<S, B, ResBody> Service<Request<B>> for Bearer<S>
where
    S: Service<Request<B>, Response = Response<ResBody>, Error = Rejection>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = BoxFuture<Result<S::Response, Rejection>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let layer = self.layer.clone();
        if matches!(*req.method(), http::Method::GET | http::Method::HEAD)
            && layer
                .policy
                .metadata_paths
                .iter()
                .any(|p| p == req.uri().path())
        {
            let resp = layer.metadata();
            return Box::pin(async move { Ok(resp) });
        }
        let token = take_token(req.headers_mut());
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let anonymous = matches!(
            req.extensions().get::<ConnectionIdentity>(),
            Some(ConnectionIdentity::Anonymous { .. })
        );
        Box::pin(async move {
            if anonymous {
                let token = token.ok_or_else(|| layer.challenge(None, None))?;
                let principal = layer.principal(&token).await?;
                req.extensions_mut().insert(Arc::new(principal));
            }
            inner.call(req).await
        })
    }
}

#[cfg(test)]
mod tests;
