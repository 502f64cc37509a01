//! A stored answer: the call's outcome and its receipt, as JSON (the same form in this
//! process and in Redis).

use carapace_filters::call::{CallOutcome, ServerContent};
use serde_json::{json, Value};

/// Whether an outcome is kept for repeats: a success, or an error the app reported that a
/// retry would not change. Retryable errors, timeouts and refusals are not: a retry with the
/// same key runs again.
pub fn storable(outcome: &CallOutcome) -> bool {
    match outcome {
        CallOutcome::Ok { content, .. } => {
            content.as_ref().is_none_or(|c| c.input_required.is_none())
        }
        CallOutcome::AppError { retryable, .. } => !retryable,
    }
}

fn content_json(c: &Option<ServerContent>) -> Value {
    match c {
        None => Value::Null,
        Some(c) => json!({"blocks": c.blocks, "structured": c.structured, "meta": c.meta}),
    }
}

fn content_of(v: &Value) -> Option<ServerContent> {
    let c = v.as_object()?;
    Some(ServerContent {
        blocks: c.get("blocks")?.clone(),
        structured: c.get("structured")?.as_bool()?,
        meta: c.get("meta").filter(|m| !m.is_null()).cloned(),
        input_required: None,
    })
}

/// The stored form of `outcome` and `receipt`.
pub fn encode(outcome: &CallOutcome, receipt: Option<&str>) -> String {
    let outcome = match outcome {
        CallOutcome::Ok {
            output,
            meta,
            content,
        } => json!({"ok": {"output": output, "meta": meta, "content": content_json(content)}}),
        CallOutcome::AppError {
            code,
            message,
            details,
            retryable,
            content,
        } => json!({"app_error": {"code": code, "message": message, "details": details,
                    "retryable": retryable, "content": content_json(content)}}),
    };
    json!({"outcome": outcome, "receipt": receipt}).to_string()
}

/// Read a stored answer back; `None` if it is not one.
pub fn decode(text: &str) -> Option<(CallOutcome, Option<String>)> {
    let doc: Value = serde_json::from_str(text).ok()?;
    let receipt = doc
        .get("receipt")
        .and_then(Value::as_str)
        .map(str::to_string);
    let outcome = doc.get("outcome")?;
    let outcome = if let Some(ok) = outcome.get("ok") {
        CallOutcome::Ok {
            output: ok.get("output")?.clone(),
            meta: ok.get("meta").filter(|m| !m.is_null()).cloned(),
            content: ok.get("content").and_then(content_of),
        }
    } else {
        let e = outcome.get("app_error")?;
        CallOutcome::AppError {
            code: e.get("code")?.as_str()?.to_string(),
            message: e.get("message")?.as_str()?.to_string(),
            details: e.get("details").filter(|d| !d.is_null()).cloned(),
            retryable: e.get("retryable")?.as_bool()?,
            content: e.get("content").and_then(content_of),
        }
    };
    Some((outcome, receipt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_come_back_as_they_were_stored() {
        let cases = [
            CallOutcome::Ok {
                output: json!({"id": "m1", "n": 1.5}),
                meta: Some(json!({"a": 1})),
                content: Some(ServerContent {
                    blocks: json!([{"type": "text", "text": "hi"}]),
                    structured: true,
                    meta: None,
                    input_required: None,
                }),
            },
            CallOutcome::Ok {
                output: Value::Null,
                meta: None,
                content: None,
            },
            CallOutcome::AppError {
                code: "NOT_FOUND".into(),
                message: "no such entry".into(),
                details: Some(json!({"id": "x"})),
                retryable: false,
                content: None,
            },
        ];
        for outcome in cases {
            let text = encode(&outcome, Some("v1.a.b"));
            assert_eq!(decode(&text), Some((outcome, Some("v1.a.b".into()))));
        }
        assert_eq!(decode("{}"), None);
        assert_eq!(decode("not json"), None);
    }

    #[test]
    fn only_answers_a_retry_would_not_change_are_kept() {
        let error = |retryable| CallOutcome::AppError {
            code: "X".into(),
            message: String::new(),
            details: None,
            retryable,
            content: None,
        };
        assert!(storable(&error(false)));
        assert!(!storable(&error(true)));
        let asking = CallOutcome::Ok {
            output: Value::Null,
            meta: None,
            content: Some(ServerContent {
                blocks: json!([]),
                structured: false,
                meta: None,
                input_required: Some(json!({})),
            }),
        };
        assert!(!storable(&asking));
    }
}
