//! Connected workers and their slots; the authority for what each worker holds.
//!
//! Workers with the same namespace and the same set of activity types form a
//! *group*; a claim is planned per worker with free slots, so a row is only ever
//! claimed for a worker that can take it, and the claimed row goes to that worker.
//!
//! Invariants:
//! - a worker never runs more attempts than its `max_concurrency`; rows claimed for
//!   it (sent, reserved by claims under way, or held ahead) are at most `1 + 2 ×
//!   writers²` times that (nine times with the two batches in flight of both
//!   stores; see `Worker::plan_ahead`):
//!   `inflight <= max_concurrency` and `inflight + ahead + reserved <= max_concurrency
//!   + ahead target`;
//! - a short claim marks its group exhausted only if nothing refreshed the group
//!   (a row came due, a worker joined) since the claim was planned: with batches
//!   written side by side, a later plan may already have taken that mark; and
//!   only if it took no row of a concurrency key (a key's share of a claim may
//!   exceed its due rows, leaving other keys' rows for the next claim);
//! - rows *claimed ahead* (committed RUNNING for a worker whose slots are all busy,
//!   not yet sent) are sent the moment one of its slots frees, without waiting for a
//!   commit; they are sent only while the worker takes tasks and the node is not
//!   draining, their leases are renewed as running attempts' are, and whenever they
//!   cannot be sent (the worker leaves or is lost, a drain, they waited too long)
//!   they are released uncounted through the committer ([`Registry::take_released`]);
//! - an attempt stays in `inflight` until the worker answers for it, even after the
//!   server ended it (cancel, timeout): its slot stays taken while the worker may
//!   still be running it (attempts are keyed with their number, so a later attempt
//!   of the same activity on the same worker takes a slot of its own);
//! - a task that cannot be put on the worker's channel is released, never held;
//! - liveness runs on the monotonic clock ([`Instant`]): when a worker was last
//!   heard from, when an attempt last reported, and when its timeouts fall (see
//!   `timeouts`), so a step of the wall clock neither evicts every worker nor fires
//!   (or stalls) timeouts;
//! - a worker's outbound channel never overflows: it holds at most
//!   `max_concurrency` tasks, one cancel per held attempt, the welcome, a drain,
//!   and [`ACK_WINDOW`] acks (each carries a permit of the session's ack window).

mod claims;
mod liveness;
mod sessions;
mod worker;

use spool_proto::attempt::Ids;
use worker::{Ahead, Inflight, Worker, wall_of};

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use spool_proto::time::UnixMillis;

use tokio::{
    sync::{Notify, mpsc},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use super::outbound::{Cancel, CancelKind, Outgoing, ToWorker};
use super::timeouts::TimedOut;
use crate::store::{Attempt, HeartbeatDetails, Key, Op, Payload, Transition};

/// Results a session may have in flight (being committed, or acked but not yet
/// sent): the bound on acks queued in a worker's outbound channel. Two batches
/// written at once carry up to a worker's rows claimed, nine times its slots on
/// PostgreSQL: the window covers that for up to 113 slots, so it does not throttle
/// the drain of a worker of common size.
pub const ACK_WINDOW: usize = 1024;

/// A worker's validated `Hello`.
#[derive(Debug, Clone)]
pub struct Registration {
    pub namespace: Arc<str>,
    pub identity: String,
    /// Sorted, without duplicates.
    pub activity_types: Vec<Arc<str>>,
    pub max_concurrency: u32,
    /// What resumes the session if its stream drops (`None`: it cannot be resumed).
    pub ticket: Option<Ticket>,
}

impl Registration {
    /// A worker of type "t" in the default namespace with `max_concurrency`
    /// slots, that cannot resume: for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(max_concurrency: u32) -> Self {
        Self {
            namespace: "default".into(),
            identity: "test".into(),
            activity_types: vec!["t".into()],
            max_concurrency,
            ticket: None,
        }
    }
}

