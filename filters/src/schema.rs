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
        self.check(instance, |e| e.to_string())
    }

    /// Validate, naming only the rule each violation breaks: no value (or unexpected key) of
    /// the instance appears in the messages. Used for app output, which must not reach the
    /// caller in any form when it breaks the schema.
    pub fn validate_redacted(&self, instance: &Value) -> Result<(), Vec<SchemaViolation>> {
        self.check(instance, |e| format!("breaks `{}`", e.kind().keyword()))
    }

    fn check(
        &self,
        instance: &Value,
        message: impl Fn(&jsonschema::ValidationError<'_>) -> String,
    ) -> Result<(), Vec<SchemaViolation>> {
        if self.validator.is_valid(instance) {
            return Ok(());
        }
        let violations: Vec<_> = self
            .validator
            .iter_errors(instance)
            .take(MAX_VIOLATIONS)
            .map(|e| SchemaViolation {
                path: e.instance_path().to_string(),
                message: message(&e),
            })
            .collect();
        Err(violations)
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
