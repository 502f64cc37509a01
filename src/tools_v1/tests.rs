use std::sync::Arc;

use carapace_filters::call::{Credential, Principal, ToolCall, ToolSpec};
use carapace_filters::schema::CompiledSchema;
use serde_json::{json, Value};

use super::back::encode_request;
use super::front::decode_request;

fn call(context: Option<Value>, idempotency_key: Option<&str>) -> ToolCall {
    ToolCall {
        call_id: "c1".into(),
        tool: Arc::new(ToolSpec {
            name: "memory.query".into(),
            app_name: None,
            definition: None,
            description: String::new(),
            input: CompiledSchema::compile(json!({"type": "object"})).unwrap(),
            output: None,
            timeout_ms_default: 5_000,
            timeout_ms_max: 10_000,
            idempotent: false,
            side_effects: false,
        }),
        tenant_id: None,
        args: json!({"query": "cat", "limit": 3, "nested": {"b": [1, 2], "a": "\"x\""}}),
        context,
        timeout_ms: Some(2_000),
        idempotency_key: idempotency_key.map(str::to_owned),
        principal: Arc::new(Principal::local()),
        request_id: None,
        trace_context: Vec::new(),
        extensions: Default::default(),
        credential: Credential::None,
    }
}

/// The borrowed request writes exactly the bytes the JSON value it replaced wrote.
#[test]
fn app_request_bytes_match_the_json_value_form() {
    for c in [
        call(None, None),
        call(Some(json!({"agent_id": "gw", "trace": "t"})), Some("k1")),
    ] {
        let mut value = json!({
            "version": "v1",
            "call_id": c.call_id,
            "tool_name": c.tool.name,
            "tenant_id": "default",
            "args": c.args,
            "timeout_ms": 2_000,
            "context": c.context.clone().unwrap_or_else(|| json!({
                "agent_id": c.principal.id,
                "session_id": c.call_id,
            })),
        });
        if let Some(k) = &c.idempotency_key {
            value["idempotency_key"] = json!(k);
        }
        assert_eq!(
            String::from_utf8(serde_json::to_vec(&encode_request(&c)).unwrap()).unwrap(),
            serde_json::to_string(&value).unwrap()
        );
    }
}

/// The body alone decodes into the call's fields; what is not tools-v1 is refused.
#[test]
fn decode_request_reads_the_fields_without_a_catalog() {
    let req = decode_request(
        br#"{"version":"v1","call_id":" c1 ","tool_name":"echo ","tenant_id":"t","args":{"x":1},"context":{"agent_id":"a","session_id":"s"},"timeout_ms":5}"#,
    )
    .unwrap();
    assert_eq!(
        (req.call_id.as_str(), req.tool_name.as_str()),
        ("c1", "echo")
    );
    assert_eq!(req.tenant_id.as_deref(), Some("t"));
    assert_eq!(
        (req.args, req.context, req.timeout_ms),
        (
            json!({"x": 1}),
            Some(json!({"agent_id": "a", "session_id": "s"})),
            Some(5)
        )
    );

    let refused = decode_request(br#"{"version":"v1","call_id":"c1","x":1}"#).unwrap_err();
    assert!(refused.malformed);
    let refused =
        decode_request(br#"{"version":"v2","call_id":"c1","tool_name":"echo","tenant_id":"t"}"#)
            .unwrap_err();
    assert!(!refused.malformed);
    assert_eq!(
        (refused.call_id.as_str(), refused.tool_name.as_str()),
        ("c1", "echo")
    );
}
