//! carapace as an OAuth 2.1 resource server on the MCP front: bearer tokens on connections
//! without a client certificate, the 401 and 403 challenges, the protected-resource metadata,
//! and the official Python SDK's OAuth client against a test authorization server.

mod common;

use carapace::client::Reply;
use carapace_filters::bearer::challenge;
use common::mcp::{interop, modern_body};
use common::oauth::{b64, Issuer};
use common::Env;
use jsonwebtoken::{EncodingKey, Header};
use serde_json::{json, Value};

const ISSUER: &str = "https://auth.test";
const RESOURCE: &str = "https://tools.test/mcp";

fn now_s() -> u64 {
    carapace_filters::unix_now_ms() / 1000
}

fn claims(scope: &str) -> Value {
    json!({"iss": ISSUER, "aud": RESOURCE, "sub": "alice", "scope": scope,
        "iat": now_s(), "exp": now_s() + 300})
}

fn oauth_yaml(env: &Env, oauth: &str) -> String {
    common::mcp::yaml(env, "mcp", "x")
        .replace(
            "front: { protocol: mcp }",
            &format!("front:\n  protocol: mcp\n  oauth:\n{oauth}"),
        )
        .replace(
            "app: { protocol: mcp, x }",
            &format!(
                "app: {{ protocol: tools-v1, address: \"http://{}\" }}",
                env.app_addr
            ),
        )
}

fn file_oauth(env: &Env) -> String {
    format!(
        r#"    resource: "{RESOURCE}"
    issuer: "{ISSUER}"
    jwks_file: {}/jwks.json
    scopes:
      memory: ["tool.call:memory.*"]
      "memory:read": ["tool.call:memory.query"]
    challenge_scope: "memory:read""#,
        env.path().display()
    )
}

async fn with_token(client: &carapace::client::Client, token: Option<&str>, body: &Value) -> Reply {
    let auth = token.map(|t| format!("Bearer {t}"));
    let method = body["method"].as_str().unwrap();
    let mut h = vec![
        ("mcp-protocol-version", common::mcp::MODERN),
        ("mcp-method", method),
    ];
    if let Some(a) = &auth {
        h.push(("authorization", a));
    }
    if let Some(name) = body["params"]["name"].as_str() {
        h.push(("mcp-name", name));
    }
    client.post_json("/mcp", &h, body).await.unwrap()
}

fn the_challenge(r: &Reply) -> challenge::ParsedChallenge {
    let v = r.headers["www-authenticate"].to_str().unwrap();
    let mut all = challenge::parse(v).unwrap();
    assert_eq!(all.len(), 1, "one challenge: {v}");
    all.remove(0)
}

fn call(tool: &str, args: Value) -> Value {
    modern_body(1, "tools/call", json!({"name": tool, "arguments": args}))
}

