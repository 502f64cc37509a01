use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use carapace_filters::Rejection;
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::AppClient;
use crate::config::{AppAddress, PoolConfig};

/// An app that counts the connections it accepted and answers `/slow` after 50 ms; with
/// `close_after_each`, it closes every connection after one answer.
async fn app(close_after_each: bool) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: http::Request<_>| async move {
                    if req.uri().path() == "/slow" {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    let host = req.headers().get("host").cloned();
                    let mut resp = Response::new(Full::new(Bytes::from(req.uri().to_string())));
                    if let Some(h) = host {
                        resp.headers_mut().insert("x-host", h);
                    }
                    Ok::<_, std::convert::Infallible>(resp)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(!close_after_each)
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, accepted)
}

fn client(addr: std::net::SocketAddr, max_idle: usize, idle_timeout_s: u64) -> AppClient {
    let pool = PoolConfig {
        max_idle,
        idle_timeout_s,
        ..PoolConfig::default()
    };
    AppClient::new(AppAddress::Tcp(addr), &pool, 1 << 20)
}

async fn get(c: &AppClient, path: &str) -> super::AppResponse {
    c.send(Method::GET, path, http::HeaderMap::new(), Bytes::new())
        .await
        .unwrap()
}

#[tokio::test]
async fn calls_reuse_one_connection_and_send_origin_form_with_the_host() {
    let (addr, accepted) = app(false).await;
    let c = client(addr, 8, 90);
    for i in 0..5 {
        let r = get(&c, &format!("/v1/x?i={i}")).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, format!("/v1/x?i={i}"));
        assert_eq!(r.headers["x-host"], addr.to_string().as_str());
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_connection_the_app_closed_is_replaced_without_failing_the_call() {
    let (addr, accepted) = app(true).await;
    let c = client(addr, 8, 90);
    for _ in 0..4 {
        assert_eq!(get(&c, "/").await.status, StatusCode::OK);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn no_more_than_max_idle_connections_are_kept() {
    let (addr, accepted) = app(false).await;
    let c = client(addr, 1, 90);
    let burst = || async { tokio::join!(get(&c, "/slow"), get(&c, "/slow"), get(&c, "/slow")) };
    burst().await;
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    // One was kept: the next burst opens two.
    burst().await;
    assert_eq!(accepted.load(Ordering::SeqCst), 5);
}

#[tokio::test(start_paused = true)]
async fn idle_connections_close_after_the_idle_timeout() {
    let (addr, accepted) = app(false).await;
    let c = client(addr, 8, 5);
    get(&c, "/").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    get(&c, "/").await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "reused within the timeout"
    );
    tokio::time::sleep(Duration::from_secs(11)).await;
    get(&c, "/").await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "closed after it");
}

#[tokio::test]
async fn an_unreachable_app_is_unavailable_and_a_broken_answer_is_invalid() {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let c = client(addr, 8, 90);
    let e = c
        .send(Method::GET, "/", http::HeaderMap::new(), Bytes::new())
        .await
        .unwrap_err();
    assert!(
        matches!(e, carapace_filters::Rejection::AppUnavailable(_)),
        "{e:?}"
    );

    // An app that reads the request and closes without answering.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
        }
    });
    let c = client(addr, 8, 90);
    let e = c
        .send(Method::GET, "/", http::HeaderMap::new(), Bytes::new())
        .await
        .unwrap_err();
    assert!(
        matches!(e, carapace_filters::Rejection::AppInvalid(_)),
        "{e:?}"
    );
}

