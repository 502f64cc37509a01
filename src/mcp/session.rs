//! Older-era MCP sessions (`Mcp-Session-Id`, revisions 2025-03-26 to 2025-11-25).
//!
//! A session's state (the negotiated version, who opened it, when) is sealed into its id with
//! an HMAC-SHA256 key, so any replica holding the key serves it, and an id cannot be guessed
//! or forged. Each process also remembers when it last saw a session and whether it was
//! ended (`DELETE`), to expire idle sessions; a replica that has not seen a session trusts
//! its seal until `session_max_lifetime_s`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::hmac;
use serde::{Deserialize, Serialize};

use super::back::relay::ClientFeatures;
use super::stream::PendingAnswers;
use super::LEGACY_VERSIONS;
use crate::config::mcp::{McpFrontConfig, MIN_SESSION_KEY_BYTES};

/// Most sessions one process tracks; beyond it new sessions are refused until old ones age out.
pub const MAX_TRACKED_SESSIONS: usize = 100_000;

/// Most sessions one principal may have tracked at once (a tenth of the table): one caller
/// opening sessions without end fills its own share, not everyone's. Ended and idle sessions
/// count until their lifetime is over, since forgetting one would let it be resumed.
pub const MAX_SESSIONS_PER_PRINCIPAL: usize = MAX_TRACKED_SESSIONS / 10;

/// How often, at most, a full table (or a principal's full share) is swept of sessions past
/// their lifetime: a sweep visits every entry under the table's lock.
const SWEEP_EVERY_MS: u64 = 1_000;

/// What a session id carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionClaims {
    /// The negotiated protocol version.
    #[serde(rename = "v")]
    pub version: String,
    /// The principal that opened it; only that principal may use it.
    #[serde(rename = "p")]
    pub principal: String,
    /// When it was opened, Unix ms.
    #[serde(rename = "t")]
    pub issued_ms: u64,
    /// Makes every id unique.
    #[serde(rename = "n")]
    nonce: String,
    /// What the client can answer of the server's requests ([`ClientFeatures`] bits).
    #[serde(rename = "c", default)]
    features: u8,
}

impl SessionClaims {
    /// The session's version when it is one this build serves (one of [`LEGACY_VERSIONS`]).
    pub fn served_version(&self) -> Option<&'static str> {
        LEGACY_VERSIONS.into_iter().find(|v| *v == self.version)
    }

    /// What the client said at `initialize` it can answer.
    pub fn features(&self) -> ClientFeatures {
        ClientFeatures::from_bits(self.features)
    }
}

#[derive(Debug, Clone)]
struct Seen {
    /// Who opened it (each principal's sessions are counted).
    principal: Arc<str>,
    issued_ms: u64,
    last_used_ms: u64,
    ended: bool,
    /// The least severe log level the client wants (`logging/setLevel`), if it set one.
    log_level: Option<u8>,
}

/// Why a session cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionRefused {
    /// Unknown, forged, someone else's, expired or ended: the caller starts a new one.
    NotFound,
    /// This process tracks too many sessions.
    Full,
}

/// The sessions this process has seen, and how many each principal has.
#[derive(Default)]
struct Table {
    by_id: HashMap<String, Seen>,
    per_principal: HashMap<Arc<str>, usize>,
    last_sweep_ms: u64,
}

impl Table {
    fn count(&self, principal: &str) -> usize {
        self.per_principal.get(principal).copied().unwrap_or(0)
    }

    /// Whether a new session of `principal` fits: after a sweep of sessions past their
    /// lifetime when the table or the principal's share is full (at most once a second).
    fn room_for(&mut self, principal: &str, now_ms: u64, max_ms: u64, caps: Caps) -> bool {
        let full =
            |t: &Table| t.by_id.len() >= caps.total || t.count(principal) >= caps.per_principal;
        // `abs_diff`: a wall clock stepped back does not hold off the sweep.
        if full(self) && now_ms.abs_diff(self.last_sweep_ms) >= SWEEP_EVERY_MS {
            self.last_sweep_ms = now_ms;
            let per_principal = &mut self.per_principal;
            self.by_id.retain(|_, s| {
                let live = now_ms.saturating_sub(s.issued_ms) <= max_ms;
                if !live {
                    if let Some(n) = per_principal.get_mut(&s.principal) {
                        *n -= 1;
                    }
                }
                live
            });
            per_principal.retain(|_, n| *n > 0);
        }
        !full(self)
    }

    fn insert(&mut self, id: String, seen: Seen) {
        *self
            .per_principal
            .entry(seen.principal.clone())
            .or_insert(0) += 1;
        self.by_id.insert(id, seen);
    }
}

/// The table's bounds.
#[derive(Debug, Clone, Copy)]
struct Caps {
    total: usize,
    per_principal: usize,
}

