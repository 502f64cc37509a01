//! The catalog's signing keys: RSA of at least 2048 bits (RS256, as the EAT text asks),
//! generated at first start into `<state_dir>/eat-keys.json` (mode 0600, written atomically,
//! refused when others may read it) or loaded from a file of the same form. Several keys may be
//! held for rotation: the first signs, all are published. Each is named by its RFC 7638 JWK
//! thumbprint.
//!
//! ring signs and verifies with RSA but cannot make RSA keys, so a new key is generated with
//! the `rsa` crate, used for nothing else: its private-key operations are not constant-time
//! (RUSTSEC-2023-0071), and key generation is one local operation with nothing to observe.

use std::path::Path;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Digest;

use crate::pairing::identity::IdentityError;

/// Size of a key carapace makes.
pub const GENERATED_BITS: usize = 2048;
/// The key file in the state directory.
pub const KEY_FILE: &str = "eat-keys.json";

/// Why the keys could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    File(#[from] IdentityError),
    #[error("{path}: key {index}: {message}")]
    Key {
        path: String,
        index: usize,
        message: String,
    },
    #[error("{0}: holds no key")]
    Empty(String),
    #[error("generating an RSA key: {0}")]
    Generate(String),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    version: u32,
    /// Base64 (standard) of each key's PKCS#8 DER; the first signs.
    keys: Vec<String>,
}

/// One signing key.
pub struct SigningKey {
    kid: String,
    pair: RsaKeyPair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    fn from_pkcs8(der: &[u8]) -> Result<Self, String> {
        let pair = RsaKeyPair::from_pkcs8(der).map_err(|e| e.to_string())?;
        if pair.public().modulus_len() * 8 < GENERATED_BITS {
            return Err("an RSA key must have at least 2048 bits".into());
        }
        let kid = thumbprint(&public_jwk_members(&pair));
        Ok(SigningKey { kid, pair })
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key as a JWK (`kty`, `n`, `e`, `kid`, `use`, `alg`).
    pub fn jwk(&self) -> Value {
        let (n, e) = public_jwk_members(&self.pair);
        json!({"kty": "RSA", "n": n, "e": e, "kid": self.kid, "use": "sig", "alg": "RS256"})
    }
}

/// `n` and `e` of a key, base64url without padding.
fn public_jwk_members(pair: &RsaKeyPair) -> (String, String) {
    let c = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(pair.public());
    (URL_SAFE_NO_PAD.encode(&c.n), URL_SAFE_NO_PAD.encode(&c.e))
}

/// RFC 7638: base64url of the SHA-256 of `{"e":…,"kty":"RSA","n":…}` (members in that order,
/// no whitespace).
fn thumbprint((n, e): &(String, String)) -> String {
    let canonical = format!(r#"{{"e":"{e}","kty":"RSA","n":"{n}"}}"#);
    URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(canonical.as_bytes()))
}

/// A new RSA key, as PKCS#8 DER.
pub fn generate() -> Result<Vec<u8>, KeyError> {
    use rsa::pkcs8::EncodePrivateKey;
    let key = rsa::RsaPrivateKey::new(&mut rand::rngs::OsRng, GENERATED_BITS)
        .map_err(|e| KeyError::Generate(e.to_string()))?;
    let der = key
        .to_pkcs8_der()
        .map_err(|e| KeyError::Generate(e.to_string()))?;
    Ok(der.as_bytes().to_vec())
}

/// The keys that sign and are published.
#[derive(Debug)]
pub struct CatalogKeys {
    keys: Vec<SigningKey>,
}

impl CatalogKeys {
    /// `<state_dir>/eat-keys.json`, made with one new key on first use.
    pub fn load_or_create(state_dir: &Path) -> Result<Self, KeyError> {
        let path = state_dir.join(KEY_FILE);
        let mut generated = None;
        let file = crate::pairing::identity::load_or_create(&path, || {
            let der = generate();
            let keys = der
                .as_ref()
                .map(|d| vec![STANDARD.encode(d)])
                .unwrap_or_default();
            generated = Some(der);
            KeyFile { version: 1, keys }
        })?;
        if let Some(Err(e)) = generated {
            return Err(e);
        }
        Self::from_file(&path, file)
    }

