//! Connection limits under a caller that opens connections and sends nothing: idle and
//! unpaired connections never lock a paired peer out, and none lives long.

mod common;

use std::time::Duration;

use carapace::client::tls_config;
use carapace::pki::Issued;
use carapace::server::Running;
use common::{call, Env};
use rustls_pki_types::ServerName;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a test waits for carapace to close a connection it should close.
const CLOSE_WITHIN: Duration = Duration::from_secs(5);

/// A TLS connection to the tools listener as `who`, handshake done, nothing sent.
async fn tls_connect(
    env: &Env,
    r: &Running,
    who: &Issued,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let addr = r.tcp_address.unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let config = tls_config(&env.pki.ca.cert_pem(), Some(who), false);
    tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::from(addr.ip()), tcp)
        .await
        .unwrap()
}

/// An HTTP/2 connection to the tools listener as `who`, and the task driving it (which ends
/// when the connection does).
async fn h2_connect(
    env: &Env,
    r: &Running,
    who: &Issued,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let addr = r.tcp_address.unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let config = tls_config(&env.pki.ca.cert_pem(), Some(who), true);
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::from(addr.ip()), tcp)
        .await
        .unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    (send, tokio::spawn(conn))
}

/// Whether the peer closed the stream (EOF or reset) within `within`.
async fn closed_within<S: AsyncReadExt + Unpin>(s: &mut S, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

fn request_bytes() -> Vec<u8> {
    let body = call("memory.query", json!({"query": "x"})).to_string();
    format!(
        "POST /v1/tools/call HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn a_full_listener_of_idle_and_unpaired_connections_still_serves_a_paired_peer() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml(
            "limits: { max_connections: 8, max_connections_per_peer: 8, first_request_timeout_ms: 60000 }",
        ))
        .await;
    let addr = r.tcp_address.unwrap();
    // Every slot taken: silent TCP connections, and TLS connections with a certificate
    // from the right CA that is not paired, all sending nothing.
    let mut held_tcp = Vec::new();
    for _ in 0..4 {
        held_tcp.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut held_tls = Vec::new();
    for _ in 0..4 {
        held_tls.push(tls_connect(&env, &r, &env.pki.stranger).await);
    }
    // The paired gateway still gets through, several times over.
    for _ in 0..3 {
        let reply = env
            .gateway(&r)
            .post_json(
                "/v1/tools/call",
                &[],
                &call("memory.query", json!({"query": "x"})),
            )
            .await
            .unwrap();
        assert_eq!(reply.json()["status"], "ok", "{}", reply.json());
    }
    // The oldest silent connections made room for it.
    let mut closed = 0;
    for s in &mut held_tcp {
        if closed_within(s, Duration::from_millis(200)).await {
            closed += 1;
        }
    }
    assert!(closed >= 1, "no idle connection was closed to make room");
    r.shutdown().await;
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_at_the_first_request_deadline() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("limits: { first_request_timeout_ms: 300 }"))
        .await;
    // Before the TLS handshake...
    let mut silent = TcpStream::connect(r.tcp_address.unwrap()).await.unwrap();
    // ...and after it, as the paired gateway.
    let mut paired = tls_connect(&env, &r, &env.pki.gateway).await;
    assert!(closed_within(&mut silent, CLOSE_WITHIN).await);
    assert!(closed_within(&mut paired, CLOSE_WITHIN).await);
    r.shutdown().await;
}

/// A keep-alive connection of the gateway's that has had one call answered, left open.
async fn served_keep_alive(env: &Env, r: &Running) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut conn = tls_connect(env, r, &env.pki.gateway).await;
    conn.write_all(&request_bytes()).await.unwrap();
    let mut buf = vec![0u8; 16 * 1024];
    let n = conn.read(&mut buf).await.unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains(r#""status":"ok""#), "{head}");
    conn
}

#[tokio::test]
async fn a_keep_alive_connection_with_no_call_in_flight_is_closed_when_idle() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("limits: { idle_timeout_ms: 300 }"))
        .await;
    let mut conn = served_keep_alive(&env, &r).await;
    assert!(closed_within(&mut conn, CLOSE_WITHIN).await);
    r.shutdown().await;
}

