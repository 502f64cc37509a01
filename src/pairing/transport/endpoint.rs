//! The tool host's pairing endpoint: a WebSocket (optionally TLS) listener that runs the remote side of the handshake.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use carapace_filters::nonce::NonceStore;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Mutex};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::WebSocketStream;

/// Largest pairing message accepted (as crabstack: 64 KiB).
use super::{
    next_text, send_all, ws_config, PairingError, MAX_PAIRING_CONNECTIONS,
    MAX_PAIRING_CONNECTIONS_PER_ADDRESS, STEP_TIMEOUT,
};
use crate::pairing::handshake::{Installed, Progress, RemoteConfig, RemoteHandshake};
use crate::pairing::identity::HostIdentity;
use crate::pairing::wire::{PairError, WireMessage};

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
        let per_address =
            crate::connections::AddressPlaces::new(MAX_PAIRING_CONNECTIONS_PER_ADDRESS);
        // Pairings in flight end with the endpoint: abandoning one is safe (nothing is used
        // before `pair.complete`), and nothing of the endpoint outlives a shutdown.
        let mut connections = tokio::task::JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            let (stream, from) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(s) => s,
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
            let Some(place) = per_address.take(from.ip()) else {
                tracing::info!(%from, "pairing connection closed: its address holds its most");
                continue;
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
                drop((slot, place));
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
            Err(PairingError::InvalidRequest(why)) => {
                let refusal = PairError::handshake_failed(why);
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
        // One pairing at a time, counted from a `pair.init` whose signature verified: a
        // connection that sends nothing (or anything unsigned) holds no pairing back.
        let mut one_at_a_time = None;
        loop {
            let text = next_text(ws, self.step_timeout).await?;
            let progress = hs.on_message(&text, SystemTime::now())?;
            if one_at_a_time.is_none() {
                let running = self.busy.try_lock();
                let refused =
                    || PairingError::InvalidRequest("a pairing is already running".into());
                one_at_a_time = Some(running.map_err(|_| refused())?);
            }
            match progress {
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
