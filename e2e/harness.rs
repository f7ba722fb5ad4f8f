//! A real server on a free loopback port with its own SQLite file, real SDK workers,
//! and raw protocol clients for what the SDK would never send.
//!
//! With `SPOOL_TEST_NODES=N` (N > 1), every test that does not need one node of its
//! own (a SQLite file to open, a store with faults, one node's counts or limits)
//! runs on N nodes sharing a fresh PostgreSQL schema, behind a TCP proxy that hands
//! each new connection to the next node, as a load balancer would: a test's
//! submits, waits and workers land on different nodes.

use std::{
    future::Future,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use spool_proto::v1::{
    self, ServerMessage, WorkerMessage, activity_service_client::ActivityServiceClient,
    admin_service_client::AdminServiceClient, server_message, worker_message,
    worker_service_client::WorkerServiceClient,
};
use spool_server::{Config, store::Store};
use spool_testkit::proxy::Proxy;
use spool_worker::Worker;
use tokio::{net::TcpListener, sync::mpsc, task::JoinHandle};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Status, transport::Channel};

/// A client of the activity service, as a test calls it.
pub type Calls = ActivityServiceClient<Channel>;

pub const WAIT: Duration = Duration::from_secs(10);

/// How many nodes [`TestServer::start`] runs (`SPOOL_TEST_NODES`, 1 if unset).
pub fn nodes_wanted() -> usize {
    match std::env::var("SPOOL_TEST_NODES") {
        Ok(n) => n
            .parse()
            .ok()
            .filter(|n| *n >= 1)
            .unwrap_or_else(|| panic!("SPOOL_TEST_NODES={n:?}: a number of nodes, 1 or more")),
        Err(_) => 1,
    }
}

type Ended = Result<(), spool_server::server::Error>;

/// One `spool serve` in this process.
struct Node {
    endpoint: String,
    stop: CancellationToken,
    task: Option<JoinHandle<Ended>>,
}

impl Node {
    fn spawn(
        config: Config,
        listener: TcpListener,
        store: Option<Arc<dyn Store>>,
        endpoint: String,
    ) -> Self {
        let stop = CancellationToken::new();
        let shutdown = stop.clone().cancelled_owned();
        let task = match store {
            Some(store) => tokio::spawn(spool_server::server::run_with_store(
                config, store, listener, shutdown,
            )),
            None => tokio::spawn(spool_server::run(config, listener, shutdown)),
        };
        Self {
            endpoint,
            stop,
            task: Some(task),
        }
    }
}

pub struct TestServer {
    /// Where clients and workers connect: the node, or the proxy in front of the
    /// nodes.
    pub endpoint: String,
    pub database: String,
    nodes: Vec<Node>,
    /// In front of the nodes when there are several; dropped with them.
    _proxy: Option<Proxy>,
    _dir: Arc<tempfile::TempDir>,
}

impl TestServer {
    /// [`TestServer::start_with`], unconfigured.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// [`TestServer::start`], and a client of it.
    pub async fn serving() -> (Self, ActivityServiceClient<Channel>) {
        let server = Self::start().await;
        let client = server.client().await;
        (server, client)
    }

    /// A server of [`nodes_wanted`] nodes: one on its own SQLite file, or several
    /// on a fresh PostgreSQL schema behind a proxy.
    pub async fn start_with(configure: impl FnOnce(&mut Config)) -> Self {
        match nodes_wanted() {
            1 => Self::one_node_with(configure).await,
            n => {
                let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
                let database = postgres_schema().await;
                Self::start_nodes(dir, database, n, None, configure).await
            }
        }
    }

    /// One node on its own SQLite file, whatever `SPOOL_TEST_NODES` says: for a
    /// test about one node (its file, its own counts, its limits).
    pub async fn one_node() -> Self {
        Self::one_node_with(|_| {}).await
    }

