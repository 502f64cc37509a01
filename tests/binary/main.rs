//! The real `carapace` binary as a child process: `check`, `config-schema`, `serve` with
//! signals (reload, drain), the admin-socket commands, secrets in logs, the Skill Gateway v1
//! log markers and `demo`.
//!
//! Every child is killed when its guard drops; every wait is bounded. Callers use only the
//! Unix socket and the admin socket, so no TCP port has to be known in advance.

#[path = "../common/mod.rs"]
mod common;

mod commands;
mod config;
mod serve;
mod skill_gateway;
mod spans;

use std::fs::File;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use carapace::client::{signed_run, Client, Reply, Transport};
use common::{call, code, Env, SkillApp};
use http::{Method, StatusCode};
use serde_json::{json, Value};

/// Longest wait for anything a child process should do promptly.
const WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

// ---------------------------------------------------------------------------------------
// One-shot commands.

/// What a finished command printed.
struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Output {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Run `carapace ARGS` with `envs` (and without an inherited `RUST_LOG`) to completion, at
/// most `limit`; output goes to anonymous files so a large output cannot block the child.
fn run_sync(args: &[&str], envs: &[(&str, &str)], limit: Duration) -> Output {
    let out = tempfile::tempfile().unwrap();
    let err = tempfile::tempfile().unwrap();
    let child = Command::new(common::binary())
        .args(args)
        .env_remove("RUST_LOG")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap())
        .spawn()
        .unwrap();
    let mut guard = Guard(child);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = guard.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "carapace {args:?} did not finish within {limit:?}"
        );
        std::thread::sleep(POLL);
    };
    let read = |mut f: File| {
        let mut s = String::new();
        f.rewind().unwrap();
        f.read_to_string(&mut s).unwrap();
        s
    };
    Output {
        status,
        stdout: read(out),
        stderr: read(err),
    }
}

/// [`run_sync`] from async code, off the runtime's worker threads (the apps in the test keep
/// being served meanwhile).
async fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let envs: Vec<(String, String)> = envs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        run_sync(&args, &envs, WAIT)
    })
    .await
    .unwrap()
}

/// Kills the child when dropped (a test that panics leaves nothing running).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------------------------------
// `carapace serve` as a child.

/// A running `carapace serve`, its stderr captured to a file.
struct Serve {
    guard: Guard,
    log: PathBuf,
}

impl Serve {
    /// Start `carapace serve -c CONFIG`, logging to `log` (appended to, so a restart keeps the
    /// earlier lines).
    fn spawn(config: &Path, log: &Path, envs: &[(&str, &str)]) -> Serve {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(common::binary())
            .args(["serve", "-c"])
            .arg(config)
            .env_remove("RUST_LOG")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Serve {
            guard: Guard(child),
            log: log.to_path_buf(),
        }
    }

    fn pid(&self) -> u32 {
        self.guard.0.id()
    }

    /// The whole log so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait until the log, from byte `from` on, contains `needle`; returns that part.
    async fn wait_log_from(&mut self, from: usize, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let log = self.log();
            if log.get(from..).is_some_and(|l| l.contains(needle)) {
                return log[from..].to_string();
            }
            if let Some(s) = self.guard.0.try_wait().unwrap() {
                panic!("carapace exited ({s}) before logging `{needle}`:\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "`{needle}` not logged within {WAIT:?}:\n{log}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    async fn wait_log(&mut self, needle: &str) -> String {
        self.wait_log_from(0, needle).await
    }

    /// Send a signal by name (`HUP`, `TERM`) with the `kill` command.
    fn signal(&self, name: &str) {
        let s = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(s.success(), "kill -{name} failed");
    }

    /// Wait for the process to exit, at most `limit`.
    async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.guard.0.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "carapace did not exit within {limit:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGTERM, then wait for a clean exit.
    async fn stop(&mut self) {
        self.signal("TERM");
        let s = self.wait_exit(WAIT).await;
        assert_eq!(s.code(), Some(0), "exit status {s}:\n{}", self.log());
    }
}

/// A tools-v1 front on a Unix socket over the harness's memory app; no ops port.
fn tools_config(env: &Env, extra: &str) -> String {
    format!(
        r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners:
  unix: {{ path: {d}/tools.sock }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
peers: {{ file: {d}/peers.json }}
ops: {{ address: "" }}
{extra}
"#,
        d = env.path().display(),
        app = env.app_addr
    )
}

fn sock(env: &Env) -> PathBuf {
    env.path().join("tools.sock")
}

fn admin_sock(env: &Env) -> PathBuf {
    env.path().join("state/admin.sock")
}

fn unix(path: &Path) -> Client {
    Client::new(Transport::Unix(path.to_path_buf()))
}

/// Poll `GET path` on the Unix socket until the answer names `tool` (discovery is done).
async fn wait_serving(sock: &Path, path: &str, tool: &str) {
    let deadline = Instant::now() + WAIT;
    let mut last = String::new();
    loop {
        if let Ok(r) = unix(sock).send(Method::GET, path, &[], "").await {
            last = format!("{} {}", r.status, String::from_utf8_lossy(&r.body));
            if r.status == StatusCode::OK && last.contains(tool) {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} did not serve {tool} within {WAIT:?}; last answer: {last}",
            sock.display()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// One tools-v1 call over the Unix socket.
async fn tool_call(sock: &Path, tool: &str, args: Value) -> Reply {
    unix(sock)
        .post_json("/v1/tools/call", &[], &call(tool, args))
        .await
        .unwrap()
}

/// Assert a tools-v1 call was answered `status: ok`.
fn assert_ok(r: &Reply) {
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    assert_eq!(r.json()["status"], "ok", "{:?}", r.json());
}

/// Assert a tools-v1 call was refused by the kill-switch (not to be retried).
fn assert_disabled(r: &Reply) {
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    assert_eq!(r.json()["status"], "error", "{:?}", r.json());
    assert_eq!(code(r), "DEPENDENCY_UNAVAILABLE", "{:?}", r.json());
    assert_eq!(r.json()["error"]["details"]["reason"], "kill_switch");
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn nonce() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}
