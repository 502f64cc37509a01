//! The `limits` section: connection, body, header, time and concurrency limits.

use schemars::JsonSchema;
use serde::Deserialize;

use super::{err, ConfigError};

/// Connection, body and concurrency limits.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Open caller connections per listener. At the cap, the oldest connection that is not
    /// a paired peer's and has no call in flight is closed to make room; when there is none,
    /// the new connection is closed.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Connections one peer may hold on a listener (a paired peer by its `component_id`,
    /// anyone else by address).
    #[serde(default = "default_max_connections_per_peer")]
    pub max_connections_per_peer: usize,
    /// Time for a connection's first request to arrive, in ms (and the whole life of a
    /// connection whose certificate is not paired).
    #[serde(default = "default_first_request_timeout_ms")]
    pub first_request_timeout_ms: u64,
    /// A connection with no call in flight for this long is closed, in ms.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Largest request head (HTTP/1.1) or header list (HTTP/2), in bytes.
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: usize,
    /// Calls in flight; more are shed with 503.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Largest request body, in bytes.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: u64,
    /// Time for the whole request body to arrive, in ms.
    #[serde(default = "default_body_timeout_ms")]
    pub body_timeout_ms: u64,
    /// Time for the request head to arrive, in ms (HTTP/1.1 header-read timeout).
    #[serde(default = "default_header_read_timeout_ms")]
    pub header_read_timeout_ms: u64,
    /// Time for the TLS handshake, in ms.
    #[serde(default = "default_tls_handshake_timeout_ms")]
    pub tls_handshake_timeout_ms: u64,
    /// Largest response body accepted from the app, in bytes.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
    /// On SIGTERM, how long calls in flight may take to finish, in seconds.
    #[serde(default = "default_drain_timeout_s")]
    pub drain_timeout_s: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_connections: default_max_connections(),
            max_connections_per_peer: default_max_connections_per_peer(),
            first_request_timeout_ms: default_first_request_timeout_ms(),
            idle_timeout_ms: default_idle_timeout_ms(),
            max_header_bytes: default_max_header_bytes(),
            max_in_flight: default_max_in_flight(),
            max_body_bytes: default_max_body_bytes(),
            body_timeout_ms: default_body_timeout_ms(),
            header_read_timeout_ms: default_header_read_timeout_ms(),
            tls_handshake_timeout_ms: default_tls_handshake_timeout_ms(),
            max_response_bytes: default_max_response_bytes(),
            drain_timeout_s: default_drain_timeout_s(),
        }
    }
}

fn default_max_connections() -> usize {
    1024
}
fn default_max_connections_per_peer() -> usize {
    256
}
fn default_first_request_timeout_ms() -> u64 {
    10_000
}
fn default_idle_timeout_ms() -> u64 {
    60_000
}
fn default_max_header_bytes() -> usize {
    16 * 1024
}
fn default_max_in_flight() -> usize {
    256
}
fn default_max_body_bytes() -> u64 {
    1 << 20
}
fn default_body_timeout_ms() -> u64 {
    10_000
}
fn default_header_read_timeout_ms() -> u64 {
    5_000
}
fn default_tls_handshake_timeout_ms() -> u64 {
    5_000
}
fn default_max_response_bytes() -> u64 {
    4 << 20
}
fn default_drain_timeout_s() -> u64 {
    30
}

pub(super) fn check_limits(l: &LimitsConfig, errors: &mut Vec<ConfigError>) {
    for (path, v) in [
        ("/limits/max_connections", l.max_connections as u64),
        (
            "/limits/max_connections_per_peer",
            l.max_connections_per_peer as u64,
        ),
        (
            "/limits/first_request_timeout_ms",
            l.first_request_timeout_ms,
        ),
        ("/limits/idle_timeout_ms", l.idle_timeout_ms),
        ("/limits/max_in_flight", l.max_in_flight as u64),
        ("/limits/max_body_bytes", l.max_body_bytes),
        ("/limits/body_timeout_ms", l.body_timeout_ms),
        ("/limits/header_read_timeout_ms", l.header_read_timeout_ms),
        (
            "/limits/tls_handshake_timeout_ms",
            l.tls_handshake_timeout_ms,
        ),
        ("/limits/max_response_bytes", l.max_response_bytes),
    ] {
        if v == 0 {
            errors.push(err(path, "must be at least 1"));
        }
    }
    if l.max_header_bytes < 8192 {
        errors.push(err("/limits/max_header_bytes", "must be at least 8192"));
    }
}
