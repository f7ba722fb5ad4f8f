//! The soak's processes: nodes (`spool serve`) and workers (`spool soak-worker`),
//! each a child process that can be killed, stopped, continued and started again,
//! with its output appended to a log file in the run directory; and the run's
//! [`Cluster`] of them, brought back after each fault.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use spool_proto::v1::{StatsRequest, activity_service_client::ActivityServiceClient};
use spool_testkit::proxy::Proxy;
use tokio::process::{Child, Command};

use super::{
    DRAIN, Error, LEASE, Options,
    history::{DriverEvent, Events, now_ms},
    setup,
};

/// A child process slot: what to run, and the process running it now (if any).
pub struct Proc {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    /// Times this slot was started; part of a worker's identity.
    pub starts: u32,
}

impl Proc {
    pub fn new(name: &str, program: &Path, args: Vec<String>, dir: &Path) -> Proc {
        Proc {
            program: program.to_owned(),
            args,
            env: Vec::new(),
            log: dir.join(format!("{name}.log")),
            child: None,
            starts: 0,
        }
    }

    pub fn env(mut self, key: &str, value: &str) -> Proc {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Starts the process; `extra` args are added for this start only.
    pub fn start(&mut self, extra: &[String]) -> std::io::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .args(extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Whether a process was started and has not exited.
    pub fn running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Whether a process was started and exited on its own.
    pub fn exited(&mut self) -> bool {
        self.child.is_some() && !self.running()
    }

    pub fn signal(&self, signal: &str) -> std::io::Result<()> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "kill -{signal} {pid} failed: {status}"
            )))
        }
    }

    /// `kill -9`, then reaps it.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// SIGTERM, and waits up to `within` for it to exit; past that, `kill -9`.
    /// True if it exited by itself.
    pub async fn terminate(&mut self, within: Duration) -> bool {
        let _ = self.signal("CONT");
        let _ = self.signal("TERM");
        let Some(child) = &mut self.child else {
            return true;
        };
        let exited = tokio::time::timeout(within, child.wait()).await.is_ok();
        if !exited {
            self.kill().await;
        }
        self.child = None;
        exited
    }

    /// Forgets a process that exited (after `exited` said so).
    pub fn reap(&mut self) {
        self.child = None;
    }
}

/// Waits until a node answers `Stats`.
pub async fn ready(addr: SocketAddr, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if let Ok(mut client) = ActivityServiceClient::connect(format!("http://{addr}")).await
            && client
                .stats(StatsRequest {
                    namespace: super::NAMESPACE.to_owned(),
                })
                .await
                .is_ok()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// A port free now on 127.0.0.1 (the OS's pick, released for the child to take).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A small filesystem for the SQLite file, to fill up on demand.
pub struct Disk {
    pub path: PathBuf,
}

impl Disk {
    pub fn mount(path: &Path, megabytes: u64) -> std::io::Result<Disk> {
        std::fs::create_dir_all(path)?;
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(path)
            .stderr(Stdio::null())
            .status()?;
        if !status.success() {
            return Err(std::io::Error::other(format!(
                "mount -t tmpfs failed ({status}); a full-disk fault needs root"
            )));
        }
        Ok(Disk {
            path: path.to_owned(),
        })
    }

    fn filler(&self) -> PathBuf {
        self.path.join("filler")
    }

    /// Writes until the filesystem is full.
    pub fn fill(&self) -> std::io::Result<u64> {
        use std::io::Write;
        let mut file = std::fs::File::create(self.filler())?;
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => return Err(e),
            }
        }
        let _ = file.sync_all();
        Ok(written)
    }

    pub fn free(&self) -> std::io::Result<()> {
        match std::fs::remove_file(self.filler()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

pub(super) struct Cluster {
    pub(super) nodes: Vec<Proc>,
    pub(super) addrs: Vec<SocketAddr>,
    pub(super) workers: Vec<Proc>,
    dir: PathBuf,
    pub(super) disk: Option<Disk>,
}

impl Cluster {
    /// Starts `nodes` nodes on `database`, then the workers, reaching the nodes
    /// through the proxy it returns.
    pub(super) async fn start(
        options: &Options,
        nodes: usize,
        database: &str,
        dir: &Path,
        disk: Option<Disk>,
    ) -> Result<(Cluster, Proxy), Error> {
        let mut addrs = Vec::with_capacity(nodes);
        let mut node_procs = Vec::with_capacity(nodes);
        for i in 0..nodes {
            let port = free_port()?;
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            addrs.push(addr);
            let args = vec![
                "serve".to_owned(),
                "--listen".to_owned(),
                addr.to_string(),
                "--database".to_owned(),
                database.to_owned(),
                "--drain-timeout".to_owned(),
                format!("{}ms", DRAIN.as_millis()),
                "--lease-timeout".to_owned(),
                format!("{}ms", LEASE.as_millis()),
                "--heartbeat-interval".to_owned(),
                format!("{}ms", options.heartbeat_interval.as_millis()),
            ];
            let mut p =
                Proc::new(&format!("node{i}"), &options.binary, args, dir).env("RUST_LOG", "info");
            if !options.breakages.is_empty() {
                p = p.env(spool_server::breakage::ENV, &options.breakages.join(","));
            }
            node_procs.push(p);
        }
        let proxy = Proxy::start(addrs.clone()).await?;
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
                    dir,
                )
            })
            .collect();
        let mut cluster = Cluster {
            nodes: node_procs,
            addrs,
            workers: worker_procs,
            dir: dir.to_owned(),
            disk,
        };
        // The first node migrates the schema before the others start.
        for i in 0..nodes {
            cluster.start_node(i).await?;
        }
        for i in 0..options.workers {
            cluster.start_worker(i)?;
        }
        Ok((cluster, proxy))
    }

    pub(super) async fn start_node(&mut self, i: usize) -> Result<(), Error> {
        self.nodes[i].start(&[])?;
        if ready(self.addrs[i], Duration::from_secs(60)).await {
            Ok(())
        } else {
            Err(setup(format!(
                "node {i} did not answer within 60 s; see {}",
                self.dir.join(format!("node{i}.log")).display()
            )))
        }
    }

    pub(super) fn start_worker(&mut self, i: usize) -> Result<(), Error> {
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
    pub(super) async fn supervise(&mut self, events: &Events) -> Result<(), Error> {
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

    /// Once the faults stop: every process continued, the disk freed, and what
    /// died brought back.
    pub(super) async fn bring_back(&mut self, events: &Events) -> Result<(), Error> {
        for p in self.nodes.iter().chain(self.workers.iter()) {
            let _ = p.signal("CONT");
        }
        if let Some(disk) = &self.disk {
            disk.free()?;
        }
        self.supervise(events).await
    }

    /// Stops every process at the end of the run.
    pub(super) async fn stop(&mut self) {
        for w in &mut self.workers {
            w.kill().await;
        }
        for n in &mut self.nodes {
            n.terminate(DRAIN + Duration::from_secs(10)).await;
        }
        // The database outlives the small filesystem, for a post-mortem.
        if let Some(disk) = self.disk.take() {
            for file in ["soak.db", "soak.db-wal"] {
                let _ = std::fs::copy(disk.path.join(file), self.dir.join(file));
            }
        }
    }
}
