//! Durable state: one row per activity, behind the [`Store`] trait.
//!
//! The store is the authority for an activity's status, attempt and outcome. Every
//! write goes through [`Store::apply`], which runs a batch of [`Op`]s in one
//! transaction and returns one [`Outcome`] per op, in order; the caller (the group
//! committer) owns batching. Reads ([`Reads::get`], [`Reads::list`], [`Reads::stats`])
//! see only committed state.
//!
//! Invariants every implementation keeps:
//! - a result counts only for the RUNNING row with the same attempt ([`Op::Finish`]
//!   is fenced by `status = RUNNING AND attempt = ?`);
//! - `attempt` only ever grows, so a fence can never match an older attempt;
//! - `(namespace, workflow_id, activity_id)` is unique; a second submit of a key
//!   never changes the stored row.

#[macro_use]
mod sql_macros;
#[macro_use]
mod reads;
mod error;
mod model;
mod ops;

mod change;
pub mod concurrency;
pub mod fairness;
#[cfg(any(test, feature = "testing"))]
pub mod layer;
pub mod postgres;
pub mod rate;
mod rows;
pub mod settings;
pub mod sqlite;

use std::{sync::Arc, time::Duration};

use spool_proto::time::UnixMillis;
pub use spool_proto::v1::{ActivityError, ActivityStatus, ErrorKind, Payload};

pub use change::AttemptOutcome;
pub(crate) use change::SCHEDULE_TO_CLOSE;
pub use error::{Class, Error};
pub use model::*;
pub use ops::*;
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

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
            .saturating_add(spool_proto::time::millis(self.instant.elapsed()))
    }
}

/// The reads both dialects make with the same statements (see `reads.rs`): what
/// callers and the dashboard show, and what the server's own sweeps and timer
/// read.
#[async_trait::async_trait]
pub trait Reads: Send + Sync + 'static {
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
}

#[async_trait::async_trait]
pub trait Store: Reads {
    /// Runs `ops` in order in one transaction, committed durably before it returns.
    /// An `Err` means nothing of the batch was written. (Shared, not borrowed: a
    /// backend may hand the batch to a thread of its own.)
    async fn apply(&self, ops: Arc<[Op]>, now: UnixMillis) -> Result<Vec<Outcome>, Error>;

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
    per_level.map_or(0, |d| spool_proto::time::millis(d.min(MAX_PRIORITY_AGING)))
}

/// One embedded migration: its file's stem (`0001_activities`) and its SQL.
fn migration(stem: &str, sql: &'static str) -> sqlx::migrate::Migration {
    // A stem that is not `NNNN_name` is caught by `migrations_are_numbered_in_order`.
    let (version, name) = stem.split_once('_').unwrap_or(("0", stem));
    sqlx::migrate::Migration::new(
        version.parse().unwrap_or(0),
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

/// Attempt `n` of activity `a{id}`, with `retry`, for unit tests of what decides
/// an attempt's end.
#[cfg(test)]
pub(crate) fn attempt_for_tests(id: i64, n: u32, retry: RetrySpec) -> Attempt {
    Attempt {
        attempt: n,
        retry,
        ..Attempt::from_row(&running_row_for_tests(id, &format!("a{id}"), "w"))
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

#[cfg(test)]
mod conformance;

#[cfg(test)]
pub(crate) mod tests;

/// Each dialect's migrations are numbered 1, 2, 3… in order, each named.
#[cfg(test)]
fn migrations_are_numbered_in_order(migrator: &sqlx::migrate::Migrator) {
    let versions: Vec<i64> = migrator.iter().map(|m| m.version).collect();
    let expected: Vec<i64> = (1..=versions.len() as i64).collect();
    assert_eq!(versions, expected);
    assert!(migrator.iter().all(|m| !m.description.is_empty()));
}
