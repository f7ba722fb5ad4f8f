//! The single writer: group commit, and the claim-and-route loop that rides on it.
//! Other nodes (`peers`) hear of each batch's changes after it commits.
//!
//! Every write of the server is a request to the committer. Its loop takes whatever
//! requests are queued (up to [`MAX_BATCH_OPS`]), adds the claims the registry plans
//! for workers with free slots, runs all of it in one transaction, then applies the
//! effects (hand claimed rows to workers, wake waiters, tell workers to stop, arm the
//! timer) and answers each request. While one transaction commits, the next batch
//! queues up, so one fsync serves many rows. A claim also takes rows *ahead* for
//! workers that finish fast (see `registry`): a slot freed by a result is refilled
//! from them at once, while the result commits with the next batch, so dispatch
//! does not wait for commits; the batch's claim then tops the rows ahead up.
//!
//! The loop is woken by requests, by the registry (a slot freed, a worker joined, a
//! row came due) and by the timer of delayed rows; it never polls.
//!
//! The store takes the next batch while one is being written (`Store::writers`),
//! so the loop's own work (effects, answers, forming the next batch) and the
//! store's overlap. PostgreSQL writes the two at once, each on a connection and a
//! backend of its own; SQLite's one writer thread writes them in turn, so there a
//! batch goes beside another only when one of the two is large enough for the
//! overlap to pay (`Store::beside_min_rows`), and small ones wait and go as one.
//! Each claim takes half of a worker's room, so that the batch sent beside it can
//! claim too, and after sending one the loop plans again at once; on SQLite, where
//! a batch of claims alone does not go beside a small one, a claim with none of
//! its group in flight also fills every free slot.
//!
//! Invariants:
//! - a request's ops are never split across transactions (`SubmitBatch` is one commit);
//! - a request is answered only after its transaction committed (or failed);
//! - effects are applied in op order, after the commit, batch by batch in the order
//!   the batches formed; at most one batch is being written while the next forms,
//!   and only batches of submits, endings and claims go side by side (see
//!   `side_by_side`), so a cancel committed after a claim always finds the claimed
//!   attempt in the registry;
//! - a batch that fails is retried request by request, so one bad request cannot
//!   fail its neighbours, and its claims are planned again and committed on their
//!   own, so dispatch does not wait on it; the loop pauses only when nothing
//!   commits at all (the store itself is failing).

use std::{ops::Range, sync::Arc, time::Duration};

use spool_proto::time::UnixMillis;
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};

use super::{Pending, Registry, due, peers::Peers, timer::Timer};
use crate::store::{self, ActivityStatus, Event, Key, Op, Outcome, Remote, Store, Transition};

/// The most ops one transaction takes (a larger single request still goes whole).
pub const MAX_BATCH_OPS: usize = 2048;

const FIRST_FAILURE_PAUSE: Duration = Duration::from_millis(100);

/// Most remote events taken per round of the loop.
const REMOTE_PER_ROUND: usize = 1024;

/// The longest cancel reason carried in a notification (the row has it whole).
const MAX_EVENT_REASON: usize = 1024;

/// How many requests may queue before submitters wait: backpressure on clients.
const QUEUE: usize = 8192;

/// Why a write did not happen.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommitError {
    /// The committer has stopped: the server is shutting down. Retry elsewhere.
    #[error("the server is shutting down")]
    Closed,
    /// The store failed the transaction; nothing of the request was written.
    #[error("{0}")]
    Store(Arc<store::Error>),
}

/// Called once with the request's outcomes (in op order), after the commit.
pub type Reply = Box<dyn FnOnce(Result<Vec<Outcome>, CommitError>) + Send>;

enum Message {
    Request {
        ops: Vec<Op>,
        reply: Option<Reply>,
    },
    /// Finish what is queued, then stop.
    Stop(oneshot::Sender<()>),
}

/// A cheap handle to the committer.
#[derive(Clone)]
pub struct Committer {
    tx: mpsc::Sender<Message>,
}

pub struct Options {
    /// How long a claimed attempt's lease lasts before another node may reclaim it.
    pub lease: Duration,
}

impl Committer {
    /// Starts the loop. Its timer first reads the store's due times, so rows already
    /// delayed in the store come due on time.
    /// `remote` carries other nodes' events when several share the store.
    pub fn spawn(
        store: Arc<dyn Store>,
        registry: Arc<Registry>,
        pending: Arc<Pending>,
        options: Options,
        remote: Option<mpsc::Receiver<Remote>>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let timer = Timer::default();
        let event_loop = Loop {
            peers: Peers::new(&store, remote),
            store,
            registry,
            pending,
            lease_ms: i64::try_from(options.lease.as_millis()).unwrap_or(i64::MAX),
            rx,
            timer,
            failure_pause: FIRST_FAILURE_PAUSE,
            carry: Vec::new(),
            fatal: None,
            claimed_alone: false,
        };
        (Self { tx }, tokio::spawn(event_loop.run()))
    }

    /// Commits `ops` in one transaction and returns their outcomes.
    pub async fn commit(&self, ops: Vec<Op>) -> Result<Vec<Outcome>, CommitError> {
        let (tx, rx) = oneshot::channel();
        self.commit_with(
            ops,
            Box::new(move |result| {
                let _ = tx.send(result);
            }),
        )
        .await?;
        rx.await.map_err(|_| CommitError::Closed)?
    }

    /// Queues `ops`; `reply` runs on the committer's task after the commit, so it
    /// must be quick (a channel send).
    pub async fn commit_with(&self, ops: Vec<Op>, reply: Reply) -> Result<(), CommitError> {
        self.tx
            .send(Message::Request {
                ops,
                reply: Some(reply),
            })
            .await
            .map_err(|_| CommitError::Closed)
    }

    /// Queues `ops` without waiting for the outcome.
    pub async fn send(&self, ops: Vec<Op>) -> Result<(), CommitError> {
        self.tx
            .send(Message::Request { ops, reply: None })
            .await
            .map_err(|_| CommitError::Closed)
    }

