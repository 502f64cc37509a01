//! Provider health on the gateway side: a circuit per paired peer and skill.
//!
//! `failures_to_open` transport failures in a row (the provider could not be reached, or did
//! not answer) open the circuit: calls fail at once with `DEPENDENCY_UNAVAILABLE` (retryable,
//! `Retry-After`) for a backoff. After it, one call goes through as a probe (half open): an
//! answer of any kind closes the circuit, another failure opens it again for twice the
//! backoff (up to `max_backoff_ms`). Any answer from the provider, success or error, counts as
//! the provider being seen.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use carapace_filters::Rejection;
use serde::Serialize;
use tokio::time::Instant;

use crate::config::HealthConfig;

/// A circuit's state, as `carapace peers` and the metrics show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug, Default)]
struct Circuit {
    failures: u32,
    open_until: Option<Instant>,
    backoff: Duration,
    probing: bool,
    last_seen_ms: Option<u64>,
}

impl Circuit {
    fn state(&self, now: Instant) -> CircuitState {
        match self.open_until {
            None => CircuitState::Closed,
            Some(_) if self.probing => CircuitState::HalfOpen,
            Some(until) if now >= until => CircuitState::HalfOpen,
            Some(_) => CircuitState::Open,
        }
    }
}

/// What one provider's health looks like now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Health {
    pub state: CircuitState,
    pub consecutive_failures: u32,
    /// Unix ms of the last answer.
    pub last_seen_ms: Option<u64>,
}

/// The circuits of every provider the outbound role calls.
#[derive(Debug)]
pub struct ProviderHealth {
    circuits: Mutex<HashMap<String, Circuit>>,
    failures_to_open: u32,
    backoff: Duration,
    max_backoff: Duration,
}

/// A call let through; [`Admitted::ended`] says how it ended. Dropped without that (the
/// call was cancelled or timed out above), it counts as neither, and frees the probe.
#[derive(Debug)]
#[must_use]
pub struct Admitted {
    probe: bool,
    provider: String,
    health: Arc<ProviderHealth>,
    ended: bool,
}

impl Admitted {
    /// The call ended: `reached` if the provider answered at all.
    pub fn ended(mut self, reached: bool, now_ms: u64) {
        self.ended = true;
        self.health
            .record(&self.provider, self.probe, reached, now_ms);
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if !self.ended && self.probe {
            let mut circuits = self
                .health
                .circuits
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(c) = circuits.get_mut(&self.provider) {
                c.probing = false;
            }
        }
    }
}

impl ProviderHealth {
    pub fn new(cfg: &HealthConfig) -> Self {
        ProviderHealth {
            circuits: Mutex::default(),
            failures_to_open: cfg.failures_to_open,
            backoff: Duration::from_millis(cfg.backoff_ms),
            max_backoff: Duration::from_millis(cfg.max_backoff_ms),
        }
    }

    /// Let a call to `provider` through, or refuse it at once while its circuit is open (or
    /// while another call is its probe).
    pub fn admit(self: &Arc<Self>, provider: &str) -> Result<Admitted, Rejection> {
        let now = Instant::now();
        let mut circuits = self.circuits.lock().unwrap_or_else(|e| e.into_inner());
        let c = circuits.entry(provider.to_string()).or_default();
        let admitted = |probe| Admitted {
            probe,
            provider: provider.to_string(),
            health: self.clone(),
            ended: false,
        };
        match (c.open_until, c.probing) {
            (None, _) => Ok(admitted(false)),
            (Some(until), false) if now >= until => {
                c.probing = true;
                Ok(admitted(true))
            }
            (Some(until), _) => Err(Rejection::CircuitOpen {
                provider: provider.to_string(),
                retry_after: until
                    .saturating_duration_since(now)
                    .max(Duration::from_secs(1)),
            }),
        }
    }

    fn record(&self, provider: &str, probe: bool, reached: bool, now_ms: u64) {
        let now = Instant::now();
        let mut circuits = self.circuits.lock().unwrap_or_else(|e| e.into_inner());
        let c = circuits.entry(provider.to_string()).or_default();
        if probe {
            c.probing = false;
        }
        if reached {
            if c.open_until.is_some() {
                tracing::info!(provider, "circuit closed: the provider answers again");
            }
            *c = Circuit {
                last_seen_ms: Some(now_ms),
                ..Circuit::default()
            };
            return;
        }
        c.failures = c.failures.saturating_add(1);
        let reopen = probe || (c.open_until.is_none() && c.failures >= self.failures_to_open);
        if reopen {
            c.backoff = match probe {
                true => (c.backoff * 2).min(self.max_backoff),
                false => self.backoff,
            };
            c.open_until = Some(now + c.backoff);
            tracing::warn!(
                provider,
                failures = c.failures,
                backoff_ms = c.backoff.as_millis() as u64,
                "circuit open: the provider does not answer"
            );
        }
    }

    /// One provider's health (closed and never seen if no call went to it yet).
    pub fn of(&self, provider: &str) -> Health {
        let circuits = self.circuits.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match circuits.get(provider) {
            Some(c) => Health {
                state: c.state(now),
                consecutive_failures: c.failures,
                last_seen_ms: c.last_seen_ms,
            },
            None => Health {
                state: CircuitState::Closed,
                consecutive_failures: 0,
                last_seen_ms: None,
            },
        }
    }

    /// Note that `provider` answered outside a call (a discovery).
    pub fn seen(&self, provider: &str, now_ms: u64) {
        let mut circuits = self.circuits.lock().unwrap_or_else(|e| e.into_inner());
        circuits
            .entry(provider.to_string())
            .or_default()
            .last_seen_ms = Some(now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> Arc<ProviderHealth> {
        Arc::new(ProviderHealth::new(&HealthConfig {
            failures_to_open: 3,
            backoff_ms: 1000,
            max_backoff_ms: 4000,
        }))
    }

    fn fail(h: &Arc<ProviderHealth>) {
        h.admit("p").unwrap().ended(false, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_open_the_circuit_a_probe_closes_it() {
        let h = health();
        for _ in 0..3 {
            fail(&h);
        }
        assert_eq!(h.of("p").state, CircuitState::Open);
        assert!(matches!(h.admit("p"), Err(Rejection::CircuitOpen { .. })));
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(h.of("p").state, CircuitState::HalfOpen);
        let probe = h.admit("p").unwrap();
        // Only one probe at a time.
        assert!(h.admit("p").is_err());
        probe.ended(true, 42);
        assert_eq!(
            h.of("p"),
            Health {
                state: CircuitState::Closed,
                consecutive_failures: 0,
                last_seen_ms: Some(42)
            }
        );
        assert!(h.admit("p").is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_doubles_the_backoff_up_to_the_maximum() {
        let h = health();
        for _ in 0..3 {
            fail(&h);
        }
        for wait in [1000, 2000, 4000, 4000] {
            tokio::time::advance(Duration::from_millis(wait - 1)).await;
            assert!(h.admit("p").is_err(), "still open before {wait} ms");
            tokio::time::advance(Duration::from_millis(1)).await;
            fail(&h);
        }
        // Another provider is not affected.
        assert!(h.admit("q").is_ok());
        // A probe dropped before it ended frees the way for the next one.
        tokio::time::advance(Duration::from_millis(4000)).await;
        drop(h.admit("p").unwrap());
        assert!(h.admit("p").is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_resets_the_count() {
        let h = health();
        fail(&h);
        fail(&h);
        h.admit("p").unwrap().ended(true, 1);
        fail(&h);
        fail(&h);
        assert_eq!(h.of("p").state, CircuitState::Closed);
    }
}
