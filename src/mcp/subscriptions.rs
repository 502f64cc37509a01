//! Resource subscriptions and list-change notifications of an MCP server behind carapace, fanned
//! out to the callers that asked for them.
//!
//! Callers subscribe in their own era: an older-era session with `resources/subscribe` and a
//! standalone `GET` stream that carries its notifications; a 2026-07-28 caller with a
//! `subscriptions/listen` request whose answer is the stream. The [`SubscriptionHub`] keeps
//! who wants what, and what all of them want together ([`Wanted`]), which carapace asks of the
//! server once ([`super::back::listen`]) whatever the number of callers. What the server says
//! goes only to the streams that asked for it: an update of a resource only to the callers
//! subscribed to that URI (each was authorized to read it when it subscribed).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::{mpsc, watch, Notify};

/// The notifications a subscription carries.
pub const UPDATED: &str = "notifications/resources/updated";
pub const RESOURCES_CHANGED: &str = "notifications/resources/list_changed";
pub const PROMPTS_CHANGED: &str = "notifications/prompts/list_changed";
/// A 2026-07-28 server's answer to carapace's `subscriptions/listen`: what it will send.
pub const ACKNOWLEDGED: &str = "notifications/subscriptions/acknowledged";

/// Most open streams over all callers; beyond it a new one is refused.
const MAX_STREAMS: usize = 4_096;
/// Most of them one principal may hold: one caller cannot take every stream.
const MAX_STREAMS_PER_PRINCIPAL: usize = MAX_STREAMS / 8;
/// Most older-era sessions with subscriptions; beyond it those without a stream are forgotten
/// (a session that expired never says so).
const MAX_SESSIONS: usize = 16_384;
/// Most resources one session or one stream subscribes to.
pub const MAX_URIS: usize = 256;
/// Notifications waiting to be written to one stream; a stream that falls further behind
/// loses notifications (counted in the log), never blocks the others.
const QUEUE: usize = 64;

/// What a stream (or the server, for all of them) is asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    pub uris: BTreeSet<String>,
    pub resources_changed: bool,
    pub prompts_changed: bool,
}

impl Wanted {
    pub fn is_empty(&self) -> bool {
        self.uris.is_empty() && !self.resources_changed && !self.prompts_changed
    }

    /// Whether this asks for everything `other` does.
    pub fn covers(&self, other: &Wanted) -> bool {
        other.uris.is_subset(&self.uris)
            && (self.resources_changed || !other.resources_changed)
            && (self.prompts_changed || !other.prompts_changed)
    }

    /// A `subscriptions/listen` filter (as the server acknowledged it).
    pub fn of_filter(f: &Value) -> Wanted {
        let flag = |k: &str| f.get(k) == Some(&Value::Bool(true));
        Wanted {
            uris: f
                .get("resourceSubscriptions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            resources_changed: flag("resourcesListChanged"),
            prompts_changed: flag("promptsListChanged"),
        }
    }

    /// The 2026-07-28 `notifications` filter of a `subscriptions/listen`.
    pub fn filter(&self) -> Value {
        let mut f = json!({});
        if self.resources_changed {
            f["resourcesListChanged"] = Value::Bool(true);
        }
        if self.prompts_changed {
            f["promptsListChanged"] = Value::Bool(true);
        }
        if !self.uris.is_empty() {
            f["resourceSubscriptions"] = json!(self.uris);
        }
        f
    }

    fn wants(&self, method: &str, params: &Value) -> bool {
        match method {
            UPDATED => params
                .get("uri")
                .and_then(Value::as_str)
                .is_some_and(|u| self.uris.contains(u)),
            RESOURCES_CHANGED => self.resources_changed,
            PROMPTS_CHANGED => self.prompts_changed,
            _ => false,
        }
    }
}

/// Whose a stream is.
#[derive(Debug, Clone, PartialEq)]
pub enum Owner {
    /// An older-era session's `GET` stream: it gets that session's resources.
    Session(String),
    /// A 2026-07-28 `subscriptions/listen`: its own filter, and the request's id to tag
    /// each notification with.
    Listen { wanted: Wanted, id: Value },
}

struct Stream {
    owner: Owner,
    /// Who opened it.
    principal: Arc<str>,
    tx: mpsc::Sender<Value>,
}

#[derive(Default)]
struct State {
    streams: HashMap<u64, Stream>,
    next: u64,
    /// The resources each older-era session subscribed to.
    sessions: HashMap<String, BTreeSet<String>>,
}

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeRefused {
    #[error("too many streams are open")]
    Streams,
    #[error("a session subscribes to at most {MAX_URIS} resources")]
    Uris,
}

/// Who wants which of the server's notifications; see the module docs.
pub struct SubscriptionHub {
    state: Mutex<State>,
    /// Notified whenever what is wanted in all may have changed.
    changed: Notify,
    /// What the server has agreed to send carapace now.
    active: watch::Sender<Wanted>,
}

impl std::fmt::Debug for SubscriptionHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionHub")
            .field("wanted", &self.wanted())
            .finish()
    }
}

