//! Where keys and answers are kept: this process ([`LocalKeys`]), or Redis for replicas
//! (`impl IdempotencyStore for RedisState`, in `shared_state.rs`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use carapace_filters::{BoxFuture, Rejection};
use tokio::time::Instant;

/// What a key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// Nothing: the key was free and is now the caller's (marked running).
    Claimed,
    /// A call with these arguments is running.
    Running { args_hash: String },
    /// A call with these arguments ended with this stored answer.
    Done { args_hash: String, answer: String },
}

/// A store of idempotency keys. Values are `r:<args_hash>:<token>` while running and
/// `d:<args_hash>:<answer>` once done; both expire after the window.
pub trait IdempotencyStore: Send + Sync {
    /// Take `key` for a call with `args_hash` (marked with `token`), or say what holds it.
    fn claim(
        &self,
        key: &str,
        args_hash: &str,
        token: &str,
        window: Duration,
    ) -> BoxFuture<Result<Slot, Rejection>>;

    /// The call that claimed `key` with `token` ended: keep `answer` for the window, or, when
    /// `None`, free the key (a repeat runs again).
    fn finish(
        &self,
        key: &str,
        token: &str,
        args_hash: &str,
        answer: Option<String>,
        window: Duration,
    ) -> BoxFuture<Result<(), Rejection>>;
}

/// Parse a stored value.
pub fn slot_of(value: &str) -> Option<Slot> {
    let mut parts = value.splitn(4, ':');
    let (kind, alg, hex) = (parts.next()?, parts.next()?, parts.next()?);
    let tail = parts.next().unwrap_or_default();
    let args_hash = format!("{alg}:{hex}");
    match kind {
        "r" => Some(Slot::Running { args_hash }),
        "d" => Some(Slot::Done {
            args_hash,
            answer: tail.to_string(),
        }),
        _ => None,
    }
}

struct Kept {
    value: String,
    expires: Instant,
}

/// Keys in this process, bounded in entries and bytes. When full, expired keys go first,
/// then the finished keys closest to expiry; a claim that still finds no room is refused
/// (`RATE_LIMITED`, retryable): running calls are never forgotten.
pub struct LocalKeys {
    keys: Mutex<(HashMap<String, Kept>, usize)>,
    max_entries: usize,
    max_bytes: usize,
}

impl LocalKeys {
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        LocalKeys {
            keys: Mutex::new((HashMap::new(), 0)),
            max_entries,
            max_bytes,
        }
    }

    /// Keys held (running or done).
    pub fn len(&self) -> usize {
        self.keys.lock().unwrap_or_else(|e| e.into_inner()).0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn put(
        &self,
        key: &str,
        value: String,
        window: Duration,
        replace: bool,
    ) -> Result<Option<String>, Rejection> {
        let now = Instant::now();
        let mut guard = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let (map, bytes) = &mut *guard;
        if let Some(k) = map.get(key) {
            if k.expires > now && !replace {
                return Ok(Some(k.value.clone()));
            }
            *bytes -= key.len() + k.value.len();
            map.remove(key);
        }
        let need = key.len() + value.len();
        if map.len() + 1 > self.max_entries || *bytes + need > self.max_bytes {
            map.retain(|k, v| {
                let keep = v.expires > now;
                if !keep {
                    *bytes -= k.len() + v.value.len();
                }
                keep
            });
        }
        while map.len() + 1 > self.max_entries || *bytes + need > self.max_bytes {
            let oldest = map
                .iter()
                .filter(|(_, v)| v.value.starts_with("d:"))
                .min_by_key(|(_, v)| v.expires)
                .map(|(k, _)| k.clone());
            let Some(k) = oldest else {
                return Err(Rejection::Overloaded);
            };
            let v = map.remove(&k).expect("just found");
            *bytes -= k.len() + v.value.len();
        }
        *bytes += need;
        map.insert(
            key.to_string(),
            Kept {
                value,
                expires: now + window,
            },
        );
        Ok(None)
    }
}

impl IdempotencyStore for LocalKeys {
    fn claim(
        &self,
        key: &str,
        args_hash: &str,
        token: &str,
        window: Duration,
    ) -> BoxFuture<Result<Slot, Rejection>> {
        let result = self
            .put(key, format!("r:{args_hash}:{token}"), window, false)
            .map(|held| match held {
                None => Slot::Claimed,
                Some(v) => slot_of(&v).unwrap_or(Slot::Claimed),
            });
        Box::pin(std::future::ready(result))
    }

    fn finish(
        &self,
        key: &str,
        token: &str,
        args_hash: &str,
        answer: Option<String>,
        window: Duration,
    ) -> BoxFuture<Result<(), Rejection>> {
        let ours = format!("r:{args_hash}:{token}");
        let still_ours = {
            let guard = self.keys.lock().unwrap_or_else(|e| e.into_inner());
            guard.0.get(key).is_some_and(|k| k.value == ours)
        };
        let stored = match (still_ours, answer) {
            (false, _) => true,
            (true, Some(a)) => self
                .put(key, format!("d:{args_hash}:{a}"), window, true)
                .is_ok(),
            (true, None) => false,
        };
        if !stored {
            // Freed, or no room to keep the answer: a repeat runs again.
            let mut guard = self.keys.lock().unwrap_or_else(|e| e.into_inner());
            let (map, bytes) = &mut *guard;
            if let Some(v) = map.remove(key) {
                *bytes -= key.len() + v.value.len();
            }
        }
        Box::pin(std::future::ready(Ok(())))
    }
}
