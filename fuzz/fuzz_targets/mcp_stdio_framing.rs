//! The stdio transport's framing and message sorting: whatever an MCP server writes on its
//! stdout, lines stay within the limit, every byte is accounted for, and each message is
//! sorted without a panic.

#![no_main]

use carapace::mcp::back::lines::{Line, LineReader};
use carapace::mcp::back::stdio::classify;
use serde_json::Value;
use libfuzzer_sys::fuzz_target;

const MAX: usize = 64;

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        // A small buffer: lines span reads, as on a pipe.
        let reader = tokio::io::BufReader::with_capacity(7, data);
        let mut lines = LineReader::new(reader, MAX);
        let mut seen = 0usize;
        let mut count = 0usize;
        while let Some(line) = lines.next_line().await.expect("reading a slice") {
            count += 1;
            match line {
                Line::Text(l) => {
                    assert!(l.len() <= MAX);
                    seen += l.len();
                    if let Ok(msg) = serde_json::from_slice::<Value>(&l) {
                        let expected = msg.as_array().map_or(1, Vec::len);
                        assert_eq!(classify(msg).len(), expected);
                    }
                }
                Line::TooLong(n) => {
                    assert!(n > MAX);
                    seen += n;
                }
            }
        }
        // Every byte is in a line, a skipped line, or a separator (`\n`, a `\r` before it or
        // at the very end).
        let newlines = data.iter().filter(|b| **b == b'\n').count();
        assert!(seen <= data.len());
        assert!(seen + newlines * 2 + 1 >= data.len());
        assert!(count >= newlines);
    });
});
