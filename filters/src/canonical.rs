//! Canonical JSON and HMAC-SHA256 for Skill Gateway v1 signatures (Vagus compatible).
//!
//! The reference implementation (Vagus-Bot, TypeScript) signs
//! `JSON.stringify(sortKeysDeep(fields))` with HMAC-SHA256. This module reproduces that string
//! byte for byte from a [`serde_json::Value`]:
//!
//! * **Object members** are ordered the way a JS engine enumerates an object whose keys were
//!   inserted in `Array.prototype.sort()` order: first every *array-index* key (a canonical
//!   decimal integer `0..=4294967294`: digits only, no sign, no leading zero except `"0"`
//!   itself) in ascending numeric order, then all other keys ordered by UTF-16 code units
//!   (not by UTF-8 bytes / code points: an astral character such as `😀` sorts *before*
//!   `U+E000..=U+FFFF`).
//! * **Arrays** keep their order.
//! * **Numbers** are coerced to `f64` and printed with ECMAScript `Number::toString`
//!   (`1.0` → `1`, `-0` → `0`, `1e21` → `1e+21`, `1e-7` → `1e-7`, `0.000001` stays fixed,
//!   integers above 2⁵³ are rounded to the nearest `f64`).
//! * **Strings** are escaped like `JSON.stringify`: `\"` `\\` `\b` `\f` `\n` `\r` `\t`, the other
//!   C0 controls as `\u00xx` (lowercase hex); everything else, including `/`, DEL, U+2028,
//!   U+2029 and all non-ASCII characters, is emitted as raw UTF-8.
//! * No insignificant whitespace.
//!
//! # Where this module deliberately fails closed
//!
//! * A member named `__proto__` is silently **dropped** by the JS implementation (the assignment
//!   hits the prototype setter), so the body would carry data the MAC does not cover. Such a
//!   member at any depth is refused with [`CanonicalError::UncoveredMember`].
//! * JS `JSON.parse` lets the last duplicate member win; [`parse_strict`] refuses duplicates
//!   ([`CanonicalError::DuplicateMember`]) so the value that is verified is never ambiguous.
//! * Lone surrogates (`"\ud800"`) and out-of-range numbers (`1e400`, which JS turns into
//!   `Infinity` and then `null`) cannot be represented in a `serde_json::Value`; the parser
//!   refuses them ([`CanonicalError::Syntax`]).
//!
//! Number parsing precision: the canonical number is the `f64` that serde_json parsed. JS
//! parses decimal literals with correct rounding; serde_json only does so with its
//! `float_roundtrip` feature (its default fast path can be one ULP off for long mantissas).
//! This crate enables that feature in its manifest; a unit test guards it.

use std::borrow::Cow;
use std::cell::RefCell;
use std::cmp::Ordering;
use std::fmt;

use hmac::{Hmac, Mac};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Maximum number of nested arrays/objects accepted by [`parse_strict`] and [`write_canonical`].
///
/// [`write_canonical`] accepts exactly `MAX_DEPTH` nested containers. [`parse_strict`] is in
/// practice one level stricter: serde_json's built-in recursion limit (which cannot be turned
/// off without its `unbounded_depth` feature) already refuses the 128th nested container; that
/// refusal is reported as [`CanonicalError::TooDeep`] as well. The parser's own check is the
/// backstop should that limit ever be disabled.
pub const MAX_DEPTH: usize = 128;

