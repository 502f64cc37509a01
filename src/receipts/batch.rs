//! Receipts signed in batches: one Ed25519 signature over the Merkle root of the receipts that
//! ended together, each receipt carrying its inclusion proof (the `v2` form, see
//! [`super::decode`]).
//!
//! The first call to ask for a signature leads. When other calls are still under way (started,
//! not yet asking), it lets the event loop run once more, so every call that ends in the same
//! turn joins the queue; then it signs what queued up and hands each call its header value. A
//! call that asks while another leads waits for it. A call that ends while no other is under
//! way signs at once: nothing could join it, so a quiet host adds no turn of its loop (and no
//! poll of its I/O for nothing), while under load one signature serves many calls.
//!
//! ```text
//! others under way:  A ends, leads | B, C end and queue | A signs A, B, C
//! none under way:    A ends, leads, signs A
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine as _;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::oneshot;

use super::merkle::{self, Hash};
use crate::pairing::wire::SigningIdentity;

/// The most receipts one signature covers; a longer queue is signed in several batches.
pub const MAX_BATCH: usize = 1024;

/// What a batch's signature covers: this, the tree's size (8 bytes, big-endian) and its root.
/// A `v1` receipt signs its payload, which starts with `{`, so one can never pass for the
/// other.
pub const BATCH_CONTEXT: &[u8] = b"carapace receipt batch\0";

/// The bytes a batch's signature is over.
pub fn batch_message(size: u64, root: &Hash) -> Vec<u8> {
    let mut msg = Vec::with_capacity(BATCH_CONTEXT.len() + 8 + 32);
    msg.extend_from_slice(BATCH_CONTEXT);
    msg.extend_from_slice(&size.to_be_bytes());
    msg.extend_from_slice(root);
    msg
}

/// The longest proof: index, size and a path as deep as a tree gets.
const PROOF_BYTES: usize = 8 + 32 * merkle::MAX_DEPTH;

/// A receipt's inclusion proof as the `v2` form carries it, written into `out`: index and size
/// (4 bytes each, big-endian), then the audit path's hashes from the leaf up. The part of
/// `out` that holds it is returned.
fn write_proof<'a>(
    index: u32,
    size: u32,
    path: &[Hash],
    out: &'a mut [u8; PROOF_BYTES],
) -> &'a [u8] {
    out[..4].copy_from_slice(&index.to_be_bytes());
    out[4..8].copy_from_slice(&size.to_be_bytes());
    for (slot, h) in out[8..].chunks_exact_mut(32).zip(path) {
        slot.copy_from_slice(h);
    }
    &out[..8 + 32 * path.len()]
}

/// Sign `payloads` (receipts' RFC 8785 forms) as one batch: each one's `v2` header value.
pub fn sign_batch(key: &SigningIdentity, payloads: &[String]) -> Vec<String> {
    assert!((1..=MAX_BATCH).contains(&payloads.len()));
    let leaves: Vec<Hash> = payloads
        .iter()
        .map(|p| merkle::leaf_hash(p.as_bytes()))
        .collect();
    let (root, paths) = merkle::tree(&leaves);
    let size = payloads.len() as u32;
    let sig = B64URL.encode(key.sign_bytes(&batch_message(size.into(), &root)));
    let mut proof = [0u8; PROOF_BYTES];
    payloads
        .iter()
        .zip(paths)
        .enumerate()
        .map(|(i, (payload, path))| {
            let proof = write_proof(i as u32, size, &path, &mut proof);
            let mut value = String::with_capacity(
                5 + super::b64_len(payload.len()) + super::b64_len(proof.len()) + sig.len(),
            );
            value.push_str("v2.");
            B64URL.encode_string(payload, &mut value);
            value.push('.');
            B64URL.encode_string(proof, &mut value);
            value.push('.');
            value.push_str(&sig);
            value
        })
        .collect()
}

/// The signatures batches made and the receipts they covered: over a time, the second's
/// growth divided by the first's is the mean batch size. Exported as metrics.
#[derive(Debug, Default)]
pub struct BatchCounters {
    pub signatures: Counter,
    pub receipts: Counter,
}

impl BatchCounters {
    /// Register the counters in `registry` (`receipt_batch_signatures`,
    /// `receipt_batch_receipts`).
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "receipt_batch_signatures",
            "Signatures over batches of receipts (receipts.batch)",
            self.signatures.clone(),
        );
        registry.register(
            "receipt_batch_receipts",
            "Receipts signed in batches; over receipt_batch_signatures, the mean batch size",
            self.receipts.clone(),
        );
    }
}

