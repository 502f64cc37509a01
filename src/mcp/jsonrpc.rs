//! JSON-RPC 2.0 as MCP uses it: decoding one client message, and every error the MCP front
//! answers, mapped to its JSON-RPC code and HTTP status in one place ([`McpError`]).
//!
//! carapace's own code for a refusal (the Remote Tool Protocol's: `RATE_LIMITED`,
//! `FORBIDDEN`, `TIMEOUT`, ...) travels in `error.data.code` of a JSON-RPC error, and in
//! `_meta["dev.carapace/error"].code` of a tool result with `isError: true`.

use http::StatusCode;
use serde_json::{json, Map, Value};

use carapace_filters::Rejection;

use super::back::upstream::Reply;
use crate::errors;
use crate::front::{json_response, Resp};

/// The key under which a tool result's `_meta` carries carapace's error.
pub const ERROR_META: &str = "dev.carapace/error";

/// Invalid JSON.
pub const PARSE_ERROR: i64 = -32700;
/// Not a JSON-RPC request.
pub const INVALID_REQUEST: i64 = -32600;
/// No such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// Bad parameters, an unknown tool, a bad cursor, missing request metadata.
pub const INVALID_PARAMS: i64 = -32602;
/// Failures on carapace's or the app's side.
pub const INTERNAL_ERROR: i64 = -32603;
/// 2026-07-28: a header disagrees with the body, or a required one is missing.
pub const HEADER_MISMATCH: i64 = -32020;
/// 2026-07-28: the requested protocol version is not served.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// One message from a client.
#[derive(Debug)]
pub enum Message {
    Request {
        id: Value,
        method: String,
        params: Map<String, Value>,
    },
    Notification {
        method: String,
        params: Map<String, Value>,
    },
    /// A response to a request the server put to the client (older era): `id` is the one the
    /// request carried.
    Response { id: Option<Value>, reply: Reply },
}

/// Everything the MCP front refuses with.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("Parse error: {0}")]
    Parse(String),
    #[error("Invalid request: {0}")]
    InvalidRequest(String),
    #[error("Method not found: {0}")]
    MethodNotFound(String),
    /// Bad parameters of a request that was otherwise understood (an unknown tool, a bad
    /// cursor): answered with HTTP 200, as any JSON-RPC result.
    #[error("Invalid params: {0}")]
    InvalidParams(String),
    /// A request missing its required metadata (HTTP 400).
    #[error("Invalid params: {0}")]
    MissingMeta(String),
    #[error("Header mismatch: {0}")]
    HeaderMismatch(String),
    #[error("Unsupported protocol version `{0}`")]
    UnsupportedVersion(String),
    /// Older era: a request without its session, or not of the session's version.
    #[error("Bad request: {0}")]
    Session(String),
    /// Older era: the session id is unknown, expired or ended.
    #[error("Session not found")]
    SessionNotFound,
    #[error("Origin `{0}` is not allowed")]
    Origin(String),
    #[error("Method not allowed: {0}")]
    HttpMethod(&'static str),
    /// Older era: the client cancelled the request (`notifications/cancelled`).
    #[error("Request cancelled by the client")]
    Cancelled,
    #[error("{}", errors::message(.0))]
    Refused(Rejection),
    /// The MCP server's own JSON-RPC error, passed on as it is.
    #[error("{message}")]
    Upstream {
        code: i64,
        message: String,
        data: Option<Value>,
    },
}

impl McpError {
    /// The HTTP status, the JSON-RPC code and the error's `data`.
    fn parts(&self) -> (StatusCode, i64, Option<Value>) {
        match self {
            McpError::Parse(_) => (StatusCode::BAD_REQUEST, PARSE_ERROR, None),
            McpError::Cancelled => (StatusCode::OK, INVALID_REQUEST, None),
            McpError::InvalidRequest(_) | McpError::Session(_) => {
                (StatusCode::BAD_REQUEST, INVALID_REQUEST, None)
            }
            McpError::MethodNotFound(_) => (StatusCode::NOT_FOUND, METHOD_NOT_FOUND, None),
            McpError::InvalidParams(_) => (StatusCode::OK, INVALID_PARAMS, None),
            McpError::MissingMeta(_) => (StatusCode::BAD_REQUEST, INVALID_PARAMS, None),
            McpError::HeaderMismatch(_) => (StatusCode::BAD_REQUEST, HEADER_MISMATCH, None),
            McpError::UnsupportedVersion(requested) => (
                StatusCode::BAD_REQUEST,
                UNSUPPORTED_PROTOCOL_VERSION,
                Some(json!({"supported": super::SUPPORTED_VERSIONS, "requested": requested})),
            ),
            McpError::SessionNotFound => (StatusCode::NOT_FOUND, INVALID_REQUEST, None),
            McpError::Origin(_) => (StatusCode::FORBIDDEN, INVALID_REQUEST, None),
            McpError::HttpMethod(_) => (StatusCode::METHOD_NOT_ALLOWED, INVALID_REQUEST, None),
            McpError::Refused(r) => {
                let (_, status) = errors::tools_v1(r);
                (status, rejection_code(r), Some(carapace_error(r)))
            }
            McpError::Upstream { code, data, .. } => (StatusCode::OK, *code, data.clone()),
        }
    }
}

