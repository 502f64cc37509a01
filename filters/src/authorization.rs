//! Authorization: what a paired peer may do, per action.
//!
//! Effective permissions are, as the Remote Tool Protocol's pairing text puts it, **role
//! defaults + peer policy overrides + temporary lease scope, with deny precedence**: a grant
//! from any of the three allows an action, a deny from anywhere refuses it, and anything not
//! granted is denied:
//!
//! ```text
//! allowed(action) = (role grants it  or  policy.allow grants it  or  an unexpired lease grants it)
//!                   and not (policy.deny matches it  or  an unexpired lease's deny matches it)
//! ```
//!
//! A lease is temporary scope: while it is in force (until `expires_at_ms`) its `allow` adds
//! to what the peer may do and its `deny` takes away from it; once it expires it contributes
//! nothing, neither grant nor deny.
//!
//! Actions are strings: `tool.call:<tool name>` for tool calls, `resource.read:<uri>` and
//! `prompt.get:<prompt name>` for an MCP server's resources and prompts, `event.subscribe:<topic>` and
//! `event.publish:<topic>` for events, `control:<action>` for control-plane requests, and
//! `pair.start`, which no role grants remotely and no policy or lease can grant either. A
//! pattern is an exact action or a prefix ending in `*` (`tool.call:memory.*`, `tool.call:*`).

use std::sync::Arc;
use std::task::{Context, Poll};

use serde::{Deserialize, Serialize};
use tower::{Layer, Service};

use crate::call::{Principal, ToolCall};
use crate::future::ReadyOr;
use crate::Rejection;

/// Starting a pairing: only ever from the local admin socket, never by a remote peer.
pub const PAIR_START: &str = "pair.start";

/// The role defaults, as the Remote Tool Protocol lists them.
pub fn role_defaults(role: &str) -> &'static [&'static str] {
    match role {
        // The paired gateway calls the tools of the host it paired with (and reads an MCP
        // server's resources and prompts there).
        "gateway" => &["tool.call:*", "resource.read:*", "prompt.get:*"],
        "tool_host" => &[
            "event.subscribe:tool.call.requested",
            "event.publish:tool.call.completed",
            "event.publish:tool.call.failed",
        ],
        // Neither consumes nor publishes tool.call.* by default.
        "subscriber" => &["event.subscribe:channel.*", "event.publish:channel.*"],
        "listener" => &["event.subscribe:channel.*"],
        // Control plane, but never starting a pairing (see `PAIR_START`).
        "cli_admin" => &["control:*"],
        _ => &[],
    }
}

/// The role a `component_type` gets when its record names none.
pub fn default_role(component_type: &str) -> &'static str {
    match component_type {
        "gateway" => "gateway",
        "tool_host" => "tool_host",
        "subscriber" => "subscriber",
        "listener" => "listener",
        "operator" => "cli_admin",
        _ => "none",
    }
}

/// Temporary scope: grants (and denies) that hold only until the lease expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    /// What the peer may also do while the lease is in force.
    #[serde(default)]
    pub allow: Vec<String>,
    /// What the peer may not do while the lease is in force, whatever grants it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// Unix time in milliseconds from which the lease no longer applies.
    pub expires_at_ms: u64,
}

impl Lease {
    /// Whether the lease is in force at `now_ms`.
    fn in_force(&self, now_ms: u64) -> bool {
        self.expires_at_ms > now_ms
    }
}

/// Per-peer overrides, stored in the peer record's `policy`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
    #[serde(default)]
    pub leases: Vec<Lease>,
}

/// Whether `pattern` covers `action`.
pub fn matches_action(pattern: &str, action: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => action.starts_with(prefix),
        None => pattern == action,
    }
}

/// An action as the concatenation of its two parts.
#[derive(Clone, Copy)]
struct Action<'a>(&'a str, &'a str);

impl Action<'_> {
    /// Whether the action is `text`.
    fn is(self, text: &str) -> bool {
        text.len() == self.0.len() + self.1.len()
            && text.starts_with(self.0)
            && &text[self.0.len()..] == self.1
    }

    /// Whether the action starts with `prefix`.
    fn starts_with(self, prefix: &str) -> bool {
        match prefix.strip_prefix(self.0) {
            Some(rest) => self.1.starts_with(rest),
            None => self.0.starts_with(prefix),
        }
    }

    /// [`matches_action`] for this action.
    fn matched_by(self, pattern: &str) -> bool {
        match pattern.strip_suffix('*') {
            Some(prefix) => self.starts_with(prefix),
            None => self.is(pattern),
        }
    }
}

