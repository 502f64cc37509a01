//! The canonical writer: key ordering, number formatting and string escaping.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::{Number, Value};

use super::{render_path, CanonicalError, Seg, MAX_DEPTH};

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

/// Which canonical form: the two differ only in how object keys are ordered and in
/// `__proto__`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// Skill Gateway v1 / Vagus: `JSON.stringify` of an object rebuilt from its sorted keys,
    /// so array-index keys come first and `__proto__` is refused (JS would drop it).
    SkillGateway,
    /// RFC 8785 (JCS): keys by UTF-16 code units only.
    Jcs,
}

/// Write the Vagus-compatible canonical form of `value` into `out`.
///
/// The output is appended to `out`. On error `out` is truncated back to its original length,
/// so a partial canonical string is never left behind to be MACed.
pub fn write_canonical(value: &Value, out: &mut String) -> Result<(), CanonicalError> {
    write_form(value, out, Form::SkillGateway)
}

/// The canonical form of `value` as a new `String` (see [`write_canonical`]).
pub fn canonical_string(value: &Value) -> Result<String, CanonicalError> {
    let mut out = String::with_capacity(128);
    write_canonical(value, &mut out)?;
    Ok(out)
}

/// The RFC 8785 (JSON Canonicalization Scheme) form of `value` into `out`: members ordered by
/// the UTF-16 code units of their names, ECMAScript number formatting, `JSON.stringify`
/// string escaping, no whitespace. An integer that an IEEE double cannot hold exactly is
/// refused rather than rounded (RFC 8785 §3.2.2.3 would round it), so two different
/// documents never share one form.
pub fn write_jcs(value: &Value, out: &mut String) -> Result<(), CanonicalError> {
    write_form(value, out, Form::Jcs)
}

/// The RFC 8785 form of `value` as a new `String` (see [`write_jcs`]).
pub fn jcs_string(value: &Value) -> Result<String, CanonicalError> {
    let mut out = String::with_capacity(128);
    write_jcs(value, &mut out)?;
    Ok(out)
}

/// The string `s` as both canonical forms write it (`JSON.stringify`'s escaping), into `out`:
/// for a writer that puts a document's known members in order itself.
pub fn write_canonical_str(s: &str, out: &mut String) {
    write_str(s, out)
}

fn write_form(value: &Value, out: &mut String, form: Form) -> Result<(), CanonicalError> {
    let original_len = out.len();
    // One scratch stack of (key, value) pairs shared by all objects of the document: each
    // object pushes its members, sorts its own slice and truncates it again when done.
    let mut members: Vec<(&str, &Value)> = Vec::with_capacity(16);
    write_value(value, out, &mut members, 0, form).map_err(|e| {
        out.truncate(original_len);
        e.into_public()
    })
}

fn write_value<'a>(
    value: &'a Value,
    out: &mut String,
    members: &mut Vec<(&'a str, &'a Value)>,
    depth: usize,
    form: Form,
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
                write_value(item, out, members, depth + 1, form)
                    .map_err(|e| e.within(Seg::Index(i)))?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            if depth >= MAX_DEPTH {
                return Err(WriteError::TooDeep);
            }
            if form == Form::SkillGateway && map.contains_key("__proto__") {
                return Err(WriteError::Uncovered(Vec::new()));
            }
            let start = members.len();
            members.extend(map.iter().map(|(k, v)| (k.as_str(), v)));
            let end = members.len();
            // Keys are unique, so an unstable sort is deterministic. serde_json's map already
            // iterates in code-point order, which this sort only has to touch up.
            match form {
                Form::SkillGateway => {
                    members[start..end].sort_unstable_by(|a, b| js_key_order(a.0, b.0))
                }
                Form::Jcs => members[start..end].sort_unstable_by(|a, b| cmp_utf16(a.0, b.0)),
            }
            out.push('{');
            for j in start..end {
                let (key, member) = members[j];
                if j > start {
                    out.push(',');
                }
                write_str(key, out);
                out.push(':');
                write_value(member, out, members, depth + 1, form)
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

/// Whether JSON escapes the byte `b` in a string: `"`, `\\` and the C0 controls.
fn is_escaped(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// The index of the first byte of `s` that a JSON string escapes (`"`, `\\` or a C0 control;
/// `JSON.stringify` and `serde_json` escape the same bytes), if any. Eight bytes are looked at
/// in one step, so a string with nothing to escape (most ids and names) is passed over at a
/// fraction of the cost of a byte-by-byte look.
pub fn first_escape(s: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let mut chunks = s.chunks_exact(8);
    let mut at = 0;
    for chunk in chunks.by_ref() {
        let x = u64::from_ne_bytes(chunk.try_into().expect("eight bytes"));
        // High bit of a byte set where it is below 0x20, or equal to `"` or `\\` (zero after
        // the XOR): the usual "has a byte less than n / a zero byte" tests, which can flag a
        // byte above a true one but never a chunk without one; the chunk is then looked at
        // byte by byte.
        let (q, b) = (x ^ (ONES * u64::from(b'"')), x ^ (ONES * u64::from(b'\\')));
        let flags = (x.wrapping_sub(ONES * 0x20) & !x)
            | (q.wrapping_sub(ONES) & !q)
            | (b.wrapping_sub(ONES) & !b);
        if flags & HIGH != 0 {
            if let Some(i) = chunk.iter().position(|&c| is_escaped(c)) {
                return Some(at + i);
            }
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| is_escaped(c))
        .map(|i| at + i)
}

/// `JSON.stringify` string escaping.
fn write_str(s: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    while let Some(i) = first_escape(&bytes[start..]).map(|i| start + i) {
        let b = bytes[i];
        // `b` is ASCII, so `start..i` and `i + 1..` are on character boundaries.
        out.push_str(&s[start..i]);
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x0C => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            _ => "",
        };
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

#[cfg(test)]
mod tests;
