//! A running attempt's lease: renewals extend only attempts still running, a
//! reclaim takes only an expired lease, and heartbeat details are fenced by attempt.

use std::sync::Arc;

use super::{Raw, support::*};
use crate::{lifecycle, store::*};

pub(super) async fn renew_extends_only_attempts_still_running(store: &dyn Store, _raw: &Raw) {
    for id in ["a", "b", "c"] {
        submit(store, new(id, "t")).await;
    }
    let rows = claim(store, &["t"], 3, T0).await;
    let row = |id: &str| by_id(&rows, id);
    let (a, b, c) = (row("a"), row("b"), row("c"));
    finish(store, &b, output("done"), T0 + 1).await;
    let attempts = vec![(a.id, a.attempt), (b.id, b.attempt), (c.id, c.attempt + 1)];
    match one(
        store,
        Op::Renew {
            attempts,
            lease_expires_at: T0 + 99_000,
        },
        T0 + 2,
    )
    .await
    {
        Outcome::Renewed(renewed) => assert_eq!(
            renewed,
            vec![(a.id, a.attempt)],
            "not b (finished), not c (another attempt)"
        ),
        other => panic!("expected Renewed, got {other:?}"),
    }
    assert_eq!(get(store, "a").await.lease_expires_at, Some(T0 + 99_000));
    assert_eq!(get(store, "c").await.lease_expires_at, Some(T0 + 30_000));
}

/// The lease guard: a reclaim (`Finish` with `lease_expired_by`) takes an attempt
/// only if its lease expired by then, so a renewal keeps it from another node.
pub(super) async fn a_reclaim_is_refused_after_renewal_and_accepted_after_expiry(
    store: &dyn Store,
    _raw: &Raw,
) {
    submit(store, new("a", "t")).await;
    let row = claim(store, &["t"], 1, T0).await.remove(0);
    assert_eq!(row.lease_expires_at, Some(T0 + 30_000));
    let reclaim = |by: i64| Op::Finish {
        attempt: Arc::new(Attempt::from_row(&row)),
        transition: lifecycle::on_failure(
            &Attempt::from_row(&row),
            crate::store::server_error(ErrorKind::WorkerLost, "WorkerLost", "gone".into()),
            by,
            0.5,
        ),
        lease_expired_by: Some(by),
    };
    // Renewed until T0 + 90 s: a reclaim judged at T0 + 60 s finds it alive.
    match one(
        store,
        Op::Renew {
            attempts: vec![(row.id, row.attempt)],
            lease_expires_at: T0 + 90_000,
        },
        T0 + 20_000,
    )
    .await
    {
        Outcome::Renewed(r) => assert_eq!(r, vec![(row.id, row.attempt)]),
        other => panic!("expected Renewed, got {other:?}"),
    }
    match one(store, reclaim(T0 + 60_000), T0 + 60_000).await {
        Outcome::Finished { accepted } => assert!(!accepted, "a renewed lease is not reclaimed"),
        other => panic!("expected Finished, got {other:?}"),
    }
    assert_eq!(get(store, "a").await.status, ActivityStatus::Running);
    // At the lease's very end it is still held; just past it, it is taken.
    match one(store, reclaim(T0 + 90_000), T0 + 90_000).await {
        Outcome::Finished { accepted } => assert!(!accepted, "not before the lease ends"),
        other => panic!("expected Finished, got {other:?}"),
    }
    match one(store, reclaim(T0 + 90_001), T0 + 90_001).await {
        Outcome::Finished { accepted } => assert!(accepted, "an expired lease is reclaimed"),
        other => panic!("expected Finished, got {other:?}"),
    }
    let row = get(store, "a").await;
    assert_eq!(row.status, ActivityStatus::Scheduled);
    assert_eq!(
        row.last_error.map(|e| e.kind),
        Some(ErrorKind::WorkerLost as i32)
    );
    let expired = store
        .expired_leases(T0 + 100_000, 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(expired.is_empty(), "a reclaimed row is no longer RUNNING");
}

/// Heartbeat details are stored only for the RUNNING attempt they name.
pub(super) async fn record_heartbeats_is_fenced_by_attempt(store: &dyn Store, _raw: &Raw) {
    submit(store, new("a", "t")).await;
    let row = claim(store, &["t"], 1, T0).await.remove(0);
    let details = |s: &str| {
        Some(Payload {
            content_type: "text/plain".into(),
            data: s.as_bytes().to_vec(),
        })
    };
    let beats = vec![
        HeartbeatDetails {
            id: row.id,
            attempt: row.attempt,
            details: details("half"),
        },
        HeartbeatDetails {
            id: row.id,
            attempt: row.attempt + 1,
            details: details("not mine"),
        },
    ];
    match one(store, Op::RecordHeartbeats(beats), T0).await {
        Outcome::Recorded(n) => assert_eq!(n, 1),
        other => panic!("expected Recorded, got {other:?}"),
    }
    assert_eq!(
        get(store, "a").await.heartbeat_details.map(|d| d.data),
        Some(b"half".to_vec())
    );
    // Once the attempt ended, its details are frozen.
    assert!(finish(store, &row, output("done"), T0 + 1).await);
    let late = vec![HeartbeatDetails {
        id: row.id,
        attempt: row.attempt,
        details: details("late"),
    }];
    match one(store, Op::RecordHeartbeats(late), T0 + 2).await {
        Outcome::Recorded(n) => assert_eq!(n, 0),
        other => panic!("expected Recorded, got {other:?}"),
    }
    assert_eq!(
        get(store, "a").await.heartbeat_details.map(|d| d.data),
        Some(b"half".to_vec())
    );
}
