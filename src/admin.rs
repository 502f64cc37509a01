//! The local admin socket (HTTP over a Unix socket, mode 0600): kill-switch control. Only the
//! local machine can reach it; nothing here is exposed on the caller listeners.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::server::Shared;

/// `PUT /v1/kill-switch` body.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KillSwitchRequest {
    pub engaged: bool,
    #[serde(default)]
    pub tool: Option<String>,
}

/// `POST /v1/peers/revoke` body.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {
    pub component_id: String,
}

fn reply(status: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn state(shared: &Shared) -> serde_json::Value {
    let (config, runtime) = shared.kill_switch.snapshot();
    json!({"config": config, "runtime": runtime, "global_engaged": shared.kill_switch.global_engaged()})
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/v1/kill-switch") => reply(StatusCode::OK, state(&shared)),
        (Method::PUT, "/v1/kill-switch") => {
            let body = match Limited::new(req.into_body(), 64 * 1024).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => return reply(StatusCode::BAD_REQUEST, json!({"error": e.to_string()})),
            };
            let r: KillSwitchRequest = match serde_json::from_slice(&body) {
                Ok(r) => r,
                Err(e) => return reply(StatusCode::BAD_REQUEST, json!({"error": e.to_string()})),
            };
            match shared.kill_switch.set_runtime(r.tool.as_deref(), r.engaged) {
                Ok(()) => {
                    tracing::warn!(
                        "kill_switch_changed scope={} engaged={}",
                        r.tool.as_deref().unwrap_or("global"),
                        r.engaged
                    );
                    if r.tool.is_none() && !r.engaged {
                        // Registration was skipped while the switch was engaged.
                        shared.request_discovery();
                    }
                    reply(StatusCode::OK, state(&shared))
                }
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({"error": e.to_string()}),
                ),
            }
        }
        (Method::GET, "/v1/peers") => {
            reply(StatusCode::OK, json!({"peers": shared.peers.records()}))
        }
        (Method::POST, "/v1/peers/revoke") => {
            let body = match Limited::new(req.into_body(), 64 * 1024).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => return reply(StatusCode::BAD_REQUEST, json!({"error": e.to_string()})),
            };
            let r: RevokeRequest = match serde_json::from_slice(&body) {
                Ok(r) => r,
                Err(e) => return reply(StatusCode::BAD_REQUEST, json!({"error": e.to_string()})),
            };
            match shared.peers.revoke(&r.component_id) {
                Ok(0) => reply(
                    StatusCode::NOT_FOUND,
                    json!({"error": format!("no active peer `{}`", r.component_id)}),
                ),
                Ok(n) => {
                    tracing::warn!("peer_revoked component_id={} records={n}", r.component_id);
                    shared.metrics.peers.set(shared.peers.len() as i64);
                    reply(
                        StatusCode::OK,
                        json!({"revoked": n, "component_id": r.component_id}),
                    )
                }
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({"error": e.to_string()}),
                ),
            }
        }
        (Method::POST, "/v1/reload") => match crate::server::reload(&shared).await {
            Ok(()) => reply(StatusCode::OK, json!({"reloaded": true})),
            Err(errors) => reply(
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({"reloaded": false, "errors": errors}),
            ),
        },
        _ => reply(
            StatusCode::NOT_FOUND,
            json!({"error": "no such admin route"}),
        ),
    }
}

/// Serve the admin socket until shutdown.
pub async fn serve(l: UnixListener, shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let stream = tokio::select! {
            r = l.accept() => match r { Ok((s, _)) => s, Err(_) => continue },
            _ = shutdown.changed() => return,
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(shared, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Send one request to an admin socket (the CLI side).
pub async fn request(
    socket: &Path,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<(StatusCode, serde_json::Value), String> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("cannot connect to admin socket {}: {e}", socket.display()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, "localhost")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let value = serde_json::from_slice(&body).unwrap_or(json!({}));
    Ok((status, value))
}
