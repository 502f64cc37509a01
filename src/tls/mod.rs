//! TLS 1.3 server configuration (one crypto provider: ring) and certificate fingerprints.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsConfig;

pub mod verified_chains;

/// A TLS file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    Verifier(String),
    #[error("pairing id {0:?} is not a plain file name")]
    PairingId(String),
}

/// The fingerprint of a certificate as the pairing handshake defines it: `sha256:` and the
/// lowercase hex SHA-256 of its DER.
pub fn fingerprint(der: &[u8]) -> String {
    crate::pairing::wire::fingerprint_der(der)
}

/// The crypto provider used everywhere.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_err(path: &Path, message: impl ToString) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// Read every certificate of a PEM file.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_pem(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(path, e))?;
    if certs.is_empty() {
        return Err(file_err(path, "no certificate found"));
    }
    Ok(certs)
}

/// Read the private key of a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = zeroize::Zeroizing::new(read_pem(path)?);
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| file_err(path, e))
}

/// A PEM file's bytes: a regular file of a bounded size.
fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    carapace_filters::state_file::read_bounded(
        path,
        carapace_filters::state_file::MAX_DOCUMENT_BYTES,
    )
    .map_err(|e| file_err(path, e))
}

/// A TLS listener's settings, with what the identity layer needs to know of its client CA.
pub struct ListenerTls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// Fingerprint of the client CA when the listener trusts exactly one.
    pub client_ca_fingerprint: Option<String>,
}

/// Where a pairing installs the tool host's certificate, key and the gateway's CA: one
/// directory per pairing (`pairing/<pairing_id>/`), made current by atomically writing its id
/// to `pairing/current` once the gateway completed the pairing. A pairing cut off before
/// that is never used.
pub struct PairedFiles {
    pub dir: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// Whether `id` can name a pairing directory: one plain path component of 1 to 64
/// characters `A-Z a-z 0-9 _ -` (no separator, no `.` or `..`, nothing absolute). Pairing ids
/// are checked more strictly when they arrive; this guards the file system whatever the caller.
pub fn is_plain_pairing_dir(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

impl PairedFiles {
    /// The files of pairing `pairing_id`, refused unless the id is a plain file name (see
    /// [`is_plain_pairing_dir`]), so they are always inside `state_dir/pairing/`.
    pub fn of(state_dir: &Path, pairing_id: &str) -> Result<Self, TlsError> {
        if !is_plain_pairing_dir(pairing_id) {
            let shown: String = pairing_id.chars().take(80).collect();
            return Err(TlsError::PairingId(shown));
        }
        let dir = Self::root(state_dir).join(pairing_id);
        Ok(PairedFiles {
            cert: dir.join("mtls.crt"),
            key: dir.join("mtls.key"),
            ca: dir.join("gateway-ca.pem"),
            dir,
        })
    }

    /// The directory holding every pairing's directory and the pointer to the current one.
    pub fn root(state_dir: &Path) -> PathBuf {
        state_dir.join("pairing")
    }

    /// The pointer to the current pairing.
    pub fn current_pointer(state_dir: &Path) -> PathBuf {
        Self::root(state_dir).join("current")
    }

    /// Remove the directory of pairing `pairing_id` unless it is the current one. Returns
    /// whether a directory was removed.
    pub fn discard(state_dir: &Path, pairing_id: &str) -> bool {
        let Ok(files) = Self::of(state_dir, pairing_id) else {
            return false;
        };
        if Self::current(state_dir).is_some_and(|c| c.dir == files.dir) {
            return false;
        }
        std::fs::remove_dir_all(&files.dir).is_ok()
    }

    /// Remove every pairing directory but the current one: pairings that never completed.
    /// Returns how many were removed.
    pub fn remove_unfinished(state_dir: &Path) -> usize {
        let Ok(entries) = std::fs::read_dir(Self::root(state_dir)) else {
            return 0;
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|id| Self::discard(state_dir, id))
            })
            .count()
    }

    /// The files of the current pairing, if a pairing completed.
    pub fn current(state_dir: &Path) -> Option<Self> {
        let id = carapace_filters::state_file::read_bounded(&Self::current_pointer(state_dir), 256)
            .ok()?;
        Self::of(state_dir, std::str::from_utf8(&id).ok()?.trim()).ok()
    }
}

