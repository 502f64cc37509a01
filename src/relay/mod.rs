//! The caller-tool relay: an agent calls the tools its caller offers, over a stream the caller
//! holds open. The relay is one more back: a caller declares its tools on its stream
//! ([`endpoint`]); they join the catalog as `<caller_id>_<name>` with their input schemas, so
//! every front offers them and every call to them passes the whole call stage (kill-switch,
//! rate limit, authorization, input schema, timeout, secret guard); the [`back`] emits each
//! call on the offering caller's stream and waits for its answer ([`registry`]).

pub mod back;
pub mod endpoint;
pub mod registry;

pub use back::RelayRouter;
pub use endpoint::RelayLayer;
pub use registry::CallerTools;
