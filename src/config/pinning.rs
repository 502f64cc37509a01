//! `app.pinning`: tool-definition pinning (see [`crate::catalog::pins`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

use carapace_filters::state_file::MAX_DOCUMENT_BYTES;

use super::{err, fix_path, ConfigError, Protocol};

/// What a changed tool definition does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PinMode {
    /// Definitions are not pinned.
    Off,
    /// A changed definition is logged and counted, and still served.
    Warn,
    /// A changed definition is withheld from discovery and its calls refused until approved.
    Enforce,
}

/// Tool-definition pinning of the app's tools.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PinningConfig {
    /// `off`, `warn` or `enforce`; default `enforce` for an MCP app (a third party's server),
    /// `warn` for a tools-v1 or skill-v1 app (the user's own).
    #[serde(default)]
    pub mode: Option<PinMode>,
    /// Pins shipped with the configuration: served tool name → `sha256:<hex>` of its
    /// definition (as `carapace tools pins` prints them). With pins here or in `file`, a tool
    /// without one is not approved; without any, each tool is pinned at first discovery (in
    /// the state directory) and a change must be approved.
    #[serde(default)]
    pub pins: BTreeMap<String, String>,
    /// A JSON file of pins in the same form, read when the configuration is loaded.
    #[serde(default)]
    pub file: Option<PathBuf>,
}

impl PinningConfig {
    /// The mode in force for an app speaking `protocol`.
    pub fn mode_for(&self, protocol: Protocol) -> PinMode {
        self.mode.unwrap_or(match protocol {
            Protocol::Mcp => PinMode::Enforce,
            Protocol::ToolsV1 | Protocol::SkillV1 => PinMode::Warn,
        })
    }

    /// The mode in force for the outbound role's tools (its paired tool hosts and skills, the
    /// user's own): `warn` unless configured.
    pub fn outbound_mode(&self) -> PinMode {
        self.mode.unwrap_or(PinMode::Warn)
    }
}

pub(super) fn resolve_pinning(p: &mut PinningConfig, base: &Path) {
    if let Some(f) = &mut p.file {
        fix_path(f, base);
    }
}

/// Every pin of the configuration and its file, checked; `at` is the section's path.
pub(super) fn check_pinning(
    p: &PinningConfig,
    at: &str,
    errors: &mut Vec<ConfigError>,
) -> BTreeMap<String, String> {
    let mut pins = BTreeMap::new();
    for (name, pin) in &p.pins {
        if is_pin(pin) {
            pins.insert(name.clone(), pin.clone());
        } else {
            errors.push(err(format!("{at}/pins/{name}"), NOT_A_PIN));
        }
    }
    let Some(file) = &p.file else {
        return pins;
    };
    let read = carapace_filters::state_file::read_bounded(file, MAX_DOCUMENT_BYTES)
        .map_err(|e| e.to_string())
        .and_then(|b| {
            serde_json::from_slice::<BTreeMap<String, String>>(&b).map_err(|e| e.to_string())
        });
    match read {
        Err(e) => errors.push(err(
            format!("{at}/file"),
            format!(
                "cannot read {} as a JSON object of pins: {e}",
                file.display()
            ),
        )),
        Ok(from_file) => {
            for (name, pin) in from_file {
                if !is_pin(&pin) {
                    errors.push(err(format!("{at}/file"), format!("`{name}`: {NOT_A_PIN}")));
                } else if pins.get(&name).is_some_and(|p| *p != pin) {
                    errors.push(err(
                        format!("{at}/pins/{name}"),
                        "differs from the pin in `file`",
                    ));
                } else {
                    pins.insert(name, pin);
                }
            }
        }
    }
    pins
}

const NOT_A_PIN: &str = "not a pin: `sha256:` and 64 lowercase hex digits";

fn is_pin(p: &str) -> bool {
    p.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}
