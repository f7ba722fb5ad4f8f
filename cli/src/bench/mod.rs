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
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

pub(crate) mod args;
mod cpu;
mod nodes;
mod queue_table;

use spool_proto::v1::{
    self, activity_service_client::ActivityServiceClient, admin_service_client::AdminServiceClient,
};
use spool_server::store::sqlite::WRITER_THREAD;
use spool_worker::{Payload, Worker};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::{Request, transport::Channel};

const NAMESPACE: &str = "bench";

#[derive(Debug, Clone)]
pub struct Options {
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
pub enum Phase {
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
pub enum Error {
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
pub async fn run(options: Options) -> Result<serde_json::Value, Error> {
    let stop_server = CancellationToken::new();
    let mut server_task = None;
    let mut _dir = None;
    let mut node_processes = None;
    let database = match &options.database {
        Some(db) => db.clone(),
        None => {
            let dir = tempfile::tempdir().map_err(|e| Error::Setup(e.to_string()))?;
            let db = format!("sqlite://{}", dir.path().join("bench.db").display());
            _dir = Some(dir);
            db
        }
    };
    let endpoints = match &options.server {
        Some(url) => vec![url.clone()],
        None if options.nodes > 0 => {
            if options.nodes > 1 && !database.starts_with("postgres") {
                return Err(Error::Setup(
                    "--nodes above 1 share one database: give --database postgres://…".into(),
                ));
            }
            let started = nodes::Nodes::start(
                options.nodes,
                &database,
                options.token.as_deref(),
                options.retention,
            )
            .await?;
            let endpoints = started.endpoints();
            node_processes = Some(started);
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
            let mut config = spool_server::Config::new(database.clone());
            config.drain_timeout = Duration::from_secs(1);
            config.auth_token = options.token.clone();
            if let Some(retention) = options.retention {
                config.retention = retention;
            }
            server_task = Some(tokio::spawn(spool_server::run(
                config,
                listener,
                stop_server.clone().cancelled_owned(),
            )));
            vec![url]
        }
    };
    let mut processes = vec![("bench".to_owned(), std::process::id())];
    if let Some(started) = &node_processes {
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
        "preload": options.preload,
    });
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
    let _idle = idle.drop_guard();
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
    for phase in &options.phases {
        let cpu_before = bench.cpu();
        let started = Instant::now();
        let (name, mut result) = match phase {
            Phase::Submit => ("submit", bench.submit_phase().await?),
            Phase::Drain => ("drain", bench.drain_phase().await?),
            Phase::Latency => ("latency", bench.latency_phase().await?),
            Phase::EndToEnd => ("end_to_end", bench.end_to_end_phase().await?),
        };
        // A phase that measures only part of its run (the drain, not the storing
        // of its backlog) reports the CPU of that part itself.
        if result.get("cpu").is_none() {
            result["cpu"] = bench.cpu_since(&cpu_before, started.elapsed());
        }
        report[name] = result;
    }
    add_ratios(&mut report);
    stop_server.cancel();
    drop(node_processes);
    if let Some(task) = server_task {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Error::Server(e.to_string())),
            Err(e) => return Err(Error::Server(e.to_string())),
        }
    }
    Ok(report)
}

/// CPU seconds used so far: by the bench's processes (this one, then the nodes),
/// and by each local PostgreSQL process; and the handler calls that had returned.
struct Cpu {
    ours: Vec<Option<f64>>,
    /// The SQLite writer thread's, in each of ours that has one.
    writers: Vec<Option<f64>>,
    postgres: std::collections::HashMap<u32, f64>,
    handled: usize,
}

/// How long acks may stand still before a wait for them asks `Stats` instead:
/// acks are the clock, and `Stats` counts the whole backlog (a quarter of a
/// second of PostgreSQL's CPU with a million rows waiting), so it is asked only
/// when acks stop coming.
const ACKS_STALLED: Duration = Duration::from_millis(250);

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

