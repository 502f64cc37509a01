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
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn first_escape_finds_the_first_escaped_byte_wherever_it_is() {
        let naive = |s: &[u8]| s.iter().position(|&b| is_escaped(b));
        // Every byte value at every place of strings up to 40 bytes long, on a background with
        // nothing to escape: ASCII, and bytes of multi-byte characters (high bit set).
        for background in [b'a', 0xA9, 0x7F, 0xFF, 0x20] {
            for len in 0..40 {
                for at in 0..len {
                    for b in 0..=255u8 {
                        let mut s = vec![background; len];
                        s[at] = b;
                        assert_eq!(first_escape(&s), naive(&s), "{s:?}");
                        // A second one after it does not move the first.
                        if at + 1 < len {
                            s[len - 1] = b'"';
                            assert_eq!(first_escape(&s), naive(&s), "{s:?}");
                        }
                    }
                }
            }
        }
    }

    fn canon(text: &str) -> String {
        canonical_string(&serde_json::from_str(text).expect("test json")).expect("canonical")
    }

    #[test]
    fn objects_out_of_order_inside_objects_in_order_are_sorted_in_both_forms() {
        // The outer object iterates in order; "a" does not in either form ("10" before "9"
        // by code points), nor its member "9" (U+FF21 before U+1F600 by code points), nor the
        // array's object in the Skill Gateway form.
        let text = "{\"a\":{\"10\":1,\"9\":{\"\u{ff21}\":1,\"\u{1f600}\":2}},\"b\":[{\"2\":0,\"10\":0}],\"c\":{}}";
        assert_eq!(
            canon(text),
            "{\"a\":{\"9\":{\"\u{1f600}\":2,\"\u{ff21}\":1},\"10\":1},\"b\":[{\"2\":0,\"10\":0}],\"c\":{}}"
        );
        let value = serde_json::from_str(text).expect("test json");
        assert_eq!(
            jcs_string(&value).expect("jcs"),
            "{\"a\":{\"10\":1,\"9\":{\"\u{1f600}\":2,\"\u{ff21}\":1}},\"b\":[{\"10\":0,\"2\":0}],\"c\":{}}"
        );
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

    /// RFC 8785 §3.2.3 and Appendix B, and where it parts from the Skill Gateway form.
    #[test]
    fn jcs_orders_by_utf16_code_units_only() {
        let v: Value = serde_json::from_str(
            r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#,
        )
        .unwrap();
        assert_eq!(
            jcs_string(&v).unwrap(),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
        let numbers: Value = serde_json::from_str(
            r#"{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"literals":[null,true,false]}"#,
        )
        .unwrap();
        assert_eq!(
            jcs_string(&numbers).unwrap(),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27]}"#
        );
        let indexed = serde_json::json!({"10": 1, "9": 2, "__proto__": 3});
        assert_eq!(
            jcs_string(&indexed).unwrap(),
            r#"{"10":1,"9":2,"__proto__":3}"#
        );
        assert!(
            canonical_string(&indexed).is_err(),
            "the Skill Gateway form refuses __proto__"
        );
    }
}
