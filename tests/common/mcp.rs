//! MCP requests as a 2026-07-28 client sends them: `_meta` in the body, mirrored headers.

use carapace::client::{Client, Reply};
use serde_json::{json, Value};

pub const MODERN: &str = "2026-07-28";

/// A 2026-07-28 request body with its `_meta`.
pub fn modern_body(id: i64, method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// `POST /mcp` with the headers mirrored from `body`: `Mcp-Method`, and `Mcp-Name` from
/// `params.name` (`tools/call`, `prompts/get`) or `params.uri` (`resources/read`).
pub async fn modern(client: &Client, body: &Value) -> Reply {
    let method = body["method"].as_str().unwrap();
    let mut h = vec![("mcp-protocol-version", MODERN), ("mcp-method", method)];
    let name = match method {
        "resources/read" => body["params"]["uri"].as_str(),
        _ => body["params"]["name"].as_str(),
    };
    if let Some(name) = name {
        h.push(("mcp-name", name));
    }
    client.post_json("/mcp", &h, body).await.unwrap()
}