/// Error for inputs whose canonical form would not cover everything they carry.
///
/// Paths are JSON Pointers (RFC 6901) to the *object* concerned: `""` is the root,
/// `/input/a` is member `a` of member `input`, array elements are addressed by index,
/// and `~` / `/` inside keys are written `~0` / `~1`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CanonicalError {
    /// The object at `path` has a member named `__proto__`, which the reference implementation
    /// drops from the signed string.
    #[error("member `__proto__` at {path} is not covered by the canonical form")]
    UncoveredMember {
        /// JSON Pointer of the object that holds the `__proto__` member.
        path: String,
    },
    /// The value at `path` is an integer beyond ±2^53 that is not what JS prints for its
    /// nearest double: the reference signs that double while the body carries the exact
    /// integer.
    #[error("integer at {path} is outside ±2^53 and cannot be signed exactly")]
    InexactInteger {
        /// JSON Pointer of the number.
        path: String,
    },
    /// The object at `path` has member `key` more than once.
    #[error("duplicate member `{key}` at {path}")]
    DuplicateMember {
        /// JSON Pointer of the object that holds the duplicate.
        path: String,
        /// The repeated member name.
        key: String,
    },
    /// The body is not JSON that can be represented faithfully (includes lone surrogates,
    /// numbers out of `f64` range and trailing data).
    #[error("body is not valid JSON: {0}")]
    Syntax(String),
    /// More than the given number of nested arrays/objects.
    #[error("nesting deeper than {0} levels")]
    TooDeep(usize),
}

// ---------------------------------------------------------------------------------------------
// Error paths (built lazily, only when an error unwinds)
// ---------------------------------------------------------------------------------------------

/// One step of a JSON Pointer.
enum Seg<'a> {
    Key(Cow<'a, str>),
    Index(usize),
}

/// Renders segments collected innermost-first (while unwinding) as a JSON Pointer.
fn render_path(innermost_first: &[Seg<'_>]) -> String {
    let mut path = String::new();
    for seg in innermost_first.iter().rev() {
        path.push('/');
        match seg {
            Seg::Key(k) => {
                for c in k.chars() {
                    match c {
                        '~' => path.push_str("~0"),
                        '/' => path.push_str("~1"),
                        c => path.push(c),
                    }
                }
            }
            Seg::Index(i) => {
                use fmt::Write as _;
                let _ = write!(path, "{i}");
            }
        }
    }
    path
}

// ---------------------------------------------------------------------------------------------
// Canonical writer
// ---------------------------------------------------------------------------------------------

/// Internal error of the writer; carries the path segments collected while unwinding.
enum WriteError<'a> {
    Uncovered(Vec<Seg<'a>>),
    Integer(Vec<Seg<'a>>),
    TooDeep,
    Number,
}

impl<'a> WriteError<'a> {
    fn within(mut self, seg: Seg<'a>) -> Self {
        if let WriteError::Uncovered(segs) | WriteError::Integer(segs) = &mut self {
            segs.push(seg);
        }
        self
    }

    fn into_public(self) -> CanonicalError {
        match self {
            WriteError::Uncovered(segs) => CanonicalError::UncoveredMember {
                path: render_path(&segs),
            },
            WriteError::Integer(segs) => CanonicalError::InexactInteger {
                path: render_path(&segs),
            },
            WriteError::TooDeep => CanonicalError::TooDeep(MAX_DEPTH),
            WriteError::Number => {
                CanonicalError::Syntax("number is not representable as a finite f64".to_owned())
            }
        }
    }
}

/// Write the Vagus-compatible canonical form of `value` into `out`.
///
/// The output is appended to `out`. On error `out` is truncated back to its original length,
/// so a partial canonical string is never left behind to be MACed.
pub fn write_canonical(value: &Value, out: &mut String) -> Result<(), CanonicalError> {
    let original_len = out.len();
    // One scratch stack of (key, value) pairs shared by all objects of the document: each
    // object pushes its members, sorts its own slice and truncates it again when done.
    let mut members: Vec<(&str, &Value)> = Vec::new();
    write_value(value, out, &mut members, 0).map_err(|e| {
        out.truncate(original_len);
        e.into_public()
    })
}

/// The canonical form of `value` as a new `String` (see [`write_canonical`]).
pub fn canonical_string(value: &Value) -> Result<String, CanonicalError> {
    let mut out = String::new();
    write_canonical(value, &mut out)?;
    Ok(out)
}

fn write_value<'a>(
    value: &'a Value,
    out: &mut String,
    members: &mut Vec<(&'a str, &'a Value)>,
    depth: usize,
) -> Result<(), WriteError<'a>> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(n, out)?,
        Value::String(s) => write_str(s, out),
        Value::Array(items) => {
            if depth >= MAX_DEPTH {
                return Err(WriteError::TooDeep);
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out, members, depth + 1).map_err(|e| e.within(Seg::Index(i)))?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            if depth >= MAX_DEPTH {
                return Err(WriteError::TooDeep);
            }
            if map.contains_key("__proto__") {
                return Err(WriteError::Uncovered(Vec::new()));
            }
            let start = members.len();
            members.extend(map.iter().map(|(k, v)| (k.as_str(), v)));
            let end = members.len();
            // Keys are unique, so an unstable sort is deterministic. serde_json's map already
            // iterates in code-point order, which this sort only has to touch up.
            members[start..end].sort_unstable_by(|a, b| js_key_order(a.0, b.0));
            out.push('{');
            for j in start..end {
                let (key, member) = members[j];
                if j > start {
                    out.push(',');
                }
                write_str(key, out);
                out.push(':');
                write_value(member, out, members, depth + 1)
                    .map_err(|e| e.within(Seg::Key(Cow::Borrowed(key))))?;
            }
            members.truncate(start);
            out.push('}');
        }
    }
    Ok(())
}

