//! The limits' commands: rate limits, concurrency limits and fairness weights,
//! each set, listed and deleted.

use spool_proto::v1;

use super::{
    Commands, Error, exit,
    print::{print_json, table},
};

impl Commands {
    pub async fn set_rate_limit(&self, limit: v1::RateLimit) -> Result<i32, Error> {
        let set = self.client.set_rate_limit(limit).await?;
        self.print_rate_limits(std::slice::from_ref(&set));
        Ok(exit::OK)
    }

    pub async fn rate_limits(&self, namespace: String) -> Result<i32, Error> {
        let limits = self.client.list_rate_limits(namespace).await?;
        self.print_rate_limits(&limits);
        Ok(exit::OK)
    }

    pub async fn set_concurrency_limit(&self, limit: v1::ConcurrencyLimit) -> Result<i32, Error> {
        let set = self.client.set_concurrency_limit(limit).await?;
        self.print_concurrency_limits(std::slice::from_ref(&set));
        Ok(exit::OK)
    }

    pub async fn concurrency_limits(&self, namespace: String) -> Result<i32, Error> {
        let limits = self.client.list_concurrency_limits(namespace).await?;
        self.print_concurrency_limits(&limits);
        Ok(exit::OK)
    }

    pub async fn set_fairness_weight(&self, weight: v1::FairnessWeight) -> Result<i32, Error> {
        let set = self.client.set_fairness_weight(weight).await?;
        self.print_fairness_weights(std::slice::from_ref(&set), false);
        Ok(exit::OK)
    }

    pub async fn fairness_weights(&self, namespace: String) -> Result<i32, Error> {
        let weights = self.client.list_fairness_weights(namespace).await?;
        self.print_fairness_weights(&weights, true);
        Ok(exit::OK)
    }

    pub async fn delete_fairness_weight(
        &self,
        namespace: String,
        activity_type: String,
        key: String,
    ) -> Result<i32, Error> {
        let what = limited(&activity_type, Some(&key));
        let deleted = self
            .client
            .delete_fairness_weight(namespace, activity_type, key)
            .await?;
        self.print_deleted(deleted, "fairness weight", &what);
        Ok(exit::OK)
    }

    /// Deletes the `kind` limit of `activity_type`, or with `key`, that key's own.
    pub async fn delete_limit(
        &self,
        kind: LimitKind,
        namespace: String,
        activity_type: String,
        key: Option<String>,
    ) -> Result<i32, Error> {
        let client = &self.client;
        let of = activity_type.clone();
        let deleted = match (kind, key.clone()) {
            (LimitKind::Rate, None) => client.delete_rate_limit(namespace, of).await?,
            (LimitKind::Rate, Some(key)) => {
                client.delete_key_rate_limit(namespace, of, key).await?
            }
            (LimitKind::Concurrency, None) => {
                client.delete_concurrency_limit(namespace, of).await?
            }
            (LimitKind::Concurrency, Some(key)) => {
                client
                    .delete_concurrency_key_limit(namespace, of, key)
                    .await?
            }
        };
        let what = match kind {
            LimitKind::Rate => "rate limit",
            LimitKind::Concurrency => "concurrency limit",
        };
        self.print_deleted(deleted, what, &limited(&activity_type, key.as_deref()));
        Ok(exit::OK)
    }

    /// What a delete of `activity_type`'s `what` did.
    fn print_deleted(&self, deleted: bool, what: &str, activity_type: &str) {
        if self.json {
            print_json(&serde_json::json!({"deleted": deleted}));
        } else if deleted {
            println!("{activity_type}: no {what} now");
        } else {
            println!("{activity_type} had no {what}: nothing changed");
        }
    }

