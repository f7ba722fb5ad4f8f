//! Fairness keys as the stores keep them: the rows of a namespace's type are
//! served fairly over their `fairness_key`s (tenants) by the order the claim
//! already follows, `claim_rank`, with no work at claim time.
//!
//! A submit gives each row with a fairness key a virtual due time, `fair_at`
//! (start-time fair queuing): its key's chain moved on by one stride, one
//! millisecond at weight 1 ([`stride_us`]), starting at the later of
//! - the key's own chain (`fairness_keys.last_us`, per namespace, type, band and
//!   key), and
//! - the virtual time of the row the claim would take next in the same band (the
//!   head: `claim_rank + priority × aging` of the first row due now; a delayed or
//!   retrying row is not the head), or now when the band has no row due.
//!
//! The head is what makes it fair both ways: a key starting anew joins the keys
//! being served, so it is neither served alone until it catches up with a key
//! whose backlog runs ahead of now, nor queued behind a key whose backlog has
//! waited past its virtual times; and a key back from idle has no credit for the
//! time it was away.
//!
//! The row is then ranked as if it came due at `fair_at`, or at `next_at` when it
//! was submitted with a delay that ends later (the chain still moves one stride,
//! not to `next_at`). One key's
//! backlog of a million rows spans a million milliseconds of virtual time, while
//! another key's new row lands next to the head: it waits for about one row of
//! each key with rows waiting (per weight), not for the backlog. Rows without a
//! fairness key keep being ranked by when they come due.
//!
//! A weight set for a key (`fairness_weights`, through `AdminService`) takes the
//! place of the weights its rows are submitted with: the submit reads it in the
//! same statement that moves the chain, so every node places the key's new rows
//! by it once it is committed. Rows already placed keep their places. A listing
//! of the weights counts each key's waiting rows ([`with_waiting`]) among the
//! first [`WAITING_COUNTED`] of its type in claim order, so that it costs the
//! same however long the backlog.
//!
//! Invariants:
//! - a chain only moves forward, and is moved in the submit's own transaction (on
//!   PostgreSQL under the key's row lock), so two submits of one key never share
//!   a place;
//! - a submit of a key already stored moves no chain;
//! - a chain behind the head of its band, or behind now when the band has no row
//!   due, changes nothing any more: the pruner deletes it, and a key that
//!   returns starts afresh (a row ranked ahead of the head since can
//!   move the head back, by at most what that row's own rank allows);
//! - `fair_at` is a rank only: the claim still takes a row only when `next_at` is
//!   due, and a retry, a snooze, a release or a re-drive ranks the row by its new
//!   due time again (`fair_at` is cleared).

use super::concurrency::MAX_WEIGHT;

/// How far one row of weight 1 moves its key's chain: one millisecond of virtual
/// time, kept in microseconds so that weights up to [`MAX_WEIGHT`] stay exact
/// enough (a key of weight 1,000 places a row each microsecond).
pub const STRIDE_US: i64 = 1_000;

/// How far one row of `weight` (0 counts as 1) moves its key's chain.
pub fn stride_us(weight: u32) -> i64 {
    STRIDE_US / i64::from(weight.clamp(1, MAX_WEIGHT))
}

/// A row's `fair_at` (ms) from its key's chain just after it (µs): the chain's
/// millisecond, which is behind now when the head has waited past its own (the
/// row then goes next to it), unless the row was submitted with a delay and comes
/// due later (it is ranked by its due time, and does not move the chain there).
pub fn fair_at(chain_us: i64, next_at_ms: i64, now_ms: i64) -> i64 {
    let chain = chain_us / 1_000;
    if next_at_ms > now_ms {
        chain.max(next_at_ms)
    } else {
        chain
    }
}

/// The most waiting rows of a type a listing of weights reads to count each
/// key's: the first in claim order, so that a listing costs the same however
/// long the backlog.
pub const WAITING_COUNTED: i64 = 100_000;

/// A weight, with its key's rows waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FairnessWeightUse {
    pub weight: FairnessWeight,
    /// Among the first [`WAITING_COUNTED`] waiting rows of the type.
    pub waiting: u64,
    /// The type had more waiting rows than were counted.
    pub truncated: bool,
}

/// The waiting rows of one type counted by fairness key (`None`: without one),
/// as a store reads them: among the first [`WAITING_COUNTED`] in claim order,
/// each count with whether more were waiting.
#[derive(Debug, Default)]
struct WaitingByKey {
    counts: std::collections::HashMap<Option<String>, u64>,
    truncated: bool,
}

