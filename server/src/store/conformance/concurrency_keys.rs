//! Concurrency keys' limits: at most a limit running per key (the type's or the
//! key's own), the counts that enforce it through every move of a row, and the
//! strategies that cancel the newest or the oldest.

use std::sync::Arc;

use super::{Raw, support::*};
use crate::store::*;

pub(super) async fn a_concurrency_key_runs_at_most_its_limit(store: &dyn Store, _raw: &Raw) {
    let keyed = |id: &str, ty: &str, key: Option<&str>| {
        let mut row = new(id, ty);
        row.concurrency_key = key.map(str::to_owned);
        row
    };
    let set = Op::Setting(SettingChange::ConcurrencyLimit {
        namespace: "default".into(),
        activity_type: "t".into(),
        max_running: 2,
        strategy: concurrency::Strategy::Queue,
    });
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
    let retry = retry(T0 + 1_000, "again");
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
    let remove = Op::Setting(SettingChange::Remove {
        namespace: "default".into(),
        activity_type: "t".into(),
        setting: Setting::ConcurrencyLimit(None),
    });
    assert!(matches!(
        one(store, remove, T0).await,
        Outcome::Removed(true)
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

pub(super) async fn a_key_may_have_its_own_limit(store: &dyn Store, _raw: &Raw) {
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
        Op::Setting(SettingChange::ConcurrencyLimit {
            namespace: "default".into(),
            activity_type: "t".into(),
            max_running: 2,
            strategy: concurrency::Strategy::Queue,
        }),
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
    let remove = Op::Setting(SettingChange::Remove {
        namespace: "default".into(),
        activity_type: "t".into(),
        setting: Setting::ConcurrencyLimit(Some("vip".into())),
    });
    assert!(matches!(
        one(store, remove.clone(), T0).await,
        Outcome::Removed(true)
    ));
    assert!(matches!(
        one(store, remove, T0).await,
        Outcome::Removed(false)
    ));
    assert!(
        claim(store, &["t"], 50, T0 + 3).await.is_empty(),
        "vip runs 4, over the type's 2 now"
    );
}

pub(super) async fn key_counts_follow_every_move_of_their_rows(store: &dyn Store, _raw: &Raw) {
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
    let end =
        |row: &ActivityRow, transition| Op::finish(Arc::new(Attempt::from_row(row)), transition);
    let retry = retry(T0 + 1_000, "again");
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

pub(super) async fn concurrency_strategies_cancel_the_newest_or_the_oldest(
    store: &dyn Store,
    _raw: &Raw,
) {
    let limit = |strategy| {
        Op::Setting(SettingChange::ConcurrencyLimit {
            namespace: "default".into(),
            activity_type: "t".into(),
            max_running: 2,
            strategy,
        })
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
pub(super) async fn a_batchs_endings_make_room_for_its_submits(store: &dyn Store, _raw: &Raw) {
    one(
        store,
        Op::Setting(SettingChange::ConcurrencyLimit {
            namespace: "default".into(),
            activity_type: "t".into(),
            max_running: 1,
            strategy: concurrency::Strategy::CancelNewest,
        }),
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
    let ending = Op::finish(Arc::new(Attempt::from_row(&running[0])), output("done"));
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
        transition: retry(T0 + 10_000, "again"),
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
    let ending = Op::finish(Arc::new(Attempt::from_row(&running[0])), output("done"));
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
