//! The secret guard on the tool-host side: the sample memory app hands back a stored private key
//! (and a value carapace holds as a secret); with `secret_guard.inbound: enforce` the caller gets
//! it redacted, or the call refused for a tool set to `refuse`, and the log names the detector
//! and the path, never any part of the value. One test in this binary: it owns the process's
//! log subscriber.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::{call, code, Env};
use serde_json::json;

const KEY_BODY: &str = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7";

/// Everything logged, for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_result_holding_a_private_key_is_redacted_or_refused_and_never_logged() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter("carapace=debug,carapace_filters=debug")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();

    let env = Env::new().await;
    let secret_file = env.path().join("deploy.secret");
    std::fs::write(&secret_file, "correct-horse-battery-staple\n").unwrap();
    let guard = format!(
        "secret_guard: {{ inbound: enforce, tools: {{ memory.delete: refuse }}, values: [{{ file: {} }}] }}",
        secret_file.display()
    );
    let r = env.start(&env.tools_yaml(&guard)).await;
    let local = env.local(&r);
    let key = format!("-----BEGIN PRIVATE KEY-----\n{KEY_BODY}\n-----END PRIVATE KEY-----");
    for text in [
        format!("deploy key {key}"),
        "deploy password correct-horse-battery-staple".to_string(),
    ] {
        let stored = local
            .post_json(
                "/v1/tools/call",
                &[],
                &call("memory.append", json!({ "text": text })),
            )
            .await
            .unwrap();
        assert_eq!(stored.json()["status"], "ok", "{:?}", stored.json());
    }

    let query = call("memory.query", json!({"query": "deploy"}));
    let answer = local
        .post_json("/v1/tools/call", &[], &query)
        .await
        .unwrap();
    assert_eq!(answer.json()["status"], "ok", "{:?}", answer.json());
    let body = String::from_utf8_lossy(&answer.body).into_owned();
    assert!(
        !body.contains(KEY_BODY) && !body.contains("BEGIN PRIVATE KEY"),
        "{body}"
    );
    assert!(!body.contains("correct-horse"), "{body}");
    assert!(body.contains("[REDACTED:private_key]"), "{body}");
    assert!(body.contains("[REDACTED:value_0]"), "{body}");

    // The app's own answer to `memory.delete` never holds a key; a tool set to `refuse`
    // whose result would is refused. Here: refuse `memory.query` through a second carapace.
    r.shutdown().await;
    let guard = format!(
        "secret_guard: {{ inbound: enforce, tools: {{ memory.query: refuse }}, values: [{{ file: {} }}] }}",
        secret_file.display()
    );
    let r = env.start(&env.tools_yaml(&guard)).await;
    let refused = env
        .local(&r)
        .post_json("/v1/tools/call", &[], &query)
        .await
        .unwrap();
    assert_eq!(code(&refused), "FORBIDDEN", "{:?}", refused.json());
    let body = String::from_utf8_lossy(&refused.body).into_owned();
    assert!(
        !body.contains(KEY_BODY) && !body.contains("correct-horse"),
        "{body}"
    );
    r.shutdown().await;

    let logged = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(
        logged.contains("secret_detected role=inbound tool=memory.query detector=private_key path=/output/matches/"),
        "{logged}"
    );
    assert!(logged.contains("action=refused"), "{logged}");
    assert!(!logged.contains(KEY_BODY), "the log holds part of the key");
    assert!(
        !logged.contains("correct-horse"),
        "the log holds part of the secret"
    );
}
