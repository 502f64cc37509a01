//! JSON-Schema validation of tool input and output, with validators compiled once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use serde_json::Value;
use tower::{Layer, Service};

use crate::call::{CallOutcome, ToolCall, ToolSpec};
use crate::{Rejection, SchemaViolation};

/// Most violations reported back to a caller for one instance.
const MAX_VIOLATIONS: usize = 16;

/// A JSON Schema compiled once (at discovery), validated many times; clones share it.
#[derive(Clone)]
pub struct CompiledSchema {
    validator: Arc<jsonschema::Validator>,
    source: Arc<Value>,
}

impl std::fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledSchema")
            .field("source", &self.source)
            .finish()
    }
}

/// A schema that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("invalid JSON Schema: {0}")]
pub struct SchemaError(pub String);

impl CompiledSchema {
    /// Compile `schema`. References are resolved only inside the document: no network, no
    /// file system.
    pub fn compile(schema: Value) -> Result<Self, SchemaError> {
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(&schema)
            .map_err(|e| SchemaError(e.to_string()))?;
        Ok(CompiledSchema {
            validator: Arc::new(validator),
            source: Arc::new(schema),
        })
    }

    /// The schema as given.
    pub fn source(&self) -> &Arc<Value> {
        &self.source
    }

    /// Validate, returning at most a few violations; messages quote the offending values
    /// (fine for a caller's own input).
    pub fn validate(&self, instance: &Value) -> Result<(), Vec<SchemaViolation>> {
        self.check(instance, |e| SchemaViolation {
            path: e.instance_path().to_string(),
            message: e.to_string(),
        })
    }

    /// Validate, naming only the rule each violation breaks and where in the schema: nothing
    /// of the instance appears, not a value and not a key (an instance path can be made of
    /// the instance's own keys, so it is left empty). Used for app output, which must not
    /// reach the caller in any form when it breaks the schema.
    pub fn validate_redacted(&self, instance: &Value) -> Result<(), Vec<SchemaViolation>> {
        self.check(instance, |e| SchemaViolation {
            path: String::new(),
            message: format!(
                "breaks `{}` at schema {}",
                e.kind().keyword(),
                e.schema_path()
            ),
        })
    }

    fn check(
        &self,
        instance: &Value,
        violation: impl Fn(&jsonschema::ValidationError<'_>) -> SchemaViolation,
    ) -> Result<(), Vec<SchemaViolation>> {
        if self.validator.is_valid(instance) {
            return Ok(());
        }
        // jsonschema gathers every violation before the first is taken: bounded work only
        // for a small instance; a larger one reports its first.
        let mut budget = ALL_VIOLATIONS_MAX_NODES;
        let violations = if has_at_most_nodes(instance, &mut budget) {
            let all = self.validator.iter_errors(instance);
            all.take(MAX_VIOLATIONS).map(|e| violation(&e)).collect()
        } else {
            let first = self.validator.validate(instance).err();
            first.iter().map(violation).collect()
        };
        Err(violations)
    }
}

/// Instances of more values than this report only their first violation. The number of
/// violations grows with the instance (one per item of a long array of the wrong type), and
/// jsonschema builds them all, each with its path, before any is taken.
const ALL_VIOLATIONS_MAX_NODES: usize = 1024;

/// Whether `v` holds at most `budget` values (itself included), counting down `budget`;
/// stops as soon as it is spent.
fn has_at_most_nodes(v: &Value, budget: &mut usize) -> bool {
    if *budget == 0 {
        return false;
    }
    *budget -= 1;
    match v {
        Value::Array(items) => items.iter().all(|i| has_at_most_nodes(i, budget)),
        Value::Object(members) => members.values().all(|m| has_at_most_nodes(m, budget)),
        _ => true,
    }
}

/// Validates a call's `args` against its tool's input schema before the call goes on.
#[derive(Debug, Clone, Copy, Default)]
pub struct InputSchemaLayer;

impl<S> Layer<S> for InputSchemaLayer {
    type Service = InputSchema<S>;
    fn layer(&self, inner: S) -> Self::Service {
        InputSchema { inner }
    }
}

/// Service of [`InputSchemaLayer`].
#[derive(Debug, Clone)]
pub struct InputSchema<S> {
    inner: S,
}

impl<S> Service<ToolCall> for InputSchema<S>
where
    S: Service<ToolCall, Error = Rejection>,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = crate::future::ReadyOr<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let checked =
            tracing::debug_span!("input_schema").in_scope(|| call.tool.input.validate(&call.args));
        match checked {
            Ok(()) => crate::future::ReadyOr::inner(self.inner.call(call)),
            Err(v) => crate::future::ReadyOr::reject(Rejection::InputSchema(v)),
        }
    }
}

/// Checks the app's output against the tool's output schema; a breaking output never reaches
/// the caller.
#[derive(Debug, Clone, Copy, Default)]
pub struct OutputSchemaLayer;

impl<S> Layer<S> for OutputSchemaLayer {
    type Service = OutputSchema<S>;
    fn layer(&self, inner: S) -> Self::Service {
        OutputSchema { inner }
    }
}

