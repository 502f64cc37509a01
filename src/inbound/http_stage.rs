//! The inbound HTTP stage: the EAT documents, identity, bearer tokens (OAuth callers), control plane, kill-switch, per-peer rate limit, load
//! shedding and body limits in front of the configured front, wrapped in its error envelope.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use carapace_filters::body::{BodyLimitLayer, BodyLimits};
use carapace_filters::identity::IdentityLayer;
use carapace_filters::kill_switch::KillSwitchLayer;
use carapace_filters::rate_limit::PeerRateLimitLayer;
use tower::ServiceBuilder;

use crate::app::AppConn;
use crate::config::{Loaded, Protocol};
use crate::eat::documents::Publication;
use crate::eat::serve::EatLayer;
use crate::edge::{edge, HttpStack, PanicAnswer};
use crate::errors::ToolsV1Answers;
use crate::front::Envelope;
use crate::inbound::call_stage::{auth_mode, call_stack, keyed_limits, tool_limits};
/// The service every listener hands requests to.
use crate::server::shared::Shared;
use crate::skill_v1::SkillV1Front;
use crate::tools_v1::ToolsV1Front;

/// The whole stack: identity, global kill-switch, per-peer rate limit, load shedding, body
/// limits, the front (decode, call stage, encode), wrapped in the front's error envelope.
pub fn build_stack(cfg: &Loaded, shared: &Arc<Shared>) -> HttpStack {
    let c = &cfg.config;
    let control = Arc::downgrade(shared);

    let app = shared.app.load().as_ref().clone();
    let tool_limits = tool_limits(cfg, shared);
    let calls = call_stack(cfg, shared, app.clone(), Some(tool_limits.clone()));
    let peer_limits = Arc::new(keyed_limits(
        shared,
        "peer",
        c.rate_limits.per_peer,
        &BTreeMap::new(),
    ));
    let body = BodyLimits {
        max_bytes: c.limits.max_body_bytes,
        deadline: Duration::from_millis(c.limits.body_timeout_ms),
    };
    let (eat_keys, eat_catalog) = eat_layers(cfg, shared).unzip();
    let http =
        ServiceBuilder::new()
            .option_layer(eat_keys)
            .layer(identity_layer(cfg, shared))
            .option_layer(crate::oauth::layer(cfg, shared.clock.clone()))
            .option_layer(eat_catalog)
            .option_layer(shared.relay.clone().map(|r| {
                crate::relay::RelayLayer::new(r, body, calls.clone(), shared.catalog.clone())
            }))
            .layer(crate::ops::control::ControlPlaneLayer::new(control))
            .layer(KillSwitchLayer::new(shared.kill_switch.clone()))
            .layer(PeerRateLimitLayer::new(peer_limits))
            .layer(shared.load_shed_layer(c.limits.max_in_flight))
            // After the per-peer limit and load shedding: a request they refuse spends no tool's
            // cell. Not on a signed front: there the caller is known only once its signature is
            // checked (after the body), and an unsigned request must not spend a tool's limit.
            .option_layer(
                (c.front.protocol == Protocol::Mcp && !c.front.http_signature()).then(|| {
                    crate::mcp::early::MirroredHeaderLayer::new(
                        shared.kill_switch.clone(),
                        tool_limits.clone(),
                        shared.catalog.clone(),
                        shared.clock.clone(),
                    )
                }),
            )
            .layer(BodyLimitLayer::new(body))
            .option_layer(crate::inbound::signature_keys::layer(cfg, shared));
    let answers = c.front.answers.unwrap_or_default();
    let panic = PanicAnswer {
        front: c.front.protocol,
        answers,
    };
    let metrics = shared.metrics.clone();
    let credential = credential_header(cfg);
    match c.front.protocol {
        Protocol::ToolsV1 => {
            let front = ToolsV1Front::new(
                shared.catalog.clone(),
                calls,
                shared.clock.clone(),
                answers,
                shared.in_flight.clone(),
            );
            let envelope = Envelope::new(http.service(front), Protocol::ToolsV1, answers, metrics);
            edge(envelope, panic, credential)
        }
        Protocol::SkillV1 => {
            let front = skill_v1_front(cfg, shared, calls);
            let answers = ToolsV1Answers::default();
            let envelope = Envelope::new(http.service(front), Protocol::SkillV1, answers, metrics);
            edge(envelope, panic, credential)
        }
        Protocol::Mcp => {
            let front = mcp_front(cfg, shared, calls, app);
            let envelope = Envelope::new(http.service(front), Protocol::Mcp, answers, metrics);
            edge(envelope, panic, credential)
        }
    }
}

