//! The caller-tool relay: a caller declares tools on a stream it holds open; agents call them
//! through the fronts; the caller answers on `/v1/caller-tools/response`. Each scenario of the
//! relay's text (REQ-CTR-001 to 004) is a test here.

mod common;

use std::time::Duration;

use bytes::Bytes;
use carapace::client::{tls_config, Client, Transport};
use carapace::server::Running;
use common::{call, code, Env};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

/// A caller's open stream, read event by event.
struct Stream {
    body: hyper::body::Incoming,
    buffered: String,
    stream_id: String,
    tools: Vec<String>,
    _conn: tokio::task::JoinHandle<()>,
}

impl Stream {
    /// The next `data:` event (keep-alive comments skipped), within 5 s.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffered.find("\n\n") {
                let block: String = self.buffered.drain(..end + 2).collect();
                if let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) {
                    return Some(serde_json::from_str(data).unwrap());
                }
                continue;
            }
            let frame = tokio::time::timeout(Duration::from_secs(5), self.body.frame())
                .await
                .expect("an event within 5 s")?;
            if let Ok(data) = frame.unwrap().into_data() {
                self.buffered.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }

    /// Whether nothing but keep-alives arrives for `wait`.
    async fn quiet_for(&mut self, wait: Duration) -> bool {
        tokio::time::timeout(wait, self.next()).await.is_err()
    }
}

enum Via<'a> {
    Socket(&'a Running),
    Tls(&'a Env, &'a Running, &'a carapace::pki::Issued),
}

/// Open a stream declaring `body`; the answer's status and, when 200, the stream.
async fn open(via: Via<'_>, body: Value) -> Result<Stream, (StatusCode, Value)> {
    let (sender, conn) = match via {
        Via::Socket(r) => {
            let io = tokio::net::UnixStream::connect(r.unix_path.clone().unwrap())
                .await
                .unwrap();
            let (s, c) = hyper::client::conn::http1::handshake(TokioIo::new(io))
                .await
                .unwrap();
            (
                s,
                tokio::spawn(async move {
                    let _ = c.await;
                }),
            )
        }
        Via::Tls(env, r, who) => {
            let tcp = tokio::net::TcpStream::connect(r.tcp_address.unwrap())
                .await
                .unwrap();
            let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            let tls = tokio_rustls::TlsConnector::from(tls_config(
                &env.pki.ca.cert_pem(),
                Some(who),
                false,
            ))
            .connect(name, tcp)
            .await
            .unwrap();
            let (s, c) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .unwrap();
            (
                s,
                tokio::spawn(async move {
                    let _ = c.await;
                }),
            )
        }
    };
    let mut sender = sender;
    let req = Request::post("/v1/caller-tools")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status();
    let sse = resp
        .headers()
        .get("content-type")
        .is_some_and(|c| c == "text/event-stream");
    if status != StatusCode::OK || !sse {
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        return Err((status, serde_json::from_slice(&body).unwrap_or(Value::Null)));
    }
    let mut s = Stream {
        body: resp.into_body(),
        buffered: String::new(),
        stream_id: String::new(),
        tools: vec![],
        _conn: conn,
    };
    let first = s.next().await.unwrap();
    assert_eq!(first["type"], "caller_tools_registered");
    s.stream_id = first["stream_id"].as_str().unwrap().to_owned();
    s.tools = serde_json::from_value(first["tools"].clone()).unwrap();
    // Kept alive: the sender lives as long as the connection task holds it.
    std::mem::forget(sender);
    Ok(s)
}

/// `myapp` on the local socket, declaring [`notification_tools`].
async fn myapp(r: &Running) -> Stream {
    open(
        Via::Socket(r),
        json!({"caller_id": "myapp", "tools": notification_tools()}),
    )
    .await
    .unwrap()
}

fn notification_tools() -> Value {
    json!([
        {"name": "send_notification", "description": "Send notification",
         "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}},
                         "required": ["message"]}},
        {"name": "slow_tool", "description": "Never answers"},
    ])
}

/// A tools-v1 front over the memory app with the relay on; the gateway and `other` (the
/// stranger's certificate) are paired.
async fn relay_host(extra: &str) -> (Env, Running) {
    let env = Env::new().await;
    common::write_peers(
        &env.path().join("peers.json"),
        &[
            (&env.pki.gateway.fingerprint, "gw_test", "active"),
            (&env.pki.stranger.fingerprint, "other", "active"),
        ],
    );
    let yaml = env.tools_yaml(&format!("caller_tools: {{ keepalive_s: 1{extra} }}"));
    let r = env.start(&yaml).await;
    (env, r)
}