#[tokio::test]
async fn the_drain_closes_an_idle_keep_alive_connection_at_once() {
    let env = Env::new().await;
    // Neither the idle timeout nor the drain's (30 s) would end it within the test's bound.
    let r = env
        .start(&env.tools_yaml("limits: { idle_timeout_ms: 60000 }"))
        .await;
    let mut conn = served_keep_alive(&env, &r).await;
    let drain = tokio::spawn(r.shutdown());
    assert!(
        closed_within(&mut conn, CLOSE_WITHIN).await,
        "the idle connection was told to close"
    );
    // carapace lingers until the caller closes its side too.
    drop(conn);
    tokio::time::timeout(CLOSE_WITHIN, drain)
        .await
        .expect("the drain ended once the connection closed")
        .unwrap();
}

#[tokio::test]
async fn an_unpaired_certificate_gets_its_answer_and_the_connection_closes() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    let mut conn = tls_connect(&env, &r, &env.pki.stranger).await;
    conn.write_all(&request_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(CLOSE_WITHIN, conn.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the connection stayed open after the answer");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.contains(r#""code":"PAIRING_REQUIRED""#), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    drop(conn);
    r.shutdown().await;
}

#[tokio::test]
async fn on_http2_an_unpaired_certificate_gets_one_answer_and_the_connection_goes_away() {
    use http_body_util::{BodyExt, Full};
    let env = Env::new().await;
    // Far longer than the test waits: the connection must end because of its answer.
    let r = env
        .start(&env.tools_yaml("limits: { first_request_timeout_ms: 60000 }"))
        .await;
    let addr = r.tcp_address.unwrap();
    let (mut send, conn) = h2_connect(&env, &r, &env.pki.stranger).await;
    let post = || {
        let body = call("memory.query", json!({"query": "x"})).to_string();
        http::Request::post(format!("https://{addr}/v1/tools/call"))
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(body)))
            .unwrap()
    };
    let first = send.send_request(post()).await.unwrap();
    // tools-v1 answers its errors in its envelope.
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains(r#""code":"PAIRING_REQUIRED""#),
        "{body:?}"
    );
    // The server said GOAWAY after its answer and closed: the client's connection ends, and
    // no second request is served on it.
    tokio::time::timeout(CLOSE_WITHIN, conn)
        .await
        .expect("the connection ended after its one answer")
        .unwrap()
        .ok();
    assert!(send.send_request(post()).await.is_err());
    r.shutdown().await;
}

/// One HTTP/2 frame: its 9-byte head and `payload`.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

/// The graceful GOAWAY of HTTP/2 waits for the client's answer to a PING. A client that
/// never answers (written here frame by frame: hyper's and h2's clients answer on their own)
/// still gets its one answer, and its unpaired connection is cut off soon after.
#[tokio::test]
async fn on_http2_an_unpaired_connection_that_never_answers_a_ping_is_cut_off() {
    let env = Env::new().await;
    // The first request's deadline is far beyond the wait: the cut-off ends the connection.
    let yaml = "limits: { first_request_timeout_ms: 60000, header_read_timeout_ms: 500 }";
    let r = env.start(&env.tools_yaml(yaml)).await;
    let addr = r.tcp_address.unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let config = tls_config(&env.pki.ca.cert_pem(), Some(&env.pki.stranger), true);
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::from(addr.ip()), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    // The preface, empty SETTINGS, and a GET as one HEADERS frame (HPACK literals).
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/v1/tools"),
        (":authority", "x"),
    ] {
        block.push(0);
        block.push(name.len() as u8);
        block.extend(name.as_bytes());
        block.push(value.len() as u8);
        block.extend(value.as_bytes());
    }
    out.extend(h2_frame(1, 0x4 | 0x1, 1, &block));
    tls.write_all(&out).await.unwrap();

    let (mut answered, mut went_away, mut pinged) = (false, false, false);
    let mut body = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut head = [0u8; 9];
    let closed = loop {
        let Ok(read) = tokio::time::timeout_at(deadline, tls.read_exact(&mut head)).await else {
            break false;
        };
        if read.is_err() {
            break true;
        }
        let mut payload = vec![0; u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize];
        if tls.read_exact(&mut payload).await.is_err() {
            break true;
        }
        match head[3] {
            0 => body.extend(&payload),
            1 => answered = true,
            // The server's SETTINGS are acknowledged; its PING never is.
            4 if head[4] & 1 == 0 => tls.write_all(&h2_frame(4, 1, 0, &[])).await.unwrap(),
            6 => pinged = true,
            7 => went_away = true,
            _ => {}
        }
    };
    assert!(closed, "the connection stayed open");
    assert!(
        answered && went_away && pinged,
        "{answered} {went_away} {pinged}"
    );
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains(r#""code":"PAIRING_REQUIRED""#), "{body}");
    r.shutdown().await;
}

