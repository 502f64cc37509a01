//! The text log format's fields: the text of `tracing_subscriber`'s `DefaultFields`, with plain
//! string values written straight into the line instead of through `Debug` and the formatting
//! machinery. Every call's span formats its fields when it is created, logged or not, so this
//! is on every request's path.

use std::fmt;

use carapace_filters::canonical::first_escape;
use tracing::field::{Field, Visit};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::fmt::FormatFields;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::format::DefaultFields;
    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::layer::SubscriberExt;

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
