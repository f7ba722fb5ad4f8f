//! Durable state: one row per activity, behind the [`Store`] trait.
//!
//! The store is the authority for an activity's status, attempt and outcome. Every
//! write goes through [`Store::apply`], which runs a batch of [`Op`]s in one
//! transaction and returns one [`Outcome`] per op, in order; the caller (the group
//! committer) owns batching. Reads ([`Store::get`], [`Store::list`], [`Store::stats`])
//! see only committed state.
//!
//! Invariants every implementation keeps:
//! - a result counts only for the RUNNING row with the same attempt ([`Op::Finish`]
//!   is fenced by `status = RUNNING AND attempt = ?`);
//! - `attempt` only ever grows, so a fence can never match an older attempt;
//! - `(namespace, workflow_id, activity_id)` is unique; a second submit of a key
//!   never changes the stored row.

/// The columns every row decoder reads, in this order, so every query returns the
/// same shape.
macro_rules! columns {
    () => {
        "id, namespace, workflow_id, activity_id, activity_type, status, attempt, uncounted, \
         max_attempts, initial_interval_ms, backoff_coefficient, max_interval_ms, non_retryable, \
         heartbeat_timeout_ms, start_to_close_ms, schedule_to_close_ms, priority, input_type, \
         input, output_type, output, error_kind, error_type, error_message, error_details_type, \
         error_details, heartbeat_type, heartbeat_details, created_at, next_at, started_at, \
         finished_at, lease_expires_at, worker_id, expires_at, headers, concurrency_key, \
         fairness_key"
    };
}

/// [`columns!`] without the payloads (input, output and both sets of details come
/// back empty), for reads that need an activity's identity and policy but must not
/// hold megabytes per row in memory: start-up reclaim, lease reclaim, and the
/// existing keys of a batch submit. Arguments: the dialect's empty BLOB, its typed
/// NULL TEXT and its typed NULL BLOB.
macro_rules! light_columns {
    ($empty_blob:literal, $null_text:literal, $null_blob:literal) => {
        concat!(
            "id, namespace, workflow_id, activity_id, activity_type, status, attempt, uncounted, \
             max_attempts, initial_interval_ms, backoff_coefficient, max_interval_ms, non_retryable, \
             heartbeat_timeout_ms, start_to_close_ms, schedule_to_close_ms, priority, \
             '' AS input_type, ",
            $empty_blob,
            " AS input, ",
            $null_text,
            " AS output_type, ",
            $null_blob,
            " AS output, error_kind, error_type, error_message, ",
            $null_text,
            " AS error_details_type, ",
            $null_blob,
            " AS error_details, ",
            $null_text,
            " AS heartbeat_type, ",
            $null_blob,
            " AS heartbeat_details, created_at, next_at, started_at, finished_at, \
             lease_expires_at, worker_id, expires_at, headers, concurrency_key, fairness_key"
        )
    };
}

/// The one setting the claim order depends on (see the priority aging migration):
/// how many milliseconds of waiting one level of priority is worth, 0 for strict
/// priority. An uncorrelated subquery, run once a statement by either dialect.
macro_rules! aging {
    () => {
        "(SELECT priority_aging_ms FROM dispatch_settings)"
    };
}

/// How many waiting rows of a type a listing of fairness weights counts
/// ([`fairness::WAITING_COUNTED`]), written into the SQL so that PostgreSQL plans
/// the listing's range scan knowing its limit.
macro_rules! waiting_counted {
    () => {
        "100000"
    };
}

/// Where a row of priority `$priority` and concurrency key `$key` goes in the
/// claim order (`claim_band`): keyed rows after every unkeyed one, 2^40 on (see
/// the concurrency keys migration), so the claim of unkeyed rows stops before them:
/// it takes `claim_band < 2^39`, below every keyed band (2^40 less a priority,
/// which is an `i32`) and above every unkeyed one.
macro_rules! band {
    ($priority:literal, $key:literal) => {
        concat!(
            "CASE WHEN ",
            $key,
            " IS NULL THEN 0 ELSE 1099511627776 END + CASE WHEN ",
            aging!(),
            " > 0 THEN 0 ELSE -",
            $priority,
            " END"
        )
    };
}

