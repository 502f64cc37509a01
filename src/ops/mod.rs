//! Operations: the local admin socket, the remote control plane, the `/healthz`, `/readyz`
//! and `/metrics` endpoint, the metrics themselves and configuration reload.

pub mod admin;
pub mod call_fields;
pub mod call_span;
pub mod control;
pub mod endpoint;
pub mod log_format;
pub mod metrics;
pub mod reload;
pub mod tool_pins;

pub use endpoint::serve;
pub use reload::reload;
