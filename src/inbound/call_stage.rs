//! The inbound call stage: per-tool kill-switch, per-tool rate limit, authorization, signature,
//! input schema, timeout, output schema, then the back that calls the app.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use carapace_filters::authorization::AuthorizationLayer;
use carapace_filters::kill_switch::KillSwitchLayer;
use carapace_filters::rate_limit::{KeyedLimits, Rate, ToolRateLimitLayer};
use carapace_filters::schema::{InputSchemaLayer, OutputSchemaLayer};
use carapace_filters::secret_guard::{Scanned, SecretGuardLayer};
use carapace_filters::signature::{
    AuthMode, ReplayGuard, SignatureLayer, SignatureVerifier, SigningKey,
};
use carapace_filters::timeout::CallTimeoutLayer;
use tower::util::BoxCloneSyncService;
use tower::ServiceBuilder;

use super::app_back::AppBack;
use crate::app::AppConn;
use crate::config::{AuthModeConfig, CallerAuthMode, Loaded, Protocol, RateConfig};
use crate::front::CallStack;
use crate::mcp::back::McpBack;
/// The service every listener hands requests to.
use crate::server::shared::Shared;
use crate::skill_v1::{AppSigning, SkillV1Back};
use crate::tools_v1::ToolsV1Back;

pub(crate) fn rate(r: RateConfig) -> Rate {
    let (n, window) = r.quota().expect("validated");
    Rate::per(
        NonZeroU32::new(n).expect("validated"),
        window,
        NonZeroU32::new(r.burst).expect("validated"),
    )
}

/// Limits in this process, or in the shared store when there is one.
pub(crate) fn keyed_limits(
    shared: &Shared,
    scope: &'static str,
    default: Option<RateConfig>,
    overrides: &BTreeMap<String, RateConfig>,
) -> KeyedLimits {
    let default = default.map(rate);
    let overrides = overrides.iter().map(|(k, r)| (k.clone(), rate(*r)));
    match &shared.redis {
        Some(redis) => KeyedLimits::shared(scope, default, overrides, Arc::new(redis.clone())),
        None => KeyedLimits::new(default, overrides),
    }
}

pub(crate) fn app_auth_mode(m: AuthModeConfig) -> AuthMode {
    match m {
        AuthModeConfig::Hmac => AuthMode::Hmac,
        AuthModeConfig::ApiKey => AuthMode::ApiKey,
    }
}

/// The Skill Gateway v1 mode of a front's callers; `None` for RFC 9421 signatures, which the
/// HTTP stage checks.
pub(crate) fn auth_mode(m: CallerAuthMode) -> Option<AuthMode> {
    match m {
        CallerAuthMode::Hmac => Some(AuthMode::Hmac),
        CallerAuthMode::ApiKey => Some(AuthMode::ApiKey),
        CallerAuthMode::HttpSignature => None,
    }
}

/// The per-tool rate limits, one set for the whole stack (the MCP front's header check and the
/// call stage take cells from the same buckets).
pub(crate) fn tool_limits(cfg: &Loaded, shared: &Shared) -> Arc<KeyedLimits> {
    let limits = &cfg.config.rate_limits;
    Arc::new(keyed_limits(shared, "tool", limits.per_tool, &limits.tools))
}

/// The call-stage stack: per-tool kill-switch, authorization, per-tool rate limit (unless
/// `tool_limits` is `None`: the call took its cell before), signature (the rate limit after it
/// when there is one), input schema, timeout, output schema, back.
pub(crate) fn call_stack(
    cfg: &Loaded,
    shared: &Shared,
    app: AppConn,
    tool_limits: Option<Arc<KeyedLimits>>,
) -> CallStack {
    let back = back(cfg, shared, app);
    let signature = signature_layer(cfg, shared);
    // A tool's rate limit is shared by every caller, so a call takes a cell only once it is
    // known to be allowed: after authorization (a caller refused the tool must not use up its
    // limit), and on a front whose calls carry a signature after the signature too (a forged
    // call needs no key to send).
    let (limit_first, limit_signed) = match signature.is_some() {
        true => (None, tool_limits),
        false => (tool_limits, None),
    };
    let idempotency = idempotency_layer(cfg, shared);
    let keyed_answers = idempotency.is_some();
    let stack = CallStack::new(
        ServiceBuilder::new()
            .layer(KillSwitchLayer::new(shared.kill_switch.clone()))
            .layer(AuthorizationLayer::new(shared.clock.clone()).on_allowed(seen(shared)))
            .option_layer(limit_first.map(ToolRateLimitLayer::new))
            .option_layer(signature)
            .option_layer(limit_signed.map(ToolRateLimitLayer::new))
            .layer(InputSchemaLayer)
            .option_layer(idempotency)
            .option_layer(metering_layer(cfg, shared))
            .option_layer(ledger_layer(shared))
            .option_layer(
                shared
                    .receipts
                    .clone()
                    .map(|r| crate::receipts::ReceiptLayer::new(r, shared.clock.clone())),
            )
            .layer(CallTimeoutLayer)
            .option_layer(
                crate::secret_guard::of(cfg, crate::secret_guard::Role::Inbound)
                    .map(|g| SecretGuardLayer::new(g, Scanned::Results)),
            )
            .layer(OutputSchemaLayer)
            .service(back),
    )
    .for_workers(shared.workers.count());
    // Receipts are signed by their layer, and kept with a keyed call's answer by the
    // idempotency layer; nothing else of this stack uses them.
    match shared.receipts {
        Some(_) => stack,
        None => stack.without_receipts(keyed_answers),
    }
}

