//! The skill-v1 back: a legacy `/run` skill served as tools-v1 tools, the manifests it refuses,
//! its outputs checked against their schemas and the capabilities the registry names.

use super::*;

// ---------------------------------------------------------------------------------------------
// 9. The skill-v1 back.

/// What carapace sent the skill must be a fresh, signed `/run` for `demo.echo` with `input`.
fn assert_signed_run(headers: &http::HeaderMap, body: &Value, input: Value) {
    assert_eq!(body["gateway_protocol_version"], "1.0");
    assert_eq!(body["skill_id"], SKILL);
    assert_eq!(body["capability"], SKILL);
    assert_eq!(body["input"], input);
    let ts = body["timestamp"].as_u64().expect("timestamp in ms");
    assert!(
        ts.abs_diff(carapace_filters::unix_now_ms()) < 60_000,
        "{ts}"
    );
    let nonce = body["nonce"].as_str().unwrap();
    assert!(
        nonce.len() == 32
            && nonce
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
        "{nonce}"
    );
    let sig = body["signature"].as_str().unwrap();
    let mut unsigned = body.clone();
    unsigned.as_object_mut().unwrap().remove("signature");
    let canonical = canonical_string(&unsigned).unwrap();
    assert!(verify_hmac_sha256_hex(SECRET, canonical.as_bytes(), sig));
    assert_eq!(headers["x-skill-signature"], sig);
    assert_eq!(
        headers
            .get_all("x-carapace-peer-id")
            .iter()
            .collect::<Vec<_>>(),
        ["gw_test"]
    );
}

