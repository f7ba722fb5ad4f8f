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

use std::{
    sync::OnceLock,
    time::{Duration, SystemTime},
};

use metrics::{Counter, Histogram};

/// One activity type's metric handles, made at a session's first task of the
/// type: building and hashing the labels at every task cost three allocations an
/// activity. A recorder installed later counts from the next session; so does a
/// type whose series an exporter's idle timeout removed meanwhile.
pub(crate) struct TypeMetrics {
    activity_type: String,
    received: Counter,
    /// Made when first recorded, so that only what happened is exported.
    pickup: OnceLock<Histogram>,
    /// By [`Ended`], made when first recorded.
    handler: [OnceLock<Histogram>; 3],
}

/// How a handler that started ended, as `spool_worker_handler_seconds` counts it.
#[derive(Clone, Copy)]
pub(crate) enum Ended {
    Completed = 0,
    Failed = 1,
    Cancelled = 2,
}

impl Ended {
    fn name(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

impl TypeMetrics {
    pub(crate) fn new(activity_type: &str) -> Self {
        Self {
            activity_type: activity_type.to_owned(),
            received: metrics::counter!(
                "spool_worker_tasks_received_total",
                "activity_type" => activity_type.to_owned()
            ),
            pickup: OnceLock::new(),
            handler: Default::default(),
        }
    }

    pub(crate) fn task_received(&self) {
        self.received.increment(1);
    }

    pub(crate) fn handler_started(&self, due: Option<SystemTime>) {
        if let Some(waited) = due.and_then(|due| SystemTime::now().duration_since(due).ok()) {
            self.pickup
                .get_or_init(|| {
                    metrics::histogram!(
                        "spool_worker_pickup_seconds",
                        "activity_type" => self.activity_type.clone()
                    )
                })
                .record(waited.as_secs_f64());
        }
    }

    pub(crate) fn handler_ended(&self, ended: Ended, took: Duration) {
        self.handler[ended as usize]
            .get_or_init(|| {
                metrics::histogram!(
                    "spool_worker_handler_seconds",
                    "activity_type" => self.activity_type.clone(),
                    "outcome" => ended.name()
                )
            })
            .record(took.as_secs_f64());
    }
}

pub(crate) fn reconnected() {
    metrics::counter!("spool_worker_reconnects_total").increment(1);
}