/// The receipts waiting for their batch's signature.
#[derive(Default)]
pub struct BatchQueue {
    queue: Mutex<Queue>,
    /// Calls started and not yet asking for their signature: those that could still join the
    /// batch a leader collects.
    under_way: AtomicUsize,
    counters: Arc<BatchCounters>,
}

/// A call counted as under way: from [`BatchQueue::start`] until it asks for its signature
/// ([`BatchQueue::sign`], which gives it back) or ends without one ([`BatchQueue::abandon`]).
#[derive(Debug)]
#[must_use = "a started call is counted until it is given back to sign or abandon"]
pub struct Started(());

#[derive(Default)]
struct Queue {
    /// A call is collecting the batch and will sign it.
    led: bool,
    waiting: Vec<Waiting>,
}

struct Waiting {
    payload: String,
    reply: oneshot::Sender<String>,
}

impl BatchQueue {
    /// A queue that counts its batches into `counters`.
    pub fn counting(counters: Arc<BatchCounters>) -> Self {
        BatchQueue {
            counters,
            ..BatchQueue::default()
        }
    }

    /// Count a call as under way: a leader that asks while it is waits a turn for it.
    pub fn start(&self) -> Started {
        // Relaxed: the count orders nothing else; it only decides whether a leader waits.
        self.under_way.fetch_add(1, Ordering::Relaxed);
        Started(())
    }

    /// A started call no longer under way: it queued for its signature, or it was dropped
    /// before it asked.
    pub fn abandon(&self, started: Started) {
        let Started(()) = started;
        self.under_way.fetch_sub(1, Ordering::Relaxed);
    }

    /// The `v2` header value for `payload`, signed with the others that end in this turn of
    /// the event loop (none if no other call is under way). `None` only if the signing
    /// panicked.
    pub async fn sign(
        &self,
        key: &SigningIdentity,
        payload: String,
        started: Started,
    ) -> Option<String> {
        let (reply, signed) = oneshot::channel();
        let leads = {
            let mut q = self.lock();
            q.waiting.push(Waiting { payload, reply });
            !std::mem::replace(&mut q.led, true)
        };
        // Queued: no longer a call that could join.
        self.abandon(started);
        if leads {
            // The guard signs the batch when dropped: at once when no other call is under
            // way, after the turn below, or when this call is dropped first, so no waiting
            // call is left without its receipt.
            let _leader = Leader { queue: self, key };
            if self.under_way.load(Ordering::Relaxed) > 0 {
                tokio::task::yield_now().await;
            }
        }
        signed.await.ok()
    }

    /// Nothing panics while holding the lock; a poisoned one is taken as it is.
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sign every waiting receipt, batch by batch, and give up the lead once none is left.
    fn sign_waiting(&self, key: &SigningIdentity) {
        loop {
            let batch = {
                let mut q = self.lock();
                if q.waiting.is_empty() {
                    q.led = false;
                    return;
                }
                let n = q.waiting.len().min(MAX_BATCH);
                q.waiting.drain(..n).collect::<Vec<_>>()
            };
            let (payloads, replies): (Vec<String>, Vec<_>) =
                batch.into_iter().map(|w| (w.payload, w.reply)).unzip();
            self.counters.signatures.inc();
            self.counters.receipts.inc_by(payloads.len() as u64);
            for (reply, value) in replies.into_iter().zip(sign_batch(key, &payloads)) {
                // A call dropped while it waited no longer wants its receipt.
                let _ = reply.send(value);
            }
        }
    }
}

