use std::sync::Mutex;

use base64::Engine;
use ring::signature::KeyPair;
use tower::ServiceExt;

use super::*;
use crate::identity::PeerCertificate;
use crate::nonce::{NonceStore, NonceStoreConfig};

const NOW_S: u64 = 1_800_000_000;
const SECRET: &[u8] = b"a shared secret of at least thirty-two bytes";

struct Keys {
    peer: ring::signature::Ed25519KeyPair,
}

fn principal(id: &str) -> Arc<Principal> {
    Arc::new(Principal {
        id: id.into(),
        kind: "gateway".into(),
        fingerprint: None,
        remote_ip: None,
        permissions: None,
        identity_values: Default::default(),
    })
}

impl SignatureKeys for Keys {
    fn key(&self, keyid: &str) -> Option<SignerKey> {
        match keyid {
            "k1" => Some(SignerKey {
                key: VerifyKey::hmac_sha256(SECRET),
                principal: None,
            }),
            "gw_east" => Some(SignerKey {
                key: VerifyKey::Ed25519(self.peer.public_key().as_ref().to_vec()),
                principal: Some(principal("gw_east")),
            }),
            _ => None,
        }
    }
}

fn keys() -> Arc<Keys> {
    let pkcs8 =
        ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
    Arc::new(Keys {
        peer: ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap(),
    })
}

/// A request signed as a client would: `keyid`, `created`, `nonce`, over `components`.
fn signed(
    keys: &Keys,
    keyid: &str,
    created: u64,
    nonce: &str,
    body: &str,
    components: &[&str],
) -> Request<Bytes> {
    let mut req = Request::post("/v1/tools/call")
        .header("host", "tools.test:8443")
        .header("content-type", "application/json")
        .header("content-digest", content_digest(body.as_bytes()))
        .body(Bytes::from(body.to_owned()))
        .unwrap();
    let list = components
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(" ");
    let params = format!("({list});created={created};keyid=\"{keyid}\";nonce=\"{nonce}\"");
    let sig = MessageSignature {
        label: "sig1".into(),
        components: components.iter().map(|c| c.to_string()).collect(),
        keyid: keyid.into(),
        created: created as i64,
        nonce: nonce.into(),
        alg: None,
        expires: None,
        params: params.clone(),
        signature: vec![],
    };
    let view = RequestView {
        method: req.method(),
        scheme: "https",
        uri: req.uri(),
        headers: req.headers(),
    };
    let base = message::signature_base(&sig, &view).unwrap();
    let bytes = match keyid {
        "gw_east" => keys.peer.sign(base.as_bytes()).as_ref().to_vec(),
        _ => ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET),
            base.as_bytes(),
        )
        .as_ref()
        .to_vec(),
    };
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    let h = req.headers_mut();
    h.insert("signature-input", format!("sig1={params}").parse().unwrap());
    h.insert("signature", format!("sig1=:{b64}:").parse().unwrap());
    req
}

const ALL: [&str; 3] = ["@method", "@target-uri", "content-digest"];

struct Harness {
    svc: tower::util::BoxCloneService<Request<Bytes>, Option<Arc<Principal>>, Rejection>,
    seen: Arc<Mutex<usize>>,
}

fn harness(keys: Arc<Keys>) -> Harness {
    let seen = Arc::new(Mutex::new(0));
    let counter = seen.clone();
    let policy = HttpSignaturePolicy {
        skew: Duration::from_secs(120),
        scheme: "https",
        authorities: vec!["tools.test:8443".into()],
        replay: ReplayGuard::Local(Arc::new(
            NonceStore::open(
                NonceStoreConfig {
                    capacity: 100,
                    ttl: Duration::from_secs(300),
                    journal: None,
                },
                NOW_S * 1000,
            )
            .unwrap(),
        )),
    };
    let clock: UnixClock = Arc::new(|| NOW_S * 1000);
    let svc = HttpSignatureLayer::new(keys, policy, clock).layer(tower::service_fn(
        move |req: Request<Bytes>| {
            *counter.lock().unwrap() += 1;
            let p = req.extensions().get::<Arc<Principal>>().cloned();
            async move { Ok::<_, Rejection>(p) }
        },
    ));
    Harness {
        svc: tower::util::BoxCloneService::new(svc),
        seen,
    }
}

async fn send(
    h: &Harness,
    mut req: Request<Bytes>,
    identity: ConnectionIdentity,
) -> Result<Option<Arc<Principal>>, Rejection> {
    req.extensions_mut().insert(identity);
    if let ConnectionIdentity::Certificate(_) =
        req.extensions().get::<ConnectionIdentity>().unwrap()
    {
        req.extensions_mut().insert(principal("gw_test"));
    }
    h.svc.clone().oneshot(req).await
}

