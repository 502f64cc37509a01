//! Each peer's last discovery document, kept across restarts.

use std::collections::BTreeMap;

/// Each peer's last discovery document, by peer id, kept across restarts: a peer that is
/// revoked, pending or unreachable keeps the tools it last served, so calls to them get the
/// same answer (`FORBIDDEN`, `DEPENDENCY_UNAVAILABLE`) before and after a restart instead of
/// `TOOL_NOT_FOUND` once the process forgot them. A peer without any record loses them.
pub(super) struct KnownTools {
    path: std::path::PathBuf,
    docs: std::sync::Mutex<BTreeMap<String, serde_json::Value>>,
}

impl KnownTools {
    pub(super) fn load(path: std::path::PathBuf) -> Self {
        let docs = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!("{}: ignored: {e}", path.display());
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        KnownTools {
            path,
            docs: std::sync::Mutex::new(docs),
        }
    }

    pub(super) fn get(&self, peer: &str) -> Option<serde_json::Value> {
        let docs = self.docs.lock().unwrap_or_else(|e| e.into_inner());
        docs.get(peer).cloned()
    }

    /// Set (`Some`) or forget (`None`) a peer's document; written only when it changed.
    pub(super) fn set(&self, peer: &str, doc: Option<serde_json::Value>) {
        let mut docs = self.docs.lock().unwrap_or_else(|e| e.into_inner());
        let changed = match doc {
            Some(d) => docs.insert(peer.to_string(), d.clone()).as_ref() != Some(&d),
            None => docs.remove(peer).is_some(),
        };
        if !changed {
            return;
        }
        let bytes = serde_json::to_vec(&*docs).expect("serializable");
        if let Err(e) = carapace_filters::state_file::write_atomically(&self.path, &bytes) {
            tracing::warn!("{}: {e}", self.path.display());
        }
    }
}
