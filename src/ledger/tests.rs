use super::record::Ending;
use super::store::*;
use super::*;

fn entry(n: u64) -> Entry {
    Entry {
        side: "inbound".into(),
        call_id: format!("c{n}"),
        receipt_id: None,
        tool: "memory.query".into(),
        consumer: "gw_home".into(),
        provider: "memory-east".into(),
        input_hash: crate::receipts::value_hash(&serde_json::json!({"n": n})),
        output_hash: crate::receipts::value_hash(&serde_json::Value::Null),
        status: "ok".into(),
        error_code: None,
        started_at: 1_000 * n,
        ended_at: 1_000 * n + 5,
        duration_ms: 5,
        receipt: None,
        charge: None,
    }
}

fn rec(n: u64) -> Record {
    Record::of(&entry(n))
}

fn ledger_with(n: u64) -> (tempfile::TempDir, rusqlite::Connection) {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = open(&dir.path().join("l.sqlite3")).unwrap();
    let entries: Vec<Record> = (1..=n).map(rec).collect();
    for chunk in entries.chunks(3) {
        append(&mut conn, chunk).unwrap();
    }
    (dir, conn)
}

#[test]
fn an_intact_chain_verifies_and_continues_across_batches() {
    let (_d, conn) = ledger_with(10);
    assert_eq!(verify(&conn).unwrap(), Ok(10));
    let rows = tail(&conn, 3).unwrap();
    assert_eq!(rows.iter().map(|r| r.seq).collect::<Vec<_>>(), [8, 9, 10]);
    assert_eq!(rows[1].prev_hash, rows[0].row_hash);
    let (_d, empty) = ledger_with(0);
    assert_eq!(verify(&empty).unwrap(), Ok(0));
}

/// A row with every field present.
fn full_entry() -> Entry {
    Entry {
        side: "inbound".into(),
        call_id: "c42".into(),
        receipt_id: Some("rcpt_1".into()),
        tool: "memory.query".into(),
        consumer: "gw_home".into(),
        provider: "memory-east".into(),
        input_hash: format!("sha256:{}", "11".repeat(32)),
        output_hash: format!("sha256:{}", "22".repeat(32)),
        status: "error".into(),
        error_code: Some("APP_ERROR".into()),
        started_at: 1_764_000_000_000,
        ended_at: 1_764_000_000_005,
        duration_ms: 5,
        receipt: Some("v1.x.y".into()),
        charge: Some(7),
    }
}

/// The row hash is the form the README documents (computed apart from this code), so files
/// written by any version verify: every field present, and every optional one absent.
#[test]
fn the_row_hash_is_the_documented_form() {
    let prev = format!("sha256:{}", "ab".repeat(32));
    let full = full_entry();
    assert_eq!(
        row_hash(42, &full, &prev),
        "sha256:51fd66aedd21214fb9b4c6878df60f6fad878cfc21e56a2c189d303c963da91a"
    );
    let sparse = Entry {
        side: "outbound".into(),
        call_id: "c1".into(),
        receipt_id: None,
        tool: "t".into(),
        consumer: "me".into(),
        provider: "peer".into(),
        status: "ok".into(),
        error_code: None,
        started_at: 0,
        ended_at: u64::MAX,
        duration_ms: 0,
        receipt: None,
        charge: None,
        ..full
    };
    assert_eq!(
        row_hash(1, &sparse, &prev),
        "sha256:c6081bce8b67532686edcb8c20c405610e8700f919e877bf8bb24c3122348bd2"
    );
}

fn page_size(conn: &rusqlite::Connection) -> i64 {
    conn.pragma_query_value(None, "page_size", |r| r.get(0))
        .unwrap()
}

/// A new file is made with the ledger's page size; a file made before (SQLite's 4 KiB pages)
/// keeps its own, and its chain goes on.
#[test]
fn a_new_ledger_has_large_pages_and_an_older_file_keeps_its_own() {
    let (_d, conn) = ledger_with(1);
    assert_eq!(page_size(&conn), PAGE_SIZE);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.sqlite3");
    {
        let old = rusqlite::Connection::open(&path).unwrap();
        old.pragma_update(None, "page_size", 4096).unwrap();
        old.pragma_update(None, "journal_mode", "WAL").unwrap();
    }
    let mut conn = open(&path).unwrap();
    append(&mut conn, &[rec(1), rec(2)]).unwrap();
    drop(conn);
    let mut conn = open(&path).unwrap();
    assert_eq!(page_size(&conn), 4096);
    append(&mut conn, &[rec(3)]).unwrap();
    assert_eq!(verify(&conn).unwrap(), Ok(3));
}

