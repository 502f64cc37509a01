//! The outbound role's stack: the local agent's tools-v1 calls, validated and routed to paired
//! peers and skills.

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

use crate::config::{Loaded, Protocol};
use crate::edge::{edge, HttpStack, PanicAnswer};
use crate::front::{CallStack, Envelope};
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
    let calls: CallStack = BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(KillSwitchLayer::new(shared.kill_switch.clone()))
            .layer(AuthorizationLayer::new(shared.clock.clone()))
            .layer(InputSchemaLayer)
            .layer(CallTimeoutLayer)
            .layer(OutputSchemaLayer)
            .service(OutboundBack::new(outbound.clone())),
    );
    let body = BodyLimits {
        max_bytes: c.limits.max_body_bytes,
        deadline: Duration::from_millis(c.limits.body_timeout_ms),
    };
    let http = ServiceBuilder::new()
        .layer(IdentityLayer::new(shared.peers.clone(), false))
        .layer(KillSwitchLayer::new(shared.kill_switch.clone()))
        .layer(shared.load_shed_layer(c.limits.max_in_flight))
        .layer(BodyLimitLayer::new(body));
    let panic = PanicAnswer {
        front: Protocol::ToolsV1,
        answers,
    };
    edge(
        Envelope::new(
            http.service(ToolsV1Front::new(
                outbound.catalog.clone(),
                calls,
                shared.clock.clone(),
                answers,
                shared.in_flight.clone(),
            )),
            Protocol::ToolsV1,
            answers,
            shared.metrics.clone(),
        ),
        panic,
    )
}
