//! The secret guard: credentials do not cross the shell. On the tool-host side it looks at
//! every result leaving for the caller (the output, an MCP server's content blocks and `_meta`,
//! an error's message and details); on the gateway side at every call's arguments leaving for
//! a peer or skill. A credential found ([`detectors`]) is, per tool, redacted in place
//! (`[REDACTED:<detector>]`) or the call refused (`FORBIDDEN`); in `warn` mode it is only
//! reported. The log line names the detector and the JSON path, never the value.
//!
//! ```
//! use std::sync::Arc;
//! use carapace_filters::secret_guard::{
//!     Detectors, GuardAction, GuardMode, Scanned, SecretGuard, SecretGuardLayer,
//! };
//! use tower::Layer;
//!
//! let guard = SecretGuard::new(
//!     Detectors::new(&[], vec![]).unwrap(),
//!     GuardMode::Enforce,
//!     GuardAction::Redact,
//!     Default::default(),
//!     "inbound",
//! );
//! let layer = SecretGuardLayer::new(Arc::new(guard), Scanned::Results);
//! let _service = layer.layer(tower::service_fn(|_call: carapace_filters::call::ToolCall| async {
//!     Ok::<_, carapace_filters::Rejection>(carapace_filters::call::CallOutcome::Ok {
//!         output: serde_json::json!({}),
//!         meta: None,
//!         content: None,
//!     })
//! }));
//! ```

pub mod detectors;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use serde_json::Value;
use tower::{Layer, Service};

use crate::call::{CallOutcome, ToolCall, ToolSpec};
use crate::Rejection;
pub use detectors::{Detectors, Found, PatternError};

/// Most findings logged for one call.
const MAX_LOGGED: usize = 16;

/// Whether the guard acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardMode {
    Off,
    /// Report, change nothing.
    Warn,
    /// Redact or refuse, as the tool's action says.
    Enforce,
}

/// What a credential found does in `enforce` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardAction {
    /// Replace it with `[REDACTED:<detector>]` and let the call go on.
    Redact,
    /// Refuse the call (`FORBIDDEN`); nothing of it goes on.
    Refuse,
}

/// Which side of a call is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scanned {
    /// The arguments, before the call goes on (the gateway side).
    Arguments,
    /// The outcome, before it goes back to the caller (the tool-host side).
    Results,
}

/// The detectors and what to do with what they find.
#[derive(Debug)]
pub struct SecretGuard {
    detectors: Detectors,
    mode: GuardMode,
    action: GuardAction,
    tools: HashMap<String, GuardAction>,
    /// `inbound` or `outbound`, for the log.
    role: &'static str,
}

/// Most passes of [`SecretGuard::scan`] over one string before it is replaced whole.
pub const MAX_REDACTION_PASSES: usize = 4;

/// A credential found at a JSON path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub detector: String,
    pub path: String,
}

impl SecretGuard {
    pub fn new(
        detectors: Detectors,
        mode: GuardMode,
        action: GuardAction,
        tools: HashMap<String, GuardAction>,
        role: &'static str,
    ) -> Self {
        SecretGuard {
            detectors,
            mode,
            action,
            tools,
            role,
        }
    }

    pub fn mode(&self) -> GuardMode {
        self.mode
    }

    /// Look through `value` (found at `at`): every finding, with the strings redacted when
    /// `redact`.
    pub fn scan(&self, value: &mut Value, at: &str, redact: bool) -> Vec<Finding> {
        let mut findings = Vec::new();
        self.walk(value, &Pointer::Root(at), redact, &mut findings);
        findings
    }

    /// `s` with `found` redacted, and again while the redacted text holds a credential: taking
    /// text out can complete one beside it (a word boundary appears where the credential
    /// was). After [`MAX_REDACTION_PASSES`] the whole string goes.
    fn redact_fully(&self, s: &str, found: &[Found], path: &str, out: &mut Vec<Finding>) -> String {
        let mut text = redacted(s, found);
        for _ in 0..MAX_REDACTION_PASSES {
            let again = self.detectors.find(&text);
            if again.is_empty() {
                return text;
            }
            out.extend(again.iter().map(|f| Finding {
                detector: f.detector.clone(),
                path: path.to_owned(),
            }));
            text = redacted(&text, &again);
        }
        if self.detectors.find(&text).is_empty() {
            text
        } else {
            "[REDACTED]".to_owned()
        }
    }

