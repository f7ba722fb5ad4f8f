//! What a committed batch means for the rest of the server, op by op: claimed
//! rows handed to their workers, waiters woken, running attempts told to stop,
//! due times armed, and the same told to the other nodes. Every kind of op is
//! named here, so a new one must say what its commit sets off.

use super::*;

impl Loop {
    /// What committed writes mean for the rest of the server, in op order.
    /// Claimed rows are moved out of `outcomes` (nobody is answered with them).
    /// Every kind of op is named: a new one must say what its commit sets off.
    pub(super) fn apply_effects(&mut self, ops: &[Op], outcomes: &mut [Outcome], now: UnixMillis) {
        for (op, outcome) in ops.iter().zip(outcomes.iter_mut()) {
            match op {
                Op::Submit(_) => {
                    if let Outcome::Submitted(submitted) = outcome {
                        self.submitted(submitted, now);
                    }
                }
                Op::Claim(claim) => {
                    if let Outcome::Claimed { rows, throttled } = outcome {
                        self.claimed(claim, std::mem::take(rows), throttled, now);
                    }
                }
                Op::Finish {
                    attempt,
                    transition,
                    ..
                } => match outcome {
                    Outcome::Finished { accepted: true } => self.ended(attempt, transition, now),
                    _ => crate::metrics::result_refused(),
                },
                Op::Cancel { reason, .. } => {
                    if let Outcome::Cancelled { prior, row } = outcome {
                        self.cancelled(*prior, row, reason, now);
                    }
                }
                Op::EnforceConcurrency { .. } => {
                    if let Outcome::Enforced(cancelled) = outcome {
                        for (prior, row) in cancelled.iter() {
                            let reason = row
                                .last_error
                                .as_ref()
                                .map(|e| e.message.clone())
                                .unwrap_or_default();
                            self.cancelled(*prior, row, &reason, now);
                        }
                    }
                }
                Op::Redrive { .. } => {
                    if let Outcome::Redriven { row } = outcome {
                        self.came_due(&row.key.namespace, &row.activity_type, row.next_at, now);
                    }
                }
                Op::ExpireScheduled { .. } => {
                    if let Outcome::Expired(keys) = outcome {
                        for key in keys.iter() {
                            self.finished(key);
                        }
                    }
                }
                // Their callers read the outcome; nothing else follows from them.
                Op::Renew { .. }
                | Op::RecordHeartbeats(_)
                | Op::Prune { .. }
                | Op::Rerank { .. }
                | Op::Setting(_) => {}
            }
        }
    }

    /// Submitted rows: those due now were marked due before the batch's claims
    /// were planned, so only other nodes hear of them; later ones arm the timer.
    fn submitted(&mut self, submitted: &[store::Submitted], now: UnixMillis) {
        crate::metrics::submitted(submitted.iter().filter(|s| s.created).count() as u64);
        for s in submitted.iter().filter(|s| s.created) {
            let (namespace, activity_type) = (&s.row.key.namespace, &s.row.activity_type);
            if s.row.next_at <= now {
                // A claim planned before that comes back short plans again
                // (`Registry::assign`); one that ran beside this batch had it
                // marked again as it landed: marking it again here would only
                // plan a claim that finds nothing.
                self.tell_due(namespace, activity_type, s.row.next_at);
            } else {
                self.came_due(namespace, activity_type, s.row.next_at, now);
            }
        }
    }

    /// Claimed rows go to their worker; a type the rate limit held back is due
    /// again when its bucket gives a row (every node reads the same bucket, so
    /// this is not told to the others).
    fn claimed(
        &mut self,
        claim: &store::Claim,
        rows: Vec<store::ActivityRow>,
        throttled: &[(std::sync::Arc<str>, UnixMillis)],
        now: UnixMillis,
    ) {
        for (activity_type, at) in throttled.iter() {
            crate::metrics::throttled(&claim.namespace, activity_type);
            self.due(&claim.namespace, activity_type, *at, now);
        }
        crate::metrics::dispatched(rows.len() as u64);
        for row in rows.iter() {
            crate::metrics::picked_up(
                &row.key.namespace,
                &row.activity_type,
                seconds(now.saturating_sub(row.next_at)),
            );
        }
        let released = self.registry.assign(claim, rows);

        self.carry.extend(released);
    }

