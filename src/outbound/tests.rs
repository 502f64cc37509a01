use std::sync::Arc;

use carapace_filters::call::{CallOutcome, Credential, Principal, ToolCall, ToolSpec};
use carapace_filters::schema::CompiledSchema;
use carapace_filters::Rejection;
use serde_json::{json, Value};

use super::back::decode_peer_answer;

fn call(call_id: &str, tool: &str) -> ToolCall {
    ToolCall {
        call_id: call_id.into(),
        tool: Arc::new(ToolSpec {
            name: tool.into(),
            app_name: None,
            definition: None,
            description: String::new(),
            input: CompiledSchema::compile(json!({"type": "object"})).unwrap(),
            output: None,
            timeout_ms_default: 1_000,
            timeout_ms_max: 5_000,
            idempotent: false,
            side_effects: false,
        }),
        tenant_id: None,
        args: json!({}),
        context: None,
        timeout_ms: None,
        idempotency_key: None,
        principal: Arc::new(Principal::local()),
        request_id: None,
        trace_context: Vec::new(),
        extensions: Default::default(),
        credential: Credential::None,
    }
}

/// The reference tool host's answers (`toolhost_http.json`): every envelope is decoded
/// for what it says, plain-text refusals are the host's transport errors.
#[test]
fn crabstack_tool_host_answers_are_passed_through() {
    let path = format!(
        "{}/../shared/vectors/crabstack/toolhost_http.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let cases: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut seen = 0;
    for case in cases["cases"].as_array().unwrap() {
        if case["path"] != "/v1/tools/call" {
            continue;
        }
        seen += 1;
        let id = case["id"].as_str().unwrap();
        let request: Value = serde_json::from_str(case["request_body"].as_str().unwrap_or(""))
            .unwrap_or(Value::Null);
        let s = |k: &str| request.get(k).and_then(Value::as_str).unwrap_or("x");
        let c = call(s("call_id"), s("tool_name").trim());
        let status = http::StatusCode::from_u16(case["status"].as_u64().unwrap() as u16);
        let body = case["response_body"].as_str().unwrap().as_bytes();
        let got = decode_peer_answer(status.unwrap(), body, &c);
        let envelope: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        match (case["status"].as_u64(), envelope["status"].as_str()) {
            (Some(200), Some("ok")) if id == "call.args_not_object" => {
                // A result that is not an object breaks the tools-v1 response schema.
                assert!(
                    matches!(got, Err(Rejection::AppInvalid(_))),
                    "{id}: {got:?}"
                )
            }
            (Some(200), Some("ok")) if id == "call.version_passthrough" => {
                assert!(
                    matches!(got, Err(Rejection::AppInvalid(_))),
                    "{id}: {got:?}"
                )
            }
            (Some(200), Some("ok")) => {
                assert!(matches!(got, Ok(CallOutcome::Ok { .. })), "{id}: {got:?}")
            }
            (Some(200), Some("error")) => match got {
                Ok(CallOutcome::AppError {
                    code,
                    message,
                    retryable,
                    ..
                }) => {
                    assert_eq!(code, envelope["error"]["code"], "{id}");
                    assert_eq!(message, envelope["error"]["message"], "{id}");
                    assert!(!retryable, "{id}");
                }
                other => panic!("{id}: {other:?}"),
            },
            (Some(200), Some("timeout")) => {
                assert!(matches!(got, Err(Rejection::Timeout(_))), "{id}: {got:?}")
            }
            (Some(code), None) => {
                assert!(
                    matches!(got, Err(Rejection::AppHttp(c)) if u64::from(c) == code),
                    "{id}: {got:?}"
                )
            }
            other => panic!("{id}: unexpected case {other:?}"),
        }
    }
    assert_eq!(seen, 22);
}

/// carapace's style: an HTTP error status with the envelope.
#[test]
fn a_refusal_with_an_http_error_status_keeps_its_code_details_and_retryability() {
    let c = call("c1", "memory.query");
    let envelope = |status: &str, code: &str, call_id: &str| {
        json!({"version": "v1", "call_id": call_id, "tool_name": "", "status": status,
               "error": {"code": code, "message": "peer gw_home is revoked",
                         "details": {"reason": "revoked"}, "retryable": false},
               "duration_ms": 0})
        .to_string()
    };
    let got = decode_peer_answer(
        http::StatusCode::FORBIDDEN,
        envelope("error", "FORBIDDEN", "").as_bytes(),
        &c,
    );
    let Ok(CallOutcome::AppError {
        code,
        message,
        details,
        retryable,
        ..
    }) = got
    else {
        panic!("{got:?}")
    };
    assert_eq!(
        (code.as_str(), message.as_str(), retryable),
        ("FORBIDDEN", "peer gw_home is revoked", false)
    );
    assert_eq!(details, Some(json!({"reason": "revoked"})));
    // Retryable only as `status: retryable_error` says, whatever the HTTP status.
    for http_status in [http::StatusCode::OK, http::StatusCode::BAD_GATEWAY] {
        let got = decode_peer_answer(
            http_status,
            envelope("retryable_error", "DEPENDENCY_UNAVAILABLE", "c1").as_bytes(),
            &c,
        );
        assert!(
            matches!(
                got,
                Ok(CallOutcome::AppError {
                    retryable: true,
                    ..
                })
            ),
            "{got:?}"
        );
    }
    // Another call's answer, a code that is no code, no envelope at all.
    let got = decode_peer_answer(
        http::StatusCode::FORBIDDEN,
        envelope("error", "FORBIDDEN", "c2").as_bytes(),
        &c,
    );
    assert!(matches!(got, Err(Rejection::AppInvalid(_))), "{got:?}");
    let got = decode_peer_answer(
        http::StatusCode::FORBIDDEN,
        envelope("error", "forbidden\n", "").as_bytes(),
        &c,
    );
    assert!(
        matches!(&got, Ok(CallOutcome::AppError { code, .. }) if code == "INTERNAL"),
        "{got:?}"
    );
    let got = decode_peer_answer(http::StatusCode::BAD_GATEWAY, b"bad gateway", &c);
    assert!(matches!(got, Err(Rejection::AppHttp(502))), "{got:?}");
}

#[test]
fn a_name_several_sources_offer_is_served_once_per_source_qualified() {
    use super::discovery::merge;
    use super::routes::Route;
    use std::collections::HashMap;
    let tools = |names: &[&str]| names_as_tools(names);
    let mut merged = crate::catalog::Catalog::default();
    let mut routes = HashMap::new();
    merge(
        vec![
            (
                Route::Peer("east".into()),
                tools(&["memory.append", "east.only"]),
            ),
            (Route::Peer("west".into()), tools(&["memory.append"])),
            (Route::Skill("demo.echo".into()), tools(&["demo.echo"])),
        ],
        &mut merged,
        &mut routes,
    );
    let names: Vec<&str> = merged.tools.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "demo.echo",
            "east.memory.append",
            "east.only",
            "west.memory.append"
        ]
    );
    let west = &merged.tools["west.memory.append"];
    assert_eq!(west.app_name(), "memory.append");
    assert_eq!(routes["west.memory.append"], Route::Peer("west".into()));
    assert_eq!(routes["demo.echo"], Route::Skill("demo.echo".into()));
    assert_eq!(merged.tools["east.only"].app_name(), "east.only");
}

