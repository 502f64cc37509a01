//! The outbound side's check of a paired peer's receipt: the signature against the peer
//! record's `public_key_ed25519`, then every field against the call that was sent and the
//! answer that came back.

use schemars::JsonSchema;
use serde::Deserialize;

use super::{output_hash, value_hash, Receipt, ReceiptError, ReceiptStatus};

/// What the outbound side does with a peer's missing or bad receipt
/// (`outbound.peers.<id>.receipts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptMode {
    /// Do not look at receipts.
    Off,
    /// Pass the answer on, and say in `Carapace-Receipt-Status` (and the log and metrics)
    /// that its receipt is missing or invalid.
    #[default]
    Flag,
    /// Refuse an answer without a valid receipt (`DEPENDENCY_UNAVAILABLE`).
    Require,
}

/// What the receipt must say.
#[derive(Clone, Copy)]
pub struct Expected<'a> {
    pub tool: &'a str,
    pub consumer: &'a str,
    pub provider: &'a str,
    pub input: &'a serde_json::Value,
    pub status: ReceiptStatus,
    pub output: Option<&'a serde_json::Value>,
    pub code: Option<&'a str>,
}

/// The check's outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Verified(Receipt),
    Missing,
    Invalid(ReceiptError),
}

impl Verdict {
    /// The `Carapace-Receipt-Status` value.
    pub fn status(&self) -> &'static str {
        match self {
            Verdict::Verified(_) => "verified",
            Verdict::Missing => "missing",
            Verdict::Invalid(_) => "invalid",
        }
    }
}

/// Check `header` (the peer's `Carapace-Receipt`, if any) against `public_key_b64` and `want`.
pub fn check(header: Option<&[u8]>, public_key_b64: &str, want: &Expected<'_>) -> Verdict {
    let Some(header) = header else {
        return Verdict::Missing;
    };
    match super::verify(header, public_key_b64).and_then(|r| matches(r, want)) {
        Ok(r) => Verdict::Verified(r),
        Err(e) => Verdict::Invalid(e),
    }
}

fn matches(r: Receipt, want: &Expected<'_>) -> Result<Receipt, ReceiptError> {
    let same = |field: &'static str, got: &str, expected: &str| {
        if got == expected {
            Ok(())
        } else {
            Err(ReceiptError::Mismatch {
                field,
                got: got.chars().take(128).collect(),
                want: expected.chars().take(128).collect(),
            })
        }
    };
    same("tool", &r.tool, want.tool)?;
    same("consumer", &r.consumer, want.consumer)?;
    same("provider", &r.provider, want.provider)?;
    same("status", r.status.as_str(), want.status.as_str())?;
    same("input_hash", &r.input_hash, &value_hash(want.input))?;
    let output = output_hash(want.status, want.output, want.code);
    same("output_hash", &r.output_hash, &output)?;
    Ok(r)
}
