//! The strict parser: [`parse_strict`] and its visitor.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::{render_path, CanonicalError, Seg, MAX_DEPTH};

/// Structured error recorded beside serde's stringly error while it unwinds.
enum Pending {
    Duplicate {
        key: String,
        segs: Vec<Seg<'static>>,
    },
    TooDeep,
}

type PendingCell = RefCell<Option<Pending>>;

/// Parse a request body strictly: like `serde_json::from_slice::<Value>`, but duplicate object
/// members are an error ([`CanonicalError::DuplicateMember`]) instead of last-wins, and nesting
/// is capped (see [`MAX_DEPTH`]; deeper input is [`CanonicalError::TooDeep`]).
///
/// Everything serde_json refuses (invalid UTF-8, lone surrogates, numbers out of `f64` range,
/// trailing data, ...) is [`CanonicalError::Syntax`].
pub fn parse_strict(bytes: &[u8]) -> Result<Value, CanonicalError> {
    let pending = PendingCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = StrictValue {
        depth: 0,
        pending: &pending,
    }
    .deserialize(&mut de)
    .and_then(|value| de.end().map(|()| value));
    parsed.map_err(|err| match pending.into_inner() {
        Some(Pending::Duplicate { key, segs }) => CanonicalError::DuplicateMember {
            path: render_path(&segs),
            key,
        },
        Some(Pending::TooDeep) => CanonicalError::TooDeep(MAX_DEPTH),
        None => {
            let msg = err.to_string();
            if msg.starts_with("recursion limit exceeded") {
                CanonicalError::TooDeep(MAX_DEPTH)
            } else {
                CanonicalError::Syntax(msg)
            }
        }
    })
}

/// A value inside a document that other code reads, parsed as [`parse_strict`] parses it
/// (duplicate members refused, nesting capped) when it sits `depth` containers deep: for a
/// member of the document's top-level object, `at_depth(1)`. Its error says only that the
/// value is not strict; [`parse_strict`] on the whole document gives the structured one.
#[derive(Clone, Copy, Debug)]
pub struct StrictSeed {
    depth: usize,
}

impl StrictSeed {
    pub fn at_depth(depth: usize) -> Self {
        StrictSeed { depth }
    }
}

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        let pending = PendingCell::new(None);
        StrictValue {
            depth: self.depth,
            pending: &pending,
        }
        .deserialize(deserializer)
    }
}

/// Seed and visitor building a `Value` at nesting `depth` (number of enclosing containers).
#[derive(Clone, Copy)]
struct StrictValue<'p> {
    depth: usize,
    pending: &'p PendingCell,
}

impl<'p> StrictValue<'p> {
    /// Seed for the members/elements of a container at `self.depth`, or an error if that
    /// container is one level too deep.
    fn enter<E: de::Error>(self) -> Result<Self, E> {
        if self.depth >= MAX_DEPTH {
            *self.pending.borrow_mut() = Some(Pending::TooDeep);
            return Err(E::custom(format_args!(
                "nesting deeper than {MAX_DEPTH} levels"
            )));
        }
        Ok(StrictValue {
            depth: self.depth + 1,
            pending: self.pending,
        })
    }

    /// Adds `seg` to the path of a pending duplicate-member error passing through.
    fn note<E>(self, seg: impl FnOnce() -> Seg<'static>, err: E) -> E {
        if let Some(Pending::Duplicate { segs, .. }) = &mut *self.pending.borrow_mut() {
            segs.push(seg());
        }
        err
    }
}

