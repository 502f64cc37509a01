//! Resource subscriptions and list changes on the MCP front, in each era
//! ([`crate::mcp::subscriptions`]): an older-era session subscribes with `resources/subscribe`
//! and receives on its standalone `GET` stream; a 2026-07-28 caller opens a
//! `subscriptions/listen` whose answer is its stream. A resource is subscribed to only by a
//! caller that may read it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body::Frame;
use http_body_util::BodyExt;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use carapace_filters::call::Principal;
use carapace_filters::Rejection;

use super::{refused, Era, McpFront, SESSION_HEADER};
use crate::front::Resp;
use crate::mcp::jsonrpc::McpError;
use crate::mcp::subscriptions::{
    Owner, SubscribeRefused, SubscriptionHub, Wanted, MAX_URIS, SUBSCRIPTION_ID,
};

/// Longest wait for the server to confirm what a new stream asks for.
const CONFIRM: Duration = Duration::from_secs(5);
/// A comment written to an idle stream this often, so that nothing between gives up on it.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

impl McpFront {
    /// `resources/subscribe` and `resources/unsubscribe` (older era).
    pub(super) fn subscribe(
        &self,
        method: &str,
        params: &Map<String, Value>,
        principal: &Principal,
        era: &Era,
    ) -> Result<Value, McpError> {
        let Era::Legacy(session) = era else {
            // 2026-07-28 has `subscriptions/listen` instead.
            return Err(McpError::MethodNotFound(method.into()));
        };
        let uri = params
            .get("uri")
            .and_then(Value::as_str)
            .ok_or_else(|| McpError::InvalidParams("`uri` (a string) is required".into()))?;
        if !self.offers_subscriptions() {
            return Err(McpError::MethodNotFound(method.into()));
        }
        let hub = self.server.as_ref().expect("checked").subscriptions();
        if method == "resources/unsubscribe" {
            hub.unsubscribe(&session.id, uri);
            return Ok(json!({}));
        }
        if !self.may_read(principal, uri) {
            let action = format!("resource.read:{uri}");
            return Err(McpError::Refused(match &principal.permissions {
                Some(p) => p.refusal(&principal.id, &action),
                None => Rejection::Forbidden(format!("{} may not {action}", principal.id)),
            }));
        }
        hub.subscribe(&session.id, uri).map_err(refusal)?;
        Ok(json!({}))
    }

    /// `GET` in an older-era session: its standalone stream.
    pub(super) async fn events(&self, req: &Request<Bytes>, principal: &Principal) -> Resp {
        let session = match self.session_of(req, principal) {
            Ok(Some(s)) => s,
            Ok(None) => {
                let why =
                    format!("a `GET` stream belongs to a session: `{SESSION_HEADER}` is required");
                return refused(None, &McpError::Session(why));
            }
            Err(e) => return refused(None, &e),
        };
        let hub = self.server.as_ref().expect("checked").subscriptions();
        let owner = Owner::Session(session.id);
        let wanted = hub.wanted_by(&owner);
        match hub.open(owner, &principal.id) {
            Ok((id, rx)) => {
                let stream = sse(hub.clone(), id, None, rx);
                confirmed(hub, &wanted).await;
                stream
            }
            Err(e) => refused(None, &refusal(e)),
        }
    }