#[tokio::test]
async fn revoking_a_peer_closes_the_connections_it_holds_open() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("limits: { idle_timeout_ms: 60000 }"))
        .await;
    let mut kept = tls_connect(&env, &r, &env.pki.gateway).await;
    kept.write_all(&request_bytes()).await.unwrap();
    let (head, _) = read_answer(&mut kept).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    // A keep-alive connection of a paired peer stays open between requests...
    assert!(!closed_within(&mut kept, Duration::from_millis(200)).await);
    let (status, _) = carapace::admin::request(
        &r.admin_socket,
        http::Method::POST,
        "/v1/peers/revoke",
        Some(json!({"component_id": "gw_test"})),
    )
    .await
    .unwrap();
    assert_eq!(status, http::StatusCode::OK);
    // ...until the peer is revoked: then it is closed, long before its idle timeout.
    assert!(closed_within(&mut kept, CLOSE_WITHIN).await);
    r.shutdown().await;
}

#[tokio::test]
async fn a_peer_paired_again_with_another_certificate_loses_the_old_ones_connections() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("limits: { idle_timeout_ms: 60000 }"))
        .await;
    let mut old = tls_connect(&env, &r, &env.pki.gateway).await;
    old.write_all(&request_bytes()).await.unwrap();
    let (head, _) = read_answer(&mut old).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    // `gw_test` is still active, now by another certificate; the file is reloaded.
    common::write_peers(
        &env.path().join("peers.json"),
        &[(&env.pki.stranger.fingerprint, "gw_test", "active")],
    );
    let (status, _) =
        carapace::admin::request(&r.admin_socket, http::Method::POST, "/v1/reload", None)
            .await
            .unwrap();
    assert_eq!(status, http::StatusCode::OK);
    assert!(closed_within(&mut old, CLOSE_WITHIN).await);
    // The new certificate's connections are served.
    let mut new = tls_connect(&env, &r, &env.pki.stranger).await;
    new.write_all(&request_bytes()).await.unwrap();
    let (head, body) = read_answer(&mut new).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!body.contains("PAIRING_REQUIRED"), "{body}");
    drop((old, new));
    r.shutdown().await;
}

#[tokio::test]
async fn one_peer_holds_at_most_its_share_of_connections() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml(
            "limits: { max_connections: 16, max_connections_per_peer: 2, first_request_timeout_ms: 60000 }",
        ))
        .await;
    let _a = tls_connect(&env, &r, &env.pki.gateway).await;
    let _b = tls_connect(&env, &r, &env.pki.gateway).await;
    // The third is closed at once; the peer's first two stay.
    let mut third = tls_connect(&env, &r, &env.pki.gateway).await;
    assert!(closed_within(&mut third, CLOSE_WITHIN).await);
    r.shutdown().await;
}

/// The head of an HTTP/1.1 answer read from `s` (through the blank line), and its body.
async fn read_answer<S: AsyncReadExt + Unpin>(s: &mut S) -> (String, String) {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::time::timeout(CLOSE_WITHIN, s.read(&mut buf))
            .await
            .expect("an answer in time")
            .expect("the answer is readable");
        assert!(n > 0, "closed before the answer's head");
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .expect("a content-length")
        .trim()
        .parse()
        .unwrap();
    while raw.len() < head_end + len {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed inside the answer's body");
        raw.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&raw[head_end..head_end + len]).into_owned();
    (head, body)
}

fn oversized_head(len: usize, extra: &str) -> Vec<u8> {
    format!(
        "POST /v1/tools/call HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}content-length: {len}\r\n\r\n"
    )
    .into_bytes()
}

