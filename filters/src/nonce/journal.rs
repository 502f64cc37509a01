//! The append-only journal file of a [`NonceStore`](super::NonceStore): its header and record
//! encoding, loading, rewriting (compaction), locking and directory syncing. The format is
//! described in the [module docs](super).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::is_live;
use super::table::Table;
use super::tail::MappedTail;

/// Magic at the start of a journal file (the version is part of it).
pub(super) const MAGIC: &[u8; 8] = b"CNONCE01";
/// Magic + 16-byte SipHash key.
pub(super) const HEADER_LEN: usize = 8 + 16;
/// u64 hash + u32 expiry.
pub(super) const RECORD_LEN: usize = 12;

/// The open journal file and its bookkeeping.
pub(super) struct Journal {
    pub(super) path: PathBuf,
    /// The SipHash key, written into every rewritten header.
    pub(super) key: [u8; 16],
    pub(super) appender: Appender,
    /// Records in the file (after the header).
    pub(super) records: u64,
    /// Compact once `records` exceeds this.
    pub(super) compact_above: u64,
    /// A failed `write` may have left a partial record: rewrite the file from
    /// memory before appending again.
    pub(super) dirty: bool,
    /// Exclusive lock on `<path>.lock`, held while the store lives: two processes
    /// appending to one journal would each miss the other's nonces.
    pub(super) _lock: File,
}

impl Journal {
    /// Appends one record, after repairing the file if an earlier append
    /// failed. On error nothing may be recorded in memory.
    pub(super) fn append(
        &mut self,
        key: u64,
        expiry: u32,
        map: &Table,
        now_ms: u64,
    ) -> io::Result<()> {
        if self.dirty {
            let live = map.iter().filter(|&(_, e)| is_live(e, now_ms));
            let (file, records) = rewrite_journal(&self.path, &self.key, live)?;
            self.install(file, records);
        }
        let record = encode_record(key, expiry);
        let appended = match &mut self.appender {
            // An error there comes before anything is stored: nothing to repair.
            Appender::Mapped(tail) => tail.append(&record),
            Appender::Written(writer) => {
                let written = writer.write_all(&record).and_then(|()| writer.flush());
                self.dirty = written.is_err();
                written
            }
        };
        appended.map(|()| self.records += 1)
    }

    /// Rewrites the file from `map` (already purged). On failure the current
    /// file stays in use and compaction is retried `capacity` appends later.
    pub(super) fn compact(&mut self, map: &Table, capacity: usize) {
        match rewrite_journal(&self.path, &self.key, map.iter()) {
            Ok((file, records)) => {
                self.install(file, records);
                self.compact_above = compact_threshold(capacity);
            }
            Err(_) => {
                self.compact_above = self
                    .records
                    .saturating_add(capacity as u64)
                    .max(compact_threshold(capacity));
            }
        }
    }

    fn install(&mut self, file: File, records: u64) {
        self.appender = Appender::for_file(file, records);
        self.records = records;
        self.dirty = false;
        // The rename is done; an fsync failure of the directory only weakens
        // durability against power loss, the new file is the one in use.
        let _ = sync_parent_dir(&self.path);
    }
}

/// Where a journal's records are appended.
pub(super) enum Appender {
    /// Stored into the mapped tail of the file ([`super::tail`]): no system call per record.
    Mapped(MappedTail),
    /// One `write` per record: where the file cannot be mapped (and in tests that make
    /// writes fail).
    Written(Box<dyn Write + Send>),
}

