//! The protocol-neutral call model every front decodes to and every back encodes from.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::schema::CompiledSchema;

/// Who is calling, as established by the identity layer (never by a header from the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// `component_id` of the paired peer, or `local` for the Unix socket (shared: calls and
    /// their cancel names hold it without a copy).
    pub id: Arc<str>,
    /// `component_type` of the paired peer (`gateway`, `operator`, ...), or `local`.
    pub kind: String,
    /// `sha256:<hex>` fingerprint of the peer certificate; `None` on the Unix socket.
    pub fingerprint: Option<String>,
    /// Remote address of an unauthenticated caller, so that limits apply per address.
    pub remote_ip: Option<std::net::IpAddr>,
    /// What the caller may do; `None` grants nothing (default deny).
    pub permissions: Option<crate::authorization::SharedPermissions>,
    /// The identity headers' values, made once (leave it `Default::default()`).
    pub identity_values: crate::identity::IdentityValues,
}

impl Principal {
    /// The principal of the local Unix socket (no authentication, as the protocol says).
    pub fn local() -> Self {
        Principal {
            id: "local".into(),
            kind: "local".into(),
            fingerprint: None,
            remote_ip: None,
            permissions: Some(std::sync::Arc::new(
                crate::authorization::Permissions::all_tools("local"),
            )),
            identity_values: Default::default(),
        }
    }

    /// The key rate limits are kept under: the peer id, or for unauthenticated callers their
    /// address (one caller cannot spend another's budget).
    pub fn limit_key(&self) -> std::borrow::Cow<'_, str> {
        match self.remote_ip {
            Some(ip) => std::borrow::Cow::Owned(format!("{}@{ip}", self.id)),
            None => std::borrow::Cow::Borrowed(&self.id),
        }
    }

    /// The key the per-peer rate limit is kept under: [`Principal::limit_key`], except that an
    /// unauthenticated caller from IPv6 is keyed by its /64, the block one host or site is
    /// given: with one address per request it would otherwise take a new budget each time.
    /// (Idempotency keys stay per address: callers sharing a /64 must not see each other's
    /// answers.)
    pub fn rate_limit_key(&self) -> std::borrow::Cow<'_, str> {
        match self.remote_ip {
            Some(ip) => std::borrow::Cow::Owned(format!("{}@{}", self.id, AddressBlock(ip))),
            None => std::borrow::Cow::Borrowed(&self.id),
        }
    }
}

/// The block an unauthenticated caller's budgets are kept under, as it is written: an IPv6
/// address's /64 (the block one host or site is given), an IPv4 address itself. An IPv4
/// caller on a dual-stack listener comes as `::ffff:a.b.c.d`: its own address, not one /64
/// every IPv4 caller shares.
pub struct AddressBlock(pub std::net::IpAddr);

impl AddressBlock {
    /// The block as one address: an IPv6 address's first 64 bits (the rest zero), an IPv4
    /// address itself.
    pub fn key(&self) -> std::net::IpAddr {
        match self.0.to_canonical() {
            std::net::IpAddr::V6(v6) => {
                std::net::Ipv6Addr::from(u128::from(v6) & !(u64::MAX as u128)).into()
            }
            v4 => v4,
        }
    }
}

impl std::fmt::Display for AddressBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.key() {
            std::net::IpAddr::V6(block) => write!(f, "{block}/64"),
            v4 => v4.fmt(f),
        }
    }
}

/// One tool as served by the app, with its schemas compiled once at discovery.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    /// The name callers use.
    pub name: String,
    /// The app's own name for the tool, when it is served under another (`app.filter.rename`).
    pub app_name: Option<String>,
    /// The tool's definition as an MCP server gave it, when it came from one: the MCP front
    /// shows its `title`, `icons`, `annotations`, `execution` and `_meta` as they are.
    pub definition: Option<Arc<Value>>,
    pub description: String,
    pub input: CompiledSchema,
    pub output: Option<CompiledSchema>,
    pub timeout_ms_default: u64,
    pub timeout_ms_max: u64,
    pub idempotent: bool,
    pub side_effects: bool,
}

impl ToolSpec {
    /// The name the app knows the tool by.
    pub fn app_name(&self) -> &str {
        self.app_name.as_deref().unwrap_or(&self.name)
    }

    /// The call's timeout: its own `timeout_ms` (or the tool default), clamped to the tool max.
    pub fn effective_timeout(&self, requested_ms: Option<u64>) -> Duration {
        let ms = requested_ms
            .unwrap_or(self.timeout_ms_default)
            .clamp(1, self.timeout_ms_max.max(1));
        Duration::from_millis(ms)
    }
}

