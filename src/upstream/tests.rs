use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
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
