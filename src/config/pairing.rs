//! The `pairing` and `gateway` sections: the tool-host pairing endpoint and the gateway's identity.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

use super::listeners::ListenersConfig;
use super::{err, fix_path, ConfigError, Derived};

/// The tool-host side of pairing.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PairingConfig {
    /// `IP:PORT` of the pairing WebSocket endpoint; never the tool listener's. Plain `ws://`
    /// pairing is for loopback addresses only.
    pub listen: String,
    /// Path of the endpoint.
    #[serde(default = "default_pairing_path")]
    pub path: String,
    /// This tool host's `component_id` (the `<name>` the operator pairs).
    pub component_id: String,
    /// The gateway's Ed25519 public key (base64): only its `pair.init` is answered.
    pub gateway_public_key_ed25519: String,
    /// Serve `wss://` with this certificate (required off loopback); `pair.identity` then
    /// carries its fingerprint, which the gateway checks against the certificate it saw.
    #[serde(default)]
    pub tls: Option<PairingTlsConfig>,
}

/// The pairing endpoint's own certificate.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PairingTlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

fn default_pairing_path() -> String {
    "/v1/pair".into()
}

/// The gateway role.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// The gateway's id, sent in `pair.init` and the common name of its client certificate.
    pub id: String,
}
pub(super) fn resolve_pairing(p: &mut PairingConfig, base: &Path) {
    if let Some(tls) = &mut p.tls {
        fix_path(&mut tls.cert_file, base);
        fix_path(&mut tls.key_file, base);
    }
}
pub(super) fn check_pairing(
    p: &PairingConfig,
    listeners: Option<&ListenersConfig>,
    d: &mut Derived,
    errors: &mut Vec<ConfigError>,
) {
    match p.listen.parse::<SocketAddr>() {
        Ok(a) if a.port() != 0 && Some(a) == d.tcp_address => errors.push(err(
            "/pairing/listen",
            "the pairing endpoint must not share the tool listener's port",
        )),
        Ok(a) if !a.ip().is_loopback() && p.tls.is_none() => errors.push(err(
            "/pairing/listen",
            "pairing over plain ws:// is allowed on loopback addresses only; set pairing.tls",
        )),
        Ok(a) => d.pairing_address = Some(a),
        Err(_) => errors.push(err(
            "/pairing/listen",
            format!("`{}` is not IP:PORT", p.listen),
        )),
    }
    if !p.path.starts_with('/') {
        errors.push(err("/pairing/path", "must start with /"));
    }
    if let Some(tls) = &p.tls {
        for (at, f) in [
            ("/pairing/tls/cert_file", &tls.cert_file),
            ("/pairing/tls/key_file", &tls.key_file),
        ] {
            if let Err(e) = std::fs::metadata(f) {
                errors.push(err(at, format!("{}: {e}", f.display())));
            }
        }
    }
    if p.component_id.is_empty() || http::HeaderValue::from_str(&p.component_id).is_err() {
        errors.push(err(
            "/pairing/component_id",
            "must be a non-empty header-safe name",
        ));
    }
    use base64::Engine;
    let key = base64::engine::general_purpose::STANDARD.decode(&p.gateway_public_key_ed25519);
    if !key.is_ok_and(|k| k.len() == 32) {
        errors.push(err(
            "/pairing/gateway_public_key_ed25519",
            "must be the base64 of a 32-byte Ed25519 public key",
        ));
    }
    if listeners.is_some_and(|l| l.tcp.as_ref().and_then(|t| t.tls.as_ref()).is_none()) {
        errors.push(err(
            "/pairing",
            "pairing installs the mTLS certificate of listeners.tcp, which must be set with tls",
        ));
    }
}

pub(super) fn check_gateway(g: &GatewayConfig, errors: &mut Vec<ConfigError>) {
    if g.id.is_empty() || http::HeaderValue::from_str(&g.id).is_err() {
        errors.push(err("/gateway/id", "must be a non-empty header-safe name"));
    }
}
