//! Submits: a key is stored once (a repeat returns the stored row, in a batch
//! without its payload; another type conflicts; a batch is all or nothing), and
//! the times computed from a submit saturate.

use super::{Raw, support::*};
use crate::store::*;

pub(super) async fn submit_is_idempotent_per_key(store: &dyn Store, _raw: &Raw) {
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

pub(super) async fn submit_conflicts_on_another_type(store: &dyn Store, _raw: &Raw) {
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

pub(super) async fn submit_batch_is_all_or_nothing(store: &dyn Store, _raw: &Raw) {
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

pub(super) async fn a_batch_answers_existing_keys_without_payloads(store: &dyn Store, _raw: &Raw) {
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

pub(super) async fn computed_times_saturate_and_stay_integers(store: &dyn Store, _raw: &Raw) {
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
