//! Processes under test: a `spool serve` per test on its own port and database,
//! worker processes, and the client calls the tests share.

use std::{
    future::Future,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use spool_proto::v1::{
    self, activity_service_client::ActivityServiceClient, admin_service_client::AdminServiceClient,
};
use spool_worker::Worker;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::transport::Channel;

use super::child;

pub const WAIT: Duration = Duration::from_secs(15);

/// A port for a server process to bind later. A port the kernel hands out for
/// `:0` could be handed to another test meanwhile, so pick one below the
/// ephemeral range (32768 and up on Linux), free when checked.
pub fn free_port() -> u16 {
    (0..1_000)
        .map(|_| rand::random_range(20_000u16..32_000))
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port")
}

/// One test's database, port and log directory; servers started from it share them.
pub struct Env {
    dir: tempfile::TempDir,
    port: u16,
}

impl Env {
    pub fn new() -> Self {
        let port = free_port();
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
            port,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A path in this environment's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes a file in this environment's directory.
    pub fn file(&self, name: &str, contents: &[u8]) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).expect("write file");
        path
    }

    /// Starts `spool serve` on this environment's port and database.
    pub fn server(&self, args: &[&str]) -> ServerProcess {
        self.server_on(&self.database(), args)
    }

    /// This environment's SQLite database URL.
    pub fn database(&self) -> String {
        format!("sqlite://{}", self.dir.path().join("spool.db").display())
    }

    /// Starts `spool serve` on this environment's port and the given database.
    pub fn server_on(&self, database: &str, args: &[&str]) -> ServerProcess {
        self.server_with(database, args, &[])
    }

    /// [`Env::server_on`] with extra environment variables.
    pub fn server_with(
        &self,
        database: &str,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> ServerProcess {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .expect("server log");
        let child = Command::new(env!("CARGO_BIN_EXE_spool"))
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--database", database])
            .args(args)
            .env("RUST_LOG", "info")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn spool serve");
        ServerProcess {
            child,
            url: self.url(),
        }
    }

    /// A server started with `args`, and a client connected to it.
    pub async fn serving(&self, args: &[&str]) -> (ServerProcess, ActivityServiceClient<Channel>) {
        let server = self.server(args);
        let client = server.client().await;
        (server, client)
    }

    /// A server with `args`, a client of it, and a worker process of `slots`
    /// slots once it is connected.
    pub async fn served(
        &self,
        args: &[&str],
        slots: u32,
    ) -> (ServerProcess, ActivityServiceClient<Channel>, WorkerProcess) {
        let (server, mut client) = self.serving(args).await;
        let worker = self.worker(slots);
        server.await_workers(&mut client, 1).await;
        (server, client, worker)
    }

    /// Starts a worker process (this test binary, re-run as [`child::run`]).
    pub fn worker(&self, concurrency: u32) -> WorkerProcess {
        let n = std::fs::read_dir(self.dir.path())
            .map(|d| d.count())
            .unwrap_or(0);
        let log = self.dir.path().join(format!("worker-{n}.log"));
        let stderr = self.dir.path().join(format!("worker-{n}.stderr"));
        let config = serde_json::json!({
            "server": self.url(),
            "log": log.display().to_string(),
            "concurrency": concurrency,
        });
        let child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "worker_process_entry",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(child::CONFIG_ENV, config.to_string())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("worker stderr"))
            .spawn()
            .expect("spawn worker process");
        WorkerProcess { child, log, stderr }
    }
}

pub struct ServerProcess {
    child: Child,
    pub url: String,
}

impl ServerProcess {
    /// A client, once the server answers.
    pub async fn client(&self) -> ActivityServiceClient<Channel> {
        let url = self.url.clone();
        eventually("the server to answer", || {
            let url = url.clone();
            async move {
                let channel = Channel::from_shared(url).ok()?.connect().await.ok()?;
                let mut client = ActivityServiceClient::new(channel);
                client.stats(v1::StatsRequest::default()).await.ok()?;
                Some(client)
            }
        })
        .await
    }

    /// An admin client of the server, which answers already.
    pub async fn admin(&self) -> AdminServiceClient<Channel> {
        admin_of(&self.url).await
    }

    /// Sets `activity_type`'s rate limit: `limit` rows each `period`.
    pub async fn set_rate_limit(&self, activity_type: &str, limit: u32, period: Duration) {
        let rate_limit = v1::RateLimit {
            activity_type: activity_type.into(),
            limit,
            period: Some(spool_proto::duration::to_proto(period)),
            ..Default::default()
        };
        let set = v1::SetRateLimitRequest {
            rate_limit: Some(rate_limit),
        };
        self.admin()
            .await
            .set_rate_limit(set)
            .await
            .expect("set the rate limit");
    }

