//! The MCP front, whole: the JSON-RPC decoder (single messages and batches), the era decision,
//! the 2026-07-28 header checks (base64 header values), sessions, `tools/list` cursors and
//! `tools/call` decoding (the one-pass reader against the general decoding). The first byte
//! chooses the headers, the rest is the body.
#![no_main]

use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use carapace::catalog::CatalogHandle;
use carapace::config::mcp::McpFrontConfig;
use carapace::front::CallStack;
use carapace::mcp::session::Sessions;
use carapace::mcp::McpFront;
use carapace_filters::call::{CallOutcome, Principal};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tower::ServiceExt;

const NOW_MS: u64 = 1_735_689_600_000;

struct Fixture {
    front: McpFront,
    session: String,
    runtime: tokio::runtime::Runtime,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let cfg = carapace_fuzz::config();
    let handle = CatalogHandle::default();
    handle.replace(carapace_fuzz::catalog(&cfg));
    // The app answers every call with its arguments.
    let calls = CallStack::new(tower::service_fn(
        |call: carapace_filters::call::ToolCall| async move {
            Ok(CallOutcome::Ok {
                output: call.args,
                meta: None,
                content: None,
            })
        },
    ));
    let mcp = McpFrontConfig {
        page_size: 1,
        ..McpFrontConfig::default()
    };
    let sessions = Arc::new(Sessions::new(&[9; 32], &mcp));
    let features = carapace::mcp::back::relay::ClientFeatures::default();
    let session = sessions
        .open("2025-03-26", "local", features, NOW_MS)
        .expect("a session");
    let front = McpFront::new(
        Arc::new(handle),
        calls.clone(),
        calls,
        Arc::new(|| NOW_MS),
        Arc::new(mcp),
        sessions,
        Arc::default(),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    Fixture {
        front,
        session,
        runtime,
    }
});

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    // The one-pass reader of `tools/call` takes only what the general decoding reads as one,
    // and reads the same id and parameters.
    if let Some(fast) = carapace::mcp::wire::read_tools_call(body) {
        assert_eq!(Some(fast), carapace::mcp::wire::read_tools_call_general(body));
    }
    let f = &*FIXTURE;
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let mut req = http::Request::builder()
        .method(if flags & 0x10 != 0 { "DELETE" } else { "POST" })
        .uri("/mcp");
    if flags & 0x01 != 0 {
        req = req.header("mcp-protocol-version", "2026-07-28");
    }
    if flags & 0x02 != 0 {
        let method = parsed.as_ref().and_then(|v| v["method"].as_str()).unwrap_or("tools/call");
        if let Ok(v) = http::HeaderValue::from_str(method) {
            req = req.header("mcp-method", v);
        }
    }
    if flags & 0x04 != 0 {
        let name = parsed.as_ref().and_then(|v| v["params"]["name"].as_str()).unwrap_or("");
        let encoded = format!("=?base64?{}?=", base64_encode(name.as_bytes()));
        req = req.header("mcp-name", encoded);
    }
    if flags & 0x08 != 0 {
        req = req.header("mcp-session-id", f.session.as_str());
    }
    let mut req = req.body(Bytes::copy_from_slice(body)).expect("request");
    req.extensions_mut().insert(Arc::new(Principal::local()));
    let resp = f.runtime.block_on(f.front.clone().oneshot(req));
    let Ok(resp) = resp else {
        return; // a routing refusal for the envelope
    };
    let status = resp.status().as_u16();
    assert!(
        [200, 202, 400, 403, 404, 405, 413, 429, 499, 500, 502, 503, 504].contains(&status),
        "status {status}"
    );
    let bytes = f
        .runtime
        .block_on(resp.into_body().collect())
        .expect("a full body")
        .to_bytes();
    if bytes.is_empty() {
        return;
    }
    let answer: Value = serde_json::from_slice(&bytes).expect("answers are JSON");
    let each = match &answer {
        Value::Array(items) => items.clone(),
        one => vec![one.clone()],
    };
    for a in each {
        assert_eq!(a["jsonrpc"], "2.0", "{a}");
        assert!(a.get("id").is_some(), "every answer has an id member: {a}");
        assert!(a.get("result").is_some() != a.get("error").is_some(), "{a}");
    }
});

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}
