//! Kill-switch: refuse every call, or every call to some tools, without reading the body.
//!
//! The switch has two sources that are OR-ed: the configuration (replaced on reload) and the
//! runtime state set through the admin socket, which is written atomically to a state file and
//! so survives restarts.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use serde::{Deserialize, Serialize};
use tower::{Layer, Service};

use crate::call::ToolCall;
use crate::future::ReadyOr;
use crate::Rejection;

/// Engaged switches from one source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Switches {
    /// Every call is refused.
    #[serde(default)]
    pub global: bool,
    /// Calls to these tools are refused.
    #[serde(default)]
    pub tools: BTreeSet<String>,
}

#[derive(Debug, Default)]
struct State {
    config: Switches,
    runtime: Switches,
}

impl State {
    /// Whether any switch of either source is engaged.
    fn any(&self) -> bool {
        let engaged = |s: &Switches| s.global || !s.tools.is_empty();
        engaged(&self.config) || engaged(&self.runtime)
    }
}

/// The switches, and whether any is engaged.
#[derive(Debug)]
struct Shared {
    state: RwLock<State>,
    /// `state.any()`, stored under the state's write lock each time the state changes: a
    /// call that finds it clear (every call while nothing is engaged) checks no further and
    /// takes no lock.
    engaged: AtomicBool,
}

impl Shared {
    fn new(state: State) -> Arc<Self> {
        Arc::new(Shared {
            engaged: AtomicBool::new(state.any()),
            state: RwLock::new(state),
        })
    }
}

/// Shared kill-switch state.
#[derive(Debug, Clone)]
pub struct KillSwitch {
    state: Arc<Shared>,
    file: Option<Arc<PathBuf>>,
    /// Serializes runtime changes, so the state file is written outside the lock that
    /// requests read.
    writer: Arc<std::sync::Mutex<()>>,
}

/// Reading or writing the kill-switch state file failed.
#[derive(Debug, thiserror::Error)]
pub enum KillSwitchError {
    #[error("kill-switch state {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("kill-switch state {path} is corrupt: {source}")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
}

impl KillSwitch {
    /// A switch with only configuration state and nothing persisted.
    pub fn in_memory(config: Switches) -> Self {
        KillSwitch {
            state: Shared::new(State {
                config,
                runtime: Switches::default(),
            }),
            file: None,
            writer: Arc::default(),
        }
    }

    /// Load the runtime state from `file` (absent file = nothing engaged) and keep writing it
    /// there. A corrupt file is an error: a switch an operator engaged is never dropped
    /// silently.
    pub fn open(config: Switches, file: impl Into<PathBuf>) -> Result<Self, KillSwitchError> {
        let file = file.into();
        let runtime =
            match crate::state_file::read_bounded(&file, crate::state_file::MAX_DOCUMENT_BYTES) {
                Ok(bytes) => {
                    serde_json::from_slice(&bytes).map_err(|source| KillSwitchError::Corrupt {
                        path: file.clone(),
                        source,
                    })?
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Switches::default(),
                Err(source) => return Err(KillSwitchError::Io { path: file, source }),
            };
        Ok(KillSwitch {
            state: Shared::new(State { config, runtime }),
            file: Some(Arc::new(file)),
            writer: Arc::default(),
        })
    }

    /// Replace the configuration source (on reload).
    pub fn set_config(&self, config: Switches) {
        self.update(|s| s.config = config);
    }

    /// Engage or release the runtime switch, globally (`tool = None`) or for one tool, and
    /// persist it before returning.
    pub fn set_runtime(&self, tool: Option<&str>, engaged: bool) -> Result<(), KillSwitchError> {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = self.read().runtime.clone();
        match tool {
            None => next.global = engaged,
            Some(t) if engaged => {
                next.tools.insert(t.to_owned());
            }
            Some(t) => {
                next.tools.remove(t);
            }
        }
        if let Some(file) = &self.file {
            crate::state_file::write_atomically(
                file,
                &serde_json::to_vec_pretty(&next).expect("serializable"),
            )
            .map_err(|source| KillSwitchError::Io {
                path: file.to_path_buf(),
                source,
            })?;
        }
        self.update(|s| s.runtime = next);
        Ok(())
    }

    /// Current (config, runtime) switches.
    pub fn snapshot(&self) -> (Switches, Switches) {
        let s = self.read();
        (s.config.clone(), s.runtime.clone())
    }

    /// Whether every call is refused.
    pub fn global_engaged(&self) -> bool {
        if !self.state.engaged.load(Ordering::Acquire) {
            return false;
        }
        let s = self.read();
        s.config.global || s.runtime.global
    }

    /// Why a call to `tool` is refused, if it is.
    pub fn check(&self, tool: Option<&str>) -> Result<(), Rejection> {
        if !self.state.engaged.load(Ordering::Acquire) {
            return Ok(());
        }
        let s = self.read();
        if s.config.global || s.runtime.global {
            return Err(Rejection::Disabled("global".into()));
        }
        if let Some(tool) = tool {
            if s.config.tools.contains(tool) || s.runtime.tools.contains(tool) {
                return Err(Rejection::Disabled(format!("tool {tool}")));
            }
        }
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Change the state, and whether any switch is engaged with it.
    fn update(&self, change: impl FnOnce(&mut State)) {
        let mut state = self.state.state.write().unwrap_or_else(|e| e.into_inner());
        change(&mut state);
        self.state.engaged.store(state.any(), Ordering::Release);
    }
}

/// Applies a [`KillSwitch`]: on `http::Request`s it checks the global switch only (the tool
/// is not known before the body is read); on [`ToolCall`]s it checks the global and the
/// per-tool switches.
#[derive(Debug, Clone)]
pub struct KillSwitchLayer {
    switch: KillSwitch,
}

impl KillSwitchLayer {
    pub fn new(switch: KillSwitch) -> Self {
        KillSwitchLayer { switch }
    }
}

impl<S> Layer<S> for KillSwitchLayer {
    type Service = KillSwitchService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        KillSwitchService {
            inner,
            switch: self.switch.clone(),
        }
    }
}

/// Service of [`KillSwitchLayer`].
#[derive(Debug, Clone)]
pub struct KillSwitchService<S> {
    inner: S,
    switch: KillSwitch,
}

impl<S, B> Service<http::Request<B>> for KillSwitchService<S>
where
    S: Service<http::Request<B>, Error = Rejection>,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = ReadyOr<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match self.switch.check(None) {
            Ok(()) => ReadyOr::inner(self.inner.call(req)),
            Err(r) => ReadyOr::reject(r),
        }
    }
}

