//! Stored rows as wire messages: an `Activity` for clients, an `ActivityTask` for
//! the worker that runs an attempt.

use spool_proto::{time, v1};

use crate::store::{ActivityRow, AttemptRecord};

pub fn activity(row: ActivityRow) -> v1::Activity {
    v1::Activity {
        key: Some(v1::ActivityKey {
            namespace: row.key.namespace,
            workflow_id: row.key.workflow_id,
            activity_id: row.key.activity_id,
        }),
        activity_type: row.activity_type,
        status: row.status as i32,
        attempt: row.attempt,
        input: Some(row.input),
        output: row.output,
        last_error: row.last_error,
        created_at: Some(time::to_proto(row.created_at)),
        next_at: Some(time::to_proto(row.next_at)),
        started_at: row.started_at.map(time::to_proto),
        finished_at: row.finished_at.map(time::to_proto),
        worker_id: row.worker_id.unwrap_or_default(),
        heartbeat_details: row.heartbeat_details,
        max_attempts: row.retry.max_attempts,
        counted_attempts: row.attempt.saturating_sub(row.uncounted),
        headers: row.headers.into_iter().collect(),
        concurrency_key: row.concurrency_key.unwrap_or_default(),
        fairness_key: row.fairness_key.unwrap_or_default(),
        // Set by Get, which reads the limits.
        waiting_reason: String::new(),
        history: Vec::new(),
    }
}

/// An attempt record as the wire shows it.
pub fn attempt_record(a: AttemptRecord) -> v1::AttemptRecord {
    v1::AttemptRecord {
        attempt: a.attempt,
        worker_id: a.worker_id.unwrap_or_default(),
        identity: a.identity.unwrap_or_default(),
        node: a.node.unwrap_or_default(),
        started_at: a.started_at.map(time::to_proto),
        ended_at: a.ended_at.map(time::to_proto),
        outcome: a.outcome,
        error: a.error,
    }
}

/// The task that sends the attempt `row` was claimed for to its worker, ended by
/// `deadline` (see `Attempt::deadline`).
pub fn task(row: ActivityRow, deadline: Option<time::UnixMillis>) -> v1::ActivityTask {
    v1::ActivityTask {
        namespace: row.key.namespace,
        workflow_id: row.key.workflow_id,
        activity_id: row.key.activity_id,
        activity_type: row.activity_type,
        input: Some(row.input),
        attempt: row.attempt,
        scheduled_at: Some(time::to_proto(row.next_at)),
        heartbeat_timeout: row.timeouts.heartbeat_ms.map(|ms| {
            spool_proto::duration::to_proto(std::time::Duration::from_millis(ms.max(0) as u64))
        }),
        deadline: deadline.map(time::to_proto),
        max_attempts: row.retry.max_attempts,
        // The claim counted this attempt already: the ones before it.
        counted_attempts: row.attempt.saturating_sub(row.uncounted).saturating_sub(1),
        last_heartbeat_details: row.heartbeat_details,
        started_at: row.started_at.map(time::to_proto),
        headers: row.headers.into_iter().collect(),
    }
}

/// A connected worker on node `node`, as `ListWorkers` shows it.
pub fn worker(w: crate::dispatch::registry::WorkerView, node: &str) -> v1::WorkerInfo {
    v1::WorkerInfo {
        worker_id: w.worker_id.to_string(),
        identity: w.identity.to_string(),
        namespace: w.namespace.to_string(),
        activity_types: w.activity_types.iter().map(|t| t.to_string()).collect(),
        max_concurrency: w.max_concurrency,
        in_flight: w.in_flight,
        connected_at: Some(time::to_proto(w.connected_at)),
        last_seen_at: Some(time::to_proto(w.last_seen_at)),
        node: node.to_owned(),
    }
}

pub fn concurrency_limit(
    limit: crate::store::concurrency::ConcurrencyLimit,
) -> v1::ConcurrencyLimit {
    v1::ConcurrencyLimit {
        namespace: limit.namespace,
        activity_type: limit.activity_type,
        max_running: limit.max_running,
        keys: limit.keys,
        running: limit.running,
        held: limit.held,
        concurrency_key: limit.key.unwrap_or_default(),
        weight: limit.weight,
        strategy: match limit.strategy {
            crate::store::concurrency::Strategy::Queue => v1::ConcurrencyStrategy::Queue,
            crate::store::concurrency::Strategy::CancelNewest => {
                v1::ConcurrencyStrategy::CancelNewest
            }
            crate::store::concurrency::Strategy::CancelInProgress => {
                v1::ConcurrencyStrategy::CancelInProgress
            }
        } as i32,
    }
}

pub fn fairness_weight(weight: crate::store::fairness::FairnessWeight) -> v1::FairnessWeight {
    v1::FairnessWeight {
        namespace: weight.namespace,
        activity_type: weight.activity_type,
        fairness_key: weight.key,
        weight: weight.weight,
        ..Default::default()
    }
}

pub fn fairness_weight_use(used: crate::store::fairness::FairnessWeightUse) -> v1::FairnessWeight {
    v1::FairnessWeight {
        waiting: used.waiting,
        waiting_truncated: used.truncated,
        ..fairness_weight(used.weight)
    }
}

pub fn rate_limit(used: crate::store::rate::RateLimitUse) -> v1::RateLimit {
    let limit = used.limit;
    v1::RateLimit {
        namespace: limit.namespace,
        activity_type: limit.activity_type,
        limit: limit.per_period,
        period: Some(spool_proto::duration::to_proto(limit.period)),
        burst: limit.burst,
        available: used.available,
        concurrency_key: limit.key.unwrap_or_default(),
    }
}
