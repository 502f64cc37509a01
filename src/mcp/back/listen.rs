//! Asking the MCP server for what carapace's callers subscribed to ([`SubscriptionHub`]), once
//! for all of them, and keeping that up to date as callers come and go.
//!
//! - **2026-07-28 server:** one `subscriptions/listen` whose filter is what the callers want
//!   together; when that changes, it is dropped (which cancels it) and opened again with the new
//!   filter. Its notifications arrive on its answer stream (HTTP) or carapace's stdio.
//! - **Older server:** `resources/subscribe` and `resources/unsubscribe` for the difference,
//!   and, over HTTP, the session's standalone `GET` stream, where the server sends them.
//!
//! Either way the notifications reach the hub through the transport's [`Notices`], which
//! passes each to the callers' streams that want it. The task holds the server only while a
//! caller's stream is open, and ends with the server.
//!
//! [`Notices`]: super::upstream::Notices

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::json;

use super::upstream::{McpUpstream, Negotiated, Reply};
use crate::mcp::subscriptions::{SubscriptionHub, Wanted};

/// Wait after the server ended or refused a listen before asking again.
const RETRY: Duration = Duration::from_secs(1);

/// Run until the server is gone; see the module docs.
pub async fn keep_listening(server: Weak<McpUpstream>, hub: Arc<SubscriptionHub>) {
    // The resources subscribed to with an older server, and in which session.
    let mut subscribed: BTreeSet<String> = BTreeSet::new();
    let mut in_session: Option<Arc<Negotiated>> = None;
    loop {
        let wanted = hub.wanted();
        let nothing_subscribed = subscribed.is_empty();
        if wanted.is_empty() && nothing_subscribed {
            hub.changed().await;
            continue;
        }
        let Some(server) = server.upgrade() else {
            return;
        };
        let session = match server.session().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("mcp_subscriptions_waiting: {e}");
                wait(&hub, RETRY).await;
                continue;
            }
        };
        if session.modern {
            subscribed.clear();
            if wanted.is_empty() {
                drop(server);
                hub.changed().await;
                continue;
            }
            listen(&server, &hub, &wanted).await;
            continue;
        }
        if !in_session
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &session))
        {
            subscribed.clear();
            in_session = Some(session.clone());
        }
        sync(&server, &wanted, &mut subscribed).await;
        hub.set_active(Wanted {
            uris: subscribed.clone(),
            resources_changed: true,
            prompts_changed: true,
        });
        if wanted.is_empty() {
            drop(server);
            hub.changed().await;
            continue;
        }
        tokio::select! {
            _ = hub.changed() => {}
            ended = server.events(session) => {
                if let Err(e) = ended {
                    tracing::debug!("mcp_server_events_ended: {e}");
                }
                wait(&hub, RETRY).await;
            }
        }
    }
}

/// One `subscriptions/listen` for `wanted`, until the callers want something else or the
/// server ends it.
async fn listen(server: &McpUpstream, hub: &SubscriptionHub, wanted: &Wanted) {
    let params = json!({ "notifications": wanted.filter() });
    // Until the server acknowledges this one, it sends nothing more than before.
    let _inactive = Inactive(hub);
    tokio::select! {
        _ = hub.changed() => {}
        ended = server.request("subscriptions/listen", params, None) => {
            match ended {
                Ok(Reply::Result(_)) => tracing::debug!("mcp_server_listen_ended"),
                Ok(Reply::Error { code, message, .. }) => {
                    tracing::warn!("mcp_server_listen_refused: {code} {message}")
                }
                Err(e) => tracing::debug!("mcp_server_listen_failed: {e}"),
            }
            wait(hub, RETRY).await;
        }
    }
}

/// Subscribe an older server to what is wanted and not yet subscribed, and unsubscribe it from
/// what no caller wants any more.
async fn sync(server: &McpUpstream, wanted: &Wanted, subscribed: &mut BTreeSet<String>) {
    let add: Vec<String> = wanted.uris.difference(subscribed).cloned().collect();
    let remove: Vec<String> = subscribed.difference(&wanted.uris).cloned().collect();
    for uri in add {
        match server
            .request("resources/subscribe", json!({ "uri": uri }), None)
            .await
        {
            Ok(Reply::Result(_)) => {
                subscribed.insert(uri);
            }
            Ok(Reply::Error { code, message, .. }) => {
                tracing::warn!("mcp_server_subscribe_refused uri={uri}: {code} {message}")
            }
            Err(e) => tracing::debug!("mcp_server_subscribe_failed uri={uri}: {e}"),
        }
    }
    for uri in remove {
        let _ = server
            .request("resources/unsubscribe", json!({ "uri": uri }), None)
            .await;
        subscribed.remove(&uri);
    }
}

/// Marks nothing active when a listen ends or is replaced.
struct Inactive<'a>(&'a SubscriptionHub);

impl Drop for Inactive<'_> {
    fn drop(&mut self) {
        self.0.set_active(Wanted::default());
    }
}

/// Wait `d`, or less if what is wanted changes.
async fn wait(hub: &SubscriptionHub, d: Duration) {
    tokio::select! {
        _ = hub.changed() => {}
        _ = tokio::time::sleep(d) => {}
    }
}
