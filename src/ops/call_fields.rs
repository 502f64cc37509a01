//! What every log line of a call carries (its request id, method, path, tool and the trace id
//! its context names), kept either in a `tracing` span or beside the call.
//!
//! A span costs every call its creation, the formatting of its fields into text and a slot in
//! the span registry, whether a line is written or not, and almost none is. When the text log
//! format is the only consumer of calls' fields (no span is exported: see
//! [`keep_fields_beside_calls`]), a call keeps its fields in a [`CallFields`] instead, current
//! on the thread while the call runs, and [`TextFormat`](super::log_format::TextFormat) writes
//! them into a line only when there is one, in the same text the span would have given.
//! [`CallScope`] is either, and what the call's code uses: enter it, record into it, carry it
//! into a spawned task or a streamed body.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use carapace_filters::call::ToolSpec;
use http::{HeaderValue, Method, Uri};
use tracing::Span;

static BESIDE_CALLS: AtomicBool = AtomicBool::new(false);

/// From now on calls keep their fields beside them rather than in a span. Only for a
/// subscriber whose text layer formats events with
/// [`TextFormat`](super::log_format::TextFormat), that exports no span and filters by one level
/// for every target: the call fields are made only when `info` is enabled, as the call's
/// `info` span would be.
pub fn keep_fields_beside_calls() {
    BESIDE_CALLS.store(true, Ordering::Relaxed);
}

/// Whether calls keep their fields beside them ([`keep_fields_beside_calls`]).
pub fn fields_beside_calls() -> bool {
    BESIDE_CALLS.load(Ordering::Relaxed)
}

/// A field a call records once it knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallField {
    /// The tool called.
    Tool,
    /// The `trace_id` the call's context names.
    ContextTraceId,
}

impl CallField {
    /// The field's name in a log line (and in the call's span).
    pub fn name(self) -> &'static str {
        match self {
            CallField::Tool => "tool",
            CallField::ContextTraceId => "context_trace_id",
        }
    }
}

/// A call's fields kept beside it: what its span would have held.
pub struct CallFields {
    request_id: HeaderValue,
    method: Method,
    uri: Uri,
    recorded: Mutex<Recorded>,
}

/// The fields a call recorded, in the order it recorded them, every value kept (as a span's
/// text grows): the first two in place (a call records its tool and perhaps its context's
/// trace id), any more (the items of an MCP batch) after them.
#[derive(Debug, Default)]
struct Recorded {
    first: [Option<(CallField, Text)>; 2],
    more: Vec<(CallField, Text)>,
}

/// A recorded value: the called tool's name, held with its catalog entry (every call records
/// one: no copy), or a copy of any other.
#[derive(Debug)]
enum Text {
    ToolName(Arc<ToolSpec>),
    Copied(Box<str>),
}

impl std::ops::Deref for Text {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Text::ToolName(tool) => &tool.name,
            Text::Copied(text) => text,
        }
    }
}

impl Recorded {
    fn push(&mut self, field: CallField, value: Text) {
        let entry = Some((field, value));
        match self.first.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = entry,
            None => self.more.extend(entry),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &(CallField, Text)> {
        self.first.iter().flatten().chain(&self.more)
    }
}

/// As its log text: the target's path, never its query (which may carry a credential).
impl fmt::Debug for CallFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f)
    }
}

impl CallFields {
    /// The fields of a call with this request id, method and target.
    pub fn new(request_id: HeaderValue, method: Method, uri: Uri) -> Self {
        CallFields {
            request_id,
            method,
            uri,
            recorded: Mutex::default(),
        }
    }

    /// Record `field`: written after the fields recorded before it, as a span's record
    /// appends to its text (a second value of a field is written too).
    pub fn record(&self, field: CallField, value: &str) {
        self.recorded().push(field, Text::Copied(value.into()));
    }

