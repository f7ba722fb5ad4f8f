//! Concurrency keys as the stores keep them: of the rows of a namespace's type
//! sharing a `concurrency_key`, at most the type's `max_running` are RUNNING at
//! once, on every node. Each key's waiting and running rows are counted in
//! `concurrency_keys` by triggers on every status change, in the same transaction
//! as the change; the claim serves the keys with room, least recently served
//! first, and locks those it serves, so two nodes never both fill a key's room.

/// The largest limit: room is counted in `i64` with "no limit" as `i32::MAX`.
pub const MAX_RUNNING: u32 = 1_000_000;

/// A type's limit and how it is used now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrencyLimit {
    pub namespace: String,
    pub activity_type: String,
    /// RUNNING rows per key, at most.
    pub max_running: u32,
    /// Keys of the type with rows waiting or running.
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

    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(Strategy::Queue),
            1 => Some(Strategy::CancelNewest),
            2 => Some(Strategy::CancelInProgress),
            _ => None,
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
