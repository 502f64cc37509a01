use super::journal::{encode_record, tmp_path, HEADER_LEN, MAGIC, RECORD_LEN};
use super::*;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Barrier};

const T0: u64 = 1_700_000_000_000;
const TTL: Duration = DEFAULT_TTL;
const TTL_MS: u64 = 300_000;

fn mem_store(capacity: usize) -> NonceStore {
    NonceStore::open(NonceStoreConfig::new(capacity), T0).unwrap()
}

fn journal_config(path: &Path, capacity: usize) -> NonceStoreConfig {
    NonceStoreConfig {
        capacity,
        ttl: TTL,
        journal: Some(path.to_path_buf()),
    }
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).unwrap().len()
}

/// Each of `nonces` (scope `k`) is refused as a replay at `now`.
fn assert_replayed(store: &NonceStore, nonces: &[&str], now: u64) {
    for n in nonces {
        assert!(
            matches!(store.check_and_insert("k", n, now), Err(NonceError::Replay)),
            "{n}"
        );
    }
}

/// The records of the journal at `path`: those before the zeros its file is allocated
/// ahead with (checked to hold nothing else).
fn records_in(path: &Path) -> u64 {
    let bytes = fs::read(path).unwrap();
    assert_eq!(&bytes[..8], MAGIC);
    let body = &bytes[HEADER_LEN..];
    let n = body
        .chunks(RECORD_LEN)
        .take_while(|r| r.len() == RECORD_LEN && r[8..] != [0; 4])
        .count();
    assert!(
        body[n * RECORD_LEN..].iter().all(|&b| b == 0),
        "only zeros after the records"
    );
    n as u64
}

struct FailingWriter;

impl Write for FailingWriter {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::other("disk on fire"))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn replay_refused_inside_ttl() {
    let store = mem_store(10);
    store.check_and_insert("k1", "n1", T0).unwrap();
    assert!(matches!(
        store.check_and_insert("k1", "n1", T0),
        Err(NonceError::Replay)
    ));
    assert!(matches!(
        store.check_and_insert("k1", "n1", T0 + TTL_MS - 1),
        Err(NonceError::Replay)
    ));
    assert_eq!(store.len(), 1);
}

#[test]
fn accepted_again_after_ttl() {
    let store = mem_store(10);
    store.check_and_insert("k1", "n1", T0).unwrap();
    // T0 is a whole second, so the expiry is exactly T0 + TTL.
    assert!(matches!(
        store.check_and_insert("k1", "n1", T0 + TTL_MS - 1),
        Err(NonceError::Replay)
    ));
    store.check_and_insert("k1", "n1", T0 + TTL_MS).unwrap();
    assert_eq!(store.len(), 1);
}

#[test]
fn expiry_is_rounded_up_never_down() {
    let store = mem_store(10);
    let now = T0 + 1_500;
    store.check_and_insert("k", "n", now).unwrap();
    // Deadline now + ttl = T0 + 301.5 s rounds up to T0 + 302 s.
    assert!(matches!(
        store.check_and_insert("k", "n", now + TTL_MS),
        Err(NonceError::Replay)
    ));
    assert!(matches!(
        store.check_and_insert("k", "n", T0 + 301_999),
        Err(NonceError::Replay)
    ));
    store.check_and_insert("k", "n", T0 + 302_000).unwrap();
}

#[test]
fn scopes_are_independent() {
    let store = mem_store(10);
    store.check_and_insert("scope-a", "n", T0).unwrap();
    store.check_and_insert("scope-b", "n", T0).unwrap();
    // Length prefixes: ("ab", "c") and ("a", "bc") are different entries.
    store.check_and_insert("ab", "c", T0).unwrap();
    store.check_and_insert("a", "bc", T0).unwrap();
    store.check_and_insert("", "abc", T0).unwrap();
    store.check_and_insert("abc", "", T0).unwrap();
    assert_eq!(store.len(), 6);
    assert!(matches!(
        store.check_and_insert("scope-b", "n", T0 + 1),
        Err(NonceError::Replay)
    ));
}