/// An app that answers each request it reads with the next of `answers`, written as it is,
/// and closes the connection after an answer ending in `Connection: close`; the requests'
/// bytes and the connections accepted are counted.
async fn raw_app(
    answers: Vec<&'static [u8]>,
) -> (
    std::net::SocketAddr,
    Arc<AtomicUsize>,
    Arc<std::sync::Mutex<Vec<u8>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (count, log) = (accepted.clone(), seen.clone());
    let answers = Arc::new(std::sync::Mutex::new(answers.into_iter()));
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let (answers, log) = (answers.clone(), log.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    log.lock().unwrap().extend_from_slice(&buf[..n]);
                    let Some(answer) = answers.lock().unwrap().next() else {
                        return;
                    };
                    s.write_all(answer).await.unwrap();
                    if answer.windows(17).any(|w| w == b"Connection: close") {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted, seen)
}

#[tokio::test]
async fn chunked_and_informational_answers_are_read_and_the_connection_kept() {
    let (addr, accepted, _) = raw_app(vec![
        b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    ])
    .await;
    let c = client(addr, 8, 90);
    let r = get(&c, "/").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "hello world");
    assert_eq!(get(&c, "/").await.body, "ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn answers_delimited_by_the_close_or_saying_close_are_not_reused() {
    let (addr, accepted, _) = raw_app(vec![
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\nConnection: close\r\n\r\na",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nc",
    ])
    .await;
    let c = client(addr, 8, 90);
    assert_eq!(get(&c, "/").await.body, "a");
    assert_eq!(get(&c, "/").await.body, "to the end");
    assert_eq!(get(&c, "/").await.body, "c");
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn answers_over_the_limit_or_malformed_are_invalid() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\ncontent-length: 2000000\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1fffff\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
        b"HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\nab",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 2\r\n\r\nab",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"NOT HTTP\r\n\r\n",
    ] {
        let (addr, _, _) = raw_app(vec![answer]).await;
        let e = client(addr, 8, 90)
            .send(Method::GET, "/", http::HeaderMap::new(), Bytes::new())
            .await
            .unwrap_err();
        assert!(
            matches!(e, carapace_filters::Rejection::AppInvalid(_)),
            "{e:?} for {}",
            String::from_utf8_lossy(answer)
        );
    }
}

#[tokio::test]
async fn the_request_has_one_host_and_one_length_set_by_carapace() {
    let (addr, _, seen) = raw_app(vec![b"HTTP/1.1 204 No Content\r\n\r\n"]).await;
    let c = client(addr, 8, 90);
    let mut headers = http::HeaderMap::new();
    headers.insert("host", "evil.example".parse().unwrap());
    headers.insert("content-length", "99".parse().unwrap());
    headers.insert("transfer-encoding", "chunked".parse().unwrap());
    headers.insert("x-carapace-peer-id", "p1".parse().unwrap());
    let r = c
        .send(Method::POST, "/run?a=1", headers, Bytes::from_static(b"{}"))
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let request = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
    assert_eq!(
        request,
        format!(
            "POST /run?a=1 HTTP/1.1\r\nhost: {addr}\r\nx-carapace-peer-id: p1\r\ncontent-length: 2\r\n\r\n{{}}"
        )
    );
}

/// A call's request: carapace's headers written straight from the call, in the order a map
/// of them would give; the answer's status and body (chunked here) read without its headers.
#[tokio::test]
async fn a_calls_request_carries_the_calls_headers_and_its_answer_is_read() {
    use carapace_filters::call::{Principal, ToolCall, ToolSpec};
    let (addr, accepted, seen) = raw_app(vec![
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-extra: 1\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nyes",
    ])
    .await;
    let c = client(addr, 8, 90);
    let call = ToolCall {
        call_id: "c1".into(),
        tool: Arc::new(ToolSpec {
            name: "t".into(),
            app_name: None,
            definition: None,
            description: String::new(),
            input: carapace_filters::schema::CompiledSchema::compile(serde_json::json!({}))
                .unwrap(),
            output: None,
            timeout_ms_default: 1_000,
            timeout_ms_max: 1_000,
            idempotent: false,
            side_effects: false,
        }),
        tenant_id: None,
        args: serde_json::json!({}),
        context: None,
        timeout_ms: None,
        idempotency_key: None,
        principal: Arc::new(Principal {
            id: "gw".into(),
            kind: "gateway".into(),
            fingerprint: Some("sha256:aa".into()),
            ..Principal::local()
        }),
        credential: carapace_filters::call::Credential::None,
        request_id: Some(http::HeaderValue::from_static("r-1")),
        trace_context: Vec::new(),
        extensions: Default::default(),
    };
    let (status, body) = c
        .post_call("/v1/tools/call", &call, b"{}".to_vec())
        .await
        .unwrap();
    assert_eq!((status, body.as_ref()), (StatusCode::OK, b"ok".as_slice()));
    let (_, body) = c
        .post_call("/v1/tools/call", &call, b"[]".to_vec())
        .await
        .unwrap();
    assert_eq!(body, "yes");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    let mut map = carapace_filters::call::app_headers(&call);
    map.insert("host", addr.to_string().parse().unwrap());
    map.insert("content-length", "2".parse().unwrap());
    let lines: String = ["host", "x-carapace-peer-id", "x-carapace-peer-type"]
        .into_iter()
        .chain([
            "x-carapace-peer-fingerprint",
            "x-request-id",
            "content-type",
        ])
        .chain(["content-length"])
        .map(|n| format!("{n}: {}\r\n", map[n].to_str().unwrap()))
        .collect();
    assert_eq!(map.len(), 7);
    let one = format!("POST /v1/tools/call HTTP/1.1\r\n{lines}\r\n");
    assert_eq!(
        String::from_utf8(seen.lock().unwrap().clone()).unwrap(),
        format!("{one}{{}}{one}[]")
    );
}