    /// `at` is where `v` is, written out only for a finding: walking a value with nothing in
    /// it allocates nothing.
    fn walk(&self, v: &mut Value, at: &Pointer<'_>, redact: bool, out: &mut Vec<Finding>) {
        match v {
            Value::String(s) => {
                let found = self.detectors.find(s);
                if found.is_empty() {
                    return;
                }
                let path = at.to_string();
                out.extend(found.iter().map(|f| Finding {
                    detector: f.detector.clone(),
                    path: path.clone(),
                }));
                if redact {
                    *s = self.redact_fully(s, &found, &path, out);
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    self.walk(item, &Pointer::Item(at, i), redact, out);
                }
            }
            Value::Object(m) => {
                for (k, item) in m.iter_mut() {
                    self.walk(item, &Pointer::Member(at, k), redact, out);
                }
            }
            _ => {}
        }
    }

    /// Apply the guard to `parts` of what `tool` (or another named thing, such as
    /// `resources/read`) answered or was given: `Ok` when it may go on (redacted in place in
    /// `enforce`/`redact`), the refusal otherwise.
    pub fn check<'v>(
        &self,
        tool: &str,
        parts: impl IntoIterator<Item = (&'v str, &'v mut Value)>,
    ) -> Result<(), Rejection> {
        if self.mode == GuardMode::Off {
            return Ok(());
        }
        let action = self.tools.get(tool).copied().unwrap_or(self.action);
        let redact = self.mode == GuardMode::Enforce && action == GuardAction::Redact;
        let mut findings = Vec::new();
        for (at, value) in parts {
            findings.extend(self.scan(value, at, redact));
        }
        if findings.is_empty() {
            return Ok(());
        }
        let done = match (self.mode, action) {
            (GuardMode::Enforce, GuardAction::Refuse) => "refused",
            (GuardMode::Enforce, GuardAction::Redact) => "redacted",
            _ => "reported (warn)",
        };
        for f in findings.iter().take(MAX_LOGGED) {
            tracing::warn!(
                tool,
                "secret_detected role={} tool={tool} detector={} path={} action={done}",
                self.role,
                f.detector,
                f.path
            );
        }
        if done == "refused" {
            let f = &findings[0];
            return Err(Rejection::Forbidden(format!(
                "a credential ({}) at {} may not cross carapace",
                f.detector, f.path
            )));
        }
        Ok(())
    }

    /// The guard over a call's outcome.
    pub fn guard_outcome(&self, tool: &str, outcome: &mut CallOutcome) -> Result<(), Rejection> {
        let mut message_value;
        // At most five parts (an error's details, content blocks, their `_meta`, its
        // `input_required` and message), kept on the stack.
        let mut parts: [Option<(&str, &mut Value)>; 5] = Default::default();
        let message = match outcome {
            CallOutcome::Ok {
                output,
                meta,
                content,
            } => {
                parts[0] = Some(("/output", output));
                parts[1] = meta.as_mut().map(|m| ("/meta", m));
                if let Some(c) = content {
                    parts[2] = Some(("/content", &mut c.blocks));
                    parts[3] = c.meta.as_mut().map(|m| ("/_meta", m));
                }
                None
            }
            CallOutcome::AppError {
                message,
                details,
                content,
                ..
            } => {
                parts[0] = details.as_mut().map(|d| ("/details", d));
                if let Some(c) = content {
                    parts[1] = Some(("/content", &mut c.blocks));
                    parts[2] = c.meta.as_mut().map(|m| ("/_meta", m));
                    parts[3] = c.input_required.as_mut().map(|q| ("/input_required", q));
                }
                Some(message)
            }
        };
        match message {
            Some(message) => {
                message_value = Value::String(std::mem::take(message));
                parts[4] = Some(("/message", &mut message_value));
                let result = self.check(tool, parts.into_iter().flatten());
                if let Value::String(s) = message_value {
                    *message = s;
                }
                result
            }
            None => self.check(tool, parts.into_iter().flatten()),
        }
    }
}