impl<'de> DeserializeSeed<'de> for StrictValue<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // Same as serde_json's own `Value` (it never produces non-finite floats).
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let child = self.enter()?;
        let mut items = Vec::new();
        while let Some(item) = seq
            .next_element_seed(child)
            .map_err(|e| self.note(|| Seg::Index(items.len()), e))?
        {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let child = self.enter()?;
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            if map.contains_key(&key) {
                let err = de::Error::custom(format_args!("duplicate member `{key}`"));
                *self.pending.borrow_mut() = Some(Pending::Duplicate {
                    key,
                    segs: Vec::new(),
                });
                return Err(err);
            }
            let value = access
                .next_value_seed(child)
                .map_err(|e| self.note(|| Seg::Key(Cow::Owned(key.clone())), e))?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::canonical_string;
    use serde_json::json;

    #[test]
    fn strict_rejects_duplicates_with_path() {
        assert_eq!(
            parse_strict(br#"{"a":1,"a":2}"#),
            Err(CanonicalError::DuplicateMember {
                path: String::new(),
                key: "a".into()
            })
        );
        assert_eq!(
            parse_strict(br#"{"input":{"x":[0,{"k":1,"j":{},"k":2}]},"k":3}"#),
            Err(CanonicalError::DuplicateMember {
                path: "/input/x/1".into(),
                key: "k".into()
            })
        );
        assert_eq!(
            parse_strict(br#"{"a/b":{"~":{"d":1,"d":{"e":1}}}}"#),
            Err(CanonicalError::DuplicateMember {
                path: "/a~1b/~0".into(),
                key: "d".into()
            })
        );
        // Duplicates after decoding escapes.
        assert!(matches!(
            parse_strict(br#"{"a":1,"\u0061":2}"#),
            Err(CanonicalError::DuplicateMember { .. })
        ));
        // Same key in sibling objects is fine.
        assert!(parse_strict(br#"{"a":{"k":1},"b":{"k":1}}"#).is_ok());
    }

    #[test]
    fn strict_accepts_ordinary_json_like_serde_json() {
        for text in [
            r#"{"a":[1,-2,3.5,1e3,"s",true,false,null,{}],"b":{"c":"\u00e9\ud83d\ude00"}}"#,
            "  [ ]  ",
            "\"x\"",
            "0",
            "-0",
            "18446744073709551615",
            "-9223372036854775808",
            "1.7976931348623157e308",
        ] {
            let ours = parse_strict(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
            let theirs: Value = serde_json::from_str(text).expect("serde_json");
            assert_eq!(ours, theirs, "{text}");
        }
    }

    #[test]
    fn strict_rejects_syntax_errors() {
        for bad in [
            &b"{\"a\":1} x"[..],
            b"{\"a\":1,}",
            b"",
            b"{\"s\":\"\xff\"}",
            b"{\"s\":\"\\ud800x\"}",
            b"1e400",
            b"NaN",
        ] {
            assert!(
                matches!(parse_strict(bad), Err(CanonicalError::Syntax(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    fn nested(levels: usize, open: &str, close: &str) -> String {
        format!("{}1{}", open.repeat(levels), close.repeat(levels))
    }

    #[test]
    fn strict_caps_depth() {
        let too_deep = Err(CanonicalError::TooDeep(MAX_DEPTH));
        assert!(parse_strict(nested(127, "[", "]").as_bytes()).is_ok());
        assert!(parse_strict(nested(127, r#"{"a":"#, "}").as_bytes()).is_ok());
        // serde_json's own limit refuses the 128th nested container (see MAX_DEPTH).
        assert_eq!(parse_strict(nested(128, "[", "]").as_bytes()), too_deep);
        assert_eq!(
            parse_strict(nested(MAX_DEPTH + 1, "[", "]").as_bytes()),
            too_deep
        );
        assert_eq!(
            parse_strict(nested(MAX_DEPTH + 1, r#"{"a":"#, "}").as_bytes()),
            too_deep
        );
        assert_eq!(parse_strict(nested(5000, "[", "]").as_bytes()), too_deep);
    }

    /// Our own depth check (backstop for serde_json's limit) fires at MAX_DEPTH + 1.
    #[test]
    fn strict_seed_depth_check() {
        let pending = PendingCell::new(None);
        let seed = StrictValue {
            depth: MAX_DEPTH,
            pending: &pending,
        };
        let mut de = serde_json::Deserializer::from_str("[1]");
        assert!(seed.deserialize(&mut de).is_err());
        assert!(matches!(pending.into_inner(), Some(Pending::TooDeep)));
        let pending = PendingCell::new(None);
        let seed = StrictValue {
            depth: MAX_DEPTH,
            pending: &pending,
        };
        let mut de = serde_json::Deserializer::from_str("1");
        assert_eq!(seed.deserialize(&mut de).ok(), Some(json!(1)));
    }

    /// JS parses decimal literals with correct rounding; serde_json only does with its
    /// `float_roundtrip` feature (enabled in this crate through jsonschema). These literals, as
    /// `JSON.stringify` emits them, are parsed one ULP off by serde_json's default fast path,
    /// which would make the canonical string (and so the signature) disagree with Vagus.
    #[test]
    fn number_parsing_is_correctly_rounded() {
        for text in [
            "9.152833412054431e-9",
            "8.80575302469665e-22",
            "1.085849574315899e-17",
        ] {
            let expected: f64 = text.parse().expect("std parse");
            let ours = parse_strict(text.as_bytes()).expect("parse");
            assert_eq!(
                ours.as_f64(),
                Some(expected),
                "{text}: serde_json without `float_roundtrip`?"
            );
            assert_eq!(canonical_string(&ours).as_deref(), Ok(text));
        }
    }
}
