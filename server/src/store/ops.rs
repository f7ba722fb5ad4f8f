//! The writes a batch carries ([`Op`]) and what each came to ([`Outcome`]),
//! with the claim and the transitions an attempt can end by.

use super::*;

/// Claim due rows of a namespace's types for one worker.
#[derive(Debug, Clone)]
pub struct Claim {
    pub namespace: Arc<str>,
    /// Tried in order, each up to what is left of `limit`; the caller rotates the
    /// order between claims so no type starves the others.
    pub activity_types: Vec<Arc<str>>,
    pub worker_id: Arc<str>,
    /// The worker's `Hello.identity` and the node it is connected to, kept with
    /// the attempt for its history.
    pub identity: Arc<str>,
    pub node: Arc<str>,
    pub limit: u32,
    pub lease_expires_at: UnixMillis,
    /// The dispatcher's count of its group's due marks when it planned the claim;
    /// a short claim marks the group exhausted only if no row came due since (see
    /// `Registry::assign`). The store ignores it.
    pub epoch: u64,
}

/// How an attempt ends, decided by the caller (see `lifecycle`).
#[derive(Debug, Clone)]
pub enum Transition {
    /// COMPLETED with this output.
    Complete { output: Payload },
    /// Back to SCHEDULED at `next_at`; the attempt counts against max_attempts.
    Retry {
        next_at: UnixMillis,
        error: ActivityError,
    },
    /// Back to SCHEDULED at `next_at`; the attempt does not count.
    Snooze { next_at: UnixMillis },
    /// FAILED (the dead letter).
    Fail { error: ActivityError },
    /// Back to SCHEDULED now, not counted: the server gave the attempt up (drain).
    Release,
}

/// The claims among `ops`, in order.
pub fn claims(ops: &[Op]) -> impl Iterator<Item = &Claim> {
    ops.iter().filter_map(|op| match op {
        Op::Claim(claim) => Some(claim),
        _ => None,
    })
}

/// One write. Ops of a batch run in order, in one transaction.
#[derive(Debug, Clone)]
pub enum Op {
    /// Insert each activity unless its key exists, all or nothing: if any key exists
    /// with another type, none is inserted. Outcome: `Submitted` (one entry per
    /// activity, in order) or `Conflict`.
    Submit(Vec<NewActivity>),
    /// Outcome: `Claimed`.
    Claim(Claim),
    /// End the attempt, fenced by its row id and attempt number (and, with
    /// `lease_expired_by`, only if its lease expired by then: a reclaim must not
    /// take an attempt whose owner renewed it). Outcome: `Finished`.
    Finish {
        attempt: Arc<Attempt>,
        transition: Transition,
        lease_expired_by: Option<UnixMillis>,
    },
    /// Extend the leases of these attempts, `(row id, attempt)`, where they are
    /// still RUNNING. Outcome: `Renewed` with those renewed: an attempt missing from
    /// it was ended elsewhere (another node cancelled or reclaimed it).
    Renew {
        attempts: Vec<(i64, u32)>,
        lease_expires_at: UnixMillis,
    },
    /// Store the latest heartbeat details of running attempts (fenced like
    /// `Finish`). Outcome: `Recorded`.
    RecordHeartbeats(Vec<HeartbeatDetails>),
    /// Fail up to `limit` SCHEDULED rows whose schedule-to-close deadline passed, as
    /// `TIMEOUT`. Outcome: `Expired` with their keys.
    ExpireScheduled { limit: u32 },
    /// SCHEDULED or RUNNING → CANCELLED. Outcome: `Cancelled`, `NotFound` or `WrongStatus`.
    Cancel { key: Key, reason: String },
    /// FAILED or CANCELLED → SCHEDULED with a fresh attempt budget.
    /// Outcome: `Redriven`, `NotFound` or `WrongStatus`.
    Redrive { key: Key },
    /// Delete up to `limit` rows finished before `before`. Outcome: `Pruned`.
    Prune { before: UnixMillis, limit: u32 },
    /// The next step of a pass that ranks waiting rows again after a change of
    /// the priority aging: the next `ids` ids. Outcome: `Reranked`.
    Rerank { ids: u32 },
    /// Set or remove a limit or a weight of a namespace's type: one statement
    /// (see [`settings`]). Outcome: the change's.
    Setting(SettingChange),
    /// Apply the type's concurrency strategy to keys that may be over their limit
    /// (those a submit added to): cancel each one's newest or oldest activities
    /// beyond its limit. One statement finds the keys over their limit, so a
    /// submit spread over many keys costs one, not one a key. Outcome:
    /// `Enforced`, what it cancelled (nothing for the queue strategy, or within
    /// the limits).
    EnforceConcurrency {
        namespace: String,
        activity_type: String,
        keys: Vec<String>,
    },
}

