//! The gateway's outbound role: an agent's call on the gateway's socket reaches the paired
//! tool host, or a skill, with the gateway's checks on the way out.

use std::sync::Arc;

use carapace::client::{Client, Transport};
use http::{Method, StatusCode};
use serde_json::json;

use crate::common::{self, call, code, Env};
use crate::{admin, query, request_pairing, start_gateway, tool_host_and_gateway, Paired};

#[tokio::test]
async fn an_agents_call_reaches_the_paired_tool_host_through_the_gateway() {
    let env = Env::new().await;
    let (host, gw, dir) =
        tool_host_and_gateway(&env, "", Arc::new(carapace_filters::unix_now_ms)).await;
    let agent = Client::new(Transport::Unix(dir.join("outbound.sock")));
    // Nothing paired yet: the gateway routes nowhere.
    let reply = agent
        .post_json("/v1/tools/call", &[], &query())
        .await
        .unwrap();
    assert!(
        matches!(
            code(&reply).as_str(),
            "TOOL_NOT_FOUND" | "DEPENDENCY_UNAVAILABLE"
        ),
        "{:?}",
        reply.json()
    );
    assert!(env.app.received().is_empty());

    let endpoint = format!("ws://{}/v1/pair", host.pairing_address.unwrap());
    let (status, body) = request_pairing(&gw, &endpoint).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Once the pairing is reported, the gateway lists the tool host's tools and the agent's
    // call goes through.
    let list = agent.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
    let tools = list.json()["tools"].as_array().cloned().unwrap_or_default();
    assert!(!tools.is_empty(), "{:?}", list.json());
    let reply = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.append", json!({"text": "via gateway"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    let seen = env.app.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["x-carapace-peer-id"], "gw_home");
    assert_eq!(seen[0].body["args"]["text"], "via gateway");
    gw.shutdown().await;
    host.shutdown().await;
}

#[tokio::test]
async fn the_gateways_kill_switch_holds_for_its_outbound_calls() {
    let env = Env::new().await;
    let paired = Paired::plain(&env).await;
    let switch = |engaged: bool| {
        carapace::admin::request(
            &paired.gw.admin_socket,
            Method::PUT,
            "/v1/kill-switch",
            Some(json!({"engaged": engaged, "tool": "memory.append"})),
        )
    };
    assert_eq!(switch(true).await.unwrap().0, StatusCode::OK);
    let append = call("memory.append", json!({"text": "no"}));
    let r = paired.ask(&append).await;
    assert_eq!(code(&r), "DEPENDENCY_UNAVAILABLE");
    // Other tools go on.
    assert_eq!(paired.ask(&query()).await.json()["status"], "ok");
    assert_eq!(env.app.received().len(), 1);
    assert_eq!(switch(false).await.unwrap().0, StatusCode::OK);
    assert_eq!(paired.ask(&append).await.json()["status"], "ok");
    assert_eq!(env.app.received().len(), 2);
    paired.shutdown().await;
}

#[tokio::test]
async fn a_retryable_error_is_retried_once_and_only_for_a_call_with_an_idempotency_key() {
    let env = Env::new().await;
    let paired = Paired::plain(&env).await;
    env.app
        .set_fault(Some(carapace::memory_app::Fault::Retryable));
    let r = paired.ask(&query()).await;
    assert_eq!(r.json()["status"], "retryable_error", "{:?}", r.json());
    assert_eq!(env.app.received().len(), 1, "retried without a key");
    let mut keyed = query();
    keyed["idempotency_key"] = json!("query-x-1");
    let r = paired.ask(&keyed).await;
    assert_eq!(r.json()["status"], "retryable_error");
    assert_eq!(env.app.received().len(), 3, "not retried exactly once");
    paired.shutdown().await;
}

#[tokio::test]
async fn bad_arguments_are_refused_by_the_gateway_before_anything_is_sent() {
    let env = Env::new().await;
    let Paired {
        host, gw, agent, ..
    } = Paired::plain(&env).await;
    // The tool host (which would refuse them too) is gone: only the gateway can answer.
    host.shutdown().await;
    let ask = |body: serde_json::Value| {
        let agent = &agent;
        async move { agent.post_json("/v1/tools/call", &[], &body).await.unwrap() }
    };
    let sent = ask(query()).await;
    assert_eq!(code(&sent), "DEPENDENCY_UNAVAILABLE", "{:?}", sent.json());
    let reply = ask(call("memory.append", json!({"text": 1}))).await;
    assert_eq!(code(&reply), "INVALID_ARGS", "{:?}", reply.json());
    assert!(env.app.received().is_empty());
    gw.shutdown().await;
}

