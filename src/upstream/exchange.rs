//! One HTTP/1.1 exchange on a pooled connection, driven in the calling task: the request's
//! head and body written with one write, the answer's head parsed with `httparse` and its
//! body read whole (length, chunked, or to the connection's end), bounded.
//!
//! This is the path of every unsigned request whose answer is read whole (the tools-v1 and
//! skill-v1 backs); a request that is signed, or whose answer streams, goes through hyper's
//! connection (see `pool.rs`). Doing the exchange here saves the connection task, the
//! channel between it and the call, and hyper's request and answer types.

use std::future::Future;
use std::io::{self, Write as _};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::AppStream;

/// The most header lines an answer may have (hyper's default).
const MAX_HEADERS: usize = 100;
/// The longest answer head accepted, and the longest trailer section.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The longest chunk-size line accepted (the size and its extensions).
const MAX_CHUNK_LINE: usize = 4 * 1024;

/// A connection with the bytes read from it and not used yet.
pub(super) struct Conn<S = AppStream> {
    pub(super) stream: S,
    buf: BytesMut,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    pub(super) fn new(stream: S) -> Conn<S> {
        Conn {
            stream,
            buf: BytesMut::with_capacity(8 * 1024),
        }
    }

    /// Whether the other side closed (or wrote without being asked): checked, without
    /// waiting, before an idle connection is used again.
    pub(super) fn is_closed(&mut self) -> bool {
        let mut probe = [0u8; 1];
        let mut buf = ReadBuf::new(&mut probe);
        let mut cx = Context::from_waker(Waker::noop());
        !matches!(
            Pin::new(&mut self.stream).poll_read(&mut cx, &mut buf),
            Poll::Pending
        )
    }
}

/// An answer read whole.
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    /// The connection can take another request.
    pub(super) reusable: bool,
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ExchangeError {
    /// Writing the request failed: it may have reached the app in part.
    #[error("writing the request: {0}")]
    Write(io::Error),
    /// The connection ended before a byte of the answer arrived.
    #[error("the connection closed before an answer")]
    NoAnswer,
    #[error("reading the answer: {0}")]
    Read(io::Error),
    #[error("the answer is not HTTP/1.1: {0}")]
    Malformed(String),
    #[error("the answer is larger than {0} bytes")]
    TooLarge(usize),
}

/// The request's bytes: origin-form request line, `Host`, the header lines `headers` writes,
/// `Content-Length`, the body.
pub(super) fn request_bytes(
    method: &Method,
    path: &str,
    host: &HeaderValue,
    headers: impl FnOnce(&mut Vec<u8>),
    body: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(512 + body.len());
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    headers(&mut out);
    // Writing into a `Vec` cannot fail; the length is formatted in place.
    let _ = write!(out, "content-length: {}\r\n\r\n", body.len());
    out.extend_from_slice(body);
    out
}

/// `headers` as header lines, except the framing ones (`Host`, `Content-Length`,
/// `Transfer-Encoding`), which are carapace's.
pub(super) fn write_header_map(headers: &HeaderMap, out: &mut Vec<u8>) {
    for (name, value) in headers {
        if name == http::header::HOST
            || name == http::header::CONTENT_LENGTH
            || name == http::header::TRANSFER_ENCODING
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Write `request` on `conn` and read the answer to a request of `method`, its body at most
/// `max` bytes; its headers kept only with `keep_headers` (the framing ones are read either
/// way).
pub(super) async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut Conn<S>,
    request: &[u8],
    method: &Method,
    max: usize,
    keep_headers: bool,
) -> Result<Answer, ExchangeError> {
    conn.stream
        .write_all(request)
        .await
        .map_err(ExchangeError::Write)?;
    // A TLS stream may hold records back until flushed.
    conn.stream.flush().await.map_err(ExchangeError::Write)?;
    conn.buf.clear();
    // Nothing of the answer can be here yet: read before the first parse.
    let head = loop {
        if fill(conn).await? == 0 {
            return Err(if conn.buf.is_empty() {
                ExchangeError::NoAnswer
            } else {
                ExchangeError::Malformed("the connection closed in the answer's head".into())
            });
        }
        if let Some(head) = parse_head(&mut conn.buf, keep_headers)? {
            break head;
        }
        if conn.buf.len() > MAX_HEAD_BYTES {
            return Err(ExchangeError::Malformed("answer head too large".into()));
        }
    };
    let bodiless = *method == Method::HEAD
        || head.status == StatusCode::NO_CONTENT
        || head.status == StatusCode::NOT_MODIFIED;
    let (body, framed) = if bodiless {
        (Bytes::new(), true)
    } else if head.chunked {
        (read_chunked(conn, max).await?, true)
    } else if head.encoded {
        (read_to_end(conn, max).await?, false)
    } else if let Some(len) = head.length {
        (read_length(conn, len, max).await?, true)
    } else {
        (read_to_end(conn, max).await?, false)
    };
    Ok(Answer {
        status: head.status,
        headers: head.headers,
        body,
        reusable: framed && head.keep_alive && conn.buf.is_empty(),
    })
}

/// An answer's head, parsed.
struct Head {
    status: StatusCode,
    headers: HeaderMap,
    length: Option<usize>,
    /// A `Transfer-Encoding` was given; `chunked` when its last coding is chunked.
    encoded: bool,
    chunked: bool,
    keep_alive: bool,
}

async fn fill<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut Conn<S>,
) -> Result<usize, ExchangeError> {
    conn.buf.reserve(4 * 1024);
    conn.stream
        .read_buf(&mut conn.buf)
        .await
        .map_err(ExchangeError::Read)
}

