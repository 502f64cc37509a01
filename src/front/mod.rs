//! What both fronts share: the response type, the record of each call for metrics, the outer
//! service that turns a [`Rejection`] from the HTTP-stage layers into the front's envelope,
//! and JSON response helpers.

mod call_stack;
mod envelope;

/// A call for tests elsewhere in the crate.
#[cfg(test)]
pub(crate) use call_stack::tests::tool_call;
pub use call_stack::CallStack;
pub use envelope::{rejection_response, Envelope, EnvelopeFuture};

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;

use carapace_filters::call::{CallOutcome, Principal, ToolCall, ToolSpec};
use carapace_filters::Rejection;
use tokio::time::Instant;

use crate::errors;
use crate::receipts::ReceiptSlot;

/// Every response carapace sends to callers.
pub type Resp = Response<Full<Bytes>>;

/// Put in a response's extensions by a front: which tool, and how the call ended.
#[derive(Debug, Clone)]
pub struct CallRecord {
    pub tool: Option<Arc<ToolSpec>>,
    pub outcome: &'static str,
}

/// Put in a refusal's extensions by the front's encoder: the error code the caller got.
#[derive(Debug, Clone, Copy)]
pub struct RefusalCode(pub &'static str);

/// The header a Skill Gateway v1 caller names its call's idempotency key in (tools-v1 has
/// the `idempotency_key` field, MCP the [`MCP_IDEMPOTENCY_KEY`] `_meta` key).
pub const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// The `_meta` key of an MCP `tools/call` that names its idempotency key.
pub const MCP_IDEMPOTENCY_KEY: &str = "io.carapace/idempotency-key";

/// The `Idempotency-Key` header's value, if sent; one that is not visible ASCII is refused.
pub fn idempotency_header(headers: &http::HeaderMap) -> Result<Option<String>, Rejection> {
    match headers.get(IDEMPOTENCY_KEY) {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Ok(k) if crate::idempotency::valid_key(k) => Ok(Some(k.to_string())),
            _ => Err(Rejection::InvalidRequest {
                message: "Idempotency-Key must be 1 to 255 visible ASCII characters".into(),
                path: None,
            }),
        },
    }
}

/// The principal the identity layer put on the request.
pub fn principal<B>(req: &Request<B>) -> Result<Arc<Principal>, Rejection> {
    req.extensions()
        .get::<Arc<Principal>>()
        .cloned()
        .ok_or_else(|| Rejection::Internal("request without principal".into()))
}

/// The tools `principal` may call, in name order (discovery shows only those).
pub fn visible_tools(
    catalog: &crate::catalog::Catalog,
    principal: &Principal,
    now_ms: u64,
) -> Vec<Arc<carapace_filters::call::ToolSpec>> {
    catalog
        .tools
        .values()
        .filter(|t| {
            principal
                .permissions
                .as_ref()
                .is_some_and(|p| p.may_call(&t.name, now_ms))
        })
        .cloned()
        .collect()
}

/// Tag a response with its call record.
pub fn recorded(mut resp: Resp, tool: Option<Arc<ToolSpec>>, outcome: &'static str) -> Resp {
    resp.extensions_mut().insert(CallRecord { tool, outcome });
    resp
}

/// Log what a rejection withheld from the caller (never secrets: rejections carry none).
pub fn log_withheld(r: &Rejection, call_id: &str, tool: &str) {
    if errors::log_detail(r) {
        match r {
            Rejection::Internal(_) => tracing::error!(call_id, tool, error = %r, "internal error"),
            Rejection::SharedStateUnavailable(_) => {
                tracing::warn!(call_id, tool, error = %r, "shared state store failure")
            }
            _ => tracing::warn!(call_id, tool, error = %r, "app failure"),
        }
    }
}

/// A call that could not be decoded: the front's error envelope, recorded without a tool.
pub fn refused(r: &Rejection, encode: impl FnOnce(&Rejection) -> Resp) -> Resp {
    log_withheld(r, "", "");
    recorded(encode(r), None, r.reason())
}

/// Run a decoded call through the call stage and encode its result with the front's codecs;
/// every front goes through here. The call's receipt, when the stage made or checked one,
/// goes into the response's headers. The stage's layers take the call here, before the
/// returned future is first polled; the future holds only what encoding the result needs.
///
/// `request_extensions` are the caller's request's, which the front has read: emptied here,
/// their map holds the answer's call record, so tagging the answer allocates no map of its
/// own (pass `Extensions::default()` when there are none).
pub fn run_call(
    calls: &CallStack,
    mut call: ToolCall,
    started: Instant,
    mut request_extensions: http::Extensions,
    encode_outcome: impl FnOnce(&CallOutcome, &str, &str, u64) -> Resp,
    encode_rejection: impl FnOnce(&Rejection, &str, &str, u64) -> Resp,
) -> impl Future<Output = Resp> {
    request_extensions.clear();
    let (call_id, tool) = (call.call_id.clone(), call.tool.clone());
    let receipt = calls.has_receipt(&call).then(ReceiptSlot::default);
    if let Some(slot) = &receipt {
        call.extensions.insert(slot.clone());
    }
    let started_call = calls.start(call);
    async move {
        let result = started_call.await;
        let ms = carapace_filters::clock::elapsed(started).as_millis() as u64;
        let (mut resp, outcome) = match &result {
            Ok(o @ CallOutcome::Ok { .. }) => (encode_outcome(o, &call_id, &tool.name, ms), "ok"),
            Ok(o @ CallOutcome::AppError { .. }) => {
                (encode_outcome(o, &call_id, &tool.name, ms), "app_error")
            }
            Err(r) => {
                log_withheld(r, &call_id, &tool.name);
                (encode_rejection(r, &call_id, &tool.name, ms), r.reason())
            }
        };
        // What the encoder put on the answer (a refusal's code) joins the emptied map.
        let mut extensions = request_extensions;
        extensions.extend(std::mem::take(resp.extensions_mut()));
        *resp.extensions_mut() = extensions;
        let mut resp = recorded(resp, Some(tool), outcome);
        if let Some(slot) = receipt {
            slot.write_headers(resp.headers_mut());
        }
        resp
    }
}

