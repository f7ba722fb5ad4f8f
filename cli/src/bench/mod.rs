//! `spool bench`: throughput and latency, measured the way job-queue benchmarks
//! report them, each phase on its own:
//! 1. submit rate, one activity per call (N concurrent callers) and in batches;
//! 2. drain rate: a stored backlog, then workers started; activities per second
//!    from the first dispatch to the last recorded outcome (the instant its ack
//!    reached the worker);
//! 3. steady latency at a fixed offered rate: pickup (submit call made → handler
//!    started) and end to end (submit call made → outcome recorded, seen by `Wait`);
//! 4. end-to-end throughput with submitters and workers running together.
//!
//! Submitters and workers run in this process (SDK workers over loopback gRPC), so
//! pickup latency is measured on one clock: the submit instant travels in the input.
//! Without `--server`, the server runs in this process too, on a fresh database;
//! with `--nodes N`, as N `spool serve` processes on one database (`nodes`), with
//! the callers and workers spread over them and each process's CPU reported.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

pub(crate) mod args;
mod cpu;
mod load;
mod nodes;
mod phases;
mod progress;
mod queue_table;
mod report;

use spool_worker::{Payload, Worker};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::transport::Channel;

use report::{add_ratios, baseline, round};

const NAMESPACE: &str = "bench";

#[derive(Debug, Clone)]
struct Options {
    /// A running server; `None` starts one in this process.
    pub server: Option<String>,
    /// The in-process server's database (default: a fresh SQLite file).
    pub database: Option<String>,
    pub token: Option<String>,
    /// TLS settings for an `https://` server.
    pub tls: spool_proto::endpoint::ClientTls,
    /// Activities per throughput phase.
    pub activities: usize,
    pub submit_concurrency: usize,
    pub batch: usize,
    /// Total worker concurrency.
    pub concurrency: u32,
    pub workers: u32,
    pub rate: u32,
    pub duration: Duration,
    pub payload_bytes: usize,
    /// The SDK workers ask for batched frames.
    pub batches: bool,
    /// Rows of a type no worker serves, stored before the phases run.
    pub preload: usize,
    /// Workers connected for the whole run that serve a type nobody submits
    /// (to measure the cost of many connected workers).
    pub idle_workers: usize,
    pub phases: Vec<Phase>,
    /// `spool serve` processes to start on `database` (0: the server runs in this
    /// process).
    pub nodes: usize,
    /// The started servers' retention of finished rows (default: theirs).
    pub retention: Option<Duration>,
    /// Concurrency keys the activities are spread over, round robin (0: none).
    pub keys: usize,
    /// With `keys`: activities of one key running at once, on every measured type.
    pub key_limit: Option<u32>,
    /// Activities a second, on every measured type (burst: as many).
    pub rate_limit: Option<u32>,
    /// Rows of one concurrency key ("tenant-a") stored before the latency phase,
    /// of its type, while its own rows come with another key ("tenant-b"): how
    /// long a newcomer waits beside another tenant's backlog.
    pub backlog: usize,
    /// The keys of `keys` and `backlog` are fairness keys, not concurrency keys.
    pub fairness_keys: bool,
}

/// The tag of the latency phase's backlog rows, whose input carries no send time
/// (`u64::MAX`), so their pickups are not counted.
const BACKLOG: &str = "backlog";

/// The types the phases measure: limits apply to these.
const MEASURED: [&str; 3] = ["bench.drain", "bench.latency", "bench.e2e"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Submit,
    Drain,
    Latency,
    EndToEnd,
}

impl std::str::FromStr for Phase {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "submit" => Ok(Phase::Submit),
            "drain" => Ok(Phase::Drain),
            "latency" => Ok(Phase::Latency),
            "e2e" => Ok(Phase::EndToEnd),
            _ => Err(format!(
                "unknown phase {s:?}: use submit, drain, latency or e2e"
            )),
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("cannot reach {0}: {1}")]
    Connect(String, String),
    #[error("{0:?}: {1}")]
    Rpc(tonic::Code, String),
    #[error("the in-process server failed: {0}")]
    Server(String),
    #[error("{0}")]
    Setup(String),
}

impl From<tonic::Status> for Error {
    fn from(s: tonic::Status) -> Self {
        Error::Rpc(s.code(), s.message().to_owned())
    }
}

/// Runs the benchmark; the report is printed to stdout.
async fn run(options: Options) -> Result<serde_json::Value, Error> {
    let mut _dir = None;
    let database = match &options.database {
        Some(db) => db.clone(),
        None => {
            let dir = tempfile::tempdir().map_err(|e| Error::Setup(e.to_string()))?;
            let db = format!("sqlite://{}", dir.path().join("bench.db").display());
            _dir = Some(dir);
            db
        }
    };
    let servers = Servers::start(&options, &database).await?;
    let endpoints = servers.endpoints.clone();
    let mut processes = vec![("bench".to_owned(), std::process::id())];
    if let Some(started) = &servers.nodes {
        processes.extend(started.processes());
    }
    let mut bench = Bench::connect(endpoints.clone(), options.clone(), processes).await?;
    if options.server.is_none() && database.starts_with("postgres") {
        bench.watched = Some(database.clone());
    }
    let endpoint = endpoints.first().cloned().unwrap_or_default();
    let floor = baseline().await?;
    let mut report = serde_json::json!({
        "baseline": floor,
        "server": if options.server.is_some() { endpoint.as_str() } else if options.nodes > 0 { "nodes" } else { "in-process" },
        "nodes": endpoints,
        "database": if options.server.is_some() { "(server's)".to_owned() } else if options.database.is_some() { spool_server::config::redact_url(&database) } else { "sqlite (fresh temp file)".to_owned() },
        "payload_bytes": options.payload_bytes,
        "batches": options.batches,
        "preload": options.preload,
    });
    let _idle = start_idle_workers(&options, &endpoints);
    report["idle_workers"] = options.idle_workers.into();
    bench.set_limits().await?;
    report["keys"] = options.keys.into();
    report["key_limit"] = options.key_limit.into();
    report["fairness_keys"] = options.fairness_keys.into();
    report["rate_limit"] = options.rate_limit.into();
    if options.preload > 0 {
        let started = Instant::now();
        bench
            .submit_batched("bench.unserved", options.preload, "preload")
            .await?;
        report["preload_seconds"] = round(started.elapsed().as_secs_f64());
    }
    bench.run_phases(&mut report).await?;
    add_ratios(&mut report);
    servers.stop().await?;
    Ok(report)
}

