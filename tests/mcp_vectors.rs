//! The 15 JSON-RPC cases of the EAT test vectors
//! (`../shared/vectors/eat/upstream/examples/test-vectors/mcp_test_vectors.json`) through the
//! MCP front, in a 2025-03-26 session (the one revision with batches), in front of a tools-v1
//! app serving the vectors' `test_tool`. Where a case contradicts JSON-RPC 2.0 or the MCP
//! specification, carapace follows those, and `DEVIATIONS` (and the README) say so.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use common::Env;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// Cases answered otherwise than the vector expects, and why.
const DEVIATIONS: [(&str, &str); 5] = [
    (
        "Valid tools/call Request",
        "MCP's CallToolResult (`content`, `structuredContent`), not EAT's `{output}`",
    ),
    (
        "Missing Request ID",
        "JSON-RPC 2.0: a message without `id` is a notification: accepted (202), no answer",
    ),
    (
        "tools/call Unknown Tool",
        "-32602, as the MCP tools page says; MCP reserves -32000..-32019 (no new use)",
    ),
    (
        "tools/call Invalid Arguments",
        "a tool result with isError (INVALID_ARGS), as MCP asks for input validation errors",
    ),
    (
        "tools/call Missing Required Arguments",
        "a tool result with isError (INVALID_ARGS), as MCP asks for input validation errors",
    ),
];

/// The request id every message of the test is sent with.
const REQUEST_ID: &str = "vectors-1";

/// The app, and how many calls reached it with the test's request id.
async fn test_tool_app() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    common::serve_http1(l, move |req: Request<hyper::body::Incoming>| {
        let counted = counted.clone();
        async move {
            let answer = match (req.method().clone(), req.uri().path()) {
                (Method::GET, "/v1/tools") => json!({"version": "v1", "service": "eat", "tools": [
                {"name": "test_tool", "description": "A test tool",
                 "input_schema": {"type": "object", "properties": {"param": {"type": "string"}},
                                  "required": ["param"]},
                 "output_schema": null, "timeout_ms_default": 1000, "timeout_ms_max": 5000,
                 "idempotent": true, "side_effects": false}]}),
                _ => {
                    // Every call carries the request id of the caller's request (a batch's
                    // items too); one without it is not counted.
                    if req
                        .headers()
                        .get("x-request-id")
                        .is_some_and(|v| v == REQUEST_ID)
                    {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let call: Value = serde_json::from_slice(&body).unwrap();
                    json!({"version": "v1", "call_id": call["call_id"], "tool_name": call["tool_name"],
                       "status": "ok", "result": {"result": "success"}, "duration_ms": 0})
                }
            };
            let mut resp = Response::new(Full::new(Bytes::from(answer.to_string())));
            resp.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            resp
        }
    });
    (addr, calls)
}

#[tokio::test]
async fn the_eat_mcp_vectors_pass_through_the_mcp_front() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/vectors/eat/upstream/examples/test-vectors/mcp_test_vectors.json");
    let cases: Vec<Value> = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(cases.len(), 15);
    for (name, _) in DEVIATIONS {
        assert!(
            cases.iter().any(|c| c["test_name"] == name),
            "no case {name}"
        );
    }
    let env = Env::new().await;
    let (app, calls) = test_tool_app().await;
    let yaml = env
        .tools_yaml("")
        .replace(&env.app_addr.to_string(), &app.to_string())
        .replace("front: { protocol: tools-v1 }", "front: { protocol: mcp }");
    let r = env.start(&yaml).await;
    let client = env.local(&r);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-03-26", "capabilities": {}}});
    let i = client.post_json("/mcp", &[], &init).await.unwrap();
    assert_eq!(i.json()["result"]["protocolVersion"], "2025-03-26");
    let session = i.headers["mcp-session-id"].to_str().unwrap().to_string();
    let headers = [
        ("mcp-session-id", session.as_str()),
        ("x-request-id", REQUEST_ID),
    ];

    for case in &cases {
        let name = case["test_name"].as_str().unwrap();
        let data = &case["test_data"];
        let Some(request) = data.get("request").or(data.get("response")) else {
            panic!("{name}: no message");
        };
        let reply = client
            .send(Method::POST, "/mcp", &headers, request.to_string())
            .await
            .unwrap();
        let got = reply.json();
        let expected = &data["expected_response"];
        let error_code = |v: &Value| v["error"]["code"].as_i64();
        match name {
            "Valid tools/list Request" => {
                let tool = &got["result"]["tools"][0];
                let want = &expected["result"]["tools"][0];
                assert_eq!(tool["name"], want["name"], "{name}: {got}");
                assert_eq!(tool["description"], want["description"]);
                assert_eq!(
                    tool["inputSchema"]["properties"],
                    want["inputSchema"]["properties"]
                );
            }
            "Valid tools/call Request" => {
                assert_eq!(got["result"]["isError"], false, "{name}: {got}");
                // 2025-03-26 has no structured content: the app's result is the text.
                let text = got["result"]["content"][0]["text"].as_str().unwrap();
                let result: Value = serde_json::from_str(text).unwrap();
                assert_eq!(result, json!({"result": "success"}));
                assert!(got["result"].get("structuredContent").is_none());
            }
            "Missing Request ID" | "Notification Request" | "Valid Error Response" => {
                assert_eq!(reply.status, StatusCode::ACCEPTED, "{name}: {got}");
                assert!(reply.body.is_empty());
            }
            "tools/call Invalid Arguments" | "tools/call Missing Required Arguments" => {
                assert_eq!(got["result"]["isError"], true, "{name}: {got}");
                assert_eq!(
                    got["result"]["_meta"]["dev.carapace/error"]["code"],
                    "INVALID_ARGS"
                );
            }
            "tools/call Unknown Tool" => {
                assert_eq!(error_code(&got), Some(-32602), "{name}: {got}");
                assert_eq!(got["id"], request["id"]);
            }
            "Batch Request" => {
                let answers = got.as_array().unwrap_or_else(|| panic!("{name}: {got}"));
                assert_eq!(answers.len(), 2);
                assert_eq!(answers[0]["id"], "batch-1");
                assert!(answers[0]["result"]["tools"].is_array());
                assert_eq!(answers[1]["id"], "batch-2");
                assert_eq!(answers[1]["result"]["isError"], false);
            }
            _ => {
                // Every other case is a JSON-RPC error the vector names.
                let want = error_code(expected).unwrap_or(-32600);
                assert_eq!(error_code(&got), Some(want), "{name}: {got}");
                assert_eq!(
                    got["id"],
                    expected
                        .get("id")
                        .cloned()
                        .unwrap_or_else(|| { request.get("id").cloned().unwrap_or(Value::Null) }),
                    "{name}: {got}"
                );
            }
        }
    }
    // Only the two good calls (one alone, one in the batch) reached the app, each with a
    // request id.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
