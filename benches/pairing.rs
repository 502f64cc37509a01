//! Duration of a whole pairing handshake (phases 1-7): both state machines in memory, and
//! over a loopback WebSocket through the tool host's pairing endpoint.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use carapace::pairing::handshake::{
    GatewayHandshake, Installed, PairRequest, Progress, RemoteConfig, RemoteHandshake,
};
use carapace::pairing::identity::{GatewayIdentity, HostIdentity};
use carapace::pairing::transport::{pair, PairingEndpoint, PairingSink};
use carapace_filters::nonce::{NonceStore, NonceStoreConfig};
use criterion::{criterion_group, criterion_main, Criterion};

fn nonces() -> Arc<NonceStore> {
    Arc::new(
        NonceStore::open(
            NonceStoreConfig {
                capacity: 10_000_000,
                ttl: Duration::from_secs(600),
                journal: None,
            },
            0,
        )
        .unwrap(),
    )
}

fn config(gw: &GatewayIdentity) -> RemoteConfig {
    RemoteConfig {
        component_type: "tool_host".into(),
        component_id: "memory-east".into(),
        gateway_public_key_ed25519: gw.public_key_ed25519(),
        endpoint_tls_fingerprint: String::new(),
    }
}

fn request(endpoint: &str) -> PairRequest {
    PairRequest {
        component_type: "tool_host".into(),
        component_id: "memory-east".into(),
        endpoint: endpoint.into(),
    }
}

/// One handshake, both sides in memory.
fn in_memory(gw: &Arc<GatewayIdentity>, host: &Arc<HostIdentity>, store: &Arc<NonceStore>) {
    let now = SystemTime::now();
    let (mut g, init) =
        GatewayHandshake::start(gw.clone(), request("ws://127.0.0.1:1/v1/pair"), None, now)
            .unwrap();
    let mut r = RemoteHandshake::new(config(gw), host.clone(), store.clone());
    let mut to_remote = vec![init];
    loop {
        let mut to_gateway = Vec::new();
        for m in to_remote.drain(..) {
            match r.on_message(&m, now).unwrap() {
                Progress::Continue(out) => to_gateway.extend(out),
                Progress::Done(..) => return,
            }
        }
        for m in to_gateway {
            match g.on_message(&m, now).unwrap() {
                Progress::Continue(out) => to_remote.extend(out),
                Progress::Done(out, _) => to_remote.extend(out),
            }
        }
    }
}

struct Discard;
impl PairingSink for Discard {
    fn install(&self, _: &Installed) -> Result<(), String> {
        Ok(())
    }
    fn activate(&self, _: &Installed) -> Result<(), String> {
        Ok(())
    }
}

fn handshake(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let gw = Arc::new(GatewayIdentity::load_or_create(&dir.path().join("gw"), "gw_bench").unwrap());
    let host = Arc::new(HostIdentity::load_or_create(&dir.path().join("host")).unwrap());
    let store = nonces();
    let mut g = c.benchmark_group("pairing");
    g.sample_size(30);
    g.bench_function("handshake phases 1-7, in memory", |b| {
        b.iter(|| in_memory(&gw, &host, &store))
    });

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let url = rt.block_on(async {
        let endpoint = Arc::new(PairingEndpoint::new(
            config(&gw),
            host.clone(),
            nonces(),
            "/v1/pair".into(),
            Arc::new(Discard),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/v1/pair", listener.local_addr().unwrap());
        let (stop, rx) = tokio::sync::watch::channel(false);
        std::mem::forget(stop);
        tokio::spawn(endpoint.serve(listener, rx));
        url
    });
    g.bench_function("handshake over loopback WebSocket", |b| {
        b.iter(|| {
            rt.block_on(pair(gw.clone(), request(&url), Box::new(|_| Ok(()))))
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, handshake);
criterion_main!(benches);
