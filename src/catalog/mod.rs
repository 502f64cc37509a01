//! Tool discovery from the app, and the catalog of tools with their compiled schemas.
//!
//! A tools-v1 app is asked `GET /v1/tools`; a skill-v1 app `GET /manifest`, in either shape:
//! the protocol text's (capabilities as strings, one input and one output schema at the top)
//! or the one the public Vagus code serves (capabilities as objects carrying their own
//! schemas). Schemas are compiled once per discovery; an unchanged answer reuses the compiled
//! catalog. Skill Gateway v1 log markers are emitted exactly as that text spells them.

mod filter;
pub mod pins;
mod skill_v1;
mod tools_v1;

pub use skill_v1::skill_catalog;
pub use tools_v1::tools_v1_catalog;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};

use carapace_filters::call::ToolSpec;
use carapace_filters::schema::CompiledSchema;
use carapace_filters::Rejection;

use crate::app::AppConn;
use crate::config::{Loaded, Protocol};
use crate::mcp::back::McpUpstream;
use crate::upstream::AppClient;

/// The protocol's ceiling for `timeout_ms`.
pub const PROTOCOL_TIMEOUT_MAX_MS: u64 = 120_000;

/// What discovery found.
#[derive(Debug, Default, Clone)]
pub struct Catalog {
    pub tools: BTreeMap<String, Arc<ToolSpec>>,
    /// `service` (tools-v1) or manifest `id` (skill-v1) of the app.
    pub service: String,
    /// The app's own version, when it says (skill-v1 manifests do).
    pub version: Option<String>,
    /// Tools not served because their definition is not the approved one ([`pins`]).
    pub withheld: BTreeMap<String, pins::Withheld>,
    /// Hash of the raw discovery answer, to skip recompiling an unchanged one.
    digest: [u8; 32],
}

impl Catalog {
    pub fn get(&self, name: &str) -> Option<&Arc<ToolSpec>> {
        self.tools.get(name)
    }

    /// The tool a call names: `ToolNotApproved` when it is withheld, else `ToolNotFound`.
    pub fn lookup(&self, name: &str) -> Result<&Arc<ToolSpec>, Rejection> {
        if let Some(w) = self.withheld.get(name) {
            return Err(Rejection::ToolNotApproved {
                tool: name.to_owned(),
                changed: w.changed.clone(),
            });
        }
        self.tools
            .get(name)
            .ok_or_else(|| Rejection::ToolNotFound(name.to_owned()))
    }
}

/// Why discovery failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("MANIFEST_INVALID: {0}")]
    ManifestInvalid(String),
    #[error("PROTOCOL_VERSION_UNSUPPORTED: manifest version {got}, expected {expected}")]
    ProtocolVersion { got: String, expected: String },
    #[error("DEPENDENCY_UNAVAILABLE: {0}")]
    Unavailable(String),
}

impl DiscoveryError {
    /// The `reason=` of a `skill_skipped` line: the message up to its first `:`.
    fn reason(&self) -> String {
        let s = self.to_string();
        s.split(':').next().unwrap_or(&s).to_string()
    }
}

/// The live catalog, swapped atomically on each successful discovery: the app's tools (the
/// base) and the tools connected callers offer ([`crate::relay`], the overlay), merged once
/// whenever either changes, so that a call reads one `Arc`.
#[derive(Debug)]
pub struct CatalogHandle {
    current: ArcSwap<Catalog>,
    base: ArcSwap<Catalog>,
    overlay: ArcSwap<BTreeMap<String, Arc<ToolSpec>>>,
    /// One merge at a time, so the last change is the one served.
    merging: std::sync::Mutex<()>,
    discovered: std::sync::atomic::AtomicBool,
    /// Whether `remote_tools_registered` was logged for the current catalog.
    registered: std::sync::atomic::AtomicBool,
    /// Recompile on the next discovery even if the app's answer is unchanged.
    stale: std::sync::atomic::AtomicBool,
}

impl Default for CatalogHandle {
    fn default() -> Self {
        CatalogHandle {
            current: ArcSwap::from_pointee(Catalog::default()),
            base: ArcSwap::from_pointee(Catalog::default()),
            overlay: ArcSwap::from_pointee(BTreeMap::new()),
            merging: std::sync::Mutex::new(()),
            discovered: false.into(),
            registered: false.into(),
            stale: false.into(),
        }
    }
}

impl CatalogHandle {
    pub fn load(&self) -> Arc<Catalog> {
        self.current.load_full()
    }

    /// The served catalog's entry for the tool `name` ([`Catalog::lookup`]), read without
    /// taking a reference to the whole catalog: a call needs only its tool, and each count
    /// taken and given back is an atomic read-modify-write on a line every call shares.
    pub fn lookup(&self, name: &str) -> Result<Arc<ToolSpec>, Rejection> {
        self.current.load().lookup(name).cloned()
    }

    /// Whether the served catalog holds the tool `name` (withheld tools are not held): read
    /// without copying its entry or making the refusal [`lookup`](Self::lookup) would.
    pub fn serves(&self, name: &str) -> bool {
        self.current.load().get(name).is_some()
    }