    /// Commits everything queued so far, then stops the loop.
    pub async fn stop(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Message::Stop(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

struct Request {
    range: Range<usize>,
    reply: Option<Reply>,
}

struct Loop {
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    pending: Arc<Pending>,
    lease_ms: i64,
    /// Requests from every handle; closed when all handles are gone.
    rx: mpsc::Receiver<Message>,
    timer: Timer,
    /// How long to pause after a failed batch (doubling to 2 s while failures
    /// last): a broken disk must not turn the loop into a spin.
    failure_pause: Duration,
    /// Writes the loop owes itself (releases of rows whose worker vanished
    /// mid-claim); they go into the next batch.
    carry: Vec<Op>,
    /// The other nodes sharing the store: what they must hear, what they say.
    peers: Peers,
    /// Set when a part the loop depends on died (the listener, the publisher): the
    /// loop ends, and the server with it.
    fatal: Option<&'static str>,
    /// Set when a failed batch's claims were written on their own as it landed
    /// (see [`Loop::landed`]).
    claimed_alone: bool,
}

impl Loop {
    async fn run(mut self) {
        let mut stop: Option<oneshot::Sender<()>> = None;
        let mut closed = false;
        // The batch being written while the next one forms (stores with more than
        // one writer only).
        let mut flight: Option<Flight> = None;
        // Set when a batch went to the store beside one in flight: the room it
        // did not claim may be claimed by a batch of its own at once, without
        // waiting for a request.
        let mut plan_again = false;
        let writers = self.store.writers();
        loop {
            let mut ops: Vec<Op> = std::mem::take(&mut self.carry);
            // Rows claimed ahead that will not be sent go back with this batch.
            ops.extend(self.registry.take_released());
            let mut requests: Vec<Request> = Vec::new();
            if ops.is_empty() && stop.is_none() && !closed && !std::mem::take(&mut plan_again) {
                let deadline = self
                    .timer
                    .next()
                    .map(|at| due::instant_for(at, self.store.now()));
                tokio::select! {
                    biased;
                    applied = landing(&mut flight), if flight.is_some() => {
                        if let Some(landed) = flight.take() {
                            self.landed(landed.batch, applied).await;
                        }
                        continue;
                    }
                    message = self.rx.recv() => match message {
                        Some(m) => self.take(m, &mut ops, &mut requests, &mut stop),
                        None => closed = true,
                    },
                    _ = self.registry.woken() => {}
                    _ = sleep_until(deadline), if deadline.is_some() => {}
                    remote = self.peers.recv(), if self.peers.listening() => match remote {
                        Some(remote) => self.on_remote(remote),
                        None => self.fatal = Some("the listener for other nodes' changes stopped"),
                    },
                }
                // Woken to release rows claimed ahead: they precede any request.
                if requests.is_empty() {
                    ops.extend(self.registry.take_released());
                }
            }
            if let Some(why) = self.fatal {
                // A node deaf to the others, or mute to them, would live on as a
                // zombie: end the loop; the server exits for its supervisor.
                tracing::error!("{why}: the committer stops");
                self.land(&mut flight).await;
                answer_closed(requests);
                return;
            }
            // Remote events are read every round, not only when the select picks
            // them: a busy node must still hear the others.
            for _ in 0..REMOTE_PER_ROUND {
                match self.peers.try_recv() {
                    Ok(Some(event)) => self.on_remote(event),
                    Ok(None) => break,
                    Err(why) => {
                        self.fatal = Some(why);
                        break;
                    }
                }
            }
            self.take_queued(&mut ops, &mut requests, &mut stop, &mut closed);
            // A store that writes its batches in turn (SQLite) gains from one sent
            // beside another only when landing that one is real work to overlap;
            // small batches wait for it and go as one, as a single writer's would.
            let small = self.store.beside_min_rows();
            if flight
                .as_ref()
                .is_some_and(|f| rows_written(&f.batch.ops) < small && rows_written(&ops) < small)
            {
                self.land(&mut flight).await;
                // What landing it released goes first, as at the top of the loop.
                let mut front = std::mem::take(&mut self.carry);
                front.extend(self.registry.take_released());
                if !front.is_empty() {
                    for request in &mut requests {
                        request.range =
                            request.range.start + front.len()..request.range.end + front.len();
                    }
                    front.append(&mut ops);
                    ops = front;
                }
                self.take_queued(&mut ops, &mut requests, &mut stop, &mut closed);
            }

            let now = self.store.now();
            self.fire_timer(now).await;
            // Rows submitted in this very batch can be claimed in it too: one commit
            // from submit to dispatch.
            mark_submits_due(&self.registry, &ops, now);
            let first_claim = ops.len();
            if stop.is_none() && !closed {
                let in_flight: Vec<&store::Claim> = flight
                    .iter()
                    .flat_map(|f| store::claims(&f.batch.ops[f.batch.first_claim..]))
                    .collect();
                let claims = self
                    .registry
                    .plan_claims(now.saturating_add(self.lease_ms), &in_flight);
                ops.extend(claims.into_iter().map(Op::Claim));
            }
            if ops.is_empty() {
                if !requests.is_empty() {
                    // Requests with no ops (a barrier: "everything before me is in").
                    self.land(&mut flight).await;
                    answer(requests, Vec::new());
                }
            } else if writers < 2 {
                self.write(ops, requests, first_claim, now).await;
            } else {
                // The next batch goes to the store before the one in flight lands,
                // so the store writes one while the loop applies the other's
                // effects; effects are still applied in the order batches formed.
                // Only batches of submits, endings and claims go side by side.
                let beside = ops.iter().all(side_by_side);
                if !beside || flight.as_ref().is_some_and(|f| !f.beside) {
                    self.land(&mut flight).await;
                }
                let claimed = first_claim < ops.len();
                let mut next = self.launch(ops, requests, first_claim, now, beside).await;
                if claimed && let Some(overtaken) = flight.as_mut() {
                    overtaken.batch.overtaken = true;
                }
                self.claimed_alone = false;
                self.land(&mut flight).await;
                // The failed batch's claims went to the store after `next`, and
                // could not see its submits either.
                if std::mem::take(&mut self.claimed_alone) {
                    next.batch.overtaken = true;
                }
                flight = Some(next);
                if stop.is_some() || closed {
                    self.land(&mut flight).await;
                } else {
                    plan_again = claimed;
                }
            }
            if stop.is_some() || closed {
                // Everything queued before the stop is in; later senders see Closed.
                self.land(&mut flight).await;
                if self.carry.is_empty() {
                    break;
                }
            }
        }
        // What the last batches changed reaches the other nodes before `stop` returns.
        self.peers.stop().await;
        if let Some(stop) = stop {
            let _ = stop.send(());
        }
    }

    /// Takes the requests queued now, up to a batch's worth.
    fn take_queued(
        &mut self,
        ops: &mut Vec<Op>,
        requests: &mut Vec<Request>,
        stop: &mut Option<oneshot::Sender<()>>,
        closed: &mut bool,
    ) {
        while ops.len() < MAX_BATCH_OPS && stop.is_none() {
            match self.rx.try_recv() {
                Ok(m) => self.take(m, ops, requests, stop),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    *closed = true;
                    break;
                }
            }
        }
    }

    fn take(
        &self,
        message: Message,
        ops: &mut Vec<Op>,
        requests: &mut Vec<Request>,
        stop: &mut Option<oneshot::Sender<()>>,
    ) {
        match message {
            Message::Request { ops: mine, reply } => {
                let start = ops.len();
                ops.extend(mine);
                requests.push(Request {
                    range: start..ops.len(),
                    reply,
                });
            }
            Message::Stop(tx) => *stop = Some(tx),
        }
    }

    async fn fire_timer(&mut self, now: UnixMillis) {
        due::fire(
            &mut self.timer,
            self.store.as_ref(),
            &self.registry,
            now,
            self.peers.sharing(),
        )
        .await;
    }

    /// Writes `ops` (the requests' ops, then the loop's own from `first_claim` on:
    /// carried releases precede requests, claims come last), applies effects, answers.
    async fn write(
        &mut self,
        ops: Vec<Op>,
        requests: Vec<Request>,
        first_claim: usize,
        now: UnixMillis,
    ) {
        let (batch, fenced) = self.batch(ops, requests, first_claim, now).await;
        let applied = self.store.apply(fenced, now).await;
        self.landed(batch, applied).await;
    }

    /// [`Loop::write`], but only sent: the store writes it on a task of its own
    /// while the loop goes on; `beside` says whether the next may go beside it.
    async fn launch(
        &self,
        ops: Vec<Op>,
        requests: Vec<Request>,
        first_claim: usize,
        now: UnixMillis,
        beside: bool,
    ) -> Flight {
        let (batch, fenced) = self.batch(ops, requests, first_claim, now).await;
        let store = self.store.clone();
        Flight {
            batch,
            applied: tokio::spawn(async move { store.apply(fenced, now).await }),
            beside,
        }
    }

    /// `ops` as a batch, and as the store is to write them.
    async fn batch(
        &self,
        ops: Vec<Op>,
        requests: Vec<Request>,
        first_claim: usize,
        now: UnixMillis,
    ) -> (Batch, Arc<[Op]>) {
        tracing::trace!(
            ops = ops.len(),
            requests = requests.len(),
            claims = ops.len() - first_claim,
            "batch"
        );
        let ops: Arc<[Op]> = ops.into();
        let fenced = crate::breakage::unfence(&*self.store, ops.clone()).await;
        let batch = Batch {
            ops,
            requests,
            first_claim,
            now,
            started: std::time::Instant::now(),
            overtaken: false,
        };
        (batch, fenced)
    }

    /// Waits for the batch in flight, if there is one, and lands it.
    async fn land(&mut self, flight: &mut Option<Flight>) {
        if flight.is_some() {
            let applied = landing(flight).await;
            if let Some(landed) = flight.take() {
                self.landed(landed.batch, applied).await;
            }
        }
    }

    /// Applies the effects of a batch the store has written and answers its
    /// requests; a batch that failed is retried request by request.
    async fn landed(&mut self, batch: Batch, applied: Result<Vec<Outcome>, store::Error>) {
        let Batch {
            ops,
            requests,
            first_claim,
            now,
            started,
            overtaken,
        } = batch;
        if overtaken {
            // A claim sent after this batch ran beside it, before its submits
            // committed, and may come back short for want of them, with the due
            // mark they set taken: marked again, so that claim cannot leave their
            // group idle with rows due (`Registry::assign`).
            mark_submits_due(&self.registry, &ops, now);
        }
        let took = started.elapsed();
        crate::metrics::commit(ops.len(), took.as_secs_f64(), applied.is_ok());
        tracing::trace!(micros = took.as_micros() as u64, "applied");
        match applied {
            Ok(mut outcomes) => {
                self.failure_pause = FIRST_FAILURE_PAUSE;
                self.apply_effects(&ops, &mut outcomes, now);
                answer(requests, outcomes);
            }
            Err(e) => {
                tracing::warn!(error = %e, ops = ops.len(), "batch failed; retrying its requests one by one");
                for claim in store::claims(&ops[first_claim..]) {
                    self.registry.unreserve(claim);
                }
                // Whether any retry below commits: if one does, the store works and
                // the failure was one request's own; no pause is due.
                let mut committed = false;
                // Ops outside any request (carried releases) are retried on their own.
                let owned_end = requests.first().map_or(first_claim, |r| r.range.start);
                if owned_end > 0 {
                    let mine = &ops[..owned_end];
                    match self
                        .store
                        .apply(
                            crate::breakage::unfence(&*self.store, Arc::from(mine)).await,
                            now,
                        )
                        .await
                    {
                        Ok(mut outcomes) => {
                            committed = true;
                            self.apply_effects(mine, &mut outcomes, now);
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "cannot release rows; they stay RUNNING until reclaimed")
                        }
                    }
                }
                for request in requests {
                    let mine = &ops[request.range.clone()];
                    let result = match self
                        .store
                        .apply(
                            crate::breakage::unfence(&*self.store, Arc::from(mine)).await,
                            now,
                        )
                        .await
                    {
                        Ok(mut outcomes) => {
                            committed = true;
                            self.apply_effects(mine, &mut outcomes, now);
                            Ok(outcomes)
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "request failed");
                            Err(CommitError::Store(Arc::new(e)))
                        }
                    };
                    if let Some(reply) = request.reply {
                        reply(result);
                    }
                }
                // Dispatch must not wait on a neighbour's failure: the claims are
                // planned again and committed on their own.
                if first_claim < ops.len() {
                    let claims: Vec<Op> = self
                        .registry
                        .plan_claims(now.saturating_add(self.lease_ms), &[])
                        .into_iter()
                        .map(Op::Claim)
                        .collect();
                    if !claims.is_empty() {
                        self.claimed_alone = true;
                        match self.store.apply(Arc::from(claims.as_slice()), now).await {
                            Ok(mut outcomes) => {
                                committed = true;
                                self.apply_effects(&claims, &mut outcomes, now);
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "claims failed");
                                for claim in store::claims(&claims) {
                                    self.registry.unreserve(claim);
                                }
                            }
                        }
                    }
                }
                self.publish_outgoing();
                if committed {
                    self.failure_pause = FIRST_FAILURE_PAUSE;
                } else {
                    // Nothing commits: the store itself is failing. Pause (doubling,
                    // up to 2 s) so a broken disk does not turn the loop into a spin.
                    tokio::time::sleep(self.failure_pause).await;
                    self.failure_pause = (self.failure_pause * 2).min(Duration::from_secs(2));
                }
                return;
            }
        }
        self.publish_outgoing();
    }

    /// What committed writes mean for the rest of the server, in op order.
    /// Claimed rows are moved out of `outcomes` (nobody is answered with them).
    fn apply_effects(&mut self, ops: &[Op], outcomes: &mut [Outcome], now: UnixMillis) {
        for (op, outcome) in ops.iter().zip(outcomes.iter_mut()) {
            match (op, outcome) {
                (Op::Submit(_), Outcome::Submitted(submitted)) => {
                    crate::metrics::submitted(submitted.iter().filter(|s| s.created).count() as u64);
                    for s in submitted.iter().filter(|s| s.created) {
                        let (namespace, activity_type) =
                            (&s.row.key.namespace, &s.row.activity_type);
                        if s.row.next_at <= now {
                            // Marked due here before the batch's claims were
                            // planned, so they already looked for it (a claim
                            // planned before that comes back short plans again,
                            // `Registry::assign`; one that ran beside this batch
                            // had it marked again as it landed): marking it again
                            // would only plan a claim that finds nothing.
                            self.tell_due(namespace, activity_type, s.row.next_at);
                        } else {
                            self.came_due(namespace, activity_type, s.row.next_at, now);
                        }
                    }
                }
                (Op::Claim(claim), Outcome::Claimed { rows, throttled }) => {
                    // The rate limit held the type back: it is due again when its
                    // bucket gives a row (every node reads the same bucket, so
                    // this is not told to the others).
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
                    let released = self.registry.assign(claim, std::mem::take(rows));
                    self.carry.extend(released);
                }
                (
                    Op::Finish {
                        attempt,
                        transition,
                        ..
                    },
                    Outcome::Finished { accepted: true },
                ) => {
                    crate::metrics::finished(transition_name(transition));
                    if matches!(
                        store::AttemptOutcome::of(transition),
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
                        store::AttemptOutcome::of(transition),
                        Some(seconds(now.saturating_sub(attempt.started_at))),
                        matches!(transition, Transition::Fail { .. }),
                    );
                    if attempt.concurrency_key.is_some() {
                        // Room for another row of its concurrency key, here or on
                        // another node.
                        self.came_due(&attempt.key.namespace, &attempt.activity_type, now, now);
                    }
                    match transition {
                        Transition::Complete { .. } | Transition::Fail { .. } => {
                            self.finished(&attempt.key)
                        }
                        Transition::Retry { next_at, .. } | Transition::Snooze { next_at } => {
                            self.came_due(
                                &attempt.key.namespace,
                                &attempt.activity_type,
                                *next_at,
                                now,
                            );
                        }
                        Transition::Release => {
                            self.came_due(&attempt.key.namespace, &attempt.activity_type, now, now)
                        }
                    }
                }
                (Op::Finish { .. }, Outcome::Finished { accepted: false }) => {
                    crate::metrics::result_refused()
                }
                (Op::Cancel { reason, .. }, Outcome::Cancelled { prior, row }) => {
                    self.cancelled(*prior, row, reason, now);
                }
                (Op::EnforceConcurrency { .. }, Outcome::Enforced(cancelled)) => {
                    for (prior, row) in cancelled.iter() {
                        let reason = row
                            .last_error
                            .as_ref()
                            .map(|e| e.message.clone())
                            .unwrap_or_default();
                        self.cancelled(*prior, row, &reason, now);
                    }
                }
                (Op::Redrive { .. }, Outcome::Redriven { row }) => {
                    self.came_due(&row.key.namespace, &row.activity_type, row.next_at, now);
                }
                (Op::ExpireScheduled { .. }, Outcome::Expired(keys)) => {
                    for key in keys.iter() {
                        self.finished(key);
                    }
                }
                _ => {}
            }
        }
    }

    /// A committed change made rows due: here, and on other nodes.
    fn came_due(&mut self, namespace: &str, activity_type: &str, at: UnixMillis, now: UnixMillis) {
        self.due(namespace, activity_type, at, now);
        self.tell_due(namespace, activity_type, at);
    }

    /// Tells the other nodes only: this node already knows.
    fn tell_due(&mut self, namespace: &str, activity_type: &str, at: UnixMillis) {
        self.peers.tell(Event::Due {
            namespace: namespace.to_owned(),
            activity_type: activity_type.to_owned(),
            at,
        });
    }

    /// A committed cancel of `row`, which was `prior`: its waiters learn of it, and
    /// a worker running it is told to stop, here or on another node.
    fn cancelled(
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
            self.peers.tell(Event::Cancelled {
                worker_id: worker_id.to_string(),
                key: row.key.clone(),
                attempt: row.attempt,
                reason: crate::limits::truncate(reason.to_owned(), MAX_EVENT_REASON),
            });
        }
    }

    /// A committed change made the activity terminal: wake its waiters, here and
    /// on other nodes.
    fn finished(&mut self, key: &Key) {
        self.pending.notify(key);
        self.peers.tell(Event::Finished { key: key.clone() });
    }

    /// Tells the other nodes what the last batch changed, without holding up the
    /// next batch.
    fn publish_outgoing(&mut self) {
        if let Err(why) = self.peers.flush(self.store.now()) {
            self.fatal = Some(why);
        }
    }

    /// Another node's committed change.
    fn on_remote(&mut self, remote: Remote) {
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

    fn due(&mut self, namespace: &str, activity_type: &str, at: UnixMillis, now: UnixMillis) {
        if at <= now {
            self.registry.mark_due(namespace, activity_type);
        } else {
            self.timer
                .insert(at, Some((namespace.into(), activity_type.into())));
        }
    }
}