/// A session's claim to its worker after a drop: a secret the worker was given,
/// valid once, and the token (by its name, never its secret) that opened the
/// session, which alone may resume it.
#[derive(Clone)]
pub struct Ticket {
    pub secret: String,
    pub caller: Arc<str>,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("caller", &self.caller)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// A fresh ticket for `caller`: 256 random bits, hex.
    pub fn new(caller: Arc<str>) -> Self {
        let bytes: [u8; 32] = rand::random();
        Self {
            secret: bytes.iter().map(|b| format!("{b:02x}")).collect(),
            caller,
        }
    }

    /// Whether `secret`, presented by `caller`, is this ticket; compared in
    /// constant time.
    fn admits(&self, secret: &str, caller: &str) -> bool {
        let (a, b) = (self.secret.as_bytes(), secret.as_bytes());
        let same =
            a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
        same && *self.caller == *caller
    }
}

/// Why a resume was refused; the worker starts a new session instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeRefused {
    /// No such session here: never was, its grace ran out, or it was evicted.
    Unknown,
    /// The secret is not the session's current one (forged, or used before), or
    /// another token presents it.
    Ticket,
    /// The Hello names another namespace, other types or other slots.
    Changed,
}

impl ResumeRefused {
    pub fn reason(self) -> &'static str {
        match self {
            ResumeRefused::Unknown => "unknown_session",
            ResumeRefused::Ticket => "bad_ticket",
            ResumeRefused::Changed => "registration_changed",
        }
    }

    pub fn explain(self) -> &'static str {
        match self {
            ResumeRefused::Unknown => {
                "no such session to resume here (its grace ran out, it was evicted, or it never existed)"
            }
            ResumeRefused::Ticket => "the resume token is not this session's current one",
            ResumeRefused::Changed => {
                "the Hello changed the namespace, the activity types or the slots of the session"
            }
        }
    }
}

/// A resumed session: its new stream, and what its worker must be told again.
pub struct Resumption {
    pub tx: mpsc::Sender<Outgoing>,
    pub rx: mpsc::Receiver<Outgoing>,
    pub evict: CancellationToken,
    /// Attempts the session holds whose task the worker does not have (lost on the
    /// way): to send again.
    pub resend: Vec<Arc<Attempt>>,
    /// Attempts the worker has that the server ended meanwhile: to tell it again.
    pub cancels: Vec<Cancel>,
    /// Attempts the worker still runs, now this stream's.
    pub reattached: usize,
}

/// Whether a worker's result answers an attempt it holds.
#[derive(Debug)]
pub enum Answer {
    /// The attempt is the worker's and still running: the result decides it. The
    /// latest heartbeat details it reported come along unless they are known
    /// stored, to be written with the result (again, if a flush took them already:
    /// that flush may land after the result's ending, and be fenced out).
    Held(Arc<Attempt>, Option<Payload>),
    /// The attempt was the worker's, but the server already ended it (cancel,
    /// timeout): the result only frees the slot.
    Ended,
    /// An attempt the worker said it still had when it resumed its session, which
    /// had ended while it was away: perhaps by this very result, sent again because
    /// its ack was lost with the old stream.
    EndedAway,
    /// Not an attempt this worker holds.
    Unknown,
}

type GroupKey = (Arc<str>, Vec<Arc<str>>);

/// An attempt as a worker names it: `(workflow_id, activity_id, attempt)`.
pub use spool_proto::attempt::AttemptKey;