/// The listener's TLS: the certificate and gateway CA of the current pairing, else the
/// configured files.
/// `certificate_optional`: connections without a client certificate are let through (as
/// anonymous) for a later layer to authenticate each request (OAuth bearer tokens).
pub fn listener_tls(
    tls: &TlsConfig,
    paired: Option<&PairedFiles>,
    certificate_optional: bool,
) -> Result<ListenerTls, TlsError> {
    let (cert, key, ca) = match paired {
        Some(p) => (&p.cert, &p.key, Some(&p.ca)),
        None => (&tls.cert_file, &tls.key_file, tls.client_ca_file.as_ref()),
    };
    let cas = match ca {
        Some(ca) => Some(load_certs(ca)?),
        None => None,
    };
    let client_ca_fingerprint = match cas.as_deref() {
        Some([one]) => Some(fingerprint(one)),
        _ => None,
    };
    let config = server_config(load_certs(cert)?, load_key(key)?, cas, certificate_optional)?;
    Ok(ListenerTls {
        acceptor: tokio_rustls::TlsAcceptor::from(config),
        client_ca_fingerprint,
    })
}

/// TLS 1.3 only, ALPN `h2` and `http/1.1`, and — when client CAs are given — a client
/// certificate chained to one of them on every connection (or, `certificate_optional`, on
/// every connection that presents one). A chain once verified is remembered
/// ([`verified_chains`]); the client's proof that it holds the key is checked on every
/// handshake, and with client CAs no session is resumed (every handshake is a full one).
pub fn server_config(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_cas: Option<Vec<CertificateDer<'static>>>,
    certificate_optional: bool,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let mut config = match client_cas {
        Some(cas) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in cas {
                roots
                    .add(c)
                    .map_err(|e| TlsError::Verifier(e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if certificate_optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| TlsError::Verifier(e.to_string()))?;
            let verifier = verified_chains::RememberingVerifier::new(verifier);
            let mut config = builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(certs, key)?;
            // No session resumption where callers are known by their certificate: a resumed
            // session is not checked again (neither the chain's expiry nor the key), for as
            // long as its ticket lasts.
            config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
            config.send_tls13_tickets = 0;
            config
        }
        None => builder.with_no_client_auth().with_single_cert(certs, key)?,
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// URI-name prefix that marks a gateway's own client certificate.
pub const GATEWAY_URI_PREFIX: &str = "urn:carapace:gateway:";

/// The gateway id of a certificate's `urn:carapace:gateway:<id>` URI name, if it has one.
pub fn gateway_id(der: &[u8]) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::FromDer;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|n| match n {
        GeneralName::URI(uri) => uri.strip_prefix(GATEWAY_URI_PREFIX).map(str::to_owned),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_files_stay_inside_the_state_directory() {
        let state = Path::new("/var/lib/carapace");
        let ok = PairedFiles::of(state, "a3f3553b6b9b3861a24253b5cb7c43a7").unwrap();
        assert_eq!(
            ok.key,
            state.join("pairing/a3f3553b6b9b3861a24253b5cb7c43a7/mtls.key")
        );
        let long = "a".repeat(65);
        for bad in [
            "../../x",
            "..",
            ".",
            "",
            "/etc",
            "/tmp/x",
            "a/b",
            "a\\b",
            "x\0",
            "current\n",
            long.as_str(),
        ] {
            assert!(
                matches!(PairedFiles::of(state, bad), Err(TlsError::PairingId(_))),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn only_the_current_pairing_survives_a_cleanup() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        for id in ["aa", "bb", "cc"] {
            let f = PairedFiles::of(state, id).unwrap();
            std::fs::create_dir_all(&f.dir).unwrap();
            std::fs::write(&f.key, "k").unwrap();
        }
        std::fs::write(PairedFiles::current_pointer(state), "bb").unwrap();
        assert!(!PairedFiles::discard(state, "bb"));
        assert!(PairedFiles::discard(state, "aa"));
        assert_eq!(PairedFiles::remove_unfinished(state), 1);
        assert_eq!(PairedFiles::remove_unfinished(state), 0);
        assert!(PairedFiles::current(state).unwrap().key.exists());
        assert!(!PairedFiles::root(state).join("cc").exists());
    }

    #[test]
    fn fingerprint_is_sha256_prefix_and_lowercase_hex() {
        // The format of the pairing handshake: `sha256:` + 64 lowercase hex of SHA-256(DER).
        let f = fingerprint(b"abc");
        assert_eq!(
            f,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