/// The app's back for its protocol; tools connected callers offer go to them (the relay).
fn back(cfg: &Loaded, shared: &Shared, app: AppConn) -> AppBack {
    let c = &cfg.config;
    let back = match (c.app.protocol, app) {
        (_, AppConn::Mcp(server)) => AppBack::Mcp(McpBack::new(server)),
        (Protocol::ToolsV1, AppConn::Http(app)) => AppBack::ToolsV1(ToolsV1Back::new(app)),
        (Protocol::Mcp, AppConn::Http(_)) => unreachable!("an MCP app is reached as one"),
        (Protocol::SkillV1, AppConn::Http(app)) => {
            let skill = c.app.skill.as_ref().expect("validated");
            let signing = skill.auth.as_ref().map(|a| {
                AppSigning::new(
                    app_auth_mode(a.mode),
                    a.header_name
                        .as_deref()
                        .map(|h| http::HeaderName::from_bytes(h.as_bytes()).expect("validated")),
                    cfg.app_secret.clone().expect("validated"),
                )
            });
            AppBack::SkillV1(SkillV1Back::new(
                app,
                &skill.skill_id,
                &skill.protocol_version,
                signing,
            ))
        }
    };
    match &shared.relay {
        Some(relay) => AppBack::Relay(crate::relay::RelayRouter::new(
            relay.clone(),
            BoxCloneSyncService::new(back),
        )),
        None => back,
    }
}

/// The signature check of a front with `auth` (HMAC or API key, the caller keys, the
/// window and the replay guard).
fn signature_layer(cfg: &Loaded, shared: &Shared) -> Option<SignatureLayer> {
    let c = &cfg.config;
    let signed = c
        .front
        .auth
        .as_ref()
        .and_then(|a| Some((a, auth_mode(a.mode)?)));
    signed.map(|(auth, mode)| {
        let keys = cfg
            .caller_keys
            .iter()
            .map(|(id, s)| SigningKey {
                id: id.clone(),
                secret: s.bytes().clone(),
            })
            .collect();
        SignatureLayer::new(Arc::new(SignatureVerifier::new(
            mode,
            keys,
            Duration::from_secs(auth.timestamp_skew_s),
            replay_guard(shared, auth.nonce_ttl_s),
            shared.clock.clone(),
        )))
    })
}

/// `idempotency`: keys in the shared store when there is one, else in this process.
fn idempotency_layer(
    cfg: &Loaded,
    shared: &Shared,
) -> Option<crate::idempotency::IdempotencyLayer> {
    let c = &cfg.config.idempotency;
    if !c.enabled {
        return None;
    }
    let keys: Arc<dyn crate::idempotency::IdempotencyStore> = match &shared.redis {
        Some(redis) => Arc::new(redis.clone()),
        None => shared.idempotency_keys.clone(),
    };
    let tools = cfg
        .config
        .tools
        .iter()
        .filter_map(|(name, t)| Some((name.clone(), t.idempotency?)))
        .collect();
    Some(crate::idempotency::IdempotencyLayer::new(
        keys,
        crate::idempotency::Settings {
            window: Duration::from_secs(c.window_s),
            wait: Duration::from_millis(c.wait_ms),
            max_result_bytes: c.max_result_bytes,
            tools,
        },
    ))
}

/// Prices and budgets, with the meter kept across reloads.
fn metering_layer(cfg: &Loaded, shared: &Shared) -> Option<crate::metering::MeteringLayer> {
    let meter = shared.meter.clone()?;
    let c = &cfg.config;
    let m = c.metering.clone().unwrap_or_default();
    let prices = crate::metering::Prices {
        tools: c
            .tools
            .iter()
            .filter_map(|(name, t)| Some((name.clone(), t.price?)))
            .collect(),
        budgets: m.budgets.into_iter().collect(),
        default: m.default_budget,
    };
    Some(crate::metering::MeteringLayer::new(
        meter,
        prices,
        shared.clock.clone(),
    ))
}

/// The ledger's layer of the tool-host side: `provider` is this host (its receipts' name,
/// else `self`).
fn ledger_layer(shared: &Shared) -> Option<crate::ledger::LedgerLayer> {
    let ledger = shared.ledger.clone()?;
    let provider: Arc<str> = match &shared.receipts {
        Some(r) => r.provider().into(),
        None => "self".into(),
    };
    let layer = crate::ledger::LedgerLayer::new(
        ledger,
        "inbound",
        Arc::new(move |_| provider.clone()),
        shared.clock.clone(),
    );
    Some(match shared.receipts {
        Some(_) => layer.over_receipts(),
        None => layer,
    })
}

/// Where a signed front records nonces: the shared store when there is one, else this
/// process's (opened at start for every front with `auth`).
pub(crate) fn replay_guard(shared: &Shared, nonce_ttl_s: u64) -> ReplayGuard {
    match &shared.redis {
        Some(redis) => ReplayGuard::Shared {
            store: Arc::new(redis.clone()),
            ttl: Duration::from_secs(nonce_ttl_s),
        },
        None => ReplayGuard::Local(
            shared
                .nonces
                .clone()
                .expect("a front with auth has a nonce store"),
        ),
    }
}

/// Notes each accepted call's peer in the peer store (`last_seen_at`).
fn seen(shared: &Shared) -> carapace_filters::authorization::AllowedHook {
    let peers = shared.peers.clone();
    Arc::new(move |principal, now_ms| peers.note_seen(principal, now_ms))
}
