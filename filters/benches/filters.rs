//! Hot-path costs of the filters: canonical JSON + HMAC verification of a Skill Gateway v1
//! request, JSON-Schema validation with a precompiled validator, and the nonce store.

use std::hint::black_box;
use std::time::Duration;

use carapace_filters::canonical::{canonical_string, parse_strict, verify_hmac_sha256_hex};
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

criterion_group!(benches, signature, schema, nonces, secret_guard);
criterion_main!(benches);
