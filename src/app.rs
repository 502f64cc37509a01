//! The app behind carapace, as the inbound role reaches it: over HTTP for a tools-v1 or
//! skill-v1 app, through an MCP client for an MCP server (at an address, or a command).

use std::sync::Arc;

use tokio::sync::Notify;

use crate::config::{AppTarget, Loaded, Protocol};
use crate::mcp::back::http::HttpServer;
use crate::mcp::back::stdio::StdioServer;
use crate::mcp::back::upstream::Notices;
use crate::mcp::back::McpUpstream;
use crate::upstream::AppClient;

/// The connection to the app.
// Held once, behind the shared state's `ArcSwap`: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum AppConn {
    Http(AppClient),
    Mcp(Arc<McpUpstream>),
}

impl AppConn {
    /// Connect as `cfg` says, with a pool of HTTP connections for each of `workers`. A command
    /// is started (in the background) here, and stopped when the last clone of this
    /// connection is dropped.
    pub fn connect(cfg: &Loaded, workers: usize) -> AppConn {
        let app = &cfg.config.app;
        let http = |address: &crate::config::AppAddress| {
            AppClient::new(
                address.clone(),
                &app.pool,
                cfg.config.limits.max_response_bytes,
            )
            .pooled_per_worker(workers)
        };
        match (&cfg.app_target, app.protocol) {
            (AppTarget::Http(address), Protocol::Mcp) => {
                let notices = Notices::default();
                let path = app.mcp.clone().unwrap_or_default().path;
                let server = HttpServer::new(http(address), path, notices.clone());
                AppConn::Mcp(Arc::new(McpUpstream::new(Box::new(server), notices)))
            }
            (AppTarget::Http(address), _) => AppConn::Http(http(address)),
            (AppTarget::Command(spec), _) => {
                let notices = Notices::default();
                let server = StdioServer::start(spec.clone(), notices.clone());
                AppConn::Mcp(Arc::new(McpUpstream::new(Box::new(server), notices)))
            }
        }
    }

    /// Where the app is, for logs.
    pub fn describe(&self) -> String {
        match self {
            AppConn::Http(c) => c.base_url(),
            AppConn::Mcp(_) => "an MCP server".into(),
        }
    }

    /// Notified when an MCP server says its tools changed.
    pub fn list_changed(&self) -> Option<Arc<Notify>> {
        match self {
            AppConn::Http(_) => None,
            AppConn::Mcp(u) => Some(u.list_changed().clone()),
        }
    }
}