#[test]
fn full_store_refuses_without_evicting() {
    let store = mem_store(3);
    store.check_and_insert("k", "a", T0).unwrap();
    store.check_and_insert("k", "b", T0 + 10_000).unwrap();
    store.check_and_insert("k", "c", T0 + 20_000).unwrap();

    match store.check_and_insert("k", "d", T0 + 30_000) {
        Err(NonceError::Full { retry_after }) => {
            assert_eq!(retry_after, Duration::from_millis(TTL_MS - 30_000));
        }
        other => panic!("expected Full, got {other:?}"),
    }
    match store.check_and_insert("k", "d", T0 + TTL_MS - 1) {
        Err(NonceError::Full { retry_after }) => {
            assert_eq!(retry_after, Duration::from_millis(1));
        }
        other => panic!("expected Full, got {other:?}"),
    }
    // Nothing was evicted: all three are still refused as replays.
    for n in ["a", "b", "c"] {
        assert!(matches!(
            store.check_and_insert("k", n, T0 + TTL_MS - 1),
            Err(NonceError::Replay)
        ));
    }
    assert_eq!(store.len(), 3);

    // Refusals did not rescan the table: the earliest expiry is known.
    assert_eq!(store.lock().rescans, 0);
    for i in 0..100 {
        let _ = store.check_and_insert("k", &format!("x{i}"), T0 + 40_000);
    }
    assert_eq!(store.lock().rescans, 0);
}

#[test]
fn full_store_accepts_after_expiry() {
    let store = mem_store(3);
    store.check_and_insert("k", "a", T0).unwrap();
    store.check_and_insert("k", "b", T0 + 10_000).unwrap();
    store.check_and_insert("k", "c", T0 + 20_000).unwrap();
    assert!(matches!(
        store.check_and_insert("k", "d", T0 + 1),
        Err(NonceError::Full { .. })
    ));

    // "a" has expired: "d" takes over its slot (one table of 5 slots: "a" is on
    // every nonce's way), with no scan of the table.
    store.check_and_insert("k", "d", T0 + TTL_MS).unwrap();
    assert_eq!(store.len(), 3);
    assert_eq!(store.lock().rescans, 0);
    // Full again; "b" expires 10 s later.
    match store.check_and_insert("k", "e", T0 + TTL_MS) {
        Err(NonceError::Full { retry_after }) => {
            assert_eq!(retry_after, Duration::from_secs(10));
        }
        other => panic!("expected Full, got {other:?}"),
    }
    assert!(matches!(
        store.check_and_insert("k", "b", T0 + TTL_MS),
        Err(NonceError::Replay)
    ));
}

#[test]
fn purge_expired_counts_and_len() {
    let store = mem_store(10);
    assert!(store.is_empty());
    store.check_and_insert("k", "a", T0).unwrap();
    store.check_and_insert("k", "b", T0 + 60_000).unwrap();
    assert_eq!(store.purge_expired(T0 + TTL_MS - 1), 0);
    assert_eq!(store.purge_expired(T0 + TTL_MS), 1);
    assert_eq!(store.len(), 1);
    assert_eq!(store.purge_expired(T0 + TTL_MS + 60_000), 1);
    assert!(store.is_empty());
    assert_eq!(store.capacity(), 10);
}

#[test]
fn zero_capacity_is_rejected() {
    let err = NonceStore::open(NonceStoreConfig::new(0), T0).unwrap_err();
    assert!(matches!(err, NonceError::Journal(e) if e.kind() == io::ErrorKind::InvalidInput));
}

