//! What happens to an attempt when it ends: the retry policy, backoff with jitter,
//! the dead letter and snoozes, as pure functions of the attempt and the clock.
//!
//! Invariants:
//! - only attempts that count (`attempt - uncounted`) are compared with
//!   `max_attempts`; snoozes and releases never use up the budget;
//! - a terminal error, or an error whose type is listed as non-retryable, fails the
//!   activity at once, whatever the budget;
//! - a retry that would start after the schedule-to-close deadline fails now.

use spool_proto::time::UnixMillis;

use crate::store::{ActivityError, Attempt, ErrorKind, RetrySpec, Transition, server_error};

/// The fate of a failed attempt. `jitter` is a random number in `[0, 1)`.
pub fn on_failure(
    attempt: &Attempt,
    error: ActivityError,
    now: UnixMillis,
    jitter: f64,
) -> Transition {
    let kind = ErrorKind::try_from(error.kind).unwrap_or(ErrorKind::Retryable);
    if kind == ErrorKind::Terminal || attempt.retry.non_retryable.contains(&error.r#type) {
        return Transition::Fail { error };
    }
    let counted = attempt.attempt.saturating_sub(attempt.uncounted);
    if counted >= attempt.retry.max_attempts {
        return Transition::Fail { error };
    }
    let delay_ms = match (&error.next_retry_delay, kind) {
        (Some(d), _) => spool_proto::duration::from_proto(Some(d))
            .ok()
            .flatten()
            .map_or(0, spool_proto::time::millis),
        // A lost worker is no fault of the activity's: run it again at once.
        (None, ErrorKind::WorkerLost) => 0,
        (None, _) => backoff_ms(&attempt.retry, counted, jitter),
    };
    let next_at = now.saturating_add(delay_ms);
    if attempt
        .schedule_to_close_deadline()
        .is_some_and(|deadline| next_at >= deadline)
    {
        return Transition::Fail { error };
    }
    Transition::Retry { next_at, error }
}

/// The delay before the attempt after `counted` counted attempts: `initial ×
/// coefficient^(counted-1)`, capped at `max_interval`, then spread by ±10 % so that
/// activities failing together do not retry together.
pub fn backoff_ms(retry: &RetrySpec, counted: u32, jitter: f64) -> i64 {
    let exponent = i32::try_from(counted.saturating_sub(1)).unwrap_or(i32::MAX);
    let base = retry.initial_interval_ms as f64 * retry.backoff_coefficient.powi(exponent);
    let capped = base.min(retry.max_interval_ms as f64);
    let spread = capped * (0.9 + 0.2 * jitter.clamp(0.0, 1.0));
    // Never past the cap, never negative; `as` saturates on the float-to-int edge.
    spread.clamp(0.0, retry.max_interval_ms as f64) as i64
}

/// An error the server records on its own behalf (lost worker, timeouts).
/// The transition of an attempt whose worker is gone (`why` says how): a
/// failure like any other, counted, retried while attempts remain.
pub fn lost(attempt: &Attempt, why: String, now: UnixMillis) -> Transition {
    on_failure(attempt, lost_error(why), now, rand::random())
}

/// The error an attempt whose worker is gone ends with.
pub fn lost_error(why: String) -> ActivityError {
    server_error(ErrorKind::WorkerLost, "WorkerLost", why)
}

