//! Tool-definition pinning: a tool whose definition changes after it was approved (the "rug
//! pull") is not served until it is approved again.
//!
//! A tool's definition is what a caller or a model is shown of it: its served name,
//! description, input and output schemas and annotations. Its pin is `sha256:` and the hex
//! SHA-256 of that definition in canonical JSON (RFC 8785, `canonical::jcs_string`). Pins come
//! from the configuration (`app.pinning.pins` and `file`): then a tool without one is not
//! approved. Without configured pins, each tool is pinned at first discovery, in
//! `<state_dir>/tool-pins.json` (with the definition, so a change can be shown field by field).
//!
//! At each discovery, in `enforce` mode a tool whose definition differs from its pin is
//! withheld: not listed by any front, and a call to it is refused (`FORBIDDEN`, with
//! `details.reason: tool_not_approved` and the fields that changed) until it is approved with
//! `carapace tools approve <name>` (the admin socket) or a configuration change. In `warn`
//! mode it is served and reported. Either way the change is logged once
//! (`tool_definition_changed`, with the JSON pointers that differ, never the values) and
//! counted (`carapace_tool_definition_changes`).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use carapace_filters::call::ToolSpec;

use crate::config::PinMode;
use crate::ops::metrics::Metrics;

/// The state file of pins recorded at first discovery and by approvals.
pub const PINS_FILE: &str = "tool-pins.json";
/// Most JSON pointers a change report lists.
const MAX_CHANGED: usize = 16;

/// A tool's recorded pin, with the definition it was made from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pinned {
    pub sha256: String,
    #[serde(default)]
    pub definition: Value,
}

/// A tool not served because its definition is not the approved one.
#[derive(Debug, Clone, PartialEq)]
pub struct Withheld {
    /// The pin it should match (`None`: it has none among the configured pins).
    pub pinned: Option<String>,
    /// Its definition now, and that definition's pin.
    pub definition: Value,
    pub sha256: String,
    /// JSON pointers into the definition that changed (`["(not pinned)"]` without a pin).
    pub changed: Vec<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct PinsFile {
    version: u32,
    tools: BTreeMap<String, Pinned>,
}

/// Why an approval was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApproveError {
    #[error("no change of `{0}` waits for approval")]
    NothingWithheld(String),
    #[error("`{0}` is pinned in the configuration (app.pinning): change the pin there")]
    Configured(String),
    #[error("the pins could not be saved: {0}")]
    Save(String),
}

/// Most tools a pin store records. Every new name is recorded (with its definition) and
/// nothing is forgotten, so a provider that keeps renaming its tools would grow the store, and
/// its file, without end (past the size a start reads, the next start would fail).
pub const MAX_PINNED_TOOLS: usize = 4096;

/// Most bytes of definitions a pin store records (as its file writes them): half of what a
/// start reads, so that a few large definitions cannot take the file past it either.
const MAX_PINNED_BYTES: usize = (carapace_filters::state_file::MAX_STORE_BYTES / 2) as usize;

/// The bytes `definition` takes in the pins file.
fn pinned_size(definition: &Value) -> usize {
    serde_json::to_vec_pretty(definition).map_or(0, |v| v.len())
}

/// The recorded pins and the changes already reported; kept across reloads.
#[derive(Debug)]
pub struct PinStore {
    path: PathBuf,
    recorded: Mutex<BTreeMap<String, Pinned>>,
    reported: Mutex<HashSet<(String, String)>>,
    metrics: Option<Arc<Metrics>>,
    max_pinned: usize,
    max_pinned_bytes: usize,
}

impl PinStore {
    /// The pins recorded in `state_dir`. A damaged file is an error: silently starting over
    /// would approve every tool again.
    pub fn open(state_dir: &std::path::Path) -> Result<Self, String> {
        Self::open_at(state_dir.join(PINS_FILE))
    }