impl Default for SubscriptionHub {
    fn default() -> Self {
        SubscriptionHub {
            state: Mutex::default(),
            changed: Notify::new(),
            active: watch::channel(Wanted::default()).0,
        }
    }
}

impl SubscriptionHub {
    /// What the server now sends carapace (set by [`crate::mcp::back::listen`]).
    pub fn set_active(&self, active: Wanted) {
        self.active.send_replace(active);
    }

    /// Wait, at most `limit`, until the server sends everything `wanted` asks for; whether it
    /// does. A caller's subscription is confirmed only then, so that nothing the server says
    /// after the confirmation is missed.
    pub async fn until_active(&self, wanted: &Wanted, limit: std::time::Duration) -> bool {
        let mut rx = self.active.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|a| a.covers(wanted)))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `session` subscribes to `uri` (older era).
    pub fn subscribe(&self, session: &str, uri: &str) -> Result<(), SubscribeRefused> {
        let mut s = self.lock();
        if s.sessions.len() >= MAX_SESSIONS && !s.sessions.contains_key(session) {
            let State {
                sessions, streams, ..
            } = &mut *s;
            sessions.retain(|id, _| {
                streams
                    .values()
                    .any(|st| !st.tx.is_closed() && st.owner == Owner::Session(id.clone()))
            });
        }
        let uris = s.sessions.entry(session.to_owned()).or_default();
        if uris.len() >= MAX_URIS && !uris.contains(uri) {
            return Err(SubscribeRefused::Uris);
        }
        uris.insert(uri.to_owned());
        drop(s);
        self.changed.notify_one();
        Ok(())
    }

    /// `session` unsubscribes from `uri` (older era).
    pub fn unsubscribe(&self, session: &str, uri: &str) {
        let mut s = self.lock();
        if let Some(uris) = s.sessions.get_mut(session) {
            uris.remove(uri);
            if uris.is_empty() {
                s.sessions.remove(session);
            }
        }
        drop(s);
        self.changed.notify_one();
    }

    /// The session ended: its subscriptions and stream go.
    pub fn end_session(&self, session: &str) {
        let mut s = self.lock();
        s.sessions.remove(session);
        s.streams
            .retain(|_, st| st.owner != Owner::Session(session.to_owned()));
        drop(s);
        self.changed.notify_one();
    }

    /// Open a stream for `owner`: its id (to [`Self::close`] it) and what it receives. A
    /// session has one stream: a new one replaces the last.
    pub fn open(
        &self,
        owner: Owner,
        principal: &str,
    ) -> Result<(u64, mpsc::Receiver<Value>), SubscribeRefused> {
        let mut s = self.lock();
        if let Owner::Session(_) = &owner {
            s.streams.retain(|_, st| st.owner != owner);
        }
        s.streams.retain(|_, st| !st.tx.is_closed());
        let held = s
            .streams
            .values()
            .filter(|st| &*st.principal == principal)
            .count();
        if s.streams.len() >= MAX_STREAMS || held >= MAX_STREAMS_PER_PRINCIPAL {
            return Err(SubscribeRefused::Streams);
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        s.next += 1;
        let id = s.next;
        let principal = principal.into();
        s.streams.insert(
            id,
            Stream {
                owner,
                principal,
                tx,
            },
        );
        drop(s);
        self.changed.notify_one();
        Ok((id, rx))
    }

    /// The stream `id` is gone.
    pub fn close(&self, id: u64) {
        self.lock().streams.remove(&id);
        self.changed.notify_one();
    }

    /// What the stream of `owner` asks for.
    pub fn wanted_by(&self, owner: &Owner) -> Wanted {
        match owner {
            Owner::Listen { wanted, .. } => wanted.clone(),
            Owner::Session(session) => session_wants(&self.lock(), session),
        }
    }

    /// What all open streams want together: what carapace asks of the server.
    pub fn wanted(&self) -> Wanted {
        let s = self.lock();
        let mut all = Wanted::default();
        for st in s.streams.values().filter(|st| !st.tx.is_closed()) {
            let w = match &st.owner {
                Owner::Listen { wanted, .. } => wanted.clone(),
                Owner::Session(session) => session_wants(&s, session),
            };
            all.uris.extend(w.uris);
            all.resources_changed |= w.resources_changed;
            all.prompts_changed |= w.prompts_changed;
        }
        all
    }

    /// Wait until what is wanted may have changed.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// A notification of the server: to every stream that wants it.
    pub fn deliver(&self, method: &str, params: &Value) {
        if method == ACKNOWLEDGED {
            let agreed = params.get("notifications").unwrap_or(&Value::Null);
            self.set_active(Wanted::of_filter(agreed));
            return;
        }
        let s = self.lock();
        for st in s.streams.values() {
            let (wants, id) = match &st.owner {
                Owner::Listen { wanted, id } => (wanted.wants(method, params), Some(id)),
                Owner::Session(session) => (session_wants(&s, session).wants(method, params), None),
            };
            if !wants {
                continue;
            }
            let mut params = params.clone();
            // The server's subscription id is carapace's; the caller's is its request's.
            if let Some(meta) = params.get_mut("_meta").and_then(Value::as_object_mut) {
                meta.remove(SUBSCRIPTION_ID);
                if meta.is_empty() {
                    params.as_object_mut().map(|p| p.remove("_meta"));
                }
            }
            if let Some(id) = id {
                with_subscription_id(&mut params, id.clone());
            }
            let msg = json!({"jsonrpc": "2.0", "method": method, "params": params});
            if let Err(mpsc::error::TrySendError::Full(_)) = st.tx.try_send(msg) {
                tracing::warn!("mcp_subscription_notification_dropped method={method}: the caller reads too slowly");
            }
        }
    }
}

