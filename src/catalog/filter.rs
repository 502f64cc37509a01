//! Static tool filtering from the configuration (`app.filter`): which of the app's tools are
//! served, under which name and with which description. Applied to every discovered catalog,
//! before authorization sees a tool and before any front offers it.

use std::collections::BTreeMap;
use std::sync::Arc;

use carapace_filters::call::ToolSpec;

use crate::config::ToolFilterConfig;

/// Whether `name` matches `pattern`: equal, or starting with what precedes a final `*`.
pub fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// The tools `filter` serves, by served name. `tools` is keyed by the app's names.
pub fn apply(
    tools: BTreeMap<String, Arc<ToolSpec>>,
    filter: &ToolFilterConfig,
) -> BTreeMap<String, Arc<ToolSpec>> {
    if filter.is_empty() {
        return tools;
    }
    let served = |name: &str| {
        (filter.allow.is_empty() || filter.allow.iter().any(|p| matches(p, name)))
            && !filter.deny.iter().any(|p| matches(p, name))
    };
    let mut out = BTreeMap::new();
    let mut renamed = Vec::new();
    for (name, tool) in tools {
        if !served(&name) {
            tracing::info!("tool_filtered name={name}");
            continue;
        }
        match filter.rename.get(&name) {
            Some(new) => renamed.push((new.clone(), name, tool)),
            None => {
                out.insert(name, tool);
            }
        }
    }
    // A renamed tool takes its new name even from a tool the app serves under that name.
    for (new, old, tool) in renamed {
        let mut spec = (*tool).clone();
        spec.app_name = Some(old.clone());
        spec.name = new.clone();
        if out.insert(new.clone(), Arc::new(spec)).is_some() {
            tracing::warn!(
                "tool_rename_collision name={new}: the app's own `{new}` is not served, `{old}` is"
            );
        }
    }
    for (name, description) in &filter.descriptions {
        if let Some(tool) = out.get_mut(name) {
            let mut spec = (**tool).clone();
            spec.description = description.clone();
            *tool = Arc::new(spec);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use carapace_filters::schema::CompiledSchema;
    use serde_json::json;

    fn tool(name: &str) -> (String, Arc<ToolSpec>) {
        let spec = ToolSpec {
            name: name.into(),
            app_name: None,
            definition: None,
            description: format!("{name} as the app describes it"),
            input: CompiledSchema::compile(json!({"type": "object"})).unwrap(),
            output: None,
            timeout_ms_default: 1000,
            timeout_ms_max: 1000,
            idempotent: false,
            side_effects: true,
        };
        (name.into(), Arc::new(spec))
    }

    #[test]
    fn allow_deny_rename_and_describe() {
        let tools: BTreeMap<_, _> = ["fs.read", "fs.write", "fs.delete", "net.get", "read"]
            .into_iter()
            .map(tool)
            .collect();
        let filter = ToolFilterConfig {
            allow: vec!["fs.*".into(), "net.get".into()],
            deny: vec!["fs.delete".into()],
            rename: [("fs.read".to_string(), "read".to_string())].into(),
            descriptions: [("read".to_string(), "Read a file.".to_string())].into(),
        };
        let out = apply(tools, &filter);
        assert_eq!(
            out.keys().collect::<Vec<_>>(),
            ["fs.write", "net.get", "read"]
        );
        let read = &out["read"];
        assert_eq!(read.name, "read");
        assert_eq!(read.app_name(), "fs.read");
        assert_eq!(read.description, "Read a file.");
        assert_eq!(out["fs.write"].app_name(), "fs.write");
    }

    #[test]
    fn patterns_match_exactly_or_by_prefix() {
        assert!(matches("a.*", "a.b") && matches("*", "x") && matches("a", "a"));
        assert!(!matches("a.*", "ab") && !matches("a", "ab"));
    }
}
