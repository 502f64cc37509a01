//! The verification order and the tampering matrix, against documents carapace's own
//! publisher made, served from memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use carapace_filters::call::ToolSpec;
use carapace_filters::schema::CompiledSchema;
use serde_json::json;

use super::*;
use crate::config::eat::EatToolConfig;
use crate::eat::documents::{Publication, CATALOG_PATH};
use crate::eat::keys::CatalogKeys;

const ORIGIN: &str = "https://tools.test";
const NOW: u64 = 1_800_000_000;

/// Documents by path; a missing path answers 404.
#[derive(Default, Clone)]
struct Host {
    docs: Arc<Mutex<HashMap<String, Fetched>>>,
    asked: Arc<Mutex<Vec<String>>>,
}

impl Host {
    fn put(&self, path: &str, status: u16, headers: &[(&str, &str)], body: impl Into<Bytes>) {
        let mut h = http::HeaderMap::new();
        for (k, v) in headers {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let f = Fetched {
            status,
            headers: h,
            body: body.into(),
        };
        self.docs.lock().unwrap().insert(path.into(), f);
    }
    fn body(&self, path: &str) -> Vec<u8> {
        self.docs.lock().unwrap()[path].body.to_vec()
    }
    fn header(&self, path: &str, name: &str) -> String {
        self.docs.lock().unwrap()[path].headers[name]
            .to_str()
            .unwrap()
            .to_owned()
    }
    fn set_header(&self, path: &str, name: &'static str, value: &str) {
        let mut docs = self.docs.lock().unwrap();
        let d = docs.get_mut(path).unwrap();
        d.headers.insert(name, value.parse().unwrap());
    }
}

impl Fetch for Host {
    async fn get(&self, path: &str, inm: Option<&str>) -> Result<Fetched, DiscoveryError> {
        self.asked.lock().unwrap().push(path.to_owned());
        let doc = self.docs.lock().unwrap().get(path).cloned();
        Ok(match doc {
            Some(d)
                if inm.is_some() && d.headers.get("etag").and_then(|e| e.to_str().ok()) == inm =>
            {
                Fetched {
                    status: 304,
                    headers: d.headers,
                    body: Bytes::new(),
                }
            }
            Some(d) => d,
            None => Fetched {
                status: 404,
                headers: http::HeaderMap::new(),
                body: Bytes::new(),
            },
        })
    }
}

fn tool(name: &str) -> Arc<ToolSpec> {
    Arc::new(ToolSpec {
        name: name.into(),
        app_name: None,
        definition: None,
        description: format!("{name} finds notes"),
        input: CompiledSchema::compile(json!({"type": "object", "required": ["query"]})).unwrap(),
        output: Some(CompiledSchema::compile(json!({"type": "object"})).unwrap()),
        timeout_ms_default: 1000,
        timeout_ms_max: 1000,
        idempotent: false,
        side_effects: false,
    })
}

struct Fixture {
    host: Host,
    keys: CatalogKeys,
    publication: Publication,
    _dir: tempfile::TempDir,
}

/// A host publishing `memory.query` (tagged `memory`) and `notes.delete` (untagged),
/// signed at NOW for an hour.
fn published() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let keys = CatalogKeys::load_or_create(dir.path()).unwrap();
    let mut tools = BTreeMap::new();
    tools.insert(
        "memory.query".to_string(),
        EatToolConfig {
            capabilities: vec!["memory".into()],
            examples: vec![],
        },
    );
    let publication = Publication {
        did: did_of(ORIGIN),
        origin: ORIGIN.into(),
        server_url: format!("{ORIGIN}/mcp"),
        title: None,
        description: None,
        tools,
        signature_ttl_s: 3600,
        max_age_s: 300,
    };
    let host = Host::default();
    let f = Fixture {
        host,
        keys,
        publication,
        _dir: dir,
    };
    f.publish(&[tool("memory.query"), tool("notes.delete")]);
    f
}

