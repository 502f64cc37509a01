//! Tower layers for AI tool hosts.
//!
//! Every layer here is usable in any tower or axum service; `carapace` stacks them in the order
//! its design gives (outermost first):
//!
//! | stage | layer | rejection |
//! |---|---|---|
//! | HTTP | [`identity::IdentityLayer`] | `PairingRequired`, `Forbidden` |
//! | HTTP | [`bearer::BearerLayer`] (OAuth callers) | `BearerToken` |
//! | HTTP | [`kill_switch::KillSwitchLayer`] (global) | `Disabled` |
//! | HTTP | [`rate_limit::PeerRateLimitLayer`] | `RateLimited` |
//! | HTTP | [`concurrency::LoadShedLayer`] | `Overloaded` |
//! | HTTP | [`body::BodyLimitLayer`] | `PayloadTooLarge`, `BodyTimeout` |
//! | HTTP | [`http_signature::HttpSignatureLayer`] (RFC 9421 fronts) | `AuthFailed`, `StaleTimestamp`, `NonceReplay` |
//! | call | [`kill_switch::KillSwitchLayer`] (per tool) | `Disabled` |
//! | call | [`rate_limit::ToolRateLimitLayer`] | `RateLimited` |
//! | call | [`signature::SignatureLayer`] | `AuthFailed`, `StaleTimestamp`, `NonceReplay` |
//! | call | [`schema::InputSchemaLayer`] | `InputSchema` |
//! | call | [`timeout::CallTimeoutLayer`] | `Timeout` |
//! | call | [`schema::OutputSchemaLayer`] | `OutputSchema` |
//!
//! HTTP-stage layers are `Service<http::Request<B>>`; call-stage layers are
//! `Service<`[`call::ToolCall`]`>` and work on the protocol-neutral model that every front
//! decodes to. Every layer fails with a [`Rejection`]; a front maps it to its own envelope in
//! one place. In an axum router, put `axum::error_handling::HandleErrorLayer` outside these
//! layers to turn a `Rejection` into the response of your choice, as with any fallible tower
//! middleware.

pub mod authorization;
pub mod bearer;
pub mod body;
pub mod call;
pub mod canonical;
pub mod clock;
pub mod concurrency;
pub mod future;
pub mod http_signature;
pub mod identity;
pub mod kill_switch;
pub mod nonce;
pub mod rate_limit;
mod rejection;
pub mod schema;
pub mod secret_guard;
pub mod shared;
pub mod signature;
pub mod state_file;
pub mod timeout;

pub use rejection::{Rejection, SchemaViolation};

/// Boxed future used by layers whose response future is an `async` block.
pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

/// Milliseconds since the Unix epoch from the system clock (read once per poll of a
/// connection's task: see [`clock`]).
pub fn unix_now_ms() -> u64 {
    clock::unix_now_ms()
}