    /// Sets `activity_type`'s concurrency limit: `max_running` at once per key.
    pub async fn set_concurrency_limit(&self, activity_type: &str, max_running: u32) {
        let limit = Some(v1::ConcurrencyLimit {
            activity_type: activity_type.into(),
            max_running,
            ..Default::default()
        });
        let mut admin = self.admin().await;
        let set = v1::SetConcurrencyLimitRequest {
            concurrency_limit: limit,
        };
        admin
            .set_concurrency_limit(set)
            .await
            .expect("set the limit");
    }

    /// Waits until the server reports NOT_SERVING (a drain began).
    pub async fn await_not_serving(&self) {
        use tonic_health::pb::{
            HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
        };
        self.on_each_connection("the server to go NOT_SERVING", |channel| async move {
            let status = HealthClient::new(channel)
                .check(HealthCheckRequest::default())
                .await
                .ok()?
                .into_inner()
                .status;
            (status == ServingStatus::NotServing as i32).then_some(())
        })
        .await
    }

    /// Waits until `check` says so of a new connection to the server (one
    /// refused counts as not yet), each try on its own connection.
    async fn on_each_connection<F, Fut>(&self, what: &str, check: F)
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Option<()>>,
    {
        let url = self.url.clone();
        eventually(what, || {
            let url = url.clone();
            let check = &check;
            async move {
                let channel = Channel::from_shared(url).ok()?.connect().await.ok()?;
                check(channel).await
            }
        })
        .await
    }

    pub async fn await_workers(&self, client: &mut ActivityServiceClient<Channel>, n: u32) {
        let _ = client;
        self.on_each_connection("workers to connect", |channel| async move {
            let workers = workers(&mut AdminServiceClient::new(channel)).await.ok()?;
            (workers.len() == n as usize).then_some(())
        })
        .await;
    }

    pub fn kill_9(&mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
    }

    pub fn signal(&self, signal: &str) {
        send_signal(self.child.id(), signal);
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The most memory the process has held so far (`VmHWM`), in bytes.
    pub fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc status");
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM");
        kb * 1024
    }