    /// Keys from a file of the same form (`{"version": 1, "keys": ["<base64 PKCS#8>", ...]}`),
    /// which its group may read (a mounted Secret).
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let file = crate::pairing::identity::load_or_create_provided(path, || KeyFile {
            version: 1,
            keys: Vec::new(),
        })?;
        Self::from_file(path, file)
    }

    fn from_file(path: &Path, file: KeyFile) -> Result<Self, KeyError> {
        let shown = path.display().to_string();
        let keys = file
            .keys
            .iter()
            .enumerate()
            .map(|(index, b64)| {
                let key = STANDARD
                    .decode(b64)
                    .map_err(|e| e.to_string())
                    .and_then(|der| SigningKey::from_pkcs8(&zeroize::Zeroizing::new(der)));
                key.map_err(|message| KeyError::Key {
                    path: shown.clone(),
                    index,
                    message,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(KeyError::Empty(shown));
        }
        Ok(CatalogKeys { keys })
    }

    /// The key that signs.
    pub fn current(&self) -> &SigningKey {
        &self.keys[0]
    }

    /// `{"keys": [...]}` with every public key.
    pub fn jwks(&self) -> Value {
        json!({"keys": self.keys.iter().map(SigningKey::jwk).collect::<Vec<_>>()})
    }

    /// A compact JWS of `payload`: header `{"alg":"RS256","typ":"JWS","kid":…}`, signed with
    /// the current key.
    pub fn sign(&self, payload: &Value) -> String {
        let key = self.current();
        let header = json!({"alg": "RS256", "typ": "JWS", "kid": key.kid});
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(payload.to_string())
        );
        let mut sig = vec![0u8; key.pair.public().modulus_len()];
        key.pair
            .sign(
                &RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                input.as_bytes(),
                &mut sig,
            )
            .expect("a 2048 to 4096-bit key signs");
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_kept_private_and_signs_what_its_jwk_verifies() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let keys = CatalogKeys::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(KEY_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = CatalogKeys::load_or_create(dir.path()).unwrap();
        assert_eq!(
            keys.current().kid(),
            again.current().kid(),
            "kept, not made again"
        );
        // The JWS verifies with the published key (jsonwebtoken, independently of ring's signer).
        let jws = keys.sign(&json!({"iss": "did:web:tools.test", "iat": 1, "exp": 2}));
        let jwks: jsonwebtoken::jwk::JwkSet = serde_json::from_value(keys.jwks()).unwrap();
        let jwk = jwks.find(keys.current().kid()).unwrap();
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        v.validate_exp = false;
        v.required_spec_claims.clear();
        let data = jsonwebtoken::decode::<Value>(
            &jws,
            &jsonwebtoken::DecodingKey::from_jwk(jwk).unwrap(),
            &v,
        )
        .unwrap();
        assert_eq!(data.claims["iss"], "did:web:tools.test");
        assert_eq!(data.header.kid.as_deref(), Some(keys.current().kid()));
        // A file others may read is refused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(CatalogKeys::load_or_create(dir.path()).is_err());
    }

    /// A configured keys file its group may read (a Secret mounted `0440` with the pod's
    /// `fsGroup`) is taken; one its group may write, or others read, is not. The file carapace
    /// makes in its state directory stays owner-only.
    #[test]
    fn a_provided_keys_file_may_be_read_by_its_group() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let made = CatalogKeys::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(KEY_FILE);
        let mode = |m: u32| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m));
        mode(0o440).unwrap();
        let loaded = CatalogKeys::load(&path).unwrap();
        assert_eq!(loaded.current().kid(), made.current().kid());
        assert!(CatalogKeys::load_or_create(dir.path()).is_err());
        for refused in [0o460, 0o444, 0o442] {
            mode(refused).unwrap();
            assert!(CatalogKeys::load(&path).is_err(), "{refused:o}");
        }
        // A file of the wrong form is refused without quoting it (it holds keys).
        mode(0o600).unwrap();
        std::fs::write(
            &path,
            r#"{"version": 1, "keys": "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"}"#,
        )
        .unwrap();
        let e = CatalogKeys::load(&path).unwrap_err().to_string();
        assert!(!e.contains("MIIEvQ"), "{e}");
    }
}
