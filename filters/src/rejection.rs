//! The one error type every layer fails with.

use std::time::Duration;

/// One violated schema rule: where in the instance, and what the rule said.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SchemaViolation {
    /// JSON pointer into the validated instance (`""` is the root).
    pub path: String,
    /// What was expected there.
    pub message: String,
}

/// Why a request was refused or a call failed. Fronts map each variant to their own envelope
/// and an HTTP status; nothing that yields a `Rejection` before the forward step reaches the
/// app.
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    /// Remote caller over mTLS while no peer is paired.
    #[error("this listener accepts only paired peers and none is paired yet")]
    PairingRequired,
    /// Caller identity is known not to be allowed (unknown certificate, revoked peer).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// Missing or wrong credential (API key, HMAC signature).
    #[error("authentication failed: {0}")]
    AuthFailed(&'static str),
    /// The request carries no usable OAuth bearer token: answered 401 with `challenge` in
    /// `WWW-Authenticate`.
    #[error("{description}")]
    BearerToken {
        /// The whole `WWW-Authenticate` value.
        challenge: String,
        description: String,
    },
    /// The bearer token is valid but its scopes do not allow `action`: answered 403 with
    /// `challenge` (`error="insufficient_scope"`, the scope needed) in `WWW-Authenticate`.
    #[error("the token's scopes do not allow {action}")]
    InsufficientScope { challenge: String, action: String },
    /// The body carries data its signature does not cover (a field outside the signed set, a
    /// `__proto__` member the reference implementation drops before signing).
    #[error("the signature does not cover {0}")]
    Unsigned(String),
    /// Kill-switch engaged, globally or for this tool.
    #[error("disabled by kill-switch ({0})")]
    Disabled(String),
    /// A rate limit refused the call.
    #[error("rate limit exceeded ({scope})")]
    RateLimited {
        scope: &'static str,
        retry_after: Duration,
    },
    /// The concurrency limit is reached; the request was shed instead of queued.
    #[error("too many calls in flight")]
    Overloaded,
    /// Body larger than the limit (by `Content-Length` or while reading).
    #[error("request body larger than {limit} bytes")]
    PayloadTooLarge { limit: u64 },
    /// The body did not arrive in time.
    #[error("request body not received within {} ms", .0.as_millis())]
    BodyTimeout(Duration),
    /// The request does not follow the front's protocol.
    #[error("invalid request: {message}")]
    InvalidRequest {
        message: String,
        path: Option<String>,
    },
    /// No such route on this front.
    #[error("no route for {0}")]
    NoRoute(String),
    /// The route exists, but not for this method.
    #[error("method not allowed: {0}")]
    MethodNotAllowed(String),
    /// The tool is not in the catalog.
    #[error("tool `{0}` not found")]
    ToolNotFound(String),
    /// The tool's definition is not the approved one (pinning): it is withheld until approved.
    #[error("tool `{tool}` changed since it was approved and is withheld until approved again")]
    ToolNotApproved { tool: String, changed: Vec<String> },
    /// The caller speaks a protocol version this front does not.
    #[error("protocol version `{0}` is not supported")]
    ProtocolVersionUnsupported(String),
    /// The signed timestamp is outside the accepted window.
    #[error("timestamp outside the ±{} s window", .window.as_secs())]
    StaleTimestamp { window: Duration },
    /// The nonce was already used within its TTL.
    #[error("nonce already used")]
    NonceReplay,
    /// The nonce store is full of live nonces; new signed work is refused until some expire.
    #[error("replay store is full")]
    NonceStoreFull { retry_after: Duration },
    /// The arguments break the tool's input schema.
    #[error("input does not match the tool's input schema")]
    InputSchema(Vec<SchemaViolation>),
    /// The app's output breaks the tool's output schema; it is withheld from the caller.
    #[error("output does not match the tool's output schema")]
    OutputSchema(Vec<SchemaViolation>),
    /// The call ran past its timeout; the upstream request was dropped.
    #[error("call exceeded {0} ms")]
    Timeout(u64),
    /// The app could not be reached.
    #[error("app unavailable: {0}")]
    AppUnavailable(String),
    /// The app answered with an HTTP error status.
    #[error("app answered HTTP {0}")]
    AppHttp(u16),
    /// The app's answer does not follow its protocol.
    #[error("app answer invalid: {0}")]
    AppInvalid(String),
    /// The store shared by the replicas (nonces, rate limits) did not answer; the call is
    /// refused rather than let through unchecked.
    #[error("shared state store unavailable: {0}")]
    SharedStateUnavailable(String),
    /// A bug or an I/O failure inside carapace (e.g. the nonce journal could not be written).
    #[error("internal error: {0}")]
    Internal(String),
    /// The caller cancelled the call while it was in flight.
    #[error("cancelled by the caller")]
    Cancelled,
    /// The call's `idempotency_key` was used before, by the same caller for the same tool,
    /// with other arguments.
    #[error("idempotency_key was already used with other arguments")]
    IdempotencyConflict,
    /// A call with the same `idempotency_key` is still running, past the time a repeat waits
    /// for it.
    #[error("a call with this idempotency_key is still running")]
    IdempotencyPending,
    /// The provider's circuit is open: it stopped answering, and is not tried again until its
    /// backoff has passed.
    #[error("{provider} is not answering; not tried again for now")]
    CircuitOpen {
        provider: String,
        retry_after: Duration,
    },
    /// The caller's budget cannot pay for the call.
    #[error("budget exhausted: {consumer} has {remaining} left of its {period} budget, the call costs {price}")]
    BudgetExhausted {
        consumer: String,
        period: &'static str,
        remaining: u64,
        price: u64,
    },
}