    /// [`TestServer::one_node`], configured.
    pub async fn one_node_with(configure: impl FnOnce(&mut Config)) -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
        let database = format!("sqlite://{}", dir.path().join("spool.db").display());
        Self::start_nodes(dir, database, 1, None, configure).await
    }

    /// A server on a store the test made (one with faults, say).
    pub async fn on_store(store: Arc<dyn Store>, configure: impl FnOnce(&mut Config)) -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
        let database = format!("sqlite://{}", dir.path().join("spool.db").display());
        Self::start_nodes(dir, database, 1, Some(store), configure).await
    }

    /// `count` nodes on `database`, each configured alike; behind a proxy when
    /// there are several.
    async fn start_nodes(
        dir: Arc<tempfile::TempDir>,
        database: String,
        count: usize,
        store: Option<Arc<dyn Store>>,
        configure: impl FnOnce(&mut Config),
    ) -> Self {
        let mut config = Config::new(database.clone());
        // Short enough that a test whose worker never answers still stops quickly.
        config.drain_timeout = Duration::from_millis(500);
        configure(&mut config);
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut nodes = Vec::with_capacity(count);
        let mut addresses = Vec::with_capacity(count);
        for _ in 0..count {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let address = listener.local_addr().expect("addr");
            addresses.push(address);
            let endpoint = format!("{scheme}://{address}");
            nodes.push(Node::spawn(
                config.clone(),
                listener,
                store.clone(),
                endpoint,
            ));
        }
        let (endpoint, proxy) = if count == 1 {
            (nodes[0].endpoint.clone(), None)
        } else {
            let proxy = Proxy::start(addresses).await.expect("proxy");
            (format!("{scheme}://{}", proxy.addr), Some(proxy))
        };
        Self {
            endpoint,
            database,
            nodes,
            _proxy: proxy,
            _dir: dir,
        }
    }

    /// A server on `database` (a URL), sharing it with whoever else uses it.
    pub async fn start_on_database(database: &str) -> Self {
        Self::start_on_database_with(database, |_| {}).await
    }

    /// Two nodes on one fresh PostgreSQL schema.
    pub async fn two_on_postgres() -> (Self, Self) {
        let database = postgres_schema().await;
        let a = Self::start_on_database(&database).await;
        let b = Self::start_on_database(&database).await;
        (a, b)
    }

    /// [`TestServer::start_on_database`], configured.
    pub async fn start_on_database_with(
        database: &str,
        configure: impl FnOnce(&mut Config),
    ) -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
        Self::start_nodes(dir, database.to_owned(), 1, None, configure).await
    }

    /// Stops every node and starts as many again on the same database.
    pub async fn restart(mut self) -> Self {
        self.shutdown().await;
        let count = self.nodes.len();
        Self::start_nodes(
            self._dir.clone(),
            self.database.clone(),
            count,
            None,
            |_| {},
        )
        .await
    }

    /// Each node's own endpoint (one, unless the server has several nodes).
    pub fn node_endpoints(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.endpoint.as_str())
    }

    /// The address, `host:port`, without a scheme.
    pub fn address(&self) -> &str {
        self.endpoint
            .split_once("://")
            .map_or(self.endpoint.as_str(), |(_, a)| a)
    }

    /// How the server ended, once every node has (for servers expected to stop on
    /// their own, or asked to stop with [`TestServer::stop`]): the first node's
    /// error, if any; `None` if a node still runs after `within`.
    pub async fn ended_within(&mut self, within: Duration) -> Option<Ended> {
        let deadline = tokio::time::Instant::now() + within;
        let mut outcome = Ok(());
        for node in &mut self.nodes {
            if let Some(task) = node.task.as_mut() {
                let ended = tokio::time::timeout_at(deadline, task).await.ok()?;
                node.task = None;
                if let Err(e) = ended.expect("server task") {
                    outcome = outcome.and(Err(e));
                }
            }
        }
        Some(outcome)
    }

    /// Signals shutdown to every node without waiting for it.
    pub fn stop(&self) {
        for node in &self.nodes {
            node.stop.cancel();
        }
    }

    pub async fn shutdown(&mut self) {
        self.stop();
        for node in &mut self.nodes {
            if let Some(task) = node.task.take() {
                tokio::time::timeout(WAIT, task)
                    .await
                    .expect("server stops in time")
                    .expect("server task")
                    .expect("server ran cleanly");
            }
        }
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.endpoint.clone())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect")
    }

    pub async fn client(&self) -> ActivityServiceClient<Channel> {
        ActivityServiceClient::new(self.channel().await).max_decoding_message_size(64 << 20)
    }

    pub async fn admin(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::new(self.channel().await)
    }

    /// Runs an SDK worker until the returned guard drops.
    pub fn worker(&self, configure: impl FnOnce(Worker) -> Worker) -> WorkerGuard {
        let worker = configure(
            Worker::new(self.endpoint.clone())
                .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200)),
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn(worker.run(stop.clone()));
        WorkerGuard { stop, task }
    }

    /// An SDK worker that completes every activity of `activity_type` at once,
    /// with an empty output, until the returned guard drops.
    pub fn completing(&self, activity_type: &'static str) -> WorkerGuard {
        self.worker(|w| w.activity(activity_type, |_, _| async { Ok(v1::Payload::default()) }))
    }

    /// An admin client of each node, for what each node tells of itself only.
    async fn node_admins(&self) -> Vec<AdminServiceClient<Channel>> {
        let mut admins = Vec::new();
        for endpoint in self.node_endpoints() {
            let channel = Channel::from_shared(endpoint.to_owned())
                .expect("endpoint")
                .connect()
                .await
                .expect("connect");
            admins.push(AdminServiceClient::new(channel));
        }
        admins
    }

    /// The workers connected in the default namespace, over all nodes (each node
    /// lists its own).
    /// Submits `request` and takes its task with a raw worker of one slot for
    /// its type: a client, the worker, and the task it holds.
    pub async fn running_one(
        &self,
        request: v1::SubmitRequest,
    ) -> (ActivityServiceClient<Channel>, RawWorker, v1::ActivityTask) {
        let mut client = self.client().await;
        let activity_type = request.activity_type.clone();
        submit(&mut client, request).await;
        let mut worker = RawWorker::connect(self, &[&activity_type], 1).await;
        let task = worker.task().await;
        (client, worker, task)
    }

    pub async fn workers(&self) -> Result<Vec<v1::WorkerInfo>, Status> {
        let mut workers = Vec::new();
        for mut admin in self.node_admins().await {
            workers.extend(spool_testkit::calls::workers(&mut admin).await?);
        }
        Ok(workers)
    }

    /// Waits until `n` workers are connected in the default namespace, over all
    /// nodes.
    pub async fn await_workers(&self, n: usize) {
        eventually("workers to connect", || async {
            (self.workers().await.ok()?.len() == n).then_some(())
        })
        .await;
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}

