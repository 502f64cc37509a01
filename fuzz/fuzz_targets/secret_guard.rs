//! The secret guard's detectors over any JSON (or any string): nothing panics, and a value
//! redacted once holds nothing the detectors find when scanned again.

#![no_main]

use std::collections::HashMap;
use std::sync::OnceLock;

use carapace_filters::secret_guard::{Detectors, GuardAction, GuardMode, SecretGuard};
use libfuzzer_sys::fuzz_target;

/// Compiled once: building the detectors' regular expressions is the costly part.
fn guard() -> &'static SecretGuard {
    static GUARD: OnceLock<SecretGuard> = OnceLock::new();
    GUARD.get_or_init(|| {
        let detectors = Detectors::new(
            &["tok_[a-z0-9]{8}".to_string()],
            vec![("value_0".into(), "s3cr3t-value".into())],
        )
        .expect("fixed patterns");
        SecretGuard::new(
            detectors,
            GuardMode::Enforce,
            GuardAction::Redact,
            HashMap::new(),
            "inbound",
        )
    })
}

fuzz_target!(|data: &[u8]| {
    let guard = guard();
    let mut value = match serde_json::from_slice::<serde_json::Value>(data) {
        Ok(v) => v,
        Err(_) => serde_json::Value::String(String::from_utf8_lossy(data).into_owned()),
    };
    guard.scan(&mut value, "", true);
    let again = guard.scan(&mut value, "", false);
    assert!(again.is_empty(), "left after redaction: {again:?} in {value}");
});
