//! Newline-delimited JSON-RPC framing of the stdio transport, bounded: a line longer than the
//! limit is skipped to its end instead of growing a buffer without bound.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// One line from the server.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A line within the limit, without its `\n` (nor a `\r` before it).
    Text(Vec<u8>),
    /// A line past the limit, skipped; its length.
    TooLong(usize),
}

/// Reads lines of at most `max` bytes from `reader`.
pub struct LineReader<R> {
    reader: R,
    max: usize,
    buf: Vec<u8>,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub fn new(reader: R, max: usize) -> Self {
        LineReader {
            reader,
            max,
            buf: Vec::new(),
        }
    }

    /// The next line; `None` at the end of the stream (a last line without `\n` counts).
    pub async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        self.buf.clear();
        let mut skipped = 0usize;
        loop {
            let chunk = self.reader.fill_buf().await?;
            if chunk.is_empty() {
                return Ok(match (skipped, self.buf.is_empty()) {
                    (0, true) => None,
                    (0, false) => Some(Line::Text(trimmed(std::mem::take(&mut self.buf)))),
                    (n, _) => Some(Line::TooLong(n)),
                });
            }
            let (part, done) = match memchr(chunk) {
                Some(i) => (&chunk[..i], i + 1),
                None => (chunk, chunk.len()),
            };
            let ended = done > part.len();
            if skipped > 0 || self.buf.len() + part.len() > self.max {
                skipped += self.buf.len() + part.len();
                self.buf.clear();
            } else {
                self.buf.extend_from_slice(part);
            }
            self.reader.consume(done);
            if ended {
                return Ok(Some(if skipped > 0 {
                    Line::TooLong(skipped)
                } else {
                    Line::Text(trimmed(std::mem::take(&mut self.buf)))
                }));
            }
        }
    }
}

fn memchr(b: &[u8]) -> Option<usize> {
    b.iter().position(|c| *c == b'\n')
}

fn trimmed(mut line: Vec<u8>) -> Vec<u8> {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], max: usize) -> Vec<Line> {
        // A tiny buffer, so lines span many reads.
        let reader = tokio::io::BufReader::with_capacity(3, input);
        let mut r = LineReader::new(reader, max);
        let mut out = Vec::new();
        while let Some(l) = r.next_line().await.unwrap() {
            out.push(l);
        }
        out
    }

    #[tokio::test]
    async fn lines_are_split_bounded_and_a_long_one_is_skipped_whole() {
        let got = lines(b"{\"a\":1}\r\n0123456789abc\nok\n\nlast", 8).await;
        assert_eq!(
            got,
            vec![
                Line::Text(b"{\"a\":1}".to_vec()),
                Line::TooLong(13),
                Line::Text(b"ok".to_vec()),
                Line::Text(Vec::new()),
                Line::Text(b"last".to_vec()),
            ]
        );
    }

    #[tokio::test]
    async fn a_long_line_at_the_end_of_the_stream_is_reported() {
        assert_eq!(lines(b"0123456789", 4).await, vec![Line::TooLong(10)]);
        assert!(lines(b"", 4).await.is_empty());
    }
}
