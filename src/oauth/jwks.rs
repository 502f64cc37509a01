//! The issuer's keys from its JWKS URL: fetched when a token names a key not held (at most
//! every `jwks_min_refresh_s`), and in the background once they are `jwks_max_age_s` old. A
//! failed fetch keeps the keys held; with none, every token is refused (fail closed).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use carapace_filters::bearer::KeySource;
use carapace_filters::BoxFuture;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use jsonwebtoken::jwk::JwkSet;
use rustls::ClientConfig;

/// Most bytes of a JWKS document.
const MAX_JWKS_BYTES: usize = 1 << 20;
/// Longest a fetch may take, connection included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

struct Held {
    keys: Arc<JwkSet>,
    fetched_at: Option<Instant>,
    last_try: Option<Instant>,
}

struct Inner {
    url: http::Uri,
    tls: Option<Arc<ClientConfig>>,
    min_refresh: Duration,
    max_age: Duration,
    held: Mutex<Held>,
    /// One fetch at a time; callers behind it get its keys.
    fetching: tokio::sync::Mutex<()>,
    /// A background refresh is spawned or running: stale keys start no other.
    refreshing: AtomicBool,
}

/// Keys from a JWKS URL.
#[derive(Clone)]
pub struct JwksUrl(Arc<Inner>);

impl JwksUrl {
    /// `ca_pem`: the CAs that sign the JWKS server's certificate (default: the web roots).
    pub fn new(
        url: http::Uri,
        ca_pem: Option<&[u8]>,
        min_refresh: Duration,
        max_age: Duration,
    ) -> Result<Self, String> {
        let tls = match url.scheme_str() {
            Some("https") => Some(client_tls(ca_pem)?),
            _ => None,
        };
        Ok(JwksUrl(Arc::new(Inner {
            url,
            tls,
            min_refresh,
            max_age,
            held: Mutex::new(Held {
                keys: Arc::new(JwkSet { keys: Vec::new() }),
                fetched_at: None,
                last_try: None,
            }),
            fetching: tokio::sync::Mutex::new(()),
            refreshing: AtomicBool::new(false),
        })))
    }
}