/// Where a row of priority `$priority` due at `$at` goes within its band
/// (`claim_rank`); NULL when `$at` is.
macro_rules! rank {
    ($at:literal, $priority:literal) => {
        concat!($at, " - ", $priority, " * ", aging!())
    };
}

/// The virtual time (ms) of the row of namespace `$ns`, type `$ty` and band `$band`
/// the claim would take first at `$now` (see `store::fairness`), read along
/// `activities_due`: rows not due yet (delayed, or retrying) are not the head;
/// NULL when the band has no row due.
macro_rules! fair_head {
    ($ns:literal, $ty:literal, $band:literal, $now:literal) => {
        concat!(
            "(SELECT h.claim_rank + h.priority * ",
            aging!(),
            " FROM activities AS h WHERE h.namespace = ",
            $ns,
            " AND h.activity_type = ",
            $ty,
            " AND h.status = 1 AND h.claim_band = ",
            $band,
            " AND h.next_at <= ",
            $now,
            " ORDER BY h.claim_rank LIMIT 1)"
        )
    };
}

/// How far a row of fairness key `$key` of namespace `$ns` and type `$ty` moves
/// its chain (µs): by the weight set for the key (`fairness_weights`), else by
/// `$given`, the stride of the row's own weight (see `store::fairness`).
macro_rules! fair_stride {
    ($ns:literal, $ty:literal, $key:literal, $given:literal) => {
        concat!(
            "COALESCE((SELECT ",
            fair_stride_us!(),
            " / w.weight FROM fairness_weights AS w WHERE w.namespace = ",
            $ns,
            " AND w.activity_type = ",
            $ty,
            " AND w.fairness_key = ",
            $key,
            "), ",
            $given,
            ")"
        )
    };
}

/// How far a row of weight 1 moves its fairness key's chain (`fairness::STRIDE_US`).
macro_rules! fair_stride_us {
    () => {
        "1000"
    };
}

/// How far a row moves its key's pass at weight 1 (`concurrency::STRIDE`).
macro_rules! stride {
    () => {
        "1000000"
    };
}

/// The rate limits of namespace `$ns` (of all, when NULL): each type's, then each
/// key's with its bucket from the key's row, as `rows::rate_limit_use` reads them.
macro_rules! rate_limits {
    ($ns:literal) => {
        concat!(
            "SELECT * FROM (SELECT namespace, activity_type, per_period, period_ms, burst, \
               interval_ns, tat_ns, NULL AS concurrency_key FROM rate_limits WHERE ",
            $ns,
            " IS NULL OR namespace = ",
            $ns,
            " UNION ALL \
             SELECT r.namespace, r.activity_type, r.per_period, r.period_ms, r.burst, \
               r.interval_ns, COALESCE((SELECT k.tat_ns FROM concurrency_keys AS k \
                 WHERE k.namespace = r.namespace AND k.activity_type = r.activity_type \
                   AND k.concurrency_key = r.concurrency_key), 0), r.concurrency_key \
             FROM key_rate_limits AS r WHERE ",
            $ns,
            " IS NULL OR r.namespace = ",
            $ns,
            ") AS l ORDER BY 1, 2, 8 NULLS FIRST"
        )
    };
}

