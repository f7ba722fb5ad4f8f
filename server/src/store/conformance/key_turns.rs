//! Concurrency keys' turns: keys share a claim and take turns by weight, a key
//! gets no credit for a spell away and holds no one back when nothing of it is
//! due; and the SQLite writer finds its keys' waiting rows again when reopened.

use super::{Raw, support::*};
use crate::store::*;

pub(super) async fn keys_share_a_claim_and_take_turns(store: &dyn Store, _raw: &Raw) {
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

pub(super) async fn keys_are_served_in_proportion_to_their_weights(store: &dyn Store, _raw: &Raw) {
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
pub(super) async fn a_key_back_from_a_retry_has_no_credit_for_its_absence(
    store: &dyn Store,
    _raw: &Raw,
) {
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
    let retry = retry(T0 + 30, "again");
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

pub(super) async fn a_key_with_nothing_due_does_not_hold_back_the_others(
    store: &dyn Store,
    _raw: &Raw,
) {
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

/// The SQLite writer keeps its own index of the waiting rows of concurrency keys
/// in memory: opened again, it finds every one of them in the file, of every
/// type and priority, beside unkeyed rows, and claims them in their order (keys
/// in turn, each by priority; the claim serves keys before unkeyed rows).
pub(super) async fn sqlite_claims_the_waiting_rows_of_keys_after_a_reopen() {
    let (_dir, url) = crate::store::tests::sqlite_url_for_tests();
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
