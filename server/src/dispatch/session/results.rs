//! A session's results on their way to the store: committed in the order read,
//! acked after their commit, retried while the store fails, and, for a result
//! whose attempt ended otherwise, checked against the attempt's history so a
//! result sent again after a resume is acked as the one it was.

use super::*;

/// How many times in all a result is committed while the store's failure is not
/// one that may pass (see `store::Class`).
const RESULT_TRIES_UNLESS_TRANSIENT: u32 = 3;

/// The pauses between tries of a write or read the store failed (a result's
/// commit, a resent task's read): from the first, doubling up to the last.
const RESULT_RETRY_FIRST: Duration = Duration::from_millis(100);
const RESULT_RETRY_MAX: Duration = Duration::from_secs(2);

/// A result whose commit failed, and what its ack needs.
pub(super) struct Unsettled {
    tx: mpsc::Sender<Outgoing>,
    ack: Ack,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Held until the result settles: a drain waits for it.
    _committing: Option<crate::dispatch::registry::Committing>,
}

/// A result the reader has taken from the worker, on its way to the committer.
pub(super) enum Forward {
    /// The result decides an attempt the worker held: commit these ops, then ack.
    Commit {
        ops: Vec<Op>,
        ack: Ack,
        /// Keeps the result unsettled (for a drain) until the commit's reply.
        committing: crate::dispatch::registry::Committing,
    },
    /// The result answers nothing the worker holds: ack it, not accepted.
    Refuse(Ack),
    /// The result answers an attempt that ended while the worker was away, which it
    /// said it still had when it resumed: perhaps this result, sent again because
    /// its ack was lost with the old stream. The store tells (see
    /// [`ended_by_own_result`]).
    Recheck(Ack),
    /// The worker said Goodbye: once every claim planned for it has landed, tell it
    /// that nothing more comes (Drain).
    Goodbye,
}

/// Sends a resumed worker a task it lacks, read again from the store (the
/// registry keeps no payloads). A read that fails is tried again while the
/// session lasts: the attempt holds a slot and its lease is renewed, so given up
/// it would hold both until the session ends.
pub async fn resend_task(
    core: &Core,
    tx: &mpsc::Sender<Outgoing>,
    worker_id: &str,
    attempt: &Attempt,
) {
    let mut pause = RESULT_RETRY_FIRST;
    loop {
        match core.store.get(&attempt.key).await {
            Ok(Some(row))
                if row.attempt == attempt.attempt
                    && row.status == crate::store::ActivityStatus::Running =>
            {
                // Through the registry: the server may have stopped the attempt
                // (a cancel, a timeout, a drain's deadline) while the row was read.
                let task = crate::dispatch::outbound::Task::new(row, attempt);
                core.registry.send_lacked(worker_id, tx, attempt, task);
                return;
            }
            // Ended meanwhile: a cancel sent for it would go unanswered, since
            // the worker never had it.
            Ok(_) => {
                core.registry.forget_unsent(worker_id, attempt);
                return;
            }
            Err(e) if !tx.is_closed() => {
                tracing::warn!(error = %e, activity_id = %attempt.key.activity_id, retry_in = %duration::format(pause), "cannot read a task to send again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RESULT_RETRY_MAX);
            }
            // The session is over; what it held is ended with it.
            Err(_) => return,
        }
    }
}

/// The transition a worker's result asks for.
pub(super) fn decide(attempt: &Attempt, reported: Reported, now: UnixMillis) -> Transition {
    match reported {
        Reported::Output(output) => Transition::Complete { output },
        Reported::Error(error) => lifecycle::on_failure(attempt, error, now, rand::random()),
        Reported::Fail(error) => Transition::Fail { error },
        Reported::Snooze { delay_ms } => Transition::Snooze {
            next_at: now.saturating_add(delay_ms),
        },
    }
}

/// Whether a result's commit ended its attempt (its `Finish` comes last).
pub(super) fn finished(outcomes: &[Outcome]) -> bool {
    matches!(outcomes.last(), Some(Outcome::Finished { accepted: true }))
}

pub(super) fn send_ack(
    tx: &mpsc::Sender<Outgoing>,
    mut ack: Ack,
    accepted: bool,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    // Without a permit the session is over and the window full: the ack has no
    // room, and nobody is reading it.
    let Some(permit) = permit else { return };
    ack.accepted = accepted;
    // Room is guaranteed by the ack window; closed means the worker is gone.
    let _ = tx.try_send(Outgoing {
        message: ToWorker::Ack(ack),
        _permit: Some(permit),
    });
}

/// Commits a result again after the store failed it, until it is written or
/// refused by its fence (the attempt ended otherwise meanwhile, e.g. its lease ran
/// out while the store was down). Refusing it for the store's failure would tell
/// the worker its attempt had ended and lose the outcome. The result's ops are
/// fenced by attempt, so a commit that failed after writing cannot write twice;
/// a refusal is checked as the first commit's is ([`recheck`]), since the commit
/// reported failed may have written this very result (its reply lost with the
/// connection).
/// A failure that is not transient is tried [`RESULT_TRIES_UNLESS_TRANSIENT`]
/// times in all: then no ack is sent, the worker keeps the result for its next
/// session, and the attempt, whose lease no longer renews, is reclaimed as lost.
pub(super) async fn retry_result(
    core: Arc<Core>,
    ops: Vec<Op>,
    (worker_id, namespace, over): (Arc<str>, Arc<str>, CancellationToken),
    unsettled: Unsettled,
    mut why: Arc<crate::store::Error>,
) {
    let mut pause = RESULT_RETRY_FIRST;
    let mut tries = 1;
    loop {
        if why.class() != crate::store::Class::Transient && tries >= RESULT_TRIES_UNLESS_TRANSIENT {
            tracing::error!(workflow_id = %unsettled.ack.workflow_id, activity_id = %unsettled.ack.activity_id, attempt = unsettled.ack.attempt, "result not recorded, given up: {why}; the worker keeps it, and the attempt is reclaimed when its lease lapses");
            return;
        }
        tries += 1;
        tracing::warn!(workflow_id = %unsettled.ack.workflow_id, activity_id = %unsettled.ack.activity_id, attempt = unsettled.ack.attempt, retry_in = %duration::format(pause), "result not recorded: {why}");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RESULT_RETRY_MAX);
        match core.committer.commit(ops.clone()).await {
            Ok(outcomes) if finished(&outcomes) => {
                let Unsettled {
                    tx, ack, permit, ..
                } = unsettled;
                send_ack(&tx, ack, true, permit);
                return;
            }
            Ok(_) => {
                recheck(core, (worker_id, namespace), unsettled, over).await;
                return;
            }
            Err(CommitError::Store { why: again, .. }) => why = again,
            Err(CommitError::Closed) => return,
        }
    }
}

