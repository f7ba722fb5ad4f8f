//! The behaviour every [`Store`] must have, written once and run against each
//! backend. A behaviour change starts here.

use std::sync::Arc;

use super::*;
use crate::{
    lifecycle,
    store::{Attempt, concurrency, fairness::FairnessWeight},
};

/// A fresh, empty store of one backend, and what keeps it alive.
struct Fixture {
    store: Arc<dyn Store>,
    raw: Raw,
    _dir: Option<tempfile::TempDir>,
}

/// A connection beside the store's own, for writing what no operation can (a row
/// an older version poisoned) and reading what no operation returns.
enum Raw {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Raw {
    async fn execute(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        let done = match self {
            Raw::Sqlite(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
            Raw::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
        };
        done.unwrap_or_else(|e| panic!("{e}"));
    }

    /// The one integer `sql` answers.
    async fn scalar(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        let read = match self {
            Raw::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            Raw::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        };
        read.unwrap_or_else(|e| panic!("{e}"))
    }

    fn is_sqlite(&self) -> bool {
        matches!(self, Raw::Sqlite(_))
    }
}

async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let url = format!("sqlite://{}", dir.path().join("spool.db").display());
    let store = SqliteStore::open(&url)
        .await
        .unwrap_or_else(|e| panic!("open {url}: {e}"));
    let raw = sqlx::SqlitePool::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    Fixture {
        store: Arc::new(store),
        raw: Raw::Sqlite(raw),
        _dir: Some(dir),
    }
}

/// A store in a schema of its own, so tests run in parallel on one server. The
/// PostgreSQL half compiles as ignored where PostgreSQL cannot be had (see
/// `tests/support/services.rs`); where it runs, a missing server fails it.
async fn postgres() -> Fixture {
    use sqlx::postgres::PgConnectOptions;
    use std::str::FromStr;
    let url = crate::fixtures::postgres_schema("conformance").await;
    let options = PgConnectOptions::from_str(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
    let store = PostgresStore::open_with(options.clone())
        .await
        .unwrap_or_else(|e| panic!("open the PostgreSQL store: {e}"));
    let raw = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    Fixture {
        store: Arc::new(store),
        raw: Raw::Postgres(raw),
        _dir: None,
    }
}

/// Runs one conformance check against every backend.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite_backend {
            $(
                #[tokio::test]
                async fn $name() {
                    let f = super::sqlite().await;
                    super::$name(f.store.as_ref(), &f.raw).await;
                }
            )*
        }
        mod postgres_backend {
            $(
                #[tokio::test]
                #[cfg_attr(
                    not(spool_test_postgres),
                    ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
                )]
                async fn $name() {
                    let f = super::postgres().await;
                    super::$name(f.store.as_ref(), &f.raw).await;
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
    a_claimed_row_is_what_the_store_holds,
    a_claim_returns_its_rows_in_claim_order,
    priority_ages_once_set_and_is_strict_again_when_unset,
    priority_aging_ranks_a_keys_waiting_rows_again,
    a_priority_aging_change_ranks_waiting_rows_in_steps,
    a_rate_limit_holds_claims_to_its_bucket,
    a_keys_rate_limit_holds_only_its_rows,
    a_concurrency_key_runs_at_most_its_limit,
    keys_share_a_claim_and_take_turns,
    keys_are_served_in_proportion_to_their_weights,
    a_key_back_from_a_retry_has_no_credit_for_its_absence,
    a_key_may_have_its_own_limit,
    key_counts_follow_every_move_of_their_rows,
    a_key_with_nothing_due_does_not_hold_back_the_others,
    concurrency_strategies_cancel_the_newest_or_the_oldest,
    a_batchs_endings_make_room_for_its_submits,
    a_fairness_keys_backlog_does_not_delay_another_keys_rows,
    fairness_keys_are_served_in_proportion_to_their_weights,
    a_weight_set_for_a_fairness_key_places_its_new_rows,
    fairness_keys_order_a_concurrency_keys_own_rows,
    a_newcomer_joins_the_head_of_a_backlog_behind_now,
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
    computed_times_saturate_and_stay_integers,
    list_pages_are_bounded_by_bytes,
    a_batch_answers_existing_keys_without_payloads,
    claims_skip_rows_past_schedule_to_close,
    an_unreadable_row_is_left_out_of_every_read,
    every_submit_is_refused_or_stored_and_read_back_equal,
    a_reclaim_is_refused_after_renewal_and_accepted_after_expiry,
    expire_scheduled_fails_only_overdue_waiting_rows,
    record_heartbeats_is_fenced_by_attempt,
    every_ended_attempt_is_in_the_history,
    history_is_bounded_and_pruned_with_its_activity,
    type_counts_split_the_backlog,
    a_lost_sessions_ending_is_fenced_to_its_node,
    a_session_is_taken_over_once_with_its_ticket,
    endings_and_the_claim_that_refills_their_slots_share_a_batch,
    every_status_lists_in_order_and_counts_apart_from_other_namespaces,
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
        headers: Default::default(),
        concurrency_key: None,
        fairness: None,
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
        identity: "host-1".into(),
        node: "node-a".into(),
        limit,
        lease_expires_at: T0 + 30_000,
        epoch: 0,
    })
}