/// The final (non-1xx) head at the start of `buf`, removed from it, its headers kept with
/// `keep`; `None` while incomplete.
fn parse_head(buf: &mut BytesMut, keep: bool) -> Result<Option<Head>, ExchangeError> {
    loop {
        // The parser writes the slots it fills: the rest (most of them) are never touched.
        let mut lines = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut resp, buf, &mut lines)
        {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(ExchangeError::Malformed(e.to_string())),
        };
        // The same bound whether the head came in one read or many.
        if len > MAX_HEAD_BYTES {
            return Err(ExchangeError::Malformed("answer head too large".into()));
        }
        let code = resp.code.unwrap_or(0);
        let status =
            StatusCode::from_u16(code).map_err(|e| ExchangeError::Malformed(e.to_string()))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(ExchangeError::Malformed(
                "an upgrade was not asked for".into(),
            ));
        }
        if status.is_informational() {
            let _ = buf.split_to(len);
            continue;
        }
        let mut head = Head {
            status,
            headers: HeaderMap::new(),
            length: None,
            encoded: false,
            chunked: false,
            // HTTP/1.0 answers end their connection.
            keep_alive: resp.version == Some(1),
        };
        if keep {
            head.headers.reserve(resp.headers.len());
        }
        for line in resp.headers.iter() {
            framing(&mut head, line.name, line.value)?;
            if keep {
                let name = HeaderName::from_bytes(line.name.as_bytes())
                    .map_err(|e| ExchangeError::Malformed(e.to_string()))?;
                let value = HeaderValue::from_bytes(line.value)
                    .map_err(|e| ExchangeError::Malformed(e.to_string()))?;
                head.headers.append(name, value);
            }
        }
        if head.encoded && head.length.is_some() {
            // RFC 9112 section 6.3: a sign of response splitting; refused.
            return Err(ExchangeError::Malformed(
                "both transfer-encoding and content-length".into(),
            ));
        }
        let _ = buf.split_to(len);
        return Ok(Some(head));
    }
}

/// What `Content-Length`, `Transfer-Encoding` and `Connection` say about the body and the
/// connection (RFC 9112 section 6).
fn framing(head: &mut Head, name: &str, value: &[u8]) -> Result<(), ExchangeError> {
    // Visible ASCII, spaces and tabs: what `HeaderValue::to_str` accepts.
    let text = || {
        value
            .iter()
            .all(|b| *b == b'\t' || (0x20..0x7f).contains(b))
            .then(|| std::str::from_utf8(value).ok())
            .flatten()
            .ok_or_else(|| ExchangeError::Malformed(format!("{name} is not text")))
    };
    if name.eq_ignore_ascii_case("content-length") {
        let digits = text()?.trim();
        let len: usize = digits
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| digits.parse().ok())
            .flatten()
            .ok_or_else(|| ExchangeError::Malformed("invalid content-length".into()))?;
        if head.length.is_some_and(|l| l != len) {
            return Err(ExchangeError::Malformed(
                "conflicting content-length".into(),
            ));
        }
        head.length = Some(len);
    } else if name.eq_ignore_ascii_case("transfer-encoding") {
        let last = text()?.rsplit(',').next().unwrap_or("").trim();
        head.encoded = true;
        head.chunked = last.eq_ignore_ascii_case("chunked");
        if !head.chunked {
            // Delimited by the connection's end.
            head.keep_alive = false;
        }
    } else if name.eq_ignore_ascii_case("connection") {
        for token in text()?.split(',').map(str::trim) {
            if token.eq_ignore_ascii_case("close") {
                head.keep_alive = false;
            }
        }
    }
    Ok(())
}

