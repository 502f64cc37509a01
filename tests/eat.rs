//! EAT: the signed tool catalog a tool host publishes (`front.eat`), checked by carapace's own
//! validator and by an independent verifier (PyJWT + rfc8785).

mod common;

use carapace::client::Reply;
use carapace::eat::names;
use carapace::server::Running;
use common::Env;
use http::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::Digest;

/// The memory app behind an MCP front publishing its catalog at `https://localhost:<port>`;
/// the gateway may call every tool, `reader` (the `stranger` certificate) all but
/// `memory.append` and `memory.delete`.
async fn host() -> (Env, Running, u16) {
    let env = Env::new().await;
    let port = common::free_port();
    let peers = json!({"version": 1, "peers": [
        {"component_type": "gateway", "component_id": "gw_test", "role": "gateway",
         "mtls_cert_fingerprint": env.pki.gateway.fingerprint, "status": "active"},
        {"component_type": "gateway", "component_id": "reader", "role": "gateway",
         "mtls_cert_fingerprint": env.pki.stranger.fingerprint, "status": "active",
         "policy": {"deny": ["tool.call:memory.append", "tool.call:memory.delete"]}},
    ]});
    std::fs::write(env.path().join("peers.json"), peers.to_string()).unwrap();
    let eat = format!(
        r#"front:
  protocol: mcp
  eat:
    base_url: "https://localhost:{port}"
    title: Memory
    tools:
      memory.query:
        capabilities: [memory, read-only]
        examples: [{{ description: "Find notes", input: {{ query: "notes" }} }}]"#
    );
    let yaml = env
        .tools_yaml("")
        .replace("front: { protocol: tools-v1 }", &eat)
        .replace(
            "tcp:\n    address: \"127.0.0.1:0\"",
            &format!("tcp:\n    address: \"127.0.0.1:{port}\""),
        );
    let r = env.start(&yaml).await;
    (env, r, port)
}

async fn get(env: &Env, r: &Running, who: &carapace::pki::Issued, path: &str) -> Reply {
    env.tls_client(r, Some(who), false)
        .send(Method::GET, path, &[], "")
        .await
        .unwrap()
}