#[test]
fn an_edited_deleted_or_truncated_row_is_found() {
    let (_d, conn) = ledger_with(10);
    conn.execute("UPDATE invocations SET status = 'error' WHERE seq = 4", [])
        .unwrap();
    assert_eq!(verify(&conn).unwrap(), Err(Break::Edited { seq: 4 }));

    let (_d, conn) = ledger_with(10);
    conn.execute("DELETE FROM invocations WHERE seq = 6", [])
        .unwrap();
    assert_eq!(verify(&conn).unwrap(), Err(Break::Missing { seq: 6 }));

    // Deleting a row and renumbering the rest so that no seq is missing: the links break.
    let (_d, conn) = ledger_with(10);
    conn.execute_batch(
        "DELETE FROM invocations WHERE seq = 6; UPDATE invocations SET seq = seq - 1 WHERE seq > 6;
         UPDATE chain SET head_seq = 9",
    )
    .unwrap();
    assert!(verify(&conn).unwrap().is_err());

    // The newest row, and the oldest, removed.
    let (_d, conn) = ledger_with(10);
    conn.execute("DELETE FROM invocations WHERE seq = 10", [])
        .unwrap();
    assert_eq!(verify(&conn).unwrap(), Err(Break::Missing { seq: 10 }));
    let (_d, conn) = ledger_with(10);
    conn.execute("DELETE FROM invocations WHERE seq = 1", [])
        .unwrap();
    assert_eq!(verify(&conn).unwrap(), Err(Break::Missing { seq: 1 }));

    // A row's hash recomputed after an edit no longer links to the next one.
    let (_d, conn) = ledger_with(10);
    let mut row = tail(&conn, 10).unwrap()[2].clone();
    row.entry.tool = "memory.delete".into();
    let forged = row_hash(row.seq, &row.entry, &row.prev_hash);
    conn.execute(
        "UPDATE invocations SET tool = 'memory.delete', row_hash = ?1 WHERE seq = 3",
        [forged],
    )
    .unwrap();
    assert_eq!(verify(&conn).unwrap(), Err(Break::Unlinked { seq: 4 }));
}

#[test]
fn a_batch_that_fails_is_not_written_and_the_next_one_is() {
    let (_d, mut conn) = ledger_with(3);
    // A stray row where the batch's second row goes: the batch fails at that row.
    conn.execute_batch(
        "INSERT INTO invocations SELECT seq + 2, side, call_id, receipt_id, tool, consumer,
            provider, input_hash, output_hash, status, error_code, started_at, ended_at,
            duration_ms, receipt, charge, prev_hash, row_hash FROM invocations WHERE seq = 3",
    )
    .unwrap();
    assert!(append(&mut conn, &[rec(4), rec(5)]).is_err());
    // Nothing of it stayed: not its first row, not the head.
    let rows: i64 = conn
        .query_row("SELECT COUNT(*) FROM invocations WHERE seq = 4", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(rows, 0);
    assert_eq!(head(&conn).unwrap().0, 3);
    // The transaction was closed: once the stray row is gone, batches are written again.
    conn.execute("DELETE FROM invocations WHERE seq = 5", [])
        .unwrap();
    assert_eq!(append(&mut conn, &[rec(4), rec(5)]).unwrap(), 5);
    assert_eq!(verify(&conn).unwrap(), Ok(5));
}

#[test]
fn retention_keeps_the_chain_verifiable() {
    let (_d, mut conn) = ledger_with(10);
    // By count: the 4 newest stay.
    assert_eq!(retain(&mut conn, 0, 4).unwrap(), 6);
    assert_eq!(verify(&conn).unwrap(), Ok(4));
    append(&mut conn, &[rec(11)]).unwrap();
    assert_eq!(verify(&conn).unwrap(), Ok(5));
    // By age: rows that ended before 9.5 s (7, 8 and 9) go.
    assert_eq!(retain(&mut conn, 9_500, 100).unwrap(), 3);
    assert_eq!(verify(&conn).unwrap(), Ok(2));
    // Everything.
    assert_eq!(retain(&mut conn, u64::MAX / 2, 100).unwrap(), 2);
    assert_eq!(verify(&conn).unwrap(), Ok(0));
    append(&mut conn, &[rec(12)]).unwrap();
    assert_eq!(verify(&conn).unwrap(), Ok(1));
}

#[tokio::test]
async fn the_writer_batches_what_queued_up_and_a_full_queue_drops_or_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.sqlite3");
    let cfg = LedgerConfig {
        queue: 4,
        ..Default::default()
    };
    let ledger = Ledger::open(&path, &cfg, Arc::default()).unwrap();
    for n in 1..=3 {
        ledger.record(rec(n), None);
    }
    let written = ledger.counters.clone();
    crate::ledger::tests::wait(|| written.written.get() == 3).await;
    let conn = open_read_only(&path).unwrap();
    assert_eq!(verify(&conn).unwrap(), Ok(3));

    let refusing = Ledger::open(
        &dir.path().join("r.sqlite3"),
        &LedgerConfig {
            queue: 1,
            on_full: LedgerFull::Refuse,
            ..Default::default()
        },
        Arc::default(),
    )
    .unwrap();
    let held = refusing.reserve().unwrap();
    assert!(held.is_some());
    assert!(refusing.reserve().is_err());
    assert_eq!(refusing.counters.refused.get(), 1);
    refusing.record(rec(1), held);
}