async fn read_length<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut Conn<S>,
    len: usize,
    max: usize,
) -> Result<Bytes, ExchangeError> {
    if len > max {
        return Err(ExchangeError::TooLarge(max));
    }
    while conn.buf.len() < len {
        if fill(conn).await? == 0 {
            return Err(ExchangeError::Malformed(
                "the connection closed in the answer's body".into(),
            ));
        }
    }
    Ok(conn.buf.split_to(len).freeze())
}

async fn read_to_end<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut Conn<S>,
    max: usize,
) -> Result<Bytes, ExchangeError> {
    // What came with the head counts too.
    loop {
        if conn.buf.len() > max {
            return Err(ExchangeError::TooLarge(max));
        }
        if fill(conn).await? == 0 {
            return Ok(conn.buf.split().freeze());
        }
    }
}

async fn read_chunked<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut Conn<S>,
    max: usize,
) -> Result<Bytes, ExchangeError> {
    let mut body = BytesMut::new();
    loop {
        let (at, size) = loop {
            match httparse::parse_chunk_size(&conn.buf) {
                // A size line starts with its size (an empty line is not a last chunk).
                Ok(httparse::Status::Complete((at, size)))
                    if at <= MAX_CHUNK_LINE
                        && conn.buf.first().is_some_and(u8::is_ascii_hexdigit) =>
                {
                    break (at, size)
                }
                Ok(httparse::Status::Partial) if conn.buf.len() <= MAX_CHUNK_LINE => {
                    more(conn).await?
                }
                _ => return Err(ExchangeError::Malformed("invalid chunk size".into())),
            }
        };
        let size = usize::try_from(size).map_err(|_| ExchangeError::TooLarge(max))?;
        if size == 0 {
            let _ = conn.buf.split_to(at);
            skip_trailers(conn).await?;
            return Ok(body.freeze());
        }
        // `body` is never over `max`, so this cannot overflow.
        if size > max - body.len() {
            return Err(ExchangeError::TooLarge(max));
        }
        while conn.buf.len() < at + size + 2 {
            more(conn).await?;
        }
        let _ = conn.buf.split_to(at);
        body.extend_from_slice(&conn.buf.split_to(size));
        if conn.buf.split_to(2).as_ref() != b"\r\n" {
            return Err(ExchangeError::Malformed("a chunk without its CRLF".into()));
        }
    }
}

/// The trailer section after the last chunk, up to its empty line.
async fn skip_trailers<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut Conn<S>,
) -> Result<(), ExchangeError> {
    let mut seen = 0;
    loop {
        if let Some(end) = conn.buf.windows(2).position(|w| w == b"\r\n") {
            let _ = conn.buf.split_to(end + 2);
            if end == 0 {
                return Ok(());
            }
            seen += end + 2;
            if seen > MAX_HEAD_BYTES {
                return Err(ExchangeError::Malformed("trailers too large".into()));
            }
            continue;
        }
        if seen + conn.buf.len() > MAX_HEAD_BYTES {
            return Err(ExchangeError::Malformed("trailers too large".into()));
        }
        more(conn).await?;
    }
}

async fn more<S: AsyncRead + AsyncWrite + Unpin>(conn: &mut Conn<S>) -> Result<(), ExchangeError> {
    if fill(conn).await? == 0 {
        return Err(ExchangeError::Malformed(
            "the connection closed in the answer's body".into(),
        ));
    }
    Ok(())
}

/// For the fuzz target and tests: `data` read as the answer to a `GET`, delivered `step` bytes
/// per read (0: all at once), its body at most `max` bytes, its headers kept or not; the
/// status and the body.
#[doc(hidden)]
pub fn read_answer(
    data: &[u8],
    step: usize,
    max: usize,
    keep_headers: bool,
) -> Result<(u16, Bytes), String> {
    let script = Script {
        data,
        step: if step == 0 { data.len().max(1) } else { step },
    };
    let mut conn = Conn::new(script);
    let exchange = std::pin::pin!(exchange(
        &mut conn,
        b"GET / HTTP/1.1\r\n\r\n",
        &Method::GET,
        max,
        keep_headers
    ));
    match exchange.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(answer)) => {
            assert!(answer.body.len() <= max, "a body over the bound");
            Ok((answer.status.as_u16(), answer.body))
        }
        Poll::Ready(Err(e)) => Err(e.to_string()),
        Poll::Pending => unreachable!("a script never waits"),
    }
}

/// A connection whose answer is given: it takes any write and reads `step` bytes at a time.
struct Script<'a> {
    data: &'a [u8],
    step: usize,
}

impl AsyncRead for Script<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = self.step.min(self.data.len()).min(buf.remaining());
        buf.put_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Script<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
