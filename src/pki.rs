//! Certificates for the demo and tests: a throwaway CA issuing server and client
//! certificates (rcgen, ECDSA P-256).

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::CertificateDer;

/// A certificate with its key.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
    /// `sha256:<hex>` of the DER, as the peer store records it.
    pub fingerprint: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

/// A certificate authority.
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Authority {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("key");
        Authority {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    fn issue(&self, names: &[&str], cn: &str, usage: ExtendedKeyUsagePurpose) -> Issued {
        let params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        self.sign(params, cn, usage)
    }

    fn sign(
        &self,
        mut params: CertificateParams,
        cn: &str,
        usage: ExtendedKeyUsagePurpose,
    ) -> Issued {
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            fingerprint: crate::tls::fingerprint(cert.der()),
            der: cert.der().clone(),
        }
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    pub fn server(&self, names: &[&str]) -> Issued {
        self.issue(
            names,
            names.first().copied().unwrap_or("server"),
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate with common name `cn`.
    pub fn client(&self, cn: &str) -> Issued {
        self.issue(&[], cn, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A client certificate with common name `cn`, valid from `not_before` to `not_after`.
    pub fn client_valid(
        &self,
        cn: &str,
        not_before: std::time::SystemTime,
        not_after: std::time::SystemTime,
    ) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        self.sign(params, cn, ExtendedKeyUsagePurpose::ClientAuth)
    }
}
