//! Liveness: the periodic sweep that finds silent workers and passed timeouts,
//! stores heartbeat details, renews leases, and reclaims orphaned rows.
//!
//! Each tick (a fraction of the heartbeat interval, at most a second):
//! - a worker silent for 3 heartbeat intervals, on two ticks in a row, is evicted:
//!   its session ends and each attempt it held fails as `WORKER_LOST`;
//! - an attempt past its heartbeat or start-to-close timeout fails as `TIMEOUT`
//!   (retried per policy), past schedule-to-close it fails for good; its worker is
//!   sent `CancelActivity` and keeps the slot until it answers;
//! - heartbeat details reported since the last tick are written, latest only;
//! - SCHEDULED rows past their schedule-to-close deadline fail as `TIMEOUT`;
//! - every third of the lease, the leases of all running attempts are extended in
//!   one statement (per attempt: a row re-claimed as a later attempt is not kept
//!   alive by the earlier one's holder), and RUNNING rows whose lease expired and
//!   that no live worker of this process holds are reclaimed as `WORKER_LOST`;
//! - an attempt held here whose row the store no longer has RUNNING at that attempt
//!   was ended elsewhere: its worker is told to stop.
//!
//! Invariant: an attempt whose worker lives is never reclaimed, however long it
//! runs: its lease is renewed while the worker is registered here.

use std::{collections::HashSet, sync::Arc, time::Duration};

use spool_proto::time::UnixMillis;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Committer, Registry, registry::Sweep};
use crate::{
    lifecycle,
    store::Attempt,
    store::{Op, Outcome, Store, Transition},
};

/// Most rows expired or reclaimed per tick; the rest wait for the next tick.
const SWEEP_LIMIT: u32 = 1_000;

pub struct Options {
    pub heartbeat_interval: Duration,
    pub lease: Duration,
    /// How often the sweep runs (`Config::sweep_tick`).
    pub tick: Duration,
}

