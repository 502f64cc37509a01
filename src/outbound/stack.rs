//! The outbound role's stack: the local agent's calls, tools-v1 or MCP (at `/mcp`), validated
//! and routed to paired peers and skills.

use std::sync::Arc;
use std::time::Duration;

use carapace_filters::authorization::AuthorizationLayer;
use carapace_filters::body::{BodyLimitLayer, BodyLimits};
use carapace_filters::identity::IdentityLayer;
use carapace_filters::kill_switch::KillSwitchLayer;
use carapace_filters::schema::{InputSchemaLayer, OutputSchemaLayer};
use carapace_filters::timeout::CallTimeoutLayer;
use tower::util::BoxCloneSyncService;
use tower::ServiceBuilder;

use crate::caller_body::CallerBody;
use crate::config::mcp::McpFrontConfig;
use crate::config::{Loaded, Protocol};
use crate::edge::{edge, HttpStack, PanicAnswer};
use carapace_filters::secret_guard::{Scanned, SecretGuardLayer};

use crate::front::{CallStack, Envelope};
use crate::mcp::McpFront;
use crate::outbound::{Outbound, OutboundBack};
/// The service every listener hands requests to.
use crate::server::shared::Shared;
use crate::tools_v1::ToolsV1Front;

/// The outbound role's stack: the local agent's calls, validated, routed to paired peers.
pub(crate) fn build_outbound_stack(
    cfg: &Loaded,
    shared: &Shared,
    outbound: Arc<Outbound>,
) -> HttpStack {
    let c = &cfg.config;
    let answers = c.outbound.as_ref().map(|o| o.answers).unwrap_or_default();
    let calls = call_stage(cfg, shared, &outbound);
    let body = BodyLimits {
        max_bytes: c.limits.max_body_bytes,
        deadline: Duration::from_millis(c.limits.body_timeout_ms),
    };
    // Remote agents (`outbound.listen`) come without a certificate and are authenticated by
    // their bearer token, the next layer; the local socket is the local principal.
    let remote = c.outbound.as_ref().is_some_and(|o| o.listen.is_some());
    // The identity layer removes the caller's own `x-carapace-*` headers; the back builds the
    // peer's request from the call's principal and forwards none of the caller's headers.
    let http = || {
        ServiceBuilder::new()
            .layer(IdentityLayer::new(shared.peers.clone(), remote))
            .option_layer(crate::oauth::outbound_layer(cfg, shared.clock.clone()))
            .layer(KillSwitchLayer::new(shared.kill_switch.clone()))
            .layer(shared.load_shed_layer(c.limits.max_in_flight))
            .layer(BodyLimitLayer::new(body))
    };
    let metrics = shared.metrics.clone();
    let mcp_cfg = Arc::new(McpFrontConfig::default());
    let mcp = McpFront::new(
        outbound.catalog.clone(),
        calls.clone(),
        calls.clone(),
        shared.clock.clone(),
        mcp_cfg.clone(),
        shared
            .mcp_sessions
            .clone()
            .expect("made at start for the outbound role"),
        shared.in_flight.clone(),
    );
    let mcp = Envelope::new(http().service(mcp), Protocol::Mcp, answers, metrics.clone());
    let tools = ToolsV1Front::new(
        outbound.catalog.clone(),
        calls,
        shared.clock.clone(),
        answers,
        shared.in_flight.clone(),
    );
    let tools = Envelope::new(
        http().service(tools),
        Protocol::ToolsV1,
        answers,
        metrics.clone(),
    );
    let search = SearchRoute {
        outbound,
        clock: shared.clock.clone(),
    };
    let search = Envelope::new(http().service(search), Protocol::ToolsV1, answers, metrics);
    let panic = |front| PanicAnswer { front, answers };
    BoxCloneSyncService::new(ByPath {
        path: mcp_cfg.path.clone().into(),
        on_path: edge(mcp, panic(Protocol::Mcp), None),
        search: edge(search, panic(Protocol::ToolsV1), None),
        elsewhere: edge(tools, panic(Protocol::ToolsV1), None),
    })
}

