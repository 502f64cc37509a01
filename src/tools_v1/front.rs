//! The tools-v1 front: `GET /v1/tools` and `POST /v1/tools/call` from callers, decoded into calls.

use std::borrow::Cow;
use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use carapace_filters::call::{CallContext, CallOutcome, Credential, Principal, ToolCall};
use carapace_filters::canonical::parse_strict;
use carapace_filters::signature::UnixClock;
use carapace_filters::{BoxFuture, Rejection};
use futures_util::future::Either;
use http::{Method, Request, StatusCode};
use serde_json::{json, Value};
use tower::Service;

use super::{REQUEST, REQUEST_SCHEMA};
use crate::catalog::{tools_v1_descriptor, CatalogHandle};
use crate::errors::{self, ToolsV1Answers};
use crate::front::{self, json_response, CallStack, Resp};
use crate::in_flight::{Finished, InFlightCalls};
use crate::json_text;
use crate::ops::call_fields::{CallField, CallScope};

/// The tools-v1 error envelope (this front's one mapping of rejections). `malformed`: the body
/// is not one JSON document of the request's shape.
pub fn error_response(
    r: &Rejection,
    call: (&str, &str),
    duration_ms: u64,
    answers: ToolsV1Answers,
    malformed: bool,
) -> Resp {
    let (code, http_status) = errors::tools_v1(r);
    let status = match answers {
        ToolsV1Answers::HttpStatus => http_status,
        ToolsV1Answers::Reference => errors::tools_v1_reference_status(r, malformed),
    };
    let error = json!({
        "code": code,
        "message": errors::message(r),
        "retryable": errors::tools_v1_retryable(r),
        "details": errors::details(r),
    });
    let mut resp = json_response(
        status,
        &json!({
            "version": "v1",
            "call_id": call.0,
            "tool_name": call.1,
            "status": errors::tools_v1_call_status(r),
            "error": error,
            "duration_ms": duration_ms,
        }),
    );
    errors::refusal_headers(r, resp.headers_mut());
    resp.extensions_mut().insert(front::RefusalCode(code));
    if let Rejection::MethodNotAllowed(allow) = r {
        if let Ok(v) = http::HeaderValue::from_str(allow) {
            resp.headers_mut().insert(http::header::ALLOW, v);
        }
    }
    resp
}

/// The tools-v1 front (its parts shared: a front is copied for every request).
#[derive(Clone)]
pub struct ToolsV1Front(Arc<FrontParts>);

/// What the tools-v1 front holds.
pub struct FrontParts {
    catalog: Arc<CatalogHandle>,
    calls: CallStack,
    clock: UnixClock,
    answers: ToolsV1Answers,
    in_flight: Arc<InFlightCalls>,
}

impl std::ops::Deref for ToolsV1Front {
    type Target = FrontParts;
    fn deref(&self) -> &FrontParts {
        &self.0
    }
}

impl ToolsV1Front {
    pub fn new(
        catalog: Arc<CatalogHandle>,
        calls: CallStack,
        clock: UnixClock,
        answers: ToolsV1Answers,
        in_flight: Arc<InFlightCalls>,
    ) -> Self {
        ToolsV1Front(Arc::new(FrontParts {
            catalog,
            calls,
            clock,
            answers,
            in_flight,
        }))
    }

    /// `POST /v1/tools/cancel` `{"version": "v1", "call_id": ...}`: cancel the caller's own
    /// call in flight with that id; `cancelled` says whether there was one.
    fn cancel(&self, req: &Request<Bytes>, principal: &Principal) -> Resp {
        let doc: Option<Value> = serde_json::from_slice(req.body()).ok();
        let call_id = doc
            .as_ref()
            .filter(|d| d["version"] == "v1")
            .and_then(|d| d["call_id"].as_str())
            .map(str::trim)
            .filter(|id| !id.is_empty());
        let Some(call_id) = call_id else {
            let r = Rejection::invalid(
                "a cancel request is {\"version\": \"v1\", \"call_id\": \"...\"}",
            );
            return front::refused(&r, |r| error_response(r, ("", ""), 0, self.answers, true));
        };
        let key = ("tools-v1", principal.id.clone(), call_id.into());
        let cancelled = self.in_flight.cancel(&key);
        json_response(
            StatusCode::OK,
            &json!({"version": "v1", "call_id": call_id, "cancelled": cancelled}),
        )
    }

