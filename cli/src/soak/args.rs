//! `spool soak`'s flags, and the `Options` they make.

use std::time::Duration;

use super::{Fault, Options};
use crate::args::duration;

#[derive(clap::Args)]
pub(crate) struct SoakArgs {
    /// Run N nodes sharing a fresh schema on this PostgreSQL server (default: one
    /// node on SQLite).
    #[arg(long, env = "SPOOL_SOAK_POSTGRES_URL")]
    postgres: Option<String>,
    /// Nodes (PostgreSQL only).
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// How long faults are injected and activities submitted.
    #[arg(long, default_value = "60s", value_parser = duration)]
    duration: Duration,
    /// Seeds the fault schedule and the workload (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Submits per second.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Concurrency of each worker.
    #[arg(long, default_value_t = 16)]
    concurrency: u32,
    /// Fault kinds to pick from (default: all the store supports): node-kill,
    /// node-term, node-pause, worker-kill, worker-stop, network-cut, pg-restart,
    /// disk-full.
    #[arg(long, value_delimiter = ',', value_parser = Fault::parse)]
    faults: Vec<Fault>,
    /// Shortest time between faults.
    #[arg(long, default_value = "2s", value_parser = duration)]
    fault_min: Duration,
    /// Longest time between faults.
    #[arg(long, default_value = "6s", value_parser = duration)]
    fault_max: Duration,
    /// Run directory for logs, histories and report.json (default: a fresh one).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Deliberate breakages for the nodes (a build with the breakages feature):
    /// fencing, release-counted, ack-before-commit.
    #[arg(long = "break", value_delimiter = ',')]
    breakages: Vec<String>,
    /// Size of the filesystem for the SQLite file, in MiB (disk-full faults).
    #[arg(long, default_value_t = 1024)]
    disk_mb: u64,
    /// Command that restarts PostgreSQL (pg-restart faults).
    #[arg(
        long,
        default_value = "pg_ctlcluster --skip-systemctl-redirect 15 main restart"
    )]
    pg_restart: String,
    /// How long to wait after the faults for every activity to finish.
    #[arg(long, default_value = "120s", value_parser = duration)]
    settle: Duration,
    /// The nodes' keep-alive interval (a worker silent for three is evicted).
    #[arg(long, default_value = "1s", value_parser = duration)]
    heartbeat_interval: Duration,
    /// The spool binary nodes and workers run (default: this one).
    #[arg(long)]
    binary: Option<std::path::PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

impl SoakArgs {
    /// Runs the soak; prints the report (with --json, as JSON); its exit code:
    /// 1 if it failed.
    pub(crate) async fn run(self) -> anyhow::Result<i32> {
        let json = self.json;
        let binary = match self.binary {
            Some(b) => b,
            None => std::env::current_exe()?,
        };
        let seed = self.seed.unwrap_or_else(rand::random);
        let options = Options {
            binary,
            postgres: self.postgres,
            nodes: self.nodes,
            duration: self.duration,
            seed,
            rate: self.rate,
            workers: self.workers,
            concurrency: self.concurrency,
            faults: self.faults,
            fault_every: (self.fault_min, self.fault_max),
            dir: self.dir,
            breakages: self.breakages,
            disk_mb: self.disk_mb,
            pg_restart: self.pg_restart,
            settle: self.settle,
            heartbeat_interval: self.heartbeat_interval,
        };
        let report = super::run(options).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.summary());
        }
        Ok(if report.passed { 0 } else { 1 })
    }
}
