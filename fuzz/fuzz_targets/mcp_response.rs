//! The MCP back's decoding of a server's answers: an HTTP answer (JSON or an SSE stream, cut
//! anywhere as reads arrive) into messages, a response into a call outcome (including "input
//! required" results), and a `tools/list` page into compiled tools.
//! Nothing panics, and a tool result always becomes an outcome.

#![no_main]

use carapace::mcp::back::http::{messages, sse_events, SseParser};
use carapace::mcp::back::upstream::Reply;
use carapace::mcp::back::{catalog_tools, outcome};
use http::{HeaderMap, HeaderValue, StatusCode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    let mut headers = HeaderMap::new();
    let content_type = if kind & 1 == 0 {
        "application/json"
    } else {
        "text/event-stream"
    };
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    let status = if kind & 2 == 0 {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    };
    // An SSE answer is read as it arrives: the events are the same wherever a read ends.
    let cut = usize::from(kind >> 2).min(body.len());
    let mut parser = SseParser::default();
    let mut events = parser.push(&body[..cut]);
    events.extend(parser.push(&body[cut..]));
    events.extend(parser.finish());
    assert_eq!(events, sse_events(body));
    let Ok(messages) = messages(status, &headers, body) else {
        return;
    };
    for m in messages {
        if let Some(reply) = Reply::from_response(&m) {
            if let Reply::Result(r) = &reply {
                if let Some(tools) = r.get("tools").and_then(|t| t.as_array()) {
                    let compiled = catalog_tools(tools, |_| 1_000);
                    assert!(compiled.len() <= tools.len());
                }
            }
            let _ = outcome(reply);
        }
    }
});
