//! `/healthz`, `/readyz` and `/metrics` on their own listener (loopback by default).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::server::shared::Shared;

fn respond(shared: &Shared, path: &str) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match path {
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        "/readyz" => {
            let ready = shared.ready();
            let body = serde_json::json!({
                "ready": ready,
                "discovered": shared.catalog.discovered(),
            })
            .to_string();
            let status = if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (status, "application/json", body)
        }
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            shared.metrics.encode(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(ctype),
    );
    r
}

/// What the ops listener's callers may hold of it: it is often reachable from more
/// than the scraper (the chart binds it to every address), so nobody may hold its connections
/// or file descriptors for long.
#[derive(Debug, Clone, Copy)]
struct OpsLimits {
    /// Connections open at once; one more is closed as soon as it is accepted.
    max_connections: usize,
    /// Of them, from one address: so one caller cannot take every place, the kubelet's
    /// probes' included.
    per_address: usize,
    /// To send a request's head, the first and each next one on the connection.
    header_read: Duration,
    /// A connection's whole life (a scraper opens another).
    lifetime: Duration,
}

impl Default for OpsLimits {
    fn default() -> Self {
        OpsLimits {
            max_connections: 64,
            per_address: 8,
            header_read: Duration::from_secs(10),
            lifetime: Duration::from_secs(300),
        }
    }
}

/// Serve the ops endpoint until shutdown.
pub async fn serve(l: TcpListener, shared: Arc<Shared>, shutdown: watch::Receiver<bool>) {
    let answer = move |path: &str| respond(&shared, path);
    serve_with(l, shutdown, OpsLimits::default(), answer).await
}

/// Serve `answer` (a response for each request's path) on `l` within `limits` until shutdown.
async fn serve_with<A>(
    l: TcpListener,
    mut shutdown: watch::Receiver<bool>,
    limits: OpsLimits,
    answer: A,
) where
    A: Fn(&str) -> Response<Full<Bytes>> + Clone + Send + Sync + 'static,
{
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let by_address = crate::connections::AddressPlaces::new(limits.per_address);
    loop {
        let (stream, peer) = tokio::select! {
            r = l.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("ops accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        // At either cap the new connection is closed (dropped) at once.
        let Some(from) = by_address.take(peer.ip()) else {
            continue;
        };
        let Ok(slot) = open.clone().try_acquire_owned() else {
            continue;
        };
        let answer = answer.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let r = answer(req.uri().path());
                    async move { Ok::<_, std::convert::Infallible>(r) }
                });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(limits.lifetime, conn).await;
            drop((slot, from));
        });
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    async fn start(limits: OpsLimits) -> (std::net::SocketAddr, watch::Sender<bool>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (stop, shutdown) = watch::channel(false);
        let answer = |_: &str| Response::new(Full::new(Bytes::from_static(b"ok\n")));
        tokio::spawn(serve_with(l, shutdown, limits, answer));
        (addr, stop)
    }

    /// What the connection gets before the server closes it: the bytes it read.
    async fn read_to_close(c: &mut TcpStream) -> String {
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got).await;
        String::from_utf8_lossy(&got).into_owned()
    }

    /// The answer to one request; empty once the server has closed the connection.
    async fn get(c: &mut TcpStream) -> String {
        let mut buf = [0u8; 256];
        let sent = c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n");
        let n = match sent.await {
            Ok(()) => c.read(&mut buf).await.unwrap_or(0),
            Err(_) => 0,
        };
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// At the cap a new connection is closed at once; the ones open are still served.
    #[tokio::test(start_paused = true)]
    async fn a_connection_over_the_cap_is_closed_and_the_others_served() {
        let limits = OpsLimits {
            max_connections: 2,
            ..OpsLimits::default()
        };
        let (addr, _stop) = start(limits).await;
        let mut held = [
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        let mut over = TcpStream::connect(addr).await.unwrap();
        let _ = over.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!(read_to_close(&mut over).await, "");
        assert!(get(&mut held[0]).await.starts_with("HTTP/1.1 200"));
        assert!(get(&mut held[1]).await.starts_with("HTTP/1.1 200"));
    }

    /// One address may hold only its share: another address is still served.
    #[tokio::test(start_paused = true)]
    async fn one_address_cannot_take_every_place() {
        let limits = OpsLimits {
            per_address: 2,
            ..OpsLimits::default()
        };
        let (addr, _stop) = start(limits).await;
        let mut held = [
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        let mut over = TcpStream::connect(addr).await.unwrap();
        assert_eq!(get(&mut over).await, "");
        let other = tokio::net::TcpSocket::new_v4().unwrap();
        other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut other = other.connect(addr).await.unwrap();
        assert!(get(&mut other).await.starts_with("HTTP/1.1 200"));
        assert!(get(&mut held[0]).await.starts_with("HTTP/1.1 200"));
        assert!(get(&mut held[1]).await.starts_with("HTTP/1.1 200"));
    }

    /// A connection that sends nothing is closed after the header timeout, one that keeps
    /// asking at the end of its lifetime, and each frees its place.
    #[tokio::test(start_paused = true)]
    async fn idle_and_long_lived_connections_are_closed_and_free_their_place() {
        let limits = OpsLimits {
            max_connections: 1,
            per_address: 1,
            header_read: Duration::from_secs(10),
            lifetime: Duration::from_secs(60),
        };
        let (addr, _stop) = start(limits).await;
        let started = tokio::time::Instant::now();
        let mut silent = TcpStream::connect(addr).await.unwrap();
        assert_eq!(read_to_close(&mut silent).await, "");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(10) && waited < Duration::from_secs(11));

        let mut busy = TcpStream::connect(addr).await.unwrap();
        let started = tokio::time::Instant::now();
        loop {
            let answer = get(&mut busy).await;
            if answer.is_empty() {
                break;
            }
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let lived = started.elapsed();
        assert!(lived >= Duration::from_secs(60) && lived < Duration::from_secs(66));
        let mut next = TcpStream::connect(addr).await.unwrap();
        assert!(get(&mut next).await.starts_with("HTTP/1.1 200"));
    }
}
