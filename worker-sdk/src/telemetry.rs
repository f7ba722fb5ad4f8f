//! The worker's own metrics, through the `metrics` facade: nothing is recorded
//! until the worker process installs an exporter (for example
//! `metrics-exporter-prometheus`), and then these appear beside its own:
//!
//! - `spool_worker_tasks_received_total{activity_type}`: tasks the server pushed;
//! - `spool_worker_pickup_seconds{activity_type}`: from when the attempt was due to
//!   its handler's start (a per-type limit's queue included);
//! - `spool_worker_handler_seconds{activity_type, outcome}`: handler run time, by
//!   `completed`, `failed` or `cancelled`;
//! - `spool_worker_reconnects_total`: sessions that ended and were opened again.

use std::time::{Duration, SystemTime};

pub(crate) fn task_received(activity_type: &str) {
    metrics::counter!("spool_worker_tasks_received_total", "activity_type" => activity_type.to_owned())
        .increment(1);
}

pub(crate) fn handler_started(activity_type: &str, due: Option<SystemTime>) {
    if let Some(waited) = due.and_then(|due| SystemTime::now().duration_since(due).ok()) {
        metrics::histogram!("spool_worker_pickup_seconds", "activity_type" => activity_type.to_owned())
            .record(waited.as_secs_f64());
    }
}

pub(crate) fn handler_ended(activity_type: &str, outcome: &'static str, took: Duration) {
    metrics::histogram!(
        "spool_worker_handler_seconds",
        "activity_type" => activity_type.to_owned(),
        "outcome" => outcome
    )
    .record(took.as_secs_f64());
}

pub(crate) fn reconnected() {
    metrics::counter!("spool_worker_reconnects_total").increment(1);
}
