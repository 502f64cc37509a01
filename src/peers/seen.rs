//! When peers were last seen, and their certificates' remaining days.

use std::collections::BTreeMap;

use carapace_filters::call::Principal;

use super::{
    lock, PeerStore, PeerStoreError, Table, ACTIVE, DAY_MS, EXPIRY_WARNING_DAYS,
    EXPIRY_WARNING_INTERVAL_MS, SEEN_WRITE_INTERVAL_MS,
};
use crate::pairing::wire::GoTime;

/// When peers made their last accepted call, and what of it was written.
#[derive(Debug, Default)]
pub(super) struct SeenLog {
    /// Latest accepted call per `component_id` (Unix ms).
    seen: Table<String, u64>,
    /// Per `component_id`: when its `last_seen_at` was last written, and the value written.
    written: Table<String, (u64, u64)>,
}
/// `ms` (Unix) as RFC 3339 in UTC.
fn rfc3339_ms(ms: u64) -> Option<String> {
    let secs = i64::try_from(ms / 1000).ok()?;
    GoTime::from_unix(secs, (ms % 1000) as u32 * 1_000_000)?.to_rfc3339_nano()
}
impl PeerStore {
    /// Note that the peer `principal` made an accepted call at `now_ms` (in memory only; see
    /// [`flush_seen`](Self::flush_seen)). Callers that are not paired peers are ignored.
    pub fn note_seen(&self, principal: &Principal, now_ms: u64) {
        if principal.fingerprint.is_none() {
            return;
        }
        let mut log = lock(&self.seen);
        match log.seen.get_mut(&*principal.id) {
            Some(t) => *t = (*t).max(now_ms),
            None => {
                log.seen.insert(principal.id.to_string(), now_ms);
            }
        }
    }

    /// Write `last_seen_at` of the peers seen since it was last written for them, unless
    /// that was less than [`SEEN_WRITE_INTERVAL_MS`] before `now_ms`: one file write for all
    /// of them, or none. Returns how many peers' times were written.
    pub fn flush_seen(&self, now_ms: u64) -> Result<usize, PeerStoreError> {
        let due: BTreeMap<String, u64> = {
            let log = lock(&self.seen);
            log.seen
                .iter()
                .filter(|(id, &t)| match log.written.get(*id) {
                    None => true,
                    Some(&(at, value)) => {
                        t > value && now_ms.saturating_sub(at) >= SEEN_WRITE_INTERVAL_MS
                    }
                })
                .map(|(id, &t)| (id.clone(), t))
                .collect()
        };
        if due.is_empty() {
            return Ok(0);
        }
        self.modify(|f| {
            for p in f.peers.iter_mut().filter(|p| p.status == ACTIVE) {
                if let Some(&t) = due.get(&p.component_id) {
                    p.last_seen_at = rfc3339_ms(t);
                }
            }
        })?;
        let mut log = lock(&self.seen);
        for (id, t) in &due {
            log.written.insert(id.clone(), (now_ms, *t));
        }
        Ok(due.len())
    }

    /// Days (rounded down, negative once expired) until the certificate of each active peer
    /// whose record gives its expiry, by `component_id` (the soonest if it has several).
    pub fn certificate_expiry_days(&self, now_ms: u64) -> BTreeMap<String, i64> {
        let mut days = BTreeMap::new();
        for e in self.snapshot.load().all.iter() {
            let (Some(not_after), ACTIVE) = (e.2, e.0.status.as_str()) else {
                continue;
            };
            let d = (not_after - now_ms as i64).div_euclid(DAY_MS);
            let slot = days.entry(e.0.component_id.clone()).or_insert(d);
            *slot = (*slot).min(d);
        }
        days
    }

    /// Of `days` (see [`certificate_expiry_days`](Self::certificate_expiry_days)), the peers
    /// with fewer than [`EXPIRY_WARNING_DAYS`] left that were not warned about in the last
    /// [`EXPIRY_WARNING_INTERVAL_MS`]; they count as warned from `now_ms`.
    pub fn expiry_warnings_due(
        &self,
        days: &BTreeMap<String, i64>,
        now_ms: u64,
    ) -> Vec<(String, i64)> {
        let mut warned = lock(&self.expiry_warned);
        warned.retain(|id, _| days.contains_key(id));
        days.iter()
            .filter(|(_, &d)| d < EXPIRY_WARNING_DAYS)
            .filter(|(id, _)| {
                let due = warned
                    .get(*id)
                    .is_none_or(|&at| now_ms.saturating_sub(at) >= EXPIRY_WARNING_INTERVAL_MS);
                if due {
                    warned.insert((*id).clone(), now_ms);
                }
                due
            })
            .map(|(id, &d)| (id.clone(), d))
            .collect()
    }
}
