use super::*;
use serde_json::{json, Value};

const VECTOR_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/vectors/vagus/");

fn load(name: &str) -> Value {
    let path = format!("{VECTOR_DIR}{name}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {path}: {e}"))
}

fn vectors() -> Vec<Value> {
    let file = load("canonical_hmac_vectors.json");
    let list = file["vectors"].as_array().expect("vectors array").clone();
    assert_eq!(Some(list.len() as u64), file["count"].as_u64());
    assert_eq!(list.len(), 38);
    list
}

fn field<'v>(v: &'v Value, name: &str) -> &'v str {
    v[name]
        .as_str()
        .unwrap_or_else(|| panic!("{}: missing {name}", v["id"]))
}

/// Vectors serde_json itself refuses to parse (documented in the vectors' README).
const PARSE_REFUSED: &[&str] = &["v14_lone_surrogate", "v21_number_overflow"];
/// Vectors with a `__proto__` member: Vagus drops it, we refuse (path of its object).
const UNCOVERED: &[(&str, &str)] = &[
    ("v28_proto_key_nested_object", "/input/a"),
    ("v29_proto_key_primitive", "/input/a"),
];

/// Vectors with an integer beyond ±2^53: Vagus signs the nearest double, we refuse.
const INEXACT: &[(&str, &str)] = &[
    ("v16_int_above_2_53", "/input/n"),
    ("v17_huge_int", "/input/n"),
];

fn uncovered_path(id: &str) -> Option<&'static str> {
    UNCOVERED.iter().find(|(u, _)| *u == id).map(|(_, p)| *p)
}

/// The error the canonical writer must give for a vector it refuses, if any.
fn expected_refusal(id: &str) -> Option<CanonicalError> {
    if let Some(path) = uncovered_path(id) {
        return Some(CanonicalError::UncoveredMember { path: path.into() });
    }
    INEXACT
        .iter()
        .find(|(u, _)| *u == id)
        .map(|(_, p)| CanonicalError::InexactInteger { path: (*p).into() })
}

#[test]
fn vectors_request_fields_canonical_and_mac() {
    let mut verified = 0;
    let mut refused = Vec::new();
    for v in vectors() {
        let id = field(&v, "id");
        let secret = field(&v, "secret").as_bytes();
        let parsed = serde_json::from_str::<Value>(field(&v, "request_fields_json"));
        if PARSE_REFUSED.contains(&id) {
            assert!(parsed.is_err(), "{id}: serde_json was expected to refuse");
            refused.push(id.to_owned());
            continue;
        }
        let parsed = parsed.unwrap_or_else(|e| panic!("{id}: {e}"));
        let canonical = canonical_string(&parsed);
        if let Some(expected) = expected_refusal(id) {
            assert_eq!(canonical, Err(expected), "{id}");
            refused.push(id.to_owned());
            continue;
        }
        let canonical = canonical.unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(canonical, field(&v, "canonical"), "{id}: canonical string");
        assert_eq!(
            hex::encode(canonical.as_bytes()),
            field(&v, "canonical_utf8_hex"),
            "{id}: canonical bytes"
        );
        let sig = hmac_sha256_hex(secret, canonical.as_bytes());
        assert_eq!(sig, field(&v, "signature_hex"), "{id}: signature");
        assert!(verify_hmac_sha256_hex(secret, canonical.as_bytes(), &sig));
        verified += 1;
    }
    assert_eq!(
        refused,
        [
            "v14_lone_surrogate",
            "v16_int_above_2_53",
            "v17_huge_int",
            "v21_number_overflow",
            "v28_proto_key_nested_object",
            "v29_proto_key_primitive"
        ]
    );
    assert_eq!(verified, 32);
}

fn flip_first_hex_char(sig: &str) -> String {
    let mut chars: Vec<char> = sig.chars().collect();
    chars[0] = if chars[0] == '0' { '1' } else { '0' };
    chars.into_iter().collect()
}

#[test]
fn vectors_wire_bodies_verify_and_tampering_fails() {
    let mut verified = 0;
    for v in vectors() {
        let id = field(&v, "id");
        let secret = field(&v, "secret").as_bytes();
        let body = match parse_strict(field(&v, "wire_body").as_bytes()) {
            Err(CanonicalError::Syntax(_)) if id == "v14_lone_surrogate" => continue,
            Err(e) => panic!("{id}: {e}"),
            Ok(_) if id == "v14_lone_surrogate" => panic!("{id}: lone surrogate accepted"),
            Ok(body) => body,
        };
        let mut fields = body;
        let sig = match fields.as_object_mut().and_then(|m| m.remove("signature")) {
            Some(Value::String(s)) => s,
            other => panic!("{id}: signature field {other:?}"),
        };
        let canonical = canonical_string(&fields);
        // The wire bodies carry what JS printed: v16 and v17 arrive already rounded.
        if let Some(path) = uncovered_path(id) {
            assert_eq!(
                canonical,
                Err(CanonicalError::UncoveredMember { path: path.into() }),
                "{id}"
            );
            continue;
        }
        let canonical = canonical.unwrap_or_else(|e| panic!("{id}: {e}"));
        let msg = canonical.as_bytes();
        assert!(verify_hmac_sha256_hex(secret, msg, &sig), "{id}: verify");
        verified += 1;

        // Tampered signature.
        assert!(
            !verify_hmac_sha256_hex(secret, msg, &flip_first_hex_char(&sig)),
            "{id}"
        );
        // Same signature, upper-case hex: refused by format.
        assert!(
            !verify_hmac_sha256_hex(secret, msg, &sig.to_uppercase()),
            "{id}"
        );
        // Wrong secret.
        let mut wrong = secret.to_vec();
        wrong.push(b'x');
        assert!(!verify_hmac_sha256_hex(&wrong, msg, &sig), "{id}");
        // Tampered input.
        let mut tampered = fields.clone();
        match tampered.get_mut("input") {
            Some(Value::Object(input)) => {
                input.insert("zz".into(), json!(1));
            }
            other => panic!("{id}: input {other:?}"),
        }
        let tampered = canonical_string(&tampered).expect("tampered canonical");
        assert!(
            !verify_hmac_sha256_hex(secret, tampered.as_bytes(), &sig),
            "{id}"
        );
    }
    assert_eq!(verified, 35);
}

/// Every row where plain serde_json output differs from Vagus is fixed (or refused).
#[test]
fn vectors_naive_serde_json_pitfalls_are_fixed() {
    let naive = load("rust_serde_json_naive.json");
    let rows = naive["rows"].as_array().expect("rows");
    let vectors = vectors();
    let mut differing = 0;
    for row in rows {
        if row["matches_vagus"] == json!(true) {
            continue;
        }
        differing += 1;
        let id = field(row, "id");
        let v = vectors
            .iter()
            .find(|v| v["id"] == row["id"])
            .expect("vector");
        let Ok(parsed) = serde_json::from_str::<Value>(field(v, "request_fields_json")) else {
            assert!(PARSE_REFUSED.contains(&id), "{id}");
            continue;
        };
        match canonical_string(&parsed) {
            Ok(c) => assert_eq!(c, field(v, "canonical"), "{id}"),
            Err(e) => assert_eq!(Some(e), expected_refusal(id), "{id}"),
        }
    }
    assert_eq!(differing, 12);
}