impl Op {
    /// An attempt's ending, fenced by its attempt number and status (a lease that
    /// ran out is `Op::Finish` with `lease_expired_by`, written by the reclaim).
    pub fn finish(attempt: Arc<Attempt>, transition: Transition) -> Self {
        Op::Finish {
            attempt,
            transition,
            lease_expired_by: None,
        }
    }
}

#[derive(Debug, Clone)]
pub enum Outcome {
    Submitted(Vec<Submitted>),
    /// Activity `index` of the submit names a key that exists with another type.
    Conflict {
        index: usize,
        existing_type: String,
    },
    Claimed {
        rows: Vec<ActivityRow>,
        /// Types whose rate limit held the claim back, and when a claim may take
        /// a row of them again.
        throttled: Vec<(Arc<str>, UnixMillis)>,
    },
    Finished {
        accepted: bool,
    },
    Cancelled {
        /// RUNNING or SCHEDULED: whether a worker must be told to stop.
        prior: ActivityStatus,
        row: ActivityRow,
    },
    Redriven {
        row: ActivityRow,
    },
    NotFound,
    WrongStatus(ActivityStatus),
    Pruned(u64),
    /// `None`: no pass is left to do (or another node is taking its step).
    Reranked(Option<Reranked>),
    Renewed(Vec<(i64, u32)>),
    Recorded(u64),
    Expired(Vec<Key>),
    RateLimitSet,
    Removed(bool),
    ConcurrencyLimitSet,
    FairnessWeightSet,
    /// Each activity cancelled, with its status before.
    Enforced(Vec<(ActivityStatus, ActivityRow)>),
}

/// The latest progress an attempt reported.
#[derive(Debug, Clone)]
pub struct HeartbeatDetails {
    pub id: i64,
    pub attempt: u32,
    pub details: Option<Payload>,
}

#[derive(Debug, Clone)]
pub struct Submitted {
    pub row: ActivityRow,
    /// False when the key existed (with the same type): nothing was written.
    pub created: bool,
}

/// One step of a re-ranking pass ([`Op::Rerank`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reranked {
    /// Waiting rows ranked again.
    pub rows: u64,
    /// Whether the pass has ranked every row it must.
    pub done: bool,
}

impl Claim {
    /// How many more rows the claim may take once it took `taken`: `None` when it
    /// is full. Both dialects try the types in order, each up to this.
    pub fn left_after(&self, taken: usize) -> Option<i64> {
        let left = i64::from(self.limit) - i64::try_from(taken).unwrap_or(i64::MAX);
        (left > 0).then_some(left)
    }
}

/// A change of one setting of a namespace's type, a limit or a weight, set (or
/// replaced) or removed.
#[derive(Debug, Clone)]
pub enum SettingChange {
    /// Set (or replace) the rate limit of a namespace's type; its bucket keeps what
    /// was taken from it. Outcome: `RateLimitSet`.
    RateLimit(rate::RateLimit),
    /// Delete one setting of a namespace's type. Outcome: `Removed`, true when
    /// there was one.
    Remove {
        namespace: String,
        activity_type: String,
        setting: Setting,
    },
    /// Set (or replace) how many rows of each concurrency key of a namespace's
    /// type may run at once. Outcome: `ConcurrencyLimitSet`.
    ConcurrencyLimit {
        namespace: String,
        activity_type: String,
        max_running: u32,
        strategy: concurrency::Strategy,
    },
    /// Set (or replace) one key's own limit (the type's when `None`) and weight.
    /// Outcome: `ConcurrencyLimitSet`.
    KeyLimit {
        namespace: String,
        activity_type: String,
        key: String,
        max_running: Option<u32>,
        weight: u32,
    },
    /// Set (or replace) the weight of one fairness key of a namespace's type: rows
    /// of the key submitted from now on are placed with it, whatever weight they
    /// were given. Outcome: `FairnessWeightSet`.
    FairnessWeight(fairness::FairnessWeight),
}

impl From<SettingChange> for Op {
    fn from(change: SettingChange) -> Self {
        Op::Setting(change)
    }
}

/// A setting of a namespace's type that [`SettingChange::Remove`] deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// The type's rate limit, or with a key that concurrency key's own.
    RateLimit(Option<String>),
    /// The type's concurrency limit, or with a key that key's own.
    ConcurrencyLimit(Option<String>),
    /// One fairness key's weight.
    FairnessWeight(String),
}

impl Setting {
    /// The key the setting is of, if it is one key's.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::RateLimit(key) | Self::ConcurrencyLimit(key) => key.as_deref(),
            Self::FairnessWeight(key) => Some(key),
        }
    }
}