/// Where a value is in what is scanned, as a JSON pointer (RFC 6901) from the part's own
/// name (`/output`, `/args`): kept as links to the enclosing values on the walk's stack, and
/// made into text only for a finding.
enum Pointer<'a> {
    Root(&'a str),
    Member(&'a Pointer<'a>, &'a str),
    Item(&'a Pointer<'a>, usize),
}

impl std::fmt::Display for Pointer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pointer::Root(at) => f.write_str(at),
            Pointer::Member(parent, key) => {
                write!(f, "{parent}/")?;
                let mut rest = *key;
                while let Some(i) = rest.find(['~', '/']) {
                    f.write_str(&rest[..i])?;
                    f.write_str(if rest.as_bytes()[i] == b'~' {
                        "~0"
                    } else {
                        "~1"
                    })?;
                    rest = &rest[i + 1..];
                }
                f.write_str(rest)
            }
            Pointer::Item(parent, i) => write!(f, "{parent}/{i}"),
        }
    }
}

/// `s` with each finding replaced by `[REDACTED:<detector>]`.
fn redacted(s: &str, found: &[Found]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut at = 0;
    for f in found {
        out.push_str(&s[at..f.start]);
        out.push_str("[REDACTED:");
        out.push_str(&f.detector);
        out.push(']');
        at = f.end;
    }
    out.push_str(&s[at..]);
    out
}

/// Applies a [`SecretGuard`] to the arguments or the results of every call.
#[derive(Debug, Clone)]
pub struct SecretGuardLayer {
    guard: Arc<SecretGuard>,
    scanned: Scanned,
}

impl SecretGuardLayer {
    pub fn new(guard: Arc<SecretGuard>, scanned: Scanned) -> Self {
        SecretGuardLayer { guard, scanned }
    }
}

impl<S> Layer<S> for SecretGuardLayer {
    type Service = SecretGuardService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        SecretGuardService {
            inner,
            guard: self.guard.clone(),
            scanned: self.scanned,
        }
    }
}

/// Service of [`SecretGuardLayer`].
#[derive(Debug, Clone)]
pub struct SecretGuardService<S> {
    inner: S,
    guard: Arc<SecretGuard>,
    scanned: Scanned,
}

impl<S> Service<ToolCall> for SecretGuardService<S>
where
    S: Service<ToolCall, Response = CallOutcome, Error = Rejection>,
{
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = SecretGuardFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: ToolCall) -> Self::Future {
        if self.scanned == Scanned::Arguments {
            let guard = &self.guard;
            if let Err(r) = guard.check(&call.tool.name, [("/args", &mut call.args)]) {
                return SecretGuardFuture::Refused { rejection: Some(r) };
            }
            return SecretGuardFuture::Passed {
                inner: self.inner.call(call),
            };
        }
        let tool = call.tool.clone();
        SecretGuardFuture::Guarded {
            inner: self.inner.call(call),
            guard: self.guard.clone(),
            tool,
        }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`SecretGuardService`]: the arguments' refusal, the call passed on
    /// (its arguments checked), or the call with its result to check.
    #[project = SecretGuardProj]
    pub enum SecretGuardFuture<F> {
        Refused { rejection: Option<Rejection> },
        Passed { #[pin] inner: F },
        Guarded {
            #[pin]
            inner: F,
            guard: Arc<SecretGuard>,
            tool: Arc<ToolSpec>,
        },
    }
}

impl<F> Future for SecretGuardFuture<F>
where
    F: Future<Output = Result<CallOutcome, Rejection>>,
{
    type Output = Result<CallOutcome, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            SecretGuardProj::Refused { rejection } => {
                Poll::Ready(Err(rejection.take().expect("polled after completion")))
            }
            SecretGuardProj::Passed { inner } => inner.poll(cx),
            SecretGuardProj::Guarded { inner, guard, tool } => {
                let mut outcome = ready!(inner.poll(cx))?;
                guard.guard_outcome(&tool.name, &mut outcome)?;
                Poll::Ready(Ok(outcome))
            }
        }
    }
}

#[cfg(test)]
mod tests;
