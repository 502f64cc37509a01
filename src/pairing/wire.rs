//! Wire-compatibility core of the crabstack pairing handshake (protocol `v1`).
//!
//! This module is the byte-exact layer between carapace and a crabstack gateway
//! (`germanoeich/crabstack`, Go). It knows the nine message shapes, how Go's
//! `encoding/json` turns each signed payload into the bytes that are signed, Ed25519
//! signing and verification, the X25519 + SHA-256 + AES-256-GCM challenge encryption,
//! certificate fingerprints and the random identifiers. It holds no handshake state:
//! the order of messages, `pairing_id` equality across steps, the challenge comparison,
//! the CSR self-signature, the certificate/fingerprint/serial checks and key pinning
//! belong to the handshake layer built on top of it.
//!
//! The reference for every rule here is `shared/vectors/crabstack/README.md` §1–§5 and
//! its vectors; the tests at the bottom check all of them.
//!
//! # Signed bytes
//!
//! A signature covers `json.Marshal` of a Go struct holding the message without
//! `sig_ed25519` ([`SignedMessage::signed_bytes`]). The bytes are built by hand in the
//! Go field order with a Go-compatible string encoder ([`append_go_json_string`]):
//! no whitespace, `<` `>` `&` as `\u003c` `\u003e` `\u0026`, U+2028/U+2029 escaped,
//! `\b \f \n \r \t` short escapes, other controls as lowercase `\u00xx`, everything
//! else raw UTF-8. A verifier re-marshals the decoded message; the received bytes are
//! never hashed as such, so key order and unknown fields on the wire do not matter.
//!
//! Timestamps: `pair.init` `gateway.issued_at` is signed as Go re-marshals the parsed
//! `time.Time` (RFC 3339 with nanoseconds, trailing zeros trimmed, offset kept, `Z` for a
//! zero offset); `pair.csr_issued` `not_before`/`not_after` are signed converted to UTC.
//! A timestamp that does not parse makes signing and verifying fail ([`WireError::BadTime`]).
//!
//! # Decoding policy
//!
//! Decoding ([`WireMessage::from_wire`]) follows Go's `json.Unmarshal` where that matters
//! for interop and fails closed elsewhere:
//!
//! * unknown fields are ignored, key order is free, a trailing newline is fine;
//! * a missing field decodes as the empty string / empty list (Go's zero value), which is
//!   then part of the re-marshalled signed bytes exactly as in Go;
//! * **refused, unlike Go:** keys in another letter case (`PAIRING_ID` is an unknown field
//!   here, so `pairing_id` stays empty and the signature fails), duplicate keys (decode
//!   error; Go keeps the last), `null` for a string field (decode error; Go keeps the zero
//!   value), a lone UTF-16 surrogate escape (decode error; Go substitutes U+FFFD);
//! * **refused, unlike Go:** timestamps that only Go's lenient fallback parser accepts
//!   (one-digit hour, `,` as fraction separator, offset hour `24`, `t`/`z` in lower case);
//!   the gateway only ever sends the canonical form;
//! * **stricter than Go:** base64 is the standard alphabet with canonical `=` padding and
//!   zero trailing bits, with no embedded newlines (Go's `StdEncoding` tolerates `\r\n` and
//!   non-zero trailing bits);
//! * fingerprints compare with ASCII case folding after trimming whitespace ([`fingerprints_match`]);
//!   Go's `EqualFold` also folds a few non-ASCII letters (`ſ`, `K`), which are refused here.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use rand::rngs::OsRng;
use rand::RngCore as _;
use ring::aead;
use ring::signature::{Ed25519KeyPair, KeyPair as _, UnparsedPublicKey, ED25519};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use x25519_dalek::{PublicKey as X25519PublicKey, SharedSecret, StaticSecret};

/// The only protocol version (`version` field of every message).
pub const PROTOCOL_VERSION: &str = "v1";
/// `type` of the gateway's signed initiation.
pub const TYPE_INIT: &str = "pair.init";
/// `type` of the remote's signed identity.
pub const TYPE_IDENTITY: &str = "pair.identity";
/// `type` of the gateway's encrypted challenge.
pub const TYPE_CHALLENGE: &str = "pair.challenge";
/// `type` of the remote's signed challenge answer.
pub const TYPE_CHALLENGE_RESPONSE: &str = "pair.challenge_response";
/// `type` of the remote's signed CSR.
pub const TYPE_CSR_REQUEST: &str = "pair.csr_request";
/// `type` of the gateway's signed certificate issuance.
pub const TYPE_CSR_ISSUED: &str = "pair.csr_issued";
/// `type` of the remote's signed installation confirmation.
pub const TYPE_CSR_INSTALLED: &str = "pair.csr_installed";
/// `type` of the gateway's final message.
pub const TYPE_COMPLETE: &str = "pair.complete";
/// `type` of the error message (sent by the remote only; the gateway just closes).
pub const TYPE_ERROR: &str = "pair.error";
/// `status` of `pair.complete`.
pub const STATUS_OK: &str = "ok";
/// `code` the crabstack sdk remote puts into its `pair.error`.
pub const ERROR_CODE_HANDSHAKE_FAILED: &str = "HANDSHAKE_FAILED";
/// Read limit both Go sides apply to one WebSocket message.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

const GCM_NONCE_LEN: usize = 12;
const GCM_TAG_LEN: usize = 16;

/// Everything that can go wrong at the wire level. Each variant names what failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The text is not valid JSON for the message shape (also: duplicate keys, `null`
    /// for a string, trailing content).
    #[error("invalid pairing message json: {0}")]
    Json(#[from] serde_json::Error),
    /// The message has no (or an empty / null) `type`.
    #[error("pairing message has no type")]
    MissingType,
    /// `type` is not one of the nine pairing message types.
    #[error("unknown pairing message type {0:?}")]
    UnknownType(String),
    /// `type` is not the one this message shape requires (compared exactly).
    #[error("unexpected pairing message type {found:?} (expected {expected:?})")]
    WrongType {
        /// The required type.
        expected: &'static str,
        /// The type on the wire.
        found: String,
    },
    /// `version` is not `v1`.
    #[error("unsupported pairing version {0:?}")]
    WrongVersion(String),
    /// A base64 field is not canonical standard base64 with padding.
    #[error("{field}: invalid base64")]
    BadBase64 {
        /// The field that failed.
        field: &'static str,
    },
    /// A public key (Ed25519 or X25519) does not decode to 32 bytes.
    #[error("{field}: expected a {expected}-byte key, got {actual} bytes")]
    BadKeyLength {
        /// The field that failed.
        field: &'static str,
        /// Required length.
        expected: usize,
        /// Decoded length.
        actual: usize,
    },
    /// `sig_ed25519` does not decode to 64 bytes.
    #[error("sig_ed25519: expected a 64-byte signature, got {0} bytes")]
    BadSignatureLength(usize),
    /// The Ed25519 seed was rejected.
    #[error("invalid ed25519 seed")]
    BadSeed,
    /// `sig_ed25519` is empty.
    #[error("signature is required")]
    MissingSignature,
    /// The Ed25519 signature does not verify over the re-marshalled signed bytes.
    #[error("signature verification failed")]
    BadSignature,
    /// `pair.init` carries a gateway key other than the configured one.
    #[error("gateway public key mismatch")]
    GatewayKeyMismatch,
    /// A timestamp is not an RFC 3339 time Go accepts, or cannot be re-encoded.
    #[error("{field}: invalid RFC 3339 time {value:?}")]
    BadTime {
        /// The field that failed.
        field: &'static str,
        /// The value on the wire.
        value: String,
    },
    /// The challenge AAD is not the JSON object `{pairing_id, challenge_id, ephemeral_public_key_x25519}`.
    #[error("parse challenge aad: {0}")]
    BadAad(String),
    /// The AAD's `pairing_id`/`challenge_id` differ from the message's.
    #[error("challenge aad mismatch")]
    AadMismatch,
    /// The challenge ciphertext is shorter than nonce + tag.
    #[error("ciphertext too short")]
    CiphertextTooShort,
    /// The X25519 agreement gave the all-zero secret (low-order public key); Go refuses it too.
    #[error("x25519 key agreement with a low-order public key")]
    LowOrderKey,
    /// AES-256-GCM authentication failed (wrong key, AAD, nonce, tag or ciphertext).
    #[error("decrypt challenge: message authentication failed")]
    DecryptionFailed,
    /// AES-256-GCM sealing failed (cannot happen for challenge-sized input).
    #[error("encrypt challenge failed")]
    EncryptionFailed,
}

// ---------------------------------------------------------------------------------------
// Go encoding/json string encoder
// ---------------------------------------------------------------------------------------

/// Appends `src` as a JSON string exactly as Go's `encoding/json` `json.Marshal` writes it
/// (HTML escaping on, Go ≥ 1.22 short escapes).
///
/// `src` may be arbitrary bytes: like the classic (pre json/v2) Go encoder every byte that
/// is not part of valid UTF-8 becomes the six characters `\ufffd`. Strings coming from
/// Rust (`&str`) never take that path.
pub fn append_go_json_string(dst: &mut Vec<u8>, src: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    dst.push(b'"');
    for chunk in src.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => dst.extend_from_slice(b"\\\""),
                '\\' => dst.extend_from_slice(b"\\\\"),
                '\u{8}' => dst.extend_from_slice(b"\\b"),
                '\u{c}' => dst.extend_from_slice(b"\\f"),
                '\n' => dst.extend_from_slice(b"\\n"),
                '\r' => dst.extend_from_slice(b"\\r"),
                '\t' => dst.extend_from_slice(b"\\t"),
                '\u{0}'..='\u{1f}' | '<' | '>' | '&' => {
                    let b = c as u8;
                    dst.extend_from_slice(b"\\u00");
                    dst.push(HEX[usize::from(b >> 4)]);
                    dst.push(HEX[usize::from(b & 0xf)]);
                }
                '\u{2028}' => dst.extend_from_slice(b"\\u2028"),
                '\u{2029}' => dst.extend_from_slice(b"\\u2029"),
                _ => {
                    let mut buf = [0u8; 4];
                    dst.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        // Go's decoder reports each byte of an invalid sequence as its own RuneError.
        for _ in chunk.invalid() {
            dst.extend_from_slice(b"\\ufffd");
        }
    }
    dst.push(b'"');
}

/// `s` as a Go `json.Marshal` string literal (with the quotes).
pub fn go_json_string(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len() + 2);
    append_go_json_string(&mut out, s.as_bytes());
    String::from_utf8(out).expect("Go JSON encoding of a str is UTF-8")
}

/// Writes one JSON object in field order, Go style (no whitespace).
struct JsonObject<'a> {
    out: &'a mut Vec<u8>,
    empty: bool,
}

impl<'a> JsonObject<'a> {
    fn open(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, empty: true }
    }

    fn key(&mut self, key: &str) {
        if !self.empty {
            self.out.push(b',');
        }
        self.empty = false;
        append_go_json_string(self.out, key.as_bytes());
        self.out.push(b':');
    }

    fn string(&mut self, key: &str, value: &str) {
        self.key(key);
        append_go_json_string(self.out, value.as_bytes());
    }

    fn string_array(&mut self, key: &str, values: &[String]) {
        self.key(key);
        self.out.push(b'[');
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            append_go_json_string(self.out, v.as_bytes());
        }
        self.out.push(b']');
    }

    fn object(&mut self, key: &str, body: impl FnOnce(&mut JsonObject<'_>)) {
        self.key(key);
        let mut inner = JsonObject::open(self.out);
        body(&mut inner);
        inner.close();
    }

    fn close(self) {
        self.out.push(b'}');
    }
}

// ---------------------------------------------------------------------------------------
// RFC 3339 time, Go style
// ---------------------------------------------------------------------------------------

/// A timestamp parsed the way Go's `time.Time.UnmarshalJSON` parses RFC 3339 (its strict
/// fast path), kept with its civil fields and UTC offset so it re-formats like Go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoTime {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    nanosecond: u32,
    offset_seconds: i32,
}