impl Bench {
    async fn connect(
        endpoints: Vec<String>,
        options: Options,
        processes: Vec<(String, u32)>,
    ) -> Result<Self, Error> {
        let mut channels = Vec::with_capacity(endpoints.len());
        for endpoint in &endpoints {
            channels.push(Self::channel(endpoint, &options).await?);
        }
        Ok(Self {
            handled_by_node: endpoints.iter().map(|_| AtomicUsize::new(0)).collect(),
            endpoints,
            channels,
            options,
            epoch: Instant::now(),
            run_id: uuid::Uuid::now_v7().simple().to_string()[..12].to_owned(),
            handled: Arc::new(AtomicUsize::new(0)),
            acked: Arc::default(),
            processes: processes.into(),
            watched: None,
        })
    }

    async fn channel(endpoint: &str, options: &Options) -> Result<Channel, Error> {
        let mut last = String::new();
        for _ in 0..100 {
            match spool_proto::endpoint::endpoint(endpoint, &options.tls)
                .map_err(|e| Error::Setup(e.to_string()))?
                .connect()
                .await
            {
                Ok(channel) => return Ok(channel),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(Error::Connect(endpoint.to_owned(), last))
    }

    fn client(&self) -> ActivityServiceClient<Channel> {
        self.client_at(0)
    }

    /// A client of the `i`-th node, counting round the nodes.
    fn client_at(&self, i: usize) -> ActivityServiceClient<Channel> {
        ActivityServiceClient::new(self.channels[i % self.channels.len()].clone())
            .max_decoding_message_size(usize::MAX)
    }

    /// CPU seconds used so far by each process (`None` where it cannot be read),
    /// and by each local PostgreSQL process.
    fn cpu(&self) -> Cpu {
        Cpu {
            ours: self
                .processes
                .iter()
                .map(|(_, pid)| cpu::process_seconds(*pid))
                .collect(),
            writers: self
                .processes
                .iter()
                .map(|(_, pid)| cpu::threads_seconds(*pid, WRITER_THREAD))
                .collect(),
            postgres: cpu::local_postgres(),
            handled: self.handled.load(Ordering::Relaxed),
        }
    }

    /// What each process used since `before`, over `wall` seconds: CPU seconds,
    /// the share of one core, and (where activities ran) the seconds per 10,000
    /// of them. Local PostgreSQL processes count as one.
    fn cpu_since(&self, before: &Cpu, wall: Duration) -> serde_json::Value {
        let handled = self
            .handled
            .load(Ordering::Relaxed)
            .saturating_sub(before.handled);
        let mut out = serde_json::Map::new();
        let entry = |used: f64| {
            let mut entry = serde_json::json!({
                "seconds": round(used),
                "cores": round(used / wall.as_secs_f64().max(1e-9)),
            });
            if handled > 0 {
                entry["seconds_per_10k"] = round(used * 10_000.0 / handled as f64);
            }
            entry
        };
        for ((name, pid), then) in self.processes.iter().zip(&before.ours) {
            let (Some(then), Some(now)) = (then, cpu::process_seconds(*pid)) else {
                continue;
            };
            out.insert(name.clone(), entry(now - then));
        }
        // The one thread every write of a SQLite server goes through: at one
        // core it bounds the server, whatever the process has left.
        for ((name, pid), then) in self.processes.iter().zip(&before.writers) {
            let (Some(then), Some(now)) = (then, cpu::threads_seconds(*pid, WRITER_THREAD)) else {
                continue;
            };
            out.insert(format!("{name} SQLite writer"), entry(now - then));
        }
        let postgres: f64 = cpu::local_postgres()
            .iter()
            .map(|(pid, now)| now - before.postgres.get(pid).copied().unwrap_or(0.0))
            .sum();
        if !before.postgres.is_empty() {
            out.insert("postgres (local)".to_owned(), entry(postgres));
        }
        serde_json::Value::Object(out)
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(token) = &self.options.token
            && let Ok(value) = format!("Bearer {token}").parse()
        {
            request.metadata_mut().insert("authorization", value);
        }
        request
    }

    /// An input carrying the submit instant, padded to `--payload-bytes`.
    fn input(&self, timed: bool) -> Payload {
        let nanos = if timed {
            u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
        } else {
            u64::MAX
        };
        let mut data = nanos.to_le_bytes().to_vec();
        data.resize(self.options.payload_bytes.max(8), b'x');
        Payload {
            content_type: "application/octet-stream".to_owned(),
            data,
        }
    }

    fn submit_request(&self, activity_type: &str, tag: &str, i: usize) -> v1::SubmitRequest {
        let mut request = v1::SubmitRequest {
            namespace: NAMESPACE.to_owned(),
            workflow_id: format!("{}-{activity_type}-{tag}", self.run_id),
            activity_id: i.to_string(),
            activity_type: activity_type.to_owned(),
            input: Some(self.input(tag != BACKLOG)),
            ..Default::default()
        };
        let key = match (tag, self.options.backlog, self.options.keys) {
            (BACKLOG, _, _) => "tenant-a".to_owned(),
            ("latency", 1.., _) => "tenant-b".to_owned(),
            (_, _, 0) => String::new(),
            (_, _, keys) => format!("key-{}", i % keys),
        };
        if self.options.fairness_keys {
            request.fairness_key = key;
        } else {
            request.concurrency_key = key;
        }
        request
    }

    /// Sets the limits the options ask for on every measured type.
    async fn set_limits(&self) -> Result<(), Error> {
        let mut admin = AdminServiceClient::new(self.channels[0].clone());
        for activity_type in MEASURED {
            if let Some(max_running) = self.options.key_limit {
                let limit = v1::ConcurrencyLimit {
                    namespace: NAMESPACE.to_owned(),
                    activity_type: activity_type.to_owned(),
                    max_running,
                    ..Default::default()
                };
                admin
                    .set_concurrency_limit(self.request(v1::SetConcurrencyLimitRequest {
                        concurrency_limit: Some(limit),
                    }))
                    .await?;
            }
            if let Some(per_second) = self.options.rate_limit {
                let limit = v1::RateLimit {
                    namespace: NAMESPACE.to_owned(),
                    activity_type: activity_type.to_owned(),
                    limit: per_second,
                    period: Some(spool_proto::duration::to_proto(Duration::from_secs(1))),
                    burst: per_second,
                    ..Default::default()
                };
                admin
                    .set_rate_limit(self.request(v1::SetRateLimitRequest {
                        rate_limit: Some(limit),
                    }))
                    .await?;
            }
        }
        Ok(())
    }

    async fn completed(&self) -> Result<u64, Error> {
        let stats = self
            .client()
            .stats(self.request(v1::StatsRequest {
                namespace: NAMESPACE.to_owned(),
            }))
            .await?
            .into_inner();
        Ok(stats.completed)
    }

    /// Submits `count` activities with `--submit-concurrency` callers, each sending
    /// batches of `--batch`.
    async fn submit_batched(
        &self,
        activity_type: &str,
        count: usize,
        tag: &str,
    ) -> Result<(), Error> {
        let next = Arc::new(AtomicUsize::new(0));
        let progress = (!tag.is_empty()).then(|| Progress::start(tag, count, next.clone()));
        let mut callers = JoinSet::new();
        let batch = self.options.batch.max(1);
        for caller in 0..self.options.submit_concurrency.max(1) {
            let next = next.clone();
            let mut client = self.client_at(caller);
            let this = self.shallow();
            let activity_type = activity_type.to_owned();
            let tag = tag.to_owned();
            callers.spawn(async move {
                loop {
                    let start = next.fetch_add(batch, Ordering::Relaxed);
                    if start >= count {
                        return Ok::<_, Error>(());
                    }
                    let end = (start + batch).min(count);
                    let activities = (start..end)
                        .map(|i| this.submit_request(&activity_type, &tag, i))
                        .collect();
                    client
                        .submit_batch(this.request(v1::SubmitBatchRequest { activities }))
                        .await?;
                }
            });
        }
        let result = join_all(callers).await;
        if let Some(progress) = progress {
            progress.finish();
        }
        result
    }

    /// A copy sharing the channel, for tasks.
    fn shallow(&self) -> Arc<Self> {
        Arc::new(Self {
            endpoints: self.endpoints.clone(),
            channels: self.channels.clone(),
            options: self.options.clone(),
            epoch: self.epoch,
            run_id: self.run_id.clone(),
            handled: self.handled.clone(),
            handled_by_node: self.handled_by_node.clone(),
            acked: self.acked.clone(),
            processes: self.processes.clone(),
            watched: self.watched.clone(),
        })
    }

    /// Starts `--workers` SDK workers for `activity_type` sharing `--concurrency`;
    /// each handler call runs `on_start` with the pickup latency.
    fn start_workers(
        &self,
        activity_type: &str,
        on_start: Arc<dyn Fn(Duration) + Send + Sync>,
    ) -> CancellationToken {
        let stop = CancellationToken::new();
        let workers = self.options.workers.max(1);
        let per_worker = self.options.concurrency.div_ceil(workers).max(1);
        for n in 0..workers {
            let epoch = self.epoch;
            let on_start = on_start.clone();
            let handled = self.handled.clone();
            let node = n as usize % self.endpoints.len();
            let by_node = self.handled_by_node.clone();
            let acked = self.acked.clone();
            let mut worker = Worker::new(self.endpoints[node].clone())
                .namespace(NAMESPACE)
                .identity(format!("bench-{n}"))
                .max_concurrency(per_worker)
                .tls(self.options.tls.clone())
                .on_ack(move |ack| {
                    if ack.accepted {
                        acked.record(epoch);
                    }
                })
                .activity(activity_type, move |_ctx, input: Payload| {
                    let on_start = on_start.clone();
                    let handled = handled.clone();
                    let by_node = by_node.clone();
                    async move {
                        let sent = input
                            .data
                            .get(..8)
                            .and_then(|b| b.try_into().ok())
                            .map(u64::from_le_bytes)
                            .unwrap_or(0);
                        let now = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        // A backlog row's pickup is not the phase's.
                        if sent != u64::MAX {
                            on_start(Duration::from_nanos(now.saturating_sub(sent)));
                        }
                        handled.fetch_add(1, Ordering::Relaxed);
                        by_node[node].fetch_add(1, Ordering::Relaxed);
                        Ok(Payload::default())
                    }
                });
            if let Some(token) = &self.options.token {
                worker = worker.token(token.clone());
            }
            tokio::spawn(worker.run(stop.clone()));
        }
        stop
    }

    /// Waits until `count` more results than `acked_before` are recorded, and
    /// returns when the last of them was: the instant its ack reached the worker,
    /// which the server sends only once the result is committed. Polling `Stats`
    /// instead would add the time of a count to the phase, and a count reads the
    /// whole backlog (~0.1 s with 1,000,000 rows waiting). `Stats` confirms the
    /// namespace's completed count reached `target` after the clock stops, and
    /// stands in for the acks if some never come (a worker's session replaced
    /// mid-phase: its results are acked where it resumes, or recorded by a node
    /// that could not answer).
    async fn await_completed(
        &self,
        target: u64,
        acked_before: usize,
        tag: &str,
        count: usize,
    ) -> Result<Instant, Error> {
        let done = Arc::new(AtomicUsize::new(0));
        let progress = Progress::start(tag, count, done.clone());
        let mut moved = (0, Instant::now());
        let last = loop {
            let acked = self.acked.count().saturating_sub(acked_before);
            done.store(acked, Ordering::Relaxed);
            if acked >= count {
                break self.acked.last(self.epoch);
            }
            if acked != moved.0 {
                moved = (acked, Instant::now());
            } else if moved.1.elapsed() >= ACKS_STALLED {
                if self.completed().await? >= target {
                    break Instant::now();
                }
                moved.1 = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        while self.completed().await? < target {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        progress.finish();
        Ok(last)
    }

    async fn submit_phase(&self) -> Result<serde_json::Value, Error> {
        let count = self.options.activities;
        // One activity per call.
        let next = Arc::new(AtomicUsize::new(0));
        let progress = Progress::start("submit (single)", count, next.clone());
        let started = Instant::now();
        let mut callers = JoinSet::new();
        for caller in 0..self.options.submit_concurrency.max(1) {
            let next = next.clone();
            let mut client = self.client_at(caller);
            let this = self.shallow();
            callers.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return Ok::<_, Error>(());
                    }
                    let request = this.submit_request("bench.unserved", "single", i);
                    client.submit(this.request(request)).await?;
                }
            });
        }
        join_all(callers).await?;
        let single = started.elapsed();
        progress.finish();
        let started = Instant::now();
        self.submit_batched("bench.unserved", count, "submit (batched)")
            .await?;
        let batched = started.elapsed();
        Ok(serde_json::json!({
            "single": rate(count, single, serde_json::json!({"concurrency": self.options.submit_concurrency})),
            "batched": rate(count, batched, serde_json::json!({"concurrency": self.options.submit_concurrency, "batch": self.options.batch})),
        }))
    }

    async fn drain_phase(&self) -> Result<serde_json::Value, Error> {
        let count = self.options.activities;
        let before = self.completed().await?;
        let acked_before = self.acked.count();
        self.submit_batched("bench.drain", count, "drain (backlog)")
            .await?;
        // The CPU of draining alone, not of storing the backlog.
        let cpu_before = self.cpu();
        let started = Instant::now();
        let first = Arc::new(Mutex::new(None::<Instant>));
        let f = first.clone();
        let by_node = self.handled_by_node();
        let stop = self.start_workers(
            "bench.drain",
            Arc::new(move |_| {
                let mut first = f.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert_with(Instant::now);
            }),
        );
        let last = self
            .await_completed(before + count as u64, acked_before, "drain", count)
            .await;
        stop.cancel();
        let last = last?;
        let first = first
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ok_or_else(|| Error::Setup("no activity was dispatched".into()))?;
        let took = last.duration_since(first);
        let mut result = rate(
            count,
            took,
            serde_json::json!({"concurrency": self.options.concurrency, "workers": self.options.workers, "per_node": self.per_node_since(&by_node, took)}),
        );
        result["cpu"] = self.cpu_since(&cpu_before, started.elapsed());
        Ok(result)
    }

    fn handled_by_node(&self) -> Vec<usize> {
        self.handled_by_node
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    /// Activities handled per second by the workers of each node since `before`.
    fn per_node_since(&self, before: &[usize], took: Duration) -> serde_json::Value {
        self.handled_by_node()
            .iter()
            .zip(before)
            .map(|(now, before)| {
                round(now.saturating_sub(*before) as f64 / took.as_secs_f64().max(1e-9))
            })
            .collect()
    }

    async fn latency_phase(&self) -> Result<serde_json::Value, Error> {
        if self.options.backlog > 0 {
            self.submit_batched("bench.latency", self.options.backlog, BACKLOG)
                .await?;
        }
        let handled_before = self.handled.load(Ordering::Relaxed);
        let pickups = Arc::new(Mutex::new(Vec::new()));
        let p = pickups.clone();
        let stop = self.start_workers(
            "bench.latency",
            Arc::new(move |latency| p.lock().unwrap_or_else(|e| e.into_inner()).push(latency)),
        );
        let watcher = self.watched.clone().map(|url| {
            let stop = CancellationToken::new();
            (stop.clone(), tokio::spawn(queue_table::watch(url, stop)))
        });
        // Let the workers connect before the clock starts.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let total = (u64::from(self.options.rate) * self.options.duration.as_millis() as u64 / 1000)
            as usize;
        let sent = Arc::new(AtomicUsize::new(0));
        let progress = Progress::start("latency", total, sent.clone());
        let interval = Duration::from_secs_f64(1.0 / f64::from(self.options.rate.max(1)));
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let end_to_end = Arc::new(Mutex::new(Vec::with_capacity(total)));
        let failures = Arc::new(AtomicU64::new(0));
        let mut calls = JoinSet::new();
        let started = Instant::now();
        for i in 0..total {
            ticker.tick().await;
            sent.store(i + 1, Ordering::Relaxed);
            let this = self.shallow();
            let mut client = self.client_at(i);
            let end_to_end = end_to_end.clone();
            let failures = failures.clone();
            calls.spawn(async move {
                let t0 = Instant::now();
                let request = this.submit_request("bench.latency", "latency", i);
                let key = v1::ActivityKey {
                    namespace: request.namespace.clone(),
                    workflow_id: request.workflow_id.clone(),
                    activity_id: request.activity_id.clone(),
                };
                if client.submit(this.request(request)).await.is_err() {
                    failures.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                let waited = client
                    .wait(this.request(v1::WaitRequest {
                        key: Some(key),
                        timeout: Some(spool_proto::duration::to_proto(Duration::from_secs(60))),
                    }))
                    .await;
                match waited {
                    Ok(a) if a.get_ref().status == v1::ActivityStatus::Completed as i32 => {
                        end_to_end
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(t0.elapsed());
                    }
                    _ => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        let offered_for = started.elapsed();
        while calls.join_next().await.is_some() {}
        progress.finish();
        stop.cancel();
        let phase = started.elapsed();
        let backlog_drained =
            (self.handled.load(Ordering::Relaxed) - handled_before).saturating_sub(total);
        let pickups = std::mem::take(&mut *pickups.lock().unwrap_or_else(|e| e.into_inner()));
        let end_to_end = std::mem::take(&mut *end_to_end.lock().unwrap_or_else(|e| e.into_inner()));
        let queue_table = match watcher {
            Some((stop, task)) => {
                stop.cancel();
                task.await
                    .map_err(|e| Error::Setup(e.to_string()))?
                    .map_err(Error::Setup)?
            }
            None => serde_json::Value::Null,
        };
        Ok(serde_json::json!({
            "queue_table": queue_table,
            "offered_rate": self.options.rate,
            "achieved_rate": round(end_to_end.len() as f64 / offered_for.as_secs_f64()),
            "activities": total,
            "failed": failures.load(Ordering::Relaxed),
            "pickup_ms": percentiles(pickups),
            "end_to_end_ms": percentiles(end_to_end),
            "backlog": (self.options.backlog > 0).then(|| serde_json::json!({
                "rows": self.options.backlog,
                "drained": backlog_drained,
                "drained_per_second": round(backlog_drained as f64 / phase.as_secs_f64()),
            })),
        }))
    }

    async fn end_to_end_phase(&self) -> Result<serde_json::Value, Error> {
        let count = self.options.activities;
        let before = self.completed().await?;
        let acked_before = self.acked.count();
        let by_node = self.handled_by_node();
        let stop = self.start_workers("bench.e2e", Arc::new(|_| {}));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        // The completion count draws the progress line.
        let submitting = self.submit_batched("bench.e2e", count, "");
        let completing = self.await_completed(before + count as u64, acked_before, "e2e", count);
        let (submitted, last) = tokio::join!(submitting, completing);
        stop.cancel();
        submitted?;
        let last = last?;
        let took = last.duration_since(started);
        Ok(rate(
            count,
            took,
            serde_json::json!({"concurrency": self.options.concurrency, "workers": self.options.workers, "batch": self.options.batch, "submit_concurrency": self.options.submit_concurrency, "per_node": self.per_node_since(&by_node, took)}),
        ))
    }
}

/// The disk's durable-commit floor, measured on a scratch SQLite file the way the
/// server writes (WAL, `synchronous=FULL`), one row per transaction: what a queue
/// without group commit could do here, and the least a durable pickup can take.
async fn baseline() -> Result<serde_json::Value, Error> {
    use sqlx::{
        ConnectOptions,
        sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous},
    };
    const COMMITS: usize = 300;
    let dir = tempfile::tempdir().map_err(|e| Error::Setup(e.to_string()))?;
    let mut conn = SqliteConnectOptions::new()
        .filename(dir.path().join("baseline.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .connect()
        .await
        .map_err(|e| Error::Setup(format!("baseline database: {e}")))?;
    let setup = |e: sqlx::Error| Error::Setup(format!("baseline: {e}"));
    sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
        .execute(&mut conn)
        .await
        .map_err(setup)?;
    let mut latencies = Vec::with_capacity(COMMITS);
    let started = Instant::now();
    for _ in 0..COMMITS {
        let t = Instant::now();
        sqlx::query("INSERT INTO t (v) VALUES (zeroblob(64))")
            .execute(&mut conn)
            .await
            .map_err(setup)?;
        latencies.push(t.elapsed());
    }
    let took = started.elapsed();
    Ok(serde_json::json!({
        "commits_per_second": round(COMMITS as f64 / took.as_secs_f64()),
        "commit_ms": percentiles(latencies),
    }))
}

/// Each throughput as a multiple of the baseline's commit rate, and each latency
/// percentile as a multiple of one commit, so runs on noisy machines compare.
fn add_ratios(report: &mut serde_json::Value) {
    let commits = report["baseline"]["commits_per_second"]
        .as_f64()
        .unwrap_or(0.0);
    let commit_p50 = report["baseline"]["commit_ms"]["p50"]
        .as_f64()
        .unwrap_or(0.0);
    if commits <= 0.0 || commit_p50 <= 0.0 {
        return;
    }
    let per_second = |v: &serde_json::Value| v["per_second"].as_f64();
    for path in [["submit", "single"], ["submit", "batched"]] {
        if let Some(x) = per_second(&report[path[0]][path[1]]) {
            report[path[0]][path[1]]["x_baseline"] = round(x / commits);
        }
    }
    for phase in ["drain", "end_to_end"] {
        if let Some(x) = per_second(&report[phase]) {
            report[phase]["x_baseline"] = round(x / commits);
        }
    }
    for key in ["pickup_ms", "end_to_end_ms"] {
        if let Some(p50) = report["latency"][key]["p50"].as_f64() {
            report["latency"][key]["p50_x_commit"] = round(p50 / commit_p50);
        }
    }
}

async fn join_all(mut set: JoinSet<Result<(), Error>>) -> Result<(), Error> {
    while let Some(joined) = set.join_next().await {
        joined.map_err(|e| Error::Setup(e.to_string()))??;
    }
    Ok(())
}

fn rate(count: usize, took: Duration, mut extra: serde_json::Value) -> serde_json::Value {
    let seconds = took.as_secs_f64();
    extra["count"] = count.into();
    extra["seconds"] = round(seconds);
    extra["per_second"] = round(count as f64 / seconds.max(1e-9));
    extra
}

fn round(x: f64) -> serde_json::Value {
    serde_json::json!((x * 1000.0).round() / 1000.0)
}

fn percentiles(mut samples: Vec<Duration>) -> serde_json::Value {
    if samples.is_empty() {
        return serde_json::Value::Null;
    }
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        round(samples[i].as_secs_f64() * 1000.0)
    };
    serde_json::json!({
        "samples": samples.len(),
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "max": at(1.0),
    })
}

/// A progress line on stderr, redrawn a few times a second when stderr is a
/// terminal; elsewhere (a log file, a pipe) one line when the phase ends.
struct Progress {
    stop: CancellationToken,
}

impl Progress {
    fn start(label: &str, total: usize, done: Arc<AtomicUsize>) -> Self {
        use std::io::IsTerminal;
        let stop = CancellationToken::new();
        let label = label.to_owned();
        let token = stop.clone();
        if !std::io::stderr().is_terminal() {
            tokio::spawn(async move {
                let started = Instant::now();
                token.cancelled().await;
                eprintln!(
                    "{label:<18} done in {:.2}s",
                    started.elapsed().as_secs_f64()
                );
            });
            return Self { stop };
        }
        tokio::spawn(async move {
            let started = Instant::now();
            loop {
                let n = done.load(Ordering::Relaxed).min(total);
                let width = 30;
                let filled = (n * width).checked_div(total).unwrap_or(width);
                eprint!(
                    "\r{label:<18} [{}{}] {n}/{total} {:.1}s ",
                    "#".repeat(filled),
                    ".".repeat(width - filled),
                    started.elapsed().as_secs_f64()
                );
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = token.cancelled() => {
                        eprintln!("\r{label:<18} done in {:.2}s{}", started.elapsed().as_secs_f64(), " ".repeat(40));
                        return;
                    }
                }
            }
        });
        Self { stop }
    }

    fn finish(self) {
        self.stop.cancel();
    }
}

/// The human summary of a report.
pub fn summary(report: &serde_json::Value) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "server: {}  database: {}  payload: {} B  preload: {}",
        report["server"].as_str().unwrap_or("?"),
        report["database"].as_str().unwrap_or("?"),
        report["payload_bytes"],
        report["preload"]
    ));
    let b = &report["baseline"];
    line(format!(
        "baseline: {}/s single-row durable commits (p50 {} ms) on this disk",
        b["commits_per_second"], b["commit_ms"]["p50"]
    ));
    if let Some(s) = report.get("submit") {
        line(format!(
            "submit, one per call ({} callers):   {:>9}/s  ({}x baseline)",
            s["single"]["concurrency"], s["single"]["per_second"], s["single"]["x_baseline"]
        ));
        line(format!(
            "submit, batches of {} ({} callers): {:>9}/s  ({}x baseline)",
            s["batched"]["batch"],
            s["batched"]["concurrency"],
            s["batched"]["per_second"],
            s["batched"]["x_baseline"]
        ));
    }
    if let Some(d) = report.get("drain") {
        line(format!(
            "drain {} (concurrency {}):      {:>9}/s  ({}x baseline)",
            d["count"], d["concurrency"], d["per_second"], d["x_baseline"]
        ));
        line(cpu_line(&d["cpu"]));
    }
    if let Some(l) = report.get("latency") {
        line(format!(
            "latency at {}/s offered ({}/s achieved, {} failed):",
            l["offered_rate"], l["achieved_rate"], l["failed"]
        ));
        for (name, key) in [("pickup", "pickup_ms"), ("end to end", "end_to_end_ms")] {
            let p = &l[key];
            line(format!(
                "  {name:<10} p50 {} ms  p90 {} ms  p99 {} ms  max {} ms",
                p["p50"], p["p90"], p["p99"], p["max"]
            ));
        }
    }
    if let Some(e) = report.get("end_to_end") {
        line(format!(
            "end to end {} (submit + run + record): {:>9}/s  ({}x baseline)",
            e["count"], e["per_second"], e["x_baseline"]
        ));
        line(cpu_line(&e["cpu"]));
    }
    out
}

/// A phase's CPU seconds per 10,000 activities, by process.
fn cpu_line(cpu: &serde_json::Value) -> String {
    let Some(parts) = cpu.as_object() else {
        return "  CPU: not measured".to_owned();
    };
    let shown: Vec<String> = parts
        .iter()
        .filter(|(_, used)| used["seconds"].as_f64().is_some_and(|s| s > 0.0))
        .filter_map(|(name, used)| Some(format!("{name} {} s", used.get("seconds_per_10k")?)))
        .collect();
    format!("  CPU per 10,000 activities: {}", shown.join(", "))
}
