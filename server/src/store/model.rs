//! What the store keeps and hands out: an activity's key and row, what a submit
//! brings, what the server remembers of an attempt, and the shapes of reads.

use super::*;

/// The identity of an activity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Key {
    pub namespace: String,
    pub workflow_id: String,
    pub activity_id: String,
}

/// A retry policy with every default already resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct RetrySpec {
    pub max_attempts: u32,
    pub initial_interval_ms: i64,
    pub backoff_coefficient: f64,
    pub max_interval_ms: i64,
    pub non_retryable: Vec<String>,
}

/// Per-activity timeouts, in milliseconds; `None` means unbounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub heartbeat_ms: Option<i64>,
    pub start_to_close_ms: Option<i64>,
    pub schedule_to_close_ms: Option<i64>,
}

/// A validated submit, defaults resolved.
#[derive(Debug, Clone)]
pub struct NewActivity {
    pub key: Key,
    pub activity_type: String,
    pub input: Payload,
    /// When it first becomes due (submit time plus delay).
    pub next_at: UnixMillis,
    pub retry: RetrySpec,
    pub timeouts: Timeouts,
    pub priority: i32,
    /// Delivered with every attempt; validated at the edge.
    pub headers: Headers,
    /// Rows sharing it run at most the type's concurrency limit at once.
    pub concurrency_key: Option<String>,
    /// Rows of a type are served fairly over these (see [`fairness`]).
    pub fairness: Option<Fairness>,
}

/// A submitted row's fairness key and its weight within it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fairness {
    pub key: String,
    /// 1 to [`concurrency::MAX_WEIGHT`].
    pub weight: u32,
}

/// An activity's headers, in key order.
pub type Headers = std::collections::BTreeMap<String, String>;

/// An activity as stored.
#[derive(Debug, Clone)]
pub struct ActivityRow {
    pub id: i64,
    pub key: Key,
    pub activity_type: String,
    pub status: ActivityStatus,
    pub attempt: u32,
    pub uncounted: u32,
    pub retry: RetrySpec,
    pub timeouts: Timeouts,
    pub priority: i32,
    pub input: Payload,
    pub output: Option<Payload>,
    pub last_error: Option<ActivityError>,
    pub heartbeat_details: Option<Payload>,
    pub created_at: UnixMillis,
    pub next_at: UnixMillis,
    pub started_at: Option<UnixMillis>,
    pub finished_at: Option<UnixMillis>,
    pub lease_expires_at: Option<UnixMillis>,
    pub worker_id: Option<String>,
    /// When schedule-to-close fails the activity: submit (or re-drive) time plus
    /// `schedule_to_close_ms`.
    pub expires_at: Option<UnixMillis>,
    pub headers: Headers,
    pub concurrency_key: Option<String>,
    pub fairness_key: Option<String>,
}

impl ActivityRow {
    pub fn is_terminal(&self) -> bool {
        is_terminal(self.status)
    }
}

pub fn is_terminal(status: ActivityStatus) -> bool {
    matches!(
        status,
        ActivityStatus::Completed | ActivityStatus::Failed | ActivityStatus::Cancelled
    )
}

/// Whether `Op::Cancel` may end an activity in `status`: one not finished yet.
pub fn cancellable(status: ActivityStatus) -> bool {
    matches!(status, ActivityStatus::Scheduled | ActivityStatus::Running)
}

/// Whether `Op::Redrive` may restart an activity in `status`: one that ended
/// without completing.
pub fn redrivable(status: ActivityStatus) -> bool {
    matches!(status, ActivityStatus::Failed | ActivityStatus::Cancelled)
}

/// What one node tells the others sharing its database, after a commit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Event {
    /// Rows of this type become claimable at `at`.
    Due {
        namespace: String,
        activity_type: String,
        at: UnixMillis,
    },
    /// The activity reached a terminal state: wake its waiters.
    Finished { key: Key },
    /// The activity was cancelled while this worker ran this attempt: tell it.
    Cancelled {
        worker_id: String,
        key: Key,
        attempt: u32,
        reason: String,
    },
}

/// Events from other nodes, as a store delivers them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remote {
    Event(Event),
    /// Events may have been missed (the listening connection was re-established):
    /// treat every type as due.
    Resync,
}

/// Upcoming due times of scheduled rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DueTimes {
    /// `(next_at, namespace, activity_type)`, earliest first, without repeats.
    pub times: Vec<(UnixMillis, String, String)>,
    /// False when the read stopped at its limit: rows due after the last time
    /// listed (or at it) may be missing.
    pub complete: bool,
}

/// A page of `List`.
#[derive(Debug, Clone)]
pub struct ListQuery {
    pub namespace: String,
    pub status: Option<ActivityStatus>,
    pub activity_type: Option<String>,
    /// Rows beyond this id in the order asked (a larger id, or with `newest_first`
    /// a smaller one; 0 starts at the newest): the page token.
    pub after_id: i64,
    /// Newest (largest id) first instead of submission order.
    pub newest_first: bool,
    /// The most rows in the page.
    pub limit: u32,
    /// The most bytes of stored payloads and texts in the page; a single row larger
    /// than this comes alone. Keeps both the answer and the read's memory bounded.
    pub max_bytes: usize,
}

