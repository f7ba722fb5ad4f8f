//! Wiring and lifecycle of one server process: open the store, reclaim what a
//! previous process left RUNNING, start the committer, serve gRPC until the
//! shutdown future completes, then stop in order.
//!
//! Shutdown order, and why:
//! 1. health goes NOT_SERVING and the root token is cancelled: new sessions are
//!    refused, sessions release the attempts they hold, parked `Wait`s answer;
//! 2. the gRPC server stops once those streams and calls have ended;
//! 3. session clean-ups are awaited (their releases are queued to the committer);
//! 4. the committer commits everything queued, then stops; the store closes last.

use std::{future::Future, sync::Arc, time::Duration};

use spool_proto::{
    time::now_millis,
    v1::{
        activity_service_server::ActivityServiceServer, admin_service_server::AdminServiceServer,
        worker_service_server::WorkerServiceServer,
    },
};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tonic::service::interceptor::InterceptedService;
use tonic_health::ServingStatus;

use crate::{
    api::{Core, activity::ActivityApi, admin::AdminApi, auth::Auth, worker::WorkerApi},
    config::Config,
    dispatch::{Committer, Pending, Registry, committer},
    lifecycle::{self, Attempt},
    store::{self, ErrorKind, Op, Outcome, Store},
};

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
}

/// Serves on `listener` until `shutdown` completes, then stops cleanly.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let store = store::open(&config.database).await?;
    reclaim(&store).await?;
    let next_due = store.next_due(now_millis()).await?;

    let registry = Arc::new(Registry::default());
    let pending = Arc::new(Pending::default());
    let (committer, committer_task) = Committer::spawn(
        store.clone(),
        registry.clone(),
        pending.clone(),
        committer::Options {
            lease: config.lease_timeout,
        },
        next_due,
    );
    // Rows already due wait for the first worker of their type.
    registry.mark_all_due();

    let root = CancellationToken::new();
    let sessions = TaskTracker::new();
    let core = Arc::new(Core {
        store,
        committer: committer.clone(),
        registry,
        pending,
        config: config.clone(),
    });

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ActivityServiceServer<ActivityApi>>()
        .await;
    health.set_serving::<WorkerServiceServer<WorkerApi>>().await;
    health.set_serving::<AdminServiceServer<AdminApi>>().await;
    health.set_service_status("", ServingStatus::Serving).await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(spool_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;

    let auth = Auth::new(config.auth_token.clone());
    let max_message = config.max_message_bytes();
    let activity = ActivityServiceServer::new(ActivityApi::new(core.clone(), root.clone()))
        .max_decoding_message_size(max_message);
    let worker =
        WorkerServiceServer::new(WorkerApi::new(core.clone(), sessions.clone(), root.clone()))
            .max_decoding_message_size(max_message);
    let admin =
        AdminServiceServer::new(AdminApi::new(core.clone())).max_decoding_message_size(max_message);

    let prune = tokio::spawn(prune_loop(
        committer.clone(),
        config.retention,
        root.clone(),
    ));
    {
        let root = root.clone();
        let health = health.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown => {}
                _ = root.cancelled() => {}
            }
            tracing::info!("shutting down");
            health
                .set_not_serving::<ActivityServiceServer<ActivityApi>>()
                .await;
            health
                .set_not_serving::<WorkerServiceServer<WorkerApi>>()
                .await;
            health
                .set_not_serving::<AdminServiceServer<AdminApi>>()
                .await;
            health
                .set_service_status("", ServingStatus::NotServing)
                .await;
            root.cancel();
        });
    }

    tracing::info!(address = ?listener.local_addr().ok(), database = %config.database, "serving");
    let served = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(InterceptedService::new(activity, auth.clone()))
        .add_service(InterceptedService::new(worker, auth.clone()))
        .add_service(InterceptedService::new(admin, auth))
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(listener),
            root.clone().cancelled_owned(),
        )
        .await;
    root.cancel();
    sessions.close();
    sessions.wait().await;
    let _ = prune.await;
    committer.stop().await;
    drop(core);
    drop(committer);
    let _ = committer_task.await;
    served?;
    tracing::info!("stopped");
    Ok(())
}

/// Ends every attempt a previous process left RUNNING: with one SQLite node, the
/// process that ran them is gone, so they count as lost workers.
async fn reclaim(store: &Arc<dyn Store>) -> Result<(), Error> {
    let running = store.running().await?;
    if running.is_empty() {
        return Ok(());
    }
    let now = now_millis();
    let ops: Vec<Op> = running
        .iter()
        .map(|row| {
            let attempt = Arc::new(Attempt::from_row(row));
            let error = lifecycle::server_error(
                ErrorKind::WorkerLost,
                "WorkerLost",
                "the server stopped while the attempt ran".to_owned(),
            );
            let transition = lifecycle::on_failure(&attempt, error, now, rand::random());
            Op::Finish {
                attempt,
                transition,
            }
        })
        .collect();
    store.apply(&ops, now).await?;
    tracing::info!(
        count = ops.len(),
        "reclaimed attempts left running by the previous process"
    );
    Ok(())
}

/// Deletes finished rows older than the retention period, a bounded batch at a time.
async fn prune_loop(committer: Committer, retention: Duration, shutdown: CancellationToken) {
    const LIMIT: u32 = 5_000;
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    loop {
        let before = now_millis().saturating_sub(retention_ms);
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
        let pause = if pruned >= u64::from(LIMIT) {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(60)
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
