//! The activity commands' flags (submit, get, wait, cancel, retry, ls), and how
//! each command's flags become its call.

use std::time::Duration;

use spool_proto::v1;

use super::{ClientArgs, connect, duration};
use crate::commands::{self, Bulk, Commands, Error, exit};

#[derive(clap::Args)]
pub(crate) struct SubmitArgs {
    /// The activity type a worker registered.
    activity_type: String,
    /// Input as inline JSON, or @FILE for a file's contents.
    #[arg(long, default_value = "{}")]
    input: String,
    /// The workflow id (default: a new UUIDv7).
    #[arg(long, default_value = "")]
    workflow_id: String,
    /// The activity id (default: a new UUIDv7).
    #[arg(long, default_value = "")]
    activity_id: String,
    /// The namespace (default: "default").
    #[arg(long, env = "SPOOL_NAMESPACE", default_value = "")]
    namespace: String,
    /// Run no earlier than this from now (e.g. 30s, 5m).
    #[arg(long, value_parser = duration)]
    delay: Option<Duration>,
    /// Attempts before the activity is FAILED for good, at least 1 (default: the
    /// server's, 10).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: Option<u32>,
    /// Higher runs first among due activities of its type (may be negative).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    priority: i32,
    /// Activities of the type sharing this key run at most the type's concurrency
    /// limit at once (`spool concurrency-limit set`).
    #[arg(long, default_value = "")]
    concurrency_key: String,
    /// Activities of the type are served fairly over these keys (a tenant, say):
    /// one key's backlog does not delay another key's activities.
    #[arg(long, default_value = "")]
    fairness_key: String,
    /// This activity's weight within its fairness key, 1 to 1,000: a key whose
    /// activities weigh 3 is served three times as often as one whose weigh 1.
    #[arg(long, requires = "fairness_key", value_parser = clap::value_parser!(u32).range(1..=1000))]
    fairness_weight: Option<u32>,
    /// Wait for the outcome (exit 3 if it FAILED or was CANCELLED).
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this long and exit 4.
    #[arg(long, value_parser = duration, requires = "wait")]
    timeout: Option<Duration>,
    #[command(flatten)]
    client: ClientArgs,
}

impl SubmitArgs {
    pub(crate) async fn run(self, before: &ClientArgs) -> Result<i32, Error> {
        let request = v1::SubmitRequest {
            namespace: self.namespace,
            workflow_id: self.workflow_id,
            activity_id: self.activity_id,
            activity_type: self.activity_type,
            input: Some(commands::input(&self.input)?),
            delay: self.delay.map(spool_proto::duration::to_proto),
            retry_policy: self.max_attempts.map(|max_attempts| v1::RetryPolicy {
                max_attempts,
                ..Default::default()
            }),
            priority: self.priority,
            concurrency_key: self.concurrency_key,
            fairness_key: self.fairness_key,
            fairness_weight: self.fairness_weight.unwrap_or_default(),
            ..Default::default()
        };
        let wait = self.wait.then_some(self.timeout);
        connect(&self.client, before)
            .await?
            .submit(request, wait)
            .await
    }
}

#[derive(clap::Args)]
struct KeyArgs {
    /// The activity: NAMESPACE/WORKFLOW_ID/ACTIVITY_ID as `spool` prints it, or
    /// WORKFLOW_ID/ACTIVITY_ID, or the workflow id alone followed by ACTIVITY_ID (for
    /// ids holding a '/').
    #[arg(value_name = "KEY")]
    key: String,
    /// The activity id, when KEY is the workflow id alone.
    activity_id: Option<String>,
    /// The namespace, when KEY does not name one (default: SPOOL_NAMESPACE, else
    /// "default").
    #[arg(long)]
    namespace: Option<String>,
    #[command(flatten)]
    client: ClientArgs,
}

impl KeyArgs {
    fn key(&self) -> Result<v1::ActivityKey, Error> {
        Self::resolve(
            &self.key,
            self.activity_id.as_deref(),
            self.namespace.as_deref(),
        )
    }

    fn resolve(
        key: &str,
        activity_id: Option<&str>,
        namespace: Option<&str>,
    ) -> Result<v1::ActivityKey, Error> {
        let mut key = commands::parse_key(key, activity_id, namespace)?;
        // The environment's namespace only where neither the key nor a flag names one.
        if key.namespace.is_empty()
            && let Ok(namespace) = std::env::var("SPOOL_NAMESPACE")
        {
            key.namespace = namespace;
        }
        Ok(key)
    }

    /// The key, then a connection: a key that is not one fails before any call.
    async fn connect(&self, before: &ClientArgs) -> Result<(v1::ActivityKey, Commands), Error> {
        let key = self.key()?;
        Ok((key, connect(&self.client, before).await?))
    }
}

#[derive(clap::Args)]
pub(crate) struct GetArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// Also show each ended attempt: outcome, times, worker and node, error.
    #[arg(long)]
    history: bool,
}

impl GetArgs {
    pub(crate) async fn run(self, before: &ClientArgs) -> Result<i32, Error> {
        let (key, cli) = self.key.connect(before).await?;
        cli.get(key, self.history).await
    }
}

#[derive(clap::Args)]
pub(crate) struct WaitArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// Give up after this long (e.g. 30s, 5m) and show the state so far, exit 4.
    #[arg(long, value_parser = duration)]
    timeout: Option<Duration>,
}