struct Leader<'a> {
    queue: &'a BatchQueue,
    key: &'a SigningIdentity,
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        self.queue.sign_waiting(self.key);
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};

    use super::*;
    use crate::receipts::{verify, Receipt, ReceiptError, ReceiptSigner, ReceiptStatus};

    fn key() -> SigningIdentity {
        SigningIdentity::from_seed(&[7; 32]).unwrap()
    }

    fn receipt(i: usize) -> Receipt {
        Receipt {
            receipt_id: format!("rcpt_{i:024x}"),
            tool: "memory.query".into(),
            consumer: "gw_test".into(),
            provider: "memory-host".into(),
            input_hash: crate::receipts::value_hash(&serde_json::json!({ "n": i })),
            output_hash: crate::receipts::value_hash(&serde_json::Value::Null),
            status: ReceiptStatus::Ok,
            executed_at: crate::receipts::rfc3339_ms(1_790_000_000_000 + i as u64),
            duration_ms: 1,
        }
    }

    fn parts(value: &str) -> Vec<String> {
        value.split('.').map(str::to_string).collect()
    }

    fn proof_of(value: &str) -> (u32, u32, usize) {
        let bytes = B64URL.decode(&parts(value)[2]).unwrap();
        let n = |r: std::ops::Range<usize>| u32::from_be_bytes(bytes[r].try_into().unwrap());
        (n(0..4), n(4..8), (bytes.len() - 8) / 32)
    }

    #[test]
    fn each_receipt_of_a_batch_verifies_alone_and_a_changed_proof_does_not() {
        let public = key().public_key_b64();
        let payloads: Vec<String> = (0..7).map(|i| receipt(i).canonical()).collect();
        let signed = sign_batch(&key(), &payloads);
        let sig = &parts(&signed[0])[3];
        for (i, value) in signed.iter().enumerate() {
            assert!(value.starts_with("v2."));
            assert_eq!(&parts(value)[3], sig, "one signature for the batch");
            assert_eq!(verify(value.as_bytes(), &public), Ok(receipt(i)));
            assert_eq!(proof_of(value).0, i as u32);
            assert_eq!(proof_of(value).1, 7);
        }
        let other = SigningIdentity::from_seed(&[8; 32]).unwrap();
        assert_eq!(
            verify(signed[3].as_bytes(), &other.public_key_b64()),
            Err(ReceiptError::BadSignature)
        );

        // Another receipt's payload with this one's proof, another index or size, a changed
        // hash of the path: each leads to another root, or to none.
        let with =
            |payload: &str, proof: Vec<u8>| format!("v2.{payload}.{}.{sig}", B64URL.encode(proof));
        let p = parts(&signed[3]);
        let proof = B64URL.decode(&p[2]).unwrap();
        let swapped = with(&parts(&signed[4])[1], proof.clone());
        assert_eq!(
            verify(swapped.as_bytes(), &public),
            Err(ReceiptError::BadSignature)
        );
        for (at, value) in [
            (3, 4u8),
            (7, 8),
            (7, 6),
            (7, 9),
            (8, 0x55),
            (proof.len() - 1, 0),
        ] {
            let mut changed = proof.clone();
            changed[at] = value;
            let got = verify(with(&p[1], changed).as_bytes(), &public);
            assert!(
                matches!(
                    got,
                    Err(ReceiptError::BadSignature | ReceiptError::BadProof)
                ),
                "byte {at} = {value}: {got:?}"
            );
        }
        let mut short = proof.clone();
        short.truncate(proof.len() - 32);
        assert_eq!(
            verify(with(&p[1], short).as_bytes(), &public),
            Err(ReceiptError::BadProof)
        );
        let mut odd = proof.clone();
        odd.pop();
        assert!(matches!(
            verify(with(&p[1], odd).as_bytes(), &public),
            Err(ReceiptError::Malformed(_))
        ));

        // The batch's signature is not a receipt's signature of its payload, nor the reverse.
        let as_v1 = format!("v1.{}.{sig}", p[1]);
        assert_eq!(
            verify(as_v1.as_bytes(), &public),
            Err(ReceiptError::BadSignature)
        );
        let v1 = receipt(3).encode(&key());
        let v1_sig = &parts(&v1)[2];
        let as_v2 = format!("v2.{}.{}.{v1_sig}", p[1], p[2]);
        assert_eq!(
            verify(as_v2.as_bytes(), &public),
            Err(ReceiptError::BadSignature)
        );
    }

    #[tokio::test]
    async fn calls_ending_in_one_turn_share_a_signature_and_a_lone_call_is_its_own_batch() {
        let public = key().public_key_b64();
        let counters = Arc::new(BatchCounters::default());
        let signer = Arc::new(
            ReceiptSigner::batched(key(), "memory-host".into()).counting(counters.clone()),
        );
        // Forty calls under way at once, as on a busy host: the first to end waits a turn and
        // the others join it.
        let calls: Vec<_> = (0..40).map(|_| signer.clone().start()).collect();
        let tasks: Vec<_> = calls
            .into_iter()
            .enumerate()
            .map(|(i, call)| tokio::spawn(async move { call.sign(&receipt(i)).await.unwrap() }))
            .collect();
        let mut signed = Vec::new();
        for t in tasks {
            signed.push(t.await.unwrap());
        }
        let mut indexes = Vec::new();
        for (i, value) in signed.iter().enumerate() {
            assert_eq!(verify(value.as_bytes(), &public), Ok(receipt(i)));
            let (index, size, _) = proof_of(value);
            assert_eq!(size, 40, "all forty ended in one turn");
            assert_eq!(parts(value)[3], parts(&signed[0])[3]);
            indexes.push(index);
        }
        indexes.sort();
        assert_eq!(indexes, (0..40).collect::<Vec<_>>());
        assert_eq!(
            (counters.signatures.get(), counters.receipts.get()),
            (1, 40)
        );

        // One call at a time: a batch of one, with an empty path, signed in the call's own
        // turn (nothing else is under way to wait for).
        let mut cx = Context::from_waker(Waker::noop());
        for i in 0..3 {
            let r = receipt(i);
            let mut lone = pin!(signer.clone().start().sign(&r));
            let Poll::Ready(Some(value)) = lone.as_mut().poll(&mut cx) else {
                panic!("a lone call waited a turn of the event loop");
            };
            assert_eq!(proof_of(&value), (0, 1, 0));
            assert_eq!(verify(value.as_bytes(), &public), Ok(receipt(i)));
        }
        assert_eq!(
            (counters.signatures.get(), counters.receipts.get()),
            (4, 43)
        );
    }

    #[tokio::test]
    async fn a_leader_waits_one_turn_for_a_call_under_way_and_not_for_one_dropped() {
        let public = key().public_key_b64();
        let signer = Arc::new(ReceiptSigner::batched(key(), "memory-host".into()));
        let mut cx = Context::from_waker(Waker::noop());
        let (r0, r1) = (receipt(0), receipt(1));
        let (a, b) = (signer.clone().start(), signer.clone().start());
        let mut leader = pin!(a.sign(&r0));
        assert!(
            leader.as_mut().poll(&mut cx).is_pending(),
            "signed before the call under way could join"
        );
        let mut follower = pin!(b.sign(&r1));
        assert!(follower.as_mut().poll(&mut cx).is_pending());
        let value = leader.await.unwrap();
        assert_eq!(proof_of(&value), (0, 2, 1));
        assert_eq!(verify(value.as_bytes(), &public), Ok(receipt(0)));
        let value = follower.await.unwrap();
        assert_eq!(proof_of(&value), (1, 2, 1));

        // A call dropped before it ended (its future never polled) is no longer under way:
        // the next call to end does not wait for it.
        let (a, b) = (signer.clone().start(), signer.clone().start());
        let r2 = receipt(2);
        drop(b.sign(&r1));
        let mut alone = pin!(a.sign(&r2));
        let Poll::Ready(Some(value)) = alone.as_mut().poll(&mut cx) else {
            panic!("waited for a call that was dropped");
        };
        assert_eq!(proof_of(&value), (0, 1, 0));
    }

    #[tokio::test]
    async fn a_leader_dropped_before_it_signed_still_signs_the_calls_waiting_on_it() {
        let public = key().public_key_b64();
        let signer = Arc::new(ReceiptSigner::batched(key(), "memory-host".into()));
        let mut cx = Context::from_waker(Waker::noop());
        let (r0, r1) = (receipt(0), receipt(1));
        let (a, b) = (signer.clone().start(), signer.clone().start());
        let mut leader = Box::pin(a.sign(&r0));
        assert!(leader.as_mut().poll(&mut cx).is_pending());
        let mut follower = pin!(b.sign(&r1));
        assert!(follower.as_mut().poll(&mut cx).is_pending());
        drop(leader);
        let Poll::Ready(Some(value)) = follower.as_mut().poll(&mut cx) else {
            panic!("the follower's receipt was signed when the leader was dropped");
        };
        assert_eq!(verify(value.as_bytes(), &public), Ok(receipt(1)));
        assert_eq!(proof_of(&value), (1, 2, 1));

        // The lead is free again: the next call signs its own batch.
        let value = signer.clone().start().sign(&receipt(2)).await.unwrap();
        assert_eq!(proof_of(&value), (0, 1, 0));
    }

    #[test]
    fn a_long_queue_is_signed_in_batches_of_at_most_max_batch() {
        let queue = BatchQueue::default();
        let mut replies = Vec::new();
        {
            let mut q = queue.lock();
            q.led = true;
            for i in 0..MAX_BATCH + 3 {
                let (reply, rx) = oneshot::channel();
                q.waiting.push(Waiting {
                    payload: receipt(i).canonical(),
                    reply,
                });
                replies.push(rx);
            }
        }
        queue.sign_waiting(&key());
        assert!(!queue.lock().led);
        let sizes: Vec<u32> = replies
            .into_iter()
            .map(|mut rx| proof_of(&rx.try_recv().unwrap()).1)
            .collect();
        assert!(sizes[..MAX_BATCH].iter().all(|&s| s == MAX_BATCH as u32));
        assert!(sizes[MAX_BATCH..].iter().all(|&s| s == 3));
    }
}
