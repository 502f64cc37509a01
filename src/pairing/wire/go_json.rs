//! Go `encoding/json` output: the string encoder and field-ordered objects.

/// Appends `src` as a JSON string exactly as Go's `encoding/json` `json.Marshal` writes it
/// (HTML escaping on, Go ≥ 1.22 short escapes).
///
/// `src` may be arbitrary bytes: like the classic (pre json/v2) Go encoder every byte that
/// is not part of valid UTF-8 becomes the six characters `\ufffd`. Strings coming from
/// Rust (`&str`) never take that path.
pub fn append_go_json_string(dst: &mut Vec<u8>, src: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    dst.push(b'"');
    for chunk in src.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => dst.extend_from_slice(b"\\\""),
                '\\' => dst.extend_from_slice(b"\\\\"),
                '\u{8}' => dst.extend_from_slice(b"\\b"),
                '\u{c}' => dst.extend_from_slice(b"\\f"),
                '\n' => dst.extend_from_slice(b"\\n"),
                '\r' => dst.extend_from_slice(b"\\r"),
                '\t' => dst.extend_from_slice(b"\\t"),
                '\u{0}'..='\u{1f}' | '<' | '>' | '&' => {
                    let b = c as u8;
                    dst.extend_from_slice(b"\\u00");
                    dst.push(HEX[usize::from(b >> 4)]);
                    dst.push(HEX[usize::from(b & 0xf)]);
                }
                '\u{2028}' => dst.extend_from_slice(b"\\u2028"),
                '\u{2029}' => dst.extend_from_slice(b"\\u2029"),
                _ => {
                    let mut buf = [0u8; 4];
                    dst.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        // Go's decoder reports each byte of an invalid sequence as its own RuneError.
        for _ in chunk.invalid() {
            dst.extend_from_slice(b"\\ufffd");
        }
    }
    dst.push(b'"');
}

/// `s` as a Go `json.Marshal` string literal (with the quotes).
pub fn go_json_string(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len() + 2);
    append_go_json_string(&mut out, s.as_bytes());
    String::from_utf8(out).expect("Go JSON encoding of a str is UTF-8")
}

/// Writes one JSON object in field order, Go style (no whitespace).
pub(super) struct JsonObject<'a> {
    out: &'a mut Vec<u8>,
    empty: bool,
}

impl<'a> JsonObject<'a> {
    pub(super) fn open(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, empty: true }
    }

    pub(super) fn key(&mut self, key: &str) {
        if !self.empty {
            self.out.push(b',');
        }
        self.empty = false;
        append_go_json_string(self.out, key.as_bytes());
        self.out.push(b':');
    }

    pub(super) fn string(&mut self, key: &str, value: &str) {
        self.key(key);
        append_go_json_string(self.out, value.as_bytes());
    }

    pub(super) fn string_array(&mut self, key: &str, values: &[String]) {
        self.key(key);
        self.out.push(b'[');
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            append_go_json_string(self.out, v.as_bytes());
        }
        self.out.push(b']');
    }

    pub(super) fn object(&mut self, key: &str, body: impl FnOnce(&mut JsonObject<'_>)) {
        self.key(key);
        let mut inner = JsonObject::open(self.out);
        body(&mut inner);
        inner.close();
    }

    pub(super) fn close(self) {
        self.out.push(b'}');
    }
}