impl GoTime {
    /// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`: fields range-checked (day against
    /// the month, no leap second), fraction of any length truncated to nanoseconds like Go.
    /// Returns `None` for anything else.
    pub fn parse_rfc3339(s: &str) -> Option<Self> {
        fn num(b: &[u8]) -> Option<u32> {
            b.iter().try_fold(0u32, |acc, &c| {
                c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
            })
        }
        let b = s.as_bytes();
        if b.len() < 19
            || b[4] != b'-'
            || b[7] != b'-'
            || b[10] != b'T'
            || b[13] != b':'
            || b[16] != b':'
        {
            return None;
        }
        let year = i64::from(num(&b[0..4])?);
        let month = num(&b[5..7]).filter(|m| (1..=12).contains(m))?;
        let day = num(&b[8..10]).filter(|d| *d >= 1 && *d <= days_in_month(year, month))?;
        let hour = num(&b[11..13]).filter(|h| *h <= 23)?;
        let minute = num(&b[14..16]).filter(|m| *m <= 59)?;
        let second = num(&b[17..19]).filter(|s| *s <= 59)?;
        let mut rest = &b[19..];
        let mut nanosecond = 0;
        if rest.len() >= 2 && rest[0] == b'.' && rest[1].is_ascii_digit() {
            let digits = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
            let kept = &rest[1..1 + digits.min(9)];
            nanosecond = num(kept)? * 10u32.pow(9 - kept.len() as u32);
            rest = &rest[1 + digits..];
        }
        let offset_seconds = match rest {
            b"Z" => 0,
            [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
                let oh = num(&[*h1, *h2]).filter(|h| *h <= 23)?;
                let om = num(&[*m1, *m2]).filter(|m| *m <= 59)?;
                let secs = (oh * 3600 + om * 60) as i32;
                if *sign == b'-' {
                    -secs
                } else {
                    secs
                }
            }
            _ => return None,
        };
        Some(Self {
            year,
            month,
            day,
            hour,
            minute,
            second,
            nanosecond,
            offset_seconds,
        })
    }

    /// The instant `secs` + `nanos` after the Unix epoch, in UTC. `nanos` must be below 10⁹.
    pub fn from_unix(secs: i64, nanos: u32) -> Option<Self> {
        if nanos >= 1_000_000_000 {
            return None;
        }
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        Some(Self {
            year,
            month,
            day,
            hour: sod / 3600,
            minute: sod / 60 % 60,
            second: sod % 60,
            nanosecond: nanos,
            offset_seconds: 0,
        })
    }

    /// `t` in UTC (times before 1970 are allowed).
    pub fn from_system_time(t: SystemTime) -> Option<Self> {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Self::from_unix(i64::try_from(d.as_secs()).ok()?, d.subsec_nanos()),
            Err(e) => {
                let back = e.duration();
                let mut secs = -i64::try_from(back.as_secs()).ok()?;
                let mut nanos = back.subsec_nanos();
                if nanos > 0 {
                    secs -= 1;
                    nanos = 1_000_000_000 - nanos;
                }
                Self::from_unix(secs, nanos)
            }
        }
    }

    /// Seconds and nanoseconds since the Unix epoch of this instant.
    pub fn unix_timestamp(&self) -> (i64, u32) {
        let days = days_from_civil(self.year, self.month, self.day);
        let secs = days * 86_400
            + i64::from(self.hour) * 3600
            + i64::from(self.minute) * 60
            + i64::from(self.second)
            - i64::from(self.offset_seconds);
        (secs, self.nanosecond)
    }

    /// This instant as a [`SystemTime`] (`None` if the platform cannot represent it).
    pub fn to_system_time(&self) -> Option<SystemTime> {
        let (secs, nanos) = self.unix_timestamp();
        if secs >= 0 {
            UNIX_EPOCH.checked_add(Duration::new(secs.unsigned_abs(), nanos))
        } else {
            UNIX_EPOCH
                .checked_sub(Duration::from_secs(secs.unsigned_abs()))?
                .checked_add(Duration::from_nanos(u64::from(nanos)))
        }
    }

    /// The same instant with offset zero (Go `t.UTC()`).
    pub fn to_utc(&self) -> Self {
        let (secs, nanos) = self.unix_timestamp();
        Self::from_unix(secs, nanos).expect("nanoseconds are below one second")
    }

    /// The UTC offset in seconds east of UTC.
    pub fn offset_seconds(&self) -> i32 {
        self.offset_seconds
    }

    /// Go `t.Format(time.RFC3339Nano)` as `json.Marshal` writes it: fraction trimmed of
    /// trailing zeros and omitted when zero, `Z` for a zero offset else `±HH:MM`.
    /// `None` when the year is outside `0..=9999` (Go's `MarshalJSON` refuses those).
    pub fn to_rfc3339_nano(&self) -> Option<String> {
        if !(0..=9999).contains(&self.year) {
            return None;
        }
        let mut s = format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        );
        if self.nanosecond != 0 {
            let frac = format!("{:09}", self.nanosecond);
            s.push('.');
            s.push_str(frac.trim_end_matches('0'));
        }
        if self.offset_seconds == 0 {
            s.push('Z');
        } else {
            let sign = if self.offset_seconds < 0 { '-' } else { '+' };
            let minutes = self.offset_seconds.unsigned_abs() / 60;
            if minutes / 60 >= 24 {
                return None;
            }
            s.push_str(&format!("{sign}{:02}:{:02}", minutes / 60, minutes % 60));
        }
        Some(s)
    }
}

impl fmt::Display for GoTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_rfc3339_nano() {
            Some(s) => f.write_str(&s),
            None => write!(f, "<time out of range>"),
        }
    }
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        _ => 28,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The string Go signs for a `time.Time` field: the parsed time re-formatted, offset kept.
fn signed_time(field: &'static str, value: &str) -> Result<String, WireError> {
    GoTime::parse_rfc3339(value)
        .and_then(|t| t.to_rfc3339_nano())
        .ok_or_else(|| WireError::BadTime {
            field,
            value: value.to_owned(),
        })
}

/// The string Go signs for `t.UTC().Format(RFC3339Nano)`.
fn signed_time_utc(field: &'static str, value: &str) -> Result<String, WireError> {
    GoTime::parse_rfc3339(value)
        .and_then(|t| t.to_utc().to_rfc3339_nano())
        .ok_or_else(|| WireError::BadTime {
            field,
            value: value.to_owned(),
        })
}

// ---------------------------------------------------------------------------------------
// Base64 / keys / Ed25519
// ---------------------------------------------------------------------------------------

fn decode_b64(field: &'static str, value: &str) -> Result<Vec<u8>, WireError> {
    BASE64
        .decode(value)
        .map_err(|_| WireError::BadBase64 { field })
}

fn decode_key32(field: &'static str, value: &str) -> Result<[u8; 32], WireError> {
    let bytes = decode_b64(field, value)?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| WireError::BadKeyLength {
        field,
        expected: 32,
        actual: bytes.len(),
    })
}

/// An Ed25519 signing key (the gateway's or the remote's long-term identity).
pub struct SigningIdentity {
    key: Ed25519KeyPair,
}

impl SigningIdentity {
    /// The key for a 32-byte seed (Go `ed25519.NewKeyFromSeed`; the seed is the first half
    /// of Go's 64-byte private key).
    pub fn from_seed(seed: &[u8; 32]) -> Result<Self, WireError> {
        Ed25519KeyPair::from_seed_unchecked(seed)
            .map(|key| Self { key })
            .map_err(|_| WireError::BadSeed)
    }

    /// A fresh random key and its seed (keep the seed to load the key again).
    pub fn generate() -> (Self, [u8; 32]) {
        let mut seed = [0u8; 32];
        OsRng.fill_bytes(&mut seed);
        let identity = Self::from_seed(&seed).expect("every 32-byte seed is a valid ed25519 seed");
        (identity, seed)
    }

    /// The raw 32-byte public key.
    pub fn public_key_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.key.public_key().as_ref());
        out
    }

    /// The public key as standard base64 (the wire form of `public_key_ed25519`).
    pub fn public_key_b64(&self) -> String {
        BASE64.encode(self.key.public_key().as_ref())
    }

    /// Signs `msg`; standard base64 of the 64-byte signature (the wire form of `sig_ed25519`).
    pub fn sign(&self, msg: &[u8]) -> String {
        BASE64.encode(self.key.sign(msg).as_ref())
    }
}

impl fmt::Debug for SigningIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningIdentity")
            .field("public_key_ed25519", &self.public_key_b64())
            .finish_non_exhaustive()
    }
}

/// Verifies an Ed25519 signature: `public_key_b64` must be base64 of 32 bytes, `sig_b64`
/// non-empty base64 of 64 bytes (strict base64, see the module docs).
pub fn verify(public_key_b64: &str, msg: &[u8], sig_b64: &str) -> Result<(), WireError> {
    let key = decode_key32("public_key_ed25519", public_key_b64)?;
    if sig_b64.is_empty() {
        return Err(WireError::MissingSignature);
    }
    let sig = decode_b64("sig_ed25519", sig_b64)?;
    if sig.len() != 64 {
        return Err(WireError::BadSignatureLength(sig.len()));
    }
    UnparsedPublicKey::new(&ED25519, key)
        .verify(msg, &sig)
        .map_err(|_| WireError::BadSignature)
}

// ---------------------------------------------------------------------------------------
// Message types
// ---------------------------------------------------------------------------------------

/// `gateway` object of `pair.init`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairGatewayInfo {
    /// Gateway id (`gateway_id` from its identity file).
    pub gateway_id: String,
    /// Base64 Ed25519 public key of the gateway.
    pub public_key_ed25519: String,
    /// Base64 of 24 random bytes.
    pub nonce: String,
    /// RFC 3339 time (signed re-formatted Go style, see [`GoTime`]).
    pub issued_at: String,
}

/// `pair.init` (gateway → remote), signed by the gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairInit {
    /// `pair.init`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// 32 lowercase hex chars.
    pub pairing_id: String,
    /// The gateway's identity.
    pub gateway: PairGatewayInfo,
    /// Base64 Ed25519 signature over [`SignedMessage::signed_bytes`].
    pub sig_ed25519: String,
}

/// `remote` object of `pair.identity`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairRemoteInfo {
    /// `tool_host`, `subscriber`, `operator`, ….
    pub component_type: String,
    /// The requested component id.
    pub component_id: String,
    /// Base64 Ed25519 public key of the remote (the message is verified with it).
    pub public_key_ed25519: String,
    /// Base64 X25519 public key the challenge is encrypted to.
    pub public_key_x25519: String,
    /// `sha256:<hex>` of the TLS certificate of the pairing endpoint, or empty (signed
    /// even when empty).
    pub mtls_cert_fingerprint: String,
}

/// `pair.identity` (remote → gateway), signed by the remote with the key it carries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairIdentity {
    /// `pair.identity`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id from `pair.init`.
    pub pairing_id: String,
    /// The remote's identity.
    pub remote: PairRemoteInfo,
    /// Base64 Ed25519 signature.
    pub sig_ed25519: String,
}

/// `pair.challenge` (gateway → remote), not signed; authenticated by AES-GCM.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairChallenge {
    /// `pair.challenge`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id.
    pub pairing_id: String,
    /// 32 lowercase hex chars.
    pub challenge_id: String,
    /// Base64 of `nonce(12) || AES-256-GCM ciphertext || tag(16)`.
    pub ciphertext: String,
    /// Base64 of the AAD JSON bytes; omitted on the wire when empty.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub aad: String,
}

/// `pair.challenge_response` (remote → gateway), signed by the remote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairChallengeResponse {
    /// `pair.challenge_response`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id.
    pub pairing_id: String,
    /// The challenge id being answered.
    pub challenge_id: String,
    /// The decrypted challenge, verbatim (an ASCII base64 string).
    pub challenge_plaintext: String,
    /// Base64 Ed25519 signature.
    pub sig_ed25519: String,
}

