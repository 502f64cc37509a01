//! A `POST /run` body read in one pass with borrowed strings, and its signed (canonical) form
//! written from the members read, without building a `Value` for the envelope.
//!
//! The reader accepts only bodies the general decoding (strict parse, the signed fields'
//! checks, the canonical writer) accepts, and gives the same fields; anything else ends the
//! pass and the general decoding runs and gives its precise refusal. The `skill_v1_request`
//! fuzz target holds both ways to the same result on every input.

use std::borrow::Cow;
use std::fmt;

use carapace_filters::canonical::{write_canonical, write_canonical_str, StrictSeed};
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use crate::one_pass::{object, once, read, unknown, Text, Whole};

/// Largest `timestamp` the front takes (whole Unix ms below 9e15, exact as a double).
const MAX_TIMESTAMP: u64 = 9_000_000_000_000_000;

/// The members of a `/run` body, each of the type the front requires.
#[derive(Debug)]
pub struct RunBody<'a> {
    pub gateway_protocol_version: Cow<'a, str>,
    pub skill_id: Cow<'a, str>,
    pub capability: Cow<'a, str>,
    /// An object, read strictly.
    pub input: Value,
    /// Whole Unix ms below [`MAX_TIMESTAMP`], written as an integer.
    pub timestamp: u64,
    pub nonce: Cow<'a, str>,
    pub signature: Cow<'a, str>,
}

/// Read a `/run` body in one pass: `None` unless every member is one of the signed fields or
/// `signature`, each given once and of its type.
pub fn read_run(body: &[u8]) -> Option<RunBody<'_>> {
    read(body)
}

impl RunBody<'_> {
    /// The signed form: the Skill Gateway canonical form of the body without `signature`
    /// (members in their sorted order, none of them an array index). `None` when the input
    /// has no canonical form (the general decoding says why).
    pub fn canonical(&self, capacity: usize) -> Option<String> {
        let mut out = String::with_capacity(capacity);
        out.push_str(r#"{"capability":"#);
        write_canonical_str(&self.capability, &mut out);
        out.push_str(r#","gateway_protocol_version":"#);
        write_canonical_str(&self.gateway_protocol_version, &mut out);
        out.push_str(r#","input":"#);
        write_canonical(&self.input, &mut out).ok()?;
        out.push_str(r#","nonce":"#);
        write_canonical_str(&self.nonce, &mut out);
        out.push_str(r#","skill_id":"#);
        write_canonical_str(&self.skill_id, &mut out);
        out.push_str(r#","timestamp":"#);
        // Below 2^53: the double's ECMAScript form is the integer's digits.
        out.push_str(itoa::Buffer::new().format(self.timestamp));
        out.push('}');
        Some(out)
    }
}

impl<'de> Deserialize<'de> for RunBody<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RunBody<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a skill-v1 run request")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RunBody<'de>, A::Error> {
                let (mut version, mut skill_id, mut capability) = (None, None, None);
                let (mut input, mut timestamp, mut nonce, mut signature) = (None, None, None, None);
                // Members of the document's object are one container deep.
                let strict = StrictSeed::at_depth(1);
                while let Some(Text(key)) = map.next_key()? {
                    match &*key {
                        "gateway_protocol_version" => {
                            once(&mut version, map.next_value::<Text>()?.0)?
                        }
                        "skill_id" => once(&mut skill_id, map.next_value::<Text>()?.0)?,
                        "capability" => once(&mut capability, map.next_value::<Text>()?.0)?,
                        "input" => once(&mut input, object(map.next_value_seed(strict)?)?)?,
                        "timestamp" => once(&mut timestamp, map.next_value::<Whole>()?.0)?,
                        "nonce" => once(&mut nonce, map.next_value::<Text>()?.0)?,
                        "signature" => once(&mut signature, map.next_value::<Text>()?.0)?,
                        _ => return Err(unknown()),
                    }
                }
                let missing = || de::Error::custom("a member is missing");
                let timestamp = timestamp
                    .filter(|t| *t < MAX_TIMESTAMP)
                    .ok_or_else(missing)?;
                Ok(RunBody {
                    gateway_protocol_version: version.ok_or_else(missing)?,
                    skill_id: skill_id.ok_or_else(missing)?,
                    capability: capability.ok_or_else(missing)?,
                    input: input.ok_or_else(missing)?,
                    timestamp,
                    nonce: nonce.ok_or_else(missing)?,
                    signature: signature.ok_or_else(missing)?,
                })
            }
        }
        d.deserialize_map(V)
    }
}
