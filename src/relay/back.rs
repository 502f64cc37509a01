//! The back of relayed tools: a call to a tool a connected caller offers goes to that
//! caller ([`CallerTools::call`]); every other call goes to the app's back.

use std::sync::Arc;
use std::task::{Context, Poll};

use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::{BoxFuture, Rejection};
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

use super::registry::CallerTools;

/// Routes each call to the caller that offers its tool, or to `app`.
#[derive(Clone)]
pub struct RelayRouter {
    relay: Arc<CallerTools>,
    app: BoxCloneSyncService<ToolCall, CallOutcome, Rejection>,
}

impl RelayRouter {
    pub fn new(
        relay: Arc<CallerTools>,
        app: BoxCloneSyncService<ToolCall, CallOutcome, Rejection>,
    ) -> Self {
        RelayRouter { relay, app }
    }
}

impl Service<ToolCall> for RelayRouter {
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = BoxFuture<Result<CallOutcome, Rejection>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        if self.relay.serves(&call.tool.name) {
            let relay = self.relay.clone();
            return Box::pin(async move { relay.call(call).await });
        }
        let app = self.app.clone();
        Box::pin(async move { app.oneshot(call).await })
    }
}
