//! The ledger's SQLite database: the schema, the hash chain, appends, retention and the
//! checks `carapace ledger verify` runs.
//!
//! Each row's `row_hash` is `sha256:` over `prev_hash`, the row's `seq` and its fields
//! ([`row_hash`]); `prev_hash` is the previous row's `row_hash`. The one-row
//! `chain` table keeps where the chain starts (after retention removed older rows) and its
//! head, updated in the same transaction as the rows: a deleted, edited or reordered row, and a
//! row removed at either end, is found by [`verify`].
//!
//! The four hashes of a row (`input_hash`, `output_hash`, `prev_hash`, `row_hash`) are stored
//! as their 32 bytes, not as their 71 characters of text: they were three quarters of a row.
//! They are hashed and read back as the `sha256:` text ([`hash_at`]); rows written as text
//! (by earlier versions, or a hash not in canonical form) stay text, in the same columns.

use std::path::Path;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Statement};
use serde::{Deserialize, Serialize};

pub use super::record::Record;
use super::record::FIELDS;
use crate::receipts::Tag;
use carapace_filters::canonical::decode_hex32;

/// The `prev_hash` of the first row ever written.
pub const GENESIS: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS invocations (
    seq INTEGER PRIMARY KEY,
    side TEXT NOT NULL,
    call_id TEXT NOT NULL,
    receipt_id TEXT,
    tool TEXT NOT NULL,
    consumer TEXT NOT NULL,
    provider TEXT NOT NULL,
    input_hash TEXT NOT NULL,
    output_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    error_code TEXT,
    started_at INTEGER NOT NULL,
    ended_at INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    receipt TEXT,
    charge INTEGER,
    prev_hash TEXT NOT NULL,
    row_hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS chain (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    first_seq INTEGER NOT NULL,
    first_prev TEXT NOT NULL,
    head_seq INTEGER NOT NULL,
    head_hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS spend (
    consumer TEXT NOT NULL,
    period TEXT NOT NULL,
    amount INTEGER NOT NULL,
    PRIMARY KEY (consumer, period)
);
INSERT OR IGNORE INTO chain (id, first_seq, first_prev, head_seq, head_hash)
    VALUES (1, 1, 'sha256:0000000000000000000000000000000000000000000000000000000000000000', 0,
            'sha256:0000000000000000000000000000000000000000000000000000000000000000');
";

/// One invocation, as a side of carapace saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// `inbound` (this host executed it) or `outbound` (this gateway sent it).
    pub side: String,
    pub call_id: String,
    pub receipt_id: Option<String>,
    pub tool: String,
    pub consumer: String,
    pub provider: String,
    pub input_hash: String,
    pub output_hash: String,
    /// `ok`, `error` or `timeout`.
    pub status: String,
    pub error_code: Option<String>,
    /// Unix milliseconds.
    pub started_at: u64,
    pub ended_at: u64,
    pub duration_ms: u64,
    /// The signed receipt (`Carapace-Receipt` value), when there is one.
    pub receipt: Option<String>,
    /// What the call was charged (metering), when priced.
    pub charge: Option<u64>,
}

/// A stored row: the entry, its place in the chain and its hashes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    pub seq: u64,
    #[serde(flatten)]
    pub entry: Entry,
    pub prev_hash: String,
    pub row_hash: String,
}

/// The hash of row `seq` holding `entry` after `prev_hash`: SHA-256 of `prev_hash`, then
/// `seq` and every field in table order, each as its length (8 bytes, big-endian; all ones
/// for an absent value) and its bytes (numbers in decimal). See [`Record`].
pub fn row_hash(seq: u64, entry: &Entry, prev_hash: &str) -> String {
    Record::of(entry)
        .row_hash(seq, prev_hash)
        .as_str()
        .to_string()
}

/// The page size of a ledger file carapace creates (SQLite's default is 4 KiB).
pub const PAGE_SIZE: i64 = 16 * 1024;