/// Sets one key's rate limit, with the dialect's placeholder prefix `$p`: `1`
/// namespace, `2` type, `3` rows per `4` milliseconds, `5` at once, one per `6`
/// nanoseconds, `7` the key. Its bucket, on the key's row, is kept.
macro_rules! set_key_rate_limit {
    ($p:literal) => {
        concat!(
            "INSERT INTO key_rate_limits (namespace, activity_type, per_period, period_ms, \
               burst, interval_ns, concurrency_key) VALUES (",
            $p,
            "1, ",
            $p,
            "2, ",
            $p,
            "3, ",
            $p,
            "4, ",
            $p,
            "5, ",
            $p,
            "6, ",
            $p,
            "7) ON CONFLICT (namespace, activity_type, concurrency_key) DO UPDATE SET \
               per_period = excluded.per_period, period_ms = excluded.period_ms, \
               burst = excluded.burst, interval_ns = excluded.interval_ns"
        )
    };
}

/// How many rows key row `k` may take at `$now` (milliseconds) from its own
/// bucket `r` (a large number when it has none; 0 or less when it is empty).
macro_rules! key_tokens {
    ($now:literal) => {
        concat!(
            "CASE WHEN r.interval_ns IS NULL THEN 2147483647 ELSE (",
            $now,
            " * 1000000 + r.burst * r.interval_ns - CASE WHEN k.tat_ns > ",
            $now,
            " * 1000000 THEN k.tat_ns ELSE ",
            $now,
            " * 1000000 END) / r.interval_ns END"
        )
    };
}

/// A key row `k`'s own rate limit `r`, joined.
macro_rules! key_rate {
    () => {
        "LEFT JOIN key_rate_limits AS r ON r.namespace = k.namespace \
         AND r.activity_type = k.activity_type AND r.concurrency_key = k.concurrency_key"
    };
}

/// The first time (nanoseconds) after `$now` (milliseconds) one of the keys of
/// type `$type` of namespace `$ns` with rows waiting gets a token back from its
/// own bucket (but those `$skip` leaves out); NULL when none will.
macro_rules! key_refill {
    ($ns:literal, $type:literal, $now:literal, $skip:literal) => {
        concat!(
            "(SELECT MIN(k.tat_ns - (r.burst - 1) * r.interval_ns) \
             FROM key_rate_limits AS r JOIN concurrency_keys AS k \
               ON k.namespace = r.namespace AND k.activity_type = r.activity_type \
               AND k.concurrency_key = r.concurrency_key \
             WHERE r.namespace = ",
            $ns,
            " AND r.activity_type = ",
            $type,
            " AND k.waiting > 0 AND k.tat_ns - (r.burst - 1) * r.interval_ns > ",
            $now,
            " * 1000000",
            $skip,
            ")"
        )
    };
}

/// A key row `k`'s own limits `x`, joined (see the key shares migration).
macro_rules! key_limits {
    () => {
        "LEFT JOIN concurrency_key_limits AS x ON x.namespace = k.namespace \
         AND x.activity_type = k.activity_type AND x.concurrency_key = k.concurrency_key"
    };
}