    /// Discovery: only the tools this caller may call.
    fn list(&self, principal: &carapace_filters::call::Principal) -> Resp {
        let catalog = self.catalog.load();
        let tools: Vec<Value> = front::visible_tools(&catalog, principal, (self.clock)())
            .iter()
            .map(|t| tools_v1_descriptor(t))
            .collect();
        json_response(
            StatusCode::OK,
            &json!({"version": "v1", "service": catalog.service, "tools": tools}),
        )
    }
}

/// Why a call request could not be decoded, with what could be read of it for the envelope.
#[derive(Debug)]
pub struct Refused {
    pub rejection: Rejection,
    pub call_id: String,
    pub tool_name: String,
    /// Not one JSON document of the request's shape (the reference answers those 400).
    pub malformed: bool,
}

/// A call request that follows tools-v1, before its tool is looked up in the catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRequest<'a> {
    /// Trimmed, non-blank.
    pub call_id: Arc<str>,
    /// Trimmed, non-blank; borrowed from the body when it has no escape (the name is only
    /// looked up, a call holds its catalog entry).
    pub tool_name: Cow<'a, str>,
    pub tenant_id: Option<String>,
    /// `{}` when absent.
    pub args: Value,
    pub context: Option<CallContext>,
    pub timeout_ms: Option<u64>,
    pub idempotency_key: Option<String>,
}

/// The first member of `doc` (or of its `context`) that the request schema does not name.
fn unknown_member(doc: &Value) -> Option<String> {
    fn props(v: &Value) -> Vec<String> {
        v["properties"]
            .as_object()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }
    static KNOWN: LazyLock<(Vec<String>, Vec<String>)> = LazyLock::new(|| {
        let schema: Value = serde_json::from_str(REQUEST_SCHEMA).expect("schema is JSON");
        (props(&schema), props(&schema["properties"]["context"]))
    });
    let (root, context) = &*KNOWN;
    let extra = |v: &Value, known: &[String], at: &str| {
        v.as_object()?
            .keys()
            .find(|k| !known.contains(k))
            .map(|k| format!("{at}/{k}"))
    };
    extra(doc, root, "").or_else(|| extra(&doc["context"], context, "/context"))
}

/// Members that must be non-blank strings (after trimming), as the reference tool host
/// checks them.
const REQUIRED_IDS: [&str; 4] = ["version", "call_id", "tool_name", "tenant_id"];

/// Decode the body of a `POST /v1/tools/call` request: one strict JSON document following the
/// request schema, with no member tools-v1 does not define, and non-blank ids (trimmed as
/// the reference tool host trims them). The tool is not looked up.
pub fn decode_request(body: &[u8]) -> Result<CallRequest<'_>, Refused> {
    match super::wire::read_call(body) {
        Some(call) => Ok(CallRequest {
            call_id: Arc::from(call.call_id.trim()),
            tool_name: match call.tool_name {
                Cow::Borrowed(name) => Cow::Borrowed(name.trim()),
                Cow::Owned(name) => Cow::Owned(name.trim().to_owned()),
            },
            tenant_id: Some(call.tenant_id.into_owned()),
            args: call.args,
            context: Some(CallContext::from_checked_json(call.context)),
            timeout_ms: call.timeout_ms,
            idempotency_key: call.idempotency_key.map(Cow::into_owned),
        }),
        None => decode_request_general(body),
    }
}