impl Fixture {
    fn publish(&self, tools: &[Arc<ToolSpec>]) {
        let p = &self.publication;
        let body = p.catalog(tools, None);
        let jws = self
            .keys
            .sign(&json!({"iss": p.did, "iat": NOW, "exp": NOW + 3600,
                                        "catalog_hash": sha256_tag(body.as_bytes())}));
        self.host.put(
            CATALOG_PATH,
            200,
            &[
                ("x-jws-signature", &jws),
                ("etag", "\"v1\""),
                ("cache-control", "private, max-age=300"),
            ],
            body,
        );
        for t in tools {
            let path = p
                .spec_url(&names::encode(&t.name))
                .strip_prefix(ORIGIN)
                .unwrap()
                .to_owned();
            self.host.put(&path, 200, &[], p.spec(t, None).unwrap());
        }
        let jwks = self.keys.jwks();
        self.host
            .put(DID_PATH, 200, &[], p.did_document(&jwks).to_string());
        self.host.put(JWKS_PATH, 200, &[], jwks.to_string());
    }

    /// Re-sign the catalog as served with `payload` changes and `header`.
    fn resign(&self, header: Option<Value>, claims: Value, keys: Option<&CatalogKeys>) {
        let body = self.host.body(CATALOG_PATH);
        let mut payload = json!({"iss": self.publication.did, "iat": NOW, "exp": NOW + 3600,
                                 "catalog_hash": sha256_tag(&body)});
        for (k, v) in claims.as_object().unwrap() {
            payload[k] = v.clone();
        }
        let mut jws = keys.unwrap_or(&self.keys).sign(&payload);
        if let Some(h) = header {
            let tail = jws.split_once('.').unwrap().1.to_owned();
            jws = format!("{}.{tail}", URL_SAFE_NO_PAD.encode(h.to_string()));
        }
        self.host.set_header(CATALOG_PATH, "x-jws-signature", &jws);
    }
}

fn request() -> Request {
    Request {
        origin: ORIGIN.into(),
        path: CATALOG_PATH.into(),
        allow_unsigned: false,
        capabilities: vec!["memory".into()],
        same_origin: true,
        skew_s: 60,
    }
}

async fn run(f: &Fixture) -> Result<Verified, DiscoveryError> {
    match discover(&f.host, &request(), None, NOW + 10).await? {
        Outcome::New(v) => Ok(v),
        Outcome::Unchanged { .. } => panic!("nothing was held"),
    }
}

#[tokio::test]
async fn a_genuine_catalog_gives_the_tools_with_the_capability() {
    let f = published();
    let v = run(&f).await.unwrap();
    assert_eq!(v.tools.len(), 1, "notes.delete has no `memory` tag");
    let t = &v.tools[0];
    assert_eq!(t.name, "memory.query");
    assert_eq!(t.server_url, "https://tools.test/mcp");
    assert_eq!(t.input["required"], json!(["query"]));
    assert_eq!(t.output, Some(json!({"type": "object"})));
    assert!(v.refused.is_empty());
    assert!(v.signed);
    assert_eq!(v.exp, NOW + 3600);
    assert_eq!(v.fresh_until, NOW + 10 + 300);
    assert_eq!(v.etag.as_deref(), Some("\"v1\""));
    // The key came from did.json; the JWKS was not needed.
    assert!(!f.host.asked.lock().unwrap().iter().any(|p| p == JWKS_PATH));

    // Revalidated with the ETag while the signature lasts.
    match discover(&f.host, &request(), Some(&v), NOW + 400)
        .await
        .unwrap()
    {
        Outcome::Unchanged { fresh_until } => assert_eq!(fresh_until, NOW + 700),
        Outcome::New(_) => panic!("expected 304"),
    }
    // Never past the signature: 304 cannot stretch it, and an expired one is not revalidated.
    match discover(&f.host, &request(), Some(&v), NOW + 3500)
        .await
        .unwrap()
    {
        Outcome::Unchanged { fresh_until } => assert_eq!(fresh_until, NOW + 3600),
        Outcome::New(_) => panic!("expected 304"),
    }
    assert_eq!(
        discover(&f.host, &request(), Some(&v), NOW + 3700)
            .await
            .unwrap_err(),
        DiscoveryError::Expired
    );
}