/// How a denied action is answered, when the caller's credential says more than `Forbidden`
/// (an OAuth token answers with the scope it lacks).
pub trait Denial: Send + Sync + std::fmt::Debug + 'static {
    /// The refusal of `action` to the principal `who`.
    fn refusal(&self, who: &str, action: &str) -> Rejection;
}

/// A peer's role and policy, resolved once per peer record.
#[derive(Debug, Clone)]
pub struct Permissions {
    role: String,
    policy: Policy,
    denial: Option<Arc<dyn Denial>>,
}

impl PartialEq for Permissions {
    fn eq(&self, other: &Self) -> bool {
        let same_denial = match (&self.denial, &other.denial) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        self.role == other.role && self.policy == other.policy && same_denial
    }
}
impl Eq for Permissions {}

impl Permissions {
    pub fn new(role: impl Into<String>, policy: Policy) -> Self {
        Permissions {
            role: role.into(),
            policy,
            denial: None,
        }
    }

    /// Answer denied actions with `denial` instead of `Forbidden`.
    pub fn with_denial(mut self, denial: Arc<dyn Denial>) -> Self {
        self.denial = Some(denial);
        self
    }

    /// The refusal of `action` to the principal `who`.
    pub fn refusal(&self, who: &str, action: &str) -> Rejection {
        match &self.denial {
            Some(d) => d.refusal(who, action),
            None => Rejection::Forbidden(format!("{who} may not {action}")),
        }
    }

    /// Every tool call (and every MCP resource and prompt) allowed: the local principal of
    /// the Unix socket, and callers of a signed front, whose every call carries a valid
    /// signature.
    pub fn all_tools(role: &str) -> Self {
        Permissions::new(
            role,
            Policy {
                allow: vec![
                    "tool.call:*".into(),
                    "resource.read:*".into(),
                    "prompt.get:*".into(),
                ],
                ..Policy::default()
            },
        )
    }

    /// Whether `action` is allowed at `now_ms`: granted by the role, the policy or a lease in
    /// force, and denied by neither the policy nor a lease in force.
    pub fn allows(&self, action: &str, now_ms: u64) -> bool {
        self.allows_action(Action(action, ""), now_ms)
    }

    /// [`Permissions::allows`] for an action given in two parts.
    fn allows_action(&self, action: Action<'_>, now_ms: u64) -> bool {
        if action.is(PAIR_START) {
            return false;
        }
        let any = |patterns: &[String]| patterns.iter().any(|p| action.matched_by(p));
        let mut leases = self.policy.leases.iter().filter(|l| l.in_force(now_ms));
        let granted = role_defaults(&self.role)
            .iter()
            .any(|p| action.matched_by(p))
            || any(&self.policy.allow)
            || leases.clone().any(|l| any(&l.allow));
        let denied = any(&self.policy.deny) || leases.any(|l| any(&l.deny));
        granted && !denied
    }

    /// Whether the peer may call `tool` (the action `tool.call:<tool>`, checked on every call
    /// without building its text).
    pub fn may_call(&self, tool: &str, now_ms: u64) -> bool {
        self.allows_action(Action("tool.call:", tool), now_ms)
    }

    /// Whether the peer may read the MCP resource `uri` (or see it listed).
    pub fn may_read(&self, uri: &str, now_ms: u64) -> bool {
        self.allows(&format!("resource.read:{uri}"), now_ms)
    }

    /// Whether the peer may get the MCP prompt `name` (or see it listed).
    pub fn may_get_prompt(&self, name: &str, now_ms: u64) -> bool {
        self.allows(&format!("prompt.get:{name}"), now_ms)
    }
}

/// Told of every call [`AuthorizationLayer`] lets through, with the time it decided at.
pub type AllowedHook = Arc<dyn Fn(&Principal, u64) + Send + Sync>;

/// Refuses tool calls the caller's permissions do not allow (`Forbidden`). A call whose
/// principal carries no permissions is refused: default deny.
#[derive(Clone)]
pub struct AuthorizationLayer {
    clock: crate::signature::UnixClock,
    on_allowed: Option<AllowedHook>,
}

impl AuthorizationLayer {
    pub fn new(clock: crate::signature::UnixClock) -> Self {
        AuthorizationLayer {
            clock,
            on_allowed: None,
        }
    }

    /// Call `hook` for every call that is allowed, before it goes on.
    pub fn on_allowed(mut self, hook: AllowedHook) -> Self {
        self.on_allowed = Some(hook);
        self
    }
}

impl std::fmt::Debug for AuthorizationLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthorizationLayer")
    }
}

impl<S> Layer<S> for AuthorizationLayer {
    type Service = Authorization<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Authorization {
            inner,
            clock: self.clock.clone(),
            on_allowed: self.on_allowed.clone(),
        }
    }
}

