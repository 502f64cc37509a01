//! The pooled HTTP client to the app, over loopback TCP or a Unix socket (and to peers and
//! catalogs over TLS).

mod exchange;
mod pool;
mod waiting;

#[doc(hidden)]
pub use exchange::read_answer;
pub use pool::AppBody;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use carapace_filters::call::{write_app_headers, ToolCall};
use carapace_filters::Rejection;

use crate::config::{AppAddress, PoolConfig};

/// Connects to the app's address, whatever the request URI says: the app address comes only
/// from configuration.
#[derive(Debug, Clone)]
pub struct AppConnector {
    target: Arc<Target>,
    /// Longest wait for a connection (and, to a peer, its TLS handshake).
    connect_timeout: Duration,
}

/// Where a connector connects.
enum Target {
    /// The app, by configuration.
    App(AppAddress),
    /// A paired peer over mTLS (the outbound role).
    Tls {
        address: std::net::SocketAddr,
        config: Arc<rustls::ClientConfig>,
    },
    /// A host by name over TLS, its certificate checked for that name (EAT catalogs and
    /// the MCP servers they name).
    Named {
        host: String,
        port: u16,
        config: Arc<rustls::ClientConfig>,
    },
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::App(a) => write!(f, "{a:?}"),
            Target::Tls { address, .. } => write!(f, "mtls://{address}"),
            Target::Named { host, port, .. } => write!(f, "https://{host}:{port}"),
        }
    }
}

/// A connection to the app.
#[derive(Debug)]
pub enum AppStream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for AppStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AppStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            AppStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            AppStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for AppStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            AppStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            AppStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            AppStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AppStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            AppStream::Unix(s) => Pin::new(s).poll_flush(cx),
            AppStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AppStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            AppStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            AppStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl AppConnector {
    /// The app shares the machine's cores with carapace, so a busy worker batches its writes
    /// to it (through pools per worker); a remote target gets every call at once.
    fn writes(&self) -> pool::Writes {
        match *self.target {
            Target::App(_) => pool::Writes::AfterTheTurn,
            Target::Tls { .. } | Target::Named { .. } => pool::Writes::AtOnce,
        }
    }

    /// A new connection to the target, within the connect timeout.
    async fn connect(&self) -> io::Result<AppStream> {
        let limit = self.connect_timeout;
        tokio::time::timeout(limit, connect(&self.target))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {} ms", limit.as_millis()),
                )
            })?
    }
}

async fn connect(target: &Target) -> io::Result<AppStream> {
    Ok(match target {
        Target::App(AppAddress::Tcp(a)) => {
            let s = TcpStream::connect(a).await?;
            s.set_nodelay(true)?;
            AppStream::Tcp(s)
        }
        Target::App(AppAddress::Unix(p)) => AppStream::Unix(UnixStream::connect(p).await?),
        Target::Tls { address, config } => {
            let s = TcpStream::connect(address).await?;
            s.set_nodelay(true)?;
            // The peer is pinned by fingerprint, not by name (see the verifier).
            let name = rustls_pki_types::ServerName::from(address.ip());
            let tls = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name, s)
                .await?;
            AppStream::Tls(Box::new(tls))
        }
        Target::Named { host, port, config } => {
            let s = TcpStream::connect((host.as_str(), *port)).await?;
            s.set_nodelay(true)?;
            let name = rustls_pki_types::ServerName::try_from(host.trim_matches(['[', ']']))
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
                .to_owned();
            let tls = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name, s)
                .await?;
            AppStream::Tls(Box::new(tls))
        }
    })
}

/// Pooled client to the app.
#[derive(Clone)]
pub struct AppClient {
    /// One pool per worker (see [`Self::pooled_per_worker`]).
    pools: Arc<pool::Pools>,
    idle_timeout: Duration,
    max_idle: usize,
    authority: Arc<str>,
    /// `Host` of every request.
    host: http::HeaderValue,
    max_response_bytes: usize,
    /// Signs every request (RFC 9421), when the other side asks for it.
    signer: Option<Arc<dyn carapace_filters::http_signature::MessageSigner>>,
    /// `https` to a peer over TLS, else `http`: the scheme of the signed `@target-uri`.
    scheme: &'static str,
}

impl std::fmt::Debug for AppClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppClient")
            .field("authority", &self.authority)
            .finish()
    }
}

/// The app's answer, read whole.
#[derive(Debug)]
pub struct AppResponse {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl AppClient {
    pub fn new(address: AppAddress, pool: &PoolConfig, max_response_bytes: u64) -> Self {
        let authority: Arc<str> = match &address {
            AppAddress::Tcp(a) => a.to_string().into(),
            AppAddress::Unix(_) => "localhost".into(),
        };
        Self::build(Target::App(address), authority, pool, max_response_bytes)
    }

