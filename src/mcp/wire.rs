//! A `tools/call` request read in one pass: the JSON-RPC envelope and the members of `params`
//! the front uses, without building a map for the message, `params` and `_meta`.
//!
//! [`read_tools_call`] accepts only a message the general decoding ([`super::jsonrpc::decode`]
//! and then [`CallParams::from_map`]) reads as a `tools/call` request, and gives the same id
//! and parameters; anything else (a member given twice, another method, a response, an id the
//! front refuses, a `_meta` that is not an object, an unknown envelope member) is `None`, and
//! the general decoding runs and gives its answer. The fuzz target `mcp_request` holds both
//! ways to the same result on every input.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};

use super::back::relay::RetryInput;
use super::{META_CAPABILITIES, META_VERSION};
use crate::one_pass::{once, read, unknown, Text};

/// `_meta` members the front reads of a request, besides the version and capabilities.
const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
const META_PROGRESS: &str = "progressToken";
const META_IDEMPOTENCY_KEY: &str = crate::front::MCP_IDEMPOTENCY_KEY;

/// What the front reads of a `tools/call` request's `params`; everything else in them is
/// ignored, as before.
#[derive(Debug, Default, PartialEq)]
pub struct CallParams {
    /// `name`, when it is a string.
    pub name: Option<String>,
    /// `arguments`, as given (the front requires an object or `null`).
    pub arguments: Option<Value>,
    /// `_meta`, when it is an object (boxed: the parameters are moved from the reader through
    /// `message` to `tools_call`, and most of their size would be `_meta`'s five values).
    pub meta: Option<Box<CallMeta>>,
    /// `inputResponses` and `requestState`, when given.
    pub retry: Option<RetryInput>,
}

/// The members of a request's `_meta` the front reads, as given.
#[derive(Debug, Default, PartialEq)]
pub struct CallMeta {
    pub version: Option<Value>,
    pub capabilities: Option<Value>,
    pub log_level: Option<Value>,
    pub progress_token: Option<Value>,
    pub idempotency_key: Option<Value>,
}

/// A `tools/call` request: its id (a string or a number) and parameters.
#[derive(Debug, PartialEq)]
pub struct CallRequest {
    pub id: Value,
    pub params: CallParams,
}

/// Read a `tools/call` request in one pass; `None` for anything else, which the general
/// decoding then reads.
pub fn read_tools_call(body: &[u8]) -> Option<CallRequest> {
    read(body)
}

impl CallParams {
    /// The parameters of a request the general decoding read.
    pub fn from_map(mut params: Map<String, Value>) -> CallParams {
        let name = match params.remove("name") {
            Some(Value::String(s)) => Some(s),
            _ => None,
        };
        let meta = match params.remove("_meta") {
            Some(Value::Object(mut m)) => Some(Box::new(CallMeta {
                version: m.remove(META_VERSION),
                capabilities: m.remove(META_CAPABILITIES),
                log_level: m.remove(META_LOG_LEVEL),
                progress_token: m.remove(META_PROGRESS),
                idempotency_key: m.remove(META_IDEMPOTENCY_KEY),
            })),
            _ => None,
        };
        CallParams {
            retry: RetryInput::of(&params),
            name,
            arguments: params.remove("arguments"),
            meta,
        }
    }
}

impl<'de> Deserialize<'de> for CallRequest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CallRequest;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON-RPC tools/call request")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CallRequest, A::Error> {
                let (mut jsonrpc, mut id, mut method, mut params) = (None, None, None, None);
                while let Some(Text(key)) = map.next_key()? {
                    match &*key {
                        "jsonrpc" => once(&mut jsonrpc, map.next_value::<Text>()?.0)?,
                        "id" => once(&mut id, map.next_value::<Value>()?)?,
                        "method" => once(&mut method, map.next_value::<Text>()?.0)?,
                        "params" => once(&mut params, map.next_value::<CallParams>()?)?,
                        // `result` and `error` make a response; others are left to the
                        // general decoding.
                        _ => return Err(unknown()),
                    }
                }
                let refuse = || de::Error::custom("not a tools/call request");
                if jsonrpc.as_deref() != Some("2.0") || method.as_deref() != Some("tools/call") {
                    return Err(refuse());
                }
                match id {
                    Some(id @ (Value::String(_) | Value::Number(_))) => Ok(CallRequest {
                        id,
                        params: params.unwrap_or_default(),
                    }),
                    _ => Err(refuse()),
                }
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for CallParams {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CallParams;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("tools/call params")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CallParams, A::Error> {
                let (mut name, mut arguments, mut meta) = (None, None, None);
                let mut retry = Map::new();
                while let Some(Text(key)) = map.next_key()? {
                    match &*key {
                        "name" => once(&mut name, map.next_value::<Value>()?)?,
                        "arguments" => once(&mut arguments, map.next_value::<Value>()?)?,
                        "_meta" => once(&mut meta, map.next_value::<BoxedMeta>()?.0)?,
                        k @ ("inputResponses" | "requestState") => {
                            let value = map.next_value::<Value>()?;
                            if retry.insert(k.to_owned(), value).is_some() {
                                return Err(de::Error::custom("member given twice"));
                            }
                        }
                        // Read (the general decoding would refuse what this refuses) and
                        // dropped.
                        _ => drop(map.next_value::<Value>()?),
                    }
                }
                Ok(CallParams {
                    name: match name {
                        Some(Value::String(s)) => Some(s),
                        _ => None,
                    },
                    arguments,
                    meta,
                    retry: (!retry.is_empty()).then_some(RetryInput(retry)),
                })
            }
        }
        d.deserialize_map(V)
    }
}

