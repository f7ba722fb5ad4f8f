//! When rows come due: the timer of delayed rows, and the reads of the store that
//! back it (at start, when it lost track of rows, and, with other nodes, every few
//! seconds anyway, so a lost notification delays work by that much at most). Due
//! times are wall-clock times; waits towards them are measured on the monotonic
//! clock and never longer than a second, so a step of the wall clock is noticed.

use std::time::Duration;

use spool_proto::time::UnixMillis;
use tokio::time::Instant;

use super::{
    Registry,
    timer::{self, Timer},
};
use crate::store::Store;

/// With other nodes: how often everything is marked due and the store's due times
/// re-read anyway, so a lost notification delays work by this much at most.
const SAFETY_NET_MS: i64 = 5_000;

/// With other nodes: well beyond how far two nodes' readings of the database's
/// clock differ.
const CLOCK_SLACK_MS: i64 = 1_000;

/// The longest the loop sleeps towards a due time before looking at the wall
/// clock again.
const WALL_RECHECK: Duration = Duration::from_secs(1);

/// Marks due what the timer says came due by `now`, and re-reads the store's due
/// times when the timer asks for it (`sharing`: other nodes share the store).
pub(super) async fn fire(
    timer: &mut Timer,
    store: &dyn Store,
    registry: &Registry,
    now: UnixMillis,
    sharing: bool,
) {
    for due in timer.take_due(now) {
        match due {
            Some((namespace, activity_type)) => registry.mark_due(&namespace, &activity_type),
            None => registry.mark_all_due(),
        }
    }
    if timer.must_read_store(now) {
        // Rows the timer lost track of may be due now, of any type.
        registry.mark_all_due();
        match store.due_times(now, timer::CAPACITY as u32).await {
            Ok(due) => {
                timer.read(
                    due.times
                        .into_iter()
                        .map(|(at, namespace, activity_type)| {
                            (at, Some((namespace.into(), activity_type.into())))
                        })
                        .collect(),
                    due.complete,
                );
                if sharing {
                    timer.read_again_by(now.saturating_add(SAFETY_NET_MS));
                    // The read leaves out rows due when written. One another node
                    // wrote (its notice lost, so this read) may be a few
                    // milliseconds ahead of our clock: due again once that passed.
                    timer.insert(now.saturating_add(CLOCK_SLACK_MS), None);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the next due times; retrying in 1 s");
                timer.read_again_at(now.saturating_add(1_000));
            }
        }
    }
}

/// When to wake for a due time. Due times are wall-clock times, and a wait is
/// measured on the monotonic clock, so a wait is never longer than
/// [`WALL_RECHECK`]: a step of the wall clock is noticed within it, and rows it
/// made due are not stalled.
pub(super) fn instant_for(at: UnixMillis, now: UnixMillis) -> Instant {
    let wait = u64::try_from(at.saturating_sub(now).max(0)).unwrap_or(0);
    Instant::now() + Duration::from_millis(wait).min(WALL_RECHECK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn with_other_nodes_everything_is_due_again_once_their_clocks_agree() {
        let (_dir, store) = crate::store::tests::sqlite_for_tests().await;
        let registry = Registry::new("n");

        let mut shared = Timer::default();
        fire(&mut shared, &store, &registry, 1_000, true).await;
        assert_eq!(shared.next(), Some(1_000 + CLOCK_SLACK_MS));
        assert_eq!(shared.take_due(1_000 + CLOCK_SLACK_MS), vec![None]);
        assert_eq!(shared.next(), Some(1_000 + SAFETY_NET_MS));

        let mut alone = Timer::default();
        fire(&mut alone, &store, &registry, 1_000, false).await;
        assert_eq!(alone.next(), None, "one node's clock is the only one");
    }
}
