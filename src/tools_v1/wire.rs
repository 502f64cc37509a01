//! The two tools-v1 documents of a call read in one pass with borrowed strings: the caller's
//! request and the app's answer, without building a `Value` for their envelopes and walking
//! it with the seed's schema.
//!
//! Each reader accepts only documents the general decoding (strict parse, the seed's schema,
//! the front's own checks) accepts, and gives the same fields; anything else is an error, and
//! the general decoding runs and gives its precise refusal. The fuzz targets
//! `tools_v1_request` and `app_responses` hold both ways to the same result on every input.

use std::borrow::Cow;
use std::fmt;

use carapace_filters::canonical::StrictSeed;
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::one_pass::{object, once, read, unknown, Strings, Text, Whole};

// ---------------------------------------------------------------------------------------
// The app's answer

/// A tools-v1 app's answer, as the back uses it.
#[derive(Debug)]
pub struct Answer<'a> {
    pub call_id: Cow<'a, str>,
    pub tool_name: Cow<'a, str>,
    /// One of the seed's four.
    pub status: Cow<'a, str>,
    /// An object, when given.
    pub result: Option<Value>,
    pub error: Option<AnswerError<'a>>,
}

/// The answer's `error` object.
#[derive(Debug, Default)]
pub struct AnswerError<'a> {
    pub code: Option<Cow<'a, str>>,
    pub message: Option<Cow<'a, str>>,
    /// An object, when given.
    pub details: Option<Value>,
}

/// Read an app's answer in one pass: `None` unless the seed's response schema accepts it.
pub fn read_answer(body: &[u8]) -> Option<Answer<'_>> {
    read(body)
}

impl<'a> Answer<'a> {
    /// The fields of an answer already checked against the seed's response schema.
    pub fn of_valid(doc: &'a Value) -> Answer<'a> {
        let text = |v: &'a Value| v.as_str().map(Cow::Borrowed);
        Answer {
            call_id: text(&doc["call_id"]).unwrap_or_default(),
            tool_name: text(&doc["tool_name"]).unwrap_or_default(),
            status: text(&doc["status"]).unwrap_or_default(),
            result: doc.get("result").cloned(),
            error: doc.get("error").map(|e| AnswerError {
                code: e.get("code").and_then(text),
                message: e.get("message").and_then(text),
                details: e.get("details").cloned(),
            }),
        }
    }
}

const STATUSES: [&str; 4] = ["ok", "error", "retryable_error", "timeout"];

impl<'de> Deserialize<'de> for Answer<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Answer<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a tools-v1 answer")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Answer<'de>, A::Error> {
                let (mut version, mut call_id, mut tool_name, mut status) =
                    (None, None, None, None);
                let (mut result, mut error, mut duration, mut logs) = (None, None, None, None);
                while let Some(Text(key)) = map.next_key()? {
                    match &*key {
                        "version" => once(&mut version, map.next_value::<Text>()?.0)?,
                        "call_id" => once(&mut call_id, map.next_value::<Text>()?.0)?,
                        "tool_name" => once(&mut tool_name, map.next_value::<Text>()?.0)?,
                        "status" => once(&mut status, map.next_value::<Text>()?.0)?,
                        "result" => once(&mut result, object(map.next_value()?)?)?,
                        "error" => once(&mut error, map.next_value::<AnswerError>()?)?,
                        "duration_ms" => once(&mut duration, map.next_value::<Whole>()?.0)?,
                        "logs" => once(&mut logs, map.next_value::<Strings>()?)?,
                        _ => return Err(unknown()),
                    }
                }
                let missing = || de::Error::custom("a required member is missing");
                if version.as_deref() != Some("v1") || duration.is_none() {
                    return Err(missing());
                }
                let status = status.ok_or_else(missing)?;
                if !STATUSES.contains(&&*status) {
                    return Err(de::Error::custom("status the schema does not name"));
                }
                Ok(Answer {
                    call_id: call_id.ok_or_else(missing)?,
                    tool_name: tool_name.ok_or_else(missing)?,
                    status,
                    result,
                    error,
                })
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for AnswerError<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AnswerError<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a tools-v1 error object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<AnswerError<'de>, A::Error> {
                let mut e = AnswerError::default();
                let mut retryable = None;
                while let Some(Text(key)) = map.next_key()? {
                    match &*key {
                        "code" => once(&mut e.code, map.next_value::<Text>()?.0)?,
                        "message" => once(&mut e.message, map.next_value::<Text>()?.0)?,
                        "details" => once(&mut e.details, object(map.next_value()?)?)?,
                        "retryable" => once(&mut retryable, map.next_value::<bool>()?)?,
                        _ => return Err(unknown()),
                    }
                }
                Ok(e)
            }
        }
        d.deserialize_map(V)
    }
}

