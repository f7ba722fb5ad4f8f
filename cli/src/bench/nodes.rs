//! `spool bench --nodes N`: N `spool serve` processes of this same binary on one
//! database, each on a loopback port of its own, measured as they run in
//! production: every node is its own process, so its CPU is its own (read from
//! `/proc`), apart from the bench's submitters and workers.
//!
//! The processes are killed when [`Nodes`] is dropped, so a failed or interrupted
//! bench leaves none behind.

use std::{path::PathBuf, process::Stdio, time::Duration};

use tokio::process::{Child, Command};

use super::Error;

pub struct Nodes {
    nodes: Vec<Node>,
}

struct Node {
    endpoint: String,
    pid: u32,
    /// Held so the process is killed with it.
    _child: Child,
}

impl Nodes {
    /// Starts `count` nodes on `database`; `token` becomes each one's
    /// `--auth-token`.
    pub async fn start(
        count: usize,
        database: &str,
        token: Option<&str>,
        retention: Option<std::time::Duration>,
    ) -> Result<Self, Error> {
        let exe = std::env::current_exe()
            .map_err(|e| Error::Setup(format!("cannot find this binary to run nodes: {e}")))?;
        let mut nodes = Vec::with_capacity(count);
        for i in 0..count {
            nodes.push(Node::start(&exe, i, database, token, retention).await?);
        }
        Ok(Self { nodes })
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.endpoint.clone()).collect()
    }

    /// Each node's name (as the bench reports it) and process id.
    pub fn processes(&self) -> Vec<(String, u32)> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("node-{i}"), n.pid))
            .collect()
    }
}

impl Node {
    async fn start(
        exe: &PathBuf,
        index: usize,
        database: &str,
        token: Option<&str>,
        retention: Option<Duration>,
    ) -> Result<Self, Error> {
        let listen = free_port()?;
        let mut command = Command::new(exe);
        command
            .arg("serve")
            .args(["--listen", &listen])
            .args(["--database", database])
            .args(["--node-name", &format!("bench-node-{index}")])
            .args(["--drain-timeout", "1s"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(token) = token {
            command.args(["--auth-token", token]);
        }
        if let Some(retention) = retention {
            command.args(["--retention", &format!("{}ms", retention.as_millis())]);
        }
        let child = command
            .spawn()
            .map_err(|e| Error::Setup(format!("cannot start node {index}: {e}")))?;
        let pid = child
            .id()
            .ok_or_else(|| Error::Setup(format!("node {index} exited at once")))?;
        let endpoint = format!("http://{listen}");
        wait_listening(&listen, Duration::from_secs(30))
            .await
            .map_err(|e| Error::Setup(format!("node {index} on {listen}: {e}")))?;
        Ok(Self {
            endpoint,
            pid,
            _child: child,
        })
    }
}

/// A loopback address no one listens on now (the port is free again when the
/// node binds it a moment later).
fn free_port() -> Result<String, Error> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::Setup(format!("no free port: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Setup(format!("no free port: {e}")))?;
    Ok(addr.to_string())
}

async fn wait_listening(addr: &str, within: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(format!("not listening after {within:?}: {e}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
