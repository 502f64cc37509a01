use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use http_body_util::Full;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair};
use serde_json::{json, Value};
use tower::ServiceExt;

use super::*;
use crate::identity::PeerCertificate;

const ISSUER: &str = "https://auth.test";
const RESOURCE: &str = "https://tools.test/mcp";
const NOW_S: u64 = 1_800_000_000;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

struct Signer {
    key: EncodingKey,
    alg: jsonwebtoken::Algorithm,
    jwk: Jwk,
}

fn es256(kid: &str) -> Signer {
    let rng = SystemRandom::new();
    let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
    let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
    let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
    let public = pair.public_key().as_ref();
    let jwk = json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
        "x": b64(&public[1..33]), "y": b64(&public[33..65])});
    Signer {
        key: EncodingKey::from_ec_der(pkcs8.as_ref()),
        alg: jsonwebtoken::Algorithm::ES256,
        jwk: serde_json::from_value(jwk).unwrap(),
    }
}

fn ed25519(kid: &str) -> Signer {
    let pkcs8 = signature::Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let pair = signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let jwk = json!({"kty": "OKP", "crv": "Ed25519", "kid": kid,
        "x": b64(pair.public_key().as_ref())});
    Signer {
        key: EncodingKey::from_ed_der(pkcs8.as_ref()),
        alg: jsonwebtoken::Algorithm::EdDSA,
        jwk: serde_json::from_value(jwk).unwrap(),
    }
}

fn claims() -> Value {
    json!({"iss": ISSUER, "aud": RESOURCE, "sub": "alice", "exp": NOW_S + 300,
        "iat": NOW_S - 10, "scope": "tools:read"})
}

impl Signer {
    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = self.jwk.common.key_id.clone();
        jsonwebtoken::encode(&header, claims, &self.key).unwrap()
    }
}

/// Counts refreshes; serves `later` once refreshed.
struct Rotating {
    now: Arc<JwkSet>,
    later: Arc<JwkSet>,
    refreshed: AtomicUsize,
}

impl KeySource for Rotating {
    fn keys(&self) -> Arc<JwkSet> {
        if self.refreshed.load(Ordering::SeqCst) > 0 {
            self.later.clone()
        } else {
            self.now.clone()
        }
    }
    fn refresh(&self) -> BoxFuture<Arc<JwkSet>> {
        self.refreshed.fetch_add(1, Ordering::SeqCst);
        let keys = self.later.clone();
        Box::pin(async move { keys })
    }
}

