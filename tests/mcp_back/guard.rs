//! The secret guard on what an MCP server sends back (`secret_guard.inbound: enforce`): a
//! passed-through resource, what the server says during a call, and the server's own error.

use serde_json::json;

use super::common::mcp::{modern, modern_body, python_http_server, start, yaml};
use super::common::{self, Env};

/// A resource passed through from the server is guarded as a tool result is: a private key in
/// it is redacted before the caller sees it (`secret_guard.inbound: enforce`).
#[tokio::test]
async fn a_private_key_in_a_passed_through_resource_is_redacted() {
    let env = Env::new().await;
    let (_server, sock) = python_http_server(&env);
    let app = format!("address: \"unix:{}\"", sock.display());
    let config = yaml(&env, "mcp", &app) + "\nsecret_guard: { inbound: enforce }\n";
    let r = start(&env, &config).await;
    let read = modern_body(1, "resources/read", json!({"uri": "notes://public/deploy"}));
    let answer = modern(&env.local(&r), &read).await;
    let text = answer.json()["result"]["contents"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{:?}", answer.json()))
        .to_owned();
    assert_eq!(text, "deploy with [REDACTED:private_key]");
    r.shutdown().await;
}

#[tokio::test]
async fn what_the_server_says_during_a_call_is_guarded_as_its_result() {
    let env = Env::new().await;
    let (_server, sock) = python_http_server(&env);
    let app = format!("address: \"unix:{}\"", sock.display());
    let config = yaml(&env, "mcp", &app) + "\nsecret_guard: { inbound: enforce }\n";
    let r = start(&env, &config).await;
    let mut body = modern_body(1, "tools/call", json!({"name": "leak", "arguments": {}}));
    body["params"]["_meta"]["progressToken"] = json!("p-1");
    body["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = json!("debug");
    let answer = env
        .local(&r)
        .post_json(
            "/mcp",
            &[
                ("mcp-protocol-version", common::mcp::MODERN),
                ("mcp-method", "tools/call"),
                ("mcp-name", "leak"),
                ("accept", "application/json, text/event-stream"),
            ],
            &body,
        )
        .await
        .unwrap();
    let stream = String::from_utf8_lossy(&answer.body).into_owned();
    assert!(stream.contains("notifications/message"), "{stream}");
    assert!(stream.contains("notifications/progress"), "{stream}");
    assert!(stream.contains("uploaded"), "{stream}");
    assert!(!stream.contains("AKIAIOSFODNN7EXAMPLE"), "{stream}");
    assert!(
        !stream.contains("ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"),
        "{stream}"
    );
    assert!(stream.contains("[REDACTED:aws_access_key_id]"), "{stream}");
    assert!(stream.contains("[REDACTED:github_token]"), "{stream}");
    r.shutdown().await;
}

/// The server's own JSON-RPC error to a passed-through request is checked as its result
/// would be: a private key in its message is redacted before the caller sees it.
#[tokio::test]
async fn a_private_key_in_the_servers_error_to_a_passed_through_read_is_redacted() {
    let env = Env::new().await;
    let (_server, sock) = python_http_server(&env);
    let app = format!("address: \"unix:{}\"", sock.display());
    let config = yaml(&env, "mcp", &app) + "\nsecret_guard: { inbound: enforce }\n";
    let r = start(&env, &config).await;
    let read = modern_body(
        1,
        "resources/read",
        json!({"uri": "notes://public/broken/unreadable"}),
    );
    let answer = modern(&env.local(&r), &read).await;
    let error = answer.json()["error"].to_string();
    assert!(error.contains("unreadable"), "the server's error: {error}");
    assert!(
        !error.contains("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
        "{error}"
    );
    assert!(error.contains("[REDACTED:private_key]"), "{error}");
    r.shutdown().await;
}
