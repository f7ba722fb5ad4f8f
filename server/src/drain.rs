//! The drain: getting a node out of the way of a deploy without losing, failing or
//! double-running anything.
//!
//! Phases, in order:
//! 1. begin (idempotent): health goes NOT_SERVING, new worker sessions are refused
//!    (UNAVAILABLE), no claim is planned any more, and every worker is sent
//!    `Drain{deadline}`. Submits are still accepted and stored.
//! 2. wait: attempts already running may finish until the deadline; their results
//!    are recorded as usual, and the drain waits for those commits too, so what it
//!    reports completed is stored.
//! 3. release: what still runs at the deadline is ended by the server (its worker
//!    is told to stop) and goes back to SCHEDULED for immediate redelivery elsewhere,
//!    not counted against `max_attempts` and never marked failed.
//!
//! After a drain the node stays up, NOT_SERVING, until a resume (which undoes phase
//! 1: SERVING, sessions taken, claims planned) or a shutdown, which closes the
//! worker streams and stops. A node shutting down cannot be resumed. Each commit of
//! a drain has a deadline, so a drain ends even while the database is unreachable.

use std::{sync::Arc, time::Duration};

use spool_proto::{
    time,
    v1::{activity_service_server, admin_service_server, server_message, worker_service_server},
};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Mutex;
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{dispatch::Core, store::Op};

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
    /// Set for good when the drain is the start of a shutdown: no resume then.
    stopping: AtomicBool,
    /// One drain (or resume) at a time; a second drain waits for the first and then
    /// finds nothing left.
    running: Mutex<()>,
}

/// Why a resume was refused.
#[derive(Debug, thiserror::Error)]
#[error("the node is shutting down; start it again instead")]
pub struct ShuttingDown;

impl Drainer {
    pub fn new(core: Arc<Core>, health: HealthReporter) -> Self {
        Self {
            core,
            health,
            stopping: AtomicBool::new(false),
            running: Mutex::new(()),
        }
    }

    /// The drain that starts a shutdown: as [`Drainer::drain`], and the node can
    /// no longer be resumed.
    pub async fn drain_to_stop(&self, timeout: Duration) -> Report {
        self.stopping.store(true, Ordering::SeqCst);
        self.drain(timeout).await
    }

    /// Ends a drain (after one in progress finishes): SERVING, new worker sessions
    /// taken, claims planned again. `Ok(false)` when the node was not draining.
    pub async fn resume(&self) -> Result<bool, ShuttingDown> {
        let _one = self.running.lock().await;
        if self.stopping.load(Ordering::SeqCst) {
            return Err(ShuttingDown);
        }
        if !self.core.registry.is_draining() {
            return Ok(false);
        }
        self.core.registry.resume();
        set_health(&self.health, ServingStatus::Serving).await;
        tracing::info!("resumed: dispatching again");
        Ok(true)
    }

    /// Waits until everything queued for the committer before now is written (an
    /// empty commit), or the drain's deadline.
    async fn barrier(&self, deadline: tokio::time::Instant) {
        match tokio::time::timeout_at(deadline, self.core.committer.commit(Vec::new())).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "drain: committer unavailable"),
            Err(_) => tracing::warn!("drain: the committer did not answer before the deadline"),
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
        set_health(&self.health, ServingStatus::NotServing).await;
        self.core.registry.pause();
        // Every commit of the drain has a deadline: with the database unreachable
        // the drain still ends, and what it could not write is reclaimed later.
        self.barrier(deadline).await;
        self.core
            .registry
            .begin_drain(server_message::Message::Drain(spool_proto::v1::Drain {
                deadline: Some(time::to_proto(deadline_ms)),
            }));
        let running = self.core.registry.running_count();
        tracing::info!(running, ?timeout, "draining");
        // Rows claimed ahead went back with `begin_drain`; this commit writes them
        // (SCHEDULED again, uncounted) before the drain goes on.
        self.barrier(deadline).await;