/// A JSON response.
pub fn json_response(status: StatusCode, body: &impl serde::Serialize) -> Resp {
    // Values and the borrowed answer structs have string keys only: this cannot fail.
    json_body(
        status,
        serde_json::to_vec(body).expect("JSON body serializes"),
    )
}

/// A response with `bytes`, JSON text, as its body.
pub fn json_body(status: StatusCode, mut bytes: Vec<u8>) -> Resp {
    // `Bytes` takes a `Vec` without an allocation of its own only when it has no spare room.
    // A body written into a buffer sized for it fills more than half of it, and the allocator
    // shrinks such a block in place.
    bytes.shrink_to_fit();
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::call_stack::tests::tool_call;
    use super::*;

    /// A stack whose layer leaves a receipt in every slot it is given (as the receipt layer
    /// and an idempotent replay do): the caller gets the receipt header exactly when the call
    /// had a slot.
    async fn receipt_header(stack: CallStack, key: Option<&str>) -> Option<http::HeaderValue> {
        let call = tool_call(key);
        let ok = |o: &CallOutcome, _: &str, _: &str, _| match o {
            CallOutcome::Ok { output, .. } => json_response(StatusCode::OK, output),
            CallOutcome::AppError { .. } => unreachable!("the stack answers ok"),
        };
        let resp = run_call(
            &stack,
            call,
            carapace_filters::clock::now(),
            http::Extensions::default(),
            ok,
            |_, _, _, _| unreachable!("the stack answers ok"),
        )
        .await;
        resp.headers().get(crate::receipts::RECEIPT_HEADER).cloned()
    }

    fn signing_stack() -> CallStack {
        CallStack::new(tower::service_fn(|call: ToolCall| async move {
            if let Some(slot) = call.extensions.get::<ReceiptSlot>() {
                slot.fill(crate::receipts::ReceiptNote {
                    receipt: None,
                    encoded: Some(http::HeaderValue::from_static("r1")),
                    status: None,
                });
            }
            Ok(CallOutcome::Ok {
                output: serde_json::json!({}),
                meta: None,
                content: None,
            })
        }))
    }

    #[tokio::test]
    async fn only_calls_a_stack_may_have_receipts_for_go_with_a_receipt_slot() {
        let r1 = Some(http::HeaderValue::from_static("r1"));
        for key in [None, Some("k1")] {
            assert_eq!(receipt_header(signing_stack(), key).await, r1);
            assert_eq!(
                receipt_header(signing_stack().without_receipts(false), key).await,
                None
            );
        }
        // A stored answer's receipt is replayed for a keyed call only.
        let keyed = || signing_stack().without_receipts(true);
        assert_eq!(receipt_header(keyed(), Some("k1")).await, r1);
        assert_eq!(receipt_header(keyed(), None).await, None);
    }

    /// The answer is tagged in the request's emptied map: it carries its call record and
    /// what its encoder put there (a refusal's code), and nothing of the request's.
    #[tokio::test]
    async fn an_answer_holds_its_record_and_its_encoders_tags_and_none_of_the_requests() {
        #[derive(Clone)]
        struct FromTheRequest;
        let refusing = CallStack::new(tower::service_fn(|_: ToolCall| async {
            Err::<CallOutcome, _>(Rejection::Overloaded)
        }));
        for (stack, refused) in [(signing_stack(), false), (refusing, true)] {
            let mut request = http::Extensions::new();
            request.insert(FromTheRequest);
            let resp = run_call(
                &stack,
                tool_call(None),
                carapace_filters::clock::now(),
                request,
                |_, _, _, _| json_response(StatusCode::OK, &serde_json::json!({})),
                |r, _, _, _| {
                    let mut resp = json_response(StatusCode::SERVICE_UNAVAILABLE, &r.reason());
                    resp.extensions_mut().insert(RefusalCode("OVERLOADED"));
                    resp
                },
            )
            .await;
            let ext = resp.extensions();
            assert!(ext.get::<FromTheRequest>().is_none());
            let record = ext.get::<CallRecord>().expect("the call is recorded");
            assert_eq!(record.tool.as_ref().map(|t| t.name.as_str()), Some("t"));
            match refused {
                false => {
                    assert_eq!(record.outcome, "ok");
                    assert!(ext.get::<RefusalCode>().is_none());
                }
                true => {
                    assert_eq!(record.outcome, Rejection::Overloaded.reason());
                    assert_eq!(ext.get::<RefusalCode>().map(|c| c.0), Some("OVERLOADED"));
                }
            }
        }
    }
}
