//! `carapace demo`, `carapace peers`, `carapace pair-tool` between two processes, and the sample app.

use super::*;

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

/// `-c` reads only the admin socket's path: an operator's shell without the secrets the
/// file names (here an environment variable only the server has) still runs the commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands_with_c_need_none_of_the_files_secrets() {
    let env = Env::new().await;
    let cfg = env.path().join("carapace.yaml");
    let guarded = "secret_guard: { values: [ { env: CARAPACE_TEST_GUARDED } ] }";
    std::fs::write(&cfg, tools_config(&env, guarded)).unwrap();
    let cfg_s = path_str(&cfg).to_string();
    let log = env.path().join("carapace.log");
    let mut srv = Serve::spawn(&cfg, &log, &[("CARAPACE_TEST_GUARDED", "s3cr3t-value")]);
    wait_serving(&sock(&env), "/v1/tools", "memory.query").await;
    let out = run(&["kill-switch", "status", "-c", &cfg_s], &[]).await;
    assert_eq!(out.code(), Some(0), "{out:?}");
    let out = run(&["peers", "list", "-c", &cfg_s], &[]).await;
    assert_eq!(out.code(), Some(0), "{out:?}");
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
