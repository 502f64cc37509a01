//! OAuth bearer tokens: the JWS header reader, key selection and signature check against a
//! fixed key set, and the claims checks. Nothing panics; a token is never accepted unless
//! its signature verified (arbitrary input never carries a valid ES256 signature by the
//! fixed key, so acceptance here is a bug).

#![no_main]

use std::time::Duration;

use carapace_filters::bearer::token::{self, TokenRules};
use libfuzzer_sys::fuzz_target;

const JWKS: &str = r#"{"keys": [
  {"kty": "EC", "crv": "P-256", "kid": "ec", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
  {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
  {"kty": "RSA", "kid": "rsa", "e": "AQAB", "n": "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw"}
]}"#;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let keys: jsonwebtoken::jwk::JwkSet = serde_json::from_str(JWKS).expect("fixed JWKS");
    let rules = TokenRules {
        issuer: "https://auth.test".into(),
        audiences: vec!["https://tools.test/mcp".into()],
        skew: Duration::from_secs(60),
    };
    if let Ok((alg, kid)) = token::header(text) {
        if let Some(jwk) = token::key_for(&keys, alg, kid.as_deref()) {
            assert!(
                token::verify(text, alg, jwk, &rules, 1_800_000_000).is_err(),
                "an arbitrary token was accepted"
            );
        }
    }
    // The claims checks alone, on any JSON.
    if let Ok(claims) = serde_json::from_str::<serde_json::Value>(text) {
        let _ = token::claims(&claims, &rules, 1_800_000_000);
    }
    let _ = token::same_resource(text, "https://tools.test/mcp");
});