#[tokio::test]
async fn tokens_are_checked_and_scopes_become_permissions() {
    let env = Env::new().await;
    let issuer = Issuer::new("k1");
    std::fs::write(env.path().join("jwks.json"), issuer.jwks.to_string()).unwrap();
    let r = env.start(&oauth_yaml(&env, &file_oauth(&env))).await;
    let anon = env.tls_client(&r, None, false);

    // No token: 401 naming the metadata, and the metadata is there for anyone.
    let resp = with_token(&anon, None, &modern_body(1, "tools/list", json!({}))).await;
    assert_eq!(resp.status, 401, "{:?}", resp.body);
    let c = the_challenge(&resp);
    assert_eq!(c.scheme, "Bearer");
    assert_eq!(c.param("error"), None);
    assert_eq!(c.param("scope"), Some("memory:read"));
    let url = "https://tools.test/.well-known/oauth-protected-resource/mcp";
    assert_eq!(c.param("resource_metadata"), Some(url));
    let meta = anon
        .send(
            http::Method::GET,
            "/.well-known/oauth-protected-resource/mcp",
            &[],
            "",
        )
        .await
        .unwrap();
    assert_eq!(meta.status, 200);
    assert_eq!(
        meta.json(),
        json!({"resource": RESOURCE, "authorization_servers": [ISSUER],
            "scopes_supported": ["memory", "memory:read"], "bearer_methods_supported": ["header"]})
    );

    // A read-only token: it sees and calls memory.query only.
    let read = issuer.token(&claims("memory:read"));
    let list = with_token(&anon, Some(&read), &modern_body(1, "tools/list", json!({}))).await;
    assert_eq!(list.status, 200, "{:?}", list.body);
    let listed = list.json();
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["memory.query"]);
    let q = with_token(
        &anon,
        Some(&read),
        &call("memory.query", json!({"query": "x"})),
    )
    .await;
    assert_eq!(q.status, 200, "{:?}", q.body);
    assert!(q.json()["result"]["isError"] != json!(true), "{}", q.json());
    let seen = env.app.received();
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].headers.get("authorization").is_none(),
        "the token never reaches the app"
    );
    assert_eq!(seen[0].headers["x-carapace-peer-id"], "oauth:alice");
    assert_eq!(seen[0].headers["x-carapace-peer-type"], "oauth");

    // A call its scopes do not allow: 403 with the scope it needs, in one challenge.
    let a = with_token(
        &anon,
        Some(&read),
        &call("memory.append", json!({"text": "t"})),
    )
    .await;
    assert_eq!(a.status, 403, "{:?}", a.body);
    let c = the_challenge(&a);
    assert_eq!(c.param("error"), Some("insufficient_scope"));
    assert_eq!(c.param("scope"), Some("memory"));
    assert_eq!(c.param("resource_metadata"), Some(url));
    assert_eq!(
        a.json()["error"]["data"]["details"]["reason"],
        "insufficient_scope"
    );
    assert_eq!(env.app.received().len(), 1, "nothing more reached the app");

    // The wider scope holds its child: both tools.
    let all = issuer.token(&claims("memory"));
    let a = with_token(
        &anon,
        Some(&all),
        &call("memory.append", json!({"text": "t"})),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(env.app.received().len(), 2);

    // The paired gateway needs no token, and one it sends goes no further.
    let gw = env.gateway(&r);
    let g = with_token(
        &gw,
        Some("not-a-token"),
        &call("memory.query", json!({"query": "x"})),
    )
    .await;
    assert_eq!(g.status, 200, "{:?}", g.body);
    let seen = env.app.received();
    assert!(seen[2].headers.get("authorization").is_none());
    assert_eq!(seen[2].headers["x-carapace-peer-id"], "gw_test");
    r.shutdown().await;
}

