use std::sync::Arc;

use carapace_filters::call::{CallContext, Credential, Principal, ToolCall, ToolSpec};
use carapace_filters::schema::CompiledSchema;
use serde_json::{json, Value};

use super::back::request_body;
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
        context: context.as_ref().map(CallContext::from_value),
        timeout_ms: Some(2_000),
        idempotency_key: idempotency_key.map(str::to_owned),
        principal: Arc::new(Principal::local()),
        request_id: None,
        trace_context: Vec::new(),
        extensions: Default::default(),
        credential: Credential::None,
    }
}

/// The request body is exactly the bytes of the JSON value it replaced, escapes included.
#[test]
fn app_request_bytes_match_the_json_value_form() {
    let mut escaped = call(None, Some("k\"2\u{1}"));
    escaped.call_id = "c\"1\\\n\u{7f}ü".into();
    escaped.tenant_id = Some("tenant\t1".into());
    escaped.principal = Arc::new(Principal {
        id: "peer \"x\"".into(),
        ..Principal::local()
    });
    for c in [
        call(None, None),
        call(Some(json!({"agent_id": "gw", "trace": "t"})), Some("k1")),
        escaped,
    ] {
        let mut value = json!({
            "version": "v1",
            "call_id": &*c.call_id,
            "tool_name": c.tool.name,
            "tenant_id": c.tenant_id.as_deref().unwrap_or("default"),
            "args": c.args,
            "timeout_ms": 2_000,
            "context": c.context.as_ref().map_or_else(
                || json!({"agent_id": &*c.principal.id, "session_id": &*c.call_id}),
                CallContext::to_value,
            ),
        });
        if let Some(k) = &c.idempotency_key {
            value["idempotency_key"] = json!(k);
        }
        assert_eq!(
            String::from_utf8(request_body(&c)).unwrap(),
            serde_json::to_string(&value).unwrap()
        );
    }
}

