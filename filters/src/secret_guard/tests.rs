use super::*;
use crate::call::testing::{call, tool};
use crate::call::ServerContent;
use serde_json::json;
use tower::ServiceExt;

const KEY: &str =
    "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----";

fn guard(mode: GuardMode, action: GuardAction) -> Arc<SecretGuard> {
    let mut tools = HashMap::new();
    tools.insert("strict".to_string(), GuardAction::Refuse);
    Arc::new(SecretGuard::new(
        Detectors::new(&[], vec![("app_secret".into(), "hunter2-hunter2".into())]).unwrap(),
        mode,
        action,
        tools,
        "inbound",
    ))
}

async fn through(
    g: Arc<SecretGuard>,
    scanned: Scanned,
    name: &str,
    outcome: CallOutcome,
) -> (Result<CallOutcome, Rejection>, Value) {
    let seen = Arc::new(std::sync::Mutex::new(Value::Null));
    let s = seen.clone();
    let svc = SecretGuardLayer::new(g, scanned).layer(tower::service_fn(move |c: ToolCall| {
        *s.lock().unwrap() = c.args.clone();
        let o = outcome.clone();
        async move { Ok::<_, Rejection>(o) }
    }));
    let mut c = call(tool(name, 1000, 1000), None);
    c.args = json!({"token": "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB", "n": 1});
    let r = svc.oneshot(c).await;
    let args = seen.lock().unwrap().clone();
    (r, args)
}

/// Found by the fuzzer: redacting `tok_…` put a word boundary after an AWS key id that
/// had none, so a second scan found it.
#[test]
fn a_credential_completed_by_a_redaction_is_redacted_too() {
    let g = SecretGuard::new(
        Detectors::new(&["tok_[a-z0-9]{8}".to_string()], vec![]).unwrap(),
        GuardMode::Enforce,
        GuardAction::Redact,
        HashMap::new(),
        "inbound",
    );
    let mut v = json!("key AKIAIOSFODNN7EXAMPF0tok_abcd1234 here");
    let found = g.scan(&mut v, "", true);
    assert_eq!(
        v,
        json!("key [REDACTED:aws_access_key_id][REDACTED:pattern_0] here")
    );
    assert_eq!(found.len(), 2);
    assert!(g.scan(&mut v, "", false).is_empty());
}

/// A finding names its place as a JSON pointer: members escaped (`~` as `~0`, `/` as
/// `~1`), array items by index, from the part's own name.
#[test]
fn a_findings_path_is_the_json_pointer_of_its_string() {
    let g = guard(GuardMode::Enforce, GuardAction::Redact);
    let mut v = json!({"ok": ["x", {"a/b~c": ["fine", "hunter2-hunter2"]}], "z": 1});
    let found = g.scan(&mut v, "/output", true);
    let paths: Vec<&str> = found.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["/output/ok/1/a~1b~0c/1"]);
    assert_eq!(v["ok"][1]["a/b~c"][1], json!("[REDACTED:app_secret]"));
    let mut top = json!("hunter2-hunter2");
    assert_eq!(g.scan(&mut top, "/message", false)[0].path, "/message");
}

fn result_with_key() -> CallOutcome {
    CallOutcome::Ok {
        output: json!({"pem": KEY, "note": "fine"}),
        meta: None,
        content: Some(ServerContent {
            blocks: json!([{"type": "text", "text": format!("here: {KEY}")}]),
            structured: true,
            meta: None,
            input_required: None,
        }),
    }
}

#[tokio::test]
async fn a_private_key_in_a_result_is_redacted_everywhere_the_caller_would_see_it() {
    let (r, _) = through(
        guard(GuardMode::Enforce, GuardAction::Redact),
        Scanned::Results,
        "t",
        result_with_key(),
    )
    .await;
    let CallOutcome::Ok {
        output, content, ..
    } = r.unwrap()
    else {
        panic!()
    };
    assert_eq!(
        output,
        json!({"pem": "[REDACTED:private_key]", "note": "fine"})
    );
    let text = content.unwrap().blocks[0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(text, "here: [REDACTED:private_key]");
}

#[tokio::test]
async fn a_refusing_tool_gets_forbidden_naming_the_detector_and_path_only() {
    let (r, _) = through(
        guard(GuardMode::Enforce, GuardAction::Redact),
        Scanned::Results,
        "strict",
        result_with_key(),
    )
    .await;
    let Err(Rejection::Forbidden(why)) = r else {
        panic!("{r:?}")
    };
    assert!(
        why.contains("private_key") && why.contains("/output/pem"),
        "{why}"
    );
    assert!(!why.contains("MIIE"), "{why}");
}

#[tokio::test]
async fn warn_reports_and_changes_nothing_and_off_does_nothing() {
    for mode in [GuardMode::Warn, GuardMode::Off] {
        let (r, _) = through(
            guard(mode, GuardAction::Refuse),
            Scanned::Results,
            "strict",
            result_with_key(),
        )
        .await;
        assert_eq!(r.unwrap(), result_with_key());
    }
}

#[tokio::test]
async fn arguments_are_guarded_before_the_call_goes_on() {
    let ok = CallOutcome::Ok {
        output: json!({}),
        meta: None,
        content: None,
    };
    let (r, seen) = through(
        guard(GuardMode::Enforce, GuardAction::Redact),
        Scanned::Arguments,
        "t",
        ok.clone(),
    )
    .await;
    assert!(r.is_ok());
    assert_eq!(seen, json!({"token": "[REDACTED:github_token]", "n": 1}));
    let (r, seen) = through(
        guard(GuardMode::Enforce, GuardAction::Redact),
        Scanned::Arguments,
        "strict",
        ok,
    )
    .await;
    assert!(matches!(r, Err(Rejection::Forbidden(_))));
    assert_eq!(seen, Value::Null, "nothing went on");
}

#[tokio::test]
async fn an_error_message_is_guarded_too() {
    let err = CallOutcome::AppError {
        code: "TOOL_ERROR".into(),
        message: "failed with hunter2-hunter2".into(),
        details: None,
        retryable: false,
        content: None,
    };
    let (r, _) = through(
        guard(GuardMode::Enforce, GuardAction::Redact),
        Scanned::Results,
        "t",
        err,
    )
    .await;
    let CallOutcome::AppError { message, .. } = r.unwrap() else {
        panic!()
    };
    assert_eq!(message, "failed with [REDACTED:app_secret]");
}