/// The JSON-RPC code of a carapace refusal answered as a JSON-RPC error.
fn rejection_code(r: &Rejection) -> i64 {
    match r {
        Rejection::ToolNotFound(_) | Rejection::InputSchema(_) => INVALID_PARAMS,
        Rejection::Internal(_)
        | Rejection::SharedStateUnavailable(_)
        | Rejection::AppUnavailable(_)
        | Rejection::AppHttp(_)
        | Rejection::AppInvalid(_)
        | Rejection::OutputSchema(_)
        | Rejection::Timeout(_) => INTERNAL_ERROR,
        // Refused for who the caller is, what it sent or how often: the request is refused.
        _ => INVALID_REQUEST,
    }
}

/// carapace's error object: the Remote Tool Protocol code, whether a retry may succeed, and
/// the details (`reason` always).
pub fn carapace_error(r: &Rejection) -> Value {
    json!({
        "code": errors::tools_v1(r).0,
        "retryable": errors::tools_v1_retryable(r),
        "details": errors::details(r),
    })
}

/// A JSON-RPC error answer; `id` is the request's when it could be read.
pub fn error_response(id: Option<&Value>, e: &McpError) -> Resp {
    let (status, code, data) = e.parts();
    let mut error = json!({"code": code, "message": e.to_string()});
    if let Some(data) = data {
        error["data"] = data;
    }
    // JSON-RPC 2.0: `null` when the request's id could not be read (the reference SDKs
    // expect the member).
    let body = json!({"jsonrpc": "2.0", "id": id.cloned().unwrap_or(Value::Null), "error": error});
    let mut resp = json_response(status, &body);
    if let McpError::Refused(r) = e {
        errors::refusal_headers(r, resp.headers_mut());
    }
    if let McpError::HttpMethod(allow) = e {
        resp.headers_mut()
            .insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
    }
    resp
}

/// A refusal before a message was decoded (identity, kill-switch, rate limit, body limits),
/// as a JSON-RPC error with a `null` id.
pub fn refusal_response(r: &Rejection) -> Resp {
    let (status, code) = (errors::tools_v1(r).1, rejection_code(r));
    let body = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": code, "message": errors::message(r), "data": carapace_error(r)},
    });
    let mut resp = json_response(status, &body);
    errors::refusal_headers(r, resp.headers_mut());
    resp
}

/// A JSON-RPC result answer.
pub fn result_response(id: &Value, result: Value) -> Resp {
    json_response(
        StatusCode::OK,
        &json!({"jsonrpc": "2.0", "id": id, "result": result}),
    )
}

/// Decode one message. On failure, the request's `id` when it could be read.
pub fn decode(body: &[u8]) -> Result<Message, (Option<Value>, McpError)> {
    let doc: Value =
        serde_json::from_slice(body).map_err(|e| (None, McpError::Parse(e.to_string())))?;
    let mut m = match doc {
        Value::Object(m) => m,
        Value::Array(_) => {
            return Err((
                None,
                McpError::InvalidRequest("batches are not accepted".into()),
            ))
        }
        _ => {
            return Err((
                None,
                McpError::InvalidRequest("a message is a JSON object".into()),
            ))
        }
    };
    let id = match m.remove("id") {
        None => None,
        Some(id @ (Value::String(_) | Value::Number(_))) => Some(id),
        Some(_) => {
            return Err((
                None,
                McpError::InvalidRequest("`id` must be a string or a number".into()),
            ))
        }
    };
    let bad = |why: &str| Err((id.clone(), McpError::InvalidRequest(why.into())));
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return bad("`jsonrpc` must be \"2.0\"");
    }
    if !m.contains_key("method") && (m.contains_key("result") || m.contains_key("error")) {
        let reply = Reply::from_response(&Value::Object(m)).expect("a result or an error");
        return Ok(Message::Response { id, reply });
    }
    let method = match m.remove("method") {
        Some(Value::String(s)) => s,
        _ => return bad("`method` must be a string"),
    };
    let params = match m.remove("params") {
        None => Map::new(),
        Some(Value::Object(p)) => p,
        Some(_) => return bad("`params` must be an object"),
    };
    Ok(match id {
        Some(id) => Message::Request { id, method, params },
        None => Message::Notification { method, params },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_of(body: &[u8]) -> i64 {
        match decode(body) {
            Err((_, e)) => e.parts().1,
            Ok(m) => panic!("decoded {m:?}"),
        }
    }

    #[test]
    fn requests_notifications_and_responses_are_told_apart() {
        let r = decode(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).unwrap();
        assert!(matches!(r, Message::Request { ref method, .. } if method == "ping"));
        let n = decode(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert!(matches!(n, Message::Notification { .. }));
        let s = decode(br#"{"jsonrpc":"2.0","id":"a","result":{}}"#).unwrap();
        assert!(matches!(s, Message::Response { .. }));
    }

    #[test]
    fn malformed_messages_get_the_json_rpc_codes() {
        assert_eq!(code_of(b"{"), PARSE_ERROR);
        assert_eq!(code_of(b"[]"), INVALID_REQUEST);
        assert_eq!(
            code_of(br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code_of(br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code_of(br#"{"jsonrpc":"2.0","id":1,"method":3}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            code_of(br#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#),
            INVALID_REQUEST
        );
    }

    #[test]
    fn an_error_keeps_the_request_id_when_it_could_be_read() {
        let (id, _) = decode(br#"{"jsonrpc":"1.0","id":"q","method":"ping"}"#).unwrap_err();
        assert_eq!(id, Some(json!("q")));
    }
}