/// The credential fields of a Skill Gateway v1 `/run` call, extracted by the front. Its
/// `Debug` output shows none of the key, the signatures or the signed payload.
#[derive(Clone)]
pub struct SkillCredential {
    /// API key header value, when one was sent.
    pub api_key: Option<String>,
    /// Signature header value (e.g. `X-Skill-Signature`), when one was sent.
    pub header_signature: Option<String>,
    /// `signature` from the body.
    pub signature_hex: String,
    /// Canonical JSON of the six signed fields (what the HMAC covers).
    pub canonical: String,
    pub timestamp_ms: i64,
    pub nonce: String,
    /// Replay scope: nonces are unique per scope (the skill id), shared by the front's calls.
    pub scope: Arc<str>,
}

impl std::fmt::Debug for SkillCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SkillCredential")
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field(
                "header_signature",
                &self.header_signature.as_ref().map(|_| "<redacted>"),
            )
            .field("signature_hex", &"<redacted>")
            .field(
                "canonical",
                &format_args!("<{} bytes>", self.canonical.len()),
            )
            .field("timestamp_ms", &self.timestamp_ms)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// What authenticates a call beyond its connection.
#[derive(Debug, Clone)]
pub enum Credential {
    /// Nothing beyond the connection (tools-v1 over mTLS or the local socket).
    None,
    /// Skill Gateway v1 fields (boxed: a call is moved through every layer, and a call without
    /// them should not carry their room).
    Skill(Box<SkillCredential>),
}

/// A caller's context (tools-v1 `context`: who asked, in which session), checked by the front
/// and kept as the JSON object text the caller sent, which goes on to a tools-v1 app as it came.
/// Two contexts are equal, and show in `Debug`, as the JSON values they are.
#[derive(Clone)]
pub struct CallContext(Arc<str>);

impl CallContext {
    /// `json` is the text of one JSON object, already checked (the front's reader).
    pub fn from_checked_json(json: &str) -> Self {
        CallContext(Arc::from(json))
    }

    /// A context given as a value (an object).
    pub fn from_value(value: &Value) -> Self {
        CallContext(Arc::from(value.to_string()))
    }

    /// The context's JSON text.
    pub fn json(&self) -> &str {
        &self.0
    }

    /// The context as a value.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.0).expect("a context is one JSON object's text")
    }

    /// The string member `name`, when there is one. A text without the name (and without an
    /// escape, which could spell it) is not parsed.
    pub fn member(&self, name: &str) -> Option<String> {
        if !self.0.contains(name) && !self.0.contains('\\') {
            return None;
        }
        self.to_value().get(name)?.as_str().map(str::to_owned)
    }
}

impl PartialEq for CallContext {
    fn eq(&self, other: &Self) -> bool {
        self.to_value() == other.to_value()
    }
}

impl std::fmt::Debug for CallContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CallContext")
            .field(&self.to_value())
            .finish()
    }
}

/// One tool call, whatever front it came in on.
#[derive(Debug, Clone)]
pub struct ToolCall {
    /// The caller's id for the call (shared: the answer and the cancel name hold it without
    /// a copy).
    pub call_id: Arc<str>,
    pub tool: Arc<ToolSpec>,
    pub tenant_id: Option<String>,
    pub args: Value,
    pub context: Option<CallContext>,
    pub timeout_ms: Option<u64>,
    pub idempotency_key: Option<String>,
    pub principal: Arc<Principal>,
    pub credential: Credential,
    /// The call's request id (`x-request-id`: the caller's when sane, else one carapace
    /// made), sent on to the app.
    pub request_id: Option<http::HeaderValue>,
    /// Trace context headers (`traceparent`, `tracestate`) sent on to the app.
    pub trace_context: Vec<(http::HeaderName, http::HeaderValue)>,
    /// What a front hands its back beyond the call itself (as a request's extensions): the
    /// MCP front puts the caller's stream here, for the server's notifications and requests.
    pub extensions: http::Extensions,
}

// A call is moved through every layer of the call stage, and each move is a copy of it. Up to
// 256 bytes that copy is glibc's short one (eight vector moves, no loop). A call grown past it
// (measured at 264 bytes) cost each of its 9 moves about 23 instructions more.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<ToolCall>() <= 256);

/// The request id header carapace reads from callers, returns to them and sends to apps.
pub const REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");

/// The headers every back sends to its app for `call`, a JSON body's: who called (the
/// principal's [`crate::identity::PEER_ID`], [`crate::identity::PEER_TYPE`] and
/// [`crate::identity::PEER_FINGERPRINT`]), the call's request id and trace context, and
/// `content-type`. The map has room for what the back and the HTTP client add after.
pub fn app_headers(call: &ToolCall) -> http::HeaderMap {
    let mut headers = http::HeaderMap::with_capacity(APP_HEADERS);
    crate::identity::set_identity_headers(&mut headers, &call.principal);
    if let Some(id) = &call.request_id {
        headers.insert(REQUEST_ID, id.clone());
    }
    for (name, value) in trace_context(call) {
        headers.insert(name.clone(), value.clone());
    }
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers
}

