//! The one table that maps every [`Rejection`] to each front's error code and an HTTP status.
//!
//! Each front speaks only its own protocol's codes: tools-v1 the Remote Tool Protocol's
//! standard codes, skill-v1 the Skill Gateway v1 gateway-level codes. carapace's finer reason
//! (`Rejection::reason`) goes in `details.reason`. On tools-v1 the codes are chosen so that a
//! gateway retries exactly what may succeed on retry (`status: retryable_error`, or `timeout`
//! with `retryable: true`, as the reference tool host marks it). README.md carries this table.

use http::StatusCode;
use serde::Deserialize;

use carapace_filters::Rejection;

/// How the tools-v1 front answers a call it refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolsV1Answers {
    /// As the reference tool host: every call outcome is HTTP 200 with the envelope's
    /// `status`; only requests that are not a call (no such route, wrong method, a body that
    /// is not one JSON document of the request's shape, too large, too slow) get an HTTP
    /// error status.
    #[default]
    Reference,
    /// Every refusal carries an HTTP error status as well (401, 403, 429, 502, 504, ...).
    HttpStatus,
}

/// A call its caller cancelled (nginx's status for a request the client gave up).
pub const CLIENT_CLOSED_REQUEST: StatusCode = match StatusCode::from_u16(499) {
    Ok(s) => s,
    Err(_) => unreachable!(),
};

/// The standard tools-v1 code of a rejection, and its HTTP status in the `http_status` style.
pub fn tools_v1(r: &Rejection) -> (&'static str, StatusCode) {
    match r {
        Rejection::PairingRequired => ("PAIRING_REQUIRED", StatusCode::UNAUTHORIZED),
        Rejection::Forbidden(_) | Rejection::ToolNotApproved { .. } => {
            ("FORBIDDEN", StatusCode::FORBIDDEN)
        }
        Rejection::AuthFailed(_) | Rejection::Unsigned(_) | Rejection::BearerToken { .. } => {
            ("UNAUTHORIZED", StatusCode::UNAUTHORIZED)
        }
        Rejection::InsufficientScope { .. } => ("FORBIDDEN", StatusCode::FORBIDDEN),
        Rejection::Disabled(_) => ("DEPENDENCY_UNAVAILABLE", StatusCode::SERVICE_UNAVAILABLE),
        Rejection::RateLimited { .. } => ("RATE_LIMITED", StatusCode::TOO_MANY_REQUESTS),
        Rejection::Overloaded | Rejection::NonceStoreFull { .. } => {
            ("RATE_LIMITED", StatusCode::SERVICE_UNAVAILABLE)
        }
        Rejection::PayloadTooLarge { .. } => ("INVALID_ARGS", StatusCode::PAYLOAD_TOO_LARGE),
        Rejection::BodyTimeout(_) => ("INVALID_ARGS", StatusCode::REQUEST_TIMEOUT),
        Rejection::InvalidRequest { .. }
        | Rejection::ProtocolVersionUnsupported(_)
        | Rejection::InputSchema(_) => ("INVALID_ARGS", StatusCode::BAD_REQUEST),
        Rejection::NoRoute(_) => ("INVALID_ARGS", StatusCode::NOT_FOUND),
        Rejection::MethodNotAllowed(_) => ("INVALID_ARGS", StatusCode::METHOD_NOT_ALLOWED),
        Rejection::ToolNotFound(_) => ("TOOL_NOT_FOUND", StatusCode::NOT_FOUND),
        Rejection::StaleTimestamp { .. } | Rejection::NonceReplay => {
            ("UNAUTHORIZED", StatusCode::UNAUTHORIZED)
        }
        Rejection::OutputSchema(_) => ("DEPENDENCY_UNAVAILABLE", StatusCode::BAD_GATEWAY),
        Rejection::Timeout(_) => ("TIMEOUT", StatusCode::GATEWAY_TIMEOUT),
        Rejection::AppUnavailable(_) | Rejection::AppHttp(_) | Rejection::AppInvalid(_) => {
            ("DEPENDENCY_UNAVAILABLE", StatusCode::BAD_GATEWAY)
        }
        Rejection::SharedStateUnavailable(_) => {
            ("DEPENDENCY_UNAVAILABLE", StatusCode::SERVICE_UNAVAILABLE)
        }
        Rejection::Internal(_) => ("INTERNAL", StatusCode::INTERNAL_SERVER_ERROR),
        Rejection::Cancelled => ("CANCELLED", CLIENT_CLOSED_REQUEST),
        Rejection::IdempotencyConflict => ("INVALID_ARGS", StatusCode::UNPROCESSABLE_ENTITY),
        Rejection::IdempotencyPending => ("RATE_LIMITED", StatusCode::CONFLICT),
        Rejection::BudgetExhausted { .. } => ("FORBIDDEN", StatusCode::FORBIDDEN),
        Rejection::CircuitOpen { .. } => {
            ("DEPENDENCY_UNAVAILABLE", StatusCode::SERVICE_UNAVAILABLE)
        }
    }
}