/// A request's `_meta`, read into its box (not moved there once read).
struct BoxedMeta(Box<CallMeta>);

impl<'de> Deserialize<'de> for BoxedMeta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = BoxedMeta;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a request's _meta object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BoxedMeta, A::Error> {
                let mut m = Box::<CallMeta>::default();
                while let Some(Text(key)) = map.next_key()? {
                    let slot = match &*key {
                        META_VERSION => &mut m.version,
                        META_CAPABILITIES => &mut m.capabilities,
                        META_LOG_LEVEL => &mut m.log_level,
                        META_PROGRESS => &mut m.progress_token,
                        META_IDEMPOTENCY_KEY => &mut m.idempotency_key,
                        _ => {
                            drop(map.next_value::<Value>()?);
                            continue;
                        }
                    };
                    once(slot, map.next_value::<Value>()?)?;
                }
                Ok(BoxedMeta(m))
            }
        }
        d.deserialize_map(V)
    }
}

/// The general decoding's reading of `body` as a `tools/call` request: the decoder, then
/// [`CallParams::from_map`]. What [`read_tools_call`] must agree with.
#[doc(hidden)]
pub fn read_tools_call_general(body: &[u8]) -> Option<CallRequest> {
    match super::jsonrpc::decode(body) {
        Ok(super::jsonrpc::Message::Request { id, method, params }) if method == "tools/call" => {
            Some(CallRequest {
                id,
                params: CallParams::from_map(params),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message with `params` as given (`members` written into it verbatim).
    fn call(params: &str) -> String {
        format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{{params}}}}}"#)
    }

    const MODERN_META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;

    fn nested(depth: usize) -> String {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn the_reader_agrees_with_the_general_decoding() {
        let taken = [
            call(&format!(
                r#""name":"echo","arguments":{{"a":[1,2.5,"x"]}},{MODERN_META}"#
            )),
            call(r#""name":"echo","arguments":{},"_meta":{"progressToken":"p1"}"#),
            call(r#""name":"echo","_meta":{"io.carapace/idempotency-key":"k-1","x":[{}]}"#),
            call(r#""name":"echo","_meta":{"io.modelcontextprotocol/logLevel":"debug"}"#),
            call(r#""name":"echo","inputResponses":{"a":{}},"requestState":"s","other":[1]"#),
            call(r#""name":5,"arguments":null"#),
            call(r#""name":"echo","arguments":[1]"#),
            call(r#""na\u006de":"ec\"ho","_m\u0065ta":{"progr\u0065ssToken":3}"#),
            call(&format!(
                r#""name":"e","arguments":{{"d":{}}}"#,
                nested(120)
            )),
            call(""),
            r#"{"params":{"name":"echo"},"method":"tools/call","id":"r-1","jsonrpc":"2.0"}"#.into(),
            r#" {"jsonrpc":"2.0","id":1.5,"method":"tools/call"} "#.into(),
        ];
        let left = [
            call(r#""name":"a","name":"b""#),
            call(r#""_meta":{},"_meta":{"progressToken":1}"#),
            call(r#""_meta":{"progressToken":1,"progressToken":2}"#),
            call(r#""inputResponses":1,"inputResponses":2"#),
            call(r#""_meta":[]"#),
            call(&format!(
                r#""name":"e","arguments":{{"d":{}}}"#,
                nested(130)
            )),
            call(&format!(r#""name":"e","other":{}"#, nested(130))),
            call(&format!(r#""_meta":{{"other":{}}}"#, nested(130))),
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/call"}"#.into(),
            r#"{"jsonrpc":"2.0","id":{},"method":"tools/call"}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call"}"#.into(),
            r#"{"jsonrpc":"2.0","method":"tools/call"}"#.into(),
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/call"}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[]}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","extra":1}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"} x"#.into(),
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call"}]"#.into(),
        ];
        for body in &taken {
            let fast = read_tools_call(body.as_bytes());
            assert!(fast.is_some(), "the reader takes {body}");
            assert_eq!(fast, read_tools_call_general(body.as_bytes()), "{body}");
        }
        for body in &left {
            assert_eq!(read_tools_call(body.as_bytes()), None, "{body}");
        }
        // Text beyond ASCII is read; a body that is not UTF-8 is left to the general path, which
        // refuses it too.
        let unicode = call(r#""name":"écho","arguments":{"q":"日本 ünï"}"#);
        assert!(read_tools_call(unicode.as_bytes()).is_some());
        assert_eq!(
            read_tools_call(unicode.as_bytes()),
            read_tools_call_general(unicode.as_bytes())
        );
        let mut broken = call(r#""name":"echo","arguments":{"q":"~"}"#).into_bytes();
        let at = broken.iter().position(|&b| b == b'~').unwrap();
        broken[at] = 0xff;
        assert_eq!(read_tools_call(&broken), None);
        assert_eq!(read_tools_call_general(&broken), None);
        // What the reader gives, member by member.
        let body = call(&format!(
            r#""name":"echo","arguments":{{"q":1}},"requestState":"s",{MODERN_META}"#
        ));
        let read = read_tools_call(body.as_bytes()).unwrap();
        assert_eq!(read.id, Value::from(7));
        assert_eq!(read.params.name.as_deref(), Some("echo"));
        assert_eq!(read.params.arguments, Some(serde_json::json!({"q": 1})));
        let meta = read.params.meta.unwrap();
        assert_eq!(meta.version, Some(Value::from("2026-07-28")));
        assert_eq!(meta.capabilities, Some(serde_json::json!({})));
        assert_eq!(read.params.retry.unwrap().0["requestState"], "s");
    }
}