/// What a read of RUNNING rows found.
#[derive(Debug, Clone, Default)]
pub struct RunningPage {
    /// A row that cannot be decoded is reported and left out.
    pub rows: Vec<ActivityRow>,
    /// Where the next page starts, when the read stopped at its limit.
    pub next_after: Option<i64>,
}

/// What a `List` read found.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    /// In the order asked. A row that cannot be decoded is reported and left out.
    pub rows: Vec<ActivityRow>,
    /// Where the next page starts (`after_id`), when more rows match.
    pub next_after: Option<i64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatusCounts {
    pub scheduled: u64,
    pub running: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
}

/// One ended attempt, as the store's `attempt_ended` trigger recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    pub attempt: u32,
    pub worker_id: Option<String>,
    pub identity: Option<String>,
    pub node: Option<String>,
    pub started_at: Option<UnixMillis>,
    pub ended_at: Option<UnixMillis>,
    /// `change::AttemptOutcome::name`.
    pub outcome: String,
    pub error: Option<ActivityError>,
}

/// How many attempt records an activity keeps: the newest, older ones are dropped.
pub const HISTORY_LIMIT: u32 = 25;

/// What is waiting, running and dead-lettered, per namespace and type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeCounts {
    pub namespace: String,
    pub activity_type: String,
    /// SCHEDULED and due now.
    pub due: u64,
    /// SCHEDULED for later (a delay or a retry's backoff).
    pub delayed: u64,
    pub running: u64,
    /// FAILED: the dead letters still kept.
    pub failed: u64,
}

/// A worker session's resume ticket, as a store shared by several nodes keeps it.
#[derive(Debug, Clone)]
pub struct SessionTicket {
    pub worker_id: String,
    pub secret: String,
    /// The token (by its name) that opened the session.
    pub caller: String,
    /// The session's namespace, types and slots, as one string.
    pub registration: String,
    pub at: UnixMillis,
}

/// A resume on a node that does not hold the session: `ticket` replaces
/// `old_secret` if it matches, and the session's RUNNING rows become `node`'s.
#[derive(Debug, Clone)]
pub struct TakeSession {
    pub ticket: SessionTicket,
    pub old_secret: String,
    pub node: String,
}

impl ListQuery {
    /// Where the page starts, as the dialects bind it: rows after `after_id` oldest
    /// first; newest first, rows below it (below every row when it is 0).
    pub fn cursor(&self) -> i64 {
        if self.newest_first && self.after_id <= 0 {
            i64::MAX
        } else {
            self.after_id
        }
    }
}

/// What the server remembers of an attempt it handed to a worker: enough to decide
/// the attempt's fate without reading the row again.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub id: i64,
    pub key: Key,
    pub activity_type: String,
    pub attempt: u32,
    pub uncounted: u32,
    pub retry: RetrySpec,
    pub timeouts: Timeouts,
    pub created_at: UnixMillis,
    pub started_at: UnixMillis,
    /// The schedule-to-close deadline, if any (see `ActivityRow::expires_at`).
    pub expires_at: Option<UnixMillis>,
    /// Set on a lost session's endings: only while the row is still this node's
    /// (`worker_node`), so an attempt another node took over is not ended here.
    pub owner_node: Option<Arc<str>>,
    /// The row's concurrency key (it never changes): its ending makes room for
    /// another row of the key, and is counted out of the key's running rows.
    pub concurrency_key: Option<Arc<str>>,
}

impl Attempt {
    pub fn from_row(row: &ActivityRow) -> Self {
        Self {
            id: row.id,
            key: row.key.clone(),
            activity_type: row.activity_type.clone(),
            attempt: row.attempt,
            uncounted: row.uncounted,
            retry: row.retry.clone(),
            timeouts: row.timeouts,
            created_at: row.created_at,
            started_at: row.started_at.unwrap_or(row.created_at),
            expires_at: row.expires_at,
            owner_node: None,
            concurrency_key: row.concurrency_key.as_deref().map(Arc::from),
        }
    }

    /// When the whole activity must be finished, if the submitter bounded it.
    pub fn schedule_to_close_deadline(&self) -> Option<UnixMillis> {
        self.expires_at
    }

    /// When this attempt must be finished: the earlier of start-to-close and
    /// schedule-to-close.
    pub fn deadline(&self) -> Option<UnixMillis> {
        let start_to_close = self
            .timeouts
            .start_to_close_ms
            .map(|ms| self.started_at.saturating_add(ms));
        match (start_to_close, self.schedule_to_close_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// An error the server itself records for an attempt (lost worker, timeout).
pub fn server_error(kind: ErrorKind, error_type: &str, message: String) -> ActivityError {
    ActivityError {
        kind: kind as i32,
        r#type: error_type.to_owned(),
        message,
        details: None,
        next_retry_delay: None,
    }
}