/// What one liveness sweep found; the caller writes it.
#[derive(Debug, Default)]
pub struct Sweep {
    /// Workers silent too long; their sessions were told to end.
    pub lost_workers: Vec<Arc<str>>,
    /// Attempts ended by a timeout; their workers were sent `CancelActivity`.
    pub timed_out: Vec<TimedOut>,
    /// Heartbeat details to store; once written, or not, the caller says so
    /// ([`Registry::details_flushed`]) with `flushed`, the same attempts by worker.
    pub heartbeats: Vec<HeartbeatDetails>,
    pub flushed: Vec<(Arc<str>, AttemptKey)>,
    /// Attempts whose lease the caller should extend, `(row id, attempt)`: every
    /// attempt still running.
    pub running: Vec<(i64, u32)>,
    /// Workers whose stream dropped and that did not resume within the grace, with
    /// the attempts they held: lost, for the caller to write.
    pub abandoned: Vec<(Arc<str>, Vec<Arc<Attempt>>)>,
}

#[derive(Default)]
struct Group {
    workers: Vec<Arc<str>>,
    /// The last claim found fewer due rows than it asked for; no claim is planned
    /// until one of the group's types is marked due.
    exhausted: bool,
    /// Counts the times `exhausted` was cleared. A claim carries the count it was
    /// planned at: when batches overlap (PostgreSQL), a short claim planned before
    /// a row came due must not mark the group exhausted after that mark was taken.
    epoch: u64,
    /// Refreshed since the last plan.
    fresh: bool,
    /// The last claim of the group that landed took all it asked for, so rows
    /// may be left for another beside the next (see `Registry::plan_claims`).
    saturated: bool,
    /// A plan passed the group over while a claim of it was in flight: if that
    /// claim lands full, the loop plans again.
    held_back: bool,
}

impl Group {
    /// Something may have given the group due rows (or a worker to take them).
    fn refresh(&mut self) {
        self.exhausted = false;
        self.epoch += 1;
        self.fresh = true;
    }
}

/// A drain under way, and when what still runs should be done.
#[derive(Clone, Copy)]
struct Draining {
    deadline: Option<UnixMillis>,
}

#[derive(Default)]
struct Inner {
    workers: foldhash::HashMap<Arc<str>, Worker>,
    groups: BTreeMap<GroupKey, Group>,
    /// Types that may have due rows since the last plan.
    due: foldhash::HashSet<(Arc<str>, Arc<str>)>,
    all_due: bool,
    /// Turns the order in which a group's types are claimed.
    rotation: usize,
    /// Set by a drain: nothing more is dispatched.
    paused: bool,
    /// Set once a drain began: told to every worker then, and to any that
    /// registers later.
    drain: Option<Draining>,
    /// Rows claimed ahead that will not be sent: for the committer to release.
    released: Vec<Arc<Attempt>>,
}

impl Inner {
    /// Worker `worker_id`, if the session writing to `tx` still owns it (a
    /// resume hands it to a new stream).
    fn owned(&self, worker_id: &str, tx: &mpsc::Sender<Outgoing>) -> Option<&Worker> {
        self.workers
            .get(worker_id)
            .filter(|w| w.outbound.same_channel(tx))
    }

    /// Gives up rows claimed ahead: the committer releases them uncounted.
    fn release(&mut self, rows: impl IntoIterator<Item = Ahead>) {
        for row in rows {
            row.span
                .in_scope(|| tracing::debug!("claimed ahead, released unsent"));
            self.released.push(row.attempt);
        }
    }

    /// Takes worker `worker_id` out of the registry and its group, and gives up
    /// its rows claimed ahead but those `kept` holds (by row and attempt).
    /// Whether any row was given up comes back beside the worker.
    fn remove_worker(
        &mut self,
        worker_id: &str,
        kept: impl Fn(&Attempt) -> bool,
    ) -> Option<(Worker, bool)> {
        let mut worker = self.workers.remove(worker_id)?;
        if let Some(group) = self.groups.get_mut(&worker.group) {
            group.workers.retain(|w| **w != *worker_id);
            if group.workers.is_empty() {
                self.groups.remove(&worker.group);
            }
        }
        let ahead = std::mem::take(&mut worker.ahead);
        let before = self.released.len();
        self.release(ahead.into_iter().filter(|row| !kept(&row.attempt)));
        let releasing = self.released.len() > before;
        Some((worker, releasing))
    }
}

