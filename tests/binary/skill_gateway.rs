//! The Skill Gateway v1 log markers.

use super::*;

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
