//! An app that is a command (a stdio MCP server carapace starts): its argv, environment,
//! working directory and resource limits, and what they resolve to.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

use super::secrets::{fix_secret, load_secret, SecretRef};
use super::{err, ConfigError};

/// A variable of the child's environment: a value, or a secret by reference.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum EnvValue {
    Value(String),
    Secret(SecretRef),
}

/// Resource limits of the child (`setrlimit`), each when given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChildLimits {
    /// Address space, in bytes (`RLIMIT_AS`).
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// CPU time, in seconds (`RLIMIT_CPU`).
    #[serde(default)]
    pub cpu_seconds: Option<u64>,
    /// Open file descriptors (`RLIMIT_NOFILE`).
    #[serde(default)]
    pub open_files: Option<u64>,
}

/// How to start a stdio MCP server, resolved: its whole environment is here.
#[derive(Clone, PartialEq, Eq)]
pub struct ChildSpec {
    /// The app's name in logs.
    pub name: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<PathBuf>,
    pub limits: ChildLimits,
}

impl std::fmt::Debug for ChildSpec {
    // The environment may hold secrets: only its names are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildSpec")
            .field("name", &self.name)
            .field("argv", &self.argv)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("working_dir", &self.working_dir)
            .field("limits", &self.limits)
            .finish()
    }
}

pub(super) fn resolve_command_paths(
    env: &mut BTreeMap<String, EnvValue>,
    working_dir: &mut Option<PathBuf>,
    base: &Path,
) {
    for v in env.values_mut() {
        if let EnvValue::Secret(s) = v {
            fix_secret(s, base);
        }
    }
    if let Some(d) = working_dir {
        super::fix_path(d, base);
    }
}

/// The child's spec, with its secrets loaded; `None` after pushing errors.
pub(super) fn child_spec(
    name: &str,
    argv: &[String],
    env: &BTreeMap<String, EnvValue>,
    working_dir: Option<&PathBuf>,
    limits: &ChildLimits,
    errors: &mut Vec<ConfigError>,
) -> Option<ChildSpec> {
    let before = errors.len();
    if argv.first().is_none_or(|p| p.is_empty()) {
        errors.push(err("/app/command", "name the program to run"));
    }
    let mut resolved = Vec::new();
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            errors.push(err(format!("/app/env/{k}"), "not a variable name"));
            continue;
        }
        match v {
            EnvValue::Value(s) => resolved.push((k.clone(), s.clone())),
            EnvValue::Secret(s) => match load_secret(s) {
                Ok(secret) => match String::from_utf8(secret.bytes().to_vec()) {
                    Ok(s) => resolved.push((k.clone(), s)),
                    Err(_) => errors.push(err(format!("/app/env/{k}"), "the secret is not UTF-8")),
                },
                Err(m) => errors.push(err(format!("/app/env/{k}"), m)),
            },
        }
    }
    if let Some(d) = working_dir {
        if !d.is_dir() {
            errors.push(err(
                "/app/working_dir",
                format!("{} is not a directory", d.display()),
            ));
        }
    }
    for (v, key) in [
        (limits.memory_bytes, "memory_bytes"),
        (limits.cpu_seconds, "cpu_seconds"),
        (limits.open_files, "open_files"),
    ] {
        if v == Some(0) {
            errors.push(err(format!("/app/limits/{key}"), "must be at least 1"));
        }
    }
    (errors.len() == before).then(|| ChildSpec {
        name: name.to_owned(),
        argv: argv.to_vec(),
        env: resolved,
        working_dir: working_dir.cloned(),
        limits: limits.clone(),
    })
}
