//! Signed receipts: proof of what a tool host executed.
//!
//! The inbound side signs a [`Receipt`] for every call it executed (ok, error or timeout)
//! with the tool host's Ed25519 identity key, the one pairing made; the caller gets it in the
//! `Carapace-Receipt` response header and the body is not changed. The outbound side checks
//! the receipt of each paired peer against the peer's `public_key_ed25519` and against what it
//! sent and received ([`check`]).
//!
//! The header's value is `v1.<payload>.<signature>`: `payload` is the unpadded base64url of the
//! receipt's RFC 8785 (JCS) form, `signature` the unpadded base64url of the Ed25519 signature
//! of exactly those bytes. A decoder refuses a payload that is not already canonical, so one
//! receipt has one encoding.
//!
//! A host that signs in batches ([`batch`]) sends `v2.<payload>.<proof>.<signature>`: the same
//! payload, its inclusion proof in the RFC 9162 Merkle tree of the receipts signed together
//! ([`merkle`]), and the signature of that tree's size and root.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Digest as _;

use crate::pairing::wire::SigningIdentity;

pub mod batch;
pub mod check;
pub mod layer;
pub mod merkle;
mod slot;

pub use check::{check, Expected, ReceiptMode, Verdict};
pub use layer::{ReceiptCall, ReceiptLayer, ReceiptSigner};
pub use slot::{ReceiptNote, ReceiptSlot};

/// The response header a receipt travels in.
pub const RECEIPT_HEADER: http::HeaderName = http::HeaderName::from_static("carapace-receipt");

/// The response header the outbound side reports its check of a peer's receipt in
/// (`verified`, `missing` or `invalid`).
pub const RECEIPT_STATUS_HEADER: http::HeaderName =
    http::HeaderName::from_static("carapace-receipt-status");

/// The longest header value a decoder reads.
pub const MAX_ENCODED_BYTES: usize = 8 * 1024;

/// How a call ended, as its receipt says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptStatus {
    Ok,
    Error,
    Timeout,
}

impl ReceiptStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiptStatus::Ok => "ok",
            ReceiptStatus::Error => "error",
            ReceiptStatus::Timeout => "timeout",
        }
    }
}

/// What a tool host signs for one executed call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// `rcpt_` and 24 hex digits, unique per receipt.
    pub receipt_id: String,
    /// The tool's name at the tool host.
    pub tool: String,
    /// Who called: the caller's component id (`local` on the Unix socket).
    pub consumer: String,
    /// Who executed: the tool host's component id.
    pub provider: String,
    /// `sha256:<hex>` of the RFC 8785 form of the call's arguments.
    pub input_hash: String,
    /// `sha256:<hex>` of the RFC 8785 form of the result (see [`output_value`]).
    pub output_hash: String,
    pub status: ReceiptStatus,
    /// When the call started, RFC 3339 UTC with milliseconds.
    pub executed_at: String,
    pub duration_ms: u64,
}

/// Why a receipt was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    #[error("malformed: {0}")]
    Malformed(&'static str),
    #[error("the payload is not in RFC 8785 form")]
    NotCanonical,
    #[error("the signature does not verify with the provider's key")]
    BadSignature,
    #[error("the inclusion proof does not fit its index and batch size")]
    BadProof,
    #[error("the provider's key is not a base64 Ed25519 public key")]
    BadKey,
    #[error("`{field}` does not match: receipt says {got}, expected {want}")]
    Mismatch {
        field: &'static str,
        got: String,
        want: String,
    },
}

impl ReceiptError {
    /// A short stable name for logs, metrics and the status header.
    pub fn reason(&self) -> &'static str {
        match self {
            ReceiptError::Malformed(_) => "malformed",
            ReceiptError::NotCanonical => "not_canonical",
            ReceiptError::BadSignature => "bad_signature",
            ReceiptError::BadProof => "bad_proof",
            ReceiptError::BadKey => "bad_key",
            ReceiptError::Mismatch { field, .. } => field,
        }
    }
}

