//! The `carapace` command.

mod admin;
mod allocator;
mod pair;
mod records;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use admin::{KillAction, PeersAction, ToolsAction};
use pair::{PairCommand, PairTransport};

/// mimalloc: fewer instructions per allocation than the system allocator on the request path,
/// and freed memory goes back to the system (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: allocator::MiMalloc = allocator::MiMalloc;

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
        /// Runtime threads serving calls.
        #[arg(long, default_value_t = 1)]
        threads: usize,
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
    /// Show the tool-definition pins of a running carapace, or approve a changed tool,
    /// through its admin socket.
    Tools {
        #[command(subcommand)]
        action: ToolsAction,
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
    /// A stdio MCP server for a local agent: every tool the gateway's outbound role offers (its
    /// paired tool hosts and skills), through the outbound socket's MCP endpoint.
    McpStdio {
        /// The gateway's outbound socket.
        #[arg(long)]
        socket: PathBuf,
        /// The MCP endpoint's path on it.
        #[arg(long, default_value = "/mcp")]
        path: String,
    },
    /// Check signed receipts offline.
    Receipts {
        #[command(subcommand)]
        action: records::ReceiptsAction,
    },
    /// Check, read or export the invocation ledger (works while carapace runs).
    Ledger {
        #[command(subcommand)]
        action: records::LedgerAction,
        /// The configuration file (the ledger's path is read from it).
        #[arg(short, long, global = true)]
        config: Option<PathBuf>,
        /// Or: the ledger's database file.
        #[arg(long, global = true)]
        path: Option<PathBuf>,
    },
    /// Ask a running carapace to reload its configuration (same as SIGHUP).
    Reload {
        #[arg(long)]
        admin_socket: Option<PathBuf>,
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config } => serve::serve(&config),
        Command::Check { config } => serve::check(&config),
        Command::ConfigSchema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&carapace::config::json_schema()).expect("JSON")
            );
            ExitCode::SUCCESS
        }
        Command::Demo => {
            serve::init_logging(carapace::config::LogFormat::Text, "error");
            tokio::runtime::Runtime::new()
                .expect("tokio runtime")
                .block_on(carapace::demo::run())
        }
        Command::SampleApp { listen, threads } => serve::sample_app(listen, threads),
        Command::KillSwitch {
            action,
            admin_socket,
            config,
        } => admin::kill_switch(action, admin_socket, config),
        Command::Pair { what } => pair::pair(what),
        Command::IdentitySecret { config, name } => admin::print_identity_secret(&config, &name),
        Command::Identity { t } => admin::admin_call(
            &pair::pair_socket(&t),
            http::Method::GET,
            "/v1/gateway",
            None,
        ),
        Command::Peers {
            action,
            admin_socket,
            config,
        } => admin::peers(action, admin_socket, config),
        Command::Tools {
            action,
            admin_socket,
            config,
        } => admin::tools(action, admin_socket, config),
        Command::Reload {
            admin_socket,
            config,
        } => admin::reload(admin_socket, config),
        Command::McpStdio { socket, path } => mcp_stdio(socket, &path),
        Command::Receipts { action } => records::receipts(action),
        Command::Ledger {
            action,
            config,
            path,
        } => records::ledger(action, config, path),
    }
}

/// `carapace mcp-stdio`: MCP on stdin and stdout, bridged to the outbound socket. Logs go to
/// stderr; stdout carries only MCP messages.
fn mcp_stdio(socket: PathBuf, path: &str) -> ExitCode {
    serve::init_logging(carapace::config::LogFormat::Text, "warn");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let input = tokio::io::BufReader::new(tokio::io::stdin());
    match rt.block_on(carapace::outbound::mcp_stdio::run(
        socket,
        path,
        input,
        tokio::io::stdout(),
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("carapace mcp-stdio: {e}");
            ExitCode::FAILURE
        }
    }
}
