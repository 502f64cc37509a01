//! Serving the EAT documents on the front's listener.
//!
//! Two layers of one service: [`EatLayer::keys`] sits before the identity layer and serves the
//! public keys (`/.well-known/jwks.json`, `/.well-known/did.json`) to anyone who can connect,
//! as a did:web resolver needs; [`EatLayer::catalog`] sits after identity (and OAuth) and
//! serves the catalog and the OpenAPI documents with only the tools the caller may call. Every
//! answer has `Cache-Control` and a strong `ETag`, and a matching `If-None-Match` gets 304.
//! The catalog carries `X-JWS-Signature`; a signature is made once per catalog hash and
//! reused until half its life is gone, so the catalog and its signature change together when
//! discovery changes the tools.
//!
//! ```
//! # use std::sync::Arc;
//! # use carapace::eat::serve::{EatLayer, Publisher};
//! # use carapace::eat::documents::Publication;
//! # fn layers(publisher: Arc<Publisher>, publication: Arc<Publication>,
//! #           catalog: Arc<carapace::catalog::CatalogHandle>,
//! #           clock: carapace_filters::signature::UnixClock) {
//! let outer = EatLayer::keys(publisher.clone(), publication.clone(), clock.clone());
//! let inner = EatLayer::catalog(publisher, publication, catalog, clock);
//! # }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use serde_json::json;
use sha2::Digest;
use tower::Service;

use carapace_filters::signature::UnixClock;
use carapace_filters::{BoxFuture, Rejection};

use super::documents::{
    sha256_tag, Publication, CATALOG_PATH, DID_PATH, JWKS_PATH, SPEC_PREFIX, SPEC_SUFFIX,
};
use super::keys::{CatalogKeys, KeyError};
use super::names;
use crate::caller_body::CallerBody;
use crate::catalog::CatalogHandle;
use crate::front::Resp;

/// The header carrying the catalog's compact JWS.
pub const SIGNATURE_HEADER: &str = "x-jws-signature";
/// Signatures kept (one per distinct catalog a caller saw); all are dropped when full.
const MAX_SIGNATURES: usize = 256;

/// The signing keys and the signatures made with them.
#[derive(Debug)]
pub struct Publisher {
    keys: CatalogKeys,
    signatures: Mutex<HashMap<String, Signed>>,
}

#[derive(Debug, Clone)]
struct Signed {
    jws: Arc<str>,
    exp: u64,
}

impl Publisher {
    pub fn new(keys: CatalogKeys) -> Self {
        Publisher {
            keys,
            signatures: Mutex::new(HashMap::new()),
        }
    }

    /// The keys of `front.eat`: its `keys_file`, else made in the state directory.
    pub fn open(cfg: &crate::config::Loaded) -> Result<Option<Self>, KeyError> {
        let Some(e) = &cfg.config.front.eat else {
            return Ok(None);
        };
        let keys = match &e.keys_file {
            Some(f) => CatalogKeys::load(f)?,
            None => CatalogKeys::load_or_create(&cfg.config.state_dir)?,
        };
        tracing::info!("eat_keys kid={}", keys.current().kid());
        Ok(Some(Publisher::new(keys)))
    }

    pub fn keys(&self) -> &CatalogKeys {
        &self.keys
    }

    /// The signature of the catalog hashing to `hash`: the one made before while more than
    /// half of its life is left, else a new one (`iat` now, `exp` after `ttl`).
    fn signature(&self, hash: &str, p: &Publication, now: u64) -> Signed {
        let ttl = p.signature_ttl_s;
        let mut cache = self.signatures.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = cache.get(hash) {
            if s.exp > now + ttl / 2 {
                return s.clone();
            }
        }
        let payload = json!({"iss": p.did, "iat": now, "exp": now + ttl, "catalog_hash": hash});
        let signed = Signed {
            jws: self.keys.sign(&payload).into(),
            exp: now + ttl,
        };
        if cache.len() >= MAX_SIGNATURES {
            cache.clear();
        }
        cache.insert(hash.to_owned(), signed.clone());
        signed
    }
}

/// Which documents a layer serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Documents {
    /// The JWKS and the did:web document.
    Keys,
    /// The catalog and the OpenAPI documents, per caller.
    Catalog,
}

/// Adds [`EatDocuments`] to a stack.
#[derive(Clone)]
pub struct EatLayer {
    publisher: Arc<Publisher>,
    publication: Arc<Publication>,
    catalog: Option<Arc<CatalogHandle>>,
    clock: UnixClock,
    documents: Documents,
}

impl EatLayer {
    /// The public keys, for anyone.
    pub fn keys(
        publisher: Arc<Publisher>,
        publication: Arc<Publication>,
        clock: UnixClock,
    ) -> Self {
        EatLayer {
            publisher,
            publication,
            catalog: None,
            clock,
            documents: Documents::Keys,
        }
    }

    /// The catalog and the OpenAPI documents, after identity.
    pub fn catalog(
        publisher: Arc<Publisher>,
        publication: Arc<Publication>,
        catalog: Arc<CatalogHandle>,
        clock: UnixClock,
    ) -> Self {
        EatLayer {
            publisher,
            publication,
            catalog: Some(catalog),
            clock,
            documents: Documents::Catalog,
        }
    }
}

impl<S> tower::Layer<S> for EatLayer {
    type Service = EatDocuments<S>;
    fn layer(&self, inner: S) -> Self::Service {
        EatDocuments {
            inner,
            layer: self.clone(),
        }
    }
}