impl Rejection {
    /// Shorthand for [`Rejection::InvalidRequest`] without a path.
    pub fn invalid(message: impl Into<String>) -> Self {
        Rejection::InvalidRequest {
            message: message.into(),
            path: None,
        }
    }

    /// Stable, low-cardinality name used in metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::PairingRequired => "pairing_required",
            Rejection::Forbidden(_) => "forbidden",
            Rejection::AuthFailed(_) => "auth_failed",
            Rejection::BearerToken { .. } => "invalid_token",
            Rejection::InsufficientScope { .. } => "insufficient_scope",
            Rejection::Unsigned(_) => "unsigned_data",
            Rejection::Disabled(_) => "kill_switch",
            Rejection::RateLimited { .. } => "rate_limited",
            Rejection::Overloaded => "overloaded",
            Rejection::PayloadTooLarge { .. } => "payload_too_large",
            Rejection::BodyTimeout(_) => "body_timeout",
            Rejection::InvalidRequest { .. } => "invalid_request",
            Rejection::NoRoute(_) => "no_route",
            Rejection::MethodNotAllowed(_) => "method_not_allowed",
            Rejection::ToolNotFound(_) => "tool_not_found",
            Rejection::ToolNotApproved { .. } => "tool_not_approved",
            Rejection::ProtocolVersionUnsupported(_) => "protocol_version",
            Rejection::StaleTimestamp { .. } => "stale_timestamp",
            Rejection::NonceReplay => "nonce_replay",
            Rejection::NonceStoreFull { .. } => "nonce_store_full",
            Rejection::InputSchema(_) => "input_schema",
            Rejection::OutputSchema(_) => "output_schema",
            Rejection::Timeout(_) => "timeout",
            Rejection::AppUnavailable(_) => "app_unavailable",
            Rejection::AppHttp(_) => "app_http_error",
            Rejection::AppInvalid(_) => "app_invalid",
            Rejection::SharedStateUnavailable(_) => "shared_state_unavailable",
            Rejection::Internal(_) => "internal",
            Rejection::Cancelled => "cancelled",
            Rejection::IdempotencyConflict => "idempotency_conflict",
            Rejection::IdempotencyPending => "idempotency_pending",
            Rejection::BudgetExhausted { .. } => "budget_exhausted",
            Rejection::CircuitOpen { .. } => "circuit_open",
        }
    }

    /// Whether the same call may succeed if retried later.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Rejection::RateLimited { .. }
                | Rejection::Overloaded
                | Rejection::NonceStoreFull { .. }
                | Rejection::AppUnavailable(_)
                | Rejection::SharedStateUnavailable(_)
                | Rejection::IdempotencyPending
                | Rejection::CircuitOpen { .. }
        )
    }

    /// How long the caller should wait, when the rejection says.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Rejection::RateLimited { retry_after, .. }
            | Rejection::NonceStoreFull { retry_after }
            | Rejection::CircuitOpen { retry_after, .. } => Some(*retry_after),
            Rejection::Overloaded
            | Rejection::SharedStateUnavailable(_)
            | Rejection::IdempotencyPending => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// The `WWW-Authenticate` value the answer carries, when the rejection has one.
    pub fn challenge(&self) -> Option<&str> {
        match self {
            Rejection::BearerToken { challenge, .. }
            | Rejection::InsufficientScope { challenge, .. } => Some(challenge),
            _ => None,
        }
    }
}
