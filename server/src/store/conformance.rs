//! The behaviour every [`Store`] must have, written once and run against each
//! backend. A behaviour change starts here.

use std::sync::Arc;

use super::*;
use crate::lifecycle::{self, Attempt};

/// A fresh, empty store of one backend, and what keeps it alive.
struct Fixture {
    store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
}

async fn sqlite() -> Option<Fixture> {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let url = format!("sqlite://{}", dir.path().join("spool.db").display());
    let store = SqliteStore::open(&url)
        .await
        .unwrap_or_else(|e| panic!("open {url}: {e}"));
    Some(Fixture {
        store: Arc::new(store),
        _dir: Some(dir),
    })
}

/// The environment variable naming the PostgreSQL server the suite runs against.
const POSTGRES_URL: &str = "SPOOL_TEST_POSTGRES_URL";

/// A store in a schema of its own, so tests run in parallel on one server.
/// Without a server configured the PostgreSQL half is skipped, but not under
/// `CI=true`: there it must run.
async fn postgres() -> Option<Fixture> {
    use sqlx::{
        Connection,
        postgres::{PgConnectOptions, PgConnection},
    };
    use std::str::FromStr;
    let Ok(url) = std::env::var(POSTGRES_URL) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{POSTGRES_URL} must name a PostgreSQL server under CI=true"
        );
        eprintln!("skipping the PostgreSQL store: {POSTGRES_URL} is not set");
        return None;
    };
    let schema = format!("spool_test_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect to {POSTGRES_URL}: {e}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("create schema: {e}"));
    let options = PgConnectOptions::from_str(&url)
        .unwrap_or_else(|e| panic!("{POSTGRES_URL}: {e}"))
        .options([("search_path", schema.as_str())]);
    let store = PostgresStore::open_with(options)
        .await
        .unwrap_or_else(|e| panic!("open the PostgreSQL store: {e}"));
    Some(Fixture {
        store: Arc::new(store),
        _dir: None,
    })
}

/// Runs one conformance check against every backend.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite_backend {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(f) = super::sqlite().await {
                        super::$name(f.store.as_ref()).await;
                    }
                }
            )*
        }
        mod postgres_backend {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(f) = super::postgres().await {
                        super::$name(f.store.as_ref()).await;
                    }
                }
            )*
        }
    };
}

conformance!(
    submit_is_idempotent_per_key,
    submit_conflicts_on_another_type,
    submit_batch_is_all_or_nothing,
    claim_takes_due_rows_by_priority_then_age,
    claim_respects_limit_types_and_namespace,
    finish_is_fenced_by_attempt_and_status,
    retry_and_snooze_reschedule,
    cancel_and_redrive,
    list_pages_and_filters,
    stats_count_by_status,
    prune_deletes_only_old_finished_rows,
    running_and_due_times,
    runs_of_like_ops_behave_as_op_by_op,
    renew_extends_only_attempts_still_running,
);

const T0: i64 = 1_000_000;

fn key(id: &str) -> Key {
    Key {
        namespace: "default".into(),
        workflow_id: "wf".into(),
        activity_id: id.into(),
    }
}

fn new(id: &str, ty: &str) -> NewActivity {
    NewActivity {
        key: key(id),
        activity_type: ty.into(),
        input: Payload {
            content_type: String::new(),
            data: format!("\"{id}\"").into_bytes(),
        },
        next_at: T0,
        retry: RetrySpec {
            max_attempts: 3,
            initial_interval_ms: 1000,
            backoff_coefficient: 2.0,
            max_interval_ms: 60_000,
            non_retryable: vec!["Fatal".into()],
        },
        timeouts: Timeouts::default(),
        priority: 0,
    }
}

async fn apply(store: &dyn Store, ops: Vec<Op>, now: i64) -> Vec<Outcome> {
    store
        .apply(ops.into(), now)
        .await
        .unwrap_or_else(|e| panic!("apply failed: {e}"))
}

async fn one(store: &dyn Store, op: Op, now: i64) -> Outcome {
    apply(store, vec![op], now)
        .await
        .pop()
        .unwrap_or_else(|| panic!("no outcome"))
}