/// The ops of one transaction, and the requests they answer.
struct Batch {
    ops: Arc<[Op]>,
    requests: Vec<Request>,
    first_claim: usize,
    now: UnixMillis,
    started: std::time::Instant,
    /// A batch with claims was sent before this one landed.
    overtaken: bool,
}

/// The rows `ops` write for requests: a submit's rows, one for any other op.
/// Claims are left out: how many rows one finds is known only once it lands.
fn rows_written(ops: &[Op]) -> usize {
    ops.iter()
        .map(|op| match op {
            Op::Submit(rows) => rows.len(),
            Op::Claim(_) => 0,
            _ => 1,
        })
        .sum()
}

/// Marks the types of the rows `ops` submit due now.
fn mark_submits_due(registry: &Registry, ops: &[Op], now: UnixMillis) {
    for op in ops {
        if let Op::Submit(batch) = op {
            for new in batch.iter().filter(|new| new.next_at <= now) {
                registry.mark_due(&new.key.namespace, &new.activity_type);
            }
        }
    }
}

/// A batch sent to the store and not yet landed.
struct Flight {
    batch: Batch,
    applied: tokio::task::JoinHandle<Result<Vec<Outcome>, store::Error>>,
    /// Whether the next batch may be written beside it ([`side_by_side`]).
    beside: bool,
}

