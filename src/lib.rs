//! carapace: a sidecar proxy that is the hard shell around an AI tool host.
//!
//! See `README.md` for what it does and how to run it. The filter layers live in the
//! `carapace-filters` crate; this crate holds the protocol fronts and backs, configuration,
//! listeners, discovery, the peer store, the admin socket and operations endpoints.

pub mod app;
pub mod caller_body;
pub mod catalog;
pub mod client;
pub mod config;
pub mod connections;
pub mod demo;
pub mod eat;
pub mod edge;
pub mod errors;
pub mod front;
pub mod idempotency;
pub mod in_flight;
pub mod inbound;
pub mod json_text;
pub mod ledger;
pub mod lingering;
pub mod listener;
pub mod mcp;
pub mod memory_app;
pub mod metering;
pub mod oauth;
pub mod one_pass;
pub mod ops;
pub mod outbound;
pub mod pairing;
pub mod peers;
pub mod pki;
pub mod receipts;
pub mod relay;
pub mod secret_guard;
pub mod server;
pub mod shared_state;
pub mod skill_v1;
pub mod telemetry;
pub mod tls;
pub mod tools_v1;
pub mod upstream;

pub use ops::{admin, control, metrics};
