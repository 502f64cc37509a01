//! Access tokens: JWTs (RFC 9068 style) checked against the issuer's keys.
//!
//! Only RS256, ES256 and EdDSA are accepted, each only with a key of its own family; `none`,
//! the HMAC algorithms and everything else are refused before any key is looked at. The
//! signature is checked first, then the claims against an injected clock: `iss` exactly,
//! `aud` naming this resource (RFC 8707), `exp` required, `nbf` and `iat` when present, each
//! with the configured skew.

use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::Value;

/// What a token must say to be accepted here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRules {
    /// The issuer (`iss`), exactly.
    pub issuer: String,
    /// Accepted audiences: this resource's canonical URI first.
    pub audiences: Vec<String>,
    /// Accepted clock difference for `exp`, `nbf` and `iat`.
    pub skew: Duration,
}

/// What an accepted token says about its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// `sub`, else `client_id`, else `azp`.
    pub subject: String,
    /// `scope` (space-separated) or `scp` (an array).
    pub scopes: Vec<String>,
    /// `exp`, in seconds since the epoch.
    pub expires_at: u64,
}

/// Why a token was refused. The text goes to the caller in `error_description`; it never
/// holds any part of the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is not a JWT")]
    Malformed,
    #[error("the token's algorithm is not accepted (RS256, ES256 or EdDSA)")]
    Algorithm,
    #[error("the token is signed by an unknown key")]
    UnknownKey,
    #[error("the token's signature does not verify")]
    Signature,
    #[error("the token was issued by another issuer")]
    Issuer,
    #[error("the token is not issued for this resource")]
    Audience,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token lacks the {0} claim")]
    MissingClaim(&'static str),
}

/// The algorithms accepted, by name as they appear in a JWS header.
pub const ACCEPTED_ALGORITHMS: [&str; 3] = ["RS256", "ES256", "EdDSA"];

/// The header's algorithm, refused unless it is one of [`ACCEPTED_ALGORITHMS`]. Reads the
/// header by hand so that `none` and unknown names are refused by this code, not by a parse
/// error deep in a library.
pub fn header(token: &str) -> Result<(Algorithm, Option<String>), TokenError> {
    use base64::Engine;
    let mut parts = token.split('.');
    let (Some(h), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(h)
        .map_err(|_| TokenError::Malformed)?;
    #[derive(Deserialize)]
    struct Header {
        alg: String,
        #[serde(default)]
        kid: Option<String>,
        #[serde(default)]
        crit: Option<Value>,
    }
    let header: Header = serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed)?;
    if header.crit.is_some() {
        // No extension is understood here, so a critical one cannot be honoured (RFC 7515).
        return Err(TokenError::Malformed);
    }
    let alg = match header.alg.as_str() {
        "RS256" => Algorithm::RS256,
        "ES256" => Algorithm::ES256,
        "EdDSA" => Algorithm::EdDSA,
        _ => return Err(TokenError::Algorithm),
    };
    Ok((alg, header.kid))
}

/// Whether `jwk` may verify `alg`: its family, its `use` and its own `alg` agree.
fn key_fits(jwk: &Jwk, alg: Algorithm) -> bool {
    let family = match (&jwk.algorithm, alg) {
        (AlgorithmParameters::RSA(_), Algorithm::RS256) => true,
        (AlgorithmParameters::EllipticCurve(ec), Algorithm::ES256) => {
            ec.curve == jsonwebtoken::jwk::EllipticCurve::P256
        }
        (AlgorithmParameters::OctetKeyPair(okp), Algorithm::EdDSA) => {
            okp.curve == jsonwebtoken::jwk::EllipticCurve::Ed25519
        }
        _ => false,
    };
    let usable = !matches!(
        jwk.common.public_key_use,
        Some(PublicKeyUse::Encryption) | Some(PublicKeyUse::Other(_))
    );
    let same_alg = match jwk.common.key_algorithm {
        None => true,
        Some(KeyAlgorithm::RS256) => alg == Algorithm::RS256,
        Some(KeyAlgorithm::ES256) => alg == Algorithm::ES256,
        Some(KeyAlgorithm::EdDSA) => alg == Algorithm::EdDSA,
        Some(_) => false,
    };
    family && usable && same_alg
}

/// The key that verifies a token of `alg` with `kid`: by `kid` when the token names one,
/// else the only key of that family. `None` when there is no such key.
pub fn key_for<'a>(keys: &'a JwkSet, alg: Algorithm, kid: Option<&str>) -> Option<&'a Jwk> {
    let mut fitting = keys.keys.iter().filter(|k| key_fits(k, alg));
    match kid {
        Some(kid) => fitting.find(|k| k.common.key_id.as_deref() == Some(kid)),
        None => {
            let first = fitting.next()?;
            fitting.next().is_none().then_some(first)
        }
    }
}