impl Appender {
    /// The appender of a journal file holding the header and `records` records, open for
    /// reading and writing at its end: its tail mapped, or `write` where that fails.
    pub(super) fn for_file(file: File, records: u64) -> Self {
        let end = HEADER_LEN as u64 + records * RECORD_LEN as u64;
        let mapped = match map_refused_here() {
            true => Err(io::Error::from(io::ErrorKind::Unsupported)),
            false => file.try_clone().and_then(|f| MappedTail::new(f, end)),
        };
        match mapped {
            Ok(tail) => Appender::Mapped(tail),
            Err(e) => {
                match e.kind() {
                    io::ErrorKind::Unsupported => {
                        tracing::debug!("nonce journal: appending with write ({e})")
                    }
                    _ => tracing::warn!(
                        "nonce journal: cannot map the file ({e}); appending with write"
                    ),
                }
                Appender::Written(Box::new(file))
            }
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Set by a test: journals opened on its thread append with `write`.
    pub(super) static REFUSE_MAP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn map_refused_here() -> bool {
    #[cfg(test)]
    return REFUSE_MAP.with(|r| r.get());
    #[cfg(not(test))]
    false
}

pub(super) fn compact_threshold(capacity: usize) -> u64 {
    (capacity as u64).saturating_mul(2)
}

pub(super) fn encode_record(hash: u64, expiry: u32) -> [u8; RECORD_LEN] {
    let mut record = [0u8; RECORD_LEN];
    record[..8].copy_from_slice(&hash.to_le_bytes());
    record[8..].copy_from_slice(&expiry.to_le_bytes());
    record
}

fn invalid_data(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Reads and validates the header; returns the hash key.
fn read_header(reader: &mut impl Read) -> io::Result<[u8; 16]> {
    let mut header = [0u8; HEADER_LEN];
    let n = read_up_to(reader, &mut header)?;
    if n < HEADER_LEN {
        return Err(invalid_data("nonce journal header is truncated"));
    }
    if &header[..8] != MAGIC {
        return Err(invalid_data(
            "not a nonce journal (bad magic; expected CNONCE01)",
        ));
    }
    let mut key = [0u8; 16];
    key.copy_from_slice(&header[8..]);
    Ok(key)
}

/// Loads the live records of a journal into `map`; returns its hash key.
pub(super) fn load_journal(file: File, map: &mut Table, now_ms: u64) -> io::Result<[u8; 16]> {
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let key = read_header(&mut reader)?;
    let mut record = [0u8; RECORD_LEN];
    // A short read can only be the last record, torn by a crash: ignore it.
    while read_up_to(&mut reader, &mut record)? == RECORD_LEN {
        let mut hash = [0u8; 8];
        let mut expiry = [0u8; 4];
        hash.copy_from_slice(&record[..8]);
        expiry.copy_from_slice(&record[8..]);
        let expiry = u32::from_le_bytes(expiry);
        if is_live(expiry, now_ms) {
            // The same nonce may appear twice (reused after expiry): keep the
            // later expiry.
            map.insert_max(u64::from_le_bytes(hash), expiry);
        }
    }
    Ok(key)
}

/// Like `read_exact`, but returns how many bytes were read before EOF.
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

pub(super) fn tmp_path(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    PathBuf::from(tmp)
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

pub(super) fn create_parent_dir(path: &Path) -> io::Result<()> {
    let dir = parent_dir(path);
    if dir.exists() {
        return Ok(());
    }
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Take the exclusive lock beside the journal, or fail if another process holds it.
pub(super) fn lock_journal(path: &Path) -> io::Result<File> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path.with_file_name(name))?;
    lock.try_lock().map_err(|_| {
        io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("{} is in use by another process", path.display()),
        )
    })?;
    Ok(lock)
}

pub(super) fn sync_parent_dir(path: &Path) -> io::Result<()> {
    File::open(parent_dir(path))?.sync_all()
}

/// Writes header + `entries` to `<path>.tmp` (mode 0600), fsyncs it and
/// renames it over `path`. Returns the new file, open for reading and writing
/// at its end, and the number of records written. The caller fsyncs the directory. On error
/// `path` is untouched.
pub(super) fn rewrite_journal(
    path: &Path,
    key: &[u8; 16],
    entries: impl IntoIterator<Item = (u64, u32)>,
) -> io::Result<(File, u64)> {
    let tmp = tmp_path(path);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // `create_new` so the mode applies (and no stale file or symlink is
    // reused); the same handle later takes the appends (mapped, which needs
    // it readable), so there is no window in which the renamed file is not
    // open.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = (|| {
        let mut out = BufWriter::with_capacity(64 * 1024, &file);
        out.write_all(MAGIC)?;
        out.write_all(key)?;
        let mut records = 0u64;
        for (key, expiry) in entries {
            out.write_all(&encode_record(key, expiry))?;
            records += 1;
        }
        out.flush()?;
        drop(out);
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        Ok(records)
    })();
    match written {
        Ok(records) => Ok((file, records)),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}
