//! Wiring and lifecycle of one server process: open the store, reclaim what a
//! previous process left RUNNING, start the committer, serve gRPC until the
//! shutdown future completes, then stop in order.
//!
//! Shutdown order, and why:
//! 1. drain (see `drain`): NOT_SERVING, no more dispatch, workers told, running
//!    attempts finish until the drain timeout, leftovers released;
//! 2. the root token is cancelled: sessions end their streams (the server closes
//!    them itself: a graceful gRPC shutdown would wait forever on open streams),
//!    parked `Wait`s answer, the sweeper stops;
//! 3. the gRPC server stops once those calls have ended, or 2 s later regardless;
//! 4. session clean-ups are awaited (their releases are queued to the committer);
//! 5. the committer commits everything queued, then stops; the store closes last.

use std::{future::Future, sync::Arc, time::Duration};

use spool_proto::v1::{
    activity_service_server::ActivityServiceServer, admin_service_server::AdminServiceServer,
    worker_service_server::WorkerServiceServer,
};
use tokio::net::TcpListener;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tonic::service::interceptor::InterceptedService;
use tonic_health::ServingStatus;

use crate::{
    api::{activity::ActivityApi, admin::AdminApi, auth::Auth, worker::WorkerApi},
    config::Config,
    dispatch::Core,
    dispatch::{Committer, Pending, Registry, committer, heartbeat},
    drain::{self, Drainer},
    lifecycle,
    store::Attempt,
    store::{self, Op, Outcome, Store},
    transport,
};

