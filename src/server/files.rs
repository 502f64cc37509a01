//! The state directory and socket files: private directories, stale sockets, file modes.

use std::path::Path;

/// The service every listener hands requests to.
use super::error::StartError;

pub(crate) fn create_private_dir(path: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::DirBuilderExt;
    let fail = |source| StartError::StateDir {
        path: path.into(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(fail)?;
    make_private(path).map_err(fail)
}

/// The state directory holds keys and the replay journal: only its owner may enter it. A
/// directory of ours that others may enter (a volume mounted `0777`) is made `0700`, saying
/// so; one that belongs to another user is refused.
fn make_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(path)?;
    if !meta.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a directory",
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    let me = crate::ops::admin::effective_uid()?;
    if meta.uid() != me {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "mode {mode:o} lets others in and it belongs to uid {}, not to this process",
                meta.uid()
            ),
        ));
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7700))?;
    tracing::warn!(
        "state_dir {} had mode {mode:o}; made it {:o} (only its owner may enter)",
        path.display(),
        mode & 0o7700
    );
    Ok(())
}

/// Remove a stale socket file at `path`, refusing if something is listening there, and
/// leaving anything that is not a socket (a misconfigured path must not delete a file).
pub(crate) fn claim_socket_path(path: &Path, what: &'static str) -> Result<(), StartError> {
    use std::os::unix::fs::FileTypeExt;
    let refuse = |source| StartError::Bind {
        what,
        address: path.display().to_string(),
        source,
    };
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(refuse(std::io::ErrorKind::AddrInUse.into()));
    }
    if std::fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_socket()) {
        return Err(refuse(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "a file that is not a socket is there; remove it or choose another path",
        )));
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(refuse(e)),
        _ => Ok(()),
    }
}

pub(crate) fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stale socket is removed; a regular file at the path is left as it was.
    #[test]
    fn only_a_stale_socket_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        claim_socket_path(&stale, "test").unwrap();
        assert!(!stale.exists());
        let file = dir.path().join("carapace.yaml");
        std::fs::write(&file, "kept").unwrap();
        assert!(claim_socket_path(&file, "test").is_err());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "kept");
        claim_socket_path(&dir.path().join("absent.sock"), "test").unwrap();
    }
}
