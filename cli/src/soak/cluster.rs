//! The soak's processes: nodes (`spool serve`) and workers (`spool soak-worker`),
//! each a child process that can be killed, stopped, continued and started again,
//! with its output appended to a log file in the run directory.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use spool_proto::v1::{StatsRequest, activity_service_client::ActivityServiceClient};
use tokio::process::{Child, Command};

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
