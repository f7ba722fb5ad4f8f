//! Timeout policy: when each of an attempt's timeouts falls, on the monotonic clock,
//! and which one an attempt has passed. A deadline stored as wall time
//! (schedule-to-close) is turned into an `Instant` once, at dispatch, so a step of
//! the wall clock neither fires nor stalls it.

use std::{sync::Arc, time::Duration};

use spool_proto::time::UnixMillis;
use tokio::time::Instant;

use crate::store::{Attempt, ErrorKind};

/// An attempt the sweep ended because a timeout passed.
#[derive(Debug)]
pub struct TimedOut {
    pub attempt: Arc<Attempt>,
    pub error_type: &'static str,
    pub message: String,
    /// Schedule-to-close: the whole activity is over, not just this attempt.
    pub final_: bool,
}

/// When start-to-close and schedule-to-close end an attempt.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    start_to_close_at: Option<Instant>,
    schedule_to_close_at: Option<Instant>,
}

impl Deadlines {
    /// The deadlines of `attempt`, dispatched at `now` (monotonic) and `now_wall`.
    pub fn at_dispatch(attempt: &Attempt, now: Instant, now_wall: UnixMillis) -> Self {
        let after = |ms: i64| now + Duration::from_millis(u64::try_from(ms.max(0)).unwrap_or(0));
        Self {
            start_to_close_at: attempt.timeouts.start_to_close_ms.map(after),
            // Stored as wall time: what is left of it from now.
            schedule_to_close_at: attempt
                .schedule_to_close_deadline()
                .map(|deadline| after(deadline.saturating_sub(now_wall))),
        }
    }

    /// The timeout `attempt` has passed at `now`, if any (schedule-to-close first:
    /// it ends the activity for good).
    pub fn passed(
        &self,
        attempt: &Arc<Attempt>,
        last_heartbeat: Instant,
        now: Instant,
    ) -> Option<TimedOut> {
        let timeouts = &attempt.timeouts;
        let timed_out = |error_type: &'static str, message: String, final_: bool| TimedOut {
            attempt: attempt.clone(),
            error_type,
            message,
            final_,
        };
        if self.schedule_to_close_at.is_some_and(|at| now >= at) {
            let (error_type, message) = crate::store::SCHEDULE_TO_CLOSE;
            return Some(timed_out(error_type, message.to_owned(), true));
        }
        if let Some(ms) = timeouts.start_to_close_ms
            && self.start_to_close_at.is_some_and(|at| now >= at)
        {
            return Some(timed_out(
                "StartToCloseTimeout",
                format!(
                    "attempt {} ran longer than start_to_close_timeout ({ms} ms)",
                    attempt.attempt
                ),
                false,
            ));
        }
        if let Some(ms) = timeouts.heartbeat_ms
            && now.saturating_duration_since(last_heartbeat)
                >= Duration::from_millis(u64::try_from(ms.max(0)).unwrap_or(0))
        {
            return Some(timed_out(
                "HeartbeatTimeout",
                format!(
                    "attempt {} sent no heartbeat for heartbeat_timeout ({ms} ms)",
                    attempt.attempt
                ),
                false,
            ));
        }
        None
    }
}

impl TimedOut {
    /// The error this timeout records.
    pub fn error(&self) -> crate::store::ActivityError {
        crate::store::server_error(ErrorKind::Timeout, self.error_type, self.message.clone())
    }
}
