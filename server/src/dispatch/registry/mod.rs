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
//!   written side by side, a later plan may already have taken that mark;
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

use std::{
    collections::{BTreeMap, HashSet, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use spool_proto::{
    time::{self, UnixMillis},
    v1::{self, ServerMessage, server_message},
};

use tokio::{
    sync::{Notify, OwnedSemaphorePermit, mpsc},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::timeouts::{Deadlines, TimedOut};
use crate::store::{Attempt, HeartbeatDetails, Key, Op, Payload, Transition};

/// Results a session may have in flight (being committed, or acked but not yet
/// sent): the bound on acks queued in a worker's outbound channel. Two batches
/// written at once carry up to a worker's rows claimed, nine times its slots on
/// PostgreSQL: the window covers that for up to 113 slots, so it does not throttle
/// the drain of a worker of common size.
pub const ACK_WINDOW: usize = 1024;

/// One message to a worker. An ack carries the session's ack-window permit, which is
/// released when the message leaves the channel for the wire.
pub struct Outgoing {
    pub message: Result<ServerMessage, Status>,
    pub permit: Option<OwnedSemaphorePermit>,
}

impl Outgoing {
    pub fn message(message: server_message::Message) -> Self {
        Self {
            message: Ok(ServerMessage {
                message: Some(message),
            }),
            permit: None,
        }
    }
}

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
    pub cancels: Vec<v1::CancelActivity>,
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
    Held(Arc<Attempt>, Option<Option<Payload>>),
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
pub type AttemptKey = (String, String, u32);

fn attempt_key(workflow_id: &str, activity_id: &str, attempt: u32) -> AttemptKey {
    (workflow_id.to_owned(), activity_id.to_owned(), attempt)
}

struct Inflight {
    attempt: Arc<Attempt>,
    /// The server ended the attempt and told the worker to stop.
    cancel_sent: bool,
    /// What it told the worker, to tell it again after a resume.
    cancel: Option<v1::CancelActivity>,
    /// When the attempt last reported progress (dispatch time at first).
    last_heartbeat: Instant,
    /// When its timeouts end this attempt.
    deadlines: Deadlines,
    /// The latest details the attempt reported, until they are known stored: they
    /// go with its result, written just before its ending, while a flush of them
    /// may still land after the ending, and be fenced out.
    details: Option<Option<Payload>>,
    /// `details` changed since the sweep last took them to store.
    unflushed: bool,
    /// The sweep took `details` to store, and its write has not been confirmed.
    flushing: bool,
    /// The attempt's span (see `claims::attempt_span`): entered for what is logged
    /// about it, closed when this entry goes.
    span: tracing::Span,
}

impl Inflight {
    /// An attempt dispatched at `now` (monotonic) and `now_wall`.
    fn new(attempt: Arc<Attempt>, now: Instant, now_wall: UnixMillis, span: tracing::Span) -> Self {
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
struct Ahead {
    /// Boxed: rows ahead are moved between queues, and back when a send fails.
    task: Box<v1::ActivityTask>,
    /// The task's payload bytes (input and heartbeat details): what it holds in
    /// memory while it waits.
    bytes: usize,
    attempt: Arc<Attempt>,
    span: tracing::Span,
    /// When the claim handed it over, on the monotonic clock: the wall time of
    /// its dispatch is the claim's plus what it waited, and it is released once it
    /// waited too long.
    claimed_at: Instant,
}

impl Ahead {
    fn new(row: crate::store::ActivityRow, worker_id: &str) -> Self {
        let attempt = Arc::new(Attempt::from_row(&row));
        let span = claims::attempt_span(&row, worker_id);
        let task = Box::new(crate::wire::task(row, &attempt));
        let bytes = [&task.input, &task.last_heartbeat_details]
            .into_iter()
            .flatten()
            .map(|p| p.data.len())
            .sum();
        Self {
            task,
            bytes,
            attempt,
            span,
            claimed_at: Instant::now(),
        }
    }

    fn is(&self, id: i64, attempt: u32) -> bool {
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
struct AheadQueue {
    rows: VecDeque<Ahead>,
    bytes: usize,
}

impl AheadQueue {
    fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether it holds its share of memory: no more rows should wait here.
    fn full(&self) -> bool {
        self.bytes >= MAX_AHEAD_BYTES
    }

    /// Whether one more row may wait here: the budget is not spent yet (so it
    /// is passed by one row at most, as [`Worker::wanted`] asks for no room
    /// ahead once it is).
    fn has_room(&self) -> bool {
        !self.full()
    }

    fn push_back(&mut self, row: Ahead) {
        self.bytes = self.bytes.saturating_add(row.bytes);
        self.rows.push_back(row);
    }

    fn push_front(&mut self, row: Ahead) {
        self.bytes = self.bytes.saturating_add(row.bytes);
        self.rows.push_front(row);
    }

    fn pop_front(&mut self) -> Option<Ahead> {
        let row = self.rows.pop_front()?;
        self.bytes = self.bytes.saturating_sub(row.bytes);
        Some(row)
    }

    fn iter(&self) -> impl Iterator<Item = &Ahead> {
        self.rows.iter()
    }

    fn retain(&mut self, mut keep: impl FnMut(&Ahead) -> bool) {
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

struct Worker {
    id: Arc<str>,
    group: GroupKey,
    identity: Arc<str>,
    max_concurrency: u32,
    /// Wall time, for display.
    connected_at: UnixMillis,
    last_seen: Instant,
    /// Attempts sent to the worker and not yet answered, by `(workflow_id,
    /// activity_id, attempt)`: the attempt is part of the key because a worker may
    /// still run attempt n (ended by the server, not yet answered) when attempt n+1
    /// of the same activity is handed to it.
    inflight: foldhash::HashMap<AttemptKey, Inflight>,
    /// Rows promised to claims the committer is running now.
    reserved: u32,
    /// Rows claimed ahead for it, in claim order (priority first): sent as its
    /// slots free.
    ahead: AheadQueue,
    /// How many rows it should have claimed ahead: about what its slots free while
    /// a claim commits (see [`Worker::plan_ahead`]).
    ahead_target: u32,
    /// Results it answered since claims were last planned.
    answered: u32,
    /// Everything sent to the worker, in order. The session owns the receiver;
    /// closed means the session is ending.
    outbound: mpsc::Sender<Outgoing>,
    /// Cancelled by a sweep that found the worker silent: its session ends.
    evict: CancellationToken,
    /// Set while the session waits on the server rather than reading (see
    /// [`Registry::pause_silence`]): the worker's silence is not counted then.
    silence_paused: u32,
    /// A sweep found it silent. It is evicted only if the next sweep still does:
    /// messages that arrived while the server itself did not run (its process
    /// descheduled, its runtime busy) are read in between, and the sweep's timer
    /// may well fire before they are.
    silent_once: bool,
    /// The worker said Goodbye: no more claims are planned for it.
    leaving: bool,
    /// What resumes its session after a drop.
    ticket: Option<Ticket>,
    /// Its stream dropped; the session may be resumed until then. No claims are
    /// planned for it meanwhile, its attempts keep their slots and leases.
    detached_until: Option<Instant>,
    /// Attempts it said it still had when it resumed, which had ended while it was
    /// away (perhaps by its own result, whose ack was lost with the old stream):
    /// their results, sent again, are checked against the store rather than
    /// refused out of hand. Of what its latest resuming `Hello` listed, at most
    /// what it could still have to answer.
    ended_away: foldhash::HashSet<AttemptKey>,
}

impl Worker {
    /// A worker heard from now, holding nothing.
    fn new(
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

    fn running(&self) -> u32 {
        u32::try_from(self.inflight.len()).unwrap_or(u32::MAX)
    }

    /// Slots neither running nor reserved nor filled by rows ahead.
    fn free_slots(&self) -> u32 {
        self.max_concurrency
            .saturating_sub(self.reserved)
            .saturating_sub(self.running())
            .saturating_sub(u32::try_from(self.ahead.len()).unwrap_or(u32::MAX))
    }

    /// Rows a claim should bring it now: its free slots, plus room ahead while
    /// its rows ahead hold less than [`MAX_AHEAD_BYTES`].
    fn wanted(&self) -> u32 {
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
    fn plan_ahead(&mut self, writers: u32) {
        let answered = std::mem::take(&mut self.answered);
        let rounds = 2 * writers * writers;
        self.ahead_target = answered
            .saturating_mul(rounds)
            .max(self.ahead_target / 2)
            .min(self.max_concurrency.saturating_mul(rounds));
    }

    /// Whether tasks may be sent to it: not leaving, evicted or detached.
    fn takes_tasks(&self) -> bool {
        !self.leaving && !self.evict.is_cancelled() && self.detached_until.is_none()
    }

    /// Sends a row to the worker as an attempt it now runs. On a closed (or full)
    /// channel the row comes back.
    fn deliver(&mut self, ahead: Ahead) -> Result<(), Ahead> {
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
        permit.send(Outgoing::message(server_message::Message::Task(*task)));
        let now = Instant::now();
        // The attempt's wall time runs from its dispatch, on the store's clock: the
        // claim's time plus what the row waited here.
        let waited = i64::try_from(now.saturating_duration_since(claimed_at).as_millis())
            .unwrap_or(i64::MAX);
        let now_wall = attempt.started_at.saturating_add(waited);
        span.in_scope(|| tracing::debug!(waited_ms = waited, "dispatched"));
        self.inflight.insert(
            attempt_key(
                &attempt.key.workflow_id,
                &attempt.key.activity_id,
                attempt.attempt,
            ),
            Inflight::new(attempt, now, now_wall, span),
        );
        Ok(())
    }

    /// Sends rows claimed ahead into its free slots.
    fn fill(&mut self, paused: bool) {
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
    /// The drain's message, once a drain began: sent to every worker then, and to
    /// any that registers later.
    drain: Option<server_message::Message>,
    /// Rows claimed ahead that will not be sent: for the committer to release.
    released: Vec<Arc<Attempt>>,
}

impl Inner {
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

    /// Adds a worker; returns its id and the receiving end of its outbound channel,
    /// which starts with `welcome(worker_id)`, ahead of any task.
    pub fn register(
        &self,
        reg: Registration,
        now: UnixMillis,
        welcome: impl FnOnce(&str) -> server_message::Message,
    ) -> (
        Arc<str>,
        mpsc::Sender<Outgoing>,
        mpsc::Receiver<Outgoing>,
        CancellationToken,
    ) {
        let id: Arc<str> = uuid::Uuid::now_v7().to_string().into();
        let max = reg.max_concurrency.max(1);
        let capacity = 2 * max as usize + ACK_WINDOW + 8;
        let (tx, rx) = mpsc::channel(capacity);
        // The channel is new and empty: this cannot fail.
        let _ = tx.try_send(Outgoing::message(welcome(&id)));
        let evict = CancellationToken::new();
        let group: GroupKey = (reg.namespace.clone(), reg.activity_types.clone());
        let mut inner = self.lock();
        // A worker registering after a drain began is told at once, under the same
        // lock that `begin_drain` broadcasts under, so none is missed.
        if let Some(drain) = &inner.drain {
            let _ = tx.try_send(Outgoing::message(drain.clone()));
        }
        inner
            .groups
            .entry(group.clone())
            .or_default()
            .workers
            .push(id.clone());
        // A new worker may be able to take rows that were waiting for one.
        if let Some(g) = inner.groups.get_mut(&group) {
            g.refresh();
        }
        let worker = Worker::new(id.clone(), group, reg, now, tx.clone(), evict.clone());
        inner.workers.insert(id.clone(), worker);
        drop(inner);
        self.wake.notify_one();
        (id, tx, rx, evict)
    }

    /// Removes a worker; returns the attempts it still ran that the server had not
    /// already ended, for the caller to fail or release.
    pub fn unregister(&self, worker_id: &str) -> Vec<Arc<Attempt>> {
        self.unregister_if(worker_id, |_| true).unwrap_or_default()
    }

    /// [`Registry::unregister`] by the session writing to `tx`, only while that
    /// session still owns the worker: checked under the same lock, since a resume
    /// may hand the worker to a new stream at any moment. `None` if it does not.
    pub fn unregister_owned(
        &self,
        worker_id: &str,
        tx: &mpsc::Sender<Outgoing>,
    ) -> Option<Vec<Arc<Attempt>>> {
        self.unregister_if(worker_id, |w| w.outbound.same_channel(tx))
    }

    /// [`Registry::unregister_owned`] for a session that is lost: its attempts
    /// come back to be ended only where still this node's, since the worker may
    /// have resumed its session on another node, which took the rows over.
    pub fn unregister_lost_owned(
        &self,
        worker_id: &str,
        tx: &mpsc::Sender<Outgoing>,
    ) -> Option<Vec<Arc<Attempt>>> {
        self.unregister_owned(worker_id, tx)
            .map(|attempts| self.lost(attempts))
    }

    /// Removes the worker if `still` holds of it, under the lock that checks it.
    fn unregister_if(
        &self,
        worker_id: &str,
        still: impl FnOnce(&Worker) -> bool,
    ) -> Option<Vec<Arc<Attempt>>> {
        let mut inner = self.lock();
        if !inner.workers.get(worker_id).is_some_and(still) {
            return None;
        }
        let (worker, releasing) = inner.remove_worker(worker_id, |_| false)?;
        drop(inner);
        if releasing {
            self.wake.notify_one();
        }
        self.answered.notify_waiters();
        Some(
            worker
                .inflight
                .into_values()
                .filter(|i| !i.cancel_sent)
                .map(|i| i.attempt)
                .collect(),
        )
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

    /// Sends a resumed worker the task of an attempt it lacked, read again from
    /// the store, only while the attempt is still in flight for it and not
    /// stopped by the server (a task sent after its cancel would run, unasked;
    /// one stopped is forgotten, freeing its slot), and only on the stream `tx`
    /// of the resume that found it lacking (a later resume sends what it lacks
    /// itself).
    pub fn send_lacked(
        &self,
        worker_id: &str,
        tx: &mpsc::Sender<Outgoing>,
        attempt: &Attempt,
        task: v1::ActivityTask,
    ) {
        let inner = self.lock();
        let Some(worker) = inner
            .workers
            .get(worker_id)
            .filter(|w| w.outbound.same_channel(tx))
        else {
            return;
        };
        let key = attempt_key(
            &attempt.key.workflow_id,
            &attempt.key.activity_id,
            attempt.attempt,
        );
        let stopped = match worker.inflight.get(&key) {
            Some(inflight) if !inflight.cancel_sent => {
                let _ = worker
                    .outbound
                    .try_send(Outgoing::message(server_message::Message::Task(task)));
                return;
            }
            Some(_) => true,
            None => false,
        };
        drop(inner);
        // Stopped while it was read: the worker, never having had it, will not
        // answer its cancel either.
        if stopped {
            self.forget_unsent(worker_id, attempt);
        }
    }

    /// A resumed worker lacked this attempt, and it is not sent again: its row
    /// ended meanwhile. The worker never had it, so it will never answer it, nor
    /// a cancel for it: the slot is freed here.
    pub fn forget_unsent(&self, worker_id: &str, attempt: &Attempt) {
        let mut inner = self.lock();
        let paused = inner.paused;
        let Some(worker) = inner.workers.get_mut(worker_id) else {
            return;
        };
        let key = attempt_key(
            &attempt.key.workflow_id,
            &attempt.key.activity_id,
            attempt.attempt,
        );
        if worker.inflight.remove(&key).is_none() {
            return;
        }
        worker.fill(paused);
        drop(inner);
        self.wake.notify_one();
        // The attempt no longer counts as running: a drain may be waiting on that.
        self.answered.notify_waiters();
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
                inflight.stop(&worker.outbound, v1::CancelKind::EndedElsewhere, reason);
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
                inflight.stop(&worker.outbound, v1::CancelKind::Drain, reason);
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
    /// any that registers from now on, is sent `drain`.
    pub fn begin_drain(&self, drain: server_message::Message) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.paused = true;
        for worker in inner.workers.values_mut() {
            let _ = worker.outbound.try_send(Outgoing::message(drain.clone()));
            // Rows claimed ahead go back uncounted: nothing more is sent.
            let ahead = std::mem::take(&mut worker.ahead);
            for row in ahead {
                row.span
                    .in_scope(|| tracing::debug!("claimed ahead, released by the drain"));
                inner.released.push(row.attempt);
            }
        }
        let mut inner = guard;
        inner.drain = Some(drain);
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

    /// Whether the session writing to `tx` still owns the worker (a resume hands
    /// it to a new stream).
    pub fn owns(&self, worker_id: &str, tx: &mpsc::Sender<Outgoing>) -> bool {
        self.lock()
            .workers
            .get(worker_id)
            .is_some_and(|w| w.outbound.same_channel(tx))
    }

    /// The stream of the session writing to `tx` dropped: keep the worker, its
    /// attempts and their slots for `grace`, for the worker to resume. False (and
    /// nothing kept) when the session cannot be resumed, or need not be: no grace,
    /// no ticket, no attempt held, the worker was evicted, or another stream owns
    /// it already. A worker that said Goodbye is kept too: cut off while it
    /// finishes, it resumes to report what it ran.
    pub fn detach(&self, worker_id: &str, tx: &mpsc::Sender<Outgoing>, grace: Duration) -> bool {
        let mut inner = self.lock();
        let Some(w) = inner.workers.get_mut(worker_id) else {
            return false;
        };
        // Holding nothing, there is nothing to keep: the worker may simply start a
        // new session.
        if grace.is_zero()
            || w.ticket.is_none()
            || w.inflight.is_empty()
            || w.evict.is_cancelled()
            || !w.outbound.same_channel(tx)
        {
            return false;
        }
        w.detached_until = Some(Instant::now() + grace);
        true
    }

    /// Hands the session of `worker_id` to a new stream, if `secret` is its ticket,
    /// presented by the token that opened it, with the same registration. The
    /// stream that held it (if its drop went unnoticed) is told to end; the ticket
    /// becomes `next`. `held` are the attempts the worker says it still has.
    pub fn resume_session(
        &self,
        worker_id: &str,
        secret: &str,
        reg: &Registration,
        held: &HashSet<AttemptKey>,
        welcome: impl FnOnce(&str) -> server_message::Message,
    ) -> Result<Resumption, ResumeRefused> {
        let mut inner = self.lock();
        let drain = inner.drain.clone();
        let paused = inner.paused;
        let Some(worker) = inner.workers.get_mut(worker_id) else {
            return Err(ResumeRefused::Unknown);
        };
        // A leaving session resumes leaving: it is planned no claim, and its
        // worker, which says Goodbye again on the new stream, hears Drain again.
        if worker.evict.is_cancelled() {
            return Err(ResumeRefused::Unknown);
        }
        let (Some(ticket), Some(next)) = (&worker.ticket, &reg.ticket) else {
            return Err(ResumeRefused::Ticket);
        };
        if !ticket.admits(secret, &next.caller) {
            return Err(ResumeRefused::Ticket);
        }
        if worker.group.0 != reg.namespace
            || worker.group.1 != reg.activity_types
            || worker.max_concurrency != reg.max_concurrency.max(1)
        {
            return Err(ResumeRefused::Changed);
        }
        let capacity = 2 * worker.max_concurrency as usize + ACK_WINDOW + 8;
        let (tx, rx) = mpsc::channel(capacity);
        // The channel is new and empty: this cannot fail.
        let _ = tx.try_send(Outgoing::message(welcome(worker_id)));
        if let Some(drain) = drain {
            let _ = tx.try_send(Outgoing::message(drain));
        }
        // The old stream, if it still reads, ends now; it no longer owns the worker.
        worker.evict.cancel();
        let evict = CancellationToken::new();
        worker.evict = evict.clone();
        worker.outbound = tx.clone();
        worker.ticket = reg.ticket.clone();
        worker.detached_until = None;
        worker.last_seen = Instant::now();
        worker.identity = reg.identity.as_str().into();
        let (resend, cancels, reattached) = reconcile(worker, held);
        // What it lacks is sent first (by the session, in `resend`), then what was
        // claimed ahead for it fills the slots left.
        worker.fill(paused);
        drop(inner);
        self.wake.notify_one();
        self.answered.notify_waiters();
        Ok(Resumption {
            tx,
            rx,
            evict,
            resend,
            cancels,
            reattached,
        })
    }

    /// Whether this worker's session can be resumed (it has a ticket).
    pub fn resumable(&self, worker_id: &str) -> bool {
        self.lock()
            .workers
            .get(worker_id)
            .is_some_and(|w| w.ticket.is_some())
    }

    /// Whether a worker of this id is registered here (live, detached or ending).
    pub fn knows(&self, worker_id: &str) -> bool {
        self.lock().workers.contains_key(worker_id)
    }

    /// This node's name.
    pub fn node(&self) -> &Arc<str> {
        &self.node
    }

    /// Registers a session another node held, resumed here: `rows` are its RUNNING
    /// rows, which the store made this node's. As a local resume, the worker is told
    /// again what it lacks (`held`: what it says it has). What this node still
    /// kept of the session (it held it before) is stale and replaced, under the
    /// same lock: its rows claimed ahead go back, but for those among `rows`,
    /// which are this session's now (given back apart, a release fenced to this
    /// node would pass and end an attempt the worker runs).
    pub fn adopt(
        &self,
        worker_id: &str,
        reg: Registration,
        rows: Vec<crate::store::ActivityRow>,
        held: &HashSet<AttemptKey>,
        now_wall: UnixMillis,
        welcome: impl FnOnce(&str) -> server_message::Message,
    ) -> Resumption {
        let id: Arc<str> = worker_id.into();
        let adopted: foldhash::HashSet<(i64, u32)> =
            rows.iter().map(|row| (row.id, row.attempt)).collect();
        let max = reg.max_concurrency.max(1);
        let capacity = 2 * max as usize + ACK_WINDOW + 8;
        let (tx, rx) = mpsc::channel(capacity);
        // The channel is new and empty: this cannot fail.
        let _ = tx.try_send(Outgoing::message(welcome(worker_id)));
        let evict = CancellationToken::new();
        let group: GroupKey = (reg.namespace.clone(), reg.activity_types.clone());
        let now = Instant::now();
        let mut inflight = foldhash::HashMap::default();
        // What the worker runs first; then rows it lacks, up to its slots (to send
        // again). The rest were claimed ahead on the node it left and never sent:
        // they go back, uncounted, for any worker (the rows read for a takeover
        // carry no payloads to send them with).
        let (has, lacks): (Vec<_>, Vec<_>) = rows.into_iter().partition(|row| {
            held.contains(&attempt_key(
                &row.key.workflow_id,
                &row.key.activity_id,
                row.attempt,
            ))
        });
        let mut unsent = Vec::new();
        for row in has.into_iter().chain(lacks) {
            let attempt = Arc::new(Attempt::from_row(&row));
            if inflight.len() >= max as usize {
                unsent.push(attempt);
                continue;
            }
            let span = claims::attempt_span(&row, &id);
            inflight.insert(
                attempt_key(&row.key.workflow_id, &row.key.activity_id, row.attempt),
                Inflight::new(attempt, now, now_wall, span),
            );
        }
        let mut worker = Worker::new(
            id.clone(),
            group.clone(),
            reg,
            now_wall,
            tx.clone(),
            evict.clone(),
        );
        worker.inflight = inflight;
        let (resend, cancels, reattached) = reconcile(&mut worker, held);
        let mut inner = self.lock();
        inner.remove_worker(worker_id, |a| adopted.contains(&(a.id, a.attempt)));
        inner.released.extend(unsent);
        if let Some(drain) = &inner.drain {
            let _ = tx.try_send(Outgoing::message(drain.clone()));
        }
        let g = inner.groups.entry(group).or_default();
        g.workers.push(id.clone());
        g.refresh();
        inner.workers.insert(id, worker);
        drop(inner);
        self.wake.notify_one();
        self.answered.notify_waiters();
        Resumption {
            tx,
            rx,
            evict,
            resend,
            cancels,
            reattached,
        }
    }

    /// The worker takes no more tasks (it said Goodbye).
    pub fn leave(&self, worker_id: &str) {
        if let Some(w) = self.lock().workers.get_mut(worker_id) {
            w.leaving = true;
        }
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
        let key = attempt_key(workflow_id, activity_id, attempt);
        let Some(inflight) = worker.inflight.remove(&key) else {
            return if worker.ended_away.remove(&key) {
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
        let Some(inflight) =
            worker
                .inflight
                .get_mut(&attempt_key(&key.workflow_id, &key.activity_id, attempt))
        else {
            return;
        };
        if inflight.cancel_sent {
            return;
        }
        inflight.stop(&worker.outbound, v1::CancelKind::Requested, reason);
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
            .map(|attempt| Op::Finish {
                attempt: self.fenced(&attempt),
                transition: Transition::Release,
                lease_expired_by: None,
            })
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

    /// Used and free slots of each worker group: `(namespace, types joined by '+',
    /// used, free)`.
    pub fn slots(&self) -> Vec<(String, String, u64, u64)> {
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
                (ns.to_string(), group.join("+"), used, free)
            })
            .collect()
    }

    /// Connected workers, optionally of one namespace.
    pub fn workers(&self, namespace: Option<&str>) -> Vec<v1::WorkerInfo> {
        let inner = self.lock();
        let mut out: Vec<v1::WorkerInfo> = inner
            .workers
            .values()
            .filter(|w| namespace.is_none_or(|ns| *w.group.0 == *ns))
            .map(|w| v1::WorkerInfo {
                worker_id: w.id.to_string(),
                identity: w.identity.to_string(),
                namespace: w.group.0.to_string(),
                activity_types: w.group.1.iter().map(|t| t.to_string()).collect(),
                max_concurrency: w.max_concurrency,
                in_flight: u32::try_from(w.inflight.len()).unwrap_or(u32::MAX),
                connected_at: Some(time::to_proto(w.connected_at)),
                last_seen_at: Some(time::to_proto(wall_of(w.last_seen))),
                node: self.node.to_string(),
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

impl Inflight {
    /// The server ends this attempt: its worker is told to stop, once, and why. Full
    /// cannot happen (one cancel per held attempt is budgeted); closed means the
    /// session is ending and will not count the attempt anyway.
    fn stop(&mut self, outbound: &mpsc::Sender<Outgoing>, kind: v1::CancelKind, reason: &str) {
        self.cancel_sent = true;
        self.span.in_scope(|| {
            tracing::info!(
                kind = kind.as_str_name(),
                reason,
                "attempt ended by the server"
            )
        });
        let cancel = v1::CancelActivity {
            workflow_id: self.attempt.key.workflow_id.clone(),
            activity_id: self.attempt.key.activity_id.clone(),
            attempt: self.attempt.attempt,
            reason: reason.to_owned(),
            kind: kind as i32,
        };
        self.cancel = Some(cancel.clone());
        let _ = outbound.try_send(Outgoing::message(server_message::Message::Cancel(cancel)));
    }
}

/// What a worker resuming with `held` must be told: the tasks of attempts the
/// session holds that it lacks (to send again), cancels for attempts it has that
/// the server ended, and how many it still runs. Attempts the server ended that the
/// worker no longer has are forgotten (nothing would ever free their slots).
fn reconcile(
    worker: &mut Worker,
    held: &HashSet<AttemptKey>,
) -> (Vec<Arc<Attempt>>, Vec<v1::CancelActivity>, usize) {
    let mut resend = Vec::new();
    let mut cancels = Vec::new();
    let mut reattached = 0;
    let mut forgotten = Vec::new();
    // Only what this resume lists: a worker that resumes again lists again what it
    // still has to send.
    worker.ended_away.clear();
    for (key, inflight) in &worker.inflight {
        let has = held.contains(key);
        match (&inflight.cancel, has) {
            (Some(cancel), true) => cancels.push(cancel.clone()),
            // Ended by the server, and the worker has nothing to answer with:
            // its slot would never be freed.
            (Some(_), false) => forgotten.push(key.clone()),
            (None, true) => reattached += 1,
            (None, false) => resend.push(inflight.attempt.clone()),
        }
    }
    for key in forgotten {
        worker.inflight.remove(&key);
    }
    // What a worker can still have to answer: its running attempts, the results
    // they came to while it was away, and those it sent whose acks it never saw.
    let answerable = 2 * worker.max_concurrency as usize + ACK_WINDOW;
    for key in held {
        if !worker.inflight.contains_key(key) {
            if worker.ended_away.len() < answerable {
                worker.ended_away.insert(key.clone());
            }
            cancels.push(v1::CancelActivity {
                workflow_id: key.0.clone(),
                activity_id: key.1.clone(),
                attempt: key.2,
                reason: "the attempt ended while the worker was disconnected".to_owned(),
                kind: v1::CancelKind::EndedElsewhere as i32,
            });
        }
    }
    (resend, cancels, reattached)
}

/// The wall time an `Instant` of the past corresponds to, for display.
fn wall_of(then: Instant) -> UnixMillis {
    let ago = i64::try_from(Instant::now().saturating_duration_since(then).as_millis())
        .unwrap_or(i64::MAX);
    time::now_millis().saturating_sub(ago)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::{ActivityRow, Op, Transition};

    fn registration(max_concurrency: u32) -> Registration {
        Registration {
            namespace: "default".into(),
            identity: "test".into(),
            activity_types: vec!["t".into()],
            max_concurrency,
            ticket: None,
        }
    }

    fn welcome(id: &str) -> server_message::Message {
        server_message::Message::Welcome(v1::Welcome {
            worker_id: id.to_owned(),
            ..Default::default()
        })
    }

    fn kinds(rx: &mut mpsc::Receiver<Outgoing>) -> Vec<&'static str> {
        let mut kinds = Vec::new();
        while let Ok(out) = rx.try_recv() {
            kinds.push(match out.message {
                Ok(ServerMessage {
                    message: Some(server_message::Message::Welcome(_)),
                }) => "welcome",
                Ok(ServerMessage {
                    message: Some(server_message::Message::Drain(_)),
                }) => "drain",
                Ok(ServerMessage {
                    message: Some(server_message::Message::Task(_)),
                }) => "task",
                _ => "other",
            });
        }
        kinds
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_session_is_resumed_only_with_its_ticket_and_only_once() {
        let registry = Registry::default();
        let with_ticket = |caller: &str| Registration {
            ticket: Some(Ticket::new(caller.into())),
            ..registration(2)
        };
        let first = with_ticket("tokens[0]");
        let secret = first
            .ticket
            .as_ref()
            .map(|t| t.secret.clone())
            .unwrap_or_default();
        let (id, tx, _rx, _) = registry.register(first, 0, welcome);
        let grace = Duration::from_secs(5);
        assert!(
            !registry.detach(&id, &tx, grace),
            "nothing held, nothing kept"
        );
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        let row = crate::store::running_row_for_tests(1, "a", &id);
        assert!(registry.assign(&claim, vec![row]).is_empty());
        assert!(registry.detach(&id, &tx, grace));
        registry.mark_all_due();
        assert!(
            registry.plan_claims(1, &[]).is_empty(),
            "no claims while detached"
        );
        let held = HashSet::new();
        let refused = |caller: &str, secret: &str, reg: Registration| {
            registry
                .resume_session(
                    &id,
                    secret,
                    &Registration {
                        ticket: Some(Ticket {
                            secret: "next".into(),
                            caller: caller.into(),
                        }),
                        ..reg
                    },
                    &held,
                    welcome,
                )
                .err()
        };
        assert_eq!(
            refused("tokens[0]", "forged", registration(2)),
            Some(ResumeRefused::Ticket)
        );
        assert_eq!(
            refused("tokens[1]", &secret, registration(2)),
            Some(ResumeRefused::Ticket),
            "bound to the token that opened it"
        );
        assert_eq!(
            refused("tokens[0]", &secret, registration(3)),
            Some(ResumeRefused::Changed)
        );
        let again = with_ticket("tokens[0]");
        let resumed = registry.resume_session(&id, &secret, &again, &held, welcome);
        assert!(
            resumed
                .as_ref()
                .is_ok_and(|r| r.resend.len() == 1 && r.reattached == 0),
            "the right ticket, once; the worker lacks attempt a: sent again"
        );
        assert_eq!(
            refused("tokens[0]", &secret, registration(2)),
            Some(ResumeRefused::Ticket),
            "the ticket is single-use"
        );
        assert!(!registry.owns(&id, &tx), "the old stream lost the session");
        assert!(
            registry.unregister_lost_owned(&id, &tx).is_none() && registry.knows(&id),
            "the old stream's end, however late, leaves the resumed session alone"
        );
        // Dropped again and never resumed: the sweep loses it after the grace.
        let new_tx = resumed.map(|r| r.tx).ok();
        assert!(new_tx.is_some_and(|tx| registry.detach(&id, &tx, grace)));
        let sweep = registry.sweep(
            Instant::now() + grace,
            Duration::from_secs(3600),
            Duration::MAX,
        );
        assert_eq!(
            sweep
                .abandoned
                .iter()
                .map(|(_, a)| a.len())
                .collect::<Vec<_>>(),
            [1],
            "lost with its attempt"
        );
        assert_eq!(registry.worker_count(), 0);
    }

    #[test]
    fn a_worker_registering_after_a_drain_began_is_told_at_once() {
        let registry = Registry::default();
        let (_, _tx, mut before, _) = registry.register(registration(1), 0, welcome);
        let drain = server_message::Message::Drain(v1::Drain { deadline: None });
        registry.begin_drain(drain);
        let (_, _tx2, mut after, _) = registry.register(registration(1), 0, welcome);
        assert_eq!(kinds(&mut before), ["welcome", "drain"]);
        assert_eq!(kinds(&mut after), ["welcome", "drain"]);
        registry.mark_all_due();
        assert!(
            registry.plan_claims(1, &[]).is_empty(),
            "a drain plans no claims"
        );
    }

    #[test]
    fn evicted_and_leaving_workers_are_planned_no_claims() {
        let registry = Registry::default();
        let (silent, _tx, _rx, evict) = registry.register(registration(4), 0, welcome);
        let (leaving, _tx2, _rx2, _) = registry.register(registration(4), 1_000, welcome);
        let (live, _tx3, _rx3, _) = registry.register(registration(4), 1_000, welcome);
        let later = Instant::now() + Duration::from_secs(1);
        registry.touch(&leaving, later);
        registry.touch(&live, later);
        // Found silent by two sweeps in a row.
        let sweep = registry.sweep(later, Duration::from_millis(500), Duration::MAX);
        assert!(sweep.lost_workers.is_empty());
        let sweep = registry.sweep(later, Duration::from_millis(500), Duration::MAX);
        assert_eq!(sweep.lost_workers, vec![silent.clone()]);
        assert!(evict.is_cancelled());
        registry.leave(&leaving);
        registry.mark_all_due();
        let claims = registry.plan_claims(1, &[]);
        let for_whom: Vec<_> = claims.iter().map(|c| c.worker_id.clone()).collect();
        assert_eq!(for_whom, vec![live]);
    }

    #[test]
    fn silence_is_not_counted_while_the_session_waits_on_the_server() {
        let registry = Registry::default();
        let (id, _tx, _rx, evict) = registry.register(registration(1), 0, welcome);
        let silence = Duration::from_secs(1);
        {
            let _paused = registry.pause_silence(&id);
            let sweep = registry.sweep(
                Instant::now() + Duration::from_secs(10),
                silence,
                Duration::MAX,
            );
            assert!(sweep.lost_workers.is_empty());
            assert!(!evict.is_cancelled());
        }
        // Resuming counts as being heard from.
        assert!(
            registry
                .sweep(Instant::now(), silence, Duration::MAX)
                .lost_workers
                .is_empty()
        );
        let later = Instant::now() + Duration::from_secs(10);
        registry.sweep(later, silence, Duration::MAX);
        assert!(
            !registry
                .sweep(later, silence, Duration::MAX)
                .lost_workers
                .is_empty()
        );
    }

    /// A worker is lost only when two sweeps in a row find it silent: a message
    /// read in between (one that waited while the server did not run) keeps it.
    #[test]
    fn a_worker_found_silent_once_is_kept_when_heard_before_the_next_sweep() {
        let registry = Registry::default();
        let (id, _tx, _rx, evict) = registry.register(registration(1), 0, welcome);
        let silence = Duration::from_secs(1);
        let at = |secs: u64| Instant::now() + Duration::from_secs(secs);
        assert!(
            registry
                .sweep(at(2), silence, Duration::MAX)
                .lost_workers
                .is_empty()
        );
        registry.touch(&id, at(2));
        assert!(
            registry
                .sweep(at(2), silence, Duration::MAX)
                .lost_workers
                .is_empty()
        );
        assert!(!evict.is_cancelled(), "heard from in between");
        // Silent again: a first finding is needed again, then it is lost.
        assert!(
            registry
                .sweep(at(4), silence, Duration::MAX)
                .lost_workers
                .is_empty()
        );
        assert_eq!(
            registry.sweep(at(4), silence, Duration::MAX).lost_workers,
            [id]
        );
        assert!(evict.is_cancelled());
    }

    /// A session taken over from another node: what the worker holds is
    /// reattached, a row it lacks within its slots is sent again, and rows beyond
    /// its slots (claimed ahead on the node it left, never sent) go back for the
    /// committer to release, uncounted; none waits here without its payload.
    #[test]
    fn a_taken_over_session_releases_the_rows_claimed_ahead_elsewhere() {
        let registry = Registry::default();
        let id = "taken-over";
        let rows = ["a", "b", "c", "d"]
            .iter()
            .enumerate()
            .map(|(i, name)| row(i as i64 + 1, name, id))
            .collect();
        // It holds a; b was sent and lost on the way; c and d were ahead.
        let held: HashSet<AttemptKey> = [attempt_key("wf", "a", 1)].into();
        let resumed = registry.adopt(id, registration(2), rows, &held, 0, welcome);
        assert_eq!(resumed.reattached, 1);
        assert_eq!(
            resumed
                .resend
                .iter()
                .map(|a| a.key.activity_id.as_str())
                .collect::<Vec<_>>(),
            ["b"]
        );
        assert_eq!(registry.claimed_ahead(None), 0);
        let released: Vec<(i64, u32, Option<Arc<str>>)> = take_released(&registry)
            .iter()
            .map(|a| (a.id, a.attempt, a.owner_node.clone()))
            .collect();
        let here = Some(registry.node.clone());
        assert_eq!(
            released,
            [(3, 1, here.clone()), (4, 1, here)],
            "released only while still this node's"
        );
        assert!(registry.holds(1, 1) && registry.holds(2, 1));
        assert!(!registry.holds(3, 1) && !registry.holds(4, 1));
    }

    /// A row taken back by a node that held the session before: the rows it kept
    /// claimed ahead for the worker are stale, and one of them the worker now
    /// runs (another node sent it). Adopting the session must not release that
    /// one: the release would be fenced to this node, which the row is again, and
    /// would send it to run a second time.
    #[test]
    fn a_session_taken_back_keeps_the_rows_the_worker_runs() {
        let registry = Registry::new("n");
        let (id, _tx, _rx, _) = registry.register(registration(1), 0, welcome);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        // One row is sent, the other waits ahead.
        let ops = registry.assign(&claim, vec![row(1, "a", &id), row(2, "b", &id)]);
        assert!(ops.is_empty());
        assert_eq!(registry.claimed_ahead(None), 1);
        // The worker ran both elsewhere, and comes back holding both.
        let rows = vec![row(1, "a", &id), row(2, "b", &id)];
        let held: HashSet<AttemptKey> =
            [attempt_key("wf", "a", 1), attempt_key("wf", "b", 1)].into();
        let resumed = registry.adopt(&id, registration(2), rows, &held, 0, welcome);
        assert_eq!(resumed.reattached, 2);
        assert!(take_released(&registry).is_empty(), "nothing released");
        assert!(registry.holds(1, 1) && registry.holds(2, 1));
        assert_eq!(registry.claimed_ahead(None), 0);
        // A stale row the session does not hold any more still goes back.
        let (other, _tx, _rx, _) = registry.register(registration(1), 0, welcome);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        let ops = registry.assign(&claim, vec![row(3, "c", &other), row(4, "d", &other)]);
        assert!(ops.is_empty());
        let rows = vec![row(3, "c", &other)];
        let held: HashSet<AttemptKey> = [attempt_key("wf", "c", 1)].into();
        registry.adopt(&other, registration(1), rows, &held, 0, welcome);
        let released: Vec<(i64, Option<Arc<str>>)> = take_released(&registry)
            .iter()
            .map(|a| (a.id, a.owner_node.clone()))
            .collect();
        assert_eq!(released, [(4, Some("n".into()))]);
    }

    /// Rows a claim took for a worker that left, or whose stream closed, while the
    /// claim was written go back fenced to this node: the worker may have resumed
    /// on another node, which took them over and may be running them.
    #[test]
    fn rows_claimed_for_a_worker_that_cannot_take_them_are_released_only_while_still_this_nodes() {
        let here: Option<Arc<str>> = Some("n".into());
        let released_by = |ops: Vec<Op>| -> Vec<(i64, Option<Arc<str>>)> {
            ops.into_iter()
                .map(|op| match op {
                    Op::Finish {
                        attempt,
                        transition: Transition::Release,
                        ..
                    } => (attempt.id, attempt.owner_node.clone()),
                    other => panic!("not a release: {other:?}"),
                })
                .collect()
        };
        // The stream closed while the claim was written.
        let registry = Registry::new("n");
        let (id, _tx, rx, _) = registry.register(registration(2), 0, welcome);
        drop(rx);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        let ops = registry.assign(&claim, vec![row(1, "a", &id)]);
        assert_eq!(released_by(ops), [(1, here.clone())]);
        // The worker was evicted (silent too long) while the claim was written.
        let registry = Registry::new("n");
        let (id, _tx, _rx, evict) = registry.register(registration(2), 0, welcome);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        evict.cancel();
        let ops = registry.assign(&claim, vec![row(3, "c", &id)]);
        assert_eq!(released_by(ops), [(3, here.clone())]);
        assert!(
            !registry.holds(3, 1),
            "not in flight for the evicted worker"
        );
        // The worker is gone from the registry.
        let (id, _tx, _rx, _) = registry.register(registration(2), 0, welcome);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        let _ = registry.unregister(&id);
        let ops = registry.assign(&claim, vec![row(2, "b", &id)]);
        assert_eq!(released_by(ops), [(2, here)]);
    }

    /// The attempts the committer is handed to release; any other op fails the test.
    fn take_released(registry: &Registry) -> Vec<Arc<Attempt>> {
        registry
            .take_released()
            .into_iter()
            .map(|op| match op {
                Op::Finish {
                    attempt,
                    transition: Transition::Release,
                    ..
                } => attempt,
                other => panic!("not a release: {other:?}"),
            })
            .collect()
    }

    /// The limits of the claims a plan would make now (their reservations undone).
    fn planned_limits(registry: &Registry) -> Vec<u32> {
        registry.mark_all_due();
        let claims = registry.plan_claims(0, &[]);
        for c in &claims {
            registry.unreserve(c);
        }
        claims.iter().map(|c| c.limit).collect()
    }

    /// A claimed row of activity `activity_id` for worker `worker_id`.
    fn row(id: i64, activity_id: &str, worker_id: &str) -> ActivityRow {
        crate::store::running_row_for_tests(id, activity_id, worker_id)
    }

    /// Whether the committer was woken since this was last asked (a wake-up is
    /// kept until taken).
    fn was_woken(registry: &Registry) -> bool {
        let woken = registry.woken();
        let mut woken = std::pin::pin!(woken);
        woken.as_mut().enable()
    }

    /// Rows claimed ahead hold their inputs in memory: past
    /// [`MAX_AHEAD_BYTES`] a worker keeps no more of them (what a claim brought
    /// beyond goes back uncounted), and plans ask for its free slots only.
    #[test]
    fn rows_ahead_hold_a_bounded_amount_of_memory() {
        let registry = Registry::new("n");
        let (id, _tx, _rx, _) = registry.register(registration(1), 0, welcome);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        let big = |n: i64| {
            let mut row = row(n, &format!("r{n}"), &id);
            row.input.data = vec![0; 4 * 1024 * 1024];
            row
        };
        let released = registry.assign(&claim, (1..=7).map(big).collect());
        // One runs; four (16 MiB) wait; two go back.
        assert_eq!(released.len(), 2);
        assert!(released.iter().all(|op| matches!(
            op,
            Op::Finish {
                transition: Transition::Release,
                ..
            }
        )));
        assert_eq!(registry.claimed_ahead(None), 4);
        let lock = registry.lock();
        let Some(worker) = lock.workers.get(&*id) else {
            panic!("registered")
        };
        assert_eq!(worker.wanted(), 0, "no room ahead, no free slot");
    }

    /// With two batches written at once, a claim takes half of a worker's room, so
    /// the next batch can claim beside it; a short claim planned before a row came
    /// due does not mark the group exhausted once a later plan has taken that mark.
    #[test]
    fn overlapping_claims_share_the_room_and_keep_due_marks() {
        let registry = Registry::new("n").with_writers(2);
        let (_id, _tx, _rx, _) = registry.register(registration(4), 0, welcome);
        registry.mark_all_due();
        let first = registry.plan_claims(0, &[]).remove(0);
        assert_eq!(first.limit, 2, "half of the room");
        // A row comes due while the first claim is written; the next plan takes
        // the mark and claims from what is left.
        registry.mark_due("default", "t");
        let second = registry.plan_claims(0, &[]).remove(0);
        assert_eq!(second.limit, 1, "half of what the first left");
        // The first finds nothing: it was planned before the row came due. The
        // loop is woken to plan again: the second plan had less room than the
        // first claim gives back now.
        let _ = was_woken(&registry);
        assert!(registry.assign(&first, Vec::new()).is_empty());
        assert!(was_woken(&registry), "woken to plan again");
        let third = registry.plan_claims(0, &[]);
        assert_eq!(
            third.iter().map(|c| c.limit).collect::<Vec<_>>(),
            [2],
            "not exhausted: the second claim may still find the row"
        );
        for c in &third {
            registry.unreserve(c);
        }
        // The second, planned after the mark, finds nothing either: exhausted.
        assert!(registry.assign(&second, Vec::new()).is_empty());
        assert!(registry.plan_claims(0, &[]).is_empty(), "exhausted");
    }

    /// With a claim of the group in flight, another is planned beside it only if
    /// rows may be left for it: the group's last claim took all it asked for, or
    /// a row came due since the last plan. A claim that lands full wakes the loop.
    #[test]
    fn a_claim_goes_beside_one_in_flight_only_when_rows_may_be_left() {
        let registry = Registry::new("n").with_writers(2);
        let (id, _tx, _rx, _) = registry.register(registration(8), 0, welcome);
        registry.mark_all_due();
        let first = registry.plan_claims(0, &[]).remove(0);
        assert_eq!(first.limit, 4, "half of the room");
        // Nothing says rows are left beyond what the first may take.
        assert!(registry.plan_claims(0, &[&first]).is_empty(), "none beside");
        // A row comes due: a claim goes beside.
        registry.mark_due("default", "t");
        let second = registry.plan_claims(0, &[&first]).remove(0);
        assert_eq!(second.limit, 2);
        // The first lands full: rows may be left, so the loop plans again, and
        // a claim goes beside the second while it is written.
        let _ = was_woken(&registry);
        let rows: Vec<_> = (1..=4).map(|i| row(i, &format!("a{i}"), &id)).collect();
        assert!(registry.assign(&first, rows).is_empty());
        assert!(was_woken(&registry), "woken to plan again");
        let third = registry.plan_claims(0, &[&second]).remove(0);
        assert_eq!(third.limit, 1);
        // The second lands short (after the mark it was planned at): the group is
        // exhausted, and nothing goes beside the third.
        assert!(registry.assign(&second, Vec::new()).is_empty());
        assert!(registry.plan_claims(0, &[&third]).is_empty(), "exhausted");
    }

    /// Slots: a claim reserves what is free; assigned attempts hold their slots
    /// until answered, also after the server ended them; a short claim marks the
    /// group exhausted until a row comes due; rows for a worker that is gone come
    /// back as releases.
    #[test]
    fn slots_are_reserved_held_and_freed_exactly() {
        let registry = Registry::default();
        let (id, _tx, _rx, _) = registry.register(registration(3), 0, welcome);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        assert_eq!(claim.limit, 3);
        assert!(
            registry.plan_claims(0, &[]).is_empty(),
            "reserved slots are not planned twice"
        );
        // Two of three found: the group is exhausted until something comes due.
        let released = registry.assign(&claim, vec![row(1, "a", &id), row(2, "b", &id)]);
        assert!(released.is_empty());
        assert!(registry.plan_claims(0, &[]).is_empty(), "exhausted");
        assert_eq!(planned_limits(&registry), [1], "two held, one free");
        // The server ends attempt a (a cancel): its slot stays taken until answered.
        registry.cancel_running(
            &id,
            &Key {
                namespace: "default".into(),
                workflow_id: "wf".into(),
                activity_id: "a".into(),
            },
            1,
            "stop",
        );
        assert_eq!(planned_limits(&registry), [1]);
        assert_eq!(registry.running_count(), 1, "a no longer counts as running");
        assert!(matches!(registry.answer(&id, "wf", "a", 1), Answer::Ended));
        // Two free, and room ahead for two more: it answered one since the last
        // plan, so a slot may free again while the claim commits.
        assert_eq!(planned_limits(&registry), [2 + 2]);
        assert!(matches!(
            registry.answer(&id, "wf", "b", 1),
            Answer::Held(..)
        ));
        assert!(matches!(
            registry.answer(&id, "wf", "b", 1),
            Answer::Unknown
        ));
        assert_eq!(planned_limits(&registry), [3 + 2]);
        // The worker leaves mid-claim: what the claim took is released.
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        registry.unregister(&id);
        let released = registry.assign(&claim, vec![row(3, "c", &id)]);
        assert!(matches!(
            released.as_slice(),
            [Op::Finish {
                transition: Transition::Release,
                ..
            }]
        ));
    }

    /// A worker with every slot busy whose results come in fast gets rows
    /// claimed ahead; a result hands it the next one at once, with no commit in
    /// between. Rows ahead never push it past its slots.
    #[test]
    fn a_freed_slot_takes_a_row_claimed_ahead_at_once() {
        let registry = Registry::default();
        let (id, _tx, mut rx, _) = registry.register(registration(2), 0, welcome);
        let plan = |registry: &Registry| {
            registry.mark_all_due();
            registry.plan_claims(0, &[])
        };
        let claim = plan(&registry).remove(0);
        assert_eq!(claim.limit, 2, "nothing answered yet: no room ahead");
        assert!(
            registry
                .assign(&claim, vec![row(1, "a", &id), row(2, "b", &id)])
                .is_empty()
        );
        assert_eq!(kinds(&mut rx), ["welcome", "task", "task"]);
        // One result; the next plan makes room ahead for two.
        assert!(matches!(
            registry.answer(&id, "wf", "a", 1),
            Answer::Held(..)
        ));
        let claim = plan(&registry).remove(0);
        assert_eq!(claim.limit, 1 + 2, "one free slot and two ahead");
        let rows = vec![row(3, "c", &id), row(4, "d", &id), row(5, "e", &id)];
        assert!(registry.assign(&claim, rows).is_empty());
        assert_eq!(kinds(&mut rx), ["task"], "c fills the free slot");
        assert_eq!(registry.claimed_ahead(None), 2);
        assert_eq!(registry.running_count(), 2);
        assert!(registry.holds(4, 1) && registry.holds(5, 1));
        // b answers: d is sent before anything is written.
        assert!(matches!(
            registry.answer(&id, "wf", "b", 1),
            Answer::Held(..)
        ));
        assert_eq!(kinds(&mut rx), ["task"]);
        assert_eq!(registry.claimed_ahead(None), 1);
        assert_eq!(registry.running_count(), 2, "never past its slots");
        assert!(matches!(
            registry.answer(&id, "wf", "d", 1),
            Answer::Held(..)
        ));
        assert_eq!(kinds(&mut rx), ["task"], "e, the last one ahead");
        assert_eq!(registry.claimed_ahead(None), 0);
        assert!(registry.take_released().is_empty(), "nothing given back");
    }

    /// However fast a worker answers, the room ahead is at most twice its slots a
    /// round (with one batch written at a time, as here).
    #[test]
    fn rows_ahead_are_at_most_twice_the_slots() {
        let registry = Registry::default();
        let (id, _tx, _rx, _) = registry.register(registration(2), 0, welcome);
        let plan = |registry: &Registry| {
            registry.mark_all_due();
            registry.plan_claims(0, &[]).remove(0)
        };
        let claim = plan(&registry);
        assert!(
            registry
                .assign(&claim, vec![row(1, "a0", &id), row(2, "a1", &id)])
                .is_empty()
        );
        let answer = |i: i64| {
            assert!(matches!(
                registry.answer(&id, "wf", &format!("a{i}"), 1),
                Answer::Held(..)
            ));
        };
        answer(0);
        answer(1);
        let claim = plan(&registry);
        assert_eq!(claim.limit, 2 + 4, "two free, and twice the two answered");
        let rows = (2..8).map(|i| row(i + 1, &format!("a{i}"), &id)).collect();
        assert!(registry.assign(&claim, rows).is_empty());
        assert_eq!(registry.claimed_ahead(None), 4);
        // Six answered in one round: eight ahead would be asked for, four are.
        (2..8).for_each(answer);
        assert_eq!(registry.claimed_ahead(None), 0);
        assert_eq!(planned_limits(&registry), [2 + 4]);
    }

    /// A worker whose attempts are long answers nothing between plans, and the
    /// room ahead shrinks to nothing: it holds no rows another worker could run.
    #[test]
    fn a_worker_of_long_attempts_claims_nothing_ahead() {
        let registry = Registry::default();
        let (id, _tx, _rx, _) = registry.register(registration(4), 0, welcome);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        let rows = (1..=4).map(|i| row(i, &format!("a{i}"), &id)).collect();
        assert!(registry.assign(&claim, rows).is_empty());
        for i in 1..=2 {
            assert!(matches!(
                registry.answer(&id, "wf", &format!("a{i}"), 1),
                Answer::Held(..)
            ));
        }
        assert_eq!(planned_limits(&registry), [2 + 4], "two free, four ahead");
        assert_eq!(planned_limits(&registry), [2 + 2], "quiet: halved");
        assert_eq!(planned_limits(&registry), [2 + 1]);
        assert_eq!(planned_limits(&registry), [2], "none ahead");
    }

    /// Rows claimed ahead that will not be sent go back for the committer to
    /// release, uncounted: when the worker leaves, when a drain begins, when they
    /// waited too long. One cancelled meanwhile is dropped, not released.
    #[test]
    fn rows_claimed_ahead_go_back_when_they_cannot_be_sent() {
        let registry = Registry::default();
        let released = |registry: &Registry| -> Vec<i64> {
            take_released(registry).iter().map(|a| a.id).collect()
        };
        // Both slots busy, two rows ahead.
        let busy_with_two_ahead = |first: i64| {
            let (id, tx, rx, _) = registry.register(registration(2), 0, welcome);
            registry.mark_all_due();
            let claim = registry.plan_claims(0, &[]).remove(0);
            let busy = vec![
                row(first, &format!("busy{first}"), &id),
                row(first + 100, "long", &id),
            ];
            assert!(registry.assign(&claim, busy).is_empty());
            assert!(matches!(
                registry.answer(&id, "wf", &format!("busy{first}"), 1),
                Answer::Held(..)
            ));
            registry.mark_all_due();
            let claim = registry.plan_claims(0, &[]).remove(0);
            assert_eq!(claim.limit, 3);
            let rows = (1..=3)
                .map(|i| row(first + i, &format!("r{}", first + i), &id))
                .collect();
            assert!(registry.assign(&claim, rows).is_empty());
            assert_eq!(registry.claimed_ahead(None), 2);
            (id, tx, rx)
        };

        let (id, _tx, _rx) = busy_with_two_ahead(10);
        registry.cancel_running(
            &id,
            &Key {
                namespace: "default".into(),
                workflow_id: "wf".into(),
                activity_id: "r12".into(),
            },
            1,
            "stop",
        );
        assert_eq!(
            registry.claimed_ahead(None),
            1,
            "the cancelled row is dropped"
        );
        registry.unregister(&id);
        assert_eq!(released(&registry), [13], "the worker left");

        let (id, _tx, _rx) = busy_with_two_ahead(20);
        let sweep = registry.sweep(Instant::now(), Duration::MAX, Duration::from_secs(3600));
        assert!(
            sweep.running.contains(&(22, 1)) && sweep.running.contains(&(23, 1)),
            "their leases are renewed while they wait"
        );
        assert!(released(&registry).is_empty());
        registry.sweep(
            Instant::now() + Duration::from_secs(3600),
            Duration::MAX,
            Duration::from_secs(3600),
        );
        assert_eq!(released(&registry), [22, 23], "they waited too long");
        registry.unregister(&id);
        assert!(released(&registry).is_empty());

        let (id, _tx, mut rx) = busy_with_two_ahead(30);
        kinds(&mut rx);
        registry.begin_drain(server_message::Message::Drain(v1::Drain::default()));
        assert_eq!(released(&registry), [32, 33], "a drain");
        assert!(matches!(
            registry.answer(&id, "wf", "r31", 1),
            Answer::Held(..)
        ));
        assert_eq!(kinds(&mut rx), ["drain"], "nothing is sent once draining");
    }

    /// A row claimed ahead that waits before it is sent: its start-to-close
    /// timeout runs from its dispatch, not from its claim.
    #[tokio::test(start_paused = true)]
    async fn timeouts_of_a_row_claimed_ahead_count_from_its_dispatch() {
        let registry = Registry::default();
        let (id, _tx, mut rx, _) = registry.register(registration(1), 0, welcome);
        let plan = |registry: &Registry| {
            registry.mark_all_due();
            registry.plan_claims(0, &[]).remove(0)
        };
        let claim = plan(&registry);
        assert!(registry.assign(&claim, vec![row(1, "a", &id)]).is_empty());
        assert!(matches!(
            registry.answer(&id, "wf", "a", 1),
            Answer::Held(..)
        ));
        let claim = plan(&registry);
        assert_eq!(claim.limit, 1 + 2, "a free slot, and two ahead");
        let mut busy = row(2, "busy", &id);
        busy.timeouts.start_to_close_ms = None;
        let mut ahead = row(3, "ahead", &id);
        ahead.timeouts.start_to_close_ms = Some(2_000);
        assert!(registry.assign(&claim, vec![busy, ahead]).is_empty());
        assert_eq!(registry.claimed_ahead(None), 1);
        kinds(&mut rx);
        // It waits 5 s ahead (past its start-to-close of 2 s), then is sent.
        tokio::time::advance(Duration::from_secs(5)).await;
        let timed_out = |at: Duration| -> Vec<(String, &'static str)> {
            registry
                .sweep(Instant::now() + at, Duration::MAX, Duration::MAX)
                .timed_out
                .into_iter()
                .map(|t| (t.attempt.key.activity_id.clone(), t.error_type))
                .collect()
        };
        assert!(
            timed_out(Duration::ZERO).is_empty(),
            "not sent: no clock yet"
        );
        assert!(matches!(
            registry.answer(&id, "wf", "busy", 1),
            Answer::Held(..)
        ));
        assert_eq!(kinds(&mut rx), ["task"], "sent at 5 s");
        assert!(
            timed_out(Duration::from_millis(1_900)).is_empty(),
            "1.9 s after its dispatch: still in time"
        );
        assert_eq!(
            timed_out(Duration::from_millis(2_100)),
            [("ahead".to_owned(), "StartToCloseTimeout")],
            "2 s after its dispatch"
        );
    }

    /// What this node ends on its own (a timeout, a drain's leftovers) is fenced
    /// to rows still its own: a worker that resumed its session on another node
    /// runs its attempt there.
    #[tokio::test(start_paused = true)]
    async fn timeouts_and_drain_leftovers_are_fenced_to_this_node() {
        let registry = Registry::default();
        let (id, _tx, _rx, _evict) = registry.register(registration(2), 0, welcome);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        let mut beats = row(1, "beats", &id);
        beats.timeouts.heartbeat_ms = Some(1_000);
        assert!(
            registry
                .assign(&claim, vec![beats, row(2, "left", &id)])
                .is_empty()
        );
        let this_node = Some(registry.node().clone());
        let sweep = registry.sweep(
            Instant::now() + Duration::from_secs(2),
            Duration::from_secs(10),
            Duration::MAX,
        );
        assert_eq!(
            sweep
                .timed_out
                .iter()
                .map(|t| t.attempt.owner_node.clone())
                .collect::<Vec<_>>(),
            std::slice::from_ref(&this_node)
        );
        let left = registry.end_all("stopping", false).release;
        assert_eq!(
            left.iter()
                .map(|a| a.owner_node.clone())
                .collect::<Vec<_>>(),
            [this_node]
        );
    }

    /// Every timeout kind and the eviction, walked on paused time: each fires at
    /// its instant, once, and a heartbeat moves its deadline; no real sleep.
    #[tokio::test(start_paused = true)]
    async fn timeouts_and_eviction_walk_on_paused_time() {
        let registry = Registry::default();
        let (id, _tx, _rx, evict) = registry.register(registration(3), 0, welcome);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        let mut beats = row(1, "beats", &id);
        beats.timeouts.heartbeat_ms = Some(2_000);
        let mut slow = row(2, "slow", &id);
        slow.timeouts.start_to_close_ms = Some(5_000);
        // Started at wall time 0, due by 3,000: three seconds from dispatch.
        let mut late = row(3, "late", &id);
        late.expires_at = Some(3_000);
        assert!(registry.assign(&claim, vec![beats, slow, late]).is_empty());
        let silence = Duration::from_secs(10);
        let timed_out = |at: Duration| -> Vec<(String, &'static str, bool)> {
            registry
                .sweep(Instant::now() + at, silence, Duration::MAX)
                .timed_out
                .into_iter()
                .map(|t| (t.attempt.key.activity_id.clone(), t.error_type, t.final_))
                .collect()
        };
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert!(registry.heartbeat(&id, "wf", "beats", 1, None, Instant::now()));
        // Now at 1.5 s; offsets below are from here.
        assert!(
            timed_out(Duration::from_millis(1_000)).is_empty(),
            "2.5 s: none"
        );
        assert_eq!(
            timed_out(Duration::from_millis(1_600)),
            [("late".to_owned(), "ScheduleToCloseTimeout", true)],
            "3.1 s: schedule-to-close, for good"
        );
        assert_eq!(
            timed_out(Duration::from_millis(2_100)),
            [("beats".to_owned(), "HeartbeatTimeout", false)],
            "3.6 s: two seconds after the last heartbeat"
        );
        assert_eq!(
            timed_out(Duration::from_millis(3_600)),
            [("slow".to_owned(), "StartToCloseTimeout", false)],
            "5.1 s: start-to-close"
        );
        assert!(
            timed_out(Duration::from_millis(4_000)).is_empty(),
            "each ends once"
        );
        assert_eq!(registry.running_count(), 0);
        // Last heard from at 1.5 s: silent from 11.5 s, and lost on the sweep
        // after the one that first finds it so.
        let lost = |at: Duration| {
            registry
                .sweep(Instant::now() + at, silence, Duration::MAX)
                .lost_workers
        };
        assert!(lost(Duration::from_millis(9_900)).is_empty());
        assert!(lost(Duration::from_millis(10_000)).is_empty());
        assert!(!evict.is_cancelled());
        assert_eq!(lost(Duration::from_millis(10_025)).len(), 1);
        assert!(evict.is_cancelled(), "the session is told to end");
    }

    /// A worker running attempt 1 of `a`, which reported `details` at `now`; its
    /// session may be resumed.
    struct Reported {
        registry: Registry,
        id: Arc<str>,
        details: Payload,
        now: Instant,
        channel: (mpsc::Sender<Outgoing>, mpsc::Receiver<Outgoing>),
    }

    fn reported_details() -> Reported {
        let registry = Registry::default();
        let resumable = Registration {
            ticket: Some(Ticket::new("tokens[0]".into())),
            ..registration(1)
        };
        let (id, tx, rx, _) = registry.register(resumable, 0, welcome);
        registry.mark_all_due();
        let claim = registry.plan_claims(60_000, &[]).remove(0);
        assert!(registry.assign(&claim, vec![row(7, "a", &id)]).is_empty());
        let details = Payload {
            content_type: String::new(),
            data: b"50%".to_vec(),
        };
        let now = Instant::now();
        assert!(registry.heartbeat(&id, "wf", "a", 1, Some(details.clone()), now));
        Reported {
            registry,
            id,
            details,
            now,
            channel: (tx, rx),
        }
    }

    /// A worker that does not resume within its grace: details whose last write
    /// failed are written by the tick that ends its attempts, ahead of the endings,
    /// so the next attempt starts from them.
    #[test]
    fn details_of_an_abandoned_session_are_written_before_its_attempts_end() {
        let Reported {
            registry,
            id,
            details,
            now,
            channel,
        } = reported_details();
        let quiet = Duration::from_secs(60);
        let sweep = registry.sweep(now, quiet, Duration::MAX);
        registry.details_flushed(&sweep.flushed, false);
        assert!(registry.detach(&id, &channel.0, Duration::from_secs(1)));
        let sweep = registry.sweep(
            Instant::now() + Duration::from_secs(2),
            quiet,
            Duration::MAX,
        );
        assert_eq!(sweep.abandoned.len(), 1, "its grace ran out");
        let written: Vec<_> = sweep.heartbeats.iter().map(|h| h.details.clone()).collect();
        assert_eq!(written, [Some(details)]);
    }

    #[test]
    fn a_heartbeat_without_details_keeps_what_was_reported() {
        let Reported {
            registry,
            id,
            details,
            now,
            ..
        } = reported_details();
        let quiet = Duration::from_secs(60);
        assert!(registry.heartbeat(&id, "wf", "a", 1, None, now));
        let sweep = registry.sweep(now, quiet, Duration::MAX);
        assert_eq!(sweep.heartbeats.len(), 1);
        assert_eq!(sweep.heartbeats[0].details.as_ref(), Some(&details));
        // Another bare heartbeat: nothing new to write.
        assert!(registry.heartbeat(&id, "wf", "a", 1, None, now));
        assert!(
            registry
                .sweep(now, quiet, Duration::MAX)
                .heartbeats
                .is_empty()
        );
        // The result still carries them: the sweep's write of them may land after
        // the result's ending, which fences it out.
        assert_eq!(carried(&registry, &id), Some(Some(details)));
    }

    /// The details attempt 1 of `a` answers with.
    fn carried(registry: &Registry, id: &str) -> Option<Option<Payload>> {
        match registry.answer(id, "wf", "a", 1) {
            Answer::Held(_, carried) => carried,
            _ => panic!("the attempt is held"),
        }
    }

    /// An attempt that times out in the tick that takes its details: if that
    /// tick's write fails, the attempt is stopped, yet its details are taken again
    /// by the next tick (written before the attempt ends in the store, by the
    /// tick or by its lease's reclaim, so the next attempt starts from them).
    #[test]
    fn details_of_a_timed_out_attempt_are_taken_again_after_a_failed_write() {
        let registry = Registry::default();
        let (id, _tx, _rx, _) = registry.register(registration(1), 0, welcome);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        let mut slow = row(7, "a", &id);
        slow.timeouts.start_to_close_ms = Some(1_000);
        assert!(registry.assign(&claim, vec![slow]).is_empty());
        let details = Payload {
            content_type: String::new(),
            data: b"90%".to_vec(),
        };
        let now = Instant::now();
        assert!(registry.heartbeat(&id, "wf", "a", 1, Some(details.clone()), now));
        let quiet = Duration::from_secs(60);
        let sweep = registry.sweep(now + Duration::from_secs(2), quiet, Duration::MAX);
        assert_eq!(sweep.timed_out.len(), 1);
        assert_eq!(sweep.heartbeats.len(), 1, "written before the ending");
        registry.details_flushed(&sweep.flushed, false);
        let again = registry.sweep(now + Duration::from_secs(3), quiet, Duration::MAX);
        assert!(again.timed_out.is_empty(), "stopped once");
        let taken: Vec<_> = again.heartbeats.into_iter().map(|h| h.details).collect();
        assert_eq!(taken, [Some(details)], "a failed write is taken again");
        registry.details_flushed(&again.flushed, true);
        assert!(
            registry
                .sweep(now + Duration::from_secs(4), quiet, Duration::MAX)
                .heartbeats
                .is_empty()
        );
    }

    /// Details whose flush failed are taken again by the next sweep; once known
    /// stored, a result no longer carries them (nor does the registry keep them).
    #[test]
    fn details_are_carried_until_known_stored() {
        let Reported {
            registry, id, now, ..
        } = reported_details();
        let quiet = Duration::from_secs(60);
        let sweep = registry.sweep(now, quiet, Duration::MAX);
        assert_eq!(sweep.flushed.len(), 1);
        registry.details_flushed(&sweep.flushed, false);
        let again = registry.sweep(now, quiet, Duration::MAX);
        assert_eq!(again.heartbeats.len(), 1, "a failed flush is taken again");
        registry.details_flushed(&again.flushed, true);
        assert!(
            registry
                .sweep(now, quiet, Duration::MAX)
                .heartbeats
                .is_empty()
        );
        assert_eq!(carried(&registry, &id), None, "known stored");
    }

    /// What the server logs about an attempt is inside that attempt's span: its
    /// identity, its worker, and the trace id of its `traceparent` header.
    #[test]
    fn an_attempts_events_carry_its_span_and_trace() {
        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        // Global, not scoped: a scoped subscriber races other tests' threads over
        // the callsites' cached interest. Other tests' events land here too; the
        // one looked for is told apart by its trace id.
        tracing::subscriber::set_global_default(subscriber)
            .unwrap_or_else(|e| panic!("only this test sets the global subscriber: {e}"));
        {
            let registry = Registry::default();
            let (id, _tx, _rx, _) = registry.register(registration(1), 0, welcome);
            registry.mark_all_due();
            let claim = registry.plan_claims(0, &[]).remove(0);
            let mut row = row(1, "a", &id);
            row.headers.insert(
                "traceparent".into(),
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            );
            assert!(registry.assign(&claim, vec![row]).is_empty());
            let key = Key {
                namespace: "default".into(),
                workflow_id: "wf".into(),
                activity_id: "a".into(),
            };
            registry.cancel_running(&id, &key, 1, "no longer needed");
        }
        let log = String::from_utf8_lossy(&captured.0.lock().unwrap_or_else(|e| e.into_inner()))
            .into_owned();
        let ended = log
            .lines()
            .find(|l| {
                l.contains("attempt ended by the server")
                    && l.contains("trace_id=0af7651916cd43dd8448eb211c80319c")
            })
            .unwrap_or_else(|| panic!("no event: {log}"));
        for field in [
            "workflow_id=wf",
            "activity_id=a",
            "attempt=1",
            "trace_id=0af7651916cd43dd8448eb211c80319c",
            "kind=\"CANCEL_KIND_REQUESTED\"",
        ] {
            assert!(ended.contains(field), "{field} missing from {ended}");
        }
    }
}
