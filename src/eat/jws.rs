//! Checking a catalog's compact JWS, as the EAT text's Verification Process says: parse the
//! header and payload, find the key, check the RS256 signature, then the times. Strict by
//! construction: the header has exactly `alg` (`RS256`, so `none` and the HS* algorithms are
//! refused before any key is looked at), `kid` and optionally `typ` (`JWS`); `crit`, a
//! duplicated member or any other member is refused. RSA keys of fewer than 2048 bits are
//! refused whatever the signature says.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::Deserialize;
use serde_json::Value;

use super::discover::DiscoveryError;

/// The catalog signature's claims.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Claims {
    pub iss: String,
    pub iat: u64,
    pub exp: u64,
    pub catalog_hash: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    alg: String,
    kid: String,
    #[serde(default)]
    typ: Option<String>,
}

/// A compact JWS, its parts decoded but not yet trusted.
#[derive(Debug)]
pub struct Parsed<'a> {
    pub kid: String,
    pub claims: Claims,
    signing_input: &'a str,
    signature: Vec<u8>,
}

/// Longest JWS accepted (a 4096-bit signature and small JSON parts fit easily).
pub const MAX_JWS_BYTES: usize = 8 * 1024;

/// Parse `jws` and refuse, before any key is used, whatever is not RS256 with a `kid`.
pub fn parse(jws: &str) -> Result<Parsed<'_>, DiscoveryError> {
    let bad = |m: &str| DiscoveryError::JwsMalformed(m.to_owned());
    if jws.len() > MAX_JWS_BYTES {
        return Err(bad("longer than 8 KiB"));
    }
    let mut parts = jws.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("not three dot-separated parts"));
    };
    let decode = |part: &str, what: &str| {
        URL_SAFE_NO_PAD
            .decode(part)
            .map_err(|_| bad(&format!("{what} is not base64url")))
    };
    let header: Value =
        serde_json::from_slice(&decode(h, "header")?).map_err(|_| bad("header is not JSON"))?;
    // The algorithm first, so that `none` and HS* get their own reason.
    match header.get("alg").and_then(Value::as_str) {
        Some("RS256") => {}
        Some(other) => {
            return Err(DiscoveryError::AlgorithmRefused(
                other.chars().take(32).collect(),
            ))
        }
        None => return Err(bad("header has no alg")),
    }
    let header: Header =
        serde_json::from_slice(&decode(h, "header")?).map_err(|e| bad(&format!("header: {e}")))?;
    debug_assert_eq!(header.alg, "RS256");
    if header.typ.as_deref().is_some_and(|t| t != "JWS") {
        return Err(bad("header typ is not JWS"));
    }
    let claims: Claims = serde_json::from_slice(&decode(p, "payload")?)
        .map_err(|e| bad(&format!("payload: {e}")))?;
    Ok(Parsed {
        kid: header.kid,
        claims,
        signing_input: &jws[..h.len() + 1 + p.len()],
        signature: decode(s, "signature")?,
    })
}

impl Parsed<'_> {
    /// The text the signature is over: header and payload as sent.
    pub fn signing_input(&self) -> &str {
        self.signing_input
    }
}

/// An RSA public key from a JWK, checked for use with RS256.
#[derive(Debug, Clone)]
pub struct RsaKey {
    n: Vec<u8>,
    e: Vec<u8>,
}

impl RsaKey {
    /// `jwk` as an RS256 verification key: `kty: RSA`, `alg` RS256 when given, `use` sig when
    /// given, at least 2048 bits.
    pub fn from_jwk(jwk: &Value) -> Result<Self, DiscoveryError> {
        let bad = |m: &str| DiscoveryError::KeyUnusable(m.to_owned());
        if jwk.get("kty").and_then(Value::as_str) != Some("RSA") {
            return Err(bad("kty is not RSA"));
        }
        if jwk.get("alg").is_some_and(|a| a != "RS256") {
            return Err(bad("alg is not RS256"));
        }
        if jwk.get("use").is_some_and(|u| u != "sig") {
            return Err(bad("use is not sig"));
        }
        if jwk.get("d").is_some() {
            return Err(bad("a published key holds its private part"));
        }
        let member = |k: &str| {
            jwk.get(k)
                .and_then(Value::as_str)
                .and_then(|s| URL_SAFE_NO_PAD.decode(s).ok())
                .ok_or_else(|| bad(&format!("{k} is not base64url")))
        };
        let n = member("n")?;
        let e = member("e")?;
        let bits = modulus_bits(&n);
        if bits < 2048 {
            return Err(DiscoveryError::WeakKey(bits));
        }
        Ok(RsaKey { n, e })
    }