#[tokio::test]
async fn a_legacy_skill_is_served_as_a_tools_v1_tool_for_both_manifest_shapes() {
    for manifest in [SkillApp::vagus_manifest(), SkillApp::text_manifest()] {
        let env = Env::new().await;
        let (skill, addr) = SkillApp::start(SECRET, manifest.clone()).await;
        let secret = secret_file(env.path(), "skill-secret", SECRET);
        let r = env.start(&back_yaml(&env, addr, &secret)).await;
        let gw = env.gateway(&r);

        let reply = gw.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        let tools = reply.json()["tools"].as_array().unwrap().clone();
        assert_eq!(tools.len(), 1, "{tools:?}");
        assert_eq!(tools[0]["name"], SKILL);
        let input_schema = match &manifest["input_schema"] {
            Value::Null => manifest["capabilities"][0]["input_schema"].clone(),
            s => s.clone(),
        };
        assert_eq!(tools[0]["input_schema"], input_schema);

        let reply = gw
            .post_json(
                "/v1/tools/call",
                &[],
                &call(SKILL, json!({"message": "hi"})),
            )
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert_eq!(reply.json()["status"], "ok");
        assert_eq!(reply.json()["result"], json!({"result": "echo:hi"}));
        {
            let seen = skill.received.lock().unwrap();
            assert_eq!(seen.len(), 1);
            assert_signed_run(&seen[0].0, &seen[0].1, json!({"message": "hi"}));
        }

        // Bad arguments never reach the skill.
        let reply = gw
            .post_json("/v1/tools/call", &[], &call(SKILL, json!({"message": 5})))
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert_eq!(code(&reply), "INVALID_ARGS");
        assert_eq!(reply.json()["error"]["details"]["reason"], "input_schema");
        assert_eq!(skill.received.lock().unwrap().len(), 1);

        // The skill's own error is passed on.
        *skill.answer.lock().unwrap() = Some((
            200,
            json!({"ok": false, "error_code": "WORKER_BUSY", "message": "busy"}),
        ));
        let reply = gw
            .post_json(
                "/v1/tools/call",
                &[],
                &call(SKILL, json!({"message": "hi"})),
            )
            .await
            .unwrap();
        assert_eq!(reply.json()["status"], "error", "{}", reply.json());
        assert_eq!(code(&reply), "WORKER_BUSY");

        // Output breaking the output schema is withheld.
        *skill.answer.lock().unwrap() = Some((200, json!({"ok": true, "output": {"wrong": 1}})));
        let reply = gw
            .post_json(
                "/v1/tools/call",
                &[],
                &call(SKILL, json!({"message": "hi"})),
            )
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert_eq!(code(&reply), "DEPENDENCY_UNAVAILABLE");
        assert_eq!(reply.json()["error"]["details"]["reason"], "output_schema");
        assert!(reply.json().get("result").is_none(), "{}", reply.json());
        assert!(
            !String::from_utf8_lossy(&reply.body).contains(r#""wrong":1"#),
            "{}",
            reply.json()
        );
        assert_eq!(skill.received.lock().unwrap().len(), 3);
        r.shutdown().await;

        // With the wrong secret, the skill answers 401: that is carapace's misconfiguration,
        // not the caller's failed authentication, so the caller gets a dependency failure
        // (as the Vagus client turns any non-2xx into an HTTP error) and no result.
        *skill.answer.lock().unwrap() = None;
        let wrong = secret_file(env.path(), "wrong-secret", b"not-the-skill-secret");
        let r = env.start(&back_yaml(&env, addr, &wrong)).await;
        let reply = env
            .gateway(&r)
            .post_json(
                "/v1/tools/call",
                &[],
                &call(SKILL, json!({"message": "hi"})),
            )
            .await
            .unwrap();
        let body = reply.json();
        assert_eq!(reply.status, StatusCode::OK, "{body}");
        assert_eq!(body["status"], "error", "{body}");
        assert_eq!(code(&reply), "DEPENDENCY_UNAVAILABLE", "{body}");
        assert_eq!(body["error"]["details"]["status"], 401, "{body}");
        assert!(body.get("result").is_none(), "{body}");
        assert_eq!(skill.received.lock().unwrap().len(), 4);
        r.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// 10. Discovery failures.

#[tokio::test]
async fn a_skill_with_an_unacceptable_manifest_never_becomes_ready() {
    let mut wrong_version = SkillApp::vagus_manifest();
    wrong_version["gateway_protocol_version"] = json!("2.0");
    let mut wrong_id = SkillApp::vagus_manifest();
    wrong_id["id"] = json!("other.skill");

    for manifest in [wrong_version, wrong_id] {
        let env = Env::new().await;
        let (skill, addr) = SkillApp::start(SECRET, manifest).await;
        let secret = secret_file(env.path(), "skill-secret", SECRET);
        let r = env.start_with(&back_yaml(&env, addr, &secret), false).await;
        // Wait until discovery has been tried and failed, then check readiness.
        wait_until(|| {
            r.shared
                .metrics
                .encode()
                .contains(r#"discoveries_total{result="failed"}"#)
        })
        .await;
        assert!(!r.shared.ready());
        let readyz = env
            .ops(&r)
            .send(Method::GET, "/readyz", &[], "")
            .await
            .unwrap();
        assert_eq!(readyz.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(readyz.json()["ready"], false);

        let reply = env
            .gateway(&r)
            .post_json(
                "/v1/tools/call",
                &[],
                &call(SKILL, json!({"message": "hi"})),
            )
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert_eq!(code(&reply), "DEPENDENCY_UNAVAILABLE");
        assert_eq!(reply.json()["status"], "retryable_error");
        assert!(skill.received.lock().unwrap().is_empty());
        assert!(!r.shared.ready());
        r.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// An output withheld for breaking its schema must not come back inside the violation messages.

#[tokio::test]
async fn values_of_a_withheld_output_do_not_reach_the_caller() {
    let env = Env::new().await;
    let (skill, addr) = SkillApp::start(SECRET, SkillApp::vagus_manifest()).await;
    let secret = secret_file(env.path(), "skill-secret", SECRET);
    let r = env.start(&back_yaml(&env, addr, &secret)).await;
    // `result` must be a string; the skill puts an object holding a credential there.
    *skill.answer.lock().unwrap() = Some((
        200,
        json!({"ok": true, "output": {"result": {"api_key": "sk-live-5ecret"}}}),
    ));
    let reply = env
        .gateway(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &call(SKILL, json!({"message": "hi"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(code(&reply), "DEPENDENCY_UNAVAILABLE");
    assert_eq!(skill.received.lock().unwrap().len(), 1);
    assert!(
        !String::from_utf8_lossy(&reply.body).contains("sk-live-5ecret"),
        "withheld output reached the caller: {}",
        reply.json()
    );
    r.shutdown().await;
}

/// The local registry names the capabilities served: one the manifest adds is never served,
/// and the log says why.
#[tokio::test]
async fn a_capability_the_registry_does_not_name_is_never_served() {
    let env = Env::new().await;
    let mut manifest = SkillApp::vagus_manifest();
    let mut extra = manifest["capabilities"][0].clone();
    extra["capability"] = json!("demo.admin");
    manifest["capabilities"].as_array_mut().unwrap().push(extra);
    let (skill, addr) = SkillApp::start(SECRET, manifest).await;
    let secret = secret_file(env.path(), "skill-secret", SECRET);
    let r = env.start(&back_yaml(&env, addr, &secret)).await;
    let gw = env.gateway(&r);
    let list = gw.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
    let names: Vec<String> = list.json()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, [SKILL]);
    let reply = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("demo.admin", json!({"message": "hi"})),
        )
        .await
        .unwrap();
    assert_eq!(code(&reply), "TOOL_NOT_FOUND", "{}", reply.json());
    assert!(skill.received.lock().unwrap().is_empty());
    r.shutdown().await;
}