    /// Record [`CallField::Tool`], the name of `tool`.
    pub fn record_tool(&self, tool: &Arc<ToolSpec>) {
        self.recorded()
            .push(CallField::Tool, Text::ToolName(Arc::clone(tool)));
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.recorded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The text the span would show: `call{request_id="…" method="…" path="…"}` with the
    /// fields recorded after, each as the text log format writes a string field.
    pub fn write(&self, w: &mut dyn fmt::Write) -> fmt::Result {
        let request_id = self.request_id.to_str().unwrap_or("");
        write!(
            w,
            "call{{request_id={request_id:?} method={:?} path={:?}",
            self.method.as_str(),
            self.uri.path()
        )?;
        for (field, value) in self.recorded().iter() {
            write!(w, " {}={:?}", field.name(), &**value)?;
        }
        w.write_char('}')
    }
}

thread_local! {
    /// The fields of the call running on this thread, if it keeps them beside it.
    static CURRENT: RefCell<Option<Arc<CallFields>>> = const { RefCell::new(None) };
}

/// The fields of the call running on this thread, when it keeps them beside it (none while
/// the thread's locals are being destroyed: a line logged then has no call).
pub fn current_fields() -> Option<Arc<CallFields>> {
    CURRENT.try_with(|c| c.borrow().clone()).ok().flatten()
}

/// Where a call's fields are: its span, beside it, or nowhere (logging below `info`).
#[derive(Debug, Clone)]
pub enum CallScope {
    Span(Span),
    Fields(Arc<CallFields>),
}

impl From<Span> for CallScope {
    fn from(span: Span) -> Self {
        CallScope::Span(span)
    }
}

impl CallScope {
    /// The scope of the call running now: its fields when it keeps them beside it, else the
    /// current span.
    pub fn current() -> Self {
        match current_fields() {
            Some(fields) => CallScope::Fields(fields),
            None => CallScope::Span(Span::current()),
        }
    }

    /// Run in this scope until the guard is dropped. The fields are moved onto the thread
    /// and back when the guard is dropped, so entering changes no reference count: a call's
    /// future enters its scope at every poll, and each atomic increment and decrement of a
    /// shared count is a locked instruction.
    pub fn enter(&mut self) -> Entered<'_> {
        if let CallScope::Span(span) = self {
            return Entered::Span(span.enter());
        }
        // Left in the fields' place while they are on the thread: a span that is no span.
        let CallScope::Fields(fields) = std::mem::replace(self, CallScope::Span(Span::none()))
        else {
            unreachable!("a span returned above")
        };
        let mut ours = Some(fields);
        match CURRENT.try_with(|c| std::mem::replace(&mut *c.borrow_mut(), ours.take())) {
            Ok(before) => Entered::Fields {
                scope: self,
                before,
            },
            // The thread's locals are being destroyed: nothing is current, the fields stay.
            Err(_) => {
                *self = CallScope::Fields(ours.take().expect("not moved"));
                Entered::Outside
            }
        }
    }

    /// `f` run in this scope.
    pub fn in_scope<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let _entered = self.enter();
        f()
    }

    /// `future`, polled in this scope (what `tracing::Instrument` does for a span).
    pub fn wrap<F>(self, future: F) -> InScope<F> {
        InScope {
            inner: Some(future),
            scope: self,
        }
    }

    /// Record `field` of the call: into its fields, or its span.
    pub fn record(&self, field: CallField, value: &str) {
        match self {
            CallScope::Span(span) => {
                span.record(field.name(), value);
            }
            CallScope::Fields(fields) => fields.record(field, value),
        }
    }

    /// Record [`CallField::Tool`], the name of `tool`.
    pub fn record_tool(&self, tool: &Arc<ToolSpec>) {
        match self {
            CallScope::Span(span) => {
                span.record(CallField::Tool.name(), tool.name.as_str());
            }
            CallScope::Fields(fields) => fields.record_tool(tool),
        }
    }
}

