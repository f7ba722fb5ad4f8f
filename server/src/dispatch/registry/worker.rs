//! One worker as the registry holds it: its slots, the attempts in flight, the
//! rows claimed ahead for it (bounded in number and in payload bytes), and the
//! delivery of a task onto its outbound channel.

use std::{collections::VecDeque, sync::Arc};

use spool_proto::time::{self, UnixMillis};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{AttemptKey, GroupKey, Registration, Ticket, claims};
use crate::{
    dispatch::{
        outbound::{Cancel, CancelKind, Outgoing, Task, ToWorker},
        timeouts::Deadlines,
    },
    store::{Attempt, Payload},
};

pub(super) struct Inflight {
    pub(super) attempt: Arc<Attempt>,
    /// The server ended the attempt and told the worker to stop.
    pub(super) cancel_sent: bool,
    /// What it told the worker, to tell it again after a resume.
    pub(super) cancel: Option<Cancel>,
    /// When the attempt last reported progress (dispatch time at first).
    pub(super) last_heartbeat: Instant,
    /// When its timeouts end this attempt.
    pub(super) deadlines: Deadlines,
    /// The latest details the attempt reported, until they are known stored: they
    /// go with its result, written just before its ending, while a flush of them
    /// may still land after the ending, and be fenced out.
    pub(super) details: Option<Payload>,
    /// `details` changed since the sweep last took them to store.
    pub(super) unflushed: bool,
    /// The sweep took `details` to store, and its write has not been confirmed.
    pub(super) flushing: bool,
    /// The attempt's span (see `claims::attempt_span`): entered for what is logged
    /// about it, closed when this entry goes.
    pub(super) span: tracing::Span,
}

impl Inflight {
    /// An attempt dispatched at `now` (monotonic) and `now_wall`.
    pub(super) fn new(
        attempt: Arc<Attempt>,
        now: Instant,
        now_wall: UnixMillis,
        span: tracing::Span,
    ) -> Self {
        Self {
            deadlines: Deadlines::at_dispatch(&attempt, now, now_wall),
            attempt,
            cancel_sent: false,
            cancel: None,
            last_heartbeat: now,
            details: None,
            unflushed: false,
            flushing: false,
            span,
        }
    }
}

/// A row claimed ahead for a worker whose slots were all busy: committed RUNNING
/// with its attempt, sent when a slot frees.
pub(super) struct Ahead {
    /// Boxed: rows ahead are moved between queues, and back when a send fails.
    pub(super) task: Box<Task>,
    /// The task's payload bytes (input and heartbeat details): what it holds in
    /// memory while it waits.
    pub(super) bytes: usize,
    pub(super) attempt: Arc<Attempt>,
    pub(super) span: tracing::Span,
    /// When the claim handed it over, on the monotonic clock: the wall time of
    /// its dispatch is the claim's plus what it waited, and it is released once it
    /// waited too long.
    pub(super) claimed_at: Instant,
}

impl Ahead {
    pub(super) fn new(row: crate::store::ActivityRow, worker_id: &str) -> Self {
        let attempt = Arc::new(Attempt::from_row(&row));
        let span = claims::attempt_span(&row, worker_id);
        let task = Box::new(Task::new(row, &attempt));
        let bytes = task.payload_bytes();
        Self {
            task,
            bytes,
            attempt,
            span,
            claimed_at: Instant::now(),
        }
    }

    pub(super) fn is(&self, id: i64, attempt: u32) -> bool {
        self.attempt.id == id && self.attempt.attempt == attempt
    }
}

/// The most payload bytes of rows claimed ahead one worker may hold waiting:
/// past it, a claim asks for its free slots only, and what a claim brings
/// beyond them goes back uncounted. Rows ahead carry their input, and room
/// ahead is counted in rows (up to eight times the slots), so without it a
/// worker of many slots and large inputs would hold gigabytes here.
pub const MAX_AHEAD_BYTES: usize = 16 * 1024 * 1024;

/// A worker's rows claimed ahead, in the order they are sent, and the payload
/// bytes they hold.
#[derive(Default)]
pub(super) struct AheadQueue {
    pub(super) rows: VecDeque<Ahead>,
    pub(super) bytes: usize,
}

impl AheadQueue {
    pub(super) fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether it holds its share of memory: no more rows should wait here.
    pub(super) fn full(&self) -> bool {
        self.bytes >= MAX_AHEAD_BYTES
    }

    /// Whether one more row may wait here: the budget is not spent yet (so it
    /// is passed by one row at most, as [`Worker::wanted`] asks for no room
    /// ahead once it is).
    pub(super) fn has_room(&self) -> bool {
        !self.full()
    }

    pub(super) fn push_back(&mut self, row: Ahead) {
        self.bytes = self.bytes.saturating_add(row.bytes);
        self.rows.push_back(row);
    }