fn policy() -> BearerPolicy {
    let mut grants = std::collections::BTreeMap::new();
    grants.insert(
        "tools:read".to_string(),
        vec!["tool.call:search".to_string()],
    );
    grants.insert("tools".to_string(), vec!["tool.call:*".to_string()]);
    BearerPolicy {
        rules: TokenRules {
            issuer: ISSUER.into(),
            audiences: vec![RESOURCE.into()],
            skew: Duration::from_secs(30),
        },
        scopes: ScopeMap::new(grants),
        challenge_scope: Some("tools:read".into()),
        resource_metadata: "https://tools.test/.well-known/oauth-protected-resource/mcp".into(),
        metadata_paths: vec!["/.well-known/oauth-protected-resource/mcp".into()],
        metadata: Bytes::from_static(br#"{"resource":"https://tools.test/mcp"}"#),
    }
}

/// What reached the inner service: its headers and principal.
type Seen = (http::HeaderMap, Option<Arc<Principal>>);

async fn send(
    keys: Arc<dyn KeySource>,
    identity: ConnectionIdentity,
    path: &str,
    token: Option<&str>,
) -> Result<Response<Full<Bytes>>, Rejection> {
    let clock: UnixClock = Arc::new(|| NOW_S * 1000);
    let svc = BearerLayer::new(policy(), keys, clock).layer(tower::service_fn(
        |req: Request<()>| async move {
            let seen: Seen = (
                req.headers().clone(),
                req.extensions().get::<Arc<Principal>>().cloned(),
            );
            let mut r = Response::new(Full::new(Bytes::from_static(b"app")));
            r.extensions_mut().insert(Arc::new(seen));
            Ok::<_, Rejection>(r)
        },
    ));
    let mut req = Request::get(path);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let mut req = req.body(()).unwrap();
    req.extensions_mut().insert(identity);
    svc.oneshot(req).await
}

fn anonymous() -> ConnectionIdentity {
    ConnectionIdentity::Anonymous { remote_ip: None }
}

fn keys(signers: &[&Signer]) -> Arc<dyn KeySource> {
    Arc::new(StaticKeys(Arc::new(JwkSet {
        keys: signers.iter().map(|s| s.jwk.clone()).collect(),
    })))
}

fn seen(r: &Response<Full<Bytes>>) -> Arc<Seen> {
    r.extensions()
        .get::<Arc<Seen>>()
        .cloned()
        .expect("reached the app")
}

fn challenge_of(r: &Rejection) -> challenge::ParsedChallenge {
    let c = r.challenge().expect("a challenge");
    challenge::parse(c).unwrap().remove(0)
}

#[tokio::test]
async fn a_valid_token_becomes_the_principal_and_never_reaches_the_app() {
    for signer in [es256("k1"), ed25519("k2")] {
        let token = signer.sign(&claims());
        let r = send(keys(&[&signer]), anonymous(), "/mcp", Some(&token))
            .await
            .unwrap();
        let seen = seen(&r);
        assert!(
            seen.0.get("authorization").is_none(),
            "the token is removed"
        );
        let p = seen.1.as_ref().unwrap();
        assert_eq!((&*p.id, p.kind.as_str()), ("oauth:alice", "oauth"));
        let perms = p.permissions.as_ref().unwrap();
        assert!(perms.may_call("search", 0));
        assert!(!perms.may_call("delete", 0));
        match perms.refusal(&p.id, "tool.call:delete") {
            Rejection::InsufficientScope { challenge, .. } => {
                let c = challenge::parse(&challenge).unwrap().remove(0);
                assert_eq!(c.param("error"), Some("insufficient_scope"));
                assert_eq!(c.param("scope"), Some("tools"));
                assert!(c.param("resource_metadata").is_some());
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn no_token_is_a_challenge_naming_the_metadata() {
    let k = es256("k1");
    let e = send(keys(&[&k]), anonymous(), "/mcp", None)
        .await
        .unwrap_err();
    let c = challenge_of(&e);
    assert_eq!(c.scheme, "Bearer");
    assert_eq!(
        c.param("error"),
        None,
        "RFC 6750 3.1: no error without a token"
    );
    assert_eq!(c.param("scope"), Some("tools:read"));
    assert_eq!(
        c.param("resource_metadata"),
        Some("https://tools.test/.well-known/oauth-protected-resource/mcp")
    );
    // The metadata itself needs no token.
    let r = send(
        keys(&[&k]),
        anonymous(),
        "/.well-known/oauth-protected-resource/mcp",
        None,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.extensions().get::<Arc<Seen>>().is_none(), "answered here");
}

#[tokio::test]
async fn bad_tokens_are_refused_with_invalid_token() {
    let k = es256("k1");
    let other = es256("k1");
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = claims();
        f(&mut c);
        k.sign(&c)
    };
    let header = |h: Value| b64(h.to_string().as_bytes());
    let body = b64(claims().to_string().as_bytes());
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "wrong aud",
            with(&|c| c["aud"] = json!("https://other.test/mcp")),
            "not issued for this resource",
        ),
        (
            "aud list",
            with(&|c| c["aud"] = json!(["a", "b"])),
            "not issued for this resource",
        ),
        (
            "no aud",
            with(&|c| {
                c.as_object_mut().unwrap().remove("aud");
            }),
            "aud",
        ),
        (
            "expired",
            with(&|c| c["exp"] = json!(NOW_S - 31)),
            "expired",
        ),
        (
            "no exp",
            with(&|c| {
                c.as_object_mut().unwrap().remove("exp");
            }),
            "exp",
        ),
        (
            "not yet",
            with(&|c| c["nbf"] = json!(NOW_S + 60)),
            "not valid yet",
        ),
        (
            "issuer",
            with(&|c| c["iss"] = json!("https://evil.test")),
            "another issuer",
        ),
        ("unknown key", other.sign(&claims()), "does not verify"),
        (
            "alg none",
            format!("{}.{body}.", header(json!({"alg": "none"}))),
            "algorithm",
        ),
        (
            "HS256 with the public key as secret",
            jsonwebtoken::encode(
                &Header::new(jsonwebtoken::Algorithm::HS256),
                &claims(),
                &EncodingKey::from_secret(serde_json::to_string(&k.jwk).unwrap().as_bytes()),
            )
            .unwrap(),
            "algorithm",
        ),
        ("not a JWT", "abc".into(), "not a JWT"),
        (
            "crit",
            format!(
                "{}.{body}.x",
                header(json!({"alg": "ES256", "crit": ["exp"]}))
            ),
            "not a JWT",
        ),
    ];
    for (name, token, says) in cases {
        let e = send(keys(&[&k]), anonymous(), "/mcp", Some(&token))
            .await
            .unwrap_err();
        let c = challenge_of(&e);
        assert_eq!(c.param("error"), Some("invalid_token"), "{name}");
        let d = c.param("error_description").unwrap();
        assert!(d.contains(says), "{name}: {d}");
        assert!(!d.contains(&token), "{name}: the token is never echoed");
    }
    // Within the skew, an expired token still passes.
    let token = with(&|c| c["exp"] = json!(NOW_S - 29));
    assert!(send(keys(&[&k]), anonymous(), "/mcp", Some(&token))
        .await
        .is_ok());
}

#[tokio::test]
async fn an_unknown_kid_refreshes_the_keys_once() {
    let old = es256("old");
    let new = es256("new");
    let source = Arc::new(Rotating {
        now: Arc::new(JwkSet {
            keys: vec![old.jwk.clone()],
        }),
        later: Arc::new(JwkSet {
            keys: vec![new.jwk.clone()],
        }),
        refreshed: AtomicUsize::new(0),
    });
    let r = send(
        source.clone(),
        anonymous(),
        "/mcp",
        Some(&old.sign(&claims())),
    )
    .await;
    assert!(r.is_ok());
    assert_eq!(
        source.refreshed.load(Ordering::SeqCst),
        0,
        "a known kid fetches nothing"
    );
    let r = send(
        source.clone(),
        anonymous(),
        "/mcp",
        Some(&new.sign(&claims())),
    )
    .await;
    assert!(r.is_ok(), "the rotated key is found after one refresh");
    assert_eq!(source.refreshed.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn paired_peers_keep_their_identity_and_lose_the_header() {
    let k = es256("k1");
    let cert = ConnectionIdentity::Certificate(Arc::new(PeerCertificate {
        fingerprint: "sha256:aa".into(),
        gateway_id: None,
        ca_fingerprint: None,
    }));
    let r = send(keys(&[&k]), cert, "/mcp", Some("whatever"))
        .await
        .unwrap();
    let seen = seen(&r);
    assert!(seen.0.get("authorization").is_none());
    assert!(
        seen.1.is_none(),
        "the identity layer's principal is left alone"
    );
    let r = send(keys(&[&k]), ConnectionIdentity::Local, "/mcp", None).await;
    assert!(r.is_ok(), "the local socket needs no token");
}