    /// A client to a paired peer over mTLS with `config` (client certificate and pinned
    /// server verifier).
    pub fn mtls(
        address: std::net::SocketAddr,
        config: Arc<rustls::ClientConfig>,
        pool: &PoolConfig,
        max_response_bytes: u64,
    ) -> Self {
        let authority = address.to_string().into();
        Self::build(
            Target::Tls { address, config },
            authority,
            pool,
            max_response_bytes,
        )
    }

    /// A client to `https://host:port`, the server's certificate checked for `host` by
    /// `config`.
    pub fn named(
        host: &str,
        port: u16,
        config: Arc<rustls::ClientConfig>,
        pool: &PoolConfig,
        max_response_bytes: u64,
    ) -> Self {
        let authority = format!("{host}:{port}").into();
        let target = Target::Named {
            host: host.to_owned(),
            port,
            config,
        };
        Self::build(target, authority, pool, max_response_bytes)
    }

    fn build(target: Target, authority: Arc<str>, pool: &PoolConfig, max: u64) -> Self {
        let scheme = match target {
            Target::Tls { .. } | Target::Named { .. } => "https",
            Target::App(_) => "http",
        };
        let connector = AppConnector {
            target: Arc::new(target),
            connect_timeout: Duration::from_millis(pool.connect_timeout_ms),
        };
        let idle_timeout = Duration::from_secs(pool.idle_timeout_s);
        AppClient {
            pools: Arc::new(pool::Pools::new(
                1,
                connector,
                idle_timeout,
                pool.max_idle,
                pool::Writes::AtOnce,
            )),
            idle_timeout,
            max_idle: pool.max_idle,
            host: http::HeaderValue::from_str(&authority)
                .unwrap_or_else(|_| http::HeaderValue::from_static("localhost")),
            authority,
            max_response_bytes: max as usize,
            signer: None,
            scheme,
        }
    }

    /// A pool of connections for each of `workers` (see [`crate::server::Workers`]): a call
    /// uses its worker's pool, so the connection's task and the call run on one thread.
    /// A busy worker's calls to the app are written after the rest of its event loop's turn
    /// (`waiting.rs`); a client without pools per worker writes every call at once.
    pub fn pooled_per_worker(mut self, workers: usize) -> Self {
        let connector = self.pools.connector().clone();
        let writes = connector.writes();
        let pools = pool::Pools::new(workers, connector, self.idle_timeout, self.max_idle, writes);
        self.pools = Arc::new(pools);
        self
    }

    /// Sign every request with `signer` (RFC 9421: `@method`, `@target-uri`,
    /// `content-digest`, a fresh nonce, `created` from the system clock).
    pub fn with_signer(
        mut self,
        signer: Arc<dyn carapace_filters::http_signature::MessageSigner>,
    ) -> Self {
        self.signer = Some(signer);
        self
    }

    /// A human-readable base URL for logs.
    pub fn base_url(&self) -> String {
        format!("{}://{}", self.scheme, self.authority)
    }

    /// Send one request and read the whole answer (bounded). Dropping the future drops the
    /// request, closing its connection: that is the hard stop of a timed-out call.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: http::HeaderMap,
        body: Bytes,
    ) -> Result<AppResponse, Rejection> {
        use tracing::Instrument;
        let span = tracing::debug_span!("upstream", path);
        self.send_inner(method, path, headers, body)
            .instrument(span)
            .await
    }

    async fn send_inner(
        &self,
        method: Method,
        path: &str,
        headers: http::HeaderMap,
        body: Bytes,
    ) -> Result<AppResponse, Rejection> {
        if self.signer.is_none() {
            let write_headers = |out: &mut Vec<u8>| exchange::write_header_map(&headers, out);
            let answer = self
                .exchange(&method, path, write_headers, &body, true)
                .await?;
            return Ok(AppResponse {
                status: answer.status,
                headers: answer.headers,
                body: answer.body,
            });
        }
        // Boxed: a signed request's future (hyper's client) is more than twice the unsigned
        // exchange's, which every call's future would carry, and copy as it is moved, otherwise.
        let open = Box::pin(self.open(method, path, headers, body)).await?;
        let body = open
            .body
            .collect()
            .await
            .map_err(|e| Rejection::AppInvalid(format!("reading answer: {e}")))?
            .to_bytes();
        Ok(AppResponse {
            status: open.status,
            headers: open.headers,
            body,
        })
    }