/// The concurrency limits of namespace `$ns` (of all, when NULL): each type's,
/// then each key's, as `rows::concurrency_limit` reads them. `$int` casts a sum
/// back to the dialect's integer.
macro_rules! concurrency_limits {
    ($ns:literal, $int:literal) => {
        concat!(
            "SELECT l.namespace, l.activity_type, NULL AS concurrency_key, l.max_running, \
               1 AS weight, \
               (SELECT COUNT(*) FROM concurrency_keys AS k \
                 WHERE k.namespace = l.namespace AND k.activity_type = l.activity_type \
                   AND (k.waiting > 0 OR k.running > 0)), \
               (SELECT COALESCE(SUM(k.running), 0)",
            $int,
            " FROM concurrency_keys AS k \
                 WHERE k.namespace = l.namespace AND k.activity_type = l.activity_type), \
               l.strategy, \
               (SELECT COALESCE(SUM(k.waiting), 0)",
            $int,
            " FROM concurrency_keys AS k ",
            key_limits!(),
            " WHERE k.namespace = l.namespace AND k.activity_type = l.activity_type \
                   AND k.running >= COALESCE(x.max_running, l.max_running)) \
             FROM concurrency_limits AS l WHERE ",
            $ns,
            " IS NULL OR l.namespace = ",
            $ns,
            " UNION ALL \
             SELECT x.namespace, x.activity_type, x.concurrency_key, \
               COALESCE(x.max_running, 0), x.weight, \
               (SELECT COUNT(*) FROM concurrency_keys AS k WHERE k.namespace = x.namespace \
                 AND k.activity_type = x.activity_type AND k.concurrency_key = x.concurrency_key \
                 AND (k.waiting > 0 OR k.running > 0)), \
               COALESCE((SELECT k.running FROM concurrency_keys AS k \
                 WHERE k.namespace = x.namespace AND k.activity_type = x.activity_type \
                   AND k.concurrency_key = x.concurrency_key), 0), \
               COALESCE((SELECT l.strategy FROM concurrency_limits AS l \
                 WHERE l.namespace = x.namespace AND l.activity_type = x.activity_type), 0), \
               COALESCE((SELECT k.waiting FROM concurrency_keys AS k \
                 WHERE k.namespace = x.namespace AND k.activity_type = x.activity_type \
                   AND k.concurrency_key = x.concurrency_key \
                   AND k.running >= COALESCE(x.max_running, (SELECT l.max_running \
                     FROM concurrency_limits AS l WHERE l.namespace = x.namespace \
                       AND l.activity_type = x.activity_type), 9223372036854775807)), 0) \
             FROM concurrency_key_limits AS x WHERE ",
            $ns,
            " IS NULL OR x.namespace = ",
            $ns
        )
    };
}

/// The keys of type `$2` of namespace `$1` among those `$keys` selects (a
/// condition on `k.concurrency_key`) with more rows waiting and running than their
/// limit (the key's own, else the type's) and a strategy that cancels: each with
/// that limit and the type's strategy.
macro_rules! over_limit {
    ($ns:literal, $type:literal, $keys:literal) => {
        concat!(
            "SELECT k.concurrency_key, COALESCE(x.max_running, l.max_running), l.strategy \
             FROM concurrency_limits AS l \
             JOIN concurrency_keys AS k ON k.namespace = l.namespace \
               AND k.activity_type = l.activity_type ",
            key_limits!(),
            " WHERE l.namespace = ",
            $ns,
            " AND l.activity_type = ",
            $type,
            " AND k.concurrency_key ",
            $keys,
            " AND l.strategy > 0 AND k.waiting + k.running > COALESCE(x.max_running, l.max_running) \
             ORDER BY k.concurrency_key"
        )
    };
}

mod change;
pub mod concurrency;
pub mod fairness;
pub mod postgres;
pub mod rate;
mod rows;
pub mod sqlite;

use std::{sync::Arc, time::Duration};

use spool_proto::time::UnixMillis;
pub use spool_proto::v1::{ActivityError, ActivityStatus, ErrorKind, Payload};

pub use change::AttemptOutcome;
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// A storage failure. [`Error::class`] says whether it may pass ([`Class::Transient`])
/// or would fail the same way again; the API maps each class to its own status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database refused or failed a statement; the transaction was rolled back.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The embedded schema migrations could not be applied; the server cannot start.
    #[error("schema migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row holds a value this version cannot read.
    #[error("stored row is unreadable: {0}")]
    Corrupt(String),
    /// Another process holds the database; only one `spool serve` may use a SQLite file.
    #[error("database {0} is in use by another spool process")]
    Locked(String),
    /// The database URL names nothing this build can open.
    #[error("unsupported database URL {0:?}: expected sqlite://PATH or postgres://…")]
    UnsupportedUrl(String),
    /// SQLite failed a statement on the writing connection (`code` is its extended
    /// result code); the transaction was rolled back.
    #[error("database error: sqlite error {code}: {message}")]
    Sqlite { code: i32, message: String },
    /// Opening or locking the database file failed.
    #[error("cannot open database {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
}

