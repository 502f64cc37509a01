//! The secret guard of each role ([`carapace_filters::secret_guard`]), built from the
//! configuration: the built-in detectors, `secret_guard.patterns`, and as exact values
//! `secret_guard.values` and every secret carapace itself holds.

use std::collections::HashMap;
use std::sync::Arc;

use carapace_filters::secret_guard::{Detectors, GuardAction, GuardMode, SecretGuard};

use crate::config::{GuardActionConfig, GuardModeConfig, Loaded};

/// Which side of the shell the guard stands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The tool-host side: results leaving for the caller.
    Inbound,
    /// The gateway side: arguments leaving for a peer or a skill.
    Outbound,
}

/// The guard of `role`, or `None` when it is off.
pub fn of(cfg: &Loaded, role: Role) -> Option<Arc<SecretGuard>> {
    let g = &cfg.config.secret_guard;
    let (mode, name) = match role {
        Role::Inbound => (g.inbound_mode(), "inbound"),
        Role::Outbound => (g.outbound_mode(), "outbound"),
    };
    let mode = match mode {
        GuardModeConfig::Off => return None,
        GuardModeConfig::Warn => GuardMode::Warn,
        GuardModeConfig::Enforce => GuardMode::Enforce,
    };
    let action = |a: GuardActionConfig| match a {
        GuardActionConfig::Redact => GuardAction::Redact,
        GuardActionConfig::Refuse => GuardAction::Refuse,
    };
    let tools: HashMap<String, GuardAction> = g
        .tools
        .iter()
        .map(|(t, a)| (t.clone(), action(*a)))
        .collect();
    let detectors =
        Detectors::new(&g.patterns, own_secrets(cfg)).expect("validated with the configuration");
    Some(Arc::new(SecretGuard::new(
        detectors,
        mode,
        action(g.action.unwrap_or(GuardActionConfig::Redact)),
        tools,
        name,
    )))
}

/// The configured values and the secrets carapace holds, by name (text ones only).
fn own_secrets(cfg: &Loaded) -> Vec<(String, String)> {
    let mut named: Vec<(String, &crate::config::Secret)> = cfg
        .guard_values
        .iter()
        .map(|(n, s)| (n.clone(), s))
        .collect();
    named.extend(
        cfg.caller_keys
            .iter()
            .map(|(id, s)| (format!("caller_key_{id}"), s)),
    );
    named.extend(cfg.app_secret.iter().map(|s| ("app_secret".to_string(), s)));
    named.extend(
        cfg.redis_password
            .iter()
            .map(|s| ("redis_password".to_string(), s)),
    );
    named.extend(
        cfg.mcp_session_key
            .iter()
            .map(|s| ("mcp_session_key".to_string(), s)),
    );
    named.extend(
        cfg.outbound_skills
            .iter()
            .filter_map(|(id, k)| k.secret.as_ref().map(|s| (format!("skill_secret_{id}"), s))),
    );
    named
        .into_iter()
        .filter_map(|(n, s)| {
            let text = std::str::from_utf8(s.bytes()).ok()?.trim().to_owned();
            Some((n, text))
        })
        .collect()
}