impl<S> Service<ToolCall> for KillSwitchService<S>
where
    S: Service<ToolCall, Error = Rejection>,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = ReadyOr<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        match self.switch.check(Some(&call.tool.name)) {
            Ok(()) => ReadyOr::inner(self.inner.call(call)),
            Err(r) => ReadyOr::reject(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_and_runtime_are_ored() {
        let ks = KillSwitch::in_memory(Switches {
            global: false,
            tools: ["a".to_string()].into(),
        });
        assert!(ks.check(Some("a")).is_err());
        assert!(ks.check(Some("b")).is_ok());
        ks.set_runtime(Some("b"), true).unwrap();
        assert!(ks.check(Some("b")).is_err());
        ks.set_runtime(None, true).unwrap();
        assert!(matches!(ks.check(None), Err(Rejection::Disabled(_))));
        ks.set_runtime(None, false).unwrap();
        assert!(ks.check(None).is_ok());
    }

    /// Calls pass without a look at the switches while none is engaged; every change to
    /// either source is seen by every copy of the switch.
    #[test]
    fn a_switch_engaged_or_released_from_either_source_is_seen_at_once() {
        let ks = KillSwitch::in_memory(Switches::default());
        let copy = ks.clone();
        assert!(copy.check(Some("a")).is_ok() && !copy.global_engaged());
        ks.set_config(Switches {
            global: false,
            tools: ["a".to_string()].into(),
        });
        assert!(copy.check(Some("a")).is_err());
        assert!(copy.check(Some("b")).is_ok() && !copy.global_engaged());
        ks.set_runtime(None, true).unwrap();
        ks.set_config(Switches::default());
        assert!(copy.global_engaged() && copy.check(Some("b")).is_err());
        ks.set_runtime(None, false).unwrap();
        assert!(copy.check(Some("a")).is_ok() && !copy.global_engaged());
        // Engaged by the configuration from the start.
        let on = KillSwitch::in_memory(Switches {
            global: true,
            tools: Default::default(),
        });
        assert!(on.global_engaged() && on.check(None).is_err());
    }

    #[test]
    fn runtime_state_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state/killswitch.json");
        let ks = KillSwitch::open(Switches::default(), &file).unwrap();
        ks.set_runtime(Some("memory.delete"), true).unwrap();
        ks.set_runtime(None, true).unwrap();
        drop(ks);
        let again = KillSwitch::open(Switches::default(), &file).unwrap();
        assert!(again.global_engaged());
        again.set_runtime(None, false).unwrap();
        assert!(again.check(Some("memory.delete")).is_err());
        assert!(again.check(Some("memory.query")).is_ok());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_corrupt_state_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("killswitch.json");
        std::fs::write(&file, b"{not json").unwrap();
        assert!(matches!(
            KillSwitch::open(Switches::default(), &file),
            Err(KillSwitchError::Corrupt { .. })
        ));
    }
}