#[tokio::test]
async fn without_a_did_document_the_jwks_gives_the_key() {
    let f = published();
    f.host.docs.lock().unwrap().remove(DID_PATH);
    assert_eq!(run(&f).await.unwrap().tools.len(), 1);
    f.host.docs.lock().unwrap().remove(JWKS_PATH);
    assert!(matches!(
        run(&f).await,
        Err(DiscoveryError::KeysUnavailable(_))
    ));
}

#[tokio::test]
async fn every_tampering_is_refused_with_its_own_reason() {
    // A changed catalog byte.
    let f = published();
    let mut body = f.host.body(CATALOG_PATH);
    let at = body.windows(5).position(|w| w == b"finds").unwrap();
    body[at] = b'F';
    let jws = f.host.header(CATALOG_PATH, "x-jws-signature");
    f.host
        .put(CATALOG_PATH, 200, &[("x-jws-signature", &jws)], body);
    assert_eq!(run(&f).await.unwrap_err(), DiscoveryError::CatalogHash);

    // A changed OpenAPI byte: the tool is not taken.
    let f = published();
    let path = "/.well-known/api-catalog/tools/memory-2equery/openapi.json";
    let mut spec = f.host.body(path);
    let at = spec.windows(5).position(|w| w == b"finds").unwrap();
    spec[at] = b'F';
    f.host.put(path, 200, &[], spec);
    let v = run(&f).await.unwrap();
    assert!(v.tools.is_empty());
    assert_eq!(v.refused[0].0, "memory-2equery");
    assert!(v.refused[0].1.contains("spec_hash"), "{:?}", v.refused);

    // An expired signature, and one from the future.
    let f = published();
    f.resign(None, json!({"iat": NOW - 7200, "exp": NOW - 3600}), None);
    assert_eq!(run(&f).await.unwrap_err(), DiscoveryError::Expired);
    f.resign(None, json!({"iat": NOW + 3600, "exp": NOW + 7200}), None);
    assert_eq!(run(&f).await.unwrap_err(), DiscoveryError::NotYetValid);

    // Signed by a key the issuer does not publish.
    let f = published();
    let other_dir = tempfile::tempdir().unwrap();
    let other = CatalogKeys::load_or_create(other_dir.path()).unwrap();
    f.resign(None, json!({}), Some(&other));
    assert!(matches!(run(&f).await, Err(DiscoveryError::UnknownKey(_))));
    // ... or claiming the issuer's kid.
    let kid = f.keys.current().kid().to_owned();
    f.resign(
        Some(json!({"alg": "RS256", "typ": "JWS", "kid": kid})),
        json!({}),
        Some(&other),
    );
    assert_eq!(run(&f).await.unwrap_err(), DiscoveryError::BadSignature);

    // alg none (and HS256 keyed with the public key).
    for alg in ["none", "HS256"] {
        f.resign(
            Some(json!({"alg": alg, "typ": "JWS", "kid": kid})),
            json!({}),
            None,
        );
        assert_eq!(
            run(&f).await.unwrap_err(),
            DiscoveryError::AlgorithmRefused(alg.into())
        );
    }

    // A 1024-bit key under the issuer's kid.
    let f = published();
    let kid = f.keys.current().kid().to_owned();
    let weak = json!({"kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig",
                      "n": URL_SAFE_NO_PAD.encode([0xc5u8; 128]), "e": "AQAB"});
    let did = f.publication.did_document(&json!({"keys": [weak]}));
    f.host.put(DID_PATH, 200, &[], did.to_string());
    assert_eq!(run(&f).await.unwrap_err(), DiscoveryError::WeakKey(1024));

    // A did.json for another host.
    let f = published();
    let mut other_host = f.publication.clone();
    other_host.did = "did:web:evil.test".into();
    let did = other_host.did_document(&f.keys.jwks());
    f.host.put(DID_PATH, 200, &[], did.to_string());
    assert_eq!(
        run(&f).await.unwrap_err(),
        DiscoveryError::DidMismatch("did:web:evil.test".into())
    );

    // Signed by another issuer than the catalog's host.
    let f = published();
    f.resign(None, json!({"iss": "did:web:evil.test"}), None);
    assert!(matches!(
        run(&f).await,
        Err(DiscoveryError::IssuerMismatch(..))
    ));
}

