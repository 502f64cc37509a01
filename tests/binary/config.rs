//! `carapace check` and `carapace config-schema`.

use super::*;

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