/// Record `field` of the call running now.
pub fn record(field: CallField, value: &str) {
    if !on_current(|fields| fields.record(field, value)) {
        CallScope::Span(Span::current()).record(field, value);
    }
}

/// Record [`CallField::Tool`] of the call running now: the name of `tool`.
pub fn record_tool(tool: &Arc<ToolSpec>) {
    if !on_current(|fields| fields.record_tool(tool)) {
        CallScope::Span(Span::current()).record_tool(tool);
    }
}

/// `f` run on the fields of the call running on this thread, borrowed where they are (a
/// clone of their `Arc` would be an atomic increment and decrement per record); false when
/// the call keeps none beside it.
fn on_current(f: impl FnOnce(&CallFields)) -> bool {
    CURRENT
        .try_with(|c| c.borrow().as_deref().map(f).is_some())
        .unwrap_or(false)
}

/// Guard of [`CallScope::enter`]: leaves the scope when dropped.
#[must_use = "the scope is left when the guard is dropped"]
pub enum Entered<'a> {
    Span(tracing::span::Entered<'a>),
    /// The fields are on the thread; `before` was current before them (put back on drop, and
    /// the fields back into `scope`).
    Fields {
        scope: &'a mut CallScope,
        before: Option<Arc<CallFields>>,
    },
    /// Entered while the thread's locals were being destroyed: nothing to put back.
    Outside,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Entered::Fields { scope, before } = self {
            let before = before.take();
            if let Ok(Some(ours)) =
                CURRENT.try_with(|c| std::mem::replace(&mut *c.borrow_mut(), before))
            {
                **scope = CallScope::Fields(ours);
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A future polled, and dropped, in a [`CallScope`] ([`CallScope::wrap`]).
    pub struct InScope<F> {
        // `None` only while it is dropped.
        #[pin]
        inner: Option<F>,
        scope: CallScope,
    }

    impl<F> PinnedDrop for InScope<F> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            let _entered = this.scope.enter();
            this.inner.set(None);
        }
    }
}

