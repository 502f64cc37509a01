//! The tools-v1 front over the sample memory app: what callers get, and what reached the app.

mod common;

use std::time::Duration;

use common::{call, code, wait_until, write_peers, Env};
use http::{Method, StatusCode};
use serde_json::json;

#[tokio::test]
async fn a_paired_gateway_call_reaches_the_app_with_identity_set_by_carapace() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    let reply = env
        .gateway(&r)
        .post_json(
            "/v1/tools/call",
            &[
                ("x-carapace-peer-id", "admin"),
                ("x-carapace-peer-type", "operator"),
            ],
            &call("memory.append", json!({"text": "hello"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let body = reply.json();
    assert_eq!(body["status"], "ok");
    assert_eq!(body["result"]["count"], 1);
    assert!(carapace::tools_v1::follows_response_schema(&body));
    let seen = env.app.received();
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert_eq!(
        h.get_all("x-carapace-peer-id").iter().collect::<Vec<_>>(),
        ["gw_test"]
    );
    assert_eq!(h["x-carapace-peer-type"], "gateway");
    assert_eq!(
        h["x-carapace-peer-fingerprint"],
        env.pki.gateway.fingerprint.as_str()
    );
    assert_eq!(seen[0].body["args"], json!({"text": "hello"}));
    r.shutdown().await;
}