#[tokio::test]
async fn bad_tokens_are_refused_and_nothing_reaches_the_app() {
    let env = Env::new().await;
    let issuer = Issuer::new("k1");
    let stranger = Issuer::new("k1");
    std::fs::write(env.path().join("jwks.json"), issuer.jwks.to_string()).unwrap();
    let r = env.start(&oauth_yaml(&env, &file_oauth(&env))).await;
    let anon = env.tls_client(&r, None, false);
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = claims("memory");
        f(&mut c);
        issuer.token(&c)
    };
    let body = b64(claims("memory").to_string().as_bytes());
    let none = format!("{}.{body}.", b64(br#"{"alg":"none","typ":"JWT"}"#));
    // HS256 keyed with the issuer's public key, as an algorithm-confusion attack does.
    let public = issuer.jwks["keys"][0].to_string();
    let confused = jsonwebtoken::encode(
        &Header::new(jsonwebtoken::Algorithm::HS256),
        &claims("memory"),
        &EncodingKey::from_secret(public.as_bytes()),
    )
    .unwrap();
    let cases = [
        (
            "wrong aud",
            with(&|c| c["aud"] = json!("https://other.test/mcp")),
        ),
        ("expired", with(&|c| c["exp"] = json!(now_s() - 3600))),
        ("not yet valid", with(&|c| c["nbf"] = json!(now_s() + 3600))),
        (
            "wrong issuer",
            with(&|c| c["iss"] = json!("https://evil.test")),
        ),
        ("unknown key", stranger.token(&claims("memory"))),
        ("alg none", none),
        ("HS256 with the public key", confused),
        ("garbage", "abc.def".into()),
    ];
    for (name, token) in cases {
        let resp = with_token(
            &anon,
            Some(&token),
            &call("memory.query", json!({"query": "x"})),
        )
        .await;
        assert_eq!(resp.status, 401, "{name}: {:?}", resp.body);
        let c = the_challenge(&resp);
        assert_eq!(c.param("error"), Some("invalid_token"), "{name}");
        assert!(c.param("resource_metadata").is_some(), "{name}");
        assert_eq!(
            resp.json()["error"]["data"]["code"],
            "UNAUTHORIZED",
            "{name}"
        );
    }
    // A token in the query string is not a token (OAuth 2.1 forbids it).
    let token = issuer.token(&claims("memory"));
    let q = anon
        .post_json(
            &format!("/mcp?access_token={token}"),
            &[
                ("mcp-protocol-version", common::mcp::MODERN),
                ("mcp-method", "tools/list"),
            ],
            &modern_body(1, "tools/list", json!({})),
        )
        .await
        .unwrap();
    assert_eq!(q.status, 401);
    assert!(env.app.received().is_empty(), "nothing reached the app");
    // A certificate the peer store does not know is refused as before, token or not: a
    // connection with a certificate is a peer's, never a bearer's.
    let stranger_tls = env.tls_client(&r, Some(&env.pki.stranger), false);
    let s = with_token(
        &stranger_tls,
        Some(&token),
        &call("memory.query", json!({"query": "x"})),
    )
    .await;
    assert!(matches!(s.status.as_u16(), 401 | 403), "{:?}", s.body);
    assert!(s.headers.get("www-authenticate").is_none());
    assert!(env.app.received().is_empty(), "nothing reached the app");
    r.shutdown().await;
}

#[tokio::test]
async fn the_python_sdk_oauth_client_gets_a_token_and_steps_up_its_scope() {
    sdk_client_in("2026-07-28").await;
}

#[tokio::test]
async fn the_python_sdk_oauth_client_steps_up_in_a_handshake_session_too() {
    sdk_client_in("legacy").await;
}

/// The SDK's OAuth client in `mode`: the 401 and the metadata lead it to the authorization
/// server, and the 403 of a call its scope does not allow to a wider token.
async fn sdk_client_in(mode: &str) {
    let env = Env::new().await;
    let mut server = tokio::process::Command::new("python3")
        .arg(interop("oauth_test_server.py"))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    let stdout = server.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let issuer = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .expect("the authorization server starts")
        .unwrap()
        .unwrap();
    let port = common::free_port();
    let resource = format!("https://127.0.0.1:{port}/mcp");
    let oauth = format!(
        r#"    resource: "{resource}"
    issuer: "{issuer}"
    jwks_url: "{issuer}/jwks"
    scopes:
      memory: ["tool.call:memory.*"]
      "memory:read": ["tool.call:memory.query"]
    challenge_scope: "memory:read""#
    );
    let yaml = oauth_yaml(&env, &oauth).replace(
        "127.0.0.1:0\"\n    tls",
        &format!("127.0.0.1:{port}\"\n    tls"),
    );
    assert!(yaml.contains(&format!("127.0.0.1:{port}")), "{yaml}");
    let r = env.start(&yaml).await;
    let ca = env.path().join("ca.pem");
    let mut cmd = std::process::Command::new("timeout");
    cmd.args(["60", "python3", "-W", "ignore"])
        .arg(interop("mcp_oauth_client.py"))
        .args(["--url", &resource, "--mode", mode, "--ca"])
        .arg(&ca);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    let era = seen["protocol_version"].as_str().unwrap_or_default();
    assert_eq!(era == "2026-07-28", mode == "2026-07-28", "{seen}");
    // First the scope of the 401, then the one the 403 named, for this resource.
    assert_eq!(seen["asked"][0]["scope"], "memory:read", "{seen}");
    assert_eq!(seen["asked"][0]["resource"], resource.as_str());
    let second = seen["asked"][1]["scope"].as_str().unwrap_or_default();
    assert!(second.split(' ').any(|s| s == "memory"), "{seen}");
    assert_eq!(seen["tools"], json!(["memory.query"]));
    assert_eq!(seen["query"]["is_error"], false);
    assert_eq!(seen["append"]["is_error"], false, "{seen}");
    let received = env.app.received();
    assert_eq!(received.len(), 2, "query and append reached the app");
    assert!(received
        .iter()
        .all(|c| c.headers.get("authorization").is_none()));
    assert!(received.iter().all(|c| c.headers["x-carapace-peer-id"]
        .to_str()
        .unwrap()
        .starts_with("oauth:user-client-")));
    r.shutdown().await;
}
