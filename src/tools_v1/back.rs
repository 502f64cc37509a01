//! The tools-v1 back: calls to a tools-v1 app (`POST /v1/tools/call`) and the decoding of its answers.

use std::sync::Arc;
use std::task::{Context, Poll};

use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::{BoxFuture, Rejection};
use http::StatusCode;
use serde_json::{json, Value};
use tower::Service;

use std::borrow::Cow;

use super::wire::{read_answer, Answer};
use super::RESPONSE;
use crate::json_text;
use crate::upstream::AppClient;

/// The tools-v1 back: calls `POST /v1/tools/call` on the app.
///
/// The client is shared: each call's future holds a reference count, not a copy of the
/// client's fields (a pool, its authority and `Host` value, each counted again per call).
#[derive(Clone, Debug)]
pub struct ToolsV1Back {
    app: Arc<AppClient>,
}

impl ToolsV1Back {
    pub fn new(app: AppClient) -> Self {
        ToolsV1Back { app: Arc::new(app) }
    }
}

/// The request body for a tools-v1 app, from any front's call: its members sorted, as a JSON
/// value writes them, the arguments and a caller's context copied once, straight into the body.
/// For a front without a context (skill-v1), a context naming the caller; no
/// `request_origin` is claimed for it.
pub fn request_body(call: &ToolCall) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    json_text::object(&mut out, |o| {
        o.value("args", &call.args).str("call_id", &call.call_id);
        match &call.context {
            Some(c) => o.json("context", c.json().as_bytes()),
            None => o.object("context", |c| {
                c.str("agent_id", &call.principal.id)
                    .str("session_id", &call.call_id);
            }),
        };
        if let Some(k) = &call.idempotency_key {
            o.str("idempotency_key", k);
        }
        o.str("tenant_id", call.tenant_id.as_deref().unwrap_or("default"))
            .u64(
                "timeout_ms",
                call.tool.effective_timeout(call.timeout_ms).as_millis() as u64,
            )
            .str("tool_name", call.tool.app_name())
            .str("version", "v1");
    });
    out
}

/// Decode a tools-v1 app's answer.
pub fn decode_response(
    status: StatusCode,
    body: &[u8],
    call: &ToolCall,
) -> Result<CallOutcome, Rejection> {
    if !status.is_success() {
        // Even with a well-formed body, an HTTP error is not a successful call.
        return Err(Rejection::AppHttp(status.as_u16()));
    }
    match read_answer(body) {
        Some(answer) => outcome(answer, call),
        None => decode_response_general(status, body, call),
    }
}

/// [`decode_response`] through a `Value` and the seed's schema: the refusal of an answer the
/// one-pass reader does not accept (and, for the fuzz target, the same result for any answer
/// it does).
#[doc(hidden)]
pub fn decode_response_general(
    status: StatusCode,
    body: &[u8],
    call: &ToolCall,
) -> Result<CallOutcome, Rejection> {
    let doc: Value = match serde_json::from_slice(body) {
        Ok(d) => d,
        Err(_) if !status.is_success() => return Err(Rejection::AppHttp(status.as_u16())),
        Err(e) => return Err(Rejection::AppInvalid(format!("answer is not JSON: {e}"))),
    };
    if !status.is_success() {
        return Err(Rejection::AppHttp(status.as_u16()));
    }
    // Redacted: the app's answer must not reach the caller quoted in an error.
    if let Err(v) = RESPONSE.validate_redacted(&doc) {
        let first = v.first().map_or("", |v| v.message.as_str());
        return Err(Rejection::AppInvalid(format!(
            "answer breaks the tools-v1 response schema: {first}"
        )));
    }
    outcome(Answer::of_valid(&doc), call)
}

/// The call's outcome from an answer that follows the seed's response schema.
fn outcome(answer: Answer<'_>, call: &ToolCall) -> Result<CallOutcome, Rejection> {
    if answer.call_id != *call.call_id || answer.tool_name != call.tool.app_name() {
        return Err(Rejection::AppInvalid(
            "answer is for another call_id or tool".into(),
        ));
    }
    match &*answer.status {
        "ok" => Ok(CallOutcome::Ok {
            output: answer.result.unwrap_or_else(|| json!({})),
            meta: None,
            content: None,
        }),
        "timeout" => Err(Rejection::Timeout(
            call.tool.effective_timeout(call.timeout_ms).as_millis() as u64,
        )),
        s => {
            let e = answer.error.unwrap_or_default();
            Ok(CallOutcome::AppError {
                code: e.code.map_or_else(|| "INTERNAL".into(), Cow::into_owned),
                message: e.message.map(Cow::into_owned).unwrap_or_default(),
                details: e.details,
                // Only this status allows a retry; `error.retryable` is advice.
                retryable: s == "retryable_error",
                content: None,
            })
        }
    }
}

impl Service<ToolCall> for ToolsV1Back {
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = BoxFuture<Result<CallOutcome, Rejection>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let app = self.app.clone();
        // Not an `async fn` owning both: rustc keeps an owned argument twice in its future
        // (1,560 bytes against this block's 1,208).
        Box::pin(async move { call_app(&app, &call).await })
    }
}

/// Call a tools-v1 app (or peer) with `call` and decode its answer.
pub async fn call_app(app: &AppClient, call: &ToolCall) -> Result<CallOutcome, Rejection> {
    let body = request_body(call);
    let (status, body) = app.post_call("/v1/tools/call", call, body).await?;
    decode_response(status, &body, call)
}
