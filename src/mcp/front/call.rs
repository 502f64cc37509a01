//! `tools/call` on the MCP front: decoded into the internal call and run through the call
//! stage. A call whose caller takes `text/event-stream`, in front of an MCP server, gets a
//! caller's stream for the server's notifications and requests about it
//! ([`crate::mcp::stream`]); in the older era a `notifications/cancelled` naming the request
//! ends it.

use std::future::Future;
use std::sync::Arc;
use tokio::time::Instant;

use bytes::Bytes;
use http::Request;
use serde_json::{Map, Value};

use carapace_filters::call::{CallOutcome, Credential, Principal, ToolCall, ToolSpec};
use carapace_filters::Rejection;

use super::{answered, complete, refused, Answer, Era, McpFront};
use crate::front::{self, CallStack, Resp};
use crate::in_flight::Finished;
use crate::json_text;
use crate::mcp::back::relay::{log_level, CallerStream, ClientFeatures};
use crate::mcp::early::ToolLimitTaken;
use crate::mcp::jsonrpc::{result_response, McpError};
use crate::mcp::results::{refusal_result, tool_result};
use crate::mcp::stream::{self, StreamContext};
use crate::mcp::wire::{CallMeta, CallParams};
use crate::mcp::{LEGACY_VERSIONS, MODERN_VERSION};

/// What a call's era decides of it: the version it is answered at, its older-era session,
/// what its caller can answer of a server's requests, and the log messages it gets.
struct CallEra {
    version: &'static str,
    session: Option<String>,
    features: ClientFeatures,
    logs: Option<u8>,
}

impl McpFront {
    /// `tools/call` in `era`: the call is decoded and handed to the call stage here; the
    /// answer's future holds only what the answer needs (nothing of the request).
    pub(super) fn tools_call(
        &self,
        req: &mut Request<Bytes>,
        id: Value,
        mut params: CallParams,
        principal: Arc<Principal>,
        era: Era,
    ) -> Answer {
        let started = carapace_filters::clock::now();
        let meta = params.meta.as_deref();
        let CallEra {
            version,
            session,
            features,
            logs,
        } = self.call_era(era, meta);
        // Only an MCP server says anything while a call runs.
        let relay = (self.server.is_some() && accepts_stream(req)).then(|| {
            let progress = meta.and_then(|m| m.progress_token.clone());
            CallerStream::new(progress, features, session.is_some(), logs)
        });
        let (stream, messages) = relay.unzip();
        let streamed = messages.map(|messages| {
            let cx = StreamContext {
                answers: self.sessions.answers().clone(),
                session: session.clone(),
                guard: self
                    .guard
                    .clone()
                    .map(|g| (g, params.name.clone().unwrap_or_default())),
                receipts: self.receipts && takes_trailers(req),
            };
            (messages, cx)
        });
        let cancel_key = session.map(|s| ("mcp", s.into(), id.to_string().into()));
        let mut call = match self.decode_call(req, &mut params, principal) {
            Ok(call) => call,
            Err(e) => return answered(refused(Some(&id), &e)),
        };
        if let Some(stream) = stream {
            call.extensions.insert(stream);
        }
        if let Some(retry) = params.retry.take() {
            call.extensions.insert(retry);
        }
        crate::ops::call_fields::record_tool(&call.tool);
        let limit_taken = req
            .extensions()
            .get::<ToolLimitTaken>()
            .is_some_and(|t| t.0 == call.tool.name);
        let stack = if limit_taken {
            &self.header_checked
        } else {
            &self.calls
        };
        let extensions = std::mem::take(req.extensions_mut());
        let call: Answer = match cancel_key {
            None => Box::pin(answer(stack, call, started, extensions, id, version)),
            Some(key) => {
                let tool = call.tool.clone();
                let run = answer(stack, call, started, extensions, id.clone(), version);
                let in_flight = self.in_flight.clone();
                Box::pin(async move {
                    match in_flight.run(key, run).await {
                        Finished::Done(resp) => resp,
                        Finished::Cancelled(_) => cancelled(&id, tool),
                    }
                })
            }
        };
        match streamed {
            None => call,
            Some((messages, cx)) => Box::pin(stream::respond(call, messages, cx)),
        }
    }

