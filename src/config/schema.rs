//! The JSON Schema of the configuration file, generated from the section types.

use super::Config;

/// The JSON Schema of the configuration file.
///
/// Optional keys are omitted, not `null`: that keeps every error at the key it concerns.
pub fn json_schema() -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(Config)).expect("serializes");
    drop_null_alternatives(&mut schema);
    require_non_empty_strings(&mut schema);
    // The one string whose emptiness means something: `ops.address: ""` disables the endpoint.
    if let Some(address) = schema.pointer_mut("/$defs/OpsConfig/properties/address") {
        address.as_object_mut().map(|m| m.remove("minLength"));
    }
    schema
}

/// Every string in the file must be non-empty: an empty path, address or name is a mistake
/// (`state_dir: ""` would be the working directory), never a way to say "none".
fn require_non_empty_strings(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let is_string = match m.get("type") {
                Some(Value::String(t)) => t == "string",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
                _ => false,
            };
            if is_string && !m.contains_key("minLength") {
                m.insert("minLength".into(), Value::from(1));
            }
            m.values_mut().for_each(require_non_empty_strings);
        }
        Value::Array(a) => a.iter_mut().for_each(require_non_empty_strings),
        _ => {}
    }
}

/// `anyOf: [X, {type: null}]` becomes `X`, and `type: [T, "null"]` becomes `T`.
fn drop_null_alternatives(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            if let Some(Value::Array(alts)) = m.get("anyOf") {
                let non_null: Vec<Value> = alts
                    .iter()
                    .filter(|a| a.get("type").and_then(Value::as_str) != Some("null"))
                    .cloned()
                    .collect();
                if non_null.len() == 1 && alts.len() == 2 {
                    m.remove("anyOf");
                    if let Value::Object(inner) = &non_null[0] {
                        for (k, val) in inner {
                            m.entry(k.clone()).or_insert_with(|| val.clone());
                        }
                    }
                }
            }
            if let Some(Value::Array(types)) = m.get("type") {
                let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if rest.len() == 1 {
                    m.insert("type".into(), rest[0].clone());
                }
            }
            for (_, child) in m.iter_mut() {
                drop_null_alternatives(child);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(drop_null_alternatives),
        _ => {}
    }
}
