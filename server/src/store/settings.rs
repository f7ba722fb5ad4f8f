//! The writes of settings (rate and concurrency limits and fairness weights, set
//! or removed): each is one statement whose arguments both dialects bind alike,
//! so each is described here once ([`SettingChange::write`]) and each dialect's
//! writer only runs it.

use super::{Outcome, Setting, SettingChange};

/// The statements a dialect writes settings with; each dialect's `sql` module
/// holds one, `SETTINGS`, made by `setting_statements!`.
pub struct Statements {
    pub set_rate_limit: &'static str,
    pub set_key_rate_limit: &'static str,
    pub set_concurrency_limit: &'static str,
    pub set_key_limit: &'static str,
    pub set_fairness_weight: &'static str,
    pub remove_rate_limit: &'static str,
    pub remove_key_rate_limit: &'static str,
    pub remove_concurrency_limit: &'static str,
    pub remove_key_limit: &'static str,
    pub remove_fairness_weight: &'static str,
}

/// One argument of a setting's statement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg<'a> {
    Int(i64),
    OptInt(Option<i64>),
    Text(&'a str),
}

/// A setting's write: the statement, its arguments in order, and the outcome
/// by how many rows it changed.
#[derive(Debug)]
pub struct SettingWrite<'a> {
    pub statement: &'static str,
    pub args: Vec<Arg<'a>>,
    pub outcome: fn(u64) -> Outcome,
}

impl SettingChange {
    /// This change as one of `sql`'s statements.
    pub fn write<'a>(&'a self, sql: &Statements) -> SettingWrite<'a> {
        use Arg::{Int, OptInt, Text};
        match self {
            SettingChange::RateLimit(limit) => {
                let mut args = vec![
                    Text(&limit.namespace),
                    Text(&limit.activity_type),
                    Int(i64::from(limit.per_period)),
                    Int(limit.period_ms()),
                    Int(i64::from(limit.burst)),
                    Int(limit.interval_ns()),
                ];
                let statement = match &limit.key {
                    None => sql.set_rate_limit,
                    Some(key) => {
                        args.push(Text(key));
                        sql.set_key_rate_limit
                    }
                };
                SettingWrite {
                    statement,
                    args,
                    outcome: |_| Outcome::RateLimitSet,
                }
            }
            SettingChange::ConcurrencyLimit {
                namespace,
                activity_type,
                max_running,
                strategy,
            } => SettingWrite {
                statement: sql.set_concurrency_limit,
                args: vec![
                    Text(namespace),
                    Text(activity_type),
                    Int(i64::from(*max_running)),
                    Int(strategy.code()),
                ],
                outcome: |_| Outcome::ConcurrencyLimitSet,
            },
            SettingChange::KeyLimit {
                namespace,
                activity_type,
                key,
                max_running,
                weight,
            } => SettingWrite {
                statement: sql.set_key_limit,
                args: vec![
                    Text(namespace),
                    Text(activity_type),
                    Text(key),
                    OptInt(max_running.map(i64::from)),
                    Int(i64::from(*weight)),
                ],
                outcome: |_| Outcome::ConcurrencyLimitSet,
            },
            SettingChange::FairnessWeight(set) => SettingWrite {
                statement: sql.set_fairness_weight,
                args: vec![
                    Text(&set.namespace),
                    Text(&set.activity_type),
                    Text(&set.key),
                    Int(i64::from(set.weight)),
                ],
                outcome: |_| Outcome::FairnessWeightSet,
            },
            SettingChange::Remove {
                namespace,
                activity_type,
                setting,
            } => {
                let statement = match setting {
                    Setting::RateLimit(None) => sql.remove_rate_limit,
                    Setting::RateLimit(Some(_)) => sql.remove_key_rate_limit,
                    Setting::ConcurrencyLimit(None) => sql.remove_concurrency_limit,
                    Setting::ConcurrencyLimit(Some(_)) => sql.remove_key_limit,
                    Setting::FairnessWeight(_) => sql.remove_fairness_weight,
                };
                let mut args = vec![Text(namespace), Text(activity_type)];
                args.extend(setting.key().map(Text));
                SettingWrite {
                    statement,
                    args,
                    outcome: |removed| Outcome::Removed(removed > 0),
                }
            }
        }
    }
}
