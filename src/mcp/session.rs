//! Older-era MCP sessions (`Mcp-Session-Id`, revisions 2025-03-26 to 2025-11-25).
//!
//! A session's state (the negotiated version, who opened it, when) is sealed into its id with
//! an HMAC-SHA256 key, so any replica holding the key serves it, and an id cannot be guessed
//! or forged. Each process also remembers when it last saw a session and whether it was
//! ended (`DELETE`), to expire idle sessions; a replica that has not seen a session trusts
//! its seal until `session_max_lifetime_s`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

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

#[derive(Debug, Clone, Copy)]
struct Seen {
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

/// The sessions of one MCP front.
pub struct Sessions {
    key: hmac::Key,
    idle_ms: u64,
    max_ms: u64,
    seen: Mutex<HashMap<String, Seen>>,
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
            seen: Mutex::new(HashMap::new()),
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
        let mut seen = self.lock();
        if seen.len() >= MAX_TRACKED_SESSIONS {
            let max_ms = self.max_ms;
            seen.retain(|_, s| now_ms.saturating_sub(s.issued_ms) <= max_ms);
            if seen.len() >= MAX_TRACKED_SESSIONS {
                return Err(SessionRefused::Full);
            }
        }
        seen.insert(
            id.clone(),
            Seen {
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
        let mut seen = self.lock();
        if seen.len() >= MAX_TRACKED_SESSIONS && !seen.contains_key(id) {
            return Err(SessionRefused::Full);
        }
        let s = seen.entry(id.to_owned()).or_insert(Seen {
            issued_ms: claims.issued_ms,
            last_used_ms: now_ms,
            ended: false,
            log_level: None,
        });
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
        if let Some(s) = self.lock().get_mut(id) {
            s.ended = true;
        }
        Ok(())
    }

    /// Set the least severe log level the session `id` wants (it was resumed just before).
    pub fn set_log_level(&self, id: &str, level: u8) {
        if let Some(s) = self.lock().get_mut(id) {
            s.log_level = Some(level);
        }
    }

    /// The least severe log level the session `id` wants, if it set one.
    pub fn log_level(&self, id: &str) -> Option<u8> {
        self.lock().get(id).and_then(|s| s.log_level)
    }

    fn unseal(&self, id: &str) -> Option<SessionClaims> {
        let (payload, tag) = id.split_once('.')?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        // Constant time.
        hmac::verify(&self.key, payload.as_bytes(), &tag).ok()?;
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
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
