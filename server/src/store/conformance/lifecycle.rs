//! An attempt's endings: a result is fenced by attempt and status; retry, snooze,
//! release and fail move the row as documented; cancel and re-drive.

use super::{Raw, support::*};
use crate::store::*;

pub(super) async fn finish_is_fenced_by_attempt_and_status(store: &dyn Store, _raw: &Raw) {
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

pub(super) async fn retry_and_snooze_reschedule(store: &dyn Store, _raw: &Raw) {
    submit(store, new("a", "t")).await;
    let row = claim(store, &["t"], 1, T0).await.remove(0);
    let retry = retry(T0 + 500, "first");
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

pub(super) async fn cancel_and_redrive(store: &dyn Store, _raw: &Raw) {
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

/// An activity with an input at the payload limit moves like any other: each
/// way of leaving RUNNING that rewrites its row (a retry, a release, a snooze,
/// a cancel, a completion) is written, whatever the row holds.
pub(super) async fn a_row_at_the_payload_limit_moves_like_any_other(store: &dyn Store, _raw: &Raw) {
    let mut big = new("big", "t");
    big.input.data = vec![b'x'; 4 * 1024 * 1024];
    submit(store, big).await;
    let error = server_error(ErrorKind::Retryable, "Boom", "again".into());
    let steps = [
        Transition::Retry { next_at: T0, error },
        Transition::Release,
        Transition::Snooze { next_at: T0 },
        output("done"),
    ];
    for (n, transition) in steps.into_iter().enumerate() {
        let row = claim(store, &["t"], 1, T0).await.remove(0);
        assert_eq!(row.input.data.len(), 4 * 1024 * 1024);
        assert!(
            finish(store, &row, transition, T0).await,
            "step {n} was not written"
        );
    }
    let done = store
        .get(&key("big"))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("gone"));
    assert_eq!(done.status, ActivityStatus::Completed);
    assert_eq!(done.input.data.len(), 4 * 1024 * 1024);
}

/// Several such rows ended in one batch (a drain's release, rows claimed ahead
/// given back): SQLite's statement journal of the batch outgrew its spill
/// threshold, and its spill to a temporary file failed the batch.
pub(super) async fn rows_at_the_payload_limit_release_together(store: &dyn Store, _raw: &Raw) {
    for id in ["b1", "b2", "b3"] {
        let mut big = new(id, "t");
        big.input.data = vec![b'x'; 4 * 1024 * 1024];
        submit(store, big).await;
    }
    let rows = claim(store, &["t"], 3, T0).await;
    let ops: Vec<Op> = rows
        .iter()
        .map(|row| {
            Op::finish(
                std::sync::Arc::new(Attempt::from_row(row)),
                Transition::Release,
            )
        })
        .collect();
    let outcomes = store.apply(ops.into(), T0).await;
    assert!(outcomes.is_ok(), "{outcomes:?}");
}
