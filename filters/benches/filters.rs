//! Hot-path costs of the filters: canonical JSON + HMAC verification of a Skill Gateway v1
//! request, JSON-Schema validation with a precompiled validator, and the nonce store.

use std::hint::black_box;
use std::time::Duration;

use carapace_filters::canonical::{
    canonical_string, parse_strict, verify_hmac_sha256_hex, HmacSha256Key,
};
use carapace_filters::nonce::{NonceStore, NonceStoreConfig};
use carapace_filters::schema::CompiledSchema;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use serde_json::{json, Value};

const SECRET: &[u8] = b"demo-secret";

fn vector(id: &str) -> (Vec<u8>, String) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/vectors/vagus/canonical_hmac_vectors.json"
    );
    let all: Value = serde_json::from_slice(&std::fs::read(path).expect("vectors")).unwrap();
    let v = all["vectors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == id)
        .expect("vector id");
    (
        v["wire_body"].as_str().unwrap().as_bytes().to_vec(),
        v["signature_hex"].as_str().unwrap().to_string(),
    )
}

/// Parse the wire body, drop `signature`, canonicalize, verify: what the signature layer and
/// the skill-v1 front do per request.
fn verify_wire(body: &[u8]) -> bool {
    let mut v = parse_strict(body).unwrap();
    let sig = v
        .as_object_mut()
        .unwrap()
        .remove("signature")
        .and_then(|s| s.as_str().map(str::to_owned))
        .unwrap();
    let canonical = canonical_string(&v).unwrap();
    verify_hmac_sha256_hex(SECRET, canonical.as_bytes(), &sig)
}

fn signature(c: &mut Criterion) {
    let mut g = c.benchmark_group("canonical_hmac");
    for id in [
        "v01_basic_spec_example",
        "v04_arrays_of_objects",
        "v38_big_array",
    ] {
        let (body, _) = vector(id);
        assert!(verify_wire(&body));
        g.bench_function(
            format!("parse+canonical+verify/{id} ({} B)", body.len()),
            |b| b.iter(|| verify_wire(black_box(&body))),
        );
    }
    let (body, sig) = vector("v01_basic_spec_example");
    let mut v = parse_strict(&body).unwrap();
    v.as_object_mut().unwrap().remove("signature");
    g.bench_function("canonical only/v01", |b| {
        b.iter(|| canonical_string(black_box(&v)).unwrap())
    });
    let canonical = canonical_string(&v).unwrap();
    g.bench_function("hmac verify only/v01", |b| {
        b.iter(|| verify_hmac_sha256_hex(SECRET, black_box(canonical.as_bytes()), &sig))
    });
    // What the signature layer does: the key's pads were hashed when it was configured.
    let key = HmacSha256Key::new(SECRET);
    g.bench_function("hmac verify, key prepared/v01", |b| {
        b.iter(|| key.verify_hex(black_box(canonical.as_bytes()), &sig))
    });
    g.finish();
}

fn schema(c: &mut Criterion) {
    let s = CompiledSchema::compile(json!({
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": 10000},
            "tags": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["text"],
        "additionalProperties": false
    }))
    .unwrap();
    let good = json!({"text": "the cat sat on the mat", "tags": ["a", "b", "c"]});
    let bad = json!({"text": 42, "extra": true});
    let mut g = c.benchmark_group("schema");
    g.bench_function("valid memory.append args", |b| {
        b.iter(|| s.validate(black_box(&good)).is_ok())
    });
    g.bench_function("invalid memory.append args (2 violations)", |b| {
        b.iter(|| s.validate(black_box(&bad)).is_err())
    });
    g.finish();
}