pub(crate) async fn wait(cond: impl Fn() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 5 s");
}

/// Whichever way a call's input hash comes (at the start, from the receipt at the end, or
/// from the receipt in place of the start's), the record is the entry's.
#[test]
fn a_record_written_in_two_steps_is_the_entrys() {
    let e = full_entry();
    let of = Record::of(&e);
    let at_start = Record::started(&e, Some(&e.input_hash)).end(Ending::of(&e, None));
    assert_eq!(at_start, of);
    let receipts = format!("sha256:{}", "33".repeat(32));
    let replaced = Record::started(&e, Some(&e.input_hash)).end(Ending::of(&e, Some(&receipts)));
    let mut from_receipt = e.clone();
    from_receipt.input_hash = receipts;
    assert_eq!(replaced, Record::of(&from_receipt));
    // Neither had one: an empty hash, as the entry had before.
    let none = Record::started(&e, None).end(Ending::of(&e, None));
    let mut empty = e.clone();
    empty.input_hash = String::new();
    assert_eq!(none, Record::of(&empty));
}

#[test]
fn its_fields_are_the_entrys_in_table_order() {
    let mut e = full_entry();
    let f = Record::of(&e)
        .fields()
        .map(|v| v.map(|b| String::from_utf8(b.to_vec()).unwrap()));
    assert_eq!(f[0].as_deref(), Some("inbound"));
    assert_eq!(f[2].as_deref(), Some("rcpt_1"));
    assert_eq!(f[6], Some(e.input_hash.clone()));
    assert_eq!(f[10].as_deref(), Some("1764000000000"));
    assert_eq!(f[13].as_deref(), Some("v1.x.y"));
    assert_eq!(f[14].as_deref(), Some("7"));
    (e.receipt_id, e.error_code, e.receipt, e.charge) = (None, None, None, None);
    let sparse = Record::of(&e);
    let f = sparse.fields();
    assert_eq!([f[2], f[9], f[13], f[14]], [None; 4]);
    assert_eq!(f[3], Some(&b"memory.query"[..]));
}

