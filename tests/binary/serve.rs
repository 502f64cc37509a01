//! `carapace serve`: a bad config, reload, drain, the nonce journal across a kill, secrets in logs, the kill-switch.

use super::*;

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