/// Order in which JS enumerates the keys of an object built from `Object.keys(o).sort()`:
/// array-index keys first, numerically; then the rest by UTF-16 code units.
fn js_key_order(a: &str, b: &str) -> Ordering {
    match (array_index(a), array_index(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => cmp_utf16(a, b),
    }
}

/// `Some(n)` if `key` is an ECMAScript array index: the canonical decimal form of an integer
/// in `0..=2^32 - 2`.
fn array_index(key: &str) -> Option<u32> {
    match key.as_bytes() {
        [b'0'] => Some(0),
        digits @ [b'1'..=b'9', rest @ ..] if rest.len() < 10 => {
            let mut n: u64 = 0;
            for &d in digits {
                if !d.is_ascii_digit() {
                    return None;
                }
                n = n * 10 + u64::from(d - b'0');
            }
            u32::try_from(n).ok().filter(|&n| n != u32::MAX)
        }
        _ => None,
    }
}

/// Compares two strings by their UTF-16 code units, i.e. exactly like
/// `a.encode_utf16().cmp(b.encode_utf16())`, without transcoding.
///
/// UTF-8 byte order equals code-point order, and code-point order equals UTF-16 order except
/// between a supplementary character (UTF-16 surrogates `D800..DFFF`, UTF-8 lead byte
/// `F0..=F4`) and a character in `U+E000..=U+FFFF` (lead byte `EE` or `EF`). At the first
/// differing byte both strings are at a character boundary unless the byte is a continuation
/// byte (`80..=BF`), in which case both characters share their lead byte and hence their class.
fn cmp_utf16(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    match a.iter().zip(b).position(|(x, y)| x != y) {
        None => a.len().cmp(&b.len()),
        Some(i) => {
            let (x, y) = (a[i], b[i]);
            let x_astral = x >= 0xF0;
            let y_astral = y >= 0xF0;
            let x_high_bmp = matches!(x, 0xEE | 0xEF);
            let y_high_bmp = matches!(y, 0xEE | 0xEF);
            if x_astral && y_high_bmp {
                Ordering::Less
            } else if x_high_bmp && y_astral {
                Ordering::Greater
            } else {
                x.cmp(&y)
            }
        }
    }
}

/// 2^53: every integer up to this magnitude is exact in `f64` and prints as plain digits.
const MAX_EXACT_INT: u64 = 1 << 53;

fn write_number<'a>(n: &Number, out: &mut String) -> Result<(), WriteError<'a>> {
    if let Some(u) = n.as_u64() {
        write_integer(false, u, out)
    } else if let Some(i) = n.as_i64() {
        write_integer(i < 0, i.unsigned_abs(), out)
    } else {
        // Without serde_json's `arbitrary_precision` this is always `Some(finite)`. A float is
        // forwarded as the same double it was signed as.
        write_f64(n.as_f64().ok_or(WriteError::Number)?, out)
    }
}

/// An integer is signed as JS prints the double nearest to it. Up to ±2^53 that is the
/// integer itself. Beyond, it is only when the integer is exactly what JS prints for its
/// double (`12345678901234567000`); any other integer (`9007199254740993`) would share its
/// signature with a different body while the app reads the exact integer, so it is refused.
fn write_integer<'a>(
    negative: bool,
    magnitude: u64,
    out: &mut String,
) -> Result<(), WriteError<'a>> {
    let start = out.len();
    if negative {
        out.push('-');
    }
    write_digits(magnitude, out);
    if magnitude > MAX_EXACT_INT {
        let f = magnitude as f64;
        let js = ryu_js::Buffer::new().format_finite(f).to_owned();
        if out[start + usize::from(negative)..] != *js {
            out.truncate(start);
            return Err(WriteError::Integer(Vec::new()));
        }
    }
    Ok(())
}