#[tokio::test]
async fn a_tool_host_presenting_another_certificate_than_the_paired_one_is_refused() {
    let env = Env::new().await;
    // This gateway keeps no idle connections, so every call makes a new TLS handshake.
    let clock = Arc::new(carapace_filters::unix_now_ms);
    let paired = Paired::new(&env, "max_idle: 0", clock).await;
    assert_eq!(paired.ask(&query()).await.json()["status"], "ok");
    let files = carapace::tls::PairedFiles::current(&env.path().join("state")).unwrap();
    let original = std::fs::read(&files.cert).unwrap();
    let original_key = std::fs::read(&files.key).unwrap();
    let other = env.pki.ca.server(&["127.0.0.1"]);
    std::fs::write(&files.cert, &other.cert_pem).unwrap();
    std::fs::write(&files.key, &other.key_pem).unwrap();
    paired.host.reload().await.unwrap();
    let reply = paired.ask(&query()).await;
    assert_eq!(code(&reply), "DEPENDENCY_UNAVAILABLE", "{:?}", reply.json());
    assert_eq!(
        env.app.received().len(),
        1,
        "a swapped certificate was trusted"
    );
    // With its paired certificate back, it is called again.
    std::fs::write(&files.cert, &original).unwrap();
    std::fs::write(&files.key, &original_key).unwrap();
    paired.host.reload().await.unwrap();
    assert_eq!(paired.ask(&query()).await.json()["status"], "ok");
    assert_eq!(env.app.received().len(), 2);
    paired.shutdown().await;
}

#[tokio::test]
async fn a_tool_host_unpaired_on_the_gateway_is_refused_before_any_io_even_when_pooled() {
    let env = Env::new().await;
    // Connections pooled as by default: the call before the revocation leaves one idle.
    let paired = Paired::plain(&env).await;
    let ok = paired.ask(&query()).await;
    assert_eq!(ok.json()["status"], "ok", "{:?}", ok.json());
    let revoke = json!({"component_id": "memory-east"});
    let revoked = admin(&paired.gw, "/v1/peers/revoke", Some(revoke)).await;
    assert_eq!(revoked, StatusCode::OK);
    let reply = paired.ask(&query()).await;
    assert_eq!(code(&reply), "FORBIDDEN", "{:?}", reply.json());
    assert_eq!(env.app.received().len(), 1);
    paired.shutdown().await;
}

#[tokio::test]
async fn the_gateway_routes_a_capability_to_its_skill_and_signs_the_run() {
    let env = Env::new().await;
    let secret = b"skill-secret-for-outbound";
    let (skill, skill_addr) =
        common::SkillApp::start(secret, common::SkillApp::vagus_manifest()).await;
    std::fs::write(env.path().join("skill.key"), secret).unwrap();
    let d = env.path().join("gw");
    let gw = start_gateway(
        &d,
        &format!(
            r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {d}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
ops: {{ address: "" }}
gateway: {{ id: gw_home }}
outbound:
  socket: {d}/outbound.sock
  peers: {{}}
  skills:
    demo.echo:
      url: "http://{skill_addr}"
      capabilities: [demo.echo]
      auth: {{ mode: hmac, header_name: X-Skill-Signature, secret: {{ file: {key} }} }}
"#,
            d = d.display(),
            app = env.app_addr,
            key = env.path().join("skill.key").display(),
        ),
    )
    .await;
    let agent = Client::new(Transport::Unix(d.join("outbound.sock")));
    // Discovered now, not by the discovery task's timing.
    gw.shared
        .outbound
        .get()
        .unwrap()
        .refresh(&gw.shared.config.load_full())
        .await;
    let reply = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("demo.echo", json!({"message": "hi"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    assert_eq!(reply.json()["result"]["result"], "echo:hi");
    // The skill verified the HMAC itself (it answers 401 otherwise) and saw a fresh run.
    let received = skill.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].1["capability"], "demo.echo");
    assert_eq!(received[0].1["nonce"].as_str().unwrap().len(), 32);

    // Bad arguments never reach the skill; an output breaking the schema never reaches the
    // agent.
    let r = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("demo.echo", json!({"message": 5})),
        )
        .await
        .unwrap();
    assert_eq!(code(&r), "INVALID_ARGS");
    *skill.answer.lock().unwrap() = Some((200, json!({"ok": true, "output": {"secret": "x"}})));
    let r = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("demo.echo", json!({"message": "hi"})),
        )
        .await
        .unwrap();
    assert_eq!(code(&r), "DEPENDENCY_UNAVAILABLE");
    assert_eq!(r.json()["error"]["details"]["reason"], "output_schema");
    assert!(!String::from_utf8_lossy(&r.body).contains("\"x\""));
    assert_eq!(skill.received.lock().unwrap().len(), 2);
    gw.shutdown().await;
}
