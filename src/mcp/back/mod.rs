//! The MCP back: an MCP server behind carapace, over Streamable HTTP ([`http`]) or as a stdio
//! command carapace supervises ([`stdio`]), in the newest revision both sides speak
//! ([`upstream`]). Its tools are discovered into the same catalog as any other back's, and a
//! call from any front becomes a `tools/call`.
//!
//! A result becomes the call's output: its `structuredContent` when it has one, else
//! `{"content": [...]}`; the MCP front passes the server's own `content` on unchanged. A
//! result with `isError` is the tool's own error (`TOOL_ERROR`), and a JSON-RPC error is mapped
//! to the Remote Tool Protocol's code (`-32602` → `INVALID_ARGS`, else `INTERNAL`). A 2026-07-28
//! "input required" result goes to a caller that can answer it ([`input`]), and is the tool
//! error `INPUT_REQUIRED` for any other. The server's notifications and requests about a call
//! go to the caller's stream ([`relay`]).

pub mod http;
pub mod input;
pub mod lines;
pub mod listen;
mod negotiate;
pub mod relay;
pub mod stdio;
pub mod upstream;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde_json::{json, Value};
use tower::Service;

use carapace_filters::call::{CallOutcome, ServerContent, ToolCall, ToolSpec};
use carapace_filters::schema::CompiledSchema;
use carapace_filters::{BoxFuture, Rejection};

use relay::{CallerStream, RetryInput};
pub use upstream::McpUpstream;
use upstream::Reply;

/// The back that calls tools on an MCP server.
#[derive(Clone, Debug)]
pub struct McpBack {
    server: Arc<McpUpstream>,
}

impl McpBack {
    pub fn new(server: Arc<McpUpstream>) -> Self {
        McpBack { server }
    }
}

