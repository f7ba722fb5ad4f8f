//! A store with faults a test switches on: stalls, a panicking read, a listener
//! that dies. Wraps a real SQLite store.

// A test helper: what it cannot do fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};

use spool_server::store::{self, Op, Remote, Store, layer::Layer};
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
    /// On a fresh SQLite database in `dir`.
    pub async fn in_dir(dir: &std::path::Path) -> Arc<Self> {
        let database = format!("sqlite://{}", dir.join("f.db").display());
        let inner = store::open(&database).await.expect("open the store");
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
impl Layer for Faulty {
    fn inner(&self) -> &dyn Store {
        self.inner.as_ref()
    }
    async fn before_apply(&self, ops: &[Op]) -> Result<(), store::Error> {
        wait_while(&self.stalled).await;
        if ends_an_attempt(ops) {
            wait_while(&self.held_endings).await;
            take_failure(&self.failed_endings)?;
        }
        Ok(())
    }
    async fn after_apply(&self, ops: &[Op]) -> Result<(), store::Error> {
        if ends_an_attempt(ops) {
            take_failure(&self.lost_replies)?;
        }
        Ok(())
    }
    async fn before_get(&self) -> Result<(), store::Error> {
        wait_while(&self.held_gets).await;
        take_failure(&self.failed_gets)
    }
    fn before_due_times(&self) {
        assert!(
            !self.panic_on_due_times.load(Ordering::SeqCst),
            "injected: due_times panics"
        );
    }
    async fn before_save_ticket(&self) {
        self.tickets_saving.fetch_add(1, Ordering::SeqCst);
        wait_while(&self.held_tickets).await;
    }
    fn single_node(&self) -> bool {
        !self.shared.load(Ordering::SeqCst) && self.inner.single_node()
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

fn ends_an_attempt(ops: &[Op]) -> bool {
    ops.iter().any(|op| matches!(op, Op::Finish { .. }))
}