/// What kind of failure a storage error is, for the caller deciding whether to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// It may pass: busy, locked, out of space, a connection lost, a timeout.
    /// Retrying the same request later can succeed.
    Transient,
    /// The data did not fit the database (a value out of range): the same request
    /// fails the same way.
    InvalidInput,
    /// A constraint refused the write.
    Conflict,
    /// A fault of this server or its database: report it.
    Internal,
}

impl Error {
    pub fn class(&self) -> Class {
        match self {
            Error::Database(e) => sqlx_class(e),
            Error::Sqlite { code, .. } => sqlite_class(*code),
            Error::Migrate(_)
            | Error::Corrupt(_)
            | Error::Locked(_)
            | Error::UnsupportedUrl(_)
            | Error::Open { .. } => Class::Internal,
        }
    }
}

fn sqlx_class(e: &sqlx::Error) -> Class {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Class::Transient,
        sqlx::Error::Database(db) => {
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                postgres_class(pg.code())
            } else {
                db.code()
                    .and_then(|c| c.parse::<i32>().ok())
                    .map_or(Class::Internal, sqlite_class)
            }
        }
        _ => Class::Internal,
    }
}

/// By SQLSTATE class.
fn postgres_class(sqlstate: &str) -> Class {
    match sqlstate.get(..2).unwrap_or_default() {
        // Connection exception, transaction rollback (serialization, deadlock),
        // insufficient resources, operator intervention (a statement timeout, an
        // administrator's shutdown), system error.
        "08" | "40" | "53" | "57" | "58" => Class::Transient,
        // Object not in prerequisite state: 55P03 is a lock timeout.
        "55" if sqlstate == "55P03" => Class::Transient,
        "22" => Class::InvalidInput,
        "23" => Class::Conflict,
        _ => Class::Internal,
    }
}

/// By primary result code (the low byte of an extended one).
fn sqlite_class(code: i32) -> Class {
    const BUSY: i32 = 5;
    const LOCKED: i32 = 6;
    const NOMEM: i32 = 7;
    const IOERR: i32 = 10;
    const FULL: i32 = 13;
    const CANTOPEN: i32 = 14;
    const PROTOCOL: i32 = 15;
    const TOOBIG: i32 = 18;
    const CONSTRAINT: i32 = 19;
    const MISMATCH: i32 = 20;
    const RANGE: i32 = 25;
    match code & 0xff {
        BUSY | LOCKED | NOMEM | IOERR | FULL | CANTOPEN | PROTOCOL => Class::Transient,
        TOOBIG | MISMATCH | RANGE => Class::InvalidInput,
        CONSTRAINT => Class::Conflict,
        _ => Class::Internal,
    }
}

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
    /// Set (or replace) the rate limit of a namespace's type; its bucket keeps what
    /// was taken from it. Outcome: `RateLimitSet`.
    SetRateLimit(rate::RateLimit),
    /// Outcome: `RateLimitRemoved`, true when there was one.
    RemoveRateLimit {
        namespace: String,
        activity_type: String,
        /// Only this concurrency key's limit.
        key: Option<String>,
    },
    /// Set (or replace) how many rows of each concurrency key of a namespace's
    /// type may run at once. Outcome: `ConcurrencyLimitSet`.
    SetConcurrencyLimit {
        namespace: String,
        activity_type: String,
        max_running: u32,
        strategy: concurrency::Strategy,
    },
    /// Set (or replace) one key's own limit (the type's when `None`) and weight.
    /// Outcome: `ConcurrencyLimitSet`.
    SetKeyLimit {
        namespace: String,
        activity_type: String,
        key: String,
        max_running: Option<u32>,
        weight: u32,
    },
    /// The type's limit, or with `key` that key's own. Outcome:
    /// `ConcurrencyLimitRemoved`, true when there was one.
    RemoveConcurrencyLimit {
        namespace: String,
        activity_type: String,
        key: Option<String>,
    },
    /// Set (or replace) the weight of one fairness key of a namespace's type: rows
    /// of the key submitted from now on are placed with it, whatever weight they
    /// were given. Outcome: `FairnessWeightSet`.
    SetFairnessWeight(fairness::FairnessWeight),
    /// Outcome: `FairnessWeightRemoved`, true when there was one.
    RemoveFairnessWeight {
        namespace: String,
        activity_type: String,
        key: String,
    },
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
    RateLimitRemoved(bool),
    ConcurrencyLimitSet,
    ConcurrencyLimitRemoved(bool),
    FairnessWeightSet,
    FairnessWeightRemoved(bool),
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

