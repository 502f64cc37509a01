use std::sync::Arc;
use std::time::{Duration, SystemTime};

use carapace_filters::nonce::{NonceStore, NonceStoreConfig};
use rcgen::{CertificateParams, CertificateSigningRequestParams, DnType, KeyPair};
use rustls_pki_types::pem::PemObject;
use serde_json::Value;

use super::gateway::{dn_text, GatewayHandshake, PairRequest, PairedPeer};
use super::remote::{Installed, Progress, RemoteConfig, RemoteHandshake};
use super::{is_valid_pairing_id, is_valid_peer_id, single_cert, HandshakeError};
use crate::pairing::identity::{GatewayIdentity, HostIdentity};
use crate::pairing::wire::{
    decode_message, fingerprint_der, GoTime, PairError, PairMessage, SignedMessage, WireMessage,
};

mod gateway;
mod tool_host;

fn vectors(name: &str) -> Value {
    let path = format!(
        "{}/../shared/vectors/crabstack/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn nonces() -> Arc<NonceStore> {
    Arc::new(
        NonceStore::open(
            NonceStoreConfig {
                capacity: 64,
                ttl: Duration::from_secs(600),
                journal: None,
            },
            0,
        )
        .unwrap(),
    )
}

fn hex32(v: &Value) -> [u8; 32] {
    hex::decode(v.as_str().unwrap())
        .unwrap()
        .try_into()
        .unwrap()
}

fn transcript_clock(t: &Value) -> SystemTime {
    GoTime::parse_rfc3339(t["generator"]["fixed_clock"].as_str().unwrap())
        .unwrap()
        .to_system_time()
        .unwrap()
}

fn remote_for_transcript(t: &Value, store: Arc<NonceStore>) -> RemoteHandshake {
    let k = &t["keys"];
    let host = HostIdentity::from_keys(
        hex32(&k["remote_ed25519"]["seed_hex"]),
        hex32(&k["remote_x25519"]["private_key_hex"]),
    );
    let csr_key = p256_sec1_to_keypair(k["remote_csr_key"]["private_key_pem"].as_str().unwrap());
    RemoteHandshake::new(
        RemoteConfig {
            component_type: "tool_host".into(),
            component_id: t["inputs"]["component_id"].as_str().unwrap().into(),
            gateway_public_key_ed25519: k["gateway_ed25519"]["public_key_b64"]
                .as_str()
                .unwrap()
                .into(),
            endpoint_tls_fingerprint: String::new(),
        },
        Arc::new(host),
        store,
    )
    .with_csr_key(csr_key)
}

/// Go writes the CSR key as SEC1 (`EC PRIVATE KEY`); ring reads PKCS#8. Rewrap the
/// P-256 scalar and public point.
fn p256_sec1_to_keypair(pem: &str) -> KeyPair {
    let der = rustls_pki_types::PrivateSec1KeyDer::from_pem_slice(pem.as_bytes()).unwrap();
    let der = der.secret_sec1_der();
    assert_eq!(&der[..7], [0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20]);
    let (scalar, point) = (&der[7..39], &der[der.len() - 65..]);
    let mut inner = vec![0x30, 0x6b, 0x02, 0x01, 0x01, 0x04, 0x20];
    inner.extend_from_slice(scalar);
    inner.extend_from_slice(&[0xa1, 0x44, 0x03, 0x42, 0x00]);
    inner.extend_from_slice(point);
    let mut pkcs8 = vec![0x30, 0x81, 0x87, 0x02, 0x01, 0x00];
    pkcs8.extend_from_slice(&[
        0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86,
        0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ]);
    pkcs8.extend_from_slice(&[0x04, 0x6d]);
    pkcs8.extend_from_slice(&inner);
    KeyPair::try_from(pkcs8.as_slice()).unwrap()
}