/// What went wrong with the database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("ledger {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A record's number field is not decimal digits (never, for a record carapace wrote).
    #[error("ledger record with a malformed number")]
    Record,
}

/// Open (creating it and its schema) the ledger at `path` for writing, in WAL mode.
pub fn open(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)?;
    // Before anything is written: a new file's pages are this size, an existing file keeps
    // its own. A batch at saturation is a few hundred rows of about 220 bytes; in 16 KiB pages
    // it is a quarter of the WAL frames (and page splits) of 4 KiB ones.
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // WAL with NORMAL: a committed batch survives the process being killed; an OS crash may
    // lose the last batches, never the chain's consistency.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

/// Open the ledger at `path` read-only (the commands that read it while carapace runs).
pub fn open_read_only(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(conn)
}

/// The chain's head: the last row's seq and hash.
pub fn head(conn: &Connection) -> Result<(u64, String), StoreError> {
    Ok(conn
        .prepare_cached("SELECT head_seq, head_hash FROM chain WHERE id = 1")?
        .query_row([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))?)
}

/// Append `records` in one transaction, chained after the head. Returns the new head seq.
///
/// Every statement of a batch, `BEGIN` and `COMMIT` included, is a cached one: a batch parses
/// no SQL (at a low rate a batch is a row or two, and parsing its five statements cost more
/// than the rows).
pub fn append(conn: &mut Connection, records: &[Record]) -> Result<u64, StoreError> {
    // IMMEDIATE: the write lock is taken before the head is read, so a second writer (another
    // process on the same file) waits instead of chaining after the same head.
    conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    match append_rows(conn, records) {
        Ok(seq) => {
            conn.prepare_cached("COMMIT")?.execute([])?;
            Ok(seq)
        }
        Err(e) => {
            // The batch is not written; the error that stopped it is the one reported.
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Which of a record's fields (by position, `side` = 0) are numbers: `started_at`,
/// `ended_at`, `duration_ms` (10 to 12) and `charge` (14); the rest are text.
fn is_number(i: usize) -> bool {
    matches!(i, 10..=12 | 14)
}

/// A number field's digits as the number: always decimal (the record wrote them).
fn digits(b: &[u8]) -> Result<u64, StoreError> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or(StoreError::Record)
}

/// A number field of a record, `None` when absent.
fn number(v: Option<&[u8]>) -> Result<Option<u64>, StoreError> {
    v.map(digits).transpose()
}

/// Which of a record's fields are hashes: `input_hash` and `output_hash` (6 and 7).
fn is_hash(i: usize) -> bool {
    matches!(i, 6 | 7)
}

/// The digest a `sha256:` tag in its canonical form (64 lowercase hex digits) names; `None`
/// for any other text, which is then stored as it is.
fn tag_digest(text: &[u8]) -> Option<[u8; 32]> {
    decode_hex32(text.strip_prefix(b"sha256:")?)
}

/// Bind a hash column: a canonical tag as its 32 bytes (a blob), any other text as text.
/// [`hash_at`] reads either back as the same text.
fn bind_hash(stmt: &mut Statement<'_>, at: usize, text: &[u8]) -> rusqlite::Result<()> {
    match tag_digest(text) {
        Some(digest) => stmt.raw_bind_parameter(at, &digest[..]),
        None => stmt.raw_bind_parameter(at, ToSqlOutput::Borrowed(ValueRef::Text(text))),
    }
}

/// Bind a record's field `i` as parameter `at`: text as the slice of the record it is,
/// numbers as integers, hashes by [`bind_hash`].
fn bind_field(
    stmt: &mut Statement<'_>,
    at: usize,
    i: usize,
    v: Option<&[u8]>,
) -> Result<(), StoreError> {
    match v {
        None => stmt.raw_bind_parameter(at, rusqlite::types::Null)?,
        Some(b) if is_number(i) => stmt.raw_bind_parameter(at, digits(b)? as i64)?,
        Some(b) if is_hash(i) => bind_hash(stmt, at, b)?,
        Some(b) => stmt.raw_bind_parameter(at, ToSqlOutput::Borrowed(ValueRef::Text(b)))?,
    }
    Ok(())
}

/// The hash in column `i` as its `sha256:` text, stored as its 32 bytes or (rows written
/// before hashes were stored as bytes, and tags not in canonical form) as text.
fn hash_at(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<String> {
    match r.get_ref(i)? {
        ValueRef::Blob(b) => match <&[u8; 32]>::try_from(b) {
            Ok(digest) => Ok(Tag::of(digest).as_str().to_string()),
            // Not written by carapace: shown as what it is, so that `verify` names the row
            // (its hash cannot match) instead of stopping at it.
            Err(_) => Ok(format!("(a blob of {} bytes, not a hash)", b.len())),
        },
        _ => r.get(i),
    }
}

/// The rows, the new head and the spend of one batch, inside [`append`]'s transaction.
fn append_rows(conn: &Connection, records: &[Record]) -> Result<u64, StoreError> {
    let (mut seq, mut prev) = head(conn)?;
    let mut insert = conn.prepare_cached(
        "INSERT INTO invocations (seq, side, call_id, receipt_id, tool, consumer, provider,
            input_hash, output_hash, status, error_code, started_at, ended_at, duration_ms,
            receipt, charge, prev_hash, row_hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
    )?;
    // The previous row's digest, once known (the head's is read from its text).
    let mut prev_digest: Option<[u8; 32]> = None;
    for r in records {
        seq += 1;
        let digest = r.row_digest(seq, &prev);
        insert.raw_bind_parameter(1, seq as i64)?;
        let fields = r.fields();
        for (i, v) in fields.into_iter().enumerate() {
            bind_field(&mut insert, i + 2, i, v)?;
        }
        match prev_digest {
            Some(d) => insert.raw_bind_parameter(17, &d[..])?,
            None => bind_hash(&mut insert, 17, prev.as_bytes())?,
        }
        insert.raw_bind_parameter(18, &digest[..])?;
        prev_digest = Some(digest);
        insert.raw_execute()?;
        add_spend(conn, &fields)?;
        // The next row's `prev_hash`, in the string the head came in (no allocation).
        prev.clear();
        prev.push_str(Tag::of(&digest).as_str());
    }
    conn.prepare_cached("UPDATE chain SET head_seq = ?1, head_hash = ?2 WHERE id = 1")?
        .execute(params![seq as i64, prev])?;
    Ok(seq)
}

/// The UTC day of a Unix ms time, as the spend table names it.
pub fn day_of(unix_ms: u64) -> u64 {
    unix_ms / 86_400_000
}

/// What each consumer was charged, in total and per UTC day, kept with the rows: a record's
/// `fields` add its charge when it has one.
fn add_spend(conn: &Connection, f: &[Option<&[u8]>; FIELDS]) -> Result<(), StoreError> {
    // Inbound rows with a charge above 0: the side (0), the consumer (4), `started_at`
    // (10) and the charge (14).
    if f[0] != Some(b"inbound") {
        return Ok(());
    }
    let Some(charge) = number(f[14])?.filter(|c| *c > 0) else {
        return Ok(());
    };
    let started_at = number(f[10])?.ok_or(StoreError::Record)?;
    let consumer = f[4].ok_or(StoreError::Record)?;
    let day = format!("day:{}", day_of(started_at));
    let mut upsert = conn.prepare_cached(
        "INSERT INTO spend (consumer, period, amount) VALUES (?1, ?2, ?3)
         ON CONFLICT (consumer, period) DO UPDATE SET amount = amount + excluded.amount",
    )?;
    for period in ["total", day.as_str()] {
        upsert.execute(params![
            ToSqlOutput::Borrowed(ValueRef::Text(consumer)),
            period,
            charge as i64
        ])?;
    }
    Ok(())
}

/// Each consumer's spend: (consumer, total, spent on `day`).
pub fn spend(conn: &Connection, day: u64) -> Result<Vec<(String, u64, u64)>, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT consumer,
                SUM(CASE WHEN period = 'total' THEN amount ELSE 0 END),
                SUM(CASE WHEN period = ?1 THEN amount ELSE 0 END)
         FROM spend GROUP BY consumer",
    )?;
    let rows = stmt
        .query_map([format!("day:{day}")], |r| {
            Ok((
                r.get(0)?,
                r.get::<_, i64>(1)? as u64,
                r.get::<_, i64>(2)? as u64,
            ))
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// Remove rows that ended before `before_ms`, and the oldest beyond `max_rows`; the chain then
/// starts at the first row kept. Returns how many went.
pub fn retain(conn: &mut Connection, before_ms: u64, max_rows: u64) -> Result<usize, StoreError> {
    let tx = conn.transaction()?;
    let (head_seq, _) = head(&tx)?;
    let by_count = head_seq.saturating_sub(max_rows);
    let by_age = last_ended_before(&tx, before_ms)?;
    let through = by_count.max(by_age);
    let gone = tx.execute("DELETE FROM invocations WHERE seq <= ?1", [through as i64])?;
    if gone > 0 {
        let first: Option<(i64, String)> = tx
            .query_row(
                "SELECT seq, prev_hash FROM invocations ORDER BY seq LIMIT 1",
                [],
                |r| Ok((r.get(0)?, hash_at(r, 1)?)),
            )
            .optional()?;
        let (first_seq, first_prev) = match first {
            Some(f) => f,
            // Everything went: the chain starts after the head.
            None => {
                let (seq, hash) = head(&tx)?;
                (seq as i64 + 1, hash)
            }
        };
        tx.execute(
            "UPDATE chain SET first_seq = ?1, first_prev = ?2 WHERE id = 1",
            params![first_seq, first_prev],
        )?;
    }
    tx.commit()?;
    Ok(gone)
}

/// The last row (by seq) that ended before `before_ms`, 0 if none: a binary search over seq,
/// since rows are appended in the order calls end (no index to keep up on every write).
fn last_ended_before(tx: &rusqlite::Transaction<'_>, before_ms: u64) -> Result<u64, StoreError> {
    let ended = |seq: u64| -> Result<Option<u64>, StoreError> {
        Ok(tx
            .query_row(
                "SELECT ended_at FROM invocations WHERE seq >= ?1 ORDER BY seq LIMIT 1",
                [seq as i64],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
            .map(|v| v as u64))
    };
    let first: Option<i64> = tx
        .query_row("SELECT MIN(seq) FROM invocations", [], |r| r.get(0))
        .optional()?
        .flatten();
    let Some(first) = first else { return Ok(0) };
    let (mut lo, mut hi) = (first as u64, head(tx)?.0);
    if ended(lo)?.is_none_or(|e| e >= before_ms) {
        return Ok(0);
    }
    // Invariant: the row at or after `lo` ended before the cutoff; after `hi` none did.
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        match ended(mid)? {
            Some(e) if e < before_ms => lo = mid,
            _ => hi = mid - 1,
        }
    }
    Ok(lo)
}

fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let u = |i: usize| r.get::<_, i64>(i).map(|v| v as u64);
    Ok(Row {
        seq: u(0)?,
        entry: Entry {
            side: r.get(1)?,
            call_id: r.get(2)?,
            receipt_id: r.get(3)?,
            tool: r.get(4)?,
            consumer: r.get(5)?,
            provider: r.get(6)?,
            input_hash: hash_at(r, 7)?,
            output_hash: hash_at(r, 8)?,
            status: r.get(9)?,
            error_code: r.get(10)?,
            started_at: u(11)?,
            ended_at: u(12)?,
            duration_ms: u(13)?,
            receipt: r.get(14)?,
            charge: r.get::<_, Option<i64>>(15)?.map(|c| c as u64),
        },
        prev_hash: hash_at(r, 16)?,
        row_hash: hash_at(r, 17)?,
    })
}

const SELECT: &str = "SELECT seq, side, call_id, receipt_id, tool, consumer, provider, input_hash,
    output_hash, status, error_code, started_at, ended_at, duration_ms, receipt, charge,
    prev_hash, row_hash FROM invocations";

/// Every row from `from_seq` on, in order, to `each`.
pub fn scan(
    conn: &Connection,
    from_seq: u64,
    mut each: impl FnMut(Row) -> bool,
) -> Result<(), StoreError> {
    let mut stmt = conn.prepare(&format!("{SELECT} WHERE seq >= ?1 ORDER BY seq"))?;
    let mut rows = stmt.query([from_seq as i64])?;
    while let Some(r) = rows.next()? {
        if !each(read_row(r)?) {
            break;
        }
    }
    Ok(())
}

/// The last `n` rows, oldest first.
pub fn tail(conn: &Connection, n: u64) -> Result<Vec<Row>, StoreError> {
    let mut stmt = conn.prepare(&format!("{SELECT} ORDER BY seq DESC LIMIT ?1"))?;
    let mut rows: Vec<Row> = stmt
        .query_map([n as i64], read_row)?
        .collect::<Result<_, _>>()?;
    rows.reverse();
    Ok(rows)
}

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Break {
    /// Row `seq` was not found where the chain says a row is.
    Missing { seq: u64 },
    /// Row `seq`'s fields do not hash to its `row_hash`.
    Edited { seq: u64 },
    /// Row `seq` does not follow the row before it (`prev_hash`).
    Unlinked { seq: u64 },
    /// The chain's head names a row that is not the last one.
    Head { seq: u64 },
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Break::Missing { seq } => write!(f, "row {seq} is missing"),
            Break::Edited { seq } => write!(f, "row {seq} was changed (its hash does not match)"),
            Break::Unlinked { seq } => write!(f, "row {seq} does not follow the row before it"),
            Break::Head { seq } => write!(f, "the chain ends at row {seq}, the table does not"),
        }
    }
}

/// Walk the chain: every row is where it should be, hashes to its `row_hash` and follows the
/// one before. Returns the number of rows checked, or the first break.
pub fn verify(conn: &Connection) -> Result<Result<u64, Break>, StoreError> {
    let (first_seq, first_prev, head_seq, head_hash): (i64, String, i64, String) = conn.query_row(
        "SELECT first_seq, first_prev, head_seq, head_hash FROM chain WHERE id = 1",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    let (mut expect_seq, mut prev) = (first_seq as u64, first_prev);
    let mut found: Option<Break> = None;
    let mut checked = 0u64;
    scan(conn, 0, |row| {
        let broken = if row.seq != expect_seq {
            Some(Break::Missing { seq: expect_seq })
        } else if row.prev_hash != prev {
            Some(Break::Unlinked { seq: row.seq })
        } else if row_hash(row.seq, &row.entry, &row.prev_hash) != row.row_hash {
            Some(Break::Edited { seq: row.seq })
        } else {
            None
        };
        if broken.is_some() {
            found = broken;
            return false;
        }
        checked += 1;
        expect_seq += 1;
        prev = row.row_hash;
        true
    })?;
    if let Some(b) = found {
        return Ok(Err(b));
    }
    if expect_seq != head_seq as u64 + 1 {
        return Ok(Err(Break::Missing { seq: expect_seq }));
    }
    if prev != head_hash {
        return Ok(Err(Break::Head {
            seq: head_seq as u64,
        }));
    }
    Ok(Ok(checked))
}
