//! `spool soak`: steady load under random faults, then a check of the history
//! against the promise (an acknowledged activity is completed, once).
//!
//! One run: nodes (`spool serve`, one on SQLite or several sharing PostgreSQL)
//! and SDK worker processes (`spool soak-worker`, reaching the nodes through a
//! TCP proxy) start; submitters in this process send activities of mixed lengths
//! at a steady rate straight to the nodes (some of them with concurrency and
//! fairness keys, under a concurrency limit and a fairness weight set at the
//! start, so keys' counts and chains live through the faults too); a fault
//! injector, seeded, picks a fault
//! at random intervals and then does what an operator or a supervisor would
//! (restart, continue, free the disk). At the end faults stop, everything is
//! brought back, the run waits until nothing is scheduled or running, reads every
//! row, and [`check::check`] judges the history.
//!
//! Invariants of the harness itself: the history is written before the event it
//! records can be lost (workers append a line per event, unbuffered); a submit
//! counts as acknowledged only on OK (or ALREADY_EXISTS for a retried key); the
//! fault schedule and the workload are a function of the seed.

pub(crate) mod args;
pub mod check;
mod cluster;
pub mod history;
mod proxy;
pub mod worker;

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use rand::{Rng, SeedableRng, rngs::StdRng};
use spool_proto::v1::{
    self, activity_service_client::ActivityServiceClient, admin_service_client::AdminServiceClient,
};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use cluster::{Disk, Proc};
use history::{DriverEvent, Log, WorkerEvent, now_ms};

pub const NAMESPACE: &str = "soak";
pub const ACTIVITY_TYPE: &str = "soak";
const WORKFLOW: &str = "soak";

/// Node settings that make faults bite within seconds.
const LEASE: Duration = Duration::from_secs(5);
const DRAIN: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    NodeKill,
    NodeTerm,
    NodePause,
    WorkerKill,
    WorkerStop,
    NetworkCut,
    PgRestart,
    DiskFull,
}

impl Fault {
    pub const ALL: [Fault; 8] = [
        Fault::NodeKill,
        Fault::NodeTerm,
        Fault::NodePause,
        Fault::WorkerKill,
        Fault::WorkerStop,
        Fault::NetworkCut,
        Fault::PgRestart,
        Fault::DiskFull,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::NodeKill => "node-kill",
            Fault::NodeTerm => "node-term",
            Fault::NodePause => "node-pause",
            Fault::WorkerKill => "worker-kill",
            Fault::WorkerStop => "worker-stop",
            Fault::NetworkCut => "network-cut",
            Fault::PgRestart => "pg-restart",
            Fault::DiskFull => "disk-full",
        }
    }

    pub fn parse(name: &str) -> Result<Fault, String> {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
                format!("unknown fault {name:?}; one of {}", names.join(", "))
            })
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    /// The `spool` binary the nodes and workers run.
    pub binary: PathBuf,
    /// `None`: one node on SQLite. `Some(url)`: `nodes` nodes sharing a fresh
    /// schema on this PostgreSQL server.
    pub postgres: Option<String>,
    pub nodes: usize,
    pub duration: Duration,
    pub seed: u64,
    /// Submits per second.
    pub rate: u32,
    pub workers: usize,
    pub concurrency: u32,
    /// Kinds to pick from; empty means every kind this store supports.
    pub faults: Vec<Fault>,
    /// A fault every `min..=max`.
    pub fault_every: (Duration, Duration),
    /// Run directory (logs, histories, report); a fresh one under the system's
    /// temporary directory if `None`.
    pub dir: Option<PathBuf>,
    /// Breakages the nodes turn on (a build with the `breakages` feature).
    pub breakages: Vec<String>,
    /// Size of the filesystem the SQLite file lives on (for `disk-full`).
    pub disk_mb: u64,
    /// Restarts PostgreSQL (for `pg-restart`), run with `sh -c`.
    pub pg_restart: String,
    /// How long to wait, after the faults, for everything to finish.
    pub settle: Duration,
    /// The nodes' keep-alive interval: a worker silent for three is evicted.
    pub heartbeat_interval: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Setup(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

fn setup(message: impl Into<String>) -> Error {
    Error::Setup(message.into())
}

/// The result of a run: what was done, and the verdict.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub seed: u64,
    pub store: String,
    pub nodes: usize,
    pub workers: usize,
    pub rate: u32,
    pub duration_s: u64,
    pub faults_enabled: Vec<&'static str>,
    pub breakages: Vec<String>,
    pub dir: String,
    pub settled: bool,
    /// Worker sessions still holding slots once nothing runs: `node/identity: n`.
    pub held: Vec<String>,
    /// Concurrency keys still counted waiting or running once nothing is: the
    /// keys' counts went wrong in a fault.
    pub keys_left: Vec<String>,
    pub verdict: check::Verdict,
    pub passed: bool,
}

