//! Claim planning and routing: which workers get a claim this round (one per
//! worker with free slots, or room ahead, in a group that may have due rows, least
//! loaded first), and where the claimed rows go: into its free slots, and the rest
//! ahead, sent as its slots free. A claim reserves its rows until they are assigned
//! or it is given back, so no slot is promised twice.

use std::sync::Arc;

use spool_proto::time::UnixMillis;

use super::{Ahead, GroupKey, Registry};
use crate::store::{ActivityRow, Attempt, Claim, Op, Transition};

impl Registry {
    /// Marks a type as possibly having due rows, and wakes the committer.
    pub fn mark_due(&self, namespace: &str, activity_type: &str) {
        let mut inner = self.lock();
        if !inner.all_due {
            inner.due.insert((namespace.into(), activity_type.into()));
        }
        drop(inner);
        self.wake.notify_one();
    }

    /// Marks every type as possibly having due rows.
    pub fn mark_all_due(&self) {
        let mut inner = self.lock();
        inner.all_due = true;
        inner.due.clear();
        drop(inner);
        self.wake.notify_one();
    }

    /// Plans the claims worth running now: one per worker with free slots or room
    /// ahead in a group that may have due rows, the least-loaded workers first. Each
    /// claim reserves its rows until [`Registry::assign`] or [`Registry::unreserve`].
    ///
    /// `in_flight`: claims sent to the store and not landed (stores with several
    /// writers). A group with one of them is planned for again only if rows may be
    /// left for a second: it was marked due since the last plan, or its last claim
    /// that landed took all it asked for. Otherwise the claim in flight holds what
    /// is due, and another beside it would find nothing, costing the store a
    /// statement for every batch; if it lands full, the loop plans again.
    pub fn plan_claims(&self, lease_expires_at: UnixMillis, in_flight: &[&Claim]) -> Vec<Claim> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        if inner.paused {
            return Vec::new();
        }
        let writers = self.writers.max(1);
        let flying: Vec<GroupKey> = in_flight
            .iter()
            .filter_map(|c| inner.workers.get(&c.worker_id))
            .map(|w| w.group.clone())
            .collect();
        let all_due = std::mem::take(&mut inner.all_due);
        let due = std::mem::take(&mut inner.due);
        inner.rotation = inner.rotation.wrapping_add(1);
        let mut claims = Vec::new();
        for ((namespace, types), group) in inner.groups.iter_mut() {
            if all_due
                || types
                    .iter()
                    .any(|t| due.contains(&(namespace.clone(), t.clone())))
            {
                group.refresh();
            }
            let fresh = std::mem::take(&mut group.fresh);
            for id in &group.workers {
                if let Some(w) = inner.workers.get_mut(id) {
                    w.plan_ahead(writers);
                }
            }
            if group.exhausted {
                continue;
            }
            let beside = flying.iter().any(|(n, t)| n == namespace && t == types);
            if !fresh && !group.saturated && beside {
                group.held_back = true;
                continue;
            }
            // A claim takes its share of the room, leaving the rest for the batch
            // sent beside it. Where small batches, claims alone among them, go
            // only after the one in flight landed (SQLite), a claim with none of
            // its group in flight fills every free slot: halves would fill them
            // over a chain of commits, each waiting for the one before. The room
            // ahead is still shared, so that a busy worker's large room does not
            // take a backlog from the group's other workers.
            let fill_free = self.in_turn && !beside;
            // An evicted worker's session is ending, a leaving worker takes no more:
            // nothing more goes to either.
            let mut free: Vec<(u32, Arc<str>, Arc<str>)> = group
                .workers
                .iter()
                .filter_map(|id| inner.workers.get(id))
                .filter(|w| w.takes_tasks())
                .map(|w| {
                    let share = w.wanted().div_ceil(writers);
                    let limit = if fill_free {
                        share.max(w.free_slots())
                    } else {
                        share
                    };
                    (limit, w.id.clone(), w.identity.clone())
                })
                .filter(|(free, ..)| *free > 0)
                .collect();
            free.sort_by_key(|f| std::cmp::Reverse(f.0));
            let mut rotated = types.clone();
            if !rotated.is_empty() {
                let by = inner.rotation % rotated.len();
                rotated.rotate_left(by);
            }
            for (limit, worker_id, identity) in free {
                if let Some(w) = inner.workers.get_mut(&worker_id) {
                    w.reserved += limit;
                }
                claims.push(Claim {
                    namespace: namespace.clone(),
                    activity_types: rotated.clone(),
                    worker_id,
                    identity,
                    node: self.node.clone(),
                    limit,
                    lease_expires_at,
                    epoch: group.epoch,
                });
            }
        }
        claims
    }

    /// Gives back the slots of a claim that did not run.
    pub fn unreserve(&self, claim: &Claim) {
        if let Some(w) = self.lock().workers.get_mut(&claim.worker_id) {
            w.reserved = w.reserved.saturating_sub(claim.limit);
        }
        self.wake.notify_one();
    }

    /// Hands the rows a claim took to its worker. Rows whose worker has gone are
    /// returned as releases for the caller to write.
    pub fn assign(&self, claim: &Claim, rows: Vec<ActivityRow>) -> Vec<Op> {
        let mut inner = self.lock();
        let short = rows.len() < claim.limit as usize;
        // A concurrency key gets a share of a claim by its weight, and may have
        // had fewer rows due than its share: rows of the keys that filled theirs
        // may be left. Such a claim plans again rather than marking its group
        // exhausted; the next finds them, or nothing.
        let keyed = rows.iter().any(|row| row.concurrency_key.is_some());
        let Some(worker) = inner.workers.get_mut(&claim.worker_id) else {
            // Fenced like every release of a row claimed ahead: the worker may
            // have resumed its session on another node meanwhile, which took the
            // row over and may be running it.
            return rows
                .iter()
                .map(|row| Op::finish(self.fenced(&Attempt::from_row(row)), Transition::Release))
                .collect();
        };
        worker.reserved = worker.reserved.saturating_sub(claim.limit);
        let mut undelivered = Vec::new();
        for row in rows {
            let row = Ahead::new(row, &worker.id);

            // Claims planned before a drain paused dispatch still land in free
            // slots; what does not fit waits ahead. A worker evicted meanwhile
            // gets none: its attempts are about to be lost, counted, where a row
            // it never had goes back uncounted.
            let sent = if worker.running() < worker.max_concurrency && !worker.evict.is_cancelled()
            {
                worker.deliver(row)
            } else if worker.takes_tasks() && worker.ahead.has_room() {
                worker.ahead.push_back(row);
                Ok(())
            } else {
                // Or over the memory rows ahead may hold (see `MAX_AHEAD_BYTES`).
                Err(row)
            };
            // The worker never got it: back to SCHEDULED, uncounted (its session
            // is ending).
            if let Err(row) = sent {
                undelivered.push(Op::finish(self.fenced(&row.attempt), Transition::Release));
            }
        }
        let group = worker.group.clone();
        let mut plan_again = false;
        if let Some(g) = inner.groups.get_mut(&group) {
            g.saturated = !short;
            let held_back = std::mem::take(&mut g.held_back);
            if !short {
                // Rows may be left, and room for them that no claim beside this
                // one took (see `plan_claims`).
                plan_again = held_back;
            } else if g.epoch == claim.epoch && !keyed {
                g.exhausted = true;
            } else {
                // A plan since this claim's took the group's due mark, but may have
                // had no room to claim with (or keys may have rows left): plan
                // again, now that this one's reservation is given back.
                plan_again = true;
            }
        }
        drop(inner);
        if plan_again {
            self.wake.notify_one();
        }
        undelivered
    }
}

/// The span of one attempt on this server, from dispatch until its worker answers
/// or is gone: what the server logs about the attempt carries its identity, its
/// worker and the trace it runs in (the `traceparent` header's trace id).
pub(super) fn attempt_span(row: &ActivityRow, worker_id: &str) -> tracing::Span {
    let trace_id = row
        .headers
        .get("traceparent")
        .and_then(|t| t.split('-').nth(1))
        .unwrap_or_default();
    let span = tracing::info_span!(
        "attempt",
        namespace = %row.key.namespace,
        workflow_id = %row.key.workflow_id,
        activity_id = %row.key.activity_id,
        activity_type = %row.activity_type,
        attempt = row.attempt,
        worker_id = %worker_id,
        trace_id = %trace_id,
    );
    spool_proto::trace::join_trace(&span, &row.headers);
    span
}