/// Whether attempt `ack.attempt` ended with this worker's own result (`None`: the
/// server stops before it is known). A worker sends one result per attempt, and
/// only a result ends an attempt as completed, retried, failed or snoozed (the
/// server's own endings are timeouts, lost workers, cancels and releases), so such
/// an ending under this worker's id was this result.
///
/// While the row still runs the attempt for this worker, the result's first write
/// may be on its way: queued behind others, tried again after a failed commit, or
/// made by another node. That is waited for, and so, if it never comes, is the
/// attempt's reclaim once its lease (renewed by no one: the registry no longer
/// holds it) lapses. Reads the store failed are tried again meanwhile.
pub(super) async fn ended_by_own_result(
    core: &Core,
    namespace: &str,
    worker_id: &str,
    ack: &Ack,
) -> Option<bool> {
    use crate::store::{ActivityStatus, AttemptOutcome, Key};
    let key = Key {
        namespace: namespace.to_owned(),
        workflow_id: ack.workflow_id.clone(),
        activity_id: ack.activity_id.clone(),
    };
    // Past the lease and a sweep or two, the attempt is reclaimed if its write
    // never came.
    let give_up = tokio::time::Instant::now() + core.config.lease_timeout.saturating_mul(2);
    let mut pause = RESULT_RETRY_FIRST;
    loop {
        let row = match core.store.get(&key).await {
            Ok(Some(row)) if row.attempt < ack.attempt => return Some(false),
            Ok(Some(row)) => Some(row),
            Ok(None) => return Some(false),
            Err(e) => {
                tracing::warn!(workflow_id = %ack.workflow_id, activity_id = %ack.activity_id, attempt = ack.attempt, error = %e, "cannot read whether a result sent again was recorded");
                None
            }
        };
        match row {
            Some(row)
                if row.attempt == ack.attempt
                    && row.status == ActivityStatus::Running
                    && row.worker_id.as_deref() != Some(worker_id) =>
            {
                return Some(false);
            }
            // Still this worker's: its result's write may be on its way.
            Some(row) if row.attempt == ack.attempt && row.status == ActivityStatus::Running => {}
            Some(row) => match core.store.history(row.id).await {
                Ok(history) => {
                    return Some(history.iter().any(|record| {
                        record.attempt == ack.attempt
                            && record.worker_id.as_deref() == Some(worker_id)
                            && matches!(
                                AttemptOutcome::parse(&record.outcome),
                                Some(
                                    AttemptOutcome::Completed
                                        | AttemptOutcome::Retried
                                        | AttemptOutcome::Failed
                                        | AttemptOutcome::Snoozed
                                )
                            )
                    }));
                }
                Err(e) => {
                    tracing::warn!(workflow_id = %ack.workflow_id, activity_id = %ack.activity_id, attempt = ack.attempt, error = %e, "cannot read the attempt history of a result sent again");
                }
            },
            None => {}
        }
        if tokio::time::Instant::now() >= give_up {
            return Some(false);
        }
        // A write queued before now has landed once an empty commit has.
        if let Err(CommitError::Closed) = core.committer.commit(Vec::new()).await {
            return None;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RESULT_RETRY_MAX);
    }
}

