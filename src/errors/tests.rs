use super::*;
use std::time::Duration;

/// The README's table, row by row: every rejection on both fronts, with the tools-v1
/// envelope status, retryability and the HTTP status of both tools-v1 styles.
#[test]
fn every_rejection_has_its_documented_code_and_status() {
    use Rejection as R;
    let d = Duration::from_secs(1);
    let limited = R::RateLimited {
        scope: "peer",
        retry_after: d,
    };
    type Row<'a> = (Rejection, &'a str, &'a str, bool, u16, u16, &'a str, u16);
    // rejection, tools-v1 code, status, retryable, http_status style, reference style,
    // skill-v1 code, skill-v1 HTTP status
    let rows: Vec<Row> = vec![
        (
            R::PairingRequired,
            "PAIRING_REQUIRED",
            "error",
            false,
            401,
            200,
            "SKILL_AUTH_FAILED",
            401,
        ),
        (
            R::Forbidden("x".into()),
            "FORBIDDEN",
            "error",
            false,
            403,
            200,
            "SKILL_AUTH_FAILED",
            403,
        ),
        (
            R::BearerToken {
                challenge: "Bearer x".into(),
                description: "x".into(),
            },
            "UNAUTHORIZED",
            "error",
            false,
            401,
            401,
            "SKILL_AUTH_FAILED",
            401,
        ),
        (
            R::InsufficientScope {
                challenge: "Bearer x".into(),
                action: "x".into(),
            },
            "FORBIDDEN",
            "error",
            false,
            403,
            403,
            "SKILL_AUTH_FAILED",
            403,
        ),
        (
            R::AuthFailed("x"),
            "UNAUTHORIZED",
            "error",
            false,
            401,
            200,
            "SKILL_AUTH_FAILED",
            401,
        ),
        (
            R::Unsigned("x".into()),
            "UNAUTHORIZED",
            "error",
            false,
            401,
            200,
            "SKILL_AUTH_FAILED",
            401,
        ),
        (
            R::Disabled("x".into()),
            "DEPENDENCY_UNAVAILABLE",
            "error",
            false,
            503,
            200,
            "GATEWAY_DISABLED",
            503,
        ),
        (
            limited,
            "RATE_LIMITED",
            "retryable_error",
            true,
            429,
            200,
            "SKILL_HTTP_ERROR",
            429,
        ),
        (
            R::Overloaded,
            "RATE_LIMITED",
            "retryable_error",
            true,
            503,
            200,
            "SKILL_HTTP_ERROR",
            503,
        ),
        (
            R::NonceStoreFull { retry_after: d },
            "RATE_LIMITED",
            "retryable_error",
            true,
            503,
            200,
            "SKILL_HTTP_ERROR",
            503,
        ),
        (
            R::PayloadTooLarge { limit: 1 },
            "INVALID_ARGS",
            "error",
            false,
            413,
            413,
            "SCHEMA_VALIDATION_FAILED",
            413,
        ),
        (
            R::BodyTimeout(d),
            "INVALID_ARGS",
            "error",
            false,
            408,
            408,
            "SCHEMA_VALIDATION_FAILED",
            408,
        ),
        (
            R::invalid("x"),
            "INVALID_ARGS",
            "error",
            false,
            400,
            200,
            "SCHEMA_VALIDATION_FAILED",
            400,
        ),
        (
            R::NoRoute("x".into()),
            "INVALID_ARGS",
            "error",
            false,
            404,
            404,
            "ROUTING_FAILED",
            404,
        ),
        (
            R::MethodNotAllowed("x".into()),
            "INVALID_ARGS",
            "error",
            false,
            405,
            405,
            "ROUTING_FAILED",
            405,
        ),
        (
            R::ToolNotFound("x".into()),
            "TOOL_NOT_FOUND",
            "error",
            false,
            404,
            200,
            "ROUTING_FAILED",
            404,
        ),
        (
            R::ToolNotApproved {
                tool: "x".into(),
                changed: vec!["/description".into()],
            },
            "FORBIDDEN",
            "error",
            false,
            403,
            200,
            "SKILL_AUTH_FAILED",
            403,
        ),
        (
            R::ProtocolVersionUnsupported("2".into()),
            "INVALID_ARGS",
            "error",
            false,
            400,
            200,
            "PROTOCOL_VERSION_UNSUPPORTED",
            400,
        ),
        (
            R::StaleTimestamp { window: d },
            "UNAUTHORIZED",
            "error",
            false,
            401,
            200,
            "NONCE_REPLAY",
            400,
        ),
        (
            R::NonceReplay,
            "UNAUTHORIZED",
            "error",
            false,
            401,
            200,
            "NONCE_REPLAY",
            400,
        ),
        (
            R::InputSchema(vec![]),
            "INVALID_ARGS",
            "error",
            false,
            400,
            200,
            "SCHEMA_VALIDATION_FAILED",
            400,
        ),
        (
            R::OutputSchema(vec![]),
            "DEPENDENCY_UNAVAILABLE",
            "error",
            false,
            502,
            200,
            "SCHEMA_VALIDATION_FAILED",
            502,
        ),
        (
            R::Timeout(1),
            "TIMEOUT",
            "timeout",
            true,
            504,
            200,
            "SKILL_TIMEOUT",
            504,
        ),
        (
            R::AppUnavailable("x".into()),
            "DEPENDENCY_UNAVAILABLE",
            "retryable_error",
            true,
            502,
            200,
            "SKILL_HTTP_ERROR",
            502,
        ),
        (
            R::AppHttp(500),
            "DEPENDENCY_UNAVAILABLE",
            "error",
            false,
            502,
            200,
            "SKILL_HTTP_ERROR",
            502,
        ),
        (
            R::AppInvalid("x".into()),
            "DEPENDENCY_UNAVAILABLE",
            "error",
            false,
            502,
            200,
            "SKILL_HTTP_ERROR",
            502,
        ),
        (
            R::SharedStateUnavailable("x".into()),
            "DEPENDENCY_UNAVAILABLE",
            "retryable_error",
            true,
            503,
            200,
            "SKILL_HTTP_ERROR",
            503,
        ),
        (
            R::Internal("x".into()),
            "INTERNAL",
            "error",
            false,
            500,
            200,
            "SKILL_HTTP_ERROR",
            500,
        ),
        (
            R::Cancelled,
            "CANCELLED",
            "error",
            false,
            499,
            200,
            "SKILL_HTTP_ERROR",
            499,
        ),
    ];
    let standard = [
        "TOOL_NOT_FOUND",
        "INVALID_ARGS",
        "UNAUTHORIZED",
        "FORBIDDEN",
        "RATE_LIMITED",
        "DEPENDENCY_UNAVAILABLE",
        "TIMEOUT",
        "INTERNAL",
        "PAIRING_REQUIRED",
        "PAIRING_FAILED",
        // The answer of a call cancelled with the optional `POST /v1/tools/cancel`, which
        // the protocol names without codes.
        "CANCELLED",
    ];
    let skill_codes = [
        "MANIFEST_INVALID",
        "PROTOCOL_VERSION_UNSUPPORTED",
        "NONCE_REPLAY",
        "SCHEMA_VALIDATION_FAILED",
        "SKILL_TIMEOUT",
        "SKILL_AUTH_FAILED",
        "GATEWAY_DISABLED",
        "ROUTING_FAILED",
        "SKILL_HTTP_ERROR",
    ];
    for (r, code, status, retry, http, reference, skill, skill_http) in &rows {
        let (t, ts) = tools_v1(r);
        assert_eq!((t, ts.as_u16()), (*code, *http), "{r:?} on tools-v1");
        assert!(standard.contains(&t), "{t} is not a standard tools-v1 code");
        assert_eq!(tools_v1_call_status(r), *status, "{r:?}");
        assert_eq!(tools_v1_retryable(r), *retry, "{r:?}");
        assert_eq!(
            tools_v1_reference_status(r, false).as_u16(),
            *reference,
            "{r:?}"
        );
        let (s, ss) = skill_v1(r);
        assert_eq!((s, ss.as_u16()), (*skill, *skill_http), "{r:?} on skill-v1");
        assert!(
            skill_codes.contains(&s),
            "{s} is not a Skill Gateway v1 code"
        );
        assert_eq!(details(r)["reason"], r.reason(), "{r:?}");
    }
    assert_eq!(
        tools_v1_reference_status(&R::invalid("x"), true),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        rows.len(),
        29,
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
