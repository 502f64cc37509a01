//! The journal's tail, mapped: a record is stored into a shared mapping of the file, so an
//! append is a copy into the page cache, not a system call (on the filesystems where that is
//! safe, [`MAPPED_FILESYSTEMS`]; elsewhere the journal appends with `write`).
//!
//! Stores into a `MAP_SHARED` mapping are in the kernel's page cache as soon as they are
//! made: they survive the process being killed exactly as the bytes of a returned `write`
//! do, and, as those, are lost to a power loss until written back. The file is allocated
//! ahead of the records ([`WINDOW`] bytes at a time, with `posix_fallocate`), so on those
//! filesystems a full disk is an error returned by [`MappedTail::append`] (the nonce is
//! refused) and never a `SIGBUS` on a store; the allocated space reads as zeros. A record's expiry is stored last, in one
//! aligned 4-byte store: a record cut short by a crash has an expiry of 0 and is not live,
//! like the zeros after the last record, so loading skips both.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{compiler_fence, AtomicU32, Ordering};

use memmap2::{MmapMut, MmapOptions};

use super::journal::RECORD_LEN;

/// Bytes of the file mapped (and allocated) at a time. Only this window is mapped, so the
/// process's resident memory holds at most this much of the journal.
pub(super) const WINDOW: usize = 256 * 1024;

/// Windows start at a multiple of this: a multiple of every page size Linux uses (4, 16 and
/// 64 KiB), as `mmap` requires of an offset.
const ALIGN: u64 = 64 * 1024;

const _: () = assert!(WINDOW as u64 >= ALIGN + RECORD_LEN as u64);

/// The mapped window of a journal file that records are stored into.
pub(super) struct MappedTail {
    file: File,
    map: MmapMut,
    /// File offset of `map[0]`.
    start: u64,
    /// File offset of the next record.
    end: u64,
}

impl MappedTail {
    /// Maps `file` (open for reading and writing) from `end`, where its records end.
    /// `Unsupported` on a filesystem not known to keep allocated space for stores into a
    /// mapping (see [`MAPPED_FILESYSTEMS`]).
    pub(super) fn new(file: File, end: u64) -> io::Result<Self> {
        let kind = filesystem_of(&file)?;
        if !MAPPED_FILESYSTEMS.contains(&kind) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("filesystem type {kind:#x} is not one the journal is mapped on"),
            ));
        }
        let (start, map) = map_window(&file, end)?;
        Ok(MappedTail {
            file,
            map,
            start,
            end,
        })
    }

    /// Store one record after the last. On error nothing was stored.
    pub(super) fn append(&mut self, record: &[u8; RECORD_LEN]) -> io::Result<()> {
        let window_end = self.start + self.map.len() as u64;
        if self.end + RECORD_LEN as u64 > window_end {
            let (start, map) = map_window(&self.file, self.end)?;
            self.start = start;
            self.map = map;
        }
        let at = usize::try_from(self.end - self.start).expect("inside the window");
        let (hash, expiry) = record.split_at(8);
        self.map[at..at + 8].copy_from_slice(hash);
        // The hash before the expiry, in the program's order (the CPU keeps it for a crash
        // of this process: the stores before the point it stopped are all made).
        compiler_fence(Ordering::Release);
        let slot = self.map[at + 8..at + RECORD_LEN].as_mut_ptr().cast::<u32>();
        assert!(slot.is_aligned(), "records are 4-byte aligned in the file");
        // SAFETY: `slot` points at 4 bytes inside the mapping, aligned (checked above: records
        // start at 24 + 12k and the window at a multiple of 64 KiB), and `&mut self` means no
        // other reference to them exists while it is stored into.
        let slot = unsafe { AtomicU32::from_ptr(slot) };
        slot.store(
            u32::from_ne_bytes(expiry.try_into().expect("4 bytes")),
            Ordering::Release,
        );
        self.end += RECORD_LEN as u64;
        Ok(())
    }
}

/// The filesystems (`statfs` types) whose allocated blocks a store into a mapping uses as
/// they are: ext4, XFS and tmpfs. On a copy-on-write filesystem (btrfs) a store into a mapped
/// page may need new space and raises `SIGBUS` when there is none, and ZFS does not reserve
/// what `posix_fallocate` asks for; there, and on any filesystem not listed (overlayfs, which
/// does not say what is below it, NFS, FUSE), the journal appends with `write`.
const MAPPED_FILESYSTEMS: [i64; 3] = [0xEF53, 0x5846_5342, 0x0102_1994];

/// Whether the journal is mapped on the filesystem `file` is on.
#[cfg(test)]
pub(super) fn maps_on(file: &File) -> bool {
    filesystem_of(file).is_ok_and(|kind| MAPPED_FILESYSTEMS.contains(&kind))
}

/// The `statfs` type of the filesystem `file` is on.
fn filesystem_of(file: &File) -> io::Result<i64> {
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `fs` is a valid place for one `statfs`, which the call fills on success.
    if unsafe { libc::fstatfs(file.as_raw_fd(), fs.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: filled by the successful call above.
    let fs = unsafe { fs.assume_init() };
    #[allow(clippy::unnecessary_cast)] // the field's type differs between targets
    Ok(fs.f_type as i64)
}

/// Allocate and map the window of `file` that holds the record at `end`.
fn map_window(file: &File, end: u64) -> io::Result<(u64, MmapMut)> {
    let start = end / ALIGN * ALIGN;
    allocate(file, start, WINDOW as u64)?;
    // SAFETY: the journal is this store's alone while it lives (the exclusive lock beside
    // it, mode 0600 in a 0700 directory), so nothing else truncates or writes the file while
    // it is mapped, and the window lies inside the file (allocated above).
    let map = unsafe { MmapOptions::new().offset(start).len(WINDOW).map_mut(file)? };
    Ok((start, map))
}

/// `posix_fallocate`: the blocks of `[offset, offset + len)` allocated (the file grown to
/// cover them, zeros where nothing was written).
fn allocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let too_far = || io::Error::new(io::ErrorKind::InvalidInput, "journal offset out of range");
    let offset = libc::off_t::try_from(offset).map_err(|_| too_far())?;
    let len = libc::off_t::try_from(len).map_err(|_| too_far())?;
    // SAFETY: a plain system call on an open descriptor; no memory is passed.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), offset, len) } {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}