/// [`decode_request`] through the strict parse and the seed's schema: the refusal of a body
/// the one-pass reader does not accept (and, for the fuzz target, the same result for any
/// body it does).
#[doc(hidden)]
pub fn decode_request_general(body: &[u8]) -> Result<CallRequest<'static>, Refused> {
    let malformed = |rejection| Refused {
        rejection,
        call_id: String::new(),
        tool_name: String::new(),
        malformed: true,
    };
    let doc = parse_strict(body).map_err(|e| malformed(Rejection::invalid(e.to_string())))?;
    if let Some(path) = unknown_member(&doc) {
        return Err(malformed(Rejection::InvalidRequest {
            message: "request has a member tools-v1 does not define".into(),
            path: Some(path),
        }));
    }
    let s = |k: &str| doc.get(k).and_then(Value::as_str).unwrap_or("").trim();
    let (call_id, tool_name) = (s("call_id").to_string(), s("tool_name").to_string());
    let fail = |rejection| Refused {
        rejection,
        call_id: call_id.clone(),
        tool_name: tool_name.clone(),
        malformed: false,
    };
    // The reference tool host's check and message, word for word.
    if REQUIRED_IDS.iter().any(|k| s(k).is_empty()) {
        return Err(fail(Rejection::invalid(format!(
            "missing required fields: {}",
            REQUIRED_IDS.join(", ")
        ))));
    }
    if s("version") != "v1" {
        return Err(fail(Rejection::ProtocolVersionUnsupported(
            s("version").into(),
        )));
    }
    if let Err(v) = REQUEST.validate(&doc) {
        let first = &v[0];
        return Err(fail(Rejection::InvalidRequest {
            message: format!("request does not follow tools-v1: {}", first.message),
            path: Some(first.path.clone()),
        }));
    }
    let Value::Object(mut m) = doc else {
        unreachable!("schema requires an object")
    };
    Ok(CallRequest {
        call_id: call_id.into(),
        tool_name: Cow::Owned(tool_name),
        tenant_id: m
            .remove("tenant_id")
            .and_then(|v| v.as_str().map(str::to_owned)),
        args: m.remove("args").unwrap_or_else(|| json!({})),
        context: m.remove("context").map(|c| CallContext::from_value(&c)),
        timeout_ms: m.get("timeout_ms").and_then(Value::as_u64),
        idempotency_key: m
            .remove("idempotency_key")
            .and_then(|v| v.as_str().map(str::to_owned)),
    })
}

/// Decode a call request and look its tool up in `catalog`.
fn decode(
    body: &[u8],
    catalog: &CatalogHandle,
    principal: Arc<carapace_filters::call::Principal>,
) -> Result<ToolCall, Refused> {
    let req = decode_request(body)?;
    let fail = |rejection| Refused {
        rejection,
        call_id: req.call_id.to_string(),
        tool_name: req.tool_name.to_string(),
        malformed: false,
    };
    if !catalog.discovered() {
        return Err(fail(Rejection::AppUnavailable(
            "tool discovery has not succeeded yet".into(),
        )));
    }
    let tool = catalog.lookup(&req.tool_name).map_err(fail)?;
    Ok(ToolCall {
        call_id: req.call_id,
        tool,
        tenant_id: req.tenant_id,
        args: req.args,
        context: req.context,
        timeout_ms: req.timeout_ms,
        idempotency_key: req.idempotency_key,
        principal,
        request_id: None,
        trace_context: Vec::new(),
        extensions: Default::default(),
        credential: Credential::None,
    })
}

/// The tools-v1 encoding of a call's outcome.
pub(super) fn outcome_response(
    outcome: &CallOutcome,
    call_id: &str,
    tool: &str,
    duration_ms: u64,
) -> Resp {
    match outcome {
        CallOutcome::Ok { output, .. } => {
            // Members in the order `json!` would write them (sorted), `output` copied once.
            let mut body = Vec::with_capacity(192);
            json_text::object(&mut body, |o| {
                o.str("call_id", call_id)
                    .u64("duration_ms", duration_ms)
                    .value("result", output)
                    .str("status", "ok")
                    .str("tool_name", tool)
                    .str("version", "v1");
            });
            front::json_body(StatusCode::OK, body)
        }
        CallOutcome::AppError {
            code,
            message,
            details,
            retryable,
            ..
        } => {
            let mut error = json!({"code": code, "message": message, "retryable": retryable});
            if let Some(d) = details {
                error["details"] = d.clone();
            }
            json_response(
                StatusCode::OK,
                &json!({
                    "version": "v1", "call_id": call_id, "tool_name": tool,
                    "status": if *retryable { "retryable_error" } else { "error" },
                    "error": error, "duration_ms": duration_ms,
                }),
            )
        }
    }
}

