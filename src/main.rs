//! The `carapace` command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use carapace::config::{self, LogFormat};

/// mimalloc: fewer instructions per allocation than the system allocator on the request path,
/// and freed memory goes back to the system (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code for a configuration that does not validate (sysexits EX_USAGE).
const EXIT_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "carapace",
    version,
    about = "The hard shell around an AI tool host"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the sidecar.
    Serve {
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Validate a configuration file; prints every error and exits 64 if there is any.
    Check {
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Print the JSON Schema of the configuration file.
    ConfigSchema,
    /// Run a self-contained demonstration on loopback.
    Demo,
    /// Serve the sample memory tool host (tools-v1) the demo uses, for trying carapace out
    /// (the compose example runs it next to carapace).
    SampleApp {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
    },
    /// Show or switch the kill-switch of a running carapace through its admin socket.
    KillSwitch {
        #[command(subcommand)]
        action: KillAction,
        /// Admin socket of the running carapace.
        #[arg(long, global = true)]
        admin_socket: Option<PathBuf>,
        /// Or: its configuration file (the admin socket is read from it).
        #[arg(short, long, global = true)]
        config: Option<PathBuf>,
    },
    /// Print the gateway's id and Ed25519 public key (what tool hosts configure).
    Identity {
        #[command(flatten)]
        t: PairTransport,
    },
    /// Pair a component with this gateway (through the gateway's local admin socket).
    Pair {
        #[command(subcommand)]
        what: PairCommand,
    },
    /// List or revoke the paired peers of a running carapace through its admin socket.
    Peers {
        #[command(subcommand)]
        action: PeersAction,
        /// Admin socket of the running carapace.
        #[arg(long, global = true)]
        admin_socket: Option<PathBuf>,
        /// Or: its configuration file (the admin socket is read from it).
        #[arg(short, long, global = true)]
        config: Option<PathBuf>,
    },
    /// Print this tool host's paired identity (certificate, key, gateway CA, peer store) as a
    /// Kubernetes Secret, so that every replica can mount the identity one pairing installed.
    /// The output holds the private key: pipe it to `kubectl apply -f -`, do not keep it.
    IdentitySecret {
        /// The tool host's configuration file (its `state_dir` holds the pairing).
        #[arg(short, long)]
        config: PathBuf,
        /// Name of the Secret.
        #[arg(long)]
        name: String,
    },
    /// Ask a running carapace to reload its configuration (same as SIGHUP).
    Reload {
        #[arg(long)]
        admin_socket: Option<PathBuf>,
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
}

/// Where the gateway's admin socket is: `--admin-socket`, else `CARAPACE_ADMIN_SOCKET`, else
/// the default state directory's.
#[derive(clap::Args, Clone)]
struct PairTransport {
    /// The gateway's admin socket.
    #[arg(long)]
    admin_socket: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 20)]
    timeout: u64,
}

#[derive(Subcommand, Clone)]
enum PairCommand {
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

#[derive(Subcommand, Clone)]
enum PeersAction {
    /// Print every peer record, with when its certificate expires (`mtls_cert_not_after`)
    /// where carapace knows it and when it last made an accepted call (`last_seen_at`).
    List,
    /// Revoke a peer: its next request fails.
    Revoke { component_id: String },
}

#[derive(Subcommand, Clone)]
enum KillAction {
    /// Print the kill-switch state.
    Status,
    /// Refuse every call, or every call to one tool.
    Engage {
        #[arg(long)]
        tool: Option<String>,
    },
    /// Undo `engage`.
    Release {
        #[arg(long)]
        tool: Option<String>,
    },
}

fn print_config_errors(path: &Path, errors: &config::ConfigErrors) {
    eprintln!("{}: {} error(s)", path.display(), errors.0.len());
    for e in &errors.0 {
        eprintln!("  {e}");
    }
}

fn init_logging(format: LogFormat, level: &str) {
    init_tracing(format, level, None);
}

/// Logs on stderr, and spans over OTLP when `otlp` is set (its handle flushes at the end).
fn init_tracing(
    format: LogFormat,
    level: &str,
    otlp: Option<&carapace::telemetry::OtlpConfig>,
) -> Option<carapace::telemetry::Exporter> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Json => fmt.json().flatten_event(true).with_filter(filter).boxed(),
        LogFormat::Text => fmt.with_ansi(false).with_filter(filter).boxed(),
    };
    let (spans, exporter) = match otlp.map(carapace::telemetry::otlp_layer) {
        Some(Ok((layer, exporter))) => (Some(layer), Some(exporter)),
        Some(Err(e)) => {
            eprintln!("spans are not exported: {e}");
            (None, None)
        }
        None => (None, None),
    };
    tracing_subscriber::registry().with(fmt).with(spans).init();
    exporter
}

fn runtime(threads: Option<usize>) -> tokio::runtime::Runtime {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        b.worker_threads(n);
    }
    b.enable_all().build().expect("tokio runtime")
}

