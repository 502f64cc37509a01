//! Secrets: where each comes from (file or environment variable) and the loaded value.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;

use super::fix_path;

/// Where a secret comes from. Secrets are never written inline in the configuration.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SecretRef {
    /// The value of this environment variable.
    Env(String),
    /// The content of this file (one trailing newline is removed).
    File(PathBuf),
}
/// A loaded secret; its value never appears in `Debug` output or logs.
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    pub fn bytes(&self) -> &Arc<[u8]> {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}
pub(super) fn fix_secret(s: &mut SecretRef, base: &Path) {
    if let SecretRef::File(p) = s {
        fix_path(p, base);
    }
}
/// Load one secret, or say why not.
pub fn load_secret(secret: &SecretRef) -> Result<Secret, String> {
    let bytes = match secret {
        SecretRef::Env(name) => std::env::var(name)
            .map_err(|_| format!("environment variable {name} is not set"))?
            .into_bytes(),
        SecretRef::File(path) => {
            use carapace_filters::state_file::{read_bounded, MAX_SECRET_BYTES};
            let mut b = read_bounded(path, MAX_SECRET_BYTES)
                .map_err(|e| format!("cannot read secret file {}: {e}", path.display()))?;
            if b.ends_with(b"\r\n") {
                b.truncate(b.len() - 2);
            } else if b.ends_with(b"\n") {
                b.truncate(b.len() - 1);
            }
            b
        }
    };
    if bytes.is_empty() {
        return Err("secret is empty".into());
    }
    Ok(Secret(bytes.into()))
}