#[test]
fn one_journal_serves_one_store_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nonces.journal");
    let first = NonceStore::open(journal_config(&path, 100), T0).unwrap();
    let err = NonceStore::open(journal_config(&path, 100), T0).unwrap_err();
    assert!(
        matches!(&err, NonceError::Journal(e) if e.kind() == io::ErrorKind::WouldBlock),
        "{err:?}"
    );
    drop(first);
    NonceStore::open(journal_config(&path, 100), T0).unwrap();
}

#[test]
fn restart_keeps_live_nonces_and_compacts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nonces.journal");
    {
        let store = NonceStore::open(journal_config(&path, 100), T0).unwrap();
        store.check_and_insert("k", "old", T0).unwrap();
        store.check_and_insert("k", "live", T0 + 200_000).unwrap();
        assert_eq!(records_in(&path), 2);
    }
    // "old" expired at T0 + 300 s, "live" lives until T0 + 500 s.
    let now = T0 + 350_000;
    let store = NonceStore::open(journal_config(&path, 100), now).unwrap();
    assert_eq!(store.len(), 1, "the expired record must not be reloaded");
    assert_eq!(records_in(&path), 1, "compacted on open");
    assert!(!tmp_path(&path).exists());
    assert!(matches!(
        store.check_and_insert("k", "live", now),
        Err(NonceError::Replay)
    ));
    store.check_and_insert("k", "old", now).unwrap();
    assert_eq!(records_in(&path), 2);
    drop(store);

    // And a third generation still knows both.
    let store = NonceStore::open(journal_config(&path, 100), now + 1).unwrap();
    for n in ["live", "old"] {
        assert!(matches!(
            store.check_and_insert("k", n, now + 1),
            Err(NonceError::Replay)
        ));
    }
}

#[test]
fn torn_trailing_record_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nonces.journal");
    {
        let store = NonceStore::open(journal_config(&path, 100), T0).unwrap();
        store.check_and_insert("k", "a", T0).unwrap();
        store.check_and_insert("k", "b", T0).unwrap();
    }
    let len_before = file_len(&path);
    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(&[0xAB; 7]).unwrap();
    drop(file);
    assert_eq!(file_len(&path), len_before + 7);

    let store = NonceStore::open(journal_config(&path, 100), T0 + 1).unwrap();
    assert_eq!(store.len(), 2);
    assert_eq!(records_in(&path), 2);
    assert_replayed(&store, &["a", "b"], T0 + 1);
}

#[test]
fn journal_records_are_stored_into_its_mapped_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nonces.journal");
    let store = NonceStore::open(journal_config(&path, 100), T0).unwrap();
    store.check_and_insert("k", "a", T0).unwrap();
    assert_eq!(records_in(&path), 1);
    let mapped = super::tail::maps_on(&fs::File::open(&path).unwrap());
    assert_eq!(store.journal_is_mapped(), mapped);
    if mapped {
        // Allocated ahead of the records: one window from the start of the file.
        assert_eq!(file_len(&path), super::tail::WINDOW as u64);
    } else {
        eprintln!("the test directory's filesystem is not one the journal is mapped on");
    }
}

#[test]
fn where_the_file_is_not_mapped_records_are_written_after_the_last() {
    super::journal::REFUSE_MAP.with(|r| r.set(true));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nonces.journal");
    {
        let store = NonceStore::open(journal_config(&path, 100), T0).unwrap();
        assert!(!store.journal_is_mapped());
        store.check_and_insert("k", "a", T0).unwrap();
        store.check_and_insert("k", "b", T0).unwrap();
        // Nothing allocated ahead: each record right after the one before.
        assert_eq!(file_len(&path), (HEADER_LEN + 2 * RECORD_LEN) as u64);
    }
    let store = NonceStore::open(journal_config(&path, 100), T0 + 1).unwrap();
    assert_eq!(store.len(), 2);
    assert_replayed(&store, &["a", "b"], T0 + 1);
    store.check_and_insert("k", "c", T0 + 1).unwrap();
    assert_eq!(file_len(&path), (HEADER_LEN + 3 * RECORD_LEN) as u64);
    super::journal::REFUSE_MAP.with(|r| r.set(false));
}

