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

mod batch;
mod effects;

use batch::{Flight, landing, mark_submits_due, rows_written, side_by_side};

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
    /// The store failed the transaction; nothing of the request was written. Its
    /// ops come back, to be tried again without a copy kept beside every request.
    #[error("{why}")]
    Store {
        why: Arc<store::Error>,
        ops: Vec<Op>,
    },
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
            lease_ms: spool_proto::time::millis(options.lease),
            rx,
            timer,
            failure_pause: FIRST_FAILURE_PAUSE,
            carry: Vec::new(),
            fatal: None,
            claimed_alone: false,
            flight: None,
            plan_again: false,
            stop: None,
            closed: false,
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
    /// The batch being written while the next one forms (stores with more than
    /// one writer only).
    flight: Option<Flight>,
    /// Set when a batch went to the store beside one in flight: the room it did
    /// not claim may be claimed by a batch of its own at once.
    plan_again: bool,
    /// A stop asked for: answered once everything queued before it is written.
    stop: Option<oneshot::Sender<()>>,
    /// Every handle is gone.
    closed: bool,
}

/// What one round of the loop writes: its ops, and the requests they answer.
struct Round {
    ops: Vec<Op>,
    requests: Vec<Request>,
}

/// What wakes the loop when nothing is queued.
enum Wake {
    /// The batch in flight was written, or failed.
    Landed(Result<Vec<Outcome>, store::Error>),
    /// A request or a stop; `None` once every handle is gone.
    Message(Option<Message>),
    /// The registry: a slot freed, a worker joined, a row came due.
    Registry,
    /// A delayed row's due time.
    Timer,
    /// Another node's change; `None` once the listener stopped.
    Remote(Option<Remote>),
}

