//! The pairing handshake of the Remote Tool Protocol: identities of both roles and the wire
//! format, compatible with the public crabstack implementation.

pub mod gateway;
pub mod handshake;
pub mod identity;
pub mod transport;
pub mod wire;