impl Report {
    pub fn summary(&self) -> String {
        let v = &self.verdict;
        let mut s = format!(
            "soak seed={} store={} nodes={} workers={} rate={}/s {}s{}\n",
            self.seed,
            self.store,
            self.nodes,
            self.workers,
            self.rate,
            self.duration_s,
            if self.breakages.is_empty() {
                String::new()
            } else {
                format!(" BROKEN: {}", self.breakages.join(","))
            }
        );
        s += &format!(
            "acknowledged {}  completed {}  failed as asked (max_attempts=1) {}  unknown submits {}\n",
            v.acknowledged, v.completed, v.failed_as_asked, v.unknown_submits
        );
        s += &format!(
            "lost {}  accepted twice {}  wrong attempt stored {}  unexplained failures {}  left unfinished {}\n",
            v.lost.len(),
            v.twice.len(),
            v.wrong_attempt.len(),
            v.unexplained_failures.len(),
            v.left_unfinished.len()
        );
        s += &format!(
            "deliveries {}  completed with the ack unseen {}\n",
            v.deliveries, v.ack_unseen
        );
        s += "fault         injected  extra deliveries\n";
        for (kind, (n, extra)) in &v.faults {
            s += &format!("{kind:<13} {n:>8}  {extra:>16}\n");
        }
        for line in v.failures() {
            s += &format!("FAILED: {line}\n");
        }
        if !self.settled {
            s +=
                "FAILED: activities were still scheduled or running when the settle time ran out\n";
        }
        for h in &self.held {
            s += &format!("FAILED: a slot is still held with nothing running: {h}\n");
        }
        for k in &self.keys_left {
            s += &format!(
                "FAILED: concurrency keys still counted with nothing waiting or running: {k}\n"
            );
        }
        s += &format!(
            "{} (history and logs in {})\n",
            if self.passed { "PASSED" } else { "FAILED" },
            self.dir
        );
        s
    }
}

struct Cluster {
    nodes: Vec<Proc>,
    addrs: Vec<SocketAddr>,
    workers: Vec<Proc>,
    dir: PathBuf,
    disk: Option<Disk>,
}

impl Cluster {
    async fn start_node(&mut self, i: usize) -> Result<(), Error> {
        self.nodes[i].start(&[])?;
        if cluster::ready(self.addrs[i], Duration::from_secs(60)).await {
            Ok(())
        } else {
            Err(setup(format!(
                "node {i} did not answer within 60 s; see {}",
                self.dir.join(format!("node{i}.log")).display()
            )))
        }
    }

    fn start_worker(&mut self, i: usize) -> Result<(), Error> {
        let w = &mut self.workers[i];
        let identity = format!("w{i}.{}", w.starts);
        let history = self.dir.join(format!("history-{identity}.jsonl"));
        w.start(&[
            "--identity".to_owned(),
            identity,
            "--history".to_owned(),
            history.display().to_string(),
        ])?;
        Ok(())
    }

    /// Brings back what died on its own; returns the faults that implies.
    async fn supervise(&mut self, events: &Events) -> Result<(), Error> {
        for i in 0..self.nodes.len() {
            if self.nodes[i].exited() {
                let t = now_ms();
                self.nodes[i].reap();
                self.start_node(i).await?;
                events.push(DriverEvent::Fault {
                    kind: "node-exit".to_owned(),
                    target: format!("node{i}"),
                    t,
                    until: now_ms(),
                });
            }
        }
        for i in 0..self.workers.len() {
            if self.workers[i].exited() {
                let t = now_ms();
                self.workers[i].reap();
                self.start_worker(i)?;
                events.push(DriverEvent::Fault {
                    kind: "worker-exit".to_owned(),
                    target: format!("worker{i}"),
                    t,
                    until: now_ms(),
                });
            }
        }
        Ok(())
    }
}