/// How long the gRPC server may take to stop once streams are closed.
const STOP_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database could not be opened, locked or migrated.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// The gRPC server failed (the listener broke).
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The tokens file is missing or invalid; the message says where.
    #[error(transparent)]
    Tokens(#[from] crate::api::auth::TokensFileError),
    /// A setting the server cannot run with; the message names the flag.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A TLS file is missing or unreadable; the message names the flag.
    #[error(transparent)]
    Tls(#[from] crate::transport::TlsError),
    /// A background task the node cannot live without stopped; the node went
    /// NOT_SERVING and stopped so that its supervisor restarts it.
    #[error("{task} stopped: {why}; the node stops so that it can be restarted")]
    TaskDied { task: &'static str, why: String },
    /// The dashboard's address cannot be bound.
    #[error("cannot listen on {0} (--ui-listen): {1}")]
    UiListen(std::net::SocketAddr, std::io::Error),
}

/// Serves on `listener` until `shutdown` completes, then drains and stops cleanly.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let prepared = prepare(&config)?;
    let store = store::open(&config.database).await?;
    serve(config, prepared, store, listener, shutdown).await
}

/// [`run`] on a store opened by the caller (a test's, or one wrapped with faults).
pub async fn run_with_store(
    config: Config,
    store: Arc<dyn Store>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let prepared = prepare(&config)?;
    serve(config, prepared, store, listener, shutdown).await
}

/// What is checked and read before any store is opened: a bad flag or file fails
/// the start at once.
struct Prepared {
    auth: Auth,
    tls: Option<tonic::transport::ServerTlsConfig>,
}

fn prepare(config: &Config) -> Result<Prepared, Error> {
    config.check()?;
    Ok(Prepared {
        auth: Auth::new(config.auth_token.clone(), config.tokens_file.as_deref())?,
        tls: config.tls.as_ref().map(transport::tls_config).transpose()?,
    })
}

/// How long the steps of a stop may take together when something (the database)
/// hangs:
/// the process still exits, and what was not written is reclaimed at the next
/// start (SQLite) or when its lease expires (PostgreSQL).
const STOP_STEP: Duration = Duration::from_secs(5);

async fn serve(
    config: Config,
    Prepared { auth, tls }: Prepared,
    store: Arc<dyn Store>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let remote = open_store(&config, &store).await?;
    let node_name = config.node_name.clone().unwrap_or_else(|| {
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        format!("{}:{port}", crate::config::host_name())
    });
    // Tasks the node cannot live without report here if they end before the
    // shutdown asked them to.
    let (deaths, mut died) = tokio::sync::mpsc::channel::<(&'static str, String)>(4);
    let root = CancellationToken::new();
    let (core, committer_task) = start_core(&config, store, &node_name, remote);
    let committer = core.committer.clone();
    let committer_task = supervise("the committer", committer_task, &deaths, &root);
    let sessions = TaskTracker::new();
    let (health, health_service) = tonic_health::server::health_reporter();
    drain::set_health(&health, ServingStatus::Serving).await;
    let drainer = Arc::new(Drainer::new(core.clone(), health.clone()));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(spool_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    if let Some(addr) = config.ui_listen {
        start_ui(addr, &core, &drainer, &auth, &root).await?;
    }
    if crate::metrics::enabled() {
        tokio::spawn(observe(core.clone(), root.clone()));
    }
    let background = Background::start(&config, &core, &deaths, &root);
    drop(deaths);
    drain_on(
        shutdown,
        drainer.clone(),
        config.drain_timeout,
        root.clone(),
    );
    log_serving(&config, &listener, tls.is_some());

    let (activity, worker, admin) = services(&core, &sessions, drainer, &root);
    let open_streams = Arc::new(tokio::sync::Semaphore::new(
        config.limits.max_open_streams_unauthenticated,
    ));
    let mut builder = transport::builder(&config.limits);
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    let serve = builder
        .add_service(transport::Guarded::bounded_method(
            health_service,
            "Watch",
            open_streams.clone(),
        ))
        .add_service(transport::Guarded::bounded(reflection, open_streams))
        .add_service(InterceptedService::new(
            transport::Guarded::new(activity),
            auth.clone(),
        ))
        .add_service(InterceptedService::new(
            transport::Guarded::new(worker),
            auth.clone(),
        ))
        .add_service(InterceptedService::new(
            transport::Guarded::new(admin),
            auth,
        ))
        .serve_with_incoming_shutdown(
            transport::Incoming::new(listener, &config.limits),
            root.clone().cancelled_owned(),
        );
    let mut death = None;
    let served = tokio::select! {
        served = serve => served,
        _ = async {
            root.cancelled().await;
            tokio::time::sleep(STOP_GRACE).await;
        } => {
            tracing::warn!("connections still open {STOP_GRACE:?} after shutdown; stopping anyway");
            Ok(())
        }
        Some((task, why)) = died.recv() => {
            // Never a zombie that accepts requests and does nothing: out of
            // rotation at once, then stop.
            tracing::error!(task, %why, "a background task died: the node goes NOT_SERVING and stops");
            drain::set_health(&health, ServingStatus::NotServing).await;
            death = Some(Error::TaskDied { task, why });
            Ok(())
        }
    };
    root.cancel();
    sessions.close();
    let stop_by = tokio::time::Instant::now() + STOP_STEP;
    bounded(stop_by, "closing sessions", sessions.wait()).await;
    background.stop(stop_by).await;
    bounded(stop_by, "committing what is queued", committer.stop()).await;
    drop(core);
    drop(committer);
    bounded(stop_by, "stopping the committer", committer_task).await;
    if let Some(death) = death {
        return Err(death);
    }
    served?;
    tracing::info!("stopped");
    Ok(())
}

/// The three Spool services over `core`, with their message limits. No request
/// larger than the limit is read, and no answer larger is sent (List pages are cut
/// far below it; Get and Wait answer one activity), but for the activity
/// service's: a SubmitBatch's answer echoes the activities it stored, each with
/// what the server set on it, so an answer may exceed the request it answers;
/// refused after the commit, it would report stored activities as not.
fn services(
    core: &Arc<Core>,
    sessions: &TaskTracker,
    drainer: Arc<Drainer>,
    root: &CancellationToken,
) -> (
    ActivityServiceServer<ActivityApi>,
    WorkerServiceServer<WorkerApi>,
    AdminServiceServer<AdminApi>,
) {
    let max_message = core.config.max_message_bytes();
    let activity = ActivityServiceServer::new(ActivityApi::new(core.clone(), root.clone()))
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message.saturating_mul(2));
    let worker =
        WorkerServiceServer::new(WorkerApi::new(core.clone(), sessions.clone(), root.clone()))
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
    let admin = AdminServiceServer::new(AdminApi::new(core.clone(), drainer))
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message);
    (activity, worker, admin)
}

/// Readies the store before anything is served: a dead process's RUNNING rows
/// reclaimed (one node), the priority aging stored when the flag sets it, and
/// other nodes listened to before anything commits, so no change they make from
/// now on goes unheard.
async fn open_store(
    config: &Config,
    store: &Arc<dyn Store>,
) -> Result<Option<tokio::sync::mpsc::Receiver<crate::store::Remote>>, Error> {
    if store.single_node() {
        reclaim(store).await?;
    }
    if let Some(aging) = config.priority_aging
        && store
            .set_priority_aging(Some(aging).filter(|d| !d.is_zero()))
            .await?
    {
        // Every node ranks by the stored setting: this one just changed it for all.
        tracing::info!(
            priority_aging = %spool_proto::duration::format(aging),
            "the priority aging changed; waiting rows are ranked again in the background"
        );
    }
    Ok(store.subscribe().await?)
}

/// The registry, the waiters and the committer, as the services share them.
fn start_core(
    config: &Config,
    store: Arc<dyn Store>,
    node_name: &str,
    remote: Option<tokio::sync::mpsc::Receiver<crate::store::Remote>>,
) -> (Arc<Core>, tokio::task::JoinHandle<()>) {
    let registry = Arc::new(
        Registry::new(node_name)
            .with_writers(store.writers())
            .in_turn(store.beside_min_rows() > 0),
    );
    let pending = Arc::new(Pending::with_limits(
        config.limits.max_waits_per_token,
        config.limits.max_waits,
    ));
    let (committer, committer_task) = Committer::spawn(
        store.clone(),
        registry.clone(),
        pending.clone(),
        committer::Options {
            lease: config.lease_timeout,
        },
        remote,
    );
    // Rows already due wait for the first worker of their type.
    registry.mark_all_due();
    let core = Arc::new(Core {
        store,
        committer,
        registry,
        pending,
        config: config.clone(),
    });
    (core, committer_task)
}

/// The dashboard on its own listener, calling the same services.
async fn start_ui(
    addr: std::net::SocketAddr,
    core: &Arc<Core>,
    drainer: &Arc<Drainer>,
    auth: &Auth,
    root: &CancellationToken,
) -> Result<(), Error> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::UiListen(addr, e))?;
    let ui = crate::ui::Ui::new(
        ActivityApi::new(core.clone(), root.clone()),
        AdminApi::new(core.clone(), drainer.clone()),
        auth.clone(),
        core.clone(),
    );
    tracing::info!(%addr, read_only = core.config.ui_read_only, "dashboard at http://{addr}/");
    let shutdown = root.clone();
    tokio::spawn(async move {
        if let Err(e) = crate::ui::serve(listener, ui, shutdown).await {
            tracing::error!(error = %e, "the dashboard stopped");
        }
    });
    Ok(())
}