#[tokio::test]
async fn a_path_that_would_change_the_request_line_is_refused_unsent() {
    let (addr, accepted, _) = raw_app(vec![]).await;
    let c = client(addr, 8, 90);
    for path in ["/a b", "/a\r\nx: y", "run"] {
        let e = c
            .send(Method::GET, path, http::HeaderMap::new(), Bytes::new())
            .await
            .unwrap_err();
        assert!(
            matches!(e, carapace_filters::Rejection::Internal(_)),
            "{e:?}"
        );
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}

/// Answers read the same whether they arrive whole or a byte at a time: every framing, the
/// informational heads before the final one, and the trailers after the last chunk.
#[test]
fn answers_read_the_same_in_any_pieces() {
    let answers: [(&[u8], u16, &[u8]); 5] = [
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
            200,
            b"hello",
        ),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n\
              HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
            201,
            b"ok",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
              3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nx-sum: 1\r\nx-more: 2\r\n\r\n",
            200,
            b"abcde",
        ),
        (b"HTTP/1.0 200 OK\r\n\r\nto the end", 200, b"to the end"),
        (
            b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n",
            204,
            b"",
        ),
    ];
    for (wire, status, body) in answers {
        for (step, keep) in [0, 1, 2, 7]
            .into_iter()
            .flat_map(|s| [(s, true), (s, false)])
        {
            let (got_status, got_body) = super::read_answer(wire, step, 64, keep).unwrap();
            assert_eq!(
                (got_status, got_body.as_ref()),
                (status, body),
                "step {step}, headers kept: {keep}"
            );
        }
    }
}

/// Whatever the pieces, an answer over the bound or cut short is an error, never a body.
#[test]
fn cut_or_oversized_answers_are_errors_in_any_pieces() {
    let answers: [&[u8]; 5] = [
        b"HTTP/1.1 200 OK\r\ncontent-length: 65\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n40\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhel",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-le",
    ];
    let oversized = [b'x'; 65];
    let close_delimited = [b"HTTP/1.1 200 OK\r\n\r\n".as_slice(), &oversized].concat();
    for wire in answers.into_iter().chain([close_delimited.as_slice()]) {
        for (step, keep) in [0, 1, 5].into_iter().flat_map(|s| [(s, true), (s, false)]) {
            assert!(
                super::read_answer(wire, step, 64, keep).is_err(),
                "{:?} at step {step}",
                String::from_utf8_lossy(wire)
            );
        }
    }
}

/// The bounds on what precedes and follows a body hold however the bytes arrive: a head over
/// 64 KiB, a chunk-size line over 4 KiB (an endless extension), trailers over 64 KiB, and an
/// empty size line (which would end the body early) are refused, whole or in pieces.
#[test]
fn heads_size_lines_and_trailers_are_bounded_in_any_pieces() {
    let filler = "a".repeat(70 * 1024);
    let long_head = format!("HTTP/1.1 200 OK\r\nx-big: {filler}\r\ncontent-length: 0\r\n\r\n");
    let long_extension = format!(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;{}\r\nx\r\n0\r\n\r\n",
        &filler[..5 * 1024]
    );
    let long_trailers = format!(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n{}\r\n",
        "x-t: 1234567890\r\n".repeat(4_000)
    );
    let empty_size = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\r\nrest".to_string();
    for wire in [long_head, long_extension, long_trailers, empty_size] {
        for (step, keep) in [(0, true), (0, false), (1000, false), (4096, true)] {
            assert!(
                super::read_answer(wire.as_bytes(), step, 1 << 20, keep).is_err(),
                "{} at step {step}",
                &wire[..60.min(wire.len())]
            );
        }
    }
    // Within the bounds, the same shapes are read.
    let ok =
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2;a=b\r\nok\r\n0\r\nx-t: 1\r\n\r\n";
    assert_eq!(
        super::read_answer(ok.as_bytes(), 1, 64, false).unwrap().1,
        "ok"
    );
}

