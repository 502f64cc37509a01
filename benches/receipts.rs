//! What a signed receipt costs per call, part by part: the hashes of the arguments and the
//! result, the receipt's RFC 8785 form, the Ed25519 signature, and the whole header value;
//! and a batch of `v2` receipts signed at once (one signature, a Merkle tree, one header per
//! receipt), by batch size.

use carapace::pairing::wire::SigningIdentity;
use carapace::receipts::batch::sign_batch;
use carapace::receipts::{
    new_receipt_id, output_hash, rfc3339_ms, value_hash, Receipt, ReceiptStatus,
};
use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use std::hint::black_box;

fn receipt() -> Receipt {
    Receipt {
        receipt_id: new_receipt_id(),
        tool: "memory.query".into(),
        consumer: "gw_bench".into(),
        provider: "memory-east".into(),
        input_hash: value_hash(&json!({"query": "bench"})),
        output_hash: value_hash(&json!({"items": [], "query": "bench"})),
        status: ReceiptStatus::Ok,
        executed_at: rfc3339_ms(1_764_000_000_123),
        duration_ms: 3,
    }
}

fn parts(c: &mut Criterion) {
    let (key, _) = SigningIdentity::generate();
    let args = json!({"query": "bench", "limit": 10, "tags": ["a", "b"]});
    let output =
        json!({"items": [{"id": "m1", "text": "a memory", "score": 0.5}], "query": "bench"});
    let r = receipt();
    let payload = r.canonical();
    let mut g = c.benchmark_group("receipt");
    g.bench_function("input_hash", |b| b.iter(|| value_hash(black_box(&args))));
    g.bench_function("output_hash", |b| {
        b.iter(|| output_hash(ReceiptStatus::Ok, Some(black_box(&output)), None))
    });
    g.bench_function("canonical_form", |b| b.iter(|| black_box(&r).canonical()));
    g.bench_function("ed25519_sign", |b| {
        b.iter(|| key.sign_bytes(black_box(payload.as_bytes())))
    });
    g.bench_function("encode_whole", |b| b.iter(|| black_box(&r).encode(&key)));
    g.bench_function("id_and_time", |b| {
        b.iter(|| (new_receipt_id(), rfc3339_ms(black_box(1_764_000_000_123))))
    });
    g.finish();
}

fn batches(c: &mut Criterion) {
    let (key, _) = SigningIdentity::generate();
    let mut g = c.benchmark_group("receipt_batch");
    for n in [1usize, 4, 16, 64] {
        let payloads: Vec<String> = (0..n).map(|_| receipt().canonical()).collect();
        g.throughput(criterion::Throughput::Elements(n as u64));
        g.bench_function(format!("sign_{n}"), |b| {
            b.iter(|| sign_batch(&key, black_box(&payloads)))
        });
    }
    g.finish();
}

criterion_group!(benches, parts, batches);
criterion_main!(benches);
