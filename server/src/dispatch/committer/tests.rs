//! The committer's tests: batches that fail, claims beside submits, requests
//! that share a commit, and batches written in turn or side by side.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::{
    dispatch::outbound::{Outgoing, ToWorker},
    dispatch::registry::Registration,
    store::{NewActivity, RetrySpec, SqliteStore, layer::Layer},
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
impl Layer for Poisoned {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }
    async fn before_apply(&self, ops: &[Op]) -> Result<(), store::Error> {
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
        Ok(())
    }
    async fn after_apply(&self, _ops: &[Op]) -> Result<(), store::Error> {
        self.written.fetch_add(1, Ordering::SeqCst);
        Ok(())
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
        retry: RetrySpec {
            max_attempts: 3,
            initial_interval_ms: 1000,
            backoff_coefficient: 2.0,
            max_interval_ms: 60_000,
            non_retryable: Vec::new(),
        },
        ..store::new_activity_for_tests(id, "t")
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
        Registration::for_tests(max_concurrency),
        spool_proto::time::now_millis(),
    );
    (committer, task, rx, registry)
}

async fn next_task(rx: &mut mpsc::Receiver<Outgoing>) -> String {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no task in time"))
            .unwrap_or_else(|| panic!("outbound closed"));
        if let ToWorker::Task(task) = message.message {
            return task.row.key.activity_id;
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
        assert!(matches!(poisoned, Err(CommitError::Store { .. })));
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
    while store.batches().len() < batches + 2 || store.written.load(Ordering::SeqCst) < written + 1
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
        tokio::spawn(async move { committer.commit(vec![Op::Submit(vec![new("first")])]).await })
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