    /// The pins recorded in the file `path`.
    pub fn open_at(path: PathBuf) -> Result<Self, String> {
        let recorded = match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            _ => {
                let bytes = carapace_filters::state_file::read_bounded(
                    &path,
                    carapace_filters::state_file::MAX_STORE_BYTES,
                )
                .map_err(|e| format!("{}: {e}", path.display()))?;
                serde_json::from_slice::<PinsFile>(&bytes)
                    .map_err(|e| format!("{}: {e}", path.display()))?
                    .tools
            }
        };
        Ok(PinStore {
            path,
            recorded: Mutex::new(recorded),
            reported: Mutex::default(),
            metrics: None,
            max_pinned: MAX_PINNED_TOOLS,
            max_pinned_bytes: MAX_PINNED_BYTES,
        })
    }

    /// The store with room for `n` tools instead of [`MAX_PINNED_TOOLS`].
    #[cfg(test)]
    fn with_room_for(mut self, n: usize) -> Self {
        self.max_pinned = n;
        self
    }

    /// The store with room for `n` bytes of definitions instead of half of what a start reads.
    #[cfg(test)]
    fn with_bytes_for(mut self, n: usize) -> Self {
        self.max_pinned_bytes = n;
        self
    }

    /// Count changes and withheld tools in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn save(&self, recorded: &BTreeMap<String, Pinned>) -> Result<(), String> {
        let file = PinsFile {
            version: 1,
            tools: recorded.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&file).expect("pins serialize");
        carapace_filters::state_file::write_atomically(&self.path, &bytes)
            .map_err(|e| format!("{}: {e}", self.path.display()))
    }

    /// Split `tools` into the ones served and the ones withheld, as `mode` and the
    /// `configured` pins say; records the pins of new tools (without configured pins).
    pub fn check(
        &self,
        tools: BTreeMap<String, Arc<ToolSpec>>,
        mode: PinMode,
        configured: &BTreeMap<String, String>,
    ) -> (BTreeMap<String, Arc<ToolSpec>>, BTreeMap<String, Withheld>) {
        if mode == PinMode::Off {
            return (tools, BTreeMap::new());
        }
        let mut recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        let mut served = BTreeMap::new();
        let mut withheld = BTreeMap::new();
        let mut new = false;
        // The bytes recorded, counted when a new tool first needs it (once per check).
        let mut bytes: Option<usize> = None;
        for (name, tool) in tools {
            let definition = definition(&tool);
            let sha256 = pin_of(&definition);
            let (pinned, before) = if configured.is_empty() {
                let size = || pinned_size(&definition);
                match recorded.get(&name) {
                    Some(p) => (Some(p.sha256.clone()), Some(&p.definition)),
                    // Full: a new tool is not recorded, and is treated as one whose pin is
                    // not known (withheld under `enforce`).
                    None if recorded.len() >= self.max_pinned
                        || *bytes.get_or_insert_with(|| {
                            recorded.values().map(|p| pinned_size(&p.definition)).sum()
                        }) + size()
                            > self.max_pinned_bytes =>
                    {
                        self.report_full(mode);
                        (None, None)
                    }
                    None => {
                        bytes = bytes.map(|b| b + size());
                        recorded.insert(name.clone(), Pinned { sha256, definition });
                        new = true;
                        served.insert(name, tool);
                        continue;
                    }
                }
            } else {
                (configured.get(&name).cloned(), None)
            };
            if pinned.as_deref() == Some(sha256.as_str()) {
                served.insert(name, tool);
                continue;
            }
            let changed = changes(pinned.is_some(), before, &definition, configured.is_empty());
            if pinned.is_some() || !configured.is_empty() {
                self.report(&name, &sha256, &changed, mode);
            }
            let w = Withheld {
                pinned,
                definition,
                sha256,
                changed,
            };
            match mode {
                PinMode::Enforce => {
                    withheld.insert(name, w);
                }
                _ => {
                    served.insert(name, tool);
                }
            }
        }
        if new {
            if let Err(e) = self.save(&recorded) {
                tracing::error!("tool_pins_not_saved: {e}");
            }
        }
        if let Some(m) = &self.metrics {
            m.tools_withheld.set(withheld.len() as i64);
        }
        (served, withheld)
    }

    /// Say once that the store is full (not once per tool: the names may be endless).
    fn report_full(&self, mode: PinMode) {
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        if !reported.insert((String::new(), "full".into())) {
            return;
        }
        let action = match mode {
            PinMode::Enforce => "withheld",
            _ => "served unpinned (pinning: warn)",
        };
        tracing::warn!(
            "tool_pins_full pinned={}: new tools are {action}; approve or remove pins from {}",
            self.max_pinned,
            self.path.display()
        );
    }

    /// Log a change once per tool and definition.
    fn report(&self, name: &str, sha256: &str, changed: &[String], mode: PinMode) {
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        if !reported.insert((name.to_owned(), sha256.to_owned())) {
            return;
        }
        if let Some(m) = &self.metrics {
            m.tool_definition_changed(name);
        }
        let action = match mode {
            PinMode::Enforce => "withheld until approved",
            _ => "served (pinning: warn)",
        };
        tracing::warn!(
            tool = name,
            "tool_definition_changed tool={name} now={sha256} changed=[{}]: {action}",
            changed.join(",")
        );
    }

    /// Approve the withheld definition `w` of `name`: it becomes the tool's pin.
    pub fn approve(
        &self,
        name: &str,
        w: Option<&Withheld>,
        configured: &BTreeMap<String, String>,
    ) -> Result<String, ApproveError> {
        if configured.contains_key(name) || !configured.is_empty() {
            return Err(ApproveError::Configured(name.to_owned()));
        }
        let w = w.ok_or_else(|| ApproveError::NothingWithheld(name.to_owned()))?;
        let mut recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        let previous = recorded.insert(
            name.to_owned(),
            Pinned {
                sha256: w.sha256.clone(),
                definition: w.definition.clone(),
            },
        );
        if let Err(e) = self.save(&recorded) {
            match previous {
                Some(p) => recorded.insert(name.to_owned(), p),
                None => recorded.remove(name),
            };
            return Err(ApproveError::Save(e));
        }
        tracing::warn!(
            tool = name,
            "tool_definition_approved tool={name} pin={}",
            w.sha256
        );
        Ok(w.sha256.clone())
    }
}