/// A source cannot take another's qualified name: peer `aaa` offering `west.memory.append`
/// while `east` and `west` both offer `memory.append` gets its tool served as
/// `aaa.west.memory.append`, and `west.memory.append` still reaches `west`.
#[test]
fn a_tool_named_as_another_sources_qualified_tool_does_not_take_its_calls() {
    use super::discovery::merge;
    use super::routes::Route;
    use std::collections::HashMap;
    let tools = |names: &[&str]| names_as_tools(names);
    for order in [["aaa", "east", "west"], ["east", "west", "aaa"]] {
        let offers = |id: &str| match id {
            "aaa" => tools(&["west.memory.append"]),
            _ => tools(&["memory.append"]),
        };
        let sources = order
            .iter()
            .map(|id| (Route::Peer(id.to_string()), offers(id)))
            .collect();
        let mut merged = crate::catalog::Catalog::default();
        let mut routes = HashMap::new();
        merge(sources, &mut merged, &mut routes);
        assert_eq!(routes["west.memory.append"], Route::Peer("west".into()));
        assert_eq!(
            merged.tools["west.memory.append"].app_name(),
            "memory.append"
        );
        assert_eq!(routes["aaa.west.memory.append"], Route::Peer("aaa".into()));
        assert_eq!(
            merged.tools["aaa.west.memory.append"].app_name(),
            "west.memory.append"
        );
        assert_eq!(merged.tools.len(), 3, "{:?}", merged.tools.keys());
    }
}

/// Tools of these names, with permissive schemas.
fn names_as_tools(names: &[&str]) -> std::collections::BTreeMap<String, Arc<ToolSpec>> {
    names
        .iter()
        .map(|n| {
            let spec = ToolSpec {
                name: n.to_string(),
                app_name: None,
                definition: None,
                description: String::new(),
                input: CompiledSchema::compile(json!({})).unwrap(),
                output: None,
                timeout_ms_default: 1000,
                timeout_ms_max: 1000,
                idempotent: false,
                side_effects: true,
            };
            (n.to_string(), Arc::new(spec))
        })
        .collect()
}
