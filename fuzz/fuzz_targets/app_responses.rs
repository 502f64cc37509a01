//! What the app answers: tools-v1 call answers, skill-v1 `/run` answers, and the discovery
//! answers the catalogs are compiled from (`GET /v1/tools`, `GET /manifest`).
//!
//! Input: one byte choosing the decoder, one byte choosing the HTTP status, then the body.
#![no_main]

use std::sync::{Arc, LazyLock};

use carapace::catalog::{skill_catalog, tools_v1_catalog};
use carapace::config::Loaded;
use carapace::{skill_v1, tools_v1};
use carapace_filters::call::{CallOutcome, Credential, Principal, ToolCall, ToolSpec};
use carapace_filters::schema::CompiledSchema;
use http::StatusCode;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

const STATUSES: [u16; 8] = [200, 201, 204, 302, 400, 404, 500, 503];

static CONFIG: LazyLock<Loaded> = LazyLock::new(carapace_fuzz::config);

static CALL: LazyLock<ToolCall> = LazyLock::new(|| ToolCall {
    call_id: "call-1".into(),
    tool: Arc::new(ToolSpec {
        name: "echo".into(),
        app_name: None,
        definition: None,
        description: String::new(),
        input: CompiledSchema::compile(json!({"type": "object"})).expect("compiles"),
        output: None,
        timeout_ms_default: 1_000,
        timeout_ms_max: 5_000,
        idempotent: true,
        side_effects: false,
    }),
    tenant_id: Some("t1".into()),
    args: json!({"message": "hello"}),
    context: None,
    timeout_ms: Some(2_000),
    idempotency_key: None,
    principal: Arc::new(Principal::local()),
    credential: Credential::None,
    request_id: None,
    trace_context: Vec::new(),
    extensions: Default::default(),
});

fuzz_target!(|data: &[u8]| {
    let [which, status, body @ ..] = data else {
        return;
    };
    let status = StatusCode::from_u16(STATUSES[usize::from(*status) % STATUSES.len()])
        .expect("a valid status");
    match which % 4 {
        0 => {
            let decoded = tools_v1::decode_response(status, body, &CALL);
            assert_eq!(
                format!("{decoded:?}"),
                format!("{:?}", tools_v1::decode_response_general(status, body, &CALL)),
                "the one-pass reader and the general decoding differ"
            );
            if let Ok(outcome) = decoded {
                assert!(status.is_success(), "an HTTP error is not a call outcome");
                if let CallOutcome::AppError { code, .. } = outcome {
                    assert!(!code.is_empty());
                }
            }
        }
        1 => {
            if skill_v1::decode_run_response(status, body).is_ok() {
                assert!(status.is_success(), "an HTTP error is not a call outcome");
            }
        }
        2 | 3 => {
            let Ok(doc) = serde_json::from_slice::<Value>(body) else {
                return;
            };
            let catalog = if which % 4 == 2 {
                tools_v1_catalog(&doc, &CONFIG)
            } else {
                let skill = CONFIG.config.app.skill.as_ref().expect("a skill-v1 app");
                skill_catalog(&doc, skill, &CONFIG)
            };
            if let Ok(catalog) = catalog {
                for (name, tool) in &catalog.tools {
                    assert_eq!(name, &tool.name);
                    assert!(tool.timeout_ms_default >= 1);
                    assert!(tool.timeout_ms_default <= tool.timeout_ms_max);
                    assert!(tool.timeout_ms_max <= carapace::catalog::PROTOCOL_TIMEOUT_MAX_MS);
                }
            }
        }
        _ => unreachable!(),
    }
});
