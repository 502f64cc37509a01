//! Demo steps 12 and 13: remote callers without a client certificate. An MCP front takes
//! OAuth bearer tokens (from an issuer whose JWKS the demo writes), and a tools-v1 front takes
//! RFC 9421 signed requests.

use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use serde_json::{json, Value};

use super::start;
use crate::client::{tls_config, Client, Reply, Transport};
use crate::pki::Authority;

const RESOURCE: &str = "https://tools.demo/mcp";
const ISSUER: &str = "https://auth.demo";

/// An ES256 issuer: its JWKS and a way to mint tokens.
struct Issuer {
    key: jsonwebtoken::EncodingKey,
    jwks: Value,
}

impl Issuer {
    fn new() -> Result<Self, String> {
        use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING as ALG};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ALG, &rng).map_err(|e| e.to_string())?;
        let pair =
            EcdsaKeyPair::from_pkcs8(&ALG, pkcs8.as_ref(), &rng).map_err(|e| e.to_string())?;
        let p = pair.public_key().as_ref();
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        Ok(Issuer {
            key: jsonwebtoken::EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwks: json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "demo", "use": "sig",
                "x": b64(&p[1..33]), "y": b64(&p[33..65])}]}),
        })
    }

    fn token(&self, scope: &str) -> Result<String, String> {
        let now = carapace_filters::unix_now_ms() / 1000;
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some("demo".into());
        let claims = json!({"iss": ISSUER, "aud": RESOURCE, "sub": "demo-user", "scope": scope,
            "iat": now, "exp": now + 300});
        jsonwebtoken::encode(&header, &claims, &self.key).map_err(|e| e.to_string())
    }
}

async fn mcp_call(client: &Client, token: &str, tool: &str, args: Value) -> Result<Reply, String> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": tool, "arguments": args, "_meta": {
            "io.modelcontextprotocol/protocolVersion": crate::mcp::MODERN_VERSION,
            "io.modelcontextprotocol/clientCapabilities": {}}}});
    let auth = format!("Bearer {token}");
    let mut headers = vec![
        ("mcp-protocol-version", crate::mcp::MODERN_VERSION),
        ("mcp-method", "tools/call"),
        ("mcp-name", tool),
    ];
    if !token.is_empty() {
        headers.push(("authorization", auth.as_str()));
    }
    client.post_json("/mcp", &headers, &body).await
}

fn challenge(r: &Reply) -> String {
    r.headers
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// carapace in `dir/<name>` with `front` (YAML lines), on a TLS listener that asks for no
/// client certificate, in front of the sample app; and a client without one.
async fn without_certificates(
    dir: &Path,
    name: &str,
    front: &str,
    app_addr: &str,
    ca: &Authority,
) -> Result<(crate::server::Running, Client), String> {
    let running = start(
        &dir.join(name),
        &format!(
            r#"
state_dir: {dir}/{name}
front:
{front}
listeners:
  tcp:
    address: "127.0.0.1:0"
    tls: {{ cert_file: {dir}/server.crt, key_file: {dir}/server.key }}
app: {{ protocol: tools-v1, address: "http://{app_addr}" }}
ops: {{ address: "" }}
"#,
            dir = dir.display()
        ),
    )
    .await?;
    let client = Client::new(Transport::Tls {
        address: running.tcp_address.ok_or("no tcp address")?,
        config: tls_config(&ca.cert_pem(), None, false),
    });
    Ok((running, client))
}

/// 12: OAuth 2.1 bearer tokens on an MCP front.
pub(super) async fn oauth_step(dir: &Path, app_addr: &str, ca: &Authority) -> Result<(), String> {
    let issuer = Issuer::new()?;
    std::fs::write(dir.join("issuer-jwks.json"), issuer.jwks.to_string())
        .map_err(|e| e.to_string())?;
    let front = format!(
        r#"  protocol: mcp
  oauth:
    resource: "{RESOURCE}"
    issuer: "{ISSUER}"
    jwks_file: {dir}/issuer-jwks.json
    scopes: {{ memory: ["tool.call:memory.*"], "memory:read": ["tool.call:memory.query"] }}
    challenge_scope: "memory:read""#,
        dir = dir.display()
    );
    let (running, client) = without_certificates(dir, "oauth", &front, app_addr, ca).await?;
    let none = mcp_call(&client, "", "memory.query", json!({"query": "cat"})).await?;
    let read = issuer.token("memory:read")?;
    let query = mcp_call(&client, &read, "memory.query", json!({"query": "cat"})).await?;
    let short = mcp_call(&client, &read, "memory.append", json!({"text": "t"})).await?;
    let wide = mcp_call(
        &client,
        &issuer.token("memory")?,
        "memory.append",
        json!({"text": "t"}),
    )
    .await?;
    if none.status != 401 || query.status != 200 || short.status != 403 || wide.status != 200 {
        return Err(format!(
            "OAuth: no token {}, read token {}, short scope {}, wide scope {}",
            none.status, query.status, short.status, wide.status
        ));
    }
    println!(
        "12. OAuth         no token -> HTTP 401 WWW-Authenticate: {}",
        challenge(&none)
    );
    println!(
        "                  scope memory:read -> memory.query HTTP {}; memory.append -> HTTP 403 {}; scope memory -> HTTP {}",
        query.status.as_u16(),
        challenge(&short),
        wide.status.as_u16()
    );
    running.shutdown().await;
    Ok(())
}

/// The demo caller's shared key.
struct DemoKey(Arc<[u8]>);

impl carapace_filters::http_signature::MessageSigner for DemoKey {
    fn keyid(&self) -> &str {
        "demo-key"
    }
    fn alg(&self) -> &'static str {
        "hmac-sha256"
    }
    fn sign(&self, base: &[u8]) -> Vec<u8> {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.0);
        ring::hmac::sign(&key, base).as_ref().to_vec()
    }
}