/// The MCP front: calls through `calls`, and through a stack without the tool rate limit for
/// calls whose limit the mirrored headers already spent; resources, prompts and completions
/// passed through when the app is an MCP server.
fn mcp_front(
    cfg: &Loaded,
    shared: &Arc<Shared>,
    calls: crate::front::CallStack,
    app: AppConn,
) -> crate::mcp::McpFront {
    let c = &cfg.config;
    crate::mcp::McpFront::new(
        shared.catalog.clone(),
        calls,
        call_stack(cfg, shared, app.clone(), None),
        shared.clock.clone(),
        Arc::new(c.front.mcp.clone().unwrap_or_default()),
        shared
            .mcp_sessions
            .clone()
            .expect("made at start for an mcp front"),
        shared.in_flight.clone(),
    )
    .with_server(match &app {
        AppConn::Mcp(server) => Some(server.clone()),
        AppConn::Http(_) => None,
    })
    .with_secret_guard(crate::secret_guard::of(
        cfg,
        crate::secret_guard::Role::Inbound,
    ))
    .with_relay(shared.relay.clone())
    .with_receipts(shared.receipts.is_some())
}

fn skill_v1_front(cfg: &Loaded, shared: &Shared, calls: crate::front::CallStack) -> SkillV1Front {
    let auth = cfg.config.front.auth.as_ref().expect("validated");
    SkillV1Front::new(
        cfg.front_skill_id.as_deref().expect("validated"),
        auth_mode(auth.mode).expect("validated: hmac or api_key on skill-v1"),
        auth.header_name.as_deref(),
        shared.catalog.clone(),
        calls,
        shared.clock.clone(),
    )
}

/// `front.eat`: the public keys for anyone (before identity), the catalog and the OpenAPI
/// documents for callers (after identity and OAuth).
fn eat_layers(cfg: &Loaded, shared: &Shared) -> Option<(EatLayer, EatLayer)> {
    let c = &cfg.config;
    let (Some(e), Some(publisher)) = (&c.front.eat, &shared.eat) else {
        if c.front.eat.is_some() {
            tracing::warn!("front.eat was added by a reload: it is served from the next start");
        }
        return None;
    };
    let mcp_path =
        (c.front.protocol == Protocol::Mcp).then(|| c.front.mcp.clone().unwrap_or_default().path);
    let publication = Arc::new(Publication::new(e, mcp_path.as_deref()));
    Some((
        EatLayer::keys(publisher.clone(), publication.clone(), shared.clock.clone()),
        EatLayer::catalog(
            publisher.clone(),
            publication,
            shared.catalog.clone(),
            shared.clock.clone(),
        ),
    ))
}

/// Identity, with the front's configured credential header counted as one.
fn identity_layer(cfg: &Loaded, shared: &Shared) -> IdentityLayer {
    let c = &cfg.config;
    // Connections without a certificate go on when every call carries a signature (skill-v1)
    // or every request a bearer token (oauth), checked by the next layer.
    let anonymous = c.front.protocol == Protocol::SkillV1 || c.front.authenticates_each_request();
    // The layer removes the caller's own `x-carapace-*` headers; the identity headers the app
    // sees are built by every back from the call's principal (`app_headers`).
    let layer = IdentityLayer::new(shared.peers.clone(), anonymous);
    match credential_header(cfg) {
        Some(h) => layer.credential_header(h),
        None => layer,
    }
}

/// The header the front's callers send their credential in, when configured
/// (`front.auth.header_name`).
fn credential_header(cfg: &Loaded) -> Option<http::HeaderName> {
    cfg.config
        .front
        .auth
        .as_ref()
        .and_then(|a| a.header_name.as_deref())
        .and_then(|h| http::HeaderName::from_bytes(h.as_bytes()).ok())
}
