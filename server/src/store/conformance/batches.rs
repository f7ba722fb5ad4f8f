//! Batches: the ops of one `apply` behave as if applied one by one, however a
//! store runs them (runs of like ops as one statement, endings beside the claim
//! that refills their slots).

use std::sync::Arc;

use super::{Raw, support::*};
use crate::store::*;

/// Runs of like ops in one batch, which a store may run as one statement each:
/// every op is answered as it would be alone, in its place.
pub(super) async fn runs_of_like_ops_behave_as_op_by_op(store: &dyn Store, _raw: &Raw) {
    a_run_of_submits_stores_them_in_order(store).await;
    let e = a_run_of_endings_judges_each_alone(store).await;
    an_attempt_ended_twice_in_a_run_ends_once(store, &e).await;
    a_run_naming_a_stored_key_answers_per_op(store).await;
    submits_and_endings_interleaved_answer_in_place(store, &e).await;
}

/// An ending of `row`'s attempt, guarded by its lease if `lease_expired_by` is set.
fn ending_of(
    row: &ActivityRow,
    transition: Transition,
    lease_expired_by: Option<UnixMillis>,
) -> Op {
    Op::Finish {
        attempt: Arc::new(Attempt::from_row(row)),
        transition,
        lease_expired_by,
    }
}

/// Submits of one batch, some of several rows: each row stored, ids in order.
async fn a_run_of_submits_stores_them_in_order(store: &dyn Store) {
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
}

/// Endings of every kind in one batch, a stale one among them: each is judged as
/// alone. Returns e, whose stale ending was refused: still running.
async fn a_run_of_endings_judges_each_alone(store: &dyn Store) -> ActivityRow {
    let rows = claim(store, &["t"], 5, T0).await;
    let row = |id: &str| by_id(&rows, id);
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
        .map(|(row, transition)| Op::finish(Arc::new(Attempt::from_row(&row)), transition))
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
    row("e")
}

/// One run ending the same attempt twice (the first wins, as op by op), next to
/// a lease-guarded reclaim judged before its lease ended (refused) and a
/// completion that keeps the last attempt's error.
async fn an_attempt_ended_twice_in_a_run_ends_once(store: &dyn Store, e: &ActivityRow) {
    let b = claim(store, &["t"], 1, T0 + 10).await.remove(0);
    assert_eq!(b.key.activity_id, "b");
    let lost = crate::store::server_error(ErrorKind::WorkerLost, "WorkerLost", "gone".into());
    let run = vec![
        ending_of(&b, output("B"), None),
        ending_of(e, Transition::Fail { error: lost }, Some(T0)),
        ending_of(&b, Transition::Release, None),
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
}

/// A run naming a key that exists falls back and still answers per op.
async fn a_run_naming_a_stored_key_answers_per_op(store: &dyn Store) {
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

/// Submits and endings interleaved, as requests arrive under load: each is
/// answered in its place, and a submit naming a key ended earlier in the batch
/// finds it ended.
async fn submits_and_endings_interleaved_answer_in_place(store: &dyn Store, e: &ActivityRow) {
    let outcomes = apply(
        store,
        vec![
            Op::Submit(vec![new("g", "t")]),
            ending_of(e, output("E"), None),
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
            ending_of(&running[1], output("G"), None),
            Op::Submit(vec![new("k", "t")]),
            ending_of(&running[2], output("H"), None),
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
pub(super) async fn endings_and_the_claim_that_refills_their_slots_share_a_batch(
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
    let ending =
        |row: &ActivityRow, transition| Op::finish(Arc::new(Attempt::from_row(row)), transition);
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

/// A run of completions longer than one statement ends (SQLite ends up to 32 in
/// one), with refused ones among them: a stale attempt, a row already ended, the
/// same attempt completed twice in the run, one guarded by a lease that has not
/// lapsed. Each is judged as alone and each row keeps its own output.
pub(super) async fn a_long_run_of_completions_judges_each_alone(store: &dyn Store, _raw: &Raw) {
    let ids: Vec<String> = (0..40).map(|i| format!("c{i:02}")).collect();
    for id in &ids {
        submit(store, new(id, "t")).await;
    }
    let rows = claim(store, &["t"], 40, T0).await;
    assert_eq!(rows.len(), 40);
    assert!(finish(store, &by_id(&rows, "c05"), output("first"), T0 + 1).await);

    let mut run = Vec::new();
    let mut expected = Vec::new();
    for id in &ids {
        let mut row = by_id(&rows, id);
        let accepted = match id.as_str() {
            "c05" => false,
            "c07" => {
                row.attempt = 9;
                false
            }
            _ => true,
        };
        run.push(Op::finish(Arc::new(Attempt::from_row(&row)), output(id)));
        expected.push(accepted);
        if id == "c11" {
            run.push(Op::finish(
                Arc::new(Attempt::from_row(&row)),
                output("twice"),
            ));
            expected.push(false);
        }
        if id == "c30" {
            let lost =
                crate::store::server_error(ErrorKind::WorkerLost, "WorkerLost", "gone".into());
            run.push(Op::Finish {
                attempt: Arc::new(Attempt::from_row(&by_id(&rows, "c31"))),
                transition: Transition::Fail { error: lost },
                lease_expired_by: Some(T0 + 2),
            });
            expected.push(false);
        }
    }
    run.push(Op::finish(
        Arc::new(Attempt::from_row(&by_id(&rows, "c20"))),
        output("late"),
    ));
    expected.push(false);

    let accepted: Vec<bool> = apply(store, run, T0 + 2)
        .await
        .into_iter()
        .map(|o| match o {
            Outcome::Finished { accepted } => accepted,
            other => panic!("expected Finished, got {other:?}"),
        })
        .collect();
    assert_eq!(accepted, expected);
    for id in &ids {
        let row = get(store, id).await;
        let (status, output) = match id.as_str() {
            "c05" => (ActivityStatus::Completed, Some("first")),
            "c07" => (ActivityStatus::Running, None),
            id => (ActivityStatus::Completed, Some(id)),
        };
        assert_eq!(row.status, status, "{id}");
        assert_eq!(
            row.output.map(|o| o.data),
            output.map(|o| o.as_bytes().to_vec()),
            "{id}"
        );
        if status == ActivityStatus::Completed {
            let at = if id == "c05" { T0 + 1 } else { T0 + 2 };
            assert_eq!(
                (row.finished_at, row.lease_expires_at),
                (Some(at), None),
                "{id}"
            );
        }
    }
}
