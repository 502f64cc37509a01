//! The skill-v1 front: the Vagus vectors, failed checks, replay, key rotation, API keys, a
//! restart, the bounded nonce store, the manifest and the front's own error codes.

use super::*;

// ---------------------------------------------------------------------------------------------
// 1. The Vagus wire vectors, end to end.

/// The Vagus vectors carapace refuses on purpose: id, status, error code.
const REFUSED_VECTORS: [(&str, StatusCode, &str); 4] = [
    // The body is not valid Unicode.
    (
        "v14_lone_surrogate",
        StatusCode::BAD_REQUEST,
        "SCHEMA_VALIDATION_FAILED",
    ),
    // A `__proto__` member is not covered by the signature.
    (
        "v28_proto_key_nested_object",
        StatusCode::UNAUTHORIZED,
        "SKILL_AUTH_FAILED",
    ),
    (
        "v29_proto_key_primitive",
        StatusCode::UNAUTHORIZED,
        "SKILL_AUTH_FAILED",
    ),
    // Empty secrets cannot be configured, and the configured keys do not match.
    (
        "v35_empty_secret",
        StatusCode::UNAUTHORIZED,
        "SKILL_AUTH_FAILED",
    ),
];

#[tokio::test]
async fn every_vagus_wire_vector_is_accepted_except_the_documented_refusals() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/vectors/vagus/canonical_hmac_vectors.json");
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vectors = file["vectors"].as_array().unwrap();
    assert_eq!(vectors.len(), 38);

    let env = Env::new().await;
    let mut secrets: Vec<&str> = vectors
        .iter()
        .map(|v| v["secret"].as_str().unwrap())
        .filter(|s| !s.is_empty())
        .collect();
    secrets.sort();
    secrets.dedup();
    let keys: Vec<PathBuf> = secrets
        .iter()
        .enumerate()
        .map(|(i, s)| secret_file(env.path(), &format!("secret{i}"), s.as_bytes()))
        .collect();
    let auth = auth_yaml("hmac", &keys, ", nonce_capacity: 16");

    let mut accepted = 0;
    for (i, v) in vectors.iter().enumerate() {
        let id = v["id"].as_str().unwrap();
        let fields = &v["request_fields"];
        let wire = v["wire_body"].as_str().unwrap();
        let sig = v["signature_hex"].as_str().unwrap();
        // A fresh carapace per vector: they share one nonce.
        let (app, addr) = EchoApp::start(fields["capability"].as_str().unwrap()).await;
        let yaml = front_yaml(
            &env.path().join(format!("s{i}")),
            fields["skill_id"].as_str().unwrap(),
            &auth,
            addr,
        );
        let (_, clock) = clock_at(fields["timestamp"].as_u64().unwrap());
        let r = env.start_clocked(&yaml, true, clock).await;

        if let Some(&(_, status, error_code)) = REFUSED_VECTORS.iter().find(|r| r.0 == id) {
            let reply = run(&r, &[("X-Skill-Signature", sig)], wire.to_string()).await;
            assert_refused(&reply, status, error_code);
            assert!(app.received().is_empty(), "{id} reached the app");
        } else {
            // A tampered copy first: refused, and it does not burn the nonce.
            let bad = tamper(sig);
            let tampered = wire.replace(
                &format!(r#""signature":"{sig}""#),
                &format!(r#""signature":"{bad}""#),
            );
            assert_ne!(tampered, wire, "{id}");
            let reply = run(&r, &[("X-Skill-Signature", &bad)], tampered).await;
            assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
            assert!(app.received().is_empty(), "tampered {id} reached the app");

            let reply = run(&r, &[("X-Skill-Signature", sig)], wire.to_string()).await;
            assert_ok(&reply);
            let input = serde_json::from_str::<Value>(wire).unwrap()["input"].clone();
            assert_eq!(reply.json()["output"], json!({ "echo": input }), "{id}");
            let seen = app.received();
            assert_eq!(seen.len(), 1, "{id}");
            assert_eq!(seen[0]["tool_name"], fields["capability"], "{id}");
            assert_eq!(seen[0]["args"], input, "{id}");
            accepted += 1;
        }
        r.shutdown().await;
    }
    assert_eq!(accepted, 34);
}

// ---------------------------------------------------------------------------------------------
// 2. Failed checks.

#[tokio::test]
async fn requests_failing_a_check_never_reach_the_app() {
    let env = Env::new().await;
    let (r, _) = hmac_front(&env, "").await;
    let refused = |reply: Reply, status: StatusCode, error_code: &'static str| {
        assert_refused(&reply, status, error_code);
        assert!(
            env.app.received().is_empty(),
            "{error_code} reached the app"
        );
        reply
    };

    // Signed with another secret.
    let body = append(b"not-the-secret", "a", NOW);
    refused(
        run_signed(&r, &body).await,
        StatusCode::UNAUTHORIZED,
        "SKILL_AUTH_FAILED",
    );

    // A correct body signature, another one in the header.
    let body = append(SECRET, "a", NOW);
    let other = "00".repeat(32);
    let reply = run(&r, &[("X-Skill-Signature", &other)], body.to_string()).await;
    refused(reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");

    // The signature header twice (the right value first): which one would be checked?
    let body = append(SECRET, "a", NOW);
    let sig = body["signature"].as_str().unwrap().to_string();
    let reply = run(
        &r,
        &[("X-Skill-Signature", &sig), ("X-Skill-Signature", &other)],
        body.to_string(),
    )
    .await;
    refused(reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
    let reply = run(
        &r,
        &[("X-Skill-Signature", &sig), ("X-Skill-Signature", &sig)],
        body.to_string(),
    )
    .await;
    refused(reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");

    // No signature at all.
    let mut body = append(SECRET, "a", NOW);
    body.as_object_mut().unwrap().remove("signature");
    refused(
        run(&r, &[], body.to_string()).await,
        StatusCode::UNAUTHORIZED,
        "SKILL_AUTH_FAILED",
    );

    // A wrong method on a known route.
    let reply = Client::new(Transport::Tcp(r.tcp_address.unwrap()))
        .send(Method::GET, "/run", &[], "")
        .await
        .unwrap();
    refused(reply, StatusCode::METHOD_NOT_ALLOWED, "ROUTING_FAILED");

    // Outside the ±120 s window, either way.
    for ts in [NOW - 121_000, NOW + 121_000] {
        let reply = refused(
            run_signed(&r, &append(SECRET, "a", ts)).await,
            StatusCode::BAD_REQUEST,
            "NONCE_REPLAY",
        );
        let message = reply.json()["message"].as_str().unwrap().to_string();
        assert!(message.contains("window"), "{message}");
    }

    // A top-level field the signature does not cover.
    let mut body = append(SECRET, "a", NOW);
    body["debug"] = json!(true);
    refused(
        run_signed(&r, &body).await,
        StatusCode::UNAUTHORIZED,
        "SKILL_AUTH_FAILED",
    );

    // Another protocol version, correctly signed.
    let mut body = append(SECRET, "a", NOW);
    body["gateway_protocol_version"] = json!("2.0");
    resign(SECRET, &mut body);
    refused(
        run_signed(&r, &body).await,
        StatusCode::BAD_REQUEST,
        "PROTOCOL_VERSION_UNSUPPORTED",
    );

    // Another skill.
    let mut body = append(SECRET, "a", NOW);
    body["skill_id"] = json!("other.skill");
    resign(SECRET, &mut body);
    refused(
        run_signed(&r, &body).await,
        StatusCode::NOT_FOUND,
        "ROUTING_FAILED",
    );

    // A capability the app does not have.
    let mut body = append(SECRET, "a", NOW);
    body["capability"] = json!("memory.drop_all");
    resign(SECRET, &mut body);
    refused(
        run_signed(&r, &body).await,
        StatusCode::NOT_FOUND,
        "ROUTING_FAILED",
    );

    // Input breaking the tool's schema.
    let mut body = append(SECRET, "a", NOW);
    body["input"] = json!({"text": 5});
    resign(SECRET, &mut body);
    let reply = refused(
        run_signed(&r, &body).await,
        StatusCode::BAD_REQUEST,
        "SCHEMA_VALIDATION_FAILED",
    );
    let violations = &reply.json()["details"]["violations"];
    assert!(
        violations.as_array().is_some_and(|v| !v.is_empty()),
        "{}",
        reply.json()
    );

    // A duplicate member: which value would have been verified?
    let body = append(SECRET, "a", NOW);
    let sig = body["signature"].as_str().unwrap();
    let text = body.to_string();
    let duplicated = text.replace(
        r#""input":{"text":"a"}"#,
        r#""input":{"text":"a","text":"b"}"#,
    );
    assert_ne!(duplicated, text);
    refused(
        run(&r, &[("X-Skill-Signature", sig)], duplicated).await,
        StatusCode::BAD_REQUEST,
        "SCHEMA_VALIDATION_FAILED",
    );

    // An integer beyond 2^53 where a signed one was: JS would sign both as the same double,
    // so the body the app would read is not the one that was signed.
    let mut body = append(SECRET, "a", NOW);
    body["input"] = json!({"text": "a", "n": 9_007_199_254_740_992_u64});
    resign(SECRET, &mut body);
    let sig = body["signature"].as_str().unwrap().to_string();
    let text = body.to_string();
    let swapped = text.replace("9007199254740992", "9007199254740993");
    assert_ne!(swapped, text);
    refused(
        run(&r, &[("X-Skill-Signature", &sig)], swapped).await,
        StatusCode::BAD_REQUEST,
        "SCHEMA_VALIDATION_FAILED",
    );
    // A number literal no double needs.
    let long = format!("0.{}1", "0".repeat(60));
    let padded = text.replace("9007199254740992", &long);
    refused(
        run(&r, &[("X-Skill-Signature", &sig)], padded).await,
        StatusCode::BAD_REQUEST,
        "SCHEMA_VALIDATION_FAILED",
    );

    // Inside the window (119 s late): accepted and forwarded.
    let reply = run_signed(&r, &append(SECRET, "late", NOW - 119_000)).await;
    assert_ok(&reply);
    let seen = env.app.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body["args"], json!({"text": "late"}));
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 3. Replay.

#[tokio::test]
async fn a_replayed_request_is_refused_and_a_forged_one_does_not_burn_its_nonce() {
    let env = Env::new().await;
    let (r, _) = hmac_front(&env, "").await;

    let body = append(SECRET, "once", NOW);
    assert_ok(&run_signed(&r, &body).await);
    let reply = run_signed(&r, &body).await;
    assert_refused(&reply, StatusCode::BAD_REQUEST, "NONCE_REPLAY");
    assert_eq!(env.app.received().len(), 1);

    // A forgery carrying nonce N is refused without recording N...
    let honest = append(SECRET, "honest", NOW);
    let mut forged = honest.clone();
    forged["input"] = json!({"text": "forged"});
    let reply = run_signed(&r, &forged).await;
    assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
    assert_eq!(env.app.received().len(), 1);
    // ...so the honest request with N still goes through.
    assert_ok(&run_signed(&r, &honest).await);
    let seen = env.app.received();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].body["args"], json!({"text": "honest"}));
    r.shutdown().await;
}

/// Forged calls (anyone can send one: no key is needed) spend no cell of the tool's rate
/// limit: the limit is taken once the signature verified, so the callers who sign keep it.
#[tokio::test]
async fn forged_calls_do_not_use_up_a_tools_rate_limit() {
    let env = Env::new().await;
    let key = secret_file(env.path(), "k0", SECRET);
    let yaml = front_yaml(
        &env.path().join("state"),
        SKILL,
        &auth_yaml("hmac", &[key], ""),
        env.app_addr,
    ) + "rate_limits: { tools: { memory.append: { per_minute: 2, burst: 2 } } }\n";
    let (_, clock) = clock_at(NOW);
    let r = env.start_clocked(&yaml, true, clock).await;
    for n in 0..5 {
        let mut forged = append(SECRET, &format!("forged {n}"), NOW);
        forged["signature"] = json!(tamper(forged["signature"].as_str().unwrap()));
        let reply = run_signed(&r, &forged).await;
        assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
    }
    for text in ["first", "second"] {
        assert_ok(&run_signed(&r, &append(SECRET, text, NOW)).await);
    }
    // The limit itself still holds for signed calls.
    let reply = run_signed(&r, &append(SECRET, "third", NOW)).await;
    assert_refused(&reply, StatusCode::TOO_MANY_REQUESTS, "SKILL_HTTP_ERROR");
    assert_eq!(reply.json()["details"]["scope"], "tool");
    assert_eq!(env.app.received().len(), 2);
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 4. Key rotation.

#[tokio::test]
async fn every_configured_key_is_accepted_and_an_unknown_one_is_not() {
    let env = Env::new().await;
    let keys = [
        secret_file(env.path(), "old", b"old-secret"),
        secret_file(env.path(), "new", b"new-secret"),
    ];
    let yaml = front_yaml(
        &env.path().join("state"),
        SKILL,
        &auth_yaml("hmac", &keys, ""),
        env.app_addr,
    );
    let (_, clock) = clock_at(NOW);
    let r = env.start_clocked(&yaml, true, clock).await;

    assert_ok(&run_signed(&r, &append(b"old-secret", "old", NOW)).await);
    assert_ok(&run_signed(&r, &append(b"new-secret", "new", NOW)).await);
    let reply = run_signed(&r, &append(b"retired-secret", "retired", NOW)).await;
    assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");

    let texts: Vec<Value> = env
        .app
        .received()
        .iter()
        .map(|c| c.body["args"]["text"].clone())
        .collect();
    assert_eq!(texts, [json!("old"), json!("new")]);
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 5. API key mode.

/// A `/run` body as Vagus sends it in api_key mode: the signature is the literal `api_key`.
fn api_key_run(text: &str) -> String {
    let mut body = append(SECRET, text, NOW);
    body["signature"] = json!("api_key");
    body.to_string()
}

#[tokio::test]
async fn api_key_mode_checks_the_key_header() {
    let env = Env::new().await;
    let key = secret_file(env.path(), "api", b"the-api-key");
    let (_, clock) = clock_at(NOW);

    let yaml = front_yaml(
        &env.path().join("state"),
        SKILL,
        &auth_yaml("api_key", std::slice::from_ref(&key), ""),
        env.app_addr,
    );
    let r = env.start_clocked(&yaml, true, clock.clone()).await;
    assert_ok(&run(&r, &[("X-API-Key", "the-api-key")], api_key_run("right")).await);
    let reply = run(&r, &[("X-API-Key", "the-api-kex")], api_key_run("wrong")).await;
    assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
    let reply = run(&r, &[], api_key_run("missing")).await;
    assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
    r.shutdown().await;
    assert_eq!(env.app.received().len(), 1);

    // A custom header name: the key is read there and nowhere else.
    let yaml = front_yaml(
        &env.path().join("state2"),
        SKILL,
        &auth_yaml("api_key", &[key], ", header_name: X-Skill-Key"),
        env.app_addr,
    );
    let r = env.start_clocked(&yaml, true, clock).await;
    let reply = run(&r, &[("X-API-Key", "the-api-key")], api_key_run("default")).await;
    assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
    assert_ok(&run(&r, &[("X-Skill-Key", "the-api-key")], api_key_run("custom")).await);
    r.shutdown().await;

    let texts: Vec<Value> = env
        .app
        .received()
        .iter()
        .map(|c| c.body["args"]["text"].clone())
        .collect();
    assert_eq!(texts, [json!("right"), json!("custom")]);
}

// ---------------------------------------------------------------------------------------------
// 6. Restart.

#[tokio::test]
async fn a_restart_does_not_reopen_the_replay_window() {
    let env = Env::new().await;
    let (r, _) = hmac_front(&env, "").await;
    let body = append(SECRET, "once", NOW);
    assert_ok(&run_signed(&r, &body).await);
    r.shutdown().await;

    // The same configuration, state directory and time.
    let (r, _) = hmac_front(&env, "").await;
    let reply = run_signed(&r, &body).await;
    assert_refused(&reply, StatusCode::BAD_REQUEST, "NONCE_REPLAY");
    assert_eq!(env.app.received().len(), 1);
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 7. The bounded nonce store.

#[tokio::test]
async fn a_full_nonce_store_refuses_new_requests_and_forgets_no_live_nonce() {
    let env = Env::new().await;
    let (r, now) = hmac_front(
        &env,
        ", timestamp_skew_s: 60, nonce_ttl_s: 120, nonce_capacity: 2",
    )
    .await;

    let first = append(SECRET, "1", NOW);
    let second = append(SECRET, "2", NOW);
    assert_ok(&run_signed(&r, &first).await);
    assert_ok(&run_signed(&r, &second).await);

    let reply = run_signed(&r, &append(SECRET, "3", NOW)).await;
    assert_refused(&reply, StatusCode::SERVICE_UNAVAILABLE, "SKILL_HTTP_ERROR");
    let retry_after: u64 = reply.headers[http::header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=120).contains(&retry_after), "{retry_after}");

    // The accepted nonces were not evicted to make room.
    for body in [&first, &second] {
        let reply = run_signed(&r, body).await;
        assert_refused(&reply, StatusCode::BAD_REQUEST, "NONCE_REPLAY");
    }
    assert_eq!(env.app.received().len(), 2);

    // Once the TTL has passed there is room again.
    let later = NOW + 121_000;
    now.store(later, Ordering::SeqCst);
    assert_ok(&run_signed(&r, &append(SECRET, "4", later)).await);
    let seen = env.app.received();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[2].body["args"], json!({"text": "4"}));
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 8. Manifest.

#[tokio::test]
async fn the_manifest_lists_the_apps_tools_as_capabilities() {
    let env = Env::new().await;
    let (r, _) = hmac_front(&env, "").await;
    let reply = Client::new(Transport::Tcp(r.tcp_address.unwrap()))
        .send(Method::GET, "/manifest", &[], "")
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    let m = reply.json();
    assert_eq!(m["id"], SKILL);
    assert_eq!(m["gateway_protocol_version"], "1.0");
    assert_eq!(m["requires"]["auth"], "hmac-sha256");
    let catalog = carapace::memory_app::catalog();
    let expected: Vec<Value> = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            json!({
                "capability": t["name"],
                "description": t["description"],
                "input_schema": t["input_schema"],
                "output_schema": t["output_schema"],
            })
        })
        .collect();
    let mut caps = m["capabilities"].as_array().unwrap().clone();
    caps.sort_by_key(|c| c["capability"].to_string());
    let mut expected = expected;
    expected.sort_by_key(|c| c["capability"].to_string());
    assert_eq!(caps, expected);
    assert!(env.app.received().is_empty());
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// The skill-v1 front's own names for timeouts and app HTTP failures.

#[tokio::test]
async fn a_slow_or_failing_app_gets_the_skill_v1_codes() {
    let env = Env::new().await;
    let key = secret_file(env.path(), "k0", SECRET);
    let yaml = front_yaml(
        &env.path().join("state"),
        SKILL,
        &auth_yaml("hmac", &[key], ""),
        env.app_addr,
    ) + "tools: { memory.query: { timeout_ms_max: 200 } }\n";
    let (_now, clock) = clock_at(NOW);
    let r = env.start_clocked(&yaml, true, clock).await;

    let slow = signed_run(
        SECRET,
        SKILL,
        "memory.query",
        json!({"query": "x", "delay_ms": 10000}),
        NOW,
        &nonce(),
    );
    let reply = run_signed(&r, &slow).await;
    assert_refused(&reply, StatusCode::GATEWAY_TIMEOUT, "SKILL_TIMEOUT");
    assert_eq!(reply.json()["details"]["timeout_ms"], 200);
    wait_until(|| env.app.abandoned() == 1).await;

    env.app
        .set_fault(Some(carapace::memory_app::Fault::Status(500)));
    let reply = run_signed(&r, &append(SECRET, "x", NOW)).await;
    assert_refused(&reply, StatusCode::BAD_GATEWAY, "SKILL_HTTP_ERROR");
    assert_eq!(env.app.received().len(), 2);
    r.shutdown().await;
}