    fn print_concurrency_limits(&self, limits: &[v1::ConcurrencyLimit]) {
        if self.json {
            let list: Vec<serde_json::Value> = limits
                .iter()
                .map(|l| {
                    serde_json::json!({
                        "namespace": l.namespace, "activity_type": l.activity_type,
                        "concurrency_key": l.concurrency_key, "max_running": l.max_running,
                        "weight": l.weight, "keys": l.keys, "running": l.running,
                        "strategy": strategy_label(l.strategy), "held": l.held,
                    })
                })
                .collect();
            print_json(&serde_json::json!({"concurrency_limits": list}));
            return;
        }
        let rows: Vec<Vec<String>> = limits
            .iter()
            .map(|l| {
                let keyed = !l.concurrency_key.is_empty();
                vec![
                    l.namespace.clone(),
                    l.activity_type.clone(),
                    key_column(&l.concurrency_key),
                    match l.max_running {
                        0 => "type's".to_owned(),
                        max => max.to_string(),
                    },
                    if keyed {
                        l.weight.to_string()
                    } else {
                        "-".to_owned()
                    },
                    strategy_label(l.strategy),
                    l.keys.to_string(),
                    l.running.to_string(),
                    l.held.to_string(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &[
                    "NAMESPACE",
                    "TYPE",
                    "KEY",
                    "PER_KEY",
                    "WEIGHT",
                    "STRATEGY",
                    "KEYS",
                    "RUNNING",
                    "HELD"
                ],
                &rows
            )
        );
    }

    /// `listed`: the weights come from a listing, which counts their keys'
    /// waiting activities (a set weight comes back without).
    fn print_fairness_weights(&self, weights: &[v1::FairnessWeight], listed: bool) {
        if self.json {
            let list: Vec<serde_json::Value> = weights
                .iter()
                .map(|w| {
                    let mut item = serde_json::json!({
                        "namespace": w.namespace, "activity_type": w.activity_type,
                        "fairness_key": w.fairness_key, "weight": w.weight,
                    });
                    if listed {
                        item["waiting"] = w.waiting.into();
                        item["waiting_truncated"] = w.waiting_truncated.into();
                    }
                    item
                })
                .collect();
            print_json(&serde_json::json!({"fairness_weights": list}));
            return;
        }
        let rows: Vec<Vec<String>> = weights
            .iter()
            .map(|w| {
                let mut row = vec![
                    w.namespace.clone(),
                    w.activity_type.clone(),
                    w.fairness_key.clone(),
                    w.weight.to_string(),
                ];
                if listed {
                    // Counted among the type's first 100,000 waiting activities.
                    let more = if w.waiting_truncated { "+" } else { "" };
                    row.push(format!("{}{more}", w.waiting));
                }
                row
            })
            .collect();
        let mut headers = vec!["NAMESPACE", "TYPE", "FAIRNESS KEY", "WEIGHT"];
        if listed {
            headers.push("WAITING");
        }
        print!("{}", table(&headers, &rows));
    }

    fn print_rate_limits(&self, limits: &[v1::RateLimit]) {
        let period = |l: &v1::RateLimit| {
            l.period
                .as_ref()
                .and_then(|p| spool_proto::duration::from_proto(Some(p)).ok().flatten())
                .map(spool_proto::duration::format)
                .unwrap_or_default()
        };
        if self.json {
            let list: Vec<serde_json::Value> = limits
                .iter()
                .map(|l| {
                    serde_json::json!({
                        "namespace": l.namespace, "activity_type": l.activity_type,
                        "concurrency_key": l.concurrency_key,
                        "limit": l.limit, "period": period(l), "burst": l.burst,
                        "available": l.available,
                    })
                })
                .collect();
            print_json(&serde_json::json!({"rate_limits": list}));
            return;
        }
        let rows: Vec<Vec<String>> = limits
            .iter()
            .map(|l| {
                vec![
                    l.namespace.clone(),
                    l.activity_type.clone(),
                    if l.concurrency_key.is_empty() {
                        "(type)".to_owned()
                    } else {
                        l.concurrency_key.clone()
                    },
                    format!("{}/{}", l.limit, period(l)),
                    l.burst.to_string(),
                    l.available.to_string(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &["NAMESPACE", "TYPE", "KEY", "LIMIT", "BURST", "AVAILABLE"],
                &rows
            )
        );
    }
}

/// A limit's KEY column: the key, or `*` for the type's own limit (every key).
fn key_column(key: &str) -> String {
    if key.is_empty() {
        "*".to_owned()
    } else {
        key.to_owned()
    }
}

/// The kinds of limit `AdminService` keeps.
#[derive(Clone, Copy)]
pub enum LimitKind {
    Rate,
    Concurrency,
}

/// What a limit deleted was on: a type, or one key of it.
fn limited(activity_type: &str, key: Option<&str>) -> String {
    match key {
        None => activity_type.to_owned(),
        Some(key) => format!("{activity_type} key {key:?}"),
    }
}

fn strategy_label(code: i32) -> String {
    match v1::ConcurrencyStrategy::try_from(code) {
        Ok(v1::ConcurrencyStrategy::CancelNewest) => "cancel-newest",
        Ok(v1::ConcurrencyStrategy::CancelInProgress) => "cancel-in-progress",
        _ => "queue",
    }
    .to_owned()
}