/// What a caller is shown of a tool, as it is pinned.
pub fn definition(t: &ToolSpec) -> Value {
    let annotations = t
        .definition
        .as_ref()
        .and_then(|d| d.get("annotations"))
        .cloned()
        .unwrap_or_else(
            || json!({"readOnlyHint": !t.side_effects, "idempotentHint": t.idempotent}),
        );
    json!({
        "name": t.name,
        "description": t.description,
        "inputSchema": &**t.input.source(),
        "outputSchema": t.output.as_ref().map(|o| (**o.source()).clone()),
        "annotations": annotations,
    })
}

/// `sha256:<hex>` of a definition's canonical JSON.
pub fn pin_of(definition: &Value) -> String {
    use sha2::Digest;
    // A definition is built from JSON values and objects with string keys: it canonicalizes.
    let canonical = carapace_filters::canonical::jcs_string(definition)
        .unwrap_or_else(|_| definition.to_string());
    format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(canonical.as_bytes()))
    )
}

/// The JSON pointers at which `a` and `b` differ (leaves, or where their kinds differ), at
/// most [`MAX_CHANGED`].
pub fn differences(a: &Value, b: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(a, b, String::new(), &mut out);
    out.truncate(MAX_CHANGED);
    out
}

/// What a withheld (or reported) tool's pin check found: the store full or no pin, the
/// places its definition changed, or a pin whose definition was not recorded. `recorded`:
/// the pins are the ones recorded here, not configured ones.
fn changes(
    pinned: bool,
    before: Option<&Value>,
    definition: &Value,
    recorded: bool,
) -> Vec<String> {
    match (pinned, before) {
        (false, _) if recorded => vec!["(the pin store is full)".to_string()],
        (false, _) => vec!["(not pinned)".to_string()],
        (true, Some(before)) if !before.is_null() => differences(before, definition),
        (true, _) => vec!["(the pinned definition is not recorded)".to_string()],
    }
}