pub async fn run(
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    committer: Committer,
    options: Options,
    shutdown: CancellationToken,
) {
    let tick = options.tick;
    let silence = options.heartbeat_interval.saturating_mul(3);
    let lease_ms = spool_proto::time::millis(options.lease).max(1);
    // Rows claimed ahead are sent within milliseconds while their worker keeps
    // pace; one that waited a quarter of the lease goes back for any worker.
    let hold_ahead = options.lease / 4;
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When leases were last renewed, on the monotonic clock: a step of the wall
    // clock must neither skip renewals nor rush them.
    let mut last_renewal: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let now = store.now();
        let tick_at = Instant::now();
        let mut sweep = registry.sweep(tick_at, silence, hold_ahead);
        let flushed = std::mem::take(&mut sweep.flushed);
        crate::metrics::liveness(registry.worker_count(), registry.running_count());
        for worker_id in &sweep.lost_workers {
            tracing::warn!(%worker_id, "worker silent for 3 heartbeat intervals: evicting");
        }
        for timed_out in &sweep.timed_out {
            tracing::info!(activity_id = %timed_out.attempt.key.activity_id, attempt = timed_out.attempt.attempt, "{}", timed_out.message);
            crate::metrics::timed_out(timed_out.error_type);
        }
        let renewing = renewal_due(last_renewal, tick_at, options.lease);
        let running = sweep.running.clone();
        let Plan {
            mut ops,
            renewed_at,
        } = plan(sweep, now, renewing.then_some(lease_ms), rand::random());
        if renewing {
            ops.extend(reclaim(store.as_ref(), &registry, now).await);
        }
        let committed = committer.commit(ops).await;
        registry.details_flushed(&flushed, committed.is_ok());
        match committed {
            Ok(outcomes) => {
                if renewing {
                    // Only once renewed for sure: a failed write retries next tick.
                    last_renewal = Some(tick_at);
                }
                if let Some(Outcome::Renewed(renewed)) = renewed_at.and_then(|i| outcomes.get(i)) {
                    // An attempt held here but no longer RUNNING in the store was
                    // ended elsewhere (another node cancelled or reclaimed it, or a
                    // notification was lost): tell its worker to stop.
                    let renewed: HashSet<&(i64, u32)> = renewed.iter().collect();
                    let gone: Vec<(i64, u32)> = running
                        .into_iter()
                        .filter(|a| !renewed.contains(a))
                        .collect();
                    if !gone.is_empty() {
                        registry.end_attempts(&gone, "the attempt was ended elsewhere");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "liveness sweep not written; retrying next tick"),
        }
    }
}

/// Leases are renewed every third of their length (so two renewals can fail before
/// one lapses), timed on the monotonic clock from the last renewal that committed.
fn renewal_due(last_renewal: Option<Instant>, now: Instant, lease: Duration) -> bool {
    last_renewal.is_none_or(|at| now.saturating_duration_since(at) >= lease / 3)
}

/// What one tick writes, in order.
struct Plan {
    ops: Vec<Op>,
    /// Where the lease renewal is in `ops`, if there is one.
    renewed_at: Option<usize>,
}

/// The tick's writes from what the registry found: heartbeat details first (they
/// are fenced to the running attempt, which a timeout may end in the same batch),
/// then each timed-out attempt's ending (for good past schedule-to-close, else per
/// its retry policy), the overdue SCHEDULED rows, and, when `renew_for` gives the
/// lease length, the renewal of every running attempt.
fn plan(sweep: Sweep, now: UnixMillis, renew_for: Option<i64>, jitter: f64) -> Plan {
    let mut ops = Vec::new();
    if !sweep.heartbeats.is_empty() {
        ops.push(Op::RecordHeartbeats(sweep.heartbeats));
    }
    for timed_out in sweep.timed_out {
        let error = timed_out.error();
        let transition = if timed_out.final_ {
            Transition::Fail { error }
        } else {
            lifecycle::on_failure(&timed_out.attempt, error, now, jitter)
        };
        ops.push(Op::finish(timed_out.attempt, transition));
    }
    for (worker_id, attempts) in sweep.abandoned {
        tracing::info!(%worker_id, lost = attempts.len(), "worker did not resume its session within the grace: its attempts are lost");
        crate::metrics::worker_lost();
        for attempt in attempts {
            let error = lifecycle::lost_error(format!(
                "worker {worker_id} dropped its stream and did not resume within the grace"
            ));
            ops.push(Op::Finish {
                transition: lifecycle::on_failure(&attempt, error, now, jitter),
                attempt,
                lease_expired_by: None,
            });
        }
    }
    ops.push(Op::ExpireScheduled { limit: SWEEP_LIMIT });
    let mut renewed_at = None;
    if let Some(lease_ms) = renew_for
        && !sweep.running.is_empty()
    {
        renewed_at = Some(ops.len());
        ops.push(Op::Renew {
            attempts: sweep.running,
            lease_expires_at: now.saturating_add(lease_ms),
        });
    }
    Plan { ops, renewed_at }
}

/// Ends RUNNING rows whose lease expired and that no worker here holds: their
/// owner is gone without this process having seen it end.
async fn reclaim(store: &dyn Store, registry: &Registry, now: UnixMillis) -> Vec<Op> {
    let rows = match store.expired_leases(now, SWEEP_LIMIT).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read expired leases");
            return Vec::new();
        }
    };
    reclaims(&rows, |id, attempt| registry.holds(id, attempt), now)
}

