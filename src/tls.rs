//! TLS 1.3 server configuration (one crypto provider: ring) and certificate fingerprints.

use std::path::Path;
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsConfig;

/// A TLS file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    Verifier(String),
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
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(path, e))?;
    if certs.is_empty() {
        return Err(file_err(path, "no certificate found"));
    }
    Ok(certs)
}

/// Read the private key of a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_err(path, e))
}

/// TLS 1.3 only, ALPN `h2` and `http/1.1`, and — when a client CA is configured — a client
/// certificate chained to it required on every connection.
pub fn server_config(tls: &TlsConfig) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let certs = load_certs(&tls.cert_file)?;
    let key = load_key(&tls.key_file)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let mut config = match &tls.client_ca_file {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in load_certs(ca)? {
                roots.add(c).map_err(|e| file_err(ca, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Verifier(e.to_string()))?;
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(certs, key)?
        }
        None => builder.with_no_client_auth().with_single_cert(certs, key)?,
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

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