fn write_digits(mut n: u64, out: &mut String) {
    let mut buf = [0u8; 20];
    let mut pos = buf.len();
    loop {
        pos -= 1;
        buf[pos] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    out.push_str(std::str::from_utf8(&buf[pos..]).unwrap_or_default());
}

/// ECMAScript `Number::toString` of a finite `f64`. Non-finite values (which JS would turn
/// into `null`) are refused: they only arise from inputs the parser already rejects.
fn write_f64<'a>(f: f64, out: &mut String) -> Result<(), WriteError<'a>> {
    if !f.is_finite() {
        return Err(WriteError::Number);
    }
    if f == 0.0 {
        // Covers -0, which JS prints as "0".
        out.push('0');
    } else {
        out.push_str(ryu_js::Buffer::new().format_finite(f));
    }
    Ok(())
}

/// `JSON.stringify` string escaping.
fn write_str(s: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x0C => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x00..=0x1F => "",
            _ => continue,
        };
        // `b` is ASCII, so `start..i` and `i + 1..` are on character boundaries.
        out.push_str(&s[start..i]);
        if escape.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xF)]));
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

// ---------------------------------------------------------------------------------------------
// Strict parser
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// HMAC
// ---------------------------------------------------------------------------------------------

fn mac_over(secret: &[u8], msg: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length (long keys are hashed first), so this cannot fail.
    let mut mac = <HmacSha256 as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(msg);
    mac
}

/// HMAC-SHA256(key = secret bytes, msg) as lowercase hex.
pub fn hmac_sha256_hex(secret: &[u8], msg: &[u8]) -> String {
    hex::encode(mac_over(secret, msg).finalize().into_bytes())
}

