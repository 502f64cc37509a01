//! `metering` and `tools.<name>.price`: what calls cost and what each consumer may spend
//! ([`crate::metering`]).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

use super::{err, Config, ConfigError};

/// Budgets of the consumers calling priced tools.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MeteringConfig {
    /// Budget per consumer (its component id, `local` on the Unix socket).
    #[serde(default)]
    pub budgets: BTreeMap<String, BudgetConfig>,
    /// The budget of a consumer not named in `budgets` (none: unlimited, charges recorded).
    #[serde(default)]
    pub default_budget: Option<BudgetConfig>,
    /// Budgets are kept by each process, in its own ledger: with `shared_state` on Redis
    /// (replicas), each replica lets a consumer spend its whole budget. Required then, to say
    /// that is meant (a consumer may spend N times its budget on N replicas).
    #[serde(default)]
    pub per_replica: bool,
}

/// What one consumer may spend, in the units prices are in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Per UTC day.
    #[serde(default)]
    pub per_day: Option<u64>,
    /// In all.
    #[serde(default)]
    pub total: Option<u64>,
}

impl Config {
    /// Whether any call is priced or budgeted.
    pub fn meters(&self) -> bool {
        self.metering.is_some() || self.tools.values().any(|t| t.price.is_some())
    }
}

pub(super) fn check_metering(c: &Config, errors: &mut Vec<ConfigError>) {
    if c.meters() && c.ledger.is_none() {
        errors.push(err(
            "/metering",
            "prices and budgets need `ledger`: charges are recorded there, and what each consumer spent is kept there",
        ));
    }
    let replicas = c.shared_state.backend == super::SharedStateBackend::Redis;
    if let Some(m) = c.metering.as_ref().filter(|m| replicas && !m.per_replica) {
        if !m.budgets.is_empty() || m.default_budget.is_some() {
            errors.push(err(
                "/metering",
                "budgets are kept by each replica in its own ledger, not in Redis: with shared_state on Redis a consumer may spend its budget once per replica; set `per_replica: true` to accept that, or run one replica",
            ));
        }
    }
    let budgets = c.metering.iter().flat_map(|m| &m.budgets);
    let default = c.metering.iter().filter_map(|m| m.default_budget.as_ref());
    for (at, b) in budgets
        .map(|(k, b)| (format!("/metering/budgets/{k}"), b))
        .chain(default.map(|b| ("/metering/default_budget".to_string(), b)))
    {
        if b.per_day.is_none() && b.total.is_none() {
            errors.push(err(at, "give `per_day`, `total` or both"));
        }
    }
}
