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
        Rejection::SharedStateUnavailable(_) => {
            ("DEPENDENCY_UNAVAILABLE", StatusCode::SERVICE_UNAVAILABLE)
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

/// The message sent to the caller: the rejection's text, except where it would carry detail
/// of carapace or of the app (internal errors, the app's transport errors and answers), which
/// stays in the log.
pub fn message(r: &Rejection) -> String {
    match r {
        Rejection::Internal(_) => "internal error".into(),
        Rejection::SharedStateUnavailable(_) => {
            "the state store shared by the replicas is unavailable".into()
        }
        Rejection::AppUnavailable(_) => "the app is unavailable".into(),
        Rejection::AppInvalid(_) => "the app's answer does not follow its protocol".into(),
        other => other.to_string(),
    }
}

/// Whether the rejection's full text belongs in the log (the caller got less).
pub fn log_detail(r: &Rejection) -> bool {
    matches!(
        r,
        Rejection::Internal(_)
            | Rejection::AppUnavailable(_)
            | Rejection::AppInvalid(_)
            | Rejection::SharedStateUnavailable(_)
    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The README's table, row by row: every rejection on both fronts.
    #[test]
    fn every_rejection_has_its_documented_code_and_status() {
        let d = Duration::from_secs(1);
        let rows: Vec<(Rejection, &str, &str, u16)> = vec![
            (
                Rejection::PairingRequired,
                "PAIRING_REQUIRED",
                "PAIRING_REQUIRED",
                401,
            ),
            (
                Rejection::Forbidden("x".into()),
                "FORBIDDEN",
                "FORBIDDEN",
                403,
            ),
            (
                Rejection::AuthFailed("x"),
                "UNAUTHORIZED",
                "SKILL_AUTH_FAILED",
                401,
            ),
            (
                Rejection::Disabled("x".into()),
                "GATEWAY_DISABLED",
                "GATEWAY_DISABLED",
                503,
            ),
            (
                Rejection::RateLimited {
                    scope: "peer",
                    retry_after: d,
                },
                "RATE_LIMITED",
                "RATE_LIMITED",
                429,
            ),
            (Rejection::Overloaded, "RATE_LIMITED", "RATE_LIMITED", 503),
            (
                Rejection::NonceStoreFull { retry_after: d },
                "RATE_LIMITED",
                "RATE_LIMITED",
                503,
            ),
            (
                Rejection::PayloadTooLarge { limit: 1 },
                "INVALID_ARGS",
                "INVALID_ARGS",
                413,
            ),
            (
                Rejection::BodyTimeout(d),
                "INVALID_ARGS",
                "INVALID_ARGS",
                408,
            ),
            (Rejection::invalid("x"), "INVALID_ARGS", "INVALID_ARGS", 400),
            (
                Rejection::NoRoute("x".into()),
                "ROUTING_FAILED",
                "ROUTING_FAILED",
                404,
            ),
            (
                Rejection::ToolNotFound("x".into()),
                "TOOL_NOT_FOUND",
                "TOOL_NOT_FOUND",
                404,
            ),
            (
                Rejection::ProtocolVersionUnsupported("2".into()),
                "PROTOCOL_VERSION_UNSUPPORTED",
                "PROTOCOL_VERSION_UNSUPPORTED",
                400,
            ),
            (
                Rejection::StaleTimestamp { window: d },
                "NONCE_REPLAY",
                "NONCE_REPLAY",
                400,
            ),
            (Rejection::NonceReplay, "NONCE_REPLAY", "NONCE_REPLAY", 409),
            (
                Rejection::InputSchema(vec![]),
                "SCHEMA_VALIDATION_FAILED",
                "SCHEMA_VALIDATION_FAILED",
                400,
            ),
            (
                Rejection::OutputSchema(vec![]),
                "SCHEMA_VALIDATION_FAILED",
                "SCHEMA_VALIDATION_FAILED",
                502,
            ),
            (Rejection::Timeout(1), "TIMEOUT", "SKILL_TIMEOUT", 504),
            (
                Rejection::AppUnavailable("x".into()),
                "DEPENDENCY_UNAVAILABLE",
                "DEPENDENCY_UNAVAILABLE",
                502,
            ),
            (
                Rejection::AppHttp(500),
                "DEPENDENCY_UNAVAILABLE",
                "SKILL_HTTP_ERROR",
                502,
            ),
            (
                Rejection::AppInvalid("x".into()),
                "DEPENDENCY_UNAVAILABLE",
                "SKILL_HTTP_ERROR",
                502,
            ),
            (
                Rejection::SharedStateUnavailable("x".into()),
                "DEPENDENCY_UNAVAILABLE",
                "DEPENDENCY_UNAVAILABLE",
                503,
            ),
            (Rejection::Internal("x".into()), "INTERNAL", "INTERNAL", 500),
        ];
        for (r, tools, skill, status) in &rows {
            let (t, ts) = code_and_status(r, Protocol::ToolsV1);
            let (s, ss) = code_and_status(r, Protocol::SkillV1);
            assert_eq!((t, ts.as_u16()), (*tools, *status), "{r:?} on tools-v1");
            assert_eq!((s, ss.as_u16()), (*skill, *status), "{r:?} on skill-v1");
        }
        assert_eq!(
            rows.len(),
            23,
            "a Rejection variant is missing from this table"
        );
    }

    #[test]
    fn detail_of_carapace_and_the_app_is_not_sent_to_callers() {
        for r in [
            Rejection::Internal("journal /var/lib/x: EIO".into()),
            Rejection::AppUnavailable("connect 127.0.0.1:8080 refused".into()),
            Rejection::AppInvalid("answer breaks schema at /result".into()),
            Rejection::SharedStateUnavailable("redis 10.0.0.7:6379: refused".into()),
        ] {
            let m = message(&r);
            assert!(
                !m.contains("/var")
                    && !m.contains("8080")
                    && !m.contains("/result")
                    && !m.contains("6379"),
                "{m}"
            );
            assert!(log_detail(&r));
        }
    }
}
