//! The attempt history (every ended attempt, bounded) and pruning: only old
//! finished rows go, with their history.

use std::sync::Arc;

use super::{Raw, support::*};
use crate::store::*;

async fn history(store: &dyn Store, id: &str) -> Vec<AttemptRecord> {
    let row = get(store, id).await;
    store
        .history(row.id)
        .await
        .unwrap_or_else(|e| panic!("history: {e}"))
}

pub(super) async fn every_ended_attempt_is_in_the_history(store: &dyn Store, _raw: &Raw) {
    retries_and_a_completion_are_recorded_with_who_ran_them(store).await;
    a_cancel_ends_the_running_attempt_too(store).await;
    a_lost_worker_and_a_timeout_say_so(store).await;
}

/// Two retries and a completion, each with its times, error and worker; a late
/// answer to an ended attempt writes no record.
async fn retries_and_a_completion_are_recorded_with_who_ran_them(store: &dyn Store) {
    submit(store, new("a", "t")).await;
    assert!(history(store, "a").await.is_empty(), "nothing ended yet");
    for (n, at) in [(1, T0), (2, T0 + 1_000)] {
        let row = claim(store, &["t"], 1, at).await.remove(0);
        assert_eq!(row.attempt, n);
        let retry = retry(at + 1_000, &format!("try {n}"));
        assert!(finish(store, &row, retry, at + 300).await);
    }
    let row = claim(store, &["t"], 1, T0 + 2_000).await.remove(0);
    // A late answer to an ended attempt writes no record.
    let stale = Attempt {
        attempt: 1,
        ..Attempt::from_row(&row)
    };
    let late = Op::finish(Arc::new(stale), output("late"));
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
}

/// A cancel ends the running attempt too; a scheduled one has none to end.
async fn a_cancel_ends_the_running_attempt_too(store: &dyn Store) {
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
}

/// A lost worker and a timeout say so, and stay in the history when the dead
/// letter is re-driven.
async fn a_lost_worker_and_a_timeout_say_so(store: &dyn Store) {
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

pub(super) async fn history_is_bounded_and_pruned_with_its_activity(store: &dyn Store, _raw: &Raw) {
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

pub(super) async fn prune_deletes_only_old_finished_rows(store: &dyn Store, _raw: &Raw) {
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