/// One step of a re-ranking pass ([`Op::Rerank`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reranked {
    /// Waiting rows ranked again.
    pub rows: u64,
    /// Whether the pass has ranked every row it must.
    pub done: bool,
}

/// A wall-clock time taken at an instant of this process, read forward by the
/// monotonic clock: a step of the wall clock after it does not move it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Anchored {
    at: UnixMillis,
    instant: std::time::Instant,
}

impl Anchored {
    pub(crate) fn new(at: UnixMillis, instant: std::time::Instant) -> Self {
        Self { at, instant }
    }

    pub(crate) fn now(&self) -> UnixMillis {
        self.at
            .saturating_add(i64::try_from(self.instant.elapsed().as_millis()).unwrap_or(i64::MAX))
    }
}

#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Runs `ops` in order in one transaction, committed durably before it returns.
    /// An `Err` means nothing of the batch was written. (Shared, not borrowed: a
    /// backend may hand the batch to a thread of its own.)
    async fn apply(&self, ops: Arc<[Op]>, now: UnixMillis) -> Result<Vec<Outcome>, Error>;

    async fn get(&self, key: &Key) -> Result<Option<ActivityRow>, Error>;

    /// One page of rows in id order (submission order), or newest first.
    async fn list(&self, query: &ListQuery) -> Result<ListPage, Error>;

    async fn stats(&self, namespace: &str) -> Result<StatusCounts, Error>;

    /// The ended attempts of row `id`, oldest first (at most [`HISTORY_LIMIT`]).
    async fn history(&self, id: i64) -> Result<Vec<AttemptRecord>, Error>;

    /// Scheduled (due and delayed), running and failed counts of every namespace
    /// and type that has any, as of `now`; sorted by namespace, then type.
    async fn type_counts(&self, now: UnixMillis) -> Result<Vec<TypeCounts>, Error>;

    /// Up to `limit` RUNNING rows with an id above `after_id`, in id order, without
    /// their payloads (`light_columns!`): for reclaiming attempts whose process is
    /// gone.
    async fn running(&self, after_id: i64, limit: u32) -> Result<RunningPage, Error>;

    /// Up to `limit` RUNNING rows whose lease expired before `now`, without their
    /// payloads.
    async fn expired_leases(&self, now: UnixMillis, limit: u32) -> Result<Vec<ActivityRow>, Error>;

    /// The next times after `after` at which SCHEDULED rows come due, read from at
    /// most `limit` rows: what arms the dispatch timer. Only rows that were not yet
    /// due when written count: one due on its commit had its type marked due then
    /// (by another node's clock, a few milliseconds ahead of ours at most).
    async fn due_times(&self, after: UnixMillis, limit: u32) -> Result<DueTimes, Error>;

    /// The rate limits of `namespace` (all namespaces when `None`), sorted by
    /// namespace and type, with what a claim could take of each at `now`.
    async fn rate_limits(
        &self,
        namespace: Option<&str>,
        now: UnixMillis,
    ) -> Result<Vec<rate::RateLimitUse>, Error>;

    /// The concurrency limits of `namespace` (all namespaces when `None`), sorted
    /// by namespace and type, with their keys' use now.
    async fn concurrency_limits(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<concurrency::ConcurrencyLimit>, Error>;

    /// The fairness weights set for keys of `namespace` (all namespaces when
    /// `None`), sorted by namespace, type and key, each with its key's waiting
    /// rows (see [`fairness::WAITING_COUNTED`]).
    async fn fairness_weights(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<fairness::FairnessWeightUse>, Error>;

    /// The waiting and running rows of one concurrency key of a namespace's type;
    /// `None` when it has neither.
    async fn concurrency_key(
        &self,
        namespace: &str,
        activity_type: &str,
        key: &str,
    ) -> Result<Option<(u64, u64)>, Error>;

    /// Sets how much waiting outweighs one level of priority in the claim order
    /// (`None`: priority is strict), for every node sharing the database. True
    /// when that changed the setting: rows written from now on are ranked by it,
    /// and a pass of [`Op::Rerank`] steps ranks the rows stored before again,
    /// in the background, however many they are.
    async fn set_priority_aging(&self, per_level: Option<Duration>) -> Result<bool, Error>;

    /// The time every write is stamped with and judged by: what `apply`'s `now`,
    /// leases and due times mean. SQLite's is the wall clock read when it opened
    /// (never behind the newest time stored), PostgreSQL's the database's, each
    /// read forward by the monotonic clock (`Anchored`): a step of this
    /// machine's wall clock neither holds a due row back nor expires one, and
    /// clock skew between nodes cannot reclaim a live attempt.
    fn now(&self) -> UnixMillis {
        spool_proto::time::now_millis()
    }

    /// True when one process owns the database (SQLite, with its file lock): at
    /// start, every RUNNING row is a dead process's, to reclaim at once. Otherwise
    /// only rows whose lease expired are (by the liveness sweep).
    fn single_node(&self) -> bool;

    /// Whether another node on this database that takes sessions over (not
    /// draining or stopping) was heard from lately: only then may a node that
    /// stops leave its sessions' attempts running for a worker to resume
    /// elsewhere. A store with no word of other nodes says no.
    fn others_staying(&self) -> bool {
        false
    }

    /// Tells the other nodes whether this one drains (and so takes no session
    /// over), and waits until it is said.
    async fn set_draining(&self, draining: bool) {
        let _ = draining;
    }

    /// How many batches [`Store::apply`] may be given at once; the committer then
    /// forms and sends the next batch while one is being written. PostgreSQL runs
    /// each on a connection of its own, on a backend of its own, and batches that
    /// touch the same rows wait for each other's locks as two nodes' batches do.
    /// SQLite's writer runs them one after the other, in whichever order they
    /// reach it (each is sent from a task of its own), as PostgreSQL may commit
    /// two in either order.
    fn writers(&self) -> usize {
        1
    }

    /// With more than one writer, the fewest rows a batch, or the one in flight,
    /// writes for requests for the two to be written side by side; smaller ones
    /// wait for the one in flight to land and go as one batch. PostgreSQL writes
    /// them at once, so any size gains; a store that runs them in turn gains only
    /// where landing the one in flight is work worth overlapping.
    fn beside_min_rows(&self) -> usize {
        0
    }

    /// Tells the other nodes sharing the database about committed changes. A
    /// single-node store has no one to tell.
    async fn publish(&self, events: Vec<Event>) -> Result<(), Error> {
        let _ = events;
        Ok(())
    }

    /// Keeps a session's resume ticket where other nodes can check it; a
    /// single-node store keeps none (its one node holds every session).
    async fn save_ticket(&self, ticket: &SessionTicket) -> Result<(), Error> {
        let _ = ticket;
        Ok(())
    }

    /// Takes over a session another node held, if its ticket matches: the ticket is
    /// replaced (used once across all nodes) and the session's RUNNING rows (without
    /// payloads) become this node's, in one transaction. `None`: no such session or
    /// ticket (always, for a single-node store).
    async fn take_session(&self, take: &TakeSession) -> Result<Option<Vec<ActivityRow>>, Error> {
        let _ = take;
        Ok(None)
    }

    /// Events other nodes publish, for as long as the receiver is kept; `None` for
    /// a single-node store.
    async fn subscribe(&self) -> Result<Option<tokio::sync::mpsc::Receiver<Remote>>, Error> {
        Ok(None)
    }
}

/// The most waiting one level of priority may be worth: any `i32` priority times
/// this, plus a due time, stays far inside the `i64` a rank is stored in.
pub const MAX_PRIORITY_AGING: Duration = Duration::from_secs(86_400);

/// [`Store::set_priority_aging`]'s setting as stored: whole milliseconds, 0 for
/// strict priority, at most [`MAX_PRIORITY_AGING`].
fn priority_aging_ms(per_level: Option<Duration>) -> i64 {
    per_level.map_or(0, |d| {
        i64::try_from(d.min(MAX_PRIORITY_AGING).as_millis()).unwrap_or(0)
    })
}

/// One embedded migration (`sql` from `migrations/<dialect>/`), numbered the same
/// in both dialects.
fn migration(version: i64, name: &str, sql: &'static str) -> sqlx::migrate::Migration {
    sqlx::migrate::Migration::new(
        version,
        name.to_owned().into(),
        sqlx::migrate::MigrationType::Simple,
        sqlx::SqlSafeStr::into_sql_str(sql),
        false,
    )
}

/// Opens the store a database URL names, running migrations.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, Error> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(Arc::new(PostgresStore::open(url).await?))
    } else {
        Err(Error::UnsupportedUrl(url.to_owned()))
    }
}

