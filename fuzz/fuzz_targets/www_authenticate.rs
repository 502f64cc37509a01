//! `WWW-Authenticate`: parsing any header never panics, and what carapace builds from any
//! error description and scope always parses back to the same parameters (printable ASCII
//! kept, the rest dropped).

#![no_main]

use carapace_filters::bearer::challenge::{parse, Challenge};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse(&text);
    let mut parts = text.splitn(2, '\n');
    let description = parts.next().unwrap_or_default().to_owned();
    let scope = parts.next().unwrap_or_default().to_owned();
    let built = Challenge {
        error: Some("insufficient_scope"),
        description: Some(description.clone()),
        scope: Some(scope.clone()),
        resource_metadata: "https://tools.test/.well-known/oauth-protected-resource/mcp".into(),
    }
    .header_value();
    assert!(http::HeaderValue::from_str(&built).is_ok(), "not a header value: {built:?}");
    let parsed = parse(&built).expect("carapace's own challenge parses");
    assert_eq!(parsed.len(), 1);
    let printable = |s: &str| s.chars().filter(|c| (' '..='~').contains(c)).collect::<String>();
    assert_eq!(parsed[0].param("error_description"), Some(printable(&description).as_str()));
    assert_eq!(parsed[0].param("scope"), Some(printable(&scope).as_str()));
});
