//! Configuration reload (SIGHUP and the admin socket): everything is built first and swapped
//! in only if all of it succeeded.

use std::sync::Arc;

use crate::config::Loaded;
use crate::inbound::http_stage::build_stack;
/// The service every listener hands requests to.
use crate::server::shared::{switches, tls_acceptor, Shared};

/// The settings that take effect only at start, each as its name and a text that differs
/// when the setting does.
fn restart_only(l: &Loaded) -> Vec<(&'static str, String)> {
    let c = &l.config;
    let nonce = c
        .front
        .auth
        .as_ref()
        .map(|a| (a.nonce_ttl_s, a.nonce_capacity));
    let limits = &c.limits;
    vec![
        (
            "listeners.unix, listeners.tcp.address",
            format!("{:?}{:?}", c.listeners.unix, l.tcp_address),
        ),
        ("state_dir", format!("{:?}", c.state_dir)),
        (
            "front.protocol, front.skill_id",
            format!("{:?}{:?}", c.front.protocol, l.front_skill_id),
        ),
        ("front.auth nonce settings", format!("{nonce:?}")),
        ("shared_state", format!("{:?}", c.shared_state)),
        ("ops.address", format!("{:?}", l.ops_address)),
        ("admin.socket", format!("{:?}", l.admin_socket())),
        ("peers.file", format!("{:?}", l.peers_file())),
        ("limits.max_connections", limits.max_connections.to_string()),
        ("telemetry", format!("{:?}", c.telemetry)),
        (
            "limits.max_connections_per_peer",
            limits.max_connections_per_peer.to_string(),
        ),
        ("log", format!("{:?}", c.log)),
        ("runtime", format!("{:?}", c.runtime)),
        ("pairing", format!("{:?}", c.pairing)),
        ("gateway", format!("{:?}", c.gateway)),
        ("outbound", format!("{:?}", c.outbound)),
        ("outbound skill secrets", outbound_secrets(l)),
        // Built once at start, from these settings and files:
        (
            "the MCP sessions (front.mcp session_key, session lifetimes)",
            mcp_sessions(l),
        ),
        (
            "front.eat (on or off, keys_file)",
            format!("{:?}", c.front.eat.as_ref().map(|e| &e.keys_file)),
        ),
        ("caller_tools", format!("{:?}", c.caller_tools)),
        ("receipts", format!("{:?}", c.receipts)),
        ("ledger", format!("{:?}", c.ledger)),
        (
            "idempotency.max_entries, .max_bytes",
            format!("{} {}", c.idempotency.max_entries, c.idempotency.max_bytes),
        ),
        ("metering (on or off)", c.meters().to_string()),
        (
            "the shared state's password file",
            digest(l.redis_password.as_ref()),
        ),
        // The outbound role's stack is built at start, with what it takes of the secret
        // guard (all but the inbound mode) and of the limits.
        (
            "on a gateway, secret_guard (but inbound) and limits.max_body_bytes, \
             .body_timeout_ms, .max_in_flight, .max_response_bytes",
            outbound_stack(c),
        ),
    ]
}

/// What the MCP sessions are built from at start: the session key (its digest) and the
/// session lifetimes.
fn mcp_sessions(l: &Loaded) -> String {
    let lifetimes = l
        .config
        .front
        .mcp
        .as_ref()
        .map(|m| (m.session_idle_timeout_s, m.session_max_lifetime_s));
    format!("{}{lifetimes:?}", digest(l.mcp_session_key.as_ref()))
}

/// What a gateway's outbound stack takes at start: the secret guard but its inbound mode, and
/// the body and response limits (nothing without an outbound role).
fn outbound_stack(c: &crate::config::Config) -> String {
    if c.outbound.is_none() {
        return String::new();
    }
    let guard = crate::config::SecretGuardConfig {
        inbound: None,
        ..c.secret_guard.clone()
    };
    let l = &c.limits;
    let sizes = (
        l.max_body_bytes,
        l.body_timeout_ms,
        l.max_in_flight,
        l.max_response_bytes,
    );
    format!("{guard:?}{sizes:?}")
}

/// A digest of a loaded secret (only the digest is compared, never shown).
fn digest(secret: Option<&crate::config::Secret>) -> String {
    use sha2::{Digest, Sha256};
    secret.map_or_else(String::new, |s| hex::encode(Sha256::digest(s.bytes())))
}

/// Settings that only take effect at start; a reload that changes one is refused.
fn restart_only_changes(old: &Loaded, new: &Loaded) -> Vec<String> {
    restart_only(old)
        .into_iter()
        .zip(restart_only(new))
        .filter(|((_, a), (_, b))| a != b)
        .map(|((what, _), _)| format!("{what} cannot change on reload; restart to apply it"))
        .collect()
}

/// A digest of the outbound skills' loaded secrets, by skill id: the outbound role signs with
/// the secrets read at start, so a rotated secret file is a change to restart for (the
/// `outbound` section names the file, not what is in it). Only the digest is compared.
fn outbound_secrets(loaded: &Loaded) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for (id, skill) in &loaded.outbound_skills {
        h.update((id.len() as u64).to_be_bytes());
        h.update(id.as_bytes());
        match &skill.secret {
            Some(secret) => {
                h.update([1]);
                h.update((secret.bytes().len() as u64).to_be_bytes());
                h.update(secret.bytes());
            }
            None => h.update([0]),
        }
    }
    hex::encode(h.finalize())
}

