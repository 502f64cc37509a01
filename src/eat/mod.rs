//! EAT: the signed tool catalog (`/.well-known/api-catalog`) of the EAT protocol text, as
//! carapace checks it. The catalog's shape is checked strictly, as the text's JSON Schema and
//! its Conformance prose together say ([`validate`]).

pub mod discover;
pub mod documents;
pub mod jws;
pub mod keys;
pub mod names;
pub mod openapi;
pub mod serve;
pub mod validate;
