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
use super::wire::{PairError, WireMessage};

/// Largest pairing message accepted (as crabstack: 64 KiB).
pub use super::wire::MAX_MESSAGE_BYTES;
/// Longest wait for the peer's next message.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest whole handshake, gateway side.
pub const PAIR_TIMEOUT: Duration = Duration::from_secs(15);
/// Pairing connections served at once by a tool host (the rest are closed at accept).
pub const MAX_PAIRING_CONNECTIONS: usize = 4;

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
    #[error("pairing not confirmed, nothing recorded: {0}")]
    Unconfirmed(String),
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES))
}

/// Read the next text message, bounded in time and size.
async fn next_text<S>(
    ws: &mut WebSocketStream<S>,
    step_timeout: Duration,
) -> Result<String, PairingError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let msg = tokio::time::timeout(step_timeout, ws.next())
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
    /// The pairing `pairing_id` was installed but not activated (the gateway went away, a
    /// step failed or timed out): remove what `install` wrote.
    fn abandon(&self, _pairing_id: &str) {}
}

/// Abandons an installed pairing when dropped before [`Installing::activated`]: on failure,
/// and when the connection's time runs out (the task is dropped).
struct Installing<'a> {
    sink: &'a dyn PairingSink,
    pairing_id: Option<String>,
}

impl Installing<'_> {
    fn activated(mut self) {
        self.pairing_id = None;
    }
}

impl Drop for Installing<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.pairing_id.take() {
            tracing::warn!("pairing_id={id} abandoned before activation");
            self.sink.abandon(&id);
        }
    }
}