/// The slots of the workers serving one set of types in one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSlots {
    pub namespace: String,
    /// The types, joined by `+`.
    pub group: String,
    pub used: u64,
    pub free: u64,
}

/// What [`Registry::end_all`] did.
#[derive(Debug, Default)]
pub struct Ended {
    /// Attempts stopped, to be released (fenced to this node).
    pub release: Vec<Arc<Attempt>>,
    /// Attempts left running for their workers to resume on another node.
    pub handed_over: usize,
}

#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
    /// Wakes the committer when a claim may now succeed: a slot freed, a worker
    /// joined, a row came due.
    wake: Notify,
    /// Wakes a drain waiting for in-flight attempts to be answered.
    answered: Notify,
    /// Results taken from workers (their attempts answered) whose commit has not
    /// returned yet: a drain waits for these too, so what it reports completed is
    /// stored.
    committing: std::sync::atomic::AtomicUsize,
    /// Attempts ended by their worker's result (completed, retried, failed or
    /// snoozed), counted as the committer lands them: a drain reports how many
    /// of those it waited for ended so.
    results: std::sync::atomic::AtomicU64,
    /// Set when a stopping node hands its resumable sessions over
    /// ([`Registry::end_all`]): only then does a session ending on shutdown
    /// leave its attempts running for its worker to resume elsewhere.
    handing_over: std::sync::atomic::AtomicBool,
    /// This server's name (`--node-name`), recorded with each attempt it dispatches.
    node: Arc<str>,
    /// How many batches the store writes at once (`Store::writers`): each claim
    /// takes that share of a worker's room, so the next batch can claim too.
    writers: u32,
    /// The store writes its batches in turn and sends small ones, claims alone
    /// among them, only after the one in flight landed (`Store::beside_min_rows`):
    /// a claim planned with none of its group in flight then fills all the
    /// worker's free slots.
    in_turn: bool,
}

impl Registry {
    /// A registry of the node named `node`.
    pub fn new(node: &str) -> Self {
        Self {
            node: node.into(),
            writers: 1,
            ..Self::default()
        }
    }

    /// The registry of a node whose store writes `writers` batches at once.
    pub fn with_writers(mut self, writers: usize) -> Self {
        self.writers = u32::try_from(writers).unwrap_or(u32::MAX).max(1);
        self
    }

    /// The registry of a node whose store writes its batches in turn, small ones
    /// each after the one before landed (see [`Registry::plan_claims`]).
    pub fn in_turn(mut self, in_turn: bool) -> Self {
        self.in_turn = in_turn;
        self
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a way
        // worse than losing the process, so keep serving with what is there.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The committer parks here when it has nothing to write.
    pub fn woken(&self) -> tokio::sync::futures::Notified<'_> {
        self.wake.notified()
    }

    /// A lost session's attempts, to be ended only where still this node's.
    fn lost(&self, attempts: Vec<Arc<Attempt>>) -> Vec<Arc<Attempt>> {
        attempts.iter().map(|a| self.fenced(a)).collect()
    }

    /// `attempt`, to be ended only while its row is still this node's: a worker
    /// that resumed its session on another node took its rows over, and that node
    /// decides their fate.
    fn fenced(&self, attempt: &Attempt) -> Arc<Attempt> {
        Arc::new(Attempt {
            owner_node: Some(self.node.clone()),
            ..attempt.clone()
        })
    }

    /// True while a worker of this process holds this attempt of the row (runs it,
    /// or has it claimed ahead).
    pub fn holds(&self, id: i64, attempt: u32) -> bool {
        self.lock().workers.values().any(|w| {
            w.inflight
                .values()
                .any(|i| i.attempt.id == id && i.attempt.attempt == attempt && !i.cancel_sent)
                || w.ahead.iter().any(|a| a.is(id, attempt))
        })
    }

