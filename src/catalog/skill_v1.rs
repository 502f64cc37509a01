//! A skill-v1 app's `GET /manifest`, in either shape, as a catalog.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use carapace_filters::call::ToolSpec;

use super::{clamp_max, compile, Catalog, DiscoveryError};
use crate::config::{Loaded, SkillAppConfig};

/// Compile a skill-v1 `GET /manifest` answer (either shape).
pub fn skill_catalog(
    doc: &Value,
    skill: &SkillAppConfig,
    cfg: &Loaded,
) -> Result<Catalog, DiscoveryError> {
    check_head(doc, skill)?;
    let caps = doc
        .get("capabilities")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("manifest capabilities is not an array"))?;
    let top = (doc.get("input_schema"), doc.get("output_schema"));
    let mut tools = BTreeMap::new();
    for (i, cap) in caps.iter().enumerate() {
        let Some(spec) = capability(i, cap, top, skill, cfg) else {
            continue;
        };
        let name = spec.name.clone();
        if tools.insert(name.clone(), Arc::new(spec)).is_some() {
            tracing::warn!(
                "capability_duplicate skill_id={} capability={name}: the last definition is served",
                skill.skill_id
            );
        }
    }
    for missing in skill
        .capabilities
        .iter()
        .filter(|c| !tools.contains_key(*c))
    {
        tracing::warn!(
            "capability_unavailable skill_id={} capability={missing} reason=not_in_manifest",
            skill.skill_id
        );
    }
    tracing::info!("manifest_schema_ok skill_id={}", skill.skill_id);
    Ok(Catalog {
        tools,
        service: skill.skill_id.clone(),
        version: doc
            .get("version")
            .and_then(Value::as_str)
            .map(str::to_owned),
        withheld: Default::default(),
        digest: [0; 32],
    })
}

fn invalid(m: &str) -> DiscoveryError {
    DiscoveryError::ManifestInvalid(m.to_string())
}

/// The manifest's protocol version and id must be the skill's.
fn check_head(doc: &Value, skill: &SkillAppConfig) -> Result<(), DiscoveryError> {
    let version = doc.get("gateway_protocol_version").and_then(Value::as_str);
    if version != Some(skill.protocol_version.as_str()) {
        return Err(DiscoveryError::ProtocolVersion {
            got: version.unwrap_or("<missing>").to_string(),
            expected: skill.protocol_version.clone(),
        });
    }
    tracing::info!("manifest_protocol_ok version={}", skill.protocol_version);
    match doc.get("id").and_then(Value::as_str) {
        Some(id) if id == skill.skill_id => Ok(()),
        Some(id) => Err(DiscoveryError::ManifestInvalid(format!(
            "manifest id {id} does not match skill_id {}",
            skill.skill_id
        ))),
        None => Err(invalid("manifest id is missing")),
    }
}

/// Capability `i` of the manifest as a tool, or `None` (logged) when it is not served.
fn capability(
    i: usize,
    cap: &Value,
    (top_in, top_out): (Option<&Value>, Option<&Value>),
    skill: &SkillAppConfig,
    cfg: &Loaded,
) -> Option<ToolSpec> {
    let skipped = |what: String| {
        tracing::warn!("capability_skipped skill_id={} {what}", skill.skill_id);
        None
    };
    // Text shape: a string, schemas at the top. Vagus shape: an object with its own.
    let (name, description, input, output) = match cap {
        Value::String(s) => (s.as_str(), "", top_in, top_out),
        Value::Object(o) => match o.get("capability").and_then(Value::as_str) {
            Some(n) => (
                n,
                o.get("description").and_then(Value::as_str).unwrap_or(""),
                o.get("input_schema").or(top_in),
                o.get("output_schema").or(top_out),
            ),
            None => return skipped(format!("index={i} reason=missing_capability_name")),
        },
        _ => return skipped(format!("index={i} reason=not_a_string_or_object")),
    };
    if !skill.capabilities.iter().any(|c| c == name) {
        return skipped(format!("capability={name} reason=not_in_registry"));
    }
    let (Some(input), Some(output)) = (input, output) else {
        return skipped(format!("capability={name} reason=missing_schema"));
    };
    let compiled =
        compile(name, "input", input).and_then(|i| compile(name, "output", output).map(|o| (i, o)));
    let (input, output) = match compiled {
        Ok(pair) => pair,
        Err(reason) => return skipped(format!("capability={name} reason={reason}")),
    };
    let max = clamp_max(name, skill.timeout_ms_max, cfg);
    Some(ToolSpec {
        name: name.to_string(),
        app_name: None,
        definition: None,
        description: description.to_string(),
        input,
        output: Some(output),
        timeout_ms_default: skill.timeout_ms_default.clamp(1, max),
        timeout_ms_max: max,
        idempotent: false,
        side_effects: true,
    })
}