pub struct WorkerGuard {
    stop: CancellationToken,
    task: JoinHandle<Result<(), spool_worker::Error>>,
}

impl WorkerGuard {
    /// Asks the worker to shut down; returns what `run` returned.
    pub async fn shutdown(self) -> Result<(), spool_worker::Error> {
        self.stop.cancel();
        self.stop_when_done().await
    }

    /// Waits for the worker to stop on its own (a permanent error).
    pub async fn stop_when_done(mut self) -> Result<(), spool_worker::Error> {
        (&mut self.task).await.expect("worker task")
    }
}

impl Drop for WorkerGuard {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Polls `check` until it yields a value, failing the test after [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    spool_testkit::fixtures::eventually_for(WAIT, what, check).await
}

pub use spool_testkit::calls::{list_all, list_pages, stats, stats_until, workers};

/// A `--tokens-file` granting `tokens` (each `{"token", "role",
/// "namespaces"?}`), in a directory of its own that lives as long as it.
pub struct TokensFile {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

pub fn tokens_file(tokens: serde_json::Value) -> TokensFile {
    let dir = tempfile::tempdir().expect("a directory for the tokens file");
    let path = dir.path().join("tokens.json");
    std::fs::write(&path, serde_json::json!({ "tokens": tokens }).to_string())
        .expect("write the tokens file");
    TokensFile { _dir: dir, path }
}

/// `message` as a request carrying `token` as its bearer token.
pub fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}")
            .parse()
            .expect("a token fits a header"),
    );
    request
}

