//! The `listeners` section: the caller-facing Unix socket and TCP (optionally TLS) listeners.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

use super::{err, fix_path, ConfigError, Derived, Protocol};

/// Caller listeners.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListenersConfig {
    /// Local mode: a Unix socket, no authentication and no encryption.
    #[serde(default)]
    pub unix: Option<UnixListenerConfig>,
    /// Remote mode: TCP with TLS 1.3.
    #[serde(default)]
    pub tcp: Option<TcpListenerConfig>,
}

/// A Unix socket listener.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UnixListenerConfig {
    pub path: PathBuf,
    /// File mode of the socket, octal digits.
    #[serde(default = "default_socket_mode")]
    pub mode: String,
}

fn default_socket_mode() -> String {
    "0660".into()
}

/// A TCP listener.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TcpListenerConfig {
    /// `host:port` to bind.
    pub address: String,
    /// TLS 1.3; required except for a skill-v1 front on a loopback address.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
}

/// TLS server settings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain of this listener.
    pub cert_file: PathBuf,
    /// PEM private key of this listener.
    pub key_file: PathBuf,
    /// PEM CA certificates that client certificates must chain to. Setting it requires a
    /// client certificate on every connection (mTLS); tools-v1 fronts must set it.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}
pub(super) fn resolve_listeners(l: &mut ListenersConfig, base: &Path) {
    if let Some(u) = &mut l.unix {
        fix_path(&mut u.path, base);
    }
    if let Some(tls) = l.tcp.as_mut().and_then(|t| t.tls.as_mut()) {
        fix_path(&mut tls.cert_file, base);
        fix_path(&mut tls.key_file, base);
        if let Some(ca) = &mut tls.client_ca_file {
            fix_path(ca, base);
        }
    }
}
pub(super) fn check_listeners(
    l: &ListenersConfig,
    front: Option<Protocol>,
    per_request: bool,
    d: &mut Derived,
    errors: &mut Vec<ConfigError>,
) {
    if l.unix.is_none() && l.tcp.is_none() {
        errors.push(err("/listeners", "at least one of unix or tcp is required"));
    }
    d.unix_mode = 0o660;
    if let Some(u) = &l.unix {
        match u32::from_str_radix(&u.mode, 8) {
            // Local mode has no authentication: the socket's mode is its access control.
            Ok(m) if m & 0o002 != 0 => errors.push(err(
                "/listeners/unix/mode",
                format!(
                    "`{}` lets every local user write to the unauthenticated socket",
                    u.mode
                ),
            )),
            Ok(m) if m <= 0o777 => d.unix_mode = m,
            _ => errors.push(err(
                "/listeners/unix/mode",
                format!("`{}` is not an octal file mode", u.mode),
            )),
        }
    }
    let Some(t) = &l.tcp else { return };
    match t.address.parse::<SocketAddr>() {
        Ok(a) => d.tcp_address = Some(a),
        Err(_) => errors.push(err(
            "/listeners/tcp/address",
            format!("`{}` is not host:port with an IP host", t.address),
        )),
    }
    match (&t.tls, front) {
        (None, Some(p @ (Protocol::ToolsV1 | Protocol::Mcp))) => errors.push(err(
            "/listeners/tcp/tls",
            format!("a {p} front on TCP requires mTLS (remote mode is mTLS only)"),
        )),
        (Some(tls), Some(p @ (Protocol::ToolsV1 | Protocol::Mcp)))
            if tls.client_ca_file.is_none() && !per_request =>
        {
            errors.push(err(
                "/listeners/tcp/tls/client_ca_file",
                format!(
                    "a {p} front on TCP requires client certificates (remote mode is mTLS only)"
                ),
            ))
        }
        (None, Some(Protocol::SkillV1)) if !d.tcp_address.is_some_and(|a| a.ip().is_loopback()) => {
            errors.push(err(
                "/listeners/tcp/tls",
                "plain HTTP is only allowed on a loopback address",
            ))
        }
        _ => {}
    }
    if let Some(tls) = &t.tls {
        for (p, f) in [
            ("/listeners/tcp/tls/cert_file", Some(&tls.cert_file)),
            ("/listeners/tcp/tls/key_file", Some(&tls.key_file)),
            (
                "/listeners/tcp/tls/client_ca_file",
                tls.client_ca_file.as_ref(),
            ),
        ] {
            if let Some(f) = f {
                if let Err(e) = std::fs::metadata(f) {
                    errors.push(err(p, format!("{}: {e}", f.display())));
                }
            }
        }
    }
}
