//! The handshake over WebSocket: one JSON message per text frame, 64 KiB at most, every step
//! bounded in time. The gateway dials the tool host's pairing endpoint (`ws://` only to
//! loopback); the tool host serves that endpoint on its own port, never the tool port.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Mutex};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use carapace_filters::nonce::NonceStore;

use super::handshake::{
    GatewayHandshake, HandshakeError, Installed, PairRequest, PairedPeer, Progress, RemoteConfig,
    RemoteHandshake,
};
use super::identity::{GatewayIdentity, HostIdentity};

/// Largest pairing message accepted (as crabstack: 64 KiB).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Longest wait for the peer's next message.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest whole handshake, gateway side.
pub const PAIR_TIMEOUT: Duration = Duration::from_secs(15);

/// A pairing that did not complete.
#[derive(Debug, thiserror::Error)]
pub enum PairingError {
    #[error("invalid pairing request: {0}")]
    InvalidRequest(String),
    #[error("mtls is required for remote pairing: {0}")]
    InsecureEndpoint(String),
    #[error("dial remote endpoint: {0}")]
    Dial(String),
    #[error("websocket: {0}")]
    WebSocket(String),
    #[error("timed out waiting for the peer")]
    Timeout,
    #[error("the peer closed the connection")]
    Closed,
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error("install: {0}")]
    Install(String),
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES))
}

/// Read the next text message, bounded in time and size.
async fn next_text<S>(ws: &mut WebSocketStream<S>) -> Result<String, PairingError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let msg = tokio::time::timeout(STEP_TIMEOUT, ws.next())
            .await
            .map_err(|_| PairingError::Timeout)?;
        match msg {
            None | Some(Ok(Message::Close(_))) => return Err(PairingError::Closed),
            Some(Err(e)) => return Err(PairingError::WebSocket(e.to_string())),
            Some(Ok(Message::Text(t))) => return Ok(t.as_str().to_string()),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(_)) => {
                return Err(PairingError::WebSocket(
                    "binary frames are not part of pairing".into(),
                ))
            }
        }
    }
}

async fn send_all<S>(ws: &mut WebSocketStream<S>, texts: Vec<String>) -> Result<(), PairingError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    for t in texts {
        tokio::time::timeout(STEP_TIMEOUT, ws.send(Message::text(t)))
            .await
            .map_err(|_| PairingError::Timeout)?
            .map_err(|e| PairingError::WebSocket(e.to_string()))?;
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Tool-host side.

/// What the tool host does with a completed pairing. `install` runs before the install is
/// confirmed to the gateway (the certificate must be in place); `activate` runs once the
/// gateway said the pairing is complete (only then is the gateway accepted as a peer).
pub trait PairingSink: Send + Sync + 'static {
    fn install(&self, installed: &Installed) -> Result<(), String>;
    fn activate(&self, installed: &Installed) -> Result<(), String>;
}

/// The tool host's pairing endpoint.
pub struct PairingEndpoint {
    pub config: RemoteConfig,
    pub identity: Arc<HostIdentity>,
    pub init_nonces: Arc<NonceStore>,
    pub path: String,
    pub sink: Arc<dyn PairingSink>,
    /// One pairing at a time.
    busy: Mutex<()>,
}

impl PairingEndpoint {
    pub fn new(
        config: RemoteConfig,
        identity: Arc<HostIdentity>,
        init_nonces: Arc<NonceStore>,
        path: String,
        sink: Arc<dyn PairingSink>,
    ) -> Self {
        PairingEndpoint {
            config,
            identity,
            init_nonces,
            path,
            sink,
            busy: Mutex::new(()),
        }
    }

