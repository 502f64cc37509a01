//! The one operation a discovery client takes from a tool's OpenAPI document: its
//! `operationId` (the tool's own name), its JSON request body schema (the input) and its 200
//! JSON response schema (the output). A document with no such operation, or with several, is
//! refused: which one the catalog's tool means would be a guess.

use serde_json::Value;

/// The operation of a tool's OpenAPI document.
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    pub operation_id: String,
    pub input: Value,
    /// `None` when the document declares no schema, or an empty one.
    pub output: Option<Value>,
}

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// The single operation of `doc`, an OpenAPI 3.0 or 3.1 document.
pub fn operation(doc: &Value) -> Result<Operation, String> {
    let version = doc
        .get("openapi")
        .and_then(Value::as_str)
        .ok_or("no `openapi` version")?;
    if !(version.starts_with("3.0.") || version.starts_with("3.1.")) {
        return Err(format!("OpenAPI {version} is not 3.0 or 3.1"));
    }
    let paths = doc
        .get("paths")
        .and_then(Value::as_object)
        .ok_or("no `paths` object")?;
    let mut ops = paths
        .values()
        .filter_map(Value::as_object)
        .flat_map(|item| {
            METHODS
                .iter()
                .filter_map(move |m| item.get(*m))
                .filter(|op| op.get("x-mcp-tool").is_some() || op.get("operationId").is_some())
        });
    let op = ops.next().ok_or("no operation")?;
    if ops.next().is_some() {
        return Err("more than one operation: which is the tool is not said".into());
    }
    let operation_id = op
        .get("operationId")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or("the operation has no operationId")?
        .to_owned();
    let input = op
        .pointer("/requestBody/content/application~1json/schema")
        .cloned()
        .unwrap_or_else(|| serde_json::json!({"type": "object"}));
    if !input.is_object() {
        return Err("the request body schema is not an object".into());
    }
    if input.get("$ref").is_some() || contains_ref(&input) {
        return Err("schemas with $ref into the document are not followed".into());
    }
    let output = op
        .pointer("/responses/200/content/application~1json/schema")
        .filter(|s| s.as_object().is_some_and(|o| !o.is_empty()))
        .cloned();
    if output.as_ref().is_some_and(contains_ref) {
        return Err("schemas with $ref into the document are not followed".into());
    }
    Ok(Operation {
        operation_id,
        input,
        output,
    })
}

/// Whether `v` has a `$ref` to a place in the OpenAPI document (`#/components/...`), which
/// would not resolve once the schema stands alone.
fn contains_ref(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, v)| {
            (k == "$ref" && v.as_str().is_some_and(|r| r.starts_with("#/components")))
                || contains_ref(v)
        }),
        Value::Array(a) => a.iter().any(contains_ref),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_operation_gives_the_name_and_the_schemas() {
        let doc = json!({"openapi": "3.1.0", "paths": {"/tools/x": {"post": {
            "operationId": "memory.query",
            "requestBody": {"content": {"application/json": {"schema": {"type": "object",
                "required": ["q"]}}}},
            "responses": {"200": {"content": {"application/json": {"schema": {"type": "object"}}}}},
        }}}});
        let op = operation(&doc).unwrap();
        assert_eq!(op.operation_id, "memory.query");
        assert_eq!(op.input["required"], json!(["q"]));
        assert_eq!(op.output, Some(json!({"type": "object"})));
    }

    #[test]
    fn documents_that_do_not_say_one_tool_are_refused() {
        for doc in [
            json!({"paths": {}}),
            json!({"openapi": "2.0", "paths": {}}),
            json!({"openapi": "3.1.0", "paths": {}}),
            json!({"openapi": "3.1.0", "paths": {"/a": {"post": {"summary": "x"}}}}),
            json!({"openapi": "3.1.0", "paths": {"/a": {"post": {"operationId": "a"},
                                                        "get": {"operationId": "b"}}}}),
            json!({"openapi": "3.1.0", "paths": {"/a": {"post": {"operationId": ""}}}}),
            json!({"openapi": "3.1.0", "paths": {"/a": {"post": {"operationId": "a",
                "requestBody": {"content": {"application/json": {"schema": {
                    "$ref": "#/components/schemas/A"}}}}}}}}),
            json!({"openapi": "3.1.0", "paths": {"/a": {"post": {"operationId": "a",
                "requestBody": {"content": {"application/json": {"schema": true}}}}}}}),
        ] {
            assert!(operation(&doc).is_err(), "{doc}");
        }
    }
}