fn admin_socket(admin_socket: Option<PathBuf>, config: Option<PathBuf>) -> Result<PathBuf, String> {
    match (admin_socket, config) {
        (Some(p), _) => Ok(p),
        (None, Some(c)) => config::load(&c).map(|l| l.admin_socket()).map_err(|e| {
            format!(
                "{}: {}",
                c.display(),
                e.0.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        }),
        (None, None) => Err("give --admin-socket PATH or -c CONFIG".into()),
    }
}

fn serve(path: &Path) -> ExitCode {
    let loaded = match config::load(path) {
        Ok(l) => l,
        Err(e) => {
            print_config_errors(path, &e);
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let otlp = loaded
        .config
        .telemetry
        .as_ref()
        .and_then(|t| t.otlp.clone());
    let exporter = init_tracing(
        loaded.config.log.format,
        &loaded.config.log.level,
        otlp.as_ref(),
    );
    let rt = runtime(loaded.config.runtime.worker_threads);
    let code = rt.block_on(async move {
        // Handlers first, so a signal during start-up is not fatal.
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        let running = match carapace::server::start(loaded).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("cannot start: {e}");
                return ExitCode::FAILURE;
            }
        };
        loop {
            tokio::select! {
                _ = hup.recv() => { let _ = running.reload().await; }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        tracing::info!("draining");
        running.shutdown().await;
        ExitCode::SUCCESS
    });
    if let Some(exporter) = exporter {
        exporter.shutdown();
    }
    code
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config } => serve(&config),
        Command::Check { config } => match config::load(&config) {
            Ok(_) => {
                println!("{}: ok", config.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                print_config_errors(&config, &e);
                ExitCode::from(EXIT_CONFIG)
            }
        },
        Command::ConfigSchema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&config::json_schema()).expect("JSON")
            );
            ExitCode::SUCCESS
        }
        Command::Demo => {
            init_logging(LogFormat::Text, "error");
            runtime(None).block_on(carapace::demo::run())
        }
        Command::SampleApp { listen } => {
            init_logging(LogFormat::Text, "info");
            runtime(Some(1)).block_on(async move {
                let listener = match tokio::net::TcpListener::bind(listen).await {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("cannot listen on {listen}: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                eprintln!("sample memory tool host on http://{listen}");
                let app = std::sync::Arc::new(carapace::memory_app::MemoryApp::default());
                let task = app.serve(listener);
                // Until SIGINT or SIGTERM (what a container runtime sends).
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("SIGTERM handler");
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
                task.abort();
                ExitCode::SUCCESS
            })
        }
        Command::KillSwitch {
            action,
            admin_socket: sock,
            config,
        } => {
            let sock = match admin_socket(sock, config) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            let (method, body) = match &action {
                KillAction::Status => (http::Method::GET, None),
                KillAction::Engage { tool } => (
                    http::Method::PUT,
                    Some(serde_json::json!({"engaged": true, "tool": tool})),
                ),
                KillAction::Release { tool } => (
                    http::Method::PUT,
                    Some(serde_json::json!({"engaged": false, "tool": tool})),
                ),
            };
            admin_call(&sock, method, "/v1/kill-switch", body)
        }
        Command::Pair { what } => pair(what),
        Command::IdentitySecret { config, name } => match identity_secret(&config, &name) {
            Ok(secret) => {
                println!("{secret}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Identity { t } => {
            admin_call(&pair_socket(&t), http::Method::GET, "/v1/gateway", None)
        }
        Command::Peers {
            action,
            admin_socket: sock,
            config,
        } => {
            let sock = match admin_socket(sock, config) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            match action {
                PeersAction::List => admin_call(&sock, http::Method::GET, "/v1/peers", None),
                PeersAction::Revoke { component_id } => admin_call(
                    &sock,
                    http::Method::POST,
                    "/v1/peers/revoke",
                    Some(serde_json::json!({ "component_id": component_id })),
                ),
            }
        }
        Command::Reload {
            admin_socket: sock,
            config,
        } => match admin_socket(sock, config) {
            Ok(s) => admin_call(&s, http::Method::POST, "/v1/reload", None),
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EXIT_CONFIG)
            }
        },
    }
}

/// The current pairing's files and the peer store, as a Kubernetes Secret (JSON, which
/// `kubectl apply` reads as it reads YAML).
fn identity_secret(config_path: &Path, name: &str) -> Result<String, String> {
    use base64::Engine;
    let loaded = config::load(config_path).map_err(|e| {
        format!(
            "{}: {}",
            config_path.display(),
            e.0.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        )
    })?;
    let state_dir = &loaded.config.state_dir;
    let paired = carapace::tls::PairedFiles::current(state_dir)
        .ok_or_else(|| format!("no completed pairing in {}", state_dir.display()))?;
    let b64 = |path: &Path| {
        carapace_filters::state_file::read_bounded(
            path,
            carapace_filters::state_file::MAX_DOCUMENT_BYTES,
        )
        .map(|b| base64::engine::general_purpose::STANDARD.encode(b))
        .map_err(|e| format!("{}: {e}", path.display()))
    };
    let secret = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "carapace",
                "app.kubernetes.io/component": "identity",
            },
        },
        "type": "Opaque",
        "data": {
            "tls.crt": b64(&paired.cert)?,
            "tls.key": b64(&paired.key)?,
            "ca.crt": b64(&paired.ca)?,
            "peers.json": b64(&loaded.peers_file())?,
        },
    });
    Ok(serde_json::to_string_pretty(&secret).expect("JSON"))
}

fn admin_call(
    sock: &Path,
    method: http::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> ExitCode {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match rt.block_on(carapace::admin::request(sock, method, path, body)) {
        Ok((status, value)) => {
            println!("{}", serde_json::to_string_pretty(&value).expect("JSON"));
            if status.is_success() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn pair_socket(t: &PairTransport) -> PathBuf {
    t.admin_socket
        .clone()
        .or_else(|| std::env::var_os("CARAPACE_ADMIN_SOCKET").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/lib/carapace/admin.sock"))
}

fn pair(what: PairCommand) -> ExitCode {
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
