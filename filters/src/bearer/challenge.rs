//! `WWW-Authenticate` challenges (RFC 9110 §11.6.1, RFC 6750 §3): built for the Bearer scheme
//! carapace answers with, and parsed (a client's view, used by the tests and the fuzzer).

/// One `Bearer` challenge as carapace sends it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Challenge {
    /// `invalid_request`, `invalid_token` or `insufficient_scope`; none when the request
    /// carried no token (RFC 6750 §3.1).
    pub error: Option<&'static str>,
    /// Human-readable reason (ASCII; never any part of the token).
    pub description: Option<String>,
    /// The scopes the request needs, space-separated.
    pub scope: Option<String>,
    /// Where the protected-resource metadata is (RFC 9728 §5.1).
    pub resource_metadata: String,
}

impl Challenge {
    /// The header value: `Bearer resource_metadata="…", error="…", …`.
    pub fn header_value(&self) -> String {
        let mut out = String::from("Bearer ");
        let mut params: Vec<(&str, &str)> = vec![("resource_metadata", &self.resource_metadata)];
        if let Some(e) = self.error {
            params.push(("error", e));
        }
        if let Some(d) = &self.description {
            params.push(("error_description", d));
        }
        if let Some(s) = &self.scope {
            params.push(("scope", s));
        }
        for (i, (name, value)) in params.into_iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(name);
            out.push_str("=\"");
            for c in value.chars() {
                // RFC 6750 limits these values to printable ASCII; anything else is dropped
                // rather than risk a header that cannot be sent.
                match c {
                    '"' | '\\' => {
                        out.push('\\');
                        out.push(c);
                    }
                    ' '..='~' => out.push(c),
                    _ => {}
                }
            }
            out.push('"');
        }
        out
    }
}

/// A challenge as parsed from a header: its scheme and its parameters (names lowercased).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedChallenge {
    pub scheme: String,
    /// `token68` form, when the challenge has one instead of parameters.
    pub token68: Option<String>,
    pub params: Vec<(String, String)>,
}

impl ParsedChallenge {
    /// The value of parameter `name` (case-insensitive).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Why a header is not a list of challenges.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed WWW-Authenticate at byte {at}: {what}")]
pub struct ChallengeError {
    pub at: usize,
    pub what: &'static str,
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn fail<T>(&self, what: &'static str) -> Result<T, ChallengeError> {
        Err(ChallengeError { at: self.i, what })
    }
    fn ows(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t') {
            self.i += 1;
        }
    }
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn token(&mut self) -> &str {
        let start = self.i;
        while self.peek().is_some_and(is_tchar) {
            self.i += 1;
        }
        // tchars are ASCII.
        std::str::from_utf8(&self.s[start..self.i]).unwrap_or_default()
    }
    fn quoted(&mut self) -> Result<String, ChallengeError> {
        self.i += 1; // opening quote
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None => return self.fail("unterminated quoted string"),
                Some(b'"') => {
                    self.i += 1;
                    return String::from_utf8(out).or_else(|_| self.fail("not UTF-8"));
                }
                Some(b'\\') => {
                    self.i += 1;
                    match self.peek() {
                        Some(c) => out.push(c),
                        None => return self.fail("unterminated escape"),
                    }
                    self.i += 1;
                }
                Some(c) if c == b'\t' || c >= 0x20 && c != 0x7f => {
                    out.push(c);
                    self.i += 1;
                }
                Some(_) => return self.fail("control character in quoted string"),
            }
        }
    }
}

/// Parse a `WWW-Authenticate` value into its challenges.
pub fn parse(header: &str) -> Result<Vec<ParsedChallenge>, ChallengeError> {
    let mut c = Cursor {
        s: header.as_bytes(),
        i: 0,
    };
    let mut out: Vec<ParsedChallenge> = Vec::new();
    loop {
        c.ows();
        while c.peek() == Some(b',') {
            c.i += 1;
            c.ows();
        }
        if c.peek().is_none() {
            break;
        }
        let scheme = c.token().to_string();
        if scheme.is_empty() {
            return c.fail("expected an auth scheme");
        }
        let mut challenge = ParsedChallenge {
            scheme,
            token68: None,
            params: Vec::new(),
        };
        if c.peek() == Some(b' ') {
            c.ows();
            params(&mut c, &mut challenge)?;
        }
        out.push(challenge);
    }
    Ok(out)
}

/// The parameters (or token68) after a scheme, up to the next challenge.
fn params(c: &mut Cursor<'_>, ch: &mut ParsedChallenge) -> Result<(), ChallengeError> {
    loop {
        c.ows();
        let mark = c.i;
        let name = c.token().to_string();
        if name.is_empty() {
            return match c.peek() {
                None | Some(b',') => Ok(()),
                _ => c.fail("expected a parameter"),
            };
        }
        c.ows();
        if c.peek() != Some(b'=') {
            // A new challenge starts here (its scheme is `name`).
            c.i = mark;
            return Ok(());
        }
        c.i += 1;
        // token68 ends in `=` padding: `name=` followed by `=`, `,` or the end.
        if ch.params.is_empty() && matches!(c.peek(), None | Some(b'=') | Some(b',')) {
            while c.peek() == Some(b'=') {
                c.i += 1;
            }
            ch.token68 = Some(String::from_utf8_lossy(&c.s[mark..c.i]).into_owned());
            return Ok(());
        }
        c.ows();
        let value = match c.peek() {
            Some(b'"') => c.quoted()?,
            _ => {
                let v = c.token().to_string();
                if v.is_empty() {
                    return c.fail("expected a parameter value");
                }
                v
            }
        };
        ch.params.push((name.to_ascii_lowercase(), value));
        c.ows();
        match c.peek() {
            None => return Ok(()),
            Some(b',') => c.i += 1,
            _ => return c.fail("expected `,` after a parameter"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_built_parses_back() {
        let ch = Challenge {
            error: Some("insufficient_scope"),
            description: Some("needs \"tools:write\" \\ é".into()),
            scope: Some("tools:read tools:write".into()),
            resource_metadata: "https://h/.well-known/oauth-protected-resource/mcp".into(),
        };
        let v = ch.header_value();
        let parsed = parse(&v).unwrap();
        assert_eq!(parsed.len(), 1);
        let p = &parsed[0];
        assert_eq!(p.scheme, "Bearer");
        assert_eq!(p.param("error"), Some("insufficient_scope"));
        assert_eq!(p.param("scope"), Some("tools:read tools:write"));
        assert_eq!(
            p.param("error_description"),
            Some("needs \"tools:write\" \\ ")
        );
        assert_eq!(
            p.param("resource_metadata"),
            Some("https://h/.well-known/oauth-protected-resource/mcp")
        );
    }

    #[test]
    fn several_challenges_and_token68() {
        let parsed =
            parse(r#"Basic realm="a, b", Bearer error=invalid_token, Negotiate abc==, X"#).unwrap();
        let schemes: Vec<_> = parsed.iter().map(|c| c.scheme.as_str()).collect();
        assert_eq!(schemes, ["Basic", "Bearer", "Negotiate", "X"]);
        assert_eq!(parsed[0].param("realm"), Some("a, b"));
        assert_eq!(parsed[1].param("ERROR"), Some("invalid_token"));
        assert_eq!(parsed[2].token68.as_deref(), Some("abc=="));
    }

    #[test]
    fn malformed_headers_are_errors() {
        for bad in [r#"Bearer a="x"#, "Bearer a=\"\u{1}\"", "=x", "Bearer a=b c"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
