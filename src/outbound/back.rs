//! The back of the outbound stack: calls to paired peers and skills, and their answers.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::{BoxFuture, Rejection};
use http::Method;
use tower::Service;

use super::routes::Route;
use super::Outbound;
use crate::upstream::AppClient;

/// A peer's answer and the receipt it came with.
type PeerAnswer = (Result<CallOutcome, Rejection>, Option<http::HeaderValue>);

/// Call a paired tool host with `call` and decode its answer.
async fn call_peer(client: &AppClient, call: &ToolCall) -> PeerAnswer {
    match send_to_peer(client, call).await {
        Ok((outcome, receipt)) => (outcome, receipt),
        Err(r) => (Err(r), None),
    }
}

async fn send_to_peer(
    client: &AppClient,
    call: &ToolCall,
) -> Result<(Result<CallOutcome, Rejection>, Option<http::HeaderValue>), Rejection> {
    let body = crate::tools_v1::request_body(call);
    let headers = carapace_filters::call::app_headers(call);
    let resp = client
        .send(Method::POST, "/v1/tools/call", headers, Bytes::from(body))
        .await?;
    let receipt = resp.headers.get(crate::receipts::RECEIPT_HEADER).cloned();
    Ok((decode_peer_answer(resp.status, &resp.body, call), receipt))
}

/// A tool host's answer, in either style of a tools-v1 host: every outcome as HTTP 200 with
/// the envelope (crabstack), or an error outcome as an HTTP error status with the envelope
/// (carapace). A refusal or error of the host reaches the caller as the host said it (code,
/// message, details, and `retryable` only for `status: retryable_error`); an answer that is
/// no envelope (crabstack's plain-text 400/404/405) stays `DEPENDENCY_UNAVAILABLE`.
pub(super) fn decode_peer_answer(
    status: http::StatusCode,
    body: &[u8],
    call: &ToolCall,
) -> Result<CallOutcome, Rejection> {
    let refusal = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|doc| peer_error(&doc, call));
    match refusal {
        Some(outcome) => outcome,
        // Successes (and anything else) as any tools-v1 answer: schema, call id, status.
        None => crate::tools_v1::decode_response(status, body, call),
    }
}

/// The outcome an error envelope (`status` `error`, `retryable_error` or `timeout` with an
/// `error.code`) stands for; `None` if `doc` is not one. The call id and tool name may be
/// empty (a host refuses some requests before reading them) but not another call's.
fn peer_error(doc: &serde_json::Value, call: &ToolCall) -> Option<Result<CallOutcome, Rejection>> {
    let status = doc.get("status")?.as_str()?;
    if !matches!(status, "error" | "retryable_error" | "timeout") {
        return None;
    }
    let error = doc.get("error")?;
    let code = error.get("code")?.as_str()?;
    let other = |key: &str, ours: &str| {
        doc.get(key)
            .and_then(serde_json::Value::as_str)
            .is_some_and(|v| !v.is_empty() && v != ours)
    };
    if other("call_id", &call.call_id) || other("tool_name", call.tool.app_name()) {
        return Some(Err(Rejection::AppInvalid(
            "answer is for another call_id or tool".into(),
        )));
    }
    if status == "timeout" {
        let ms = call.tool.effective_timeout(call.timeout_ms).as_millis() as u64;
        return Some(Err(Rejection::Timeout(ms)));
    }
    let valid_code = (1..=64).contains(&code.len())
        && code
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    let message = error.get("message").and_then(serde_json::Value::as_str);
    Some(Ok(CallOutcome::AppError {
        code: if valid_code { code } else { "INTERNAL" }.to_string(),
        message: message.unwrap_or_default().chars().take(2048).collect(),
        details: error.get("details").filter(|d| d.is_object()).cloned(),
        // Only this status allows a retry; `error.retryable` is advice.
        retryable: status == "retryable_error",
        content: None,
    }))
}

/// The back of the outbound stack: call the peer that serves the tool; retry once, only
/// with an idempotency key, and only after a transport failure or a `retryable_error`.
#[derive(Clone)]
pub struct OutboundBack {
    outbound: Arc<Outbound>,
}

impl OutboundBack {
    pub fn new(outbound: Arc<Outbound>) -> Self {
        OutboundBack { outbound }
    }
}