/// The driver's history: in memory for the checker, and on disk for a reader.
struct Events {
    list: Mutex<Vec<DriverEvent>>,
    log: Log,
}

impl Events {
    fn push(&self, event: DriverEvent) {
        let _ = self.log.write(&event);
        if let Ok(mut list) = self.list.lock() {
            list.push(event);
        }
    }

    fn take(&self) -> Vec<DriverEvent> {
        self.list
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }
}

pub async fn run(options: Options) -> Result<Report, Error> {
    if !options.breakages.is_empty() && !spool_server::breakage::COMPILED_IN {
        return Err(setup(
            "--break needs a build with the breakages feature \
             (cargo build -p spool --features breakages)",
        ));
    }
    for name in &options.breakages {
        if spool_server::breakage::Breakage::parse(name).is_none() {
            return Err(setup(format!("unknown breakage {name:?}")));
        }
    }
    let sqlite = options.postgres.is_none();
    let nodes = if sqlite { 1 } else { options.nodes.max(1) };
    let mut faults: Vec<Fault> = if options.faults.is_empty() {
        Fault::ALL
            .into_iter()
            .filter(|f| match f {
                Fault::PgRestart => !sqlite,
                Fault::DiskFull => sqlite,
                _ => true,
            })
            .collect()
    } else {
        options.faults.clone()
    };
    if sqlite && faults.contains(&Fault::PgRestart) {
        return Err(setup("pg-restart needs --postgres"));
    }
    if !sqlite && faults.contains(&Fault::DiskFull) {
        return Err(setup("disk-full is for the SQLite store only"));
    }

    let dir = match &options.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            // Histories are appended to: an old run's would be judged with this one.
            if std::fs::read_dir(d)?.next().is_some() {
                return Err(setup(format!(
                    "the run directory {} is not empty; remove it or name another",
                    d.display()
                )));
            }
            d.clone()
        }
        None => tempfile::Builder::new()
            .prefix("spool-soak-")
            .tempdir()?
            .keep(),
    };

    let explicit_disk = options.faults.contains(&Fault::DiskFull);
    let disk = if sqlite && faults.contains(&Fault::DiskFull) {
        match Disk::mount(&dir.join("disk"), options.disk_mb) {
            Ok(d) => Some(d),
            Err(e) if !explicit_disk => {
                eprintln!("soak: no disk-full faults: {e}");
                faults.retain(|f| *f != Fault::DiskFull);
                None
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };
    let database = match &options.postgres {
        None => {
            let at = disk.as_ref().map_or(dir.clone(), |d| d.path.clone());
            format!("sqlite://{}", at.join("soak.db").display())
        }
        Some(base) => fresh_schema(base, options.seed).await?,
    };

    let mut addrs = Vec::with_capacity(nodes);
    let mut node_procs = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let port = cluster::free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        addrs.push(addr);
        let args = vec![
            "serve".to_owned(),
            "--listen".to_owned(),
            addr.to_string(),
            "--database".to_owned(),
            database.clone(),
            "--drain-timeout".to_owned(),
            format!("{}ms", DRAIN.as_millis()),
            "--lease-timeout".to_owned(),
            format!("{}ms", LEASE.as_millis()),
            "--heartbeat-interval".to_owned(),
            format!("{}ms", options.heartbeat_interval.as_millis()),
        ];
        let mut p =
            Proc::new(&format!("node{i}"), &options.binary, args, &dir).env("RUST_LOG", "info");
        if !options.breakages.is_empty() {
            p = p.env(spool_server::breakage::ENV, &options.breakages.join(","));
        }
        node_procs.push(p);
    }
    let proxy = proxy::Proxy::start(addrs.clone()).await?;
    let worker_procs = (0..options.workers)
        .map(|i| {
            Proc::new(
                &format!("worker{i}"),
                &options.binary,
                vec![
                    "soak-worker".to_owned(),
                    "--server".to_owned(),
                    format!("http://{}", proxy.addr),
                    "--concurrency".to_owned(),
                    options.concurrency.to_string(),
                ],
                &dir,
            )
        })
        .collect();
    let mut cluster = Cluster {
        nodes: node_procs,
        addrs: addrs.clone(),
        workers: worker_procs,
        dir: dir.clone(),
        disk,
    };
    // The first node migrates the schema before the others start.
    for i in 0..nodes {
        cluster.start_node(i).await?;
    }
    for i in 0..options.workers {
        cluster.start_worker(i)?;
    }
    let cluster = Arc::new(tokio::sync::Mutex::new(cluster));
    let events = Arc::new(Events {
        list: Mutex::new(Vec::new()),
        log: Log::create(&dir.join("driver.jsonl"))?,
    });
    let proxy = Arc::new(proxy);

    eprintln!(
        "soak: seed {} · {} · {nodes} node(s) · {} workers · {}/s for {} s · faults: {} · {}",
        options.seed,
        if sqlite { "sqlite" } else { "postgres" },
        options.workers,
        options.rate,
        options.duration.as_secs(),
        faults
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(","),
        dir.display()
    );

    let stop_load = CancellationToken::new();
    let stop_faults = CancellationToken::new();
    let mut load = JoinSet::new();
    let channels: Vec<Channel> = addrs
        .iter()
        .map(|a| {
            tonic::transport::Endpoint::from_shared(format!("http://{a}"))
                .map(|e| {
                    e.connect_timeout(Duration::from_secs(1))
                        .timeout(Duration::from_secs(3))
                        .connect_lazy()
                })
                .map_err(|e| setup(e.to_string()))
        })
        .collect::<Result<_, _>>()?;
    set_limits(&channels).await?;
    const SUBMITTERS: u64 = 4;
    let per = Duration::from_secs_f64(SUBMITTERS as f64 / f64::from(options.rate.max(1)));
    for s in 0..SUBMITTERS {
        load.spawn(submitter(
            s,
            options.seed,
            channels.clone(),
            per,
            events.clone(),
            stop_load.clone(),
        ));
    }
    let injector = tokio::spawn(inject(
        StdRng::seed_from_u64(options.seed),
        faults.clone(),
        options.fault_every,
        cluster.clone(),
        proxy.clone(),
        options.pg_restart.clone(),
        options.heartbeat_interval,
        events.clone(),
        stop_faults.clone(),
    ));
    let supervisor = {
        let cluster = cluster.clone();
        let events = events.clone();
        let stop = stop_faults.clone();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if let Err(e) = cluster.lock().await.supervise(&events).await {
                    eprintln!("soak: supervisor: {e}");
                }
            }
        })
    };

    let started = tokio::time::Instant::now();
    let mut progress = tokio::time::interval(Duration::from_secs(10));
    progress.tick().await;
    while started.elapsed() < options.duration {
        tokio::select! {
            _ = progress.tick() => {
                let list = events.list.lock().map(|l| {
                    let faults = l.iter().filter(|e| matches!(e, DriverEvent::Fault { .. })).count();
                    let acked = l.iter().filter(|e| matches!(e, DriverEvent::Submitted { .. })).count();
                    (faults, acked)
                }).unwrap_or_default();
                eprintln!("soak: {:>5} s · {} acknowledged · {} faults", started.elapsed().as_secs(), list.1, list.0);
            }
            _ = tokio::time::sleep_until(started + options.duration) => {}
        }
    }

    stop_load.cancel();
    while load.join_next().await.is_some() {}
    stop_faults.cancel();
    let _ = injector.await;
    let _ = supervisor.await;
    {
        let mut c = cluster.lock().await;
        for p in c.nodes.iter().chain(c.workers.iter()) {
            let _ = p.signal("CONT");
        }
        if let Some(disk) = &c.disk {
            disk.free()?;
        }
        c.supervise(&events).await?;
    }
    eprintln!("soak: faults stopped; waiting for every activity to finish");
    let client = ActivityServiceClient::new(channels[0].clone());
    let settled = settle(client.clone(), options.settle).await;
    let held = held_slots(&channels).await;
    let keys_left = if settled {
        keys_left(&channels).await
    } else {
        Vec::new()
    };
    let rows = read_rows(client).await?;
    {
        let mut c = cluster.lock().await;
        for w in &mut c.workers {
            w.kill().await;
        }
        for n in &mut c.nodes {
            n.terminate(DRAIN + Duration::from_secs(10)).await;
        }
        // The database outlives the small filesystem, for a post-mortem.
        if let Some(disk) = c.disk.take() {
            for file in ["soak.db", "soak.db-wal"] {
                let _ = std::fs::copy(disk.path.join(file), dir.join(file));
            }
        }
    }

    let mut worker_events: Vec<WorkerEvent> = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("history-") && name.ends_with(".jsonl") {
            worker_events.extend(history::read::<WorkerEvent>(&path)?);
        }
    }
    let verdict = check::check(&events.take(), &worker_events, &rows);
    let passed = verdict.passed() && settled && held.is_empty() && keys_left.is_empty();
    let report = Report {
        seed: options.seed,
        store: if sqlite { "sqlite" } else { "postgres" }.to_owned(),
        nodes,
        workers: options.workers,
        rate: options.rate,
        duration_s: options.duration.as_secs(),
        faults_enabled: faults.iter().map(|f| f.name()).collect(),
        breakages: options.breakages.clone(),
        dir: dir.display().to_string(),
        settled,
        held,
        keys_left,
        verdict,
        passed,
    };
    if let Ok(json) = serde_json::to_string_pretty(&report) {
        let _ = std::fs::write(dir.join("report.json"), json);
    }
    Ok(report)
}

