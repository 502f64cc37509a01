//! `carapace pair`: pair a component with this gateway through its admin socket, or check
//! pairing end to end with a throwaway tool host.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::EXIT_CONFIG;

/// Where the gateway's admin socket is: `--admin-socket`, else `CARAPACE_ADMIN_SOCKET`, else
/// the default state directory's.
#[derive(clap::Args, Clone)]
pub(crate) struct PairTransport {
    /// The gateway's admin socket.
    #[arg(long)]
    admin_socket: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 20)]
    timeout: u64,
}

#[derive(Subcommand, Clone)]
pub(crate) enum PairCommand {
    /// Pair a tool host (component_type=tool_host).
    Tool {
        #[command(flatten)]
        t: PairTransport,
        endpoint: String,
        name: String,
    },
    /// Pair a subscriber (component_type=subscriber).
    Subscriber {
        #[command(flatten)]
        t: PairTransport,
        endpoint: String,
        name: String,
    },
    /// Pair an operator's CLI (component_type=operator).
    Cli {
        #[command(flatten)]
        t: PairTransport,
        endpoint: String,
        name: String,
    },
    /// Check pairing end to end: a throwaway local tool host pairs with the gateway.
    Test {
        #[command(flatten)]
        t: PairTransport,
        /// The test tool host's component id.
        #[arg(long, default_value = "carapace-pair-test")]
        component_id: String,
    },
}

pub(crate) fn pair_socket(t: &PairTransport) -> PathBuf {
    t.admin_socket
        .clone()
        .or_else(|| {
            std::env::var_os(crate::admin::ADMIN_SOCKET_ENV)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("/var/lib/carapace/admin.sock"))
}

pub(crate) fn pair(what: PairCommand) -> ExitCode {
    let (t, kind, endpoint, name) = match what {
        PairCommand::Tool { t, endpoint, name } => (t, "tool_host", endpoint, name),
        PairCommand::Subscriber { t, endpoint, name } => (t, "subscriber", endpoint, name),
        PairCommand::Cli { t, endpoint, name } => (t, "operator", endpoint, name),
        PairCommand::Test { t, component_id } => return pair_test(&t, &component_id),
    };
    let (endpoint, name) = (endpoint.trim().to_string(), name.trim().to_string());
    if endpoint.is_empty() || name.is_empty() {
        eprintln!(
            "{} is required",
            if endpoint.is_empty() {
                "endpoint"
            } else {
                "name"
            }
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match rt.block_on(request_pairing(&t, kind, &endpoint, &name)) {
        // Complete only once the gateway has seen the peer activate it.
        Ok(v) if v["peer"]["status"] == "active" => {
            print_paired("pairing complete", &v, kind);
            ExitCode::SUCCESS
        }
        Ok(v) => {
            eprintln!(
                "carapace pair failed: the gateway did not confirm the pairing (peer status {}); \
                 it is not usable",
                v["peer"]["status"]
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("carapace pair failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn request_pairing(
    t: &PairTransport,
    kind: &str,
    endpoint: &str,
    name: &str,
) -> Result<serde_json::Value, String> {
    let body =
        serde_json::json!({"component_type": kind, "component_id": name, "endpoint": endpoint});
    let socket = pair_socket(t);
    let call = carapace::admin::request(&socket, http::Method::POST, "/v1/pairings", Some(body));
    let (status, value) = tokio::time::timeout(std::time::Duration::from_secs(t.timeout), call)
        .await
        .map_err(|_| format!("no answer within {} s", t.timeout))??;
    if status.is_success() {
        Ok(value)
    } else {
        let why = value["error"].as_str().unwrap_or("");
        Err(format!("gateway pairing failed: HTTP {status}: {why}"))
    }
}

fn print_paired(title: &str, v: &serde_json::Value, kind: &str) {
    let s = |x: &serde_json::Value| x.as_str().unwrap_or("").to_string();
    let peer = &v["peer"];
    let ty = peer["component_type"].as_str().unwrap_or(kind);
    println!("{title}");
    println!("pairing_id={}", s(&v["pairing_id"]));
    println!("component_type={ty}");
    println!("component_id={}", s(&peer["component_id"]));
    println!("endpoint={}", s(&v["endpoint"]));
    println!(
        "mtls_cert_fingerprint={}",
        s(&peer["mtls_cert_fingerprint"])
    );
}

/// A throwaway tool host on loopback, with fresh keys, pairs with the gateway.
fn pair_test(t: &PairTransport, component_id: &str) -> ExitCode {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match rt.block_on(pair_test_run(t, component_id)) {
        Ok(v) => {
            print_paired("pairing test complete", &v, "tool_host");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("carapace pair test failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn pair_test_run(t: &PairTransport, component_id: &str) -> Result<serde_json::Value, String> {
    use carapace::pairing::{handshake, identity, transport};
    use std::sync::Arc;
    let (status, gw) =
        carapace::admin::request(&pair_socket(t), http::Method::GET, "/v1/gateway", None).await?;
    if !status.is_success() {
        return Err("the admin socket is not a gateway's".into());
    }
    let gateway_key = gw["public_key_ed25519"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let host = identity::HostIdentity::from_keys(rand::random(), rand::random());
    let nonces = carapace_filters::nonce::NonceStore::open(
        carapace_filters::nonce::NonceStoreConfig {
            capacity: 16,
            ttl: std::time::Duration::from_secs(600),
            journal: None,
        },
        carapace_filters::unix_now_ms(),
    )
    .map_err(|e| e.to_string())?;
    struct Discard;
    impl transport::PairingSink for Discard {
        fn install(&self, _: &handshake::Installed) -> Result<(), String> {
            Ok(())
        }
        fn activate(&self, _: &handshake::Installed) -> Result<(), String> {
            Ok(())
        }
    }
    let endpoint = Arc::new(transport::PairingEndpoint::new(
        handshake::RemoteConfig {
            component_type: "tool_host".into(),
            component_id: component_id.into(),
            gateway_public_key_ed25519: gateway_key,
            endpoint_tls_fingerprint: String::new(),
        },
        Arc::new(host),
        Arc::new(nonces),
        "/v1/pair".into(),
        Arc::new(Discard),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let url = format!(
        "ws://{}/v1/pair",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(endpoint.serve(listener, stop_rx));
    request_pairing(t, "tool_host", &url, component_id).await
}