/// The tool host's pairing endpoint.
pub struct PairingEndpoint {
    pub config: RemoteConfig,
    pub identity: Arc<HostIdentity>,
    pub init_nonces: Arc<NonceStore>,
    pub path: String,
    pub sink: Arc<dyn PairingSink>,
    /// Longest wait for each of the gateway's messages.
    pub step_timeout: Duration,
    /// `wss://`: the endpoint's TLS (its certificate's fingerprint goes in `pair.identity`).
    tls: Option<tokio_rustls::TlsAcceptor>,
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
            step_timeout: STEP_TIMEOUT,
            tls: None,
            busy: Mutex::new(()),
        }
    }

    /// Serve `wss://` with this certificate chain and key; `pair.identity` then carries the
    /// fingerprint of the leaf, which the gateway checks against what it saw.
    pub fn with_tls(
        mut self,
        certs: Vec<rustls_pki_types::CertificateDer<'static>>,
        key: rustls_pki_types::PrivateKeyDer<'static>,
    ) -> Result<Self, PairingError> {
        let leaf = certs.first().ok_or_else(|| {
            PairingError::Install("no certificate for the pairing endpoint".into())
        })?;
        self.config.endpoint_tls_fingerprint = crate::tls::fingerprint(leaf);
        let config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
            .map_err(|e| PairingError::Install(e.to_string()))?;
        self.tls = Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)));
        Ok(self)
    }

    /// Serve pairing connections until `shutdown` changes: a few connections at a time, each
    /// bounded as a whole (pings do not extend it).
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_PAIRING_CONNECTIONS));
        // Pairings in flight end with the endpoint: abandoning one is safe (nothing is used
        // before `pair.complete`), and nothing of the endpoint outlives a shutdown.
        let mut connections = tokio::task::JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            let stream = tokio::select! {
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!("pairing accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = shutdown.changed() => {
                    connections.abort_all();
                    while connections.join_next().await.is_some() {}
                    return;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                continue;
            };
            let this = self.clone();
            connections.spawn(async move {
                let whole = this.step_timeout * 4;
                match tokio::time::timeout(whole, this.handle(stream)).await {
                    Ok(Err(e)) => tracing::warn!("pairing failed: {e}"),
                    Err(_) => tracing::warn!("pairing failed: not finished within {whole:?}"),
                    Ok(Ok(())) => {}
                }
                drop(slot);
            });
        }
    }

    async fn handle(&self, stream: TcpStream) -> Result<(), PairingError> {
        // Small messages, two of them back to back: no Nagle delay.
        let _ = stream.set_nodelay(true);
        match &self.tls {
            None => self.handle_stream(stream).await,
            Some(tls) => {
                let stream = tokio::time::timeout(self.step_timeout, tls.accept(stream))
                    .await
                    .map_err(|_| PairingError::Timeout)?
                    .map_err(|e| PairingError::WebSocket(format!("TLS: {e}")))?;
                self.handle_stream(stream).await
            }
        }
    }

    // The upgrade callback's error type is tungstenite's.
    #[allow(clippy::result_large_err)]
    async fn handle_stream<S>(&self, stream: S) -> Result<(), PairingError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
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
            self.step_timeout,
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
        // Say why, as crabstack's remote does; after `pair.complete` this tells the gateway
        // that the pairing was not activated. Local install errors stay in the log.
        match &result {
            Err(PairingError::Handshake(e)) => {
                let _ = send_all(&mut ws, vec![hs.error_message(e)]).await;
            }
            Err(PairingError::Install(_)) => {
                let refusal =
                    PairError::handshake_failed("the tool host could not install the pairing");
                let _ = send_all(&mut ws, vec![refusal.to_wire().unwrap_or_default()]).await;
            }
            _ => {}
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
        let mut installing: Option<Installing<'_>> = None;
        loop {
            let text = next_text(ws, self.step_timeout).await?;
            match hs.on_message(&text, SystemTime::now())? {
                Progress::Continue(out) => {
                    if let (Some(i), None) = (hs.installed(), &installing) {
                        // Armed first: a partial install is removed too.
                        installing = Some(Installing {
                            sink: self.sink.as_ref(),
                            pairing_id: Some(i.pairing_id.clone()),
                        });
                        self.sink.install(i).map_err(PairingError::Install)?;
                    }
                    send_all(ws, out).await?;
                }
                Progress::Done(out, done) => {
                    send_all(ws, out).await?;
                    self.sink.activate(&done).map_err(PairingError::Install)?;
                    if let Some(i) = installing.take() {
                        i.activated();
                    }
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
    let default_port = if secure { 443 } else { 80 };
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        // [v6] or [v6]:port
        let (h, tail) = rest
            .split_once(']')
            .ok_or_else(|| invalid("endpoint has an unclosed ["))?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| invalid("endpoint port is not a number"))?,
            None if tail.is_empty() => default_port,
            None => return Err(invalid("endpoint authority is malformed")),
        };
        (h, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .map_err(|_| invalid("endpoint port is not a number"))?,
            ),
            None => (authority, default_port),
        }
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

/// How the gateway records a paired peer; called before `pair.complete` is sent, so a peer
/// the gateway could not record is never told it is paired.
pub type RecordPeer<'a> = Box<dyn FnOnce(&PairedPeer) -> Result<(), String> + Send + 'a>;

/// How the peer ended the connection after `pair.complete`: what the gateway knows of the
/// activation from the pairing connection alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// A WebSocket close: a carapace tool host sends it once it has activated the pairing.
    Closed,
    /// `pair.error` (or anything else) instead: the peer did not activate the pairing.
    Refused(String),
    /// No close within the step timeout, a reset or EOF: the peer may have died before
    /// handling `pair.complete` (crabstack's sdk remote also just drops the connection).
    Vanished,
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ending::Closed => f.write_str("the peer closed the connection after pair.complete"),
            Ending::Refused(why) => write!(f, "the peer refused pair.complete: {why}"),
            Ending::Vanished => f.write_str("the peer went away without confirming pair.complete"),
        }
    }
}

/// A handshake that reached `pair.complete`. The peer was recorded before it; whether the
/// peer activated the pairing is not known from this alone (see [`Ending`]).
#[derive(Debug)]
pub struct Completed {
    pub peer: PairedPeer,
    pub ending: Ending,
}

/// Run a pairing from the gateway: dial, handshake, record the peer, complete.
pub async fn pair(
    identity: Arc<GatewayIdentity>,
    request: PairRequest,
    record: RecordPeer<'_>,
) -> Result<Completed, PairingError> {
    let deadline = tokio::time::Instant::now() + PAIR_TIMEOUT;
    pair_inner(identity, request, record, deadline).await
}

