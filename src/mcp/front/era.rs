//! The era a request is served in, decided from its metadata and headers: a 2026-07-28
//! request's `_meta` and mirrored headers are checked here; an older one must name a live
//! session.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request};
use serde_json::{Map, Value};

use carapace_filters::call::Principal;
use carapace_filters::Rejection;

use super::McpFront;
use crate::mcp::back::relay::ClientFeatures;
use crate::mcp::jsonrpc::McpError;
use crate::mcp::session::SessionRefused;
use crate::mcp::wire::CallParams;
use crate::mcp::{decode_header_value, ENCODED_HEADER_PREFIX, LEGACY_VERSIONS, MODERN_VERSION};
use crate::mcp::{META_CAPABILITIES, META_VERSION};
use crate::mcp::{METHOD_HEADER, NAME_HEADER, PROTOCOL_VERSION_HEADER, SESSION_HEADER};

/// Which protocol era a request is served in.
pub(super) enum Era {
    /// 2026-07-28: stateless, checked per request.
    Modern,
    /// A handshake-era request in a live session, at the session's version.
    Legacy(LiveSession),
}

/// An older-era session a request names.
pub(super) struct LiveSession {
    pub(super) id: String,
    /// The version negotiated for the session: one of [`LEGACY_VERSIONS`].
    pub(super) version: &'static str,
    /// What the client can answer of the server's requests.
    pub(super) features: ClientFeatures,
}

impl McpFront {
    /// Decide the era, and check the request's metadata for it.
    pub(super) fn era(
        &self,
        req: &Request<Bytes>,
        method: &str,
        declared: &Declared,
        principal: &Principal,
    ) -> Result<Era, McpError> {
        if !declares_modern(req, declared) {
            return match self.session_of(req, principal)? {
                Some(s) => Ok(Era::Legacy(s)),
                None => Err(McpError::Session(format!(
                    "send `initialize` first and then `{SESSION_HEADER}` (2025 revisions), or \
                     `params._meta` with `{META_VERSION}` ({MODERN_VERSION})"
                ))),
            };
        }
        if !declared.meta {
            return Err(McpError::MissingMeta("`params._meta` is required".into()));
        }
        let version = declared
            .version
            .and_then(Value::as_str)
            .ok_or_else(|| McpError::MissingMeta(format!("`_meta.{META_VERSION}` is required")))?;
        agree(req.headers(), &PROTOCOL_VERSION_HEADER, version)?;
        if version != MODERN_VERSION {
            return Err(McpError::UnsupportedVersion(version.into()));
        }
        if !declared.capabilities.is_some_and(Value::is_object) {
            return Err(McpError::MissingMeta(format!(
                "`_meta.{META_CAPABILITIES}` (an object) is required"
            )));
        }
        agree(req.headers(), &METHOD_HEADER, method)?;
        if let Some(name) = declared.named {
            agree(req.headers(), &NAME_HEADER, name.unwrap_or(""))?;
        }
        Ok(Era::Modern)
    }

    /// The live session named in the request, if it names one.
    pub(super) fn session_of(
        &self,
        req: &Request<Bytes>,
        principal: &Principal,
    ) -> Result<Option<LiveSession>, McpError> {
        let Some(id) = req.headers().get(&SESSION_HEADER) else {
            return Ok(None);
        };
        let id = id.to_str().map_err(|_| McpError::SessionNotFound)?;
        let claims = self
            .sessions
            .resume(id, &principal.id, (self.clock)())
            .map_err(session_error)?;
        // `resume` refuses a session sealed at a version this build does not serve.
        let version = claims.served_version().ok_or(McpError::SessionNotFound)?;
        // The session's version governs; the header must name a handshake-era version
        // carapace serves (the reference SDK servers take any of them within a session).
        match header(req.headers(), &PROTOCOL_VERSION_HEADER) {
            Some(v) if !LEGACY_VERSIONS.contains(&v) => Err(McpError::Session(format!(
                "{PROTOCOL_VERSION_HEADER} `{v}` is not a version of this session's era"
            ))),
            _ => Ok(Some(LiveSession {
                id: id.to_owned(),
                features: claims.features(),
                version,
            })),
        }
    }
}

pub(super) fn session_error(e: SessionRefused) -> McpError {
    match e {
        SessionRefused::NotFound => McpError::SessionNotFound,
        SessionRefused::Full => McpError::Refused(Rejection::Overloaded),
    }
}