/// Whether `op` may be written beside another batch: it meets the other batch's
/// rows only at their locks, and whichever commits first, landing the two in the
/// order they formed tells the registry the truth. A submit inserts, an ending is
/// fenced by its attempt, a claim skips locked rows. Not so a cancel, whose
/// batch could find a row a later batch's claim took (RUNNING) and land first,
/// before the registry holds the attempt to stop; nor a renewal, which could miss
/// an attempt a later batch ended and take it for lost. Those batches are written
/// alone.
fn side_by_side(op: &Op) -> bool {
    matches!(op, Op::Submit(_) | Op::Finish { .. } | Op::Claim(_))
}

/// What the store made of the batch in `flight`, once it is written; never,
/// without one.
async fn landing(flight: &mut Option<Flight>) -> Result<Vec<Outcome>, store::Error> {
    match flight {
        // A writing task that ended without an answer (it panicked, or the
        // runtime is going down) is a failed batch: its requests are retried.
        Some(f) => (&mut f.applied)
            .await
            .unwrap_or_else(|_| Err(store::Error::Database(sqlx::Error::WorkerCrashed))),
        None => std::future::pending().await,
    }
}

fn seconds(millis: i64) -> f64 {
    millis as f64 / 1000.0
}

fn transition_name(transition: &Transition) -> &'static str {
    match transition {
        Transition::Complete { .. } => "completed",
        Transition::Retry { .. } => "retried",
        Transition::Snooze { .. } => "snoozed",
        Transition::Fail { .. } => "failed",
        Transition::Release => "released",
    }
}

