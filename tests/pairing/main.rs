//! Pairing on loopback, two carapace processes' worth of stack: a gateway pairs a tool host
//! through its admin socket and from then on only the paired gateway's certificate gets
//! through (`handshake`); the gateway's outbound role calls the paired tool host and its
//! skills (`outbound`); and pairing under hostile or failing peers (`hardening`).

#[path = "../common/mod.rs"]
mod common;
mod handshake;
mod hardening;
mod outbound;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use carapace::client::{Client, Transport};
use carapace::pairing::identity::GatewayIdentity;
use carapace::pki::Issued;
use carapace::server::Running;
use carapace_filters::signature::UnixClock;
use common::{write_peers, Env};

/// The call most tests make: `memory.query`, which the sample app answers.
fn query() -> serde_json::Value {
    common::call("memory.query", serde_json::json!({"query": "x"}))
}

/// The certificate (and key) the tool host of `env` installed from its pairing.
fn installed_certificate(env: &Env) -> Issued {
    let files = carapace::tls::PairedFiles::current(&env.path().join("state")).unwrap();
    issued(
        std::fs::read_to_string(&files.cert).unwrap(),
        std::fs::read_to_string(&files.key).unwrap(),
    )
}

/// A certificate and its key as the client configuration takes them.
fn issued(cert_pem: String, key_pem: String) -> Issued {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
    Issued {
        fingerprint: carapace::tls::fingerprint(&der),
        cert_pem,
        key_pem,
        der,
    }
}

/// A gateway's configuration (`gw_home`, its state, peer file and sockets under `dir`);
/// `outbound_to`: the tool host it calls as `memory-east`; `pool`: its connections' pool (to
/// its app and, in the outbound role, to its peers), the default when empty.
fn gateway_yaml(
    dir: &Path,
    app: SocketAddr,
    outbound_to: Option<SocketAddr>,
    pool: &str,
) -> String {
    let outbound = outbound_to.map_or(String::new(), |tools| {
        format!(
            "outbound:\n  socket: {d}/outbound.sock\n  peers: {{ memory-east: {{ url: \"https://{tools}\" }} }}\n",
            d = dir.display()
        )
    });
    let pool = match pool {
        "" => String::new(),
        p => format!(", pool: {{ {p} }}"),
    };
    format!(
        r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {d}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app}"{pool} }}
peers: {{ file: {d}/peers.json }}
ops: {{ address: "" }}
gateway: {{ id: gw_home }}
{outbound}"#,
        d = dir.display()
    )
}

async fn start_gateway(dir: &Path, yaml: &str) -> Running {
    start_gateway_clocked(dir, yaml, Arc::new(carapace_filters::unix_now_ms)).await
}

async fn start_gateway_clocked(dir: &Path, yaml: &str, clock: UnixClock) -> Running {
    std::fs::create_dir_all(dir.join("state")).unwrap();
    std::fs::write(dir.join("carapace.yaml"), yaml).unwrap();
    let loaded = carapace::config::load(&dir.join("carapace.yaml")).unwrap();
    carapace::server::start_with_clock(loaded, clock)
        .await
        .unwrap()
}

/// What the gateway's admin socket answers to pairing `memory-east` at `endpoint`.
async fn request_pairing(gw: &Running, endpoint: &str) -> (http::StatusCode, serde_json::Value) {
    carapace::admin::request(
        &gw.admin_socket,
        http::Method::POST,
        "/v1/pairings",
        Some(
            serde_json::json!({"component_type": "tool", "component_id": "memory-east",
                                "endpoint": endpoint}),
        ),
    )
    .await
    .unwrap()
}

/// What `r`'s admin socket answers (its status) to a POST of `body` to `path`.
async fn admin(r: &Running, path: &str, body: Option<serde_json::Value>) -> http::StatusCode {
    carapace::admin::request(&r.admin_socket, http::Method::POST, path, body)
        .await
        .unwrap()
        .0
}

/// The tool host's pairing section: it pairs as `memory-east` with the gateway of `key`.
fn host_pairing(key: &str) -> String {
    format!(
        "pairing: {{ listen: \"127.0.0.1:0\", component_id: memory-east, gateway_public_key_ed25519: \"{key}\" }}"
    )
}

/// A real tool host (the memory app behind carapace, with a pairing endpoint, nothing paired)
/// and a gateway at `<env>/gw` that calls it as `memory-east` with its connections' `pool`
/// (see [`gateway_yaml`]), its wall clock being `clock`: (host, gateway, gateway's dir).
async fn tool_host_and_gateway(
    env: &Env,
    pool: &str,
    clock: UnixClock,
) -> (Running, Running, PathBuf) {
    write_peers(&env.path().join("peers.json"), &[]);
    let dir = env.path().join("gw");
    let key = GatewayIdentity::load_or_create(&dir.join("state"), "gw_home")
        .unwrap()
        .public_key_ed25519();
    let host = env.start(&env.tools_yaml(&host_pairing(&key))).await;
    let yaml = gateway_yaml(&dir, env.app_addr, Some(host.tcp_address.unwrap()), pool);
    let gw = start_gateway_clocked(&dir, &yaml, clock).await;
    (host, gw, dir)
}

/// A tool host and a gateway paired through the gateway's admin socket, and the agent's
/// client on the gateway's outbound socket.
struct Paired {
    host: Running,
    gw: Running,
    /// The gateway's directory.
    dir: PathBuf,
    /// The tool host's pairing endpoint.
    endpoint: String,
    agent: Client,
}

impl Paired {
    /// Paired as [`tool_host_and_gateway`] sets them up.
    async fn new(env: &Env, pool: &str, clock: UnixClock) -> Paired {
        let (host, gw, dir) = tool_host_and_gateway(env, pool, clock).await;
        let endpoint = format!("ws://{}/v1/pair", host.pairing_address.unwrap());
        let (status, body) = request_pairing(&gw, &endpoint).await;
        assert_eq!(status, http::StatusCode::OK, "{body}");
        let agent = Client::new(Transport::Unix(dir.join("outbound.sock")));
        Paired {
            host,
            gw,
            dir,
            endpoint,
            agent,
        }
    }

    /// Paired, the gateway's connections pooled as by default and its clock the system's.
    async fn plain(env: &Env) -> Paired {
        Paired::new(env, "", Arc::new(carapace_filters::unix_now_ms)).await
    }

    /// What the agent gets for `body`.
    async fn ask(&self, body: &serde_json::Value) -> carapace::client::Reply {
        self.agent
            .post_json("/v1/tools/call", &[], body)
            .await
            .unwrap()
    }

    async fn shutdown(self) {
        self.gw.shutdown().await;
        self.host.shutdown().await;
    }
}
