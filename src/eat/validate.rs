//! An EAT catalog's shape: the JSON Schema of the protocol text (embedded verbatim in
//! `catalog.schema.json`, draft-07, with format checks), and where the Conformance prose is
//! stricter: every tool has `x-mcp-tool` ("Include valid tool definitions with `x-mcp-tool`"),
//! tool names are unique ("Unique tool identifier"), and an MCP server is reached over HTTP(S).
//! Each failure has the `error_type` the EAT test vectors give it.

use std::sync::OnceLock;

use serde_json::Value;

/// The catalog schema of the EAT protocol text.
pub const CATALOG_SCHEMA: &str = include_str!("catalog.schema.json");

/// Why a catalog is refused: the kind (as the EAT vectors name it) and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} at {path}: {message}")]
pub struct CatalogError {
    pub kind: ErrorKind,
    /// JSON pointer into the catalog (`""` is the root).
    pub path: String,
    pub message: String,
}

/// The `error_type` of the EAT test vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidJson,
    MissingRequiredField,
    InvalidVersion,
    InvalidType,
    /// A tool name outside `^[a-zA-Z0-9_-]+$`, a repeated name, or a value of the wrong form.
    InvalidFormat,
    InvalidUrl,
    InvalidHash,
    InvalidVersionFormat,
}

impl ErrorKind {
    /// As the vectors spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidJson => "INVALID_JSON",
            ErrorKind::MissingRequiredField => "MISSING_REQUIRED_FIELD",
            ErrorKind::InvalidVersion => "INVALID_VERSION",
            ErrorKind::InvalidType => "INVALID_TYPE",
            ErrorKind::InvalidFormat => "INVALID_FORMAT",
            ErrorKind::InvalidUrl => "INVALID_URL",
            ErrorKind::InvalidHash => "INVALID_HASH",
            ErrorKind::InvalidVersionFormat => "INVALID_VERSION_FORMAT",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn validator() -> &'static jsonschema::Validator {
    static V: OnceLock<jsonschema::Validator> = OnceLock::new();
    V.get_or_init(|| {
        let schema: Value = serde_json::from_str(CATALOG_SCHEMA).expect("the embedded schema");
        jsonschema::options()
            .should_validate_formats(true)
            .build(&schema)
            .expect("the embedded schema compiles")
    })
}

/// The kind of one schema failure, from the keyword and where it is.
fn kind_of(e: &jsonschema::ValidationError<'_>, path: &str) -> ErrorKind {
    use jsonschema::error::ValidationErrorKind as K;
    match e.kind() {
        K::Required { .. } => ErrorKind::MissingRequiredField,
        K::Enum { .. } if path == "/version" => ErrorKind::InvalidVersion,
        K::Type { .. } => ErrorKind::InvalidType,
        K::Pattern { .. } if path.ends_with("/spec_hash") => ErrorKind::InvalidHash,
        K::Pattern { .. } if path.ends_with("/version") => ErrorKind::InvalidVersionFormat,
        K::Format { format, .. } if format == "uri" => ErrorKind::InvalidUrl,
        _ => ErrorKind::InvalidFormat,
    }
}

/// Check a catalog's bytes: the catalog when every rule holds, else every failure found.
pub fn validate(bytes: &[u8]) -> Result<Value, Vec<CatalogError>> {
    let catalog: Value = serde_json::from_slice(bytes).map_err(|e| {
        vec![CatalogError {
            kind: ErrorKind::InvalidJson,
            path: String::new(),
            message: e.to_string(),
        }]
    })?;
    let mut errors: Vec<CatalogError> = validator()
        .iter_errors(&catalog)
        .map(|e| {
            let path = e.instance_path().to_string();
            CatalogError {
                kind: kind_of(&e, &path),
                message: e.to_string(),
                path,
            }
        })
        .collect();
    errors.extend(prose(&catalog));
    if errors.is_empty() {
        Ok(catalog)
    } else {
        errors.sort_by(|a, b| a.path.cmp(&b.path));
        errors.dedup();
        Err(errors)
    }
}

/// The Conformance prose's rules beyond the schema.
fn prose(catalog: &Value) -> Vec<CatalogError> {
    let mut out = Vec::new();
    let Some(tools) = catalog.get("tools").and_then(Value::as_array) else {
        return out;
    };
    let mut seen = std::collections::HashSet::new();
    for (i, tool) in tools.iter().enumerate() {
        let at = |k: &str| format!("/tools/{i}/{k}");
        if !tool.is_object() {
            continue;
        }
        match tool.get("x-mcp-tool") {
            None => out.push(CatalogError {
                kind: ErrorKind::MissingRequiredField,
                path: at("x-mcp-tool"),
                message: "every tool needs `x-mcp-tool` (the Conformance section)".into(),
            }),
            Some(mcp) => {
                let url = mcp.get("server_url").and_then(Value::as_str);
                let web = url.is_some_and(|u| {
                    let lower = u.to_ascii_lowercase();
                    lower.starts_with("https://") || lower.starts_with("http://")
                });
                if url.is_some() && !web {
                    out.push(CatalogError {
                        kind: ErrorKind::InvalidUrl,
                        path: at("x-mcp-tool/server_url"),
                        message: "an MCP server is reached over http or https".into(),
                    });
                }
            }
        }
        if let Some(name) = tool.get("name").and_then(Value::as_str) {
            if !seen.insert(name) {
                out.push(CatalogError {
                    kind: ErrorKind::InvalidFormat,
                    path: at("name"),
                    message: format!("the tool name `{name}` is not unique"),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