/// What the era decision reads of a request's `params`.
pub(super) struct Declared<'a> {
    /// `_meta` is an object.
    meta: bool,
    /// `_meta`'s protocol version and client capabilities, as given.
    version: Option<&'a Value>,
    capabilities: Option<&'a Value>,
    /// For a method that names what it acts on (`tools/call`, `prompts/get`:
    /// `name`; `resources/read`: `uri`): that name, when a string.
    named: Option<Option<&'a str>>,
}

impl<'a> Declared<'a> {
    pub(super) fn of(method: &str, params: &'a Map<String, Value>) -> Self {
        let meta = params.get("_meta").and_then(Value::as_object);
        let key = match method {
            "tools/call" | "prompts/get" => Some("name"),
            "resources/read" => Some("uri"),
            _ => None,
        };
        Declared {
            meta: meta.is_some(),
            version: meta.and_then(|m| m.get(META_VERSION)),
            capabilities: meta.and_then(|m| m.get(META_CAPABILITIES)),
            named: key.map(|k| params.get(k).and_then(Value::as_str)),
        }
    }

    pub(super) fn of_call(params: &'a CallParams) -> Self {
        let meta = params.meta.as_ref();
        Declared {
            meta: meta.is_some(),
            version: meta.and_then(|m| m.version.as_ref()),
            capabilities: meta.and_then(|m| m.capabilities.as_ref()),
            named: Some(params.name.as_deref()),
        }
    }
}

/// Whether a request asks for 2026-07-28: a version in `params._meta`, or the version header.
pub(super) fn declares_modern(req: &Request<Bytes>, declared: &Declared) -> bool {
    declared.version.is_some()
        || header(req.headers(), &PROTOCOL_VERSION_HEADER) == Some(MODERN_VERSION)
}

/// A header's value when present and text.
pub(super) fn header<'a>(h: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A 2026-07-28 mirrored header must be present and, decoded, equal the body's value.
fn agree(h: &HeaderMap, name: &HeaderName, body: &str) -> Result<(), McpError> {
    let Some(raw) = h.get(name) else {
        return Err(McpError::HeaderMismatch(format!(
            "the `{name}` header is required"
        )));
    };
    // The usual case, decided without checking the header's text byte by byte: the header is
    // the body's (ASCII) value as it is. An ASCII header value is text, and one that is not in
    // the encoded form is its own decoding, so this is the answer of the full check below.
    if raw.as_bytes() == body.as_bytes()
        && body.is_ascii()
        && !body.starts_with(ENCODED_HEADER_PREFIX)
    {
        return Ok(());
    }
    let value = raw
        .to_str()
        .ok()
        .and_then(decode_header_value)
        .ok_or_else(|| McpError::HeaderMismatch(format!("the `{name}` header is malformed")))?;
    if value != body {
        return Err(McpError::HeaderMismatch(format!(
            "the `{name}` header does not match the body"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn agrees(raw: &[u8], body: &str) -> Result<(), String> {
        let mut h = HeaderMap::new();
        h.insert(NAME_HEADER, HeaderValue::from_bytes(raw).unwrap());
        agree(&h, &NAME_HEADER, body).map_err(|e| match e {
            McpError::HeaderMismatch(why) => why,
            other => panic!("not a header mismatch: {other:?}"),
        })
    }

    #[test]
    fn a_header_agrees_with_the_body_as_it_is_or_in_the_encoded_form() {
        assert_eq!(agrees(b"memory.query", "memory.query"), Ok(()));
        // "café" in the encoded form.
        assert_eq!(agrees(b"=?base64?Y2Fmw6k=?=", "caf\u{e9}"), Ok(()));
        let other = agrees(b"memory.append", "memory.query").unwrap_err();
        assert!(other.contains("does not match"), "{other}");
        assert!(agrees(b"", "memory.query").is_err());
    }

    #[test]
    fn the_same_bytes_do_not_agree_when_they_are_not_plain_text() {
        // Raw UTF-8 is not a header's text: it must come in the encoded form.
        let raw = agrees("caf\u{e9}".as_bytes(), "caf\u{e9}").unwrap_err();
        assert!(raw.contains("malformed"), "{raw}");
        // A value in the encoded form is decoded before comparing, even when the body holds
        // the same characters ("bWVtb3J5" is "memory").
        let encoded = agrees(b"=?base64?bWVtb3J5?=", "=?base64?bWVtb3J5?=").unwrap_err();
        assert!(encoded.contains("does not match"), "{encoded}");
    }

    #[test]
    fn a_missing_header_is_refused() {
        let h = HeaderMap::new();
        let e = agree(&h, &METHOD_HEADER, "tools/call").unwrap_err();
        assert!(matches!(e, McpError::HeaderMismatch(why) if why.contains("required")));
    }
}
