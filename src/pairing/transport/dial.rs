//! The gateway side: dials a tool host's pairing endpoint and runs the handshake over it.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// Largest pairing message accepted (as crabstack: 64 KiB).
use super::{next_text, send_all, ws_config, PairingError, PAIR_TIMEOUT, STEP_TIMEOUT};
use crate::pairing::handshake::{GatewayHandshake, PairRequest, PairedPeer, Progress};
use crate::pairing::identity::GatewayIdentity;

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
                    return Ending::Refused(
                        match crate::pairing::wire::decode_message(t.as_str()) {
                            Ok(crate::pairing::wire::PairMessage::Error(e)) => {
                                crate::pairing::handshake::sanitized(&format!(
                                    "{} {}",
                                    e.code, e.message
                                ))
                            }
                            _ => "a message after pair.complete".into(),
                        },
                    )
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
