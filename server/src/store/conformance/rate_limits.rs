//! Rate limits: a type's or a key's token bucket holds claims to its rate,
//! and only its own rows.

use super::{Raw, support::*};
use crate::store::*;

pub(super) async fn a_rate_limit_holds_claims_to_its_bucket(store: &dyn Store, _raw: &Raw) {
    let limit = |namespace: &str| rate::RateLimit {
        namespace: namespace.into(),
        activity_type: "t".into(),
        key: None,
        per_period: 2,
        period: std::time::Duration::from_secs(1),
        burst: 2,
    };
    assert!(matches!(
        one(
            store,
            Op::Setting(SettingChange::RateLimit(limit("default"))),
            T0
        )
        .await,
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
    assert_eq!(uses(store, None, T0 + 500).await, [empty(limit("default"))]);
    let later = uses(store, Some("default"), T0 + 60_000).await;
    assert_eq!(later[0].available, 2, "a bucket fills up to its burst");
    assert!(uses(store, Some("other"), T0).await.is_empty());

    let mut other = claim_for(&["t"], 10);
    if let Op::Claim(claim) = &mut other {
        claim.namespace = "other".into();
    }
    assert_eq!(claimed(one(store, other, T0 + 500).await), (1, vec![]));

    let remove = || {
        Op::Setting(SettingChange::Remove {
            namespace: "default".into(),
            activity_type: "t".into(),
            setting: Setting::RateLimit(None),
        })
    };
    assert!(matches!(
        one(store, remove(), T0).await,
        Outcome::Removed(true)
    ));
    assert!(matches!(
        one(store, remove(), T0).await,
        Outcome::Removed(false)
    ));
    assert_eq!(
        at(T0 + 600).await,
        (2, vec![]),
        "no limit: the rest at once"
    );
}

pub(super) async fn a_keys_rate_limit_holds_only_its_rows(store: &dyn Store, _raw: &Raw) {
    // Key "mail" of t: two a second, two at once; "sms" and unkeyed rows free.
    let limit = rate::RateLimit {
        namespace: "default".into(),
        activity_type: "t".into(),
        key: Some("mail".into()),
        per_period: 2,
        period: std::time::Duration::from_secs(1),
        burst: 2,
    };
    one(
        store,
        Op::Setting(SettingChange::RateLimit(limit.clone())),
        T0,
    )
    .await;
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
    assert_eq!(uses(store, None, T0 + 500).await, [empty(limit.clone())]);
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
    let remove = Op::Setting(SettingChange::Remove {
        namespace: "default".into(),
        activity_type: "t".into(),
        setting: Setting::RateLimit(Some("mail".into())),
    });
    assert!(matches!(
        one(store, remove, T0).await,
        Outcome::Removed(true)
    ));
    assert_eq!(at(T0 + 1_500).await.0, ["mail-late"]);
}

/// The rate limits of `namespace` (every one when `None`) and their use at `now`.
async fn uses(store: &dyn Store, namespace: Option<&str>, now: i64) -> Vec<rate::RateLimitUse> {
    store
        .rate_limits(namespace, now)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `limit` with its bucket empty.
fn empty(limit: rate::RateLimit) -> rate::RateLimitUse {
    rate::RateLimitUse {
        limit,
        available: 0,
    }
}