/// `pair.csr_request` (remote → gateway), signed by the remote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairCsrRequest {
    /// `pair.csr_request`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id.
    pub pairing_id: String,
    /// PEM `CERTIFICATE REQUEST` (Go `pem.EncodeToMemory` layout).
    pub csr_pem: String,
    /// Base64 Ed25519 signature.
    pub sig_ed25519: String,
}

/// `pair.csr_issued` (gateway → remote), signed by the gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairCsrIssued {
    /// `pair.csr_issued`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id.
    pub pairing_id: String,
    /// PEM of the issued certificate.
    pub certificate_pem: String,
    /// PEMs of the chain (the pairing CA); omitted on the wire and in the signed bytes
    /// when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub certificate_chain_pem: Vec<String>,
    /// Lowercase hex serial, no leading zeros.
    pub serial_number: String,
    /// `sha256:<hex>` of the issued certificate's DER.
    pub mtls_cert_fingerprint: String,
    /// RFC 3339 (signed converted to UTC).
    pub not_before: String,
    /// RFC 3339 (signed converted to UTC).
    pub not_after: String,
    /// Base64 Ed25519 signature.
    pub sig_ed25519: String,
}

/// `pair.csr_installed` (remote → gateway), signed by the remote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairCsrInstalled {
    /// `pair.csr_installed`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id.
    pub pairing_id: String,
    /// Fingerprint of the installed certificate, exactly the string that is signed.
    pub mtls_cert_fingerprint: String,
    /// Base64 Ed25519 signature.
    pub sig_ed25519: String,
}

/// `pair.complete` (gateway → remote), not signed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairComplete {
    /// `pair.complete`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id.
    pub pairing_id: String,
    /// `ok`.
    pub status: String,
}

/// `pair.error`, not signed. The crabstack sdk remote sends it with an empty
/// `pairing_id` and code `HANDSHAKE_FAILED`; the gateway never sends it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairError {
    /// `pair.error`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id (empty from the sdk).
    pub pairing_id: String,
    /// Error code.
    pub code: String,
    /// Human-readable message.
    pub message: String,
}

/// Decodes a JSON object into `T`. serde's derived structs also accept a JSON array
/// (fields by position), which Go refuses; so the top level and the `nested` keys are
/// first checked to be objects, then `T` is decoded from the same bytes (which keeps
/// serde's duplicate-key refusal).
fn decode_object<T: DeserializeOwned>(
    bytes: &[u8],
    nested: &[&str],
) -> Result<T, serde_json::Error> {
    use serde::de::Error as _;
    let value: serde_json::Value = serde_json::from_slice(bytes)?;
    let object = value
        .as_object()
        .ok_or_else(|| serde_json::Error::custom("expected a JSON object"))?;
    for key in nested {
        if let Some(v) = object.get(*key) {
            if !v.is_object() {
                return Err(serde_json::Error::custom(format!(
                    "{key}: expected a JSON object"
                )));
            }
        }
    }
    serde_json::from_slice(bytes)
}

/// Common behaviour of the nine message shapes.
pub trait WireMessage: Sized + DeserializeOwned {
    /// The `type` this shape requires.
    const TYPE: &'static str;
    /// Keys whose values are nested Go structs (must be JSON objects when present).
    const NESTED_OBJECTS: &'static [&'static str] = &[];

    /// `type` as received / set.
    fn msg_type(&self) -> &str;
    /// `version` as received / set.
    fn version(&self) -> &str;
    /// `pairing_id` as received / set.
    fn pairing_id(&self) -> &str;

    /// The message exactly as Go's `conn.WriteJSON` puts it in the text frame: Go
    /// `json.Marshal` of the wire struct plus `\n`. Fails only for a time field that
    /// does not parse.
    fn to_wire(&self) -> Result<String, WireError>;

    /// Decodes one message (see the module docs for the decoding policy). Does not check
    /// `type`/`version`; use [`WireMessage::check_header`] or [`SignedMessage::verify_with`].
    fn from_wire(text: &str) -> Result<Self, WireError> {
        Ok(decode_object(text.as_bytes(), Self::NESTED_OBJECTS)?)
    }

    /// `type` must equal [`WireMessage::TYPE`] exactly and `version` must be `v1`.
    fn check_header(&self) -> Result<(), WireError> {
        if self.msg_type() != Self::TYPE {
            return Err(WireError::WrongType {
                expected: Self::TYPE,
                found: self.msg_type().to_owned(),
            });
        }
        if self.version() != PROTOCOL_VERSION {
            return Err(WireError::WrongVersion(self.version().to_owned()));
        }
        Ok(())
    }
}

/// The six signed message shapes.
pub trait SignedMessage: WireMessage {
    /// Go `json.Marshal` of the signed payload struct (README §2.1), byte for byte.
    /// Fails only for a time field that does not parse.
    fn signed_bytes(&self) -> Result<Vec<u8>, WireError>;
    /// `sig_ed25519`.
    fn signature(&self) -> &str;
    /// Replaces `sig_ed25519`.
    fn set_signature(&mut self, sig_b64: String);

    /// Checks the header and sets `sig_ed25519` to the signature over the signed bytes.
    fn sign_with(&mut self, identity: &SigningIdentity) -> Result<(), WireError> {
        self.check_header()?;
        let bytes = self.signed_bytes()?;
        self.set_signature(identity.sign(&bytes));
        Ok(())
    }

    /// Checks `type`/`version`, then verifies `sig_ed25519` with `public_key_b64` over the
    /// re-marshalled signed bytes (never over the received text).
    fn verify_with(&self, public_key_b64: &str) -> Result<(), WireError> {
        self.check_header()?;
        if self.signature().is_empty() {
            return Err(WireError::MissingSignature);
        }
        let bytes = self.signed_bytes()?;
        verify(public_key_b64, &bytes, self.signature())
    }
}

macro_rules! wire_message {
    ($ty:ty, $name:expr) => {
        wire_message!($ty, $name, []);
    };
    ($ty:ty, $name:expr, [$($nested:expr),*]) => {
        impl WireMessage for $ty {
            const TYPE: &'static str = $name;
            const NESTED_OBJECTS: &'static [&'static str] = &[$($nested),*];

            fn msg_type(&self) -> &str {
                &self.msg_type
            }

            fn version(&self) -> &str {
                &self.version
            }

            fn pairing_id(&self) -> &str {
                &self.pairing_id
            }

            fn to_wire(&self) -> Result<String, WireError> {
                let mut bytes = self.encode(false)?;
                bytes.push(b'\n');
                Ok(String::from_utf8(bytes).expect("Go JSON encoding of str fields is UTF-8"))
            }
        }
    };
}

macro_rules! signed_message {
    ($ty:ty) => {
        impl SignedMessage for $ty {
            fn signed_bytes(&self) -> Result<Vec<u8>, WireError> {
                self.encode(true)
            }

            fn signature(&self) -> &str {
                &self.sig_ed25519
            }

            fn set_signature(&mut self, sig_b64: String) {
                self.sig_ed25519 = sig_b64;
            }
        }
    };
}

wire_message!(PairInit, TYPE_INIT, ["gateway"]);
wire_message!(PairIdentity, TYPE_IDENTITY, ["remote"]);
wire_message!(PairChallenge, TYPE_CHALLENGE);
wire_message!(PairChallengeResponse, TYPE_CHALLENGE_RESPONSE);
wire_message!(PairCsrRequest, TYPE_CSR_REQUEST);
wire_message!(PairCsrIssued, TYPE_CSR_ISSUED);
wire_message!(PairCsrInstalled, TYPE_CSR_INSTALLED);
wire_message!(PairComplete, TYPE_COMPLETE);
wire_message!(PairError, TYPE_ERROR);
signed_message!(PairInit);
signed_message!(PairIdentity);
signed_message!(PairChallengeResponse);
signed_message!(PairCsrRequest);
signed_message!(PairCsrIssued);
signed_message!(PairCsrInstalled);

// Each `encode(signed)` writes the Go struct in declaration order: with `signed` the
// signed payload (no `sig_ed25519`), otherwise the wire struct (`sig_ed25519` last).

impl PairInit {
    /// A `pair.init` with type and version set and no signature.
    pub fn new(pairing_id: impl Into<String>, gateway: PairGatewayInfo) -> Self {
        Self {
            msg_type: TYPE_INIT.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            gateway,
            sig_ed25519: String::new(),
        }
    }

    /// What a remote does with `pair.init`: the carried gateway key must be the
    /// configured one, and the signature must verify with the configured key.
    pub fn verify_from_gateway(&self, configured_gateway_key_b64: &str) -> Result<(), WireError> {
        self.check_header()?;
        let configured = decode_key32(
            "configured gateway public_key_ed25519",
            configured_gateway_key_b64,
        )?;
        let carried = decode_key32(
            "gateway.public_key_ed25519",
            &self.gateway.public_key_ed25519,
        )
        .map_err(|_| WireError::GatewayKeyMismatch)?;
        if carried != configured {
            return Err(WireError::GatewayKeyMismatch);
        }
        self.verify_with(configured_gateway_key_b64)
    }

    fn encode(&self, signed: bool) -> Result<Vec<u8>, WireError> {
        // time.Time marshals the same in the wire and the signed struct.
        let issued_at = signed_time("gateway.issued_at", &self.gateway.issued_at)?;
        let mut out = Vec::with_capacity(320);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.object("gateway", |g| {
            g.string("gateway_id", &self.gateway.gateway_id);
            g.string("public_key_ed25519", &self.gateway.public_key_ed25519);
            g.string("nonce", &self.gateway.nonce);
            g.string("issued_at", &issued_at);
        });
        if !signed {
            o.string("sig_ed25519", &self.sig_ed25519);
        }
        o.close();
        Ok(out)
    }
}

impl PairIdentity {
    /// A `pair.identity` with type and version set and no signature.
    pub fn new(pairing_id: impl Into<String>, remote: PairRemoteInfo) -> Self {
        Self {
            msg_type: TYPE_IDENTITY.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            remote,
            sig_ed25519: String::new(),
        }
    }

    /// What the gateway does: verify with the key carried in `remote.public_key_ed25519`.
    /// The message is self-certifying; whether that key is acceptable is policy.
    pub fn verify_self_signed(&self) -> Result<(), WireError> {
        self.verify_with(&self.remote.public_key_ed25519)
    }

    fn encode(&self, signed: bool) -> Result<Vec<u8>, WireError> {
        let r = &self.remote;
        let mut out = Vec::with_capacity(400);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.object("remote", |g| {
            g.string("component_type", &r.component_type);
            g.string("component_id", &r.component_id);
            g.string("public_key_ed25519", &r.public_key_ed25519);
            g.string("public_key_x25519", &r.public_key_x25519);
            g.string("mtls_cert_fingerprint", &r.mtls_cert_fingerprint);
        });
        if !signed {
            o.string("sig_ed25519", &self.sig_ed25519);
        }
        o.close();
        Ok(out)
    }
}

impl PairChallenge {
    /// A `pair.challenge` with type and version set.
    pub fn new(
        pairing_id: impl Into<String>,
        challenge_id: impl Into<String>,
        ciphertext: impl Into<String>,
        aad: impl Into<String>,
    ) -> Self {
        Self {
            msg_type: TYPE_CHALLENGE.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            challenge_id: challenge_id.into(),
            ciphertext: ciphertext.into(),
            aad: aad.into(),
        }
    }

    fn encode(&self, _signed: bool) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(512);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("challenge_id", &self.challenge_id);
        o.string("ciphertext", &self.ciphertext);
        if !self.aad.is_empty() {
            o.string("aad", &self.aad);
        }
        o.close();
        Ok(out)
    }
}

impl PairChallengeResponse {
    /// A `pair.challenge_response` with type and version set and no signature.
    pub fn new(
        pairing_id: impl Into<String>,
        challenge_id: impl Into<String>,
        challenge_plaintext: impl Into<String>,
    ) -> Self {
        Self {
            msg_type: TYPE_CHALLENGE_RESPONSE.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            challenge_id: challenge_id.into(),
            challenge_plaintext: challenge_plaintext.into(),
            sig_ed25519: String::new(),
        }
    }

