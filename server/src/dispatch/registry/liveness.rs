//! Liveness as the registry sees it: when each worker was last heard from, each
//! attempt's heartbeats, and the sweep that evicts silent workers and ends attempts
//! whose timeouts passed (see `timeouts`). All on the monotonic clock.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use spool_proto::attempt::Ids;

use super::{AttemptKey, CancelKind, Registry, SilencePaused, Sweep, Worker};
use crate::dispatch::timeouts::TimedOut;
use crate::store::{HeartbeatDetails, Payload};

impl Registry {
    /// Records that the worker was heard from.
    pub fn touch(&self, worker_id: &str, now: Instant) {
        if let Some(w) = self.lock().workers.get_mut(worker_id) {
            w.last_seen = now;
        }
    }

    /// Records an attempt's heartbeat; returns false if the worker does not hold
    /// that attempt (a late heartbeat is ignored).
    pub fn heartbeat(
        &self,
        worker_id: &str,
        workflow_id: &str,
        activity_id: &str,
        attempt: u32,
        details: Option<Payload>,
        now: Instant,
    ) -> bool {
        let mut inner = self.lock();
        let Some(worker) = inner.workers.get_mut(worker_id) else {
            return false;
        };
        worker.last_seen = now;
        match worker
            .inflight
            .get_mut(Ids::new(workflow_id, activity_id, attempt).key())
        {
            Some(i) if !i.cancel_sent => {
                i.last_heartbeat = now;
                // No details: the attempt is alive; what it reported last stands.
                if details.is_some() {
                    i.details = details;
                    i.unflushed = true;
                }
                true
            }
            _ => false,
        }
    }

    /// The sweep's write of heartbeat details (`Sweep::flushed`) landed, or failed
    /// (`stored` false). Details known stored are let go: a result need not carry
    /// them. Failed ones are taken again by the next sweep.
    pub fn details_flushed(&self, flushed: &[(Arc<str>, AttemptKey)], stored: bool) {
        if flushed.is_empty() {
            return;
        }
        let mut inner = self.lock();
        for (worker_id, key) in flushed {
            let Some(inflight) = inner
                .workers
                .get_mut(worker_id)
                .and_then(|w| w.inflight.get_mut(key))
            else {
                continue;
            };
            inflight.flushing = false;
            if !stored {
                inflight.unflushed = true;
            } else if !inflight.unflushed {
                inflight.details = None;
            }
        }
    }

    /// One liveness pass: finds workers silent for `silence` or longer, ends
    /// attempts whose timeouts passed (telling their workers to stop), releases rows
    /// claimed ahead that waited `hold_for` (their worker is slower than it was),
    /// and collects heartbeat details to store and running rows (and rows still
    /// ahead) to renew.
    pub fn sweep(&self, now: Instant, silence: Duration, hold_for: Duration) -> Sweep {
        let mut sweep = Sweep::default();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let mut abandoned = Vec::new();
        let mut waited_too_long = Vec::new();
        for worker in inner.workers.values_mut() {
            for row in std::mem::take(&mut worker.ahead) {
                if now.saturating_duration_since(row.claimed_at) >= hold_for {
                    waited_too_long.push(row);
                } else {
                    worker.ahead.push_back(row);
                }
            }
            sweep.running.extend(
                worker
                    .ahead
                    .iter()
                    .map(|a| (a.attempt.id, a.attempt.attempt)),
            );
            // Details first, also of a worker lost below: the tick writes them
            // before it ends the attempts, so the next attempt starts from them.
            // An attempt already stopped is included: if the tick that timed it
            // out failed to write, the attempt still runs in the store until its
            // lease is reclaimed, and its details are written before that (for
            // one ended already the write is fenced off).
            for inflight in worker.inflight.values_mut() {
                if !std::mem::take(&mut inflight.unflushed) {
                    continue;
                }
                let Some(details) = &inflight.details else {
                    continue;
                };
                let attempt = &inflight.attempt;
                inflight.flushing = true;
                sweep.heartbeats.push(HeartbeatDetails {
                    id: attempt.id,
                    attempt: attempt.attempt,
                    details: Some(details.clone()),
                });
                sweep.flushed.push((
                    worker.id.clone(),
                    AttemptKey::new(
                        &attempt.key.workflow_id,
                        &attempt.key.activity_id,
                        attempt.attempt,
                    ),
                ));
            }
            // A dropped stream is not silence: its grace decides.
            if let Some(until) = worker.detached_until {
                if now >= until {
                    abandoned.push(worker.id.clone());
                    continue;
                }
            } else if now.saturating_duration_since(worker.last_seen) >= silence
                && worker.silence_paused == 0
                && !worker.evict.is_cancelled()
            {
                if std::mem::replace(&mut worker.silent_once, true) {
                    worker.evict.cancel();
                    sweep.lost_workers.push(worker.id.clone());
                    continue;
                }
            } else {
                worker.silent_once = false;
            }
            for inflight in worker.inflight.values_mut() {
                if inflight.cancel_sent {
                    continue;
                }
                let attempt = &inflight.attempt;
                let Some(timed_out) =
                    inflight
                        .deadlines
                        .passed(&inflight.attempt, inflight.last_heartbeat, now)
                else {
                    sweep.running.push((attempt.id, attempt.attempt));
                    continue;
                };
                inflight.stop(&worker.outbound, CancelKind::TimedOut, &timed_out.message);
                // Fenced to this node: a worker that resumed its session elsewhere
                // heartbeats there, and this copy's deadlines no longer describe it.
                sweep.timed_out.push(TimedOut {
                    attempt: self.fenced(&timed_out.attempt),
                    ..timed_out
                });
            }
        }
        let releasing = !waited_too_long.is_empty();
        inner.release(waited_too_long);
        drop(guard);
        if releasing {
            self.wake.notify_one();
        }
        for worker_id in abandoned {
            // Only if it is still detached: it may have resumed since.
            let still_detached = |w: &Worker| w.detached_until.is_some_and(|until| now >= until);
            if let Some(attempts) = self.unregister_if(&worker_id, still_detached) {
                sweep.abandoned.push((worker_id, self.lost(attempts)));
            }
        }
        if !sweep.timed_out.is_empty() || !sweep.lost_workers.is_empty() {
            // Fewer attempts run now: a drain may be waiting on that.
            self.answered.notify_waiters();
        }
        sweep
    }

    /// While the returned guard lives, the worker's silence is not counted: its
    /// session waits on the server, not reading. When it drops, the worker counts
    /// as heard from.
    pub fn pause_silence<'a>(&'a self, worker_id: &'a str) -> SilencePaused<'a> {
        if let Some(w) = self.lock().workers.get_mut(worker_id) {
            w.silence_paused += 1;
        }
        SilencePaused {
            registry: self,
            worker_id,
        }
    }
}