impl Service<ToolCall> for McpBack {
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = BoxFuture<Result<CallOutcome, Rejection>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let server = self.server.clone();
        Box::pin(async move {
            let name = call.tool.app_name();
            let mut params = json!({"name": name, "arguments": call.args});
            if let Some(RetryInput(fields)) = call.extensions.get::<RetryInput>() {
                let p = params.as_object_mut().expect("an object");
                p.extend(fields.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            let relay = call.extensions.get::<CallerStream>().cloned();
            let mut round = 0;
            loop {
                let reply = server
                    .request_relayed("tools/call", params.clone(), Some(name), relay.clone())
                    .await?;
                // An older-era caller is asked on its stream, and the call retried with its
                // answers, a bounded number of times.
                let asked = match (&reply, &relay) {
                    (Reply::Result(r), Some(relay)) if round < input::MAX_ROUNDS => {
                        input::InputRequired::of(r).filter(|a| a.askable(relay))
                    }
                    _ => None,
                };
                let Some(asked) = asked else {
                    return Ok(outcome(reply));
                };
                match asked.ask(relay.as_ref().expect("matched")).await {
                    Ok(retry) => retry.apply(&mut params),
                    Err(refused) => return Ok(refused),
                }
                round += 1;
            }
        })
    }
}

/// The 2026-07-28 error for a request that needs a client capability the client lacks.
const MISSING_CLIENT_CAPABILITY: i64 = -32021;

/// A `tools/call` answer as the call's outcome.
pub fn outcome(reply: Reply) -> CallOutcome {
    let result = match reply {
        Reply::Result(r) => r,
        Reply::Error {
            code,
            message,
            data,
        } => {
            let code = match code {
                -32602 => "INVALID_ARGS",
                // The server needs the caller's input of a kind this caller did not declare
                // (2026-07-28 MissingRequiredClientCapability).
                MISSING_CLIENT_CAPABILITY => "INPUT_REQUIRED",
                _ => "INTERNAL",
            };
            return CallOutcome::AppError {
                code: code.into(),
                message,
                details: data,
                retryable: false,
                content: None,
            };
        }
    };
    // 2026-07-28: the server asks the caller for input and expects the request retried with
    // the answers ([`input`]). A caller that cannot be asked gets a clear error.
    if let Some(asked) = input::InputRequired::of(&result) {
        return asked.into_outcome(result.get("_meta").cloned());
    }
    let blocks = match result.get("content") {
        Some(c @ Value::Array(_)) => c.clone(),
        _ => json!([]),
    };
    let meta = result.get("_meta").cloned();
    if result.get("isError") == Some(&Value::Bool(true)) {
        return tool_error(blocks, meta);
    }
    let (output, structured) = match result.get("structuredContent") {
        Some(s) => (s.clone(), true),
        None => (json!({ "content": blocks }), false),
    };
    CallOutcome::Ok {
        output,
        meta: None,
        content: Some(ServerContent {
            blocks,
            structured,
            meta,
            input_required: None,
        }),
    }
}

/// A result with `isError`: the tool's own error, its text as the message.
fn tool_error(blocks: Value, meta: Option<Value>) -> CallOutcome {
    let message = blocks
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n");
    CallOutcome::AppError {
        code: "TOOL_ERROR".into(),
        message: if message.is_empty() {
            "the tool reported an error".into()
        } else {
            message
        },
        details: Some(json!({ "content": blocks })),
        retryable: false,
        content: Some(ServerContent {
            blocks,
            structured: false,
            meta,
            input_required: None,
        }),
    }
}

/// Compile an MCP server's tools (every page of `tools/list`). A tool without a name or with
/// a schema that does not compile is skipped with a log line; the others are served.
pub fn catalog_tools(
    tools: &[Value],
    timeout_max: impl Fn(&str) -> u64,
) -> BTreeMap<String, Arc<ToolSpec>> {
    let mut out = BTreeMap::new();
    for (i, t) in tools.iter().enumerate() {
        let Some(name) = t
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        else {
            tracing::warn!("tool_skipped index={i} reason=missing_name");
            continue;
        };
        // A name is written into log lines and served to agents: no control characters (a
        // newline would forge a log line).
        if name.chars().any(char::is_control) {
            tracing::warn!("tool_skipped index={i} reason=control_character_in_name");
            continue;
        }
        match tool_spec(name, t, timeout_max(name)) {
            Ok(spec) => {
                if out.insert(name.to_owned(), Arc::new(spec)).is_some() {
                    tracing::warn!("tool_duplicate name={name}: the last definition is served");
                }
            }
            Err(reason) => tracing::warn!("tool_skipped name={name} reason={reason}"),
        }
    }
    out
}

fn tool_spec(name: &str, t: &Value, max: u64) -> Result<ToolSpec, String> {
    let compile = |what: &str, s: &Value| {
        CompiledSchema::compile(s.clone())
            .map_err(|e| format!("{what} schema does not compile: {e}"))
    };
    let input = match t.get("inputSchema") {
        Some(s @ Value::Object(_)) => compile("input", s)?,
        _ => return Err("missing_schema".into()),
    };
    let output = match t.get("outputSchema") {
        Some(s @ Value::Object(_)) => Some(compile("output", s)?),
        _ => None,
    };
    let hint = |k: &str| {
        t.get("annotations")
            .and_then(|a| a.get(k))
            .and_then(Value::as_bool)
    };
    Ok(ToolSpec {
        name: name.to_owned(),
        app_name: None,
        definition: Some(Arc::new(t.clone())),
        description: t
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        input,
        output,
        timeout_ms_default: 30_000u64.clamp(1, max),
        timeout_ms_max: max,
        idempotent: hint("idempotentHint").unwrap_or(false),
        side_effects: !hint("readOnlyHint").unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_and_errors_become_outcomes() {
        let structured = outcome(Reply::Result(json!({
            "content": [{"type": "text", "text": "{\"n\":1}"}],
            "structuredContent": {"n": 1},
        })));
        let CallOutcome::Ok {
            output, content, ..
        } = structured
        else {
            panic!()
        };
        assert_eq!(output, json!({"n": 1}));
        assert!(content.unwrap().structured);

        let image = json!([{"type": "image", "data": "AA==", "mimeType": "image/png"}]);
        let CallOutcome::Ok {
            output, content, ..
        } = outcome(Reply::Result(json!({ "content": image })))
        else {
            panic!()
        };
        assert_eq!(output, json!({ "content": image }));
        let content = content.unwrap();
        assert!(!content.structured);
        assert_eq!(content.blocks, image);

        let failed = outcome(Reply::Result(json!({
            "content": [{"type": "text", "text": "no such file"}], "isError": true,
        })));
        assert!(
            matches!(&failed, CallOutcome::AppError { code, message, .. } if code == "TOOL_ERROR" && message == "no such file"),
            "{failed:?}"
        );
        let asks = outcome(Reply::Result(json!({
            "resultType": "input_required",
            "inputRequests": {"confirm": {"method": "elicitation/create", "params": {}}},
        })));
        assert!(
            matches!(&asks, CallOutcome::AppError { code, .. } if code == "INPUT_REQUIRED"),
            "{asks:?}"
        );
        let complete = outcome(Reply::Result(
            json!({"resultType": "complete", "content": []}),
        ));
        assert!(matches!(complete, CallOutcome::Ok { .. }));
        let invalid = outcome(Reply::Error {
            code: -32602,
            message: "bad".into(),
            data: None,
        });
        assert!(matches!(invalid, CallOutcome::AppError { code, .. } if code == "INVALID_ARGS"));
    }

    #[test]
    fn tools_compile_with_hints_and_bad_ones_are_skipped() {
        let tools = [
            json!({"name": "echo", "inputSchema": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"},
                   "annotations": {"readOnlyHint": true, "idempotentHint": true}}),
            json!({"name": "no-schema"}),
            json!({"name": "bad", "inputSchema": {"type": 5}}),
            json!({"inputSchema": {}}),
        ];
        let c = catalog_tools(&tools, |_| 5_000);
        assert_eq!(c.keys().collect::<Vec<_>>(), ["echo"]);
        let echo = &c["echo"];
        assert!(echo.idempotent && !echo.side_effects);
        assert_eq!(
            (echo.timeout_ms_default, echo.timeout_ms_max),
            (5_000, 5_000)
        );
    }
}
