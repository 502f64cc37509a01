//! The text log format: its fields ([`TextFields`], the text of `tracing_subscriber`'s
//! `DefaultFields`, with plain string values written straight into the line instead of through
//! `Debug` and the formatting machinery; a call's span, when it has one, formats its fields
//! when it is created, logged or not) and its lines ([`TextFormat`], which writes the fields of
//! a call that keeps them beside it).

use std::fmt;

use carapace_filters::canonical::first_escape;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Format, Full, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Formats fields as `DefaultFields` does (without ANSI colours), faster for plain strings.
///
/// ```
/// use carapace::ops::log_format::TextFields;
///
/// let layer = tracing_subscriber::fmt::layer::<tracing_subscriber::Registry>()
///     .with_ansi(false)
///     .fmt_fields(TextFields);
/// # drop(layer);
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct TextFields;

impl<'writer> FormatFields<'writer> for TextFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = TextVisitor {
            writer,
            is_empty: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct TextVisitor<'a> {
    writer: Writer<'a>,
    is_empty: bool,
    result: fmt::Result,
}

/// Whether `Debug` writes `s` as itself between quotes: printable ASCII without `"` or `\`.
fn plain(s: &str) -> bool {
    // Each test looks at a word at a time: ASCII, no `"`, `\\` or C0 control, no DEL.
    s.is_ascii() && first_escape(s.as_bytes()).is_none() && !s.as_bytes().contains(&0x7f)
}

impl TextVisitor<'_> {
    /// Anything but a plain string: exactly as `DefaultFields`.
    fn default_visitor(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        if self.result.is_err() {
            return;
        }
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut visitor);
        self.result = visitor.finish();
        self.is_empty = false;
    }
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        let name = field.name();
        if self.result.is_err() || name == "message" || name.starts_with("r#") || !plain(value) {
            return self.default_visitor(|v| v.record_str(field, value));
        }
        let pad = !std::mem::replace(&mut self.is_empty, false);
        let parts: [&str; 5] = [if pad { " " } else { "" }, name, "=\"", value, "\""];
        // ` name="value"` in one write when it fits a small buffer, as a call's span fields do:
        // each write into the span's text is a call through `dyn Write` and may grow it.
        let mut buf = [0u8; 192];
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.result = match buf.get_mut(..len) {
            Some(out) => {
                let mut at = 0;
                for p in parts {
                    out[at..at + p.len()].copy_from_slice(p.as_bytes());
                    at += p.len();
                }
                // Whole `str`s end to end: still UTF-8.
                self.writer
                    .write_str(std::str::from_utf8(out).expect("UTF-8 pieces"))
            }
            None => parts.iter().try_for_each(|p| self.writer.write_str(p)),
        };
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.default_visitor(|v| v.record_error(field, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.default_visitor(|v| v.record_debug(field, value));
    }
}

/// The text log line: `tracing_subscriber`'s full format, with the fields of a call that
/// keeps them beside it ([`CallFields`](super::call_fields::CallFields)) written where its
/// span would be, the same text. A line outside such a call is the full format's own.
///
/// ```
/// use carapace::ops::log_format::{TextFields, TextFormat};
///
/// let layer = tracing_subscriber::fmt::layer::<tracing_subscriber::Registry>()
///     .with_ansi(false)
///     .fmt_fields(TextFields)
///     .event_format(TextFormat::default());
/// # drop(layer);
/// ```
#[derive(Debug)]
pub struct TextFormat {
    full: Format<Full>,
    /// The full format from the spans on: what follows the time, the level and the call.
    after_call: Format<Full, ()>,
}

impl Default for TextFormat {
    fn default() -> Self {
        TextFormat {
            full: Format::default(),
            after_call: Format::default().without_time().with_level(false),
        }
    }
}

