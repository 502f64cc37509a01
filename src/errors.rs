//! The one table that maps every [`Rejection`] to each front's error code and an HTTP status.
//!
//! Codes come from the two seeds. Where both protocols have a fitting code the more specific
//! one is used on both fronts (`TOOL_NOT_FOUND` over `ROUTING_FAILED`,
//! `SCHEMA_VALIDATION_FAILED` over `INVALID_ARGS` for schema failures); where each protocol
//! names the same failure its own way, each front uses its own name (`UNAUTHORIZED` /
//! `SKILL_AUTH_FAILED`, `TIMEOUT` / `SKILL_TIMEOUT`). README.md carries this table.

use http::StatusCode;

use carapace_filters::Rejection;

use crate::config::Protocol;

/// Error code and HTTP status of a rejection on a front.
pub fn code_and_status(r: &Rejection, front: Protocol) -> (&'static str, StatusCode) {
    let skill = front == Protocol::SkillV1;
    match r {
        Rejection::PairingRequired => ("PAIRING_REQUIRED", StatusCode::UNAUTHORIZED),
        Rejection::Forbidden(_) => ("FORBIDDEN", StatusCode::FORBIDDEN),
        Rejection::AuthFailed(_) if skill => ("SKILL_AUTH_FAILED", StatusCode::UNAUTHORIZED),
        Rejection::AuthFailed(_) => ("UNAUTHORIZED", StatusCode::UNAUTHORIZED),
        Rejection::Disabled(_) => ("GATEWAY_DISABLED", StatusCode::SERVICE_UNAVAILABLE),
        Rejection::RateLimited { .. } => ("RATE_LIMITED", StatusCode::TOO_MANY_REQUESTS),
        Rejection::Overloaded => ("RATE_LIMITED", StatusCode::SERVICE_UNAVAILABLE),
        Rejection::NonceStoreFull { .. } => ("RATE_LIMITED", StatusCode::SERVICE_UNAVAILABLE),
        Rejection::PayloadTooLarge { .. } => ("INVALID_ARGS", StatusCode::PAYLOAD_TOO_LARGE),
        Rejection::BodyTimeout(_) => ("INVALID_ARGS", StatusCode::REQUEST_TIMEOUT),
        Rejection::InvalidRequest { .. } => ("INVALID_ARGS", StatusCode::BAD_REQUEST),
        Rejection::NoRoute(_) => ("ROUTING_FAILED", StatusCode::NOT_FOUND),
        Rejection::ToolNotFound(_) => ("TOOL_NOT_FOUND", StatusCode::NOT_FOUND),
        Rejection::ProtocolVersionUnsupported(_) => {
            ("PROTOCOL_VERSION_UNSUPPORTED", StatusCode::BAD_REQUEST)
        }
        Rejection::StaleTimestamp { .. } => ("NONCE_REPLAY", StatusCode::BAD_REQUEST),
        Rejection::NonceReplay => ("NONCE_REPLAY", StatusCode::CONFLICT),
        Rejection::InputSchema(_) => ("SCHEMA_VALIDATION_FAILED", StatusCode::BAD_REQUEST),
        Rejection::OutputSchema(_) => ("SCHEMA_VALIDATION_FAILED", StatusCode::BAD_GATEWAY),
        Rejection::Timeout(_) if skill => ("SKILL_TIMEOUT", StatusCode::GATEWAY_TIMEOUT),
        Rejection::Timeout(_) => ("TIMEOUT", StatusCode::GATEWAY_TIMEOUT),
        Rejection::AppUnavailable(_) => ("DEPENDENCY_UNAVAILABLE", StatusCode::BAD_GATEWAY),
        Rejection::AppHttp(_) | Rejection::AppInvalid(_) if skill => {
            ("SKILL_HTTP_ERROR", StatusCode::BAD_GATEWAY)
        }
        Rejection::AppHttp(_) | Rejection::AppInvalid(_) => {
            ("DEPENDENCY_UNAVAILABLE", StatusCode::BAD_GATEWAY)
        }
        Rejection::Internal(_) => ("INTERNAL", StatusCode::INTERNAL_SERVER_ERROR),
    }
}

/// Structured details of a rejection for the envelope's `details` object.
pub fn details(r: &Rejection) -> Option<serde_json::Value> {
    use serde_json::json;
    match r {
        Rejection::InputSchema(v) | Rejection::OutputSchema(v) => Some(json!({
            "stage": if matches!(r, Rejection::InputSchema(_)) { "input" } else { "output" },
            "violations": v,
        })),
        Rejection::InvalidRequest {
            path: Some(path), ..
        } => Some(json!({ "path": path })),
        Rejection::RateLimited { scope, retry_after } => Some(json!({
            "scope": scope, "retry_after_s": retry_after.as_secs(),
        })),
        Rejection::PayloadTooLarge { limit } => Some(json!({ "limit_bytes": limit })),
        Rejection::Timeout(ms) => Some(json!({ "timeout_ms": ms })),
        Rejection::AppHttp(status) => Some(json!({ "status": status })),
        _ => None,
    }
}

/// The message sent to the caller: the rejection's text, except for internal errors, whose
/// detail stays in the log.
pub fn message(r: &Rejection) -> String {
    match r {
        Rejection::Internal(_) => "internal error".into(),
        Rejection::AppUnavailable(_) => "the app is unavailable".into(),
        other => other.to_string(),
    }
}

/// Add `Retry-After` when the rejection says how long to wait.
pub fn retry_after_header(r: &Rejection, headers: &mut http::HeaderMap) {
    if let Some(d) = r.retry_after() {
        headers.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from(d.as_secs().max(1)),
        );
    }
}
