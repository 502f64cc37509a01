//! Persistent identities of the two roles, kept in the state directory.
//!
//! The tool-host role has an Ed25519 key (signs its pairing messages) and an X25519 key
//! (proves possession by decrypting the gateway's challenge). The gateway role has an Ed25519
//! key and a certificate authority (rcgen, ECDSA P-256) that issues the mTLS certificates.
//! Each identity is one JSON file written atomically with mode 0600: a crash leaves the old
//! file or the new one, and a missing file is created on first use. A file that exists but
//! cannot be read is an error, never silently replaced (that would change who we are).

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use rand::RngCore;

use super::wire::{x25519_public_b64, SigningIdentity};
use serde::{Deserialize, Serialize};

/// Reading or creating an identity failed.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("identity {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("identity {path} is not valid: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// 32 secret bytes, wiped when dropped, never printed.
#[derive(Clone)]
struct Secret32(zeroize::Zeroizing<[u8; 32]>);

impl std::fmt::Debug for Secret32 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

fn random32() -> Secret32 {
    let mut b = zeroize::Zeroizing::new([0u8; 32]);
    rand::rngs::OsRng.fill_bytes(&mut *b);
    Secret32(b)
}

fn decode32(path: &Path, what: &str, b64: &str) -> Result<Secret32, IdentityError> {
    let bytes = B64.decode(b64).map_err(|e| IdentityError::Invalid {
        path: path.into(),
        message: format!("{what}: {e}"),
    })?;
    let arr: [u8; 32] = bytes.try_into().map_err(|_| IdentityError::Invalid {
        path: path.into(),
        message: format!("{what}: not 32 bytes"),
    })?;
    Ok(Secret32(zeroize::Zeroizing::new(arr)))
}

/// Load the JSON file at `path`, or create it with `create` and write it atomically. A file
/// that anyone but its owner may read is refused.
pub(crate) fn load_or_create<F: Serialize + for<'de> Deserialize<'de>>(
    path: &Path,
    create: impl FnOnce() -> F,
) -> Result<F, IdentityError> {
    load_or_create_refusing(path, create, 0o077)
}

/// [`load_or_create`] for a key file the operator provides, which its group may read: a
/// Kubernetes Secret is mounted `0440` with the pod's `fsGroup` as its group, the group this
/// process runs in. Writable by the group, or readable by others, it is refused.
pub(crate) fn load_or_create_provided<F: Serialize + for<'de> Deserialize<'de>>(
    path: &Path,
    create: impl FnOnce() -> F,
) -> Result<F, IdentityError> {
    load_or_create_refusing(path, create, 0o037)
}