/// `sha256:` and the lowercase hex SHA-256 of the RFC 8785 form of `value`. A value with no
/// RFC 8785 form (an integer no double holds exactly) is hashed in its plain JSON form.
pub fn value_hash(value: &Value) -> String {
    value_tag(value).as_str().to_string()
}

/// [`value_hash`] on the stack: the RFC 8785 form is written into a buffer this thread keeps
/// (a call's hashes allocate nothing once it has grown to their size).
pub fn value_tag(value: &Value) -> Tag {
    thread_local! {
        static TEXT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    /// Larger forms are not kept: the buffer stays the size of the common call.
    const KEEP: usize = 64 * 1024;
    TEXT.with_borrow_mut(|text| {
        text.clear();
        if carapace_filters::canonical::write_jcs(value, text).is_err() {
            *text = serde_json::to_string(value).expect("a Value serializes");
        }
        let tag = Tag::of(&sha2::Sha256::digest(text.as_bytes()).into());
        if text.capacity() > KEEP {
            *text = String::new();
        }
        tag
    })
}

/// A SHA-256 digest as written in receipts and the ledger (`sha256:` and 64 lowercase hex
/// digits), held on the stack.
#[derive(Clone, Copy)]
pub struct Tag([u8; 71]);

impl Tag {
    pub fn of(digest: &[u8; 32]) -> Tag {
        let mut tag = [0u8; 71];
        tag[..7].copy_from_slice(b"sha256:");
        hex::encode_to_slice(digest, &mut tag[7..]).expect("64 digits for 32 bytes");
        Tag(tag)
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("ASCII")
    }
}

/// A SHA-256 digest as written in receipts and the ledger: `sha256:` and 64 lowercase hex
/// digits.
pub fn sha256_tag(digest: &[u8; 32]) -> String {
    Tag::of(digest).as_str().to_string()
}

/// What a receipt's `output_hash` covers: the output of a call that succeeded, `{"code": ..}`
/// of one that failed, and `null` for a timeout.
pub fn output_value(status: ReceiptStatus, output: Option<&Value>, code: Option<&str>) -> Value {
    match status {
        ReceiptStatus::Ok => output.cloned().unwrap_or(Value::Null),
        ReceiptStatus::Error => serde_json::json!({"code": code.unwrap_or_default()}),
        ReceiptStatus::Timeout => Value::Null,
    }
}

/// `output_hash` of a call that ended with `status`: [`value_hash`] of [`output_value`],
/// without copying a success's output.
pub fn output_hash(status: ReceiptStatus, output: Option<&Value>, code: Option<&str>) -> String {
    output_tag(status, output, code).as_str().to_string()
}

/// [`output_hash`] on the stack.
pub fn output_tag(status: ReceiptStatus, output: Option<&Value>, code: Option<&str>) -> Tag {
    match (status, output) {
        (ReceiptStatus::Ok, Some(output)) => value_tag(output),
        _ => value_tag(&output_value(status, output, code)),
    }
}

/// A new receipt id.
pub fn new_receipt_id() -> String {
    let mut id = *b"rcpt_000000000000000000000000";
    hex::encode_to_slice(rand::random::<[u8; 12]>(), &mut id[5..]).expect("24 digits");
    String::from_utf8(id.to_vec()).expect("ASCII")
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds (`2026-11-26T12:00:00.123Z`), for
/// years up to 9999.
pub fn rfc3339_ms(unix_ms: u64) -> String {
    let (days, ms_of_day) = (unix_ms / 86_400_000, unix_ms % 86_400_000);
    let (year, month, day) = crate::pairing::wire::civil_from_days(days as i64);
    assert!(year <= 9999, "a year below 10000");
    let mut text = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut n: u64| {
        for i in (at..at + width).rev() {
            text[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, 4, year as u64);
    put(5, 2, month.into());
    put(8, 2, day.into());
    put(11, 2, ms_of_day / 3_600_000);
    put(14, 2, ms_of_day / 60_000 % 60);
    put(17, 2, ms_of_day / 1000 % 60);
    put(20, 3, ms_of_day % 1000);
    String::from_utf8(text.to_vec()).expect("ASCII")
}

impl Receipt {
    /// The RFC 8785 form: the bytes that are signed.
    pub fn canonical(&self) -> String {
        self.try_canonical()
            .expect("a receipt carapace makes has a duration a double holds exactly")
    }

    /// The RFC 8785 form, if there is one: none when `duration_ms` is an integer no double
    /// holds exactly (above 2^53), as a receipt from elsewhere may claim.
    fn try_canonical(&self) -> Option<String> {
        if self.duration_ms > 1 << 53 {
            // Past 2^53 only some integers have a form; the general writer knows which.
            let value = serde_json::to_value(self).expect("a receipt serializes");
            return carapace_filters::canonical::jcs_string(&value).ok();
        }
        Some(self.jcs_members())
    }

    /// The RFC 8785 form written member by member: the names in their sorted order (all
    /// ASCII, so UTF-16 order is byte order), each string escaped as `JSON.stringify` does,
    /// and `duration_ms` (at most 2^53) as its plain digits.
    fn jcs_members(&self) -> String {
        use carapace_filters::canonical::write_canonical_str as string;
        // About 330 bytes for a receipt with short names; longer ones grow it once.
        let mut out = String::with_capacity(384);
        out.push_str("{\"consumer\":");
        string(&self.consumer, &mut out);
        out.push_str(",\"duration_ms\":");
        out.push_str(itoa::Buffer::new().format(self.duration_ms));
        for (name, value) in [
            (",\"executed_at\":", &self.executed_at),
            (",\"input_hash\":", &self.input_hash),
            (",\"output_hash\":", &self.output_hash),
            (",\"provider\":", &self.provider),
            (",\"receipt_id\":", &self.receipt_id),
        ] {
            out.push_str(name);
            string(value, &mut out);
        }
        out.push_str(",\"status\":\"");
        out.push_str(self.status.as_str());
        out.push_str("\",\"tool\":");
        string(&self.tool, &mut out);
        out.push('}');
        out
    }

    /// Sign and encode: the `Carapace-Receipt` header value.
    pub fn encode(&self, key: &SigningIdentity) -> String {
        let payload = self.canonical();
        let sig = key.sign_bytes(payload.as_bytes());
        let mut value = String::with_capacity(4 + b64_len(payload.len()) + b64_len(sig.len()));
        value.push_str("v1.");
        B64URL.encode_string(payload, &mut value);
        value.push('.');
        B64URL.encode_string(sig, &mut value);
        value
    }
}

/// A header value split into the receipt, the signed bytes and the signature, not yet
/// verified.
#[derive(Debug)]
pub struct Encoded {
    pub receipt: Receipt,
    pub payload: Vec<u8>,
    pub signature: Vec<u8>,
    /// The receipt's place in its batch (`v2`); `None` for a receipt signed alone (`v1`).
    pub proof: Option<Proof>,
}

/// A `v2` receipt's inclusion proof: its leaf's index in a batch of `size`, and the audit path
/// from the leaf up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    pub index: u32,
    pub size: u32,
    pub path: Vec<merkle::Hash>,
}

impl Proof {
    fn parse(bytes: &[u8]) -> Result<Proof, ReceiptError> {
        let bad = ReceiptError::Malformed("proof is not index, size and 32-byte hashes");
        if bytes.len() < 8
            || !(bytes.len() - 8).is_multiple_of(32)
            || bytes.len() > 8 + 32 * merkle::MAX_DEPTH
        {
            return Err(bad);
        }
        let (head, path) = bytes.split_at(8);
        Ok(Proof {
            index: u32::from_be_bytes(head[..4].try_into().expect("4 bytes")),
            size: u32::from_be_bytes(head[4..].try_into().expect("4 bytes")),
            path: path
                .chunks_exact(32)
                .map(|c| c.try_into().expect("32 bytes"))
                .collect(),
        })
    }

    /// What the batch's signature covers, when the proof leads from `payload` to a root.
    fn signed_message(&self, payload: &[u8]) -> Result<Vec<u8>, ReceiptError> {
        let leaf = merkle::leaf_hash(payload);
        let root = merkle::root_from_path(self.index.into(), self.size.into(), leaf, &self.path)
            .ok_or(ReceiptError::BadProof)?;
        Ok(batch::batch_message(self.size.into(), &root))
    }
}

/// The length of `n` bytes in unpadded base64url.
pub(crate) fn b64_len(n: usize) -> usize {
    base64::encoded_len(n, false).expect("a header value's length")
}

fn unbase64(part: &str, what: &'static str) -> Result<Vec<u8>, ReceiptError> {
    B64URL
        .decode(part)
        .map_err(|_| ReceiptError::Malformed(what))
}

/// Split and decode a `Carapace-Receipt` value. Checks the form only, not the signature.
pub fn decode(value: &[u8]) -> Result<Encoded, ReceiptError> {
    if value.len() > MAX_ENCODED_BYTES {
        return Err(ReceiptError::Malformed("longer than 8 KiB"));
    }
    let text = std::str::from_utf8(value).map_err(|_| ReceiptError::Malformed("not UTF-8"))?;
    let parts: Vec<&str> = text.split('.').collect();
    let (payload, proof, sig) = match parts[..] {
        ["v1", payload, sig] => (payload, None, sig),
        ["v2", payload, proof, sig] => (payload, Some(proof), sig),
        _ => {
            return Err(ReceiptError::Malformed(
                "not v1.<payload>.<signature> or v2.<payload>.<proof>.<signature>",
            ))
        }
    };
    let payload = unbase64(payload, "payload is not unpadded base64url")?;
    let proof = proof
        .map(|p| Proof::parse(&unbase64(p, "proof is not unpadded base64url")?))
        .transpose()?;
    let signature = unbase64(sig, "signature is not unpadded base64url")?;
    if signature.len() != 64 {
        return Err(ReceiptError::Malformed("signature is not 64 bytes"));
    }
    let receipt: Receipt = serde_json::from_slice(&payload)
        .map_err(|_| ReceiptError::Malformed("payload is not a receipt"))?;
    if receipt.try_canonical().as_deref().map(str::as_bytes) != Some(payload.as_slice()) {
        return Err(ReceiptError::NotCanonical);
    }
    Ok(Encoded {
        receipt,
        payload,
        signature,
        proof,
    })
}

/// Decode and verify a receipt's signature with `public_key_b64` (standard base64 of the
/// 32-byte Ed25519 key, as a peer record keeps it): over the payload (`v1`), or over the root
/// its inclusion proof leads to (`v2`).
pub fn verify(value: &[u8], public_key_b64: &str) -> Result<Receipt, ReceiptError> {
    use base64::engine::general_purpose::STANDARD;
    let encoded = decode(value)?;
    let key = STANDARD
        .decode(public_key_b64)
        .ok()
        .filter(|k| k.len() == 32)
        .ok_or(ReceiptError::BadKey)?;
    let batch_message;
    let signed: &[u8] = match &encoded.proof {
        None => &encoded.payload,
        Some(proof) => {
            batch_message = proof.signed_message(&encoded.payload)?;
            &batch_message
        }
    };
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key)
        .verify(signed, &encoded.signature)
        .map_err(|_| ReceiptError::BadSignature)?;
    Ok(encoded.receipt)
}

#[cfg(test)]
mod tests;