impl<S, N> FormatEvent<S, N> for TextFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some(call) = super::call_fields::current_fields() else {
            return self.full.format_event(ctx, writer, event);
        };
        // As the full format writes its time stamp and level.
        if SystemTime.format_time(&mut writer).is_err() {
            writer.write_str("<unknown time>")?;
        }
        writer.write_char(' ')?;
        writer.write_str(match *event.metadata().level() {
            Level::TRACE => "TRACE ",
            Level::DEBUG => "DEBUG ",
            Level::INFO => " INFO ",
            Level::WARN => " WARN ",
            Level::ERROR => "ERROR ",
        })?;
        call.write(&mut writer)?;
        writer.write_char(':')?;
        // Spans inside the call follow it; else a space, as after the full format's last span.
        if ctx
            .event_scope()
            .is_none_or(|mut spans| spans.next().is_none())
        {
            writer.write_char(' ')?;
        }
        self.after_call.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::call_fields::{CallField, CallFields, CallScope};
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::format::DefaultFields;
    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;
        fn make_writer(&'a self) -> Lines {
            self.clone()
        }
    }

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("outer failed")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// Logs the same spans and events through `fields`; the text written.
    fn logged<N>(fields: N) -> String
    where
        N: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let out = Lines::default();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .without_time()
            .with_writer(out.clone())
            .fmt_fields(fields);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                "call",
                request_id = "0af7651916cd43dd",
                method = %http::Method::POST,
                path = "/v1/tools/call",
                tool = tracing::field::Empty,
                r#type = "raw",
            );
            let _in = span.enter();
            span.record("tool", "memory.query");
            // Longer than the buffer a plain field is written through.
            let long = "a long plain value ".repeat(20);
            for value in [
                long.as_str(),
                "",
                "plain text",
                "a \"quoted\" one",
                "back\\slash",
                "new\nline",
                "tab\t",
                "ünïcode",
                "\u{1b}[31mred",
                "'single'",
                "~!@#$%^&*()_+{}|:<>?",
                "del\u{7f}",
                "0123456789abcdef\"quote past a word",
                "0123456789abcdef\u{7f}",
                "0123456789abcdefü",
            ] {
                tracing::info!(
                    value,
                    n = 7,
                    ok = true,
                    ratio = 0.5,
                    "message with \"quotes\" {}",
                    1
                );
            }
            let err = Outer(std::io::Error::other("inner failed"));
            tracing::warn!(error = &err as &(dyn std::error::Error + 'static), "failed");
            tracing::warn!(front = %"tools-v1", reason = ?"rate_limited", "call refused");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text
    }

    /// The lines `body` logs at `debug` through `format`, each without its time stamp.
    fn lines<F>(format: F, body: impl FnOnce()) -> Vec<String>
    where
        F: for<'w> FormatEvent<tracing_subscriber::Registry, TextFields> + Send + Sync + 'static,
    {
        let out = Lines::default();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(out.clone())
            .fmt_fields(TextFields)
            .event_format(format)
            .with_filter(tracing::level_filters::LevelFilter::DEBUG);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), body);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| {
                let (time, rest) = l.split_once(' ').unwrap();
                assert!(time.ends_with('Z') && time.len() == 27, "{l}");
                rest.to_string()
            })
            .collect()
    }

    /// What a call logs: lines at three levels, one in a span of its own.
    fn a_calls_lines(record: impl Fn(CallField, &str)) {
        record(CallField::Tool, "memory \"quoted\"");
        tracing::info!(value = "plain", n = 7, "in the call");
        record(CallField::ContextTraceId, "trace-1");
        tracing::debug_span!("upstream", path = "/call").in_scope(|| {
            tracing::debug!(status = 200, "answered");
        });
        tracing::warn!(reason = ?"rate_limited", "refused");
        // A second tool (the next item of an MCP batch): a span's text grows by it.
        record(CallField::Tool, "memory.append");
        tracing::error!("app failed");
    }

    #[test]
    fn a_line_outside_a_call_is_the_full_formats_own() {
        let body = || {
            tracing::info!(value = "plain", "no call");
            tracing::info_span!("call", request_id = "x").in_scope(|| {
                tracing::warn!(reason = "slow", "in a span");
            });
        };
        let ours = lines(TextFormat::default(), body);
        assert_eq!(
            ours,
            [
                r#" INFO carapace::ops::log_format::tests: no call value="plain""#,
                r#" WARN call{request_id="x"}: carapace::ops::log_format::tests: in a span reason="slow""#,
            ]
        );
        assert_eq!(ours, lines(Format::default(), body));
    }

    #[test]
    fn a_call_with_its_fields_beside_it_is_written_as_its_span_would_be() {
        let in_span = lines(TextFormat::default(), || {
            let span = tracing::info_span!(
                "call",
                request_id = "0af7651916cd43dd",
                method = "POST",
                path = "/v1/tools/call",
                tool = tracing::field::Empty,
                context_trace_id = tracing::field::Empty,
            );
            span.in_scope(|| a_calls_lines(|f, v| CallScope::current().record(f, v)));
        });
        let beside = lines(TextFormat::default(), || {
            let mut scope = CallScope::Fields(std::sync::Arc::new(CallFields::new(
                http::HeaderValue::from_static("0af7651916cd43dd"),
                http::Method::POST,
                http::Uri::from_static("/v1/tools/call?q=1"),
            )));
            scope.in_scope(|| a_calls_lines(|f, v| CallScope::current().record(f, v)));
        });
        let call = r#"call{request_id="0af7651916cd43dd" method="POST" path="/v1/tools/call" tool="memory \"quoted\"""#;
        assert_eq!(
            beside,
            [
                format!(
                    r#" INFO {call}}}: carapace::ops::log_format::tests: in the call value="plain" n=7"#
                ),
                format!(
                    r#"DEBUG {call} context_trace_id="trace-1"}}:upstream{{path="/call"}}: carapace::ops::log_format::tests: answered status=200"#
                ),
                format!(
                    r#" WARN {call} context_trace_id="trace-1"}}: carapace::ops::log_format::tests: refused reason="rate_limited""#
                ),
                format!(
                    r#"ERROR {call} context_trace_id="trace-1" tool="memory.append"}}: carapace::ops::log_format::tests: app failed"#
                ),
            ]
        );
        assert_eq!(beside, in_span);
    }

    #[test]
    fn writes_what_the_default_fields_write() {
        let ours = logged(TextFields);
        let theirs = logged(DefaultFields::new());
        assert!(
            ours.contains(r#"request_id="0af7651916cd43dd" method=POST"#),
            "{ours}"
        );
        assert!(ours.contains(r#"tool="memory.query""#), "{ours}");
        assert_eq!(ours, theirs);
    }
}