/// Service of [`AuthorizationLayer`].
#[derive(Clone)]
pub struct Authorization<S> {
    inner: S,
    clock: crate::signature::UnixClock,
    on_allowed: Option<AllowedHook>,
}

impl<S> Service<ToolCall> for Authorization<S>
where
    S: Service<ToolCall, Error = Rejection>,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = ReadyOr<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let now_ms = (self.clock)();
        let permissions = call.principal.permissions.as_ref();
        if permissions.is_some_and(|p| p.may_call(&call.tool.name, now_ms)) {
            if let Some(hook) = &self.on_allowed {
                hook(&call.principal, now_ms);
            }
            return ReadyOr::inner(self.inner.call(call));
        }
        let action = format!("tool.call:{}", call.tool.name);
        ReadyOr::reject(match permissions {
            Some(p) => p.refusal(&call.principal.id, &action),
            None => Rejection::Forbidden(format!("{} may not {action}", call.principal.id)),
        })
    }
}

/// Shared permissions of a principal.
pub type SharedPermissions = Arc<Permissions>;

#[cfg(test)]
mod tests {
    use super::*;

    fn p(role: &str, allow: &[&str], deny: &[&str], leases: Vec<Lease>) -> Permissions {
        Permissions::new(
            role,
            Policy {
                allow: allow.iter().map(|s| s.to_string()).collect(),
                deny: deny.iter().map(|s| s.to_string()).collect(),
                leases,
            },
        )
    }

    #[test]
    fn an_action_in_two_parts_matches_as_its_text_does() {
        let patterns = [
            "tool.call:*",
            "tool.call:memory.query",
            "tool.call:memory.*",
            "tool.*",
            "*",
            "tool.call:",
            "tool.call:memory.query.x",
            "tool.cal",
            "tool.call:memory.quer",
            "resource.read:*",
            "tool.call:memory.query*",
        ];
        let actions = [
            ("tool.call:", "memory.query"),
            ("tool.call:", ""),
            ("tool.", "call:x"),
            ("", "tool.call:memory.query"),
        ];
        for (a, b) in actions {
            let text = format!("{a}{b}");
            for p in patterns {
                assert_eq!(
                    Action(a, b).matched_by(p),
                    matches_action(p, &text),
                    "{p} against {a}|{b}"
                );
            }
        }
    }

    #[test]
    fn role_defaults_follow_the_protocol() {
        let t = p("tool_host", &[], &[], vec![]);
        assert!(t.allows("event.subscribe:tool.call.requested", 0));
        assert!(t.allows("event.publish:tool.call.completed", 0));
        assert!(t.allows("event.publish:tool.call.failed", 0));
        assert!(!t.allows("event.publish:tool.call.requested", 0));
        let s = p("subscriber", &[], &[], vec![]);
        assert!(!s.allows("event.subscribe:tool.call.requested", 0));
        assert!(!s.allows("event.publish:tool.call.completed", 0));
        let admin = p("cli_admin", &[], &[], vec![]);
        assert!(admin.allows("control:kill_switch", 0));
        assert!(!admin.allows(PAIR_START, 0), "never pairs remotely");
        assert!(p("gateway", &[], &[], vec![]).may_call("memory.query", 0));
        assert!(
            !p("nobody", &[], &[], vec![]).may_call("memory.query", 0),
            "default deny"
        );
    }

    #[test]
    fn overrides_add_and_deny_wins() {
        let s = p("subscriber", &["tool.call:memory.query"], &[], vec![]);
        assert!(s.may_call("memory.query", 0));
        assert!(!s.may_call("memory.delete", 0));
        let g = p(
            "gateway",
            &["tool.call:memory.delete"],
            &["tool.call:memory.delete"],
            vec![],
        );
        assert!(
            !g.may_call("memory.delete", 0),
            "deny beats both role and allow"
        );
        assert!(g.may_call("memory.query", 0));
        let g = p("gateway", &[], &["tool.call:memory.*"], vec![]);
        assert!(!g.may_call("memory.query", 0));
        assert!(g.may_call("cron.list", 0));
        let admin = p("cli_admin", &[PAIR_START], &[], vec![]);
        assert!(
            !admin.allows(PAIR_START, 0),
            "no policy grants remote pairing"
        );
    }

    fn lease(allow: &[&str], deny: &[&str], expires_at_ms: u64) -> Lease {
        Lease {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
            expires_at_ms,
        }
    }

    #[test]
    fn the_role_alone_grants_its_defaults() {
        let g = p("gateway", &[], &[], vec![]);
        assert!(g.may_call("memory.delete", 0));
        let s = p("subscriber", &[], &[], vec![]);
        assert!(!s.may_call("memory.query", 0));
        assert!(s.allows("event.publish:channel.general", 0));
    }