    /// `subscriptions/listen` (2026-07-28): acknowledged with what is honoured (the
    /// resources this caller may read, and the list changes the server announces), then the
    /// notifications, each tagged with the request's id.
    pub(super) async fn listen(
        &self,
        id: Value,
        params: &Map<String, Value>,
        principal: &Principal,
    ) -> Resp {
        // What the server offers is known once it was negotiated with.
        if let Err(e) = self.server.as_ref().expect("checked").session().await {
            return refused(Some(&id), &McpError::Refused(e));
        }
        let asked = params.get("notifications").and_then(Value::as_object);
        let flag = |k: &str| asked.and_then(|a| a.get(k)) == Some(&Value::Bool(true));
        let offered = self.passed_through();
        let offers = |cap: &str| {
            offered.get(cap).and_then(|c| c.get("listChanged")) == Some(&Value::Bool(true))
        };
        let subscribable = self.offers_subscriptions();
        let uris = asked
            .and_then(|a| a.get("resourceSubscriptions"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|u| subscribable && self.may_read(principal, u))
            .take(MAX_URIS)
            .map(str::to_owned)
            .collect();
        let wanted = Wanted {
            uris,
            resources_changed: flag("resourcesListChanged") && offers("resources"),
            prompts_changed: flag("promptsListChanged") && offers("prompts"),
        };
        let ack = json!({
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {"_meta": {SUBSCRIPTION_ID: id.clone()}, "notifications": wanted.filter()},
        });
        let hub = self.server.as_ref().expect("checked").subscriptions();
        let owner = Owner::Listen {
            wanted: wanted.clone(),
            id: id.clone(),
        };
        match hub.open(owner, &principal.id) {
            Ok((stream, rx)) => {
                let stream = sse(hub.clone(), stream, Some(ack), rx);
                confirmed(hub, &wanted).await;
                stream
            }
            Err(e) => refused(Some(&id), &refusal(e)),
        }
    }

    /// Whether the server offers resource subscriptions.
    fn offers_subscriptions(&self) -> bool {
        self.passed_through()
            .get("resources")
            .and_then(|c| c.get("subscribe"))
            == Some(&Value::Bool(true))
    }

    fn may_read(&self, principal: &Principal, uri: &str) -> bool {
        principal
            .permissions
            .as_ref()
            .is_some_and(|p| p.may_read(uri, (self.clock)()))
    }
}

/// Wait until the server sends what `wanted` asks for, so that the caller misses nothing said
/// after its stream starts; a server that takes longer is not waited for (logged).
async fn confirmed(hub: &SubscriptionHub, wanted: &Wanted) {
    if !hub.until_active(wanted, CONFIRM).await {
        tracing::info!("mcp_subscription_unconfirmed: the MCP server has not confirmed it yet");
    }
}

fn refusal(e: SubscribeRefused) -> McpError {
    match e {
        SubscribeRefused::Streams => McpError::Refused(Rejection::Overloaded),
        SubscribeRefused::Uris => McpError::InvalidParams(e.to_string()),
    }
}

/// A subscription's SSE answer: `first`, then what the hub sends, until the caller goes
/// (which closes the hub's stream).
fn sse(
    hub: Arc<SubscriptionHub>,
    id: u64,
    first: Option<Value>,
    rx: mpsc::Receiver<Value>,
) -> Resp {
    let body = HubBody {
        first: first.map(|v| event(&v)),
        rx,
        keep_alive: tokio::time::interval_at(tokio::time::Instant::now() + KEEP_ALIVE, KEEP_ALIVE),
        _open: Open { hub, id },
    };
    crate::mcp::stream::sse_response(body.boxed_unsync())
}

fn event(v: &Value) -> Bytes {
    crate::mcp::stream::event(&serde_json::to_vec(v).expect("JSON values serialize"))
}

/// Closes the hub's stream when the answer's body is dropped (the caller went away).
struct Open {
    hub: Arc<SubscriptionHub>,
    id: u64,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.hub.close(self.id);
    }
}

struct HubBody {
    first: Option<Bytes>,
    rx: mpsc::Receiver<Value>,
    keep_alive: tokio::time::Interval,
    _open: Open,
}

impl http_body::Body for HubBody {
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if let Poll::Ready(msg) = self.rx.poll_recv(cx) {
            return Poll::Ready(msg.map(|m| Ok(Frame::data(event(&m)))));
        }
        if self.keep_alive.poll_tick(cx).is_ready() {
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                b": keep-alive\n\n",
            )))));
        }
        Poll::Pending
    }
}