async fn submit(store: &dyn Store, activity: NewActivity) -> Vec<Submitted> {
    match one(store, Op::Submit(vec![activity]), T0).await {
        Outcome::Submitted(s) => s,
        other => panic!("expected Submitted, got {other:?}"),
    }
}

async fn get(store: &dyn Store, id: &str) -> ActivityRow {
    store
        .get(&key(id))
        .await
        .unwrap_or_else(|e| panic!("get: {e}"))
        .unwrap_or_else(|| panic!("{id} not found"))
}

fn claim_for(types: &[&str], limit: u32) -> Op {
    Op::Claim(Claim {
        namespace: "default".into(),
        activity_types: types.iter().map(|t| Arc::<str>::from(*t)).collect(),
        worker_id: "w1".into(),
        limit,
        lease_expires_at: T0 + 30_000,
    })
}

async fn claim(store: &dyn Store, types: &[&str], limit: u32, now: i64) -> Vec<ActivityRow> {
    match one(store, claim_for(types, limit), now).await {
        Outcome::Claimed(rows) => rows,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

async fn finish(store: &dyn Store, row: &ActivityRow, transition: Transition, now: i64) -> bool {
    let op = Op::Finish {
        attempt: Arc::new(Attempt::from_row(row)),
        transition,
        lease_expired_by: None,
    };
    match one(store, op, now).await {
        Outcome::Finished { accepted } => accepted,
        other => panic!("expected Finished, got {other:?}"),
    }
}

fn output(s: &str) -> Transition {
    Transition::Complete {
        output: Payload {
            content_type: "text/plain".into(),
            data: s.as_bytes().to_vec(),
        },
    }
}

async fn submit_is_idempotent_per_key(store: &dyn Store) {
    let first = submit(store, new("a", "t")).await;
    assert!(first[0].created);
    assert_eq!(first[0].row.status, ActivityStatus::Scheduled);
    assert_eq!(first[0].row.attempt, 0);
    let mut again = new("a", "t");
    again.input.data = b"\"different\"".to_vec();
    let second = submit(store, again).await;
    assert!(!second[0].created);
    assert_eq!(second[0].row.id, first[0].row.id);
    assert_eq!(
        second[0].row.input.data, b"\"a\"",
        "the stored row is unchanged"
    );
}

async fn submit_conflicts_on_another_type(store: &dyn Store) {
    submit(store, new("a", "t")).await;
    match one(store, Op::Submit(vec![new("a", "other")]), T0).await {
        Outcome::Conflict {
            index,
            existing_type,
        } => {
            assert_eq!(index, 0);
            assert_eq!(existing_type, "t");
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(get(store, "a").await.activity_type, "t");
}

async fn submit_batch_is_all_or_nothing(store: &dyn Store) {
    submit(store, new("taken", "t")).await;
    let batch = vec![new("b1", "t"), new("taken", "other"), new("b3", "t")];
    match one(store, Op::Submit(batch), T0).await {
        Outcome::Conflict { index, .. } => assert_eq!(index, 1),
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert!(
        store.get(&key("b1")).await.ok().flatten().is_none(),
        "b1 must be rolled back"
    );
    // A batch naming one key twice inserts it once.
    match one(store, Op::Submit(vec![new("d", "t"), new("d", "t")]), T0).await {
        Outcome::Submitted(s) => {
            assert!(s[0].created);
            assert!(!s[1].created);
            assert_eq!(s[0].row.id, s[1].row.id);
        }
        other => panic!("expected Submitted, got {other:?}"),
    }
    // Ops of one batch see each other, in order.
    let outcomes = apply(
        store,
        vec![Op::Submit(vec![new("e", "t")]), claim_for(&["t"], 10)],
        T0,
    )
    .await;
    match &outcomes[1] {
        Outcome::Claimed(rows) => assert!(rows.iter().any(|r| r.key.activity_id == "e")),
        other => panic!("expected Claimed, got {other:?}"),
    }
}

async fn claim_takes_due_rows_by_priority_then_age(store: &dyn Store) {
    let mut old = new("old", "t");
    old.next_at = T0 - 10;
    let mut urgent = new("urgent", "t");
    urgent.priority = 5;
    let mut later = new("later", "t");
    later.next_at = T0 + 1_000;
    for a in [new("young", "t"), urgent, old, later] {
        submit(store, a).await;
    }
    let rows = claim(store, &["t"], 2, T0).await;
    let mut ids: Vec<_> = rows.iter().map(|r| r.key.activity_id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["old", "urgent"]);
    for row in &rows {
        assert_eq!(row.status, ActivityStatus::Running);
        assert_eq!(row.attempt, 1);
        assert_eq!(row.worker_id.as_deref(), Some("w1"));
        assert_eq!(row.started_at, Some(T0));
        assert_eq!(row.lease_expires_at, Some(T0 + 30_000));
    }
    let rows = claim(store, &["t"], 10, T0).await;
    assert_eq!(rows.len(), 1, "only 'young' is due; 'later' is not");
    assert!(claim(store, &["t"], 10, T0).await.is_empty());
    let rows = claim(store, &["t"], 10, T0 + 1_000).await;
    assert_eq!(rows[0].key.activity_id, "later");
}

async fn claim_respects_limit_types_and_namespace(store: &dyn Store) {
    for (id, ty) in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("c1", "c")] {
        submit(store, new(id, ty)).await;
    }
    let mut other_ns = new("x", "a");
    other_ns.key.namespace = "other".into();
    submit(store, other_ns).await;
    let rows = claim(store, &["a", "b"], 2, T0).await;
    assert_eq!(rows.len(), 2);
    let rows = claim(store, &["a", "b"], 10, T0).await;
    assert_eq!(rows.len(), 1);
    assert!(claim(store, &["a", "b"], 10, T0).await.is_empty());
    assert_eq!(get(store, "c1").await.status, ActivityStatus::Scheduled);
}

async fn finish_is_fenced_by_attempt_and_status(store: &dyn Store) {
    submit(store, new("a", "t")).await;
    let row = claim(store, &["t"], 1, T0).await.remove(0);
    let mut stale = row.clone();
    stale.attempt = 0;
    assert!(!finish(store, &stale, output("stale"), T0).await);
    assert!(finish(store, &row, output("done"), T0 + 5).await);
    assert!(
        !finish(store, &row, output("twice"), T0 + 6).await,
        "a second result is refused"
    );
    let done = get(store, "a").await;
    assert_eq!(done.status, ActivityStatus::Completed);
    assert_eq!(done.output.map(|o| o.data), Some(b"done".to_vec()));
    assert_eq!(done.finished_at, Some(T0 + 5));
}

async fn retry_and_snooze_reschedule(store: &dyn Store) {
    submit(store, new("a", "t")).await;
    let row = claim(store, &["t"], 1, T0).await.remove(0);
    let error = lifecycle::server_error(ErrorKind::Retryable, "Boom", "first".into());
    let retry = Transition::Retry {
        next_at: T0 + 500,
        error,
    };
    assert!(finish(store, &row, retry, T0).await);
    let row = get(store, "a").await;
    assert_eq!(row.status, ActivityStatus::Scheduled);
    assert_eq!(row.next_at, T0 + 500);
    assert_eq!(
        row.last_error.as_ref().map(|e| e.r#type.as_str()),
        Some("Boom")
    );
    assert!(claim(store, &["t"], 1, T0 + 499).await.is_empty());
    let row = claim(store, &["t"], 1, T0 + 500).await.remove(0);
    assert_eq!(row.attempt, 2);
    assert!(
        finish(
            store,
            &row,
            Transition::Snooze { next_at: T0 + 900 },
            T0 + 600
        )
        .await
    );
    let row = get(store, "a").await;
    assert_eq!(
        (row.status, row.uncounted, row.next_at),
        (ActivityStatus::Scheduled, 1, T0 + 900)
    );
    assert_eq!(
        row.last_error.map(|e| e.message),
        Some("first".into()),
        "a snooze keeps the last error"
    );
    let row = claim(store, &["t"], 1, T0 + 900).await.remove(0);
    assert!(finish(store, &row, Transition::Release, T0 + 950).await);
    let row = get(store, "a").await;
    assert_eq!(
        (row.status, row.uncounted, row.attempt, row.next_at),
        (ActivityStatus::Scheduled, 2, 3, T0 + 950)
    );
    let row = claim(store, &["t"], 1, T0 + 950).await.remove(0);
    let error = lifecycle::server_error(ErrorKind::Terminal, "Fatal", "no".into());
    assert!(finish(store, &row, Transition::Fail { error }, T0 + 1_000).await);
    let row = get(store, "a").await;
    assert_eq!(row.status, ActivityStatus::Failed);
    assert_eq!(row.finished_at, Some(T0 + 1_000));
}

async fn cancel_and_redrive(store: &dyn Store) {
    submit(store, new("s", "t")).await;
    match one(
        store,
        Op::Cancel {
            key: key("s"),
            reason: "changed my mind".into(),
        },
        T0 + 1,
    )
    .await
    {
        Outcome::Cancelled { prior, row } => {
            assert_eq!(prior, ActivityStatus::Scheduled);
            assert_eq!(row.status, ActivityStatus::Cancelled);
            assert_eq!(
                row.last_error.map(|e| e.message),
                Some("changed my mind".into())
            );
        }
        other => panic!("expected Cancelled, got {other:?}"),
    }
    assert!(
        claim(store, &["t"], 10, T0 + 2).await.is_empty(),
        "a cancelled row is never claimed"
    );
    match one(
        store,
        Op::Cancel {
            key: key("s"),
            reason: String::new(),
        },
        T0 + 3,
    )
    .await
    {
        Outcome::WrongStatus(ActivityStatus::Cancelled) => {}
        other => panic!("expected WrongStatus, got {other:?}"),
    }
    submit(store, new("r", "t")).await;
    let running = claim(store, &["t"], 1, T0).await.remove(0);
    match one(
        store,
        Op::Cancel {
            key: key("r"),
            reason: String::new(),
        },
        T0 + 4,
    )
    .await
    {
        Outcome::Cancelled { prior, row } => {
            assert_eq!(prior, ActivityStatus::Running);
            assert_eq!(row.worker_id.as_deref(), Some("w1"));
            assert_eq!(row.attempt, 1);
        }
        other => panic!("expected Cancelled, got {other:?}"),
    }
    assert!(
        !finish(store, &running, output("late"), T0 + 5).await,
        "a result after cancel is refused"
    );
    match one(store, Op::Redrive { key: key("r") }, T0 + 6).await {
        Outcome::Redriven { row } => {
            assert_eq!(row.status, ActivityStatus::Scheduled);
            assert_eq!(row.uncounted, row.attempt);
        }
        other => panic!("expected Redriven, got {other:?}"),
    }
    let again = claim(store, &["t"], 1, T0 + 6).await.remove(0);
    assert_eq!(again.attempt, 2, "attempt keeps growing across a re-drive");
    assert!(!finish(store, &running, output("older"), T0 + 7).await);
    match one(store, Op::Redrive { key: key("r") }, T0 + 8).await {
        Outcome::WrongStatus(ActivityStatus::Running) => {}
        other => panic!("expected WrongStatus, got {other:?}"),
    }
    match one(
        store,
        Op::Redrive {
            key: key("missing"),
        },
        T0,
    )
    .await
    {
        Outcome::NotFound => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
}

async fn list_pages_and_filters(store: &dyn Store) {
    for i in 0..7 {
        submit(
            store,
            new(&format!("a{i}"), if i % 2 == 0 { "even" } else { "odd" }),
        )
        .await;
    }
    claim(store, &["odd"], 1, T0).await;
    let page = |after_id, status, ty: Option<&str>| ListQuery {
        namespace: "default".into(),
        status,
        activity_type: ty.map(Into::into),
        after_id,
        limit: 3,
    };
    let first = store.list(&page(0, None, None)).await.unwrap_or_default();
    assert_eq!(first.len(), 3);
    let last_id = first.last().map_or(0, |r| r.id);
    let second = store
        .list(&page(last_id, None, None))
        .await
        .unwrap_or_default();
    assert_eq!(second.len(), 3);
    assert!(second.iter().all(|r| r.id > last_id));
    let evens = store
        .list(&page(0, None, Some("even")))
        .await
        .unwrap_or_default();
    assert!(evens.iter().all(|r| r.activity_type == "even"));
    let running = store
        .list(&page(0, Some(ActivityStatus::Running), None))
        .await
        .unwrap_or_default();
    assert_eq!(running.len(), 1);
    let other = ListQuery {
        namespace: "other".into(),
        ..page(0, None, None)
    };
    assert!(store.list(&other).await.unwrap_or_default().is_empty());
}

async fn stats_count_by_status(store: &dyn Store) {
    for i in 0..5 {
        submit(store, new(&format!("a{i}"), "t")).await;
    }
    let rows = claim(store, &["t"], 2, T0).await;
    finish(store, &rows[0], output("ok"), T0).await;
    one(
        store,
        Op::Cancel {
            key: key("a4"),
            reason: String::new(),
        },
        T0,
    )
    .await;
    let counts = store.stats("default").await.unwrap_or_default();
    assert_eq!(
        counts,
        StatusCounts {
            scheduled: 2,
            running: 1,
            completed: 1,
            failed: 0,
            cancelled: 1,
        }
    );
    assert_eq!(
        store.stats("other").await.unwrap_or_default(),
        StatusCounts::default()
    );
}

async fn prune_deletes_only_old_finished_rows(store: &dyn Store) {
    for id in ["old", "new", "open"] {
        submit(store, new(id, "t")).await;
    }
    one(
        store,
        Op::Cancel {
            key: key("old"),
            reason: String::new(),
        },
        T0,
    )
    .await;
    one(
        store,
        Op::Cancel {
            key: key("new"),
            reason: String::new(),
        },
        T0 + 100,
    )
    .await;
    match one(
        store,
        Op::Prune {
            before: T0 + 50,
            limit: 10,
        },
        T0 + 200,
    )
    .await
    {
        Outcome::Pruned(n) => assert_eq!(n, 1),
        other => panic!("expected Pruned, got {other:?}"),
    }
    assert!(store.get(&key("old")).await.ok().flatten().is_none());
    assert!(store.get(&key("new")).await.ok().flatten().is_some());
    assert!(store.get(&key("open")).await.ok().flatten().is_some());
}

async fn running_and_due_times(store: &dyn Store) {
    let mut later = new("later", "t");
    later.next_at = T0 + 5_000;
    let mut later_too = new("later-too", "t");
    later_too.next_at = T0 + 5_000;
    let mut other = new("other", "u");
    other.next_at = T0 + 9_000;
    submit(store, new("now", "t")).await;
    submit(store, later).await;
    submit(store, later_too).await;
    submit(store, other).await;
    let due = |after, limit| async move { store.due_times(after, limit).await.unwrap_or_default() };
    let ns = || "default".to_string();
    let all = due(T0, 10).await;
    assert_eq!(
        all.times,
        vec![
            (T0 + 5_000, ns(), "t".to_string()),
            (T0 + 9_000, ns(), "u".to_string())
        ],
        "one entry per time, namespace and type"
    );
    assert!(all.complete);
    let first = due(T0 - 1, 1).await;
    assert_eq!(first.times, vec![(T0, ns(), "t".to_string())]);
    assert!(!first.complete, "a read that stopped at its limit says so");
    claim(store, &["t"], 1, T0).await;
    let running = store.running().await.unwrap_or_default();
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].key.activity_id, "now");
}

async fn runs_of_like_ops_behave_as_op_by_op(store: &dyn Store) {
    let outcomes = apply(
        store,
        vec![
            Op::Submit(vec![new("a", "t")]),
            Op::Submit(vec![new("b", "t"), new("c", "t")]),
            Op::Submit(vec![new("d", "t")]),
            Op::Submit(vec![new("e", "t")]),
        ],
        T0,
    )
    .await;
    let ids: Vec<i64> = outcomes
        .iter()
        .flat_map(|o| match o {
            Outcome::Submitted(s) => s
                .iter()
                .map(|s| {
                    assert!(s.created);
                    s.row.id
                })
                .collect::<Vec<_>>(),
            other => panic!("expected Submitted, got {other:?}"),
        })
        .collect();
    assert_eq!(ids.len(), 5);
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids follow submission order: {ids:?}"
    );
    let b = get(store, "b").await;
    assert_eq!(
        (b.input.data.as_slice(), b.retry.non_retryable.as_slice()),
        (&b"\"b\""[..], &["Fatal".to_string()][..])
    );

    let rows = claim(store, &["t"], 5, T0).await;
    let row = |id: &str| {
        rows.iter()
            .find(|r| r.key.activity_id == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} claimed"))
    };
    let mut stale = row("e");
    stale.attempt = 7;
    let error = lifecycle::server_error(ErrorKind::Retryable, "Boom", "bulk".into());
    let finishes = vec![
        (row("a"), output("A")),
        (
            row("b"),
            Transition::Retry {
                next_at: T0 + 10,
                error: error.clone(),
            },
        ),
        (row("c"), Transition::Fail { error }),
        (row("d"), Transition::Snooze { next_at: T0 + 20 }),
        (stale, output("stale")),
    ];
    let ops = finishes
        .into_iter()
        .map(|(row, transition)| Op::Finish {
            attempt: Arc::new(Attempt::from_row(&row)),
            transition,
            lease_expired_by: None,
        })
        .collect();
    let accepted: Vec<bool> = apply(store, ops, T0 + 5)
        .await
        .into_iter()
        .map(|o| matches!(o, Outcome::Finished { accepted: true }))
        .collect();
    assert_eq!(accepted, [true, true, true, true, false]);
    let a = get(store, "a").await;
    assert_eq!(
        (a.status, a.output.map(|o| o.data)),
        (ActivityStatus::Completed, Some(b"A".to_vec()))
    );
    let b = get(store, "b").await;
    assert_eq!((b.status, b.next_at), (ActivityStatus::Scheduled, T0 + 10));
    assert_eq!(b.last_error.map(|e| e.message), Some("bulk".into()));
    assert_eq!(get(store, "c").await.status, ActivityStatus::Failed);
    let d = get(store, "d").await;
    assert_eq!(
        (d.status, d.uncounted, d.next_at),
        (ActivityStatus::Scheduled, 1, T0 + 20)
    );
    assert_eq!(get(store, "e").await.status, ActivityStatus::Running);

    // A run naming a key that exists falls back and still answers per op.
    let outcomes = apply(
        store,
        vec![
            Op::Submit(vec![new("f", "t")]),
            Op::Submit(vec![new("a", "t")]),
            Op::Submit(vec![new("a", "u")]),
        ],
        T0,
    )
    .await;
    assert!(matches!(&outcomes[0], Outcome::Submitted(s) if s[0].created));
    assert!(matches!(&outcomes[1], Outcome::Submitted(s) if !s[0].created));
    assert!(matches!(&outcomes[2], Outcome::Conflict { index: 0, .. }));
}

async fn renew_extends_only_attempts_still_running(store: &dyn Store) {
    for id in ["a", "b", "c"] {
        submit(store, new(id, "t")).await;
    }
    let rows = claim(store, &["t"], 3, T0).await;
    let row = |id: &str| {
        rows.iter()
            .find(|r| r.key.activity_id == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id}"))
    };
    let (a, b, c) = (row("a"), row("b"), row("c"));
    finish(store, &b, output("done"), T0 + 1).await;
    let attempts = vec![(a.id, a.attempt), (b.id, b.attempt), (c.id, c.attempt + 1)];
    match one(
        store,
        Op::Renew {
            attempts,
            lease_expires_at: T0 + 99_000,
        },
        T0 + 2,
    )
    .await
    {
        Outcome::Renewed(renewed) => assert_eq!(
            renewed,
            vec![(a.id, a.attempt)],
            "not b (finished), not c (another attempt)"
        ),
        other => panic!("expected Renewed, got {other:?}"),
    }
    assert_eq!(get(store, "a").await.lease_expires_at, Some(T0 + 99_000));
    assert_eq!(get(store, "c").await.lease_expires_at, Some(T0 + 30_000));
}