/// A fresh schema on the PostgreSQL server `base` names; the URL the nodes use.
async fn fresh_schema(base: &str, seed: u64) -> Result<String, Error> {
    use sqlx::Connection;
    let schema = format!("spool_soak_{seed}_{}", std::process::id());
    let mut admin = sqlx::PgConnection::connect(base)
        .await
        .map_err(|e| setup(format!("cannot reach PostgreSQL at {base}: {e}")))?;
    for statement in [
        format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        format!("CREATE SCHEMA {schema}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&mut admin)
            .await
            .map_err(|e| setup(format!("cannot create schema {schema}: {e}")))?;
    }
    let separator = if base.contains('?') { '&' } else { '?' };
    Ok(format!("{base}{separator}options=-csearch_path%3D{schema}"))
}

/// How many concurrency keys and fairness keys the load spreads over.
const CONCURRENCY_KEYS: u64 = 8;
const FAIRNESS_KEYS: u64 = 4;

/// The limit the load's concurrency keys run under, and the weight of one of its
/// fairness keys: a keyed activity waits for its key's room, and is placed on its
/// tenant's chain, in every fault. The limit is loose enough that the settle
/// still ends in time.
async fn set_limits(channels: &[Channel]) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut admin = AdminServiceClient::new(channels[0].clone());
        let limit = admin
            .set_concurrency_limit(v1::SetConcurrencyLimitRequest {
                concurrency_limit: Some(v1::ConcurrencyLimit {
                    namespace: NAMESPACE.to_owned(),
                    activity_type: ACTIVITY_TYPE.to_owned(),
                    max_running: 8,
                    ..Default::default()
                }),
            })
            .await;
        let weight = match limit {
            Ok(_) => {
                admin
                    .set_fairness_weight(v1::SetFairnessWeightRequest {
                        fairness_weight: Some(v1::FairnessWeight {
                            namespace: NAMESPACE.to_owned(),
                            activity_type: ACTIVITY_TYPE.to_owned(),
                            fairness_key: "t0".to_owned(),
                            weight: 3,
                            ..Default::default()
                        }),
                    })
                    .await
            }
            Err(s) => Err(s),
        };
        match weight {
            Ok(_) => return Ok(()),
            Err(s) if tokio::time::Instant::now() >= deadline => {
                return Err(setup(format!(
                    "cannot set the load's limits: {}",
                    s.message()
                )));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// One submitter: a new key every `every`, retried (same key, next node) until
/// acknowledged or given up on.
async fn submitter(
    index: u64,
    seed: u64,
    channels: Vec<Channel>,
    every: Duration,
    events: Arc<Events>,
    stop: CancellationToken,
) {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(1 + index));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut next_node = index as usize;
    for n in 0u64.. {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let key = format!("{seed}-{index}-{n}");
        let once = rng.random_bool(0.1);
        let ms: u64 = match rng.random_range(0..100) {
            0..60 => rng.random_range(0..20),
            60..90 => rng.random_range(50..500),
            _ => rng.random_range(1_000..3_000),
        };
        let concurrency_key = match rng.random_range(0..4) {
            0 => format!("c{}", rng.random_range(0..CONCURRENCY_KEYS)),
            _ => String::new(),
        };
        let fairness_key = match rng.random_range(0..2) {
            0 => format!("t{}", rng.random_range(0..FAIRNESS_KEYS)),
            _ => String::new(),
        };
        let request = v1::SubmitRequest {
            namespace: NAMESPACE.to_owned(),
            workflow_id: WORKFLOW.to_owned(),
            activity_id: key.clone(),
            activity_type: ACTIVITY_TYPE.to_owned(),
            input: spool_worker::json(&worker::Input { ms }).ok(),
            retry_policy: Some(v1::RetryPolicy {
                max_attempts: if once { 1 } else { 1_000 },
                initial_interval: Some(spool_proto::duration::to_proto(Duration::from_millis(100))),
                backoff_coefficient: 2.0,
                max_interval: Some(spool_proto::duration::to_proto(Duration::from_secs(1))),
                non_retryable_error_types: Vec::new(),
            }),
            start_to_close_timeout: Some(spool_proto::duration::to_proto(Duration::from_secs(60))),
            concurrency_key,
            fairness_key,
            ..Default::default()
        };
        let mut acknowledged = false;
        for _ in 0..40 {
            let mut client =
                ActivityServiceClient::new(channels[next_node % channels.len()].clone());
            match client.submit(request.clone()).await {
                Ok(_) => acknowledged = true,
                Err(s) if s.code() == tonic::Code::AlreadyExists => acknowledged = true,
                Err(_) => {
                    next_node += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
            break;
        }
        events.push(if acknowledged {
            DriverEvent::Submitted {
                k: key,
                once,
                t: now_ms(),
            }
        } else {
            DriverEvent::Unknown {
                k: key,
                t: now_ms(),
            }
        });
    }
}

#[allow(clippy::too_many_arguments)]
async fn inject(
    mut rng: StdRng,
    faults: Vec<Fault>,
    every: (Duration, Duration),
    cluster: Arc<tokio::sync::Mutex<Cluster>>,
    proxy: Arc<proxy::Proxy>,
    pg_restart: String,
    heartbeat_interval: Duration,
    events: Arc<Events>,
    stop: CancellationToken,
) {
    if faults.is_empty() {
        return;
    }
    loop {
        let wait = rng.random_range(every.0..=every.1.max(every.0));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return,
        }
        let fault = faults[rng.random_range(0..faults.len())];
        let mut c = cluster.lock().await;
        let node = rng.random_range(0..c.nodes.len());
        let worker = rng.random_range(0..c.workers.len().max(1));
        let pause = Duration::from_millis(rng.random_range(200..1_500));
        let t = now_ms();
        let target = match fault {
            Fault::NodeKill | Fault::NodeTerm | Fault::NodePause => format!("node{node}"),
            Fault::WorkerKill | Fault::WorkerStop => format!("worker{worker}"),
            Fault::NetworkCut => "proxy".to_owned(),
            Fault::PgRestart => "postgres".to_owned(),
            Fault::DiskFull => "disk".to_owned(),
        };
        let outcome: Result<(), Error> = async {
            match fault {
                Fault::NodeKill => {
                    c.nodes[node].kill().await;
                    tokio::time::sleep(pause).await;
                    c.start_node(node).await
                }
                Fault::NodeTerm => {
                    if !c.nodes[node]
                        .terminate(DRAIN + Duration::from_secs(10))
                        .await
                    {
                        eprintln!("soak: node{node} did not stop within its drain; killed");
                    }
                    c.start_node(node).await
                }
                Fault::NodePause => {
                    c.nodes[node].signal("STOP")?;
                    tokio::time::sleep(LEASE + Duration::from_secs(2)).await;
                    c.nodes[node].signal("CONT")?;
                    Ok(())
                }
                Fault::WorkerKill => {
                    if let Some(w) = c.workers.get_mut(worker) {
                        w.kill().await;
                        c.start_worker(worker)?;
                    }
                    Ok(())
                }
                Fault::WorkerStop => {
                    if let Some(w) = c.workers.get(worker) {
                        w.signal("STOP")?;
                        // Past eviction: three missed keep-alive intervals.
                        tokio::time::sleep(heartbeat_interval * 3 + Duration::from_millis(1_500))
                            .await;
                        w.signal("CONT")?;
                    }
                    Ok(())
                }
                Fault::NetworkCut => {
                    proxy.cut();
                    Ok(())
                }
                Fault::PgRestart => {
                    let status = tokio::process::Command::new("sh")
                        .arg("-c")
                        .arg(&pg_restart)
                        .status()
                        .await?;
                    if !status.success() {
                        return Err(setup(format!("{pg_restart:?} failed: {status}")));
                    }
                    Ok(())
                }
                Fault::DiskFull => {
                    if let Some(disk) = &c.disk {
                        disk.fill()?;
                        tokio::time::sleep(pause + Duration::from_secs(1)).await;
                        disk.free()?;
                    }
                    Ok(())
                }
            }
        }
        .await;
        if let Err(e) = outcome {
            eprintln!("soak: {} failed: {e}", fault.name());
        }
        events.push(DriverEvent::Fault {
            kind: fault.name().to_owned(),
            target,
            t,
            until: now_ms(),
        });
    }
}

/// Waits until nothing in the namespace is scheduled or running.
async fn settle(mut client: ActivityServiceClient<Channel>, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if let Ok(stats) = client
            .stats(v1::StatsRequest {
                namespace: NAMESPACE.to_owned(),
            })
            .await
        {
            let s = stats.into_inner();
            if s.scheduled == 0 && s.running == 0 {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// Worker sessions that still count attempts in flight once nothing is RUNNING
/// (given a few seconds for acks on their way), on any node.
async fn held_slots(channels: &[Channel]) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut held = Vec::new();
        for (i, channel) in channels.iter().enumerate() {
            let mut admin = AdminServiceClient::new(channel.clone());
            match admin
                .list_workers(v1::ListWorkersRequest {
                    namespace: NAMESPACE.to_owned(),
                })
                .await
            {
                Ok(answer) => held.extend(
                    answer
                        .into_inner()
                        .workers
                        .into_iter()
                        .filter(|w| w.in_flight > 0)
                        .map(|w| format!("node{i}/{}: {}", w.identity, w.in_flight)),
                ),
                Err(s) => held.push(format!("node{i}: cannot list workers: {}", s.message())),
            }
        }
        if held.is_empty() || tokio::time::Instant::now() >= deadline {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the load's concurrency limit still counts once every activity has
/// finished: nothing, unless a fault left a key's counts behind its rows.
async fn keys_left(channels: &[Channel]) -> Vec<String> {
    let mut admin = AdminServiceClient::new(channels[0].clone());
    let listed = admin
        .list_concurrency_limits(v1::ListConcurrencyLimitsRequest {
            namespace: NAMESPACE.to_owned(),
        })
        .await;
    match listed {
        Ok(answer) => answer
            .into_inner()
            .concurrency_limits
            .into_iter()
            .filter(|l| l.concurrency_key.is_empty() && (l.keys > 0 || l.running > 0 || l.held > 0))
            .map(|l| format!("{} keys, {} running, {} held", l.keys, l.running, l.held))
            .collect(),
        Err(s) => vec![format!("cannot list concurrency limits: {}", s.message())],
    }
}

/// Every row of the namespace, by activity id.
async fn read_rows(
    mut client: ActivityServiceClient<Channel>,
) -> Result<HashMap<String, check::Row>, Error> {
    let mut rows = HashMap::new();
    let mut token = String::new();
    loop {
        let page = client
            .list(v1::ListRequest {
                namespace: NAMESPACE.to_owned(),
                page_size: 1_000,
                page_token: token,
                ..Default::default()
            })
            .await
            .map_err(|s| setup(format!("cannot list the activities: {}", s.message())))?
            .into_inner();
        for a in page.activities {
            let Some(key) = &a.key else { continue };
            let output = a
                .output
                .as_ref()
                .and_then(|p| serde_json::from_slice::<worker::Output>(&p.data).ok())
                .map(|o| (o.by, o.attempt));
            rows.insert(
                key.activity_id.clone(),
                check::Row {
                    status: v1::ActivityStatus::try_from(a.status)
                        .unwrap_or(v1::ActivityStatus::Unspecified),
                    attempt: a.attempt,
                    output,
                    error_kind: a
                        .last_error
                        .as_ref()
                        .and_then(|e| v1::ErrorKind::try_from(e.kind).ok()),
                    started_at: a.started_at.as_ref().map(spool_proto::time::from_proto),
                    finished_at: a.finished_at.as_ref().map(spool_proto::time::from_proto),
                },
            );
        }
        if page.next_page_token.is_empty() {
            return Ok(rows);
        }
        token = page.next_page_token;
    }
}
