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
    v1::{activity_service_server, admin_service_server, worker_service_server},
};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Mutex;
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{dispatch::Core, store::Op};

/// How long the release of leftovers may take to commit after the deadline.
const RELEASE_WITHIN: Duration = Duration::from_secs(2);

/// A deadline beyond any real drain, for timeouts too large for the clock.
const FAR: Duration = Duration::from_secs(365 * 86_400);

/// What a drain did with the attempts running when it began.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Ended by their worker's result (completed, retried, failed or snoozed),
    /// written before the deadline.
    pub completed: u32,
    /// Still running at the deadline, and written back to SCHEDULED, uncounted.
    pub released: u32,
    /// Left running for their workers to resume on another node that stays.
    pub handed_over: u32,
    /// Ended otherwise (a timeout, a lost worker, a cancel, ended by another
    /// node), or a release that could not be written (reclaimed later).
    pub ended_otherwise: u32,
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
        self.core.store.set_draining(false).await;
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
        let deadline_ms = self.core.store.now().saturating_add(time::millis(timeout));

        // Phase 1. Stop dispatch first, then let any claim already in the
        // committer's current batch land (the empty commit is a barrier), so the
        // count below includes every attempt a worker may be running.
        set_health(&self.health, ServingStatus::NotServing).await;
        self.core.registry.pause();
        // The other nodes learn this one takes no session over: one that stops
        // hands its sessions only to a node that stays.
        let _ = tokio::time::timeout_at(deadline, self.core.store.set_draining(true)).await;
        // Every commit of the drain has a deadline: with the database unreachable
        // the drain still ends, and what it could not write is reclaimed later.
        self.barrier(deadline).await;
        self.core.registry.begin_drain(Some(deadline_ms));
        let running = self.core.registry.unsettled_count();
        let results_before = self.core.registry.results_committed();
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

        // Phase 3. A node that stops, with others that stay on its database, hands
        // resumable sessions over: their workers resume on another node with what
        // they run. Otherwise (alone, or every other node draining or stopping
        // too) it releases them, uncounted, as a single node does: left running,
        // they would be reclaimed as lost, counted, when the nodes start again
        // before their workers are back.
        let hand_over = self.stopping.load(Ordering::SeqCst) && self.core.store.others_staying();
        let ended = self.core.registry.end_all(
            "the server is draining; the activity will run again",
            hand_over,
        );
        let completed = self
            .core
            .registry
            .results_committed()
            .saturating_sub(results_before);
        let mut released = 0;
        if !ended.release.is_empty() {
            let now = self.core.store.now();
            let ops = ended
                .release
                .into_iter()
                .map(|attempt| Op::Finish {
                    transition: crate::lifecycle::release(&attempt, now),
                    attempt,
                    lease_expired_by: None,
                })
                .collect();
            match tokio::time::timeout(RELEASE_WITHIN, self.core.committer.commit(ops)).await {
                Ok(Ok(outcomes)) => {
                    released = outcomes
                        .iter()
                        .filter(|o| matches!(o, crate::store::Outcome::Finished { accepted: true }))
                        .count();
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "drain: releasing leftovers failed; they are reclaimed at the next start")
                }
                Err(_) => tracing::error!(
                    "drain: releasing leftovers did not commit in time; they are reclaimed at the next start"
                ),
            }
        }
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        // Results of attempts that began after the count (a resumed session's
        // resend) do not make the report claim more than ran.
        let completed = usize::try_from(completed)
            .unwrap_or(usize::MAX)
            .min(running);
        let released = released.min(running - completed);
        let handed_over = ended.handed_over.min(running - completed - released);
        let report = Report {
            completed: count(completed),
            released: count(released),
            handed_over: count(handed_over),
            ended_otherwise: count(running - completed - released - handed_over),
        };
        tracing::info!(
            completed = report.completed,
            released = report.released,
            handed_over = report.handed_over,
            ended_otherwise = report.ended_otherwise,
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
    use tokio::sync::mpsc;

    use super::*;
    use crate::{
        Config,
        dispatch::{
            Committer, Pending, Registry, committer,
            outbound::{Outgoing, ToWorker},
            registry::{Answer, Registration},
        },
        store::{self, ActivityStatus, Key, Payload},
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
        let (dir, url) = store::tests::sqlite_url_for_tests();
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
        let (worker_id, _tx, mut outbound, _evict) =
            registry.register(Registration::for_tests(1), 0);
        let new = store::new_activity_for_tests("a", "t");
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
            got_task = matches!(out.message, ToWorker::Task(_));
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
            ToWorker::Drain { .. } => "drain",
            ToWorker::Cancel(_) => "cancel",
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
                released: 1,
                ..Report::default()
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
        // The worker answers once told of the drain, and its result is written.
        let committer = node.core.committer.clone();
        let answer = tokio::spawn(async move {
            let told = kinds_until_drain(&mut outbound).await;
            let answered = registry.answer(&worker_id, "wf", "a", 1);
            if let Answer::Held(attempt, _) = &answered {
                committer
                    .commit(vec![store::Op::Finish {
                        attempt: attempt.clone(),
                        transition: store::Transition::Complete {
                            output: Payload::default(),
                        },
                        lease_expired_by: None,
                    }])
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            (told, answered, outbound)
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
                ..Report::default()
            }
        );
        assert!(kinds(&mut outbound).is_empty(), "nothing after the drain");
    }

    /// An attempt ended during the drain other than by its result (here: ended by
    /// another node, as a lease renewal finds) is not reported completed.
    #[tokio::test]
    async fn an_attempt_ended_otherwise_is_not_reported_completed() {
        let node = node_running_one().await;
        let registry = node.core.registry.clone();
        let mut outbound = node.outbound;
        let store = node.core.store.clone();
        let ended = tokio::spawn(async move {
            kinds_until_drain(&mut outbound).await;
            let id = store
                .get(&key())
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("gone"))
                .id;
            registry.end_attempts(&[(id, 1)], "ended elsewhere");
            outbound
        });
        let report = node.drainer.drain(Duration::from_secs(30)).await;
        let _outbound = ended.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            report,
            Report {
                ended_otherwise: 1,
                ..Report::default()
            }
        );
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