#[tokio::test]
async fn a_caller_that_sends_its_whole_oversized_body_first_still_reads_the_413() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("limits: { max_body_bytes: 1024 }"))
        .await;
    let mut s = tls_connect(&env, &r, &env.pki.gateway).await;
    // As most HTTP/1 clients do: the whole request first (far more than the socket buffers
    // hold while carapace reads none of it), then the answer.
    let len = 4 << 20;
    s.write_all(&oversized_head(len, "")).await.unwrap();
    let body = vec![b' '; len];
    tokio::time::timeout(CLOSE_WITHIN, s.write_all(&body))
        .await
        .expect("the upload is read (and discarded) while the connection closes")
        .expect("the upload is not cut off by a reset");
    s.flush().await.unwrap();
    let (head, body) = read_answer(&mut s).await;
    assert!(head.starts_with("http/1.1 413"), "{head}");
    assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
    assert!(body.contains("INVALID_ARGS"), "{body}");
    assert!(closed_within(&mut s, CLOSE_WITHIN).await);
    assert!(env.app.received().is_empty());
}

#[tokio::test]
async fn a_small_refused_body_is_discarded_and_the_connection_serves_the_next_call() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("limits: { max_body_bytes: 1024 }"))
        .await;
    let mut s = tls_connect(&env, &r, &env.pki.gateway).await;
    // The refusal comes from the head alone; the body follows it.
    s.write_all(&oversized_head(2000, "")).await.unwrap();
    let (head, _) = read_answer(&mut s).await;
    assert!(head.starts_with("http/1.1 413"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");
    s.write_all(&[b' '; 2000]).await.unwrap();
    // The same connection carries the next call.
    s.write_all(&request_bytes()).await.unwrap();
    let (head, body) = read_answer(&mut s).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(body.contains("\"ok\""), "{body}");
    assert_eq!(env.app.received().len(), 1);
}

#[tokio::test]
async fn a_caller_waiting_for_100_continue_gets_the_refusal_and_is_never_asked_for_the_body() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("limits: { max_body_bytes: 1024 }"))
        .await;
    let mut s = tls_connect(&env, &r, &env.pki.gateway).await;
    s.write_all(&oversized_head(2000, "expect: 100-continue\r\n"))
        .await
        .unwrap();
    let (head, _) = read_answer(&mut s).await;
    assert!(
        head.starts_with("http/1.1 413"),
        "no 100 Continue first: {head}"
    );
    assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
    assert!(closed_within(&mut s, CLOSE_WITHIN).await);
}

#[tokio::test]
async fn on_http2_a_refused_upload_resets_only_its_stream() {
    use http_body_util::{BodyExt, Full};
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("limits: { max_body_bytes: 1024 }"))
        .await;
    let addr = r.tcp_address.unwrap();
    let (mut send, _conn) = h2_connect(&env, &r, &env.pki.gateway).await;
    let post = |body: Vec<u8>| {
        http::Request::post(format!("https://{addr}/v1/tools/call"))
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(body)))
            .unwrap()
    };
    let big = send.send_request(post(vec![b' '; 1 << 20])).await.unwrap();
    assert_eq!(big.status(), 413);
    let good = call("memory.query", json!({"query": "x"})).to_string();
    let next = send
        .send_request(post(good.into_bytes()))
        .await
        .expect("the connection lives on");
    assert_eq!(next.status(), 200);
    let body = next.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("\"ok\""));
}

#[tokio::test]
async fn an_http1_keep_alive_connection_waits_the_idle_timeout_and_a_slow_head_only_its_own() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("limits: { header_read_timeout_ms: 300, idle_timeout_ms: 10000 }"))
        .await;
    let mut s = tls_connect(&env, &r, &env.pki.gateway).await;
    s.write_all(&request_bytes()).await.unwrap();
    let (head, _) = read_answer(&mut s).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    // Idle for more than three head timeouts: the connection still serves.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    s.write_all(&request_bytes()).await.unwrap();
    let (head, _) = read_answer(&mut s).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    // A head that starts and stops is cut off at its own timeout (within twice it), long
    // before the idle timeout.
    let started = std::time::Instant::now();
    s.write_all(b"POST /v1/tools/call HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(env.app.received().len(), 2);
}
