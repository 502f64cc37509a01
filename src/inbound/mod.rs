//! The inbound (tool-host) role: each caller's request goes through the HTTP stage (identity,
//! bearer tokens, control plane, kill-switch, per-peer rate limit, load shedding, body limits,
//! RFC 9421 signatures, the front) and
//! each decoded call through the call stage (per-tool kill-switch and rate limit,
//! authorization, signature, schemas, timeout, the back). A pairing's result is installed here.

mod app_back;
pub(crate) mod call_stage;
pub(crate) mod http_stage;
pub(crate) mod installer;
pub mod signature_keys;

pub use http_stage::build_stack;