// ---------------------------------------------------------------------------------------
// The caller's request

/// A `POST /v1/tools/call` body the front accepts, its ids not yet trimmed.
#[derive(Debug)]
pub struct CallBody<'a> {
    pub call_id: Cow<'a, str>,
    pub tool_name: Cow<'a, str>,
    pub tenant_id: Cow<'a, str>,
    pub idempotency_key: Option<Cow<'a, str>>,
    /// An object, read strictly.
    pub args: Value,
    /// The caller's context as its JSON text, following the seed's context schema.
    pub context: &'a str,
    pub timeout_ms: Option<u64>,
}

/// Read a call request in one pass: `None` unless the general decoding would accept it.
pub fn read_call(body: &[u8]) -> Option<CallBody<'_>> {
    read(body)
}

/// The members the seed's schema of a request's `context` names.
const CONTEXT_MEMBERS: [&str; 8] = [
    "agent_id",
    "session_id",
    "platform",
    "channel_id",
    "actor_id",
    "isolation_key",
    "trace_id",
    "request_origin",
];

/// The values the seed's schema allows for `context.request_origin`.
const ORIGINS: [&str; 4] = ["agent_turn", "cron", "operator", "system"];

/// Whether `json` (one JSON value's text) is a `context` following the seed's schema: an
/// object of strings, `agent_id` and `session_id` given, no other member than the schema's and
/// none twice, `request_origin` one of its four. The schema's checks, written out, at a tenth
/// of a general validation's cost, over the text itself (no value is built); a test holds it
/// to the schema.
fn context_follows_schema(json: &str) -> bool {
    /// Reads the context's members, the names it has seen as bits of `CONTEXT_MEMBERS`.
    struct Members;
    impl<'de> Visitor<'de> for Members {
        type Value = u8;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a tools-v1 context")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u8, A::Error> {
            let mut seen = 0u8;
            while let Some(Text(name)) = map.next_key()? {
                let i = CONTEXT_MEMBERS
                    .iter()
                    .position(|m| *m == name)
                    .ok_or_else(unknown)?;
                if seen & (1 << i) != 0 {
                    return Err(de::Error::custom("member given twice"));
                }
                seen |= 1 << i;
                let Text(value) = map.next_value()?;
                if CONTEXT_MEMBERS[i] == "request_origin" && !ORIGINS.contains(&&*value) {
                    return Err(de::Error::custom("request_origin the schema does not name"));
                }
            }
            Ok(seen)
        }
    }
    struct Context;
    impl<'de> Deserialize<'de> for Context {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            // agent_id and session_id: the first two members.
            match d.deserialize_map(Members)? & 0b11 {
                0b11 => Ok(Context),
                _ => Err(de::Error::custom("a required member is missing")),
            }
        }
    }
    let mut de = serde_json::Deserializer::from_str(json);
    Context::deserialize(&mut de).is_ok() && de.end().is_ok()
}

/// Largest `timeout_ms` the seed's request schema allows.
const MAX_TIMEOUT_MS: u64 = 120_000;