        // Phase 2. Each answer or disconnect wakes us to count again.
        loop {
            let answered = self.core.registry.answered();
            if self.core.registry.unsettled_count() == 0 {
                break;
            }
            tokio::select! {
                _ = answered => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }

        // Phase 3. A node that stops, with others on its database, hands resumable
        // sessions over: their workers resume on another node with what they run.
        // Alone (none heard from lately), it releases them, uncounted, as a single
        // node does: left running, they would be reclaimed as lost, counted, when
        // it starts again before their workers are back.
        let hand_over = self.stopping.load(Ordering::SeqCst) && self.core.store.others_present();
        let leftovers = self.core.registry.end_all(
            "the server is draining; the activity will run again",
            hand_over,
        );
        let released = leftovers.len();
        if !leftovers.is_empty() {
            let now = self.core.store.now();
            let ops = leftovers
                .into_iter()
                .map(|attempt| Op::Finish {
                    transition: crate::lifecycle::release(&attempt, now),
                    attempt,
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
    for service in [
        activity_service_server::SERVICE_NAME,
        worker_service_server::SERVICE_NAME,
        admin_service_server::SERVICE_NAME,
        "",
    ] {
        health.set_service_status(service, status).await;
    }
}

#[cfg(test)]
mod tests {
    use spool_proto::v1::{self, ServerMessage};
    use tokio::sync::mpsc;

    use super::*;
    use crate::{
        Config,
        dispatch::{
            Committer, Pending, Registry, committer,
            registry::{Answer, Outgoing, Registration},
        },
        store::{self, ActivityStatus, Key, NewActivity, Payload, RetrySpec, Timeouts},
    };

    struct Node {
        core: Arc<Core>,
        drainer: Drainer,
        outbound: mpsc::Receiver<Outgoing>,
        worker_id: Arc<str>,
        _dir: tempfile::TempDir,
    }

    /// A node with one worker (one slot) running attempt 1 of activity "a".
    async fn node_running_one() -> Node {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let url = format!("sqlite://{}", dir.path().join("spool.db").display());
        let store = store::open(&url).await.unwrap_or_else(|e| panic!("{e}"));
        let registry = Arc::new(Registry::default());
        let pending = Arc::new(Pending::default());
        let (committer, _task) = Committer::spawn(
            store.clone(),
            registry.clone(),
            pending.clone(),
            committer::Options {
                lease: Duration::from_secs(30),
            },
            None,
        );
        let (worker_id, _tx, mut outbound, _evict) = registry.register(
            Registration {
                namespace: "default".into(),
                identity: "test".into(),
                activity_types: vec!["t".into()],
                max_concurrency: 1,
                ticket: None,
            },
            0,
            |id| {
                server_message::Message::Welcome(v1::Welcome {
                    worker_id: id.to_owned(),
                    ..Default::default()
                })
            },
        );
        let new = NewActivity {
            key: key(),
            activity_type: "t".into(),
            input: Payload::default(),
            next_at: 0,
            retry: RetrySpec {
                max_attempts: 1,
                initial_interval_ms: 1_000,
                backoff_coefficient: 2.0,
                max_interval_ms: 1_000,
                non_retryable: Vec::new(),
            },
            timeouts: Timeouts::default(),
            priority: 0,
            headers: Default::default(),
            concurrency_key: None,
            fairness: None,
        };
        committer
            .commit(vec![store::Op::Submit(vec![new])])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // Welcome, then the task.
        let mut got_task = false;
        while !got_task {
            let out = tokio::time::timeout(Duration::from_secs(10), outbound.recv())
                .await
                .unwrap_or_else(|_| panic!("no task"))
                .unwrap_or_else(|| panic!("closed"));
            got_task = matches!(
                out.message,
                Ok(ServerMessage {
                    message: Some(server_message::Message::Task(_))
                })
            );
        }
        let (health, _) = tonic_health::server::health_reporter();
        let core = Arc::new(Core {
            store,
            committer,
            registry,
            pending,
            config: Config::new(url),
        });
        Node {
            drainer: Drainer::new(core.clone(), health),
            core,
            outbound,
            worker_id,
            _dir: dir,
        }
    }

    fn key() -> Key {
        Key {
            namespace: "default".into(),
            workflow_id: "wf".into(),
            activity_id: "a".into(),
        }
    }

    /// What the worker is sent, up to and with the Drain.
    async fn kinds_until_drain(rx: &mut mpsc::Receiver<Outgoing>) -> Vec<&'static str> {
        let mut seen = Vec::new();
        while seen.last() != Some(&"drain") {
            let Some(out) = rx.recv().await else { break };
            seen.push(kind(out));
        }
        seen
    }

    fn kind(out: Outgoing) -> &'static str {
        match out.message {
            Ok(ServerMessage {
                message: Some(server_message::Message::Drain(_)),
            }) => "drain",
            Ok(ServerMessage {
                message: Some(server_message::Message::Cancel(_)),
            }) => "cancel",
            _ => "other",
        }
    }

    fn kinds(rx: &mut mpsc::Receiver<Outgoing>) -> Vec<&'static str> {
        let mut kinds = Vec::new();
        while let Ok(out) = rx.try_recv() {
            kinds.push(kind(out));
        }
        kinds
    }

    /// Past the deadline, what still runs is told to stop and released: SCHEDULED
    /// again, uncounted, never failed; nothing more is dispatched.
    #[tokio::test]
    async fn what_outlives_the_deadline_is_released_uncounted() {
        let mut node = node_running_one().await;
        let report = node.drainer.drain(Duration::from_millis(200)).await;
        assert_eq!(
            report,
            Report {
                completed: 0,
                released: 1
            }
        );
        assert_eq!(kinds(&mut node.outbound), ["drain", "cancel"]);
        let row = node
            .core
            .store
            .get(&key())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("gone"));
        assert_eq!(
            row.status,
            ActivityStatus::Scheduled,
            "released, not failed"
        );
        assert_eq!((row.attempt, row.uncounted), (1, 1), "and not counted");
        node.core.registry.mark_all_due();
        assert!(
            node.core.registry.plan_claims(0, &[]).is_empty(),
            "a drained node dispatches nothing"
        );
    }

