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
}