/// A listener that accepts connections, reads what comes and never answers; `arrived` is
/// notified at each read.
async fn silent_listener() -> (std::net::SocketAddr, Arc<tokio::sync::Notify>) {
    use tokio::io::AsyncReadExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let arrived = Arc::new(tokio::sync::Notify::new());
    let notify = arrived.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let notify = notify.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    notify.notify_one();
                }
            });
        }
    });
    (addr, arrived)
}

async fn open(c: &AppClient, path: &str) -> Result<super::OpenResponse, Rejection> {
    c.open(Method::GET, path, http::HeaderMap::new(), Bytes::new())
        .await
}

#[tokio::test]
async fn a_call_to_the_app_is_counted_as_waiting_until_it_ends_however_it_ends() {
    // Answered, on a kept connection: whole, or its head (a streamed body is not counted).
    let (addr, _) = app(false).await;
    let c = client(addr, 8, 90).pooled_per_worker(1);
    get(&c, "/").await;
    assert_eq!(c.pools.waiting(), 0);
    let streaming = open(&c, "/").await.unwrap();
    assert_eq!(c.pools.waiting(), 0, "counted past the answer's head");
    drop(streaming);

    // Answered after the pooled connection was found closed (a retry on a new one).
    let (addr, accepted) = app(true).await;
    let c = client(addr, 8, 90).pooled_per_worker(1);
    for _ in 0..3 {
        get(&c, "/").await;
        open(&c, "/").await.unwrap().body.collect().await.unwrap();
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 6);
    assert_eq!(c.pools.waiting(), 0);

    // Refused: nothing listens.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let c = client(nobody, 8, 90).pooled_per_worker(1);
    assert!(c
        .send(Method::GET, "/", http::HeaderMap::new(), Bytes::new())
        .await
        .is_err());
    assert!(open(&c, "/").await.is_err());
    assert_eq!(c.pools.waiting(), 0);

    // Dropped while the app has not answered (what a call's deadline does), both ways.
    let (addr, arrived) = silent_listener().await;
    let c = client(addr, 8, 90).pooled_per_worker(1);
    {
        let mut whole = std::pin::pin!(get(&c, "/"));
        let mut head = std::pin::pin!(open(&c, "/"));
        // Each call is polled before the listener's news is looked at.
        tokio::select! {
            biased;
            _ = &mut whole => panic!("answered"),
            _ = arrived.notified() => {}
        }
        tokio::select! {
            biased;
            _ = &mut head => panic!("answered"),
            _ = arrived.notified() => {}
        }
        assert_eq!(c.pools.waiting(), 2);
    }
    assert_eq!(c.pools.waiting(), 0);
}

#[tokio::test]
async fn a_call_through_a_pool_every_worker_shares_is_not_counted_as_waiting() {
    let (addr, arrived) = silent_listener().await;
    let c = client(addr, 8, 90);
    let mut call = std::pin::pin!(get_result(&c));
    tokio::select! {
        biased;
        _ = &mut call => panic!("answered"),
        _ = arrived.notified() => {}
    }
    assert_eq!(c.pools.waiting(), 0);
}

#[tokio::test]
async fn a_call_to_a_remote_target_is_not_counted_as_waiting() {
    // A TLS target that never completes the handshake: the call stays pending in it.
    let (addr, arrived) = silent_listener().await;
    let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let pool = PoolConfig::default();
    let c = AppClient::named("127.0.0.1", addr.port(), Arc::new(config), &pool, 1 << 20)
        .pooled_per_worker(1);
    let mut first = std::pin::pin!(get_result(&c));
    tokio::select! {
        biased;
        _ = &mut first => panic!("answered"),
        _ = arrived.notified() => {}
    }
    let mut second = std::pin::pin!(get_result(&c));
    tokio::select! {
        biased;
        _ = &mut second => panic!("answered"),
        _ = arrived.notified() => {}
    }
    assert_eq!(c.pools.waiting(), 0);
}

async fn get_result(c: &AppClient) -> Result<super::AppResponse, Rejection> {
    c.send(Method::GET, "/", http::HeaderMap::new(), Bytes::new())
        .await
}
