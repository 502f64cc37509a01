//! The local admin socket (HTTP over a Unix socket, mode 0600): kill-switch control. Only the
//! local machine can reach it; nothing here is exposed on the caller listeners.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::server::shared::Shared;

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

pub(super) fn reply(status: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
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

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{body}\n"))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(
        "x-content-type-options",
        http::HeaderValue::from_static("nosniff"),
    );
    r
}

/// `POST /v1/pairings` body, as the crabstack gateway's admin API takes it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairingRequestBody {
    #[serde(default)]
    pub component_type: String,
    #[serde(default)]
    pub component_id: String,
    #[serde(default)]
    pub endpoint: String,
}

/// Parse a pairing request, saying what is wrong as the crabstack gateway does.
fn parse_pairing_request(body: &[u8]) -> Result<PairingRequestBody, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err("EOF".into());
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let r = PairingRequestBody::deserialize(&mut de).map_err(|e| {
        let m = e.to_string();
        if e.is_eof() {
            "unexpected EOF".to_string()
        } else if let Some(field) = m
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
        {
            format!("json: unknown field \"{field}\"")
        } else {
            m
        }
    })?;
    de.end().map_err(|_| "trailing content".to_string())?;
    Ok(r)
}

/// The protocol's component type for a requested one (`tool`, `tool-host`, `cli`, ...).
pub fn component_type(raw: &str) -> Option<&'static str> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "tool" | "tool_host" | "tool-host" => Some("tool_host"),
        "subscriber" => Some("subscriber"),
        "listener" => Some("listener"),
        "operator" | "cli" => Some("operator"),
        _ => None,
    }
}

/// A request body the admin handlers read: hyper's on the admin socket, the caller's on the
/// control plane.
pub trait AdminBody:
    http_body::Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
    + Send
    + 'static
{
}

impl<B> AdminBody for B where
    B: http_body::Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + 'static
{
}

/// Run a pairing requested on the admin socket and record the peer.
async fn pairings<B: AdminBody>(shared: Arc<Shared>, req: Request<B>) -> Response<Full<Bytes>> {
    if req.method() != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    }
    let Some(gateway) = shared.gateway.clone() else {
        return text(StatusCode::NOT_IMPLEMENTED, "pairing not configured");
    };
    let body = match Limited::new(req.into_body(), 1 << 20).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return text(StatusCode::BAD_REQUEST, &format!("invalid json: {e}")),
    };
    let r = match parse_pairing_request(&body) {
        Ok(r) => r,
        Err(why) => return text(StatusCode::BAD_REQUEST, &format!("invalid json: {why}")),
    };
    let Some(kind) = component_type(&r.component_type) else {
        return text(
            StatusCode::BAD_REQUEST,
            &format!("unsupported component type: {}", r.component_type),
        );
    };
    let component_id = r.component_id.trim().to_string();
    if component_id.is_empty() {
        return text(StatusCode::BAD_REQUEST, "component_id is required");
    }
    if component_id == gateway.gateway_id
        || crate::peers::RESERVED_IDS.contains(&component_id.as_str())
    {
        return text(
            StatusCode::BAD_REQUEST,
            &format!("invalid pairing request: component_id {component_id} is reserved"),
        );
    }
    let endpoint = r.endpoint.trim().to_string();
    if endpoint.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "invalid pairing request: endpoint is required",
        );
    }
    let request = crate::pairing::handshake::PairRequest {
        component_type: kind.to_string(),
        component_id,
        endpoint,
    };
    match crate::pairing::gateway::pair_peer(&shared, gateway, request).await {
        Ok((peer, record)) => paired(&peer, &record),
        Err(crate::pairing::transport::PairingError::InvalidRequest(m)) => text(
            StatusCode::BAD_REQUEST,
            &format!("invalid pairing request: {m}"),
        ),
        Err(e) => {
            tracing::warn!("pairing failed: {e}");
            text(StatusCode::BAD_GATEWAY, &e.to_string())
        }
    }
}

/// The answer to a pairing that succeeded, as the crabstack gateway writes it.
fn paired(
    peer: &crate::pairing::handshake::PairedPeer,
    record: &crate::peers::PeerRecord,
) -> Response<Full<Bytes>> {
    tracing::info!(
        "paired component_type={} component_id={} mtls_cert_fingerprint={}",
        peer.component_type,
        peer.component_id,
        peer.mtls_cert_fingerprint
    );
    let body = json!({
        "pairing_id": peer.pairing_id,
        "endpoint": peer.endpoint,
        "peer": {
            "component_type": record.component_type,
            "component_id": record.component_id,
            "endpoint": record.endpoint,
            "public_key_ed25519": record.public_key_ed25519,
            "public_key_x25519": record.public_key_x25519,
            "mtls_cert_fingerprint": record.mtls_cert_fingerprint,
            "paired_at": record.paired_at,
            "last_seen_at": record.last_seen_at,
            "status": record.status,
        }
    });
    // As the crabstack gateway writes it: JSON and a newline.
    let mut r = reply(StatusCode::OK, body.clone());
    *r.body_mut() = Full::new(Bytes::from(format!("{body}\n")));
    r
}