pub fn key(workflow_id: &str, activity_id: &str) -> v1::ActivityKey {
    v1::ActivityKey {
        namespace: String::new(),
        workflow_id: workflow_id.into(),
        activity_id: activity_id.into(),
    }
}

pub fn json(value: serde_json::Value) -> v1::Payload {
    v1::Payload {
        content_type: spool_proto::activity::JSON.to_owned(),
        data: value.to_string().into_bytes(),
    }
}

pub fn request(activity_type: &str, workflow_id: &str, activity_id: &str) -> v1::SubmitRequest {
    v1::SubmitRequest {
        activity_type: activity_type.into(),
        workflow_id: workflow_id.into(),
        activity_id: activity_id.into(),
        input: Some(json(serde_json::json!({"id": activity_id}))),
        ..Default::default()
    }
}

pub fn fast_retries(max_attempts: u32) -> Option<v1::RetryPolicy> {
    Some(v1::RetryPolicy {
        max_attempts,
        initial_interval: Some(prost_types_duration(Duration::from_millis(10))),
        backoff_coefficient: 1.0,
        ..Default::default()
    })
}

pub fn prost_types_duration(d: Duration) -> prost_types::Duration {
    spool_proto::duration::to_proto(d)
}

pub async fn submit(client: &mut Calls, request: v1::SubmitRequest) -> v1::SubmitResponse {
    client.submit(request).await.expect("submit").into_inner()
}

/// Waits (server-side) until the activity is terminal.
pub async fn wait(client: &mut Calls, key: v1::ActivityKey) -> v1::Activity {
    let activity = wait_within(client, key, WAIT).await;
    assert!(
        activity.status >= v1::ActivityStatus::Completed as i32,
        "not terminal after {WAIT:?}: {activity:?}"
    );
    activity
}

/// Polls `key`'s row until `ready` accepts it (see [`eventually`]), and
/// returns the row that was.
pub async fn row_when(
    client: &Calls,
    key: v1::ActivityKey,
    what: &str,
    ready: impl Fn(&v1::Activity) -> bool,
) -> v1::Activity {
    let (ready, key) = (&ready, &key);
    eventually(what, || {
        let mut client = client.clone();
        async move {
            let row = get(&mut client, key.clone()).await;
            ready(&row).then_some(row)
        }
    })
    .await
}

/// The activity once terminal, or as it is after `within`.
pub async fn wait_within(
    client: &mut Calls,
    key: v1::ActivityKey,
    within: Duration,
) -> v1::Activity {
    client
        .wait(v1::WaitRequest {
            key: Some(key),
            timeout: Some(prost_types_duration(within)),
        })
        .await
        .expect("wait")
        .into_inner()
}

pub async fn get(client: &mut Calls, key: v1::ActivityKey) -> v1::Activity {
    read(client, key, false).await
}

pub async fn get_with_history(client: &mut Calls, key: v1::ActivityKey) -> v1::Activity {
    read(client, key, true).await
}

async fn read(client: &mut Calls, key: v1::ActivityKey, include_history: bool) -> v1::Activity {
    client
        .get(v1::GetRequest {
            key: Some(key),
            include_history,
        })
        .await
        .expect("get")
        .into_inner()
}

pub async fn cancel(
    client: &mut Calls,
    key: v1::ActivityKey,
    reason: impl Into<String>,
) -> Result<tonic::Response<v1::Activity>, Status> {
    client
        .cancel(v1::CancelRequest {
            key: Some(key),
            reason: reason.into(),
        })
        .await
}

/// A `Retry` of a dead letter or a cancelled activity: its re-drive.
pub async fn redrive(
    client: &mut Calls,
    key: v1::ActivityKey,
) -> Result<tonic::Response<v1::Activity>, Status> {
    client.retry(v1::RetryRequest { key: Some(key) }).await
}

/// Fails the test unless `answer` is INVALID_ARGUMENT saying `says`.
pub fn invalid<T: std::fmt::Debug>(answer: Result<T, Status>, says: &str) {
    let err = answer.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains(says), "{}", err.message());
}

