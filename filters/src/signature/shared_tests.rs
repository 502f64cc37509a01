use super::*;
use crate::call::SkillCredential;
use crate::canonical::hmac_sha256_hex;
use crate::shared::SharedStateError;
use std::collections::HashSet;
use std::sync::Mutex;

const NOW: u64 = 1_735_689_600_000;

/// A shared ledger in memory that records what it was asked, or fails every call.
#[derive(Default)]
struct FakeLedger {
    seen: Mutex<HashSet<(String, String)>>,
    asked: Mutex<Vec<Duration>>,
    down: bool,
}

impl SharedNonces for FakeLedger {
    fn insert_if_absent(
        &self,
        scope: &str,
        nonce: &str,
        ttl: Duration,
    ) -> BoxFuture<Result<bool, SharedStateError>> {
        self.asked.lock().unwrap().push(ttl);
        let r = if self.down {
            Err(SharedStateError("connection refused".into()))
        } else {
            Ok(self
                .seen
                .lock()
                .unwrap()
                .insert((scope.to_owned(), nonce.to_owned())))
        };
        Box::pin(async move { r })
    }
}

fn verifier(ledger: Arc<FakeLedger>) -> SignatureVerifier {
    SignatureVerifier::new(
        AuthMode::Hmac,
        vec![SigningKey {
            id: "k".into(),
            secret: Arc::from(&b"secret"[..]),
        }],
        Duration::from_secs(120),
        ReplayGuard::Shared {
            store: ledger,
            ttl: Duration::from_secs(300),
        },
        Arc::new(|| NOW),
    )
}

fn signed(secret: &[u8], nonce: &str) -> Credential {
    let canonical = format!(r#"{{"nonce":"{nonce}","timestamp":{NOW}}}"#);
    Credential::Skill(Box::new(SkillCredential {
        api_key: None,
        header_signature: None,
        signature_hex: hmac_sha256_hex(secret, canonical.as_bytes()),
        canonical,
        timestamp_ms: NOW as i64,
        nonce: nonce.into(),
        scope: "demo.echo".into(),
    }))
}

async fn outcome(v: &SignatureVerifier, c: &Credential) -> Result<(), Rejection> {
    match v.verify(c)? {
        Verified::Now(_) => panic!("a shared store answers later"),
        Verified::Pending(f) => f.await,
    }
}

#[tokio::test]
async fn the_shared_ledger_decides_replays_with_the_configured_ttl() {
    let ledger = Arc::new(FakeLedger::default());
    let v = verifier(ledger.clone());
    outcome(&v, &signed(b"secret", "n1")).await.unwrap();
    assert!(matches!(
        outcome(&v, &signed(b"secret", "n1")).await,
        Err(Rejection::NonceReplay)
    ));
    assert_eq!(*ledger.asked.lock().unwrap(), [Duration::from_secs(300); 2]);
}

#[tokio::test]
async fn a_forged_call_never_reaches_the_shared_ledger() {
    let ledger = Arc::new(FakeLedger::default());
    let v = verifier(ledger.clone());
    assert!(matches!(
        v.verify(&signed(b"wrong", "n1")),
        Err(Rejection::AuthFailed(_))
    ));
    assert!(ledger.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn an_unreachable_ledger_refuses_the_call() {
    let ledger = Arc::new(FakeLedger {
        down: true,
        ..Default::default()
    });
    let v = verifier(ledger);
    assert!(matches!(
        outcome(&v, &signed(b"secret", "n1")).await,
        Err(Rejection::SharedStateUnavailable(_))
    ));
}