#[test]
fn records_past_one_mapped_window_all_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nonces.journal");
    let n = 2 * super::tail::WINDOW / RECORD_LEN + 5;
    {
        let store = NonceStore::open(journal_config(&path, 100_000), T0).unwrap();
        for i in 0..n {
            store.check_and_insert("k", &format!("n{i}"), T0).unwrap();
        }
        assert_eq!(records_in(&path), n as u64);
    }
    let store = NonceStore::open(journal_config(&path, 100_000), T0 + 1).unwrap();
    assert_eq!(store.len(), n);
    for i in [0, 1, n / 2, n - 1] {
        assert!(matches!(
            store.check_and_insert("k", &format!("n{i}"), T0 + 1),
            Err(NonceError::Replay)
        ));
    }
    assert_eq!(records_in(&path), n as u64, "compacted on open");
}

#[test]
fn a_record_cut_short_in_the_mapped_tail_is_not_live() {
    use std::io::{Seek, SeekFrom};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nonces.journal");
    {
        let store = NonceStore::open(journal_config(&path, 100), T0).unwrap();
        store.check_and_insert("k", "a", T0).unwrap();
        store.check_and_insert("k", "b", T0).unwrap();
    }
    // A crash after the third record's hash was stored, before its expiry.
    let mut file = OpenOptions::new().write(true).open(&path).unwrap();
    let third = (HEADER_LEN + 2 * RECORD_LEN) as u64;
    file.seek(SeekFrom::Start(third)).unwrap();
    file.write_all(&[0xAB; 8]).unwrap();
    drop(file);

    let store = NonceStore::open(journal_config(&path, 100), T0 + 1).unwrap();
    assert_eq!(store.len(), 2);
    assert_eq!(records_in(&path), 2);
    store.check_and_insert("k", "c", T0 + 1).unwrap();
}

#[test]
fn bad_magic_or_truncated_header_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nonces.journal");
    let mut bad = b"XNONCE01".to_vec();
    bad.extend_from_slice(&[0u8; 16]);
    bad.extend_from_slice(&encode_record(1, u32::MAX));
    for contents in [bad, b"CNONCE01\0\0\0".to_vec(), Vec::new()] {
        fs::write(&path, &contents).unwrap();
        let err = NonceStore::open(journal_config(&path, 100), T0).unwrap_err();
        assert!(
            matches!(&err, NonceError::Journal(e) if e.kind() == io::ErrorKind::InvalidData),
            "{err:?}"
        );
        // The corrupt file is left alone for inspection.
        assert_eq!(fs::read(&path).unwrap(), contents);
    }
}

#[test]
fn journal_write_failure_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nonces.journal");
    let store = NonceStore::open(journal_config(&path, 100), T0).unwrap();
    store.check_and_insert("k", "a", T0).unwrap();

    store.set_journal_writer(Box::new(FailingWriter));
    let err = store.check_and_insert("k", "b", T0).unwrap_err();
    assert!(matches!(err, NonceError::Journal(_)), "{err:?}");
    assert_eq!(store.len(), 1, "the failed insert was rolled back");

    // Not recorded: the next attempt is not a replay. It first rewrites
    // the journal (the failed write may have torn a record), then appends.
    store.check_and_insert("k", "b", T0).unwrap();
    assert_eq!(records_in(&path), 2);
    drop(store);

    let store = NonceStore::open(journal_config(&path, 100), T0 + 1).unwrap();
    assert_eq!(store.len(), 2);
    assert_replayed(&store, &["a", "b"], T0 + 1);
}