/// The HTTP status of a refusal in the `reference` style: 200 for every call outcome.
/// `malformed`: the body is not one JSON document of the request's shape (the reference
/// answers those 400).
pub fn tools_v1_reference_status(r: &Rejection, malformed: bool) -> StatusCode {
    match r {
        Rejection::NoRoute(_) => StatusCode::NOT_FOUND,
        Rejection::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
        Rejection::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        Rejection::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
        Rejection::InvalidRequest { .. } if malformed => StatusCode::BAD_REQUEST,
        // OAuth is HTTP authentication: its clients act on the status and the challenge.
        Rejection::BearerToken { .. } => StatusCode::UNAUTHORIZED,
        Rejection::InsufficientScope { .. } => StatusCode::FORBIDDEN,
        _ => StatusCode::OK,
    }
}

/// Whether a tools-v1 caller may retry: what [`Rejection::retryable`] says, and a timeout
/// (the reference tool host marks `TIMEOUT` retryable while the status stays `timeout`).
pub fn tools_v1_retryable(r: &Rejection) -> bool {
    r.retryable() || matches!(r, Rejection::Timeout(_))
}

/// The envelope's `status` of a refused tools-v1 call.
pub fn tools_v1_call_status(r: &Rejection) -> &'static str {
    match r {
        Rejection::Timeout(_) => "timeout",
        r if r.retryable() => "retryable_error",
        _ => "error",
    }
}

