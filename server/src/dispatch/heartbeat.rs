//! Liveness: the periodic sweep that finds silent workers and passed timeouts,
//! stores heartbeat details, renews leases, and reclaims orphaned rows.
//!
//! Each tick (a fraction of the heartbeat interval, at most a second):
//! - a worker silent for 3 heartbeat intervals is evicted: its session ends and each
//!   attempt it held fails as `WORKER_LOST`;
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

use super::{Committer, Registry};
use crate::{
    lifecycle,
    store::Attempt,
    store::{ErrorKind, Op, Outcome, Store, Transition},
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
    let lease_ms = millis(options.lease).max(1);
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
        let sweep = registry.sweep(tick_at, silence);
        crate::metrics::liveness(registry.worker_count(), registry.running_count());
        for worker_id in &sweep.lost_workers {
            tracing::warn!(%worker_id, "worker silent for 3 heartbeat intervals: evicting");
        }
        let mut ops = Vec::new();
        // Details first: they are fenced to the running attempt, which a timeout
        // below may end in this same batch.
        if !sweep.heartbeats.is_empty() {
            ops.push(Op::RecordHeartbeats(sweep.heartbeats));
        }
        for timed_out in sweep.timed_out {
            tracing::info!(activity_id = %timed_out.attempt.key.activity_id, attempt = timed_out.attempt.attempt, "{}", timed_out.message);
            crate::metrics::timed_out(timed_out.error_type);
            let error = timed_out.error();
            let transition = if timed_out.final_ {
                Transition::Fail { error }
            } else {
                lifecycle::on_failure(&timed_out.attempt, error, now, rand::random())
            };
            ops.push(Op::Finish {
                attempt: timed_out.attempt,
                transition,
                lease_expired_by: None,
            });
        }
        ops.push(Op::ExpireScheduled { limit: SWEEP_LIMIT });
        let renewing = last_renewal
            .is_none_or(|at| tick_at.saturating_duration_since(at) >= options.lease / 3);
        let mut renewed_at = None;
        if renewing {
            if !sweep.running.is_empty() {
                renewed_at = Some(ops.len());
                ops.push(Op::Renew {
                    attempts: sweep.running.clone(),
                    lease_expires_at: now.saturating_add(lease_ms),
                });
            }
            ops.extend(reclaim(store.as_ref(), &registry, now).await);
        }
        match committer.commit(ops).await {
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
                    let gone: Vec<(i64, u32)> = sweep
                        .running
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
    rows.iter()
        .filter(|row| !registry.holds(row.id, row.attempt))
        .map(|row| {
            let attempt = Arc::new(Attempt::from_row(row));
            let error = crate::store::server_error(
                ErrorKind::WorkerLost,
                "WorkerLost",
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

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
