//! RFC 9421 HTTP Message Signatures on a tools-v1 front (`front.auth.mode: http_signature`),
//! with requests signed by an independent signer (PyPI `http-message-signatures`).

mod common;

use std::path::Path;

use carapace::client::{Client, Reply};
use common::mcp::interop;
use common::{call, code, Env};
use serde_json::Value;

const URL: &str = "https://localhost/v1/tools/call";

/// The headers the Python signer gives for `body` sent to `URL`.
fn python_sign(env: &Env, body: &str, args: &[&str]) -> Vec<(String, String)> {
    python_sign_for(env, URL, body, args)
}

fn python_sign_for(env: &Env, url: &str, body: &str, args: &[&str]) -> Vec<(String, String)> {
    let body_file = env.path().join("body.json");
    std::fs::write(&body_file, body).unwrap();
    let out = std::process::Command::new("timeout")
        .args(["30", "python3", "-W", "ignore"])
        .arg(interop("httpsig_sign.py"))
        .args(["sign", "--url", url, "--body-file"])
        .arg(&body_file)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let headers: serde_json::Map<String, Value> = serde_json::from_slice(&out.stdout).unwrap();
    headers
        .into_iter()
        .map(|(k, v)| (k, v.as_str().unwrap().to_owned()))
        .collect()
}

