//! The MCP back: real MCP servers behind carapace (the Python SDK over Streamable HTTP and over
//! stdio, the reference `server-everything` over stdio, a faulty stdio server), called through
//! the MCP and tools-v1 fronts. The calls in `calls`, servers run as commands in `commands`,
//! filtering, resources, prompts and batches in `passthrough`, the secret guard in `guard`.

mod calls;
mod commands;
#[path = "../common/mod.rs"]
mod common;
mod guard;
mod passthrough;

use carapace::client::{Client, Reply};
use common::call;
use common::mcp::interop;
use serde_json::Value;

/// A file under `tests/interop/node/node_modules` that must be installed (`npm ci` there).
pub(crate) fn node_module(rel: &str) -> String {
    let p = interop("node/node_modules").join(rel);
    assert!(
        p.exists(),
        "{} is missing: run `npm ci` in tests/interop/node",
        p.display()
    );
    p.display().to_string()
}

pub(crate) async fn tools_call(client: &Client, tool: &str, args: Value) -> Reply {
    client
        .post_json("/v1/tools/call", &[], &call(tool, args))
        .await
        .unwrap()
}