fn anon() -> ConnectionIdentity {
    ConnectionIdentity::Anonymous { remote_ip: None }
}

fn cert() -> ConnectionIdentity {
    ConnectionIdentity::Certificate(Arc::new(PeerCertificate {
        fingerprint: "sha256:aa".into(),
        gateway_id: None,
        ca_fingerprint: None,
    }))
}

fn text(r: Result<Option<Arc<Principal>>, Rejection>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn a_good_signature_passes_once() {
    let k = keys();
    let h = harness(k.clone());
    let req = || signed(&k, "k1", NOW_S - 5, "n-1", r#"{"a":1}"#, &ALL);
    assert_eq!(text(send(&h, req(), anon()).await), "ok");
    assert_eq!(text(send(&h, req(), anon()).await), "nonce already used");
    assert_eq!(*h.seen.lock().unwrap(), 1);
}

#[tokio::test]
async fn every_tampering_is_refused_before_the_app() {
    let k = keys();
    let h = harness(k.clone());
    let body = r#"{"a":1}"#;
    let mut header = signed(
        &k,
        "k1",
        NOW_S,
        "n-2",
        body,
        &["@method", "@target-uri", "content-digest", "content-type"],
    );
    header
        .headers_mut()
        .insert("content-type", "text/plain".parse().unwrap());
    let mut changed_body = signed(&k, "k1", NOW_S, "n-3", body, &ALL);
    *changed_body.body_mut() = Bytes::from_static(br#"{"a":2}"#);
    let mut both = signed(&k, "k1", NOW_S, "n-4", body, &ALL);
    *both.body_mut() = Bytes::from_static(br#"{"a":2}"#);
    both.headers_mut().insert(
        "content-digest",
        content_digest(br#"{"a":2}"#).parse().unwrap(),
    );
    let mut target = signed(&k, "k1", NOW_S, "n-5", body, &ALL);
    *target.uri_mut() = "/v1/tools/other".parse().unwrap();
    let cases = [
        (header, "the signature does not verify"),
        (
            changed_body,
            "content-digest is missing, of no known algorithm, or does not match the body",
        ),
        (both, "the signature does not verify"),
        (target, "the signature does not verify"),
        (
            signed(&k, "k1", NOW_S - 121, "n-6", body, &ALL),
            "timestamp outside the ±120 s window",
        ),
        (
            signed(&k, "k1", NOW_S + 121, "n-7", body, &ALL),
            "timestamp outside the ±120 s window",
        ),
        (
            signed(&k, "nobody", NOW_S, "n-8", body, &ALL),
            "unknown keyid",
        ),
        (
            signed(&k, "k1", NOW_S, "n-9", body, &["@method", "@target-uri"]),
            "no signature covers @method, @target-uri and content-digest",
        ),
        (
            signed(&k, "k1", NOW_S, "", body, &ALL),
            "the nonce must be 1 to 128 characters",
        ),
        (
            Request::post("/x").body(Bytes::new()).unwrap(),
            "no Signature-Input and Signature headers",
        ),
    ];
    for (req, says) in cases {
        let got = text(send(&h, req, anon()).await);
        assert!(got.ends_with(says), "{got} / {says}");
    }
    assert_eq!(*h.seen.lock().unwrap(), 0, "nothing reached the app");
    // A refused request burned no nonce: the same nonce still works once signed properly.
    assert_eq!(
        text(send(&h, signed(&k, "k1", NOW_S, "n-6", body, &ALL), anon()).await),
        "ok"
    );
}

#[tokio::test]
async fn a_peer_key_names_the_peer_and_only_that_peer() {
    let k = keys();
    let h = harness(k.clone());
    let p = send(&h, signed(&k, "gw_east", NOW_S, "p-1", "{}", &ALL), anon())
        .await
        .unwrap();
    assert_eq!(
        &*p.unwrap().id,
        "gw_east",
        "an anonymous connection becomes the signing peer"
    );
    let r = send(&h, signed(&k, "gw_east", NOW_S, "p-2", "{}", &ALL), cert()).await;
    assert_eq!(
        text(r),
        "authentication failed: the signature is by another peer than the connection's"
    );
    let p = send(&h, signed(&k, "k1", NOW_S, "p-3", "{}", &ALL), cert())
        .await
        .unwrap();
    assert_eq!(
        &*p.unwrap().id,
        "gw_test",
        "a shared key keeps the connection's peer"
    );
    let local = Request::post("/x").body(Bytes::new()).unwrap();
    assert_eq!(
        text(send(&h, local, ConnectionIdentity::Local).await),
        "ok",
        "the local socket signs nothing"
    );
}

/// The signed request of the README, made by PyPI `http-message-signatures` 3.0.0.
#[test]
fn the_readme_example_from_an_independent_signer_verifies() {
    let body = br#"{"version":"v1","call_id":"c-1","tool_name":"memory.query","tenant_id":"t","args":{"query":"x"}}"#;
    let input = r#"sig1=("@method" "@target-uri" "content-digest");created=1795000000;keyid="k1";alg="hmac-sha256";nonce="6f1c2a9e4b7d8a03""#;
    let signature = "sig1=:VUc4rmyI6M/PTsRr7pSzaQTDfs4dS9riyh0rbUGYXr8=:";
    let digest = "sha-256=:wf7ChwqwWCzLc6rQp0MuixbV8exg6lt0wARDLV5JEd0=:";
    assert_eq!(message::check_content_digest(digest, body), Ok(()));
    let mut headers = http::HeaderMap::new();
    headers.insert("host", "tools.example.com:8443".parse().unwrap());
    headers.insert("content-digest", digest.parse().unwrap());
    let uri: http::Uri = "/v1/tools/call".parse().unwrap();
    let view = RequestView {
        method: &http::Method::POST,
        scheme: "https",
        uri: &uri,
        headers: &headers,
    };
    let sig = message::parse(input, signature).unwrap().remove(0);
    let base = message::signature_base(&sig, &view).unwrap();
    let key = VerifyKey::hmac_sha256(SECRET);
    assert!(key.verifies(base.as_bytes(), &sig.signature), "{base}");
    assert!(!key.verifies(base.replace("POST", "PUT").as_bytes(), &sig.signature));
}

struct PeerSigner(ring::signature::Ed25519KeyPair);

impl MessageSigner for PeerSigner {
    fn keyid(&self) -> &str {
        "gw_east"
    }
    fn alg(&self) -> &'static str {
        "ed25519"
    }
    fn sign(&self, base: &[u8]) -> Vec<u8> {
        self.0.sign(base).as_ref().to_vec()
    }
}

#[tokio::test]
async fn what_sign_request_signs_the_layer_accepts() {
    let pkcs8 =
        ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
    let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let k = Arc::new(Keys {
        peer: ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap(),
    });
    let h = harness(k);
    let signer = PeerSigner(pair);
    let body = Bytes::from_static(br#"{"x":1}"#);
    let mut req = Request::post("http://tools.test:8443/v1/tools/call")
        .body(body.clone())
        .unwrap();
    sign_request(&mut req, &body, "https", &signer, NOW_S, "s-1");
    let p = send(&h, req, anon()).await.unwrap();
    assert_eq!(&*p.unwrap().id, "gw_east");
    let mut get = Request::get("http://tools.test:8443/v1/tools")
        .body(Bytes::new())
        .unwrap();
    sign_request(&mut get, b"", "https", &signer, NOW_S, "s-2");
    assert!(
        get.headers().get("content-digest").is_none(),
        "no body, no digest"
    );
    assert!(send(&h, get, anon()).await.is_ok());
}

#[tokio::test]
async fn the_host_and_the_session_are_part_of_what_is_signed() {
    let k = keys();
    let h = harness(k.clone());
    let mut other = signed(&k, "k1", NOW_S, "h-1", "{}", &ALL);
    other
        .headers_mut()
        .insert("host", "elsewhere.test:8443".parse().unwrap());
    // Re-signed for the other host: the signature holds, the host is not this one.
    let mut elsewhere = Request::post("/v1/tools/call")
        .header("host", "elsewhere.test:8443")
        .body(Bytes::from_static(b"{}"))
        .unwrap();
    sign_request(&mut elsewhere, b"{}", "https", &HmacK1, NOW_S, "h-2");
    let mut session = signed(&k, "k1", NOW_S, "h-3", "{}", &ALL);
    session
        .headers_mut()
        .insert("mcp-session-id", "s-1".parse().unwrap());
    for (req, says) in [
        (other, "the signature does not verify"),
        (elsewhere, "the signed request names another host"),
        (
            session,
            "no signature covers @method, @target-uri and content-digest",
        ),
    ] {
        let got = text(send(&h, req, anon()).await);
        assert!(got.ends_with(says), "{got} / {says}");
    }
    let p = send(&h, signed(&k, "k1", NOW_S, "h-4", "{}", &ALL), anon())
        .await
        .unwrap();
    assert_eq!(
        &*p.unwrap().id,
        "signed:k1",
        "a shared key's holder is named by the key"
    );
}

struct HmacK1;

impl MessageSigner for HmacK1 {
    fn keyid(&self) -> &str {
        "k1"
    }
    fn alg(&self) -> &'static str {
        "hmac-sha256"
    }
    fn sign(&self, base: &[u8]) -> Vec<u8> {
        ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET), base)
            .as_ref()
            .to_vec()
    }
}
