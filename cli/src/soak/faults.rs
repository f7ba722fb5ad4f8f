//! The fault injector: which faults a run may pick, and the seeded loop that
//! picks one at random intervals and does what an operator or a supervisor
//! would after it.

use std::{sync::Arc, time::Duration};

use rand::{Rng, rngs::StdRng};
use spool_testkit::proxy::Proxy;
use tokio_util::sync::CancellationToken;

use super::{
    DRAIN, Error, LEASE,
    cluster::Cluster,
    history::{DriverEvent, Events, now_ms},
    setup,
};

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

    /// The kinds a run picks from: `asked`, or every kind the store supports.
    pub(super) fn enabled(asked: &[Fault], sqlite: bool) -> Result<Vec<Fault>, Error> {
        let faults: Vec<Fault> = if asked.is_empty() {
            Fault::ALL
                .into_iter()
                .filter(|f| match f {
                    Fault::PgRestart => !sqlite,
                    Fault::DiskFull => sqlite,
                    _ => true,
                })
                .collect()
        } else {
            asked.to_vec()
        };
        if sqlite && faults.contains(&Fault::PgRestart) {
            return Err(setup("pg-restart needs --postgres"));
        }
        if !sqlite && faults.contains(&Fault::DiskFull) {
            return Err(setup("disk-full is for the SQLite store only"));
        }
        Ok(faults)
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn inject(
    mut rng: StdRng,
    faults: Vec<Fault>,
    every: (Duration, Duration),
    cluster: Arc<tokio::sync::Mutex<Cluster>>,
    proxy: Arc<Proxy>,
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