    fn encode(&self, signed: bool) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(320);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("challenge_id", &self.challenge_id);
        o.string("challenge_plaintext", &self.challenge_plaintext);
        if !signed {
            o.string("sig_ed25519", &self.sig_ed25519);
        }
        o.close();
        Ok(out)
    }
}

impl PairCsrRequest {
    /// A `pair.csr_request` with type and version set and no signature.
    pub fn new(pairing_id: impl Into<String>, csr_pem: impl Into<String>) -> Self {
        Self {
            msg_type: TYPE_CSR_REQUEST.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            csr_pem: csr_pem.into(),
            sig_ed25519: String::new(),
        }
    }

    fn encode(&self, signed: bool) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(self.csr_pem.len() + 256);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("csr_pem", &self.csr_pem);
        if !signed {
            o.string("sig_ed25519", &self.sig_ed25519);
        }
        o.close();
        Ok(out)
    }
}

impl PairCsrIssued {
    /// A `pair.csr_issued` with type and version set and no signature.
    pub fn new(
        pairing_id: impl Into<String>,
        certificate_pem: impl Into<String>,
        certificate_chain_pem: Vec<String>,
        serial_number: impl Into<String>,
        mtls_cert_fingerprint: impl Into<String>,
        not_before: impl Into<String>,
        not_after: impl Into<String>,
    ) -> Self {
        Self {
            msg_type: TYPE_CSR_ISSUED.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            certificate_pem: certificate_pem.into(),
            certificate_chain_pem,
            serial_number: serial_number.into(),
            mtls_cert_fingerprint: mtls_cert_fingerprint.into(),
            not_before: not_before.into(),
            not_after: not_after.into(),
            sig_ed25519: String::new(),
        }
    }

    fn encode(&self, signed: bool) -> Result<Vec<u8>, WireError> {
        // Signed: t.UTC().Format(RFC3339Nano) strings. Wire: time.Time (offset kept).
        let (not_before, not_after) = if signed {
            (
                signed_time_utc("not_before", &self.not_before)?,
                signed_time_utc("not_after", &self.not_after)?,
            )
        } else {
            (
                signed_time("not_before", &self.not_before)?,
                signed_time("not_after", &self.not_after)?,
            )
        };
        let chain_len: usize = self.certificate_chain_pem.iter().map(String::len).sum();
        let mut out = Vec::with_capacity(self.certificate_pem.len() + chain_len + 512);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("certificate_pem", &self.certificate_pem);
        if !self.certificate_chain_pem.is_empty() {
            o.string_array("certificate_chain_pem", &self.certificate_chain_pem);
        }
        o.string("serial_number", &self.serial_number);
        o.string("mtls_cert_fingerprint", &self.mtls_cert_fingerprint);
        o.string("not_before", &not_before);
        o.string("not_after", &not_after);
        if !signed {
            o.string("sig_ed25519", &self.sig_ed25519);
        }
        o.close();
        Ok(out)
    }
}

impl PairCsrInstalled {
    /// A `pair.csr_installed` with type and version set and no signature.
    pub fn new(pairing_id: impl Into<String>, mtls_cert_fingerprint: impl Into<String>) -> Self {
        Self {
            msg_type: TYPE_CSR_INSTALLED.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            mtls_cert_fingerprint: mtls_cert_fingerprint.into(),
            sig_ed25519: String::new(),
        }
    }

    fn encode(&self, signed: bool) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(256);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("mtls_cert_fingerprint", &self.mtls_cert_fingerprint);
        if !signed {
            o.string("sig_ed25519", &self.sig_ed25519);
        }
        o.close();
        Ok(out)
    }
}

impl PairComplete {
    /// `{"type":"pair.complete","version":"v1","pairing_id":…,"status":"ok"}`.
    pub fn ok(pairing_id: impl Into<String>) -> Self {
        Self {
            msg_type: TYPE_COMPLETE.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            status: STATUS_OK.to_owned(),
        }
    }

    fn encode(&self, _signed: bool) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(128);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("status", &self.status);
        o.close();
        Ok(out)
    }
}

impl PairError {
    /// A `pair.error` with type and version set.
    pub fn new(
        pairing_id: impl Into<String>,
        code: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            msg_type: TYPE_ERROR.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            code: code.into(),
            message: message.into(),
        }
    }

    /// The error the crabstack sdk remote sends: empty `pairing_id`, code `HANDSHAKE_FAILED`.
    pub fn handshake_failed(message: impl Into<String>) -> Self {
        Self::new("", ERROR_CODE_HANDSHAKE_FAILED, message)
    }

    fn encode(&self, _signed: bool) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(128 + self.message.len());
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("code", &self.code);
        o.string("message", &self.message);
        o.close();
        Ok(out)
    }
}

/// Any pairing message, decoded by its `type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PairMessage {
    /// `pair.init`.
    Init(PairInit),
    /// `pair.identity`.
    Identity(PairIdentity),
    /// `pair.challenge`.
    Challenge(PairChallenge),
    /// `pair.challenge_response`.
    ChallengeResponse(PairChallengeResponse),
    /// `pair.csr_request`.
    CsrRequest(PairCsrRequest),
    /// `pair.csr_issued`.
    CsrIssued(PairCsrIssued),
    /// `pair.csr_installed`.
    CsrInstalled(PairCsrInstalled),
    /// `pair.complete`.
    Complete(PairComplete),
    /// `pair.error`.
    Error(PairError),
}

/// The `type` of a message without decoding the rest (the text must still be one JSON
/// object). Missing, empty or `null` type → [`WireError::MissingType`].
pub fn message_type(text: &str) -> Result<String, WireError> {
    #[derive(Deserialize)]
    struct Peek {
        #[serde(rename = "type", default)]
        msg_type: Option<String>,
    }
    let peek: Peek = decode_object(text.as_bytes(), &[])?;
    match peek.msg_type {
        Some(t) if !t.is_empty() => Ok(t),
        _ => Err(WireError::MissingType),
    }
}

/// Decodes a message of any of the nine types (dispatching on the exact `type`).
pub fn decode_message(text: &str) -> Result<PairMessage, WireError> {
    let t = message_type(text)?;
    Ok(match t.as_str() {
        TYPE_INIT => PairMessage::Init(PairInit::from_wire(text)?),
        TYPE_IDENTITY => PairMessage::Identity(PairIdentity::from_wire(text)?),
        TYPE_CHALLENGE => PairMessage::Challenge(PairChallenge::from_wire(text)?),
        TYPE_CHALLENGE_RESPONSE => {
            PairMessage::ChallengeResponse(PairChallengeResponse::from_wire(text)?)
        }
        TYPE_CSR_REQUEST => PairMessage::CsrRequest(PairCsrRequest::from_wire(text)?),
        TYPE_CSR_ISSUED => PairMessage::CsrIssued(PairCsrIssued::from_wire(text)?),
        TYPE_CSR_INSTALLED => PairMessage::CsrInstalled(PairCsrInstalled::from_wire(text)?),
        TYPE_COMPLETE => PairMessage::Complete(PairComplete::from_wire(text)?),
        TYPE_ERROR => PairMessage::Error(PairError::from_wire(text)?),
        _ => return Err(WireError::UnknownType(t)),
    })
}

// ---------------------------------------------------------------------------------------
// Challenge encryption (X25519 + SHA-256 + AES-256-GCM)
// ---------------------------------------------------------------------------------------

/// The AAD JSON object (Go struct `challengeAAD`, this field order).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ChallengeAad {
    pairing_id: String,
    challenge_id: String,
    ephemeral_public_key_x25519: String,
}

fn challenge_aad_bytes(
    pairing_id: &str,
    challenge_id: &str,
    ephemeral_public_b64: &str,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    let mut o = JsonObject::open(&mut out);
    o.string("pairing_id", pairing_id);
    o.string("challenge_id", challenge_id);
    o.string("ephemeral_public_key_x25519", ephemeral_public_b64);
    o.close();
    out
}

fn x25519_agree(secret: &StaticSecret, public: [u8; 32]) -> Result<SharedSecret, WireError> {
    let shared = secret.diffie_hellman(&X25519PublicKey::from(public));
    if !shared.was_contributory() {
        return Err(WireError::LowOrderKey);
    }
    Ok(shared)
}

/// `SHA-256(shared || aad_bytes)`, the AES-256 key.
fn derive_challenge_key(shared: &SharedSecret, aad: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(shared.as_bytes());
    h.update(aad);
    h.finalize().into()
}

fn aes_key(key: &[u8; 32]) -> aead::LessSafeKey {
    let unbound = aead::UnboundKey::new(&aead::AES_256_GCM, key)
        .expect("a 32-byte key is a valid AES-256 key");
    aead::LessSafeKey::new(unbound)
}

/// Encrypts a challenge for the remote's X25519 key with a random ephemeral key and nonce.
/// Returns `(ciphertext_b64, aad_b64)`, the `ciphertext` and `aad` fields of `pair.challenge`.
pub fn seal_challenge(
    remote_x25519_public_b64: &str,
    pairing_id: &str,
    challenge_id: &str,
    plaintext: &[u8],
) -> Result<(String, String), WireError> {
    let mut ephemeral = [0u8; 32];
    OsRng.fill_bytes(&mut ephemeral);
    let mut nonce = [0u8; GCM_NONCE_LEN];
    OsRng.fill_bytes(&mut nonce);
    seal_challenge_with(
        remote_x25519_public_b64,
        pairing_id,
        challenge_id,
        plaintext,
        ephemeral,
        nonce,
    )
}

/// [`seal_challenge`] with the ephemeral X25519 secret and the GCM nonce given (for
/// deterministic tests; never reuse either). Steps (gateway `crypto.go`): `shared =
/// X25519(eph, remote)`; `aad = json.Marshal({pairing_id, challenge_id,
/// ephemeral_public_key_x25519})`; `key = SHA-256(shared || aad)`; `ciphertext =
/// base64(nonce || AES-256-GCM(key).Seal(nonce, plaintext, aad))`.
pub fn seal_challenge_with(
    remote_x25519_public_b64: &str,
    pairing_id: &str,
    challenge_id: &str,
    plaintext: &[u8],
    ephemeral_secret: [u8; 32],
    nonce: [u8; 12],
) -> Result<(String, String), WireError> {
    let remote = decode_key32("remote.public_key_x25519", remote_x25519_public_b64)?;
    let ephemeral = StaticSecret::from(ephemeral_secret);
    let ephemeral_public = X25519PublicKey::from(&ephemeral);
    let shared = x25519_agree(&ephemeral, remote)?;
    let aad = challenge_aad_bytes(
        pairing_id,
        challenge_id,
        &BASE64.encode(ephemeral_public.as_bytes()),
    );
    let key = derive_challenge_key(&shared, &aad);
    let mut sealed = Vec::with_capacity(GCM_NONCE_LEN + plaintext.len() + GCM_TAG_LEN);
    sealed.extend_from_slice(&nonce);
    sealed.extend_from_slice(plaintext);
    let mut body = sealed.split_off(GCM_NONCE_LEN);
    aes_key(&key)
        .seal_in_place_append_tag(
            aead::Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(aad.as_slice()),
            &mut body,
        )
        .map_err(|_| WireError::EncryptionFailed)?;
    sealed.extend_from_slice(&body);
    Ok((BASE64.encode(&sealed), BASE64.encode(&aad)))
}

