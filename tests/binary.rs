//! The real `carapace` binary as a child process: `check`, `config-schema`, `serve` with
//! signals (reload, drain), the admin-socket commands, secrets in logs, the Skill Gateway v1
//! log markers and `demo`.
//!
//! Every child is killed when its guard drops; every wait is bounded. Callers use only the
//! Unix socket and the admin socket, so no TCP port has to be known in advance.

mod common;

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

// ---------------------------------------------------------------------------------------
// check, config-schema

/// The environment variables the shipped examples read their secrets from.
const EXAMPLE_SECRETS: [(&str, &str); 3] = [
    ("SKILL_HMAC_KEY_2026_11", "example-key-2026-11"),
    ("SKILL_HMAC_KEY_2026_05", "example-key-2026-05"),
    ("LEGACY_SKILL_SECRET", "example-legacy-secret"),
];

#[tokio::test]
async fn check_accepts_every_shipped_example() {
    let env = Env::new().await;
    let d = env.path().display().to_string();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        // The examples name TLS files and directories of a real host; point them here.
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replace("/etc/carapace/tls/gateway-ca.crt", &format!("{d}/ca.pem"))
            .replace("/etc/carapace/tls/", &format!("{d}/"))
            .replace("/var/lib/carapace", &format!("{d}/state"))
            .replace("/run/carapace", &format!("{d}/run"));
        assert!(!text.contains("/etc/"), "{}: {text}", p.display());
        let copy = env.path().join(p.file_name().unwrap());
        std::fs::write(&copy, text).unwrap();
        let out = run(&["check", "-c", path_str(&copy)], &EXAMPLE_SECRETS).await;
        assert_eq!(out.code(), Some(0), "{}: {out:?}", p.display());
        assert!(out.stdout.contains("ok"), "{}: {out:?}", p.display());
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} examples found");
}

#[tokio::test]
async fn check_names_every_error_of_a_bad_config() {
    let env = Env::new().await;
    let cfg = env.path().join("bad.yaml");
    std::fs::write(
        &cfg,
        format!(
            r#"
state_dir: {d}/state
front:
  protocol: skill-v1
  skill_id: memory
  colour: blue
  auth:
    mode: hmac
    keys:
      - {{ id: k1, secret: {{ env: CARAPACE_BINARY_TEST_UNSET_VAR }} }}
listeners:
  unix: {{ mode: "0600" }}
app: {{ protocol: tools-v1, address: "http://10.1.2.3:8080" }}
limits: {{ max_body_bytes: "lots" }}
ops: {{ address: "" }}
"#,
            d = env.path().display()
        ),
    )
    .unwrap();
    let out = run(&["check", "-c", path_str(&cfg)], &[]).await;
    let mut missing = Vec::new();
    for (what, needles) in [
        ("unknown key", &["/front", "colour"][..]),
        ("wrong type", &["/limits/max_body_bytes"][..]),
        ("missing required key", &["/listeners/unix", "path"][..]),
        (
            "unset env secret",
            &[
                "/front/auth/keys/0/secret",
                "CARAPACE_BINARY_TEST_UNSET_VAR",
            ][..],
        ),
        ("non-loopback plain app address", &["/app/address"][..]),
    ] {
        if let Some(n) = needles.iter().find(|n| !out.stderr.contains(**n)) {
            missing.push(format!("{what} (`{n}`)"));
        }
    }
    assert!(missing.is_empty(), "errors not named: {missing:?}\n{out:?}");
    assert_eq!(out.code(), Some(64), "{out:?}");
}

#[tokio::test]
async fn check_names_every_semantic_error() {
    // The same meaning errors without any structural one: all of them are collected.
    let env = Env::new().await;
    let cfg = env.path().join("bad.yaml");
    std::fs::write(
        &cfg,
        format!(
            r#"
state_dir: {d}/state
front:
  protocol: skill-v1
  skill_id: memory
  auth:
    mode: hmac
    keys:
      - {{ id: k1, secret: {{ env: CARAPACE_BINARY_TEST_UNSET_VAR }} }}
listeners:
  unix: {{ path: {d}/tools.sock, mode: "0999" }}
app: {{ protocol: tools-v1, address: "http://10.1.2.3:8080" }}
ops: {{ address: "" }}
"#,
            d = env.path().display()
        ),
    )
    .unwrap();
    let out = run(&["check", "-c", path_str(&cfg)], &[]).await;
    assert_eq!(out.code(), Some(64), "{out:?}");
    for needle in [
        "/front/auth/keys/0/secret",
        "CARAPACE_BINARY_TEST_UNSET_VAR",
        "/app/address",
        "/listeners/unix/mode",
    ] {
        assert!(
            out.stderr.contains(needle),
            "`{needle}` not named:\n{out:?}"
        );
    }
    assert!(out.stdout.is_empty(), "{out:?}");
}

