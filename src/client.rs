//! A small HTTP client over TLS (with a client certificate), a Unix socket or plain loopback
//! TCP, speaking HTTP/1.1 or HTTP/2. Used by the demo and the tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::pki::Issued;

/// Where to connect.
#[derive(Clone)]
pub enum Transport {
    Tls {
        address: SocketAddr,
        config: Arc<ClientConfig>,
    },
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// An answer.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The trailer fields sent after the body, if any.
    pub trailers: Option<HeaderMap>,
}

impl Reply {
    /// The body as JSON (`null` if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// TLS 1.3 client settings trusting `ca_pem`, presenting `identity` when given.
pub fn tls_config(ca_pem: &str, identity: Option<&Issued>, h2: bool) -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("CA certificate");
    }
    let builder = ClientConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(id) => builder
            .with_client_auth_cert(
                vec![id.der.clone()],
                PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes()).expect("key PEM"),
            )
            .expect("client certificate"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = if h2 {
        vec![b"h2".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Arc::new(config)
}

/// One connection per request, or several requests on one ([`Client::open`]); enough for
/// demonstrations and tests.
#[derive(Clone)]
pub struct Client {
    transport: Transport,
    h2: bool,
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

impl Client {
    pub fn new(transport: Transport) -> Self {
        let h2 = matches!(&transport, Transport::Tls { config, .. } if config.alpn_protocols == [b"h2".to_vec()]);
        Client { transport, h2 }
    }

    async fn connect(&self) -> Result<Box<dyn Io>, String> {
        Ok(match &self.transport {
            Transport::Tls { address, config } => {
                let tcp = tokio::net::TcpStream::connect(address)
                    .await
                    .map_err(|e| format!("connect {address}: {e}"))?;
                let name = ServerName::from(address.ip());
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS handshake: {e}"))?;
                Box::new(tls)
            }
            Transport::Unix(p) => Box::new(
                tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(|e| format!("connect {}: {e}", p.display()))?,
            ),
            Transport::Tcp(a) => Box::new(
                tokio::net::TcpStream::connect(a)
                    .await
                    .map_err(|e| format!("connect {a}: {e}"))?,
            ),
        })
    }

    /// Send one request on a connection of its own and read the whole answer.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Reply, String> {
        self.open().await?.send(method, path, headers, body).await
    }

    /// Open one connection to send several requests on, one after the other.
    pub async fn open(&self) -> Result<Connection, String> {
        let io = TokioIo::new(self.connect().await?);
        let sender = if self.h2 {
            let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            Sender::H2(sender)
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            Sender::H1(sender)
        };
        Ok(Connection { sender })
    }

    /// `POST` a JSON value.
    pub async fn post_json(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: &serde_json::Value,
    ) -> Result<Reply, String> {
        self.send(Method::POST, path, headers, body.to_string())
            .await
    }
}

/// One open connection ([`Client::open`]).
pub struct Connection {
    sender: Sender,
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Connection {
    /// The server closed this connection (no request can be sent on it any more).
    pub fn is_closed(&self) -> bool {
        match &self.sender {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    /// Send a request on this connection and read the whole answer.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Reply, String> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::CONTENT_TYPE, "application/json");
        match self.sender {
            Sender::H1(_) => req = req.header(http::header::HOST, "localhost"),
            Sender::H2(_) => req = req.uri(format!("https://localhost{path}")),
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(body.into()))
            .map_err(|e| e.to_string())?;
        let resp = match &mut self.sender {
            Sender::H1(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
            Sender::H2(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
        }
        .map_err(|e| e.to_string())?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let collected = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        let trailers = collected.trailers().cloned();
        Ok(Reply {
            status,
            headers,
            body: collected.to_bytes(),
            trailers,
        })
    }
}

/// A signed Skill Gateway v1 `/run` body, as a caller such as Vagus sends it.
pub fn signed_run(
    secret: &[u8],
    skill_id: &str,
    capability: &str,
    input: serde_json::Value,
    timestamp_ms: u64,
    nonce: &str,
) -> serde_json::Value {
    let mut body = serde_json::json!({
        "gateway_protocol_version": "1.0",
        "skill_id": skill_id,
        "capability": capability,
        "input": input,
        "timestamp": timestamp_ms,
        "nonce": nonce,
    });
    let canonical = carapace_filters::canonical::canonical_string(&body).expect("canonical");
    body["signature"] = serde_json::json!(carapace_filters::canonical::hmac_sha256_hex(
        secret,
        canonical.as_bytes()
    ));
    body
}