    /// Serve `catalog` (the outbound registry builds its own from several peers).
    pub fn replace(&self, catalog: Catalog) {
        self.set_base(catalog);
        self.discovered
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// The app's tools alone, without the overlay.
    pub fn base(&self) -> Arc<Catalog> {
        self.base.load_full()
    }

    /// Serve `tools` beside the app's (a name the app serves stays the app's).
    pub fn set_overlay(&self, tools: BTreeMap<String, Arc<ToolSpec>>) {
        let _one = self.merging.lock().unwrap_or_else(|e| e.into_inner());
        self.overlay.store(Arc::new(tools));
        self.merge();
    }

    fn set_base(&self, catalog: Catalog) {
        let _one = self.merging.lock().unwrap_or_else(|e| e.into_inner());
        self.base.store(Arc::new(catalog));
        self.merge();
    }

    /// `current` = base + overlay; with no overlay, the base itself.
    fn merge(&self) {
        let base = self.base.load_full();
        let overlay = self.overlay.load();
        if overlay.is_empty() {
            self.current.store(base);
            return;
        }
        let mut merged = (*base).clone();
        for (name, spec) in overlay.iter() {
            merged
                .tools
                .entry(name.clone())
                .or_insert_with(|| spec.clone());
        }
        self.current.store(Arc::new(merged));
    }

    /// The configuration changed: the next discovery recompiles even an unchanged answer.
    pub fn invalidate(&self) {
        self.stale.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether discovery has succeeded at least once.
    pub fn discovered(&self) -> bool {
        self.discovered.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Discover once and swap the catalog in. On failure the previous catalog stays. While
    /// `disabled` (global kill-switch) the catalog is still kept warm, but registration is
    /// logged as skipped.
    pub async fn refresh(
        &self,
        app: &AppConn,
        cfg: &Loaded,
        disabled: bool,
        pins: &pins::PinStore,
    ) -> Result<usize, DiscoveryError> {
        let previous = self.base();
        let reuse = !self.stale.swap(false, std::sync::atomic::Ordering::AcqRel);
        let result = match app {
            AppConn::Http(app) => discover(app, cfg, &previous, reuse).await,
            AppConn::Mcp(server) => discover_mcp(server, cfg, &previous, reuse).await,
        };
        match result {
            Ok(Some(mut catalog)) => {
                let tools = std::mem::take(&mut catalog.tools);
                let tools = filter::apply(tools, &cfg.config.app.filter);
                let mode = cfg.config.app.pinning.mode_for(cfg.config.app.protocol);
                (catalog.tools, catalog.withheld) = pins.check(tools, mode, &cfg.pins);
                let n = catalog.tools.len();
                self.log_registration(&catalog, disabled);
                self.set_base(catalog);
                self.discovered
                    .store(true, std::sync::atomic::Ordering::Release);
                Ok(n)
            }
            Ok(None) => {
                // Unchanged, but registration may have been skipped before.
                if !disabled && !self.registered.load(std::sync::atomic::Ordering::Acquire) {
                    self.log_registration(&previous, disabled);
                }
                Ok(previous.tools.len())
            }
            Err(e) => Err(e),
        }
    }

    /// The Skill Gateway v1 registration markers for a freshly discovered catalog.
    fn log_registration(&self, catalog: &Catalog, disabled: bool) {
        let names: Vec<&str> = catalog.tools.keys().map(String::as_str).collect();
        let registered = if disabled {
            tracing::warn!("registration_skipped reason=kill_switch_active");
            false
        } else if names.is_empty() {
            tracing::warn!("registration_skipped reason=no_routes_discovered");
            false
        } else {
            tracing::info!(
                "remote_tools_registered count={} tools=[{}]",
                names.len(),
                names.join(",")
            );
            true
        };
        self.registered
            .store(registered, std::sync::atomic::Ordering::Release);
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

/// Fetch and compile; `Ok(None)` when the answer is unchanged since `previous`.
async fn discover(
    app: &AppClient,
    cfg: &Loaded,
    previous: &Catalog,
    reuse: bool,
) -> Result<Option<Catalog>, DiscoveryError> {
    let timeout = Duration::from_millis(cfg.config.app.discovery.timeout_ms);
    let path = match cfg.config.app.protocol {
        Protocol::ToolsV1 => "/v1/tools",
        Protocol::SkillV1 => "/manifest",
        Protocol::Mcp => unreachable!("an MCP app is discovered by discover_mcp"),
    };
    let skill = cfg.config.app.skill.as_ref();
    if let Some(skill) = skill {
        tracing::info!(
            "manifest_discovery_start skill_id={} base_url={}",
            skill.skill_id,
            app.base_url()
        );
    }
    let fetched = tokio::time::timeout(
        timeout,
        app.send(Method::GET, path, http::HeaderMap::new(), Bytes::new()),
    )
    .await;
    let result = match fetched {
        Err(_) => Err(DiscoveryError::Unavailable(format!(
            "GET {path} timed out after {} ms",
            timeout.as_millis()
        ))),
        Ok(Err(e)) => Err(DiscoveryError::Unavailable(e.to_string())),
        Ok(Ok(resp)) if !resp.status.is_success() => Err(DiscoveryError::ManifestInvalid(format!(
            "GET {path} returned {}",
            resp.status.as_u16()
        ))),
        Ok(Ok(resp)) => {
            let d = digest(&resp.body);
            if reuse && previous.digest == d && !previous.tools.is_empty() {
                if let Some(skill) = skill {
                    tracing::info!("manifest_cached skill_id={}", skill.skill_id);
                }
                return Ok(None);
            }
            let doc: Result<Value, _> = serde_json::from_slice(&resp.body);
            match doc {
                Err(e) => Err(DiscoveryError::ManifestInvalid(format!(
                    "GET {path} is not JSON: {e}"
                ))),
                Ok(doc) => match skill {
                    None => tools_v1_catalog(&doc, cfg),
                    Some(skill) => skill_catalog(&doc, skill, cfg),
                }
                .map(|mut c| {
                    c.digest = d;
                    c
                }),
            }
        }
    };
    if let Err(e) = &result {
        match skill {
            Some(skill) => {
                tracing::warn!(
                    "skill_skipped skill_id={} reason={}",
                    skill.skill_id,
                    e.reason()
                );
                tracing::warn!("{e}");
            }
            None => tracing::warn!("tools_discovery_failed reason={e}"),
        }
    }
    result.map(Some)
}

/// Every page of an MCP server's `tools/list`, compiled; `Ok(None)` when unchanged.
async fn discover_mcp(
    server: &McpUpstream,
    cfg: &Loaded,
    previous: &Catalog,
    reuse: bool,
) -> Result<Option<Catalog>, DiscoveryError> {
    let timeout = Duration::from_millis(cfg.config.app.discovery.timeout_ms);
    let tools = match tokio::time::timeout(timeout, server.list_tools()).await {
        Err(_) => Err(DiscoveryError::Unavailable(format!(
            "tools/list timed out after {} ms",
            timeout.as_millis()
        ))),
        Ok(Err(e)) => Err(DiscoveryError::Unavailable(e.to_string())),
        Ok(Ok(tools)) => Ok(tools),
    };
    let tools = match tools {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!("tools_discovery_failed reason={e}");
            return Err(e);
        }
    };
    let d = digest(&serde_json::to_vec(&tools).expect("JSON values serialize"));
    if reuse && previous.digest == d && !previous.tools.is_empty() {
        return Ok(None);
    }
    let tools = crate::mcp::back::catalog_tools(&tools, |name| {
        clamp_max(name, PROTOCOL_TIMEOUT_MAX_MS, cfg)
    });
    Ok(Some(Catalog {
        tools,
        service: String::new(),
        version: None,
        withheld: BTreeMap::new(),
        digest: d,
    }))
}

pub(super) fn clamp_max(name: &str, declared: u64, cfg: &Loaded) -> u64 {
    let mut max = declared.clamp(1, PROTOCOL_TIMEOUT_MAX_MS);
    if let Some(o) = cfg.config.tools.get(name).and_then(|t| t.timeout_ms_max) {
        max = max.min(o);
    }
    max
}

pub(super) fn compile(name: &str, what: &str, schema: &Value) -> Result<CompiledSchema, String> {
    CompiledSchema::compile(schema.clone())
        .map_err(|e| format!("tool {name}: {what} schema does not compile: {e}"))
}

/// The `GET /v1/tools` descriptor of a tool: both schemas always present.
pub fn tools_v1_descriptor(t: &ToolSpec) -> Value {
    let mut d = json!({
        "name": t.name,
        "description": t.description,
        "input_schema": &**t.input.source(),
        "timeout_ms_default": t.timeout_ms_default,
        "timeout_ms_max": t.timeout_ms_max,
        "idempotent": t.idempotent,
        "side_effects": t.side_effects,
    });
    // A tool without an output schema (an MCP tool may have none) takes any output: `null`,
    // as the reference tool host writes it, so a tools-v1 gateway serves the tool too.
    d["output_schema"] = match &t.output {
        Some(o) => (**o.source()).clone(),
        None => Value::Null,
    };
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_looks_its_tool_up_in_the_catalog_served_now() {
        let handle = CatalogHandle::default();
        let tool = crate::front::tool_call(None).tool;
        let mut catalog = Catalog::default();
        catalog.tools.insert("t".into(), tool.clone());
        handle.replace(catalog);
        assert!(Arc::ptr_eq(&handle.lookup("t").unwrap(), &tool));
        assert!(matches!(handle.lookup("x"), Err(Rejection::ToolNotFound(n)) if n == "x"));
        assert!(handle.serves("t") && !handle.serves("x"));
        // A tool a connected caller offers is served beside the app's.
        handle.set_overlay(BTreeMap::from([("c".to_string(), tool.clone())]));
        assert!(handle.lookup("c").is_ok() && handle.lookup("t").is_ok());
        handle.set_overlay(BTreeMap::new());
        assert!(matches!(
            handle.lookup("c"),
            Err(Rejection::ToolNotFound(_))
        ));
    }
}
