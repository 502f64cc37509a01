//! What the MCP front answers about tools: a tool's definition in `tools/list`, and a call's
//! outcome or refusal as a `CallToolResult`, for each protocol revision.

use serde_json::{json, Value};

use carapace_filters::call::{CallOutcome, ToolSpec};
use carapace_filters::Rejection;

use super::jsonrpc::{self, ERROR_META};
use super::{LEGACY_VERSIONS, MODERN_VERSION};

/// A tool as `tools/list` shows it.
pub fn tool_definition(t: &ToolSpec, version: &str) -> Value {
    let mut input = match t.input.source().as_ref() {
        Value::Object(m) => Value::Object(m.clone()),
        _ => json!({}),
    };
    if input.get("type").is_none() {
        input["type"] = Value::from("object");
    }
    let mut d = json!({
        "name": t.name,
        "description": t.description,
        "inputSchema": input,
        "annotations": {"readOnlyHint": !t.side_effects, "idempotentHint": t.idempotent},
    });
    if let Some(def) = &t.definition {
        for key in ["title", "icons", "annotations", "execution", "_meta"] {
            if let Some(v) = def.get(key) {
                d[key] = v.clone();
            }
        }
    }
    if let Some(out) = &t.output {
        let schema = out.source();
        // 2025-03-26 has no output schemas. 2025-06-18 and 2025-11-25 type one as an object
        // schema (`"type": "object"`), and clients built on those types refuse the whole
        // `tools/list` over one that is not (a tool without an output schema has `{}`).
        let shown = if version == MODERN_VERSION {
            schema.is_object()
        } else {
            version != LEGACY_VERSIONS[2] && schema.get("type") == Some(&Value::from("object"))
        };
        if shown {
            d["outputSchema"] = schema.as_ref().clone();
        }
    }
    d
}

/// A tool's answer as a `CallToolResult`. An MCP server's own content is passed on as it is.
pub fn tool_result(outcome: &CallOutcome, version: &str, structured: bool) -> Value {
    match outcome {
        CallOutcome::Ok {
            output, content, ..
        } => {
            let (mut r, has_structured) = match content {
                Some(c) => (json!({"content": c.blocks, "isError": false}), c.structured),
                None => {
                    let text = serde_json::to_string(output).expect("JSON values serialize");
                    (
                        json!({"content": [{"type": "text", "text": text}], "isError": false}),
                        true,
                    )
                }
            };
            // Before 2026-07-28 structured content is an object.
            if structured && has_structured && (version == MODERN_VERSION || output.is_object()) {
                r["structuredContent"] = output.clone();
            }
            if let Some(meta) = content.as_ref().and_then(|c| c.meta.clone()) {
                r["_meta"] = meta;
            }
            r
        }
        CallOutcome::AppError {
            content: Some(c), ..
        } if version == MODERN_VERSION && c.input_required.is_some() => {
            // The server's questions, for the caller to answer and retry the call with.
            let mut r = c.input_required.clone().expect("checked");
            r["resultType"] = Value::from("input_required");
            if let Some(meta) = &c.meta {
                r["_meta"] = meta.clone();
            }
            r
        }
        CallOutcome::AppError {
            code,
            message,
            details,
            retryable,
            content,
        } => {
            let mut error = json!({"code": code, "retryable": retryable});
            if let Some(d) = details {
                error["details"] = d.clone();
            }
            let blocks = match content {
                Some(c) => c.blocks.clone(),
                None => json!([{"type": "text", "text": format!("{code}: {message}")}]),
            };
            json!({
                "content": blocks,
                "isError": true,
                "_meta": {ERROR_META: error},
            })
        }
    }
}

/// A refusal of the call stage as a `CallToolResult` with `isError`, so a model can see it.
pub fn refusal_result(r: &Rejection) -> Value {
    let error = jsonrpc::carapace_error(r);
    let text = format!(
        "{}: {}",
        error["code"].as_str().unwrap_or(""),
        crate::errors::message(r)
    );
    json!({
        "content": [{"type": "text", "text": text}],
        "isError": true,
        "_meta": {ERROR_META: error},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use carapace_filters::schema::CompiledSchema;

    fn tool(output: Option<Value>) -> ToolSpec {
        ToolSpec {
            name: "t".into(),
            app_name: None,
            definition: None,
            description: "d".into(),
            input: CompiledSchema::compile(json!({"type": "object"})).unwrap(),
            output: output.map(|o| CompiledSchema::compile(o).unwrap()),
            timeout_ms_default: 1000,
            timeout_ms_max: 1000,
            idempotent: true,
            side_effects: false,
        }
    }

    #[test]
    fn handshake_revisions_show_only_object_output_schemas() {
        let object = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        for schema in [
            json!({}),
            json!({"type": "string"}),
            json!({"properties": {}}),
        ] {
            let t = tool(Some(schema.clone()));
            for v in LEGACY_VERSIONS {
                assert!(
                    tool_definition(&t, v).get("outputSchema").is_none(),
                    "{v} {schema}"
                );
            }
            assert_eq!(tool_definition(&t, MODERN_VERSION)["outputSchema"], schema);
        }
        let t = tool(Some(object.clone()));
        assert_eq!(tool_definition(&t, "2025-11-25")["outputSchema"], object);
        assert_eq!(tool_definition(&t, "2025-06-18")["outputSchema"], object);
        assert!(tool_definition(&t, "2025-03-26")
            .get("outputSchema")
            .is_none());
        assert_eq!(tool_definition(&t, MODERN_VERSION)["outputSchema"], object);
        assert!(tool_definition(&tool(None), "2025-11-25")
            .get("outputSchema")
            .is_none());
    }
}
