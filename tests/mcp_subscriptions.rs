//! Resource subscriptions and list changes of an MCP server behind carapace, in both eras: a
//! 2026-07-28 `subscriptions/listen`, and an older-era session's `resources/subscribe` with its
//! `GET` stream. The Python SDK's server (`tests/interop/mcp_python_server.py`, whose `touch`
//! tool announces a change) runs over Streamable HTTP and over stdio; the raw client is
//! `tests/interop/mcp_subscriptions.py`.

mod common;

use carapace::server::Running;
use common::mcp::{over_python_http, python_stdio_app, run_python, start, yaml};
use common::Env;
use serde_json::{json, Value};

const URI: &str = "notes://public/readme";

async fn subscriptions(r: &Running) -> Value {
    let args = ["--uri", URI, "--other", "notes://public/other"];
    run_python("mcp_subscriptions.py", r, &args).await
}

fn methods(stream: &Value) -> Vec<String> {
    stream["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("{stream}"))
        .iter()
        .map(|m| m["method"].as_str().unwrap().to_owned())
        .collect()
}

/// Each stream gets the list change and the update of the resource it subscribed to, and not
/// the update of the other resource `touch` announced first.
async fn both_eras(r: &Running) {
    let seen = subscriptions(r).await;
    let modern = &seen["modern"];
    assert_eq!(modern["content_type"], "text/event-stream", "{seen}");
    assert_eq!(
        modern["ack"]["params"],
        json!({"_meta": {"io.modelcontextprotocol/subscriptionId": "sub-1"},
               "notifications": {"resourceSubscriptions": [URI], "resourcesListChanged": true}}),
        "{seen}"
    );
    let expected = [
        "notifications/resources/list_changed",
        "notifications/resources/updated",
    ];
    assert_eq!(methods(modern), expected, "{seen}");
    let updated = &modern["messages"][1]["params"];
    assert_eq!(
        updated,
        &json!({"_meta": {"io.modelcontextprotocol/subscriptionId": "sub-1"}, "uri": URI}),
        "carapace's own subscription id is replaced by the caller's: {seen}"
    );

    assert_eq!(
        seen["capabilities"]["resources"]["subscribe"], true,
        "{seen}"
    );
    assert_eq!(seen["subscribe"]["result"], json!({}), "{seen}");
    assert_eq!(methods(&seen["legacy"]), expected, "{seen}");
    assert_eq!(
        seen["legacy"]["messages"][1]["params"],
        json!({"uri": URI}),
        "{seen}"
    );
    assert_eq!(seen["unsubscribe"]["result"], json!({}), "{seen}");
}

#[tokio::test]
async fn subscriptions_reach_their_callers_over_http_in_both_eras() {
    let env = Env::new().await;
    let (_server, r) = over_python_http(&env, "mcp").await;
    both_eras(&r).await;
    r.shutdown().await;
}

#[tokio::test]
async fn subscriptions_reach_their_callers_over_stdio_in_both_eras() {
    let env = Env::new().await;
    let r = start(&env, &yaml(&env, "mcp", &python_stdio_app())).await;
    both_eras(&r).await;
    r.shutdown().await;
}

/// A resource the caller may not read cannot be subscribed to.
#[tokio::test]
async fn a_caller_subscribes_only_to_what_it_may_read() {
    let env = Env::new().await;
    let peers = json!({"version": 1, "peers": [{
        "component_type": "gateway", "component_id": "gw_test", "role": "gateway",
        "mtls_cert_fingerprint": env.pki.gateway.fingerprint, "status": "active",
        "policy": {"deny": ["resource.read:notes://secret/*"]}}]});
    std::fs::write(env.path().join("peers.json"), peers.to_string()).unwrap();
    let (_server, r) = over_python_http(&env, "mcp").await;
    let gw = env.gateway(&r);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let opened = gw.post_json("/mcp", &[], &init).await.unwrap();
    let session = opened.headers["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let h = [
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let subscribe = |uri: &str| json!({"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", "params": {"uri": uri}});
    let secret = gw
        .post_json("/mcp", &h, &subscribe("notes://secret/plan"))
        .await
        .unwrap();
    let error = &secret.json()["error"];
    assert_eq!(error["data"]["code"], "FORBIDDEN", "{:?}", secret.json());
    let public = gw.post_json("/mcp", &h, &subscribe(URI)).await.unwrap();
    assert_eq!(public.json()["result"], json!({}), "{:?}", public.json());
    r.shutdown().await;
}