async fn pair_inner(
    identity: Arc<GatewayIdentity>,
    request: PairRequest,
    record: RecordPeer<'_>,
    deadline: tokio::time::Instant,
) -> Result<Completed, PairingError> {
    let ep = parse_endpoint(&request.endpoint)?;
    let tcp = tokio::time::timeout_at(deadline, TcpStream::connect((ep.host.as_str(), ep.port)))
        .await
        .map_err(|_| PairingError::Timeout)?
        .map_err(|e| PairingError::Dial(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let scheme = if ep.secure { "wss" } else { "ws" };
    let host = if ep.host.contains(':') {
        format!("[{}]", ep.host)
    } else {
        ep.host.clone()
    };
    let url = format!("{scheme}://{host}:{}{}", ep.port, ep.path);
    if !ep.secure {
        return run_gateway(tcp, &url, identity, request, None, record, deadline).await;
    }
    // wss://: the endpoint's certificate is not chained to anything the gateway knows; what
    // authenticates it is that the signed `pair.identity` names its fingerprint.
    let seen = Arc::new(std::sync::Mutex::new(None));
    let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| PairingError::Dial(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(RecordingVerifier {
            seen: seen.clone(),
            provider: crate::tls::provider(),
        }))
        .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from(ep.host.clone())
        .map_err(|e| PairingError::InvalidRequest(format!("endpoint host: {e}")))?;
    let connect = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp);
    let tls = tokio::time::timeout_at(deadline, connect)
        .await
        .map_err(|_| PairingError::Timeout)?
        .map_err(|e| PairingError::Dial(format!("TLS: {e}")))?;
    let fingerprint = seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or_else(|| PairingError::Dial("no certificate from the endpoint".into()))?;
    run_gateway(
        tls,
        &url,
        identity,
        request,
        Some(fingerprint),
        record,
        deadline,
    )
    .await
}

/// Records the fingerprint of the certificate the pairing endpoint presented; the handshake
/// then requires `pair.identity` to name it. Handshake signatures are still verified.
#[derive(Debug)]
struct RecordingVerifier {
    seen: Arc<std::sync::Mutex<Option<String>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for RecordingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(crate::tls::fingerprint(end_entity));
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The gateway's side of the conversation over an established stream, until `deadline`;
/// the peer is recorded before `pair.complete` is sent.
async fn run_gateway<S>(
    stream: S,
    url: &str,
    identity: Arc<GatewayIdentity>,
    request: PairRequest,
    endpoint_fingerprint: Option<String>,
    record: RecordPeer<'_>,
    deadline: tokio::time::Instant,
) -> Result<Completed, PairingError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let upgrade = tokio_tungstenite::client_async_with_config(url, stream, Some(ws_config()));
    let (mut ws, _) = tokio::time::timeout_at(deadline, upgrade)
        .await
        .map_err(|_| PairingError::Timeout)?
        .map_err(|e| PairingError::Dial(e.to_string()))?;
    let (mut hs, init) =
        GatewayHandshake::start(identity, request, endpoint_fingerprint, SystemTime::now())?;
    send_all(&mut ws, vec![init]).await?;
    let mut record = Some(record);
    loop {
        let text = tokio::time::timeout_at(deadline, next_text(&mut ws, STEP_TIMEOUT))
            .await
            .map_err(|_| PairingError::Timeout)??;
        match hs.on_message(&text, SystemTime::now())? {
            Progress::Continue(out) => send_all(&mut ws, out).await?,
            Progress::Done(out, peer) => {
                let record = record.take().expect("done once");
                record(&peer).map_err(PairingError::Install)?;
                send_all(&mut ws, out).await?;
                // The peer is recorded already, so this wait is not under the deadline.
                let ending = ending(&mut ws).await;
                let _ = ws.close(None).await;
                return Ok(Completed { peer, ending });
            }
        }
    }
}

/// Wait (one step at most) for how the peer ends the connection after `pair.complete`.
async fn ending<S>(ws: &mut WebSocketStream<S>) -> Ending
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let wait = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(_))) => return Ending::Closed,
                Some(Ok(Message::Text(t))) => {
                    return Ending::Refused(match super::wire::decode_message(t.as_str()) {
                        Ok(super::wire::PairMessage::Error(e)) => {
                            super::handshake::sanitized(&format!("{} {}", e.code, e.message))
                        }
                        _ => "a message after pair.complete".into(),
                    })
                }
                Some(Ok(_)) => continue,
                None | Some(Err(_)) => return Ending::Vanished,
            }
        }
    };
    tokio::time::timeout(STEP_TIMEOUT, wait)
        .await
        .unwrap_or(Ending::Vanished)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn plain_websocket_only_to_loopback() {
        assert!(parse_endpoint("ws://127.0.0.1:7444/v1/pair").is_ok());
        assert!(parse_endpoint("ws://localhost:7444").is_ok());
        assert!(parse_endpoint("ws://[::1]:7444/v1/pair").is_ok());
        let v6 = parse_endpoint("ws://[::1]/v1/pair").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 80));
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

    #[derive(Default)]
    struct Counting {
        installed: AtomicUsize,
        activated: AtomicUsize,
        abandoned: AtomicUsize,
        /// Activation fails (as when the listener's new TLS cannot be built).
        refuse_activation: std::sync::atomic::AtomicBool,
    }

    impl PairingSink for Counting {
        fn install(&self, _: &Installed) -> Result<(), String> {
            self.installed.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn activate(&self, _: &Installed) -> Result<(), String> {
            assert_eq!(
                self.installed.load(Ordering::SeqCst),
                1,
                "activated before install"
            );
            if self.refuse_activation.load(Ordering::SeqCst) {
                return Err("no TLS listener".into());
            }
            self.activated.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn abandon(&self, _: &str) {
            self.abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }

    struct Setup {
        _dir: tempfile::TempDir,
        gateway: Arc<GatewayIdentity>,
        sink: Arc<Counting>,
        url: String,
        _stop: watch::Sender<bool>,
    }

    async fn setup() -> Setup {
        setup_with(None).await
    }

    /// `tls`: serve wss:// with this certificate; `Some((_, wrong))` makes the endpoint claim
    /// another fingerprint in `pair.identity`.
    async fn setup_with(tls: Option<(crate::pki::Issued, bool)>) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let gateway =
            Arc::new(GatewayIdentity::load_or_create(&dir.path().join("gw"), "gw_t").unwrap());
        let host = Arc::new(HostIdentity::load_or_create(&dir.path().join("host")).unwrap());
        let sink = Arc::new(Counting::default());
        let nonces = NonceStore::open(
            carapace_filters::nonce::NonceStoreConfig {
                capacity: 16,
                ttl: Duration::from_secs(600),
                journal: None,
            },
            0,
        )
        .unwrap();
        let mut endpoint = PairingEndpoint::new(
            RemoteConfig {
                component_type: "tool_host".into(),
                component_id: "memory-east".into(),
                gateway_public_key_ed25519: gateway.public_key_ed25519(),
                endpoint_tls_fingerprint: String::new(),
            },
            host,
            Arc::new(nonces),
            "/v1/pair".into(),
            sink.clone(),
        );
        endpoint.step_timeout = Duration::from_millis(300);
        let scheme = if tls.is_some() { "wss" } else { "ws" };
        if let Some((cert, wrong)) = tls {
            use rustls_pki_types::pem::PemObject;
            let key =
                rustls_pki_types::PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap();
            endpoint = endpoint.with_tls(vec![cert.der.clone()], key).unwrap();
            if wrong {
                endpoint.config.endpoint_tls_fingerprint = format!("sha256:{}", "0".repeat(64));
            }
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("{scheme}://{}/v1/pair", listener.local_addr().unwrap());
        let (stop, stop_rx) = watch::channel(false);
        tokio::spawn(Arc::new(endpoint).serve(listener, stop_rx));
        Setup {
            _dir: dir,
            gateway,
            sink,
            url,
            _stop: stop,
        }
    }

    fn request(url: &str) -> PairRequest {
        PairRequest {
            component_type: "tool_host".into(),
            component_id: "memory-east".into(),
            endpoint: url.into(),
        }
    }

    async fn raw(url: &str) -> WebSocketStream<TcpStream> {
        let addr = url
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let tcp = TcpStream::connect(addr).await.unwrap();
        tokio_tungstenite::client_async(url, tcp).await.unwrap().0
    }

    /// The endpoint ends the connection (close frame, error or EOF) within a bounded time.
    async fn assert_closed(ws: &mut WebSocketStream<TcpStream>) {
        let end = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match ws.next().await {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                    Some(Ok(_)) => continue,
                }
            }
        })
        .await;
        assert!(end.is_ok(), "the endpoint kept the connection open");
    }

    #[tokio::test]
    async fn a_pairing_over_websocket_installs_before_confirming() {
        let s = setup().await;
        let done = pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(())))
            .await
            .unwrap();
        assert_eq!(done.peer.component_id, "memory-east");
        // The tool host closes once it has activated: the gateway saw it.
        assert_eq!(done.ending, Ending::Closed);
        assert_eq!(s.sink.installed.load(Ordering::SeqCst), 1);
        assert_eq!(s.sink.activated.load(Ordering::SeqCst), 1);
        assert_eq!(s.sink.abandoned.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_tool_host_that_cannot_activate_says_so_after_pair_complete() {
        let s = setup().await;
        s.sink.refuse_activation.store(true, Ordering::SeqCst);
        let done = pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(())))
            .await
            .unwrap();
        assert!(
            matches!(&done.ending, Ending::Refused(why) if why.contains("HANDSHAKE_FAILED")),
            "{:?}",
            done.ending
        );
        assert_eq!(s.sink.activated.load(Ordering::SeqCst), 0);
        assert_eq!(s.sink.abandoned.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn over_wss_the_identity_must_name_the_certificate_the_gateway_saw() {
        let ca = crate::pki::Authority::new("pairing endpoint CA");
        let s = setup_with(Some((ca.server(&["127.0.0.1"]), false))).await;
        assert!(s.url.starts_with("wss://"));
        let done = pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(())))
            .await
            .unwrap();
        assert_eq!(done.peer.component_id, "memory-east");
        assert_eq!(s.sink.activated.load(Ordering::SeqCst), 1);

        let s = setup_with(Some((ca.server(&["127.0.0.1"]), true))).await;
        let err = pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(())))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                PairingError::Handshake(HandshakeError::FingerprintMismatch)
            ),
            "{err}"
        );
        assert_eq!(s.sink.installed.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_oversized_frame_a_silent_peer_and_a_wrong_path_are_cut_off() {
        let s = setup().await;
        let mut ws = raw(&s.url).await;
        let _ = ws
            .send(Message::text("x".repeat(MAX_MESSAGE_BYTES + 1)))
            .await;
        assert_closed(&mut ws).await;
        let mut silent = raw(&s.url).await;
        assert_closed(&mut silent).await;
        let addr = s
            .url
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let wrong = s.url.replace("/v1/pair", "/v1/other");
        assert!(tokio_tungstenite::client_async(wrong, tcp).await.is_err());
        assert_eq!(s.sink.installed.load(Ordering::SeqCst), 0);
        // The endpoint still pairs afterwards.
        pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(())))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_gateway_that_stops_at_any_step_leaves_no_peer_activated() {
        // Stop after the gateway has sent 1 (init), 2 (+challenge), 3 (+csr_issued) messages.
        for stop_after in 1..=3 {
            let s = setup().await;
            let mut ws = raw(&s.url).await;
            let (mut hs, init) = GatewayHandshake::start(
                s.gateway.clone(),
                request(&s.url),
                None,
                SystemTime::now(),
            )
            .unwrap();
            let mut sent = 1;
            ws.send(Message::text(init)).await.unwrap();
            while sent < stop_after {
                let text = next_text(&mut ws, Duration::from_secs(5)).await.unwrap();
                if let Progress::Continue(out) = hs.on_message(&text, SystemTime::now()).unwrap() {
                    for m in out {
                        ws.send(Message::text(m)).await.unwrap();
                        sent += 1;
                    }
                }
            }
            drop(ws);
            // Give the endpoint time to notice, then check nothing was activated.
            tokio::time::sleep(Duration::from_millis(400)).await;
            assert_eq!(
                s.sink.activated.load(Ordering::SeqCst),
                0,
                "stopped after {stop_after} messages"
            );
            let installed = s.sink.installed.load(Ordering::SeqCst);
            assert_eq!(
                installed,
                usize::from(stop_after == 3),
                "after {stop_after}"
            );
            // What was installed is removed again.
            assert_eq!(s.sink.abandoned.load(Ordering::SeqCst), installed);
        }
    }
}
