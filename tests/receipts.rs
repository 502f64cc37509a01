//! Signed receipts: the tool host signs every executed call, an independent implementation
//! verifies them, and a gateway checks its paired peers' receipts.

mod common;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine as _;
use carapace::client::{Client, Reply};
use common::*;
use serde_json::{json, Value};

/// Check `receipt` with the independent verifier (Python `cryptography` + `rfc8785`).
fn python_check(receipt: &str, key: &str, args: &Value, status: &str, output: &Value) -> Value {
    use std::io::Write;
    let doc = json!({"receipt": receipt, "public_key": key, "args": args, "status": status,
                     "output": output, "code": output["code"]});
    let mut child = std::process::Command::new("timeout")
        .args(["60", "python3", "-W", "ignore"])
        .arg(common::mcp::interop("receipt_verify.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(doc.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

fn base64_url(part: &str) -> Vec<u8> {
    B64URL.decode(part).unwrap()
}

fn receipt_of(r: &Reply) -> String {
    r.headers
        .get("carapace-receipt")
        .unwrap_or_else(|| panic!("no receipt: {:?}", r.headers))
        .to_str()
        .unwrap()
        .to_string()
}

fn host_key(env: &Env) -> String {
    carapace::pairing::identity::HostIdentity::load_or_create(&env.path().join("state"))
        .unwrap()
        .public_key_ed25519()
}

#[tokio::test]
async fn every_executed_call_carries_a_receipt_an_independent_verifier_accepts() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("receipts: { sign: true, provider_id: memory-host }"))
        .await;
    let key = host_key(&env);
    let args = json!({"text": "receipts are proof", "tags": ["é", "\u{1f980}"]});
    let before = std::fs::read(env.path().join("carapace.yaml")).unwrap();
    let reply = env
        .gateway(&r)
        .post_json("/v1/tools/call", &[], &call("memory.append", args.clone()))
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    let receipt = receipt_of(&reply);
    let output = reply.json()["result"].clone();
    let got = python_check(&receipt, &key, &args, "ok", &output);
    assert_eq!(got["valid"], true, "{got}");
    assert_eq!(got["receipt"]["consumer"], "gw_test");
    assert_eq!(got["receipt"]["provider"], "memory-host");
    assert_eq!(got["receipt"]["tool"], "memory.append");
    // The body is what the app answered, unchanged.
    assert!(reply.json().get("receipt").is_none());

    // A changed byte of the input, the output or the receipt is found.
    let other_args = json!({"text": "receipts are proof!", "tags": ["é", "\u{1f980}"]});
    let got = python_check(&receipt, &key, &other_args, "ok", &output);
    assert_eq!(got["reason"], "input_hash");
    let mut other_output = output.clone();
    other_output["id"] = json!("x");
    let got = python_check(&receipt, &key, &args, "ok", &other_output);
    assert_eq!(got["reason"], "output_hash");
    let mut bytes = receipt.clone().into_bytes();
    let i = bytes.len() / 2;
    bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(bytes).unwrap();
    let got = python_check(&tampered, &key, &args, "ok", &output);
    assert_eq!(got["valid"], false, "{got}");
    assert!(carapace::receipts::verify(tampered.as_bytes(), &key).is_err());

    // `carapace receipts verify` checks a stored receipt offline.
    let d = env.path();
    std::fs::write(d.join("receipt"), &receipt).unwrap();
    std::fs::write(d.join("tampered"), &tampered).unwrap();
    std::fs::write(d.join("args.json"), args.to_string()).unwrap();
    std::fs::write(d.join("other.json"), other_args.to_string()).unwrap();
    std::fs::write(d.join("output.json"), output.to_string()).unwrap();
    let verify = |file: &str, input: &str| {
        std::process::Command::new(binary())
            .args(["receipts", "verify", "--public-key", &key, "--output"])
            .arg(d.join("output.json"))
            .arg("--receipt")
            .arg(d.join(file))
            .arg("--input")
            .arg(d.join(input))
            .output()
            .unwrap()
    };
    let out = verify("receipt", "args.json");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["tool"], "memory.append");
    assert!(!verify("tampered", "args.json").status.success());
    let out = verify("receipt", "other.json");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("input_hash"));

    // An error the app reported, and a refusal after the checks, are receipted too; a
    // refusal before them (no such tool) executed nothing and has none.
    let reply = env
        .local(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.delete", json!({"id": "missing"})),
        )
        .await
        .unwrap();
    let error = code(&reply);
    assert!(!error.is_empty(), "{:?}", reply.json());
    let got = python_check(
        &receipt_of(&reply),
        &key,
        &json!({"id": "missing"}),
        "error",
        &json!({"code": error}),
    );
    assert_eq!(got["valid"], true, "{got}");
    assert_eq!(got["receipt"]["consumer"], "local");
    let reply = env
        .local(&r)
        .post_json("/v1/tools/call", &[], &call("memory.nothing", json!({})))
        .await
        .unwrap();
    assert_eq!(code(&reply), "TOOL_NOT_FOUND");
    assert!(reply.headers.get("carapace-receipt").is_none());
    assert_eq!(
        before,
        std::fs::read(env.path().join("carapace.yaml")).unwrap()
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_timeout_is_receipted_with_a_null_output() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml(
            "receipts: { sign: true, provider_id: memory-host }\ntools: { memory.query: { timeout_ms_max: 50 } }",
        ))
        .await;
    let args = json!({"query": "x", "delay_ms": 2000});
    let reply = env
        .local(&r)
        .post_json("/v1/tools/call", &[], &call("memory.query", args.clone()))
        .await
        .unwrap();
    assert_eq!(code(&reply), "TIMEOUT");
    let got = python_check(
        &receipt_of(&reply),
        &host_key(&env),
        &args,
        "timeout",
        &Value::Null,
    );
    assert_eq!(got["valid"], true, "{got}");
    r.shutdown().await;
}

