//! A ledger entry in the form its row hash covers, as the writer takes it.
//!
//! A [`Record`] holds an entry's fields in table order (`side` to `charge`), each as an 8-byte
//! big-endian length (all ones for an absent value) and its bytes, numbers in decimal: the
//! bytes the row hash covers after `prev_hash` and `seq`. A call's fields are written into one
//! buffer when it starts and ends ([`Record::start`], [`Started::end`]); the writer hashes the
//! buffer in one pass and binds each field as a slice of it. So a call hands the writer one
//! allocation, not a string per field.

use sha2::Digest as _;

use super::store::Entry;
use crate::receipts::Tag;

/// Fields of a record: `side` to `charge`.
pub(super) const FIELDS: usize = 15;
/// The length written for an absent value.
const ABSENT: [u8; 8] = u64::MAX.to_be_bytes();
/// What a record of a call without a receipt takes, so that it is written without growing.
const CAPACITY: usize = 512;

/// An entry's fields, encoded as its row hash covers them (see the module's docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    bytes: Vec<u8>,
}

/// A record whose call has started: the fields known then are written.
#[derive(Debug)]
pub struct Started {
    bytes: Vec<u8>,
    /// Where `receipt_id` goes, known only when the call ends.
    receipt_at: usize,
    /// The `input_hash` field written at the start: its bytes' range.
    input: Option<std::ops::Range<usize>>,
    started_at: u64,
}

/// The fields known when the call ends.
#[derive(Debug, Clone, Copy)]
pub struct Ending<'a> {
    pub receipt_id: Option<&'a str>,
    /// The call's receipt's `input_hash`: it is the one recorded (in place of the start's).
    /// Empty when neither the start nor the end had one.
    pub input_hash: Option<&'a str>,
    pub output_hash: &'a str,
    pub status: &'a str,
    pub error_code: Option<&'a str>,
    pub ended_at: u64,
    pub duration_ms: u64,
    pub receipt: Option<&'a str>,
    pub charge: Option<u64>,
}

fn field(bytes: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        Some(b) => {
            bytes.extend_from_slice(&(b.len() as u64).to_be_bytes());
            bytes.extend_from_slice(b);
        }
        None => bytes.extend_from_slice(&ABSENT),
    }
}

fn number(bytes: &mut Vec<u8>, n: Option<u64>) {
    let mut digits = itoa::Buffer::new();
    field(bytes, n.map(|n| digits.format(n).as_bytes()));
}

impl Record {
    /// The fields a call has when it starts; `input_hash` when it is known then.
    pub fn start(
        side: &str,
        call_id: &str,
        tool: &str,
        consumer: &str,
        provider: &str,
        input_hash: Option<&str>,
        started_at: u64,
    ) -> Started {
        let mut bytes = Vec::with_capacity(CAPACITY);
        field(&mut bytes, Some(side.as_bytes()));
        field(&mut bytes, Some(call_id.as_bytes()));
        let receipt_at = bytes.len();
        for v in [tool, consumer, provider] {
            field(&mut bytes, Some(v.as_bytes()));
        }
        let input = input_hash.map(|h| {
            let at = bytes.len();
            field(&mut bytes, Some(h.as_bytes()));
            at..bytes.len()
        });
        Started {
            bytes,
            receipt_at,
            input,
            started_at,
        }
    }

    /// The record of `entry`.
    pub fn of(e: &Entry) -> Record {
        Record::started(e, None).end(Ending::of(e, Some(&e.input_hash)))
    }

    /// The start of `entry`'s record, with `input_hash` there or not.
    pub(super) fn started(e: &Entry, input_hash: Option<&str>) -> Started {
        Record::start(
            &e.side,
            &e.call_id,
            &e.tool,
            &e.consumer,
            &e.provider,
            input_hash,
            e.started_at,
        )
    }

    /// The hash of this record as row `seq` after `prev_hash`: SHA-256 of `prev_hash`, `seq`
    /// and the fields, each as its length and its bytes.
    pub fn row_hash(&self, seq: u64, prev_hash: &str) -> Tag {
        Tag::of(&self.row_digest(seq, prev_hash))
    }

    /// [`Record::row_hash`]'s digest.
    pub fn row_digest(&self, seq: u64, prev_hash: &str) -> [u8; 32] {
        let mut h = sha2::Sha256::new();
        h.update((prev_hash.len() as u64).to_be_bytes());
        h.update(prev_hash);
        let mut digits = itoa::Buffer::new();
        let seq = digits.format(seq);
        h.update((seq.len() as u64).to_be_bytes());
        h.update(seq);
        h.update(&self.bytes);
        h.finalize().into()
    }

    /// Each field, `None` when absent.
    pub fn fields(&self) -> [Option<&[u8]>; FIELDS] {
        let mut out = [None; FIELDS];
        let mut rest = &self.bytes[..];
        for slot in &mut out {
            let (len, tail) = rest.split_at(8);
            let len = u64::from_be_bytes(len.try_into().expect("8 bytes"));
            rest = tail;
            if len != u64::MAX {
                let (value, tail) = rest.split_at(len as usize);
                *slot = Some(value);
                rest = tail;
            }
        }
        debug_assert!(rest.is_empty(), "a record has {FIELDS} fields");
        out
    }
}

impl<'a> Ending<'a> {
    /// The end of `entry`'s record, with `input_hash` there or not.
    pub(super) fn of(e: &'a Entry, input_hash: Option<&'a str>) -> Self {
        Ending {
            receipt_id: e.receipt_id.as_deref(),
            input_hash,
            output_hash: &e.output_hash,
            status: &e.status,
            error_code: e.error_code.as_deref(),
            ended_at: e.ended_at,
            duration_ms: e.duration_ms,
            receipt: e.receipt.as_deref(),
            charge: e.charge,
        }
    }
}

impl Started {
    /// The record, with the fields known when the call ended.
    pub fn end(mut self, e: Ending<'_>) -> Record {
        // The receipt's input hash replaces the start's (the same length, normally: a tag), or
        // comes where the start had none. Before `receipt_id` goes in, which moves it.
        match (self.input, e.input_hash) {
            (Some(range), Some(h)) => {
                let len = (h.len() as u64).to_be_bytes();
                self.bytes.splice(range, len.into_iter().chain(h.bytes()));
            }
            (Some(_), None) => {}
            (None, h) => field(&mut self.bytes, Some(h.unwrap_or_default().as_bytes())),
        }
        // `receipt_id` goes between `call_id` and `tool`: the fields after it move once, in
        // place (the iterator's length is exact).
        let (len, id) = match e.receipt_id {
            Some(id) => ((id.len() as u64).to_be_bytes(), id.as_bytes()),
            None => (ABSENT, &[][..]),
        };
        let at = self.receipt_at;
        self.bytes
            .splice(at..at, len.into_iter().chain(id.iter().copied()));
        let b = &mut self.bytes;
        field(b, Some(e.output_hash.as_bytes()));
        field(b, Some(e.status.as_bytes()));
        field(b, e.error_code.map(str::as_bytes));
        for n in [self.started_at, e.ended_at, e.duration_ms] {
            number(b, Some(n));
        }
        field(b, e.receipt.map(str::as_bytes));
        number(b, e.charge);
        Record { bytes: self.bytes }
    }
}