fn b64_json(part: &str) -> Value {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn sha256_tag(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

#[tokio::test]
async fn the_catalog_is_canonical_valid_signed_and_lists_what_the_caller_may_call() {
    let (env, r, port) = host().await;
    let reply = get(&env, &r, &env.pki.gateway, "/.well-known/api-catalog").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["content-type"], "application/json");
    let catalog = carapace::eat::validate::validate(&reply.body).expect("valid EAT catalog");
    let canonical = carapace_filters::canonical::jcs_string(&catalog).unwrap();
    assert_eq!(
        canonical.as_bytes(),
        &reply.body[..],
        "served in its JCS form"
    );
    let names: Vec<&str> = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["memory-2eappend", "memory-2edelete", "memory-2equery"]
    );
    let origin = format!("https://localhost:{port}");
    let query = &catalog["tools"][2];
    assert_eq!(query["x-mcp-tool"]["server_url"], format!("{origin}/mcp"));
    assert_eq!(
        query["x-mcp-tool"]["capabilities"],
        json!(["memory", "read-only"])
    );
    assert_eq!(
        query["x-mcp-tool"]["examples"][0]["input"],
        json!({"query": "notes"})
    );
    assert_eq!(
        catalog["metadata"]["publisher"],
        format!("did:web:localhost%3A{port}")
    );

    // The signature: RS256, the issuer's did:web, this body's hash, a bounded life.
    let jws = reply.headers["x-jws-signature"].to_str().unwrap();
    let parts: Vec<&str> = jws.split('.').collect();
    assert_eq!(parts.len(), 3);
    let header = b64_json(parts[0]);
    assert_eq!(header["alg"], "RS256");
    assert_eq!(header["typ"], "JWS");
    let payload = b64_json(parts[1]);
    assert_eq!(payload["iss"], format!("did:web:localhost%3A{port}"));
    assert_eq!(payload["catalog_hash"], sha256_tag(&reply.body));
    let (iat, exp) = (
        payload["iat"].as_u64().unwrap(),
        payload["exp"].as_u64().unwrap(),
    );
    assert_eq!(exp - iat, 3600);
    assert_eq!(reply.headers["cache-control"], "private, max-age=300");

    // Each OpenAPI document hashes to its spec_hash and names the tool by its own name.
    for tool in catalog["tools"].as_array().unwrap() {
        let url = tool["spec_url"].as_str().unwrap();
        let path = url.strip_prefix(&origin).expect("same origin");
        let spec = get(&env, &r, &env.pki.gateway, path).await;
        assert_eq!(spec.status, StatusCode::OK, "{path}");
        assert_eq!(sha256_tag(&spec.body), tool["spec_hash"]);
        let doc = spec.json();
        assert_eq!(doc["openapi"], "3.1.0");
        let op = &doc["paths"][format!("/tools/{}", tool["name"].as_str().unwrap())]["post"];
        let real = names::decode(tool["name"].as_str().unwrap()).unwrap();
        assert_eq!(op["operationId"], real.as_str());
        assert_eq!(
            op["requestBody"]["content"]["application/json"]["schema"]["type"],
            "object"
        );
        assert_eq!(op["x-mcp-tool"], tool["x-mcp-tool"]);
    }

    // The same catalog again: the same signature; with its ETag, 304 and no body.
    let again = get(&env, &r, &env.pki.gateway, "/.well-known/api-catalog").await;
    assert_eq!(again.headers["x-jws-signature"], jws);
    let etag = again.headers["etag"].to_str().unwrap().to_owned();
    let cached = env
        .tls_client(&r, Some(&env.pki.gateway), false)
        .send(
            Method::GET,
            "/.well-known/api-catalog",
            &[("if-none-match", &etag)],
            "",
        )
        .await
        .unwrap();
    assert_eq!(cached.status, StatusCode::NOT_MODIFIED);
    assert!(cached.body.is_empty());
    assert_eq!(cached.headers["etag"], etag.as_str());

    // A caller with fewer permissions sees fewer tools, under another signature, and cannot
    // fetch the document of a tool it may not call.
    let reader = get(&env, &r, &env.pki.stranger, "/.well-known/api-catalog").await;
    let theirs = carapace::eat::validate::validate(&reader.body).unwrap();
    assert_eq!(theirs["tools"].as_array().unwrap().len(), 1);
    assert_eq!(theirs["tools"][0]["name"], "memory-2equery");
    assert_ne!(reader.headers["x-jws-signature"], jws);
    let hidden = get(
        &env,
        &r,
        &env.pki.stranger,
        "/.well-known/api-catalog/tools/memory-2eappend/openapi.json",
    )
    .await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_keys_are_public_and_the_catalog_is_not() {
    let (env, r, port) = host().await;
    let outsider = env.pki.ca.client("outsider");
    let refused = get(&env, &r, &outsider, "/.well-known/api-catalog").await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "not paired");
    assert!(refused.headers.get("x-jws-signature").is_none());

    let jwks = get(&env, &r, &outsider, "/.well-known/jwks.json").await;
    assert_eq!(jwks.status, StatusCode::OK);
    let key = &jwks.json()["keys"][0];
    assert_eq!(key["kty"], "RSA");
    assert_eq!(key["alg"], "RS256");
    assert!(key.get("d").is_none(), "no private part");
    let did = get(&env, &r, &outsider, "/.well-known/did.json")
        .await
        .json();
    let id = format!("did:web:localhost%3A{port}");
    assert_eq!(did["id"], id.as_str());
    assert_eq!(did["verificationMethod"][0]["publicKeyJwk"], *key);
    assert_eq!(
        did["verificationMethod"][0]["id"],
        format!("{id}#{}", key["kid"].as_str().unwrap())
    );
    assert!(get(&env, &r, &outsider, "/.well-known/did.json")
        .await
        .headers["cache-control"]
        .to_str()
        .unwrap()
        .starts_with("public"));

    let post = env
        .tls_client(&r, Some(&env.pki.gateway), false)
        .send(Method::POST, "/.well-known/api-catalog", &[], "{}")
        .await
        .unwrap();
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn an_independent_verifier_accepts_the_catalog_its_signature_and_its_specs() {
    let (env, r, port) = host().await;
    let d = env.path();
    std::fs::write(d.join("gw.crt"), &env.pki.gateway.cert_pem).unwrap();
    std::fs::write(d.join("gw.key"), &env.pki.gateway.key_pem).unwrap();
    let url = format!("https://localhost:{port}/.well-known/api-catalog");
    let script = common::mcp::interop("eat_verify.py");
    let args: Vec<String> = vec![
        "60".into(),
        "python3".into(),
        script.display().to_string(),
        url,
        "--ca".into(),
        d.join("ca.pem").display().to_string(),
        "--cert".into(),
        d.join("gw.crt").display().to_string(),
        "--key".into(),
        d.join("gw.key").display().to_string(),
    ];
    let out = tokio::process::Command::new("timeout")
        .args(&args)
        .output()
        .await
        .expect("python3 runs");
    let found: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "verifier said: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(found["verified"], true, "{found}");
    assert_eq!(found["served_canonical"], true);
    assert_eq!(found["tools"]["memory-2equery"], "memory.query");
    assert_eq!(
        found["server_urls"],
        json!([format!("https://localhost:{port}/mcp")])
    );
    drop(r);
}

/// A gateway whose outbound role takes the tools tagged `memory` from the catalog at
/// `https://localhost:<port>`, presenting the paired gateway's certificate; its agent socket.
async fn gateway(env: &Env, port: u16) -> (Running, std::path::PathBuf) {
    gateway_at(env, &format!("localhost:{port}")).await
}

/// The same, with the catalog at `https://<authority>`.
async fn gateway_at(env: &Env, authority: &str) -> (Running, std::path::PathBuf) {
    let d = env.path();
    let g = d.join("gw");
    std::fs::create_dir_all(&g).unwrap();
    std::fs::write(d.join("gw.crt"), &env.pki.gateway.cert_pem).unwrap();
    std::fs::write(d.join("gw.key"), &env.pki.gateway.key_pem).unwrap();
    let yaml = format!(
        r#"
state_dir: {g}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {g}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
ops: {{ address: "" }}
gateway: {{ id: gw_home }}
outbound:
  socket: {g}/outbound.sock
  peers: {{}}
  eat:
    memory-east:
      url: "https://{authority}/.well-known/api-catalog"
      capabilities: [memory]
      ca_file: {d}/ca.pem
      cert_file: {d}/gw.crt
      key_file: {d}/gw.key
"#,
        g = g.display(),
        d = d.display(),
        app = env.app_addr,
    );
    std::fs::write(g.join("carapace.yaml"), yaml).unwrap();
    let gw = carapace::server::start(carapace::config::load(&g.join("carapace.yaml")).unwrap())
        .await
        .unwrap();
    (gw, g.join("outbound.sock"))
}

async fn agent_tools(socket: &std::path::Path) -> Vec<String> {
    let agent = carapace::client::Client::new(carapace::client::Transport::Unix(socket.into()));
    let list = agent.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
    list.json()["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_gateway_verifies_the_catalog_and_calls_the_tool_through_the_hosts_mcp_front() {
    let (env, _host, port) = host().await;
    let (_gw, socket) = gateway(&env, port).await;
    for _ in 0..200 {
        if !agent_tools(&socket).await.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Only the tool tagged `memory`, under its own name.
    assert_eq!(agent_tools(&socket).await, ["memory.query"]);

    let app = carapace::client::Client::new(carapace::client::Transport::Tcp(env.app_addr));
    let stored = app
        .post_json(
            "/v1/tools/call",
            &[],
            &common::call("memory.append", json!({"text": "remember the catalog"})),
        )
        .await
        .unwrap();
    assert_eq!(stored.json()["status"], "ok");
    let agent = carapace::client::Client::new(carapace::client::Transport::Unix(socket.clone()));
    let answer = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &common::call("memory.query", json!({"query": "catalog"})),
        )
        .await
        .unwrap();
    let doc = answer.json();
    assert_eq!(doc["status"], "ok", "{doc}");
    assert_eq!(doc["result"]["matches"][0]["text"], "remember the catalog");
    // It reached the app through the tool host's MCP front, as the paired gateway.
    let seen = env.app.received();
    let last = seen.last().unwrap();
    assert_eq!(last.tool, "memory.query");
    assert_eq!(last.headers["x-carapace-peer-id"], "gw_test");

    // Input the verified input schema refuses never leaves the gateway.
    let before = env.app.received().len();
    let bad = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &common::call("memory.query", json!({"query": 5})),
        )
        .await
        .unwrap();
    assert_eq!(common::code(&bad), "INVALID_ARGS");
    assert_eq!(env.app.received().len(), before);
}

#[tokio::test]
async fn a_catalog_signed_for_another_host_registers_nothing() {
    let (env, _host, port) = host().await;
    // The same documents reached as 127.0.0.1: the issuer, did:web:localhost%3A<port>, is
    // not the catalog's host.
    let (gw, socket) = gateway_at(&env, &format!("127.0.0.1:{port}")).await;
    let outbound = gw.shared.outbound.get().unwrap().clone();
    common::wait_until(|| outbound.catalog.discovered()).await;
    assert!(agent_tools(&socket).await.is_empty());
    assert_eq!(
        outbound.eat_refusal("memory-east").map(|e| e.reason()),
        Some("issuer_mismatch")
    );
    let before = env.app.received().len();
    let agent = carapace::client::Client::new(carapace::client::Transport::Unix(socket));
    let answer = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &common::call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(common::code(&answer), "TOOL_NOT_FOUND");
    assert_eq!(env.app.received().len(), before);
}
