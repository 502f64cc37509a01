//! Tokens already verified: a token's signature is checked once per key set, then found by
//! its SHA-256 (a JWT signature check costs about 50 µs, a lookup under 0.3 µs; see
//! BENCHMARKS.md). `exp` is still checked at every use against the clock; a refreshed key set
//! makes every entry stale, so a key the issuer withdrew stops working at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use jsonwebtoken::jwk::JwkSet;
use sha2::{Digest, Sha256};

use super::token::Holder;

/// Most tokens remembered; when full, the cache is emptied and fills again.
pub const MAX_CACHED_TOKENS: usize = 10_000;

struct Entry {
    holder: Holder,
    /// The key set the token was verified with (held, so that its address is not reused).
    keys: Arc<JwkSet>,
}

/// Verified tokens by SHA-256.
#[derive(Default)]
pub struct TokenCache {
    map: Mutex<HashMap<[u8; 32], Entry>>,
}

impl TokenCache {
    /// The holder of `token` when it was verified with `keys` and is not past `exp` (with
    /// `skew_s`) at `now_s`.
    pub fn get(&self, token: &str, keys: &Arc<JwkSet>, now_s: u64, skew_s: u64) -> Option<Holder> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let e = map.get(&digest)?;
        (Arc::ptr_eq(&e.keys, keys) && now_s < e.holder.expires_at.saturating_add(skew_s))
            .then(|| e.holder.clone())
    }

    /// Remember that `token` verified with `keys`.
    pub fn put(&self, token: &str, keys: &Arc<JwkSet>, holder: &Holder) {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_CACHED_TOKENS {
            map.clear();
        }
        map.insert(
            digest,
            Entry {
                holder: holder.clone(),
                keys: keys.clone(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lasts_until_exp_and_only_with_its_key_set() {
        let cache = TokenCache::default();
        let keys = Arc::new(JwkSet { keys: vec![] });
        let holder = Holder {
            subject: "alice".into(),
            scopes: vec![],
            expires_at: 100,
        };
        cache.put("t", &keys, &holder);
        assert_eq!(cache.get("t", &keys, 99, 0), Some(holder.clone()));
        assert_eq!(cache.get("t", &keys, 100, 0), None, "expired");
        assert_eq!(
            cache.get("t", &keys, 100, 5),
            Some(holder),
            "within the skew"
        );
        assert_eq!(cache.get("u", &keys, 50, 0), None);
        let refreshed = Arc::new(JwkSet { keys: vec![] });
        assert_eq!(cache.get("t", &refreshed, 50, 0), None, "another key set");
    }
}