async fn agent_call(agent: &Client, tool: &str, args: Value) -> Reply {
    agent
        .post_json("/v1/tools/call", &[], &call(tool, args))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_gateway_that_requires_receipts_refuses_a_host_signing_with_another_key() {
    let env = Env::new().await;
    // The host signs by default once paired.
    let (host, gw, agent) = paired(&env, "", ", receipts: require", "", None).await;
    let reply = agent_call(&agent, "memory.append", json!({"text": "a"})).await;
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    assert_eq!(reply.headers["carapace-receipt-status"], "verified");
    let receipt =
        carapace::receipts::verify(receipt_of(&reply).as_bytes(), &host_key(&env)).unwrap();
    assert_eq!(
        (receipt.consumer.as_str(), receipt.provider.as_str()),
        ("gw_home", "memory-east")
    );

    // The paired record now names another key: the host's receipts no longer verify.
    let (other, _) = carapace::pairing::wire::SigningIdentity::generate();
    gw.shared
        .peers
        .modify(|f| f.peers[0].public_key_ed25519 = Some(other.public_key_b64()))
        .unwrap();
    let seen = env.app.received().len();
    let reply = agent_call(&agent, "memory.append", json!({"text": "b"})).await;
    assert_eq!(code(&reply), "DEPENDENCY_UNAVAILABLE", "{:?}", reply.json());
    assert_eq!(reply.headers["carapace-receipt-status"], "invalid");
    // The host did run it (its receipt says so); the agent is not given the result.
    assert_eq!(env.app.received().len(), seen + 1);
    assert!(reply.json().get("result").is_none());
    gw.shutdown().await;
    host.shutdown().await;
}

#[tokio::test]
async fn a_gateway_that_flags_receipts_passes_an_unsigned_answer_and_says_so() {
    let env = Env::new().await;
    let (host, gw, agent) = paired(
        &env,
        "receipts: { sign: false }",
        ", receipts: flag",
        "",
        None,
    )
    .await;
    let reply = agent_call(&agent, "memory.append", json!({"text": "a"})).await;
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    assert_eq!(reply.headers["carapace-receipt-status"], "missing");
    assert!(reply.headers.get("carapace-receipt").is_none());
    let metrics = gw.shared.metrics.encode();
    assert!(
        metrics.contains(r#"carapace_peer_receipts_total{peer="memory-east",status="missing"} 1"#),
        "{metrics}"
    );
    gw.shutdown().await;
    host.shutdown().await;
}

#[tokio::test]
async fn a_gateway_that_flags_receipts_passes_an_answer_signed_with_another_key_and_says_so() {
    let env = Env::new().await;
    let (host, gw, agent) = paired(&env, "", ", receipts: flag", "", None).await;
    let (other, _) = carapace::pairing::wire::SigningIdentity::generate();
    gw.shared
        .peers
        .modify(|f| f.peers[0].public_key_ed25519 = Some(other.public_key_b64()))
        .unwrap();
    let reply = agent_call(&agent, "memory.append", json!({"text": "a"})).await;
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    assert_eq!(reply.headers["carapace-receipt-status"], "invalid");
    assert!(reply.headers.get("carapace-receipt").is_some());
    assert!(gw
        .shared
        .metrics
        .encode()
        .contains(r#"carapace_peer_receipts_total{peer="memory-east",status="invalid"} 1"#));
    gw.shutdown().await;
    host.shutdown().await;
}

/// A host with `receipts: { batch: true }` signs the calls that end together once: every
/// receipt carries its inclusion proof, the gateway requiring receipts verifies each, so does
/// the independent verifier and `carapace receipts verify`, and the receipts sharing a
/// signature are exactly the leaves of their batch.
#[tokio::test]
async fn batched_receipts_of_concurrent_calls_each_verify_with_their_proof() {
    let env = Env::new().await;
    let (host, gw, agent) = paired(
        &env,
        "receipts: { batch: true }",
        ", receipts: require",
        "",
        None,
    )
    .await;
    let key = host_key(&env);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..8 {
        let agent = agent.clone();
        let args = json!({"query": format!("q{i}"), "delay_ms": 50});
        calls.spawn(async move { (args.clone(), agent_call(&agent, "memory.query", args).await) });
    }
    let mut batches: std::collections::BTreeMap<String, Vec<(u32, u32)>> = Default::default();
    let mut ids = std::collections::BTreeSet::new();
    while let Some(done) = calls.join_next().await {
        let (args, reply) = done.unwrap();
        assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
        assert_eq!(reply.headers["carapace-receipt-status"], "verified");
        let receipt = receipt_of(&reply);
        let got = python_check(&receipt, &key, &args, "ok", &reply.json()["result"]);
        assert_eq!(got["valid"], true, "{got}");
        assert!(ids.insert(got["receipt"]["receipt_id"].as_str().unwrap().to_string()));
        let parts: Vec<&str> = receipt.split('.').collect();
        assert_eq!(parts[0], "v2", "{receipt}");
        let proof = base64_url(parts[2]);
        let n = |r: std::ops::Range<usize>| u32::from_be_bytes(proof[r].try_into().unwrap());
        batches
            .entry(parts[3].to_string())
            .or_default()
            .push((n(0..4), n(4..8)));
    }
    for leaves in batches.values_mut() {
        leaves.sort();
        let size = leaves[0].1;
        let want: Vec<(u32, u32)> = (0..size).map(|i| (i, size)).collect();
        assert_eq!(*leaves, want, "every leaf of each batch, once");
    }
    assert_eq!(ids.len(), 8);
    // The host's metrics count the batches' signatures and the receipts they covered.
    let metrics = host.shared.metrics.encode();
    let count = |name: &str| -> usize {
        let line = metrics.lines().find(|l| l.starts_with(name));
        line.and_then(|l| l.split(' ').nth(1)?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    assert_eq!(count("carapace_receipt_batch_receipts_total"), 8);
    assert_eq!(
        count("carapace_receipt_batch_signatures_total"),
        batches.len()
    );

    // `carapace receipts verify` checks one offline; a changed size in its proof is found by
    // every verifier.
    let args = json!({"query": "last"});
    let reply = agent_call(&agent, "memory.query", args.clone()).await;
    let output = reply.json()["result"].clone();
    let receipt = receipt_of(&reply);
    let d = env.path();
    std::fs::write(d.join("args.json"), args.to_string()).unwrap();
    std::fs::write(d.join("output.json"), output.to_string()).unwrap();
    let cli = |receipt: &str| {
        std::fs::write(d.join("receipt"), receipt).unwrap();
        std::process::Command::new(binary())
            .args(["receipts", "verify", "--public-key", &key, "--output"])
            .arg(d.join("output.json"))
            .arg("--receipt")
            .arg(d.join("receipt"))
            .arg("--input")
            .arg(d.join("args.json"))
            .output()
            .unwrap()
    };
    assert!(cli(&receipt).status.success());
    let parts: Vec<&str> = receipt.split('.').collect();
    let mut proof = base64_url(parts[2]);
    proof[7] ^= 2;
    let tampered = format!("v2.{}.{}.{}", parts[1], B64URL.encode(&proof), parts[3]);
    let got = python_check(&tampered, &key, &args, "ok", &output);
    assert_eq!(got["valid"], false, "{got}");
    assert!(carapace::receipts::verify(tampered.as_bytes(), &key).is_err());
    assert!(!cli(&tampered).status.success());
    gw.shutdown().await;
    host.shutdown().await;
}

/// An MCP call answered as an SSE stream (the server reported progress before its result) has
/// sent its head before the call ended: the receipt comes after the last event as the
/// `Carapace-Receipt` trailer, announced in `Trailer`, and verifies against the streamed result.
/// The Python SDK's client reads the same stream as before.
#[tokio::test]
async fn a_streamed_mcp_answer_carries_its_receipt_as_a_trailer() {
    use common::mcp::{modern_body, python_stdio_app, run_python, start, yaml, MODERN};
    let env = Env::new().await;
    let config =
        yaml(&env, "mcp", &python_stdio_app()) + "receipts: { sign: true, provider_id: py-host }\n";
    let r = start(&env, &config).await;
    let key = host_key(&env);
    let mut body = modern_body(
        7,
        "tools/call",
        json!({"name": "count", "arguments": {"n": 2}}),
    );
    body["params"]["_meta"]["progressToken"] = json!("p1");
    let headers = [
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", MODERN),
        ("mcp-method", "tools/call"),
        ("mcp-name", "count"),
        ("te", "trailers"),
    ];
    // An HTTP/1.1 caller that does not say it takes trailers (`TE: trailers`) is sent none.
    let plain = env
        .local(&r)
        .post_json("/mcp", &headers[..4], &body)
        .await
        .unwrap();
    assert_eq!(plain.headers["content-type"], "text/event-stream");
    assert!(plain.headers.get("trailer").is_none());
    assert!(plain.trailers.is_none());
    let reply = env
        .local(&r)
        .post_json("/mcp", &headers, &body)
        .await
        .unwrap();
    assert_eq!(reply.headers["content-type"], "text/event-stream");
    assert_eq!(
        reply.headers["trailer"],
        "Carapace-Receipt, Carapace-Receipt-Status"
    );
    assert!(reply.headers.get("carapace-receipt").is_none());
    let text = String::from_utf8(reply.body.to_vec()).unwrap();
    let events: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("event: message\ndata: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(events.len() >= 3, "progress, then the result: {text}");
    assert_eq!(events[0]["method"], "notifications/progress", "{text}");
    let last = events.last().unwrap();
    assert_eq!(last["id"], 7, "{text}");
    assert_eq!(
        last["result"]["content"][0]["text"], "counted to 2",
        "{text}"
    );
    // What a receipt hashes is the tool's output, whatever the front: an MCP server's
    // `structuredContent`, or `{"content": [...]}` when it sent none.
    let output = match last["result"].get("structuredContent") {
        Some(s) => s.clone(),
        None => json!({"content": last["result"]["content"]}),
    };

    let trailers = reply.trailers.expect("the receipt trailer");
    let receipt = trailers["carapace-receipt"].to_str().unwrap();
    let got = python_check(receipt, &key, &json!({"n": 2}), "ok", &output);
    assert_eq!(got["valid"], true, "{got}");
    assert_eq!(got["receipt"]["tool"], "count");
    assert_eq!(got["receipt"]["provider"], "py-host");
    assert_eq!(got["receipt"]["consumer"], "local");
    assert!(carapace::receipts::verify(receipt.as_bytes(), &key).is_ok());

    // The reference client, in both eras, is unaffected by the trailer.
    for mode in ["2026-07-28", "legacy"] {
        let seen = run_python("mcp_python_relay_client.py", &r, &["--mode", mode]).await;
        assert_eq!(seen["count"], json!(["counted to 3"]), "{mode}: {seen}");
        assert_eq!(
            seen["progress"].as_array().unwrap().len(),
            3,
            "{mode}: {seen}"
        );
    }
    r.shutdown().await;
}