    /// An unsigned request whose answer is read whole: one exchange carapace drives itself
    /// (`exchange.rs`), the header lines written by `headers`, the answer's headers kept with
    /// `keep_headers`.
    async fn exchange(
        &self,
        method: &Method,
        path: &str,
        headers: impl FnOnce(&mut Vec<u8>),
        body: &[u8],
        keep_headers: bool,
    ) -> Result<exchange::Answer, Rejection> {
        let request = self.request_bytes(method, path, headers, body)?;
        Ok(self
            .pools
            .exchange(&request, method, self.max_response_bytes, keep_headers)
            .await?)
    }

    /// An unsigned request's bytes, for the pools' exchange.
    fn request_bytes(
        &self,
        method: &Method,
        path: &str,
        headers: impl FnOnce(&mut Vec<u8>),
        body: &[u8],
    ) -> Result<Vec<u8>, Rejection> {
        origin_form(path)?;
        Ok(exchange::request_bytes(
            method, path, &self.host, headers, body,
        ))
    }

    /// POST a call's JSON `body` to `path` with the call's headers
    /// ([`carapace_filters::call::app_headers`]) and read the whole answer (bounded), for a
    /// back that needs only its status and body. Unsigned, the headers are written straight
    /// into the request and the answer's are not kept; signed, it is [`Self::send`].
    ///
    /// The body is a `Vec`: unsigned, it is copied into the request as it is; only the signed
    /// path makes it `Bytes` (which, for a `Vec` with room to spare, is an allocation).
    pub async fn post_call(
        &self,
        path: &str,
        call: &ToolCall,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Bytes), Rejection> {
        if self.signer.is_some() {
            let headers = carapace_filters::call::app_headers(call);
            // Boxed: its future is larger than the unsigned path's, which would carry it.
            let resp = Box::pin(self.send(Method::POST, path, headers, Bytes::from(body))).await?;
            return Ok((resp.status, resp.body));
        }
        use tracing::Instrument;
        let span = tracing::debug_span!("upstream", path);
        let write_headers = |out: &mut Vec<u8>| write_app_headers(call, out);
        // The pools' exchange awaited here, not through `exchange`: one future fewer to build
        // and move per call.
        let request = self.request_bytes(&Method::POST, path, write_headers, &body)?;
        let answer = self
            .pools
            .exchange(&request, &Method::POST, self.max_response_bytes, false)
            .instrument(span)
            .await?;
        Ok((answer.status, answer.body))
    }

    /// Send one request and return the answer's head, with its body still to be read (bounded
    /// as in [`Self::send`]): for answers that stream, such as an MCP server's SSE.
    pub async fn open(
        &self,
        method: Method,
        path: &str,
        headers: http::HeaderMap,
        body: Bytes,
    ) -> Result<OpenResponse, Rejection> {
        let uri = http::Uri::try_from(path).map_err(|e| Rejection::Internal(e.to_string()))?;
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Full::new(body.clone()))
            .map_err(|e| Rejection::Internal(e.to_string()))?;
        *req.headers_mut() = headers;
        // The authority signed is the one sent.
        req.headers_mut()
            .insert(http::header::HOST, self.host.clone());
        if let Some(signer) = &self.signer {
            let nonce = hex::encode(rand::random::<[u8; 16]>());
            let created = carapace_filters::unix_now_ms() / 1000;
            carapace_filters::http_signature::sign_request(
                &mut req,
                &body,
                self.scheme,
                signer.as_ref(),
                created,
                &nonce,
            );
        }
        let (resp, lease) = self.pools.send(req).await?;
        let (head, body) = resp.into_parts();
        Ok(OpenResponse {
            status: head.status,
            headers: head.headers,
            body: Limited::new(AppBody::new(body, lease), self.max_response_bytes),
        })
    }
}

/// A path written into the request line as it is: origin-form, visible ASCII only (no
/// space, CR or LF).
fn origin_form(path: &str) -> Result<(), Rejection> {
    if path.starts_with('/') && path.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        Ok(())
    } else {
        Err(Rejection::Internal(format!(
            "not an origin-form path: {path}"
        )))
    }
}

/// How a failed exchange reads to the caller: nothing sent means the app is unavailable;
/// anything after the write means its answer is not one.
impl From<pool::Failure> for Rejection {
    fn from(failure: pool::Failure) -> Rejection {
        match failure {
            pool::Failure::Unsent(e) => Rejection::AppUnavailable(e),
            pool::Failure::Sent(e) => {
                Rejection::AppInvalid(format!("after the request was sent: {e}"))
            }
            pool::Failure::TooLarge(e) => Rejection::AppInvalid(format!("reading answer: {e}")),
        }
    }
}

/// An answer whose body is read as it arrives.
pub struct OpenResponse {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Limited<AppBody>,
}

#[cfg(test)]
mod tests;