/// The servers measured: the one `--server` names, `spool serve` processes
/// (`--nodes`), or one in this process.
struct Servers {
    endpoints: Vec<String>,
    /// Ends the in-process server.
    stop: CancellationToken,
    in_process: Option<JoinHandle<Result<(), spool_server::server::Error>>>,
    nodes: Option<nodes::Nodes>,
}

impl Servers {
    async fn start(options: &Options, database: &str) -> Result<Self, Error> {
        let mut servers = Servers {
            endpoints: Vec::new(),
            stop: CancellationToken::new(),
            in_process: None,
            nodes: None,
        };
        servers.endpoints = match &options.server {
            Some(url) => vec![url.clone()],
            None if options.nodes > 0 => {
                if options.nodes > 1 && !database.starts_with("postgres") {
                    return Err(Error::Setup(
                        "--nodes above 1 share one database: give --database postgres://…".into(),
                    ));
                }
                let started = nodes::Nodes::start(
                    options.nodes,
                    database,
                    options.token.as_deref(),
                    options.retention,
                )
                .await?;
                let endpoints = started.endpoints();
                servers.nodes = Some(started);
                endpoints
            }
            None => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .map_err(|e| Error::Setup(e.to_string()))?;
                let url = format!(
                    "http://{}",
                    listener
                        .local_addr()
                        .map_err(|e| Error::Setup(e.to_string()))?
                );
                let mut config = spool_server::Config::new(database.to_owned());
                config.drain_timeout = Duration::from_secs(1);
                config.auth_token = options.token.clone();
                if let Some(retention) = options.retention {
                    config.retention = retention;
                }
                servers.in_process = Some(tokio::spawn(spool_server::run(
                    config,
                    listener,
                    servers.stop.clone().cancelled_owned(),
                )));
                vec![url]
            }
        };
        Ok(servers)
    }

    /// Stops the servers the bench started; the in-process one's error, if it failed.
    async fn stop(self) -> Result<(), Error> {
        self.stop.cancel();
        drop(self.nodes);
        if let Some(task) = self.in_process {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(Error::Server(e.to_string())),
                Err(e) => return Err(Error::Server(e.to_string())),
            }
        }
        Ok(())
    }
}

/// Starts `--idle-workers` workers of a type nobody submits; they stop when the
/// guard is dropped.
fn start_idle_workers(options: &Options, endpoints: &[String]) -> DropGuard {
    let idle = CancellationToken::new();
    for n in 0..options.idle_workers {
        let mut worker = Worker::new(endpoints[n % endpoints.len()].clone())
            .namespace(NAMESPACE)
            .identity(format!("bench-idle-{n}"))
            .max_concurrency(1)
            .tls(options.tls.clone())
            .activity("bench.idle", |_, _| async { Ok(Payload::default()) });
        if let Some(token) = &options.token {
            worker = worker.token(token.clone());
        }
        tokio::spawn(worker.run(idle.clone()));
    }
    idle.drop_guard()
}

/// Results acknowledged as recorded, and when the last one was (nanoseconds since
/// the bench's epoch).
#[derive(Default)]
struct Acked {
    count: AtomicUsize,
    last_ns: AtomicU64,
}

impl Acked {
    fn record(&self, epoch: Instant) {
        let now = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // The instant first, so that whoever reads the count reached reads an
        // instant no earlier than that ack's.
        self.last_ns.fetch_max(now, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Release);
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    fn last(&self, epoch: Instant) -> Instant {
        epoch + Duration::from_nanos(self.last_ns.load(Ordering::Relaxed))
    }
}

struct Bench {
    /// The nodes, each with a channel; callers and workers take them in turn.
    endpoints: Vec<String>,
    channels: Vec<Channel>,
    options: Options,
    /// The clock pickup latency is measured on: submit instants travel in inputs
    /// as nanoseconds since this instant.
    epoch: Instant,
    /// Distinguishes this run's activity ids from a previous run's on the same server.
    run_id: String,
    /// Handler calls that returned, across all phases: a cheap signal of progress
    /// that spares the server a `Stats` count per poll.
    handled: Arc<AtomicUsize>,
    /// The same, per node the worker was connected to.
    handled_by_node: Arc<[AtomicUsize]>,
    /// Results the server acknowledged as recorded, across all phases.
    acked: Arc<Acked>,
    /// The processes whose CPU each phase reports: this one, then the nodes.
    processes: Arc<[(String, u32)]>,
    /// The PostgreSQL database the bench started its servers on, whose queue
    /// table the latency phase watches.
    watched: Option<String>,
}