/// A RUNNING row of activity `activity_id` (workflow `wf`, attempt 1) claimed for
/// `worker_id`, for unit tests of what handles claimed rows.
#[cfg(test)]
pub(crate) fn running_row_for_tests(id: i64, activity_id: &str, worker_id: &str) -> ActivityRow {
    ActivityRow {
        id,
        key: Key {
            namespace: "default".into(),
            workflow_id: "wf".into(),
            activity_id: activity_id.into(),
        },
        activity_type: "t".into(),
        status: ActivityStatus::Running,
        attempt: 1,
        uncounted: 0,
        retry: one_attempt_for_tests(),
        timeouts: Default::default(),
        priority: 0,
        input: Payload::default(),
        output: None,
        last_error: None,
        heartbeat_details: None,
        created_at: 0,
        next_at: 0,
        started_at: Some(0),
        finished_at: None,
        lease_expires_at: None,
        worker_id: Some(worker_id.to_owned()),
        expires_at: None,
        headers: Headers::new(),
        concurrency_key: None,
        fairness_key: None,
    }
}

/// A retry policy of one attempt, for unit tests.
#[cfg(test)]
pub(crate) fn one_attempt_for_tests() -> RetrySpec {
    RetrySpec {
        max_attempts: 1,
        initial_interval_ms: 1,
        backoff_coefficient: 1.0,
        max_interval_ms: 1,
        non_retryable: Vec::new(),
    }
}

/// A new activity `wf/activity_id` of type `activity_type`, due at once, for unit
/// tests of what stores it.
#[cfg(test)]
pub(crate) fn new_activity_for_tests(activity_id: &str, activity_type: &str) -> NewActivity {
    NewActivity {
        key: Key {
            namespace: "default".into(),
            workflow_id: "wf".into(),
            activity_id: activity_id.into(),
        },
        activity_type: activity_type.into(),
        input: Payload::default(),
        next_at: 0,
        retry: one_attempt_for_tests(),
        timeouts: Timeouts::default(),
        priority: 0,
        headers: Headers::new(),
        concurrency_key: None,
        fairness: None,
    }
}

impl Claim {
    /// How many more rows the claim may take once it took `taken`: `None` when it
    /// is full. Both dialects try the types in order, each up to this.
    pub fn left_after(&self, taken: usize) -> Option<i64> {
        let left = i64::from(self.limit) - i64::try_from(taken).unwrap_or(i64::MAX);
        (left > 0).then_some(left)
    }
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

#[cfg(test)]
mod conformance;

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

#[cfg(test)]
mod tests;