impl WaitingByKey {
    fn new(counts: Vec<(Option<String>, i64, bool)>) -> Self {
        Self {
            truncated: counts.iter().any(|&(_, _, more)| more),
            counts: counts
                .into_iter()
                .map(|(key, n, _)| (key, u64::try_from(n).unwrap_or(0)))
                .collect(),
        }
    }

    /// `weight` with the rows of its key counted here.
    fn of(&self, weight: FairnessWeight) -> FairnessWeightUse {
        let waiting = self
            .counts
            .get(&Some(weight.key.clone()))
            .copied()
            .unwrap_or(0);
        FairnessWeightUse {
            weight,
            waiting,
            truncated: self.truncated,
        }
    }
}

/// `weights`, sorted by type, each with its key's waiting rows: `count` reads a
/// type's (by namespace and type) once, as the dialects' `WAITING_BY_FAIRNESS_KEY`
/// answers: key, rows, whether more were waiting.
pub async fn with_waiting<F, Fut>(
    weights: Vec<FairnessWeight>,
    mut count: F,
) -> Result<Vec<FairnessWeightUse>, super::Error>
where
    F: FnMut(String, String) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<(Option<String>, i64, bool)>, super::Error>>,
{
    let mut used = Vec::with_capacity(weights.len());
    let mut counted: Option<((String, String), WaitingByKey)> = None;
    for weight in weights {
        let of = (weight.namespace.clone(), weight.activity_type.clone());
        let waiting = match counted.take() {
            Some((t, waiting)) if t == of => waiting,
            _ => WaitingByKey::new(count(of.0.clone(), of.1.clone()).await?),
        };
        used.push(waiting.of(weight));
        counted = Some((of, waiting));
    }
    Ok(used)
}

/// The weight set for one fairness key of a namespace's type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FairnessWeight {
    pub namespace: String,
    pub activity_type: String,
    pub key: String,
    /// 1 to [`MAX_WEIGHT`].
    pub weight: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A type with more rows waiting than were counted marks every count of it.
    #[test]
    fn a_count_with_more_waiting_is_marked_truncated() {
        let weight = |key: &str| FairnessWeight {
            namespace: "default".into(),
            activity_type: "t".into(),
            key: key.into(),
            weight: 2,
        };
        let all = WaitingByKey::new(vec![(Some("a".into()), 10, false), (None, 90, false)]);
        let used = all.of(weight("a"));
        assert_eq!((used.waiting, used.truncated), (10, false));
        assert_eq!(all.of(weight("b")).waiting, 0);
        let cut = WaitingByKey::new(vec![(Some("a".into()), 10, true), (None, 90, true)]);
        assert!(cut.of(weight("a")).truncated);
        assert!(cut.of(weight("b")).truncated, "a key not among them too");
    }

    /// The SQL counts as many rows as the listing says.
    #[test]
    fn the_sql_counts_what_the_listing_says() {
        assert_eq!(
            waiting_counted!().parse::<i64>().ok(),
            Some(WAITING_COUNTED)
        );
    }

    #[test]
    fn a_row_is_ranked_by_its_chain_unless_it_comes_due_later() {
        assert_eq!(fair_at(101_000, 100, 100), 101);
        assert_eq!(fair_at(101_999, 100, 100), 101);
        // Behind now: next to an overdue head.
        assert_eq!(fair_at(51_000, 100, 100), 51);
        // Delayed: its due time.
        assert_eq!(fair_at(101_000, 60_000, 100), 60_000);
        assert_eq!(fair_at(90_000_000, 60_000, 100), 90_000);
    }

    #[test]
    fn the_statements_stride_is_the_schedulers() {
        assert_eq!(fair_stride_us!().parse::<i64>().ok(), Some(STRIDE_US));
    }

    #[test]
    fn heavier_rows_move_the_chain_less() {
        assert_eq!(stride_us(0), 1_000);
        assert_eq!(stride_us(1), 1_000);
        assert_eq!(stride_us(3), 333);
        assert_eq!(stride_us(1_000), 1);
        assert_eq!(stride_us(u32::MAX), 1);
        // Three rows of weight 3 share the millisecond one row of weight 1 takes.
        let places: Vec<i64> = (1..=4).map(|n| fair_at(n * stride_us(3), 0, 0)).collect();
        assert_eq!(places, [0, 0, 0, 1]);
    }
}