/// Serves the EAT documents; every other request goes on to `inner`.
#[derive(Clone)]
pub struct EatDocuments<S> {
    inner: S,
    layer: EatLayer,
}

impl<S> Service<Request<CallerBody>> for EatDocuments<S>
where
    S: Service<Request<CallerBody>, Response = Resp, Error = Rejection> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Resp;
    type Error = Rejection;
    type Future = BoxFuture<Result<Resp, Rejection>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<CallerBody>) -> Self::Future {
        let path = req.uri().path();
        let ours = match self.layer.documents {
            Documents::Keys => path == JWKS_PATH || path == DID_PATH,
            Documents::Catalog => path == CATALOG_PATH || path.starts_with(SPEC_PREFIX),
        };
        if !ours {
            let clone = self.inner.clone();
            let mut inner = std::mem::replace(&mut self.inner, clone);
            return Box::pin(async move { inner.call(req).await });
        }
        let answer = self.layer.answer(&req);
        Box::pin(async move { answer })
    }
}

/// A document to send: its bytes, how long it may be cached, and headers beside.
struct Document {
    body: Bytes,
    max_age: u64,
    private: bool,
    signature: Option<Arc<str>>,
}

impl EatLayer {
    fn answer<B>(&self, req: &Request<B>) -> Result<Resp, Rejection> {
        if req.method() != Method::GET {
            return Err(Rejection::MethodNotAllowed(format!(
                "{} {}: only GET",
                req.method(),
                req.uri().path()
            )));
        }
        let p = &self.publication;
        let now = (self.clock)() / 1000;
        let path = req.uri().path();
        let doc = match path {
            JWKS_PATH => self.public(self.publisher.keys().jwks()),
            DID_PATH => self.public(p.did_document(&self.publisher.keys().jwks())),
            CATALOG_PATH => {
                let tools = self.visible(req)?;
                let version = self.catalog_handle().load().version.clone();
                let body = p.catalog(&tools, version.as_deref());
                let hash = sha256_tag(body.as_bytes());
                let signed = self.publisher.signature(&hash, p, now);
                Document {
                    body: Bytes::from(body),
                    max_age: p.max_age_s.min(signed.exp.saturating_sub(now)),
                    private: true,
                    signature: Some(signed.jws),
                }
            }
            _ => {
                let not_found = || Rejection::NoRoute(path.to_owned());
                let eat_name = path
                    .strip_prefix(SPEC_PREFIX)
                    .and_then(|r| r.strip_suffix(SPEC_SUFFIX))
                    .ok_or_else(not_found)?;
                let name = names::decode(eat_name).ok_or_else(not_found)?;
                let tool = self
                    .visible(req)?
                    .into_iter()
                    .find(|t| t.name == name)
                    .ok_or_else(not_found)?;
                let version = self.catalog_handle().load().version.clone();
                let version = version.filter(|v| super::documents::is_semver(v));
                let body = p.spec(&tool, version.as_deref()).map_err(|_| not_found())?;
                Document {
                    body: Bytes::from(body),
                    max_age: p.max_age_s,
                    private: true,
                    signature: None,
                }
            }
        };
        Ok(respond(req, doc))
    }

    fn public(&self, doc: serde_json::Value) -> Document {
        Document {
            body: Bytes::from(doc.to_string()),
            max_age: self.publication.max_age_s,
            private: false,
            signature: None,
        }
    }

    fn catalog_handle(&self) -> &CatalogHandle {
        self.catalog.as_deref().expect("the catalog layer has it")
    }

    /// The tools the caller may call, in name order.
    fn visible<B>(
        &self,
        req: &Request<B>,
    ) -> Result<Vec<Arc<carapace_filters::call::ToolSpec>>, Rejection> {
        let principal = crate::front::principal(req)?;
        let catalog = self.catalog_handle().load();
        Ok(crate::front::visible_tools(
            &catalog,
            &principal,
            (self.clock)(),
        ))
    }
}

/// The answer: 304 when `If-None-Match` names this ETag, else the document.
fn respond<B>(req: &Request<B>, doc: Document) -> Resp {
    let mut tag = sha2::Sha256::new();
    tag.update(&doc.body);
    if let Some(s) = &doc.signature {
        tag.update(b"\n");
        tag.update(s.as_bytes());
    }
    let etag = format!("\"{}\"", &hex::encode(tag.finalize())[..32]);
    let cache = format!(
        "{}, max-age={}",
        if doc.private { "private" } else { "public" },
        doc.max_age
    );
    let fresh = req
        .headers()
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim())
        .any(|t| t == "*" || t.trim_start_matches("W/") == etag);
    let (status, body) = if fresh {
        (StatusCode::NOT_MODIFIED, Bytes::new())
    } else {
        (StatusCode::OK, doc.body)
    };
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::ETAG, HeaderValue::from_str(&etag).expect("hex"));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_str(&cache).expect("ascii"),
    );
    // Per caller: a shared cache must not give one caller's catalog to another.
    if doc.private {
        h.insert(header::VARY, HeaderValue::from_static("authorization"));
    }
    if status == StatusCode::OK {
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    if let Some(s) = doc.signature {
        if let Ok(v) = HeaderValue::from_str(&s) {
            h.insert(SIGNATURE_HEADER, v);
        }
    }
    resp
}

#[cfg(test)]
mod tests;
