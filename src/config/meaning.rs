//! The meaning pass: checks every section the schema pass found sound, and derives addresses and secrets.

use std::collections::BTreeMap;
use std::path::Path;

use super::app::{check_app, check_tools, resolve_app, AppConfig, ToolOverride};
use super::front::{check_front, resolve_front, FrontConfig};
use super::limits::{check_limits, LimitsConfig};
use super::listeners::{check_listeners, resolve_listeners, ListenersConfig};
use super::ops::{check_ops, check_runtime_and_log, LogConfig, OpsConfig, RuntimeConfig};
use super::outbound::{check_outbound, OutboundConfig};
use super::pairing::{check_gateway, check_pairing, resolve_pairing, GatewayConfig, PairingConfig};
use super::rate_limits::{check_rate_limits, RateLimitsConfig};
use super::secrets::fix_secret;
use super::shared_state::{check_shared_state, resolve_shared_state, SharedStateConfig};
use super::{err, fix_path, Config, ConfigError, Derived};

pub(super) fn check_telemetry(
    t: Option<&crate::telemetry::TelemetryConfig>,
    errors: &mut Vec<ConfigError>,
) {
    let Some(otlp) = t.and_then(|t| t.otlp.as_ref()) else {
        return;
    };
    if !otlp.endpoint.starts_with("http://") || otlp.endpoint.parse::<http::Uri>().is_err() {
        errors.push(err(
            "/telemetry/otlp/endpoint",
            "must be http://HOST:PORT/v1/traces (OTLP over HTTP; TLS is not built in)",
        ));
    }
    if otlp.export_interval_ms == 0 {
        errors.push(err(
            "/telemetry/otlp/export_interval_ms",
            "must be at least 1",
        ));
    }
}

/// Meaning errors of the sections the schema pass found no error in.
pub(super) fn meaning_of_sound_sections(
    json: &serde_json::Value,
    structural: &[ConfigError],
    base: &Path,
) -> Vec<ConfigError> {
    /// The section `key`, typed, when no structural error is inside it or names it missing.
    fn sound<T: serde::de::DeserializeOwned>(
        json: &serde_json::Value,
        structural: &[ConfigError],
        key: &str,
    ) -> Option<T> {
        let prefix = format!("/{key}");
        let broken = structural.iter().any(|e| {
            e.path == prefix
                || e.path.starts_with(&format!("{prefix}/"))
                || (e.path.is_empty() && e.message.contains(&format!("\"{key}\"")))
        });
        if broken {
            return None;
        }
        let v = json.get(key).cloned().unwrap_or(serde_json::json!({}));
        serde_json::from_value(v).ok()
    }
    let mut owned = PartsOwned {
        outbound: sound(json, structural, "outbound"),
        pairing: sound(json, structural, "pairing"),
        gateway: sound(json, structural, "gateway"),
        front: sound(json, structural, "front"),
        listeners: sound(json, structural, "listeners"),
        app: sound(json, structural, "app"),
        rate_limits: sound(json, structural, "rate_limits"),
        limits: sound(json, structural, "limits"),
        tools: sound(json, structural, "tools"),
        runtime: sound(json, structural, "runtime"),
        log: sound(json, structural, "log"),
        ops: sound(json, structural, "ops"),
        shared_state: sound(json, structural, "shared_state"),
    };
    owned.resolve(base);
    let mut errors = Vec::new();
    check_meaning(&owned.parts(), &mut errors);
    errors
}

/// Owned sections for [`meaning_of_sound_sections`].
struct PartsOwned {
    outbound: Option<OutboundConfig>,
    pairing: Option<PairingConfig>,
    gateway: Option<GatewayConfig>,
    front: Option<FrontConfig>,
    listeners: Option<ListenersConfig>,
    app: Option<AppConfig>,
    rate_limits: Option<RateLimitsConfig>,
    limits: Option<LimitsConfig>,
    tools: Option<BTreeMap<String, ToolOverride>>,
    runtime: Option<RuntimeConfig>,
    log: Option<LogConfig>,
    ops: Option<OpsConfig>,
    shared_state: Option<SharedStateConfig>,
}

impl PartsOwned {
    fn parts(&self) -> Parts<'_> {
        Parts {
            outbound: self.outbound.as_ref(),
            pairing: self.pairing.as_ref(),
            gateway: self.gateway.as_ref(),
            front: self.front.as_ref(),
            listeners: self.listeners.as_ref(),
            app: self.app.as_ref(),
            rate_limits: self.rate_limits.as_ref(),
            limits: self.limits.as_ref(),
            tools: self.tools.as_ref(),
            runtime: self.runtime.as_ref(),
            log: self.log.as_ref(),
            ops: self.ops.as_ref(),
            shared_state: self.shared_state.as_ref(),
        }
    }

    /// Resolve relative paths as [`resolve_paths`] does for a whole configuration.
    fn resolve(&mut self, base: &Path) {
        if let Some(l) = &mut self.listeners {
            resolve_listeners(l, base);
        }
        if let Some(f) = &mut self.front {
            resolve_front(f, base);
        }
        if let Some(a) = &mut self.app {
            resolve_app(a, base);
        }
        if let Some(p) = &mut self.pairing {
            resolve_pairing(p, base);
        }
        if let Some(s) = &mut self.shared_state {
            resolve_shared_state(s, base);
        }
    }
}