/// Acks a result whose attempt was not the worker's to end any more when the
/// result came: one the worker sends again after a resume for an attempt that ended
/// while it was away, or one whose ending the store refused (the row had moved
/// on). Such a result may still be the one the attempt ended with, its first ack
/// lost with the old stream, or its write made by the node the session moved from;
/// then the worker hears it was accepted. Runs apart from the session's forwarder,
/// which it would hold up; a result that was committed stays unsettled (for a
/// drain) until its ack is sent. Nothing is sent if the session is `over` or the
/// server stops first: the worker sends the result again where it resumes.
pub(super) async fn recheck(
    core: Arc<Core>,
    (worker_id, namespace): (Arc<str>, Arc<str>),
    unsettled: Unsettled,
    over: CancellationToken,
) {
    let answer = tokio::select! {
        answer = ended_by_own_result(&core, &namespace, &worker_id, &unsettled.ack) => answer,
        _ = over.cancelled() => None,
    };
    let Some(accepted) = answer else {
        return;
    };
    if !accepted {
        crate::metrics::result_refused();
    }
    let Unsettled {
        tx, ack, permit, ..
    } = unsettled;
    send_ack(&tx, ack, accepted, permit);
}

/// Commits a session's results in the order they were read, and acks each after
/// its commit. Takes an ack-window permit per result (the bound on acks queued for
/// the worker); once the session is `over`, results are still committed but acks
/// wait for no room.
pub(super) async fn forward_results(
    core: Arc<Core>,
    (worker_id, namespace): (Arc<str>, Arc<str>),
    tx: mpsc::Sender<Outgoing>,
    window: Arc<Semaphore>,
    mut queue: mpsc::Receiver<Forward>,
    over: CancellationToken,
) {
    while let Some(item) = queue.recv().await {
        let permit = tokio::select! {
            biased;
            permit = window.clone().acquire_owned() => permit.ok(),
            _ = over.cancelled() => window.clone().try_acquire_owned().ok(),
        };
        match item {
            Forward::Refuse(ack) => send_ack(&tx, ack, false, permit),
            Forward::Recheck(ack) => {
                tokio::spawn(recheck(
                    core.clone(),
                    (worker_id.clone(), namespace.clone()),
                    Unsettled {
                        tx: tx.clone(),
                        ack,
                        permit,
                        _committing: None,
                    },
                    over.clone(),
                ));
            }
            Forward::Goodbye => {
                drop(permit);
                // An empty commit is a barrier: claims planned for this worker
                // before it left have been assigned when it returns.
                let _ = core.committer.commit(Vec::new()).await;
                let _ = tx.try_send(Outgoing::new(ToWorker::Drain { deadline: None }));
            }
            Forward::Commit {
                ops,
                ack,
                committing,
            } => {
                let tx = tx.clone();
                if crate::breakage::active(crate::breakage::Breakage::AckBeforeCommit) {
                    send_ack(&tx, ack.clone(), true, permit);
                    let reply = Box::new(move |_: Result<Vec<Outcome>, _>| drop(committing));
                    let _ = core.committer.commit_with(ops, reply).await;
                    continue;
                }
                let core_again = core.clone();
                let who = (worker_id.clone(), namespace.clone(), over.clone());
                let reply = Box::new(move |outcome: Result<Vec<Outcome>, CommitError>| {
                    match outcome {
                        Ok(outcomes) if finished(&outcomes) => {
                            send_ack(&tx, ack, true, permit);
                            drop(committing);
                        }
                        // The row had moved on: perhaps by this very result,
                        // written by the node the session moved from.
                        Ok(_) => {
                            let (worker_id, namespace, over) = who;
                            let unsettled = Unsettled {
                                tx,
                                ack,
                                permit,
                                _committing: Some(committing),
                            };
                            tokio::spawn(recheck(
                                core_again,
                                (worker_id, namespace),
                                unsettled,
                                over,
                            ));
                        }
                        Err(CommitError::Store { why, ops }) => {
                            tokio::spawn(retry_result(
                                core_again,
                                ops,
                                who,
                                Unsettled {
                                    tx,
                                    ack,
                                    permit,
                                    _committing: Some(committing),
                                },
                                why,
                            ));
                        }
                        // No ack: the worker keeps the result and sends it again
                        // to the node it resumes on.
                        Err(CommitError::Closed) => drop(committing),
                    }
                });
                if core.committer.commit_with(ops, reply).await.is_err() {
                    // The committer is gone (shutdown); the reply, and with it the
                    // ack, is dropped. The row stays RUNNING and is reclaimed later.
                    tracing::warn!("result not recorded: shutting down");
                }
            }
        }
    }
}