    /// Serve pairing connections until `shutdown` changes.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            let stream = tokio::select! {
                r = listener.accept() => match r { Ok((s, _)) => s, Err(_) => continue },
                _ = shutdown.changed() => return,
            };
            let this = self.clone();
            tokio::spawn(async move {
                if let Err(e) = this.handle(stream).await {
                    tracing::warn!("pairing failed: {e}");
                }
            });
        }
    }

    // The upgrade callback's error type is tungstenite's.
    #[allow(clippy::result_large_err)]
    async fn handle(&self, stream: TcpStream) -> Result<(), PairingError> {
        let path = self.path.clone();
        let check_path = move |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
            if req.uri().path() == path {
                Ok(resp)
            } else {
                let mut e = ErrorResponse::new(Some("not found".into()));
                *e.status_mut() = http::StatusCode::NOT_FOUND;
                Err(e)
            }
        };
        let ws = tokio::time::timeout(
            STEP_TIMEOUT,
            tokio_tungstenite::accept_hdr_async_with_config(stream, check_path, Some(ws_config())),
        )
        .await
        .map_err(|_| PairingError::Timeout)?
        .map_err(|e| PairingError::WebSocket(e.to_string()))?;
        let Ok(_one_at_a_time) = self.busy.try_lock() else {
            return Err(PairingError::InvalidRequest(
                "a pairing is already running".into(),
            ));
        };
        let mut ws = ws;
        let mut hs = RemoteHandshake::new(
            self.config.clone(),
            self.identity.clone(),
            self.init_nonces.clone(),
        );
        let result = self.run(&mut ws, &mut hs).await;
        if let Err(PairingError::Handshake(e)) = &result {
            let _ = send_all(&mut ws, vec![hs.error_message(e)]).await;
        }
        let _ = ws.close(None).await;
        result
    }

    async fn run<S>(
        &self,
        ws: &mut WebSocketStream<S>,
        hs: &mut RemoteHandshake,
    ) -> Result<(), PairingError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut installed = false;
        loop {
            let text = next_text(ws).await?;
            match hs.on_message(&text, SystemTime::now())? {
                Progress::Continue(out) => {
                    if let (Some(i), false) = (hs.installed(), installed) {
                        self.sink.install(i).map_err(PairingError::Install)?;
                        installed = true;
                    }
                    send_all(ws, out).await?;
                }
                Progress::Done(out, done) => {
                    send_all(ws, out).await?;
                    self.sink.activate(&done).map_err(PairingError::Install)?;
                    tracing::info!(
                        "paired gateway_id={} pairing_id={} mtls_cert_fingerprint={}",
                        done.gateway_id,
                        done.pairing_id,
                        done.mtls_cert_fingerprint
                    );
                    return Ok(());
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// Gateway side.

/// Where to dial, checked: `ws://` only to a loopback host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub secure: bool,
    pub host: String,
    pub port: u16,
    pub path: String,
}

/// Parse and check a pairing endpoint.
pub fn parse_endpoint(endpoint: &str) -> Result<Endpoint, PairingError> {
    let invalid = |m: &str| PairingError::InvalidRequest(m.to_string());
    let (secure, rest) = if let Some(r) = endpoint.strip_prefix("ws://") {
        (false, r)
    } else if let Some(r) = endpoint.strip_prefix("wss://") {
        (true, r)
    } else {
        return Err(invalid("endpoint must be ws:// or wss://"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
            h.trim_start_matches('[').trim_end_matches(']'),
            p.parse::<u16>()
                .map_err(|_| invalid("endpoint port is not a number"))?,
        ),
        _ => (authority, if secure { 443 } else { 80 }),
    };
    if host.is_empty() {
        return Err(invalid("endpoint has no host"));
    }
    let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !secure && !loopback {
        return Err(PairingError::InsecureEndpoint(format!(
            "{endpoint}: ws:// is allowed only to loopback"
        )));
    }
    Ok(Endpoint {
        secure,
        host: host.to_string(),
        port,
        path: path.to_string(),
    })
}

/// Run a pairing from the gateway: dial, handshake, return the peer to record.
pub async fn pair(
    identity: Arc<GatewayIdentity>,
    request: PairRequest,
) -> Result<PairedPeer, PairingError> {
    tokio::time::timeout(PAIR_TIMEOUT, pair_inner(identity, request))
        .await
        .map_err(|_| PairingError::Timeout)?
}

async fn pair_inner(
    identity: Arc<GatewayIdentity>,
    request: PairRequest,
) -> Result<PairedPeer, PairingError> {
    let ep = parse_endpoint(&request.endpoint)?;
    if ep.secure {
        return Err(PairingError::InsecureEndpoint(
            "wss:// pairing is not available in this version; pair over loopback ws://".into(),
        ));
    }
    let tcp = TcpStream::connect((ep.host.as_str(), ep.port))
        .await
        .map_err(|e| PairingError::Dial(e.to_string()))?;
    let url = format!("ws://{}:{}{}", ep.host, ep.port, ep.path);
    let (mut ws, _) = tokio_tungstenite::client_async_with_config(url, tcp, Some(ws_config()))
        .await
        .map_err(|e| PairingError::Dial(e.to_string()))?;
    let (mut hs, init) = GatewayHandshake::start(identity, request, None, SystemTime::now())?;
    send_all(&mut ws, vec![init]).await?;
    loop {
        let text = next_text(&mut ws).await?;
        match hs.on_message(&text, SystemTime::now())? {
            Progress::Continue(out) => send_all(&mut ws, out).await?,
            Progress::Done(out, peer) => {
                send_all(&mut ws, out).await?;
                let _ = ws.close(None).await;
                return Ok(peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_websocket_only_to_loopback() {
        assert!(parse_endpoint("ws://127.0.0.1:7444/v1/pair").is_ok());
        assert!(parse_endpoint("ws://localhost:7444").is_ok());
        assert!(parse_endpoint("ws://[::1]:7444/v1/pair").is_ok());
        assert!(matches!(
            parse_endpoint("ws://10.0.0.1:5225"),
            Err(PairingError::InsecureEndpoint(_))
        ));
        assert!(matches!(
            parse_endpoint("http://127.0.0.1:1"),
            Err(PairingError::InvalidRequest(_))
        ));
        let e = parse_endpoint("wss://10.0.0.1:5225/v1/pair").unwrap();
        assert!(e.secure);
        assert_eq!((e.port, e.path.as_str()), (5225, "/v1/pair"));
    }
}