/// The sessions of one MCP front.
pub struct Sessions {
    key: hmac::Key,
    idle_ms: u64,
    max_ms: u64,
    caps: Caps,
    seen: Mutex<Table>,
    /// The MCP server's requests waiting for these sessions' answers (kept, as the sessions
    /// are, across reloads).
    answers: std::sync::Arc<PendingAnswers>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("idle_ms", &self.idle_ms)
            .field("max_ms", &self.max_ms)
            .finish_non_exhaustive()
    }
}

impl Sessions {
    pub fn new(key: &[u8], cfg: &McpFrontConfig) -> Self {
        Sessions {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
            idle_ms: cfg.session_idle_timeout_s.saturating_mul(1000),
            max_ms: cfg.session_max_lifetime_s.saturating_mul(1000),
            caps: Caps {
                total: MAX_TRACKED_SESSIONS,
                per_principal: MAX_SESSIONS_PER_PRINCIPAL,
            },
            seen: Mutex::default(),
            answers: Default::default(),
        }
    }

    /// The MCP server's requests waiting for these sessions' answers.
    pub fn answers(&self) -> &std::sync::Arc<PendingAnswers> {
        &self.answers
    }

    /// Open a session for `principal` at `version`; returns its id.
    pub fn open(
        &self,
        version: &str,
        principal: &str,
        features: ClientFeatures,
        now_ms: u64,
    ) -> Result<String, SessionRefused> {
        let claims = SessionClaims {
            version: version.into(),
            principal: principal.into(),
            issued_ms: now_ms,
            nonce: hex::encode(rand::random::<[u8; 16]>()),
            features: features.bits(),
        };
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).expect("serializes"));
        let tag = hmac::sign(&self.key, payload.as_bytes());
        let id = format!("{payload}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()));
        let mut table = self.lock();
        if !table.room_for(principal, now_ms, self.max_ms, self.caps) {
            return Err(SessionRefused::Full);
        }
        table.insert(
            id.clone(),
            Seen {
                principal: principal.into(),
                issued_ms: now_ms,
                last_used_ms: now_ms,
                ended: false,
                log_level: None,
            },
        );
        Ok(id)
    }

    /// Use the session `id` as `principal`: its claims, if it is live.
    pub fn resume(
        &self,
        id: &str,
        principal: &str,
        now_ms: u64,
    ) -> Result<SessionClaims, SessionRefused> {
        let claims = self.unseal(id).ok_or(SessionRefused::NotFound)?;
        if claims.principal != principal || now_ms.saturating_sub(claims.issued_ms) > self.max_ms {
            return Err(SessionRefused::NotFound);
        }
        // A session sealed at a version this build does not serve (by another build sharing
        // the key, as in a rolling upgrade) cannot be continued here, nor ended: the client
        // starts a new one, as for any session not found.
        if claims.served_version().is_none() {
            return Err(SessionRefused::NotFound);
        }
        let mut table = self.lock();
        if !table.by_id.contains_key(id) {
            // Opened elsewhere (another replica, or before a restart): tracked from now on.
            if !table.room_for(principal, now_ms, self.max_ms, self.caps) {
                return Err(SessionRefused::Full);
            }
            let seen = Seen {
                principal: principal.into(),
                issued_ms: claims.issued_ms,
                last_used_ms: now_ms,
                ended: false,
                log_level: None,
            };
            table.insert(id.to_owned(), seen);
        }
        let s = table.by_id.get_mut(id).expect("tracked above");
        if s.ended || now_ms.saturating_sub(s.last_used_ms) > self.idle_ms {
            s.ended = true;
            return Err(SessionRefused::NotFound);
        }
        s.last_used_ms = now_ms;
        Ok(claims)
    }

    /// End the session `id` (`DELETE`).
    pub fn end(&self, id: &str, principal: &str, now_ms: u64) -> Result<(), SessionRefused> {
        self.resume(id, principal, now_ms)?;
        if let Some(s) = self.lock().by_id.get_mut(id) {
            s.ended = true;
        }
        Ok(())
    }

    /// Set the least severe log level the session `id` wants (it was resumed just before).
    pub fn set_log_level(&self, id: &str, level: u8) {
        if let Some(s) = self.lock().by_id.get_mut(id) {
            s.log_level = Some(level);
        }
    }

    /// The least severe log level the session `id` wants, if it set one.
    pub fn log_level(&self, id: &str) -> Option<u8> {
        self.lock().by_id.get(id).and_then(|s| s.log_level)
    }

    fn unseal(&self, id: &str) -> Option<SessionClaims> {
        let (payload, tag) = id.split_once('.')?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        // Constant time.
        hmac::verify(&self.key, payload.as_bytes(), &tag).ok()?;
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The configured key, or the one in `<state_dir>/mcp_session.key` (made at first start:
/// 32 random bytes, mode 0600, written atomically).
pub fn load_or_create_key(state_dir: &Path) -> std::io::Result<Vec<u8>> {
    let path = state_dir.join("mcp_session.key");
    match carapace_filters::state_file::read_bounded(&path, 4096) {
        Ok(key) if key.len() >= MIN_SESSION_KEY_BYTES => Ok(key),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} is shorter than {MIN_SESSION_KEY_BYTES} bytes",
                path.display()
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = rand::random::<[u8; 32]>().to_vec();
            carapace_filters::state_file::write_atomically(&path, &key)?;
            Ok(key)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(key: &[u8]) -> Sessions {
        let cfg = McpFrontConfig {
            session_idle_timeout_s: 60,
            session_max_lifetime_s: 600,
            ..McpFrontConfig::default()
        };
        Sessions::new(key, &cfg)
    }

    #[test]
    fn one_principal_fills_only_its_share_and_ended_sessions_count_until_their_lifetime() {
        let mut s = sessions(&[1; 32]);
        s.caps = Caps {
            total: 4,
            per_principal: 2,
        };
        let open = |s: &Sessions, who: &str, at: u64| {
            s.open("2025-06-18", who, ClientFeatures::default(), at)
        };
        let first = open(&s, "greedy", 0).unwrap();
        open(&s, "greedy", 0).unwrap();
        assert_eq!(open(&s, "greedy", 10), Err(SessionRefused::Full));
        // Ending one frees nothing: forgotten, it could be resumed.
        s.end(&first, "greedy", 20).unwrap();
        assert_eq!(open(&s, "greedy", 2_000), Err(SessionRefused::Full));
        assert_eq!(
            s.resume(&first, "greedy", 2_000),
            Err(SessionRefused::NotFound)
        );
        // Others still get sessions, up to the table's bound.
        open(&s, "polite", 0).unwrap();
        let theirs = open(&s, "polite", 0).unwrap();
        assert_eq!(open(&s, "third", 3_000), Err(SessionRefused::Full));
        // A session another replica opened is tracked, and counted, once it is used here.
        let elsewhere = sessions(&[1; 32]);
        let moved = open(&elsewhere, "third", 0).unwrap();
        assert_eq!(s.resume(&moved, "third", 3_000), Err(SessionRefused::Full));
        assert!(s.resume(&theirs, "polite", 3_000).is_ok());
        // Past the lifetime (600 s) the old sessions are swept and their shares come back.
        assert!(open(&s, "greedy", 600_001).is_ok());
        assert!(
            s.resume(&moved, "third", 600_001).is_err(),
            "past its own lifetime"
        );
        assert!(open(&s, "third", 600_002).is_ok());
    }

    #[test]
    fn a_session_at_a_version_this_build_does_not_serve_is_not_found_nor_ended() {
        let s = sessions(&[1; 32]);
        let id = s
            .open("2024-11-05", "gw", ClientFeatures::default(), 1_000)
            .unwrap();
        assert_eq!(s.resume(&id, "gw", 2_000), Err(SessionRefused::NotFound));
        assert_eq!(s.end(&id, "gw", 2_000), Err(SessionRefused::NotFound));
    }

    #[test]
    fn a_replica_with_the_same_key_serves_the_session_and_no_other_caller_can() {
        let a = sessions(&[1; 32]);
        let b = sessions(&[1; 32]);
        let id = a
            .open("2025-11-25", "gw_test", ClientFeatures::default(), 1_000)
            .unwrap();
        assert!(id.bytes().all(|c| (0x21..=0x7e).contains(&c)));
        let claims = b.resume(&id, "gw_test", 2_000).unwrap();
        assert_eq!(claims.version, "2025-11-25");
        assert_eq!(
            b.resume(&id, "someone_else", 2_000),
            Err(SessionRefused::NotFound)
        );
        let other_key = sessions(&[2; 32]);
        assert_eq!(
            other_key.resume(&id, "gw_test", 2_000),
            Err(SessionRefused::NotFound)
        );
    }

    #[test]
    fn forged_idle_ended_and_old_sessions_are_not_found() {
        let s = sessions(&[1; 32]);
        let id = s
            .open("2025-06-18", "gw", ClientFeatures::default(), 0)
            .unwrap();
        let (payload, tag) = id.split_once('.').unwrap();
        let mut forged = payload.to_string();
        forged.replace_range(0..1, if &payload[..1] == "A" { "B" } else { "A" });
        assert!(s.resume(&format!("{forged}.{tag}"), "gw", 1).is_err());
        // Idle past the timeout.
        assert_eq!(s.resume(&id, "gw", 61_001), Err(SessionRefused::NotFound));
        // Used in time, then ended.
        let id = s
            .open("2025-06-18", "gw", ClientFeatures::default(), 100_000)
            .unwrap();
        s.resume(&id, "gw", 150_000).unwrap();
        s.end(&id, "gw", 160_000).unwrap();
        assert_eq!(s.resume(&id, "gw", 160_001), Err(SessionRefused::NotFound));
        // Past the lifetime, even if used all along.
        let id = s
            .open("2025-06-18", "gw", ClientFeatures::default(), 0)
            .unwrap();
        for t in (50_000..=600_000).step_by(50_000) {
            s.resume(&id, "gw", t).unwrap();
        }
        assert_eq!(s.resume(&id, "gw", 600_001), Err(SessionRefused::NotFound));
    }
}
