//! Admin routes of tool-definition pinning ([`crate::catalog::pins`]):
//!
//! - `GET /v1/tools/pins`: the pin of every served tool, and every withheld tool with its
//!   pin now, its approved pin and the fields that changed (the form `app.pinning.pins` takes).
//! - `POST /v1/tools/approve` `{"tool": NAME}`: approve a withheld tool's new definition; it
//!   is served from the next discovery on, which starts at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use serde::Deserialize;
use serde_json::{json, Value};

use super::admin::{read_object, reply, AdminBody};
use crate::catalog::pins::{definition, pin_of, ApproveError};
use crate::catalog::Catalog;
use crate::server::shared::Shared;

/// `POST /v1/tools/approve` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApproveRequest {
    pub tool: String,
    /// A tool of the outbound role (the paired peers' and skills'), not of the app.
    #[serde(default)]
    pub outbound: bool,
}

/// The pinning routes; `None` for any other path.
pub async fn handle<B: AdminBody>(
    shared: &Arc<Shared>,
    req: Request<B>,
) -> Option<Response<Full<Bytes>>> {
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/v1/tools/pins") => Some(pins(shared)),
        (Method::POST, "/v1/tools/approve") => Some(approve(shared, req).await),
        _ => None,
    }
}

fn pins(shared: &Shared) -> Response<Full<Bytes>> {
    let mut pins = report(&shared.catalog.load());
    if let Some(outbound) = shared.outbound.get() {
        pins["outbound"] = report(&outbound.catalog.load());
    }
    reply(StatusCode::OK, pins)
}

/// Every served tool's pin, and every withheld tool with what changed.
fn report(catalog: &Catalog) -> Value {
    let served: BTreeMap<&str, String> = catalog
        .tools
        .iter()
        .map(|(name, t)| (name.as_str(), pin_of(&definition(t))))
        .collect();
    let withheld: BTreeMap<&str, Value> = catalog
        .withheld
        .iter()
        .map(|(name, w)| {
            (
                name.as_str(),
                json!({"pin": w.sha256, "approved": w.pinned, "changed": w.changed}),
            )
        })
        .collect();
    json!({"pins": served, "withheld": withheld})
}

async fn approve<B: AdminBody>(shared: &Arc<Shared>, req: Request<B>) -> Response<Full<Bytes>> {
    let r: ApproveRequest = match read_object(req).await {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    let cfg = shared.config.load();
    let approved = if r.outbound {
        match shared.outbound.get() {
            Some(outbound) => outbound.approve(&r.tool, &cfg),
            None => {
                let e = "this carapace has no outbound role";
                return reply(StatusCode::NOT_FOUND, json!({ "error": e }));
            }
        }
    } else {
        let catalog = shared.catalog.load();
        shared
            .pins
            .approve(&r.tool, catalog.withheld.get(&r.tool), &cfg.pins)
    };
    match approved {
        Ok(pin) => {
            // Recompile even if the app's answer is unchanged, and do it now.
            shared.catalog.invalidate();
            shared.request_discovery();
            reply(StatusCode::OK, json!({"approved": r.tool, "pin": pin}))
        }
        Err(e @ ApproveError::NothingWithheld(_)) => {
            reply(StatusCode::NOT_FOUND, json!({"error": e.to_string()}))
        }
        Err(e @ ApproveError::Configured(_)) => {
            reply(StatusCode::CONFLICT, json!({"error": e.to_string()}))
        }
        Err(e @ ApproveError::Save(_)) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": e.to_string()}),
        ),
    }
}