/// Inputs that would read without bound, or mean "nothing" by accident, are refused.
#[tokio::test]
async fn check_refuses_unbounded_files_and_empty_values() {
    let env = Env::new().await;
    let cfg = env.path().join("bad.yaml");
    std::fs::write(
        &cfg,
        r#"
state_dir: ""
front:
  protocol: skill-v1
  skill_id: memory
  auth: { mode: hmac, keys: [ { id: k1, secret: { file: /dev/zero } } ] }
listeners: { tcp: { address: "127.0.0.1:0" } }
app: { protocol: tools-v1, address: "unix:" }
"#,
    )
    .unwrap();
    let out = run(&["check", "-c", path_str(&cfg)], &[]).await;
    assert_eq!(out.code(), Some(64), "{out:?}");
    for needle in [
        "/state_dir",
        "/front/auth/keys/0/secret",
        "not a regular file",
        "/app/address",
    ] {
        assert!(
            out.stderr.contains(needle),
            "`{needle}` not named:\n{out:?}"
        );
    }
}

#[tokio::test]
async fn check_refuses_a_file_that_is_not_yaml_or_does_not_exist() {
    let env = Env::new().await;
    let cfg = env.path().join("garbage.yaml");
    std::fs::write(&cfg, "front: [unclosed\n  : {\n\t- ").unwrap();
    let out = run(&["check", "-c", path_str(&cfg)], &[]).await;
    assert_eq!(out.code(), Some(64), "{out:?}");
    assert!(out.stderr.contains("YAML"), "{out:?}");

    let missing = env.path().join("does-not-exist.yaml");
    let out = run(&["check", "-c", path_str(&missing)], &[]).await;
    assert_eq!(out.code(), Some(64), "{out:?}");
    assert!(out.stderr.contains("does-not-exist.yaml"), "{out:?}");
}

#[test]
fn config_schema_prints_a_json_schema() {
    let out = run_sync(&["config-schema"], &[], WAIT);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let schema: Value = serde_json::from_str(&out.stdout).expect("JSON on stdout");
    assert!(schema["properties"]["front"].is_object(), "{schema}");
    assert_eq!(schema["additionalProperties"], json!(false), "{schema}");
    assert_eq!(schema["type"], "object");
    let required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for key in ["state_dir", "front", "listeners", "app"] {
        assert!(required.contains(&key), "{required:?}");
    }
}

// ---------------------------------------------------------------------------------------
// serve