fn walk(a: &Value, b: &Value, at: String, out: &mut Vec<String>) {
    if out.len() >= MAX_CHANGED || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let next = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => walk(p, q, next, out),
                    _ => out.push(next),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                walk(p, q, format!("{at}/{i}"), out);
            }
        }
        _ => out.push(if at.is_empty() { "/".into() } else { at }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carapace_filters::schema::CompiledSchema;

    fn tool(name: &str, input: Value) -> Arc<ToolSpec> {
        Arc::new(ToolSpec {
            name: name.into(),
            app_name: None,
            definition: None,
            description: "d".into(),
            input: CompiledSchema::compile(input).unwrap(),
            output: None,
            timeout_ms_default: 1000,
            timeout_ms_max: 1000,
            idempotent: true,
            side_effects: false,
        })
    }

    fn tools(list: &[Arc<ToolSpec>]) -> BTreeMap<String, Arc<ToolSpec>> {
        list.iter().map(|t| (t.name.clone(), t.clone())).collect()
    }

    fn text(ty: &str) -> Value {
        json!({"type": "object", "properties": {"text": {"type": ty}}})
    }

    #[test]
    fn a_tool_is_pinned_at_first_sight_and_withheld_when_it_changes_until_approved() {
        let dir = tempfile::tempdir().unwrap();
        let store = PinStore::open(dir.path()).unwrap();
        let none = BTreeMap::new();
        let (served, held) =
            store.check(tools(&[tool("a", text("string"))]), PinMode::Enforce, &none);
        assert_eq!((served.len(), held.len()), (1, 0));

        // Another process reads the same pins.
        let store = PinStore::open(dir.path()).unwrap();
        let changed = tools(&[tool("a", text("integer"))]);
        let (served, held) = store.check(changed.clone(), PinMode::Enforce, &none);
        assert!(served.is_empty());
        assert_eq!(held["a"].changed, ["/inputSchema/properties/text/type"]);
        // Warn serves it, and reports the change.
        let (served, _) = store.check(changed.clone(), PinMode::Warn, &none);
        assert_eq!(served.len(), 1);

        assert_eq!(
            store.approve("b", None, &none),
            Err(ApproveError::NothingWithheld("b".into()))
        );
        let pin = store.approve("a", held.get("a"), &none).unwrap();
        assert_eq!(pin, held["a"].sha256);
        let (served, held) = store.check(changed, PinMode::Enforce, &none);
        assert_eq!((served.len(), held.len()), (1, 0));
        // Off pins nothing.
        let (served, _) = store.check(tools(&[tool("a", text("null"))]), PinMode::Off, &none);
        assert_eq!(served.len(), 1);
    }

    #[test]
    fn configured_pins_approve_only_what_they_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = PinStore::open(dir.path()).unwrap();
        let a = tool("a", text("string"));
        let pins = BTreeMap::from([("a".to_string(), pin_of(&definition(&a)))]);
        let (served, held) = store.check(
            tools(&[a, tool("b", text("string"))]),
            PinMode::Enforce,
            &pins,
        );
        assert_eq!(served.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(held["b"].changed, ["(not pinned)"]);
        assert_eq!(
            store.approve("b", held.get("b"), &pins),
            Err(ApproveError::Configured("b".into()))
        );
        assert!(
            !dir.path().join(PINS_FILE).exists(),
            "configured pins are not recorded"
        );
    }

    /// A full store records no more tools: a new one is withheld under `enforce` (served
    /// under `warn`), the file does not grow, and the tools pinned before are served.
    #[test]
    fn a_full_store_records_no_new_tool() {
        let dir = tempfile::tempdir().unwrap();
        let store = PinStore::open(dir.path()).unwrap().with_room_for(2);
        let none = BTreeMap::new();
        let first = tools(&[tool("a", text("string")), tool("b", text("string"))]);
        let (served, _) = store.check(first, PinMode::Enforce, &none);
        assert_eq!(served.len(), 2);
        let size = std::fs::metadata(dir.path().join(PINS_FILE)).unwrap().len();
        let renamed = |n: usize| {
            let name = format!("c{n}");
            tools(&[tool("a", text("string")), tool(&name, text("string"))])
        };
        for n in 0..5 {
            let (served, held) = store.check(renamed(n), PinMode::Enforce, &none);
            assert_eq!(served.keys().collect::<Vec<_>>(), ["a"]);
            assert_eq!(held[&format!("c{n}")].changed, ["(the pin store is full)"]);
        }
        let (served, _) = store.check(renamed(9), PinMode::Warn, &none);
        assert_eq!(served.len(), 2);
        assert_eq!(
            std::fs::metadata(dir.path().join(PINS_FILE)).unwrap().len(),
            size
        );
        assert_eq!(store.recorded.lock().unwrap().len(), 2);
        assert_eq!(store.reported.lock().unwrap().len(), 1);
    }

    /// The store is full by bytes too: a few large definitions cannot take its file past
    /// what a start reads.
    #[test]
    fn a_store_full_by_bytes_records_no_new_tool() {
        let dir = tempfile::tempdir().unwrap();
        let one = pinned_size(&definition(&tool("a", text("string"))));
        // Room for the bytes of two such tools, and for any number of tools.
        let store = PinStore::open(dir.path())
            .unwrap()
            .with_bytes_for(2 * one + one / 2);
        let none = BTreeMap::new();
        let first = tools(&[tool("a", text("string")), tool("b", text("string"))]);
        let (served, _) = store.check(first, PinMode::Enforce, &none);
        assert_eq!(served.len(), 2);
        let third = tools(&[
            tool("a", text("string")),
            tool("b", text("string")),
            tool("c", text("string")),
        ]);
        let (served, held) = store.check(third, PinMode::Enforce, &none);
        assert_eq!(served.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(held["c"].changed, ["(the pin store is full)"]);
        assert_eq!(store.recorded.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_damaged_pins_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(PINS_FILE), b"{not json").unwrap();
        assert!(PinStore::open(dir.path()).is_err());
    }

    #[test]
    fn differences_name_every_changed_place_and_no_value() {
        let a = json!({"d": "old", "s": {"p": {"x": 1, "y": [1, 2]}}});
        let b = json!({"d": "new", "s": {"p": {"x": 1, "y": [1, 3], "z": true}}});
        assert_eq!(differences(&a, &b), ["/d", "/s/p/y/1", "/s/p/z"]);
        assert_eq!(differences(&json!(1), &json!("1")), ["/"]);
    }
}
