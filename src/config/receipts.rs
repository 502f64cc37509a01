//! `receipts`: the tool-host side's signed receipts ([`crate::receipts`]).

use schemars::JsonSchema;
use serde::Deserialize;

use super::{err, Config, ConfigError};

/// Signed receipts of the calls this tool host executes.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReceiptsConfig {
    /// Sign a receipt for every executed call with the host's Ed25519 identity key (the one
    /// pairing uses; made in `state_dir` on first start). Default: on when `pairing` is set.
    #[serde(default)]
    pub sign: Option<bool>,
    /// The receipts' `provider`. Default: `pairing.component_id`; required without pairing.
    #[serde(default)]
    pub provider_id: Option<String>,
    /// Sign the receipts of calls that end together as one batch: one signature over their
    /// Merkle root, each receipt carrying its inclusion proof (the `v2` form). Far cheaper
    /// under load; every verifier must read `v2` (carapace does since this form was added).
    /// Default: off (`v1`, a signature per receipt).
    #[serde(default)]
    pub batch: bool,
}

impl Config {
    /// Whether receipts are signed in batches (`receipts.batch`).
    pub fn receipts_batched(&self) -> bool {
        self.receipts.as_ref().is_some_and(|r| r.batch)
    }

    /// The `provider` receipts name, when this host signs them.
    pub fn receipt_provider(&self) -> Option<String> {
        let r = self.receipts.clone().unwrap_or_default();
        let pairing = self.pairing.as_ref().map(|p| p.component_id.clone());
        if !r.sign.unwrap_or(pairing.is_some()) {
            return None;
        }
        r.provider_id.or(pairing)
    }
}

pub(super) fn check_receipts(c: &Config, errors: &mut Vec<ConfigError>) {
    let Some(r) = &c.receipts else { return };
    if r.sign == Some(true) && r.provider_id.is_none() && c.pairing.is_none() {
        errors.push(err(
            "/receipts/provider_id",
            "is required to sign receipts without `pairing` (it names the tool host)",
        ));
    }
    if let Some(id) = &r.provider_id {
        if id.is_empty() || id.len() > 128 || id.chars().any(char::is_control) {
            errors.push(err(
                "/receipts/provider_id",
                "must be 1 to 128 characters without control characters",
            ));
        }
    }
}