    pub(super) fn push_front(&mut self, row: Ahead) {
        self.bytes = self.bytes.saturating_add(row.bytes);
        self.rows.push_front(row);
    }

    pub(super) fn pop_front(&mut self) -> Option<Ahead> {
        let row = self.rows.pop_front()?;
        self.bytes = self.bytes.saturating_sub(row.bytes);
        Some(row)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Ahead> {
        self.rows.iter()
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Ahead) -> bool) {
        let mut bytes = 0;
        self.rows.retain(|row| {
            let kept = keep(row);
            if kept {
                bytes += row.bytes;
            }
            kept
        });
        self.bytes = bytes;
    }
}

impl IntoIterator for AheadQueue {
    type Item = Ahead;
    type IntoIter = std::collections::vec_deque::IntoIter<Ahead>;

    fn into_iter(self) -> Self::IntoIter {
        self.rows.into_iter()
    }
}

pub(super) struct Worker {
    pub(super) id: Arc<str>,
    pub(super) group: GroupKey,
    pub(super) identity: Arc<str>,
    pub(super) max_concurrency: u32,
    /// Wall time, for display.
    pub(super) connected_at: UnixMillis,
    pub(super) last_seen: Instant,
    /// Attempts sent to the worker and not yet answered, by `(workflow_id,
    /// activity_id, attempt)`: the attempt is part of the key because a worker may
    /// still run attempt n (ended by the server, not yet answered) when attempt n+1
    /// of the same activity is handed to it.
    pub(super) inflight: foldhash::HashMap<AttemptKey, Inflight>,
    /// Rows promised to claims the committer is running now.
    pub(super) reserved: u32,
    /// Rows claimed ahead for it, in claim order (priority first): sent as its
    /// slots free.
    pub(super) ahead: AheadQueue,
    /// How many rows it should have claimed ahead: about what its slots free while
    /// a claim commits (see [`Worker::plan_ahead`]).
    pub(super) ahead_target: u32,
    /// Results it answered since claims were last planned.
    pub(super) answered: u32,
    /// Everything sent to the worker, in order. The session owns the receiver;
    /// closed means the session is ending.
    pub(super) outbound: mpsc::Sender<Outgoing>,
    /// Cancelled by a sweep that found the worker silent: its session ends.
    pub(super) evict: CancellationToken,
    /// Set while the session waits on the server rather than reading (see
    /// [`Registry::pause_silence`]): the worker's silence is not counted then.
    pub(super) silence_paused: u32,
    /// A sweep found it silent. It is evicted only if the next sweep still does:
    /// messages that arrived while the server itself did not run (its process
    /// descheduled, its runtime busy) are read in between, and the sweep's timer
    /// may well fire before they are.
    pub(super) silent_once: bool,
    /// The worker said Goodbye: no more claims are planned for it.
    pub(super) leaving: bool,
    /// What resumes its session after a drop.
    pub(super) ticket: Option<Ticket>,
    /// Its stream dropped; the session may be resumed until then. No claims are
    /// planned for it meanwhile, its attempts keep their slots and leases.
    pub(super) detached_until: Option<Instant>,
    /// Attempts it said it still had when it resumed, which had ended while it was
    /// away (perhaps by its own result, whose ack was lost with the old stream):
    /// their results, sent again, are checked against the store rather than
    /// refused out of hand. Of what its latest resuming `Hello` listed, at most
    /// what it could still have to answer.
    pub(super) ended_away: foldhash::HashSet<AttemptKey>,
}

impl Worker {
    /// A worker heard from now, holding nothing.
    pub(super) fn new(
        id: Arc<str>,
        group: GroupKey,
        reg: Registration,
        connected_at: UnixMillis,
        outbound: mpsc::Sender<Outgoing>,
        evict: CancellationToken,
    ) -> Self {
        Self {
            id,
            group,
            identity: reg.identity.into(),
            max_concurrency: reg.max_concurrency.max(1),
            connected_at,
            last_seen: Instant::now(),
            inflight: Default::default(),
            reserved: 0,
            ahead: AheadQueue::default(),
            ahead_target: 0,
            answered: 0,
            outbound,
            evict,
            silence_paused: 0,
            silent_once: false,
            leaving: false,
            ticket: reg.ticket,
            detached_until: None,
            ended_away: Default::default(),
        }
    }

    pub(super) fn running(&self) -> u32 {
        u32::try_from(self.inflight.len()).unwrap_or(u32::MAX)
    }

    /// Slots neither running nor reserved nor filled by rows ahead.
    pub(super) fn free_slots(&self) -> u32 {
        self.max_concurrency
            .saturating_sub(self.reserved)
            .saturating_sub(self.running())
            .saturating_sub(u32::try_from(self.ahead.len()).unwrap_or(u32::MAX))
    }

