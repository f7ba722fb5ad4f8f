//! Claims: which rows a claim takes (due, of its types and namespace, by priority
//! then age, none past its schedule-to-close deadline), in what order they come
//! back, and that they are the rows as stored; and the sweep of overdue waiting rows.

use super::{Raw, support::*};
use crate::store::*;

pub(super) async fn claim_takes_due_rows_by_priority_then_age(store: &dyn Store, _raw: &Raw) {
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

/// The rows of one claim come back in claim order, which is the order they are
/// sent in: a worker with one free slot and rows ahead runs the most urgent
/// first, whatever order the rows were stored in.
pub(super) async fn a_claim_returns_its_rows_in_claim_order(store: &dyn Store, _raw: &Raw) {
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

/// A claim of more rows than one statement takes (SQLite claims them in chunks)
/// takes each due row once, those first in claim order, and leaves the rest
/// waiting.
pub(super) async fn a_large_claim_takes_each_row_once_in_claim_order(
    store: &dyn Store,
    _raw: &Raw,
) {
    // Stored newest first: claim order (by age) is the reverse of the ids'.
    for i in 0..75 {
        submit(store, ranked(&format!("r{i:02}"), 0, T0 - i)).await;
    }
    let rows = claim(store, &["t"], 70, T0).await;
    let ids: Vec<_> = rows.iter().map(|r| r.key.activity_id.clone()).collect();
    let expected: Vec<_> = (5..75).rev().map(|i| format!("r{i:02}")).collect();
    assert_eq!(ids, expected);
    for row in &rows {
        assert_eq!((row.status, row.attempt), (ActivityStatus::Running, 1));
        let stored = get(store, &row.key.activity_id).await;
        assert_eq!(
            (stored.status, stored.attempt),
            (ActivityStatus::Running, 1)
        );
    }
    for i in 0..5 {
        let waiting = get(store, &format!("r{i:02}")).await;
        assert_eq!(
            (waiting.status, waiting.attempt),
            (ActivityStatus::Scheduled, 0)
        );
    }
    assert_eq!(claim(store, &["t"], 100, T0).await.len(), 5);
}

/// A claim hands out its rows as they are stored once claimed, every column: a
/// store that builds them rather than read them back must build them right.
pub(super) async fn a_claimed_row_is_what_the_store_holds(store: &dyn Store, _raw: &Raw) {
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
    let retried = finish(store, &first[0], retry(T0 + 5, "again"), T0 + 1).await;
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

pub(super) async fn claim_respects_limit_types_and_namespace(store: &dyn Store, _raw: &Raw) {
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

pub(super) async fn claims_skip_rows_past_schedule_to_close(store: &dyn Store, _raw: &Raw) {
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

/// `ExpireScheduled` fails SCHEDULED rows past their deadline, as TIMEOUT, up to its
/// limit; rows running, without a deadline, or not yet due stay.
pub(super) async fn expire_scheduled_fails_only_overdue_waiting_rows(
    store: &dyn Store,
    _raw: &Raw,
) {
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
