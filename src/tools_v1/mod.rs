//! Remote Tool Protocol (`tools-v1`): the front (`GET /v1/tools`, `POST /v1/tools/call`) and
//! the back (calling a tools-v1 app). The seed's request and response schemas are enforced on
//! both sides.

use std::sync::LazyLock;

use carapace_filters::schema::CompiledSchema;
use serde_json::Value;

mod front;
mod wire;
pub use front::{
    decode_request, decode_request_general, error_response, CallRequest, Refused, ToolsV1Front,
};
mod back;
pub use back::{call_app, decode_response, decode_response_general, request_body, ToolsV1Back};
#[cfg(test)]
mod tests;

/// The seed's `POST /v1/tools/call` request schema.
pub const REQUEST_SCHEMA: &str = include_str!("../../schemas/tool-call-request-v1.json");
/// The seed's `POST /v1/tools/call` response schema.
pub const RESPONSE_SCHEMA: &str = include_str!("../../schemas/tool-call-response-v1.json");

static REQUEST: LazyLock<CompiledSchema> = LazyLock::new(|| {
    CompiledSchema::compile(serde_json::from_str(REQUEST_SCHEMA).expect("schema is JSON"))
        .expect("request schema compiles")
});
static RESPONSE: LazyLock<CompiledSchema> = LazyLock::new(|| {
    CompiledSchema::compile(serde_json::from_str(RESPONSE_SCHEMA).expect("schema is JSON"))
        .expect("response schema compiles")
});
/// Check a response body against the seed's response schema (the tests use it).
pub fn follows_response_schema(doc: &Value) -> bool {
    RESPONSE.validate(doc).is_ok()
}
