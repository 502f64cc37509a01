//! `/healthz`, `/readyz` and `/metrics` on their own listener (loopback by default).

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

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

/// Serve the ops endpoint until shutdown.
pub async fn serve(l: TcpListener, shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let stream = tokio::select! {
            r = l.accept() => match r { Ok((s, _)) => s, Err(_) => continue },
            _ = shutdown.changed() => return,
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let r = respond(&shared, req.uri().path());
                    async move { Ok::<_, std::convert::Infallible>(r) }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
