//! RFC 9421 signatures: the `Signature-Input` and `Signature` parser, the signature base of
//! each parsed signature over a fixed request, and the `Content-Digest` check. Nothing
//! panics; whatever parses yields a base ending in its own `@signature-params` line.
//! Input: Signature-Input, Signature, Content-Digest and the body, separated by 0xFF bytes.

#![no_main]

use carapace_filters::http_signature::message::{
    check_content_digest, parse, signature_base, RequestView,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|b| *b == 0xFF);
    let input = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let signature = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let digest = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let body = parts.next().unwrap_or_default();
    let _ = check_content_digest(&digest, body);
    let Ok(sigs) = parse(&input, &signature) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    headers.insert("host", http::HeaderValue::from_static("tools.test:8443"));
    headers.insert("content-type", http::HeaderValue::from_static("application/json"));
    if let Ok(v) = http::HeaderValue::from_str(&digest) {
        headers.insert("content-digest", v);
    }
    let uri: http::Uri = "/v1/tools/call?x=1".parse().expect("fixed URI");
    let view = RequestView {
        method: &http::Method::POST,
        scheme: "https",
        uri: &uri,
        headers: &headers,
    };
    for sig in sigs {
        if let Ok(base) = signature_base(&sig, &view) {
            let last = base.lines().last().unwrap_or_default();
            assert!(last.starts_with("\"@signature-params\": ("), "{base}");
        }
    }
});
