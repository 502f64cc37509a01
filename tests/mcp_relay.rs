//! What an MCP server says to the caller while a call runs, through carapace: progress and log
//! messages, its questions (elicitation) in both eras, and who may answer them. The Python
//! SDK's server (`tests/interop/mcp_python_server.py`: `confirm` asks, `count` reports) runs
//! behind carapace over Streamable HTTP and over stdio; the Python SDK's client calls it through
//! the MCP front in 2026-07-28 ("input required" results, retried with the answers) and in the
//! older era (requests on the call's SSE stream, answers posted back in the session).

mod common;

use carapace::server::Running;
use common::mcp::{over_python_http, python_stdio_app, run_python, start, yaml};
use common::{call, code, Env};
use serde_json::json;

/// The SDK client in both eras: the server's question reaches it and its answer the server,
/// progress comes back under its own token, and log messages at the level it asked for.
async fn both_eras(r: &Running) {
    let modern = run_python("mcp_python_relay_client.py", r, &["--mode", "2026-07-28"]).await;
    assert_eq!(modern["protocol_version"], "2026-07-28", "{modern}");
    assert_eq!(modern["asked"], json!(["Really delete x?"]), "{modern}");
    assert_eq!(modern["confirm"]["text"], json!(["deleted x"]), "{modern}");
    assert_eq!(modern["count"], json!(["counted to 3"]), "{modern}");
    assert_eq!(
        modern["progress"],
        json!([
            [1.0, 3.0, "step 1"],
            [2.0, 3.0, "step 2"],
            [3.0, 3.0, "step 3"]
        ]),
        "{modern}"
    );
    // It asked for `debug`: every message.
    assert_eq!(
        modern["logs"],
        json!([
            ["debug", "step 1"],
            ["warning", "step 2"],
            ["debug", "step 3"]
        ]),
        "{modern}"
    );

    let legacy = run_python("mcp_python_relay_client.py", r, &["--mode", "legacy"]).await;
    assert_eq!(legacy["protocol_version"], "2025-11-25", "{legacy}");
    assert_eq!(legacy["asked"], json!(["Really delete x?"]), "{legacy}");
    assert_eq!(legacy["confirm"]["text"], json!(["deleted x"]), "{legacy}");
    assert_eq!(legacy["progress"].as_array().unwrap().len(), 3, "{legacy}");
    // `logging/setLevel warning`: the debug messages are not sent to this session.
    assert_eq!(legacy["logs"], json!([["warning", "step 2"]]), "{legacy}");

    // The answer decides: declined, the server keeps the item.
    let declined = run_python(
        "mcp_python_relay_client.py",
        r,
        &["--mode", "legacy", "--decline"],
    )
    .await;
    assert_eq!(declined["confirm"]["text"], json!(["kept x"]), "{declined}");
    let declined = run_python(
        "mcp_python_relay_client.py",
        r,
        &["--mode", "2026-07-28", "--decline"],
    )
    .await;
    assert_eq!(declined["confirm"]["text"], json!(["kept x"]), "{declined}");
}

/// Only the session the question was put to, with the id it was given, answers it, once.
async fn answers_are_bound_to_the_session(r: &Running) {
    let seen = run_python("mcp_answer_binding.py", r, &[]).await;
    assert_eq!(seen["content_type"], "text/event-stream", "{seen}");
    assert_eq!(seen["request"]["method"], "elicitation/create", "{seen}");
    for refused in ["foreign_session", "unknown_id", "again"] {
        assert_eq!(seen[refused]["status"], 400, "{refused}: {seen}");
        assert_eq!(
            seen[refused]["body"]["error"]["code"], -32600,
            "{refused}: {seen}"
        );
    }
    assert_eq!(seen["own"]["status"], 202, "{seen}");
    // Session B's `ok: false` never reached the server: it deleted.
    assert_eq!(seen["result"]["content"][0]["text"], "deleted x", "{seen}");
}

#[tokio::test]
async fn a_server_over_http_asks_and_reports_to_the_caller_in_both_eras() {
    let env = Env::new().await;
    let (_server, r) = over_python_http(&env, "mcp").await;
    both_eras(&r).await;
    answers_are_bound_to_the_session(&r).await;
    r.shutdown().await;
}

#[tokio::test]
async fn a_server_over_stdio_asks_and_reports_to_the_caller_in_both_eras() {
    let env = Env::new().await;
    let r = start(&env, &yaml(&env, "mcp", &python_stdio_app())).await;
    both_eras(&r).await;
    answers_are_bound_to_the_session(&r).await;
    r.shutdown().await;
}

/// A front that cannot carry the question gets a clear error at once, and the server's
/// progress and logs are not needed for the call to succeed.
#[tokio::test]
async fn a_tools_v1_caller_gets_input_required_never_a_hang() {
    let env = Env::new().await;
    let r = start(&env, &yaml(&env, "tools-v1", &python_stdio_app())).await;
    let local = env.local(&r);
    let asked = local
        .post_json(
            "/v1/tools/call",
            &[],
            &call("confirm", json!({"item": "x"})),
        )
        .await
        .unwrap();
    // The server asks only a client that declared elicitation, and a tools-v1 caller cannot.
    assert_eq!(code(&asked), "INPUT_REQUIRED", "{:?}", asked.json());
    assert_eq!(
        asked.json()["error"]["details"]["requiredCapabilities"],
        json!({"elicitation": {"form": {}}}),
        "{:?}",
        asked.json()
    );
    let counted = local
        .post_json("/v1/tools/call", &[], &call("count", json!({"n": 2})))
        .await
        .unwrap();
    assert_eq!(counted.status, 200, "{:?}", counted.json());
    r.shutdown().await;
}