/// [`app_headers`] as HTTP/1.1 header lines (`name: value` and CRLF), in the order the map
/// holds them, written straight into `out`: an unsigned request to the app needs no map.
pub fn write_app_headers(call: &ToolCall, out: &mut Vec<u8>) {
    let mut line = |name: &http::HeaderName, value: &[u8]| {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    };
    // From the principal's fields as they are, checked as a header value is: the shared values
    // `app_headers` inserts would cost a count taken and dropped, and a comparison, each.
    use crate::identity::{identity_value, PEER_FINGERPRINT, PEER_ID, PEER_TYPE};
    let p = &call.principal;
    line(&PEER_ID, identity_value(&p.id));
    line(&PEER_TYPE, identity_value(&p.kind));
    if let Some(f) = &p.fingerprint {
        line(&PEER_FINGERPRINT, identity_value(f));
    }
    if let Some(id) = &call.request_id {
        line(&REQUEST_ID, id.as_bytes());
    }
    for (name, value) in trace_context(call) {
        line(name, value.as_bytes());
    }
    line(&http::header::CONTENT_TYPE, b"application/json");
}

/// The call's trace context headers (`traceparent`, `tracestate`), each name once (the last
/// value given), and never one of the headers carapace sets itself.
fn trace_context(call: &ToolCall) -> impl Iterator<Item = &(http::HeaderName, http::HeaderValue)> {
    let ours = |n: &http::HeaderName| {
        n.as_str().starts_with(crate::identity::HEADER_PREFIX)
            || *n == REQUEST_ID
            || *n == http::header::CONTENT_TYPE
            || *n == http::header::HOST
            || *n == http::header::CONTENT_LENGTH
            || *n == http::header::TRANSFER_ENCODING
    };
    let all = &call.trace_context;
    all.iter()
        .enumerate()
        .filter(move |(i, (n, _))| !ours(n) && !all[i + 1..].iter().any(|(m, _)| m == n))
        .map(|(_, h)| h)
}

/// Room for an app request's headers: three identity headers, request id, two trace context
/// headers, `content-type`, a signature, `host` and `content-length`.
const APP_HEADERS: usize = 10;

/// What the app answered for a call that reached it.
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    /// The tool ran and produced `output` (checked against the output schema).
    Ok {
        output: Value,
        meta: Option<Value>,
        content: Option<ServerContent>,
    },
    /// The tool ran and reported an error of its own (passed through to the caller).
    AppError {
        code: String,
        message: String,
        details: Option<Value>,
        retryable: bool,
        content: Option<ServerContent>,
    },
}

