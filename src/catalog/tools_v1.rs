//! A tools-v1 app's `GET /v1/tools` as a catalog.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use carapace_filters::call::ToolSpec;

use super::{clamp_max, compile, Catalog, DiscoveryError, PROTOCOL_TIMEOUT_MAX_MS};
use crate::config::Loaded;

/// Compile a tools-v1 `GET /v1/tools` answer.
pub fn tools_v1_catalog(doc: &Value, cfg: &Loaded) -> Result<Catalog, DiscoveryError> {
    let invalid = |m: String| DiscoveryError::ManifestInvalid(m);
    if doc.get("version").and_then(Value::as_str) != Some("v1") {
        return Err(DiscoveryError::ProtocolVersion {
            got: doc
                .get("version")
                .map(|v| v.to_string())
                .unwrap_or_default(),
            expected: "v1".into(),
        });
    }
    let service = doc
        .get("service")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let list = doc
        .get("tools")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("GET /v1/tools: `tools` is not an array".into()))?;
    let mut tools = BTreeMap::new();
    for (i, t) in list.iter().enumerate() {
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
        let spec = tool_spec(name, t, cfg);
        match spec {
            Ok(s) => {
                if tools.insert(name.to_string(), Arc::new(s)).is_some() {
                    tracing::warn!("tool_duplicate name={name}: the last definition is served");
                }
            }
            Err(reason) => tracing::warn!("tool_skipped name={name} reason={reason}"),
        }
    }
    Ok(Catalog {
        tools,
        service,
        version: None,
        withheld: Default::default(),
        digest: [0; 32],
    })
}

/// One tool of the answer, compiled; why not when it cannot be served.
fn tool_spec(name: &str, t: &Value, cfg: &Loaded) -> Result<ToolSpec, String> {
    // Strict contracts: a tool without both schemas is not served. `null` is how the
    // reference tool host writes a schema it was not given (its fields have no
    // omitempty): the app takes any value there, and so does carapace.
    let (Some(input), Some(output)) = (t.get("input_schema"), t.get("output_schema")) else {
        return Err("missing_schema".into());
    };
    let any = Value::Object(serde_json::Map::new());
    let or_any = |s: &'_ Value, what: &str| {
        if s.is_null() {
            tracing::warn!("tool_schema_absent name={name} stage={what}: any value is accepted");
            any.clone()
        } else {
            s.clone()
        }
    };
    let input = compile(name, "input", &or_any(input, "input"))?;
    let output = Some(compile(name, "output", &or_any(output, "output"))?);
    // 0 is the reference tool host's "not set" (zero values are written out).
    let u = |k: &str, d: u64| {
        t.get(k)
            .and_then(Value::as_u64)
            .filter(|v| *v > 0)
            .unwrap_or(d)
    };
    let max = clamp_max(name, u("timeout_ms_max", PROTOCOL_TIMEOUT_MAX_MS), cfg);
    Ok(ToolSpec {
        name: name.to_string(),
        app_name: None,
        definition: None,
        description: t
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        input,
        output,
        timeout_ms_default: u("timeout_ms_default", 30_000).clamp(1, max),
        timeout_ms_max: max,
        idempotent: t
            .get("idempotent")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        side_effects: t
            .get("side_effects")
            .and_then(Value::as_bool)
            .unwrap_or(true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name is written into log lines and served to agents: one holding a control
    /// character (a newline would forge a log line) is skipped, the others are served.
    #[test]
    fn a_tool_whose_name_holds_a_control_character_is_skipped() {
        let cfg = crate::config::parse(
            "state_dir: /tmp/x\nfront: { protocol: tools-v1 }\n\
             listeners: { unix: { path: /tmp/x.sock } }\n\
             app: { protocol: tools-v1, address: 'http://127.0.0.1:1' }\n",
            std::path::Path::new("/"),
        )
        .unwrap();
        let tool = |name: &str| {
            serde_json::json!({"name": name, "description": "d",
                               "input_schema": {"type": "object"}, "output_schema": null})
        };
        let doc = serde_json::json!({"version": "v1", "tools": [
            tool("memory.query"),
            tool("evil\ntool_definition_changed tool=x"),
            tool("bell\u{7}"),
        ]});
        let catalog = tools_v1_catalog(&doc, &cfg).unwrap();
        assert_eq!(catalog.tools.keys().collect::<Vec<_>>(), ["memory.query"]);
    }
}