#[tokio::test]
async fn unsigned_catalogs_only_when_allowed_and_http_errors_by_kind() {
    let f = published();
    f.host
        .docs
        .lock()
        .unwrap()
        .get_mut(CATALOG_PATH)
        .unwrap()
        .headers
        .remove("x-jws-signature");
    assert_eq!(run(&f).await.unwrap_err(), DiscoveryError::Unsigned);
    let mut allowed = request();
    allowed.allow_unsigned = true;
    match discover(&f.host, &allowed, None, NOW).await.unwrap() {
        Outcome::New(v) => {
            assert!(!v.signed);
            assert_eq!(v.tools.len(), 1);
            assert_eq!(v.exp, NOW + 300);
        }
        Outcome::Unchanged { .. } => panic!(),
    }

    for (status, want) in [
        (404, DiscoveryError::NotFound),
        (401, DiscoveryError::NeedsCredentials(401)),
        (403, DiscoveryError::NeedsCredentials(403)),
        (503, DiscoveryError::Status(503)),
    ] {
        f.host.put(CATALOG_PATH, status, &[], "");
        let e = run(&f).await.unwrap_err();
        assert_eq!(e, want);
        assert_eq!(e.transient(), status == 503);
    }
}

#[tokio::test]
async fn a_server_url_on_another_origin_is_refused_unless_allowed() {
    let mut f = published();
    f.publication.server_url = "https://elsewhere.test/mcp".into();
    f.publish(&[tool("memory.query")]);
    let v = run(&f).await.unwrap();
    assert!(v.tools.is_empty());
    assert!(v.refused[0].1.contains("origin"), "{:?}", v.refused);
    let mut open = request();
    open.same_origin = false;
    match discover(&f.host, &open, None, NOW).await.unwrap() {
        Outcome::New(v) => assert_eq!(v.tools[0].server_url, "https://elsewhere.test/mcp"),
        Outcome::Unchanged { .. } => panic!(),
    }
}

#[test]
fn origins_and_cache_headers() {
    assert_eq!(
        did_of("https://Tools.test:8443"),
        "did:web:tools.test%3A8443"
    );
    let u: http::Uri = "https://H.test:443/x".parse().unwrap();
    assert_eq!(origin_of(&u), "https://h.test");
    let mut h = http::HeaderMap::new();
    h.insert("cache-control", "private, max-age=120".parse().unwrap());
    assert_eq!(max_age(&h), 120);
    h.insert("cache-control", "no-cache, max-age=120".parse().unwrap());
    assert_eq!(max_age(&h), 0);
}

/// A host that fails `failures` times with 503 before serving `inner`.
struct Flaky {
    inner: Host,
    failures: Mutex<u32>,
}

impl Fetch for Flaky {
    async fn get(&self, path: &str, inm: Option<&str>) -> Result<Fetched, DiscoveryError> {
        {
            let mut left = self.failures.lock().unwrap();
            if path == CATALOG_PATH && *left > 0 {
                *left -= 1;
                return Ok(Fetched {
                    status: 503,
                    headers: http::HeaderMap::new(),
                    body: Bytes::new(),
                });
            }
        }
        self.inner.get(path, inm).await
    }
}

#[tokio::test(start_paused = true)]
async fn server_errors_are_retried_with_backoff_and_the_last_catalog_is_kept_meanwhile() {
    let f = published();
    let flaky = Flaky {
        inner: f.host.clone(),
        failures: Mutex::new(2),
    };
    let started = tokio::time::Instant::now();
    let v = match ask(&flaky, &request(), None, NOW).await.unwrap() {
        Outcome::New(v) => v,
        Outcome::Unchanged { .. } => panic!(),
    };
    // Two pauses: 250 ms and 500 ms, each with up to half again.
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(750)
            && waited <= std::time::Duration::from_millis(1125),
        "{waited:?}"
    );
    assert_eq!(v.tools.len(), 1);

    // A host that keeps failing: the verified catalog stays, until its signature expires.
    let mut held = Some(v);
    let down = Flaky {
        inner: f.host.clone(),
        failures: Mutex::new(100),
    };
    let result = ask(&down, &request(), held.as_ref(), NOW + 400).await;
    assert_eq!(result.as_ref().unwrap_err(), &DiscoveryError::Status(503));
    assert_eq!(*down.failures.lock().unwrap(), 97, "three tries");
    settle(&mut held, result, NOW + 400, "t", "u");
    assert!(held.is_some(), "kept");
    let result = ask(&down, &request(), held.as_ref(), NOW + 3600).await;
    settle(&mut held, result, NOW + 3600, "t", "u");
    assert!(held.is_none(), "not past its signature");

    // A 404 drops what was held at once, without retries.
    let mut held = Some(run(&f).await.unwrap());
    f.host.put(CATALOG_PATH, 404, &[], "");
    let asked = f.host.asked.lock().unwrap().len();
    let result = ask(&f.host, &request(), held.as_ref(), NOW + 400).await;
    assert_eq!(f.host.asked.lock().unwrap().len(), asked + 1);
    settle(&mut held, result, NOW + 400, "t", "u");
    assert!(held.is_none());
}