/// An MCP server's own rendering of a tool's answer, which the MCP front passes on as it is.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerContent {
    /// The result's `content` blocks (text, images, resources, ...).
    pub blocks: Value,
    /// Whether the call's `output` is the server's `structuredContent`; otherwise `output` is
    /// `{"content": blocks}`, and the MCP front sends no `structuredContent`.
    pub structured: bool,
    /// The result's `_meta`, when the server gave one.
    pub meta: Option<Value>,
    /// A 2026-07-28 "input required" result's `inputRequests` and `requestState`: the MCP
    /// front gives them to a caller that can answer and retry.
    pub input_required: Option<Value>,
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use serde_json::json;

    /// A tool with a permissive input schema, a `{"n": integer}` output schema and the given
    /// timeouts.
    pub fn tool(name: &str, default_ms: u64, max_ms: u64) -> Arc<ToolSpec> {
        Arc::new(ToolSpec {
            name: name.into(),
            app_name: None,
            definition: None,
            description: String::new(),
            input: CompiledSchema::compile(json!({"type": "object"})).unwrap(),
            output: Some(
                CompiledSchema::compile(json!({
                    "type": "object",
                    "properties": {"n": {"type": "integer"}},
                    "required": ["n"]
                }))
                .unwrap(),
            ),
            timeout_ms_default: default_ms,
            timeout_ms_max: max_ms,
            idempotent: false,
            side_effects: false,
        })
    }

    pub fn call(tool: Arc<ToolSpec>, timeout_ms: Option<u64>) -> ToolCall {
        ToolCall {
            call_id: "c1".into(),
            tool,
            tenant_id: None,
            args: json!({}),
            context: None,
            timeout_ms,
            idempotency_key: None,
            principal: Arc::new(Principal::local()),
            request_id: None,
            trace_context: Vec::new(),
            extensions: Default::default(),
            credential: Credential::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{call, tool};
    use super::*;
    use http::{HeaderName, HeaderValue};

    fn from(ip: &str) -> Principal {
        Principal {
            id: "anonymous".into(),
            remote_ip: Some(ip.parse().unwrap()),
            ..Principal::local()
        }
    }

    #[test]
    fn an_ipv6_caller_is_rate_limited_by_its_64_and_an_ipv4_one_by_its_address() {
        let key = |ip: &str| from(ip).rate_limit_key().into_owned();
        assert_eq!(key("2001:db8:1:2::1"), "anonymous@2001:db8:1:2::/64");
        assert_eq!(key("2001:db8:1:2:ffff::9"), key("2001:db8:1:2::1"));
        assert_ne!(key("2001:db8:1:3::1"), key("2001:db8:1:2::1"));
        assert_eq!(key("192.0.2.7"), "anonymous@192.0.2.7");
        assert_eq!(key("::ffff:192.0.2.7"), "anonymous@192.0.2.7");
        assert_ne!(key("192.0.2.8"), key("192.0.2.7"));
        // Idempotency (and the rest) keep the whole address.
        assert_eq!(
            from("2001:db8:1:2::1").limit_key(),
            "anonymous@2001:db8:1:2::1"
        );
        assert_eq!(Principal::local().rate_limit_key(), "local");
    }

    /// The header lines `app_headers`' map would be written as.
    fn lines_of(map: &http::HeaderMap) -> String {
        map.iter()
            .map(|(n, v)| format!("{n}: {}\r\n", v.to_str().unwrap()))
            .collect()
    }

    fn written(c: &ToolCall) -> String {
        let mut out = Vec::new();
        write_app_headers(c, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_written_headers_are_the_maps_in_its_order() {
        let mut c = call(tool("t", 1_000, 5_000), None);
        assert_eq!(written(&c), lines_of(&app_headers(&c)));
        assert_eq!(
            written(&c),
            "x-carapace-peer-id: local\r\nx-carapace-peer-type: local\r\n\
             content-type: application/json\r\n"
        );
        c.principal = Arc::new(Principal {
            id: "gw-1".into(),
            kind: "gateway".into(),
            fingerprint: Some("sha256:ab".into()),
            ..Principal::local()
        });
        c.request_id = Some(HeaderValue::from_static("req-7"));
        let tp = HeaderName::from_static("traceparent");
        let ts = HeaderName::from_static("tracestate");
        c.trace_context = vec![
            (tp.clone(), HeaderValue::from_static("00-old")),
            (ts, HeaderValue::from_static("k=v")),
            (tp, HeaderValue::from_static("00-new")),
        ];
        assert_eq!(written(&c), lines_of(&app_headers(&c)));
        assert_eq!(
            written(&c),
            "x-carapace-peer-id: gw-1\r\nx-carapace-peer-type: gateway\r\n\
             x-carapace-peer-fingerprint: sha256:ab\r\nx-request-id: req-7\r\n\
             tracestate: k=v\r\ntraceparent: 00-new\r\ncontent-type: application/json\r\n"
        );
        // A field that is no header value is sent as `invalid`, never as a line of its own.
        c.principal = Arc::new(Principal {
            id: "gw-1\r\nx-carapace-peer-id: local".into(),
            kind: "gate\tway".into(),
            fingerprint: Some("sha256:\x7f".into()),
            ..Principal::local()
        });
        c.request_id = None;
        c.trace_context.clear();
        assert_eq!(written(&c), lines_of(&app_headers(&c)));
        assert_eq!(
            written(&c),
            "x-carapace-peer-id: invalid\r\nx-carapace-peer-type: gate\tway\r\n\
             x-carapace-peer-fingerprint: invalid\r\ncontent-type: application/json\r\n"
        );
    }

    /// Trace context never carries a header carapace sets: who called, the request id, the
    /// body's type and framing stay carapace's.
    #[test]
    fn trace_context_cannot_replace_carapaces_headers() {
        let mut c = call(tool("t", 1_000, 5_000), None);
        for name in [
            "x-carapace-peer-id",
            "x-request-id",
            "content-type",
            "content-length",
            "host",
            "transfer-encoding",
        ] {
            c.trace_context.push((
                HeaderName::from_static(name),
                HeaderValue::from_static("forged"),
            ));
        }
        let map = app_headers(&c);
        assert_eq!(map["x-carapace-peer-id"], "local");
        assert_eq!(map["content-type"], "application/json");
        for name in [
            "x-request-id",
            "content-length",
            "host",
            "transfer-encoding",
        ] {
            assert!(map.get(name).is_none(), "{name}");
        }
        assert!(!written(&c).contains("forged"));
    }
}