/// Verify `token` with `jwk` and check its claims at `now_s` (seconds since the epoch).
pub fn verify(
    token: &str,
    alg: Algorithm,
    jwk: &Jwk,
    rules: &TokenRules,
    now_s: u64,
) -> Result<Holder, TokenError> {
    let key = DecodingKey::from_jwk(jwk).map_err(|_| TokenError::UnknownKey)?;
    let mut validation = Validation::new(alg);
    // The claims are checked below against the injected clock.
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    let data = jsonwebtoken::decode::<Value>(token, &key, &validation).map_err(|e| {
        use jsonwebtoken::errors::ErrorKind;
        match e.kind() {
            ErrorKind::InvalidSignature
            | ErrorKind::InvalidEcdsaKey
            | ErrorKind::InvalidRsaKey(_) => TokenError::Signature,
            ErrorKind::InvalidAlgorithm => TokenError::Algorithm,
            _ => TokenError::Malformed,
        }
    })?;
    claims(&data.claims, rules, now_s)
}

/// Whether two resource URIs name the same resource, as the MCP authorization text asks them
/// compared: scheme and host case-insensitively, a trailing `/` of the path ignored. Anything
/// that is not an absolute URI must be equal as it is.
pub fn same_resource(a: &str, b: &str) -> bool {
    fn canonical(s: &str) -> Option<String> {
        let u: http::Uri = s.parse().ok()?;
        let (scheme, authority) = (u.scheme_str()?, u.authority()?);
        let path = u.path().trim_end_matches('/');
        let query = u.query().map(|q| format!("?{q}")).unwrap_or_default();
        Some(format!(
            "{}://{}{path}{query}",
            scheme.to_ascii_lowercase(),
            authority.as_str().to_ascii_lowercase()
        ))
    }
    a == b || matches!((canonical(a), canonical(b)), (Some(x), Some(y)) if x == y)
}

/// Check the claims of a verified token.
pub fn claims(c: &Value, rules: &TokenRules, now_s: u64) -> Result<Holder, TokenError> {
    let skew = rules.skew.as_secs();
    let number = |name: &'static str| -> Result<Option<u64>, TokenError> {
        match c.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
                .map(Some)
                .ok_or(TokenError::Malformed),
        }
    };
    if c.get("iss").and_then(Value::as_str) != Some(rules.issuer.as_str()) {
        return Err(TokenError::Issuer);
    }
    let audiences: Vec<&str> = match c.get("aud") {
        Some(Value::String(a)) => vec![a.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => return Err(TokenError::MissingClaim("aud")),
    };
    if !audiences
        .iter()
        .any(|a| rules.audiences.iter().any(|r| r == a))
    {
        return Err(TokenError::Audience);
    }
    let exp = number("exp")?.ok_or(TokenError::MissingClaim("exp"))?;
    if now_s >= exp.saturating_add(skew) {
        return Err(TokenError::Expired);
    }
    if number("nbf")?.is_some_and(|nbf| now_s.saturating_add(skew) < nbf) {
        return Err(TokenError::NotYetValid);
    }
    if number("iat")?.is_some_and(|iat| now_s.saturating_add(skew) < iat) {
        return Err(TokenError::NotYetValid);
    }
    if c.get("sub").is_some_and(|s| !s.is_string()) {
        return Err(TokenError::Malformed);
    }
    let subject = ["sub", "client_id", "azp"]
        .iter()
        .find_map(|k| c.get(*k).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
        .ok_or(TokenError::MissingClaim("sub"))?
        .to_owned();
    let scopes = match (c.get("scope"), c.get("scp")) {
        (Some(Value::String(s)), _) => s
            .split(' ')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        (None, Some(Value::Array(a))) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        (None, Some(Value::String(s))) => s
            .split(' ')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        (None, None) => Vec::new(),
        _ => return Err(TokenError::Malformed),
    };
    Ok(Holder {
        subject,
        scopes,
        expires_at: exp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_compare_as_the_authorization_text_says() {
        assert!(same_resource(
            "https://Tools.Example.com/mcp",
            "HTTPS://tools.example.com/mcp/"
        ));
        assert!(!same_resource(
            "https://tools.example.com/mcp",
            "https://tools.example.com/MCP"
        ));
        assert!(!same_resource(
            "https://tools.example.com/mcp",
            "https://tools.example.com:444/mcp"
        ));
        assert!(!same_resource("urn:a", "urn:A"));
        assert!(same_resource("urn:a", "urn:a"));
    }
}