async fn claim(store: &dyn Store, types: &[&str], limit: u32, now: i64) -> Vec<ActivityRow> {
    match one(store, claim_for(types, limit), now).await {
        Outcome::Claimed { rows, .. } => rows,
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

async fn submit_is_idempotent_per_key(store: &dyn Store, _raw: &Raw) {
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

async fn submit_conflicts_on_another_type(store: &dyn Store, _raw: &Raw) {
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

async fn submit_batch_is_all_or_nothing(store: &dyn Store, _raw: &Raw) {
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
        Outcome::Claimed { rows, .. } => assert!(rows.iter().any(|r| r.key.activity_id == "e")),
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// The rows of one claim come back in claim order, which is the order they are
/// sent in: a worker with one free slot and rows ahead runs the most urgent
/// first, whatever order the rows were stored in.
async fn a_claim_returns_its_rows_in_claim_order(store: &dyn Store, _raw: &Raw) {
    for a in [
        ranked("low-a", 0, T0 - 30),
        ranked("low-b", 0, T0 - 20),
        ranked("high", 5, T0 - 10),
        ranked("low-c", 0, T0 - 40),
    ] {
        submit(store, a).await;
    }
    let rows = claim(store, &["t"], 10, T0).await;
    let ids: Vec<_> = rows.iter().map(|r| r.key.activity_id.as_str()).collect();
    assert_eq!(ids, ["high", "low-c", "low-a", "low-b"]);
}

/// A claim hands out its rows as they are stored once claimed, every column: a
/// store that builds them rather than read them back must build them right.
async fn a_claimed_row_is_what_the_store_holds(store: &dyn Store, _raw: &Raw) {
    let mut a = new("a", "t");
    a.priority = 3;
    a.timeouts.heartbeat_ms = Some(5_000);
    a.headers = vec![("h".to_owned(), "v".to_owned())].into_iter().collect();
    for activity in [a, new("b", "t")] {
        submit(store, activity).await;
    }
    let first = claim(store, &["t"], 10, T0).await;
    assert_eq!(first.len(), 2);
    // The second attempt of "a", claimed after its first is retried.
    let retried = finish(
        store,
        &first[0],
        Transition::Retry {
            next_at: T0 + 5,
            error: crate::store::server_error(ErrorKind::Retryable, "Boom", "again".into()),
        },
        T0 + 1,
    )
    .await;
    assert!(retried);
    let again = claim(store, &["t"], 10, T0 + 10).await;
    assert_eq!(again.len(), 1);
    for row in first.iter().skip(1).chain(&again) {
        let stored = store
            .get(&row.key)
            .await
            .unwrap_or_else(|e| panic!("get: {e}"))
            .unwrap_or_else(|| panic!("{} is not stored", row.key.activity_id));
        assert_eq!(
            format!("{row:?}"),
            format!("{stored:?}"),
            "claimed row differs from the stored one"
        );
    }
    assert_eq!(again[0].attempt, 2);
    assert!(again[0].last_error.is_some());

    // Its completion keeps what it does not change (the earlier attempt's error,
    // its place in claim order) and lets go of the lease.
    assert!(finish(store, &again[0], output("done"), T0 + 20).await);
    let done = store.get(&again[0].key).await.ok().flatten();
    let done = done.as_ref().map(|r| {
        (
            r.status,
            r.attempt,
            r.uncounted,
            r.lease_expires_at,
            r.finished_at,
            r.next_at,
            r.output.is_some(),
            r.last_error.as_ref().map(|e| e.message.as_str()),
        )
    });
    assert_eq!(
        done,
        Some((
            ActivityStatus::Completed,
            2,
            0,
            None,
            Some(T0 + 20),
            T0 + 5,
            true,
            Some("again"),
        ))
    );
}

async fn claim_takes_due_rows_by_priority_then_age(store: &dyn Store, _raw: &Raw) {
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

async fn a_rate_limit_holds_claims_to_its_bucket(store: &dyn Store, _raw: &Raw) {
    let limit = |namespace: &str| rate::RateLimit {
        namespace: namespace.into(),
        activity_type: "t".into(),
        key: None,
        per_period: 2,
        period: std::time::Duration::from_secs(1),
        burst: 2,
    };
    assert!(matches!(
        one(store, Op::SetRateLimit(limit("default")), T0).await,
        Outcome::RateLimitSet
    ));
    // The same type of another namespace is not limited by it.
    let mut elsewhere = new("x", "t");
    elsewhere.key.namespace = "other".into();
    submit(store, elsewhere).await;
    for id in ["a", "b", "c", "d", "e"] {
        submit(store, new(id, "t")).await;
    }
    submit(store, new("u1", "u")).await;
    let claimed = |outcome| match outcome {
        Outcome::Claimed { rows, throttled } => (
            rows.len(),
            throttled
                .into_iter()
                .map(|(ty, at)| (ty.to_string(), at))
                .collect::<Vec<_>>(),
        ),
        other => panic!("expected Claimed, got {other:?}"),
    };
    // Two a second, two at once: the burst, then one each 500 ms.
    let at = |now| async move { claimed(one(store, claim_for(&["t", "u"], 10), now).await) };
    assert_eq!(
        at(T0).await,
        (3, vec![("t".into(), T0 + 500)]),
        "2 of t, u1"
    );
    assert_eq!(at(T0 + 499).await, (0, vec![("t".into(), T0 + 500)]));
    assert_eq!(at(T0 + 500).await, (1, vec![("t".into(), T0 + 1_000)]));
    let uses = store
        .rate_limits(None, T0 + 500)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        uses,
        [rate::RateLimitUse {
            limit: limit("default"),
            available: 0
        }]
    );
    let later = store
        .rate_limits(Some("default"), T0 + 60_000)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(later[0].available, 2, "a bucket fills up to its burst");
    assert!(
        store
            .rate_limits(Some("other"), T0)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_empty()
    );

    let mut other = claim_for(&["t"], 10);
    if let Op::Claim(claim) = &mut other {
        claim.namespace = "other".into();
    }
    assert_eq!(claimed(one(store, other, T0 + 500).await), (1, vec![]));

    let remove = || Op::RemoveRateLimit {
        namespace: "default".into(),
        activity_type: "t".into(),
        key: None,
    };
    assert!(matches!(
        one(store, remove(), T0).await,
        Outcome::RateLimitRemoved(true)
    ));
    assert!(matches!(
        one(store, remove(), T0).await,
        Outcome::RateLimitRemoved(false)
    ));
    assert_eq!(
        at(T0 + 600).await,
        (2, vec![]),
        "no limit: the rest at once"
    );
}

async fn a_keys_rate_limit_holds_only_its_rows(store: &dyn Store, _raw: &Raw) {
    // Key "mail" of t: two a second, two at once; "sms" and unkeyed rows free.
    let limit = rate::RateLimit {
        namespace: "default".into(),
        activity_type: "t".into(),
        key: Some("mail".into()),
        per_period: 2,
        period: std::time::Duration::from_secs(1),
        burst: 2,
    };
    one(store, Op::SetRateLimit(limit.clone()), T0).await;
    let keyed = |id: String, key: Option<&str>| {
        let mut row = new(&id, "t");
        row.concurrency_key = key.map(str::to_owned);
        row
    };
    for i in 0..5 {
        submit(store, keyed(format!("mail{i}"), Some("mail"))).await;
        submit(store, keyed(format!("sms{i}"), Some("sms"))).await;
    }
    submit(store, keyed("plain".into(), None)).await;
    let at = |now| async move {
        match one(store, claim_for(&["t"], 20), now).await {
            Outcome::Claimed { rows, throttled } => {
                let mut ids: Vec<_> = rows.iter().map(|r| r.key.activity_id.to_string()).collect();
                ids.sort();
                let throttled: Vec<_> = throttled
                    .into_iter()
                    .map(|(ty, at)| (ty.to_string(), at))
                    .collect();
                (ids, throttled)
            }
            other => panic!("expected Claimed, got {other:?}"),
        }
    };
    let (first, throttled) = at(T0).await;
    assert_eq!(
        first,
        [
            "mail0", "mail1", "plain", "sms0", "sms1", "sms2", "sms3", "sms4"
        ],
        "the key's burst, and everything else"
    );
    assert_eq!(
        throttled,
        [("t".to_owned(), T0 + 500)],
        "when mail has a token"
    );
    assert_eq!(
        at(T0 + 499).await,
        (vec![], vec![("t".to_owned(), T0 + 500)])
    );
    assert_eq!(
        at(T0 + 500).await,
        (vec!["mail2".to_owned()], vec![("t".to_owned(), T0 + 1_000)])
    );
    let uses = store
        .rate_limits(None, T0 + 500)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        uses,
        [rate::RateLimitUse {
            limit: limit.clone(),
            available: 0
        }]
    );
    assert_eq!(at(T0 + 1_000).await.0, ["mail3"]);
    assert_eq!(at(T0 + 1_500).await.0, ["mail4"]);
    // Its bucket outlives a spell with none of its rows waiting or running.
    for i in 0..5 {
        let row = get(store, &format!("mail{i}")).await;
        assert!(finish(store, &row, output("done"), T0 + 1_500).await);
    }
    submit(store, keyed("mail-late".into(), Some("mail"))).await;
    assert_eq!(
        at(T0 + 1_500).await,
        (vec![], vec![("t".to_owned(), T0 + 2_000)]),
        "the bucket spent at T0 + 1.5s is still empty"
    );
    // Removed, the key's rows go at once.
    let remove = Op::RemoveRateLimit {
        namespace: "default".into(),
        activity_type: "t".into(),
        key: Some("mail".into()),
    };
    assert!(matches!(
        one(store, remove, T0).await,
        Outcome::RateLimitRemoved(true)
    ));
    assert_eq!(at(T0 + 1_500).await.0, ["mail-late"]);
}

async fn a_concurrency_key_runs_at_most_its_limit(store: &dyn Store, _raw: &Raw) {
    let keyed = |id: &str, ty: &str, key: Option<&str>| {
        let mut row = new(id, ty);
        row.concurrency_key = key.map(str::to_owned);
        row
    };
    let set = Op::SetConcurrencyLimit {
        namespace: "default".into(),
        activity_type: "t".into(),
        max_running: 2,
        strategy: concurrency::Strategy::Queue,
    };
    assert!(matches!(
        one(store, set, T0).await,
        Outcome::ConcurrencyLimitSet
    ));
    for i in 0..5 {
        submit(store, keyed(&format!("a{i}"), "t", Some("k1"))).await;
    }
    submit(store, keyed("b0", "t", Some("k2"))).await;
    submit(store, keyed("free0", "t", None)).await;
    submit(store, keyed("free1", "t", None)).await;
    submit(store, keyed("other", "u", Some("k1"))).await;
    let running = |rows: &[ActivityRow], key: &str| {
        rows.iter()
            .filter(|r| r.concurrency_key.as_deref() == Some(key))
            .count()
    };

    let first = claim(store, &["t", "u"], 20, T0).await;
    assert_eq!(first.len(), 6, "two of k1, k2's one, both unkeyed, u's");
    assert_eq!(
        running(&first, "k1"),
        2 + 1,
        "two of t, and u's (not limited)"
    );
    let a: Vec<_> = first
        .iter()
        .filter(|r| r.key.activity_id.starts_with('a'))
        .collect();
    assert_eq!(
        a.iter()
            .map(|r| r.key.activity_id.as_str())
            .collect::<Vec<_>>(),
        ["a0", "a1"],
        "a key's rows in claim order"
    );
    assert!(claim(store, &["t"], 20, T0).await.is_empty(), "k1 is full");
    let uses = store
        .concurrency_limits(None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        uses,
        [concurrency::ConcurrencyLimit {
            namespace: "default".into(),
            activity_type: "t".into(),
            key: None,
            max_running: 2,
            weight: 1,
            keys: 2,
            running: 3,
            strategy: concurrency::Strategy::Queue,
            held: 3,
        }]
    );

    // A row that ends makes room; one that goes back to waiting too.
    assert!(finish(store, a[0], output("done"), T0).await);
    let error = crate::store::server_error(ErrorKind::Retryable, "Boom", "again".into());
    let retry = Transition::Retry {
        next_at: T0 + 1_000,
        error,
    };
    assert!(finish(store, a[1], retry, T0).await);
    let next = claim(store, &["t"], 20, T0).await;
    assert_eq!(
        next.iter()
            .map(|r| r.key.activity_id.as_str())
            .collect::<Vec<_>>(),
        ["a2", "a3"]
    );
    assert!(
        claim(store, &["t"], 20, T0 + 1_000).await.is_empty(),
        "full again"
    );

    // Without a limit, a key holds nothing back.
    let remove = Op::RemoveConcurrencyLimit {
        namespace: "default".into(),
        activity_type: "t".into(),
        key: None,
    };
    assert!(matches!(
        one(store, remove, T0).await,
        Outcome::ConcurrencyLimitRemoved(true)
    ));
    let mut rest: Vec<_> = claim(store, &["t"], 20, T0 + 1_000)
        .await
        .into_iter()
        .map(|r| r.key.activity_id.to_string())
        .collect();
    rest.sort();
    assert_eq!(rest, ["a1", "a4"]);
    assert_eq!(
        get(store, "a4").await.concurrency_key.as_deref(),
        Some("k1")
    );
}

async fn keys_share_a_claim_and_take_turns(store: &dyn Store, _raw: &Raw) {
    let keyed = |id: String, key: &str| {
        let mut row = new(&id, "t");
        row.concurrency_key = Some(key.to_owned());
        row
    };
    for i in 0..10 {
        submit(store, keyed(format!("a{i}"), "big")).await;
    }
    submit(store, keyed("b0".into(), "small")).await;
    submit(store, keyed("b1".into(), "small")).await;
    let keys = |rows: Vec<ActivityRow>| {
        let mut keys: Vec<_> = rows
            .iter()
            .filter_map(|r| r.concurrency_key.clone())
            .collect();
        keys.sort();
        keys
    };
    // Unlimited, a big backlog still takes only its share while others wait.
    assert_eq!(
        keys(claim(store, &["t"], 4, T0).await),
        ["big", "big", "small", "small"]
    );
    submit(store, keyed("c0".into(), "new")).await;
    // A new key takes its turn with the keys waiting: beside big at once.
    assert_eq!(keys(claim(store, &["t"], 2, T0 + 1).await), ["big", "new"]);
    assert_eq!(keys(claim(store, &["t"], 3, T0 + 2).await), ["big"; 3]);
}

/// A key's own limit and weight, as the API commits them.
fn key_limit(key: &str, max_running: Option<u32>, weight: u32) -> Op {
    Op::SetKeyLimit {
        namespace: "default".into(),
        activity_type: "t".into(),
        key: key.into(),
        max_running,
        weight,
    }
}

async fn keys_are_served_in_proportion_to_their_weights(store: &dyn Store, _raw: &Raw) {
    let keyed = |id: String, key: &str| {
        let mut row = new(&id, "t");
        row.concurrency_key = Some(key.to_owned());
        row
    };
    for key in ["heavy", "l1", "l2", "l3"] {
        for i in 0..30 {
            submit(store, keyed(format!("{key}-{i}"), key)).await;
        }
    }
    assert!(matches!(
        one(store, key_limit("heavy", None, 3), T0).await,
        Outcome::ConcurrencyLimitSet
    ));
    let count = |rows: &[ActivityRow], key: &str| {
        rows.iter()
            .filter(|r| r.concurrency_key.as_deref() == Some(key))
            .count()
    };
    // Within one claim: shares by weight, 3 + 1 + 1 + 1.
    let first = claim(store, &["t"], 6, T0).await;
    assert_eq!(
        ["heavy", "l1", "l2", "l3"].map(|k| count(&first, k)),
        [3, 1, 1, 1]
    );
    // Across claims smaller than the keys: turns by weight. Each claim of one
    // row serves the key of lowest pass; over 24 the heavy key had half.
    let mut served = Vec::new();
    for i in 0..24 {
        served.extend(claim(store, &["t"], 1, T0 + 1 + i).await);
    }
    assert_eq!(
        ["heavy", "l1", "l2", "l3"].map(|k| count(&served, k)),
        [12, 4, 4, 4],
        "{:?}",
        served
            .iter()
            .map(|r| r.concurrency_key.clone().unwrap_or_default())
            .collect::<Vec<_>>()
    );
    // A key new to the type starts level with the keys waiting: served at once,
    // then in turn, with no credit for the turns it was not there for.
    for i in 0..4 {
        submit(store, keyed(format!("new-{i}"), "new")).await;
    }
    let mut next = Vec::new();
    for i in 0..6 {
        next.extend(claim(store, &["t"], 1, T0 + 30 + i).await);
    }
    let new = count(&next, "new");
    assert!(
        new == 1 || new == 2,
        "the new key ran {new} of the next 6 rows (weights 3, 1, 1, 1 and 1)"
    );
    assert_eq!(count(&next[..2], "new"), 1, "served among the first two");
}

/// A key whose only row ran while the others were served many times, then
/// waits again through that row's retry, takes its turn level with the keys
/// waiting: it is not owed the turns it was away for, however many rows it
/// then gets.
async fn a_key_back_from_a_retry_has_no_credit_for_its_absence(store: &dyn Store, _raw: &Raw) {
    let keyed = |id: String, key: &str| {
        let mut row = new(&id, "t");
        row.concurrency_key = Some(key.to_owned());
        row
    };
    submit(store, keyed("solo-0".into(), "solo")).await;
    for key in ["a", "b"] {
        for i in 0..20 {
            submit(store, keyed(format!("{key}-{i}"), key)).await;
        }
    }
    let first = claim(store, &["t"], 3, T0).await;
    let Some(solo) = first
        .iter()
        .find(|r| r.concurrency_key.as_deref() == Some("solo"))
    else {
        panic!("solo's row is claimed with the others' first");
    };
    // While solo's row runs, a and b are served ten times each.
    for i in 0..20 {
        claim(store, &["t"], 1, T0 + 1 + i).await;
    }
    let retry = Transition::Retry {
        next_at: T0 + 30,
        error: crate::store::server_error(ErrorKind::Retryable, "Boom", "again".into()),
    };
    assert!(finish(store, solo, retry, T0 + 30).await);
    for i in 1..6 {
        submit(store, keyed(format!("solo-{i}"), "solo")).await;
    }
    let mut next = Vec::new();
    for i in 0..6 {
        next.extend(claim(store, &["t"], 1, T0 + 40 + i).await);
    }
    let solo_served = next
        .iter()
        .filter(|r| r.concurrency_key.as_deref() == Some("solo"))
        .count();
    assert!(
        (1..=3).contains(&solo_served),
        "solo ran {solo_served} of the next 6 rows, level with two other keys: {:?}",
        next.iter()
            .map(|r| r.concurrency_key.clone().unwrap_or_default())
            .collect::<Vec<_>>()
    );
}

async fn key_counts_follow_every_move_of_their_rows(store: &dyn Store, _raw: &Raw) {
    let ids: Vec<String> = ["a", "b"]
        .iter()
        .flat_map(|k| (0..6).map(move |i| format!("{k}{i}")))
        .collect();
    for id in &ids {
        let mut row = new(id, "t");
        row.concurrency_key = Some(id[..1].to_owned());
        submit(store, row).await;
    }
    // What the rows say, and what the store counts, for both keys.
    let check = |when: &'static str| {
        let ids = ids.clone();
        async move {
            for key in ["a", "b"] {
                let (mut waiting, mut running) = (0, 0);
                for id in ids.iter().filter(|id| id.starts_with(key)) {
                    match get(store, id).await.status {
                        ActivityStatus::Scheduled => waiting += 1,
                        ActivityStatus::Running => running += 1,
                        _ => {}
                    }
                }
                let counted = store
                    .concurrency_key("default", "t", key)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                let expected = (waiting > 0 || running > 0).then_some((waiting, running));
                assert_eq!(counted, expected, "{when}: key {key}");
            }
        }
    };
    check("submitted").await;
    let claimed = claim(store, &["t"], 8, T0).await;
    check("claimed").await;
    let of = |key: &str| -> Vec<&ActivityRow> {
        claimed
            .iter()
            .filter(|r| r.concurrency_key.as_deref() == Some(key))
            .collect()
    };
    let (a, b) = (of("a"), of("b"));
    let end = |row: &ActivityRow, transition| Op::Finish {
        attempt: Arc::new(Attempt::from_row(row)),
        transition,
        lease_expired_by: None,
    };
    let retry = Transition::Retry {
        next_at: T0 + 1_000,
        error: crate::store::server_error(ErrorKind::Retryable, "Boom", "again".into()),
    };
    // Endings and a claim in one batch, as the committer runs them.
    apply(
        store,
        vec![
            end(a[0], output("done")),
            end(a[1], retry),
            end(b[0], output("done")),
            claim_for(&["t"], 3),
        ],
        T0,
    )
    .await;
    check("ended, retried and claimed in one batch").await;
    let cancel = |id: &str| Op::Cancel {
        key: key(id),
        reason: "no longer wanted".into(),
    };
    // A running row and a waiting one cancelled, then the waiting one re-driven.
    let running_b = ids
        .iter()
        .find(|id| {
            id.starts_with('b')
                && claimed.iter().any(|r| r.key.activity_id == **id)
                && b[0].key.activity_id != **id
        })
        .cloned()
        .unwrap_or_else(|| panic!("a running row of b"));
    one(store, cancel(&running_b), T0).await;
    one(store, cancel("b5"), T0).await;
    check("cancelled").await;
    one(store, Op::Redrive { key: key("b5") }, T0).await;
    check("re-driven").await;
    one(store, cancel("a5"), T0).await;
    check("cancelled, maybe running").await;
    // Everything else run and completed: no key is left.
    for _ in 0..4 {
        for row in claim(store, &["t"], 20, T0 + 2_000).await {
            assert!(finish(store, &row, output("done"), T0 + 2_000).await);
        }
        for id in &ids {
            let row = get(store, id).await;
            if row.status == ActivityStatus::Running {
                assert!(finish(store, &row, output("done"), T0 + 2_000).await);
            }
        }
    }
    check("all done").await;
    assert!(matches!(
        one(
            store,
            Op::Prune {
                before: 0,
                limit: 100
            },
            T0 + 3_000
        )
        .await,
        Outcome::Pruned(_)
    ));
    check("pruned").await;
    // A row re-driven when its key had gone brings the key back.
    one(store, Op::Redrive { key: key("a5") }, T0 + 3_000).await;
    check("re-driven into a key that had gone").await;
    assert_eq!(claim(store, &["t"], 5, T0 + 3_000).await.len(), 1);
    check("claimed again").await;
}

async fn a_key_with_nothing_due_does_not_hold_back_the_others(store: &dyn Store, _raw: &Raw) {
    let keyed = |id: &str, key: &str| {
        let mut row = new(id, "t");
        row.concurrency_key = Some(key.to_owned());
        row
    };
    // First in the keys' order, but its only row is due later.
    let mut later = keyed("later", "a-later");
    later.next_at = T0 + 60_000;
    submit(store, later).await;
    submit(store, keyed("now", "b-now")).await;
    let mut got = Vec::new();
    for i in 0..3 {
        got.extend(claim(store, &["t"], 1, T0 + i).await);
    }
    assert_eq!(
        got.iter()
            .map(|r| r.key.activity_id.as_str())
            .collect::<Vec<_>>(),
        ["now"]
    );
}

async fn a_key_may_have_its_own_limit(store: &dyn Store, _raw: &Raw) {
    let keyed = |id: String, key: &str| {
        let mut row = new(&id, "t");
        row.concurrency_key = Some(key.to_owned());
        row
    };
    // Alone, a key's own limit holds where its type has none.
    one(store, key_limit("slow", Some(1), 1), T0).await;
    for key in ["slow", "vip", "plain"] {
        for i in 0..6 {
            submit(store, keyed(format!("{key}-{i}"), key)).await;
        }
    }

    let count = |rows: &[ActivityRow], key: &str| {
        rows.iter()
            .filter(|r| r.concurrency_key.as_deref() == Some(key))
            .count()
    };
    let first = claim(store, &["t"], 4, T0).await;
    assert_eq!(count(&first, "slow"), 1, "{first:?}");
    // A keyed row of higher priority waits for its key all the same.
    let mut urgent = keyed("slow-urgent".into(), "slow");
    urgent.priority = 9;
    submit(store, urgent).await;
    // With the type's limit of 2: vip's own 4 beside it, plain at the type's.
    one(
        store,
        Op::SetConcurrencyLimit {
            namespace: "default".into(),
            activity_type: "t".into(),
            max_running: 2,
            strategy: concurrency::Strategy::Queue,
        },
        T0,
    )
    .await;
    one(store, key_limit("vip", Some(4), 1), T0).await;
    let mut all = first;
    all.extend(claim(store, &["t"], 50, T0 + 1).await);
    assert_eq!(
        ["slow", "vip", "plain"].map(|k| count(&all, k)),
        [1, 4, 2],
        "each key at its own limit, or the type's"
    );
    let uses = store
        .concurrency_limits(None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let summary: Vec<_> = uses
        .iter()
        .map(|l| (l.key.clone(), l.max_running, l.running, l.held))
        .collect();
    assert_eq!(
        summary,
        [
            (None, 2, 7, 12),
            (Some("slow".into()), 1, 1, 6),
            (Some("vip".into()), 4, 4, 2),
        ]
    );
    // A key's own limit set without a number follows the type's; removed, so
    // does the key.
    one(store, key_limit("slow", None, 1), T0).await;
    assert_eq!(count(&claim(store, &["t"], 50, T0 + 2).await, "slow"), 1);
    let remove = Op::RemoveConcurrencyLimit {
        namespace: "default".into(),
        activity_type: "t".into(),
        key: Some("vip".into()),
    };
    assert!(matches!(
        one(store, remove.clone(), T0).await,
        Outcome::ConcurrencyLimitRemoved(true)
    ));
    assert!(matches!(
        one(store, remove, T0).await,
        Outcome::ConcurrencyLimitRemoved(false)
    ));
    assert!(
        claim(store, &["t"], 50, T0 + 3).await.is_empty(),
        "vip runs 4, over the type's 2 now"
    );
}

async fn concurrency_strategies_cancel_the_newest_or_the_oldest(store: &dyn Store, _raw: &Raw) {
    let limit = |strategy| Op::SetConcurrencyLimit {
        namespace: "default".into(),
        activity_type: "t".into(),
        max_running: 2,
        strategy,
    };
    // A submit and the strategy applied to its key, as the API commits them.
    let submit_keyed = |id: &'static str| async move {
        let mut row = new(id, "t");
        row.concurrency_key = Some("k".into());
        // With a key that has no rows beside it: it is never over its limit.
        let enforce = Op::EnforceConcurrency {
            namespace: "default".into(),
            activity_type: "t".into(),
            keys: vec!["j".into(), "k".into()],
        };
        let mut outcomes = apply(store, vec![Op::Submit(vec![row]), enforce], T0).await;
        match outcomes.pop() {
            Some(Outcome::Enforced(cancelled)) => cancelled
                .into_iter()
                .map(|(prior, row)| (prior, row.key.activity_id.to_string(), row.status))
                .collect::<Vec<_>>(),
            other => panic!("expected Enforced, got {other:?}"),
        }
    };
    one(store, limit(concurrency::Strategy::CancelNewest), T0).await;
    assert!(submit_keyed("a0").await.is_empty());
    assert!(submit_keyed("a1").await.is_empty());
    assert_eq!(
        submit_keyed("a2").await,
        [(
            ActivityStatus::Scheduled,
            "a2".to_owned(),
            ActivityStatus::Cancelled
        )],
        "the newest goes"
    );
    let a2 = get(store, "a2").await;
    assert!(
        a2.last_error
            .is_some_and(|e| e.message.contains("(cancel newest)")),
        "it says why"
    );
    let running = claim(store, &["t"], 1, T0).await;
    assert_eq!(running[0].key.activity_id, "a0");

    one(store, limit(concurrency::Strategy::CancelInProgress), T0).await;
    assert_eq!(
        submit_keyed("a3").await,
        [(
            ActivityStatus::Running,
            "a0".to_owned(),
            ActivityStatus::Cancelled
        )],
        "the oldest goes, running or not"
    );
    assert_eq!(get(store, "a1").await.status, ActivityStatus::Scheduled);
    assert_eq!(get(store, "a3").await.status, ActivityStatus::Scheduled);

    one(store, limit(concurrency::Strategy::Queue), T0).await;
    assert!(
        submit_keyed("a4").await.is_empty(),
        "the queue cancels nothing"
    );
    let uses = store
        .concurrency_limits(Some("default"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (uses[0].strategy, uses[0].running, uses[0].keys),
        (concurrency::Strategy::Queue, 0, 1)
    );
}

/// Endings, submits and a claim of the same key in one batch: a submit's strategy
/// counts the key's rows as the batch's endings left them (a completed one gone,
/// a retried one waiting again), and the claim refills the room they made,
/// however each store keeps its counts.
async fn a_batchs_endings_make_room_for_its_submits(store: &dyn Store, _raw: &Raw) {
    one(
        store,
        Op::SetConcurrencyLimit {
            namespace: "default".into(),
            activity_type: "t".into(),
            max_running: 1,
            strategy: concurrency::Strategy::CancelNewest,
        },
        T0,
    )
    .await;
    let keyed = |id: &str| {
        let mut row = new(id, "t");
        row.concurrency_key = Some("k".into());
        row
    };
    let enforce = || Op::EnforceConcurrency {
        namespace: "default".into(),
        activity_type: "t".into(),
        keys: vec!["k".into()],
    };
    submit(store, keyed("a")).await;
    let running = claim(store, &["t"], 1, T0).await;
    assert_eq!(running.len(), 1);
    let ending = Op::Finish {
        attempt: Arc::new(Attempt::from_row(&running[0])),
        transition: output("done"),
        lease_expired_by: None,
    };
    let outcomes = apply(
        store,
        vec![ending, Op::Submit(vec![keyed("b")]), enforce()],
        T0 + 1,
    )
    .await;
    assert!(
        matches!(
            outcomes.as_slice(),
            [
                Outcome::Finished { accepted: true },
                Outcome::Submitted(_),
                Outcome::Enforced(cancelled)
            ] if cancelled.is_empty()
        ),
        "{outcomes:?}"
    );
    assert_eq!(get(store, "b").await.status, ActivityStatus::Scheduled);
    // And a retry in a batch counts as waiting again before the next submit.
    let running = claim(store, &["t"], 1, T0 + 1).await;
    assert_eq!(running[0].key.activity_id, "b");
    let retry = Op::Finish {
        attempt: Arc::new(Attempt::from_row(&running[0])),
        transition: Transition::Retry {
            next_at: T0 + 10_000,
            error: crate::store::server_error(ErrorKind::Retryable, "Boom", "again".into()),
        },
        lease_expired_by: None,
    };
    let outcomes = apply(
        store,
        vec![retry, Op::Submit(vec![keyed("c")]), enforce()],
        T0 + 2,
    )
    .await;
    match outcomes.last() {
        Some(Outcome::Enforced(cancelled)) => assert_eq!(
            cancelled
                .iter()
                .map(|(_, row)| row.key.activity_id.as_str())
                .collect::<Vec<_>>(),
            ["c"],
            "b waits again, so c is one too many"
        ),
        other => panic!("expected Enforced, got {other:?}"),
    }
    // A claim later in the batch sees the room too, and refills it at once.
    let running = claim(store, &["t"], 1, T0 + 10_000).await;
    assert_eq!(running[0].key.activity_id, "b");
    submit(store, keyed("d")).await;
    let ending = Op::Finish {
        attempt: Arc::new(Attempt::from_row(&running[0])),
        transition: output("done"),
        lease_expired_by: None,
    };
    let outcomes = apply(store, vec![ending, claim_for(&["t"], 1)], T0 + 10_001).await;
    match outcomes.last() {
        Some(Outcome::Claimed { rows, .. }) => assert_eq!(
            rows.iter()
                .map(|r| r.key.activity_id.as_str())
                .collect::<Vec<_>>(),
            ["d"]
        ),
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// A row of type `ty` with fairness key `key` of `weight`.
fn fair(id: &str, ty: &str, key: &str, weight: u32) -> NewActivity {
    NewActivity {
        fairness: Some(Fairness {
            key: key.into(),
            weight,
        }),
        ..new(id, ty)
    }
}

async fn a_fairness_keys_backlog_does_not_delay_another_keys_rows(store: &dyn Store, raw: &Raw) {
    // Tenant a's backlog, in one submit; then one row of tenant b and one row
    // without a fairness key.
    let backlog = (0..50)
        .map(|i| fair(&format!("a{i}"), "t", "a", 1))
        .collect();
    one(store, Op::Submit(backlog), T0).await;
    submit(store, fair("b0", "t", "b", 1)).await;
    submit(store, new("u0", "t")).await;
    assert_eq!(get(store, "b0").await.fairness_key.as_deref(), Some("b"));

    // A submit of a stored key stores nothing, and moves no chain.
    let chain = "SELECT last_us FROM fairness_keys WHERE fairness_key = 'b'";
    let before = raw.scalar(chain).await;
    submit(store, fair("b0", "t", "b", 1)).await;
    let again = vec![fair("a0", "t", "a", 1), fair("b0", "t", "b", 1)];
    one(store, Op::Submit(again), T0).await;
    assert_eq!(raw.scalar(chain).await, before);
    let a_chain = "SELECT last_us FROM fairness_keys WHERE fairness_key = 'a'";
    assert_eq!(raw.scalar(a_chain).await, (T0 + 50) * 1_000);

    // u0 is ranked by its due time, ahead of a's backlog (spread over virtual
    // time from now on); b0 next to a's head, not after its 50 rows.
    let mut first: Vec<String> = claim(store, &["t"], 4, T0)
        .await
        .into_iter()
        .map(|r| r.key.activity_id)
        .collect();
    first.sort();
    assert_eq!(first, ["a0", "a1", "b0", "u0"]);

    // b's next row goes next to a's head again, and a priority aging set
    // meanwhile ranks every waiting row again from where its key placed it.
    submit(store, fair("b1", "t", "b", 1)).await;
    let aging = Some(std::time::Duration::from_secs(1));
    assert_eq!(set_aging(store, aging).await, Some(49));
    let order = claim_order(store, T0).await;
    assert_eq!(order.len(), 49);
    assert_eq!(order.iter().position(|o| o == "b1"), Some(2), "{order:?}");
    let a: Vec<&String> = order.iter().filter(|o| o.starts_with('a')).collect();
    let in_order: Vec<String> = (2..50).map(|i| format!("a{i}")).collect();
    assert!(a.iter().zip(&in_order).all(|(x, y)| *x == y), "{order:?}");

    // Each key's chain is kept until it falls behind now (the band has no row
    // due any more); then the pruner deletes it, and a key that comes back
    // starts afresh.
    let chains = "SELECT COUNT(*) FROM fairness_keys";
    assert_eq!(raw.scalar(chains).await, 2);
    let prune = |now| {
        one(
            store,
            Op::Prune {
                before: 0,
                limit: 100,
            },
            now,
        )
    };
    prune(T0).await;
    assert_eq!(raw.scalar(chains).await, 2, "a's chain is 50 ms ahead");
    prune(T0 + 60).await;
    assert_eq!(raw.scalar(chains).await, 0);
}

async fn a_newcomer_joins_the_head_of_a_backlog_behind_now(store: &dyn Store, raw: &Raw) {
    // a's backlog has waited 10 s past the virtual times it was given when b's
    // first row comes.
    let backlog = (0..20)
        .map(|i| fair(&format!("a{i}"), "t", "a", 1))
        .collect();
    one(store, Op::Submit(backlog), T0).await;
    let later = T0 + 10_000;
    let b0 = NewActivity {
        next_at: later,
        ..fair("b0", "t", "b", 1)
    };
    one(store, Op::Submit(vec![b0]), later).await;
    let mut first: Vec<String> = claim(store, &["t"], 3, later)
        .await
        .into_iter()
        .map(|r| r.key.activity_id)
        .collect();
    first.sort();
    assert_eq!(first, ["a0", "a1", "b0"], "b0 next to a's head");

    // b's chain is behind the head of the band now: the pruner deletes it; a's
    // is ahead, and stays.
    one(
        store,
        Op::Prune {
            before: 0,
            limit: 100,
        },
        later,
    )
    .await;
    let chains = "SELECT COUNT(*) FROM fairness_keys WHERE fairness_key = 'a'";
    assert_eq!(raw.scalar(chains).await, 1);
    assert_eq!(raw.scalar("SELECT COUNT(*) FROM fairness_keys").await, 1);

    // A row not due yet is not the head: with only a delayed row waiting in its
    // band, a new key starts at now.
    let delayed = NewActivity {
        next_at: later + 3_600_000,
        ..new("u1", "d")
    };
    one(store, Op::Submit(vec![delayed]), later).await;
    let c0 = NewActivity {
        next_at: later,
        ..fair("c0", "d", "c", 1)
    };
    one(store, Op::Submit(vec![c0]), later).await;
    let fair_at = |id: &str| format!("SELECT fair_at FROM activities WHERE activity_id = '{id}'");
    assert_eq!(raw.scalar(&fair_at("c0")).await, later + 1);

    // A row submitted with a delay is ranked by its due time, and leaves its
    // key's chain where it was: the key's next row still goes next to the head
    // (a2, at T0 + 3; b1 moved the chain one place on).
    let delayed = NewActivity {
        next_at: later + 60_000,
        ..fair("b1", "t", "b", 1)
    };
    let due = NewActivity {
        next_at: later,
        ..fair("b2", "t", "b", 1)
    };
    one(store, Op::Submit(vec![delayed, due]), later).await;
    assert_eq!(raw.scalar(&fair_at("b1")).await, later + 60_000);
    assert_eq!(raw.scalar(&fair_at("b2")).await, T0 + 5);
}

async fn fairness_keys_are_served_in_proportion_to_their_weights(store: &dyn Store, raw: &Raw) {
    // h's rows weigh 3 and l's 1: both backlogs submitted at once, h's first.
    for (key, weight) in [("h", 3), ("l", 1)] {
        let rows = (0..40)
            .map(|i| fair(&format!("{key}{i}"), "t", key, weight))
            .collect();
        one(store, Op::Submit(rows), T0).await;
    }
    // Whole milliseconds, rounded down: h's first three rows share T0.
    let fair_at = |id: &str| format!("SELECT fair_at FROM activities WHERE activity_id = '{id}'");
    for (id, at) in [("h0", T0), ("h2", T0), ("h3", T0 + 1), ("l0", T0 + 1)] {
        assert_eq!(raw.scalar(&fair_at(id)).await, at, "{id}");
    }
    let order = claim_order(store, T0).await;
    let heavy = |n: usize| order[..n].iter().filter(|o| o.starts_with('h')).count();
    // Three of h's rows for each of l's (to the millisecond a row of weight 1
    // takes: h's first three go before l's first).
    assert_eq!(heavy(3), 3, "{order:?}");
    assert!((15..=16).contains(&heavy(20)), "{order:?}");
    assert!((30..=31).contains(&heavy(40)), "{order:?}");
    // And l's rows, each a place of its own, stay in their order.
    let light: Vec<&String> = order.iter().filter(|o| o.starts_with('l')).collect();
    assert_eq!(light.len(), 40);
    assert!(
        light
            .windows(2)
            .all(|w| { w[0][1..].parse::<u32>().ok() < w[1][1..].parse::<u32>().ok() })
    );
}

async fn a_weight_set_for_a_fairness_key_places_its_new_rows(store: &dyn Store, raw: &Raw) {
    let weight = |namespace: &str, ty: &str, key: &str, weight: u32| {
        Op::SetFairnessWeight(FairnessWeight {
            namespace: namespace.into(),
            activity_type: ty.into(),
            key: key.into(),
            weight,
        })
    };
    // h weighs 3 on t; l weighs 1 on t (set twice: the second replaces the
    // first). h's weights of another type and of another namespace are not t's
    // (set first, and sorting first, so a lookup missing either would find them).
    for op in [
        weight("another", "t", "h", 1),
        weight("default", "a", "h", 1),
        weight("default", "t", "h", 3),
        weight("default", "t", "l", 2),
        weight("default", "t", "l", 1),
    ] {
        assert!(matches!(
            one(store, op, T0).await,
            Outcome::FairnessWeightSet
        ));
    }
    let listed = |namespace: Option<&'static str>| async move {
        let listed = store
            .fairness_weights(namespace)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        listed
            .into_iter()
            .map(|u| {
                let w = u.weight;
                assert!(!u.truncated);
                let waiting = u.waiting;
                format!(
                    "{}/{}/{}={} ({waiting})",
                    w.namespace, w.activity_type, w.key, w.weight
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        listed(None).await,
        [
            "another/t/h=1 (0)",
            "default/a/h=1 (0)",
            "default/t/h=3 (0)",
            "default/t/l=1 (0)"
        ]
    );
    assert_eq!(listed(Some("another")).await, ["another/t/h=1 (0)"]);

    // The rows' own weights are the other way round: the set weights count, so
    // they are placed as in `fairness_keys_are_served_in_proportion_to_their_weights`.
    // h's rows come in two submits, the second moving the chain the first made.
    let rows = |key: &str, own: u32, ids: std::ops::Range<u32>| {
        ids.map(|i| fair(&format!("{key}{i}"), "t", key, own))
            .collect()
    };
    one(store, Op::Submit(rows("h", 1, 0..20)), T0).await;
    one(store, Op::Submit(rows("h", 1, 20..40)), T0).await;
    one(store, Op::Submit(rows("l", 4, 0..40)), T0).await;
    // Each weight with its key's waiting rows, of its own type and namespace.
    let mut elsewhere = fair("x0", "t", "l", 1);
    elsewhere.key.namespace = "another".into();
    one(store, Op::Submit(vec![elsewhere]), T0).await;
    one(store, Op::Submit(vec![fair("x1", "a", "l", 1)]), T0).await;
    assert_eq!(
        listed(None).await,
        [
            "another/t/h=1 (0)",
            "default/a/h=1 (0)",
            "default/t/h=3 (40)",
            "default/t/l=1 (40)"
        ]
    );
    let fair_at = |id: &str| format!("SELECT fair_at FROM activities WHERE activity_id = '{id}'");
    // A third of a millisecond a row of h: h20, its 21st, at 6.993 ms.
    for (id, at) in [
        ("h0", T0),
        ("h2", T0),
        ("h3", T0 + 1),
        ("h20", T0 + 6),
        ("h23", T0 + 7),
        ("l0", T0 + 1),
    ] {
        assert_eq!(raw.scalar(&fair_at(id)).await, at, "{id}");
    }

    // Deleted, h's new rows weigh what they say again: 1, a millisecond each
    // after its chain's 40 places of a third (13.32 ms).
    let remove = || Op::RemoveFairnessWeight {
        namespace: "default".into(),
        activity_type: "t".into(),
        key: "h".into(),
    };
    let removed = one(store, remove(), T0).await;
    assert!(matches!(removed, Outcome::FairnessWeightRemoved(true)));
    let again = one(store, remove(), T0).await;
    assert!(matches!(again, Outcome::FairnessWeightRemoved(false)));
    let rows = vec![fair("h40", "t", "h", 1), fair("h41", "t", "h", 1)];
    one(store, Op::Submit(rows), T0).await;
    assert_eq!(raw.scalar(&fair_at("h40")).await, T0 + 14);
    assert_eq!(raw.scalar(&fair_at("h41")).await, T0 + 15);

    let order = claim_order(store, T0).await;
    let heavy = |n: usize| order[..n].iter().filter(|o| o.starts_with('h')).count();
    assert!((15..=16).contains(&heavy(20)), "{order:?}");
    assert!((30..=31).contains(&heavy(40)), "{order:?}");
    // Claimed, they wait no more (h's weight is gone).
    assert_eq!(
        listed(Some("default")).await,
        ["default/a/h=1 (0)", "default/t/l=1 (0)"]
    );
}

async fn fairness_keys_order_a_concurrency_keys_own_rows(store: &dyn Store, _raw: &Raw) {
    let row = |id: &str, key: &str, tenant: &str| NewActivity {
        concurrency_key: Some(key.into()),
        ..fair(id, "t", tenant, 1)
    };
    // Concurrency key k: tenant a's backlog, then one row of tenant b.
    let backlog = (0..30).map(|i| row(&format!("a{i}"), "k", "a")).collect();
    one(store, Op::Submit(backlog), T0).await;
    submit(store, row("b0", "k", "b")).await;
    // Within k, b0 goes next to a's head (a0, a1, b0 at T0 + 1, + 2, + 2), not
    // behind a's 30 rows.
    let ids = |rows: Vec<ActivityRow>| {
        let mut ids: Vec<String> = rows.into_iter().map(|r| r.key.activity_id).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(claim(store, &["t"], 3, T0).await), ["a0", "a1", "b0"]);
    // And the concurrency keys still take turns: m's one row goes in the next
    // claim beside k's.
    submit(store, row("m0", "m", "a")).await;
    assert_eq!(ids(claim(store, &["t"], 2, T0).await), ["a2", "m0"]);
}

/// Claims the due rows of type `t` one at a time, and names them in that order.
async fn claim_order(store: &dyn Store, now: i64) -> Vec<String> {
    let mut order = Vec::new();
    while let Some(row) = claim(store, &["t"], 1, now).await.pop() {
        order.push(row.key.activity_id.to_string());
    }
    order
}

/// A row of type `t` of `priority`, due at `next_at`.
fn ranked(id: &str, priority: i32, next_at: i64) -> NewActivity {
    let mut row = new(id, "t");
    row.priority = priority;
    row.next_at = next_at;
    row
}

/// Sets the priority aging and, if that changed it, runs the re-ranking pass in
/// small steps: how many waiting rows it ranked again.
async fn set_aging(store: &dyn Store, aging: Option<std::time::Duration>) -> Option<u64> {
    let changed = store
        .set_priority_aging(aging)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    changed.then_some(rerank_all(store, 2).await)
}

/// Runs a re-ranking pass to its end, `ids` ids a step: the rows it ranked.
async fn rerank_all(store: &dyn Store, ids: u32) -> u64 {
    let mut rows = 0;
    loop {
        match one(store, Op::Rerank { ids }, T0).await {
            Outcome::Reranked(Some(step)) => {
                rows += step.rows;
                if step.done {
                    return rows;
                }
            }
            Outcome::Reranked(None) => return rows,
            other => panic!("expected Reranked, got {other:?}"),
        }
    }
}

async fn priority_ages_once_set_and_is_strict_again_when_unset(store: &dyn Store, _raw: &Raw) {
    let second = Some(std::time::Duration::from_secs(1));
    let row = ranked;
    let set = |aging| set_aging(store, aging);
    // Strict by default: the higher priority first, however long the other waited.
    submit(store, row("a1", 0, T0 - 10_000)).await;
    submit(store, row("u1", 5, T0)).await;
    assert_eq!(set(None).await, None, "strict is the default");
    assert_eq!(claim(store, &["t"], 1, T0).await[0].key.activity_id, "u1");

    // A second per level: a1's 10 s of waiting outweigh u2's 5 levels and its
    // 6 s; a2 waited 9.5 s, u2 in effect 9 s. Rows submitted since rank alike.
    assert_eq!(set(second).await, Some(1), "a1 was ranked again");
    assert_eq!(set(second).await, None, "unchanged");
    submit(store, row("u2", 5, T0 - 4_000)).await;
    submit(store, row("a2", 0, T0 - 9_500)).await;
    assert_eq!(claim_order(store, T0).await, ["a1", "a2", "u2"]);

    // A retry is ranked by its new due time: x (one level up) due at T0 + 1 s
    // counts as due at T0, after y, due at T0 - 0.5 s.
    submit(store, row("x", 1, T0)).await;
    let x = claim(store, &["t"], 1, T0).await.remove(0);
    let error = crate::store::server_error(ErrorKind::Retryable, "Boom", "again".into());
    let retry = Transition::Retry {
        next_at: T0 + 1_000,
        error,
    };
    assert!(finish(store, &x, retry, T0).await);
    submit(store, row("y", 0, T0 - 500)).await;
    assert_eq!(claim_order(store, T0 + 1_000).await, ["y", "x"]);

    // Back to strict: the waiting rows are ranked by priority again.
    submit(store, row("z1", 0, T0 - 5_000)).await;
    submit(store, row("z2", 2, T0)).await;
    assert_eq!(set(None).await, Some(2));
    assert_eq!(claim_order(store, T0).await, ["z2", "z1"]);
}

/// A change of the aging ranks the rows stored before it again in steps of a few
/// ids, each committed alone; a row written meanwhile is ranked by the new
/// setting at once; setting the same value again starts no pass, and a change
/// in the middle of a pass starts it again from the first row.
async fn a_priority_aging_change_ranks_waiting_rows_in_steps(store: &dyn Store, _raw: &Raw) {
    let second = Some(std::time::Duration::from_secs(1));
    submit(store, ranked("old", 0, T0 - 10_000)).await;
    submit(store, ranked("urgent", 5, T0)).await;
    submit(store, ranked("old2", 0, T0 - 9_000)).await;
    submit(store, ranked("urgent2", 5, T0 - 100)).await;
    let changed = |aging| async move {
        store
            .set_priority_aging(aging)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert!(changed(second).await);
    assert!(!changed(second).await, "the same value starts no pass");
    assert!(matches!(
        one(store, Op::Rerank { ids: 2 }, T0).await,
        Outcome::Reranked(Some(Reranked {
            rows: 2,
            done: false
        }))
    ));
    // Ranked by the new setting as it is written: ties with old2.
    submit(store, ranked("new", 5, T0 - 4_000)).await;
    assert_eq!(rerank_all(store, 2).await, 2, "old2 and urgent2 are left");
    assert!(
        matches!(
            one(store, Op::Rerank { ids: 2 }, T0).await,
            Outcome::Reranked(None)
        ),
        "nothing left"
    );
    assert_eq!(
        claim_order(store, T0).await,
        ["old", "old2", "new", "urgent2", "urgent"]
    );
    // Strict again, changed back half-way through: the pass starts over, and
    // every row ends strict.
    submit(store, ranked("a", 0, T0 - 10_000)).await;
    submit(store, ranked("b", 5, T0)).await;
    assert!(changed(None).await);
    assert!(matches!(
        one(store, Op::Rerank { ids: 2 }, T0).await,
        Outcome::Reranked(Some(Reranked { done: false, .. }))
    ));
    assert!(changed(second).await);
    assert!(changed(None).await);
    assert_eq!(rerank_all(store, 2).await, 2);
    assert_eq!(claim_order(store, T0).await, ["b", "a"]);
}

/// A change of the aging setting ranks the waiting rows of concurrency keys again
/// too: they are claimed key by key, in their key's own order.
async fn priority_aging_ranks_a_keys_waiting_rows_again(store: &dyn Store, _raw: &Raw) {
    let keyed = |id: &str, priority: i32, next_at: i64| NewActivity {
        concurrency_key: Some("k".into()),
        ..ranked(id, priority, next_at)
    };
    let set = |aging| set_aging(store, aging);
    // Stored strict (urgent first), then ranked with a second per level: old's
    // 10 s of waiting outweigh urgent's 5 levels.
    submit(store, keyed("old", 0, T0 - 10_000)).await;
    submit(store, keyed("urgent", 5, T0)).await;
    assert_eq!(set(Some(std::time::Duration::from_secs(1))).await, Some(2));
    assert_eq!(claim_order(store, T0).await, ["old", "urgent"]);

    // Stored aged, then strict again.
    submit(store, keyed("old2", 0, T0 - 10_000)).await;
    submit(store, keyed("urgent2", 5, T0)).await;
    assert_eq!(set(None).await, Some(2));
    assert_eq!(claim_order(store, T0).await, ["urgent2", "old2"]);
}

/// The SQLite writer keeps its own index of the waiting rows of concurrency keys
/// in memory: opened again, it finds every one of them in the file, of every
/// type and priority, beside unkeyed rows, and claims them in their order (keys
/// in turn, each by priority; the claim serves keys before unkeyed rows).
#[tokio::test]
async fn sqlite_claims_the_waiting_rows_of_keys_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let url = format!("sqlite://{}", dir.path().join("spool.db").display());
    let open = || async {
        SqliteStore::open(&url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"))
    };
    let row = |id: &str, ty: &str, key: Option<&str>, priority: i32| {
        let mut row = new(id, ty);
        row.priority = priority;
        row.concurrency_key = key.map(str::to_owned);
        row
    };
    {
        let store = open().await;
        for activity in [
            row("k1-low", "t", Some("k1"), -3),
            row("k1-high", "t", Some("k1"), 7),
            row("k2", "t", Some("k2"), 0),
            row("plain", "t", None, 9),
            row("other-type", "t2", Some("k1"), 0),
        ] {
            submit(&store, activity).await;
        }
        // One claimed and ended, so that a key has rows in every state.
        let first = claim(&store, &["t2"], 1, T0).await;
        assert_eq!(first.len(), 1);
        submit(&store, row("other-type-2", "t2", Some("k1"), 0)).await;
    }
    let store = open().await;
    assert_eq!(
        claim_order(&store, T0).await,
        ["k1-high", "k2", "k1-low", "plain"]
    );
    let rest: Vec<_> = claim(&store, &["t2"], 10, T0)
        .await
        .into_iter()
        .map(|r| r.key.activity_id.to_string())
        .collect();
    assert_eq!(rest, ["other-type-2"]);
}

async fn claim_respects_limit_types_and_namespace(store: &dyn Store, _raw: &Raw) {
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

async fn finish_is_fenced_by_attempt_and_status(store: &dyn Store, _raw: &Raw) {
    submit(store, new("a", "t")).await;
    let row = claim(store, &["t"], 1, T0).await.remove(0);
    let mut stale = row.clone();
    stale.attempt = 0;
    assert!(!finish(store, &stale, output("stale"), T0).await);
    let mut ahead = row.clone();
    ahead.attempt = row.attempt + 1;
    assert!(
        !finish(store, &ahead, output("ahead"), T0).await,
        "an attempt not yet made is refused too"
    );
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

async fn retry_and_snooze_reschedule(store: &dyn Store, _raw: &Raw) {
    submit(store, new("a", "t")).await;
    let row = claim(store, &["t"], 1, T0).await.remove(0);
    let error = crate::store::server_error(ErrorKind::Retryable, "Boom", "first".into());
    let retry = Transition::Retry {
        next_at: T0 + 500,
        error,
    };
    assert!(finish(store, &row, retry, T0).await);
    let row = get(store, "a").await;
    assert_eq!(row.status, ActivityStatus::Scheduled);
    assert_eq!(row.next_at, T0 + 500);
    let due = store.due_times(T0, 10).await.unwrap_or_default();
    assert_eq!(
        due.times,
        vec![(T0 + 500, "default".to_string(), "t".to_string())],
        "the retry arms the dispatch timer"
    );
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
    let error = crate::store::server_error(ErrorKind::Terminal, "Fatal", "no".into());
    assert!(finish(store, &row, Transition::Fail { error }, T0 + 1_000).await);
    let row = get(store, "a").await;
    assert_eq!(row.status, ActivityStatus::Failed);
    assert_eq!(row.finished_at, Some(T0 + 1_000));
}

async fn cancel_and_redrive(store: &dyn Store, _raw: &Raw) {
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
            assert!(row.last_error.is_none(), "the run starts afresh");
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

async fn list_pages_and_filters(store: &dyn Store, _raw: &Raw) {
    for i in 0..7 {
        submit(
            store,
            new(&format!("a{i}"), if i % 2 == 0 { "even" } else { "odd" }),
        )
        .await;
    }
    claim(store, &["odd"], 1, T0).await;
    let page = |after_id, status, ty: Option<&str>| ListQuery {
        newest_first: false,
        namespace: "default".into(),
        status,
        activity_type: ty.map(Into::into),
        after_id,
        limit: 3,
        max_bytes: 1 << 20,
    };
    let list = |query: ListQuery| async move {
        store
            .list(&query)
            .await
            .unwrap_or_else(|e| panic!("list: {e}"))
    };
    let first = list(page(0, None, None)).await;
    assert_eq!(first.rows.len(), 3);
    let last_id = first.rows.last().map_or(0, |r| r.id);
    assert_eq!(first.next_after, Some(last_id));
    let second = list(page(last_id, None, None)).await;
    assert_eq!(second.rows.len(), 3);
    assert!(second.rows.iter().all(|r| r.id > last_id));
    let third = list(page(second.next_after.unwrap_or(0), None, None)).await;
    assert_eq!(
        (third.rows.len(), third.next_after),
        (1, None),
        "the last page says no more follow"
    );
    let evens = list(page(0, None, Some("even"))).await;
    assert!(evens.rows.iter().all(|r| r.activity_type == "even"));
    assert_eq!(evens.rows.len(), 3);
    let running = list(page(0, Some(ActivityStatus::Running), None)).await;
    assert_eq!(running.rows.len(), 1);
    let other = ListQuery {
        namespace: "other".into(),
        ..page(0, None, None)
    };
    assert!(list(other).await.rows.is_empty());

    // Newest first: seven rows, pages of three, each page below the last.
    let newest = |after_id| ListQuery {
        newest_first: true,
        ..page(after_id, None, None)
    };
    let first = list(newest(0)).await;
    let ids: Vec<i64> = first.rows.iter().map(|r| r.id).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "descending: {ids:?}");
    assert_eq!(first.rows[0].key.activity_id, "a6", "the newest first");
    let second = list(newest(first.next_after.unwrap_or(0))).await;
    assert_eq!(second.rows.len(), 3);
    assert!(second.rows.iter().all(|r| r.id < ids[2]));
    let third = list(newest(second.next_after.unwrap_or(0))).await;
    assert_eq!((third.rows.len(), third.next_after), (1, None));
    assert_eq!(third.rows[0].key.activity_id, "a0");
}

async fn stats_count_by_status(store: &dyn Store, _raw: &Raw) {
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

async fn prune_deletes_only_old_finished_rows(store: &dyn Store, _raw: &Raw) {
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

async fn running_and_due_times(store: &dyn Store, _raw: &Raw) {
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
    assert_eq!(
        first.times,
        vec![(T0 + 5_000, ns(), "t".to_string())],
        "a row due when written ('now') is not read: its type was marked due then"
    );
    assert!(!first.complete, "a read that stopped at its limit says so");
    claim(store, &["t"], 2, T0 + 5_000).await;
    let first = store.running(0, 1).await.unwrap_or_default();
    assert_eq!(first.rows.len(), 1);
    assert_eq!(first.rows[0].key.activity_id, "now");
    assert!(
        first.rows[0].input.data.is_empty(),
        "running rows are read without their payloads"
    );
    let rest = store
        .running(first.next_after.unwrap_or(i64::MAX), 10)
        .await
        .unwrap_or_default();
    assert_eq!(rest.rows.len(), 1);
    assert_eq!(rest.next_after, None);
}

async fn runs_of_like_ops_behave_as_op_by_op(store: &dyn Store, _raw: &Raw) {
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
    let error = crate::store::server_error(ErrorKind::Retryable, "Boom", "bulk".into());
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

    // One run ending the same attempt twice (the first wins, as op by op), next to
    // a lease-guarded reclaim judged before its lease ended (refused) and a
    // completion that keeps the last attempt's error.
    let b = claim(store, &["t"], 1, T0 + 10).await.remove(0);
    assert_eq!(b.key.activity_id, "b");
    let ending = |row: &ActivityRow, transition, lease_expired_by| Op::Finish {
        attempt: Arc::new(Attempt::from_row(row)),
        transition,
        lease_expired_by,
    };
    let lost = crate::store::server_error(ErrorKind::WorkerLost, "WorkerLost", "gone".into());
    let run = vec![
        ending(&b, output("B"), None),
        ending(&row("e"), Transition::Fail { error: lost }, Some(T0)),
        ending(&b, Transition::Release, None),
    ];
    let accepted: Vec<bool> = apply(store, run, T0 + 11)
        .await
        .into_iter()
        .map(|o| matches!(o, Outcome::Finished { accepted: true }))
        .collect();
    assert_eq!(accepted, [true, false, false]);
    let b = get(store, "b").await;
    assert_eq!(
        (b.status, b.uncounted, b.output.map(|o| o.data)),
        (ActivityStatus::Completed, 0, Some(b"B".to_vec()))
    );
    assert_eq!(b.last_error.map(|e| e.message), Some("bulk".into()));
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

    // Submits and endings interleaved, as requests arrive under load: each is
    // answered in its place, and a submit naming a key ended earlier in the batch
    // finds it ended.
    let outcomes = apply(
        store,
        vec![
            Op::Submit(vec![new("g", "t")]),
            ending(&row("e"), output("E"), None),
            Op::Submit(vec![new("e", "t")]),
            Op::Submit(vec![new("h", "t")]),
        ],
        T0 + 12,
    )
    .await;
    assert!(matches!(&outcomes[0], Outcome::Submitted(s) if s[0].created));
    assert!(matches!(&outcomes[1], Outcome::Finished { accepted: true }));
    assert!(
        matches!(&outcomes[2], Outcome::Submitted(s)
            if !s[0].created && s[0].row.status == ActivityStatus::Completed),
        "{:?}",
        outcomes[2]
    );
    assert!(matches!(&outcomes[3], Outcome::Submitted(s) if s[0].created));
    let running = claim(store, &["t"], 5, T0 + 12).await;
    let claimed: Vec<&str> = running.iter().map(|r| &*r.key.activity_id).collect();
    assert_eq!(claimed, ["f", "g", "h"]);
    let outcomes = apply(
        store,
        vec![
            ending(&running[1], output("G"), None),
            Op::Submit(vec![new("k", "t")]),
            ending(&running[2], output("H"), None),
            Op::Submit(vec![new("l", "t")]),
        ],
        T0 + 13,
    )
    .await;
    assert!(matches!(&outcomes[0], Outcome::Finished { accepted: true }));
    assert!(matches!(&outcomes[1], Outcome::Submitted(s) if s[0].row.key.activity_id == "k"));
    assert!(matches!(&outcomes[2], Outcome::Finished { accepted: true }));
    assert!(matches!(&outcomes[3], Outcome::Submitted(s) if s[0].row.key.activity_id == "l"));
    for (id, status) in [
        ("g", ActivityStatus::Completed),
        ("h", ActivityStatus::Completed),
        ("k", ActivityStatus::Scheduled),
        ("l", ActivityStatus::Scheduled),
    ] {
        assert_eq!(get(store, id).await.status, status, "{id}");
    }
}

/// The batch a busy dispatch loop makes (the results that came in, then a claim
/// for the slots they freed), which a store may run as one statement: each ending
/// is judged as alone, and the claim takes due rows, never one an ending in the
/// batch still holds.
async fn endings_and_the_claim_that_refills_their_slots_share_a_batch(
    store: &dyn Store,
    _raw: &Raw,
) {
    for id in ["x", "y", "z", "w"] {
        submit(store, new(id, "t")).await;
    }
    let running = claim(store, &["t"], 2, T0).await;
    let claimed: Vec<&str> = running.iter().map(|r| &*r.key.activity_id).collect();
    assert_eq!(claimed, ["x", "y"]);
    let mut stale = running[1].clone();
    stale.attempt = 9;
    let ending = |row: &ActivityRow, transition| Op::Finish {
        attempt: Arc::new(Attempt::from_row(row)),
        transition,
        lease_expired_by: None,
    };
    let outcomes = apply(
        store,
        vec![
            ending(&running[0], output("X")),
            ending(&stale, output("stale")),
            claim_for(&["t"], 1),
        ],
        T0 + 1,
    )
    .await;
    assert!(matches!(&outcomes[0], Outcome::Finished { accepted: true }));
    assert!(matches!(
        &outcomes[1],
        Outcome::Finished { accepted: false }
    ));
    match &outcomes[2] {
        Outcome::Claimed { rows, .. } => {
            let ids: Vec<(&str, u32)> = rows
                .iter()
                .map(|r| (&*r.key.activity_id, r.attempt))
                .collect();
            assert_eq!(ids, [("z", 1)]);
        }
        other => panic!("expected Claimed, got {other:?}"),
    }
    assert_eq!(get(store, "x").await.status, ActivityStatus::Completed);
    assert_eq!(get(store, "y").await.status, ActivityStatus::Running);
    // A claim that finds nothing due still answers, and the endings still land.
    let y = get(store, "y").await;
    let z = get(store, "z").await;
    let w = claim(store, &["t"], 1, T0 + 2).await.remove(0);
    let outcomes = apply(
        store,
        vec![
            ending(&y, output("Y")),
            ending(&z, output("Z")),
            ending(&w, output("W")),
            claim_for(&["t"], 5),
        ],
        T0 + 3,
    )
    .await;
    assert_eq!(outcomes.len(), 4);
    assert!(
        outcomes[..3]
            .iter()
            .all(|o| matches!(o, Outcome::Finished { accepted: true })),
        "{outcomes:?}"
    );
    assert!(matches!(&outcomes[3], Outcome::Claimed { rows, .. } if rows.is_empty()));
    for id in ["y", "z", "w"] {
        assert_eq!(
            get(store, id).await.status,
            ActivityStatus::Completed,
            "{id}"
        );
    }
}

async fn renew_extends_only_attempts_still_running(store: &dyn Store, _raw: &Raw) {
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

/// The first page of the default namespace, unfiltered.
/// Each status is read along its own index (the SQLite store lists and counts
/// without an index on status): pages of every status, in both orders, hold
/// exactly that status's rows of the namespace, whose ids interleave with another's.
async fn every_status_lists_in_order_and_counts_apart_from_other_namespaces(
    store: &dyn Store,
    _raw: &Raw,
) {
    let in_ns = |ns: &str, id: &str| Key {
        namespace: ns.into(),
        ..key(id)
    };
    for i in 0..9 {
        for ns in ["default", "other"] {
            let mut activity = new(&format!("a{i}"), "t");
            activity.key = in_ns(ns, &format!("a{i}"));
            submit(store, activity).await;
        }
    }
    for ns in ["default", "other"] {
        let claim = Op::Claim(Claim {
            namespace: ns.into(),
            limit: 6,
            ..match claim_for(&["t"], 6) {
                Op::Claim(c) => c,
                other => panic!("{other:?}"),
            }
        });
        let Outcome::Claimed { rows, .. } = one(store, claim, T0).await else {
            panic!("expected Claimed");
        };
        let ids: Vec<_> = rows.iter().map(|r| r.key.activity_id.as_str()).collect();
        assert_eq!(
            ids,
            ["a0", "a1", "a2", "a3", "a4", "a5"],
            "oldest first in {ns}"
        );
        assert!(finish(store, &rows[0], output("ok"), T0 + 1).await);
        assert!(finish(store, &rows[1], output("ok"), T0 + 1).await);
        let error = crate::store::server_error(ErrorKind::Terminal, "Fatal", "no".into());
        assert!(finish(store, &rows[2], Transition::Fail { error }, T0 + 1).await);
        let cancel = Op::Cancel {
            key: in_ns(ns, "a8"),
            reason: String::new(),
        };
        one(store, cancel, T0 + 1).await;
    }
    let expected = [
        (
            None,
            vec!["a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8"],
        ),
        (Some(ActivityStatus::Scheduled), vec!["a6", "a7"]),
        (Some(ActivityStatus::Running), vec!["a3", "a4", "a5"]),
        (Some(ActivityStatus::Completed), vec!["a0", "a1"]),
        (Some(ActivityStatus::Failed), vec!["a2"]),
        (Some(ActivityStatus::Cancelled), vec!["a8"]),
    ];
    for ns in ["default", "other"] {
        for (status, ids) in &expected {
            for newest_first in [false, true] {
                let mut seen = Vec::new();
                let mut after_id = 0;
                loop {
                    let page = store
                        .list(&ListQuery {
                            namespace: ns.into(),
                            status: *status,
                            newest_first,
                            after_id,
                            ..everything(2)
                        })
                        .await
                        .unwrap_or_else(|e| panic!("list: {e}"));
                    assert!(page.rows.len() <= 2);
                    for row in &page.rows {
                        assert_eq!(row.key.namespace, ns);
                        seen.push(row.key.activity_id.clone());
                    }
                    match page.next_after {
                        Some(next) => after_id = next,
                        None => break,
                    }
                }
                let mut want = ids.clone();
                if newest_first {
                    want.reverse();
                }
                assert_eq!(seen, want, "{ns}, {status:?}, newest first: {newest_first}");
            }
        }
        assert_eq!(
            store.stats(ns).await.unwrap_or_else(|e| panic!("{e}")),
            StatusCounts {
                scheduled: 2,
                running: 3,
                completed: 2,
                failed: 1,
                cancelled: 1,
            },
            "{ns}"
        );
    }
    let counts = store
        .type_counts(T0 + 1)
        .await
        .unwrap_or_else(|e| panic!("type_counts: {e}"));
    let summary: Vec<_> = counts
        .iter()
        .map(|c| (c.namespace.as_str(), c.due, c.delayed, c.running, c.failed))
        .collect();
    assert_eq!(summary, [("default", 2, 0, 3, 1), ("other", 2, 0, 3, 1)]);
}

fn everything(limit: u32) -> ListQuery {
    ListQuery {
        newest_first: false,
        namespace: "default".into(),
        status: None,
        activity_type: None,
        after_id: 0,
        limit,
        max_bytes: 1 << 20,
    }
}

async fn computed_times_saturate_and_stay_integers(store: &dyn Store, _raw: &Raw) {
    // Validation bounds durations far below this; the store must not overflow
    // even when handed the extreme.
    let mut huge = new("huge", "t");
    huge.timeouts.schedule_to_close_ms = Some(i64::MAX);
    huge.next_at = T0;
    let submitted = submit(store, huge).await;
    assert_eq!(submitted[0].row.expires_at, Some(i64::MAX));
    let row = get(store, "huge").await;
    assert_eq!(row.expires_at, Some(i64::MAX));
    let page = store
        .list(&everything(10))
        .await
        .unwrap_or_else(|e| panic!("list: {e}"));
    assert_eq!(page.rows.len(), 1);
    let claimed = claim(store, &["t"], 1, T0).await;
    assert_eq!(claimed.len(), 1, "a far deadline does not stop a claim");
    let error = crate::store::server_error(ErrorKind::Terminal, "X", "x".into());
    assert!(finish(store, &claimed[0], Transition::Fail { error }, T0 + 1).await);
    match one(store, Op::Redrive { key: key("huge") }, T0 + 2).await {
        Outcome::Redriven { row } => assert_eq!(row.expires_at, Some(i64::MAX)),
        other => panic!("expected Redriven, got {other:?}"),
    }
    assert_eq!(get(store, "huge").await.expires_at, Some(i64::MAX));
}

async fn list_pages_are_bounded_by_bytes(store: &dyn Store, _raw: &Raw) {
    let big = |id: &str, size: usize| {
        let mut a = new(id, "t");
        a.input.data = vec![b'x'; size];
        a
    };
    submit(store, big("a", 400_000)).await;
    submit(store, big("b", 400_000)).await;
    submit(store, big("c", 2_000_000)).await;
    submit(store, big("d", 10)).await;
    let page = |after_id| ListQuery {
        newest_first: false,
        namespace: "default".into(),
        status: None,
        activity_type: None,
        after_id,
        limit: 100,
        max_bytes: 1_000_000,
    };
    let mut pages = Vec::new();
    let mut after = 0;
    loop {
        let p = store
            .list(&page(after))
            .await
            .unwrap_or_else(|e| panic!("list: {e}"));
        pages.push(
            p.rows
                .iter()
                .map(|r| r.key.activity_id.clone())
                .collect::<Vec<_>>(),
        );
        match p.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(
        pages,
        vec![vec!["a", "b"], vec!["c"], vec!["d"]],
        "pages fit the byte budget; a row larger than it comes alone"
    );
}

async fn a_batch_answers_existing_keys_without_payloads(store: &dyn Store, _raw: &Raw) {
    let mut big = new("big", "t");
    big.input.data = vec![b'x'; 1_000_000];
    submit(store, big).await;
    let batch: Vec<NewActivity> = (0..50).map(|_| new("big", "t")).collect();
    match one(store, Op::Submit(batch), T0).await {
        Outcome::Submitted(s) => {
            assert_eq!(s.len(), 50);
            for s in &s {
                assert!(!s.created);
                assert_eq!(s.row.key.activity_id, "big");
                assert_eq!(s.row.status, ActivityStatus::Scheduled);
                assert!(s.row.input.data.is_empty(), "no stored payload comes back");
            }
        }
        other => panic!("expected Submitted, got {other:?}"),
    }
    // A single submit of an existing key still returns the whole activity.
    let again = submit(store, new("big", "t")).await;
    assert_eq!(again[0].row.input.data.len(), 1_000_000);
}

async fn claims_skip_rows_past_schedule_to_close(store: &dyn Store, _raw: &Raw) {
    let mut short = new("short", "t");
    short.timeouts.schedule_to_close_ms = Some(100);
    submit(store, short).await;
    submit(store, new("open", "t")).await;
    let rows = claim(store, &["t"], 10, T0 + 100).await;
    let ids: Vec<_> = rows.iter().map(|r| r.key.activity_id.as_str()).collect();
    assert_eq!(ids, ["open"], "a row past its deadline is never dispatched");
    match one(store, Op::ExpireScheduled { limit: 10 }, T0 + 100).await {
        Outcome::Expired(keys) => assert_eq!(keys, vec![key("short")]),
        other => panic!("expected Expired, got {other:?}"),
    }
    let expired = get(store, "short").await;
    assert_eq!(expired.status, ActivityStatus::Failed);
    assert_eq!(
        expired.last_error.map(|e| (e.kind, e.r#type)),
        Some((
            ErrorKind::Timeout as i32,
            "ScheduleToCloseTimeout".to_owned()
        ))
    );
}

async fn an_unreadable_row_is_left_out_of_every_read(store: &dyn Store, raw: &Raw) {
    for id in ["a", "b", "c", "d"] {
        submit(store, new(id, "t")).await;
    }
    claim(store, &["t"], 4, T0).await;
    // An unknown status and a broken policy: no version writes them, and every read
    // must survive them.
    raw.execute("UPDATE activities SET status = 99 WHERE activity_id = 'b'")
        .await;
    raw.execute("UPDATE activities SET non_retryable = '{broken' WHERE activity_id = 'd'")
        .await;
    if raw.is_sqlite() {
        // What an older version stored when a time overflowed: a REAL.
        raw.execute("UPDATE activities SET expires_at = 1e30 WHERE activity_id = 'c'")
            .await;
    }
    let page = store
        .list(&everything(10))
        .await
        .unwrap_or_else(|e| panic!("list: {e}"));
    let ids: Vec<_> = page
        .rows
        .iter()
        .map(|r| r.key.activity_id.as_str())
        .collect();
    assert_eq!(ids, ["a", "c"]);
    if raw.is_sqlite() {
        assert_eq!(page.rows[1].expires_at, Some(i64::MAX), "a REAL saturates");
    }
    let running = store.running(0, 10).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(running.rows.len(), 2);
    raw.execute("UPDATE activities SET lease_expires_at = 0")
        .await;
    let expired = store
        .expired_leases(T0, 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(expired.len(), 2);
    let counts = store
        .stats("default")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(counts.running, 3, "the unknown status is left out of Stats");
    assert!(matches!(store.get(&key("b")).await, Err(Error::Corrupt(_))));
}

/// Generated submits, absurd ones among them, through the request validator and
/// the store: each is refused (INVALID_ARGUMENT, or RESOURCE_EXHAUSTED for a
/// payload) or stored and read back equal. Inputs mix valid values with the edges
/// (control characters, lengths at and past the limits, negative and enormous
/// durations, invalid nanos, NaN).
async fn every_submit_is_refused_or_stored_and_read_back_equal(store: &dyn Store, _raw: &Raw) {
    use proptest::{
        prelude::*,
        strategy::ValueTree,
        test_runner::{Config as Cases, RngAlgorithm, TestRng, TestRunner},
    };

    use crate::api::{self, validate};

    // Mostly valid, so that both outcomes are common; every edge shows up.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            24 => "[a-z0-9._-]{1,20}",
            8 => "\\PC{1,30}",
            1 => Just(String::new()),
            1 => "[a-zA-Z0-9 ._/-]{250,260}",
            1 => ".{0,12}",
            1 => "[a-z]{1,5}[\\x00-\\x1f\\x7f][a-z]{0,5}",
        ]
    }
    fn duration() -> impl Strategy<Value = Option<prost_types::Duration>> {
        let seconds = prop_oneof![
            40 => 0i64..5_000,
            2 => Just(10 * 365 * 86_400),
            1 => Just(10 * 365 * 86_400 + 1),
            1 => -5i64..0,
            1 => Just(i64::MAX),
            1 => Just(i64::MIN),
            1 => 1_000_000_000_000i64..1_000_000_000_001,
        ];
        let nanos = prop_oneof![
            20 => Just(0i32),
            20 => 0i32..1_000_000_000,
            1 => Just(1_000_000_000),
            1 => Just(-1)
        ];
        proptest::option::weighted(
            0.4,
            (seconds, nanos).prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
        )
    }
    let policy = proptest::option::of(
        (
            prop_oneof![
                10 => Just(0u32),
                20 => 1u32..20,
                2 => Just(10_000),
                1 => Just(10_001),
                1 => Just(u32::MAX)
            ],
            duration(),
            prop_oneof![
                10 => Just(0.0f64),
                20 => 1.0f64..3.0,
                2 => Just(100.0),
                1 => Just(0.5),
                1 => Just(f64::NAN),
                1 => Just(f64::INFINITY),
                1 => Just(100.5)
            ],
            duration(),
            proptest::collection::vec("[A-Za-z]{1,10}|\\PC{0,5}", 0..3),
        )
            .prop_map(|(max_attempts, initial, coefficient, max, types)| {
                spool_proto::v1::RetryPolicy {
                    max_attempts,
                    initial_interval: initial,
                    backoff_coefficient: coefficient,
                    max_interval: max,
                    non_retryable_error_types: types,
                }
            }),
    );
    let payload = proptest::option::of(
        (text(), proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(content_type, data)| Payload { content_type, data }),
    );
    let namespace = prop_oneof![4 => Just(String::new()), 8 => "[a-z]{1,8}", 1 => text()];
    let request = (
        (namespace, text(), text(), text()),
        payload,
        (duration(), duration(), duration(), duration()),
        policy,
        any::<i32>(),
    )
        .prop_map(
            |(
                (namespace, workflow_id, activity_id, activity_type),
                input,
                d,
                retry_policy,
                priority,
            )| {
                spool_proto::v1::SubmitRequest {
                    namespace,
                    workflow_id,
                    activity_id,
                    activity_type,
                    input,
                    delay: d.0,
                    retry_policy,
                    heartbeat_timeout: d.1,
                    start_to_close_timeout: d.2,
                    schedule_to_close_timeout: d.3,
                    priority,
                    // Every other one carries headers, a W3C traceparent among them.
                    headers: if priority % 2 == 0 {
                        [
                            ("tenant".to_owned(), format!("t{priority}")),
                            (
                                "traceparent".to_owned(),
                                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                                    .to_owned(),
                            ),
                        ]
                        .into()
                    } else {
                        Default::default()
                    },
                    concurrency_key: if priority % 3 == 0 {
                        format!("customer-{priority}")
                    } else {
                        String::new()
                    },
                    // Every fifth one has a fairness key, some with a weight out
                    // of range.
                    fairness_key: if priority % 5 == 0 {
                        format!("tenant-{}", priority % 4)
                    } else {
                        String::new()
                    },
                    fairness_weight: if priority % 5 == 0 {
                        priority.unsigned_abs() % 1_200
                    } else {
                        0
                    },
                }
            },
        );

    let mut config = crate::Config::new("unused");
    config.max_payload_bytes = 32;
    let mut runner = TestRunner::new_with_rng(
        Cases {
            cases: 200,
            ..Cases::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let (mut stored, mut refused) = (0, 0);
    for case in 0..200 {
        let submitted = request
            .new_tree(&mut runner)
            .unwrap_or_else(|e| panic!("{e}"))
            .current();
        let shown = format!("{submitted:?}");
        let asked = submitted.clone();
        let new = match validate::submit(submitted, &config, T0) {
            Ok(new) => new,
            Err(api::Error::InvalidArgument(_) | api::Error::PayloadTooLarge { .. }) => {
                refused += 1;
                continue;
            }
            Err(other) => panic!("case {case}: {other} for {shown}"),
        };
        // What was accepted is what was asked for (empty ids and namespace filled in).
        let same_or_generated = |asked: &str, got: &str| {
            if asked.is_empty() {
                uuid::Uuid::parse_str(got).is_ok()
            } else {
                asked == got
            }
        };
        assert!(
            same_or_generated(&asked.workflow_id, &new.key.workflow_id)
                && same_or_generated(&asked.activity_id, &new.key.activity_id),
            "case {case}: ids changed: {shown}"
        );
        let namespace = if asked.namespace.is_empty() {
            "default"
        } else {
            asked.namespace.as_str()
        };
        assert_eq!(new.key.namespace, namespace, "case {case}");
        assert_eq!(
            (&new.activity_type, &new.input, new.priority),
            (
                &asked.activity_type,
                &asked.input.clone().unwrap_or_default(),
                asked.priority
            ),
            "case {case}"
        );
        // Each case a key of its own: the generated ids may repeat.
        let mut new = new;
        new.key.workflow_id = format!("{case}-{}", new.key.workflow_id);
        new.key.workflow_id = validate::truncate(new.key.workflow_id, validate::MAX_NAME_BYTES);
        let outcome = store
            .apply(vec![Op::Submit(vec![new.clone()])].into(), T0)
            .await
            .unwrap_or_else(|e| {
                panic!("case {case}: the store refused a valid submit: {e} for {shown}")
            });
        assert!(
            matches!(&outcome[..], [Outcome::Submitted(s)] if s[0].created),
            "case {case}: {outcome:?}"
        );
        let row = store
            .get(&new.key)
            .await
            .unwrap_or_else(|e| panic!("case {case}: {e} for {shown}"))
            .unwrap_or_else(|| panic!("case {case}: not stored: {shown}"));
        let read_back = (
            &row.key,
            &row.activity_type,
            &row.input,
            row.next_at,
            &row.retry,
            row.timeouts,
            row.priority,
            row.expires_at,
            row.status,
            &row.headers,
            &row.concurrency_key,
            &row.fairness_key,
        );
        let sent = (
            &new.key,
            &new.activity_type,
            &new.input,
            new.next_at,
            &new.retry,
            new.timeouts,
            new.priority,
            change::expires_at(T0, new.timeouts.schedule_to_close_ms),
            ActivityStatus::Scheduled,
            &asked.headers.clone().into_iter().collect::<Headers>(),
            &Some(asked.concurrency_key.clone()).filter(|k| !k.is_empty()),
            &Some(asked.fairness_key.clone()).filter(|k| !k.is_empty()),
        );
        assert_eq!(read_back, sent, "case {case}: {shown}");
        stored += 1;
    }
    eprintln!("validator property: {stored} stored, {refused} refused");
    assert!(
        stored > 20 && refused > 20,
        "stored {stored}, refused {refused}"
    );
}

/// The lease guard: a reclaim (`Finish` with `lease_expired_by`) takes an attempt
/// only if its lease expired by then, so a renewal keeps it from another node.
async fn a_reclaim_is_refused_after_renewal_and_accepted_after_expiry(
    store: &dyn Store,
    _raw: &Raw,
) {
    submit(store, new("a", "t")).await;
    let row = claim(store, &["t"], 1, T0).await.remove(0);
    assert_eq!(row.lease_expires_at, Some(T0 + 30_000));
    let reclaim = |by: i64| Op::Finish {
        attempt: Arc::new(Attempt::from_row(&row)),
        transition: lifecycle::on_failure(
            &Attempt::from_row(&row),
            crate::store::server_error(ErrorKind::WorkerLost, "WorkerLost", "gone".into()),
            by,
            0.5,
        ),
        lease_expired_by: Some(by),
    };
    // Renewed until T0 + 90 s: a reclaim judged at T0 + 60 s finds it alive.
    match one(
        store,
        Op::Renew {
            attempts: vec![(row.id, row.attempt)],
            lease_expires_at: T0 + 90_000,
        },
        T0 + 20_000,
    )
    .await
    {
        Outcome::Renewed(r) => assert_eq!(r, vec![(row.id, row.attempt)]),
        other => panic!("expected Renewed, got {other:?}"),
    }
    match one(store, reclaim(T0 + 60_000), T0 + 60_000).await {
        Outcome::Finished { accepted } => assert!(!accepted, "a renewed lease is not reclaimed"),
        other => panic!("expected Finished, got {other:?}"),
    }
    assert_eq!(get(store, "a").await.status, ActivityStatus::Running);
    // At the lease's very end it is still held; just past it, it is taken.
    match one(store, reclaim(T0 + 90_000), T0 + 90_000).await {
        Outcome::Finished { accepted } => assert!(!accepted, "not before the lease ends"),
        other => panic!("expected Finished, got {other:?}"),
    }
    match one(store, reclaim(T0 + 90_001), T0 + 90_001).await {
        Outcome::Finished { accepted } => assert!(accepted, "an expired lease is reclaimed"),
        other => panic!("expected Finished, got {other:?}"),
    }
    let row = get(store, "a").await;
    assert_eq!(row.status, ActivityStatus::Scheduled);
    assert_eq!(
        row.last_error.map(|e| e.kind),
        Some(ErrorKind::WorkerLost as i32)
    );
    let expired = store
        .expired_leases(T0 + 100_000, 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(expired.is_empty(), "a reclaimed row is no longer RUNNING");
}

/// `ExpireScheduled` fails SCHEDULED rows past their deadline, as TIMEOUT, up to its
/// limit; rows running, without a deadline, or not yet due stay.
async fn expire_scheduled_fails_only_overdue_waiting_rows(store: &dyn Store, _raw: &Raw) {
    let with_deadline = |id: &str, ms: i64| {
        let mut a = new(id, "t");
        a.timeouts.schedule_to_close_ms = Some(ms);
        a
    };
    submit(store, with_deadline("late1", 100)).await;
    submit(store, with_deadline("late2", 100)).await;
    submit(store, with_deadline("later", 10_000)).await;
    submit(store, new("none", "t")).await;
    let mut running = with_deadline("running", 100);
    running.activity_type = "r".into();
    submit(store, running).await;
    claim(store, &["r"], 1, T0).await;
    match one(store, Op::ExpireScheduled { limit: 1 }, T0 + 100).await {
        Outcome::Expired(keys) => assert_eq!(keys.len(), 1, "at most the limit"),
        other => panic!("expected Expired, got {other:?}"),
    }
    match one(store, Op::ExpireScheduled { limit: 10 }, T0 + 100).await {
        Outcome::Expired(keys) => assert_eq!(keys.len(), 1, "the other overdue one"),
        other => panic!("expected Expired, got {other:?}"),
    }
    for id in ["late1", "late2"] {
        let row = get(store, id).await;
        assert_eq!(row.status, ActivityStatus::Failed);
        assert_eq!(row.finished_at, Some(T0 + 100));
    }
    assert_eq!(get(store, "later").await.status, ActivityStatus::Scheduled);
    assert_eq!(get(store, "none").await.status, ActivityStatus::Scheduled);
    assert_eq!(
        get(store, "running").await.status,
        ActivityStatus::Running,
        "a running attempt's deadline is the sweep's to enforce"
    );
}

/// Heartbeat details are stored only for the RUNNING attempt they name.
async fn record_heartbeats_is_fenced_by_attempt(store: &dyn Store, _raw: &Raw) {
    submit(store, new("a", "t")).await;
    let row = claim(store, &["t"], 1, T0).await.remove(0);
    let details = |s: &str| {
        Some(Payload {
            content_type: "text/plain".into(),
            data: s.as_bytes().to_vec(),
        })
    };
    let beats = vec![
        HeartbeatDetails {
            id: row.id,
            attempt: row.attempt,
            details: details("half"),
        },
        HeartbeatDetails {
            id: row.id,
            attempt: row.attempt + 1,
            details: details("not mine"),
        },
    ];
    match one(store, Op::RecordHeartbeats(beats), T0).await {
        Outcome::Recorded(n) => assert_eq!(n, 1),
        other => panic!("expected Recorded, got {other:?}"),
    }
    assert_eq!(
        get(store, "a").await.heartbeat_details.map(|d| d.data),
        Some(b"half".to_vec())
    );
    // Once the attempt ended, its details are frozen.
    assert!(finish(store, &row, output("done"), T0 + 1).await);
    let late = vec![HeartbeatDetails {
        id: row.id,
        attempt: row.attempt,
        details: details("late"),
    }];
    match one(store, Op::RecordHeartbeats(late), T0 + 2).await {
        Outcome::Recorded(n) => assert_eq!(n, 0),
        other => panic!("expected Recorded, got {other:?}"),
    }
    assert_eq!(
        get(store, "a").await.heartbeat_details.map(|d| d.data),
        Some(b"half".to_vec())
    );
}

async fn history(store: &dyn Store, id: &str) -> Vec<AttemptRecord> {
    let row = get(store, id).await;
    store
        .history(row.id)
        .await
        .unwrap_or_else(|e| panic!("history: {e}"))
}

async fn every_ended_attempt_is_in_the_history(store: &dyn Store, _raw: &Raw) {
    submit(store, new("a", "t")).await;
    assert!(history(store, "a").await.is_empty(), "nothing ended yet");
    for (n, at) in [(1, T0), (2, T0 + 1_000)] {
        let row = claim(store, &["t"], 1, at).await.remove(0);
        assert_eq!(row.attempt, n);
        let error = crate::store::server_error(ErrorKind::Retryable, "Boom", format!("try {n}"));
        let retry = Transition::Retry {
            next_at: at + 1_000,
            error,
        };
        assert!(finish(store, &row, retry, at + 300).await);
    }
    let row = claim(store, &["t"], 1, T0 + 2_000).await.remove(0);
    // A late answer to an ended attempt writes no record.
    let stale = Attempt {
        attempt: 1,
        ..Attempt::from_row(&row)
    };
    let late = Op::Finish {
        attempt: Arc::new(stale),
        transition: output("late"),
        lease_expired_by: None,
    };
    assert!(matches!(
        one(store, late, T0 + 2_100).await,
        Outcome::Finished { accepted: false }
    ));
    assert!(finish(store, &row, output("done"), T0 + 2_500).await);
    let records = history(store, "a").await;
    let summary: Vec<_> = records
        .iter()
        .map(|r| {
            (
                r.attempt,
                r.outcome.as_str(),
                r.started_at,
                r.ended_at,
                r.error.as_ref().map(|e| e.message.as_str()),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (1, "retried", Some(T0), Some(T0 + 300), Some("try 1")),
            (
                2,
                "retried",
                Some(T0 + 1_000),
                Some(T0 + 1_300),
                Some("try 2")
            ),
            (3, "completed", Some(T0 + 2_000), Some(T0 + 2_500), None),
        ]
    );
    for r in &records {
        assert_eq!(
            (
                r.worker_id.as_deref(),
                r.identity.as_deref(),
                r.node.as_deref()
            ),
            (Some("w1"), Some("host-1"), Some("node-a")),
            "who ran attempt {}",
            r.attempt
        );
    }

    // A cancel ends the running attempt too; a scheduled one has none to end.
    submit(store, new("b", "t")).await;
    claim(store, &["t"], 1, T0 + 3_000).await;
    let cancel = Op::Cancel {
        key: key("b"),
        reason: "stop".into(),
    };
    assert!(matches!(
        one(store, cancel, T0 + 3_100).await,
        Outcome::Cancelled { .. }
    ));
    let records = history(store, "b").await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].outcome, "cancelled");
    assert_eq!(
        records[0].error.as_ref().map(|e| e.message.as_str()),
        Some("stop")
    );
    submit(store, new("c", "t")).await;
    let cancel = Op::Cancel {
        key: key("c"),
        reason: String::new(),
    };
    one(store, cancel, T0 + 3_200).await;
    assert!(history(store, "c").await.is_empty());

    // A lost worker and a timeout say so.
    submit(store, new("d", "t")).await;
    let row = claim(store, &["t"], 1, T0 + 4_000).await.remove(0);
    let lost = crate::store::server_error(ErrorKind::WorkerLost, "WorkerLost", "gone".into());
    let retry = Transition::Retry {
        next_at: T0 + 4_000,
        error: lost,
    };
    assert!(finish(store, &row, retry, T0 + 4_100).await);
    let row = claim(store, &["t"], 1, T0 + 4_200).await.remove(0);
    let late = crate::store::server_error(ErrorKind::Timeout, "StartToCloseTimeout", "slow".into());
    assert!(finish(store, &row, Transition::Fail { error: late }, T0 + 4_300).await);
    let outcomes: Vec<String> = history(store, "d")
        .await
        .into_iter()
        .map(|r| r.outcome)
        .collect();
    assert_eq!(outcomes, ["lost", "timed_out"]);

    // A dead letter re-driven keeps its failed attempt in the history.
    let redrive = Op::Redrive { key: key("d") };
    assert!(matches!(
        one(store, redrive, T0 + 5_000).await,
        Outcome::Redriven { .. }
    ));
    let row = claim(store, &["t"], 1, T0 + 5_000).await.remove(0);
    assert!(finish(store, &row, output("ok"), T0 + 5_100).await);
    let records = history(store, "d").await;
    let summary: Vec<_> = records
        .iter()
        .map(|r| {
            (
                r.attempt,
                r.outcome.as_str(),
                r.ended_at,
                r.error.as_ref().map(|e| e.r#type.as_str()),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (1, "lost", Some(T0 + 4_100), Some("WorkerLost")),
            (
                2,
                "timed_out",
                Some(T0 + 4_300),
                Some("StartToCloseTimeout")
            ),
            (3, "completed", Some(T0 + 5_100), None),
        ]
    );
}

async fn history_is_bounded_and_pruned_with_its_activity(store: &dyn Store, _raw: &Raw) {
    submit(store, new("a", "t")).await;
    let attempts = HISTORY_LIMIT + 5;
    for n in 0..attempts {
        let at = T0 + i64::from(n) * 10;
        let row = claim(store, &["t"], 1, at).await.remove(0);
        assert!(finish(store, &row, Transition::Snooze { next_at: at + 10 }, at + 5).await);
    }
    let records = history(store, "a").await;
    assert_eq!(
        records.len(),
        HISTORY_LIMIT as usize,
        "only the newest are kept"
    );
    assert_eq!(records.first().map(|r| r.attempt), Some(6));
    assert_eq!(records.last().map(|r| r.attempt), Some(attempts));
    let id = get(store, "a").await.id;
    let cancel = Op::Cancel {
        key: key("a"),
        reason: String::new(),
    };
    one(store, cancel, T0 + 10_000).await;
    let prune = Op::Prune {
        before: T0 + 20_000,
        limit: 10,
    };
    assert!(matches!(
        one(store, prune, T0 + 30_000).await,
        Outcome::Pruned(1)
    ));
    let left = store
        .history(id)
        .await
        .unwrap_or_else(|e| panic!("history: {e}"));
    assert!(left.is_empty(), "pruned with its activity: {left:?}");
}

async fn type_counts_split_the_backlog(store: &dyn Store, _raw: &Raw) {
    submit(store, new("due-1", "a")).await;
    submit(store, new("due-2", "a")).await;
    let mut later = new("later", "a");
    later.next_at = T0 + 60_000;
    submit(store, later).await;
    submit(store, new("run", "b")).await;
    submit(store, new("dead", "b")).await;
    claim(store, &["b"], 2, T0).await;
    let dead = get(store, "dead").await;
    let error = crate::store::server_error(ErrorKind::Terminal, "Fatal", "no".into());
    assert!(finish(store, &dead, Transition::Fail { error }, T0 + 1).await);
    let counts = store
        .type_counts(T0 + 10)
        .await
        .unwrap_or_else(|e| panic!("type_counts: {e}"));
    let summary: Vec<_> = counts
        .iter()
        .map(|c| {
            (
                c.activity_type.as_str(),
                c.due,
                c.delayed,
                c.running,
                c.failed,
            )
        })
        .collect();
    assert_eq!(summary, [("a", 2, 1, 0, 0), ("b", 0, 0, 1, 1)]);
}

async fn a_lost_sessions_ending_is_fenced_to_its_node(store: &dyn Store, _raw: &Raw) {
    submit(store, new("a", "t")).await;
    let row = claim(store, &["t"], 1, T0).await.remove(0);
    let lost = |node: &str| Op::Finish {
        attempt: Arc::new(Attempt {
            owner_node: Some(node.into()),
            ..Attempt::from_row(&row)
        }),
        transition: Transition::Release,
        lease_expired_by: None,
    };
    assert!(
        matches!(
            one(store, lost("node-b"), T0 + 1).await,
            Outcome::Finished { accepted: false }
        ),
        "not node-b's row"
    );
    assert!(matches!(
        one(store, lost("node-a"), T0 + 2).await,
        Outcome::Finished { accepted: true }
    ));
}

async fn a_session_is_taken_over_once_with_its_ticket(store: &dyn Store, _raw: &Raw) {
    submit(store, new("a", "t")).await;
    claim(store, &["t"], 1, T0).await;
    let ticket = |secret: &str, caller: &str| SessionTicket {
        worker_id: "w1".into(),
        secret: secret.into(),
        caller: caller.into(),
        registration: "default|t|1".into(),
        at: T0,
    };
    let take = |old: &str, new: &str, caller: &str| TakeSession {
        ticket: ticket(new, caller),
        old_secret: old.into(),
        node: "node-b".into(),
    };
    store
        .save_ticket(&ticket("s1", "tokens[0]"))
        .await
        .unwrap_or_else(|e| panic!("save: {e}"));
    let taken = |t: TakeSession| async move {
        store
            .take_session(&t)
            .await
            .unwrap_or_else(|e| panic!("take: {e}"))
    };
    if store.single_node() {
        // One node holds every session: there is nothing to take over.
        assert!(taken(take("s1", "s2", "tokens[0]")).await.is_none());
        return;
    }
    assert!(taken(take("forged", "s2", "tokens[0]")).await.is_none());
    assert!(
        taken(take("s1", "s2", "tokens[1]")).await.is_none(),
        "bound to its caller"
    );
    let rows = taken(take("s1", "s2", "tokens[0]")).await;
    assert_eq!(
        rows.map(|r| r
            .iter()
            .map(|r| (r.key.activity_id.clone(), r.attempt))
            .collect::<Vec<_>>()),
        Some(vec![("a".to_owned(), 1)])
    );
    assert!(
        taken(take("s1", "s3", "tokens[0]")).await.is_none(),
        "a ticket is used once"
    );
    // The rows are node-b's now: node-a's ending of its lost session changes nothing.
    let row = get(store, "a").await;
    let lost = Op::Finish {
        attempt: Arc::new(Attempt {
            owner_node: Some("node-a".into()),
            ..Attempt::from_row(&row)
        }),
        transition: Transition::Release,
        lease_expired_by: None,
    };
    assert!(matches!(
        one(store, lost, T0 + 1).await,
        Outcome::Finished { accepted: false }
    ));
}