impl<'de> Deserialize<'de> for CallBody<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CallBody<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a tools-v1 call request")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CallBody<'de>, A::Error> {
                let (mut version, mut call_id, mut tool_name, mut tenant) =
                    (None, None, None, None);
                let (mut key_, mut args, mut context, mut timeout) = (None, None, None, None);
                // Members of the document's object are one container deep.
                let strict = StrictSeed::at_depth(1);
                while let Some(Text(key)) = map.next_key()? {
                    match &*key {
                        "version" => once(&mut version, map.next_value::<Text>()?.0)?,
                        "call_id" => once(&mut call_id, map.next_value::<Text>()?.0)?,
                        "tool_name" => once(&mut tool_name, map.next_value::<Text>()?.0)?,
                        "tenant_id" => once(&mut tenant, map.next_value::<Text>()?.0)?,
                        "idempotency_key" => once(&mut key_, map.next_value::<Text>()?.0)?,
                        "args" => once(&mut args, object(map.next_value_seed(strict)?)?)?,
                        "context" => once(&mut context, map.next_value::<&RawValue>()?.get())?,
                        "timeout_ms" => once(&mut timeout, map.next_value::<Whole>()?.0)?,
                        _ => return Err(unknown()),
                    }
                }
                let refuse = || de::Error::custom("not a request the front accepts");
                let id = |v: Option<Cow<'de, str>>| v.filter(|s| !s.trim().is_empty());
                if version.as_deref() != Some("v1")
                    || timeout.is_some_and(|t| !(1..=MAX_TIMEOUT_MS).contains(&t))
                {
                    return Err(refuse());
                }
                let context = context.ok_or_else(refuse)?;
                if !context_follows_schema(context) {
                    return Err(refuse());
                }
                Ok(CallBody {
                    call_id: id(call_id).ok_or_else(refuse)?,
                    tool_name: id(tool_name).ok_or_else(refuse)?,
                    tenant_id: id(tenant).ok_or_else(refuse)?,
                    idempotency_key: key_,
                    args: args.ok_or_else(refuse)?,
                    context,
                    timeout_ms: timeout,
                })
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carapace_filters::schema::CompiledSchema;
    use serde_json::json;

    /// The written-out check says what the seed's schema says, member by member.
    #[test]
    fn the_context_check_agrees_with_the_seeds_schema() {
        let schema: Value =
            serde_json::from_str(super::super::REQUEST_SCHEMA).expect("schema is JSON");
        let compiled = CompiledSchema::compile(schema["properties"]["context"].clone())
            .expect("context schema compiles");
        let base = json!({"agent_id": "a", "session_id": "s"});
        let mut cases = vec![
            base.clone(),
            json!({}),
            json!({"agent_id": "a"}),
            json!({"session_id": "s"}),
            json!([]),
            json!("context"),
            json!(null),
            json!({"agent_id": 1, "session_id": "s"}),
            json!({"agent_id": "a", "session_id": null}),
        ];
        // Every member the schema names (taken from it, not from the check), and two it does
        // not.
        let named = schema["properties"]["context"]["properties"]
            .as_object()
            .expect("the schema names members");
        let members: Vec<&str> = named
            .keys()
            .map(String::as_str)
            .chain(["unknown", "Agent_id"])
            .collect();
        let values = [
            json!("x"),
            json!("agent_turn"),
            json!("cron"),
            json!("operator"),
            json!("system"),
            json!("System"),
            json!(""),
            json!(7),
            json!(true),
            json!({}),
            json!(["cron"]),
        ];
        for member in members {
            for value in &values {
                let mut c = base.clone();
                c[member] = value.clone();
                cases.push(c);
            }
        }
        for case in &cases {
            assert_eq!(
                context_follows_schema(&case.to_string()),
                compiled.validate(case).is_ok(),
                "{case}"
            );
        }
        let follows = cases
            .iter()
            .filter(|c| context_follows_schema(&c.to_string()));
        assert!(follows.count() > 10);
        // What a value cannot hold: a member given twice, escapes, space around the text.
        for (text, follows) in [
            (r#"{"agent_id":"a","session_id":"s","agent_id":"b"}"#, false),
            (
                r#"{"agent_id":"a","session_id":"s","trace_id":"t","trace_id":"t"}"#,
                false,
            ),
            (r#"{"agent\u005fid":"a","session_id":"s\n"}"#, true),
            (r#"{ "agent_id" : "a" , "session_id" : "s" }"#, true),
            (r#"{"agent_id":"a","session_id":"s"} x"#, false),
        ] {
            assert_eq!(context_follows_schema(text), follows, "{text}");
        }
    }
}
