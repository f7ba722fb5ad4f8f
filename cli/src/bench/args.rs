//! `spool bench`'s flags, and the `Options` they make.

use std::time::Duration;

use super::{Options, Phase};
use crate::{
    args::{ClientArgs, duration, target},
    logging::init_logging,
};

#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
    /// The in-process server's database (default: a fresh temporary SQLite file).
    #[arg(long)]
    database: Option<String>,
    /// Activities per throughput phase.
    #[arg(long, default_value_t = 20_000)]
    activities: usize,
    /// Concurrent submit callers.
    #[arg(long, default_value_t = 16)]
    submit_concurrency: usize,
    /// Activities per SubmitBatch call.
    #[arg(long, default_value_t = 500)]
    batch: usize,
    /// Total worker concurrency.
    #[arg(long, default_value_t = 50)]
    concurrency: u32,
    /// Worker connections sharing that concurrency.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Offered rate of the latency phase, activities per second.
    #[arg(long, default_value_t = 500)]
    rate: u32,
    /// Length of the latency phase.
    #[arg(long, default_value = "10s", value_parser = duration)]
    duration: Duration,
    /// Input size of each activity.
    #[arg(long, default_value_t = 64)]
    payload_bytes: usize,
    /// Whether the SDK workers ask for batched frames (to measure what they save).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    batches: bool,
    /// Rows of a type no worker serves, stored before the phases run.
    #[arg(long, default_value_t = 0)]
    preload: usize,
    /// Workers kept connected for the whole run, serving a type nobody submits.
    #[arg(long, default_value_t = 0)]
    idle_workers: usize,
    /// Phases to run, in order: submit, drain, latency, e2e.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "submit,drain,latency,e2e"
    )]
    phases: Vec<Phase>,
    /// Start this many `spool serve` processes on --database (PostgreSQL when
    /// more than one) instead of a server in this process; callers and workers
    /// are spread over them, and each phase reports each process's CPU.
    #[arg(long, default_value_t = 0, conflicts_with = "server")]
    nodes: usize,
    /// The started servers' --retention: short, with a long latency phase, to
    /// watch the queue table level off on PostgreSQL (default: the server's).
    #[arg(long, value_parser = duration, conflicts_with = "server")]
    retention: Option<Duration>,
    /// Spread the activities over this many concurrency keys, round robin.
    #[arg(long, default_value_t = 0)]
    keys: usize,
    /// With --keys: a concurrency limit of this many running per key, on the
    /// measured types.
    #[arg(long, requires = "keys")]
    key_limit: Option<u32>,
    /// A rate limit of this many activities a second (burst as many), on the
    /// measured types.
    #[arg(long)]
    rate_limit: Option<u32>,
    /// Before the latency phase, store this many rows of one concurrency key of
    /// its type; the phase's own rows come with another key, and their pickup is
    /// measured beside that backlog (fairness between keys).
    #[arg(long, default_value_t = 0)]
    backlog: usize,
    /// The keys of --keys and --backlog are fairness keys (`submit
    /// --fairness-key`), not concurrency keys.
    #[arg(long, conflicts_with = "key_limit")]
    fairness_keys: bool,
}

impl BenchArgs {
    /// Runs the benchmark; prints the summary, or with --json the whole report.
    pub(crate) async fn run(self) -> anyhow::Result<()> {
        // The in-process server's log would drown the progress line: warnings only,
        // unless RUST_LOG says otherwise.
        init_logging("text", "warn");
        let server = self.client.server.clone();
        let target = target(&self.client)?;
        let json = target.json;
        let options = Options {
            server: server.clone(),
            database: self.database,
            token: target.token.clone(),
            tls: target.tls.clone(),
            activities: self.activities,
            submit_concurrency: self.submit_concurrency,
            batch: self.batch,
            concurrency: self.concurrency,
            workers: self.workers,
            rate: self.rate,
            duration: self.duration,
            payload_bytes: self.payload_bytes,
            batches: self.batches,
            preload: self.preload,
            idle_workers: self.idle_workers,
            phases: self.phases,
            nodes: self.nodes,
            retention: self.retention,
            keys: self.keys,
            key_limit: self.key_limit,
            rate_limit: self.rate_limit,
            backlog: self.backlog,
            fairness_keys: self.fairness_keys,
        };
        let report = super::run(options).await?;
        if json {
            println!("{report}");
        } else {
            print!("{}", super::report::summary(&report));
        }
        Ok(())
    }
}