fn client_tls(ca_pem: Option<&[u8]>) -> Result<Arc<ClientConfig>, String> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            for c in rustls_pki_types::CertificateDer::pem_slice_iter(pem) {
                let c = c.map_err(|e| format!("jwks_ca_file: {e}"))?;
                roots.add(c).map_err(|e| format!("jwks_ca_file: {e}"))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let config = ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

impl Inner {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fetch unless one was tried within `min_refresh`; the keys held after.
    async fn refresh(self: Arc<Self>) -> Arc<JwkSet> {
        let _one = self.fetching.lock().await;
        {
            let mut held = self.held();
            if held
                .last_try
                .is_some_and(|t| t.elapsed() < self.min_refresh)
            {
                return held.keys.clone();
            }
            held.last_try = Some(Instant::now());
        }
        let fetched = tokio::time::timeout(FETCH_TIMEOUT, self.fetch()).await;
        let mut held = self.held();
        match fetched {
            Ok(Ok(keys)) => {
                tracing::info!(url = %self.url, keys = keys.keys.len(), "JWKS fetched");
                held.keys = Arc::new(keys);
                held.fetched_at = Some(Instant::now());
            }
            Ok(Err(e)) => tracing::warn!(url = %self.url, "JWKS fetch failed: {e}"),
            Err(_) => tracing::warn!(url = %self.url, "JWKS fetch timed out"),
        }
        held.keys.clone()
    }

    async fn fetch(&self) -> Result<JwkSet, String> {
        let host = self.url.host().ok_or("no host")?.to_owned();
        let tls = self.tls.is_some();
        let port = self.url.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let bare = host.trim_matches(|c| c == '[' || c == ']').to_owned();
        let tcp = tokio::net::TcpStream::connect((bare.as_str(), port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let path = self
            .url
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let authority = self.url.authority().map_or(host.clone(), |a| a.to_string());
        let req = http::Request::get(path)
            .header(http::header::HOST, authority)
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let resp = match &self.tls {
            Some(config) => {
                let name = rustls_pki_types::ServerName::try_from(bare)
                    .map_err(|e| format!("server name: {e}"))?;
                let io = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS: {e}"))?;
                send(TokioIo::new(io), req).await?
            }
            None => send(TokioIo::new(tcp), req).await?,
        };
        if resp.status() != http::StatusCode::OK {
            return Err(format!("HTTP {}", resp.status()));
        }
        let body = Limited::new(resp.into_body(), MAX_JWKS_BYTES)
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        crate::config::oauth::parse_jwks(&body)
    }
}

async fn send<T>(
    io: TokioIo<T>,
    req: http::Request<Empty<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    sender.send_request(req).await.map_err(|e| e.to_string())
}

/// Clears the background refresh's flag when its task ends, however it ends (done, panicked,
/// or dropped with its runtime), so a later stale read can start another.
struct Refreshing(Arc<Inner>);

impl Drop for Refreshing {
    fn drop(&mut self) {
        self.0.refreshing.store(false, Ordering::Release);
    }
}

impl KeySource for JwksUrl {
    /// The keys held; once they are `max_age` old, one refresh in the background (none while
    /// one runs, or within `min_refresh` of the last try: every request of a token reads the
    /// keys, and a JWKS host that fails or hangs must not make each one spawn a task).
    fn keys(&self) -> Arc<JwkSet> {
        let inner = &self.0;
        let (keys, due) = {
            let held = inner.held();
            let stale = held
                .fetched_at
                .is_some_and(|t| t.elapsed() >= inner.max_age);
            let tried = held
                .last_try
                .is_some_and(|t| t.elapsed() < inner.min_refresh);
            (held.keys.clone(), stale && !tried)
        };
        if due && !inner.refreshing.swap(true, Ordering::AcqRel) {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let done = Refreshing(inner.clone());
                    rt.spawn(async move {
                        done.0.clone().refresh().await;
                        drop(done);
                    });
                }
                Err(_) => inner.refreshing.store(false, Ordering::Release),
            }
        }
        keys
    }

    fn refresh(&self) -> BoxFuture<Arc<JwkSet>> {
        Box::pin(self.0.clone().refresh())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A JWKS host on loopback that answers its first request with one Ed25519 key and then
    /// takes connections without ever answering (a host that hangs).
    async fn host_that_then_hangs() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let body = r#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k1","alg":"EdDSA","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;
            let mut first = true;
            let mut held = Vec::new();
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                if first {
                    first = false;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    s.write_all(head.as_bytes()).await.unwrap();
                    s.write_all(body.as_bytes()).await.unwrap();
                } else {
                    held.push(s);
                }
            }
        });
        addr
    }

    #[tokio::test]
    async fn stale_keys_start_one_background_refresh_not_one_per_request() {
        let addr = host_that_then_hangs().await;
        let url: http::Uri = format!("http://{addr}/jwks").parse().unwrap();
        // Stale as soon as fetched; a failed or hanging fetch may be tried again after 1 s.
        let jwks = JwksUrl::new(url, None, Duration::from_secs(1), Duration::ZERO).unwrap();
        assert_eq!(KeySource::refresh(&jwks).await.keys.len(), 1);
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let before = tasks();
        // Within a second of the fetch: nothing is due, however many requests read the keys.
        for _ in 0..1000 {
            assert_eq!(jwks.keys().keys.len(), 1);
        }
        assert_eq!(tasks(), before);
        // Past it: one refresh, which hangs; the requests meanwhile spawn nothing more.
        jwks.0.held().last_try = Some(Instant::now() - Duration::from_secs(2));
        for _ in 0..1000 {
            assert_eq!(jwks.keys().keys.len(), 1, "the keys held are kept");
        }
        assert_eq!(tasks(), before + 1);
    }
}