/// The outbound call stage: kill-switch, the caller's permissions, the input schema, the
/// ledger, the timeout, the output schema and the secret guard on arguments, before the back
/// that routes each call to its peer or skill.
fn call_stage(cfg: &Loaded, shared: &Shared, outbound: &Arc<Outbound>) -> CallStack {
    CallStack::new(
        ServiceBuilder::new()
            .layer(KillSwitchLayer::new(shared.kill_switch.clone()))
            .layer(AuthorizationLayer::new(shared.clock.clone()))
            .layer(InputSchemaLayer)
            // Above the timeout: a call that times out is recorded as `TIMEOUT`, with the
            // answer the caller got (output schema and secret guard included).
            .option_layer(shared.ledger.clone().map(|ledger| {
                let routes = outbound.clone();
                crate::ledger::LedgerLayer::new(
                    ledger,
                    "outbound",
                    Arc::new(move |call| routes.provider_of(&call.tool.name).into()),
                    shared.clock.clone(),
                )
            }))
            .layer(CallTimeoutLayer)
            .layer(OutputSchemaLayer)
            .option_layer(
                crate::secret_guard::of(cfg, crate::secret_guard::Role::Outbound)
                    .map(|g| SecretGuardLayer::new(g, Scanned::Arguments)),
            )
            .service(OutboundBack::new(outbound.clone())),
    )
    .for_workers(shared.workers.count())
}

/// The path of tool search on the outbound endpoint.
pub const SEARCH_PATH: &str = "/v1/tools/search";

/// `GET /v1/tools/search?q=<text>&limit=<n>`: the tools the caller may call that match,
/// best first (see [`crate::outbound::search`]).
#[derive(Clone)]
struct SearchRoute {
    outbound: Arc<Outbound>,
    clock: carapace_filters::signature::UnixClock,
}

impl<B> tower::Service<http::Request<B>> for SearchRoute {
    type Response = crate::front::Resp;
    type Error = carapace_filters::Rejection;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        std::future::ready(self.answer(&req))
    }
}

impl SearchRoute {
    fn answer<B>(
        &self,
        req: &http::Request<B>,
    ) -> Result<crate::front::Resp, carapace_filters::Rejection> {
        use carapace_filters::Rejection;
        if req.method() != http::Method::GET {
            return Err(Rejection::MethodNotAllowed("GET".into()));
        }
        let principal = crate::front::principal(req)?;
        let mut text = None;
        let mut limit = 10usize;
        for (k, v) in form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes()) {
            match &*k {
                "q" => text = Some(v.into_owned()),
                "limit" => {
                    limit = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=100).contains(n))
                        .ok_or_else(|| Rejection::InvalidRequest {
                            message: "`limit` must be a whole number from 1 to 100".into(),
                            path: Some("limit".into()),
                        })?
                }
                _ => {}
            }
        }
        let text = text.ok_or_else(|| Rejection::InvalidRequest {
            message: "`q` is required".into(),
            path: Some("q".into()),
        })?;
        let results = self
            .outbound
            .search(&text, limit, &principal, (self.clock)())
            .map_err(Rejection::Internal)?;
        Ok(crate::front::json_response(
            http::StatusCode::OK,
            &serde_json::json!({"query": text, "results": results}),
        ))
    }
}

/// Sends requests for `path` (MCP) to one stack, tool search to another, and every other
/// request to the tools-v1 stack.
#[derive(Clone)]
struct ByPath {
    path: Arc<str>,
    on_path: HttpStack,
    search: HttpStack,
    elsewhere: HttpStack,
}

impl tower::Service<http::Request<CallerBody>> for ByPath {
    type Response = <HttpStack as tower::Service<http::Request<CallerBody>>>::Response;
    type Error = std::convert::Infallible;
    type Future = <HttpStack as tower::Service<http::Request<CallerBody>>>::Future;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // Both stacks are always ready (boxed edges over `Envelope`s that are).
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<CallerBody>) -> Self::Future {
        use tower::ServiceExt;
        let stack = match req.uri().path() {
            p if p == &*self.path => self.on_path.clone(),
            SEARCH_PATH => self.search.clone(),
            _ => self.elsewhere.clone(),
        };
        Box::pin(stack.oneshot(req))
    }
}
