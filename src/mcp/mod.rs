//! Model Context Protocol over Streamable HTTP: the front, in both protocol eras.
//!
//! - **2026-07-28** (modern, stateless): every request carries its version and client
//!   capabilities in `params._meta`, and mirrors `method` and the tool name into the
//!   `Mcp-Method` and `Mcp-Name` headers, which must agree with the body. It has no
//!   `initialize` and no `ping`: a request declaring it gets 404 and -32601 for them.
//! - **2025-03-26, 2025-06-18, 2025-11-25** (legacy): `initialize` negotiates a version and
//!   opens a session ([`session`]); later requests name it in `Mcp-Session-Id`.
//!
//! `tools/call` becomes the same internal call as on every other front, so the whole call
//! stage applies (authorization, rate limits, kill-switch, schemas, timeout).

pub mod back;
pub mod early;
pub mod front;
pub mod jsonrpc;
pub mod passthrough;
pub mod results;
pub mod session;
pub mod stream;
pub mod subscriptions;
pub mod wire;

pub use front::McpFront;
pub use jsonrpc::refusal_response;

/// The stateless revision.
pub const MODERN_VERSION: &str = "2026-07-28";
/// The handshake revisions served, newest first.
pub const LEGACY_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
/// Every revision served, newest first.
pub const SUPPORTED_VERSIONS: [&str; 4] = [
    MODERN_VERSION,
    LEGACY_VERSIONS[0],
    LEGACY_VERSIONS[1],
    LEGACY_VERSIONS[2],
];

/// `_meta` keys of a 2026-07-28 request: its protocol version and its client's capabilities.
pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// The revision a request declares (2026-07-28), or its session's (2025 revisions).
pub const PROTOCOL_VERSION_HEADER: http::HeaderName =
    http::HeaderName::from_static("mcp-protocol-version");
/// 2026-07-28: the request's JSON-RPC method, mirrored.
pub const METHOD_HEADER: http::HeaderName = http::HeaderName::from_static("mcp-method");
/// 2026-07-28: the name a `tools/call` (or `prompts/get`, ...) names, mirrored.
pub const NAME_HEADER: http::HeaderName = http::HeaderName::from_static("mcp-name");
/// 2025 revisions: the session a request belongs to.
pub const SESSION_HEADER: http::HeaderName = http::HeaderName::from_static("mcp-session-id");

/// How a mirrored header's value in the encoded form starts (`=?base64?…?=`).
pub const ENCODED_HEADER_PREFIX: &str = "=?base64?";

/// A mirrored header's value, with the `=?base64?…?=` form decoded (2026-07-28); borrowed
/// when it is plain.
pub fn decode_header_value(v: &str) -> Option<std::borrow::Cow<'_, str>> {
    use base64::Engine;
    match v
        .strip_prefix(ENCODED_HEADER_PREFIX)
        .and_then(|r| r.strip_suffix("?="))
    {
        Some(b64) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
            String::from_utf8(bytes).ok().map(Into::into)
        }
        None => Some(v.into()),
    }
}