/// A catalog of more tools than are taken: the first are taken, the rest refused with the
/// reason, and no spec of a tool beyond is fetched.
#[tokio::test]
async fn a_catalog_gives_at_most_its_share_of_tools() {
    let f = published();
    let names: Vec<String> = (0..=MAX_TOOLS_PER_CATALOG)
        .map(|i| format!("t{i:05}"))
        .collect();
    let tools: Vec<Arc<ToolSpec>> = names.iter().map(|n| tool(n)).collect();
    f.publish(&tools);
    let mut every = request();
    every.capabilities = vec!["*".into()];
    let v = match discover(&f.host, &every, None, NOW + 10).await.unwrap() {
        Outcome::New(v) => v,
        Outcome::Unchanged { .. } => panic!("nothing was held"),
    };
    assert_eq!(v.tools.len(), MAX_TOOLS_PER_CATALOG);
    assert_eq!(v.refused.len(), 1, "{:?}", v.refused);
    assert!(v.refused[0].1.contains("beyond"), "{:?}", v.refused);
    let last = names.last().unwrap();
    assert!(!f
        .host
        .asked
        .lock()
        .unwrap()
        .iter()
        .any(|p| p.contains(last.as_str())));
}

/// A host that answers every document after `delay`.
struct Slow {
    inner: Host,
    delay: std::time::Duration,
}

impl Fetch for Slow {
    async fn get(&self, path: &str, inm: Option<&str>) -> Result<Fetched, DiscoveryError> {
        tokio::time::sleep(self.delay).await;
        self.inner.get(path, inm).await
    }
}

/// A host slow enough that the catalog, its keys and every spec take longer than the
/// deadline: the discovery ends there, as an unreachable host's, and keeps what was held.
#[tokio::test(start_paused = true)]
async fn a_discovery_is_given_its_deadline_as_a_whole() {
    let f = published();
    let names: Vec<String> = (0..10).map(|i| format!("t{i:02}")).collect();
    let tools: Vec<Arc<ToolSpec>> = names.iter().map(|n| tool(n)).collect();
    f.publish(&tools);
    let mut every = request();
    every.capabilities = vec!["*".into()];
    // Each document in 2 s: the dozen of them fit in 30 s.
    let brisk = Slow {
        inner: f.host.clone(),
        delay: std::time::Duration::from_secs(2),
    };
    let mut held = match ask(&brisk, &every, None, NOW + 10).await.unwrap() {
        Outcome::New(v) => Some(v),
        Outcome::Unchanged { .. } => panic!("nothing was held"),
    };
    assert_eq!(held.as_ref().unwrap().tools.len(), 10);
    // Each in 5 s: not.
    let slow = Slow {
        inner: f.host.clone(),
        delay: std::time::Duration::from_secs(5),
    };
    let started = tokio::time::Instant::now();
    let result = ask(&slow, &every, None, NOW + 20).await;
    assert_eq!(started.elapsed(), DISCOVERY_DEADLINE);
    assert_eq!(
        result.as_ref().unwrap_err(),
        &DiscoveryError::Unreachable("not discovered within 30 s".into())
    );
    settle(&mut held, result, NOW + 20, "t", "u");
    assert!(held.is_some(), "kept, as for an unreachable host");
}
