use std::sync::Arc;

use bytes::Bytes;
use carapace_filters::call::{Credential, Principal, ToolCall, ToolSpec};
use carapace_filters::schema::CompiledSchema;
use carapace_filters::signature::AuthMode;
use carapace_filters::Rejection;
use serde_json::json;

use super::SkillV1Front;
use crate::catalog::{Catalog, CatalogHandle};
use crate::front::CallStack;

/// A front for `demo.echo` with one capability, `demo.echo`; `discovered` says whether its
/// catalog was ever discovered.
fn front(discovered: bool) -> SkillV1Front {
    let handle = CatalogHandle::default();
    if discovered {
        let mut catalog = Catalog::default();
        let tool = ToolSpec {
            name: "demo.echo".into(),
            app_name: None,
            definition: None,
            description: String::new(),
            input: CompiledSchema::compile(json!({"type": "object"})).unwrap(),
            output: None,
            timeout_ms_default: 5_000,
            timeout_ms_max: 10_000,
            idempotent: false,
            side_effects: false,
        };
        catalog.tools.insert(tool.name.clone(), Arc::new(tool));
        handle.replace(catalog);
    }
    // Decoding never calls the stack.
    let calls = CallStack::new(tower::service_fn(|_| async {
        Err(Rejection::AppUnavailable("not called".into()))
    }));
    SkillV1Front::new(
        "demo.echo",
        AuthMode::Hmac,
        None,
        Arc::new(handle),
        calls,
        Arc::new(|| 1_735_689_600_000),
    )
}

const VALID: &str = r#"{"gateway_protocol_version":"1.0","skill_id":"demo.echo","capability":"demo.echo","input":{"message":"hi \"you\"\n","n":[1,2.5,-0.0,1e3,{"b":true,"a":null,"10":"x","2":"y"}]},"timestamp":1735689600000,"nonce":"n-1","signature":"00ff"}"#;