fn nonces(c: &mut Criterion) {
    const NOW: u64 = 1_800_000_000_000;
    const TTL_MS: u64 = 300_000;
    let mut g = c.benchmark_group("nonce_store");
    let dir = tempfile::tempdir().unwrap();
    for (capacity, journal) in [(10_000usize, false), (1_000_000, false), (1_000_000, true)] {
        let store = NonceStore::open(
            NonceStoreConfig {
                capacity,
                ttl: Duration::from_millis(TTL_MS),
                journal: journal.then(|| dir.path().join("nonces.journal")),
            },
            NOW,
        )
        .unwrap();
        // Steady state: the clock advances so that by the time the store is full its oldest
        // entries have just expired (capacity entries per TTL); purges are part of the cost.
        let step_ms = TTL_MS / capacity as u64 + 1;
        let mut i = 0u64;
        let label = if journal { ", journal" } else { "" };
        g.bench_function(
            format!("insert fresh, steady state (capacity {capacity}{label})"),
            |b| {
                b.iter_batched(
                    || {
                        i += 1;
                        (format!("{i:032x}"), NOW + i * step_ms)
                    },
                    |(n, now)| store.check_and_insert("demo.echo", &n, now).unwrap(),
                    BatchSize::SmallInput,
                )
            },
        );
        if journal {
            continue;
        }
        let later = NOW + (i + 1) * step_ms;
        store
            .check_and_insert("demo.echo", "replayed", later)
            .unwrap();
        g.bench_function(format!("refuse replay (capacity {capacity})"), |b| {
            b.iter(|| {
                store
                    .check_and_insert("demo.echo", black_box("replayed"), later)
                    .is_err()
            })
        });
    }
    g.finish();
}

