//! Skill Gateway v1 (`skill-v1`): the front (`GET /manifest`, `POST /run` with HMAC or API key)
//! and the back (calling a legacy `/run` skill, signing with the skill's own secret).

mod front;
pub use front::{error_response, SkillV1Front};
mod back;
mod wire;
pub use back::{call_skill, decode_run_response, encode_run, AppSigning, SkillV1Back};

/// The protocol version this front speaks.
pub const PROTOCOL_VERSION: &str = "1.0";
/// The six fields the signature covers.
pub const SIGNED_FIELDS: [&str; 6] = [
    "gateway_protocol_version",
    "skill_id",
    "capability",
    "input",
    "timestamp",
    "nonce",
];
/// Default header of the API key.
pub const DEFAULT_API_KEY_HEADER: &str = "x-api-key";
/// Default header of the signature copy.
pub const DEFAULT_SIGNATURE_HEADER: &str = "x-skill-signature";

/// Longest number literal accepted in a signed body: a double needs at most 17 significant
/// digits and an exponent; a longer literal can only be a value the signer and the app read
/// differently.
pub const MAX_NUMBER_CHARS: usize = 40;

#[cfg(test)]
mod tests;
