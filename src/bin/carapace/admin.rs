//! Commands that talk to a running carapace through its admin socket (`kill-switch`, `peers`,
//! `reload`, `identity`), and `identity-secret`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use carapace::config;

use crate::EXIT_CONFIG;

#[derive(Subcommand, Clone)]
pub(crate) enum PeersAction {
    /// Print every peer record, with when its certificate expires (`mtls_cert_not_after`)
    /// where carapace knows it and when it last made an accepted call (`last_seen_at`).
    List,
    /// Revoke a peer: its next request fails.
    Revoke { component_id: String },
}

#[derive(Subcommand, Clone)]
pub(crate) enum ToolsAction {
    /// Print the pin of every served tool (the form `app.pinning.pins` takes) and every tool
    /// withheld because its definition changed, with the fields that changed.
    Pins,
    /// Approve a withheld tool's new definition: it is served again at once.
    Approve {
        name: String,
        /// A tool of the outbound role (a paired peer's or a skill's), not of the app.
        #[arg(long)]
        outbound: bool,
    },
    /// Search the tools a gateway's outbound role knows (its paired peers, skills and EAT
    /// catalogs) by name, description and tags, through its outbound socket.
    Search {
        /// Words to look for (plain text; no query syntax).
        query: String,
        /// The outbound socket (default: `outbound.socket` of --config).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Most results.
        #[arg(short = 'n', long, default_value_t = 10)]
        limit: u32,
    },
}

#[derive(Subcommand, Clone)]
pub(crate) enum KillAction {
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

/// The variable naming the admin socket when neither `--admin-socket` nor `-c` does (the chart
/// sets it in the container, so commands run there find the socket).
pub(crate) const ADMIN_SOCKET_ENV: &str = "CARAPACE_ADMIN_SOCKET";

/// The admin socket: `--admin-socket`, else `-c`'s, else [`ADMIN_SOCKET_ENV`]'s (`from_env`).
fn admin_socket_of(
    admin_socket: Option<PathBuf>,
    config: Option<PathBuf>,
    from_env: Option<std::ffi::OsString>,
) -> Result<PathBuf, String> {
    match (admin_socket, config, from_env) {
        (Some(p), _, _) => Ok(p),
        // Only the socket's path is read: no secret the file names needs to be there.
        (None, Some(c), _) => config::admin_socket_of(&c),
        (None, None, Some(p)) if !p.is_empty() => Ok(PathBuf::from(p)),
        (None, None, _) => Err(format!(
            "give --admin-socket PATH or -c CONFIG (or set {ADMIN_SOCKET_ENV})"
        )),
    }
}

/// The admin socket from the flags, or a usage error.
fn socket_or_exit(
    admin_socket: Option<PathBuf>,
    config: Option<PathBuf>,
) -> Result<PathBuf, ExitCode> {
    admin_socket_of(admin_socket, config, std::env::var_os(ADMIN_SOCKET_ENV)).map_err(|e| {
        eprintln!("{e}");
        ExitCode::from(EXIT_CONFIG)
    })
}

/// `carapace kill-switch status|engage|release`.
pub(crate) fn kill_switch(
    action: KillAction,
    admin_socket: Option<PathBuf>,
    config: Option<PathBuf>,
) -> ExitCode {
    let sock = match socket_or_exit(admin_socket, config) {
        Ok(s) => s,
        Err(code) => return code,
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

/// `carapace peers list|revoke`.
pub(crate) fn peers(
    action: PeersAction,
    admin_socket: Option<PathBuf>,
    config: Option<PathBuf>,
) -> ExitCode {
    let sock = match socket_or_exit(admin_socket, config) {
        Ok(s) => s,
        Err(code) => return code,
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

/// `carapace tools pins|approve`.
pub(crate) fn tools(
    action: ToolsAction,
    admin_socket: Option<PathBuf>,
    config: Option<PathBuf>,
) -> ExitCode {
    if let ToolsAction::Search {
        query,
        socket,
        limit,
    } = &action
    {
        return search(query, socket.clone(), config, *limit);
    }
    let sock = match socket_or_exit(admin_socket, config) {
        Ok(s) => s,
        Err(code) => return code,
    };
    match action {
        ToolsAction::Search { .. } => unreachable!("answered above"),
        ToolsAction::Pins => admin_call(&sock, http::Method::GET, "/v1/tools/pins", None),
        ToolsAction::Approve { name, outbound } => admin_call(
            &sock,
            http::Method::POST,
            "/v1/tools/approve",
            Some(serde_json::json!({ "tool": name, "outbound": outbound })),
        ),
    }
}

/// `carapace tools search`: `GET /v1/tools/search` on the outbound socket.
fn search(query: &str, socket: Option<PathBuf>, config: Option<PathBuf>, limit: u32) -> ExitCode {
    let socket = match (socket, config) {
        (Some(s), _) => s,
        (None, Some(c)) => match config::load(&c) {
            Ok(l) => match &l.config.outbound {
                Some(o) => o.socket.clone(),
                None => {
                    eprintln!("{}: no `outbound` section", c.display());
                    return ExitCode::from(EXIT_CONFIG);
                }
            },
            Err(e) => {
                for e in &e.0 {
                    eprintln!("{}: {e}", c.display());
                }
                return ExitCode::from(EXIT_CONFIG);
            }
        },
        (None, None) => {
            eprintln!("give --socket, or --config");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let q: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("q", query)
        .append_pair("limit", &limit.to_string())
        .finish();
    admin_call(
        &socket,
        http::Method::GET,
        &format!("/v1/tools/search?{q}"),
        None,
    )
}

/// `carapace reload`.
pub(crate) fn reload(admin_socket: Option<PathBuf>, config: Option<PathBuf>) -> ExitCode {
    match socket_or_exit(admin_socket, config) {
        Ok(s) => admin_call(&s, http::Method::POST, "/v1/reload", None),
        Err(code) => code,
    }
}

/// `carapace identity-secret`.
pub(crate) fn print_identity_secret(config: &Path, name: &str) -> ExitCode {
    match identity_secret(config, name) {
        Ok(secret) => {
            println!("{secret}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
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

pub(crate) fn admin_call(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_socket_comes_from_the_flag_then_the_config_then_the_variable() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("carapace.yaml");
        std::fs::write(&cfg, "state_dir: /srv/state\n").unwrap();
        let env = Some(std::ffi::OsString::from("/from/env.sock"));
        let flag = Some(PathBuf::from("/from/flag.sock"));
        assert_eq!(
            admin_socket_of(flag, Some(cfg.clone()), env.clone()).unwrap(),
            PathBuf::from("/from/flag.sock")
        );
        assert_eq!(
            admin_socket_of(None, Some(cfg), env.clone()).unwrap(),
            PathBuf::from("/srv/state/admin.sock")
        );
        assert_eq!(
            admin_socket_of(None, None, env).unwrap(),
            PathBuf::from("/from/env.sock")
        );
        for unset in [None, Some(std::ffi::OsString::new())] {
            let e = admin_socket_of(None, None, unset).unwrap_err();
            assert!(e.contains(ADMIN_SOCKET_ENV), "{e}");
        }
    }
}