    /// Bits of the modulus.
    pub fn bits(&self) -> usize {
        modulus_bits(&self.n)
    }

    /// Whether `parsed`'s signature is this key's, over its signing input.
    pub fn verify(&self, parsed: &Parsed<'_>) -> Result<(), DiscoveryError> {
        let key = ring::signature::RsaPublicKeyComponents {
            n: &self.n,
            e: &self.e,
        };
        key.verify(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            parsed.signing_input.as_bytes(),
            &parsed.signature,
        )
        .map_err(|_| DiscoveryError::BadSignature)
    }
}

/// Significant bits of a big-endian modulus.
fn modulus_bits(n: &[u8]) -> usize {
    let n = &n[n.iter().take_while(|b| **b == 0).count()..];
    match n.first() {
        None => 0,
        Some(first) => n.len() * 8 - first.leading_zeros() as usize,
    }
}

/// `iat` not in the future and `exp` not past, each with `skew_s` of clock difference.
pub fn check_times(c: &Claims, now_s: u64, skew_s: u64) -> Result<(), DiscoveryError> {
    if c.exp <= c.iat {
        return Err(DiscoveryError::JwsMalformed("exp is not after iat".into()));
    }
    if c.iat > now_s.saturating_add(skew_s) {
        return Err(DiscoveryError::NotYetValid);
    }
    if c.exp.saturating_add(skew_s) <= now_s {
        return Err(DiscoveryError::Expired);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eat::keys::CatalogKeys;
    use serde_json::json;

    /// Times at the end of the range (a signer's `exp`, a clock) are compared, not added
    /// past it: no overflow (a panic in a debug build).
    #[test]
    fn times_at_the_end_of_the_range_are_checked_without_overflow() {
        let claims = |iat, exp| Claims {
            iss: "did:web:x".into(),
            iat,
            exp,
            catalog_hash: String::new(),
        };
        assert!(check_times(&claims(100, u64::MAX), 200, 60).is_ok());
        assert!(check_times(&claims(u64::MAX - 1, u64::MAX), u64::MAX - 1, 60).is_ok());
        assert!(matches!(
            check_times(&claims(100, 200), u64::MAX, 60),
            Err(DiscoveryError::Expired)
        ));
    }

    fn signed() -> (tempfile::TempDir, CatalogKeys, String) {
        let dir = tempfile::tempdir().unwrap();
        let keys = CatalogKeys::load_or_create(dir.path()).unwrap();
        let jws = keys.sign(&json!({"iss": "did:web:h.test", "iat": 100, "exp": 200,
                                    "catalog_hash": "sha256:00"}));
        (dir, keys, jws)
    }

    fn forge(header: &Value, rest: &str) -> String {
        let mut parts = rest.splitn(2, '.');
        let (_, tail) = (parts.next(), parts.next().unwrap());
        format!("{}.{tail}", URL_SAFE_NO_PAD.encode(header.to_string()))
    }

    #[test]
    fn a_catalog_signature_verifies_with_its_published_key_only() {
        let (_d, keys, jws) = signed();
        let parsed = parse(&jws).unwrap();
        assert_eq!(parsed.kid, keys.current().kid());
        assert_eq!(parsed.claims.iss, "did:web:h.test");
        let key = RsaKey::from_jwk(&keys.current().jwk()).unwrap();
        key.verify(&parsed).unwrap();

        let (_d2, other, _) = signed();
        let stranger = RsaKey::from_jwk(&other.current().jwk()).unwrap();
        assert!(matches!(
            stranger.verify(&parsed),
            Err(DiscoveryError::BadSignature)
        ));

        // One changed payload byte breaks it.
        let mut parts: Vec<&str> = jws.split('.').collect();
        let payload = URL_SAFE_NO_PAD.encode(
            json!({"iss": "did:web:h.test", "iat": 100, "exp": 900, "catalog_hash": "sha256:00"})
                .to_string(),
        );
        parts[1] = &payload;
        let changed = parts.join(".");
        assert!(matches!(
            key.verify(&parse(&changed).unwrap()),
            Err(DiscoveryError::BadSignature)
        ));
    }

    #[test]
    fn none_hs_crit_and_odd_headers_are_refused_before_any_key() {
        let (_d, keys, jws) = signed();
        let kid = keys.current().kid().to_owned();
        for (alg, want) in [("none", "none"), ("HS256", "HS256"), ("RS512", "RS512")] {
            let forged = forge(&json!({"alg": alg, "kid": kid}), &jws);
            match parse(&forged) {
                Err(DiscoveryError::AlgorithmRefused(a)) => assert_eq!(a, want),
                other => panic!("{alg}: {other:?}"),
            }
        }
        for header in [
            json!({"alg": "RS256", "kid": kid, "crit": ["exp"]}),
            json!({"alg": "RS256"}),
            json!({"alg": "RS256", "kid": kid, "typ": "JWT"}),
            json!({"alg": "RS256", "kid": kid, "jku": "https://evil.test/keys"}),
        ] {
            assert!(
                matches!(
                    parse(&forge(&header, &jws)),
                    Err(DiscoveryError::JwsMalformed(_))
                ),
                "{header}"
            );
        }
        let dup = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"RS256","kid":"{kid}","kid":"x"}}"#)),
            jws.split_once('.').unwrap().1
        );
        assert!(matches!(parse(&dup), Err(DiscoveryError::JwsMalformed(_))));
        for junk in ["", "a.b", "a.b.c.d", "!!.??.##"] {
            assert!(parse(junk).is_err(), "{junk}");
        }
    }

    #[test]
    fn keys_under_2048_bits_and_keys_for_other_uses_are_refused() {
        let small = json!({"kty": "RSA", "n": URL_SAFE_NO_PAD.encode([0xffu8; 128]), "e": "AQAB"});
        assert!(matches!(
            RsaKey::from_jwk(&small),
            Err(DiscoveryError::WeakKey(1024))
        ));
        // Leading zero bytes do not count.
        let mut padded = vec![0u8; 8];
        padded.extend([0x01u8; 255]);
        let odd = json!({"kty": "RSA", "n": URL_SAFE_NO_PAD.encode(&padded), "e": "AQAB"});
        assert!(matches!(
            RsaKey::from_jwk(&odd),
            Err(DiscoveryError::WeakKey(2033))
        ));
        let n = URL_SAFE_NO_PAD.encode([0xffu8; 256]);
        for jwk in [
            json!({"kty": "EC", "n": n, "e": "AQAB"}),
            json!({"kty": "RSA", "n": n, "e": "AQAB", "alg": "RS384"}),
            json!({"kty": "RSA", "n": n, "e": "AQAB", "use": "enc"}),
            json!({"kty": "RSA", "n": n, "e": "AQAB", "d": "AQAB"}),
            json!({"kty": "RSA", "n": 5, "e": "AQAB"}),
        ] {
            assert!(
                matches!(RsaKey::from_jwk(&jwk), Err(DiscoveryError::KeyUnusable(_))),
                "{jwk}"
            );
        }
    }

    #[test]
    fn times_are_checked_with_the_skew() {
        let c = |iat, exp| Claims {
            iss: String::new(),
            iat,
            exp,
            catalog_hash: String::new(),
        };
        assert!(check_times(&c(100, 200), 150, 30).is_ok());
        assert!(check_times(&c(100, 200), 229, 30).is_ok());
        assert!(matches!(
            check_times(&c(100, 200), 230, 30),
            Err(DiscoveryError::Expired)
        ));
        assert!(matches!(
            check_times(&c(200, 300), 169, 30),
            Err(DiscoveryError::NotYetValid)
        ));
        assert!(check_times(&c(200, 200), 200, 30).is_err());
    }
}
