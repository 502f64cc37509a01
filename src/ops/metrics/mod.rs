//! Prometheus metrics: requests by front, tool, outcome (the code the caller got) and reason, latency
//! histograms, and gauges for the stores and the paired peers' certificates.

mod calls;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry};

use crate::config::Protocol;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    component_id: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReceiptLabels {
    peer: String,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabels {
    worker: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
}

/// All metrics of one process.
pub struct Metrics {
    registry: Registry,
    /// Every call's count and latency, by thread (`carapace_requests_total` and
    /// `carapace_request_duration_seconds`).
    calls: Arc<calls::CallSeries>,
    reloads: Family<ResultLabels, Counter>,
    worker_connections: Family<WorkerLabels, Counter>,
    discoveries: Family<ResultLabels, Counter>,
    pub nonce_entries: Gauge<i64, AtomicI64>,
    pub tools: Gauge<i64, AtomicI64>,
    pub peers: Gauge<i64, AtomicI64>,
    /// Tools withheld because their definition is not the approved one.
    pub tools_withheld: Gauge<i64, AtomicI64>,
    tool_definition_changes: Family<ToolLabels, Counter>,
    certificate_expiry: Family<PeerLabels, Gauge<i64, AtomicI64>>,
    /// The peers `certificate_expiry` has a value for.
    certificate_expiry_peers: Mutex<Vec<String>>,
    receipts: Family<ReceiptLabels, Counter>,
    circuits: Family<ProviderLabels, Gauge<i64, AtomicI64>>,
    /// The ledger's rows written, entries dropped and calls refused (queue full).
    pub ledger: Arc<crate::ledger::LedgerCounters>,
    /// Receipts signed in batches (`receipts.batch`): signatures and receipts.
    pub receipt_batches: Arc<crate::receipts::batch::BatchCounters>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// `metric`, registered in `registry` as `name` with `help`.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("carapace");
        let calls = Arc::new(calls::CallSeries::default());
        registry.register_collector(Box::new(calls::CallSeriesCollector(calls.clone())));
        let r = &mut registry;
        let ledger = Arc::new(crate::ledger::LedgerCounters::default());
        ledger.register(r);
        let receipt_batches = Arc::new(crate::receipts::batch::BatchCounters::default());
        receipt_batches.register(r);
        Metrics {
            reloads: registered(r, "config_reloads", "Configuration reloads by result", Family::default()),
            worker_connections: registered(
                r,
                "worker_connections",
                "Connections served, by the worker (event loop) that served them",
                Family::default(),
            ),
            discoveries: registered(r, "discoveries", "Tool discoveries by result", Family::default()),
            nonce_entries: registered(r, "nonce_store_entries", "Nonces held by the replay store", Gauge::default()),
            tools: registered(r, "catalog_tools", "Tools in the catalog", Gauge::default()),
            peers: registered(r, "peer_store_records", "Records in the peer store", Gauge::default()),
            tools_withheld: registered(
                r,
                "tools_withheld",
                "Tools withheld because their definition changed since it was approved (pinning)",
                Gauge::default(),
            ),
            tool_definition_changes: registered(
                r,
                "tool_definition_changes",
                "Changed tool definitions seen (once per tool and new definition), by tool",
                Family::default(),
            ),
            certificate_expiry: registered(
                r,
                "peer_certificate_expiry_days",
                "Days until the certificate of a paired peer expires (negative once expired), for peers whose record gives its expiry",
                Family::default(),
            ),
            receipts: registered(
                r,
                "peer_receipts",
                "Answers of paired peers by the check of their signed receipt (verified, missing, invalid)",
                Family::default(),
            ),
            circuits: registered(
                r,
                "provider_circuit_open",
                "1 while the circuit of a peer or skill the outbound role calls is open (it stopped answering), else 0",
                Family::default(),
            ),
            ledger,
            receipt_batches,
            registry,
            calls,
            certificate_expiry_peers: Mutex::default(),
        }
    }
}

fn front_label(front: Protocol) -> &'static str {
    match front {
        Protocol::ToolsV1 => "tools-v1",
        Protocol::SkillV1 => "skill-v1",
        Protocol::Mcp => "mcp",
    }
}

impl Metrics {
    /// Record one request: `outcome` is `ok`, `app_error` or the code the caller got,
    /// `reason` carapace's finer reason for a refusal (empty otherwise).
    pub fn observe(
        &self,
        front: Protocol,
        tool: Option<&str>,
        (outcome, reason): (&'static str, &'static str),
        took: Duration,
    ) {
        let labels = (front_label(front), tool.unwrap_or(""), outcome, reason);
        self.calls.observe(labels, took);
    }

    /// The circuit of `provider` is open, or not.
    pub fn provider_circuit(&self, provider: &str, open: bool) {
        self.circuits
            .get_or_create(&ProviderLabels {
                provider: provider.into(),
            })
            .set(i64::from(open));
    }

    /// The outbound side checked a peer's receipt.
    pub fn receipt_checked(&self, peer: &str, status: &'static str) {
        self.receipts
            .get_or_create(&ReceiptLabels {
                peer: peer.into(),
                status,
            })
            .inc();
    }

    /// A tool's definition changed from its pin.
    pub fn tool_definition_changed(&self, tool: &str) {
        self.tool_definition_changes
            .get_or_create(&ToolLabels { tool: tool.into() })
            .inc();
    }

    /// A worker began serving a connection.
    pub fn worker_connection(&self, worker: usize) {
        let worker = worker as u64;
        self.worker_connections
            .get_or_create(&WorkerLabels { worker })
            .inc();
    }

    pub fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "refused" };
        self.reloads.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn discovery(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.discoveries
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Set the days to expiry of every peer certificate, by `component_id`; peers no longer
    /// listed are dropped.
    pub fn peer_certificate_expiry(&self, days: &BTreeMap<String, i64>) {
        let mut known = self
            .certificate_expiry_peers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for gone in known.iter().filter(|id| !days.contains_key(*id)) {
            self.certificate_expiry.remove(&PeerLabels {
                component_id: gone.clone(),
            });
        }
        for (id, d) in days {
            self.certificate_expiry
                .get_or_create(&PeerLabels {
                    component_id: id.clone(),
                })
                .set(*d);
        }
        *known = days.keys().cloned().collect();
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writes to a String");
        out
    }
}
