//! Writing the protocols' fixed envelopes as JSON text straight into a body, byte for byte what
//! `serde_json` writes for them.
//!
//! Every call writes one envelope to the app and one to the caller. Through serde, each member
//! name is escaped again on every call and each string is three small writes into the body;
//! here the names and punctuation are one slice each (`,"call_id":`), and a string that needs no
//! escape (almost every id and name) is copied whole. A string that does is written by
//! `serde_json` itself, and so are the free-form values (`args`, `result`).

use carapace_filters::canonical::first_escape;
use serde_json::Value;

/// Writes an object at the end of `out`, its members written by `members` in the order it
/// gives them (the envelopes give them sorted, as a `serde_json::Value` writes them).
pub fn object(out: &mut Vec<u8>, members: impl FnOnce(&mut Object<'_>)) {
    out.push(b'{');
    let mut o = Object { out, first: true };
    members(&mut o);
    o.out.push(b'}');
}

/// The members of an object being written.
pub struct Object<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl Object<'_> {
    /// `"name":` after a comma when needed; `name` must need no escape (the envelopes' names).
    fn name(&mut self, name: &str) -> &mut Vec<u8> {
        debug_assert!(plain(name), "{name}");
        if !std::mem::replace(&mut self.first, false) {
            self.out.push(b',');
        }
        self.out.push(b'"');
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.out
    }

    pub fn str(&mut self, name: &str, value: &str) -> &mut Self {
        string(self.name(name), value);
        self
    }

    pub fn u64(&mut self, name: &str, value: u64) -> &mut Self {
        let mut digits = itoa::Buffer::new();
        self.name(name)
            .extend_from_slice(digits.format(value).as_bytes());
        self
    }

    pub fn bool(&mut self, name: &str, value: bool) -> &mut Self {
        let text: &[u8] = if value { b"true" } else { b"false" };
        self.name(name).extend_from_slice(text);
        self
    }

    pub fn value(&mut self, name: &str, value: &Value) -> &mut Self {
        let out = self.name(name);
        serde_json::to_writer(out, value).expect("a JSON value writes into memory");
        self
    }

    /// A member whose value is an object, written by `members`.
    pub fn object(&mut self, name: &str, members: impl FnOnce(&mut Object<'_>)) -> &mut Self {
        object(self.name(name), members);
        self
    }

    /// A member whose value is a list of one object, written by `members`.
    pub fn list_of_one(&mut self, name: &str, members: impl FnOnce(&mut Object<'_>)) -> &mut Self {
        let out = self.name(name);
        out.push(b'[');
        object(out, members);
        out.push(b']');
        self
    }

    /// A member whose value is `json`, JSON text written by `serde_json` (compact), as it is.
    pub fn json(&mut self, name: &str, json: &[u8]) -> &mut Self {
        self.name(name).extend_from_slice(json);
        self
    }

    /// A member whose value is `json`, JSON text written by `serde_json` (compact), as a
    /// string: the bytes `serde_json` writes for that text as a string, in one pass.
    pub fn text_of(&mut self, name: &str, json: &[u8]) -> &mut Self {
        let out = self.name(name);
        out.reserve(json.len() + 2);
        out.push(b'"');
        write_in_string(out, json);
        out.push(b'"');
        self
    }
}

/// Writes JSON text as the inside of a JSON string. `serde_json` writes no control character
/// as it is (in its strings they are escapes, and compact text has no whitespace), so `"` and
/// `\` are the only bytes to escape, each with a `\` before it.
fn write_in_string(out: &mut Vec<u8>, json: &[u8]) {
    let mut rest = json;
    while let Some(i) = memchr::memchr2(b'"', b'\\', rest) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(&[b'\\', rest[i]]);
        rest = &rest[i + 1..];
    }
    out.extend_from_slice(rest);
}

/// Whether `s` is written between quotes as it is: no `"`, `\` or control character.
fn plain(s: &str) -> bool {
    first_escape(s.as_bytes()).is_none()
}

/// `s` as a JSON string.
pub fn string(out: &mut Vec<u8>, s: &str) {
    if plain(s) {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(out, s).expect("a string writes into memory");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every ASCII character, in order.
    fn every_ascii() -> String {
        (0u8..0x80).map(char::from).collect()
    }

    #[test]
    fn strings_are_the_bytes_serde_json_writes() {
        let every_byte = every_ascii();
        for s in [
            "",
            "plain id-1",
            "quote \" backslash \\ slash /",
            "tab\tnewline\ncr\rbackspace\u{8}formfeed\u{c}",
            "\u{0}\u{1f}\u{7f}",
            "ünïcödé ✓ \u{2028}\u{2029} 🦀",
            &every_byte,
        ] {
            let mut out = Vec::new();
            string(&mut out, s);
            assert_eq!(out, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn json_text_as_a_string_and_as_it_is_are_the_bytes_serde_json_writes() {
        for value in [
            json!({"q": "a\"b\\c", "n": [1, 2.5, null, -0.0, 1e300], "z": {"y": true}}),
            json!("tab\tnewline\n\u{0}\u{1f}\u{7f} ünï ✓ \u{2028} 🦀 \\\""),
            json!(every_ascii()),
            json!([]),
            json!(null),
            json!(7),
        ] {
            let mut out = Vec::new();
            let json = serde_json::to_vec(&value).unwrap();
            object(&mut out, |o| {
                o.list_of_one("content", |b| {
                    b.text_of("text", &json).str("type", "text");
                })
                .json("structuredContent", &json);
            });
            let text = serde_json::to_string(&value).unwrap();
            let expected = serde_json::to_vec(
                &json!({"content": [{"text": text, "type": "text"}], "structuredContent": value}),
            );
            assert_eq!(out, expected.unwrap(), "{value}");
        }
    }

    #[test]
    fn an_object_is_the_bytes_of_the_same_json_value() {
        let args = json!({"q": "a\"b", "n": [1, 2.5, null], "z": {"y": true}});
        let mut out = Vec::new();
        object(&mut out, |o| {
            o.value("args", &args)
                .str("call_id", "c\n1")
                .object("context", |c| {
                    c.str("agent_id", "a").str("session_id", "s");
                })
                .bool("retryable", false)
                .u64("timeout_ms", u64::MAX)
                .object("empty", |_| {});
        });
        let expected = json!({
            "args": args, "call_id": "c\n1",
            "context": {"agent_id": "a", "session_id": "s"},
            "retryable": false, "timeout_ms": u64::MAX, "empty": {},
        });
        // `json!` sorts the members; this object was written in that order but for `empty`.
        let reparsed: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(reparsed, expected);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            r#"{"args":{"n":[1,2.5,null],"q":"a\"b","z":{"y":true}},"call_id":"c\n1","context":{"agent_id":"a","session_id":"s"},"retryable":false,"timeout_ms":18446744073709551615,"empty":{}}"#
        );
    }
}
