//! Fairness keys: a key's backlog does not delay another key's rows, keys are
//! served by weight (their rows' own, or one set for the key), a newcomer joins
//! the head of a backlog, and keys order a concurrency key's own rows.

use super::{Raw, support::*};
use crate::store::{fairness::FairnessWeight, *};

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

pub(super) async fn a_fairness_keys_backlog_does_not_delay_another_keys_rows(
    store: &dyn Store,
    raw: &Raw,
) {
    // Tenant a's backlog, in one submit; then one row of tenant b and one row
    // without a fairness key.
    backlog_of_a(store, 50).await;
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
    assert_eq!(claimed_ids(store, 4, T0).await, ["a0", "a1", "b0", "u0"]);

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

pub(super) async fn a_newcomer_joins_the_head_of_a_backlog_behind_now(
    store: &dyn Store,
    raw: &Raw,
) {
    // a's backlog has waited 10 s past the virtual times it was given when b's
    // first row comes.
    backlog_of_a(store, 20).await;
    let later = T0 + 10_000;
    let b0 = NewActivity {
        next_at: later,
        ..fair("b0", "t", "b", 1)
    };
    one(store, Op::Submit(vec![b0]), later).await;
    assert_eq!(
        claimed_ids(store, 3, later).await,
        ["a0", "a1", "b0"],
        "b0 next to a's head"
    );

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

pub(super) async fn fairness_keys_are_served_in_proportion_to_their_weights(
    store: &dyn Store,
    raw: &Raw,
) {
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

pub(super) async fn a_weight_set_for_a_fairness_key_places_its_new_rows(
    store: &dyn Store,
    raw: &Raw,
) {
    let weight = |namespace: &str, ty: &str, key: &str, weight: u32| {
        Op::Setting(SettingChange::FairnessWeight(FairnessWeight {
            namespace: namespace.into(),
            activity_type: ty.into(),
            key: key.into(),
            weight,
        }))
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
    let remove = || {
        Op::Setting(SettingChange::Remove {
            namespace: "default".into(),
            activity_type: "t".into(),
            setting: Setting::FairnessWeight("h".into()),
        })
    };
    let removed = one(store, remove(), T0).await;
    assert!(matches!(removed, Outcome::Removed(true)));
    let again = one(store, remove(), T0).await;
    assert!(matches!(again, Outcome::Removed(false)));
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

pub(super) async fn fairness_keys_order_a_concurrency_keys_own_rows(store: &dyn Store, _raw: &Raw) {
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

/// Tenant a's backlog of `n` rows of type "t", in one submit at `T0`.
async fn backlog_of_a(store: &dyn Store, n: usize) {
    let backlog = (0..n)
        .map(|i| fair(&format!("a{i}"), "t", "a", 1))
        .collect();
    one(store, Op::Submit(backlog), T0).await;
}

/// The ids of the next `n` rows of type "t" claimed at `now`, sorted.
async fn claimed_ids(store: &dyn Store, n: u32, now: i64) -> Vec<String> {
    let mut ids: Vec<String> = claim(store, &["t"], n, now)
        .await
        .into_iter()
        .map(|r| r.key.activity_id)
        .collect();
    ids.sort();
    ids
}