    /// Waits for the process to exit; its exit code (`None` if killed by a signal).
    pub async fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the server did not exit within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct WorkerProcess {
    child: Child,
    log: PathBuf,
    stderr: PathBuf,
}

impl WorkerProcess {
    pub fn log(&self) -> Log {
        Log(std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn signal(&self, signal: &str) {
        send_signal(self.child.id(), signal);
    }

    pub fn kill_9(&mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
    }

    /// Its exit code once it exits within `within`; `None` if it did not.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A worker process's log: `start ID ATTEMPT` and `done ID ATTEMPT` lines.
pub struct Log(String);

impl Log {
    fn count(&self, kind: &str) -> usize {
        self.0.lines().filter(|l| l.starts_with(kind)).count()
    }

    pub fn starts(&self) -> usize {
        self.count("start ")
    }

    pub fn dones(&self) -> usize {
        self.count("done ")
    }

    /// The attempts of `activity_id` that started (`kind` "start") or finished
    /// ("done"), in order.
    pub fn attempts(&self, kind: &str, activity_id: &str) -> Vec<u32> {
        let prefix = format!("{kind} {activity_id} ");
        self.0
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|attempt| attempt.parse().ok())
            .collect()
    }

    /// Some activity started its attempt `attempt`.
    pub fn started(&self, attempt: u32) -> bool {
        self.0
            .lines()
            .any(|l| l.starts_with("start ") && l.ends_with(&format!(" {attempt}")))
    }
}

fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// An SDK worker in this process for `activity_type`, answering at once.
pub fn in_process_worker(server: &ServerProcess, activity_type: &str) -> DropGuard {
    let stop = CancellationToken::new();
    let worker = Worker::new(server.url.clone())
        .identity("in-process")
        .activity(activity_type, |ctx, _| async move {
            spool_worker::json(&serde_json::json!({
                "pid": "in-process",
                "attempt": ctx.info().attempt,
            }))
        });
    tokio::spawn(worker.run(stop.clone()));
    stop.drop_guard()
}

/// An SDK worker in this process (identity `observed`) for the types the
/// dashboard and metrics tests need: `flaky` fails its first two attempts
/// (retryable) and completes the third; `poison` fails its first attempt for good
/// (a dead letter) and completes once re-driven; `echo` answers its input.
pub fn observed_worker(server: &ServerProcess) -> DropGuard {
    observed_worker_with_token(server, None)
}

/// [`observed_worker`] presenting `token`.
pub fn observed_worker_with_token(server: &ServerProcess, token: Option<&str>) -> DropGuard {
    let stop = CancellationToken::new();
    let mut worker = Worker::new(server.url.clone());
    if let Some(token) = token {
        worker = worker.token(token);
    }
    let worker = worker
        .identity("observed")
        .activity("flaky", |ctx, _| async move {
            let attempt = ctx.info().attempt;
            if attempt < 3 {
                return Err(spool_worker::ActivityError::retryable(
                    "Flaky",
                    format!("attempt {attempt} fails"),
                ));
            }
            spool_worker::json(&serde_json::json!({ "attempt": attempt }))
        })
        .activity("poison", |ctx, _| async move {
            let attempt = ctx.info().attempt;
            if attempt == 1 {
                return Err(spool_worker::ActivityError::terminal(
                    "Poison",
                    "the first attempt always fails",
                ));
            }
            spool_worker::json(&serde_json::json!({ "attempt": attempt }))
        })
        .activity("echo", |_, input| async move { Ok(input) });
    tokio::spawn(worker.run(stop.clone()));
    stop.drop_guard()
}

/// A submit of `activity_type` retried after 10 ms, at most `max_attempts` times.
pub fn quick_retry_request(
    activity_type: &str,
    activity_id: &str,
    max_attempts: u32,
) -> v1::SubmitRequest {
    v1::SubmitRequest {
        activity_type: activity_type.into(),
        workflow_id: "p".into(),
        activity_id: activity_id.into(),
        input: spool_worker::json(&serde_json::json!({ "id": activity_id })).ok(),
        retry_policy: Some(v1::RetryPolicy {
            max_attempts,
            initial_interval: Some(spool_proto::duration::to_proto(Duration::from_millis(10))),
            backoff_coefficient: 1.0,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn now_ms() -> i64 {
    spool_proto::time::now_millis()
}

/// The activity `id` once it completed, failing the test after `within`.
pub async fn completed_within(
    client: &ActivityServiceClient<Channel>,
    id: &str,
    within: Duration,
) -> v1::Activity {
    eventually_for(within, &format!("{id} to complete"), || {
        let mut client = client.clone();
        async move {
            let row = get(&mut client, id).await;
            (status(&row) == v1::ActivityStatus::Completed).then_some(row)
        }
    })
    .await
}

/// Waits up to `within` until the server's Stats count `n` activities completed.
pub async fn await_completed(client: &ActivityServiceClient<Channel>, n: usize, within: Duration) {
    let what = format!("{n} activities to complete");
    stats_until(client, within, &what, |s| s.completed == n as u64).await;
}

pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_for(WAIT, what, check).await
}

pub fn key(activity_id: &str) -> v1::ActivityKey {
    v1::ActivityKey {
        namespace: String::new(),
        workflow_id: "p".into(),
        activity_id: activity_id.into(),
    }
}

pub fn sleep_request(activity_id: &str, ms: u64, delay: Option<Duration>) -> v1::SubmitRequest {
    v1::SubmitRequest {
        activity_type: "sleep".into(),
        workflow_id: "p".into(),
        activity_id: activity_id.into(),
        input: spool_worker::json(&serde_json::json!({ "ms": ms })).ok(),
        delay: delay.map(spool_proto::duration::to_proto),
        ..Default::default()
    }
}

/// An admin client of the server at `url`, which answers already.
pub async fn admin_of(url: &str) -> AdminServiceClient<Channel> {
    let channel = Channel::from_shared(url.to_owned())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    AdminServiceClient::new(channel)
}

pub async fn submit(client: &mut ActivityServiceClient<Channel>, request: v1::SubmitRequest) {
    client.submit(request).await.expect("submit");
}

pub async fn get(client: &mut ActivityServiceClient<Channel>, activity_id: &str) -> v1::Activity {
    client
        .get(v1::GetRequest {
            key: Some(key(activity_id)),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner()
}

pub async fn wait(client: &mut ActivityServiceClient<Channel>, activity_id: &str) -> v1::Activity {
    client
        .wait(v1::WaitRequest {
            key: Some(key(activity_id)),
            timeout: Some(spool_proto::duration::to_proto(WAIT)),
        })
        .await
        .expect("wait")
        .into_inner()
}

pub fn status(activity: &v1::Activity) -> v1::ActivityStatus {
    v1::ActivityStatus::try_from(activity.status).expect("known status")
}

pub use spool_testkit::calls::{list_all, stats, stats_until, workers};

pub use spool_testkit::fixtures::eventually_for;

/// Fails the test unless there is a row for each of `says`, and each row holds
/// every text its entry names.
pub fn assert_rows_say(rows: &[impl AsRef<str> + std::fmt::Debug], says: &[&[&str]]) {
    assert_eq!(rows.len(), says.len(), "{rows:?}");
    for (row, texts) in rows.iter().zip(says) {
        for text in *texts {
            assert!(
                row.as_ref().contains(text),
                "{text:?} not in {row:?}: {rows:?}"
            );
        }
    }
}

/// Two nodes on one fresh PostgreSQL schema, each started with `args`; the
/// environments are returned to outlive the servers.
pub async fn two_nodes(args: &[&str]) -> (Env, Env, ServerProcess, ServerProcess) {
    let database = postgres_schema().await;
    let (node_a, node_b) = (Env::new(), Env::new());
    let a = node_a.server_on(&database, args);
    let b = node_b.server_on(&database, args);
    (node_a, node_b, a, b)
}

/// A database URL for a fresh schema of its own on the PostgreSQL server the
/// environment names (see `fixtures::postgres_schema`).
pub async fn postgres_schema() -> String {
    spool_testkit::fixtures::postgres_schema("spool_proc").await
}