    /// Ends these attempts, `(row id, attempt)`, where a worker here still runs
    /// them: the store says another node ended them. Each worker is told to stop
    /// and keeps the slot until it answers.
    pub fn end_attempts(&self, attempts: &[(i64, u32)], reason: &str) {
        let ended: HashSet<&(i64, u32)> = attempts.iter().collect();
        let mut inner = self.lock();
        for worker in inner.workers.values_mut() {
            // Claimed ahead and ended meanwhile: nothing to send, nothing to write.
            worker
                .ahead
                .retain(|a| !ended.contains(&(a.attempt.id, a.attempt.attempt)));
            for inflight in worker.inflight.values_mut() {
                let attempt = (inflight.attempt.id, inflight.attempt.attempt);
                if inflight.cancel_sent || !ended.contains(&attempt) {
                    continue;
                }
                inflight.stop(&worker.outbound, CancelKind::EndedElsewhere, reason);
            }
        }
        drop(inner);
        self.answered.notify_waiters();
    }

    /// Attempts running now that the server has not ended.
    pub fn running_count(&self) -> usize {
        self.lock()
            .workers
            .values()
            .map(|w| w.inflight.values().filter(|i| !i.cancel_sent).count())
            .sum()
    }

    /// Attempts running, or answered with a result not yet committed: what a drain
    /// waits for.
    pub fn unsettled_count(&self) -> usize {
        self.running_count() + self.committing.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A result was taken for an attempt and goes to be committed; it counts as
    /// unsettled until the returned guard is dropped (with the commit's reply, or
    /// with a commit that will never run).
    pub fn commit_begins(self: &Arc<Self>) -> Committing {
        self.committing
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Committing(self.clone())
    }

    /// Completes at the next answer or disconnect; create before checking a count.
    pub fn answered(&self) -> tokio::sync::futures::Notified<'_> {
        self.answered.notified()
    }

    /// Ends every attempt still running (a drain's deadline passed): each worker is
    /// told to stop, and the attempts are returned for the caller to release. With
    /// `hand_over` (a node stopping, with other nodes that stay sharing its
    /// database), the attempts of sessions that can be resumed are left running
    /// instead: their workers resume on another node, which takes them over.
    pub fn end_all(&self, reason: &str, hand_over: bool) -> Ended {
        self.handing_over
            .store(hand_over, std::sync::atomic::Ordering::SeqCst);
        let mut ended = Ended::default();
        for worker in self.lock().workers.values_mut() {
            if hand_over && worker.ticket.is_some() {
                ended.handed_over += worker.inflight.values().filter(|i| !i.cancel_sent).count();
                continue;
            }
            for inflight in worker.inflight.values_mut() {
                if inflight.cancel_sent {
                    continue;
                }
                inflight.stop(&worker.outbound, CancelKind::Drain, reason);
                // Released only while still this node's row (see `fenced`).
                ended.release.push(self.fenced(&inflight.attempt));
            }
        }
        ended
    }