async fn respond(client: &Client, body: Value) -> carapace::client::Reply {
    client
        .post_json("/v1/caller-tools/response", &[], &body)
        .await
        .unwrap()
}

/// An agent's call, run in the background.
fn agent_call(
    r: &Running,
    tool: &str,
    args: Value,
) -> tokio::task::JoinHandle<carapace::client::Reply> {
    let agent = Client::new(Transport::Unix(r.unix_path.clone().unwrap()));
    let body = call(tool, args);
    tokio::spawn(async move { agent.post_json("/v1/tools/call", &[], &body).await.unwrap() })
}

async fn listed(r: &Running) -> Vec<Value> {
    let agent = Client::new(Transport::Unix(r.unix_path.clone().unwrap()));
    let list = agent.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
    list.json()["tools"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn req_ctr_001_an_agent_calls_a_caller_tool_and_gets_its_result() {
    let (_env, r) = relay_host("").await;
    let mut caller = myapp(&r).await;
    assert_eq!(caller.tools, ["myapp_send_notification", "myapp_slow_tool"]);

    let pending = agent_call(&r, "myapp_send_notification", json!({"message": "hello"}));
    let request = caller.next().await.unwrap();
    assert_eq!(request["type"], "caller_tool_request");
    assert_eq!(request["tool"], "send_notification");
    assert_eq!(request["arguments"], json!({"message": "hello"}));
    let request_id = request["request_id"].as_str().unwrap();
    assert_eq!(request_id.len(), 32, "128 random bits, hex");

    let local = Client::new(Transport::Unix(r.unix_path.clone().unwrap()));
    let ok = respond(
        &local,
        json!({"stream_id": caller.stream_id, "request_id": request_id,
               "result": {"status": "sent"}}),
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.json());
    let answer = pending.await.unwrap().json();
    assert_eq!(answer["status"], "ok", "{answer}");
    assert_eq!(answer["result"], json!({"status": "sent"}));

    // Finished: the same request_id again is refused.
    let again = respond(
        &local,
        json!({"stream_id": caller.stream_id, "request_id": request_id, "result": {}}),
    )
    .await;
    assert_eq!(code(&again), "INVALID_ARGS");
}

#[tokio::test]
async fn req_ctr_002_declared_tools_are_listed_with_their_input_schema_and_enforced() {
    let (_env, r) = relay_host("").await;
    let mut caller = myapp(&r).await;
    let tools = listed(&r).await;
    let t = tools
        .iter()
        .find(|t| t["name"] == "myapp_send_notification")
        .expect("listed");
    assert_eq!(t["input_schema"]["properties"]["message"]["type"], "string");
    assert!(
        tools.iter().any(|t| t["name"] == "memory.query"),
        "the app's stay"
    );

    // Arguments the declared schema refuses are never emitted.
    let refused = agent_call(&r, "myapp_send_notification", json!({"message": 5}))
        .await
        .unwrap();
    assert_eq!(code(&refused), "INVALID_ARGS");
    assert!(caller.quiet_for(Duration::from_millis(300)).await);
}

#[tokio::test]
async fn req_ctr_003_and_004_an_error_answer_reaches_the_agent_as_the_tools_error() {
    let (_env, r) = relay_host("").await;
    let mut caller = myapp(&r).await;
    let pending = agent_call(&r, "myapp_send_notification", json!({"message": "hi"}));
    let request = caller.next().await.unwrap();
    let local = Client::new(Transport::Unix(r.unix_path.clone().unwrap()));
    let ok = respond(
        &local,
        json!({"stream_id": caller.stream_id, "request_id": request["request_id"],
               "error": "recipient not found"}),
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
    let answer = pending.await.unwrap().json();
    assert_eq!(answer["status"], "error", "{answer}");
    assert_eq!(answer["error"]["code"], "TOOL_ERROR");
    assert_eq!(answer["error"]["message"], "recipient not found");
}

#[tokio::test]
async fn req_ctr_001_a_caller_that_disconnects_fails_its_pending_calls_at_once() {
    let (_env, r) = relay_host("").await;
    let mut caller = myapp(&r).await;
    let pending = agent_call(&r, "myapp_slow_tool", json!({}));
    caller.next().await.unwrap();
    let started = std::time::Instant::now();
    drop(caller);
    let answer = pending.await.unwrap();
    assert_eq!(code(&answer), "DEPENDENCY_UNAVAILABLE", "{}", answer.json());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "not waiting for the timeout"
    );
    // Withdrawn, and back when the caller reconnects.
    for _ in 0..100 {
        if !listed(&r)
            .await
            .iter()
            .any(|t| t["name"] == "myapp_slow_tool")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!listed(&r)
        .await
        .iter()
        .any(|t| t["name"] == "myapp_slow_tool"));
    let _again = myapp(&r).await;
    assert!(listed(&r)
        .await
        .iter()
        .any(|t| t["name"] == "myapp_slow_tool"));
}

#[tokio::test]
async fn only_the_caller_holding_the_stream_answers_its_requests() {
    let (env, r) = relay_host("").await;
    // Over mTLS the caller id is the peer's component id.
    let mut caller = open(
        Via::Tls(&env, &r, &env.pki.gateway),
        json!({"tools": notification_tools()}),
    )
    .await
    .unwrap();
    assert_eq!(caller.tools[0], "gw_test_send_notification");
    let claimed = open(
        Via::Tls(&env, &r, &env.pki.stranger),
        json!({"caller_id": "gw_test", "tools": notification_tools()}),
    )
    .await
    .err()
    .expect("refused");
    assert_eq!(claimed.1["error"]["code"], "FORBIDDEN", "{}", claimed.1);

    let pending = agent_call(&r, "gw_test_send_notification", json!({"message": "m"}));
    let request = caller.next().await.unwrap();
    let other = env.tls_client(&r, Some(&env.pki.stranger), false);
    let foreign = respond(
        &other,
        json!({"stream_id": caller.stream_id, "request_id": request["request_id"],
               "result": {"status": "forged"}}),
    )
    .await;
    assert_eq!(code(&foreign), "FORBIDDEN");
    let gateway = env.gateway(&r);
    let unknown = respond(
        &gateway,
        json!({"stream_id": caller.stream_id, "request_id": "00".repeat(16), "result": {}}),
    )
    .await;
    assert_eq!(code(&unknown), "INVALID_ARGS");
    let ok = respond(
        &gateway,
        json!({"stream_id": caller.stream_id, "request_id": request["request_id"],
               "result": {"status": "sent"}}),
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(pending.await.unwrap().json()["result"]["status"], "sent");
}

#[tokio::test]
async fn limits_are_refused_each_with_its_code_and_nothing_is_lost() {
    let (_env, r) = relay_host(", max_tools_per_caller: 2, max_pending_per_caller: 1, max_argument_bytes: 200, max_result_bytes: 100").await;
    let three = json!([{"name": "a"}, {"name": "b"}, {"name": "c"}]);
    let (_, refused) = open(Via::Socket(&r), json!({"caller_id": "big", "tools": three}))
        .await
        .err()
        .expect("too many tools");
    assert_eq!(refused["error"]["code"], "INVALID_ARGS", "{refused}");
    let mut caller = myapp(&r).await;
    // Arguments over the limit are not emitted.
    let big = agent_call(
        &r,
        "myapp_send_notification",
        json!({"message": "x".repeat(300)}),
    )
    .await
    .unwrap();
    assert_eq!(code(&big), "INVALID_ARGS");
    // One pending call at most: the second is refused while the first waits.
    let first = agent_call(&r, "myapp_send_notification", json!({"message": "1"}));
    let request = caller.next().await.unwrap();
    let second = agent_call(&r, "myapp_send_notification", json!({"message": "2"}))
        .await
        .unwrap();
    assert_eq!(code(&second), "RATE_LIMITED");
    // A result over the limit: the responder is told, the agent gets an error, not a hang.
    let local = Client::new(Transport::Unix(r.unix_path.clone().unwrap()));
    let too_big = respond(
        &local,
        json!({"stream_id": caller.stream_id, "request_id": request["request_id"],
               "result": {"blob": "y".repeat(200)}}),
    )
    .await;
    assert_eq!(code(&too_big), "INVALID_ARGS", "{}", too_big.json());
    assert_eq!(
        too_big.json()["error"]["details"]["reason"],
        "payload_too_large"
    );
    assert_eq!(code(&first.await.unwrap()), "DEPENDENCY_UNAVAILABLE");
}

#[tokio::test]
async fn an_mcp_agent_calls_a_caller_tool_and_the_caller_answers_with_the_mcp_method() {
    let env = Env::new().await;
    let yaml = env
        .tools_yaml("caller_tools: { keepalive_s: 1 }")
        .replace("front: { protocol: tools-v1 }", "front: { protocol: mcp }");
    let r = env.start(&yaml).await;
    let mut caller = myapp(&r).await;
    // The official Python SDK as the agent: a good call, then arguments the schema refuses.
    let agent = {
        let sock = r.unix_path.clone().unwrap();
        tokio::spawn(async move {
            let script = common::mcp::interop("mcp_python_client.py");
            let out = tokio::process::Command::new("timeout")
                .args(["60", "python3", "-W", "ignore"])
                .arg(script)
                .arg("--uds")
                .arg(sock)
                .args([
                    "--tool",
                    "myapp_send_notification",
                    "--good",
                    r#"{"message": "hello"}"#,
                    "--bad",
                    r#"{"message": 5}"#,
                ])
                .output()
                .await
                .unwrap();
            serde_json::from_slice::<Value>(&out.stdout).unwrap_or_else(|_| {
                panic!(
                    "agent: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )
            })
        })
    };
    let request = caller.next().await.unwrap();
    assert_eq!(request["arguments"], json!({"message": "hello"}));
    let local = Client::new(Transport::Unix(r.unix_path.clone().unwrap()));
    let answered = common::mcp::modern(
        &local,
        &common::mcp::modern_body(
            7,
            "caller_tool_response",
            json!({"stream_id": caller.stream_id, "request_id": request["request_id"],
                   "result": {"status": "sent"}}),
        ),
    )
    .await
    .json();
    assert_eq!(answered["result"]["resultType"], "complete", "{answered}");
    assert!(answered.get("error").is_none());
    let seen = agent.await.unwrap();
    assert!(
        seen["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "myapp_send_notification"),
        "{seen}"
    );
    assert_eq!(seen["good"]["is_error"], false, "{seen}");
    assert_eq!(seen["good"]["structured"], json!({"status": "sent"}));
    assert_eq!(
        seen["bad"]["is_error"], true,
        "refused before the caller: {seen}"
    );
    assert!(caller.quiet_for(Duration::from_millis(300)).await);

    // An answer to an unknown request is an MCP error.
    let unknown = common::mcp::modern(
        &local,
        &common::mcp::modern_body(
            8,
            "caller_tool_response",
            json!({"stream_id": caller.stream_id, "request_id": "ab".repeat(16), "result": {}}),
        ),
    )
    .await
    .json();
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
}

#[tokio::test]
async fn req_ctr_005_the_socket_form_calls_a_caller_tool_and_waits_for_the_answer() {
    let (_env, r) = relay_host("").await;
    let mut caller = myapp(&r).await;
    let socket = Client::new(Transport::Unix(r.unix_path.clone().unwrap()));
    let pending = {
        let socket = socket.clone();
        tokio::spawn(async move {
            socket
                .post_json(
                    "/v1/caller-tool",
                    &[],
                    &json!({"method": "caller_tool",
                            "params": {"tool": "myapp_send_notification",
                                       "arguments": {"message": "x"}}}),
                )
                .await
                .unwrap()
        })
    };
    let request = caller.next().await.unwrap();
    assert_eq!(request["tool"], "send_notification");
    respond(
        &socket,
        json!({"stream_id": caller.stream_id, "request_id": request["request_id"],
               "result": {"status": "sent"}}),
    )
    .await;
    assert_eq!(
        pending.await.unwrap().json(),
        json!({"result": {"status": "sent"}})
    );
    // Through the call stage: bad arguments are refused in the same form.
    let bad = socket
        .post_json(
            "/v1/caller-tool",
            &[],
            &json!({"method": "caller_tool",
                    "params": {"tool": "myapp_send_notification", "arguments": {}}}),
        )
        .await
        .unwrap()
        .json();
    assert_eq!(bad["error"]["code"], "INVALID_ARGS", "{bad}");
}

// Faults: a caller that answers garbage, answers twice, or never reads its stream.

#[tokio::test]
async fn fault_a_caller_answering_garbage_is_refused_and_the_call_still_waits_for_a_real_answer() {
    let (_env, r) = relay_host("").await;
    let mut caller = myapp(&r).await;
    let pending = agent_call(&r, "myapp_send_notification", json!({"message": "m"}));
    let request = caller.next().await.unwrap();
    let id = request["request_id"].clone();
    let local = Client::new(Transport::Unix(r.unix_path.clone().unwrap()));
    for garbage in [
        json!("not an object"),
        json!({"stream_id": caller.stream_id, "request_id": id}),
        json!({"stream_id": caller.stream_id, "request_id": id, "result": {}, "error": "both"}),
        json!({"stream_id": caller.stream_id, "request_id": id, "result": {}, "extra": 1}),
        json!({"stream_id": 5, "request_id": id, "result": {}}),
    ] {
        let refused = respond(&local, garbage.clone()).await;
        assert_eq!(
            code(&refused),
            "INVALID_ARGS",
            "{garbage}: {}",
            refused.json()
        );
    }
    let raw = local
        .send(Method::POST, "/v1/caller-tools/response", &[], "{not json")
        .await
        .unwrap();
    assert_eq!(code(&raw), "INVALID_ARGS");
    assert!(!pending.is_finished(), "garbage does not end the call");
    let ok = respond(
        &local,
        json!({"stream_id": caller.stream_id, "request_id": id, "result": {"status": "sent"}}),
    )
    .await;
    assert_eq!(ok.json()["status"], "ok");
    // Twice: the second answer is refused and changes nothing.
    let twice = respond(
        &local,
        json!({"stream_id": caller.stream_id, "request_id": id, "error": "late"}),
    )
    .await;
    assert_eq!(code(&twice), "INVALID_ARGS");
    assert_eq!(pending.await.unwrap().json()["result"]["status"], "sent");
}

#[tokio::test]
async fn fault_a_caller_that_never_reads_its_stream_holds_nothing_forever() {
    let (_env, r) = relay_host(", max_pending_per_caller: 2").await;
    // The stream is opened and never read again.
    let _caller = myapp(&r).await;
    let slow = |ms: u64| {
        let agent = Client::new(Transport::Unix(r.unix_path.clone().unwrap()));
        let mut body = call("myapp_send_notification", json!({"message": "m"}));
        body["timeout_ms"] = json!(ms);
        tokio::spawn(async move { agent.post_json("/v1/tools/call", &[], &body).await.unwrap() })
    };
    let first = slow(400);
    let second = slow(400);
    let relay = r.shared.relay.clone().unwrap();
    common::wait_until(|| relay.pending("myapp") == 2).await;
    // Full: refused at once, not queued.
    let third = slow(400).await.unwrap();
    assert_eq!(code(&third), "RATE_LIMITED");
    assert_eq!(code(&first.await.unwrap()), "TIMEOUT");
    assert_eq!(code(&second.await.unwrap()), "TIMEOUT");
    // And the slots come back once they time out.
    let fourth = slow(200).await.unwrap();
    assert_eq!(code(&fourth), "TIMEOUT");
}

#[tokio::test]
async fn fault_an_answer_whose_body_never_arrives_is_cut_off_at_the_body_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = Env::new().await;
    let yaml = env.tools_yaml("caller_tools: {}\nlimits: { body_timeout_ms: 300 }");
    let r = env.start(&yaml).await;
    let mut io = tokio::net::UnixStream::connect(r.unix_path.clone().unwrap())
        .await
        .unwrap();
    io.write_all(
        b"POST /v1/caller-tools/response HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"stream_id\":",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        loop {
            let n = io.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
            if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "answered within the deadline, not held");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains(r#""reason":"body_timeout""#), "{text}");
}

/// On a skill-v1 front, where callers without a certificate are known only by the signature on
/// each `/run`, the relay's routes (which no signature covers) refuse such a caller: it would
/// register tools as `anonymous`, a principal every unsigned caller shares.
#[tokio::test]
async fn an_unsigned_caller_on_a_signed_front_registers_nothing() {
    let env = Env::new().await;
    let d = env.path().display();
    std::fs::write(env.path().join("k0"), "skill-secret").unwrap();
    let yaml = format!(
        r#"
state_dir: {d}/state
front: {{ protocol: skill-v1, skill_id: memory, auth: {{ mode: hmac, keys: [ {{ id: k0, secret: {{ file: {d}/k0 }} }} ] }} }}
listeners: {{ tcp: {{ address: "127.0.0.1:0" }} }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
ops: {{ address: "" }}
caller_tools: {{ keepalive_s: 1 }}
"#,
        app = env.app_addr,
    );
    let r = env.start(&yaml).await;
    let caller = Client::new(Transport::Tcp(r.tcp_address.unwrap()));
    let declaration = json!({"tools": [{"name": "read_file",
        "description": "Use this for every file read", "inputSchema": {"type": "object"}}]});
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        caller.post_json("/v1/caller-tools", &[], &declaration),
    )
    .await
    .expect("answered at once, not held open as a stream")
    .unwrap();
    assert_eq!(
        refused.status,
        StatusCode::UNAUTHORIZED,
        "{}",
        refused.json()
    );
    assert_eq!(code(&refused), "SKILL_AUTH_FAILED");
    let manifest = caller
        .send(Method::GET, "/manifest", &[], "")
        .await
        .unwrap()
        .json();
    assert!(
        !manifest.to_string().contains("read_file"),
        "nothing was registered: {manifest}"
    );
    r.shutdown().await;
}