/// Decrypts a `pair.challenge` with the remote's X25519 secret (sdk
/// `DecryptPairChallenge`): checks type/version; decodes the AAD JSON and requires its
/// `pairing_id`/`challenge_id` to equal the message's; takes the ephemeral key from the
/// AAD; derives the key from the AAD bytes exactly as received; opens AES-256-GCM.
/// Returns the plaintext (the remote echoes it as `challenge_plaintext`).
pub fn open_challenge(
    remote_secret: &StaticSecret,
    msg: &PairChallenge,
) -> Result<Vec<u8>, WireError> {
    msg.check_header()?;
    let aad = decode_b64("aad", &msg.aad)?;
    let meta: ChallengeAad =
        decode_object(&aad, &[]).map_err(|e| WireError::BadAad(e.to_string()))?;
    if meta.pairing_id != msg.pairing_id || meta.challenge_id != msg.challenge_id {
        return Err(WireError::AadMismatch);
    }
    let ephemeral = decode_key32(
        "aad.ephemeral_public_key_x25519",
        &meta.ephemeral_public_key_x25519,
    )?;
    let shared = x25519_agree(remote_secret, ephemeral)?;
    let key = derive_challenge_key(&shared, &aad);
    let mut data = decode_b64("ciphertext", &msg.ciphertext)?;
    if data.len() < GCM_NONCE_LEN + GCM_TAG_LEN {
        return Err(WireError::CiphertextTooShort);
    }
    let mut body = data.split_off(GCM_NONCE_LEN);
    let nonce =
        <[u8; GCM_NONCE_LEN]>::try_from(data.as_slice()).expect("split at the nonce length");
    let plaintext = aes_key(&key)
        .open_in_place(
            aead::Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(aad.as_slice()),
            &mut body,
        )
        .map_err(|_| WireError::DecryptionFailed)?;
    Ok(plaintext.to_vec())
}

/// A fresh random X25519 secret (tests; identities persist theirs).
#[cfg(test)]
fn new_x25519_secret() -> StaticSecret {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    StaticSecret::from(bytes)
}

/// Standard base64 of the X25519 public key of `secret` (wire form of `public_key_x25519`).
pub fn x25519_public_b64(secret: &StaticSecret) -> String {
    BASE64.encode(X25519PublicKey::from(secret).as_bytes())
}

// ---------------------------------------------------------------------------------------
// Fingerprints and identifiers
// ---------------------------------------------------------------------------------------

/// `sha256:` + lowercase hex of SHA-256 over the whole certificate DER.
pub fn fingerprint_der(der: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(der)))
}

/// Go `strings.EqualFold(strings.TrimSpace(a), strings.TrimSpace(b))`, with ASCII-only case
/// folding (fingerprints are ASCII; see the module docs).
pub fn fingerprints_match(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    OsRng.fill_bytes(&mut out);
    out
}

/// A new `pairing_id`: 16 random bytes as 32 lowercase hex chars.
pub fn new_pairing_id() -> String {
    hex::encode(random_bytes::<16>())
}

/// A new `challenge_id` (same format as a pairing id).
pub fn new_challenge_id() -> String {
    new_pairing_id()
}

/// A new `gateway.nonce`: standard base64 of 24 random bytes (32 chars).
pub fn new_nonce() -> String {
    BASE64.encode(random_bytes::<24>())
}

/// A new challenge plaintext: standard base64 of 32 random bytes (44 chars); the ASCII
/// string itself is what is encrypted and echoed back.
pub fn new_challenge_plaintext() -> String {
    BASE64.encode(random_bytes::<32>())
}