/// Name the caller's subscription in a notification's `params._meta`. A server's `params` or
/// `_meta` that is not an object (which no revision allows) is replaced by one: indexing into
/// it would panic the task reading the server.
fn with_subscription_id(params: &mut Value, id: Value) {
    if !params.is_object() {
        *params = Value::Object(Default::default());
    }
    let meta = params
        .as_object_mut()
        .expect("made an object")
        .entry("_meta")
        .or_insert_with(|| Value::Object(Default::default()));
    if !meta.is_object() {
        *meta = Value::Object(Default::default());
    }
    meta[SUBSCRIPTION_ID] = id;
}

/// `_meta` key naming the subscription a notification belongs to (2026-07-28).
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// An older-era session with a stream wants its resources' updates and every list change.
fn session_wants(s: &State, session: &str) -> Wanted {
    Wanted {
        uris: s.sessions.get(session).cloned().unwrap_or_default(),
        resources_changed: true,
        prompts_changed: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen(uris: &[&str], id: i64) -> Owner {
        Owner::Listen {
            wanted: Wanted {
                uris: uris.iter().map(|u| u.to_string()).collect(),
                ..Wanted::default()
            },
            id: Value::from(id),
        }
    }

    #[test]
    fn an_update_reaches_only_the_streams_subscribed_to_its_uri() {
        let hub = SubscriptionHub::default();
        let (_, mut a) = hub.open(listen(&["r://a"], 1), "p").unwrap();
        let (_, mut b) = hub.open(listen(&["r://b"], 2), "p").unwrap();
        hub.subscribe("s1", "r://a").unwrap();
        // Subscribed but with no stream yet: nothing is wanted for it.
        assert_eq!(hub.wanted().uris.len(), 2);
        let (_, mut s1) = hub.open(Owner::Session("s1".into()), "p").unwrap();
        assert!(hub.wanted().resources_changed);

        let server_meta = json!({"uri": "r://a", "_meta": {SUBSCRIPTION_ID: 99}});
        hub.deliver(UPDATED, &server_meta);
        let got = a.try_recv().unwrap();
        assert_eq!(
            got["params"],
            json!({"uri": "r://a", "_meta": {SUBSCRIPTION_ID: 1}})
        );
        assert!(b.try_recv().is_err(), "b is not subscribed to r://a");
        assert_eq!(s1.try_recv().unwrap()["params"], json!({"uri": "r://a"}));

        hub.deliver(RESOURCES_CHANGED, &json!({}));
        assert!(a.try_recv().is_err(), "a did not ask for list changes");
        assert_eq!(s1.try_recv().unwrap()["method"], RESOURCES_CHANGED);
    }

    #[test]
    fn a_server_notification_whose_params_or_meta_is_not_an_object_still_reaches_the_caller() {
        let hub = SubscriptionHub::default();
        let wanted = Wanted {
            resources_changed: true,
            ..Wanted::default()
        };
        let (_, mut rx) = hub
            .open(
                Owner::Listen {
                    wanted,
                    id: json!(7),
                },
                "p",
            )
            .unwrap();
        for params in [
            json!({"_meta": 1}),
            json!({"_meta": []}),
            json!([]),
            json!(null),
        ] {
            hub.deliver(RESOURCES_CHANGED, &params);
            let got = rx.try_recv().unwrap();
            assert_eq!(
                got["params"],
                json!({"_meta": {SUBSCRIPTION_ID: 7}}),
                "{params}"
            );
        }
    }

    #[test]
    fn one_principal_holds_at_most_its_share_of_the_streams() {
        let hub = SubscriptionHub::default();
        let mut held = Vec::new();
        for i in 0..MAX_STREAMS_PER_PRINCIPAL {
            held.push(hub.open(listen(&["r://a"], i as i64), "greedy").unwrap());
        }
        assert!(matches!(
            hub.open(listen(&["r://a"], -1), "greedy"),
            Err(SubscribeRefused::Streams)
        ));
        // Others still get theirs; a stream given back is the greedy caller's again.
        assert!(hub.open(listen(&["r://a"], 0), "polite").is_ok());
        drop(held.pop());
        assert!(hub.open(listen(&["r://a"], -1), "greedy").is_ok());
    }

    #[test]
    fn what_is_wanted_shrinks_when_streams_close_and_sessions_end() {
        let hub = SubscriptionHub::default();
        let (a, _rx_a) = hub.open(listen(&["r://a"], 1), "p").unwrap();
        hub.subscribe("s1", "r://b").unwrap();
        let (_, rx_s1) = hub.open(Owner::Session("s1".into()), "p").unwrap();
        assert_eq!(
            hub.wanted().filter()["resourceSubscriptions"],
            json!(["r://a", "r://b"])
        );
        hub.close(a);
        assert_eq!(
            hub.wanted().filter()["resourceSubscriptions"],
            json!(["r://b"])
        );
        drop(rx_s1);
        assert!(
            hub.wanted().is_empty(),
            "a stream whose caller left wants nothing"
        );
        hub.end_session("s1");
        let (_, _rx) = hub.open(Owner::Session("s1".into()), "p").unwrap();
        assert!(
            hub.wanted().uris.is_empty(),
            "the ended session's subscriptions are gone"
        );
    }

    #[tokio::test]
    async fn a_subscription_is_confirmed_once_the_server_sends_what_it_asks_for() {
        let hub = SubscriptionHub::default();
        let want = Wanted {
            uris: ["r://a".to_string()].into(),
            resources_changed: true,
            prompts_changed: false,
        };
        let limit = std::time::Duration::from_millis(50);
        assert!(!hub.until_active(&want, limit).await);
        hub.deliver(
            ACKNOWLEDGED,
            &json!({"notifications": {"resourceSubscriptions": ["r://a", "r://b"], "resourcesListChanged": true}}),
        );
        assert!(hub.until_active(&want, limit).await);
        assert!(
            !hub.until_active(
                &Wanted {
                    prompts_changed: true,
                    ..want
                },
                limit
            )
            .await
        );
    }

    #[test]
    fn a_session_has_one_stream_and_bounded_subscriptions() {
        let hub = SubscriptionHub::default();
        let (_, mut first) = hub.open(Owner::Session("s".into()), "p").unwrap();
        let (_, mut second) = hub.open(Owner::Session("s".into()), "p").unwrap();
        hub.deliver(PROMPTS_CHANGED, &json!({}));
        assert!(first.try_recv().is_err(), "replaced");
        assert!(second.try_recv().is_ok());
        for i in 0..MAX_URIS {
            hub.subscribe("s", &format!("r://{i}")).unwrap();
        }
        assert_eq!(
            hub.subscribe("s", "r://one-more"),
            Err(SubscribeRefused::Uris)
        );
        hub.subscribe("s", "r://0").unwrap();
    }
}
