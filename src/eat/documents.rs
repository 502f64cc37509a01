//! The documents a tool host publishes: the EAT catalog, one OpenAPI 3.1 document per tool,
//! the JWKS and the did:web document. The catalog and the OpenAPI documents are served in
//! their RFC 8785 (JCS) form, so the SHA-256 of the bytes a client receives is the hash of
//! the canonical form (`catalog_hash`, `spec_hash`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use sha2::Digest;

use carapace_filters::call::ToolSpec;
use carapace_filters::canonical::jcs_string;

use super::names;
use crate::config::eat::{EatConfig, EatToolConfig};

/// Path of the catalog (EAT text: "Catalogs MUST be served at").
pub const CATALOG_PATH: &str = "/.well-known/api-catalog";
/// Path of the public keys as a JWKS (the text's fallback).
pub const JWKS_PATH: &str = "/.well-known/jwks.json";
/// Path of the did:web document.
pub const DID_PATH: &str = "/.well-known/did.json";
/// Where each tool's OpenAPI document is: this, its catalog name, then [`SPEC_SUFFIX`].
pub const SPEC_PREFIX: &str = "/.well-known/api-catalog/tools/";
pub const SPEC_SUFFIX: &str = "/openapi.json";

/// What every document of one tool host says, from `front.eat` and the front.
#[derive(Debug, Clone)]
pub struct Publication {
    /// `did:web:<host>`: the issuer, and the catalog's `metadata.publisher`.
    pub did: String,
    /// `base_url` without a trailing `/`.
    pub origin: String,
    /// The MCP endpoint the tools are called at.
    pub server_url: String,
    pub title: Option<String>,
    pub description: Option<String>,
    pub tools: BTreeMap<String, EatToolConfig>,
    pub signature_ttl_s: u64,
    pub max_age_s: u64,
}

impl Publication {
    pub fn new(e: &EatConfig, mcp_path: Option<&str>) -> Self {
        Publication {
            did: e.did(),
            origin: e.origin().to_owned(),
            server_url: e.server_url(mcp_path),
            title: e.title.clone(),
            description: e.description.clone(),
            tools: e.tools.clone(),
            signature_ttl_s: e.signature_ttl_s,
            max_age_s: e.max_age_s,
        }
    }

    /// `spec_url` of the tool named `eat_name` in the catalog.
    pub fn spec_url(&self, eat_name: &str) -> String {
        format!("{}{SPEC_PREFIX}{eat_name}{SPEC_SUFFIX}", self.origin)
    }

    /// `x-mcp-tool` of `tool`: the server, and its configured capabilities and examples.
    fn mcp_tool(&self, tool: &ToolSpec) -> Value {
        let own = self.tools.get(&tool.name).cloned().unwrap_or_default();
        let mut m = json!({"server_url": self.server_url, "method": "POST"});
        if !own.capabilities.is_empty() {
            m["capabilities"] = json!(own.capabilities);
        }
        if !own.examples.is_empty() {
            m["examples"] = json!(own.examples);
        }
        m
    }

    /// The OpenAPI 3.1 document of `tool`, canonical: one `POST` operation whose
    /// `operationId` is the tool's name, its input schema as the request body, its output
    /// schema (when it declares one) as the answer, and `x-mcp-tool`. The path is descriptive:
    /// the tool is called with MCP `tools/call` at `x-mcp-tool.server_url`.
    pub fn spec(&self, tool: &ToolSpec, version: Option<&str>) -> Result<String, String> {
        let eat_name = names::encode(&tool.name);
        let output = tool
            .output
            .as_ref()
            .map_or_else(|| json!({}), |o| o.source().as_ref().clone());
        let mut op = json!({
            "operationId": tool.name,
            "summary": tool.description,
            "requestBody": {
                "required": true,
                "content": {"application/json": {"schema": tool.input.source().as_ref()}},
            },
            "responses": {"200": {
                "description": "The tool's result",
                "content": {"application/json": {"schema": output}},
            }},
            "x-mcp-tool": self.mcp_tool(tool),
        });
        if tool.side_effects {
            op["x-side-effects"] = json!(true);
        }
        let doc = json!({
            "openapi": "3.1.0",
            "info": {"title": tool.name, "version": version.unwrap_or("0.0.0")},
            "servers": [{"url": self.server_url}],
            "paths": {format!("/tools/{eat_name}"): {"post": op}},
        });
        jcs_string(&doc).map_err(|e| format!("tool {}: {e}", tool.name))
    }

    /// The catalog of `tools`, canonical, with each tool's OpenAPI document hashed into its
    /// `spec_hash`. A tool whose documents cannot be written canonically (a schema with an
    /// integer beyond 2^53 that no double holds) is left out, and said so.
    pub fn catalog(&self, tools: &[Arc<ToolSpec>], version: Option<&str>) -> String {
        let version = version.filter(|v| is_semver(v));
        let mut entries = Vec::with_capacity(tools.len());
        for tool in tools {
            let spec = match self.spec(tool, version) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("eat_tool_skipped: {e}");
                    continue;
                }
            };
            let eat_name = names::encode(&tool.name);
            let mut entry = json!({
                "name": eat_name,
                "description": tool.description,
                "spec_url": self.spec_url(&eat_name),
                "spec_hash": sha256_tag(spec.as_bytes()),
                "x-mcp-tool": self.mcp_tool(tool),
            });
            if let Some(v) = version {
                entry["version"] = json!(v);
            }
            if jcs_string(&entry).is_err() {
                tracing::warn!(
                    "eat_tool_skipped: tool {}: examples not canonical",
                    tool.name
                );
                continue;
            }
            entries.push(entry);
        }
        let mut metadata = Map::new();
        if let Some(t) = &self.title {
            metadata.insert("title".into(), json!(t));
        }
        if let Some(d) = &self.description {
            metadata.insert("description".into(), json!(d));
        }
        metadata.insert(
            "generator".into(),
            json!(concat!("carapace/", env!("CARGO_PKG_VERSION"))),
        );
        metadata.insert("publisher".into(), json!(self.did));
        let doc = json!({"version": "1.0", "metadata": metadata, "tools": entries});
        jcs_string(&doc).expect("every part was written canonically")
    }

    /// The did:web document naming each public key (`JsonWebKey2020`), for assertions.
    pub fn did_document(&self, jwks: &Value) -> Value {
        let methods: Vec<Value> = jwks["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|k| {
                json!({
                    "id": format!("{}#{}", self.did, k["kid"].as_str().unwrap_or_default()),
                    "type": "JsonWebKey2020",
                    "controller": self.did,
                    "publicKeyJwk": k,
                })
            })
            .collect();
        let ids: Vec<Value> = methods.iter().map(|m| m["id"].clone()).collect();
        json!({
            "@context": ["https://www.w3.org/ns/did/v1", "https://w3id.org/security/suites/jws-2020/v1"],
            "id": self.did,
            "verificationMethod": methods,
            "assertionMethod": ids,
        })
    }
}

/// `sha256:` and the lowercase hex SHA-256 of `bytes`.
pub fn sha256_tag(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// `MAJOR.MINOR.PATCH` of ASCII digits, as the catalog schema's `version` pattern asks.
pub fn is_semver(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}
