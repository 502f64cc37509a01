//! What the secret guard looks for: built-in credential formats, patterns from the
//! configuration, and exact values (the secrets carapace itself holds, and configured ones).

use regex::{Regex, RegexSet};

/// Built-in detectors: a name and a pattern. Each matches a credential's own format, so that a
/// match is worth refusing (few false positives) rather than everything that looks random.
/// Word boundaries are ASCII ones (`(?-u:\b)`), which the fast matching engines handle.
pub const BUILT_IN: &[(&str, &str)] = &[
    // The whole block, up to its END line (or the end of the string when it is cut off), so
    // that redacting it leaves nothing of the key.
    (
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?s:.*?)(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\z)",
    ),
    (
        "aws_access_key_id",
        r"(?-u:\b)(?:AKIA|ASIA|AROA|AIDA)[0-9A-Z]{16}(?-u:\b)",
    ),
    (
        "github_token",
        r"(?-u:\b)(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
    ),
    ("gitlab_token", r"(?-u:\b)glpat-[A-Za-z0-9_-]{20,}"),
    ("slack_token", r"(?-u:\b)xox[abposr]-[A-Za-z0-9-]{10,}"),
    ("anthropic_api_key", r"(?-u:\b)sk-ant-[A-Za-z0-9_-]{20,}"),
    (
        "openai_api_key",
        r"(?-u:\b)sk-(?:proj-|svcacct-)?[A-Za-z0-9_-]{32,}",
    ),
    (
        "stripe_key",
        r"(?-u:\b)(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}",
    ),
    ("google_api_key", r"(?-u:\b)AIza[0-9A-Za-z_-]{35}"),
    (
        "jwt",
        r"(?-u:\b)eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    ),
    (
        "bearer_token",
        r"(?i)(?-u:\b)bearer\s+[A-Za-z0-9._~+/-]{20,}=*",
    ),
];

/// Shortest exact value looked for: a shorter one would match ordinary text.
pub const MIN_VALUE_LEN: usize = 8;

/// A compiled set of detectors.
#[derive(Debug, Clone)]
pub struct Detectors {
    /// Every pattern at once, to learn in one pass whether a string needs a closer look.
    set: RegexSet,
    patterns: Vec<(String, Regex)>,
    /// Exact values and their names.
    values: Vec<(String, String)>,
}

/// A pattern of the configuration that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("pattern {index}: {message}")]
pub struct PatternError {
    pub index: usize,
    pub message: String,
}

/// One credential found in a string: which detector, and where in the string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub detector: String,
    pub start: usize,
    pub end: usize,
}

impl Detectors {
    /// The built-in detectors, the configured `patterns` (named `pattern_<index>`) and the
    /// exact `values` (name, value); values shorter than [`MIN_VALUE_LEN`] are ignored.
    pub fn new(patterns: &[String], values: Vec<(String, String)>) -> Result<Self, PatternError> {
        let mut named: Vec<(String, String)> = BUILT_IN
            .iter()
            .map(|(n, p)| (n.to_string(), p.to_string()))
            .collect();
        for (i, p) in patterns.iter().enumerate() {
            Regex::new(p).map_err(|e| PatternError {
                index: i,
                message: e.to_string(),
            })?;
            named.push((format!("pattern_{i}"), p.clone()));
        }
        let set = RegexSet::new(named.iter().map(|(_, p)| p)).expect("each pattern compiled");
        let patterns = named
            .into_iter()
            .map(|(n, p)| (n, Regex::new(&p).expect("compiled above")))
            .collect();
        let values = values
            .into_iter()
            .filter(|(_, v)| v.len() >= MIN_VALUE_LEN)
            .collect();
        Ok(Detectors {
            set,
            patterns,
            values,
        })
    }

    /// Every credential in `s`, in order, without overlaps.
    pub fn find(&self, s: &str) -> Vec<Found> {
        let mut found = Vec::new();
        let hits = self.set.matches(s);
        if hits.matched_any() {
            for i in hits.iter() {
                let (name, re) = &self.patterns[i];
                found.extend(re.find_iter(s).map(|m| Found {
                    detector: name.clone(),
                    start: m.start(),
                    end: m.end(),
                }));
            }
        }
        for (name, value) in &self.values {
            found.extend(s.match_indices(value.as_str()).map(|(start, v)| Found {
                detector: name.clone(),
                start,
                end: start + v.len(),
            }));
        }
        found.sort_by_key(|f| (f.start, std::cmp::Reverse(f.end)));
        let mut kept: Vec<Found> = Vec::with_capacity(found.len());
        for f in found {
            if kept.last().is_none_or(|k| f.start >= k.end) {
                kept.push(f);
            }
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detectors() -> Detectors {
        Detectors::new(
            &[r"\bacme-[0-9]{6}\b".to_string()],
            vec![
                ("app_secret".into(), "hunter2-hunter2".into()),
                ("short".into(), "abc".into()),
            ],
        )
        .unwrap()
    }

    #[test]
    fn each_credential_format_is_found_and_ordinary_text_is_not() {
        let d = detectors();
        let cases = [
            ("-----BEGIN RSA PRIVATE KEY-----\nMIIE", "private_key"),
            ("-----BEGIN OPENSSH PRIVATE KEY-----", "private_key"),
            ("key AKIAIOSFODNN7EXAMPLE here", "aws_access_key_id"),
            ("ghp_0123456789abcdefghijklmnopqrstuvwxyzAB", "github_token"),
            ("xoxb-1234567890-abcdefghij", "slack_token"),
            ("sk-ant-api03-abcdefghijklmnopqrstuvwx", "anthropic_api_key"),
            (
                "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789",
                "openai_api_key",
            ),
            ("AIzaSyA1234567890abcdefghijklmnopqrstuv", "google_api_key"),
            (
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlc2ln",
                "jwt",
            ),
            (
                "Authorization: Bearer abcdefghijklmnopqrstuvwxyz123",
                "bearer_token",
            ),
            ("order acme-123456 shipped", "pattern_0"),
            ("the password is hunter2-hunter2.", "app_secret"),
        ];
        for (text, detector) in cases {
            let found = d.find(text);
            assert_eq!(found.len(), 1, "{text}: {found:?}");
            assert_eq!(found[0].detector, detector, "{text}");
        }
        for text in [
            "the cat sat on the mat",
            "abc is short",
            "sk-short",
            "-----BEGIN CERTIFICATE-----",
            "eyJhbGciOiJIUzI1NiJ9 alone",
        ] {
            assert!(d.find(text).is_empty(), "{text}");
        }
    }

    #[test]
    fn a_private_key_is_found_whole_up_to_its_end_line_or_the_end_of_the_string() {
        let d = detectors();
        let block = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----";
        let text = format!("before {block} after");
        let f = &d.find(&text)[0];
        assert_eq!(&text[f.start..f.end], block);
        let cut = "x -----BEGIN PRIVATE KEY-----\nMIIEvQ";
        let f = &d.find(cut)[0];
        assert_eq!(&cut[f.start..], &cut[2..]);
        assert_eq!(f.end, cut.len());
    }

    #[test]
    fn overlapping_findings_are_one() {
        let d = detectors();
        let text = "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlc2ln";
        assert_eq!(d.find(text).len(), 1);
    }

    #[test]
    fn a_pattern_that_does_not_compile_is_named() {
        let e = Detectors::new(&["ok".into(), "(".into()], vec![]).unwrap_err();
        assert_eq!(e.index, 1);
    }
}
