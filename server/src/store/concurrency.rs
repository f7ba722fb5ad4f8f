//! Concurrency keys as the stores keep them: of the rows of a namespace's type
//! sharing a `concurrency_key`, at most the key's `max_running` (its own, else the
//! type's) are RUNNING at once, on every node. Each key's waiting and running rows
//! are counted in `concurrency_keys`, in the same transaction as every status
//! change (by triggers, and by the claim for the rows it takes).
//!
//! The keys share claims by weight (stride scheduling): a claim serves the keys
//! with room and the lowest pass, gives each a share of its rows in proportion to
//! its weight, and moves each key's pass on by [`stride`] per row. It locks the
//! keys it serves, so two nodes never both fill a key's room.

/// The largest limit: room is counted in `i64` with "no limit" as `i32::MAX`.
pub const MAX_RUNNING: u32 = 1_000_000;

/// The largest weight of a key.
pub const MAX_WEIGHT: u32 = 1_000;

/// How far a row moves its key's pass at weight 1: large enough that
/// `STRIDE / MAX_WEIGHT` still ranks keys to a thousandth.
pub const STRIDE: i64 = 1_000_000;

/// How far each row a claim gives a key of `weight` moves its pass.
pub fn stride(weight: i64) -> i64 {
    STRIDE / weight.clamp(1, i64::from(MAX_WEIGHT))
}

/// A ready key's share of a claim of `left` rows among keys of total weight
/// `total`: in proportion to its weight, one row at least, its room at most.
pub fn share(left: i64, weight: i64, total: i64, room: i64) -> i64 {
    let weight = weight.max(1);
    let total = total.max(weight);
    let even = left.saturating_mul(weight).saturating_add(total - 1) / total;
    even.max(1).min(room)
}

/// A type's limit, or one key's, and how it is used now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrencyLimit {
    pub namespace: String,
    pub activity_type: String,
    /// Set for one key's own limit and weight.
    pub key: Option<String>,
    /// RUNNING rows per key, at most; for one key, 0 is the type's.
    pub max_running: u32,
    /// One key's weight in the claim's shares (1 for a type's limit).
    pub weight: u32,
    /// Keys of the type with rows waiting or running (for one key: 1 or 0).
    pub keys: u64,
    /// Their RUNNING rows.
    pub running: u64,
    pub strategy: Strategy,
    /// SCHEDULED rows of keys at the limit: held back by it.
    pub held: u64,
}

/// What happens to a key's activities beyond its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// They wait until a running one ends.
    #[default]
    Queue,
    /// The newest are cancelled as they come: at most the limit are ever waiting
    /// or running.
    CancelNewest,
    /// The oldest, waiting or running, are cancelled to make room for the newest.
    CancelInProgress,
}

impl Strategy {
    /// As stored in `concurrency_limits.strategy`.
    pub fn code(self) -> i64 {
        match self {
            Strategy::Queue => 0,
            Strategy::CancelNewest => 1,
            Strategy::CancelInProgress => 2,
        }
    }

    /// [`Strategy::code`] read back; any other code is a corrupt row.
    pub fn from_code(code: i64) -> Result<Self, super::Error> {
        match code {
            0 => Ok(Strategy::Queue),
            1 => Ok(Strategy::CancelNewest),
            2 => Ok(Strategy::CancelInProgress),
            _ => Err(super::Error::Corrupt(format!(
                "unknown concurrency strategy {code}"
            ))),
        }
    }

    /// Why an activity it cancelled was cancelled.
    pub fn reason(self, key: &str, max_running: i64) -> String {
        match self {
            Strategy::Queue => String::new(),
            Strategy::CancelNewest => format!(
                "concurrency limit: {max_running} of key {key:?} were already waiting or running (cancel newest)"
            ),
            Strategy::CancelInProgress => format!(
                "concurrency limit: newer activities of key {key:?} took its place, {max_running} at most (cancel in progress)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statements_stride_is_the_schedulers() {
        assert_eq!(stride!().parse::<i64>().ok(), Some(STRIDE));
    }

    #[test]
    fn shares_follow_weights_within_room() {
        // Two keys of weights 3 and 1 split a claim of 8 as 6 and 2.
        assert_eq!(share(8, 3, 4, 100), 6);
        assert_eq!(share(8, 1, 4, 100), 2);
        // One row at least, however light; never beyond the key's room.
        assert_eq!(share(2, 1, 1000, 100), 1);
        assert_eq!(share(8, 3, 4, 2), 2);
        assert_eq!(stride(1), STRIDE);
        assert_eq!(stride(4), STRIDE / 4);
        assert_eq!(stride(0), STRIDE);
    }
}
