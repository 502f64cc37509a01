//! What the ledger's writer pays per row: one batch of rows appended in one transaction
//! (SQLite in WAL mode, the row hashes, the chain's head and the spend table), as the writer
//! thread does every 10 ms; at saturation a batch is a few hundred rows.

use carapace::ledger::store::{append, open};
use carapace::ledger::{Entry, Record};
use carapace::receipts::value_hash;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::json;

/// A row as the full stack's benchmark call writes it (skill-v1 `memory.query`, unpriced).
fn entry(n: u64) -> Entry {
    Entry {
        side: "inbound".into(),
        call_id: format!("call-{n:016x}"),
        receipt_id: None,
        tool: "memory.query".into(),
        consumer: "gw_bench".into(),
        provider: "memory-east".into(),
        input_hash: value_hash(&json!({"query": "bench", "n": n})),
        output_hash: value_hash(&json!({"items": [], "query": "bench"})),
        status: "ok".into(),
        error_code: None,
        started_at: 1_764_000_000_000 + n,
        ended_at: 1_764_000_000_003 + n,
        duration_ms: 3,
        receipt: None,
        charge: None,
    }
}

fn batches(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = open(&dir.path().join("ledger.sqlite3")).unwrap();
    let mut g = c.benchmark_group("ledger");
    for rows in [1u64, 256] {
        let batch: Vec<Record> = (0..rows).map(|n| Record::of(&entry(n))).collect();
        g.throughput(Throughput::Elements(rows));
        g.bench_function(format!("append_{rows}_rows"), |b| {
            b.iter(|| append(&mut conn, &batch).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, batches);
criterion_main!(benches);