/// The status of a `Get` that was refused (it panics if the call succeeded).
pub async fn get_refused(client: &mut Calls, key: v1::ActivityKey) -> Status {
    match client
        .get(v1::GetRequest {
            key: Some(key),
            ..Default::default()
        })
        .await
    {
        Ok(found) => panic!("expected the get refused, found {:?}", found.into_inner()),
        Err(status) => status,
    }
}

/// A count a test shares with its handlers.
#[derive(Clone, Default)]
pub struct Count(Arc<AtomicU32>);

impl Count {
    /// Counts one more: how many were counted before.
    pub fn bump(&self) -> u32 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }

    pub fn get(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

/// How many handlers run now, and the most that ever ran at once.
#[derive(Default)]
pub struct Gauge {
    now: AtomicU32,
    most: AtomicU32,
}

impl Gauge {
    /// Runs `work` counted among those running.
    pub async fn counted<T>(&self, work: impl Future<Output = T>) -> T {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let out = work.await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        out
    }

    pub fn most(&self) -> u32 {
        self.most.load(Ordering::SeqCst)
    }
}

/// Submits an activity of `activity_type` (workflow "wf") with `max_attempts`
/// fast retries and waits for its end.
pub async fn run_to_the_end(
    client: &mut Calls,
    activity_type: &str,
    activity_id: &str,
    max_attempts: u32,
) -> v1::Activity {
    submit_with_retries(client, activity_type, activity_id, max_attempts).await;
    wait(client, key("wf", activity_id)).await
}

/// Submits an activity of `activity_type` (workflow "wf") with `max_attempts`
/// fast retries.
pub async fn submit_with_retries(
    client: &mut Calls,
    activity_type: &str,
    activity_id: &str,
    max_attempts: u32,
) -> v1::SubmitResponse {
    let mut req = request(activity_type, "wf", activity_id);
    req.retry_policy = fast_retries(max_attempts);
    submit(client, req).await
}

/// Where an activity ended: its status and the attempt it ended on.
pub fn outcome(activity: &v1::Activity) -> (v1::ActivityStatus, u32) {
    (status(activity), activity.attempt)
}

/// The error a dead letter ended with (failing the test if the activity did
/// not end FAILED).
pub fn dead_letter_error(activity: &v1::Activity) -> v1::ActivityError {
    assert_eq!(status(activity), v1::ActivityStatus::Failed, "{activity:?}");
    activity.last_error.clone().expect("a dead letter's error")
}

pub fn status(activity: &v1::Activity) -> v1::ActivityStatus {
    v1::ActivityStatus::try_from(activity.status).expect("known status")
}

/// A worker speaking the protocol by hand.
pub struct RawWorker {
    pub tx: mpsc::Sender<WorkerMessage>,
    pub rx: tonic::Streaming<ServerMessage>,
    pub welcome: v1::Welcome,
}

pub fn hello(types: &[&str], max_concurrency: u32) -> v1::Hello {
    v1::Hello {
        namespace: String::new(),
        identity: "raw".into(),
        activity_types: types.iter().map(|t| t.to_string()).collect(),
        max_concurrency,
        protocol_version: 1,
        ..Default::default()
    }
}

impl RawWorker {
    /// Opens a session whose first message is `first`.
    pub async fn open(server: &TestServer, first: worker_message::Message) -> Result<Self, Status> {
        let mut client = WorkerServiceClient::new(server.channel().await);
        let (tx, rx) = mpsc::channel(64);
        tx.send(WorkerMessage {
            message: Some(first),
        })
        .await
        .expect("send first");
        let mut inbound = client.session(ReceiverStream::new(rx)).await?.into_inner();
        match inbound.message().await? {
            Some(ServerMessage {
                message: Some(server_message::Message::Welcome(welcome)),
            }) => Ok(Self {
                tx,
                rx: inbound,
                welcome,
            }),
            other => panic!("expected Welcome, got {other:?}"),
        }
    }

    pub async fn connect(server: &TestServer, types: &[&str], max_concurrency: u32) -> Self {
        Self::open(
            server,
            worker_message::Message::Hello(hello(types, max_concurrency)),
        )
        .await
        .expect("session")
    }

    /// The next message other than a keep-alive-irrelevant one, within [`WAIT`].
    pub async fn next(&mut self) -> server_message::Message {
        tokio::time::timeout(WAIT, self.rx.message())
            .await
            .expect("a server message in time")
            .expect("stream ok")
            .and_then(|m| m.message)
            .expect("a message")
    }

    /// Nothing arrives within `d`.
    pub async fn quiet_for(&mut self, d: Duration) {
        if let Ok(m) = tokio::time::timeout(d, self.rx.message()).await {
            panic!("expected silence, got {m:?}");
        }
    }

    pub async fn task(&mut self) -> v1::ActivityTask {
        match self.next().await {
            server_message::Message::Task(t) => t,
            other => panic!("expected a task, got {other:?}"),
        }
    }

    pub async fn send(&self, message: worker_message::Message) {
        self.tx
            .send(WorkerMessage {
                message: Some(message),
            })
            .await
            .expect("send");
    }

    /// A bare heartbeat: the worker is alive.
    pub async fn keep_alive(&self) {
        self.send(worker_message::Message::Heartbeat(v1::Heartbeat::default()))
            .await;
    }

    pub async fn complete(&self, task: &v1::ActivityTask, attempt: u32) {
        self.send(worker_message::Message::Result(v1::ActivityResult {
            workflow_id: task.workflow_id.clone(),
            activity_id: task.activity_id.clone(),
            attempt,
            outcome: Some(v1::activity_result::Outcome::Output(json(
                serde_json::json!("raw"),
            ))),
        }))
        .await;
    }

    /// The ack of a result and the task that follows it, in either order: the
    /// slot a result frees may be refilled in the very commit that records it, so
    /// the next task can leave before the ack.
    pub async fn ack_and_task(&mut self) -> (v1::ResultAck, v1::ActivityTask) {
        use server_message::Message::{Ack, Task};
        match [self.next().await, self.next().await] {
            [Ack(a), Task(t)] | [Task(t), Ack(a)] => (a, t),
            other => panic!("expected an ack and a task, got {other:?}"),
        }
    }

    /// A task and a cancel, in either order (a cancel and the task sent in the
    /// room it left, or a resent task and the cancel of another).
    pub async fn task_and_cancel(&mut self) -> (v1::ActivityTask, v1::CancelActivity) {
        use server_message::Message::{Cancel, Task};
        match [self.next().await, self.next().await] {
            [Task(t), Cancel(c)] | [Cancel(c), Task(t)] => (t, c),
            other => panic!("expected a task and a cancel, got {other:?}"),
        }
    }

    /// Completes `n` tasks one at a time, each as it comes (the first from
    /// [`Self::task`], each other after the last one's ack): their ids in the
    /// order served, and the task that came after them.
    pub async fn serve_one_at_a_time(&mut self, n: usize) -> (Vec<String>, v1::ActivityTask) {
        let mut task = self.task().await;
        let mut served = Vec::with_capacity(n);
        for _ in 0..n {
            served.push(task.activity_id.clone());
            self.complete(&task, task.attempt).await;
            task = self.ack_and_task().await.1;
        }
        (served, task)
    }

    pub async fn ack(&mut self) -> v1::ResultAck {
        match self.next().await {
            server_message::Message::Ack(a) => a,
            other => panic!("expected an ack, got {other:?}"),
        }
    }
}

#[allow(dead_code)]
pub fn database_path(server: &TestServer) -> PathBuf {
    PathBuf::from(server.database.trim_start_matches("sqlite://"))
}

/// A database URL for a fresh schema of its own on the PostgreSQL server the
/// environment names (see `fixtures::postgres_schema`).
pub async fn postgres_schema() -> String {
    spool_testkit::fixtures::postgres_schema("spool_e2e").await
}

/// Reads `socket` until the server closes it, and checks it did so at the
/// handshake timeout (10 s after `since`): not before, and not long after.
pub async fn closed_at_the_handshake_timeout(
    socket: &mut tokio::net::TcpStream,
    since: std::time::Instant,
) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(n) = socket.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await
    .expect("the server closes the socket");
    let took = since.elapsed();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(15),
        "closed after {took:?}"
    );
}