/// Apply a reloaded configuration: everything is built first and swapped in only if all of it
/// succeeded, so a bad configuration leaves the old one serving. Reloads are serialized.
pub async fn reload(shared: &Arc<Shared>) -> Result<(), Vec<String>> {
    let _guard = shared.reload_lock.lock().await;
    let old = shared.config.load_full();
    let prepared = crate::config::load(&old.source)
        .map_err(|e| e.0.iter().map(|e| e.to_string()).collect::<Vec<_>>())
        .and_then(|new| {
            let changed = restart_only_changes(&old, &new);
            if !changed.is_empty() {
                return Err(changed);
            }
            let tls = tls_acceptor(&new).map_err(|e| vec![e.to_string()])?;
            Ok((new, tls))
        });
    let (new, tls) = match prepared {
        Ok(p) => p,
        Err(errors) => {
            for e in &errors {
                tracing::error!("reload refused: {e}");
            }
            shared.metrics.reload(false);
            return Err(errors);
        }
    };
    let new = Arc::new(new);
    // Tool settings from the configuration (timeouts, the skill, the filter, the pins) shape
    // the compiled catalog.
    let tools = |l: &Loaded| {
        let c = &l.config;
        format!(
            "{:?}{:?}{:?}{:?}{:?}",
            c.tools, c.app.skill, c.app.filter, c.app.pinning, l.pins
        )
    };
    let tools_changed = tools(&new) != tools(&old);
    // (`ChildSpec` compares the environment's values; its `Debug` shows only the names.)
    let app = |l: &Loaded| {
        let a = &l.config.app;
        format!("{:?}{:?}{:?}", a.protocol, a.pool, a.mcp)
    };
    if new.app_target != old.app_target || app(&new) != app(&old) {
        // A command app is stopped when the last call using it ends, and a new one started.
        shared.app.store(Arc::new(crate::app::AppConn::connect(
            &new,
            shared.workers.count(),
        )));
    }
    let stack = build_stack(&new, shared);
    shared.kill_switch.set_config(switches(&new));
    shared.tls.store(tls.map(Arc::new));
    shared.config.store(new);
    shared.stack.store(Arc::new(stack));
    if let Err(e) = shared.peers.reload_if_changed() {
        tracing::error!("peer store kept as it was: {e}");
    }
    shared.metrics.peers.set(shared.peers.len() as i64);
    if tools_changed {
        shared.catalog.invalidate();
    }
    shared.request_discovery();
    shared.metrics.reload(true);
    tracing::info!("config_reloaded path={}", old.source.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gateway with one outbound skill signed with the secret in `skill.key`.
    fn gateway(dir: &std::path::Path, secret: &[u8]) -> Loaded {
        gateway_with(dir, secret, "")
    }

    /// [`gateway`] with `extra` added to its configuration.
    fn gateway_with(dir: &std::path::Path, secret: &[u8], extra: &str) -> Loaded {
        std::fs::write(dir.join("skill.key"), secret).unwrap();
        let d = dir.display();
        std::fs::write(
            dir.join("carapace.yaml"),
            format!(
                r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {d}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://127.0.0.1:9" }}
ops: {{ address: "" }}
gateway: {{ id: gw_home }}
outbound:
  socket: {d}/outbound.sock
  peers: {{}}
  skills:
    demo.echo:
      url: "http://127.0.0.1:9"
      capabilities: [demo.echo]
      auth: {{ mode: hmac, secret: {{ file: {d}/skill.key }} }}
{extra}
"#
            ),
        )
        .unwrap();
        crate::config::load(&dir.join("carapace.yaml")).unwrap()
    }

    #[test]
    fn a_rotated_outbound_skill_secret_is_refused_on_reload_without_showing_it() {
        let dir = tempfile::tempdir().unwrap();
        let old = gateway(dir.path(), b"first-skill-secret");
        assert!(restart_only_changes(&old, &gateway(dir.path(), b"first-skill-secret")).is_empty());
        let changes = restart_only_changes(&old, &gateway(dir.path(), b"second-skill-secret"));
        assert_eq!(
            changes,
            ["outbound skill secrets cannot change on reload; restart to apply it"]
        );
    }

    /// What is built once at start (the ledger, receipts, the outbound role's secret guard
    /// and limits) is not changed by a reload that would then say it applied it: such a
    /// reload is refused, naming the setting.
    #[test]
    fn settings_built_at_start_are_refused_on_reload() {
        let dir = tempfile::tempdir().unwrap();
        let key = b"skill-secret";
        let old = gateway(dir.path(), key);
        for (extra, named) in [
            ("ledger: {}", "ledger"),
            ("receipts: { sign: true, provider_id: p }", "receipts"),
            (
                "limits: { max_body_bytes: 4096 }",
                "on a gateway, secret_guard",
            ),
            (
                "secret_guard: { outbound: enforce }",
                "on a gateway, secret_guard",
            ),
            (
                "idempotency: { max_entries: 10 }",
                "idempotency.max_entries",
            ),
        ] {
            let changes = restart_only_changes(&old, &gateway_with(dir.path(), key, extra));
            assert_eq!(changes.len(), 1, "{extra}: {changes:?}");
            assert!(changes[0].starts_with(named), "{extra}: {changes:?}");
        }
        // What the front's stack (rebuilt on reload) alone reads still reloads.
        for extra in [
            "secret_guard: { inbound: enforce }",
            "limits: { max_header_bytes: 8192 }",
        ] {
            let changes = restart_only_changes(&old, &gateway_with(dir.path(), key, extra));
            assert!(changes.is_empty(), "{extra}: {changes:?}");
        }
    }
}