impl WaitArgs {
    pub(crate) async fn run(self, before: &ClientArgs) -> Result<i32, Error> {
        let (key, cli) = self.key.connect(before).await?;
        cli.wait(key, self.timeout).await
    }
}

#[derive(clap::Args)]
pub(crate) struct CancelArgs {
    #[command(flatten)]
    selection: Selection,
    /// Why, shown as the activity's last error.
    #[arg(long, default_value = "")]
    reason: String,
}

impl CancelArgs {
    pub(crate) async fn run(self, before: &ClientArgs) -> Result<i32, Error> {
        let running = [v1::ActivityStatus::Scheduled, v1::ActivityStatus::Running];
        let action = Bulk::Cancel {
            reason: self.reason,
        };
        self.selection.run(before, action, &running).await
    }
}

/// One activity by key, or with --all every activity matching the filters.
#[derive(clap::Args)]
pub(crate) struct Selection {
    /// The activity, as for `get`; leave it out and pass --all to act on every
    /// activity matching --type and --status.
    #[arg(value_name = "KEY", required_unless_present = "all")]
    key: Option<String>,
    /// The activity id, when KEY is the workflow id alone.
    activity_id: Option<String>,
    /// The namespace (default: SPOOL_NAMESPACE, else "default").
    #[arg(long)]
    namespace: Option<String>,
    /// Act on every activity matching --type and --status, not on one key.
    #[arg(long, conflicts_with = "key")]
    all: bool,
    /// With --all: only this activity type.
    #[arg(long = "type", requires = "all")]
    activity_type: Option<String>,
    /// With --all: only this status (retry: failed by default; cancel: scheduled
    /// and running).
    #[arg(long, requires = "all", value_parser = commands::parse_status)]
    status: Option<v1::ActivityStatus>,
    /// With --all: list the activities it would act on, and change nothing.
    #[arg(long, requires = "all")]
    dry_run: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl Selection {
    fn key(&self) -> Result<v1::ActivityKey, Error> {
        KeyArgs::resolve(
            self.key.as_deref().unwrap_or_default(),
            self.activity_id.as_deref(),
            self.namespace.as_deref(),
        )
    }

    /// The lists --all acts on: one per status.
    fn lists(&self, default_statuses: &[v1::ActivityStatus]) -> Vec<v1::ListRequest> {
        let namespace = self
            .namespace
            .clone()
            .or_else(|| std::env::var("SPOOL_NAMESPACE").ok())
            .unwrap_or_default();
        let statuses = match self.status {
            Some(s) => vec![s],
            None => default_statuses.to_vec(),
        };
        statuses
            .into_iter()
            .map(|status| v1::ListRequest {
                namespace: namespace.clone(),
                status: status as i32,
                activity_type: self.activity_type.clone().unwrap_or_default(),
                page_size: 500,
                ..Default::default()
            })
            .collect()
    }

    /// Runs `action` on the key, or on every match with --all.
    async fn run(
        &self,
        before: &ClientArgs,
        action: Bulk,
        default_statuses: &[v1::ActivityStatus],
    ) -> Result<i32, Error> {
        let cli = connect(&self.client, before).await?;
        if !self.all {
            let key = self.key()?;
            return match action {
                Bulk::Retry => cli.retry(key).await,
                Bulk::Cancel { reason } => cli.cancel(key, reason).await,
            };
        }
        let mut code = exit::OK;
        for list in self.lists(default_statuses) {
            code = code.max(cli.bulk(list, action.clone(), self.dry_run).await?);
        }
        Ok(code)
    }

    /// `spool retry`: with --all, the FAILED ones unless --status says otherwise.
    pub(crate) async fn retry(&self, before: &ClientArgs) -> Result<i32, Error> {
        self.run(before, Bulk::Retry, &[v1::ActivityStatus::Failed])
            .await
    }
}

#[derive(clap::Args)]
pub(crate) struct LsArgs {
    /// The namespace (default: "default").
    #[arg(long, env = "SPOOL_NAMESPACE", default_value = "")]
    namespace: String,
    /// Only this status: scheduled, running, completed, failed or cancelled.
    #[arg(long, value_parser = commands::parse_status)]
    status: Option<v1::ActivityStatus>,
    /// Only this activity type.
    #[arg(long = "type")]
    activity_type: Option<String>,
    /// The most activities to show.
    #[arg(long, default_value_t = 50, conflicts_with = "all")]
    limit: usize,
    /// Show every matching activity.
    #[arg(long)]
    all: bool,
    /// Start after the page a previous `ls` ended with (it prints the token to use).
    #[arg(long, default_value = "")]
    page_token: String,
    /// Oldest first instead of newest first.
    #[arg(long)]
    oldest_first: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl LsArgs {
    pub(crate) async fn run(self, before: &ClientArgs) -> Result<i32, Error> {
        let request = v1::ListRequest {
            namespace: self.namespace,
            status: self.status.map_or(0, |s| s as i32),
            activity_type: self.activity_type.unwrap_or_default(),
            page_token: self.page_token,
            newest_first: !self.oldest_first,
            ..Default::default()
        };
        let limit = if self.all { usize::MAX } else { self.limit };
        connect(&self.client, before)
            .await?
            .list(request, limit)
            .await
    }
}