    /// An attempt answered before the deadline counts as completed, and the drain
    /// returns as soon as nothing runs.
    #[tokio::test]
    async fn an_answer_before_the_deadline_ends_the_drain_early() {
        let node = node_running_one().await;
        let registry = node.core.registry.clone();
        let worker_id = node.worker_id.clone();
        let mut outbound = node.outbound;
        // The worker answers once told of the drain.
        let answer = tokio::spawn(async move {
            let told = kinds_until_drain(&mut outbound).await;
            (told, registry.answer(&worker_id, "wf", "a", 1), outbound)
        });
        let started = tokio::time::Instant::now();
        let report = node.drainer.drain(Duration::from_secs(30)).await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not the deadline"
        );
        let (told, answered, mut outbound) = answer.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(told, ["drain"]);
        assert!(matches!(answered, Answer::Held(..)));
        assert_eq!(
            report,
            Report {
                completed: 1,
                released: 0
            }
        );
        assert!(kinds(&mut outbound).is_empty(), "nothing after the drain");
    }

    /// A resume undoes a drain's stop (claims planned again, a newly registered
    /// worker not told to drain); the drain that starts a shutdown cannot be
    /// resumed.
    #[tokio::test]
    async fn a_resume_ends_a_drain_but_not_a_shutdown() {
        let node = node_running_one().await;
        assert!(
            matches!(node.drainer.resume().await, Ok(false)),
            "nothing to resume"
        );
        node.drainer.drain(Duration::from_millis(50)).await;
        assert!(node.core.registry.is_draining());
        assert!(matches!(node.drainer.resume().await, Ok(true)));
        assert!(!node.core.registry.is_draining());
        // The worker answers the attempt the drain released, freeing its slot.
        node.core.registry.answer(&node.worker_id, "wf", "a", 1);
        node.core.registry.mark_all_due();
        assert!(
            !node.core.registry.plan_claims(0, &[]).is_empty(),
            "claims are planned again"
        );
        node.drainer.drain_to_stop(Duration::from_millis(50)).await;
        assert!(node.drainer.resume().await.is_err(), "not while stopping");
        assert!(node.core.registry.is_draining());
    }
}