    /// What `era` decides of a call. Log messages: a 2026-07-28 caller asks per request; an
    /// older session gets them all unless it set a level.
    fn call_era(&self, era: Era, meta: Option<&CallMeta>) -> CallEra {
        match era {
            Era::Modern => {
                let level = meta.and_then(|m| m.log_level.as_ref());
                let caps = meta.and_then(|m| m.capabilities.as_ref());
                CallEra {
                    version: MODERN_VERSION,
                    session: None,
                    features: ClientFeatures::of(caps),
                    logs: level.and_then(Value::as_str).and_then(log_level),
                }
            }
            Era::Legacy(s) => CallEra {
                logs: Some(self.sessions.log_level(&s.id).unwrap_or(0)),
                version: s.version,
                session: Some(s.id),
                features: s.features,
            },
        }
    }

    /// The call `params` describe; its `arguments` are moved out of them.
    fn decode_call(
        &self,
        req: &Request<Bytes>,
        params: &mut CallParams,
        principal: Arc<Principal>,
    ) -> Result<ToolCall, McpError> {
        let arguments = params.arguments.take();
        let name = params
            .name
            .as_deref()
            .ok_or_else(|| McpError::InvalidParams("`name` (a string) is required".into()))?;
        let args = match arguments {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(a @ Value::Object(_)) => a,
            Some(_) => {
                return Err(McpError::InvalidParams(
                    "`arguments` must be an object".into(),
                ))
            }
        };
        if !self.catalog.discovered() {
            return Err(McpError::Refused(Rejection::AppUnavailable(
                "tool discovery has not succeeded yet".into(),
            )));
        }
        let tool = match self.catalog.lookup(name) {
            Ok(tool) => tool,
            Err(e @ Rejection::ToolNotApproved { .. }) => return Err(McpError::Refused(e)),
            Err(_) => return Err(McpError::InvalidParams(format!("Unknown tool: {name}"))),
        };
        // An OAuth caller short of a scope is answered at the HTTP level (403 with the scope
        // it needs), in every era, so that its client can ask for the scope; every other
        // refusal of the call stage stays a tool result.
        if let Some(p) = &principal.permissions {
            if !p.may_call(&tool.name, (self.clock)()) {
                let action = format!("tool.call:{}", tool.name);
                if let r @ Rejection::InsufficientScope { .. } = p.refusal(&principal.id, &action) {
                    return Err(McpError::Refused(r));
                }
            }
        }
        let key = params.meta.as_mut().and_then(|m| m.idempotency_key.take());
        let idempotency_key = match key {
            None => None,
            Some(Value::String(k)) if crate::idempotency::valid_key(&k) => Some(k),
            Some(_) => {
                return Err(McpError::InvalidParams(format!(
                    "`_meta.{}` must be a string of 1 to 255 visible ASCII characters",
                    crate::front::MCP_IDEMPOTENCY_KEY
                )))
            }
        };
        Ok(ToolCall {
            call_id: new_call_id().into(),
            tool,
            tenant_id: None,
            args,
            context: None,
            timeout_ms: None,
            idempotency_key,
            principal,
            credential: Credential::None,
            request_id: crate::edge::request_id(req),
            trace_context: crate::telemetry::outgoing_context(req.headers()),
            extensions: Default::default(),
        })
    }
}

/// The call run through `stack` and answered as a `tools/call` result to `id` in `version`.
/// The stage's layers take the call now; the future holds only what the answer needs.
fn answer(
    stack: &CallStack,
    call: ToolCall,
    started: Instant,
    request_extensions: http::Extensions,
    id: Value,
    version: &'static str,
) -> impl Future<Output = Resp> + Send + 'static {
    let legacy_structured = version != LEGACY_VERSIONS[2];
    // One of the two encodes the answer; an id is a number or a short string.
    let refused_id = id.clone();
    front::run_call(
        stack,
        call,
        started,
        request_extensions,
        move |outcome, _, _, _| match outcome {
            CallOutcome::Ok {
                output,
                content: None,
                ..
            } => output_answer(&id, output, version, legacy_structured),
            _ => result_response(
                &id,
                complete(tool_result(outcome, version, legacy_structured), version),
            ),
        },
        move |r, _, _, _| {
            let mut resp = result_response(&refused_id, complete(refusal_result(r), version));
            let code = crate::errors::tools_v1(r).0;
            resp.extensions_mut().insert(front::RefusalCode(code));
            resp
        },
    )
}

/// The answer to a call cancelled in flight, recorded with its tool as the tools-v1 front
/// records one.
fn cancelled(id: &Value, tool: Arc<ToolSpec>) -> Resp {
    let r = Rejection::Cancelled;
    let mut resp = refused(Some(id), &McpError::Cancelled);
    resp.extensions_mut()
        .insert(front::RefusalCode(crate::errors::tools_v1(&r).0));
    front::recorded(resp, Some(tool), r.reason())
}

