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
mod faults;
pub mod history;
mod load;
mod report;
mod settle;
pub mod worker;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use spool_proto::v1::activity_service_client::ActivityServiceClient;

use args::Options;
use cluster::{Cluster, Disk};
use faults::Fault;
use history::Events;
use report::Report;

pub const NAMESPACE: &str = "soak";
pub const ACTIVITY_TYPE: &str = "soak";
const WORKFLOW: &str = "soak";

/// Node settings that make faults bite within seconds.
const LEASE: Duration = Duration::from_secs(5);
const DRAIN: Duration = Duration::from_secs(2);

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

async fn run(options: Options) -> Result<Report, Error> {
    check_breakages(&options.breakages)?;
    let sqlite = options.postgres.is_none();
    let nodes = if sqlite { 1 } else { options.nodes.max(1) };
    let mut faults = Fault::enabled(&options.faults, sqlite)?;
    let dir = run_dir(options.dir.as_deref())?;
    let disk = if sqlite && faults.contains(&Fault::DiskFull) {
        mount_disk(&options, &dir, &mut faults)?
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
    let (cluster, proxy) = Cluster::start(&options, nodes, &database, &dir, disk).await?;
    let addrs = cluster.addrs.clone();
    let cluster = Arc::new(tokio::sync::Mutex::new(cluster));
    let events = Arc::new(Events::create(&dir.join("driver.jsonl"))?);
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

    let channels = load::channels(&addrs)?;
    load::set_limits(&channels).await?;
    load::under_faults(&options, &faults, &channels, &cluster, &proxy, &events).await;
    cluster.lock().await.bring_back(&events).await?;
    eprintln!("soak: faults stopped; waiting for every activity to finish");
    let client = ActivityServiceClient::new(channels[0].clone());
    let settled = settle::settle(client.clone(), options.settle).await;
    let held = settle::held_slots(&channels).await;
    let keys_left = if settled {
        settle::keys_left(&channels).await
    } else {
        Vec::new()
    };
    let rows = settle::read_rows(client).await?;
    cluster.lock().await.stop().await;

    let worker_events = history::read_workers(&dir)?;
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

fn check_breakages(breakages: &[String]) -> Result<(), Error> {
    if !breakages.is_empty() && !spool_server::breakage::COMPILED_IN {
        return Err(setup(
            "--break needs a build with the breakages feature \
             (cargo build -p spool --features breakages)",
        ));
    }
    for name in breakages {
        if spool_server::breakage::Breakage::parse(name).is_none() {
            return Err(setup(format!("unknown breakage {name:?}")));
        }
    }
    Ok(())
}

/// The run directory: `dir`, which must be empty, or a fresh one.
fn run_dir(dir: Option<&Path>) -> Result<PathBuf, Error> {
    Ok(match dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            // Histories are appended to: an old run's would be judged with this one.
            if std::fs::read_dir(d)?.next().is_some() {
                return Err(setup(format!(
                    "the run directory {} is not empty; remove it or name another",
                    d.display()
                )));
            }
            d.to_owned()
        }
        None => tempfile::Builder::new()
            .prefix("spool-soak-")
            .tempdir()?
            .keep(),
    })
}

/// The small filesystem disk-full faults fill. Where it cannot be mounted, a run
/// that did not ask for disk-full by name goes on without it.
fn mount_disk(
    options: &Options,
    dir: &Path,
    faults: &mut Vec<Fault>,
) -> Result<Option<Disk>, Error> {
    let explicit_disk = options.faults.contains(&Fault::DiskFull);
    match Disk::mount(&dir.join("disk"), options.disk_mb) {
        Ok(d) => Ok(Some(d)),
        Err(e) if !explicit_disk => {
            eprintln!("soak: no disk-full faults: {e}");
            faults.retain(|f| *f != Fault::DiskFull);
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
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
