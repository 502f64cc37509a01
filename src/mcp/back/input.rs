//! Multi round-trip requests (2026-07-28): a server that needs the caller's input answers a
//! `tools/call` with an "input required" result (`inputRequests`, `requestState`), and the
//! caller retries the call with `inputResponses` and the same `requestState`.
//!
//! - A 2026-07-28 caller on the MCP front gets the result as it is and retries itself; its
//!   retried call passes the whole call stage again (authorization, schemas, limits) and its
//!   `inputResponses` and `requestState` reach the server untouched
//!   ([`super::relay::RetryInput`]).
//! - An older-era caller cannot take such a result, but can be asked on its stream: each
//!   request is put to it as a server request, and the call is retried with its answers, at
//!   most [`MAX_ROUNDS`] times, within the call's timeout.
//! - Any other caller (tools-v1, skill-v1, an older-era caller that did not declare the
//!   capability) gets the tool error `INPUT_REQUIRED`, never a hang or an empty success.

use serde_json::{json, Map, Value};

use carapace_filters::call::{CallOutcome, ServerContent};

use super::relay::CallerStream;
use super::upstream::Reply;

/// Most times one call is retried with an older-era caller's answers.
pub const MAX_ROUNDS: usize = 4;

/// A server's "input required" result.
#[derive(Debug, Clone, PartialEq)]
pub struct InputRequired {
    /// `inputRequests`: key → `{method, params}`.
    requests: Map<String, Value>,
    /// `requestState`, echoed on the retry.
    state: Option<Value>,
}

impl InputRequired {
    /// The result's questions, when it is not a complete result.
    pub fn of(result: &Value) -> Option<Self> {
        let kind = result.get("resultType").and_then(Value::as_str)?;
        if kind == "complete" {
            return None;
        }
        Some(InputRequired {
            requests: result
                .get("inputRequests")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            state: result.get("requestState").cloned(),
        })
    }

    /// Whether every question can be put to `caller`.
    pub fn askable(&self, caller: &CallerStream) -> bool {
        self.requests.values().all(|r| {
            r.get("method")
                .and_then(Value::as_str)
                .is_some_and(|m| caller.answers(m))
        })
    }

    /// Put every question to the caller; the retry's fields, or the outcome when the caller
    /// answered one with an error.
    pub async fn ask(self, caller: &CallerStream) -> Result<Retry, CallOutcome> {
        let mut answers = Map::new();
        for (key, request) in self.requests {
            let method = request.get("method").and_then(Value::as_str).unwrap_or("");
            let params = request.get("params").cloned().unwrap_or_else(|| json!({}));
            match caller.ask(method, params).await {
                Reply::Result(r) => {
                    answers.insert(key, r);
                }
                Reply::Error { code, message, .. } => {
                    return Err(CallOutcome::AppError {
                        code: "INPUT_REQUIRED".into(),
                        message: format!("the caller did not answer `{method}`: {code} {message}"),
                        details: None,
                        retryable: false,
                        content: None,
                    })
                }
            }
        }
        Ok(Retry {
            answers,
            state: self.state,
        })
    }

    /// The result for a caller that was not asked: `INPUT_REQUIRED`, carrying the questions
    /// for an MCP caller that can answer them itself.
    pub fn into_outcome(self, meta: Option<Value>) -> CallOutcome {
        let methods: Vec<&str> = self
            .requests
            .values()
            .filter_map(|r| r.get("method").and_then(Value::as_str))
            .collect();
        let message = format!(
            "the MCP server needs the caller's input ({}) and a retry of the call",
            if methods.is_empty() {
                "its request state".to_owned()
            } else {
                methods.join(", ")
            }
        );
        let mut input = Map::new();
        if !self.requests.is_empty() {
            input.insert("inputRequests".into(), Value::Object(self.requests));
        }
        if let Some(state) = self.state {
            input.insert("requestState".into(), state);
        }
        CallOutcome::AppError {
            code: "INPUT_REQUIRED".into(),
            message: message.clone(),
            details: None,
            retryable: false,
            content: Some(ServerContent {
                blocks: json!([{"type": "text", "text": format!("INPUT_REQUIRED: {message}")}]),
                structured: false,
                meta,
                input_required: Some(Value::Object(input)),
            }),
        }
    }
}

/// What a retried call adds to its params.
#[derive(Debug)]
pub struct Retry {
    answers: Map<String, Value>,
    state: Option<Value>,
}

impl Retry {
    /// Put the answers (and the state, exactly as the server gave it) into `params`.
    pub fn apply(self, params: &mut Value) {
        let p = params
            .as_object_mut()
            .expect("tools/call params are an object");
        p.insert("inputResponses".into(), Value::Object(self.answers));
        match self.state {
            Some(state) => p.insert("requestState".into(), state),
            None => p.remove("requestState"),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::back::relay::{ClientFeatures, ServerMessage};

    fn asks() -> Value {
        json!({
            "resultType": "input_required",
            "inputRequests": {"confirm": {"method": "elicitation/create", "params": {"message": "ok?"}}},
            "requestState": "opaque",
        })
    }

    #[test]
    fn a_complete_result_asks_nothing() {
        assert_eq!(InputRequired::of(&json!({"content": []})), None);
        assert_eq!(InputRequired::of(&json!({"resultType": "complete"})), None);
        assert!(InputRequired::of(&asks()).is_some());
    }

    #[test]
    fn a_caller_that_was_not_asked_gets_input_required_with_the_questions() {
        let CallOutcome::AppError { code, content, .. } =
            InputRequired::of(&asks()).unwrap().into_outcome(None)
        else {
            panic!("an error")
        };
        assert_eq!(code, "INPUT_REQUIRED");
        let input = content.unwrap().input_required.unwrap();
        assert_eq!(input["requestState"], "opaque");
        assert_eq!(
            input["inputRequests"]["confirm"]["method"],
            "elicitation/create"
        );
    }

    #[tokio::test]
    async fn an_older_era_caller_is_asked_and_the_retry_carries_its_answers_and_the_state() {
        let asked = InputRequired::of(&asks()).unwrap();
        let elicits = ClientFeatures::of(Some(&json!({"elicitation": {}})));
        let (cannot, _rx) = CallerStream::new(None, ClientFeatures::default(), true, None);
        assert!(!asked.askable(&cannot));
        let (modern, _rx) = CallerStream::new(None, elicits, false, None);
        assert!(
            !asked.askable(&modern),
            "a 2026-07-28 caller answers itself"
        );
        let (caller, mut rx) = CallerStream::new(None, elicits, true, None);
        assert!(asked.askable(&caller));
        let answering = tokio::spawn(async move {
            let Some(ServerMessage::Request {
                method,
                params,
                answer,
            }) = rx.recv().await
            else {
                panic!("a request")
            };
            assert_eq!(
                (method.as_str(), &params),
                ("elicitation/create", &json!({"message": "ok?"}))
            );
            answer
                .send(Reply::Result(json!({"action": "accept"})))
                .unwrap();
        });
        let retry = asked.ask(&caller).await.unwrap();
        answering.await.unwrap();
        let mut params = json!({"name": "t", "arguments": {}});
        retry.apply(&mut params);
        assert_eq!(
            params,
            json!({"name": "t", "arguments": {},
                   "inputResponses": {"confirm": {"action": "accept"}}, "requestState": "opaque"})
        );
    }
}
