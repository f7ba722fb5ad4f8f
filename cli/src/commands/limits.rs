//! The limits' commands: rate limits, concurrency limits and fairness weights,
//! each set, listed and deleted.

use spool_client::Client;
use spool_proto::v1;

use super::{
    Commands, Error, exit,
    print::{print_json, table},
};

/// A setting kept per activity type (or per key of one): set and listed alike,
/// printed as a table or as JSON.
pub trait Setting: Sized {
    /// The JSON field its list is printed under.
    const LIST: &'static str;

    async fn set(client: &Client, setting: Self) -> Result<Self, spool_client::Error>;

    async fn list(client: &Client, namespace: String) -> Result<Vec<Self>, spool_client::Error>;

    /// The table's headers; `listed`: the settings come from a listing, which
    /// may say more than a set answers.
    fn headers(listed: bool) -> Vec<&'static str>;

    fn row(&self, listed: bool) -> Vec<String>;

    fn json(&self, listed: bool) -> serde_json::Value;
}

impl Commands {
    /// Sets (or replaces) a setting, and prints it as stored.
    pub async fn set<S: Setting>(&self, setting: S) -> Result<i32, Error> {
        let set = S::set(&self.client, setting).await?;
        self.print_settings(std::slice::from_ref(&set), false);
        Ok(exit::OK)
    }

    /// Prints the settings of `namespace` (every namespace when empty).
    pub async fn settings<S: Setting>(&self, namespace: String) -> Result<i32, Error> {
        let listed = S::list(&self.client, namespace).await?;
        self.print_settings(&listed, true);
        Ok(exit::OK)
    }

    fn print_settings<S: Setting>(&self, settings: &[S], listed: bool) {
        if self.json {
            let list: Vec<serde_json::Value> = settings.iter().map(|s| s.json(listed)).collect();
            print_json(&serde_json::json!({ S::LIST: list }));
            return;
        }
        let rows: Vec<Vec<String>> = settings.iter().map(|s| s.row(listed)).collect();
        print!("{}", table(&S::headers(listed), &rows));
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
}

impl Setting for v1::RateLimit {
    const LIST: &'static str = "rate_limits";

    async fn set(client: &Client, setting: Self) -> Result<Self, spool_client::Error> {
        client.set_rate_limit(setting).await
    }

    async fn list(client: &Client, namespace: String) -> Result<Vec<Self>, spool_client::Error> {
        client.list_rate_limits(namespace).await
    }

    fn headers(_: bool) -> Vec<&'static str> {
        vec!["NAMESPACE", "TYPE", "KEY", "LIMIT", "BURST", "AVAILABLE"]
    }

    fn row(&self, _: bool) -> Vec<String> {
        vec![
            self.namespace.clone(),
            self.activity_type.clone(),
            if self.concurrency_key.is_empty() {
                "(type)".to_owned()
            } else {
                self.concurrency_key.clone()
            },
            format!("{}/{}", self.limit, rate_period(self)),
            self.burst.to_string(),
            self.available.to_string(),
        ]
    }

    fn json(&self, _: bool) -> serde_json::Value {
        serde_json::json!({
            "namespace": self.namespace, "activity_type": self.activity_type,
            "concurrency_key": self.concurrency_key,
            "limit": self.limit, "period": rate_period(self), "burst": self.burst,
            "available": self.available,
        })
    }
}

fn rate_period(limit: &v1::RateLimit) -> String {
    limit
        .period
        .as_ref()
        .and_then(|p| spool_proto::duration::from_proto(Some(p)).ok().flatten())
        .map(spool_proto::duration::format)
        .unwrap_or_default()
}

impl Setting for v1::ConcurrencyLimit {
    const LIST: &'static str = "concurrency_limits";

    async fn set(client: &Client, setting: Self) -> Result<Self, spool_client::Error> {
        client.set_concurrency_limit(setting).await
    }

    async fn list(client: &Client, namespace: String) -> Result<Vec<Self>, spool_client::Error> {
        client.list_concurrency_limits(namespace).await
    }

    fn headers(_: bool) -> Vec<&'static str> {
        vec![
            "NAMESPACE",
            "TYPE",
            "KEY",
            "PER_KEY",
            "WEIGHT",
            "STRATEGY",
            "KEYS",
            "RUNNING",
            "HELD",
        ]
    }

    fn row(&self, _: bool) -> Vec<String> {
        let keyed = !self.concurrency_key.is_empty();
        vec![
            self.namespace.clone(),
            self.activity_type.clone(),
            key_column(&self.concurrency_key),
            match self.max_running {
                0 => "type's".to_owned(),
                max => max.to_string(),
            },
            if keyed {
                self.weight.to_string()
            } else {
                "-".to_owned()
            },
            strategy_label(self.strategy),
            self.keys.to_string(),
            self.running.to_string(),
            self.held.to_string(),
        ]
    }

    fn json(&self, _: bool) -> serde_json::Value {
        serde_json::json!({
            "namespace": self.namespace, "activity_type": self.activity_type,
            "concurrency_key": self.concurrency_key, "max_running": self.max_running,
            "weight": self.weight, "keys": self.keys, "running": self.running,
            "strategy": strategy_label(self.strategy), "held": self.held,
        })
    }
}

/// A listing counts each weight's key's waiting activities; a set weight comes
/// back without.
impl Setting for v1::FairnessWeight {
    const LIST: &'static str = "fairness_weights";

    async fn set(client: &Client, setting: Self) -> Result<Self, spool_client::Error> {
        client.set_fairness_weight(setting).await
    }

    async fn list(client: &Client, namespace: String) -> Result<Vec<Self>, spool_client::Error> {
        client.list_fairness_weights(namespace).await
    }

    fn headers(listed: bool) -> Vec<&'static str> {
        let mut headers = vec!["NAMESPACE", "TYPE", "FAIRNESS KEY", "WEIGHT"];
        if listed {
            headers.push("WAITING");
        }
        headers
    }

    fn row(&self, listed: bool) -> Vec<String> {
        let mut row = vec![
            self.namespace.clone(),
            self.activity_type.clone(),
            self.fairness_key.clone(),
            self.weight.to_string(),
        ];
        if listed {
            // Counted among the type's first 100,000 waiting activities.
            let more = if self.waiting_truncated { "+" } else { "" };
            row.push(format!("{}{more}", self.waiting));
        }
        row
    }

    fn json(&self, listed: bool) -> serde_json::Value {
        let mut item = serde_json::json!({
            "namespace": self.namespace, "activity_type": self.activity_type,
            "fairness_key": self.fairness_key, "weight": self.weight,
        });
        if listed {
            item["waiting"] = self.waiting.into();
            item["waiting_truncated"] = self.waiting_truncated.into();
        }
        item
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