/// The Skill Gateway v1 code of a rejection and its HTTP status (the reference demo skill's
/// statuses where it has the case: 400 for a stale timestamp or a replay, 401 for a bad
/// signature).
pub fn skill_v1(r: &Rejection) -> (&'static str, StatusCode) {
    let http_error = "SKILL_HTTP_ERROR";
    match r {
        Rejection::PairingRequired
        | Rejection::AuthFailed(_)
        | Rejection::Unsigned(_)
        | Rejection::BearerToken { .. } => ("SKILL_AUTH_FAILED", StatusCode::UNAUTHORIZED),
        Rejection::Forbidden(_)
        | Rejection::ToolNotApproved { .. }
        | Rejection::InsufficientScope { .. } => ("SKILL_AUTH_FAILED", StatusCode::FORBIDDEN),
        Rejection::Disabled(_) => ("GATEWAY_DISABLED", StatusCode::SERVICE_UNAVAILABLE),
        Rejection::RateLimited { .. } => (http_error, StatusCode::TOO_MANY_REQUESTS),
        Rejection::Overloaded | Rejection::NonceStoreFull { .. } => {
            (http_error, StatusCode::SERVICE_UNAVAILABLE)
        }
        Rejection::PayloadTooLarge { .. } => {
            ("SCHEMA_VALIDATION_FAILED", StatusCode::PAYLOAD_TOO_LARGE)
        }
        Rejection::BodyTimeout(_) => ("SCHEMA_VALIDATION_FAILED", StatusCode::REQUEST_TIMEOUT),
        Rejection::InvalidRequest { .. } | Rejection::InputSchema(_) => {
            ("SCHEMA_VALIDATION_FAILED", StatusCode::BAD_REQUEST)
        }
        Rejection::NoRoute(_) | Rejection::ToolNotFound(_) => {
            ("ROUTING_FAILED", StatusCode::NOT_FOUND)
        }
        Rejection::MethodNotAllowed(_) => ("ROUTING_FAILED", StatusCode::METHOD_NOT_ALLOWED),
        Rejection::ProtocolVersionUnsupported(_) => {
            ("PROTOCOL_VERSION_UNSUPPORTED", StatusCode::BAD_REQUEST)
        }
        Rejection::StaleTimestamp { .. } | Rejection::NonceReplay => {
            ("NONCE_REPLAY", StatusCode::BAD_REQUEST)
        }
        Rejection::OutputSchema(_) => ("SCHEMA_VALIDATION_FAILED", StatusCode::BAD_GATEWAY),
        Rejection::Timeout(_) => ("SKILL_TIMEOUT", StatusCode::GATEWAY_TIMEOUT),
        Rejection::AppUnavailable(_) | Rejection::AppHttp(_) | Rejection::AppInvalid(_) => {
            (http_error, StatusCode::BAD_GATEWAY)
        }
        Rejection::SharedStateUnavailable(_) => (http_error, StatusCode::SERVICE_UNAVAILABLE),
        Rejection::Internal(_) => (http_error, StatusCode::INTERNAL_SERVER_ERROR),
        Rejection::Cancelled => (http_error, CLIENT_CLOSED_REQUEST),
        Rejection::IdempotencyConflict => {
            ("SCHEMA_VALIDATION_FAILED", StatusCode::UNPROCESSABLE_ENTITY)
        }
        Rejection::IdempotencyPending => (http_error, StatusCode::CONFLICT),
        Rejection::BudgetExhausted { .. } => ("SKILL_AUTH_FAILED", StatusCode::FORBIDDEN),
        Rejection::CircuitOpen { .. } => (http_error, StatusCode::SERVICE_UNAVAILABLE),
    }
}

/// Structured details of a rejection for the envelope's `details` object.
pub fn details(r: &Rejection) -> serde_json::Value {
    let mut d = specific_details(r).unwrap_or_else(|| serde_json::json!({}));
    d["reason"] = serde_json::Value::from(r.reason());
    d
}

fn specific_details(r: &Rejection) -> Option<serde_json::Value> {
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
        Rejection::ToolNotApproved { tool, changed } => {
            Some(json!({ "tool": tool, "changed": changed }))
        }
        Rejection::AppHttp(status) => Some(json!({ "status": status })),
        Rejection::IdempotencyConflict => Some(json!({ "field": "idempotency_key" })),
        Rejection::CircuitOpen {
            provider,
            retry_after,
        } => Some(json!({ "provider": provider, "retry_after_s": retry_after.as_secs().max(1) })),
        Rejection::BudgetExhausted {
            consumer,
            period,
            remaining,
            price,
        } => Some(json!({
            "consumer": consumer, "budget": period, "remaining": remaining, "price": price,
        })),
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

/// Add `Retry-After` when the rejection says how long to wait, and `WWW-Authenticate` when it
/// carries a challenge.
pub fn refusal_headers(r: &Rejection, headers: &mut http::HeaderMap) {
    if let Some(d) = r.retry_after() {
        headers.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from(d.as_secs().max(1)),
        );
    }
    if let Some(v) = r
        .challenge()
        .and_then(|c| http::HeaderValue::from_str(c).ok())
    {
        headers.insert(http::header::WWW_AUTHENTICATE, v);
    }
}

#[cfg(test)]
mod tests;