/// Negative vectors (`pairing_negative.json`) that this module does **not** refuse because
/// the check belongs to the handshake state machine; the handshake layer's tests must
/// cover each of them. Every other negative vector is refused by this module's tests.
#[cfg(test)]
pub(crate) const HANDSHAKE_CHECKED: &[&str] = &[
    // Valid gateway signature; the remote must check fingerprint(certificate_pem) ==
    // mtls_cert_fingerprint (sdk flow.go:407-413).
    "issued.cert_swapped_resigned",
    // Valid remote signature; the gateway must compare challenge_plaintext with what it
    // encrypted, in constant time (manager.go:227-229).
    "response.wrong_plaintext_resigned",
    // Valid remote signature; the CA must check the CSR's own ECDSA signature (ca.go:232-245).
    "csr.self_signature_broken_resigned",
    // Valid remote signature; the gateway must EqualFold the fingerprint against the one
    // it issued (manager.go:285-287).
    "installed.other_fingerprint_resigned",
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn vectors_path(name: &str) -> String {
        format!(
            "{}/{name}",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/vectors/crabstack")
        )
    }

    fn load(name: &str) -> Value {
        let path = vectors_path(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
        serde_json::from_str(&text).expect("vector file is JSON")
    }

    fn s<'a>(v: &'a Value, key: &str) -> &'a str {
        v[key]
            .as_str()
            .unwrap_or_else(|| panic!("missing string {key}"))
    }

    fn b64(v: &str) -> Vec<u8> {
        BASE64.decode(v).expect("vector base64")
    }

    fn seed(hex_str: &str) -> [u8; 32] {
        hex::decode(hex_str).unwrap().try_into().unwrap()
    }

    fn transcript() -> Value {
        load("pairing_transcript.json")
    }

    fn gateway_identity(t: &Value) -> SigningIdentity {
        SigningIdentity::from_seed(&seed(s(&t["keys"]["gateway_ed25519"], "seed_hex"))).unwrap()
    }

    fn remote_identity(t: &Value) -> SigningIdentity {
        SigningIdentity::from_seed(&seed(s(&t["keys"]["remote_ed25519"], "seed_hex"))).unwrap()
    }

    fn remote_x25519(t: &Value) -> StaticSecret {
        StaticSecret::from(seed(s(&t["keys"]["remote_x25519"], "private_key_hex")))
    }

    /// PEM body → DER (test helper; one block).
    fn pem_to_der(pem: &str) -> Vec<u8> {
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        b64(&body)
    }

    /// Parse, check round trip, signed bytes, verification and re-signing for one signed
    /// message type. Returns the decoded message.
    fn check_signed<M: SignedMessage>(
        wire_text: &str,
        signed_b64: &str,
        key_b64: &str,
        signer: Option<&SigningIdentity>,
    ) -> M {
        let msg = M::from_wire(wire_text).expect("decodes");
        assert_eq!(msg.to_wire().unwrap(), wire_text, "wire re-encoding");
        assert_eq!(
            String::from_utf8(msg.signed_bytes().unwrap()).unwrap(),
            String::from_utf8(b64(signed_b64)).unwrap(),
            "signed bytes of {}",
            M::TYPE
        );
        msg.verify_with(key_b64).expect("verifies");
        if let Some(id) = signer {
            // Ed25519 is deterministic: re-signing reproduces the vector's signature.
            let mut resigned = M::from_wire(wire_text).unwrap();
            resigned.set_signature(String::new());
            resigned.sign_with(id).unwrap();
            assert_eq!(
                resigned.signature(),
                msg.signature(),
                "re-signed {}",
                M::TYPE
            );
        }
        msg
    }

    #[test]
    fn transcript_messages_decode_reencode_and_verify() {
        let t = transcript();
        let gw = gateway_identity(&t);
        let rm = remote_identity(&t);
        let messages = t["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 8);
        let mut signed = 0;
        for m in messages {
            let wire = s(m, "wire_text");
            assert_eq!(b64(s(m, "wire_b64")), wire.as_bytes());
            let ty = s(m, "type");
            assert_eq!(message_type(wire).unwrap(), ty);
            let decoded = decode_message(wire).unwrap();
            if let Some(sig) = m.get("signature") {
                signed += 1;
                let key = s(sig, "public_key_ed25519");
                let signer = if s(sig, "signer") == "gateway" {
                    &gw
                } else {
                    &rm
                };
                assert_eq!(signer.public_key_b64(), key);
                let sb = s(sig, "signed_bytes_b64");
                assert_eq!(b64(sb), s(sig, "signed_bytes_text").as_bytes());
                let got_sig = match ty {
                    TYPE_INIT => check_signed::<PairInit>(wire, sb, key, Some(signer)).sig_ed25519,
                    TYPE_IDENTITY => {
                        let m = check_signed::<PairIdentity>(wire, sb, key, Some(signer));
                        m.verify_self_signed().unwrap();
                        m.sig_ed25519
                    }
                    TYPE_CHALLENGE_RESPONSE => {
                        check_signed::<PairChallengeResponse>(wire, sb, key, Some(signer))
                            .sig_ed25519
                    }
                    TYPE_CSR_REQUEST => {
                        check_signed::<PairCsrRequest>(wire, sb, key, Some(signer)).sig_ed25519
                    }
                    TYPE_CSR_ISSUED => {
                        check_signed::<PairCsrIssued>(wire, sb, key, Some(signer)).sig_ed25519
                    }
                    TYPE_CSR_INSTALLED => {
                        check_signed::<PairCsrInstalled>(wire, sb, key, Some(signer)).sig_ed25519
                    }
                    other => panic!("unexpected signed type {other}"),
                };
                assert_eq!(got_sig, s(sig, "sig_ed25519"));
                verify(key, &b64(sb), s(sig, "sig_ed25519")).unwrap();
            } else {
                match decoded {
                    PairMessage::Challenge(c) => {
                        c.check_header().unwrap();
                        assert_eq!(c.to_wire().unwrap(), wire);
                    }
                    PairMessage::Complete(c) => {
                        c.check_header().unwrap();
                        assert_eq!(c.status, STATUS_OK);
                        assert_eq!(c.to_wire().unwrap(), wire);
                        assert_eq!(PairComplete::ok(c.pairing_id.clone()), c);
                    }
                    other => panic!("unexpected unsigned message {other:?}"),
                }
            }
        }
        assert_eq!(signed, 6);
        let init = PairInit::from_wire(s(&messages[0], "wire_text")).unwrap();
        init.verify_from_gateway(&gw.public_key_b64()).unwrap();
    }

    #[test]
    fn keys_derive_from_seeds() {
        let t = transcript();
        let k = &t["keys"];
        assert_eq!(
            gateway_identity(&t).public_key_b64(),
            s(&k["gateway_ed25519"], "public_key_b64")
        );
        assert_eq!(
            remote_identity(&t).public_key_b64(),
            s(&k["remote_ed25519"], "public_key_b64")
        );
        // Go's 64-byte private key is seed || public key.
        let go_priv = b64(s(&k["gateway_ed25519"], "private_key_go_64byte_b64"));
        assert_eq!(&go_priv[32..], gateway_identity(&t).public_key_bytes());
        assert_eq!(
            x25519_public_b64(&remote_x25519(&t)),
            s(&k["remote_x25519"], "public_key_b64")
        );
        let eph = StaticSecret::from(seed(s(&k["ephemeral_x25519"], "private_key_hex")));
        assert_eq!(
            x25519_public_b64(&eph),
            s(&k["ephemeral_x25519"], "public_key_b64")
        );
    }

    #[test]
    fn challenge_opens_with_remote_secret() {
        let t = transcript();
        let c = &t["challenge_encryption"];
        let wire = t["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| s(m, "type") == TYPE_CHALLENGE)
            .map(|m| s(m, "wire_text"))
            .unwrap();
        let msg = PairChallenge::from_wire(wire).unwrap();
        assert_eq!(msg.ciphertext, s(c, "wire_ciphertext_b64"));
        assert_eq!(msg.aad, s(c, "aad_b64"));
        assert_eq!(b64(&msg.aad), s(c, "aad_text").as_bytes());
        let plaintext = open_challenge(&remote_x25519(&t), &msg).unwrap();
        assert_eq!(plaintext, s(c, "plaintext_text").as_bytes());
        // The response echoes it.
        let resp = t["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| s(m, "type") == TYPE_CHALLENGE_RESPONSE)
            .map(|m| PairChallengeResponse::from_wire(s(m, "wire_text")).unwrap())
            .unwrap();
        assert_eq!(resp.challenge_plaintext.as_bytes(), plaintext.as_slice());
        assert_eq!(resp.challenge_id, msg.challenge_id);
    }

    #[test]
    fn challenge_seal_is_reproducible_and_intermediates_match() {
        let t = transcript();
        let c = &t["challenge_encryption"];
        let aad_text = s(c, "aad_text");
        let meta: ChallengeAad = serde_json::from_str(aad_text).unwrap();
        let eph = seed(s(c, "ephemeral_private_hex"));
        let nonce: [u8; 12] = hex::decode(s(c, "nonce_hex")).unwrap().try_into().unwrap();
        let (ciphertext, aad) = seal_challenge_with(
            s(c, "remote_x25519_public_b64"),
            &meta.pairing_id,
            &meta.challenge_id,
            s(c, "plaintext_text").as_bytes(),
            eph,
            nonce,
        )
        .unwrap();
        assert_eq!(aad, s(c, "aad_b64"));
        assert_eq!(ciphertext, s(c, "wire_ciphertext_b64"));
        let raw = b64(&ciphertext);
        assert_eq!(hex::encode(&raw[..12]), s(c, "nonce_hex"));
        assert_eq!(
            hex::encode(&raw[12..]),
            format!("{}{}", s(c, "gcm_ciphertext_hex"), s(c, "gcm_tag_hex"))
        );
        assert_eq!(
            challenge_aad_bytes(
                &meta.pairing_id,
                &meta.challenge_id,
                s(c, "ephemeral_public_b64")
            ),
            aad_text.as_bytes()
        );

        // Shared secret from both sides and the derived key.
        let remote_pub = decode_key32("x", s(c, "remote_x25519_public_b64")).unwrap();
        let eph_pub = decode_key32("x", s(c, "ephemeral_public_b64")).unwrap();
        let from_gateway = x25519_agree(&StaticSecret::from(eph), remote_pub).unwrap();
        let from_remote = x25519_agree(
            &StaticSecret::from(seed(s(c, "remote_x25519_private_hex"))),
            eph_pub,
        )
        .unwrap();
        assert_eq!(
            hex::encode(from_gateway.as_bytes()),
            s(c, "shared_secret_hex")
        );
        assert_eq!(from_remote.as_bytes(), from_gateway.as_bytes());
        assert_eq!(
            hex::encode(derive_challenge_key(&from_remote, aad_text.as_bytes())),
            s(c, "derived_key_hex")
        );

        // The challenge message of the transcript is exactly what the gateway built.
        let built = PairChallenge::new(meta.pairing_id, meta.challenge_id, ciphertext, aad);
        let wire = t["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| s(m, "type") == TYPE_CHALLENGE)
            .map(|m| s(m, "wire_text"))
            .unwrap();
        assert_eq!(built.to_wire().unwrap(), wire);
    }

    #[test]
    fn challenge_random_round_trip_and_low_order_key() {
        let secret = new_x25519_secret();
        let public = x25519_public_b64(&secret);
        let pairing_id = new_pairing_id();
        let challenge_id = new_challenge_id();
        let plaintext = new_challenge_plaintext();
        let (ct, aad) =
            seal_challenge(&public, &pairing_id, &challenge_id, plaintext.as_bytes()).unwrap();
        let msg = PairChallenge::new(pairing_id.clone(), challenge_id.clone(), ct, aad);
        assert_eq!(open_challenge(&secret, &msg).unwrap(), plaintext.as_bytes());
        // Another secret cannot open it.
        assert!(matches!(
            open_challenge(&new_x25519_secret(), &msg),
            Err(WireError::DecryptionFailed)
        ));
        // Sealing to, or receiving from, the all-zero (low-order) point is refused.
        let zero = BASE64.encode([0u8; 32]);
        assert!(matches!(
            seal_challenge(&zero, &pairing_id, &challenge_id, b"x"),
            Err(WireError::LowOrderKey)
        ));
        let aad = challenge_aad_bytes(&pairing_id, &challenge_id, &zero);
        let bad = PairChallenge::new(
            pairing_id,
            challenge_id,
            BASE64.encode([0u8; 40]),
            BASE64.encode(aad),
        );
        assert!(matches!(
            open_challenge(&secret, &bad),
            Err(WireError::LowOrderKey)
        ));
        // A wrong key length in the AAD.
        let aad = challenge_aad_bytes(
            &bad.pairing_id,
            &bad.challenge_id,
            &BASE64.encode([1u8; 31]),
        );
        let bad = PairChallenge {
            aad: BASE64.encode(aad),
            ..bad
        };
        assert!(matches!(
            open_challenge(&secret, &bad),
            Err(WireError::BadKeyLength {
                expected: 32,
                actual: 31,
                ..
            })
        ));
        // Wrong type is refused before decrypting.
        let wrong = PairChallenge {
            msg_type: "pair.Challenge".into(),
            ..msg
        };
        assert!(matches!(
            open_challenge(&secret, &wrong),
            Err(WireError::WrongType { .. })
        ));
    }

    #[test]
    fn fingerprints_match_vectors() {
        let t = transcript();
        for f in t["fingerprints"].as_array().unwrap() {
            let der = b64(s(f, "certificate_der_b64"));
            let fp = fingerprint_der(&der);
            assert_eq!(fp, s(f, "fingerprint"));
            assert_eq!(fp, format!("sha256:{}", s(f, "sha256_hex")));
            let upper = fp.to_ascii_uppercase();
            assert!(upper.starts_with("SHA256:"));
            assert!(fingerprints_match(&fp, &upper));
            assert!(fingerprints_match(&format!("  {upper}\n"), &fp));
            let mut other = fp.clone();
            let last = other.pop().unwrap();
            other.push(if last == '0' { '1' } else { '0' });
            assert!(!fingerprints_match(&fp, &other));
            assert!(!fingerprints_match(&fp, ""));
        }
        // The issued certificate in pair.csr_issued matches its signed fingerprint and
        // the one pair.csr_installed confirms; the chain entry is the CA.
        let messages = t["messages"].as_array().unwrap();
        let issued = PairCsrIssued::from_wire(s(&messages[5], "wire_text")).unwrap();
        let installed = PairCsrInstalled::from_wire(s(&messages[6], "wire_text")).unwrap();
        let fp = fingerprint_der(&pem_to_der(&issued.certificate_pem));
        assert_eq!(fp, issued.mtls_cert_fingerprint);
        assert!(fingerprints_match(&installed.mtls_cert_fingerprint, &fp));
        assert_eq!(
            fingerprint_der(&pem_to_der(&issued.certificate_chain_pem[0])),
            s(&t["keys"]["pairing_ca"], "fingerprint")
        );
        assert_eq!(
            s(&t["fingerprints"][0], "serial_number_hex_as_sent"),
            issued.serial_number
        );
        // Go EqualFold would also fold U+017F (ſ) to 's'; ASCII folding refuses it.
        assert!(!fingerprints_match(&fp.replacen('s', "\u{17f}", 1), &fp));
    }

    /// What this module's refusal of one negative vector looks like.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Refusal {
        BadSignature,
        MissingSignature,
        WrongType,
        WrongVersion,
        GatewayKeyMismatch,
        AadMismatch,
        BadAad,
        TooShort,
        Decryption,
    }

    fn classify(e: &WireError) -> Refusal {
        match e {
            WireError::BadSignature => Refusal::BadSignature,
            WireError::MissingSignature => Refusal::MissingSignature,
            WireError::WrongType { .. } => Refusal::WrongType,
            WireError::WrongVersion(_) => Refusal::WrongVersion,
            WireError::GatewayKeyMismatch => Refusal::GatewayKeyMismatch,
            WireError::AadMismatch => Refusal::AadMismatch,
            WireError::BadAad(_) => Refusal::BadAad,
            WireError::CiphertextTooShort => Refusal::TooShort,
            WireError::DecryptionFailed => Refusal::Decryption,
            other => panic!("unexpected error kind {other:?}"),
        }
    }

    /// The refusal expected here for each negative vector id (mirrors the Go error text).
    fn expected_refusal(id: &str) -> Refusal {
        match id {
            "init.sig_empty" => Refusal::MissingSignature,
            "init.type_case" => Refusal::WrongType,
            "init.version" => Refusal::WrongVersion,
            "init.foreign_key_resigned" => Refusal::GatewayKeyMismatch,
            "challenge.truncated" => Refusal::TooShort,
            "challenge.aad_pairing_id" | "challenge.challenge_id" => Refusal::AadMismatch,
            "challenge.aad_missing" => Refusal::BadAad,
            "challenge.tag_bitflip"
            | "challenge.nonce_bitflip"
            | "challenge.aad_whitespace"
            | "challenge.aad_ephemeral_swapped" => Refusal::Decryption,
            _ => Refusal::BadSignature,
        }
    }

    /// Runs the check the receiving side of `v` performs at the wire level. Also checks
    /// that the re-marshalled signed bytes equal what Go recomputed for the vector.
    fn wire_check(
        v: &Value,
        gateway_key: &str,
        remote_key: &str,
        remote_x: &StaticSecret,
    ) -> Result<(), WireError> {
        fn signed<M: SignedMessage>(v: &Value, key: &str) -> Result<(), WireError> {
            let msg = M::from_wire(s(v, "wire_text")).expect("tampered message still decodes");
            if let Some(expected) = v.get("recomputed_signed_bytes_b64").and_then(Value::as_str) {
                assert_eq!(
                    String::from_utf8(msg.signed_bytes().unwrap()).unwrap(),
                    String::from_utf8(b64(expected)).unwrap(),
                    "recomputed signed bytes of {}",
                    s(v, "id")
                );
            }
            msg.verify_with(key)
        }
        match s(v, "message_type") {
            TYPE_INIT => {
                // Remote: configured gateway key (also catches a swapped carried key).
                let r = signed::<PairInit>(v, gateway_key);
                let msg = PairInit::from_wire(s(v, "wire_text")).unwrap();
                let full = msg.verify_from_gateway(gateway_key);
                assert_eq!(r.is_ok(), full.is_ok(), "{}", s(v, "id"));
                full
            }
            TYPE_CSR_ISSUED => signed::<PairCsrIssued>(v, gateway_key),
            TYPE_IDENTITY => {
                // Gateway: verified with the key the message carries.
                let msg = PairIdentity::from_wire(s(v, "wire_text")).unwrap();
                let r = signed::<PairIdentity>(v, &msg.remote.public_key_ed25519);
                assert_eq!(r.is_ok(), msg.verify_self_signed().is_ok());
                r
            }
            TYPE_CHALLENGE_RESPONSE => signed::<PairChallengeResponse>(v, remote_key),
            TYPE_CSR_REQUEST => signed::<PairCsrRequest>(v, remote_key),
            TYPE_CSR_INSTALLED => signed::<PairCsrInstalled>(v, remote_key),
            TYPE_CHALLENGE => {
                let msg = PairChallenge::from_wire(s(v, "wire_text")).unwrap();
                open_challenge(remote_x, &msg).map(|_| ())
            }
            other => panic!("unexpected message type {other}"),
        }
    }

    #[test]
    fn negative_vectors_are_refused_or_left_to_the_handshake() {
        let n = load("pairing_negative.json");
        let gateway_key = s(&n, "gateway_public_key_b64");
        let remote_key = s(&n, "remote_public_key_b64");
        let remote_x = StaticSecret::from(seed(s(&n, "remote_x25519_private_hex")));
        let vectors = n["vectors"].as_array().unwrap();
        assert_eq!(vectors.len(), 41);
        let mut refused = Vec::new();
        let mut left = Vec::new();
        for v in vectors {
            let id = s(v, "id");
            assert_eq!(s(v, "expect"), "reject");
            let result = wire_check(v, gateway_key, remote_key, &remote_x);
            if HANDSHAKE_CHECKED.contains(&id) {
                // Validly signed: the wire layer must accept it so the handshake decides.
                result.unwrap_or_else(|e| {
                    panic!("{id}: wire layer refused a handshake-level vector: {e}")
                });
                left.push(id);
            } else {
                let err = result.expect_err(id);
                assert_eq!(classify(&err), expected_refusal(id), "{id}: {err}");
                refused.push(id);
            }
        }
        assert_eq!(refused.len(), 37, "{refused:?}");
        assert_eq!(left.len(), HANDSHAKE_CHECKED.len());
        for id in HANDSHAKE_CHECKED {
            assert!(left.contains(id), "{id} is not a negative vector");
        }
        assert_eq!(refused.len() + left.len(), vectors.len());
    }

    /// `accepted_variants` this module refuses (fail closed), with the reason.
    const REFUSED_VARIANTS: &[(&str, &str)] = &[(
        "init.key_case_insensitive",
        "keys match case-sensitively: PAIRING_ID is ignored, pairing_id stays empty, signature fails",
    )];

    #[test]
    fn accepted_variants_verify_except_documented_refusals() {
        let n = load("pairing_negative.json");
        let gateway_key = s(&n, "gateway_public_key_b64");
        let remote_key = s(&n, "remote_public_key_b64");
        let remote_x = StaticSecret::from(seed(s(&n, "remote_x25519_private_hex")));
        let variants = n["accepted_variants"]["vectors"].as_array().unwrap();
        assert_eq!(variants.len(), 8);
        let mut accepted = 0;
        for v in variants {
            let id = s(v, "id");
            assert_eq!(s(v, "expect"), "accept");
            if REFUSED_VARIANTS.iter().any(|(r, _)| *r == id) {
                let msg = PairInit::from_wire(s(v, "wire_text")).unwrap();
                assert_eq!(msg.pairing_id, "");
                assert!(matches!(
                    msg.verify_from_gateway(gateway_key),
                    Err(WireError::BadSignature)
                ));
                continue;
            }
            wire_check(v, gateway_key, remote_key, &remote_x)
                .unwrap_or_else(|e| panic!("{id}: {e}"));
            accepted += 1;
        }
        assert_eq!(accepted, 7);

        // Specific consequences.
        let by_id = |id: &str| variants.iter().find(|v| s(v, "id") == id).unwrap();
        let issued = PairCsrIssued::from_wire(s(
            by_id("issued.fingerprint_uppercase_resigned"),
            "wire_text",
        ))
        .unwrap();
        assert!(fingerprints_match(
            &issued.mtls_cert_fingerprint,
            &fingerprint_der(&pem_to_der(&issued.certificate_pem))
        ));
        let installed = PairCsrInstalled::from_wire(s(
            by_id("installed.fingerprint_uppercase_resigned"),
            "wire_text",
        ))
        .unwrap();
        assert!(fingerprints_match(
            &installed.mtls_cert_fingerprint,
            &issued.mtls_cert_fingerprint
        ));
        // Wire re-encoding of the offset form keeps the offset; the signature uses UTC.
        let offset =
            PairCsrIssued::from_wire(s(by_id("issued.not_before_offset_form"), "wire_text"))
                .unwrap();
        assert!(offset
            .to_wire()
            .unwrap()
            .contains("\"not_before\":\"2026-01-02T04:59:05+02:00\""));
        // Re-signing an untrimmed issued_at gives the transcript's signature.
        let t = transcript();
        let mut untrimmed =
            PairInit::from_wire(s(by_id("init.issued_at_untrimmed"), "wire_text")).unwrap();
        assert_eq!(
            untrimmed.gateway.issued_at,
            "2026-01-02T03:04:05.123456700Z"
        );
        let expected_sig = untrimmed.sig_ed25519.clone();
        untrimmed.sign_with(&gateway_identity(&t)).unwrap();
        assert_eq!(untrimmed.sig_ed25519, expected_sig);
        // The self-signed other key verifies with its own key only.
        let other =
            PairIdentity::from_wire(s(by_id("identity.self_signed_other_key"), "wire_text"))
                .unwrap();
        other.verify_self_signed().unwrap();
        assert!(matches!(
            other.verify_with(remote_key),
            Err(WireError::BadSignature)
        ));
    }

    #[test]
    fn json_encoding_vectors() {
        let t = transcript();
        let gw = gateway_identity(&t);
        let rm = remote_identity(&t);
        let e = load("json_encoding.json");
        let vectors = e["vectors"].as_array().unwrap();
        assert_eq!(vectors.len(), 12);
        let mut checked = 0;
        for v in vectors {
            let id = s(v, "id");
            let wire = s(v, "wire_text");
            let sb = s(v, "signed_bytes_b64");
            assert_eq!(b64(sb), s(v, "signed_bytes_text").as_bytes(), "{id}");
            let (key, signer) = if s(v, "signer") == "gateway" {
                (gw.public_key_b64(), &gw)
            } else {
                (rm.public_key_b64(), &rm)
            };
            // The Go string encoder on the raw input reproduces the escaped value inside
            // the signed bytes (this is the only way to feed it invalid UTF-8).
            if let Some(input) = v.get("input_value_utf8_hex").and_then(Value::as_str) {
                let mut encoded = b"\"component_id\":".to_vec();
                append_go_json_string(&mut encoded, &hex::decode(input).unwrap());
                let signed = b64(sb);
                assert!(
                    signed
                        .windows(encoded.len())
                        .any(|w| w == encoded.as_slice()),
                    "{id}: encoder output {:?} not in signed bytes",
                    String::from_utf8_lossy(&encoded)
                );
            }
            if !v["go_receiver_verifies_wire"].as_bool().unwrap() {
                // escape.invalid_utf8: the wire carries \ufffd, which decodes to U+FFFD and
                // re-encodes raw, so a receiver cannot verify — exactly like a Go receiver.
                assert_eq!(id, "escape.invalid_utf8");
                let msg = PairIdentity::from_wire(wire).unwrap();
                assert_eq!(msg.remote.component_id, "bad\u{fffd}byte");
                let ours = msg.signed_bytes().unwrap();
                assert_ne!(ours, b64(sb));
                assert!(ours.windows(3).any(|w| w == [0xef, 0xbf, 0xbd]));
                assert!(matches!(
                    msg.verify_with(&key),
                    Err(WireError::BadSignature)
                ));
                // Go's json/v2-backed encoder writes the raw form, which is what we sign.
                let mut resigned = msg.clone();
                resigned.sign_with(signer).unwrap();
                resigned.verify_with(&key).unwrap();
                checked += 1;
                continue;
            }
            match wire {
                w if w.starts_with("{\"type\":\"pair.identity\"") => {
                    check_signed::<PairIdentity>(w, sb, &key, Some(signer));
                }
                w if w.starts_with("{\"type\":\"pair.init\"") => {
                    check_signed::<PairInit>(w, sb, &key, Some(signer));
                }
                w if w.starts_with("{\"type\":\"pair.csr_issued\"") => {
                    let m = check_signed::<PairCsrIssued>(w, sb, &key, Some(signer));
                    assert!(m.not_before.ends_with("+02:00"));
                    assert!(s(v, "signed_bytes_text")
                        .contains("\"not_before\":\"2026-01-02T02:59:05Z\""));
                }
                _ => panic!("{id}: unexpected message"),
            }
            checked += 1;
        }
        assert_eq!(checked, 12);
    }

    #[test]
    fn go_string_escaping() {
        let cases: &[(&[u8], &str)] = &[
            (b"plain", "\"plain\""),
            (b"<a&b>", "\"\\u003ca\\u0026b\\u003e\""),
            (b"q\"b\\s/x", "\"q\\\"b\\\\s/x\""),
            (
                b"\x00\x01\x08\x0c\x0a\x0d\x09\x1f\x7f",
                "\"\\u0000\\u0001\\b\\f\\n\\r\\t\\u001f\x7f\"",
            ),
            ("a\u{2028}b\u{2029}c".as_bytes(), "\"a\\u2028b\\u2029c\""),
            ("café-🦀-ü\u{fffd}".as_bytes(), "\"café-🦀-ü\u{fffd}\""),
            (b"bad\xffbyte", "\"bad\\ufffdbyte\""),
            (b"\xe2\x82x", "\"\\ufffd\\ufffdx\""),
            (b"\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\""),
            (b"+/=", "\"+/=\""),
        ];
        for (input, expected) in cases {
            let mut out = Vec::new();
            append_go_json_string(&mut out, input);
            assert_eq!(String::from_utf8(out).unwrap(), *expected, "{input:?}");
        }
        assert_eq!(
            go_json_string("-----BEGIN X-----\nAB+/=\n"),
            "\"-----BEGIN X-----\\nAB+/=\\n\""
        );
    }

    #[test]
    fn rfc3339_parse_and_format_like_go() {
        let canon = |s: &str| GoTime::parse_rfc3339(s).and_then(|t| t.to_rfc3339_nano());
        let utc = |s: &str| GoTime::parse_rfc3339(s).and_then(|t| t.to_utc().to_rfc3339_nano());
        for (input, expected) in [
            (
                "2026-01-02T03:04:05.1234567Z",
                "2026-01-02T03:04:05.1234567Z",
            ),
            (
                "2026-01-02T03:04:05.123456700Z",
                "2026-01-02T03:04:05.1234567Z",
            ),
            ("2026-01-02T03:04:05.000000000Z", "2026-01-02T03:04:05Z"),
            (
                "2026-01-02T03:04:05.000000001Z",
                "2026-01-02T03:04:05.000000001Z",
            ),
            (
                "2026-01-02T03:04:05.1234567891999Z",
                "2026-01-02T03:04:05.123456789Z",
            ),
            ("2026-01-02T05:04:05+02:00", "2026-01-02T05:04:05+02:00"),
            ("2026-01-02T05:04:05-00:00", "2026-01-02T05:04:05Z"),
            ("2026-01-02T05:04:05+00:00", "2026-01-02T05:04:05Z"),
            ("2024-02-29T00:00:00Z", "2024-02-29T00:00:00Z"),
            ("0000-01-01T00:00:00Z", "0000-01-01T00:00:00Z"),
        ] {
            assert_eq!(canon(input).as_deref(), Some(expected), "{input}");
        }
        for bad in [
            "",
            "2026-01-02",
            "2026-01-02T03:04:05",
            "2026-01-02t03:04:05Z",
            "2026-01-02T03:04:05z",
            "2026-01-02 03:04:05Z",
            "2026-01-02T3:04:05Z",
            "2026-01-02T03:04:05,1Z",
            "2026-01-02T03:04:05.Z",
            "2026-01-02T24:00:00Z",
            "2026-01-02T03:60:00Z",
            "2026-01-02T03:04:60Z",
            "2026-13-02T03:04:05Z",
            "2026-00-02T03:04:05Z",
            "2025-02-29T03:04:05Z",
            "2026-04-31T03:04:05Z",
            "2026-01-02T03:04:05+24:00",
            "2026-01-02T03:04:05+02:60",
            "2026-01-02T03:04:05+0200",
            "2026-01-02T03:04:05Z ",
            "+2026-01-02T03:04:05Z",
            "2026-01-02T03:04:05.1é",
            "２026-01-02T03:04:05Z",
        ] {
            assert_eq!(GoTime::parse_rfc3339(bad), None, "{bad:?}");
        }
        // UTC conversion across day, month and year boundaries.
        assert_eq!(
            utc("2026-01-02T04:59:05+02:00").as_deref(),
            Some("2026-01-02T02:59:05Z")
        );
        assert_eq!(
            utc("2026-01-01T01:00:00+02:00").as_deref(),
            Some("2025-12-31T23:00:00Z")
        );
        assert_eq!(
            utc("2024-02-28T23:30:00.5-01:00").as_deref(),
            Some("2024-02-29T00:30:00.5Z")
        );
        assert_eq!(utc("9999-12-31T23:59:59-00:01"), None);
        assert_eq!(utc("0000-01-01T00:00:00+00:01"), None);
        // Unix conversions.
        let t = GoTime::parse_rfc3339("2026-01-02T03:04:05.1234567Z").unwrap();
        assert_eq!(t.unix_timestamp(), (1_767_323_045, 123_456_700));
        assert_eq!(GoTime::from_unix(1_767_323_045, 123_456_700), Some(t));
        assert_eq!(
            GoTime::from_system_time(t.to_system_time().unwrap()),
            Some(t)
        );
        let old = GoTime::parse_rfc3339("1969-12-31T23:59:59.25Z").unwrap();
        assert_eq!(old.unix_timestamp(), (-1, 250_000_000));
        assert_eq!(
            GoTime::from_system_time(old.to_system_time().unwrap()),
            Some(old)
        );
        assert_eq!(
            GoTime::from_unix(0, 0).unwrap().to_string(),
            "1970-01-01T00:00:00Z"
        );
        let offset = GoTime::parse_rfc3339("2026-01-02T05:04:05-07:30").unwrap();
        assert_eq!(offset.offset_seconds(), -27_000);
        assert_eq!(offset.to_utc().unix_timestamp(), offset.unix_timestamp());
    }

    #[test]
    fn days_round_trip_over_a_wide_range() {
        for days in (-800_000..800_000).step_by(97) {
            let (y, m, d) = civil_from_days(days);
            assert!((1..=12).contains(&m) && d >= 1 && d <= days_in_month(y, m));
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn bad_times_make_signing_and_verifying_fail() {
        let t = transcript();
        let gw = gateway_identity(&t);
        let wire = s(&t["messages"][0], "wire_text");
        let mut init = PairInit::from_wire(wire).unwrap();
        init.gateway.issued_at = "2026-01-02 03:04:05Z".into();
        assert!(matches!(
            init.verify_with(&gw.public_key_b64()),
            Err(WireError::BadTime {
                field: "gateway.issued_at",
                ..
            })
        ));
        assert!(matches!(
            init.sign_with(&gw),
            Err(WireError::BadTime { .. })
        ));
        assert!(init.to_wire().is_err());
        init.gateway.issued_at = String::new();
        assert!(matches!(
            init.signed_bytes(),
            Err(WireError::BadTime { .. })
        ));

        let mut issued = PairCsrIssued::from_wire(s(&t["messages"][5], "wire_text")).unwrap();
        issued.not_after = "2027-01-02T03:04:05".into();
        assert!(matches!(
            issued.verify_with(&gw.public_key_b64()),
            Err(WireError::BadTime {
                field: "not_after",
                ..
            })
        ));
    }

    #[test]
    fn sign_and_verify_round_trip_for_every_signed_type() {
        let (gw, gw_seed) = SigningIdentity::generate();
        assert_eq!(
            SigningIdentity::from_seed(&gw_seed)
                .unwrap()
                .public_key_b64(),
            gw.public_key_b64()
        );
        let (rm, _) = SigningIdentity::generate();
        let pid = new_pairing_id();
        let now = GoTime::from_system_time(SystemTime::now())
            .unwrap()
            .to_string();

        let mut init = PairInit::new(
            pid.clone(),
            PairGatewayInfo {
                gateway_id: "gw<1>".into(),
                public_key_ed25519: gw.public_key_b64(),
                nonce: new_nonce(),
                issued_at: now.clone(),
            },
        );
        init.sign_with(&gw).unwrap();
        init.verify_from_gateway(&gw.public_key_b64()).unwrap();
        assert!(matches!(
            init.verify_from_gateway(&rm.public_key_b64()),
            Err(WireError::GatewayKeyMismatch)
        ));
        assert!(matches!(
            init.verify_with(&rm.public_key_b64()),
            Err(WireError::BadSignature)
        ));
        let back = PairInit::from_wire(&init.to_wire().unwrap()).unwrap();
        assert_eq!(back, init);

        let x = new_x25519_secret();
        let mut identity = PairIdentity::new(
            pid.clone(),
            PairRemoteInfo {
                component_type: "tool_host".into(),
                component_id: "a\u{2028}é&".into(),
                public_key_ed25519: rm.public_key_b64(),
                public_key_x25519: x25519_public_b64(&x),
                mtls_cert_fingerprint: String::new(),
            },
        );
        identity.sign_with(&rm).unwrap();
        identity.verify_self_signed().unwrap();
        assert_eq!(
            PairIdentity::from_wire(&identity.to_wire().unwrap()).unwrap(),
            identity
        );

        let mut resp =
            PairChallengeResponse::new(pid.clone(), new_challenge_id(), new_challenge_plaintext());
        resp.sign_with(&rm).unwrap();
        resp.verify_with(&rm.public_key_b64()).unwrap();
        let mut csr = PairCsrRequest::new(
            pid.clone(),
            "-----BEGIN CERTIFICATE REQUEST-----\nAA==\n-----END CERTIFICATE REQUEST-----\n",
        );
        csr.sign_with(&rm).unwrap();
        csr.verify_with(&rm.public_key_b64()).unwrap();
        let mut issued = PairCsrIssued::new(
            pid.clone(),
            "pem",
            Vec::new(),
            "1f",
            fingerprint_der(b"der"),
            "2026-01-02T05:00:00+02:00",
            "2027-01-02T03:00:00Z",
        );
        issued.sign_with(&gw).unwrap();
        issued.verify_with(&gw.public_key_b64()).unwrap();
        let signed = String::from_utf8(issued.signed_bytes().unwrap()).unwrap();
        assert!(!signed.contains("certificate_chain_pem"));
        assert!(signed.contains("\"not_before\":\"2026-01-02T03:00:00Z\""));
        let wire = issued.to_wire().unwrap();
        assert!(wire.contains("\"not_before\":\"2026-01-02T05:00:00+02:00\""));
        assert_eq!(PairCsrIssued::from_wire(&wire).unwrap(), issued);
        let mut installed =
            PairCsrInstalled::new(pid.clone(), issued.mtls_cert_fingerprint.clone());
        installed.sign_with(&rm).unwrap();
        installed.verify_with(&rm.public_key_b64()).unwrap();
        installed.mtls_cert_fingerprint = installed.mtls_cert_fingerprint.to_ascii_uppercase();
        assert!(matches!(
            installed.verify_with(&rm.public_key_b64()),
            Err(WireError::BadSignature)
        ));

        // Signing refuses a wrong header.
        let mut wrong = PairCsrInstalled {
            version: "v2".into(),
            ..installed
        };
        assert!(matches!(wrong.sign_with(&rm), Err(WireError::WrongVersion(v)) if v == "v2"));
    }

    #[test]
    fn verify_is_strict_about_encodings() {
        let (id, _) = SigningIdentity::generate();
        let key = id.public_key_b64();
        let sig = id.sign(b"msg");
        verify(&key, b"msg", &sig).unwrap();
        assert!(matches!(
            verify(&key, b"msh", &sig),
            Err(WireError::BadSignature)
        ));
        assert!(matches!(
            verify(&key, b"msg", ""),
            Err(WireError::MissingSignature)
        ));
        assert!(matches!(
            verify(&key, b"msg", "!!"),
            Err(WireError::BadBase64 {
                field: "sig_ed25519"
            })
        ));
        assert!(matches!(
            verify(&key, b"msg", &BASE64.encode([0u8; 63])),
            Err(WireError::BadSignatureLength(63))
        ));
        assert!(matches!(
            verify(&BASE64.encode([0u8; 31]), b"msg", &sig),
            Err(WireError::BadKeyLength {
                expected: 32,
                actual: 31,
                ..
            })
        ));
        assert!(matches!(
            verify("", b"msg", &sig),
            Err(WireError::BadKeyLength { actual: 0, .. })
        ));
        // Missing padding, non-zero trailing bits, URL alphabet, embedded newline.
        assert!(matches!(
            verify(key.trim_end_matches('='), b"msg", &sig),
            Err(WireError::BadBase64 { .. })
        ));
        let url = sig.replace('+', "-").replace('/', "_");
        if url != sig {
            assert!(matches!(
                verify(&key, b"msg", &url),
                Err(WireError::BadBase64 { .. })
            ));
        }
        let wrapped = format!("{}\n{}", &sig[..40], &sig[40..]);
        assert!(matches!(
            verify(&key, b"msg", &wrapped),
            Err(WireError::BadBase64 { .. })
        ));
        // A public key with the last char's unused bits set is not canonical.
        let last = key.as_bytes()[42];
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let pos = alphabet.iter().position(|c| *c == last).unwrap();
        let mut noncanon = key.clone().into_bytes();
        noncanon[42] = alphabet[pos ^ 1];
        let noncanon = String::from_utf8(noncanon).unwrap();
        assert!(matches!(
            verify(&noncanon, b"msg", &sig),
            Err(WireError::BadBase64 { .. })
        ));
        assert!(format!("{id:?}").contains(&key));
    }

    #[test]
    fn decoding_policy() {
        // Unknown fields, reordering, trailing newline: accepted.
        let m = PairComplete::from_wire("{\"status\":\"ok\",\"x\":[1,{}],\"pairing_id\":\"p\",\"version\":\"v1\",\"type\":\"pair.complete\"}\n").unwrap();
        assert_eq!(m, PairComplete::ok("p"));
        // Missing fields are Go zero values.
        let m = PairCsrInstalled::from_wire("{\"type\":\"pair.csr_installed\",\"version\":\"v1\"}")
            .unwrap();
        assert_eq!(m.pairing_id, "");
        assert!(matches!(
            m.verify_with(&BASE64.encode([1u8; 32])),
            Err(WireError::MissingSignature)
        ));
        // Duplicate keys, null strings, wrong JSON types, trailing content: refused.
        assert!(
            PairComplete::from_wire("{\"type\":\"pair.complete\",\"type\":\"pair.complete\"}")
                .is_err()
        );
        assert!(PairComplete::from_wire("{\"type\":null}").is_err());
        assert!(PairComplete::from_wire("{\"type\":1}").is_err());
        assert!(PairComplete::from_wire("{} {}").is_err());
        assert!(PairComplete::from_wire("[]").is_err());
        assert!(PairComplete::from_wire("[\"pair.complete\",\"v1\",\"p\",\"ok\"]").is_err());
        assert!(message_type("[\"pair.complete\"]").is_err());
        let array_gateway = "{\"type\":\"pair.init\",\"version\":\"v1\",\"gateway\":[\"g\",\"k\",\"n\",\"2026-01-02T03:04:05Z\"]}";
        assert!(PairInit::from_wire(array_gateway).is_err());
        assert!(decode_message(array_gateway).is_err());
        // Header checks.
        let m = PairComplete {
            msg_type: "pair.Complete".into(),
            ..PairComplete::ok("p")
        };
        assert!(matches!(
            m.check_header(),
            Err(WireError::WrongType {
                expected: "pair.complete",
                ..
            })
        ));
        // Type peeking and dispatch.
        assert_eq!(
            message_type("{\"a\":1,\"type\":\"pair.error\"}").unwrap(),
            "pair.error"
        );
        assert!(matches!(
            message_type("{\"a\":1}"),
            Err(WireError::MissingType)
        ));
        assert!(matches!(
            message_type("{\"type\":null}"),
            Err(WireError::MissingType)
        ));
        assert!(matches!(
            message_type("{\"type\":\"\"}"),
            Err(WireError::MissingType)
        ));
        assert!(matches!(message_type("not json"), Err(WireError::Json(_))));
        assert!(
            matches!(decode_message("{\"type\":\"pair.Init\"}"), Err(WireError::UnknownType(t)) if t == "pair.Init")
        );
        let err = PairError::handshake_failed("verify pair.init signature: <bad> & \"worse\"");
        let wire = err.to_wire().unwrap();
        assert_eq!(
            wire,
            "{\"type\":\"pair.error\",\"version\":\"v1\",\"pairing_id\":\"\",\"code\":\"HANDSHAKE_FAILED\",\"message\":\"verify pair.init signature: \\u003cbad\\u003e \\u0026 \\\"worse\\\"\"}\n"
        );
        assert_eq!(decode_message(&wire).unwrap(), PairMessage::Error(err));
        // An empty aad is omitted on the wire; the chain likewise.
        let c = PairChallenge::new("p", "c", "ct", "");
        assert_eq!(
            c.to_wire().unwrap(),
            "{\"type\":\"pair.challenge\",\"version\":\"v1\",\"pairing_id\":\"p\",\"challenge_id\":\"c\",\"ciphertext\":\"ct\"}\n"
        );
        assert!(!serde_json::to_string(&c).unwrap().contains("aad"));
    }

    #[test]
    fn random_helpers_have_the_wire_formats() {
        let id = new_pairing_id();
        assert_eq!(id.len(), 32);
        assert!(id
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        assert_ne!(id, new_pairing_id());
        assert_eq!(new_challenge_id().len(), 32);
        let nonce = new_nonce();
        assert_eq!(nonce.len(), 32);
        assert_eq!(BASE64.decode(&nonce).unwrap().len(), 24);
        let p = new_challenge_plaintext();
        assert_eq!(p.len(), 44);
        assert!(p.ends_with('=') && !p.ends_with("=="));
        assert_eq!(BASE64.decode(&p).unwrap().len(), 32);
    }
}