    /// Whether this node, stopping, hands its resumable sessions over.
    pub fn hands_over(&self) -> bool {
        self.handing_over.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// An attempt ended by its worker's result was written.
    pub fn result_committed(&self) {
        self.results
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many attempts ended by their worker's result were written so far.
    pub fn results_committed(&self) -> u64 {
        self.results.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A drain begins: no more claims are planned, and every worker, including
    /// any that registers from now on, is told to finish by `deadline`.
    pub fn begin_drain(&self, deadline: Option<UnixMillis>) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.paused = true;
        for worker in inner.workers.values_mut() {
            let _ = worker
                .outbound
                .try_send(Outgoing::new(ToWorker::Drain { deadline }));
            // Rows claimed ahead go back uncounted: nothing more is sent.
            let ahead = std::mem::take(&mut worker.ahead);
            for row in ahead {
                row.span
                    .in_scope(|| tracing::debug!("claimed ahead, released by the drain"));
                inner.released.push(row.attempt);
            }
        }
        let mut inner = guard;
        inner.drain = Some(Draining { deadline });
        drop(inner);
        self.wake.notify_one();
    }

    /// Stops planning claims (the first step of a drain, before the barrier that
    /// lets claims already planned land).
    pub fn pause(&self) {
        self.lock().paused = true;
        self.wake.notify_one();
    }

    /// Every group's last claim took all it asked for (see `Group::saturated`).
    #[cfg(test)]
    pub(crate) fn saturate(&self) {
        for group in self.lock().groups.values_mut() {
            group.saturated = true;
        }
    }

    /// A drain ends: claims are planned again, workers that register are no longer
    /// sent a drain, and every group may have due rows.
    pub fn resume(&self) {
        let mut inner = self.lock();
        inner.paused = false;
        inner.drain = None;
        drop(inner);
        self.mark_all_due();
    }

    /// Whether a drain stopped dispatch (and until a resume).
    pub fn is_draining(&self) -> bool {
        self.lock().paused
    }

    /// This node's name.
    pub fn node(&self) -> &Arc<str> {
        &self.node
    }

    /// The slots a worker was granted (0 if it is not registered).
    pub fn capacity(&self, worker_id: &str) -> usize {
        self.lock()
            .workers
            .get(worker_id)
            .map_or(0, |w| w.max_concurrency as usize)
    }

    /// Takes the attempt a worker's result answers, freeing its slot.
    pub fn answer(
        &self,
        worker_id: &str,
        workflow_id: &str,
        activity_id: &str,
        attempt: u32,
    ) -> Answer {
        let mut inner = self.lock();
        let Some(worker) = inner.workers.get_mut(worker_id) else {
            return Answer::Unknown;
        };
        let ids = Ids::new(workflow_id, activity_id, attempt);
        let Some(inflight) = worker.inflight.remove(ids.key()) else {
            return if worker.ended_away.remove(ids.key()) {
                Answer::EndedAway
            } else {
                Answer::Unknown
            };
        };
        worker.answered = worker.answered.saturating_add(1);
        // The freed slot takes a row claimed ahead at once: dispatch does not wait
        // for this result's commit.
        let paused = inner.paused;
        if let Some(worker) = inner.workers.get_mut(worker_id) {
            worker.fill(paused);
        }
        drop(inner);
        self.wake.notify_one();
        self.answered.notify_waiters();
        inflight.span.in_scope(|| {
            tracing::debug!(
                after_the_server_ended_it = inflight.cancel_sent,
                "the worker answered"
            )
        });
        if inflight.cancel_sent {
            Answer::Ended
        } else {
            Answer::Held(
                inflight.attempt,
                inflight
                    .details
                    .filter(|_| inflight.unflushed || inflight.flushing),
            )
        }
    }

    /// Tells the worker running attempt `attempt` of `key` to stop because a client
    /// cancelled it; its slot stays taken until it answers. Does nothing if no
    /// worker holds that attempt.
    pub fn cancel_running(&self, worker_id: &str, key: &Key, attempt: u32, reason: &str) {
        let mut inner = self.lock();
        let Some(worker) = inner.workers.get_mut(worker_id) else {
            return;
        };
        // Claimed ahead, never sent: it is simply dropped (the store has it
        // cancelled already).
        worker
            .ahead
            .retain(|a| !(a.attempt.key == *key && a.attempt.attempt == attempt));
        let Some(inflight) = worker
            .inflight
            .get_mut(Ids::new(&key.workflow_id, &key.activity_id, attempt).key())
        else {
            return;
        };
        if inflight.cancel_sent {
            return;
        }
        inflight.stop(&worker.outbound, CancelKind::Requested, reason);
        drop(inner);
        // The attempt no longer counts as running: a drain may be waiting on that.
        self.answered.notify_waiters();
    }

    /// Rows claimed ahead that will not be sent (their worker left or was lost, a
    /// drain began, they waited too long), as releases for the committer to write:
    /// back to SCHEDULED, uncounted.
    pub fn take_released(&self) -> Vec<Op> {
        let released = std::mem::take(&mut self.lock().released);
        released
            .into_iter()
            .map(|attempt| Op::finish(self.fenced(&attempt), Transition::Release))
            .collect()
    }

    /// Rows this node holds claimed ahead for its workers (of one namespace, or
    /// all), not yet sent to one: they are RUNNING in the store.
    pub fn claimed_ahead(&self, namespace: Option<&str>) -> usize {
        self.lock()
            .workers
            .values()
            .filter(|w| namespace.is_none_or(|ns| *w.group.0 == *ns))
            .map(|w| w.ahead.len())
            .sum()
    }

    /// Used and free slots of each worker group.
    pub fn slots(&self) -> Vec<GroupSlots> {
        let inner = self.lock();
        let mut by_group: BTreeMap<&GroupKey, (u64, u64)> = BTreeMap::new();
        for w in inner.workers.values() {
            let used = w.inflight.len() as u64;
            let slot = by_group.entry(&w.group).or_default();
            slot.0 += used;
            slot.1 += u64::from(w.max_concurrency).saturating_sub(used);
        }
        by_group
            .into_iter()
            .map(|((ns, types), (used, free))| {
                let group: Vec<&str> = types.iter().map(|t| &**t).collect();
                GroupSlots {
                    namespace: ns.to_string(),
                    group: group.join("+"),
                    used,
                    free,
                }
            })
            .collect()
    }

    /// Connected workers, optionally of one namespace, by id.
    pub fn workers(&self, namespace: Option<&str>) -> Vec<WorkerView> {
        let inner = self.lock();
        let mut out: Vec<WorkerView> = inner
            .workers
            .values()
            .filter(|w| namespace.is_none_or(|ns| *w.group.0 == *ns))
            .map(|w| WorkerView {
                worker_id: w.id.clone(),
                identity: w.identity.clone(),
                namespace: w.group.0.clone(),
                activity_types: w.group.1.clone(),
                max_concurrency: w.max_concurrency,
                in_flight: u32::try_from(w.inflight.len()).unwrap_or(u32::MAX),
                connected_at: w.connected_at,
                last_seen_at: wall_of(w.last_seen),
            })
            .collect();
        out.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
        out
    }

    /// Connected workers, in every namespace.
    pub fn worker_count(&self) -> usize {
        self.lock().workers.len()
    }

    pub fn connected(&self, namespace: &str) -> usize {
        self.lock()
            .workers
            .values()
            .filter(|w| *w.group.0 == *namespace)
            .count()
    }
}

/// A connected worker, as `ListWorkers` shows it.
#[derive(Debug, Clone)]
pub struct WorkerView {
    pub worker_id: Arc<str>,
    pub identity: Arc<str>,
    pub namespace: Arc<str>,
    pub activity_types: Vec<Arc<str>>,
    pub max_concurrency: u32,
    pub in_flight: u32,
    /// Wall times.
    pub connected_at: UnixMillis,
    pub last_seen_at: UnixMillis,
}

/// See [`Registry::commit_begins`].
pub struct Committing(Arc<Registry>);

impl Drop for Committing {
    fn drop(&mut self) {
        let _ = self.0.committing.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |n| n.checked_sub(1),
        );
        self.0.answered.notify_waiters();
    }
}

/// See [`Registry::pause_silence`].
pub struct SilencePaused<'a> {
    registry: &'a Registry,
    worker_id: &'a str,
}

impl Drop for SilencePaused<'_> {
    fn drop(&mut self) {
        if let Some(w) = self.registry.lock().workers.get_mut(self.worker_id) {
            w.silence_paused = w.silence_paused.saturating_sub(1);
            w.last_seen = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests;
