//! Two carapace replicas sharing one real `redis-server` (started here on a Unix socket or a
//! loopback port): a nonce is used once across both, a rate limit holds for both together, and
//! when Redis goes away calls are refused (`DEPENDENCY_UNAVAILABLE`) until it is back.
//!
//! These tests need the `redis-server` binary (Debian package `redis-server`); `.ci/run`
//! installs it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use carapace::client::{signed_run, Client, Reply, Transport};
use carapace::server::Running;
use carapace_filters::signature::UnixClock;
use common::{code, Env};
use http::{Method, StatusCode};
use serde_json::{json, Value};

const NOW: u64 = 1_735_689_600_000;
const SECRET: &[u8] = b"shared-secret";
const SKILL: &str = "demo.memory";

/// A `redis-server` of this test only, killed on drop.
struct Redis {
    child: Child,
    /// `unix:///...` or `redis://127.0.0.1:PORT`.
    url: String,
    args: Vec<String>,
    dir: PathBuf,
}

impl Redis {
    /// On a Unix socket in `dir`.
    fn unix(dir: &Path) -> Redis {
        Redis::unix_with(dir, &[])
    }

    /// On a Unix socket in `dir`, with more `redis-server` arguments.
    fn unix_with(dir: &Path, extra: &[&str]) -> Redis {
        let sock = dir.join("redis.sock");
        let mut args = vec![
            "--port".into(),
            "0".into(),
            "--unixsocket".into(),
            sock.display().to_string(),
            "--unixsocketperm".into(),
            "700".into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        Redis::spawn(dir, args, format!("unix://{}", sock.display()))
    }

    /// On a free loopback TCP port.
    fn tcp(dir: &Path) -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let args = vec![
            "--bind".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port.to_string(),
        ];
        Redis::spawn(dir, args, format!("redis://127.0.0.1:{port}"))
    }

    fn spawn(dir: &Path, args: Vec<String>, url: String) -> Redis {
        let child = start_server(dir, &args);
        let r = Redis {
            child,
            url,
            args,
            dir: dir.to_path_buf(),
        };
        r.wait_up();
        r
    }