/// The endings of expired-lease rows not `held` here: lost workers' attempts,
/// guarded by the lease (a holder that renewed meanwhile keeps its attempt).
fn reclaims(
    rows: &[crate::store::ActivityRow],
    held: impl Fn(i64, u32) -> bool,
    now: UnixMillis,
) -> Vec<Op> {
    rows.iter()
        .filter(|row| !held(row.id, row.attempt))
        .map(|row| {
            let attempt = Arc::new(Attempt::from_row(row));
            let error = lifecycle::lost_error(
                "the attempt's lease expired with no live worker holding it".to_owned(),
            );
            tracing::warn!(activity_id = %attempt.key.activity_id, attempt = attempt.attempt, "reclaiming an attempt whose lease expired");
            Op::Finish {
                transition: lifecycle::on_failure(&attempt, error, now, rand::random()),
                attempt,
                lease_expired_by: Some(now),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dispatch::timeouts::TimedOut, store::RetrySpec};

    fn attempt(id: i64, n: u32, max_attempts: u32) -> Arc<Attempt> {
        let retry = RetrySpec {
            max_attempts,
            initial_interval_ms: 1_000,
            backoff_coefficient: 2.0,
            max_interval_ms: 10_000,
            non_retryable: Vec::new(),
        };
        Arc::new(crate::store::attempt_for_tests(id, n, retry))
    }

    fn timed_out(attempt: Arc<Attempt>, final_: bool) -> TimedOut {
        TimedOut {
            attempt,
            error_type: "StartToClose",
            message: "too slow".into(),
            final_,
        }
    }

    #[test]
    fn a_tick_orders_details_endings_expiry_and_renewal() {
        let sweep = Sweep {
            lost_workers: Vec::new(),
            timed_out: vec![
                timed_out(attempt(1, 1, 3), false),
                timed_out(attempt(2, 3, 3), false),
                timed_out(attempt(3, 1, 3), true),
            ],
            heartbeats: vec![crate::store::HeartbeatDetails {
                id: 9,
                attempt: 1,
                details: None,
            }],
            flushed: Vec::new(),
            running: vec![(9, 1)],
            abandoned: vec![("gone".into(), vec![attempt(4, 1, 3)])],
        };
        let Plan { ops, renewed_at } = plan(sweep, 50_000, Some(30_000), 0.5);
        assert!(matches!(ops[0], Op::RecordHeartbeats(_)), "details first");
        let endings: Vec<(i64, &Transition)> = ops[1..5]
            .iter()
            .map(|op| match op {
                Op::Finish {
                    attempt,
                    transition,
                    lease_expired_by: None,
                } => (attempt.id, transition),
                other => panic!("expected an ending, got {other:?}"),
            })
            .collect();
        // Budget left: retried after the backoff (jitter 0.5 is none). Budget spent, or past
        // schedule-to-close: failed for good.
        assert!(
            matches!(
                endings[0],
                (
                    1,
                    Transition::Retry {
                        next_at: 51_000,
                        ..
                    }
                )
            ),
            "{endings:?}"
        );
        assert!(
            matches!(endings[1], (2, Transition::Fail { .. })),
            "{endings:?}"
        );
        assert!(
            matches!(endings[2], (3, Transition::Fail { .. })),
            "{endings:?}"
        );
        // A worker that did not resume in time: its attempt is lost, and retried.
        assert!(
            matches!(endings[3], (4, Transition::Retry { error, .. }) if error.r#type == "WorkerLost"),
            "{endings:?}"
        );
        assert!(matches!(ops[5], Op::ExpireScheduled { .. }));
        assert_eq!(renewed_at, Some(6));
        match &ops[6] {
            Op::Renew {
                attempts,
                lease_expires_at,
            } => assert_eq!(
                (attempts.as_slice(), *lease_expires_at),
                ([(9, 1)].as_slice(), 80_000)
            ),
            other => panic!("expected the renewal, got {other:?}"),
        }
    }

    /// Renewals every third of the lease on the monotonic clock, walked on paused
    /// time: the first tick renews, then not again until a third has passed.
    #[tokio::test(start_paused = true)]
    async fn leases_are_renewed_every_third_of_their_length() {
        let lease = Duration::from_secs(30);
        assert!(renewal_due(None, Instant::now(), lease), "first tick");
        let renewed = Instant::now();
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(!renewal_due(Some(renewed), Instant::now(), lease));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(renewal_due(Some(renewed), Instant::now(), lease));
    }

    #[test]
    fn no_renewal_between_renewal_ticks_or_with_nothing_running() {
        let running = Sweep {
            running: vec![(9, 1)],
            ..Default::default()
        };
        let between = plan(running, 0, None, 0.0);
        assert_eq!(between.renewed_at, None);
        assert!(!between.ops.iter().any(|op| matches!(op, Op::Renew { .. })));
        let idle = plan(Sweep::default(), 0, Some(30_000), 0.0);
        assert_eq!(idle.renewed_at, None);
        assert!(matches!(idle.ops.as_slice(), [Op::ExpireScheduled { .. }]));
    }

    #[test]
    fn only_rows_nobody_here_holds_are_reclaimed_under_the_lease_guard() {
        let row = |id: i64| {
            let mut row = crate::store::running_row_for_tests(id, &format!("a{id}"), "gone");
            row.attempt = 2;
            row.lease_expires_at = Some(6_000);
            row
        };
        let rows = [row(1), row(2)];
        let ops = reclaims(&rows, |id, attempt| id == 1 && attempt == 2, 7_000);
        assert_eq!(ops.len(), 1, "the held row stays");
        match &ops[0] {
            Op::Finish {
                attempt,
                transition,
                lease_expired_by,
            } => {
                assert_eq!((attempt.id, attempt.attempt), (2, 2));
                assert_eq!(*lease_expired_by, Some(7_000), "guarded by the lease");
                let error = match transition {
                    Transition::Retry { error, .. } | Transition::Fail { error } => error,
                    other => panic!("a lost worker's ending, got {other:?}"),
                };
                assert_eq!(error.kind, crate::store::ErrorKind::WorkerLost as i32);
            }
            other => panic!("expected an ending, got {other:?}"),
        }
    }
}