/// What each row's four hashes are stored as: `typeof` and `length` of each.
fn stored_hashes(conn: &rusqlite::Connection) -> Vec<Vec<(String, i64)>> {
    let cols = ["input_hash", "output_hash", "prev_hash", "row_hash"];
    let sql = format!(
        "SELECT {} FROM invocations ORDER BY seq",
        cols.map(|c| format!("typeof({c}), length({c})")).join(", ")
    );
    let mut stmt = conn.prepare(&sql).unwrap();
    stmt.query_map([], |r| {
        (0..4)
            .map(|i| Ok((r.get(2 * i)?, r.get(2 * i + 1)?)))
            .collect()
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// A row's hashes are stored as their 32 bytes, and read back as the `sha256:` text the
/// entry had: the rows are about half as large, the chain and what `tail` shows unchanged.
#[test]
fn hashes_are_stored_as_their_bytes_and_read_back_as_text() {
    let (_d, conn) = ledger_with(4);
    let blob = ("blob".to_string(), 32);
    assert_eq!(stored_hashes(&conn), vec![vec![blob; 4]; 4]);
    let rows = tail(&conn, 4).unwrap();
    for (n, row) in (1..).zip(&rows) {
        assert_eq!(row.entry, entry(n));
        assert!(row.row_hash.starts_with("sha256:") && row.row_hash.len() == 71);
    }
    assert_eq!(rows[0].prev_hash, GENESIS);
    assert_eq!(rows[3].prev_hash, rows[2].row_hash);
    assert_eq!(verify(&conn).unwrap(), Ok(4));
}

/// A hash that is not a canonical tag (none at all, or hex in capitals) is stored as the
/// text it is, so it reads back unchanged and its row verifies.
#[test]
fn a_hash_not_in_canonical_form_is_stored_as_text() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = open(&dir.path().join("l.sqlite3")).unwrap();
    let mut none = entry(1);
    none.input_hash = String::new();
    let mut capitals = entry(2);
    capitals.output_hash = format!("sha256:{}", "AB".repeat(32));
    let mut short = entry(3);
    short.output_hash = "sha256:abcd".into();
    append(
        &mut conn,
        &[none.clone(), capitals.clone(), short.clone()].map(|e| Record::of(&e)),
    )
    .unwrap();
    let stored = stored_hashes(&conn);
    assert_eq!(stored[0][0], ("text".to_string(), 0));
    assert_eq!(stored[1][1], ("text".to_string(), 71));
    assert_eq!(stored[2][1], ("text".to_string(), 11));
    let rows = tail(&conn, 3).unwrap();
    let read: Vec<Entry> = rows.into_iter().map(|r| r.entry).collect();
    assert_eq!(read, [none, capitals, short]);
    assert_eq!(verify(&conn).unwrap(), Ok(3));
}

/// A file whose rows hold their hashes as text (as files written before did) verifies and
/// reads as it did, and its chain goes on with rows that hold bytes; a stored blob of the
/// wrong size is shown as such and its row named by `verify`.
#[test]
fn rows_with_text_hashes_verify_and_the_chain_goes_on() {
    let (_d, mut conn) = ledger_with(3);
    let before = tail(&conn, 3).unwrap();
    conn.execute_batch(
        "UPDATE invocations SET input_hash = 'sha256:' || lower(hex(input_hash)),
            output_hash = 'sha256:' || lower(hex(output_hash)),
            prev_hash = 'sha256:' || lower(hex(prev_hash)),
            row_hash = 'sha256:' || lower(hex(row_hash))",
    )
    .unwrap();
    assert_eq!(stored_hashes(&conn)[2][3], ("text".to_string(), 71));
    assert_eq!(tail(&conn, 3).unwrap(), before);
    assert_eq!(verify(&conn).unwrap(), Ok(3));
    append(&mut conn, &[rec(4), rec(5)]).unwrap();
    assert_eq!(stored_hashes(&conn)[3][2], ("blob".to_string(), 32));
    assert_eq!(verify(&conn).unwrap(), Ok(5));
    // Retention starts the chain at a row whose `prev_hash` is text.
    assert_eq!(retain(&mut conn, 0, 3).unwrap(), 2);
    assert_eq!(verify(&conn).unwrap(), Ok(3));

    conn.execute(
        "UPDATE invocations SET output_hash = x'00' WHERE seq = 5",
        [],
    )
    .unwrap();
    assert_eq!(
        tail(&conn, 1).unwrap()[0].entry.output_hash,
        "(a blob of 1 bytes, not a hash)"
    );
    assert_eq!(verify(&conn).unwrap(), Err(Break::Edited { seq: 5 }));
}

/// The queue holds at most its places: records pushed and places reserved; a place reserved
/// and not used comes back, and the writer's take gives back every place it took, in order.
#[test]
fn the_queue_counts_records_and_reserved_places_and_takes_them_in_order() {
    let q = super::queue::RecordQueue::new(3);
    assert!(q.push(rec(1)));
    let place = q.reserve().expect("a second place");
    let unused = q.reserve().expect("a third place");
    assert!(q.reserve().is_none() && !q.push(rec(9)), "full");
    drop(unused);
    assert!(q.push(rec(3)));
    assert!(!q.push(rec(9)));
    place.fill(rec(2));
    let mut taken = Vec::new();
    q.take(&mut taken);
    assert_eq!(taken, [rec(1), rec(3), rec(2)]);
    // Every place is free again.
    let mut again = Vec::new();
    for n in 4..=6 {
        assert!(q.push(rec(n)));
    }
    assert!(!q.push(rec(9)));
    q.take(&mut again);
    assert_eq!(again, [rec(4), rec(5), rec(6)]);
    assert!(!q.is_closed());
    q.close();
    assert!(q.is_closed());
}

/// A ledger dropped (carapace stopping) has its writer write what was queued, then end.
#[tokio::test]
async fn what_was_queued_when_the_ledger_closes_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.sqlite3");
    let ledger = Ledger::open(&path, &LedgerConfig::default(), Arc::default()).unwrap();
    let written = ledger.counters.clone();
    for n in 1..=5 {
        ledger.record(rec(n), None);
    }
    drop(ledger);
    wait(|| written.written.get() == 5).await;
    let conn = open_read_only(&path).unwrap();
    assert_eq!(verify(&conn).unwrap(), Ok(5));
}
