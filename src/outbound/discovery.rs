//! Discovering the peers' tools and routing each to the peer that serves it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use carapace_filters::call::ToolSpec;

use bytes::Bytes;
use http::Method;

use super::routes::Route;
use super::Outbound;
use crate::catalog::{tools_v1_catalog, Catalog};
use crate::config::Loaded;
use crate::upstream::AppClient;

/// The tools of peer `id`'s discovery document (none when it does not compile).
pub(super) fn compiled_peer_tools(
    id: &str,
    doc: &serde_json::Value,
    cfg: &Loaded,
) -> BTreeMap<String, Arc<ToolSpec>> {
    match tools_v1_catalog(doc, cfg) {
        Ok(c) => c.tools,
        Err(e) => {
            tracing::warn!("outbound_discovery_failed peer={id} reason={e}");
            BTreeMap::new()
        }
    }
}

/// One registry from every source's tools, names kept collision-free: a name only one source
/// offers is served as it is; a name several offer is served once per source as
/// `<source id>.<name>` (the peer's component id or the skill's id), and each call reaches its
/// source under the plain name. A qualified name always reaches the source it names: a name
/// one source offers that is another's qualified name (`west.memory.append` from peer `aaa`)
/// is qualified too (`aaa.west.memory.append`), and qualified names are served first.
pub(super) fn merge(
    sources: Vec<(Route, BTreeMap<String, Arc<ToolSpec>>)>,
    merged: &mut Catalog,
    routes: &mut HashMap<String, Route>,
) {
    let source_of = |route: &Route| match route {
        Route::Peer(id) | Route::Skill(id) | Route::Eat(id) => id.clone(),
    };
    let mut offered: HashMap<&str, usize> = HashMap::new();
    for (_, tools) in &sources {
        for name in tools.keys() {
            *offered.entry(name).or_default() += 1;
        }
    }
    let shared: HashSet<&str> = offered
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(name, _)| name)
        .collect();
    let generated: HashSet<String> = sources
        .iter()
        .flat_map(|(route, tools)| {
            let source = source_of(route);
            tools
                .keys()
                .filter(|n| shared.contains(n.as_str()))
                .map(move |n| format!("{source}.{n}"))
        })
        .collect();
    let qualify = |name: &str| shared.contains(name) || generated.contains(name);
    for qualified_pass in [true, false] {
        for (route, tools) in &sources {
            let source = source_of(route);
            for (name, spec) in tools {
                if qualify(name) != qualified_pass {
                    continue;
                }
                let (served, spec) = match qualified_pass {
                    true => {
                        let mut qualified = (**spec).clone();
                        qualified.name = format!("{source}.{name}");
                        qualified.app_name = Some(name.clone());
                        (qualified.name.clone(), Arc::new(qualified))
                    }
                    false => (name.clone(), spec.clone()),
                };
                if merged.tools.contains_key(&served) {
                    tracing::warn!("outbound_tool_duplicate tool={served} source={source}");
                    continue;
                }
                routes.insert(served.clone(), route.clone());
                merged.tools.insert(served, spec);
            }
        }
    }
}

/// `GET /v1/tools` on a peer: its discovery document, or why not.
pub(super) async fn discover(client: &AppClient) -> Result<serde_json::Value, String> {
    let r = client
        .send(
            Method::GET,
            "/v1/tools",
            http::HeaderMap::new(),
            Bytes::new(),
        )
        .await
        .map_err(|e| e.to_string())?;
    if !r.status.is_success() {
        return Err(format!("GET /v1/tools answered {}", r.status));
    }
    let doc: serde_json::Value = serde_json::from_slice(&r.body)
        .map_err(|e| format!("GET /v1/tools answer is not JSON: {e}"))?;
    if doc["version"] != "v1" || !doc["tools"].is_array() {
        return Err("GET /v1/tools answer is not a tools-v1 discovery".into());
    }
    Ok(doc)
}

impl Outbound {
    /// Before the first discovery: route the tools each peer with a record last served, so
    /// a restart changes no answer (a revoked peer's tools stay refused with `FORBIDDEN`).
    pub(super) fn restore_known(&self, cfg: &Loaded) {
        let mut merged = Catalog::default();
        let mut routes = HashMap::new();
        let mut sources = Vec::new();
        for id in self.addresses.keys() {
            if self.peers.status_of(id).is_none() {
                continue;
            }
            if let Some(doc) = self.known.get(id) {
                sources.push((Route::Peer(id.clone()), compiled_peer_tools(id, &doc, cfg)));
            }
        }
        merge(sources, &mut merged, &mut routes);
        if routes.is_empty() {
            return;
        }
        self.pin(&mut merged, cfg);
        merged.service = "carapace-outbound".into();
        self.routes.store(Arc::new(routes));
        self.catalog.replace(merged);
    }

    /// The tools document of peer `id`: asked of it when it is paired and remembered; the
    /// remembered one when it is not paired or does not answer; none once it has no record.
    pub(super) async fn peer_tools(&self, id: &str) -> Option<serde_json::Value> {
        let client = match self.client_for(id) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("outbound_discovery_skipped peer={id} reason={e}");
                if self.peers.status_of(id).is_none() {
                    self.known.set(id, None);
                }
                return self.known.get(id);
            }
        };
        match discover(&client).await {
            Ok(doc) => {
                self.known.set(id, Some(doc.clone()));
                Some(doc)
            }
            Err(e) => {
                tracing::warn!("outbound_discovery_failed peer={id} reason={e}");
                self.known.get(id)
            }
        }
    }
}
