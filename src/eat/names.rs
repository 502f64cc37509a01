//! Tool names in an EAT catalog, which allows only `^[a-zA-Z0-9_-]+$`.
//!
//! The rule, one-to-one and reversible: ASCII letters, digits and `_` stay; `-` becomes `--`;
//! every other byte of the UTF-8 name becomes `-` and its two lowercase hex digits. So
//! `memory.query` is `memory-2equery` and `a-b` is `a--b`. After a `-` comes either `-` or a
//! hex digit, never both readings, so two names never map to one ([`decode`] inverts it). The
//! tool's own name is the `operationId` of its OpenAPI document.

/// The catalog name of `name`.
pub fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    for b in name.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => out.push(b as char),
            b'-' => out.push_str("--"),
            _ => {
                out.push('-');
                out.push_str(&hex::encode([b]));
            }
        }
    }
    out
}

/// The tool name a catalog name stands for, when it is one [`encode`] makes.
pub fn decode(eat_name: &str) -> Option<String> {
    let mut out = Vec::with_capacity(eat_name.len());
    let mut bytes = eat_name.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => out.push(b),
            b'-' => match bytes.next()? {
                b'-' => out.push(b'-'),
                h => {
                    let l = bytes.next()?;
                    let pair = [h, l];
                    if !pair.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
                        return None;
                    }
                    let byte = hex::decode(pair).ok()?[0];
                    // Only bytes `encode` escapes are escaped.
                    if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
                        return None;
                    }
                    out.push(byte);
                }
            },
            _ => return None,
        }
    }
    String::from_utf8(out).ok().filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_into_the_catalog_alphabet_and_back() {
        for (name, eat) in [
            ("memory.query", "memory-2equery"),
            ("a-b", "a--b"),
            ("a_b", "a_b"),
            ("a--2e", "a----2e"),
            ("a.-2e", "a-2e--2e"),
            ("été", "-c3-a9t-c3-a9"),
        ] {
            assert_eq!(encode(name), eat);
            assert_eq!(decode(eat).as_deref(), Some(name));
            assert!(eat
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
        }
    }

    #[test]
    fn only_what_encode_makes_decodes() {
        for bad in [
            "a-", "a-2", "a-zz", "a-2E", "a-61", "a-2d", "", "a.b", "-ff",
        ] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn two_names_never_share_a_catalog_name() {
        let names = ["a.b", "a-2eb", "a-b", "a--b", "a_b", "a-2e-b", "a.-b"];
        let mut seen = std::collections::HashSet::new();
        for n in names {
            assert!(seen.insert(encode(n)), "{n}");
            assert_eq!(decode(&encode(n)).as_deref(), Some(n));
        }
    }
}
