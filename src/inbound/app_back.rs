//! The back a call stage ends in: the back of the app's protocol, or the relay in front of it.
//!
//! Every back already answers with one boxed future; an enum hands it on as it is (a boxed
//! service would box it a second time).

use std::task::{Context, Poll};

use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::{BoxFuture, Rejection};
use tower::Service;

use crate::mcp::back::McpBack;
use crate::relay::RelayRouter;
use crate::skill_v1::SkillV1Back;
use crate::tools_v1::ToolsV1Back;

/// The app's back, by the app's protocol; or the relay, which routes the calls of tools a
/// connected caller offers to that caller and the others to the app's back.
#[derive(Clone)]
pub(crate) enum AppBack {
    ToolsV1(ToolsV1Back),
    SkillV1(SkillV1Back),
    Mcp(McpBack),
    Relay(RelayRouter),
}

impl Service<ToolCall> for AppBack {
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = BoxFuture<Result<CallOutcome, Rejection>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        match self {
            AppBack::ToolsV1(back) => back.poll_ready(cx),
            AppBack::SkillV1(back) => back.poll_ready(cx),
            AppBack::Mcp(back) => back.poll_ready(cx),
            AppBack::Relay(back) => back.poll_ready(cx),
        }
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        match self {
            AppBack::ToolsV1(back) => back.call(call),
            AppBack::SkillV1(back) => back.call(call),
            AppBack::Mcp(back) => back.call(call),
            AppBack::Relay(back) => back.call(call),
        }
    }
}
