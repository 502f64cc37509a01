//! What the protocols' one-pass readers share: serde readers of a document's members that
//! borrow strings from the body, and the rules every reader keeps (a member given twice, or
//! one the reader does not name, ends the pass; the general decoding then decides).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};
use serde_json::Value;

/// A string member, borrowed from the document unless it had escapes.
pub struct Text<'a>(pub Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// An unsigned integer member as JSON wrote it (a float such as `3.0` is not one here).
pub struct Whole(pub u64);

impl<'de> Deserialize<'de> for Whole {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Whole;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an unsigned integer")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Whole, E> {
                Ok(Whole(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// An array of strings, checked and dropped.
pub struct Strings;

impl<'de> Deserialize<'de> for Strings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Strings;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of strings")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strings, A::Error> {
                while seq.next_element::<Text<'de>>()?.is_some() {}
                Ok(Strings)
            }
        }
        d.deserialize_seq(V)
    }
}

/// `value` when it is an object.
pub fn object<E: de::Error>(value: Value) -> Result<Value, E> {
    match value {
        Value::Object(_) => Ok(value),
        _ => Err(E::custom("not an object")),
    }
}

/// Stores a member's value; a member given twice is an error (the general path decides).
pub fn once<T, E: de::Error>(slot: &mut Option<T>, value: T) -> Result<(), E> {
    match slot.replace(value) {
        None => Ok(()),
        Some(_) => Err(E::custom("member given twice")),
    }
}

pub fn unknown<E: de::Error>() -> E {
    E::custom("member the schema does not name")
}

/// Reads one whole JSON document from `body` with `T`'s reader.
///
/// The body is checked to be UTF-8 once, as a whole (a word at a time over ASCII), and read as
/// text: serde_json's byte-slice reader checks every string it meets on its own, byte by byte,
/// which cost more than the rest of a small call's parse. A body that is not UTF-8 is no JSON
/// document; the general path says why.
pub fn read<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Option<T> {
    let text = std::str::from_utf8(body).ok()?;
    let mut de = serde_json::Deserializer::from_str(text);
    let doc = T::deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(doc)
}