/// The shutdown signal drains first, then stops everything.
fn drain_on(
    shutdown: impl Future<Output = ()> + Send + 'static,
    drainer: Arc<Drainer>,
    drain_timeout: Duration,
    root: CancellationToken,
) {
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown => {}
            _ = root.cancelled() => {}
        }
        tracing::info!("shutting down: draining first");
        drainer.drain_to_stop(drain_timeout).await;
        root.cancel();
    });
}

fn log_serving(config: &Config, listener: &TcpListener, tls: bool) {
    let address = listener
        .local_addr()
        .map_or_else(|e| format!("unknown ({e})"), |a| a.to_string());
    let auth_mode = match (&config.auth_token, &config.tokens_file) {
        (_, Some(file)) => format!("tokens from {}", file.display()),
        (Some(_), None) => "one token (--auth-token)".to_owned(),
        (None, None) => "none: anyone who can connect may call".to_owned(),
    };
    tracing::info!(
        %address,
        database = %crate::config::shown_database(&config.database),
        version = env!("CARGO_PKG_VERSION"),
        tls,
        auth = %auth_mode,
        "serving on {}://{address}",
        if tls { "https" } else { "http" }
    );
}

/// The background tasks beside the committer, stopped in order at the end.
struct Background {
    prune: tokio::task::JoinHandle<()>,
    rerank: tokio::task::JoinHandle<()>,
    sweeper: tokio::task::JoinHandle<()>,
}

