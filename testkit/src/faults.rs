//! A store with faults a test switches on: stalls, a panicking read, a listener
//! that dies. Wraps a real SQLite store.

// A test helper: what it cannot do fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};

use spool_proto::time::UnixMillis;
use spool_server::store::{
    self, ActivityRow, DueTimes, Key, ListPage, ListQuery, Op, Outcome, Remote, RunningPage,
    StatusCounts, Store,
};
use tokio::sync::{mpsc, watch};

pub struct Faulty {
    inner: Arc<dyn Store>,
    /// While true, every write waits.
    stalled: watch::Sender<bool>,
    /// `due_times` panics (the committer reads it at start).
    pub panic_on_due_times: AtomicBool,
    /// The sending half of the "other nodes" channel `subscribe` hands out;
    /// dropping it is the listener dying.
    remote: Mutex<Option<mpsc::Sender<Remote>>>,
    /// Whether `subscribe` hands out a channel at all.
    pub listens: AtomicBool,
    /// This many writes that end an attempt fail, as a database that went away
    /// would fail them, before one succeeds again.
    pub failed_endings: AtomicUsize,
    /// This many writes that end an attempt are made and then reported failed, as
    /// a commit whose reply is lost with the connection.
    pub lost_replies: AtomicUsize,
    /// This many reads of one row fail before one succeeds again.
    pub failed_gets: AtomicUsize,
    /// While true, reads of one row wait.
    held_gets: watch::Sender<bool>,
    /// While true, writes that end an attempt wait.
    held_endings: watch::Sender<bool>,
    /// Whether it says it is shared with other nodes (so sessions save tickets).
    pub shared: AtomicBool,
    /// While true, saves of a session's ticket wait.
    held_tickets: watch::Sender<bool>,
    /// How many saves of a ticket have begun.
    pub tickets_saving: AtomicUsize,
}

impl Faulty {
    pub async fn sqlite(database: &str) -> Arc<Self> {
        let inner = store::open(database).await.expect("open the store");
        Arc::new(Self {
            inner,
            stalled: watch::Sender::new(false),
            panic_on_due_times: AtomicBool::new(false),
            remote: Mutex::new(None),
            listens: AtomicBool::new(false),
            failed_endings: AtomicUsize::new(0),
            lost_replies: AtomicUsize::new(0),
            failed_gets: AtomicUsize::new(0),
            held_gets: watch::Sender::new(false),
            held_endings: watch::Sender::new(false),
            shared: AtomicBool::new(false),
            held_tickets: watch::Sender::new(false),
            tickets_saving: AtomicUsize::new(0),
        })
    }

    pub fn stall(&self, stalled: bool) {
        self.stalled.send_replace(stalled);
    }

    pub fn hold_gets(&self, held: bool) {
        self.held_gets.send_replace(held);
    }

    pub fn hold_endings(&self, held: bool) {
        self.held_endings.send_replace(held);
    }

    pub fn hold_tickets(&self, held: bool) {
        self.held_tickets.send_replace(held);
    }

    /// The listener for other nodes dies.
    pub fn kill_listener(&self) {
        self.remote.lock().unwrap().take();
    }
}

/// Waits while `gate` is true.
async fn wait_while(gate: &watch::Sender<bool>) {
    let mut gate = gate.subscribe();
    while *gate.borrow_and_update() {
        if gate.changed().await.is_err() {
            break;
        }
    }
}

/// Takes one of the failures `count` has left to inject, if any.
fn take_failure(count: &AtomicUsize) -> Result<(), store::Error> {
    match count.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)) {
        Ok(_) => Err(store::Error::Sqlite {
            code: 10, // SQLITE_IOERR
            message: "injected: disk I/O error".into(),
        }),
        Err(_) => Ok(()),
    }
}

#[async_trait::async_trait]
impl Store for Faulty {
    async fn apply(&self, ops: Arc<[Op]>, now: UnixMillis) -> Result<Vec<Outcome>, store::Error> {
        wait_while(&self.stalled).await;
        if ops.iter().any(|op| matches!(op, Op::Finish { .. })) {
            wait_while(&self.held_endings).await;
            take_failure(&self.failed_endings)?;
            let outcomes = self.inner.apply(ops, now).await?;
            take_failure(&self.lost_replies)?;
            return Ok(outcomes);
        }
        self.inner.apply(ops, now).await
    }
    async fn get(&self, key: &Key) -> Result<Option<ActivityRow>, store::Error> {
        wait_while(&self.held_gets).await;
        take_failure(&self.failed_gets)?;
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
    async fn type_counts(&self, now: i64) -> Result<Vec<store::TypeCounts>, store::Error> {
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
        assert!(
            !self.panic_on_due_times.load(Ordering::SeqCst),
            "injected: due_times panics"
        );
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
        !self.shared.load(Ordering::SeqCst) && self.inner.single_node()
    }
    fn now(&self) -> UnixMillis {
        self.inner.now()
    }
    async fn save_ticket(&self, ticket: &store::SessionTicket) -> Result<(), store::Error> {
        self.tickets_saving.fetch_add(1, Ordering::SeqCst);
        wait_while(&self.held_tickets).await;
        self.inner.save_ticket(ticket).await
    }
    fn others_staying(&self) -> bool {
        self.inner.others_staying()
    }
    async fn set_draining(&self, draining: bool) {
        self.inner.set_draining(draining).await
    }
    async fn subscribe(&self) -> Result<Option<mpsc::Receiver<Remote>>, store::Error> {
        if !self.listens.load(Ordering::SeqCst) {
            return Ok(None);
        }
        let (tx, rx) = mpsc::channel(16);
        *self.remote.lock().unwrap() = Some(tx);
        Ok(Some(rx))
    }
}
