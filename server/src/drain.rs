//! The drain: getting a node out of the way of a deploy without losing, failing or
//! double-running anything.
//!
//! Phases, in order:
//! 1. begin (idempotent): health goes NOT_SERVING, new worker sessions are refused
//!    (UNAVAILABLE), no claim is planned any more, and every worker is sent
//!    `Drain{deadline}`. Submits are still accepted and stored.
//! 2. wait: attempts already running may finish until the deadline; their results
//!    are recorded as usual.
//! 3. release: what still runs at the deadline is ended by the server (its worker
//!    is told to stop) and goes back to SCHEDULED for immediate redelivery elsewhere,
//!    not counted against `max_attempts` and never marked failed.
//!
//! After a drain the node stays up, NOT_SERVING; a shutdown then closes the worker
//! streams and stops. Each commit of a drain has a deadline, so a drain ends even
//! while the database is unreachable.

use std::{sync::Arc, time::Duration};

use spool_proto::{
    time,
    v1::{
        activity_service_server::ActivityServiceServer, admin_service_server::AdminServiceServer,
        server_message, worker_service_server::WorkerServiceServer,
    },
};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{
    api::{Core, activity::ActivityApi, admin::AdminApi, worker::WorkerApi},
    store::{Op, Transition},
};

/// How long the release of leftovers may take to commit after the deadline.
const RELEASE_WITHIN: Duration = Duration::from_secs(2);

/// A deadline beyond any real drain, for timeouts too large for the clock.
const FAR: Duration = Duration::from_secs(365 * 86_400);

/// What a drain did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Attempts running when the drain began that finished before its deadline.
    pub completed: u32,
    /// Attempts still running at the deadline, released back to SCHEDULED.
    pub released: u32,
}

pub struct Drainer {
    core: Arc<Core>,
    health: HealthReporter,
    /// Cancelled when the drain begins; the worker API refuses sessions from then on.
    draining: CancellationToken,
    /// One drain at a time; a second waits for the first and then finds nothing left.
    running: Mutex<()>,
}

impl Drainer {
    pub fn new(core: Arc<Core>, health: HealthReporter, draining: CancellationToken) -> Self {
        Self {
            core,
            health,
            draining,
            running: Mutex::new(()),
        }
    }

    pub async fn drain(&self, timeout: Duration) -> Report {
        let now = tokio::time::Instant::now();
        let deadline = now.checked_add(timeout).unwrap_or(now + FAR);
        // One drain at a time, but never past this one's deadline: a shutdown must
        // not wait behind an operator's long drain (the phases are idempotent).
        let _one = tokio::time::timeout_at(deadline, self.running.lock())
            .await
            .ok();
        let deadline_ms = self
            .core
            .store
            .now()
            .saturating_add(i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX));

        // Phase 1. Stop dispatch first, then let any claim already in the
        // committer's current batch land (the empty commit is a barrier), so the
        // count below includes every attempt a worker may be running.
        self.draining.cancel();
        set_health(&self.health, ServingStatus::NotServing).await;
        self.core.registry.pause();
        // Every commit of the drain has a deadline: with the database unreachable
        // the drain still ends, and what it could not write is reclaimed later.
        match tokio::time::timeout_at(deadline, self.core.committer.commit(Vec::new())).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "drain: committer unavailable"),
            Err(_) => tracing::warn!("drain: the committer did not answer before the deadline"),
        }
        self.core
            .registry
            .begin_drain(server_message::Message::Drain(spool_proto::v1::Drain {
                deadline: Some(time::to_proto(deadline_ms)),
            }));
        let running = self.core.registry.running_count();
        tracing::info!(running, ?timeout, "draining");

        // Phase 2. Each answer or disconnect wakes us to count again.
        loop {
            let answered = self.core.registry.answered();
            if self.core.registry.running_count() == 0 {
                break;
            }
            tokio::select! {
                _ = answered => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }

        // Phase 3.
        let leftovers = self
            .core
            .registry
            .end_all("the server is draining; the activity will run again");
        let released = leftovers.len();
        if !leftovers.is_empty() {
            let ops = leftovers
                .into_iter()
                .map(|attempt| Op::Finish {
                    attempt,
                    transition: Transition::Release,
                    lease_expired_by: None,
                })
                .collect();
            match tokio::time::timeout(RELEASE_WITHIN, self.core.committer.commit(ops)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "drain: releasing leftovers failed; they are reclaimed at the next start")
                }
                Err(_) => tracing::error!(
                    "drain: releasing leftovers did not commit in time; they are reclaimed at the next start"
                ),
            }
        }
        let report = Report {
            completed: u32::try_from(running.saturating_sub(released)).unwrap_or(u32::MAX),
            released: u32::try_from(released).unwrap_or(u32::MAX),
        };
        tracing::info!(
            completed = report.completed,
            released = report.released,
            "drained"
        );
        report
    }
}

pub async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health
        .set_service_status(
            <ActivityServiceServer<ActivityApi> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
    health
        .set_service_status(
            <WorkerServiceServer<WorkerApi> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
    health
        .set_service_status(
            <AdminServiceServer<AdminApi> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
    health.set_service_status("", status).await;
}