/// A request's body (at most 64 KiB) as one JSON object of `T`'s shape, or the 400 for it.
pub(super) async fn read_object<T: serde::de::DeserializeOwned, B: AdminBody>(
    req: Request<B>,
) -> Result<T, Response<Full<Bytes>>> {
    let body = match Limited::new(req.into_body(), 64 * 1024).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Err(reply(
                StatusCode::BAD_REQUEST,
                json!({"error": e.to_string()}),
            ))
        }
    };
    object_body(&body).map_err(|e| reply(StatusCode::BAD_REQUEST, json!({"error": e})))
}

/// An admin request body: one JSON object with exactly the request's members (serde would
/// also fill a struct from an array, `[true]`, which no client means).
fn object_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    match carapace_filters::canonical::parse_strict(body).map_err(|e| e.to_string())? {
        v @ serde_json::Value::Object(_) => serde_json::from_value(v).map_err(|e| e.to_string()),
        _ => Err("the body must be a JSON object".into()),
    }
}

/// Serve one admin request (the admin socket, and the control plane after authorization).
pub async fn handle<B: AdminBody>(shared: Arc<Shared>, req: Request<B>) -> Response<Full<Bytes>> {
    if req.uri().path() == "/v1/pairings" {
        return pairings(shared, req).await;
    }
    if req.uri().path().starts_with("/v1/tools/") {
        return super::tool_pins::handle(&shared, req)
            .await
            .unwrap_or_else(|| {
                reply(
                    StatusCode::NOT_FOUND,
                    json!({"error": "no such admin route"}),
                )
            });
    }
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/v1/gateway") => match &shared.gateway {
            Some(g) => reply(
                StatusCode::OK,
                json!({"gateway_id": g.gateway_id, "public_key_ed25519": g.public_key_ed25519()}),
            ),
            None => reply(StatusCode::NOT_FOUND, json!({"error": "not a gateway"})),
        },
        (Method::GET, "/v1/kill-switch") => reply(StatusCode::OK, state(&shared)),
        (Method::PUT, "/v1/kill-switch") => set_kill_switch(&shared, req).await,
        (Method::GET, "/v1/peers") => {
            let providers = shared.outbound.get().map(|o| o.provider_health());
            reply(
                StatusCode::OK,
                json!({"peers": shared.peers.records(), "providers": providers}),
            )
        }
        (Method::POST, "/v1/peers/revoke") => revoke_peer(&shared, req).await,
        (Method::POST, "/v1/reload") => match crate::ops::reload::reload(&shared).await {
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

/// `PUT /v1/kill-switch`: engage or release the switch, global or for one tool.
async fn set_kill_switch<B: AdminBody>(shared: &Shared, req: Request<B>) -> Response<Full<Bytes>> {
    let r: KillSwitchRequest = match read_object(req).await {
        Ok(r) => r,
        Err(refused) => return refused,
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
            reply(StatusCode::OK, state(shared))
        }
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": e.to_string()}),
        ),
    }
}

/// `POST /v1/peers/revoke`: every active record of a component revoked.
async fn revoke_peer<B: AdminBody>(shared: &Shared, req: Request<B>) -> Response<Full<Bytes>> {
    let r: RevokeRequest = match read_object(req).await {
        Ok(r) => r,
        Err(refused) => return refused,
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

/// The effective user of this process (`/proc/self` belongs to it).
pub fn effective_uid() -> std::io::Result<u32> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/self")?.uid())
}

/// Whether a process of user `peer` may use the admin socket of a process of user `owner`:
/// the same user, or root. The socket's mode (0600) says the same; this holds even if the
/// mode is loosened or the socket is reached through a descriptor passed on.
pub fn peer_allowed(peer: u32, owner: u32) -> bool {
    peer == owner || peer == 0
}

/// Largest admin request head accepted.
const MAX_ADMIN_HEAD_BYTES: usize = 16 * 1024;
/// Time for an admin request's head to arrive.
const ADMIN_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Serve the admin socket until shutdown.
pub async fn serve(l: UnixListener, shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let owner = match effective_uid() {
        Ok(uid) => uid,
        Err(e) => {
            tracing::error!("admin socket closed: the process's user is unknown: {e}");
            return;
        }
    };
    loop {
        let stream = tokio::select! {
            r = l.accept() => match r { Ok((s, _)) => s, Err(_) => continue },
            _ = shutdown.changed() => return,
        };
        match stream.peer_cred() {
            Ok(cred) if peer_allowed(cred.uid(), owner) => {}
            Ok(cred) => {
                tracing::warn!(
                    uid = cred.uid(),
                    "admin connection refused: not this process's user or root"
                );
                continue;
            }
            Err(e) => {
                tracing::warn!("admin connection refused: peer credentials unknown: {e}");
                continue;
            }
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(shared, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(ADMIN_HEADER_TIMEOUT)
                .max_buf_size(MAX_ADMIN_HEAD_BYTES)
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
    // Some answers are plain text (the pairing API's errors): keep it for the operator.
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| json!({"error": String::from_utf8_lossy(&body).trim().to_string()}));
    Ok((status, value))
}