fn hmac_args<'a>(env: &'a Env, created: &'a str, nonce: &'a str) -> Vec<String> {
    let key = env.path().join("k1.secret").display().to_string();
    [
        "--key-id",
        "k1",
        "--alg",
        "hmac-sha256",
        "--key-file",
        &key,
        "--created",
        created,
        "--nonce",
        nonce,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

async fn send(client: &Client, body: &str, headers: &[(String, String)]) -> Reply {
    send_to(client, "/v1/tools/call", body, headers, &[]).await
}

async fn send_to(
    client: &Client,
    path: &str,
    body: &str,
    headers: &[(String, String)],
    extra: &[(&str, &str)],
) -> Reply {
    let mut h: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("content-type"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    h.extend_from_slice(extra);
    client
        .send(http::Method::POST, path, &h, body.to_owned())
        .await
        .unwrap()
}

fn yaml(env: &Env) -> String {
    env.tools_yaml("")
        .replace(
            "front: { protocol: tools-v1 }",
            &format!(
                "front:\n  protocol: tools-v1\n  answers: http_status\n  auth:\n    mode: http_signature\n    keys: [{{ id: k1, secret: {{ file: {}/k1.secret }} }}]\n    timestamp_skew_s: 60\n    authorities: [localhost]",
                env.path().display()
            ),
        )
}

fn now_s() -> u64 {
    carapace_filters::unix_now_ms() / 1000
}

fn write_secret(dir: &Path) {
    std::fs::write(
        dir.join("k1.secret"),
        "a shared secret of at least thirty-two bytes",
    )
    .unwrap();
}

#[tokio::test]
async fn independently_signed_requests_pass_and_tampered_ones_do_not() {
    let env = Env::new().await;
    write_secret(env.path());
    let r = env.start(&yaml(&env)).await;
    let anon = env.tls_client(&r, None, false);
    let body = call("memory.append", serde_json::json!({"text": "signed"})).to_string();
    let now = now_s().to_string();

    let good = python_sign(
        &env,
        &body,
        &hmac_args(&env, &now, "n-1")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(good
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-digest")));
    let ok = send(&anon, &body, &good).await;
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    assert_eq!(ok.json()["status"], "ok", "{}", ok.json());
    assert_eq!(env.app.received().len(), 1);
    // The holder of a shared key is named by it.
    assert_eq!(
        env.app.received()[0].headers["x-carapace-peer-id"],
        "signed:k1"
    );

    // A replay of the same request: the nonce is used.
    let again = send(&anon, &body, &good).await;
    assert_eq!(
        (again.status.as_u16(), code(&again)),
        (401, "UNAUTHORIZED".into())
    );
    assert_eq!(again.json()["error"]["details"]["reason"], "nonce_replay");

    // A covered header changed on the way.
    let mut args = hmac_args(&env, &now, "n-2");
    args.extend([
        "--cover".into(),
        "@method,@target-uri,content-digest,x-tenant".into(),
        "--header".into(),
        "x-tenant=a".into(),
    ]);
    let mut tampered = python_sign(
        &env,
        &body,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    for (k, v) in tampered.iter_mut() {
        if k.eq_ignore_ascii_case("x-tenant") {
            *v = "b".into();
        }
    }
    let header = send(&anon, &body, &tampered).await;
    // The body changed on the way (its digest no longer matches).
    let other = call("memory.append", serde_json::json!({"text": "changed"})).to_string();
    let signed = python_sign(
        &env,
        &body,
        &hmac_args(&env, &now, "n-3")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let changed = send(&anon, &other, &signed).await;
    // Signed too long ago, and by a key carapace does not know.
    let old = (now_s() - 600).to_string();
    let stale = python_sign(
        &env,
        &body,
        &hmac_args(&env, &old, "n-4")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let stale = send(&anon, &body, &stale).await;
    std::fs::write(
        env.path().join("k2.secret"),
        "another secret that is long enough here",
    )
    .unwrap();
    let k2 = env.path().join("k2.secret").display().to_string();
    let unknown = python_sign(
        &env,
        &body,
        &[
            "--key-id",
            "k2",
            "--alg",
            "hmac-sha256",
            "--key-file",
            &k2,
            "--created",
            &now,
            "--nonce",
            "n-5",
        ],
    );
    let unknown = send(&anon, &body, &unknown).await;
    let unsigned = send(&anon, &body, &[]).await;
    for (name, reply, reason) in [
        ("covered header", &header, "auth_failed"),
        ("body", &changed, "auth_failed"),
        ("created", &stale, "stale_timestamp"),
        ("keyid", &unknown, "auth_failed"),
        ("unsigned", &unsigned, "auth_failed"),
    ] {
        assert_eq!(reply.status, 401, "{name}: {:?}", reply.body);
        assert_eq!(code(reply), "UNAUTHORIZED", "{name}");
        assert_eq!(reply.json()["error"]["details"]["reason"], reason, "{name}");
    }
    assert!(changed.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("content-digest"));
    assert!(unknown.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown keyid"));
    assert_eq!(env.app.received().len(), 1, "nothing else reached the app");

    // The local socket needs no signature.
    let local = env
        .local(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", serde_json::json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(local.json()["status"], "ok", "{}", local.json());
    r.shutdown().await;
}

#[tokio::test]
async fn a_paired_peer_signs_with_its_identity_key() {
    let env = Env::new().await;
    write_secret(env.path());
    let pem = env.path().join("peer.pem");
    let out = std::process::Command::new("python3")
        .arg(interop("httpsig_sign.py"))
        .arg("keygen")
        .arg(&pem)
        .output()
        .unwrap();
    assert!(out.status.success());
    let public = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    // The paired gateway's record, now holding its Ed25519 identity key.
    let peers = env.path().join("peers.json");
    let mut file: Value = serde_json::from_slice(&std::fs::read(&peers).unwrap()).unwrap();
    file["peers"][0]["public_key_ed25519"] = Value::from(public);
    std::fs::write(&peers, file.to_string()).unwrap();
    let r = env.start(&yaml(&env)).await;
    let body = call("memory.query", serde_json::json!({"query": "x"})).to_string();
    let now = now_s().to_string();
    let key = pem.display().to_string();
    let args = |nonce: &'static str| {
        vec![
            "--key-id".to_string(),
            "gw_test".into(),
            "--alg".into(),
            "ed25519".into(),
            "--key-file".into(),
            key.clone(),
            "--created".into(),
            now.clone(),
            "--nonce".into(),
            nonce.into(),
        ]
    };
    let sign = |nonce| {
        python_sign(
            &env,
            &body,
            &args(nonce).iter().map(String::as_str).collect::<Vec<_>>(),
        )
    };
    // Without a client certificate, the signature alone names the peer.
    let anon = env.tls_client(&r, None, false);
    let ok = send(&anon, &body, &sign("p-1")).await;
    assert_eq!(ok.json()["status"], "ok", "{}", ok.json());
    assert_eq!(
        env.app.received()[0].headers["x-carapace-peer-id"],
        "gw_test"
    );
    // Over the peer's own mTLS connection as well.
    let ok = send(&env.gateway(&r), &body, &sign("p-2")).await;
    assert_eq!(ok.json()["status"], "ok", "{}", ok.json());
    // Another peer's connection may not present it.
    let stranger = env.tls_client(&r, Some(&env.pki.stranger), false);
    let refused = send(&stranger, &body, &sign("p-3")).await;
    assert_ne!(refused.status, 200);
    assert_eq!(env.app.received().len(), 2);
    r.shutdown().await;
}

#[tokio::test]
async fn the_mcp_front_takes_signed_requests_too() {
    let env = Env::new().await;
    write_secret(env.path());
    let yaml = yaml(&env).replace(
        "protocol: tools-v1\n  answers: http_status",
        "protocol: mcp",
    );
    let r = env.start(&yaml).await;
    let anon = env.tls_client(&r, None, false);
    let body = common::mcp::modern_body(
        1,
        "tools/call",
        serde_json::json!({"name": "memory.query", "arguments": {"query": "x"}}),
    )
    .to_string();
    let now = now_s().to_string();
    let args = hmac_args(&env, &now, "m-1");
    let signed = python_sign_for(
        &env,
        "https://localhost/mcp",
        &body,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let mirrored = [
        ("mcp-protocol-version", common::mcp::MODERN),
        ("mcp-method", "tools/call"),
        ("mcp-name", "memory.query"),
        ("accept", "application/json, text/event-stream"),
    ];
    let ok = send_to(&anon, "/mcp", &body, &signed, &mirrored).await;
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    assert!(
        ok.json()["result"]["isError"] != Value::Bool(true),
        "{}",
        ok.json()
    );
    let replay = send_to(&anon, "/mcp", &body, &signed, &mirrored).await;
    assert_eq!(replay.status, 401, "{:?}", replay.body);
    assert_eq!(
        replay.json()["error"]["data"]["details"]["reason"],
        "nonce_replay"
    );
    assert_eq!(env.app.received().len(), 1);
    r.shutdown().await;
}