impl<F: Future> Future for InScope<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _entered = this.scope.enter();
        let inner = this.inner.as_pin_mut().expect("only dropped without it");
        inner.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_the_path_and_never_the_query() {
        let fields = CallFields::new(
            HeaderValue::from_static("r-1"),
            Method::POST,
            Uri::from_static("/v1/tools/call?access_token=s3cr3t"),
        );
        fields.record(CallField::Tool, "memory.query");
        let shown = format!("{fields:?}");
        assert_eq!(
            shown,
            r#"call{request_id="r-1" method="POST" path="/v1/tools/call" tool="memory.query"}"#
        );
        assert!(!shown.contains("s3cr3t"));
    }

    fn fields() -> Arc<CallFields> {
        Arc::new(CallFields::new(
            HeaderValue::from_static("0af7651916cd43dd"),
            Method::POST,
            Uri::from_static("/v1/tools/call?x=1"),
        ))
    }

    fn text(fields: &CallFields) -> String {
        let mut out = String::new();
        fields.write(&mut out).unwrap();
        out
    }

    #[test]
    fn fields_are_current_only_while_entered_and_nest() {
        assert!(current_fields().is_none());
        let mut outer = CallScope::Fields(fields());
        let mut inner = CallScope::Fields(Arc::new(CallFields::new(
            HeaderValue::from_static("inner"),
            Method::GET,
            Uri::from_static("/"),
        )));
        outer.in_scope(|| {
            assert!(text(&current_fields().unwrap()).contains("0af7651916cd43dd"));
            inner.in_scope(|| {
                assert!(text(&current_fields().unwrap()).contains(r#"request_id="inner""#));
            });
            assert!(text(&current_fields().unwrap()).contains("0af7651916cd43dd"));
        });
        assert!(current_fields().is_none());
    }

    #[test]
    fn entering_moves_the_fields_onto_the_thread_and_back_without_a_copy() {
        let fields = fields();
        let weak = Arc::downgrade(&fields);
        let mut scope = CallScope::Fields(fields);
        for _ in 0..2 {
            let entered = scope.enter();
            // The thread holds the one reference there is: moved, not cloned.
            assert_eq!(weak.strong_count(), 1);
            let current = current_fields().unwrap();
            assert!(std::ptr::eq(&*current, weak.as_ptr()));
            drop(current);
            drop(entered);
            assert!(current_fields().is_none());
            match &scope {
                CallScope::Fields(back) => assert!(std::ptr::eq(&**back, weak.as_ptr())),
                CallScope::Span(_) => panic!("the fields were not given back"),
            }
            assert_eq!(weak.strong_count(), 1);
        }
    }

    #[test]
    fn recorded_fields_follow_in_the_order_recorded_every_value_kept() {
        let f = fields();
        assert_eq!(
            text(&f),
            r#"call{request_id="0af7651916cd43dd" method="POST" path="/v1/tools/call"}"#
        );
        CallScope::Fields(f.clone()).in_scope(|| {
            record(CallField::ContextTraceId, "trace-1");
            record(CallField::Tool, "memory.query");
            record(CallField::Tool, "another");
        });
        assert_eq!(
            text(&f),
            r#"call{request_id="0af7651916cd43dd" method="POST" path="/v1/tools/call" context_trace_id="trace-1" tool="memory.query" tool="another"}"#
        );
    }

    #[test]
    fn a_tool_is_recorded_by_its_name_as_a_copied_value_is() {
        let tool = crate::front::tool_call(None).tool;
        let (by_tool, copied) = (fields(), fields());
        CallScope::Fields(by_tool.clone()).in_scope(|| record_tool(&tool));
        copied.record(CallField::Tool, &tool.name);
        assert!(text(&by_tool).ends_with(&format!(" tool={:?}}}", tool.name)));
        assert_eq!(text(&by_tool), text(&copied));
    }

    #[test]
    fn a_value_that_needs_escapes_is_written_as_debug_writes_it() {
        let f = fields();
        f.record(CallField::Tool, "a \"quoted\"\nname");
        assert!(
            text(&f).ends_with(r#" tool="a \"quoted\"\nname"}"#),
            "{}",
            text(&f)
        );
    }

    #[test]
    fn a_wrapped_future_is_dropped_in_the_scope() {
        /// Never ready; notes the call fields current when it is dropped.
        struct NotesOnDrop(Arc<Mutex<Option<Option<Arc<CallFields>>>>>);
        impl Drop for NotesOnDrop {
            fn drop(&mut self) {
                *self.0.lock().unwrap() = Some(current_fields());
            }
        }
        impl Future for NotesOnDrop {
            type Output = ();
            fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
                Poll::Pending
            }
        }
        let f = fields();
        let noted = Arc::new(Mutex::new(None));
        let wrapped = CallScope::Fields(f.clone()).wrap(NotesOnDrop(noted.clone()));
        drop(wrapped);
        let at_drop = noted.lock().unwrap().take().expect("dropped");
        assert!(at_drop.is_some_and(|s| Arc::ptr_eq(&s, &f)));
        assert!(
            current_fields().is_none(),
            "the scope is left after the drop"
        );
    }

    #[tokio::test]
    async fn a_wrapped_future_runs_in_the_scope_at_every_poll() {
        let f = fields();
        let seen = CallScope::Fields(f.clone())
            .wrap(async {
                let first = current_fields().map(|c| Arc::as_ptr(&c));
                tokio::task::yield_now().await;
                (first, current_fields().map(|c| Arc::as_ptr(&c)))
            })
            .await;
        assert_eq!(seen, (Some(Arc::as_ptr(&f)), Some(Arc::as_ptr(&f))));
        assert!(current_fields().is_none());
    }

    #[test]
    fn without_fields_the_current_span_is_the_scope() {
        assert!(matches!(CallScope::current(), CallScope::Span(_)));
    }
}