/// Answers requests the loop will not commit: the committer is stopping.
fn answer_closed(requests: Vec<Request>) {
    for request in requests {
        if let Some(reply) = request.reply {
            reply(Err(CommitError::Closed));
        }
    }
}

fn answer(requests: Vec<Request>, mut outcomes: Vec<Outcome>) {
    // Split from the back so each request takes its own range without copying.
    for request in requests.into_iter().rev() {
        let mine = outcomes.split_off(request.range.start);
        outcomes.truncate(request.range.start);
        if let Some(reply) = request.reply {
            reply(Ok(mine.into_iter().take(request.range.len()).collect()));
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use spool_proto::v1::server_message;

    use super::*;
    use crate::{
        dispatch::registry::{Outgoing, Registration},
        store::{
            ActivityRow, DueTimes, ListPage, ListQuery, NewActivity, Payload, RetrySpec,
            RunningPage, SqliteStore, StatusCounts, Timeouts,
        },
    };

    /// SQLite, except that a batch holding a cancel whose reason is "poison"
    /// fails, as a request the database refuses would; it records the size of
    /// every batch and counts those written, writes wait while `stalled` is true,
    /// and batches with a submit while `hold_submits` is. It says it writes
    /// `writers` batches at once.
    struct Poisoned {
        inner: SqliteStore,
        failures: AtomicUsize,
        batches: std::sync::Mutex<Vec<usize>>,
        written: AtomicUsize,
        stalled: tokio::sync::watch::Sender<bool>,
        hold_submits: tokio::sync::watch::Sender<bool>,
        writers: usize,
        beside_min_rows: usize,
    }

    impl Poisoned {
        async fn open(dir: &tempfile::TempDir) -> Arc<Self> {
            Self::with_writers(dir, 1).await
        }

        async fn with_writers(dir: &tempfile::TempDir, writers: usize) -> Arc<Self> {
            Self::with_writers_in_turn(dir, writers, 0).await
        }

        /// Says it writes `writers` batches in turn, as SQLite's one writer does:
        /// batches under `beside_min_rows` rows are not sent side by side.
        async fn with_writers_in_turn(
            dir: &tempfile::TempDir,
            writers: usize,
            beside_min_rows: usize,
        ) -> Arc<Self> {
            let url = format!("sqlite://{}", dir.path().join("spool.db").display());
            Arc::new(Poisoned {
                inner: SqliteStore::open(&url)
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
                failures: AtomicUsize::new(0),
                batches: std::sync::Mutex::new(Vec::new()),
                written: AtomicUsize::new(0),
                stalled: tokio::sync::watch::Sender::new(false),
                hold_submits: tokio::sync::watch::Sender::new(false),
                writers,
                beside_min_rows,
            })
        }

        fn batches(&self) -> Vec<usize> {
            self.batches
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        }
    }

    /// Waits while `gate` is true.
    async fn wait_while(gate: &tokio::sync::watch::Sender<bool>) {
        let mut gate = gate.subscribe();
        while *gate.borrow_and_update() {
            if gate.changed().await.is_err() {
                break;
            }
        }
    }

    #[async_trait::async_trait]
    impl Store for Poisoned {
        async fn apply(
            &self,
            ops: Arc<[Op]>,
            now: UnixMillis,
        ) -> Result<Vec<Outcome>, store::Error> {
            self.batches
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ops.len());
            wait_while(&self.stalled).await;
            if ops.iter().any(|op| matches!(op, Op::Submit(_))) {
                wait_while(&self.hold_submits).await;
            }
            if ops
                .iter()
                .any(|op| matches!(op, Op::Cancel { reason, .. } if reason == "poison"))
            {
                self.failures.fetch_add(1, Ordering::SeqCst);
                return Err(store::Error::Sqlite {
                    code: 20,
                    message: "datatype mismatch".to_owned(),
                });
            }
            let applied = self.inner.apply(ops, now).await;
            self.written.fetch_add(1, Ordering::SeqCst);
            applied
        }
        async fn get(&self, key: &Key) -> Result<Option<ActivityRow>, store::Error> {
            self.inner.get(key).await
        }
        async fn list(&self, query: &ListQuery) -> Result<ListPage, store::Error> {
            self.inner.list(query).await
        }
        async fn stats(&self, namespace: &str) -> Result<StatusCounts, store::Error> {
            self.inner.stats(namespace).await
        }
        async fn history(&self, id: i64) -> Result<Vec<store::AttemptRecord>, store::Error> {
            self.inner.history(id).await
        }
        async fn type_counts(
            &self,
            now: UnixMillis,
        ) -> Result<Vec<store::TypeCounts>, store::Error> {
            self.inner.type_counts(now).await
        }
        async fn running(&self, after: i64, limit: u32) -> Result<RunningPage, store::Error> {
            self.inner.running(after, limit).await
        }
        async fn expired_leases(
            &self,
            now: UnixMillis,
            limit: u32,
        ) -> Result<Vec<ActivityRow>, store::Error> {
            self.inner.expired_leases(now, limit).await
        }
        async fn due_times(&self, after: UnixMillis, limit: u32) -> Result<DueTimes, store::Error> {
            self.inner.due_times(after, limit).await
        }
        async fn set_priority_aging(
            &self,
            per_level: Option<std::time::Duration>,
        ) -> Result<bool, store::Error> {
            self.inner.set_priority_aging(per_level).await
        }
        async fn concurrency_limits(
            &self,
            namespace: Option<&str>,
        ) -> Result<Vec<store::concurrency::ConcurrencyLimit>, store::Error> {
            self.inner.concurrency_limits(namespace).await
        }
        async fn fairness_weights(
            &self,
            namespace: Option<&str>,
        ) -> Result<Vec<store::fairness::FairnessWeightUse>, store::Error> {
            self.inner.fairness_weights(namespace).await
        }
        async fn concurrency_key(
            &self,
            namespace: &str,
            activity_type: &str,
            key: &str,
        ) -> Result<Option<(u64, u64)>, store::Error> {
            self.inner
                .concurrency_key(namespace, activity_type, key)
                .await
        }
        async fn rate_limits(
            &self,
            namespace: Option<&str>,
            now: UnixMillis,
        ) -> Result<Vec<store::rate::RateLimitUse>, store::Error> {
            self.inner.rate_limits(namespace, now).await
        }
        fn single_node(&self) -> bool {
            true
        }
        fn writers(&self) -> usize {
            self.writers
        }
        fn beside_min_rows(&self) -> usize {
            self.beside_min_rows
        }
    }

    fn new(id: &str) -> NewActivity {
        NewActivity {
            key: Key {
                namespace: "default".into(),
                workflow_id: "wf".into(),
                activity_id: id.into(),
            },
            activity_type: "t".into(),
            input: Payload::default(),
            next_at: 0,
            retry: RetrySpec {
                max_attempts: 3,
                initial_interval_ms: 1000,
                backoff_coefficient: 2.0,
                max_interval_ms: 60_000,
                non_retryable: Vec::new(),
            },
            timeouts: Timeouts::default(),
            priority: 0,
            headers: Default::default(),
            concurrency_key: None,
            fairness: None,
        }
    }

    /// A committer on `store` and one worker of type "t" with `max_concurrency`
    /// slots: its outbound messages come out of the returned receiver.
    fn with_worker(
        store: Arc<Poisoned>,
        max_concurrency: u32,
    ) -> (
        Committer,
        tokio::task::JoinHandle<()>,
        mpsc::Receiver<Outgoing>,
        Arc<Registry>,
    ) {
        let registry = Arc::new(
            Registry::default()
                .with_writers(store.writers)
                .in_turn(store.beside_min_rows > 0),
        );
        let (committer, task) = Committer::spawn(
            store,
            registry.clone(),
            Arc::new(Pending::default()),
            Options {
                lease: Duration::from_secs(30),
            },
            None,
        );
        let (_id, _tx, rx, _evict) = registry.register(
            Registration {
                namespace: "default".into(),
                identity: "test".into(),
                activity_types: vec!["t".into()],
                max_concurrency,
                ticket: None,
            },
            spool_proto::time::now_millis(),
            |id| {
                server_message::Message::Welcome(spool_proto::v1::Welcome {
                    worker_id: id.to_owned(),
                    ..Default::default()
                })
            },
        );
        (committer, task, rx, registry)
    }

    async fn next_task(rx: &mut mpsc::Receiver<Outgoing>) -> String {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .unwrap_or_else(|_| panic!("no task in time"))
                .unwrap_or_else(|| panic!("outbound closed"));
            if let Ok(spool_proto::v1::ServerMessage {
                message: Some(server_message::Message::Task(task)),
            }) = message.message
            {
                return task.activity_id;
            }
        }
    }

    /// A request the store refuses fails alone: its neighbours commit, the claims
    /// of its batch go out on their own, and the loop does not pause, however often
    /// it comes.
    #[tokio::test]
    async fn a_failing_request_neither_fails_its_neighbours_nor_stalls_dispatch() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = Poisoned::open(&dir).await;
        let (committer, task, mut rx, _) = with_worker(store.clone(), 1_000);
        let started = std::time::Instant::now();
        const ROUNDS: usize = 20;
        for i in 0..ROUNDS {
            // The poison and a good submit land in one batch: the commit_with
            // calls queue both before the loop takes either.
            let (poison_tx, poison_rx) = oneshot::channel();
            let (good_tx, good_rx) = oneshot::channel();
            let reply = |tx: oneshot::Sender<_>| -> Reply {
                Box::new(move |r| {
                    let _ = tx.send(r);
                })
            };
            let poison = vec![Op::Cancel {
                key: new("x").key,
                reason: "poison".into(),
            }];
            let good = vec![Op::Submit(vec![new(&format!("a{i}"))])];
            let (a, b) = tokio::join!(
                committer.commit_with(poison, reply(poison_tx)),
                committer.commit_with(good, reply(good_tx))
            );
            assert!(a.is_ok() && b.is_ok());
            let poisoned = poison_rx.await.unwrap_or_else(|_| panic!("no reply"));
            assert!(matches!(poisoned, Err(CommitError::Store(_))));
            if i == 0 {
                // The first time, both shared the failed batch (2 ops) before
                // being retried alone.
                let batches = store
                    .batches
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                assert!(
                    batches
                        .windows(3)
                        .any(|w| w[0] >= 2 && w[1] == 1 && w[2] >= 1),
                    "the poison failed a shared batch, then went alone: {batches:?}"
                );
            }
            let good = good_rx.await.unwrap_or_else(|_| panic!("no reply"));
            assert!(good.is_ok(), "a neighbour of the poison commits: {good:?}");
            assert_eq!(next_task(&mut rx).await, format!("a{i}"));
        }
        assert!(store.failures.load(Ordering::SeqCst) >= ROUNDS);
        // With a pause per failure (100 ms, doubling to 2 s) this would take 30 s;
        // without, it is forty durable commits.
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{ROUNDS} poisoned batches took {:?}",
            started.elapsed()
        );
        committer.stop().await;
        drop(committer);
        let _ = task.await;
    }

    /// A row submitted due is claimed in its own submit's transaction, and nothing
    /// plans another claim for it after that commit: one transaction a submit.
    #[tokio::test]
    async fn a_submit_claimed_in_its_own_batch_plans_no_second_claim() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = Poisoned::open(&dir).await;
        let (committer, task, mut rx, _) = with_worker(store.clone(), 10);
        let batches = || {
            store
                .batches
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        };
        // The worker's arrival plans a claim of its own, which finds nothing.
        committer
            .commit(vec![Op::Submit(vec![new("a0")])])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(next_task(&mut rx).await, "a0");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = batches().len();
        for i in 1..=5 {
            committer
                .commit(vec![Op::Submit(vec![new(&format!("a{i}"))])])
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(next_task(&mut rx).await, format!("a{i}"));
        }
        // Time for a claim the loop would plan after the last commit.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            batches()[before..],
            [2, 2, 2, 2, 2],
            "each submit with its claim, and no claim after it"
        );
        committer.stop().await;
        drop(committer);
        let _ = task.await;
    }

    /// With two batches written at once, a claim sent beside a batch of submits
    /// runs before they commit and finds none of them; it must not leave their
    /// type idle with rows due once it lands short.
    #[tokio::test]
    async fn a_claim_beside_uncommitted_submits_leaves_no_due_row_idle() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = Poisoned::with_writers(&dir, 2).await;
        // Two slots: each claim takes half of them.
        let (committer, task, mut rx, registry) = with_worker(store.clone(), 2);
        // The worker's arrival plans claims that find nothing; let them land.
        tokio::time::sleep(Duration::from_millis(100)).await;
        while store.batches().len() != store.written.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // As after a claim that took all it asked for, so that the next claim goes
        // beside the batch of the first (see `Registry::plan_claims`).
        registry.saturate();
        let (batches, written) = (store.batches().len(), store.written.load(Ordering::SeqCst));
        store.hold_submits.send_replace(true);
        let submit = {
            let committer = committer.clone();
            let rows = (0..5).map(|i| new(&format!("a{i}"))).collect();
            tokio::spawn(async move { committer.commit(vec![Op::Submit(rows)]).await })
        };
        // The submits and a claim are held; the next claim goes beside them and is
        // written first, without their rows.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.batches().len() < batches + 2
            || store.written.load(Ordering::SeqCst) < written + 1
        {
            assert!(
                std::time::Instant::now() < deadline,
                "no claim beside the submits"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            store.batches()[batches..],
            [2, 1],
            "submits with a claim, then a claim"
        );
        store.hold_submits.send_replace(false);
        assert!(matches!(submit.await, Ok(Ok(_))));
        // The submits' own claim fills one slot; the other is filled too.
        let first = next_task(&mut rx).await;
        let second = next_task(&mut rx).await;
        assert_ne!(first, second);
        committer.stop().await;
        drop(committer);
        let _ = task.await;
    }

    /// Requests queued while a commit runs go into the next transaction together:
    /// a hundred submits, one batch.
    #[tokio::test]
    async fn requests_queued_during_a_commit_share_the_next_one() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = Poisoned::open(&dir).await;
        let (committer, task) = Committer::spawn(
            store.clone(),
            Arc::new(Registry::default()),
            Arc::new(Pending::default()),
            Options {
                lease: Duration::from_secs(30),
            },
            None,
        );
        store.stalled.send_replace(true);
        let first = {
            let committer = committer.clone();
            tokio::spawn(
                async move { committer.commit(vec![Op::Submit(vec![new("first")])]).await },
            )
        };
        // The first batch is inside the store, stalled; these queue behind it.
        while store
            .batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            tokio::task::yield_now().await;
            if first.is_finished() {
                break;
            }
        }
        let mut replies = Vec::new();
        for i in 0..100 {
            let (tx, rx) = oneshot::channel();
            committer
                .commit_with(
                    vec![Op::Submit(vec![new(&format!("a{i}"))])],
                    Box::new(move |r| {
                        let _ = tx.send(r.is_ok());
                    }),
                )
                .await
                .unwrap_or_else(|_| panic!("queued"));
            replies.push(rx);
        }
        store.stalled.send_replace(false);
        assert!(matches!(first.await, Ok(Ok(_))));
        for rx in replies {
            assert_eq!(rx.await.ok(), Some(true));
        }
        let batches = store
            .batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        assert_eq!(batches, vec![1, 100], "one transaction for the hundred");
        committer.stop().await;
        drop(committer);
        let _ = task.await;
    }

    /// A store that writes two batches in turn (SQLite): requests of a row or two
    /// queued behind a small batch wait for it to land and go as one, as with one
    /// writer; a large batch in flight has the next sent beside it at once.
    #[tokio::test]
    async fn only_large_batches_go_beside_a_writer_that_writes_in_turn() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = Poisoned::with_writers_in_turn(&dir, 2, 16).await;
        let (committer, task) = Committer::spawn(
            store.clone(),
            Arc::new(Registry::default().with_writers(2)),
            Arc::new(Pending::default()),
            Options {
                lease: Duration::from_secs(30),
            },
            None,
        );
        let submit = |ids: Vec<String>| {
            let committer = committer.clone();
            tokio::spawn(async move {
                let rows = ids.iter().map(|id| new(id)).collect();
                committer.commit(vec![Op::Submit(rows)]).await
            })
        };
        let until = |n: usize| {
            let store = store.clone();
            async move {
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while store.batches().len() < n {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "{:?}",
                        store.batches()
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };

        store.stalled.send_replace(true);
        let first = submit(vec!["first".into()]);
        until(1).await;
        let small: Vec<_> = (0..10).map(|i| submit(vec![format!("s{i}")])).collect();
        // Give the loop every chance to send one of them beside the first.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(store.batches(), [1], "nothing sent beside a small batch");
        store.stalled.send_replace(false);
        assert!(matches!(first.await, Ok(Ok(_))));
        for reply in small {
            assert!(matches!(reply.await, Ok(Ok(_))));
        }
        assert_eq!(store.batches(), [1, 10], "the ten queued behind it, as one");

        store.stalled.send_replace(true);
        let large = submit((0..20).map(|i| format!("l{i}")).collect());
        until(3).await;
        let beside = submit(vec!["beside".into()]);
        until(4).await;
        assert_eq!(store.batches()[2..], [1, 1], "sent beside the large batch");
        store.stalled.send_replace(false);
        assert!(matches!(large.await, Ok(Ok(_))));
        assert!(matches!(beside.await, Ok(Ok(_))));
        committer.stop().await;
        drop(committer);
        let _ = task.await;
    }

    /// On a store that writes its batches in turn, a worker that arrives to a
    /// backlog has its slots filled by one claim: a claim alone never goes beside
    /// another there, so claims that each took half of the room would fill the
    /// slots over a chain of commits (32, 16, 8, … for 64 slots).
    #[tokio::test]
    async fn one_claim_fills_a_new_worker_where_batches_are_written_in_turn() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = Poisoned::with_writers_in_turn(&dir, 2, 16).await;
        let rows = (0..100).map(|i| new(&format!("a{i}"))).collect();
        assert!(
            store
                .inner
                .apply(Arc::new([Op::Submit(rows)]), 0)
                .await
                .is_ok()
        );
        let (committer, task, mut rx, _registry) = with_worker(store.clone(), 64);
        let mut sent = std::collections::HashSet::new();
        while sent.len() < 64 {
            sent.insert(next_task(&mut rx).await);
        }
        assert_eq!(
            store.batches(),
            [1],
            "one batch, with one claim, filled the 64 slots"
        );
        committer.stop().await;
        drop(committer);
        let _ = task.await;
    }
}