/// Resolve relative paths against the configuration file's directory.
pub(super) fn resolve_paths(c: &mut Config, base: &Path) {
    fix_path(&mut c.state_dir, base);
    resolve_shared_state(&mut c.shared_state, base);
    resolve_listeners(&mut c.listeners, base);
    resolve_front(&mut c.front, base);
    resolve_app(&mut c.app, base);
    if let Some(p) = &mut c.pairing {
        resolve_pairing(p, base);
    }
    if let Some(o) = &mut c.outbound {
        if let Some(l) = &mut o.listen {
            fix_path(&mut l.cert_file, base);
            fix_path(&mut l.key_file, base);
            super::oauth::resolve_oauth(&mut l.oauth, base);
        }
        fix_path(&mut o.socket, base);
        super::pinning::resolve_pinning(&mut o.pinning, base);
        for e in o.eat.values_mut() {
            for f in [&mut e.ca_file, &mut e.cert_file, &mut e.key_file]
                .into_iter()
                .flatten()
            {
                fix_path(f, base);
            }
        }
        for skill in o.skills.values_mut() {
            if let Some(ca) = &mut skill.ca_file {
                fix_path(ca, base);
            }
            if let Some(auth) = &mut skill.auth {
                fix_secret(&mut auth.secret, base);
            }
        }
    }
    if let Some(f) = &mut c.peers.file {
        fix_path(f, base);
    }
    if let Some(s) = &mut c.admin.socket {
        fix_path(s, base);
    }
}

/// The typed sections of a configuration. A section is `None` when the schema pass found an
/// error inside it: its meaning is then not checked, but every other section's still is, so
/// one run names every error.
pub(super) struct Parts<'a> {
    outbound: Option<&'a OutboundConfig>,
    pairing: Option<&'a PairingConfig>,
    gateway: Option<&'a GatewayConfig>,
    front: Option<&'a FrontConfig>,
    listeners: Option<&'a ListenersConfig>,
    app: Option<&'a AppConfig>,
    rate_limits: Option<&'a RateLimitsConfig>,
    limits: Option<&'a LimitsConfig>,
    tools: Option<&'a BTreeMap<String, ToolOverride>>,
    runtime: Option<&'a RuntimeConfig>,
    log: Option<&'a LogConfig>,
    ops: Option<&'a OpsConfig>,
    shared_state: Option<&'a SharedStateConfig>,
}

impl<'a> Parts<'a> {
    pub(super) fn of(c: &'a Config) -> Self {
        Parts {
            outbound: c.outbound.as_ref(),
            pairing: c.pairing.as_ref(),
            gateway: c.gateway.as_ref(),
            front: Some(&c.front),
            listeners: Some(&c.listeners),
            app: Some(&c.app),
            rate_limits: Some(&c.rate_limits),
            limits: Some(&c.limits),
            tools: Some(&c.tools),
            runtime: Some(&c.runtime),
            log: Some(&c.log),
            ops: Some(&c.ops),
            shared_state: Some(&c.shared_state),
        }
    }
}

pub(super) fn check_meaning(p: &Parts<'_>, errors: &mut Vec<ConfigError>) -> Derived {
    let mut d = Derived::default();
    if let Some(l) = p.listeners {
        // Bearer tokens or RFC 9421 signatures authenticate callers without a certificate.
        let per_request = p.front.is_some_and(|f| f.authenticates_each_request());
        check_listeners(l, p.front.map(|f| f.protocol), per_request, &mut d, errors);
    }
    if let Some(f) = p.front {
        check_front(f, p.app, &mut d, errors);
    }
    if let Some(a) = p.app {
        check_app(a, &mut d, errors);
    }
    if let Some(pairing) = p.pairing {
        check_pairing(pairing, p.listeners, &mut d, errors);
    }
    if let Some(g) = p.gateway {
        check_gateway(g, errors);
    }
    if let Some(o) = p.outbound {
        check_outbound(o, p.gateway.is_some(), &mut d, errors);
    }
    if let Some(rl) = p.rate_limits {
        check_rate_limits(rl, p.shared_state, errors);
    }
    if let Some(l) = p.limits {
        check_limits(l, errors);
    }
    check_tools(p.tools, errors);
    check_runtime_and_log(p.runtime, p.log, errors);
    if let Some(s) = p.shared_state {
        check_shared_state(s, &mut d, errors);
    }
    if let Some(ops) = p.ops {
        check_ops(ops, &mut d, errors);
    }
    d
}