impl Loop {
    async fn run(mut self) {
        let writers = self.store.writers();
        loop {
            let mut round = Round {
                ops: std::mem::take(&mut self.carry),
                requests: Vec::new(),
            };
            // Rows claimed ahead that will not be sent go back with this batch.
            round.ops.extend(self.registry.take_released());
            if round.ops.is_empty() && !self.stopping() && !std::mem::take(&mut self.plan_again) {
                match self.wait().await {
                    Wake::Landed(applied) => {
                        if let Some(landed) = self.flight.take() {
                            self.landed(landed.batch, applied).await;
                        }
                        continue;
                    }
                    Wake::Message(Some(message)) => self.take(message, &mut round),
                    Wake::Message(None) => self.closed = true,
                    Wake::Registry | Wake::Timer => {}
                    Wake::Remote(Some(remote)) => self.on_remote(remote),
                    Wake::Remote(None) => {
                        self.fatal = Some("the listener for other nodes' changes stopped")
                    }
                }
                // Woken to release rows claimed ahead: they precede any request.
                if round.requests.is_empty() {
                    round.ops.extend(self.registry.take_released());
                }
            }
            if let Some(why) = self.fatal {
                // A node deaf to the others, or mute to them, would live on as a
                // zombie: end the loop; the server exits for its supervisor.
                tracing::error!("{why}: the committer stops");
                self.land().await;
                answer_closed(round.requests);
                return;
            }
            self.hear_remote();
            self.take_queued(&mut round);
            self.land_small(&mut round).await;
            let now = self.store.now();
            self.fire_timer(now).await;
            // Rows submitted in this very batch can be claimed in it too: one commit
            // from submit to dispatch.
            mark_submits_due(&self.registry, &round.ops, now);
            let first_claim = round.ops.len();
            if !self.stopping() {
                self.plan_claims(&mut round.ops, now);
            }
            if round.ops.is_empty() {
                if !round.requests.is_empty() {
                    // Requests with no ops (a barrier: "everything before me is in").
                    self.land().await;
                    answer(round.requests, Vec::new());
                }
            } else if writers < 2 {
                self.write(round.ops, round.requests, first_claim, now)
                    .await;
            } else {
                self.send(round, first_claim, now).await;
            }
            if self.stopping() {
                // Everything queued before the stop is in; later senders see Closed.
                self.land().await;
                if self.carry.is_empty() {
                    break;
                }
            }
        }
        // What the last batches changed reaches the other nodes before `stop` returns.
        self.peers.stop().await;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Whether a stop was asked for, or every handle is gone.
    fn stopping(&self) -> bool {
        self.stop.is_some() || self.closed
    }

    /// Waits for whatever comes first with nothing queued.
    async fn wait(&mut self) -> Wake {
        let deadline = self
            .timer
            .next()
            .map(|at| due::instant_for(at, self.store.now()));
        tokio::select! {
            biased;
            applied = landing(&mut self.flight), if self.flight.is_some() => Wake::Landed(applied),
            message = self.rx.recv() => Wake::Message(message),
            _ = self.registry.woken() => Wake::Registry,
            _ = sleep_until(deadline), if deadline.is_some() => Wake::Timer,
            remote = self.peers.recv(), if self.peers.listening() => Wake::Remote(remote),
        }
    }

    /// Remote events are read every round, not only when the select picks them:
    /// a busy node must still hear the others.
    fn hear_remote(&mut self) {
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
    }

    /// A store that writes its batches in turn (SQLite) gains from one sent beside
    /// another only when landing that one is real work to overlap: small batches
    /// wait for the one in flight and go as one, as a single writer's would.
    async fn land_small(&mut self, round: &mut Round) {
        let small = self.store.beside_min_rows();
        if !self
            .flight
            .as_ref()
            .is_some_and(|f| rows_written(&f.batch.ops) < small && rows_written(&round.ops) < small)
        {
            return;
        }
        self.land().await;
        // What landing it released goes first, as at the top of the loop.
        let mut front = std::mem::take(&mut self.carry);
        front.extend(self.registry.take_released());
        if !front.is_empty() {
            for request in &mut round.requests {
                request.range = request.range.start + front.len()..request.range.end + front.len();
            }
            front.append(&mut round.ops);
            round.ops = front;
        }
        self.take_queued(round);
    }

    /// Adds the claims the registry plans for workers with room, knowing those
    /// of the batch in flight.
    fn plan_claims(&self, ops: &mut Vec<Op>, now: UnixMillis) {
        let in_flight: Vec<&store::Claim> = self
            .flight
            .iter()
            .flat_map(|f| store::claims(&f.batch.ops[f.batch.first_claim..]))
            .collect();
        let claims = self
            .registry
            .plan_claims(now.saturating_add(self.lease_ms), &in_flight);
        ops.extend(claims.into_iter().map(Op::Claim));
    }

    /// Sends the round's batch to a store that writes two at once: the next batch
    /// goes before the one in flight lands, so the store writes one while the loop
    /// applies the other's effects; effects are still applied in the order batches
    /// formed. Only batches of submits, endings and claims go side by side.
    async fn send(&mut self, round: Round, first_claim: usize, now: UnixMillis) {
        let beside = round.ops.iter().all(side_by_side);
        if !beside || self.flight.as_ref().is_some_and(|f| !f.beside) {
            self.land().await;
        }
        let claimed = first_claim < round.ops.len();
        let mut next = self
            .launch(round.ops, round.requests, first_claim, now, beside)
            .await;
        if claimed && let Some(overtaken) = self.flight.as_mut() {
            overtaken.batch.overtaken = true;
        }
        self.claimed_alone = false;
        self.land().await;
        // The failed batch's claims went to the store after `next`, and could not
        // see its submits either.
        if std::mem::take(&mut self.claimed_alone) {
            next.batch.overtaken = true;
        }
        self.flight = Some(next);
        if self.stopping() {
            self.land().await;
        } else {
            // The room this batch's claims did not take may be claimed by a batch
            // of its own at once, without waiting for a request.
            self.plan_again = claimed;
        }
    }

    /// Takes the requests queued now, up to a batch's worth.
    fn take_queued(&mut self, round: &mut Round) {
        while round.ops.len() < MAX_BATCH_OPS && self.stop.is_none() {
            match self.rx.try_recv() {
                Ok(m) => self.take(m, round),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.closed = true;
                    break;
                }
            }
        }
    }

    fn take(&mut self, message: Message, round: &mut Round) {
        match message {
            Message::Request { ops: mine, reply } => {
                let start = round.ops.len();
                round.ops.extend(mine);
                round.requests.push(Request {
                    range: start..round.ops.len(),
                    reply,
                });
            }
            Message::Stop(tx) => self.stop = Some(tx),
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
mod tests;
