//! Priority aging: strict priority by default, aged once set, strict again when
//! unset; a change ranks the waiting rows (keyed ones too) again in steps.

use super::{Raw, support::*};
use crate::store::*;

pub(super) async fn priority_ages_once_set_and_is_strict_again_when_unset(
    store: &dyn Store,
    _raw: &Raw,
) {
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
    let retry = retry(T0 + 1_000, "again");
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
pub(super) async fn a_priority_aging_change_ranks_waiting_rows_in_steps(
    store: &dyn Store,
    _raw: &Raw,
) {
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
pub(super) async fn priority_aging_ranks_a_keys_waiting_rows_again(store: &dyn Store, _raw: &Raw) {
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