/// A call id for the internal call: `mcp-` and 24 random hex digits.
fn new_call_id() -> String {
    let mut id = *b"mcp-000000000000000000000000";
    hex::encode_to_slice(rand::random::<[u8; 12]>(), &mut id[4..]).expect("24 digits");
    String::from_utf8(id.to_vec()).expect("ASCII")
}

/// The answer to a call whose result is the app's output as it is (an HTTP app: no content
/// blocks of its own), written from borrowed parts: the same bytes as
/// `result_response(id, complete(tool_result(..)))`, without copying the output into a result
/// first; the output's JSON text is written once, and copied into the text block (as a
/// string) and the structured content.
fn output_answer(id: &Value, output: &Value, version: &str, structured: bool) -> Resp {
    let modern = version == MODERN_VERSION;
    // Before 2026-07-28 structured content is an object.
    let structured = structured && (modern || output.is_object());
    // The output's text, written once for both places it goes.
    let json = serde_json::to_vec(output).expect("a JSON value writes into memory");
    // Room for the envelope, the text (escaped: at most twice as long) and the output.
    let mut body = Vec::with_capacity(256 + 3 * json.len());
    // Members in the order of the result values (sorted by name).
    json_text::object(&mut body, |answer| {
        answer
            .value("id", id)
            .str("jsonrpc", "2.0")
            .object("result", |result| {
                if modern {
                    result.object("_meta", |meta| {
                        meta.object("io.modelcontextprotocol/serverInfo", |info| {
                            info.str("name", "carapace")
                                .str("version", env!("CARGO_PKG_VERSION"));
                        });
                    });
                }
                result
                    .list_of_one("content", |block| {
                        block.text_of("text", &json).str("type", "text");
                    })
                    .bool("isError", false);
                if modern {
                    result.str("resultType", "complete");
                }
                if structured {
                    result.json("structuredContent", &json);
                }
            });
    });
    front::json_body(http::StatusCode::OK, body)
}

/// Whether the caller takes trailer fields: HTTP/2, or HTTP/1.1 with `TE: trailers` (an
/// HTTP/1.1 server sends none otherwise).
fn takes_trailers(req: &Request<Bytes>) -> bool {
    req.version() == http::Version::HTTP_2
        || req.headers().get_all(http::header::TE).iter().any(|v| {
            v.to_str().is_ok_and(|s| {
                s.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
            })
        })
}

/// Whether the caller takes an SSE answer (`Accept` naming `text/event-stream`).
fn accepts_stream(req: &Request<Bytes>) -> bool {
    req.headers()
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| {
            m.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use serde_json::json;

    async fn bytes(resp: Resp) -> Vec<u8> {
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    #[test]
    fn call_ids_are_mcp_and_24_random_hex_digits() {
        let (a, b) = (new_call_id(), new_call_id());
        for id in [&a, &b] {
            let digits = id.strip_prefix("mcp-").expect("prefix");
            assert_eq!(digits.len(), 24, "{id}");
            assert!(digits
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        }
        assert_ne!(a, b);
    }

    #[tokio::test]
    async fn an_output_answer_is_the_bytes_of_the_built_result() {
        let outputs = [
            json!({"b": [1, 2.5, "x"], "a": {"z": null, "y": true}}),
            json!("just text, with \"quotes\" and \u{e9}"),
            json!([1, 2, 3]),
            json!({"path": "C:\\tmp\\x", "raw": "tab\tcontrol\u{1}", "n": null}),
        ];
        let versions = [
            MODERN_VERSION,
            LEGACY_VERSIONS[0],
            LEGACY_VERSIONS[1],
            LEGACY_VERSIONS[2],
        ];
        for output in &outputs {
            for version in versions {
                for structured in [true, false] {
                    for id in [json!(7), json!("req-1")] {
                        let outcome = CallOutcome::Ok {
                            output: output.clone(),
                            meta: None,
                            content: None,
                        };
                        let built = result_response(
                            &id,
                            complete(tool_result(&outcome, version, structured), version),
                        );
                        let fast = output_answer(&id, output, version, structured);
                        assert_eq!(fast.status(), built.status());
                        assert_eq!(
                            String::from_utf8(bytes(fast).await).unwrap(),
                            String::from_utf8(bytes(built).await).unwrap(),
                            "{version} structured={structured} {output}"
                        );
                    }
                }
            }
        }
    }
}