/// A successful answer is exactly the bytes of the JSON value it replaced, escapes included.
#[tokio::test]
async fn answer_bytes_match_the_json_value_form() {
    use http_body_util::BodyExt;
    let output = json!({"q": "a\"b\n", "n": [1, 2.5, null], "ü": {"t": true}});
    let outcome = carapace_filters::call::CallOutcome::Ok {
        output: output.clone(),
        meta: None,
        content: None,
    };
    for (call_id, tool) in [("c1", "memory.query"), ("c\"1\\\u{1}", "tool ü\t")] {
        let resp = super::front::outcome_response(&outcome, call_id, tool, 7);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let value = json!({
            "version": "v1", "call_id": call_id, "tool_name": tool,
            "status": "ok", "result": output, "duration_ms": 7,
        });
        assert_eq!(
            String::from_utf8(body.to_vec()).unwrap(),
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
    assert_eq!((&*req.call_id, &*req.tool_name), ("c1", "echo"));
    assert_eq!(req.tenant_id.as_deref(), Some("t"));
    assert_eq!(
        (req.args, req.context, req.timeout_ms),
        (
            json!({"x": 1}),
            Some(CallContext::from_value(
                &json!({"agent_id": "a", "session_id": "s"})
            )),
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

/// A valid call request, with `extra` members (raw JSON text) added at the end.
fn request(extra: &str) -> String {
    format!(
        r#"{{"version":"v1","call_id":"c1","tool_name":"memory.query","tenant_id":"t","args":{{"q":"cat","n":[1,2.5,{{"x":null}}]}},"context":{{"agent_id":"a","session_id":"s","trace_id":"tr"}}{extra}}}"#
    )
}

/// Bodies on both sides of every rule of the request schema and the front's own checks.
fn request_cases() -> Vec<String> {
    let mut cases: Vec<String> = [
        "",
        r#","timeout_ms":1"#,
        r#","timeout_ms":120000"#,
        r#","timeout_ms":120001"#,
        r#","timeout_ms":0"#,
        r#","timeout_ms":5.0"#,
        r#","timeout_ms":-3"#,
        r#","timeout_ms":"5""#,
        r#","idempotency_key":"k""#,
        r#","idempotency_key":7"#,
        r#","idempotency_key":"k","idempotency_key":"j""#,
        r#","extra":1"#,
        r#","version":"v1""#,
        r#","\u0061rgs":{}"#,
        r#","tenant_id":"  ""#,
        r#","call_id":" c2 ""#,
    ]
    .iter()
    .map(|extra| request(extra))
    .collect();
    let valid = request("");
    for (from, to) in [
        (r#""version":"v1""#, r#""version":" v1""#),
        (r#""version":"v1""#, r#""version":"v2""#),
        (r#""call_id":"c1""#, r#""call_id":"   ""#),
        (r#""call_id":"c1""#, r#""call_id":" c\u00e9 ""#),
        (r#""tool_name":"memory.query""#, r#""tool_name":1"#),
        (r#""tenant_id":"t""#, r#""tenant_id":null"#),
        (r#""args":{"#, r#""args":[{"#),
        (r#""n":[1,2.5,{"x":null}]"#, r#""n":1,"n":2"#),
        (r#","trace_id":"tr""#, r#","trace_id":1"#),
        (r#","trace_id":"tr""#, r#","request_origin":"cron""#),
        (r#","trace_id":"tr""#, r#","request_origin":"elsewhere""#),
        (r#","trace_id":"tr""#, r#","other":"x""#),
        (r#","trace_id":"tr""#, r#","agent_id":"b""#),
        (r#""agent_id":"a","#, ""),
    ] {
        assert!(valid.contains(from), "{from}");
        cases.push(valid.replacen(from, to, 1));
    }
    cases.push(valid.replace(
        r#","context":{"agent_id":"a","session_id":"s","trace_id":"tr"}"#,
        "",
    ));
    cases.push(format!("{valid} "));
    cases.push(format!("{valid}x"));
    cases.push(format!("[{valid}]"));
    cases.push("{}".into());
    cases.push("null".into());
    // Nesting at the strict parse's limit and one past it.
    for depth in [126, 127, 128] {
        let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        cases.push(valid.replacen(r#""q":"cat""#, &format!(r#""q":{deep}"#), 1));
    }
    cases
}

/// The one-pass reader takes the body a caller normally sends and reads what the general
/// decoding reads; on every body it accepts or refuses, `decode_request` gives what the
/// general decoding gives (refusals included, with their ids).
#[test]
fn request_reader_agrees_with_the_general_decoding() {
    assert!(super::wire::read_call(request("").as_bytes()).is_some());
    assert!(super::wire::read_call(request(r#","timeout_ms":5"#).as_bytes()).is_some());
    let mut accepted = 0;
    for body in request_cases() {
        let (fast, general) = (
            decode_request(body.as_bytes()),
            super::front::decode_request_general(body.as_bytes()),
        );
        accepted += usize::from(general.is_ok());
        assert_eq!(format!("{fast:?}"), format!("{general:?}"), "{body}");
    }
    assert!(accepted >= 8, "the cases cover accepted bodies too");
}

/// Answers on both sides of every rule of the response schema.
fn answer_cases() -> Vec<String> {
    let ok = r#"{"version":"v1","call_id":"c1","tool_name":"memory.query","status":"ok","result":{"hits":[1,{"a":"\"x\""}]},"duration_ms":3}"#;
    let err = r#"{"version":"v1","call_id":"c1","tool_name":"memory.query","status":"error","error":{"code":"E","message":"m","details":{"d":1},"retryable":true},"duration_ms":3,"logs":["l"]}"#;
    let mut cases = vec![ok.to_string(), err.to_string()];
    for (doc, from, to) in [
        (ok, r#""status":"ok""#, r#""status":"retryable_error""#),
        (ok, r#""status":"ok""#, r#""status":"timeout""#),
        (ok, r#""status":"ok""#, r#""status":"done""#),
        (ok, r#""status":"ok","#, ""),
        (ok, r#""result":{"hits":[1,{"a":"\"x\""}]},"#, ""),
        (ok, r#""result":{"#, r#""result":[{"#),
        (ok, r#""duration_ms":3"#, r#""duration_ms":3.0"#),
        (ok, r#""duration_ms":3"#, r#""duration_ms":-1"#),
        (
            ok,
            r#""duration_ms":3"#,
            r#""duration_ms":3,"duration_ms":4"#,
        ),
        (ok, r#""duration_ms":3"#, r#""duration_ms":3,"extra":1"#),
        (ok, r#""call_id":"c1""#, r#""call_id":"c2""#),
        (ok, r#""call_id":"c1""#, r#""call_\u0069d":"c\u0031""#),
        (
            ok,
            r#""tool_name":"memory.query""#,
            r#""tool_name":"other""#,
        ),
        (ok, r#""version":"v1""#, r#""version":"v2""#),
        (ok, r#""status":"ok""#, r#""status":"error","status":"ok""#),
        (err, r#""code":"E","#, ""),
        (err, r#""code":"E""#, r#""code":1"#),
        (err, r#""details":{"d":1}"#, r#""details":[1]"#),
        (err, r#""retryable":true"#, r#""retryable":"yes""#),
        (err, r#""retryable":true"#, r#""other":true"#),
        (err, r#""logs":["l"]"#, r#""logs":["l",2]"#),
        (err, r#""error":{"#, r#""error":null,"e":{"#),
    ] {
        assert!(doc.contains(from), "{from}");
        cases.push(doc.replacen(from, to, 1));
    }
    cases.push(format!("{ok}x"));
    cases.push("[]".into());
    cases.push("not json".into());
    cases
}

/// As for requests: the reader takes an app's usual answers, and `decode_response` gives what
/// the general decoding gives on every answer, at every status.
#[test]
fn answer_reader_agrees_with_the_general_decoding() {
    let c = call(None, None);
    let mut accepted = 0;
    for (i, body) in answer_cases().iter().enumerate() {
        if i < 2 {
            assert!(
                super::wire::read_answer(body.as_bytes()).is_some(),
                "{body}"
            );
        }
        for status in [200, 201, 404, 500] {
            let status = http::StatusCode::from_u16(status).unwrap();
            let (fast, general) = (
                super::decode_response(status, body.as_bytes(), &c),
                super::decode_response_general(status, body.as_bytes(), &c),
            );
            accepted += usize::from(general.is_ok());
            assert_eq!(
                format!("{fast:?}"),
                format!("{general:?}"),
                "{status} {body}"
            );
        }
    }
    assert!(accepted >= 10, "the cases cover accepted answers too");
}