/// `body` to `/v1/tools/call`, signed with `key` and `nonce`; the headers to send.
fn signed_headers(key: &DemoKey, body: &[u8], nonce: &str) -> Vec<(String, String)> {
    let mut req = http::Request::post("http://localhost/v1/tools/call")
        .body(())
        .expect("static request");
    carapace_filters::http_signature::sign_request(
        &mut req,
        body,
        "https",
        key,
        carapace_filters::unix_now_ms() / 1000,
        nonce,
    );
    req.headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_owned()))
        .collect()
}

async fn send_signed(
    client: &Client,
    body: &[u8],
    headers: &[(String, String)],
) -> Result<Reply, String> {
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    client
        .send(http::Method::POST, "/v1/tools/call", &h, body.to_vec())
        .await
}

/// 13: RFC 9421 signatures on a tools-v1 front.
pub(super) async fn signature_step(
    dir: &Path,
    app_addr: &str,
    ca: &Authority,
) -> Result<(), String> {
    let secret = "a demo key shared with one caller, 32+ bytes";
    std::fs::write(dir.join("demo-key.secret"), secret).map_err(|e| e.to_string())?;
    let front = format!(
        "  protocol: tools-v1\n  answers: http_status\n  auth: {{ mode: http_signature, keys: [{{ id: demo-key, secret: {{ file: {}/demo-key.secret }} }}] }}",
        dir.display()
    );
    let (running, client) = without_certificates(dir, "signed", &front, app_addr, ca).await?;
    let key = DemoKey(Arc::from(secret.as_bytes()));
    let body = json!({"version": "v1", "call_id": "c-13", "tool_name": "memory.query",
        "tenant_id": "home", "args": {"query": "cat"},
        "context": {"agent_id": "demo", "session_id": "s-13"}})
    .to_string();
    let headers = signed_headers(
        &key,
        body.as_bytes(),
        &hex::encode(rand::random::<[u8; 16]>()),
    );
    let ok = send_signed(&client, body.as_bytes(), &headers).await?;
    let replay = send_signed(&client, body.as_bytes(), &headers).await?;
    let tampered_body = body.replace("cat", "dog");
    let fresh = signed_headers(
        &key,
        body.as_bytes(),
        &hex::encode(rand::random::<[u8; 16]>()),
    );
    let tampered = send_signed(&client, tampered_body.as_bytes(), &fresh).await?;
    let reason = |r: &Reply| {
        r.json()["error"]["details"]["reason"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    if ok.json()["status"] != "ok" || replay.status != 401 || tampered.status != 401 {
        return Err(format!(
            "signatures: signed {} {}, replayed {}, tampered {}",
            ok.status,
            String::from_utf8_lossy(&ok.body),
            replay.status,
            tampered.status
        ));
    }
    println!(
        "13. RFC 9421      signed POST (@method @target-uri content-digest, keyid=demo-key) -> {}; replayed -> HTTP 401 {}; body changed -> HTTP 401 {}",
        ok.json()["status"],
        reason(&replay),
        reason(&tampered)
    );
    running.shutdown().await;
    Ok(())
}