impl Service<ToolCall> for OutboundBack {
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = BoxFuture<Result<CallOutcome, Rejection>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let outbound = self.outbound.clone();
        Box::pin(async move {
            let route = outbound
                .routes
                .load()
                .get(&call.tool.name)
                .cloned()
                .ok_or_else(|| Rejection::ToolNotFound(call.tool.name.clone()))?;
            let peer = match route {
                Route::Peer(peer) => peer,
                Route::Skill(id) => {
                    let skill = outbound
                        .skills
                        .get(&id)
                        .ok_or_else(|| Rejection::Internal(format!("no skill {id}")))?;
                    let admitted = outbound.health.admit(&id)?;
                    let result = crate::skill_v1::call_skill(
                        &skill.client,
                        &skill.config.skill_id,
                        &skill.config.protocol_version,
                        skill.signing.as_ref(),
                        &call,
                    )
                    .await;
                    outbound.ended(&id, admitted, reached(&result));
                    return result;
                }
                Route::Eat(id) => {
                    let source = outbound
                        .eat
                        .get(&id)
                        .ok_or_else(|| Rejection::Internal(format!("no EAT catalog {id}")))?;
                    return source.call(call, (outbound.clock)() / 1000).await;
                }
            };
            let client = outbound.client_for(&peer)?;
            let admitted = outbound.health.admit(&peer)?;
            let mut answer = call_peer(&client, &call).await;
            let retry = call.idempotency_key.is_some()
                && matches!(
                    &answer.0,
                    Err(Rejection::AppUnavailable(_))
                        | Ok(CallOutcome::AppError {
                            retryable: true,
                            ..
                        })
                );
            if retry {
                tracing::info!(call_id = %call.call_id, peer = %peer, "retrying once");
                answer = call_peer(&client, &call).await;
            }
            outbound.ended(&peer, admitted, reached(&answer.0));
            outbound.check_receipt(&peer, &call, answer)
        })
    }
}

/// Whether a provider answered at all (only a transport failure says it did not).
fn reached(result: &Result<CallOutcome, Rejection>) -> bool {
    !matches!(result, Err(Rejection::AppUnavailable(_)))
}

impl Outbound {
    /// A call to `provider` ended: its circuit and the metric learn how.
    fn ended(&self, provider: &str, admitted: super::health::Admitted, reached: bool) {
        admitted.ended(reached, (self.clock)());
        let open = self.health.of(provider).state != super::health::CircuitState::Closed;
        self.metrics.provider_circuit(provider, open);
    }

    /// Check a peer's receipt as `outbound.peers.<id>.receipts` says, and leave it with the
    /// verdict in the call's [`ReceiptSlot`]. `require` refuses a success without a valid
    /// receipt and any answer with an invalid one; a failure without a receipt passes (it
    /// claims nothing was done).
    fn check_receipt(
        &self,
        peer: &str,
        call: &ToolCall,
        answer: PeerAnswer,
    ) -> Result<CallOutcome, Rejection> {
        use crate::receipts::{check, Expected, ReceiptMode, ReceiptNote, ReceiptSlot, Verdict};
        let (result, header) = answer;
        let mode = self.receipt_modes.get(peer).copied().unwrap_or_default();
        if mode == ReceiptMode::Off || matches!(result, Err(Rejection::AppUnavailable(_))) {
            return result;
        }
        let key = self
            .peers
            .active(peer)
            .and_then(|r| r.public_key_ed25519)
            .unwrap_or_default();
        let (status, output, code) = crate::receipts::layer::ending(&result);
        let want = Expected {
            tool: call.tool.app_name(),
            consumer: &self.signer.id,
            provider: peer,
            input: &call.args,
            status,
            output,
            code,
        };
        let verdict = check(header.as_ref().map(|h| h.as_bytes()), &key, &want);
        self.metrics.receipt_checked(peer, verdict.status());
        if let Some(slot) = call.extensions.get::<ReceiptSlot>() {
            slot.fill(ReceiptNote {
                encoded: header.clone(),
                receipt: match &verdict {
                    Verdict::Verified(r) => Some(r.clone()),
                    _ => None,
                },
                status: Some(verdict.status()),
            });
        }
        let refuse = match &verdict {
            Verdict::Verified(_) => return result,
            Verdict::Invalid(e) => {
                tracing::warn!(peer, call_id = %call.call_id, reason = e.reason(), "receipt invalid: {e}");
                mode == ReceiptMode::Require
            }
            Verdict::Missing => {
                tracing::warn!(peer, call_id = %call.call_id, "receipt missing");
                mode == ReceiptMode::Require && status == crate::receipts::ReceiptStatus::Ok
            }
        };
        match refuse {
            true => Err(Rejection::AppInvalid(format!(
                "the answer of {peer} has no valid receipt ({})",
                verdict.status()
            ))),
            false => result,
        }
    }
}
