//! An OAuth issuer for tests: an ES256 key, its JWKS, and tokens signed with it.

use base64::Engine;
use jsonwebtoken::{EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair};
use serde_json::{json, Value};

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The issuer's ES256 key: its JWKS and a signer.
pub struct Issuer {
    key: EncodingKey,
    pub jwks: Value,
}

impl Issuer {
    pub fn new(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        let p = pair.public_key().as_ref();
        Issuer {
            key: EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwks: json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
                "x": b64(&p[1..33]), "y": b64(&p[33..65])}]}),
        }
    }

    pub fn token(&self, claims: &Value) -> String {
        let mut h = Header::new(jsonwebtoken::Algorithm::ES256);
        h.kid = self.jwks["keys"][0]["kid"].as_str().map(str::to_owned);
        jsonwebtoken::encode(&h, claims, &self.key).unwrap()
    }
}
