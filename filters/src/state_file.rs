//! Files that hold state: written so that a crash at any point leaves either the old or the
//! new content, never a torn file, and readable only by their owner.

use std::io::{Read, Write};
use std::path::Path;

/// Largest secret file read (a key or a password, never a megabyte).
pub const MAX_SECRET_BYTES: u64 = 64 * 1024;
/// Largest certificate, key, configuration or identity file read.
pub const MAX_DOCUMENT_BYTES: u64 = 4 * 1024 * 1024;
/// Largest peer store read.
pub const MAX_STORE_BYTES: u64 = 64 * 1024 * 1024;

/// Read a whole regular file of at most `max` bytes. Anything else (a device such as
/// `/dev/zero`, a FIFO, a directory, a larger file) is refused before it is read, so a
/// mistaken path never exhausts memory or blocks. Symbolic links are followed (mounted
/// secrets are links); the check is on the file opened.
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        // Opening a FIFO must not wait for a writer.
        .custom_flags(libc_o_nonblock())
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    if meta.len() > max {
        return Err(too_large(max));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    f.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large(max));
    }
    Ok(bytes)
}

fn too_large(max: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("larger than {max} bytes"),
    )
}

/// `O_NONBLOCK` on Linux and the BSDs (0x800 on Linux, 0x4 on macOS and the BSDs).
const fn libc_o_nonblock() -> i32 {
    if cfg!(target_os = "linux") {
        0o4000
    } else {
        0x4
    }
}

/// Write `bytes` to `path` so that a crash leaves either the old or the new content: write a
/// temporary file beside it, fsync, rename over, fsync the directory. Mode 0600.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(
        ".tmp.{}.{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let tmp = dir.join(tmp_name);
    // A fresh file of our own: never an existing file or a link planted at that name.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    drop(f);
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn bounded_reads_refuse_devices_fifos_directories_and_large_files() {
        let dir = tempfile::tempdir().unwrap();
        for path in ["/dev/zero", "/dev/urandom"] {
            let e = read_bounded(Path::new(path), MAX_SECRET_BYTES).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{path}");
        }
        assert!(read_bounded(dir.path(), MAX_SECRET_BYTES).is_err());
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        assert!(read_bounded(&fifo, MAX_SECRET_BYTES).is_err());
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 1025]).unwrap();
        assert!(read_bounded(&big, 1024).is_err());
        assert_eq!(read_bounded(&big, 1025).unwrap().len(), 1025);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&big, &link).unwrap();
        assert_eq!(read_bounded(&link, 2048).unwrap().len(), 1025);
    }

    #[test]
    fn replaces_the_whole_file_privately_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        write_atomically(&path, b"old").unwrap();
        write_atomically(&path, b"new content").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new content");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
    }
}