/// The transition of an attempt a draining server gives up: back to SCHEDULED,
/// uncounted (unless the `release-counted` breakage is on; see `breakage`).
pub fn release(attempt: &Attempt, now: UnixMillis) -> Transition {
    if crate::breakage::active(crate::breakage::Breakage::ReleaseCounted) {
        return lost(
            attempt,
            "released by a draining server (counted: deliberately broken)".to_owned(),
            now,
        );
    }
    Transition::Release
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(n: u32, max: u32) -> Attempt {
        let retry = RetrySpec {
            max_attempts: max,
            initial_interval_ms: 1_000,
            backoff_coefficient: 2.0,
            max_interval_ms: 300_000,
            non_retryable: vec!["Fatal".into()],
        };
        crate::store::attempt_for_tests(1, n, retry)
    }

    fn error(kind: ErrorKind, ty: &str) -> ActivityError {
        server_error(kind, ty, "boom".into())
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let spec = attempt(1, 10).retry;
        assert_eq!(backoff_ms(&spec, 1, 0.5), 1_000);
        assert_eq!(backoff_ms(&spec, 2, 0.5), 2_000);
        assert_eq!(backoff_ms(&spec, 4, 0.5), 8_000);
        assert_eq!(backoff_ms(&spec, 40, 0.5), 300_000);
        assert_eq!(backoff_ms(&spec, 40, 0.999), 300_000);
        assert_eq!(backoff_ms(&spec, 1, 0.0), 900);
        assert_eq!(backoff_ms(&spec, 1, 1.0), 1_100);
    }

    #[test]
    fn retryable_error_retries_until_the_budget_is_spent() {
        let of_three = |n| {
            on_failure(
                &attempt(n, 3),
                error(ErrorKind::Retryable, "X"),
                10_000,
                0.5,
            )
        };
        // The second of three retries waits twice the interval.
        for (n, due) in [(1, 11_000), (2, 12_000)] {
            let t = of_three(n);
            assert!(
                matches!(t, Transition::Retry { next_at, .. } if next_at == due),
                "attempt {n}: {t:?}"
            );
        }
        let t = of_three(3);
        assert!(matches!(t, Transition::Fail { .. }), "{t:?}");
    }

    #[test]
    fn uncounted_attempts_do_not_spend_the_budget() {
        let mut a = attempt(3, 3);
        a.uncounted = 1;
        let t = on_failure(&a, error(ErrorKind::Retryable, "X"), 0, 0.5);
        assert!(matches!(t, Transition::Retry { .. }), "{t:?}");
    }

    #[test]
    fn terminal_and_non_retryable_fail_at_once() {
        let t = on_failure(&attempt(1, 10), error(ErrorKind::Terminal, "X"), 0, 0.5);
        assert!(matches!(t, Transition::Fail { .. }), "{t:?}");
        let t = on_failure(
            &attempt(1, 10),
            error(ErrorKind::Retryable, "Fatal"),
            0,
            0.5,
        );
        assert!(matches!(t, Transition::Fail { .. }), "{t:?}");
    }

    #[test]
    fn worker_lost_retries_immediately_and_next_retry_delay_overrides() {
        let t = on_failure(
            &attempt(1, 10),
            error(ErrorKind::WorkerLost, "WorkerLost"),
            500,
            0.5,
        );
        assert!(matches!(t, Transition::Retry { next_at: 500, .. }), "{t:?}");
        let mut e = error(ErrorKind::Retryable, "X");
        e.next_retry_delay = Some(prost_types::Duration {
            seconds: 7,
            nanos: 0,
        });
        let t = on_failure(&attempt(1, 10), e, 500, 0.5);
        assert!(
            matches!(t, Transition::Retry { next_at: 7_500, .. }),
            "{t:?}"
        );
    }

    /// An attempt's deadline is the earlier of start-to-close (from its start) and
    /// schedule-to-close; none without either.
    #[test]
    fn an_attempts_deadline_is_the_earlier_bound() {
        let mut a = attempt(1, 10);
        a.started_at = 1_000;
        assert_eq!(a.deadline(), None);
        a.timeouts.start_to_close_ms = Some(500);
        assert_eq!(a.deadline(), Some(1_500));
        a.expires_at = Some(1_200);
        assert_eq!(a.deadline(), Some(1_200));
        a.expires_at = Some(9_000);
        assert_eq!(a.deadline(), Some(1_500));
        a.timeouts.start_to_close_ms = None;
        assert_eq!(a.deadline(), Some(9_000));
    }

    #[test]
    fn a_retry_past_schedule_to_close_fails_now() {
        let mut a = attempt(1, 10);
        a.timeouts.schedule_to_close_ms = Some(1_500);
        a.expires_at = Some(1_500);
        let t = on_failure(&a, error(ErrorKind::Retryable, "X"), 1_000, 0.5);
        assert!(matches!(t, Transition::Fail { .. }), "{t:?}");
    }
}
