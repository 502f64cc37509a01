//! The skill-v1 `POST /run` decoder (number-length check, strict JSON, signed fields,
//! canonical form) and the HMAC check of what it decoded; the one-pass reader and the general
//! decoding give the same result on every body.
#![no_main]

use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use carapace::catalog::CatalogHandle;
use carapace::front::CallStack;
use carapace::skill_v1::SkillV1Front;
use carapace_filters::call::{Credential, Principal, ToolCall};
use carapace_filters::canonical::{canonical_string, parse_strict, verify_hmac_sha256_hex};
use carapace_filters::signature::AuthMode;
use carapace_filters::Rejection;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

static FRONT: LazyLock<SkillV1Front> = LazyLock::new(|| {
    let cfg = carapace_fuzz::config();
    let handle = CatalogHandle::default();
    handle.replace(carapace_fuzz::catalog(&cfg));
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
});

/// Equal as JavaScript reads them: numbers compare as doubles (`0.0` is signed as `0`).
fn same_numbers(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_numbers(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_numbers(v, w)))
        }
        _ => a == b,
    }
}

fuzz_target!(|body: &[u8]| {
    let req = http::Request::post("/run")
        .header("content-type", "application/json")
        .body(Bytes::copy_from_slice(body))
        .expect("request");
    let principal = Arc::new(Principal::local());
    let (decoded, general) = (
        FRONT.decode(&req, principal.clone()),
        FRONT.decode_general(&req, principal),
    );
    // The one-pass reader and the general decoding agree on every body.
    assert_eq!(format!("{decoded:?}"), format!("{general:?}"));
    let canonical = |c: &Result<ToolCall, Rejection>| match c {
        Ok(ToolCall {
            credential: Credential::Skill(s),
            ..
        }) => Some(s.canonical.clone()),
        _ => None,
    };
    assert_eq!(canonical(&decoded), canonical(&general));
    let Ok(call) = decoded else {
        return;
    };
    let Credential::Skill(cred) = &call.credential else {
        panic!("a skill-v1 call carries a skill credential");
    };
    // The string that is MACed is the canonical form of what the call carries.
    let reparsed = parse_strict(cred.canonical.as_bytes())
        .unwrap_or_else(|e| panic!("canonical {:?} does not reparse: {e}", cred.canonical));
    assert_eq!(
        canonical_string(&reparsed).as_deref(),
        Ok(cred.canonical.as_str())
    );
    assert!(
        same_numbers(&reparsed["input"], &call.args),
        "the app gets the signed input: signed {}, sent {}",
        reparsed["input"],
        call.args
    );
    assert_eq!(reparsed["nonce"].as_str(), Some(cred.nonce.as_str()));
    assert!(cred.timestamp_ms >= 0);
    let _ = verify_hmac_sha256_hex(
        carapace_fuzz::SECRET.as_bytes(),
        cred.canonical.as_bytes(),
        &cred.signature_hex,
    );
});