#[tokio::test]
async fn serve_with_a_bad_config_exits_64_before_binding() {
    let env = Env::new().await;
    let cfg = env.path().join("carapace.yaml");
    std::fs::write(&cfg, tools_config(&env, "bogus_key: 1")).unwrap();
    let out = run(&["serve", "-c", path_str(&cfg)], &[]).await;
    assert_eq!(out.code(), Some(64), "{out:?}");
    assert!(out.stderr.contains("bogus_key"), "{out:?}");
    assert!(!sock(&env).exists(), "unix socket was bound");
    assert!(!admin_sock(&env).exists(), "admin socket was bound");
    assert!(!env.path().join("state").exists(), "state dir was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_and_reload_command_apply_good_configs_and_refuse_bad_ones() {
    let env = Env::new().await;
    let cfg = env.path().join("carapace.yaml");
    let cfg_s = path_str(&cfg).to_string();
    let good = tools_config(&env, "");
    std::fs::write(&cfg, &good).unwrap();
    let mut srv = Serve::spawn(&cfg, &env.path().join("carapace.log"), &[]);
    let sock = sock(&env);
    wait_serving(&sock, "/v1/tools", "memory.query").await;
    assert_ok(&tool_call(&sock, "memory.append", json!({"text": "one"})).await);

    // A bad file on SIGHUP is refused, with the error named; the old config keeps serving.
    std::fs::write(&cfg, tools_config(&env, "bogus_reload_key: true")).unwrap();
    let mark = srv.log().len();
    srv.signal("HUP");
    let after = srv.wait_log_from(mark, "reload refused").await;
    assert!(after.contains("bogus_reload_key"), "{after}");
    assert_ok(&tool_call(&sock, "memory.append", json!({"text": "two"})).await);

    // A good file with the global kill-switch on SIGHUP: every call refused, none reaches
    // the app.
    std::fs::write(&cfg, tools_config(&env, "kill_switch: { global: true }")).unwrap();
    let mark = srv.log().len();
    srv.signal("HUP");
    srv.wait_log_from(mark, "config_reloaded").await;
    let seen = env.app.received().len();
    assert_disabled(&tool_call(&sock, "memory.query", json!({"query": "o"})).await);
    assert_disabled(&tool_call(&sock, "memory.append", json!({"text": "three"})).await);
    assert_eq!(env.app.received().len(), seen, "a call reached the app");

    // `carapace reload -c`: a bad file is refused with its errors and a non-zero status.
    std::fs::write(&cfg, tools_config(&env, "bogus_reload_key: true")).unwrap();
    let out = run(&["reload", "-c", &cfg_s], &[]).await;
    assert_ne!(out.code(), Some(0), "{out:?}");
    assert!(
        out.stderr.contains("bogus_reload_key") || out.stdout.contains("bogus_reload_key"),
        "{out:?}"
    );
    // ... and through the admin socket the running carapace itself refuses it.
    let admin = admin_sock(&env);
    let out = run(&["reload", "--admin-socket", path_str(&admin)], &[]).await;
    assert_ne!(out.code(), Some(0), "{out:?}");
    assert!(out.stdout.contains("bogus_reload_key"), "{out:?}");
    assert_disabled(&tool_call(&sock, "memory.query", json!({"query": "o"})).await);

    // A good file without the kill-switch: calls work again.
    std::fs::write(&cfg, &good).unwrap();
    let out = run(&["reload", "-c", &cfg_s], &[]).await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    let r = tool_call(&sock, "memory.query", json!({"query": "o"})).await;
    assert_ok(&r);
    assert_eq!(r.json()["result"]["matches"].as_array().unwrap().len(), 2);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_calls_in_flight_then_exits_0() {
    let env = Env::new().await;
    let cfg = env.path().join("carapace.yaml");
    std::fs::write(&cfg, tools_config(&env, "")).unwrap();
    let mut srv = Serve::spawn(&cfg, &env.path().join("carapace.log"), &[]);
    let sock = sock(&env);
    wait_serving(&sock, "/v1/tools", "memory.query").await;

    let mut body = call("memory.query", json!({"query": "x", "delay_ms": 1500}));
    body["timeout_ms"] = json!(5000);
    let client = unix(&sock);
    let slow = tokio::spawn(async move { client.post_json("/v1/tools/call", &[], &body).await });
    let deadline = Instant::now() + WAIT;
    while !env.app.received().iter().any(|r| r.tool == "memory.query") {
        assert!(
            Instant::now() < deadline,
            "the slow call never reached the app"
        );
        tokio::time::sleep(POLL).await;
    }
    let signalled = Instant::now();
    srv.signal("TERM");

    let reply = tokio::time::timeout(WAIT, slow)
        .await
        .expect("the slow call did not finish")
        .unwrap()
        .expect("the slow call failed");
    assert_ok(&reply);
    let status = srv.wait_exit(WAIT).await;
    assert_eq!(status.code(), Some(0), "{status}:\n{}", srv.log());
    assert!(signalled.elapsed() < WAIT);
    assert!(
        std::os::unix::net::UnixStream::connect(&sock).is_err(),
        "the unix socket still accepts connections"
    );
    assert!(!sock.exists(), "the unix socket file was left behind");
}

/// Request headers.
type Headers<'a> = Vec<(&'a str, &'a str)>;

/// A signed `memory.query` run of `query`, at the current time with a fresh nonce.
fn query_run(secret: &[u8], query: &str) -> Value {
    signed_run(
        secret,
        "memory",
        "memory.query",
        json!({"query": query}),
        now_ms(),
        &nonce(),
    )
}

/// A skill-v1 front (`mode`: `hmac` or `api_key`, its key from `CARAPACE_TEST_KEY`) on a Unix
/// socket in `dir` over the harness's memory app, with `extra` configuration; returns the
/// configuration's path and the socket's.
fn skill_front_config(env: &Env, dir: &Path, mode: &str, extra: &str) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let cfg = dir.join("carapace.yaml");
    let sock = dir.join("skill.sock");
    std::fs::write(
        &cfg,
        format!(
            r#"
state_dir: {d}/state
front:
  protocol: skill-v1
  skill_id: memory
  auth: {{ mode: {mode}, keys: [ {{ id: k1, secret: {{ env: CARAPACE_TEST_KEY }} }} ] }}
listeners:
  unix: {{ path: {sock} }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
ops: {{ address: "" }}
{extra}
"#,
            d = dir.display(),
            sock = sock.display(),
            app = env.app_addr
        ),
    )
    .unwrap();
    (cfg, sock)
}

/// One skill-v1 front run (HMAC or API key): a good call, a bad one, a replay. Returns the
/// signatures and header values that must not be logged.
async fn secret_run(env: &Env, mode: &str, secret: &str) -> Vec<String> {
    let dir = env.path().join(mode);
    let (cfg, sock) = skill_front_config(env, &dir, mode, "log: { format: json, level: trace }");
    let mut srv = Serve::spawn(
        &cfg,
        &env.path().join("carapace.log"),
        &[("RUST_LOG", "trace"), ("CARAPACE_TEST_KEY", secret)],
    );
    wait_serving(&sock, "/manifest", "memory.query").await;
    let client = unix(&sock);
    let mut sensitive = Vec::new();

    let good = query_run(secret.as_bytes(), "x");
    let sig = good["signature"].as_str().unwrap().to_string();
    sensitive.push(sig.clone());
    // The signed payload, in its canonical and its wire form.
    let mut signed = good.clone();
    signed.as_object_mut().unwrap().remove("signature");
    sensitive.push(carapace_filters::canonical::canonical_string(&signed).unwrap());
    sensitive.push(good.to_string());
    let bad = query_run(b"not-the-secret", "x");
    // What the failed attempt presented is not logged either.
    sensitive.push(bad["signature"].as_str().unwrap().to_string());
    if mode == "api_key" {
        sensitive.push("not-the-secret".to_string());
    }
    let (good_headers, bad_headers): (Headers, Headers) = match mode {
        "hmac" => (
            vec![("x-skill-signature", sig.as_str())],
            vec![("x-skill-signature", bad["signature"].as_str().unwrap())],
        ),
        _ => (
            vec![("x-api-key", secret)],
            vec![("x-api-key", "not-the-secret")],
        ),
    };

    let r = client
        .post_json("/run", &good_headers, &good)
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{mode}: {:?}", r.json());
    assert_eq!(r.json()["ok"], true, "{mode}: {:?}", r.json());
    let r = client.post_json("/run", &bad_headers, &bad).await.unwrap();
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{mode}: {:?}", r.json());
    assert_eq!(code(&r), "SKILL_AUTH_FAILED");
    let r = client
        .post_json("/run", &good_headers, &good)
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{mode}: {:?}", r.json());
    assert_eq!(code(&r), "NONCE_REPLAY");

    srv.stop().await;
    sensitive
}

/// A nonce accepted just before the process is killed (SIGKILL: no shutdown, no flush) is
/// still refused after the restart: its journal record was in the kernel before the call
/// went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nonce_accepted_before_a_kill_is_refused_after_the_restart() {
    let env = Env::new().await;
    let (cfg, sock) = skill_front_config(&env, env.path(), "hmac", "");
    let secret = "kill-test-secret";
    let envs = [("CARAPACE_TEST_KEY", secret)];
    let log = env.path().join("carapace.log");
    let good = query_run(secret.as_bytes(), "x");

    let mut srv = Serve::spawn(&cfg, &log, &envs);
    wait_serving(&sock, "/manifest", "memory.query").await;
    let r = unix(&sock).post_json("/run", &[], &good).await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    srv.signal("KILL");
    let status = srv.wait_exit(WAIT).await;
    assert_eq!(status.code(), None, "killed by a signal: {status}");

    let mut srv = Serve::spawn(&cfg, &log, &envs);
    wait_serving(&sock, "/manifest", "memory.query").await;
    let r = unix(&sock).post_json("/run", &[], &good).await.unwrap();
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{:?}", r.json());
    assert_eq!(code(&r), "NONCE_REPLAY");
    // A new nonce still goes through.
    let fresh = query_run(secret.as_bytes(), "y");
    let r = unix(&sock).post_json("/run", &[], &fresh).await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_appear_in_trace_logs() {
    let env = Env::new().await;
    let secret = "s3cr3t-Zq9-never-log-me";
    let mut sensitive = secret_run(&env, "hmac", secret).await;
    sensitive.extend(secret_run(&env, "api_key", secret).await);

    let log = std::fs::read_to_string(env.path().join("carapace.log")).unwrap();
    assert!(!log.trim().is_empty(), "nothing was logged");
    // Both runs logged at trace level as JSON, including the calls.
    assert!(log.lines().all(|l| l.starts_with('{')), "{log}");
    assert!(
        log.matches("signature verified").count() >= 2,
        "the calls were not logged:\n{log}"
    );
    // Each line of a call is written in the call's span, with its request id.
    for line in log.lines().filter(|l| l.contains("signature verified")) {
        assert!(
            line.contains(r#""name":"call""#) && line.contains(r#""request_id":""#),
            "a call's line without its span: {line}"
        );
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let b64url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut forbidden = vec![
        secret.to_string(),
        hex::encode(secret),
        hex::encode_upper(secret),
        b64.encode(secret),
        b64url.encode(secret),
    ];
    forbidden.extend(sensitive);
    for f in &forbidden {
        assert!(!log.contains(f.as_str()), "`{f}` found in the log:\n{log}");
    }
    // The secret's bytes as a Debug list ([115, 51, ...]) are not there either.
    let bytes = format!("{:?}", secret.as_bytes());
    let bytes = bytes.trim_matches(['[', ']']);
    assert!(!log.contains(bytes), "secret bytes found in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_switch_commands_work_and_survive_a_restart() {
    let env = Env::new().await;
    let cfg = env.path().join("carapace.yaml");
    let cfg_s = path_str(&cfg).to_string();
    std::fs::write(&cfg, tools_config(&env, "")).unwrap();
    let log = env.path().join("carapace.log");
    let sock = sock(&env);
    let admin = admin_sock(&env);
    let admin_s = path_str(&admin).to_string();
    let mut srv = Serve::spawn(&cfg, &log, &[]);
    wait_serving(&sock, "/v1/tools", "memory.delete").await;

    let out = run(
        &[
            "kill-switch",
            "engage",
            "--tool",
            "memory.delete",
            "--admin-socket",
            &admin_s,
        ],
        &[],
    )
    .await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    let seen = env.app.received().len();
    assert_disabled(&tool_call(&sock, "memory.delete", json!({"id": "m1"})).await);
    assert_eq!(
        env.app.received().len(),
        seen,
        "memory.delete reached the app"
    );
    assert_ok(&tool_call(&sock, "memory.query", json!({"query": "x"})).await);
    srv.stop().await;

    // Same state_dir: the switch an operator engaged is remembered.
    let mut srv = Serve::spawn(&cfg, &log, &[]);
    wait_serving(&sock, "/v1/tools", "memory.delete").await;
    let seen = env.app.received().len();
    assert_disabled(&tool_call(&sock, "memory.delete", json!({"id": "m1"})).await);
    assert_eq!(
        env.app.received().len(),
        seen,
        "memory.delete reached the app"
    );

    let out = run(&["kill-switch", "status", "-c", &cfg_s], &[]).await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    let state: Value = serde_json::from_str(&out.stdout).expect("status prints JSON");
    assert_eq!(
        state["runtime"]["tools"],
        json!(["memory.delete"]),
        "{state}"
    );
    assert_eq!(state["global_engaged"], false, "{state}");

    let out = run(
        &[
            "kill-switch",
            "release",
            "--tool",
            "memory.delete",
            "-c",
            &cfg_s,
        ],
        &[],
    )
    .await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    let r = tool_call(&sock, "memory.delete", json!({"id": "m1"})).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    assert_eq!(code(&r), "NOT_FOUND", "the app answers: {:?}", r.json());
    assert_eq!(env.app.received().len(), seen + 1);

    // Global.
    let out = run(&["kill-switch", "engage", "--admin-socket", &admin_s], &[]).await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    let seen = env.app.received().len();
    assert_disabled(&tool_call(&sock, "memory.query", json!({"query": "x"})).await);
    assert_disabled(&tool_call(&sock, "memory.delete", json!({"id": "m1"})).await);
    assert_eq!(env.app.received().len(), seen, "a call reached the app");
    let out = run(&["kill-switch", "status", "--admin-socket", &admin_s], &[]).await;
    let state: Value = serde_json::from_str(&out.stdout).expect("status prints JSON");
    assert_eq!(state["global_engaged"], true, "{state}");
    assert_eq!(state["runtime"]["global"], true, "{state}");
    assert_eq!(state["config"]["global"], false, "{state}");
    let out = run(&["kill-switch", "release", "-c", &cfg_s], &[]).await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_ok(&tool_call(&sock, "memory.query", json!({"query": "x"})).await);
    srv.stop().await;

    // Nothing to talk to: a clear error and a non-zero status.
    let out = run(&["kill-switch", "status", "--admin-socket", &admin_s], &[]).await;
    assert_ne!(out.code(), Some(0), "{out:?}");
    assert!(out.stderr.contains("admin socket"), "{out:?}");
}

// ---------------------------------------------------------------------------------------
// Skill Gateway v1 log markers

/// `carapace serve` with a tools-v1 front over a fake Skill Gateway v1 skill serving
/// `manifest`, text logs at info. Returns the running process and the skill's address.
async fn skill_serve(env: &Env, manifest: Value, extra: &str) -> (Serve, PathBuf, String) {
    let secret = b"legacy-skill-secret";
    let (_app, addr) = SkillApp::start(secret, manifest).await;
    let d = env.path().display();
    std::fs::write(env.path().join("skill.secret"), secret).unwrap();
    let cfg = env.path().join("carapace.yaml");
    std::fs::write(
        &cfg,
        format!(
            r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners:
  unix: {{ path: {d}/tools.sock }}
app:
  protocol: skill-v1
  address: "http://{addr}"
  skill:
    skill_id: demo.echo
    capabilities: [demo.echo]
    auth: {{ mode: hmac, header_name: X-Skill-Signature, secret: {{ file: {d}/skill.secret }} }}
ops: {{ address: "" }}
log: {{ format: text, level: info }}
{extra}
"#
        ),
    )
    .unwrap();
    let srv = Serve::spawn(&cfg, &env.path().join("carapace.log"), &[]);
    (srv, cfg, addr.to_string())
}

fn assert_markers(log: &str, markers: &[String]) {
    let missing: Vec<&String> = markers
        .iter()
        .filter(|m| !log.contains(m.as_str()))
        .collect();
    assert!(missing.is_empty(), "markers missing: {missing:?}\n{log}");
}

/// The markers appear in this order (each first occurrence).
fn assert_markers_in_order(log: &str, markers: &[String]) {
    assert_markers(log, markers);
    let at: Vec<usize> = markers
        .iter()
        .map(|m| log.find(m.as_str()).unwrap())
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "markers out of the text's order {markers:?}:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skill_gateway_log_markers_are_spelled_as_the_text_gives_them() {
    let env = Env::new().await;
    // The manifest offers one capability more than the registry names.
    let mut manifest = SkillApp::vagus_manifest();
    let mut extra = manifest["capabilities"][0].clone();
    extra["capability"] = json!("demo.admin");
    manifest["capabilities"].as_array_mut().unwrap().push(extra);
    let (mut srv, cfg, addr) = skill_serve(&env, manifest, "").await;
    srv.wait_log("remote_tools_registered").await;
    assert_markers(
        &srv.log(),
        &[
            "capability_skipped skill_id=demo.echo capability=demo.admin reason=not_in_registry"
                .to_string(),
        ],
    );
    let markers = [
        "remote_gateway enabled=true".to_string(),
        "remote_gateway kill_switch=false".to_string(),
        format!("registry_loaded path={}", cfg.display()),
        "registry_summary skills=1 capabilities=1".to_string(),
        format!("manifest_discovery_start skill_id=demo.echo base_url=http://{addr}"),
        "manifest_protocol_ok version=1.0".to_string(),
        "manifest_schema_ok skill_id=demo.echo".to_string(),
        "remote_tools_registered count=1 tools=[demo.echo]".to_string(),
    ];
    assert_markers_in_order(&srv.log(), &markers);
    assert!(addr.starts_with("127.0.0.1:"));
    let log = srv.log();
    assert!(!log.contains("GATEWAY_DISABLED"), "{log}");
    assert!(!log.contains("skill_skipped"), "{log}");

    // The capability is served as a tool, and the call goes through to the skill.
    let sock = sock(&env);
    wait_serving(&sock, "/v1/tools", "demo.echo").await;
    let r = tool_call(&sock, "demo.echo", json!({"message": "hi"})).await;
    assert_ok(&r);
    assert_eq!(r.json()["result"]["result"], "echo:hi");

    // A rediscovery of an unchanged manifest is a cache hit.
    let mark = srv.log().len();
    srv.signal("HUP");
    srv.wait_log_from(mark, "manifest_cached skill_id=demo.echo")
        .await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skill_gateway_unsupported_manifest_version_is_skipped_with_a_reason() {
    let env = Env::new().await;
    let mut manifest = SkillApp::vagus_manifest();
    manifest["gateway_protocol_version"] = json!("2.0");
    let (mut srv, _, _) = skill_serve(&env, manifest, "").await;
    srv.wait_log("skill_skipped").await;
    let log = srv.log();
    assert_markers(
        &log,
        &[
            "skill_skipped skill_id=demo.echo reason=PROTOCOL_VERSION_UNSUPPORTED".to_string(),
            "PROTOCOL_VERSION_UNSUPPORTED".to_string(),
        ],
    );
    assert!(!log.contains("manifest_protocol_ok"), "{log}");
    assert!(!log.contains("remote_tools_registered"), "{log}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skill_gateway_kill_switch_logs_gateway_disabled() {
    let env = Env::new().await;
    let (mut srv, _, _) = skill_serve(
        &env,
        SkillApp::vagus_manifest(),
        "kill_switch: { global: true }",
    )
    .await;
    srv.wait_log("registration_skipped").await;
    assert_markers(
        &srv.log(),
        &[
            "remote_gateway enabled=true".to_string(),
            "remote_gateway kill_switch=true".to_string(),
            "GATEWAY_DISABLED".to_string(),
            "registration_skipped reason=kill_switch_active".to_string(),
        ],
    );
    // Fail-closed: calls are refused. The socket file appears at bind, a moment before the
    // listener accepts: retry until a connection is taken.
    let sock = sock(&env);
    let deadline = Instant::now() + WAIT;
    let reply = loop {
        let sent = unix(&sock)
            .post_json(
                "/v1/tools/call",
                &[],
                &call("demo.echo", json!({"message": "hi"})),
            )
            .await;
        match sent {
            Ok(r) => break r,
            Err(e) => assert!(Instant::now() < deadline, "no answer on the socket: {e:?}"),
        }
        tokio::time::sleep(POLL).await;
    };
    assert_disabled(&reply);
    srv.stop().await;
}

/// With the gateway disabled, the log says registration was skipped; it must not then say
/// the skill's tools were registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skill_gateway_kill_switch_registers_no_tools() {
    let env = Env::new().await;
    let (mut srv, _, _) = skill_serve(
        &env,
        SkillApp::vagus_manifest(),
        "kill_switch: { global: true }",
    )
    .await;
    // Discovery ran; whatever that pass logs is written before the process can exit.
    srv.wait_log("manifest_schema_ok").await;
    srv.stop().await;
    let log = srv.log();
    assert!(
        log.contains("registration_skipped reason=kill_switch_active"),
        "{log}"
    );
    assert!(
        !log.contains("remote_tools_registered"),
        "registration was logged as skipped, then as done:\n{log}"
    );
}

// ---------------------------------------------------------------------------------------
// demo

#[test]
fn demo_runs_and_names_the_error_codes() {
    let out = run_sync(&["demo"], &[], Duration::from_secs(60));
    assert_eq!(out.code(), Some(0), "{out:?}");
    for c in [
        "INVALID_ARGS",
        "PAIRING_REQUIRED",
        "NONCE_REPLAY",
        "DEPENDENCY_UNAVAILABLE",
        "TIMEOUT",
        "tool_not_approved",
        "error=\"insufficient_scope\"",
        "replayed -> HTTP 401 nonce_replay",
        "took memory.query (tag memory) -> call \"ok\"",
        "one catalog byte changed -> refused catalog_hash",
        "answered -> result {\"shown\":true}; caller gone mid-call -> DEPENDENCY_UNAVAILABLE at once",
    ] {
        assert!(
            out.stdout.contains(c),
            "`{c}` not in the demo output:\n{out:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_list_and_revoke_from_the_command_line() {
    let env = Env::new().await;
    let cfg = env.path().join("carapace.yaml");
    std::fs::write(&cfg, tools_config(&env, "")).unwrap();
    let cfg_s = path_str(&cfg).to_string();
    let mut srv = Serve::spawn(&cfg, &env.path().join("carapace.log"), &[]);
    wait_serving(&sock(&env), "/v1/tools", "memory.query").await;

    let out = run(&["peers", "list", "-c", &cfg_s], &[]).await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    let list: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(list["peers"][0]["component_id"], "gw_test", "{out:?}");
    assert_eq!(list["peers"][0]["status"], "active", "{out:?}");

    let out = run(&["peers", "revoke", "gw_test", "-c", &cfg_s], &[]).await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    let out = run(&["peers", "revoke", "gw_test", "-c", &cfg_s], &[]).await;
    assert_eq!(out.code(), Some(1), "revoking twice should fail: {out:?}");
    let out = run(&["peers", "list", "-c", &cfg_s], &[]).await;
    let list: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(list["peers"][0]["status"], "revoked", "{out:?}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_pair_with_carapace_pair_tool_and_the_gateway_reaches_the_app() {
    let env = Env::new().await;
    common::write_peers(&env.path().join("peers.json"), &[]);
    let (tools_port, pair_port) = (common::free_port(), common::free_port());
    let gw = env.path().join("gw");
    std::fs::create_dir_all(&gw).unwrap();
    let gw_admin = gw.join("state/admin.sock");
    let gw_admin_s = path_str(&gw_admin).to_string();
    std::fs::write(
        gw.join("carapace.yaml"),
        format!(
            r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {d}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
peers: {{ file: {d}/peers.json }}
ops: {{ address: "" }}
gateway: {{ id: gw_home }}
outbound:
  socket: {d}/outbound.sock
  peers: {{ memory-east: {{ url: "https://127.0.0.1:{tools_port}" }} }}
"#,
            d = gw.display(),
            app = env.app_addr
        ),
    )
    .unwrap();
    let mut gateway = Serve::spawn(&gw.join("carapace.yaml"), &gw.join("carapace.log"), &[]);
    gateway.wait_log("outbound socket").await;

    // The operator reads the gateway's key for the tool host's configuration.
    let out = run(&["identity", "--admin-socket", &gw_admin_s], &[]).await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    let key = serde_json::from_str::<Value>(&out.stdout).unwrap()["public_key_ed25519"]
        .as_str()
        .unwrap()
        .to_string();

    let d = env.path().display();
    std::fs::write(
        env.path().join("host.yaml"),
        format!(
            r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners:
  tcp:
    address: "127.0.0.1:{tools_port}"
    tls: {{ cert_file: {d}/server.crt, key_file: {d}/server.key, client_ca_file: {d}/ca.pem }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
peers: {{ file: {d}/peers.json }}
ops: {{ address: "" }}
pairing: {{ listen: "127.0.0.1:{pair_port}", component_id: memory-east, gateway_public_key_ed25519: "{key}" }}
"#,
            app = env.app_addr
        ),
    )
    .unwrap();
    let mut host = Serve::spawn(
        &env.path().join("host.yaml"),
        &env.path().join("host.log"),
        &[],
    );
    host.wait_log("pairing endpoint on").await;

    let endpoint = format!("ws://127.0.0.1:{pair_port}/v1/pair");
    let out = run(
        &[
            "pair",
            "tool",
            "--admin-socket",
            &gw_admin_s,
            &endpoint,
            "memory-east",
        ],
        &[],
    )
    .await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "pairing complete", "{out:?}");
    assert!(lines.contains(&"component_type=tool_host"), "{out:?}");
    assert!(lines.contains(&"component_id=memory-east"), "{out:?}");
    assert!(
        lines.contains(&format!("endpoint={endpoint}").as_str()),
        "{out:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("mtls_cert_fingerprint=sha256:")),
        "{out:?}"
    );

    // The agent calls through the gateway; the call reaches the app over mTLS.
    let agent = unix(&gw.join("outbound.sock"));
    let mut reply = None;
    for _ in 0..100 {
        let r = agent
            .post_json(
                "/v1/tools/call",
                &[],
                &common::call("memory.append", json!({"text": "over the pairing"})),
            )
            .await
            .unwrap();
        if r.json()["status"] == "ok" {
            reply = Some(r);
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    assert!(reply.is_some(), "no call got through:\n{}", gateway.log());
    let seen = env.app.received();
    assert_eq!(
        seen.last().unwrap().headers["x-carapace-peer-id"],
        "gw_home"
    );

    // The identity the pairing installed, exported for replicas to mount: the files in use.
    let out = run(
        &[
            "identity-secret",
            "-c",
            env.path().join("host.yaml").to_str().unwrap(),
            "--name",
            "memory-east-identity",
        ],
        &[],
    )
    .await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    let secret: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(secret["kind"], "Secret");
    assert_eq!(secret["metadata"]["name"], "memory-east-identity");
    let state = env.path().join("state");
    let current = std::fs::read_to_string(state.join("pairing/current")).unwrap();
    let paired = state.join("pairing").join(current.trim());
    let data = |key: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"][key].as_str().unwrap())
            .unwrap()
    };
    assert_eq!(
        data("tls.crt"),
        std::fs::read(paired.join("mtls.crt")).unwrap()
    );
    assert_eq!(
        data("tls.key"),
        std::fs::read(paired.join("mtls.key")).unwrap()
    );
    assert_eq!(
        data("ca.crt"),
        std::fs::read(paired.join("gateway-ca.pem")).unwrap()
    );
    let peers: Value = serde_json::from_slice(&data("peers.json")).unwrap();
    assert!(peers.to_string().contains("gw_home"), "{peers}");

    // Unpaired on the gateway: the same call fails closed.
    let out = run(
        &[
            "peers",
            "revoke",
            "memory-east",
            "--admin-socket",
            &gw_admin_s,
        ],
        &[],
    )
    .await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    let reached = env.app.received().len();
    let r = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &common::call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(code(&r), "FORBIDDEN", "{:?}", r.json());
    assert_eq!(env.app.received().len(), reached);

    // `carapace pair test` checks the gateway end to end with a throwaway tool host.
    let out = run(&["pair", "test", "--admin-socket", &gw_admin_s], &[]).await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(out.stdout.starts_with("pairing test complete\n"), "{out:?}");

    host.stop().await;
    gateway.stop().await;
}

#[tokio::test]
async fn sample_app_serves_the_memory_tools_and_stops_on_sigterm() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let address = format!("127.0.0.1:{port}");
    let child = Command::new(common::binary())
        .args(["sample-app", "--listen", &address])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut guard = Guard(child);
    let client = Client::new(Transport::Tcp(address.parse().unwrap()));
    let deadline = Instant::now() + WAIT;
    let tools = loop {
        if let Ok(r) = client.send(Method::GET, "/v1/tools", &[], "").await {
            break r;
        }
        assert!(Instant::now() < deadline, "sample-app did not answer");
        tokio::time::sleep(POLL).await;
    };
    assert_eq!(tools.status, StatusCode::OK);
    let names: Vec<String> = tools.json()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.contains(&"memory.append".to_string()), "{names:?}");
    let s = Command::new("kill")
        .arg("-TERM")
        .arg(guard.0.id().to_string())
        .status()
        .unwrap();
    assert!(s.success());
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = guard.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "sample-app ignored SIGTERM");
        tokio::time::sleep(POLL).await;
    };
    assert_eq!(status.code(), Some(0));
}

// ---------------------------------------------------------------------------------------
// Distributed tracing

/// One exported span: trace id, span id, parent span id (hex), name, string attributes.
#[derive(Debug, Clone)]
struct SpanSeen {
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    attributes: Vec<(String, String)>,
}

fn spans_in(bodies: &[bytes::Bytes]) -> Vec<SpanSeen> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use prost::Message;
    let mut out = Vec::new();
    for body in bodies {
        let req = ExportTraceServiceRequest::decode(body.as_ref()).expect("OTLP protobuf");
        for span in req
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
        {
            let attributes = span
                .attributes
                .iter()
                .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Any::StringValue(s) => Some((kv.key.clone(), s.clone())),
                    _ => None,
                })
                .collect();
            out.push(SpanSeen {
                trace_id: hex::encode(&span.trace_id),
                span_id: hex::encode(&span.span_id),
                parent: hex::encode(&span.parent_span_id),
                name: span.name.clone(),
                attributes,
            });
        }
    }
    out
}

/// Spans go to an OTLP receiver: the call continues the caller's trace, the stages are its
/// children, and the app is told carapace's span as its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_receiver_with_their_parent_links() {
    use std::sync::{Arc, Mutex};
    let env = Env::new().await;
    let bodies: Arc<Mutex<Vec<bytes::Bytes>>> = Arc::default();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = l.local_addr().unwrap();
    let sink = bodies.clone();
    common::serve_http1(l, move |req: http::Request<hyper::body::Incoming>| {
        let sink = sink.clone();
        async move {
            use http_body_util::BodyExt;
            let path = req.uri().path().to_string();
            let body = req.into_body().collect().await.unwrap().to_bytes();
            if path == "/v1/traces" {
                sink.lock().unwrap().push(body);
            }
            let mut r = http::Response::new(http_body_util::Full::new(bytes::Bytes::new()));
            r.headers_mut()
                .insert("content-type", "application/x-protobuf".parse().unwrap());
            r
        }
    });
    let cfg = env.path().join("carapace.yaml");
    let extra = format!(
        "telemetry: {{ otlp: {{ endpoint: \"http://{otlp}/v1/traces\", export_interval_ms: 100 }} }}"
    );
    std::fs::write(&cfg, tools_config(&env, &extra)).unwrap();
    let mut srv = Serve::spawn(&cfg, &env.path().join("serve.log"), &[]);
    let sock = sock(&env);
    wait_serving(&sock, "/v1/tools", "memory.query").await;

    let (trace, caller_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let traceparent = format!("00-{trace}-{caller_span}-01");
    let mut body = call("memory.query", json!({"query": "x"}));
    body["context"]["trace_id"] = json!("ctx-trace-7");
    let reply = unix(&sock)
        .post_json("/v1/tools/call", &[("traceparent", &traceparent)], &body)
        .await
        .unwrap();
    assert_ok(&reply);
    let to_app = env.app.received().last().unwrap().headers["traceparent"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(to_app.starts_with(&format!("00-{trace}-")), "{to_app}");

    let deadline = Instant::now() + WAIT;
    let (call_span, stages) = loop {
        let spans = spans_in(&bodies.lock().unwrap());
        let call_span = spans
            .iter()
            .find(|s| s.name == "call" && s.trace_id == trace)
            .cloned();
        if let Some(c) = call_span {
            let stages: Vec<SpanSeen> = spans
                .iter()
                .filter(|s| s.parent == c.span_id)
                .cloned()
                .collect();
            if stages.iter().any(|s| s.name == "upstream") {
                break (c, stages);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no spans: {spans:?}\n{}",
            srv.log()
        );
        tokio::time::sleep(POLL).await;
    };
    assert_eq!(call_span.parent, caller_span, "{call_span:?}");
    let attr = |k: &str| {
        call_span
            .attributes
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(attr("context_trace_id").as_deref(), Some("ctx-trace-7"));
    assert_eq!(attr("tool").as_deref(), Some("memory.query"));
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    for stage in ["input_schema", "upstream", "output_schema"] {
        assert!(
            names.contains(&stage),
            "{stage} not a child of the call: {names:?}"
        );
    }
    assert!(stages.iter().all(|s| s.trace_id == trace));
    assert_eq!(
        to_app,
        format!("00-{trace}-{}-01", call_span.span_id),
        "the app's parent is carapace's call span"
    );
    srv.stop().await;
}