impl Background {
    fn start(
        config: &Config,
        core: &Arc<Core>,
        deaths: &tokio::sync::mpsc::Sender<(&'static str, String)>,
        root: &CancellationToken,
    ) -> Self {
        let prune = supervise(
            "the pruner",
            tokio::spawn(prune_loop(
                core.store.clone(),
                core.committer.clone(),
                config.retention,
                root.clone(),
            )),
            deaths,
            root,
        );
        // Not supervised: it ends of itself once no pass is left (on a store of
        // one node), and a failed step is tried again.
        let rerank = tokio::spawn(rerank_loop(
            core.committer.clone(),
            core.store.single_node(),
            root.clone(),
        ));
        let sweeper = tokio::spawn(heartbeat::run(
            core.store.clone(),
            core.registry.clone(),
            core.committer.clone(),
            heartbeat::Options {
                heartbeat_interval: config.heartbeat_interval,
                lease: config.lease_timeout,
                tick: config.sweep_tick(),
            },
            root.clone(),
        ));
        let sweeper = supervise("the liveness sweep", sweeper, deaths, root);
        Self {
            prune,
            rerank,
            sweeper,
        }
    }

    async fn stop(self, stop_by: tokio::time::Instant) {
        bounded(stop_by, "stopping the pruner", self.prune).await;
        bounded(stop_by, "stopping the re-ranking", self.rerank).await;
        bounded(stop_by, "stopping the liveness sweep", self.sweeper).await;
    }
}

/// Watches a task the node cannot live without: if it ends (or panics) before the
/// shutdown began, its death is reported on `deaths`.
fn supervise(
    task: &'static str,
    handle: tokio::task::JoinHandle<()>,
    deaths: &tokio::sync::mpsc::Sender<(&'static str, String)>,
    root: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let deaths = deaths.clone();
    let root = root.clone();
    tokio::spawn(async move {
        let ended = handle.await;
        if root.is_cancelled() {
            return;
        }
        let why = match ended {
            Ok(()) => "it ended".to_owned(),
            Err(e) if e.is_panic() => "it panicked".to_owned(),
            Err(e) => e.to_string(),
        };
        let _ = deaths.send((task, why)).await;
    })
}

/// One step of a stop, done by `stop_by` or abandoned.
async fn bounded<F: Future>(stop_by: tokio::time::Instant, step: &str, work: F) {
    if tokio::time::timeout_at(stop_by, work).await.is_err() {
        tracing::error!(
            step,
            "the stop took longer than {STOP_STEP:?}; stopping anyway (what was not written is reclaimed later)"
        );
    }
}

/// Ends every attempt a previous process left RUNNING: with a single-node store
/// (SQLite), the process that ran them is gone, so they count as lost workers.
/// Nodes sharing a store reclaim only expired leases, in the liveness sweep.
/// Reads a page of rows at a time, without their payloads, so a crash with many
/// large rows running cannot make start-up run out of memory.
async fn reclaim(store: &Arc<dyn Store>) -> Result<(), Error> {
    const PAGE: u32 = 1_000;
    let mut after = 0;
    let mut count = 0;
    loop {
        let page = store.running(after, PAGE).await?;
        let now = store.now();
        let ops: Vec<Op> = page
            .rows
            .iter()
            .map(|row| {
                let attempt = Arc::new(Attempt::from_row(row));
                let transition = lifecycle::lost(
                    &attempt,
                    "the server stopped while the attempt ran".to_owned(),
                    now,
                );
                Op::finish(attempt, transition)
            })
            .collect();
        count += ops.len();
        if !ops.is_empty() {
            store.apply(ops.into(), now).await?;
        }
        match page.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    if count > 0 {
        tracing::info!(
            count,
            "reclaimed attempts left running by the previous process"
        );
    }
    Ok(())
}

/// How often the per-type gauges are read from the store.
const OBSERVE_EVERY: Duration = Duration::from_secs(5);

/// Keeps the per-type gauges (backlog, running, dead letters) and the worker slots
/// current while metrics are served. A failed read only skips a refresh.
async fn observe(core: Arc<crate::dispatch::Core>, shutdown: CancellationToken) {
    let mut types = std::collections::HashSet::new();
    let mut groups = std::collections::HashSet::new();
    let mut limited = std::collections::HashSet::new();
    let mut ticker = tokio::time::interval(OBSERVE_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let now = core.store.now();
        let counts = match core.store.type_counts(now).await {
            Ok(counts) => {
                crate::metrics::type_counts(&counts, &mut types);
                counts
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot count activities by type for metrics");
                Vec::new()
            }
        };
        match (
            core.store.rate_limits(None, now).await,
            core.store.concurrency_limits(None).await,
        ) {
            (Ok(rate), Ok(concurrency)) => {
                crate::metrics::limits(&rate, &concurrency, &counts, &mut limited)
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "cannot read the limits for metrics")
            }
        }
        crate::metrics::worker_slots(&core.registry.slots(), &mut groups);
    }
}

/// How long the pruner waits once it has caught up: a tenth of the retention,
/// between 1 s and a minute. Rows outlive the retention by at most that, and with
/// a short retention the deletions come in passes small against the minute
/// between autovacuum's visits: passes a minute apart drifted against those
/// visits, so that some visits came just before a pass and its dead rows waited
/// a minute more, and the queue table grew by two fifths after seven minutes of
/// steady churn (measured on PostgreSQL; docs/BENCHMARKS.md, "Current figures").
fn idle_prune_pause(retention: Duration) -> Duration {
    (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Deletes finished rows older than the retention period, a small batch at a time:
/// each batch rides in the committer's transaction, so it must cost dispatch
/// little (a few milliseconds), and short transactions let vacuum keep up.
/// Ranks the waiting rows again after a change of the priority aging, a few
/// thousand ids a step, each step a commit of its own: a backlog of millions is
/// ranked again without a statement that outlasts its timeout or holds the
/// writer. Until a row is reached it keeps the rank of the setting before, which
/// changes the order among waiting rows, never whether one is due. With other
/// nodes a pass may start (or be left by a node that stopped) at any time, so
/// the loop looks again now and then.
async fn rerank_loop(committer: Committer, single_node: bool, shutdown: CancellationToken) {
    const IDS: u32 = 2_000;
    const LOOK_AGAIN: Duration = Duration::from_secs(10);
    let mut ranked = 0u64;
    loop {
        let pause = match committer.commit(vec![Op::Rerank { ids: IDS }]).await {
            Ok(outcomes) => match outcomes.first() {
                Some(Outcome::Reranked(Some(step))) => {
                    ranked += step.rows;
                    if step.done {
                        tracing::info!(
                            waiting_rows = ranked,
                            "waiting rows ranked again by the priority aging"
                        );
                        ranked = 0;
                    }
                    // Yield between steps, so dispatch is never held up.
                    Duration::from_millis(10)
                }
                _ if single_node => return,
                _ => LOOK_AGAIN,
            },
            Err(e) => {
                tracing::warn!(error = %e, "ranking waiting rows again failed; retrying");
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

async fn prune_loop(
    store: Arc<dyn Store>,
    committer: Committer,
    retention: Duration,
    shutdown: CancellationToken,
) {
    const LIMIT: u32 = 500;
    let retention_ms = spool_proto::time::millis(retention);
    loop {
        let before = store.now().saturating_sub(retention_ms);
        let pruned = match committer
            .commit(vec![Op::Prune {
                before,
                limit: LIMIT,
            }])
            .await
        {
            Ok(outcomes) => match outcomes.first() {
                Some(Outcome::Pruned(n)) => *n,
                _ => 0,
            },
            Err(e) => {
                tracing::warn!(error = %e, "pruning failed");
                0
            }
        };
        // A full batch means more are due: go on at once (up to 50,000 rows a
        // second), yielding between batches so dispatch is never held up.
        let pause = if pruned >= u64::from(LIMIT) {
            Duration::from_millis(10)
        } else {
            idle_prune_pause(retention)
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