    #[test]
    fn a_policy_deny_beats_the_role() {
        let g = p("gateway", &[], &["tool.call:memory.delete"], vec![]);
        assert!(!g.may_call("memory.delete", 0));
        assert!(g.may_call("memory.query", 0));
    }

    #[test]
    fn a_lease_grants_extra_scope_while_in_force() {
        let s = p(
            "subscriber",
            &["tool.call:cron.list"],
            &[],
            vec![lease(&["tool.call:memory.*"], &[], 1_000)],
        );
        assert!(
            s.may_call("memory.query", 999),
            "the lease adds to the role"
        );
        assert!(
            s.may_call("cron.list", 999),
            "and does not narrow the policy"
        );
        assert!(!s.may_call("files.read", 999));
        assert!(
            s.allows("event.subscribe:channel.x", 999),
            "nor the role defaults"
        );
        // A lease on a peer whose role already grants everything takes nothing away.
        let g = p(
            "gateway",
            &[],
            &[],
            vec![lease(&["tool.call:cron.list"], &[], 1_000)],
        );
        assert!(g.may_call("memory.delete", 999));
    }

    #[test]
    fn an_expired_lease_grants_nothing() {
        let s = p(
            "subscriber",
            &[],
            &[],
            vec![lease(&["tool.call:memory.*"], &[], 1_000)],
        );
        assert!(
            !s.may_call("memory.query", 1_000),
            "expired at expires_at_ms"
        );
        assert!(!s.may_call("memory.query", 5_000));
    }

    #[test]
    fn a_deny_beats_a_lease() {
        let s = p(
            "subscriber",
            &[],
            &["tool.call:memory.delete"],
            vec![lease(&["tool.call:memory.*"], &[], 1_000)],
        );
        assert!(s.may_call("memory.query", 0));
        assert!(
            !s.may_call("memory.delete", 0),
            "policy deny over lease allow"
        );
        let s = p(
            "subscriber",
            &[],
            &[],
            vec![lease(&["tool.call:*", PAIR_START], &[], u64::MAX)],
        );
        assert!(!s.allows(PAIR_START, 0), "no lease grants remote pairing");
    }

    #[test]
    fn a_lease_deny_holds_for_the_lease_lifetime_only() {
        let g = p(
            "gateway",
            &["tool.call:memory.delete"],
            &[],
            vec![
                lease(&[], &["tool.call:memory.delete"], 1_000),
                lease(&["tool.call:memory.delete"], &[], 2_000),
            ],
        );
        // Over the role, the policy allow and another lease's allow.
        assert!(!g.may_call("memory.delete", 999));
        assert!(g.may_call("memory.query", 999));
        assert!(
            g.may_call("memory.delete", 1_000),
            "the denying lease expired"
        );
    }

    #[test]
    fn lease_deny_is_optional_and_absent_when_empty() {
        let l: Lease =
            serde_json::from_str(r#"{"allow": ["tool.call:x"], "expires_at_ms": 5}"#).unwrap();
        assert!(l.deny.is_empty());
        assert_eq!(
            serde_json::to_value(&l).unwrap(),
            serde_json::json!({"allow": ["tool.call:x"], "expires_at_ms": 5})
        );
        let l: Lease =
            serde_json::from_str(r#"{"deny": ["tool.call:x"], "expires_at_ms": 5}"#).unwrap();
        assert!(l.allow.is_empty());
    }

    #[tokio::test]
    async fn the_hook_hears_of_allowed_calls_only() {
        use crate::call::testing;
        use tower::ServiceExt;
        let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
        let h = heard.clone();
        let layer = AuthorizationLayer::new(Arc::new(|| 7)).on_allowed(Arc::new(
            move |p: &Principal, now| h.lock().unwrap().push((p.id.clone(), now)),
        ));
        let svc = layer.layer(tower::service_fn(|_: ToolCall| async {
            Ok::<_, Rejection>(())
        }));
        let tool = testing::tool("memory.query", 10, 10);
        svc.clone()
            .oneshot(testing::call(tool.clone(), None))
            .await
            .unwrap();
        let mut denied = testing::call(tool, None);
        denied.principal = Arc::new(Principal {
            id: "sub_1".into(),
            permissions: Some(Arc::new(p("subscriber", &[], &[], vec![]))),
            ..Principal::local()
        });
        assert!(matches!(
            svc.oneshot(denied).await,
            Err(Rejection::Forbidden(_))
        ));
        assert_eq!(*heard.lock().unwrap(), [("local".into(), 7)]);
    }
}