impl ToolsV1Front {
    /// `POST /v1/tools/call`: the request is decoded and the call stage started here; the
    /// returned future holds only what the answer needs (not the request, nor the call).
    fn call_tool(
        &self,
        req: &mut Request<Bytes>,
    ) -> impl Future<Output = Result<Resp, Rejection>> + Send + 'static {
        let started = carapace_filters::clock::now();
        let answers = self.answers;
        let principal = match front::principal(req) {
            Ok(p) => p,
            Err(r) => return Either::Left(std::future::ready(Err(r))),
        };
        let mut call = match decode(req.body(), &self.catalog, principal) {
            Ok(call) => call,
            Err(d) => {
                let resp = front::refused(&d.rejection, |r| {
                    error_response(r, (&d.call_id, &d.tool_name), 0, answers, d.malformed)
                });
                return Either::Left(std::future::ready(Ok(resp)));
            }
        };
        call.request_id = crate::edge::request_id(req);
        let scope = CallScope::current();
        scope.record_tool(&call.tool);
        if let Some(id) = call.context.as_ref().and_then(|c| c.member("trace_id")) {
            scope.record(CallField::ContextTraceId, &id);
        }
        call.trace_context = crate::telemetry::outgoing_context(req.headers());
        // The name a cancel gives (handed back if the call is cancelled).
        let key = ("tools-v1", call.principal.id.clone(), call.call_id.clone());
        let tool = call.tool.clone();
        let run = front::run_call(
            &self.calls,
            call,
            started,
            std::mem::take(req.extensions_mut()),
            outcome_response,
            move |r, call_id, tool, ms| error_response(r, (call_id, tool), ms, answers, false),
        );
        let in_flight = self.in_flight.clone();
        Either::Right(async move {
            Ok(match in_flight.run(key, run).await {
                Finished::Done(resp) => resp,
                Finished::Cancelled((_, _, call_id)) => {
                    let ms = carapace_filters::clock::elapsed(started).as_millis() as u64;
                    let r = Rejection::Cancelled;
                    let call = (&*call_id, tool.name.as_str());
                    let resp = error_response(&r, call, ms, answers, false);
                    front::recorded(resp, Some(tool), r.reason())
                }
            })
        })
    }
}

impl Service<Request<Bytes>> for ToolsV1Front {
    type Response = Resp;
    type Error = Rejection;
    type Future = BoxFuture<Result<Resp, Rejection>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        if req.method() == Method::POST && req.uri().path() == "/v1/tools/call" {
            return Box::pin(self.call_tool(&mut req));
        }
        let this = self.clone();
        Box::pin(async move {
            match (req.method(), req.uri().path()) {
                (&Method::GET, "/v1/tools") => Ok(this.list(&*front::principal(&req)?)),
                // As the reference tool host: a paired caller can check the host is up.
                (&Method::GET, "/healthz") => {
                    Ok(json_response(StatusCode::OK, &json!({"ok": true})))
                }
                (&Method::POST, "/v1/tools/cancel") => {
                    Ok(this.cancel(&req, &*front::principal(&req)?))
                }
                (_, "/v1/tools") => Err(Rejection::MethodNotAllowed("GET".into())),
                (_, "/v1/tools/call" | "/v1/tools/cancel") => {
                    Err(Rejection::MethodNotAllowed("POST".into()))
                }
                (m, p) => Err(Rejection::NoRoute(format!("{m} {p}"))),
            }
        })
    }
}