/// Constant-time check of a hex signature against HMAC-SHA256(secret, msg).
///
/// Only exactly 64 lowercase hex characters are accepted (that is what Vagus sends); anything
/// else is a mismatch. The comparison of the decoded bytes is constant time
/// (`Mac::verify_slice`); the format check only depends on the untrusted input.
pub fn verify_hmac_sha256_hex(secret: &[u8], msg: &[u8], signature_hex: &str) -> bool {
    let sig = signature_hex.as_bytes();
    if sig.len() != 64 || !sig.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return false;
    }
    let mut raw = [0u8; 32];
    if hex::decode_to_slice(sig, &mut raw).is_err() {
        return false;
    }
    mac_over(secret, msg).verify_slice(&raw).is_ok()
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const VECTOR_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/vectors/vagus/");

    fn load(name: &str) -> Value {
        let path = format!("{VECTOR_DIR}{name}");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {path}: {e}"))
    }

    fn vectors() -> Vec<Value> {
        let file = load("canonical_hmac_vectors.json");
        let list = file["vectors"].as_array().expect("vectors array").clone();
        assert_eq!(Some(list.len() as u64), file["count"].as_u64());
        assert_eq!(list.len(), 38);
        list
    }

    fn field<'v>(v: &'v Value, name: &str) -> &'v str {
        v[name]
            .as_str()
            .unwrap_or_else(|| panic!("{}: missing {name}", v["id"]))
    }

    /// Vectors serde_json itself refuses to parse (documented in the vectors' README).
    const PARSE_REFUSED: &[&str] = &["v14_lone_surrogate", "v21_number_overflow"];
    /// Vectors with a `__proto__` member: Vagus drops it, we refuse (path of its object).
    const UNCOVERED: &[(&str, &str)] = &[
        ("v28_proto_key_nested_object", "/input/a"),
        ("v29_proto_key_primitive", "/input/a"),
    ];

    /// Vectors with an integer beyond ±2^53: Vagus signs the nearest double, we refuse.
    const INEXACT: &[(&str, &str)] = &[
        ("v16_int_above_2_53", "/input/n"),
        ("v17_huge_int", "/input/n"),
    ];

    fn uncovered_path(id: &str) -> Option<&'static str> {
        UNCOVERED.iter().find(|(u, _)| *u == id).map(|(_, p)| *p)
    }

    /// The error the canonical writer must give for a vector it refuses, if any.
    fn expected_refusal(id: &str) -> Option<CanonicalError> {
        if let Some(path) = uncovered_path(id) {
            return Some(CanonicalError::UncoveredMember { path: path.into() });
        }
        INEXACT
            .iter()
            .find(|(u, _)| *u == id)
            .map(|(_, p)| CanonicalError::InexactInteger { path: (*p).into() })
    }

    #[test]
    fn vectors_request_fields_canonical_and_mac() {
        let mut verified = 0;
        let mut refused = Vec::new();
        for v in vectors() {
            let id = field(&v, "id");
            let secret = field(&v, "secret").as_bytes();
            let parsed = serde_json::from_str::<Value>(field(&v, "request_fields_json"));
            if PARSE_REFUSED.contains(&id) {
                assert!(parsed.is_err(), "{id}: serde_json was expected to refuse");
                refused.push(id.to_owned());
                continue;
            }
            let parsed = parsed.unwrap_or_else(|e| panic!("{id}: {e}"));
            let canonical = canonical_string(&parsed);
            if let Some(expected) = expected_refusal(id) {
                assert_eq!(canonical, Err(expected), "{id}");
                refused.push(id.to_owned());
                continue;
            }
            let canonical = canonical.unwrap_or_else(|e| panic!("{id}: {e}"));
            assert_eq!(canonical, field(&v, "canonical"), "{id}: canonical string");
            assert_eq!(
                hex::encode(canonical.as_bytes()),
                field(&v, "canonical_utf8_hex"),
                "{id}: canonical bytes"
            );
            let sig = hmac_sha256_hex(secret, canonical.as_bytes());
            assert_eq!(sig, field(&v, "signature_hex"), "{id}: signature");
            assert!(verify_hmac_sha256_hex(secret, canonical.as_bytes(), &sig));
            verified += 1;
        }
        assert_eq!(
            refused,
            [
                "v14_lone_surrogate",
                "v16_int_above_2_53",
                "v17_huge_int",
                "v21_number_overflow",
                "v28_proto_key_nested_object",
                "v29_proto_key_primitive"
            ]
        );
        assert_eq!(verified, 32);
    }

    fn flip_first_hex_char(sig: &str) -> String {
        let mut chars: Vec<char> = sig.chars().collect();
        chars[0] = if chars[0] == '0' { '1' } else { '0' };
        chars.into_iter().collect()
    }

    #[test]
    fn vectors_wire_bodies_verify_and_tampering_fails() {
        let mut verified = 0;
        for v in vectors() {
            let id = field(&v, "id");
            let secret = field(&v, "secret").as_bytes();
            let body = match parse_strict(field(&v, "wire_body").as_bytes()) {
                Err(CanonicalError::Syntax(_)) if id == "v14_lone_surrogate" => continue,
                Err(e) => panic!("{id}: {e}"),
                Ok(_) if id == "v14_lone_surrogate" => panic!("{id}: lone surrogate accepted"),
                Ok(body) => body,
            };
            let mut fields = body;
            let sig = match fields.as_object_mut().and_then(|m| m.remove("signature")) {
                Some(Value::String(s)) => s,
                other => panic!("{id}: signature field {other:?}"),
            };
            let canonical = canonical_string(&fields);
            // The wire bodies carry what JS printed: v16 and v17 arrive already rounded.
            if let Some(path) = uncovered_path(id) {
                assert_eq!(
                    canonical,
                    Err(CanonicalError::UncoveredMember { path: path.into() }),
                    "{id}"
                );
                continue;
            }
            let canonical = canonical.unwrap_or_else(|e| panic!("{id}: {e}"));
            let msg = canonical.as_bytes();
            assert!(verify_hmac_sha256_hex(secret, msg, &sig), "{id}: verify");
            verified += 1;

            // Tampered signature.
            assert!(
                !verify_hmac_sha256_hex(secret, msg, &flip_first_hex_char(&sig)),
                "{id}"
            );
            // Same signature, upper-case hex: refused by format.
            assert!(
                !verify_hmac_sha256_hex(secret, msg, &sig.to_uppercase()),
                "{id}"
            );
            // Wrong secret.
            let mut wrong = secret.to_vec();
            wrong.push(b'x');
            assert!(!verify_hmac_sha256_hex(&wrong, msg, &sig), "{id}");
            // Tampered input.
            let mut tampered = fields.clone();
            match tampered.get_mut("input") {
                Some(Value::Object(input)) => {
                    input.insert("zz".into(), json!(1));
                }
                other => panic!("{id}: input {other:?}"),
            }
            let tampered = canonical_string(&tampered).expect("tampered canonical");
            assert!(
                !verify_hmac_sha256_hex(secret, tampered.as_bytes(), &sig),
                "{id}"
            );
        }
        assert_eq!(verified, 35);
    }

    /// Every row where plain serde_json output differs from Vagus is fixed (or refused).
    #[test]
    fn vectors_naive_serde_json_pitfalls_are_fixed() {
        let naive = load("rust_serde_json_naive.json");
        let rows = naive["rows"].as_array().expect("rows");
        let vectors = vectors();
        let mut differing = 0;
        for row in rows {
            if row["matches_vagus"] == json!(true) {
                continue;
            }
            differing += 1;
            let id = field(row, "id");
            let v = vectors
                .iter()
                .find(|v| v["id"] == row["id"])
                .expect("vector");
            let Ok(parsed) = serde_json::from_str::<Value>(field(v, "request_fields_json")) else {
                assert!(PARSE_REFUSED.contains(&id), "{id}");
                continue;
            };
            match canonical_string(&parsed) {
                Ok(c) => assert_eq!(c, field(v, "canonical"), "{id}"),
                Err(e) => assert_eq!(Some(e), expected_refusal(id), "{id}"),
            }
        }
        assert_eq!(differing, 12);
    }

    // --- parse_strict -------------------------------------------------------------------------

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

    // --- canonical form -----------------------------------------------------------------------

    fn canon(text: &str) -> String {
        canonical_string(&serde_json::from_str(text).expect("test json")).expect("canonical")
    }

    #[test]
    fn array_index_keys_are_hoisted_in_numeric_order() {
        assert_eq!(
            canon(r#"{"b":1,"10":1,"9":1,"a":1}"#),
            r#"{"9":1,"10":1,"a":1,"b":1}"#
        );
        // 2^32 - 2 is the largest array index; 2^32 - 1 is an ordinary key.
        assert_eq!(
            canon(r#"{"4294967294":1,"5":1}"#),
            r#"{"5":1,"4294967294":1}"#
        );
        assert_eq!(
            canon(r#"{"4294967295":1,"5":1}"#),
            r#"{"5":1,"4294967295":1}"#
        );
        assert_eq!(
            canon(r#"{"4294967295":1,"42949672950":1,"4":1}"#),
            r#"{"4":1,"4294967295":1,"42949672950":1}"#
        );
        // Leading zeros, signs, empty and non-digit keys are not indices.
        assert_eq!(
            canon(r#"{"01":1,"1":2,"-1":3,"0":4,"":5,"1a":6,"+1":7,"1.0":8}"#),
            r#"{"0":4,"1":2,"":5,"+1":7,"-1":3,"01":1,"1.0":8,"1a":6}"#
        );
        assert_eq!(array_index("0"), Some(0));
        assert_eq!(array_index("00"), None);
        assert_eq!(array_index("4294967294"), Some(4_294_967_294));
        assert_eq!(array_index("4294967295"), None);
        assert_eq!(array_index("99999999999"), None);
        assert_eq!(array_index("１"), None);
    }

    #[test]
    fn keys_are_ordered_by_utf16_code_units() {
        // U+1F600 is D83D DE00 in UTF-16, so it sorts before U+E000 and U+FF21.
        assert_eq!(
            canon("{\"\u{ff21}\":1,\"\u{1f600}\":2,\"\u{e000}\":3,\"\u{ffff}\":4,\"\u{d7ff}\":5}"),
            "{\"\u{d7ff}\":5,\"\u{1f600}\":2,\"\u{e000}\":3,\"\u{ff21}\":1,\"\u{ffff}\":4}"
        );
        // Exhaustive cross-check of the byte-level comparator against encode_utf16.
        let samples = [
            "",
            "a",
            "A",
            "ab",
            "a\u{0}",
            "\u{7f}",
            "\u{80}",
            "é",
            "e\u{301}",
            "\u{7ff}",
            "\u{800}",
            "\u{d7ff}",
            "\u{e000}",
            "\u{e000}a",
            "\u{efff}",
            "\u{f000}",
            "\u{ff21}",
            "\u{ffff}",
            "\u{10000}",
            "\u{1f600}",
            "\u{1f600}a",
            "\u{1f601}",
            "\u{10ffff}",
            "a\u{1f600}",
            "a\u{ffff}",
            "a\u{e000}b",
            "a\u{10000}b",
            "\u{e000}\u{1f600}",
            "\u{1f600}\u{e000}",
        ];
        for a in samples {
            for b in samples {
                assert_eq!(
                    cmp_utf16(a, b),
                    a.encode_utf16().cmp(b.encode_utf16()),
                    "{a:?} vs {b:?}"
                );
            }
        }
    }

    #[test]
    fn numbers_use_ecmascript_number_to_string() {
        let cases: &[(&str, &str)] = &[
            ("1.0", "1"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("0", "0"),
            ("-1", "-1"),
            ("1.5e3", "1500"),
            ("100e-2", "1"),
            ("0.1", "0.1"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("1e-6", "0.000001"),
            ("1e-7", "1e-7"),
            ("-1.25E-10", "-1.25e-10"),
            ("5e-324", "5e-324"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("0.30000000000000004", "0.30000000000000004"),
            ("9007199254740991", "9007199254740991"),
            ("9007199254740992", "9007199254740992"),
            ("-9007199254740992", "-9007199254740992"),
            // Beyond u64/i64 serde_json already holds a double: forwarded as that double.
            ("-98765432109876543210", "-98765432109876540000"),
            ("123456789012345680000", "123456789012345680000"),
        ];
        for (input, expected) in cases {
            assert_eq!(canon(input), *expected, "{input}");
        }
    }

    /// Two bodies that differ only beyond 2^53 would share one signature while the app reads
    /// different integers: neither can be signed.
    #[test]
    fn integers_beyond_2_pow_53_are_refused_not_rounded() {
        for input in [
            "9007199254740993",
            "9007199254740995",
            "-9007199254740993",
            "18446744073709551615",
            "-9223372036854775807",
            "12345678901234567890",
        ] {
            let v: Value = serde_json::from_str(&format!(r#"{{"a":[{input}]}}"#)).unwrap();
            assert_eq!(
                canonical_string(&v),
                Err(CanonicalError::InexactInteger {
                    path: "/a/0".into()
                }),
                "{input}"
            );
        }
    }

    /// Beyond 2^53, an integer that is exactly what JS prints for its double is signed as
    /// itself (it is what a JS signer sends).
    #[test]
    fn integers_printed_by_js_are_signed_as_themselves() {
        for input in [
            "9007199254740994",
            "12345678901234567000",
            "-9223372036854776000",
            "18446744073709552000",
        ] {
            assert_eq!(canon(input), input, "{input}");
        }
    }

    #[test]
    fn strings_are_escaped_like_json_stringify() {
        let s =
            "q\" b\\ s/ \u{8}\u{c}\n\r\t \u{0}\u{1}\u{1b}\u{1f}\u{7f} \u{2028}\u{2029} é😀 <&>'";
        assert_eq!(
            canonical_string(&json!(s)).expect("canonical"),
            "\"q\\\" b\\\\ s/ \\b\\f\\n\\r\\t \\u0000\\u0001\\u001b\\u001f\u{7f} \u{2028}\u{2029} é😀 <&>'\""
        );
        // Keys are escaped the same way.
        assert_eq!(
            canon(r#"{"a\\b":2,"a\"b":1,"a\nb":3}"#),
            r#"{"a\nb":3,"a\"b":1,"a\\b":2}"#
        );
    }

    #[test]
    fn structure_and_literals() {
        assert_eq!(
            canon(r#"{"z":{"b":[3,{"d":null,"c":true}],"a":false},"a":[],"m":{}}"#),
            r#"{"a":[],"m":{},"z":{"a":false,"b":[3,{"c":true,"d":null}]}}"#
        );
        assert_eq!(canon(" [ 1 , \"x\" ] "), r#"[1,"x"]"#);
    }

    #[test]
    fn proto_member_is_refused_at_any_depth() {
        let uncovered = |path: &str| {
            Err(CanonicalError::UncoveredMember {
                path: path.to_owned(),
            })
        };
        let c = |text: &str| canonical_string(&serde_json::from_str(text).expect("json"));
        assert_eq!(c(r#"{"__proto__":1}"#), uncovered(""));
        assert_eq!(c(r#"[0,{"__proto__":{}}]"#), uncovered("/1"));
        assert_eq!(
            c(r#"{"a/b":{"~x":[{"__proto__":null}]}}"#),
            uncovered("/a~1b/~0x/0")
        );
        // Only the exact member name; values and look-alikes are covered.
        assert!(c(r#"{"__proto__x":1,"x":"__proto__","constructor":{},"__PROTO__":2}"#).is_ok());
        // Nothing partial is left in the output buffer.
        let mut out = String::from("prefix");
        let value = json!({"a": 1, "b": {"__proto__": 1}});
        assert!(write_canonical(&value, &mut out).is_err());
        assert_eq!(out, "prefix");
        let mut out = String::from("prefix");
        write_canonical(&json!({"b":1,"a":2}), &mut out).expect("canonical");
        assert_eq!(out, r#"prefix{"a":2,"b":1}"#);
    }

    #[test]
    fn writer_caps_depth() {
        let mut value = json!(1);
        for _ in 0..MAX_DEPTH {
            value = Value::Array(vec![value]);
        }
        assert!(canonical_string(&value).is_ok());
        value = json!({ "k": value });
        assert_eq!(
            canonical_string(&value),
            Err(CanonicalError::TooDeep(MAX_DEPTH))
        );
    }

    #[test]
    fn hmac_rfc4231_case_2_and_signature_format() {
        let sig = hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(verify_hmac_sha256_hex(
            b"Jefe",
            b"what do ya want for nothing?",
            &sig
        ));
        for bad in [
            "",
            &sig[..62],
            &format!("{sig}00"),
            &sig.to_uppercase(),
            &format!(" {}", &sig[1..]),
            &format!("{}g", &sig[..63]),
        ] {
            assert!(
                !verify_hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?", bad),
                "{bad:?}"
            );
        }
    }
}