    /// Rows a claim should bring it now: its free slots, plus room ahead while
    /// its rows ahead hold less than [`MAX_AHEAD_BYTES`].
    pub(super) fn wanted(&self) -> u32 {
        let ahead_target = if self.ahead.full() {
            0
        } else {
            self.ahead_target
        };
        (self.max_concurrency + ahead_target)
            .saturating_sub(self.reserved)
            .saturating_sub(self.running())
            .saturating_sub(u32::try_from(self.ahead.len()).unwrap_or(u32::MAX))
    }

    /// Sizes the room ahead from the results answered since the last plan: twice
    /// what freed during one round of the committer, so a slot freed while the
    /// next claim commits finds a row waiting; it halves with each quiet round, so
    /// a worker of long attempts holds none. At most twice the worker's slots a round: a
    /// worker that turns all its slots over within one commit then still finds
    /// rows when the next one lands, and the committer's batches (one fsync each)
    /// carry up to that many results.
    ///
    /// With `writers` batches written at once, a claim takes `1 / writers` of the
    /// room and its rows land `writers` rounds after it is planned, so the room
    /// covers `writers²` rounds, twice over.
    pub(super) fn plan_ahead(&mut self, writers: u32) {
        let answered = std::mem::take(&mut self.answered);
        let rounds = 2 * writers * writers;
        self.ahead_target = answered
            .saturating_mul(rounds)
            .max(self.ahead_target / 2)
            .min(self.max_concurrency.saturating_mul(rounds));
    }

    /// Whether tasks may be sent to it: not leaving, evicted or detached.
    pub(super) fn takes_tasks(&self) -> bool {
        !self.leaving && !self.evict.is_cancelled() && self.detached_until.is_none()
    }

    /// Sends a row to the worker as an attempt it now runs. On a closed (or full)
    /// channel the row comes back.
    pub(super) fn deliver(&mut self, ahead: Ahead) -> Result<(), Ahead> {
        // A permit first: the row stays whole if the channel cannot take it.
        let permit = match self.outbound.try_reserve() {
            Ok(permit) => permit,
            Err(e) => {
                if matches!(e, mpsc::error::TrySendError::Full(())) {
                    tracing::error!(worker_id = %self.id, "outbound channel full: slot accounting is broken");
                }
                return Err(ahead);
            }
        };
        let Ahead {
            task,
            attempt,
            span,
            claimed_at,
            bytes: _,
        } = ahead;
        permit.send(Outgoing::new(ToWorker::Task(task)));
        let now = Instant::now();
        // The attempt's wall time runs from its dispatch, on the store's clock: the
        // claim's time plus what the row waited here.
        let waited = spool_proto::time::millis(now.saturating_duration_since(claimed_at));
        let now_wall = attempt.started_at.saturating_add(waited);
        span.in_scope(|| tracing::debug!(waited_ms = waited, "dispatched"));
        self.inflight.insert(
            AttemptKey::new(
                &attempt.key.workflow_id,
                &attempt.key.activity_id,
                attempt.attempt,
            ),
            Inflight::new(attempt, now, now_wall, span),
        );
        Ok(())
    }

    /// Sends rows claimed ahead into its free slots.
    pub(super) fn fill(&mut self, paused: bool) {
        while !paused && self.takes_tasks() && self.running() < self.max_concurrency {
            let Some(next) = self.ahead.pop_front() else {
                return;
            };
            if let Err(back) = self.deliver(next) {
                self.ahead.push_front(back);
                return;
            }
        }
    }
}

impl Inflight {
    /// The server ends this attempt: its worker is told to stop, once, and why. Full
    /// cannot happen (one cancel per held attempt is budgeted); closed means the
    /// session is ending and will not count the attempt anyway.
    pub(super) fn stop(
        &mut self,
        outbound: &mpsc::Sender<Outgoing>,
        kind: CancelKind,
        reason: &str,
    ) {
        self.cancel_sent = true;
        self.span.in_scope(|| {
            tracing::info!(kind = kind.as_str(), reason, "attempt ended by the server")
        });
        let cancel = Cancel {
            workflow_id: self.attempt.key.workflow_id.clone(),
            activity_id: self.attempt.key.activity_id.clone(),
            attempt: self.attempt.attempt,
            reason: reason.to_owned(),
            kind,
        };
        self.cancel = Some(cancel.clone());
        let _ = outbound.try_send(Outgoing::new(ToWorker::Cancel(cancel)));
    }
}

/// The wall time an `Instant` of the past corresponds to, for display.
pub(super) fn wall_of(then: Instant) -> UnixMillis {
    let ago = time::millis(Instant::now().saturating_duration_since(then));
    time::now_millis().saturating_sub(ago)
}
