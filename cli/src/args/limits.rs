//! The flags of the limits' commands (rate-limit, concurrency-limit,
//! fairness-weight), and how each becomes its call.

use std::time::Duration;

use spool_proto::v1;

use super::{ClientArgs, NamespaceArgs, duration};
use crate::commands::{Error, LimitKind};

#[derive(clap::Subcommand)]
pub(crate) enum RateLimitCommand {
    /// Set (or replace) a type's limit: at most --limit rows each --per; or with
    /// --key, one concurrency key's.
    Set(RateLimitSetArgs),
    /// List the limits, with what each has available now.
    List(NamespaceArgs),
    /// Remove a type's limit, or with --key that key's.
    Delete(LimitDeleteArgs),
}

impl RateLimitCommand {
    pub(crate) async fn run(self, before: &ClientArgs) -> Result<i32, Error> {
        match self {
            RateLimitCommand::Set(a) => {
                let cli = a.of.scope.connect(before).await?;
                let limit = v1::RateLimit {
                    namespace: a.of.scope.namespace,
                    activity_type: a.of.activity_type,
                    limit: a.limit,
                    period: Some(spool_proto::duration::to_proto(a.per)),
                    burst: a.burst,
                    concurrency_key: a.key.unwrap_or_default(),
                    available: 0,
                };
                cli.set(limit).await
            }
            RateLimitCommand::List(n) => n.list::<v1::RateLimit>(before).await,
            RateLimitCommand::Delete(a) => a.run(LimitKind::Rate, before).await,
        }
    }
}

#[derive(clap::Subcommand)]
pub(crate) enum ConcurrencyLimitCommand {
    /// Set (or replace) a type's limit: at most --max running per key; or with
    /// --key, one key's own --max and --weight.
    Set(ConcurrencyLimitSetArgs),
    /// List the limits, the types' then their keys', with their use now.
    List(NamespaceArgs),
    /// Remove a type's limit, or with --key what was set for that key.
    Delete(LimitDeleteArgs),
}

impl ConcurrencyLimitCommand {
    pub(crate) async fn run(self, before: &ClientArgs) -> Result<i32, Error> {
        match self {
            ConcurrencyLimitCommand::Set(a) => {
                let cli = a.of.scope.connect(before).await?;
                let limit = v1::ConcurrencyLimit {
                    namespace: a.of.scope.namespace,
                    activity_type: a.of.activity_type,
                    max_running: a.max.unwrap_or_default(),
                    concurrency_key: a.key.unwrap_or_default(),
                    weight: a.weight.unwrap_or_default(),
                    strategy: match a.strategy.as_str() {
                        "cancel-newest" => v1::ConcurrencyStrategy::CancelNewest,
                        "cancel-in-progress" => v1::ConcurrencyStrategy::CancelInProgress,
                        _ => v1::ConcurrencyStrategy::Queue,
                    } as i32,
                    ..Default::default()
                };
                cli.set(limit).await
            }
            ConcurrencyLimitCommand::List(n) => n.list::<v1::ConcurrencyLimit>(before).await,
            ConcurrencyLimitCommand::Delete(a) => a.run(LimitKind::Concurrency, before).await,
        }
    }
}

#[derive(clap::Subcommand)]
pub(crate) enum FairnessWeightCommand {
    /// Set (or replace) one fairness key's weight: its share of claims against
    /// the type's other keys waiting, 1 to 1000.
    Set(FairnessWeightSetArgs),
    /// List the weights set.
    List(NamespaceArgs),
    /// Remove a key's weight: its activities are placed by their own weights again.
    Delete(FairnessWeightDeleteArgs),
}

impl FairnessWeightCommand {
    pub(crate) async fn run(self, before: &ClientArgs) -> Result<i32, Error> {
        match self {
            FairnessWeightCommand::Set(a) => {
                let cli = a.of.scope.connect(before).await?;
                let weight = v1::FairnessWeight {
                    namespace: a.of.scope.namespace,
                    activity_type: a.of.activity_type,
                    fairness_key: a.key,
                    weight: a.weight,
                    ..Default::default()
                };
                cli.set(weight).await
            }
            FairnessWeightCommand::List(n) => n.list::<v1::FairnessWeight>(before).await,
            FairnessWeightCommand::Delete(a) => {
                let TypeArgs {
                    activity_type,
                    scope,
                } = a.of;
                scope
                    .connect(before)
                    .await?
                    .delete_fairness_weight(scope.namespace, activity_type, a.key)
                    .await
            }
        }
    }
}

#[derive(clap::Args)]
pub(crate) struct FairnessWeightSetArgs {
    /// The fairness key (a tenant, say).
    #[arg(long)]
    key: String,
    /// 1 to 1000: a key of weight 3 is served three times as often as one of 1.
    #[arg(long)]
    weight: u32,
    #[command(flatten)]
    of: TypeArgs,
}

#[derive(clap::Args)]
pub(crate) struct FairnessWeightDeleteArgs {
    /// The fairness key.
    #[arg(long)]
    key: String,
    #[command(flatten)]
    of: TypeArgs,
}

#[derive(clap::Args)]
pub(crate) struct ConcurrencyLimitSetArgs {
    /// Activities per concurrency key running at once (with --key, for that key;
    /// left out, the type's).
    #[arg(long)]
    max: Option<u32>,
    /// Set this one key's own limit and weight, beside the type's.
    #[arg(long)]
    key: Option<String>,
    /// With --key: its share of claims against the type's other keys waiting,
    /// 1 to 1000 (a key of weight 3 is served three times as often as one of 1).
    #[arg(long, requires = "key")]
    weight: Option<u32>,
    /// What happens beyond --max: queue (they wait), cancel-newest (new ones are
    /// cancelled), cancel-in-progress (the oldest are cancelled for new ones).
    #[arg(long, default_value = "queue", value_parser = ["queue", "cancel-newest", "cancel-in-progress"])]
    strategy: String,
    #[command(flatten)]
    of: TypeArgs,
}

#[derive(clap::Args)]
pub(crate) struct RateLimitSetArgs {
    /// Rows per period.
    #[arg(long)]
    limit: u32,
    /// The period (whole milliseconds, up to 1h).
    #[arg(long, default_value = "1s", value_parser = duration)]
    per: Duration,
    /// Rows at once after a quiet spell (default: --limit).
    #[arg(long, default_value_t = 0)]
    burst: u32,
    /// Limit this one concurrency key's activities of the type, beside the
    /// type's own limit.
    #[arg(long)]
    key: Option<String>,
    #[command(flatten)]
    of: TypeArgs,
}

#[derive(clap::Args)]
pub(crate) struct LimitDeleteArgs {
    /// Only this concurrency key's limit.
    #[arg(long)]
    key: Option<String>,
    #[command(flatten)]
    of: TypeArgs,
}

impl LimitDeleteArgs {
    async fn run(self, kind: LimitKind, before: &ClientArgs) -> Result<i32, Error> {
        let TypeArgs {
            activity_type,
            scope,
        } = self.of;
        scope
            .connect(before)
            .await?
            .delete_limit(kind, scope.namespace, activity_type, self.key)
            .await
    }
}

/// The activity type a limit or weight is set on or deleted from, and its
/// namespace.
#[derive(clap::Args)]
pub(crate) struct TypeArgs {
    /// The activity type.
    activity_type: String,
    #[command(flatten)]
    scope: NamespaceArgs,
}
