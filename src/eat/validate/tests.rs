//! The EAT test vectors (`../shared/vectors/eat/upstream`, copied byte for byte from the
//! public implementation): every case of `invalid_catalogs.json` and `valid_catalog.json` with
//! its expected verdict and `error_type`, and the verdict on each example and fixture catalog.

use std::path::PathBuf;

use serde_json::Value;

use super::*;

fn vectors(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/vectors/eat/upstream")
        .join(rel)
}

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(vectors(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A case's catalog as bytes: a `test_data` that is a JSON string is served as it is (the
/// "Invalid JSON" case), anything else as JSON.
fn case_bytes(case: &Value) -> Vec<u8> {
    match &case["test_data"] {
        Value::String(raw) => raw.as_bytes().to_vec(),
        other => serde_json::to_vec(other).unwrap(),
    }
}

fn check_case(case: &Value) {
    let name = case["test_name"].as_str().unwrap();
    let verdict = validate(&case_bytes(case));
    match case["expected_result"].as_str().unwrap() {
        "PASS" => assert!(verdict.is_ok(), "{name}: {verdict:?}"),
        "FAIL" => {
            let errors = verdict.expect_err(name);
            let expected = case["error_type"].as_str().unwrap();
            assert!(
                errors.iter().any(|e| e.kind.as_str() == expected),
                "{name}: expected {expected}, got {errors:?}"
            );
        }
        other => panic!("{name}: verdict {other}"),
    }
}

#[test]
fn every_catalog_vector_gets_its_verdict_and_error_type() {
    let invalid: Vec<Value> =
        serde_json::from_slice(&read("examples/test-vectors/invalid_catalogs.json")).unwrap();
    assert_eq!(invalid.len(), 15);
    invalid.iter().for_each(check_case);
    let valid: Value =
        serde_json::from_slice(&read("examples/test-vectors/valid_catalog.json")).unwrap();
    check_case(&valid);
}

#[test]
fn the_fixture_catalogs_are_judged_tool_by_tool() {
    assert!(validate(&read("tests/fixtures/catalogs/valid_catalog.json")).is_ok());
    let errors = validate(&read("tests/fixtures/catalogs/invalid_catalog.json")).unwrap_err();
    // Tool 0 is valid; tools 1 to 7 each break one rule.
    let tools: std::collections::BTreeSet<&str> = errors
        .iter()
        .filter_map(|e| e.path.strip_prefix("/tools/"))
        .filter_map(|p| p.split('/').next())
        .collect();
    assert_eq!(
        tools.into_iter().collect::<Vec<_>>(),
        ["1", "2", "3", "4", "5", "6", "7"],
        "{errors:?}"
    );
}

#[test]
fn the_example_catalogs_are_judged_by_the_text() {
    assert!(validate(&read("examples/catalogs/enterprise-catalog.json")).is_ok());
    // Schema-valid; its embedded JWS is a placeholder that a verifier refuses elsewhere.
    assert!(validate(&read("examples/catalogs/signed-catalog.json")).is_ok());
    for rel in [
        "examples/catalogs/simple-catalog.json",
        "demo/site/.well-known/api-catalog",
    ] {
        let errors = validate(&read(rel)).unwrap_err();
        assert!(
            errors.iter().all(|e| e.kind == ErrorKind::InvalidHash),
            "{rel}: {errors:?}"
        );
    }
    // The older shape: no spec_url, no x-mcp-tool.
    let errors = validate(&read("test-catalog/.well-known/api-catalog")).unwrap_err();
    assert!(errors
        .iter()
        .any(|e| e.kind == ErrorKind::MissingRequiredField));
}

#[test]
fn names_are_unique_and_servers_are_web_urls() {
    let tool = |name: &str, server: &str| {
        serde_json::json!({"name": name, "description": "d", "spec_url": "https://a.test/s.json",
            "x-mcp-tool": {"server_url": server}})
    };
    let catalog = serde_json::json!({"version": "1.0", "tools": [
        tool("a", "https://a.test/mcp"), tool("a", "https://a.test/mcp"), tool("b", "ftp://a.test/mcp")]});
    let errors = validate(&serde_json::to_vec(&catalog).unwrap()).unwrap_err();
    let found: Vec<(&str, ErrorKind)> = errors.iter().map(|e| (e.path.as_str(), e.kind)).collect();
    assert_eq!(
        found,
        [
            ("/tools/1/name", ErrorKind::InvalidFormat),
            ("/tools/2/x-mcp-tool/server_url", ErrorKind::InvalidUrl)
        ]
    );
}