/// The secret guard over a typical result: ten memory matches of ~100 bytes of prose each
/// (nothing found, the common case), and the same with a private key in one of them.
fn secret_guard(c: &mut Criterion) {
    use carapace_filters::secret_guard::{Detectors, GuardAction, GuardMode, SecretGuard};
    let guard = SecretGuard::new(
        Detectors::new(
            &[],
            vec![("app_secret".into(), "correct-horse-battery".into())],
        )
        .unwrap(),
        GuardMode::Enforce,
        GuardAction::Redact,
        Default::default(),
        "inbound",
    );
    let prose = "the cat sat on the mat and then it went for a walk along the river bank at dusk";
    let clean = json!({"matches": (0..10).map(|i| json!({"id": format!("m{i}"), "text": prose})).collect::<Vec<_>>()});
    let mut dirty = clean.clone();
    dirty["matches"][3]["text"] =
        json!("key -----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY-----");
    let mut g = c.benchmark_group("secret_guard");
    g.bench_function("result, 10 matches, nothing found", |b| {
        b.iter_batched(
            || clean.clone(),
            |mut v| guard.scan(black_box(&mut v), "/output", true).len(),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("result, 10 matches, one private key redacted", |b| {
        b.iter_batched(
            || dirty.clone(),
            |mut v| guard.scan(black_box(&mut v), "/output", true).len(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// Caller authentication without mTLS: an OAuth JWT (ES256 and EdDSA) checked as the bearer
/// layer does, and an RFC 9421 signed request (HMAC-SHA256) checked as the signature layer
/// does (parse, signature base, HMAC, content digest), without the nonce record.
fn caller_auth(c: &mut Criterion) {
    use carapace_filters::bearer::token::{self, TokenRules};
    use carapace_filters::http_signature::message::{self, RequestView};
    use ring::signature::KeyPair;
    let b64 = |b: &[u8]| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    };
    let rng = ring::rand::SystemRandom::new();
    let alg = &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING;
    let ec = ring::signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
    let ec_pub = ring::signature::EcdsaKeyPair::from_pkcs8(alg, ec.as_ref(), &rng).unwrap();
    let p = ec_pub.public_key().as_ref();
    let ed = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let ed_pub = ring::signature::Ed25519KeyPair::from_pkcs8(ed.as_ref()).unwrap();
    let keys: jsonwebtoken::jwk::JwkSet = serde_json::from_value(json!({"keys": [
        {"kty": "EC", "crv": "P-256", "kid": "ec", "x": b64(&p[1..33]), "y": b64(&p[33..65])},
        {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": b64(ed_pub.public_key().as_ref())},
    ]}))
    .unwrap();
    let rules = TokenRules {
        issuer: "https://auth.test".into(),
        audiences: vec!["https://tools.test/mcp".into()],
        skew: Duration::from_secs(60),
    };
    let claims = json!({"iss": "https://auth.test", "aud": "https://tools.test/mcp",
        "sub": "alice", "scope": "tools:read", "iat": 1_800_000_000u64, "exp": 1_800_000_300u64});
    let sign = |a: jsonwebtoken::Algorithm, kid: &str, key: jsonwebtoken::EncodingKey| {
        let mut h = jsonwebtoken::Header::new(a);
        h.kid = Some(kid.into());
        jsonwebtoken::encode(&h, &claims, &key).unwrap()
    };
    let tokens = [
        (
            "ES256",
            sign(
                jsonwebtoken::Algorithm::ES256,
                "ec",
                jsonwebtoken::EncodingKey::from_ec_der(ec.as_ref()),
            ),
        ),
        (
            "EdDSA",
            sign(
                jsonwebtoken::Algorithm::EdDSA,
                "ed",
                jsonwebtoken::EncodingKey::from_ed_der(ed.as_ref()),
            ),
        ),
    ];
    let mut g = c.benchmark_group("caller_auth");
    for (name, t) in &tokens {
        g.bench_function(format!("bearer JWT {name}"), |b| {
            b.iter(|| {
                let (alg, kid) = token::header(black_box(t)).unwrap();
                let jwk = token::key_for(&keys, alg, kid.as_deref()).unwrap();
                token::verify(t, alg, jwk, &rules, 1_800_000_100).unwrap()
            })
        });
    }
    // The same token again, as the layer finds it in its cache of verified tokens.
    let cache = carapace_filters::bearer::cache::TokenCache::default();
    let shared = std::sync::Arc::new(keys.clone());
    let (alg, kid) = token::header(&tokens[0].1).unwrap();
    let holder = token::verify(
        &tokens[0].1,
        alg,
        token::key_for(&keys, alg, kid.as_deref()).unwrap(),
        &rules,
        1_800_000_100,
    )
    .unwrap();
    cache.put(&tokens[0].1, &shared, &holder);
    g.bench_function("bearer JWT ES256, verified before (cache)", |b| {
        b.iter(|| {
            cache
                .get(black_box(&tokens[0].1), &shared, 1_800_000_100, 60)
                .unwrap()
        })
    });
    // The README's request, signed by PyPI http-message-signatures.
    let body = br#"{"version":"v1","call_id":"c-1","tool_name":"memory.query","tenant_id":"t","args":{"query":"x"}}"#;
    let input = r#"sig1=("@method" "@target-uri" "content-digest");created=1795000000;keyid="k1";alg="hmac-sha256";nonce="6f1c2a9e4b7d8a03""#;
    let signature = "sig1=:VUc4rmyI6M/PTsRr7pSzaQTDfs4dS9riyh0rbUGYXr8=:";
    let digest = "sha-256=:wf7ChwqwWCzLc6rQp0MuixbV8exg6lt0wARDLV5JEd0=:";
    let mut headers = http::HeaderMap::new();
    headers.insert("host", "tools.example.com:8443".parse().unwrap());
    headers.insert("content-digest", digest.parse().unwrap());
    let uri: http::Uri = "/v1/tools/call".parse().unwrap();
    let key = ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        b"a shared secret of at least thirty-two bytes",
    );
    g.bench_function("RFC 9421 hmac-sha256, 95-byte body", |b| {
        b.iter(|| {
            let view = RequestView {
                method: &http::Method::POST,
                scheme: "https",
                uri: &uri,
                headers: &headers,
            };
            let sig = message::parse(black_box(input), signature)
                .unwrap()
                .remove(0);
            let base = message::signature_base(&sig, &view).unwrap();
            ring::hmac::verify(&key, base.as_bytes(), &sig.signature).unwrap();
            message::check_content_digest(digest, body).unwrap()
        })
    });
    g.finish();
}

/// The permission check of every call: a gateway with a policy of a few patterns.
fn authorization(c: &mut Criterion) {
    use carapace_filters::authorization::{Permissions, Policy};
    let p = Permissions::new(
        "gateway",
        Policy {
            allow: vec!["tool.call:memory.*".into(), "resource.read:*".into()],
            deny: vec!["tool.call:memory.delete".into(), "tool.call:admin.*".into()],
            leases: Vec::new(),
        },
    );
    let mut g = c.benchmark_group("authorization");
    g.bench_function("may_call memory.query", |b| {
        b.iter(|| p.may_call(black_box("memory.query"), 0))
    });
    g.bench_function(
        "allows tool.call:memory.query, action text built per call",
        |b| b.iter(|| p.allows(&format!("tool.call:{}", black_box("memory.query")), 0)),
    );
    g.finish();
}

criterion_group!(
    benches,
    signature,
    schema,
    nonces,
    secret_guard,
    caller_auth,
    authorization
);
criterion_main!(benches);