    /// Wait until the server answers PING (at most 5 s).
    fn wait_up(&self) {
        for _ in 0..500 {
            let ok = self.cli(&["ping"]).starts_with("PONG");
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not come up at {}", self.url);
    }

    /// `redis-cli` against this server (with its password, if it has one); its output.
    fn cli(&self, args: &[&str]) -> String {
        let mut auth = Vec::new();
        if let Some(i) = self.args.iter().position(|a| a == "--requirepass") {
            auth = vec![
                "--no-auth-warning".to_string(),
                "-a".into(),
                self.args[i + 1].clone(),
            ];
        }
        Command::new("redis-cli")
            .args(self.cli_target())
            .args(auth)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    fn cli_target(&self) -> Vec<String> {
        match self.url.strip_prefix("unix://") {
            Some(sock) => vec!["-s".into(), sock.into()],
            None => {
                let port = self.url.rsplit(':').next().unwrap();
                vec!["-h".into(), "127.0.0.1".into(), "-p".into(), port.into()]
            }
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Start again with the same address (and an empty data set).
    fn restart(&mut self) {
        self.stop();
        self.child = start_server(&self.dir, &self.args);
        self.wait_up();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

fn start_server(dir: &Path, args: &[String]) -> Child {
    Command::new("redis-server")
        .args(args)
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is needed for these tests (Debian package redis-server)")
}

/// A skill-v1 replica (HMAC) over the env's memory app, with its own state directory, sharing
/// the Redis at `url` under `prefix`, with `extra` top-level YAML.
fn replica_yaml(env: &Env, name: &str, url: &str, prefix: &str, extra: &str) -> String {
    let d = env.path();
    std::fs::write(d.join("k0"), SECRET).unwrap();
    format!(
        r#"
state_dir: {d}/{name}
front:
  protocol: skill-v1
  skill_id: {SKILL}
  auth: {{ mode: hmac, keys: [ {{ id: k0, secret: {{ file: {d}/k0 }} }} ] }}
listeners: {{ tcp: {{ address: "127.0.0.1:0" }} }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
ops: {{ address: "" }}
admin: {{ socket: {d}/{name}.admin.sock }}
shared_state:
  backend: redis
  redis: {{ url: "{url}", key_prefix: "{prefix}", timeout_ms: 200 }}
{extra}
"#,
        d = d.display(),
        app = env.app_addr,
    )
}

fn clock() -> UnixClock {
    let now = Arc::new(AtomicU64::new(NOW));
    Arc::new(move || now.load(Ordering::SeqCst))
}

async fn replica(env: &Env, name: &str, redis: &Redis, extra: &str) -> Running {
    let yaml = replica_yaml(env, name, &redis.url, "tool-host-a:", extra);
    env.start_clocked(&yaml, true, clock()).await
}

fn append(text: &str) -> Value {
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    signed_run(
        SECRET,
        SKILL,
        "memory.append",
        json!({ "text": text }),
        NOW,
        &nonce,
    )
}

async fn run(r: &Running, body: &Value) -> Reply {
    Client::new(Transport::Tcp(r.tcp_address.expect("tcp listener")))
        .send(Method::POST, "/run", &[], body.to_string())
        .await
        .unwrap()
}

/// How many calls reached the app.
fn app_calls(env: &Env) -> usize {
    env.app.received().len()
}

#[tokio::test]
async fn a_request_accepted_at_one_replica_is_refused_at_the_other() {
    let env = Env::new().await;
    let redis = Redis::unix(env.path());
    let a = replica(&env, "a", &redis, "").await;
    let b = replica(&env, "b", &redis, "").await;

    let body = append("once");
    let first = run(&a, &body).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.json());
    assert_eq!(app_calls(&env), 1);

    for r in [&b, &a] {
        let replay = run(r, &body).await;
        assert_eq!(replay.status, StatusCode::BAD_REQUEST, "{}", replay.json());
        assert_eq!(code(&replay), "NONCE_REPLAY");
    }
    assert_eq!(app_calls(&env), 1, "a replay reached the app");

    // A fresh nonce goes through at the other replica.
    let other = run(&b, &append("twice")).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.json());
    assert_eq!(app_calls(&env), 2);

    // A forged request with a fresh nonce does not burn that nonce in the shared store.
    let honest = append("forged first");
    let mut forged = honest.clone();
    forged["input"]["text"] = json!("tampered");
    let refused = run(&a, &forged).await;
    assert_eq!(code(&refused), "SKILL_AUTH_FAILED");
    let accepted = run(&b, &honest).await;
    assert_eq!(accepted.status, StatusCode::OK, "{}", accepted.json());

    // Another tool host on the same Redis (its own key prefix) keeps its own nonces.
    let yaml = replica_yaml(&env, "c", &redis.url, "tool-host-c:", "");
    let c = env.start_clocked(&yaml, true, clock()).await;
    let elsewhere = run(&c, &body).await;
    assert_eq!(elsewhere.status, StatusCode::OK, "{}", elsewhere.json());
}

#[tokio::test]
async fn a_rate_limit_holds_across_both_replicas() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::tcp(dir.path());
    let limits = "rate_limits: { per_peer: { per_second: 1, burst: 3 } }";
    let a = replica(&env, "a", &redis, limits).await;
    let b = replica(&env, "b", &redis, limits).await;

    // Three cells in all: two at A, one at B; then both refuse.
    for r in [&a, &b, &a] {
        let ok = run(r, &append("within")).await;
        assert_eq!(ok.status, StatusCode::OK, "{}", ok.json());
    }
    for r in [&b, &a] {
        let refused = run(r, &append("over")).await;
        assert_eq!(
            refused.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            refused.json()
        );
        assert_eq!(code(&refused), "SKILL_HTTP_ERROR");
        assert_eq!(refused.json()["details"]["reason"], "rate_limited");
        assert_eq!(refused.headers["retry-after"], "1");
    }
    assert_eq!(app_calls(&env), 3);
}

#[tokio::test]
async fn when_redis_goes_away_calls_are_refused_until_it_is_back() {
    let env = Env::new().await;
    let mut redis = Redis::unix(env.path());
    let limits = "rate_limits: { per_tool: { per_second: 1000, burst: 1000 } }";
    let a = replica(&env, "a", &redis, limits).await;
    let ok = run(&a, &append("before")).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.json());

    redis.stop();
    for _ in 0..3 {
        let refused = run(&a, &append("during")).await;
        assert_eq!(
            refused.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            refused.json()
        );
        assert_eq!(code(&refused), "SKILL_HTTP_ERROR");
        assert_eq!(refused.headers["retry-after"], "1");
        assert!(
            !refused.json().to_string().contains("redis.sock"),
            "the store's address reached the caller: {}",
            refused.json()
        );
    }
    assert_eq!(app_calls(&env), 1, "a call went through without Redis");

    redis.restart();
    assert!(
        accepted_within_5s(&a).await,
        "calls still refused after Redis came back"
    );
}

#[tokio::test]
async fn a_replica_starts_while_redis_is_down_and_refuses_until_it_is_up() {
    let env = Env::new().await;
    let sock = env.path().join("redis.sock");
    let url = format!("unix://{}", sock.display());
    let yaml = replica_yaml(&env, "a", &url, "p:", "");
    let a = env.start_clocked(&yaml, true, clock()).await;
    let refused = run(&a, &append("early")).await;
    assert_eq!(code(&refused), "SKILL_HTTP_ERROR", "{}", refused.json());
    assert_eq!(app_calls(&env), 0);

    let _redis = Redis::unix(env.path());
    assert!(
        accepted_within_5s(&a).await,
        "calls still refused after Redis came up"
    );
}

/// Send signed calls until one is accepted (at most 5 s); whether one was.
async fn accepted_within_5s(r: &Running) -> bool {
    for _ in 0..100 {
        if run(r, &append("retry")).await.status == StatusCode::OK {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn a_redis_that_may_evict_keys_is_not_trusted_with_nonces() {
    let env = Env::new().await;
    let redis = Redis::unix_with(
        env.path(),
        &["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"],
    );
    let a = replica(&env, "a", &redis, "").await;
    let refused = run(&a, &append("evictable")).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.json()
    );
    assert_eq!(code(&refused), "SKILL_HTTP_ERROR");
    assert_eq!(app_calls(&env), 0);

    assert!(redis
        .cli(&["config", "set", "maxmemory-policy", "noeviction"])
        .starts_with("OK"));
    assert!(
        accepted_within_5s(&a).await,
        "still refused once Redis keeps every key"
    );
}

#[tokio::test]
async fn a_refused_password_is_tried_again_once_redis_takes_it() {
    let env = Env::new().await;
    let redis = Redis::unix_with(env.path(), &["--requirepass", "old-password"]);
    std::fs::write(env.path().join("redis-password"), "new-password\n").unwrap();
    let yaml = replica_yaml(&env, "a", &redis.url, "p:", "").replace(
        "timeout_ms: 200 }",
        &format!(
            "timeout_ms: 200, password: {{ file: {}/redis-password }} }}",
            env.path().display()
        ),
    );
    assert!(yaml.contains("redis-password"));
    let a = env.start_clocked(&yaml, true, clock()).await;
    for _ in 0..4 {
        let refused = run(&a, &append("wrong password")).await;
        assert_eq!(code(&refused), "SKILL_HTTP_ERROR", "{}", refused.json());
    }
    assert_eq!(app_calls(&env), 0);

    // The operator rotates Redis' password to the one carapace was given.
    assert!(redis
        .cli(&["config", "set", "requirepass", "new-password"])
        .starts_with("OK"));
    assert!(
        accepted_within_5s(&a).await,
        "never reconnected with the password"
    );
}

#[tokio::test]
async fn a_keyed_call_runs_once_across_both_replicas() {
    let env = Env::new().await;
    let redis = Redis::unix(env.path());
    let a = replica(&env, "a", &redis, "").await;
    let b = replica(&env, "b", &redis, "").await;
    let key = [("Idempotency-Key", "order-7")];
    // 20 identical calls (each signed with its own nonce), at both replicas at once.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..20 {
        let address = if i % 2 == 0 { &a } else { &b }.tcp_address.unwrap();
        let body = append("once only");
        set.spawn(async move {
            Client::new(Transport::Tcp(address))
                .send(Method::POST, "/run", &key, body.to_string())
                .await
                .unwrap()
        });
    }
    let mut outputs = Vec::new();
    while let Some(r) = set.join_next().await {
        let r = r.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.json());
        outputs.push(r.json()["output"].clone());
    }
    assert_eq!(app_calls(&env), 1, "a repeat reached the app");
    assert!(
        outputs.iter().all(|o| *o == outputs[0] && !o.is_null()),
        "{outputs:?}"
    );

    // The same key with other arguments is refused, at either replica, before the app.
    let other = Client::new(Transport::Tcp(b.tcp_address.unwrap()))
        .send(
            Method::POST,
            "/run",
            &key,
            append("something else").to_string(),
        )
        .await
        .unwrap();
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        other.json()
    );
    assert_eq!(code(&other), "SCHEMA_VALIDATION_FAILED");
    assert!(
        other.json().to_string().contains("idempotency_conflict"),
        "{}",
        other.json()
    );
    assert_eq!(app_calls(&env), 1);
}