/// [`load_or_create`], refusing a file with any of the mode bits `refused`.
fn load_or_create_refusing<F: Serialize + for<'de> Deserialize<'de>>(
    path: &Path,
    create: impl FnOnce() -> F,
    refused: u32,
) -> Result<F, IdentityError> {
    use carapace_filters::state_file::{read_bounded, MAX_DOCUMENT_BYTES};
    match read_bounded(path, MAX_DOCUMENT_BYTES) {
        Ok(bytes) => {
            use std::os::unix::fs::PermissionsExt;
            let bytes = zeroize::Zeroizing::new(bytes);
            let mode = std::fs::metadata(path)
                .map_err(|source| IdentityError::Io {
                    path: path.into(),
                    source,
                })?
                .permissions()
                .mode();
            if mode & refused != 0 {
                return Err(IdentityError::Invalid {
                    path: path.into(),
                    message: format!(
                        "mode {:o} lets others read the keys; chmod {}",
                        mode & 0o777,
                        if refused == 0o077 {
                            "600"
                        } else {
                            "600 or 640"
                        }
                    ),
                });
            }
            // serde's message can quote a value of the file, which is a key: say where.
            serde_json::from_slice(&bytes).map_err(|e| IdentityError::Invalid {
                path: path.into(),
                message: format!(
                    "not the expected JSON ({:?} error at line {}, column {})",
                    e.classify(),
                    e.line(),
                    e.column()
                ),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let file = create();
            let bytes = serde_json::to_vec_pretty(&file).expect("serializable");
            carapace_filters::state_file::write_atomically(path, &bytes).map_err(|source| {
                IdentityError::Io {
                    path: path.into(),
                    source,
                }
            })?;
            Ok(file)
        }
        Err(source) => Err(IdentityError::Io {
            path: path.into(),
            source,
        }),
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostFile {
    version: u32,
    ed25519_seed: String,
    x25519_private: String,
}

/// The tool-host role's identity.
pub struct HostIdentity {
    ed25519_seed: Secret32,
    x25519_private: Secret32,
}

impl std::fmt::Debug for HostIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostIdentity")
            .field("public_key_ed25519", &self.public_key_ed25519())
            .field("public_key_x25519", &self.public_key_x25519())
            .finish()
    }
}

impl HostIdentity {
    /// `<state_dir>/host_identity.json`, created on first use.
    pub fn load_or_create(state_dir: &Path) -> Result<Self, IdentityError> {
        let path = state_dir.join("host_identity.json");
        let file = load_or_create(&path, || HostFile {
            version: 1,
            ed25519_seed: B64.encode(*random32().0),
            x25519_private: B64.encode(*random32().0),
        })?;
        let id = HostIdentity {
            ed25519_seed: decode32(&path, "ed25519_seed", &file.ed25519_seed)?,
            x25519_private: decode32(&path, "x25519_private", &file.x25519_private)?,
        };
        Ok(id)
    }

    /// From raw keys (tests and vectors).
    pub fn from_keys(ed25519_seed: [u8; 32], x25519_private: [u8; 32]) -> Self {
        HostIdentity {
            ed25519_seed: Secret32(zeroize::Zeroizing::new(ed25519_seed)),
            x25519_private: Secret32(zeroize::Zeroizing::new(x25519_private)),
        }
    }

    /// The Ed25519 signing key.
    pub fn signing_key(&self) -> SigningIdentity {
        SigningIdentity::from_seed(&self.ed25519_seed.0).expect("32-byte seed")
    }

    /// The X25519 secret.
    pub fn x25519_secret(&self) -> x25519_dalek::StaticSecret {
        x25519_dalek::StaticSecret::from(*self.x25519_private.0)
    }

    /// Base64 (standard, padded) of the Ed25519 public key.
    pub fn public_key_ed25519(&self) -> String {
        self.signing_key().public_key_b64()
    }

    /// Base64 (standard, padded) of the X25519 public key.
    pub fn public_key_x25519(&self) -> String {
        x25519_public_b64(&self.x25519_secret())
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewayFile {
    version: u32,
    gateway_id: String,
    ed25519_seed: String,
    ca_key_pem: String,
    ca_cert_pem: String,
}

/// The gateway role's identity: its signing key and the pairing CA.
pub struct GatewayIdentity {
    pub gateway_id: String,
    ed25519_seed: Secret32,
    ca_key_pem: String,
    /// The CA certificate every issued mTLS certificate chains to.
    pub ca_cert_pem: String,
}

impl std::fmt::Debug for GatewayIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayIdentity")
            .field("gateway_id", &self.gateway_id)
            .field("public_key_ed25519", &self.public_key_ed25519())
            .finish_non_exhaustive()
    }
}

impl GatewayIdentity {
    /// `<state_dir>/gateway_identity.json`, created on first use with a new CA.
    pub fn load_or_create(state_dir: &Path, gateway_id: &str) -> Result<Self, IdentityError> {
        let path = state_dir.join("gateway_identity.json");
        let file = load_or_create(&path, || {
            let (ca_key_pem, ca_cert_pem) = new_ca(gateway_id);
            GatewayFile {
                version: 1,
                gateway_id: gateway_id.to_string(),
                ed25519_seed: B64.encode(*random32().0),
                ca_key_pem,
                ca_cert_pem,
            }
        })?;
        if file.gateway_id != gateway_id {
            return Err(IdentityError::Invalid {
                path,
                message: format!(
                    "belongs to gateway `{}`, not `{gateway_id}`",
                    file.gateway_id
                ),
            });
        }
        // The CA must load: fail now, not at the first pairing.
        rcgen::KeyPair::from_pem(&file.ca_key_pem).map_err(|e| IdentityError::Invalid {
            path: path.clone(),
            message: format!("ca_key_pem: {e}"),
        })?;
        Ok(GatewayIdentity {
            gateway_id: file.gateway_id,
            ed25519_seed: decode32(&path, "ed25519_seed", &file.ed25519_seed)?,
            ca_key_pem: file.ca_key_pem,
            ca_cert_pem: file.ca_cert_pem,
        })
    }

    /// The Ed25519 signing key.
    pub fn signing_key(&self) -> SigningIdentity {
        SigningIdentity::from_seed(&self.ed25519_seed.0).expect("32-byte seed")
    }

    /// Base64 (standard, padded) of the Ed25519 public key, as remotes configure it.
    pub fn public_key_ed25519(&self) -> String {
        self.signing_key().public_key_b64()
    }

    /// The CA's key pair (for issuing).
    pub fn ca_key(&self) -> rcgen::KeyPair {
        rcgen::KeyPair::from_pem(&self.ca_key_pem).expect("checked at load")
    }

    /// A client certificate from the pairing CA with the gateway's id as common name: what
    /// the gateway presents to the tool hosts it paired. Returns (certificate PEM, key PEM).
    pub fn issue_client_certificate(&self) -> Result<(String, String), IdentityError> {
        let invalid = |e: rcgen::Error| IdentityError::Invalid {
            path: PathBuf::from("gateway_identity.json"),
            message: e.to_string(),
        };
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(invalid)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, self.gateway_id.clone());
        // The mark tool hosts require: the CA never copies a URI name from a peer's CSR.
        let uri = format!("{}{}", crate::tls::GATEWAY_URI_PREFIX, self.gateway_id);
        params.subject_alt_names = vec![rcgen::SanType::URI(
            rcgen::string::Ia5String::try_from(uri).map_err(invalid)?,
        )];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        let now = std::time::SystemTime::now();
        params.not_before = (now - std::time::Duration::from_secs(300)).into();
        params.not_after = (now + std::time::Duration::from_secs(365 * 24 * 3600)).into();
        let issuer =
            rcgen::Issuer::from_ca_cert_pem(&self.ca_cert_pem, self.ca_key()).map_err(invalid)?;
        let key = rcgen::KeyPair::generate().map_err(invalid)?;
        let cert = params.signed_by(&key, &issuer).map_err(invalid)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// A new pairing CA: (key PEM, self-signed certificate PEM), valid ten years.
fn new_ca(gateway_id: &str) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("carapace pairing CA {gateway_id}"),
    );
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let now = std::time::SystemTime::now();
    params.not_before = now.into();
    params.not_after = (now + std::time::Duration::from_secs(10 * 365 * 24 * 3600)).into();
    let key = rcgen::KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("CA certificate");
    (key.serialize_pem(), cert.pem())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_host_identity_is_created_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = HostIdentity::load_or_create(dir.path()).unwrap();
        let b = HostIdentity::load_or_create(dir.path()).unwrap();
        assert_eq!(a.public_key_ed25519(), b.public_key_ed25519());
        assert_eq!(a.public_key_x25519(), b.public_key_x25519());
        assert_ne!(a.public_key_ed25519(), a.public_key_x25519());
        let path = dir.path().join("host_identity.json");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!format!("{a:?}").contains(&B64.encode(*a.ed25519_seed.0)));
    }

    #[test]
    fn an_identity_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        HostIdentity::load_or_create(dir.path()).unwrap();
        let path = dir.path().join("host_identity.json");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = HostIdentity::load_or_create(dir.path()).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }

    #[test]
    fn a_damaged_identity_is_an_error_not_a_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host_identity.json");
        std::fs::write(&path, b"{\"version\":1,\"ed25519_seed\":\"AAAA\"").unwrap();
        assert!(HostIdentity::load_or_create(dir.path()).is_err());
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"{\"version\":1,\"ed25519_seed\":\"AAAA\""
        );
    }

    #[test]
    fn the_gateway_identity_keeps_its_ca_and_refuses_another_gateway_id() {
        let dir = tempfile::tempdir().unwrap();
        let a = GatewayIdentity::load_or_create(dir.path(), "gw_home").unwrap();
        let b = GatewayIdentity::load_or_create(dir.path(), "gw_home").unwrap();
        assert_eq!(a.ca_cert_pem, b.ca_cert_pem);
        assert_eq!(a.public_key_ed25519(), b.public_key_ed25519());
        assert!(GatewayIdentity::load_or_create(dir.path(), "gw_other").is_err());
        a.ca_key();
    }

    #[test]
    fn ed25519_keys_derive_as_the_pairing_vectors_say() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/vectors/crabstack/pairing_transcript.json"
        );
        let t: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let k = &t["keys"];
        let hex32 = |v: &serde_json::Value| -> [u8; 32] {
            hex::decode(v.as_str().unwrap())
                .unwrap()
                .try_into()
                .unwrap()
        };
        let seed = hex32(&k["remote_ed25519"]["seed_hex"]);
        let x = hex32(&k["remote_x25519"]["private_key_hex"]);
        let id = HostIdentity::from_keys(seed, x);
        assert_eq!(
            id.public_key_ed25519(),
            k["remote_ed25519"]["public_key_b64"].as_str().unwrap()
        );
        assert_eq!(
            id.public_key_x25519(),
            k["remote_x25519"]["public_key_b64"].as_str().unwrap()
        );
        let gw_seed = hex32(&k["gateway_ed25519"]["seed_hex"]);
        let gw = SigningIdentity::from_seed(&gw_seed).unwrap();
        assert_eq!(
            gw.public_key_b64(),
            k["gateway_ed25519"]["public_key_b64"].as_str().unwrap()
        );
    }
}