#[test]
fn journal_that_cannot_be_repaired_keeps_failing_closed() {
    let dir = tempfile::tempdir().unwrap();
    let jdir = dir.path().join("j");
    let path = jdir.join("nonces.journal");
    let store = NonceStore::open(journal_config(&path, 100), T0).unwrap();
    store.check_and_insert("k", "a", T0).unwrap();

    store.set_journal_writer(Box::new(FailingWriter));
    fs::remove_dir_all(&jdir).unwrap();
    for _ in 0..3 {
        let err = store.check_and_insert("k", "b", T0).unwrap_err();
        assert!(matches!(err, NonceError::Journal(_)), "{err:?}");
    }
    assert_eq!(store.len(), 1);
    // Replays are still detected from memory.
    assert!(matches!(
        store.check_and_insert("k", "a", T0),
        Err(NonceError::Replay)
    ));
}

#[test]
fn journal_is_compacted_while_running() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nonces.journal");
    let config = NonceStoreConfig {
        capacity: 2,
        ttl: Duration::from_secs(1),
        journal: Some(path.clone()),
    };
    let store = NonceStore::open(config, T0).unwrap();
    // One nonce every 2 s: each has expired when the next arrives.
    for i in 0..4u64 {
        store
            .check_and_insert("k", &format!("n{i}"), T0 + i * 2_000)
            .unwrap();
        assert_eq!(records_in(&path), i + 1);
    }
    // The fifth record exceeds 2 * capacity: the file is rewritten with
    // the one live entry.
    store.check_and_insert("k", "n4", T0 + 8_000).unwrap();
    assert_eq!(records_in(&path), 1);
    assert_eq!(store.len(), 1);
    store.check_and_insert("k", "n5", T0 + 8_000).unwrap();
    assert_eq!(records_in(&path), 2);
    drop(store);

    let config = NonceStoreConfig {
        capacity: 2,
        ttl: Duration::from_secs(1),
        journal: Some(path.clone()),
    };
    let store = NonceStore::open(config, T0 + 8_500).unwrap();
    assert!(matches!(
        store.check_and_insert("k", "n5", T0 + 8_500),
        Err(NonceError::Replay)
    ));
}

#[test]
fn journal_file_mode_is_0600_and_new_dirs_0700() {
    let dir = tempfile::tempdir().unwrap();
    let jdir = dir.path().join("state").join("nonces");
    let path = jdir.join("nonces.journal");
    let store = NonceStore::open(journal_config(&path, 10), T0).unwrap();
    store.check_and_insert("k", "a", T0).unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&jdir), 0o700);
    assert_eq!(mode(jdir.parent().unwrap()), 0o700);
    drop(store);
    // Still 0600 after the compaction of a reopen.
    let _store = NonceStore::open(journal_config(&path, 10), T0 + 1).unwrap();
    assert_eq!(mode(&path), 0o600);
    assert_eq!(records_in(&path), 1);
}

#[test]
fn concurrent_inserts_of_one_nonce_accept_exactly_one() {
    let store = Arc::new(mem_store(100));
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let store = Arc::clone(&store);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                store.check_and_insert("k", "same", T0)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert_eq!(
        results
            .iter()
            .filter(|r| matches!(r, Err(NonceError::Replay)))
            .count(),
        7
    );
    assert_eq!(store.len(), 1);
}

#[test]
fn bytes_per_entry_at_most_32() {
    for capacity in [1_000, 100_000, 1_000_000] {
        let store = mem_store(capacity);
        let bytes = store.bytes_per_entry_upper_bound();
        assert!(bytes <= 32.0, "capacity {capacity}: {bytes} bytes/entry");
    }
    // Filled to the brim, the table is the one the bound was computed
    // for, and a refused nonce does not make it grow.
    let store = mem_store(100_000);
    for i in 0..100_000 {
        store.check_and_insert("k", &i.to_string(), T0).unwrap();
    }
    let full = store.table_bytes();
    assert_eq!(full, table::bytes_for(100_000));
    assert!(full as f64 / 100_000.0 <= 32.0);
    assert!(matches!(
        store.check_and_insert("k", "one more", T0),
        Err(NonceError::Full { .. })
    ));
    assert_eq!(store.table_bytes(), full);
}