/// Service of [`OutputSchemaLayer`].
#[derive(Debug, Clone)]
pub struct OutputSchema<S> {
    inner: S,
}

impl<S> Service<ToolCall> for OutputSchema<S>
where
    S: Service<ToolCall, Response = CallOutcome, Error = Rejection>,
{
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = OutputSchemaFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        // The tool, not a copy of its schema: one reference count taken instead of two.
        let tool = call.tool.output.is_some().then(|| Arc::clone(&call.tool));
        OutputSchemaFuture {
            inner: self.inner.call(call),
            tool,
        }
    }
}

pin_project! {
    /// Response future of [`OutputSchema`]: the app's outcome, once its output passed the
    /// tool's output schema.
    pub struct OutputSchemaFuture<F> {
        #[pin]
        inner: F,
        // The called tool, when it has an output schema.
        tool: Option<Arc<ToolSpec>>,
    }
}

impl<F> Future for OutputSchemaFuture<F>
where
    F: Future<Output = Result<CallOutcome, Rejection>>,
{
    type Output = Result<CallOutcome, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let outcome = ready!(this.inner.poll(cx))?;
        let schema = this.tool.as_ref().and_then(|tool| tool.output.as_ref());
        if let (CallOutcome::Ok { output, .. }, Some(schema)) = (&outcome, schema) {
            tracing::debug_span!("output_schema")
                .in_scope(|| schema.validate_redacted(output))
                .map_err(Rejection::OutputSchema)?;
        }
        Poll::Ready(Ok(outcome))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reports_path_of_each_violation() {
        let s = CompiledSchema::compile(json!({
            "type": "object",
            "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["text"],
            "additionalProperties": false
        }))
        .unwrap();
        assert!(s.validate(&json!({"text": "x"})).is_ok());
        let v = s.validate(&json!({"n": "one", "extra": 1})).unwrap_err();
        let paths: Vec<_> = v.iter().map(|v| v.path.as_str()).collect();
        assert!(paths.contains(&"/n"), "{v:?}");
        assert!(paths.contains(&""), "{v:?}");
    }

    #[test]
    fn redacted_violations_quote_no_value() {
        let s = CompiledSchema::compile(json!({
            "type": "object",
            "properties": {"result": {"type": "string"}},
            "additionalProperties": false
        }))
        .unwrap();
        let v = s
            .validate_redacted(&json!({"result": {"api_key": "sk-live-5ecret"}, "zz_key": 1}))
            .unwrap_err();
        let all = format!("{v:?}");
        assert!(!all.contains("5ecret") && !all.contains("zz_key"), "{all}");
        assert!(all.contains("breaks `type`"), "{all}");
    }

    /// A key of the output is not named in the path either: a schema that checks every
    /// member's value would otherwise put the app's own keys (here a user's address) there.
    #[test]
    fn redacted_violations_name_no_key_of_the_instance() {
        let s = CompiledSchema::compile(json!({
            "type": "object",
            "properties": {"users": {"additionalProperties": {"type": "integer"}}}
        }))
        .unwrap();
        let v = s
            .validate_redacted(&json!({"users": {"alice@corp.example": "x"}}))
            .unwrap_err();
        let all = format!("{v:?}");
        assert!(!all.contains("alice"), "{all}");
        assert_eq!(v.len(), 1, "{all}");
        assert_eq!(v[0].path, "");
        assert!(v[0].message.contains("breaks `type`"), "{all}");
        assert!(
            v[0].message
                .contains("/properties/users/additionalProperties"),
            "{all}"
        );
    }

    /// A small instance reports each violation (up to 16); a large one its first, so that a
    /// long array of wrong items is not answered by building a violation per item.
    #[test]
    fn a_large_instance_reports_its_first_violation_and_a_small_one_each() {
        let s = CompiledSchema::compile(json!({
            "type": "object",
            "properties": {"tags": {"items": {"type": "string"}}}
        }))
        .unwrap();
        let small = s.validate(&json!({"tags": [1, 2, 3]})).unwrap_err();
        assert_eq!(small.len(), 3, "{small:?}");
        assert_eq!(small[2].path, "/tags/2");
        let many = s.validate(&json!({"tags": vec![1; 100]})).unwrap_err();
        assert_eq!(many.len(), MAX_VIOLATIONS);
        let large = json!({"tags": vec![1; 200_000]});
        let first = s.validate(&large).unwrap_err();
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(first[0].path, "/tags/0");
        assert_eq!(s.validate_redacted(&large).unwrap_err().len(), 1);
    }

    #[test]
    fn a_broken_schema_does_not_compile() {
        assert!(CompiledSchema::compile(json!({"type": 12})).is_err());
    }

    #[test]
    fn no_remote_references_are_fetched() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}/x.json", listener.local_addr().unwrap());
        let err = CompiledSchema::compile(json!({"$ref": url}));
        assert!(err.is_err());
        assert!(
            listener.accept().is_err(),
            "compiling a schema connected to the network"
        );
    }
}
