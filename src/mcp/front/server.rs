//! The app's MCP server behind the front: resources, prompts and completions forwarded to it,
//! the callers' responses to its requests, its log level per session and the capabilities of
//! it that are passed through.

use bytes::Bytes;
use http::Request;
use serde_json::{json, Map, Value};

use carapace_filters::call::Principal;

use super::{accepted, complete, refused, Era, McpFront};
use crate::front::Resp;
use crate::mcp::back::relay::{log_level, LOG_LEVELS};
use crate::mcp::back::upstream::Reply;
use crate::mcp::jsonrpc::{result_response, McpError};
use crate::mcp::{passthrough, stream, MODERN_VERSION};

impl McpFront {
    /// A resources, prompts or completions request, passed through to the app's MCP server
    /// (authorized, its result checked by the secret guard); the list and read results of
    /// 2026-07-28 say how long and for whom they may be cached.
    pub(super) async fn forward_to_server(
        &self,
        id: &Value,
        m: &str,
        params: Map<String, Value>,
        principal: &Principal,
        version: &str,
    ) -> Resp {
        let server = self.server.as_ref().expect("checked");
        let now = (self.clock)();
        match passthrough::forward(server, m, params, principal, now).await {
            Ok((mut r, filtered)) => {
                let guarded = self
                    .guard
                    .as_ref()
                    .map(|g| g.check(m, [("/result", &mut r)]));
                if let Some(Err(e)) = guarded {
                    return refused(Some(id), &McpError::Refused(e));
                }
                if version == MODERN_VERSION && (m.ends_with("/list") || m == "resources/read") {
                    r["ttlMs"] = Value::from(self.cfg.list_ttl_ms);
                    let scope = if filtered || m == "resources/read" {
                        "private"
                    } else {
                        "public"
                    };
                    r["cacheScope"] = Value::from(scope);
                }
                result_response(id, complete(r, version))
            }
            Err(McpError::Upstream {
                code,
                message,
                mut data,
            }) => {
                // The server's own error is checked as its result would be: its message and
                // data reach the caller as they are.
                let mut text = Value::String(message);
                let mut parts = vec![("/error/message", &mut text)];
                if let Some(d) = data.as_mut() {
                    parts.push(("/error/data", d));
                }
                if let Some(Err(e)) = self.guard.as_ref().map(|g| g.check(m, parts)) {
                    return refused(Some(id), &McpError::Refused(e));
                }
                let message = match text {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                let e = McpError::Upstream {
                    code,
                    message,
                    data,
                };
                refused(Some(id), &e)
            }
            Err(e) => refused(Some(id), &e),
        }
    }

    /// A caller's response to a request the server put to it (older era). Only the session the
    /// request went to, with the id carapace gave it, answers it, once. A response to an id
    /// carapace never gives is taken and dropped (202, as the MCP text allows and the EAT
    /// vectors expect); one to a carapace id that waits for no answer in this session is
    /// refused, so a late or foreign answer is told so. Nothing else reaches the server.
    pub(super) fn response(
        &self,
        req: &Request<Bytes>,
        principal: &Principal,
        id: Option<Value>,
        reply: Reply,
    ) -> Resp {
        let session = match self.session_of(req, principal) {
            Err(e @ McpError::SessionNotFound) => return refused(None, &e),
            Ok(s) => s,
            Err(_) => None,
        };
        let answers = self.sessions.answers();
        if session.is_some_and(|s| answers.deliver(&s.id, id.as_ref(), reply)) {
            return accepted();
        }
        if !id.as_ref().is_some_and(stream::is_answer_id) {
            return accepted();
        }
        let why = "the response answers no request waiting in this session";
        refused(id.as_ref(), &McpError::InvalidRequest(why.into()))
    }

    /// `logging/setLevel` (older era): the least severe log message of the server this session
    /// is sent. The server behind is shared by every caller, so its own level is left alone
    /// and each session's messages are filtered here.
    pub(super) fn set_log_level(
        &self,
        params: &Map<String, Value>,
        era: &Era,
    ) -> Result<Value, McpError> {
        let Era::Legacy(session) = era else {
            return Err(McpError::MethodNotFound("logging/setLevel".into()));
        };
        let level = params.get("level").and_then(Value::as_str);
        let Some(rank) = level.and_then(log_level) else {
            return Err(McpError::InvalidParams(format!(
                "`level` must be one of {}",
                LOG_LEVELS.join(", ")
            )));
        };
        self.sessions.set_log_level(&session.id, rank);
        Ok(json!({}))
    }

    /// The capabilities of the MCP server behind carapace that are passed through.
    pub(super) fn passed_through(&self) -> Map<String, Value> {
        self.server
            .as_ref()
            .and_then(|s| s.negotiated())
            .map(|n| passthrough::capabilities(&n.capabilities))
            .unwrap_or_default()
    }
}
