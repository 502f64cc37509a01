use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine;
use carapace_filters::call::{Principal, ToolSpec};
use carapace_filters::schema::CompiledSchema;
use serde_json::Value;

use super::*;
use crate::catalog::Catalog;

fn tool(name: &str, input: Value) -> Arc<ToolSpec> {
    Arc::new(ToolSpec {
        name: name.into(),
        app_name: None,
        definition: None,
        description: format!("{name} does a thing"),
        input: CompiledSchema::compile(input).unwrap(),
        output: None,
        timeout_ms_default: 1000,
        timeout_ms_max: 1000,
        idempotent: false,
        side_effects: false,
    })
}

fn catalog_of(tools: &[Arc<ToolSpec>]) -> Catalog {
    let mut c = Catalog::default();
    for t in tools {
        c.tools.insert(t.name.clone(), t.clone());
    }
    c
}

struct Fixture {
    layer: EatLayer,
    catalog: Arc<CatalogHandle>,
    now_s: Arc<AtomicU64>,
    _dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let keys = CatalogKeys::load_or_create(dir.path()).unwrap();
    let publication = Publication {
        did: "did:web:tools.test".into(),
        origin: "https://tools.test".into(),
        server_url: "https://tools.test/mcp".into(),
        title: None,
        description: None,
        tools: BTreeMap::new(),
        signature_ttl_s: 600,
        max_age_s: 300,
    };
    let catalog = Arc::new(CatalogHandle::default());
    let now_s = Arc::new(AtomicU64::new(1_800_000_000));
    let clock = now_s.clone();
    let layer = EatLayer::catalog(
        Arc::new(Publisher::new(keys)),
        Arc::new(publication),
        catalog.clone(),
        Arc::new(move || clock.load(Ordering::SeqCst) * 1000),
    );
    Fixture {
        layer,
        catalog,
        now_s,
        _dir: dir,
    }
}

fn get(f: &Fixture, path: &str) -> Resp {
    let mut req = Request::get(path).body(()).unwrap();
    req.extensions_mut().insert(Arc::new(Principal::local()));
    f.layer.answer(&req).unwrap()
}

fn payload(resp: &Resp) -> Value {
    let jws = resp.headers()[SIGNATURE_HEADER].to_str().unwrap();
    let part = jws.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn body(resp: &Resp) -> Vec<u8> {
    use http_body_util::BodyExt;
    let body = resp.body().clone();
    let collected = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(body.collect());
    match collected {
        Ok(c) => c.to_bytes().to_vec(),
        Err(never) => match never {},
    }
}

#[test]
fn a_discovery_that_changes_the_tools_changes_the_catalog_and_its_signature() {
    let f = fixture();
    let object = serde_json::json!({"type": "object"});
    f.catalog
        .replace(catalog_of(&[tool("a.one", object.clone())]));
    let first = get(&f, CATALOG_PATH);
    let first_body = body(&first);
    assert_eq!(payload(&first)["catalog_hash"], sha256_tag(&first_body));

    f.catalog.replace(catalog_of(&[
        tool("a.one", object.clone()),
        tool("b.two", object.clone()),
    ]));
    let second = get(&f, CATALOG_PATH);
    let second_body = body(&second);
    assert_ne!(first_body, second_body);
    assert_ne!(
        first.headers()[SIGNATURE_HEADER],
        second.headers()[SIGNATURE_HEADER]
    );
    assert_ne!(
        first.headers()[header::ETAG],
        second.headers()[header::ETAG]
    );
    assert_eq!(payload(&second)["catalog_hash"], sha256_tag(&second_body));
    let doc: Value = serde_json::from_slice(&second_body).unwrap();
    assert_eq!(doc["tools"][1]["name"], "b-2etwo");
}

#[test]
fn a_signature_is_reused_for_half_its_life_and_no_cache_outlives_it() {
    let f = fixture();
    f.catalog.replace(catalog_of(&[tool(
        "a.one",
        serde_json::json!({"type": "object"}),
    )]));
    let first = get(&f, CATALOG_PATH);
    let iat = payload(&first)["iat"].as_u64().unwrap();
    assert_eq!(payload(&first)["exp"].as_u64().unwrap(), iat + 600);
    assert_eq!(
        first.headers()[header::CACHE_CONTROL],
        "private, max-age=300"
    );

    f.now_s.fetch_add(299, Ordering::SeqCst);
    let later = get(&f, CATALOG_PATH);
    assert_eq!(
        later.headers()[SIGNATURE_HEADER],
        first.headers()[SIGNATURE_HEADER]
    );
    assert_eq!(
        later.headers()[header::CACHE_CONTROL],
        "private, max-age=300"
    );

    f.now_s.fetch_add(2, Ordering::SeqCst);
    let renewed = get(&f, CATALOG_PATH);
    assert_ne!(
        renewed.headers()[SIGNATURE_HEADER],
        first.headers()[SIGNATURE_HEADER]
    );
    assert_eq!(payload(&renewed)["iat"].as_u64().unwrap(), iat + 301);
}

#[test]
fn a_tool_that_has_no_canonical_form_is_left_out_and_the_rest_is_served() {
    let f = fixture();
    // 2^53 + 1: no double holds it, so RFC 8785 cannot write it.
    let odd = serde_json::json!({"type": "integer", "maximum": 9_007_199_254_740_993u64});
    f.catalog.replace(catalog_of(&[
        tool("a.one", serde_json::json!({"type": "object"})),
        tool("b.odd", odd),
    ]));
    let resp = get(&f, CATALOG_PATH);
    let doc = crate::eat::validate::validate(&body(&resp)).unwrap();
    let names: Vec<&str> = doc["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a-2eone"]);
    let spec = Request::get("/.well-known/api-catalog/tools/b-2eodd/openapi.json")
        .body(())
        .map(|mut r| {
            r.extensions_mut().insert(Arc::new(Principal::local()));
            r
        })
        .unwrap();
    assert!(matches!(f.layer.answer(&spec), Err(Rejection::NoRoute(_))));
}