/// Bodies on both sides of every rule of the `/run` decoding.
fn run_cases() -> Vec<String> {
    let mut cases = vec![
        VALID.to_string(),
        // Other member order, whitespace, escapes in names and values.
        r#" { "signature" : "ab", "nonce":"n\u00e9", "timestamp" : 0, "input" : {},
            "capab\u0069lity":"demo.echo", "skill_id":"demo.echo",
            "gateway_protocol_version":"1.0" } "#
            .to_string(),
    ];
    for (from, to) in [
        (r#""1.0""#, r#""2.0""#),
        (r#""1.0""#, "1"),
        (r#""skill_id":"demo.echo""#, r#""skill_id":"other""#),
        (r#""skill_id":"demo.echo""#, r#""skill_id":7"#),
        (r#""skill_id":"demo.echo","#, ""),
        (r#""capability":"demo.echo""#, r#""capability":"nope""#),
        (r#""capability":"demo.echo""#, r#""capability":null"#),
        (r#""nonce":"n-1""#, r#""nonce":1"#),
        (r#","nonce":"n-1""#, ""),
        (r#","signature":"00ff""#, ""),
        (r#""signature":"00ff""#, r#""signature":["00ff"]"#),
        (r#""input":{"#, r#""input":[{"#),
        (
            r#""input":{"message""#,
            r#""input":{"__proto__":1,"message""#,
        ),
        (
            r#""input":{"message""#,
            r#""input":{"o":{"__proto__":{}},"message""#,
        ),
        (r#""input":{"message""#, r#""input":{"message":1,"message""#),
        (
            r#""input":{"message""#,
            r#""input":{"big":9007199254740993,"message""#,
        ),
        (
            r#""input":{"message""#,
            r#""input":{"big":12345678901234567000,"message""#,
        ),
        (
            r#""input":{"message""#,
            r#""input":{"huge":1e400,"message""#,
        ),
        (
            r#""input":{"message""#,
            r#""input":{"long":1.00000000000000000000000000000000000000001,"message""#,
        ),
        (
            r#""timestamp":1735689600000"#,
            r#""timestamp":1.7356896e12"#,
        ),
        (
            r#""timestamp":1735689600000"#,
            r#""timestamp":1735689600000.0"#,
        ),
        (r#""timestamp":1735689600000"#, r#""timestamp":-1"#),
        (
            r#""timestamp":1735689600000"#,
            r#""timestamp":8999999999999999"#,
        ),
        (
            r#""timestamp":1735689600000"#,
            r#""timestamp":9000000000000000"#,
        ),
        (
            r#""timestamp":1735689600000"#,
            r#""timestamp":"1735689600000""#,
        ),
        (r#","timestamp":1735689600000"#, ""),
        (r#""nonce":"n-1""#, r#""nonce":"n-1","extra":true"#),
        (r#""nonce":"n-1""#, r#""nonce":"n-1","nonce":"n-2""#),
        (r#""nonce":"n-1""#, r#""nonce":"n-1","__proto__":{}"#),
    ] {
        assert!(VALID.contains(from), "{from}");
        cases.push(VALID.replacen(from, to, 1));
    }
    cases.push(format!("{VALID} "));
    cases.push(format!("{VALID}x"));
    cases.push(format!("[{VALID}]"));
    cases.push("{}".into());
    cases.push("null".into());
    cases.push("not json".into());
    // Nesting at the strict parse's limit and one past it.
    for depth in [126, 127, 128] {
        let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        cases.push(VALID.replacen(r#""message":"hi"#, &format!(r#""d":{deep},"m":"hi"#), 1));
    }
    cases
}

/// The one-pass reader takes the body a caller normally sends; on every body, with and
/// without a catalog and with each credential header, `decode` gives what the general
/// decoding gives (the canonical string, the input, every refusal).
#[test]
fn run_reader_agrees_with_the_general_decoding() {
    assert!(super::wire::read_run(VALID.as_bytes()).is_some());
    let mut accepted = 0;
    for discovered in [true, false] {
        let front = front(discovered);
        for body in run_cases() {
            for header in [None, Some(&b"00ff"[..]), Some(&b"\xff"[..])] {
                let mut req = http::Request::post("/run");
                if let Some(h) = header {
                    req = req.header(
                        "x-skill-signature",
                        http::HeaderValue::from_bytes(h).unwrap(),
                    );
                }
                let req = req.body(Bytes::from(body.clone())).unwrap();
                let principal = Arc::new(Principal::local());
                let (fast, general) = (
                    front.decode(&req, principal.clone()),
                    front.decode_general(&req, principal),
                );
                accepted += usize::from(general.is_ok());
                assert_eq!(format!("{fast:?}"), format!("{general:?}"), "{body}");
                // `Debug` shows the signed form's length only.
                assert_eq!(signed_form(&fast), signed_form(&general), "{body}");
            }
        }
    }
    assert!(accepted >= 10, "the cases cover accepted bodies too");
}

fn signed_form(call: &Result<ToolCall, Rejection>) -> Option<&str> {
    match call {
        Ok(ToolCall {
            credential: Credential::Skill(c),
            ..
        }) => Some(&c.canonical),
        _ => None,
    }
}

/// The signed form the reader writes is the canonical form of the body without `signature`.
#[test]
fn the_read_body_signs_its_canonical_form() {
    let run = super::wire::read_run(VALID.as_bytes()).expect("read");
    let mut doc: serde_json::Value = serde_json::from_str(VALID).unwrap();
    doc.as_object_mut().unwrap().remove("signature");
    assert_eq!(
        run.canonical(0).as_deref(),
        Some(
            carapace_filters::canonical::canonical_string(&doc)
                .unwrap()
                .as_str()
        )
    );
}

/// The first number literal longer than the limit, found byte by byte: what the front's
/// search must give.
fn overlong_bytewise(body: &[u8]) -> Option<usize> {
    let (mut in_string, mut escaped, mut run, mut start) = (false, false, 0usize, 0usize);
    for (i, &b) in body.iter().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        if matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
            if run == 0 {
                start = i;
            }
            run += 1;
            if run > super::MAX_NUMBER_CHARS {
                return Some(start);
            }
        } else {
            run = 0;
            in_string = b == b'"';
        }
    }
    None
}

/// Overlong numbers are found where they are, inside strings never, on bodies of quotes,
/// escapes and digits in every arrangement a seeded generator makes.
#[test]
fn overlong_numbers_are_found_outside_strings_only() {
    let long = "1".repeat(super::MAX_NUMBER_CHARS + 1);
    let at = VALID.find("1735689600000").unwrap();
    let body = VALID.replacen("1735689600000", &long, 1);
    assert_eq!(super::front::overlong_number(body.as_bytes()), Some(at));
    let quoted = VALID.replacen("n-1", &long, 1);
    assert_eq!(super::front::overlong_number(quoted.as_bytes()), None);
    let escaped = VALID.replacen("n-1", &format!(r#"\\\"{long}"#), 1);
    assert_eq!(super::front::overlong_number(escaped.as_bytes()), None);
    // xorshift: the same bodies on every run.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let alphabet = b"\"\\1-e.x ";
    let mut found = 0;
    for _ in 0..20_000 {
        let len = (next() % 120) as usize;
        let mut body: Vec<u8> = (0..len)
            .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
            .collect();
        if next() % 2 == 0 {
            // A run at the limit, one past it or longer, anywhere: inside a string, touching
            // other number characters, across any offset.
            let run = "1".repeat(super::MAX_NUMBER_CHARS + (next() % 3) as usize);
            let at = (next() % (len as u64 + 1)) as usize;
            body.splice(at..at, run.bytes());
        }
        let expected = overlong_bytewise(&body);
        found += usize::from(expected.is_some());
        assert_eq!(
            super::front::overlong_number(&body),
            expected,
            "{}",
            String::from_utf8_lossy(&body)
        );
    }
    assert!(found > 1_000, "the bodies cover overlong numbers too");
}

/// A successful `/run` answer is exactly the bytes of the JSON value it replaced: the app's
/// meta (when an object) with carapace's `duration_ms` in its sorted place, or one with only it.
#[tokio::test]
async fn answer_bytes_match_the_json_value_form() {
    use carapace_filters::call::CallOutcome;
    use http_body_util::BodyExt;
    let output = json!({"q": "a\"b\n", "n": [1, 2.5, null], "ü": {"t": true}});
    for meta in [
        None,
        Some(json!({"z": 1, "duration_ms": 99, "a": "x\u{1}"})),
        Some(json!("not an object")),
    ] {
        let outcome = CallOutcome::Ok {
            output: output.clone(),
            meta: meta.clone(),
            content: None,
        };
        let resp = super::front::outcome_response(&outcome, 7);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let mut expected_meta = match meta {
            Some(serde_json::Value::Object(m)) => serde_json::Value::Object(m),
            _ => json!({}),
        };
        expected_meta["duration_ms"] = json!(7);
        let value = json!({"ok": true, "output": output, "meta": expected_meta});
        assert_eq!(
            String::from_utf8(body.to_vec()).unwrap(),
            serde_json::to_string(&value).unwrap()
        );
    }
}