#[test]
fn an_idle_store_is_small_whatever_its_capacity() {
    let store = mem_store(1_000_000);
    assert!(store.table_bytes() <= table::bytes_for(INITIAL_TABLE_CAPACITY));
    assert!(store.table_bytes() < 128 * 1024, "{}", store.table_bytes());
    assert_eq!(mem_store(10).table_bytes(), table::bytes_for(10));
}

#[test]
fn the_table_follows_the_live_set_not_the_total() {
    // 1,000 nonces a second for 100 s with a 10 s TTL: at most 11,000
    // live at once (expiries round up), 100,000 accepted in all.
    let config = NonceStoreConfig {
        ttl: Duration::from_secs(10),
        ..NonceStoreConfig::new(1_000_000)
    };
    let store = NonceStore::open(config, T0).unwrap();
    let mut peak_len = 0;
    for i in 0..100_000u64 {
        let now = T0 + i;
        store.check_and_insert("k", &i.to_string(), now).unwrap();
        peak_len = peak_len.max(store.len());
    }
    let table = store.lock().table.capacity();
    // Never sized for the 100,000 accepted: at most one doubling above
    // the 4/3 x live set that triggers growth.
    assert!(table >= 11_000, "{table}");
    assert!(table <= 2 * 11_000 * 4 / 3, "{table}");
    assert!(peak_len <= table, "{peak_len} {table}");
    // Purges are amortised: each one is at least a quarter table apart.
    let rescans = store.lock().rescans;
    assert!(rescans <= 100_000 / (8_192 / 4), "{rescans} purges");
    // Every live nonce is still refused.
    for i in 100_000 - 9_000..100_000u64 {
        assert!(matches!(
            store.check_and_insert("k", &i.to_string(), T0 + 100_000),
            Err(NonceError::Replay)
        ));
    }
}

#[test]
fn growth_stops_at_the_table_capacity_entries_need() {
    let store = mem_store(20_000);
    for i in 0..20_000 {
        store.check_and_insert("k", &i.to_string(), T0).unwrap();
    }
    assert_eq!(store.table_bytes(), table::bytes_for(20_000));
    assert!(store.lock().table.capacity() < 2 * 20_000);
}

#[test]
fn a_key_made_ahead_records_nothing_until_it_is_checked() {
    let store = mem_store(100_000);
    let key = store.key("k", "n1");
    assert_eq!(key, store.key("k", "n1"));
    assert_ne!(key, store.key("k2", "n1"));
    assert_ne!(key, store.key("k", "n2"));
    assert_eq!(store.len(), 0);
    assert!(store.check_and_insert("k", "n1", T0).is_ok());
    assert!(store.check_and_insert("k", "n2", T0).is_ok());

    // The table is replaced (it grows) between a key and its check.
    let ahead = store.key("k", "n3");
    for i in 0..10_000 {
        store.check_and_insert("k", &format!("g{i}"), T0).unwrap();
    }
    assert!(store.lock().table.capacity() > INITIAL_TABLE_CAPACITY);
    store.check_and_insert_key(ahead, T0).unwrap();
    assert!(matches!(
        store.check_and_insert("k", "n3", T0),
        Err(NonceError::Replay)
    ));
    assert!(matches!(
        store.check_and_insert_key(key, T0 + 1),
        Err(NonceError::Replay)
    ));
}

#[test]
fn live_after_agrees_with_is_live() {
    for now in [
        0,
        1,
        999,
        1000,
        1001,
        T0,
        T0 + 999,
        T0 + 1000,
        u64::MAX / 2,
        u64::MAX,
    ] {
        let cut = live_after(now);
        for e in [
            0,
            1,
            cut.saturating_sub(1),
            cut,
            cut.saturating_add(1),
            u32::MAX,
        ] {
            assert_eq!(is_live(e, now), e > cut, "expiry {e} at {now}");
        }
    }
}
