//! `spool soak`'s flags: the soak's [`Options`], each declared once.

use std::{path::PathBuf, time::Duration};

use super::Fault;
use crate::args::duration;

/// A soak's settings: the flags of `spool soak`, each declared once.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Options {
    /// Run N nodes sharing a fresh schema on this PostgreSQL server (default: one
    /// node on SQLite).
    #[arg(long, env = "SPOOL_SOAK_POSTGRES_URL")]
    pub postgres: Option<String>,
    /// Nodes (PostgreSQL only).
    #[arg(long, default_value_t = 2)]
    pub nodes: usize,
    /// How long faults are injected and activities submitted.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub duration: Duration,
    /// Seeds the fault schedule and the workload (default: random, printed).
    #[arg(long, default_value_t = rand::random(), hide_default_value = true)]
    pub seed: u64,
    /// Submits per second.
    #[arg(long, default_value_t = 100)]
    pub rate: u32,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Concurrency of each worker.
    #[arg(long, default_value_t = 16)]
    pub concurrency: u32,
    /// Fault kinds to pick from (default: all the store supports): node-kill,
    /// node-term, node-pause, worker-kill, worker-stop, network-cut, pg-restart,
    /// disk-full.
    #[arg(long, value_delimiter = ',', value_parser = Fault::parse)]
    pub faults: Vec<Fault>,
    /// Shortest time between faults.
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub fault_min: Duration,
    /// Longest time between faults.
    #[arg(long, default_value = "6s", value_parser = duration)]
    pub fault_max: Duration,
    /// Run directory for logs, histories and report.json (default: a fresh one).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
    /// Deliberate breakages for the nodes (a build with the breakages feature):
    /// fencing, release-counted, ack-before-commit.
    #[arg(long = "break", value_delimiter = ',')]
    pub breakages: Vec<String>,
    /// Size of the filesystem for the SQLite file, in MiB (disk-full faults).
    #[arg(long, default_value_t = 1024)]
    pub disk_mb: u64,
    /// Command that restarts PostgreSQL (pg-restart faults).
    #[arg(
        long,
        default_value = "pg_ctlcluster --skip-systemctl-redirect 15 main restart"
    )]
    pub pg_restart: String,
    /// How long to wait after the faults for every activity to finish.
    #[arg(long, default_value = "120s", value_parser = duration)]
    pub settle: Duration,
    /// The nodes' keep-alive interval (a worker silent for three is evicted).
    #[arg(long, default_value = "1s", value_parser = duration)]
    pub heartbeat_interval: Duration,
    /// The spool binary nodes and workers run (default: this one).
    #[arg(long, default_value_os_t = this_binary(), hide_default_value = true)]
    pub binary: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

impl Options {
    /// Runs the soak; prints the report (with --json, as JSON); its exit code:
    /// 1 if it failed.
    pub(crate) async fn run(self) -> anyhow::Result<i32> {
        let json = self.json;
        let report = super::run(self).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.summary());
        }
        Ok(if report.passed { 0 } else { 1 })
    }
}

/// The running binary, which nodes and workers run unless told otherwise; by
/// name on `PATH` where it cannot be found.
fn this_binary() -> PathBuf {
    std::env::current_exe().unwrap_or_else(|_| PathBuf::from("spool"))
}