    /// An attempt's ending was written: counted, its waiters woken or its row
    /// due again, and room made for its concurrency key.
    fn ended(&mut self, attempt: &store::Attempt, transition: &Transition, now: UnixMillis) {
        crate::metrics::finished(transition_name(transition));
        let outcome = store::AttemptOutcome::of(transition);
        if matches!(
            outcome,
            store::AttemptOutcome::Completed
                | store::AttemptOutcome::Retried
                | store::AttemptOutcome::Failed
                | store::AttemptOutcome::Snoozed
        ) {
            self.registry.result_committed();
        }
        crate::metrics::attempt_ended(
            &attempt.key.namespace,
            &attempt.activity_type,
            outcome,
            Some(seconds(now.saturating_sub(attempt.started_at))),
            matches!(transition, Transition::Fail { .. }),
        );
        let (namespace, activity_type) = (&attempt.key.namespace, &attempt.activity_type);
        if attempt.concurrency_key.is_some() {
            // Room for another row of its concurrency key, here or on another node.
            self.came_due(namespace, activity_type, now, now);
        }
        match transition {
            Transition::Complete { .. } | Transition::Fail { .. } => self.finished(&attempt.key),
            Transition::Retry { next_at, .. } | Transition::Snooze { next_at } => {
                self.came_due(namespace, activity_type, *next_at, now);
            }
            Transition::Release => self.came_due(namespace, activity_type, now, now),
        }
    }

    /// A committed change made rows due: here, and on other nodes.
    pub(super) fn came_due(
        &mut self,
        namespace: &str,
        activity_type: &str,
        at: UnixMillis,
        now: UnixMillis,
    ) {
        self.due(namespace, activity_type, at, now);
        self.tell_due(namespace, activity_type, at);
    }

    /// Tells the other nodes only: this node already knows.
    pub(super) fn tell_due(&mut self, namespace: &str, activity_type: &str, at: UnixMillis) {
        self.peers.tell(|| Event::Due {
            namespace: namespace.to_owned(),
            activity_type: activity_type.to_owned(),
            at,
        });
    }

    /// A committed cancel of `row`, which was `prior`: its waiters learn of it, and
    /// a worker running it is told to stop, here or on another node.
    pub(super) fn cancelled(
        &mut self,
        prior: ActivityStatus,
        row: &store::ActivityRow,
        reason: &str,
        now: UnixMillis,
    ) {
        crate::metrics::cancelled();
        crate::metrics::attempt_ended(
            &row.key.namespace,
            &row.activity_type,
            store::AttemptOutcome::Cancelled,
            (prior == ActivityStatus::Running)
                .then(|| row.started_at.map(|t| seconds(now.saturating_sub(t))))
                .flatten(),
            false,
        );
        self.finished(&row.key);
        if prior == ActivityStatus::Running && row.concurrency_key.is_some() {
            self.came_due(&row.key.namespace, &row.activity_type, now, now);
        }
        if prior == ActivityStatus::Running
            && let Some(worker_id) = &row.worker_id
        {
            // The worker may be connected here, or to another node.
            self.registry
                .cancel_running(worker_id, &row.key, row.attempt, reason);
            self.peers.tell(|| Event::Cancelled {
                worker_id: worker_id.to_string(),
                key: row.key.clone(),
                attempt: row.attempt,
                reason: crate::limits::truncate(reason.to_owned(), MAX_EVENT_REASON),
            });
        }
    }

    /// A committed change made the activity terminal: wake its waiters, here and
    /// on other nodes.
    pub(super) fn finished(&mut self, key: &Key) {
        self.pending.notify(key);
        self.peers.tell(|| Event::Finished { key: key.clone() });
    }

    /// Tells the other nodes what the last batch changed, without holding up the
    /// next batch.
    pub(super) fn publish_outgoing(&mut self) {
        if let Err(why) = self.peers.flush(self.store.now()) {
            self.fatal = Some(why);
        }
    }

    /// Another node's committed change.
    pub(super) fn on_remote(&mut self, remote: Remote) {
        match remote {
            Remote::Event(Event::Due {
                namespace,
                activity_type,
                at,
            }) => self.due(&namespace, &activity_type, at, self.store.now()),
            Remote::Event(Event::Finished { key }) => self.pending.notify(&key),
            Remote::Event(Event::Cancelled {
                worker_id,
                key,
                attempt,
                reason,
            }) => self
                .registry
                .cancel_running(&worker_id, &key, attempt, &reason),
            Remote::Resync => {
                self.registry.mark_all_due();
                self.timer.read_again_by(self.store.now());
            }
        }
    }

    pub(super) fn due(
        &mut self,
        namespace: &str,
        activity_type: &str,
        at: UnixMillis,
        now: UnixMillis,
    ) {
        if at <= now {
            self.registry.mark_due(namespace, activity_type);
        } else {
            self.timer
                .insert(at, Some((namespace.into(), activity_type.into())));
        }
    }
}

pub(super) fn transition_name(transition: &Transition) -> &'static str {
    match transition {
        Transition::Complete { .. } => "completed",
        Transition::Retry { .. } => "retried",
        Transition::Snooze { .. } => "snoozed",
        Transition::Fail { .. } => "failed",
        Transition::Release => "released",
    }
}

pub(super) fn seconds(millis: i64) -> f64 {
    millis as f64 / 1000.0
}
