//! Finding the revision both sides speak, as the specification says: `server/discover`
//! (2026-07-28), else `initialize` with the newest handshake revision and
//! `notifications/initialized`; and the `_meta` a 2026-07-28 request carries.

use std::sync::Arc;

use serde_json::{json, Value};

use carapace_filters::Rejection;

use super::upstream::{Answer, Negotiated, Outgoing, Reply, Transport};
use crate::mcp::{LEGACY_VERSIONS, MODERN_VERSION};

pub(super) const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub(super) const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub(super) const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";

/// A modern request carries its revision and the client's capabilities in `_meta`.
pub(super) fn with_meta(mut params: Value, session: &Negotiated) -> Value {
    if session.modern {
        let m = meta_of(&mut params);
        m.insert(META_VERSION.into(), Value::from(MODERN_VERSION));
        m.insert(META_CAPABILITIES.into(), json!({}));
        m.insert(META_CLIENT_INFO.into(), client_info());
    }
    params
}

/// `params._meta`, made an object if it is not one.
pub(super) fn meta_of(params: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !params.is_object() {
        *params = json!({});
    }
    let meta = params
        .as_object_mut()
        .expect("an object")
        .entry("_meta")
        .or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut().expect("an object")
}

fn client_info() -> Value {
    json!({"name": "carapace", "version": env!("CARGO_PKG_VERSION")})
}

/// Find the newest revision both sides speak: `server/discover` (2026-07-28), else
/// `initialize` with the newest handshake revision and `notifications/initialized`.
pub(super) async fn negotiate(t: &dyn Transport) -> Result<Negotiated, Rejection> {
    let modern = Arc::new(Negotiated {
        version: MODERN_VERSION.into(),
        modern: true,
        session: None,
        capabilities: Value::Null,
    });
    let discover = Outgoing {
        method: "server/discover".into(),
        params: with_meta(json!({}), &modern),
        tool: None,
        session: Some(modern.clone()),
        relay: None,
    };
    match t.request(discover).await {
        Ok(Answer::Reply {
            reply: Reply::Result(r),
            ..
        }) if offers_modern(&r) => {
            return Ok(Negotiated {
                capabilities: r.get("capabilities").cloned().unwrap_or(Value::Null),
                ..(*modern).clone()
            })
        }
        // Not reachable at all: no point trying `initialize`.
        Err(e @ (Rejection::AppUnavailable(_) | Rejection::Timeout(_))) => return Err(e),
        _ => {}
    }
    handshake(t).await
}

/// `initialize` with the newest handshake revision, then `notifications/initialized`.
pub(super) async fn handshake(t: &dyn Transport) -> Result<Negotiated, Rejection> {
    let init = Outgoing {
        method: "initialize".into(),
        params: json!({
            "protocolVersion": LEGACY_VERSIONS[0],
            // On behalf of its callers: each request is relayed only to a caller that
            // declared the capability, and answered with an error otherwise.
            "capabilities": {"sampling": {}, "elicitation": {"form": {}}, "roots": {}},
            "clientInfo": client_info(),
        }),
        tool: None,
        session: None,
        relay: None,
    };
    let (result, session) = match t.request(init).await? {
        Answer::Reply {
            reply: Reply::Result(r),
            session,
        } => (r, session),
        Answer::Reply {
            reply: Reply::Error { code, message, .. },
            ..
        } => {
            return Err(Rejection::AppInvalid(format!(
                "initialize failed: {code} {message}"
            )))
        }
        Answer::SessionGone => return Err(Rejection::AppInvalid("initialize answered 404".into())),
    };
    let version = result
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !LEGACY_VERSIONS.contains(&version) {
        return Err(Rejection::AppInvalid(format!(
            "the MCP server speaks `{version}`, which carapace does not"
        )));
    }
    let n = Negotiated {
        version: version.to_owned(),
        modern: false,
        session,
        capabilities: result.get("capabilities").cloned().unwrap_or(Value::Null),
    };
    t.notify(Outgoing {
        method: "notifications/initialized".into(),
        params: json!({}),
        tool: None,
        session: Some(Arc::new(n.clone())),
        relay: None,
    })
    .await?;
    Ok(n)
}

fn offers_modern(discover: &Value) -> bool {
    discover
        .get("supportedVersions")
        .and_then(Value::as_array)
        .is_some_and(|v| v.iter().any(|v| v == MODERN_VERSION))
}
