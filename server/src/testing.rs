//! An in-process server for the tests of services and workers built on Spool
//! (the `testing` feature): a fresh SQLite database in a temporary directory, a
//! free port on 127.0.0.1, stopped and deleted when dropped.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let server = spool_server::testing::TestServer::start().await?;
//! // Point `spool_client::Client::builder` and `spool_worker::Worker::new` at it:
//! let endpoint = server.endpoint();
//! # let _ = endpoint;
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{Config, server::Error};

/// A server running in this process until dropped (or [`TestServer::stop`]ped).
pub struct TestServer {
    endpoint: String,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), Error>>>,
    /// Deleted with the server.
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// A server with the defaults, but a short drain (tests end quickly).
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(|_| {}).await
    }

    /// A server configured by `configure` (its database is the temporary one).
    pub async fn start_with(configure: impl FnOnce(&mut Config)) -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut config = Config::new(format!(
            "sqlite://{}",
            dir.path().join("spool.db").display()
        ));
        config.drain_timeout = Duration::from_millis(500);
        configure(&mut config);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let stop = CancellationToken::new();
        let task = tokio::spawn(crate::run(config, listener, stop.clone().cancelled_owned()));
        Ok(Self {
            endpoint,
            stop,
            task: Some(task),
            _dir: dir,
        })
    }

    /// Where clients and workers connect: `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Drains and stops the server; how it ended.
    pub async fn stop(mut self) -> Result<(), Error> {
        self.stop.cancel();
        match self.task.take() {
            Some(task) => match task.await {
                Ok(ended) => ended,
                // A panic in the server is the test's failure: raise it there.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => Ok(()),
            },
            None => Ok(()),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
