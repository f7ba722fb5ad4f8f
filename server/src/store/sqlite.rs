//! The embedded default: one SQLite file in WAL mode.
//!
//! Writes go through one dedicated connection (SQLite has one writer anyway), each
//! batch in a `BEGIN IMMEDIATE` transaction committed with `synchronous=FULL`, so a
//! commit is on disk before any caller hears of it. Reads use a small pool of other
//! connections, which WAL lets run beside the writer.
//!
//! Statuses appear in SQL as the wire enum's numbers: 1 SCHEDULED, 2 RUNNING,
//! 3 COMPLETED, 4 FAILED, 5 CANCELLED.
//!
//! The process holds an exclusive `flock` on the database file for its lifetime:
//! two servers on one file would both reclaim each other's RUNNING rows at start-up.

use std::{fs::File, str::FromStr, time::Duration};

use sqlx::{
    Connection, Row, SqliteConnection,
    migrate::{Migration, MigrationType, Migrator},
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
        SqliteSynchronous,
    },
};
use tokio::sync::Mutex;

use super::{
    ActivityError, ActivityRow, ActivityStatus, Error, Key, ListQuery, NewActivity, Op, Outcome,
    Payload, RetrySpec, StatusCounts, Store, Submitted, Timeouts, Transition, sqlite_bulk,
};
use spool_proto::time::UnixMillis;

/// The columns [`decode`] reads, in one place so every query returns the same shape.
macro_rules! columns {
    () => {
        "id, namespace, workflow_id, activity_id, activity_type, status, attempt, uncounted, \
         max_attempts, initial_interval_ms, backoff_coefficient, max_interval_ms, non_retryable, \
         heartbeat_timeout_ms, start_to_close_ms, schedule_to_close_ms, priority, input_type, \
         input, output_type, output, error_kind, error_type, error_message, error_details_type, \
         error_details, heartbeat_type, heartbeat_details, created_at, next_at, started_at, \
         finished_at, lease_expires_at, worker_id"
    };
}

fn migrator() -> Migrator {
    Migrator::with_migrations(vec![Migration::new(
        1,
        "activities".into(),
        MigrationType::Simple,
        sqlx::SqlSafeStr::into_sql_str(include_str!("migrations/sqlite/0001_activities.sql")),
        false,
    )])
}

pub struct SqliteStore {
    /// The one connection that writes; held only by `apply` (the committer).
    writer: Mutex<SqliteConnection>,
    readers: SqlitePool,
    /// Holds the process-wide `flock` until the store is dropped.
    _lock: File,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://PATH`), takes the
    /// file lock and runs migrations.
    pub async fn open(url: &str) -> Result<Self, Error> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .statement_cache_capacity(64);
        let path = options.get_filename().to_path_buf();
        if path.as_os_str().is_empty() || path.to_string_lossy().contains(":memory:") {
            // Each pooled connection would get its own empty in-memory database.
            return Err(Error::UnsupportedUrl(url.to_owned()));
        }
        let mut writer = SqliteConnection::connect_with(&options).await?;
        let lock = File::open(&path).map_err(|source| Error::Open {
            path: path.display().to_string(),
            source,
        })?;
        if lock.try_lock().is_err() {
            return Err(Error::Locked(path.display().to_string()));
        }
        migrator().run_direct(None, &mut writer, false).await?;
        let readers = SqlitePoolOptions::new()
            .max_connections(4)
            .min_connections(1)
            .connect_with(options)
            .await?;
        Ok(Self {
            writer: Mutex::new(writer),
            readers,
            _lock: lock,
        })
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn apply(&self, ops: &[Op], now: UnixMillis) -> Result<Vec<Outcome>, Error> {
        let mut conn = self.writer.lock().await;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let mut outcomes = Vec::with_capacity(ops.len());
        let mut start = 0;
        while start < ops.len() {
            let end = run_end(ops, start);
            if let Some(bulk) = bulk(&mut tx, &ops[start..end], now).await? {
                outcomes.extend(bulk);
            } else {
                for op in &ops[start..end] {
                    outcomes.push(apply_one(&mut tx, op, now).await?);
                }
            }
            start = end;
        }
        tx.commit().await?;
        Ok(outcomes)
    }

    async fn get(&self, key: &Key) -> Result<Option<ActivityRow>, Error> {
        let mut conn = self.readers.acquire().await?;
        select_by_key(&mut conn, key).await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<ActivityRow>, Error> {
        let status = query.status.map(|s| s as i64);
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM activities WHERE namespace = ?1 AND id > ?2 \
              AND (?3 IS NULL OR status = ?3) AND (?4 IS NULL OR activity_type = ?4) \
              ORDER BY id LIMIT ?5"
        ))
        .bind(&query.namespace)
        .bind(query.after_id)
        .bind(status)
        .bind(query.activity_type.as_deref())
        .bind(i64::from(query.limit))
        .fetch_all(&self.readers)
        .await?;
        rows.iter().map(decode).collect()
    }

    async fn stats(&self, namespace: &str) -> Result<StatusCounts, Error> {
        let rows = sqlx::query(
            "SELECT status, COUNT(*) FROM activities WHERE namespace = ?1 GROUP BY status",
        )
        .bind(namespace)
        .fetch_all(&self.readers)
        .await?;
        let mut counts = StatusCounts::default();
        for row in rows {
            let status: i64 = row.try_get(0)?;
            let n = u64::try_from(row.try_get::<i64, _>(1)?).unwrap_or(0);
            match status_from(status)? {
                ActivityStatus::Scheduled => counts.scheduled = n,
                ActivityStatus::Running => counts.running = n,
                ActivityStatus::Completed => counts.completed = n,
                ActivityStatus::Failed => counts.failed = n,
                ActivityStatus::Cancelled => counts.cancelled = n,
                ActivityStatus::Unspecified => {}
            }
        }
        Ok(counts)
    }

    async fn running(&self) -> Result<Vec<ActivityRow>, Error> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM activities WHERE status = 2 ORDER BY id"
        ))
        .fetch_all(&self.readers)
        .await?;
        rows.iter().map(decode).collect()
    }

    async fn expired_leases(&self, now: UnixMillis, limit: u32) -> Result<Vec<ActivityRow>, Error> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM activities WHERE status = 2 AND lease_expires_at < ?1 ORDER BY lease_expires_at LIMIT ?2"
        ))
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.readers)
        .await?;
        rows.iter().map(decode).collect()
    }

    async fn next_due(&self, after: UnixMillis) -> Result<Option<UnixMillis>, Error> {
        let row =
            sqlx::query("SELECT MIN(next_at) FROM activities WHERE status = 1 AND next_at > ?1")
                .bind(after)
                .fetch_one(&self.readers)
                .await?;
        Ok(row.try_get::<Option<i64>, _>(0)?)
    }
}

/// The end of the run of like ops (submits, or attempt endings) starting at `start`.
fn run_end(ops: &[Op], start: usize) -> usize {
    let same = |a: &Op, b: &Op| {
        matches!(
            (a, b),
            (Op::Submit(_), Op::Submit(_)) | (Op::Finish { .. }, Op::Finish { .. })
        )
    };
    // Always at least one op, so the caller advances.
    ops[start + 1..]
        .iter()
        .position(|op| !same(&ops[start], op))
        .map_or(ops.len(), |n| start + 1 + n)
}

/// A run's set-based execution, when it has more than one row and the bulk path
/// can take it (see `sqlite_bulk`).
async fn bulk(
    conn: &mut SqliteConnection,
    run: &[Op],
    now: UnixMillis,
) -> Result<Option<Vec<Outcome>>, Error> {
    match run.first() {
        Some(Op::Submit(_)) => {
            let batches: Vec<&[NewActivity]> = run
                .iter()
                .filter_map(|op| match op {
                    Op::Submit(batch) => Some(batch.as_slice()),
                    _ => None,
                })
                .collect();
            if batches.iter().map(|b| b.len()).sum::<usize>() < 2 {
                return Ok(None);
            }
            sqlite_bulk::submit_run(conn, &batches, now).await
        }
        Some(Op::Finish { .. }) if run.len() >= 2 => sqlite_bulk::finish_run(conn, run, now).await,
        _ => Ok(None),
    }
}

async fn apply_one(
    conn: &mut SqliteConnection,
    op: &Op,
    now: UnixMillis,
) -> Result<Outcome, Error> {
    match op {
        Op::Submit(batch) => submit_all(conn, batch, now).await,
        Op::Claim(claim) => sqlite_bulk::claim(conn, claim, now)
            .await
            .map(Outcome::Claimed),
        Op::Finish {
            attempt,
            transition,
            lease_expired_by,
        } => {
            finish(
                conn,
                attempt.id,
                attempt.attempt,
                transition,
                *lease_expired_by,
                now,
            )
            .await
        }
        Op::Renew {
            ids,
            lease_expires_at,
        } => {
            let mut renewed = 0;
            // Bounded statements: SQLite caps the size of one JSON argument.
            for chunk in ids.chunks(10_000) {
                let done = sqlx::query(
                    "UPDATE activities SET lease_expires_at = ?1 \
                     WHERE status = 2 AND id IN (SELECT value FROM json_each(?2))",
                )
                .bind(lease_expires_at)
                .bind(serde_json::to_string(chunk).unwrap_or_default())
                .execute(&mut *conn)
                .await?;
                renewed += done.rows_affected();
            }
            Ok(Outcome::Renewed(renewed))
        }
        Op::RecordHeartbeats(beats) => {
            let mut recorded = 0;
            for beat in beats {
                let done = sqlx::query(
                    "UPDATE activities SET heartbeat_type = ?3, heartbeat_details = ?4 \
                     WHERE id = ?1 AND attempt = ?2 AND status = 2",
                )
                .bind(beat.id)
                .bind(i64::from(beat.attempt))
                .bind(beat.details.as_ref().map(|d| d.content_type.as_str()))
                .bind(beat.details.as_ref().map(|d| d.data.as_slice()))
                .execute(&mut *conn)
                .await?;
                recorded += done.rows_affected();
            }
            Ok(Outcome::Recorded(recorded))
        }
        Op::ExpireScheduled { limit } => {
            let error = crate::lifecycle::server_error(
                spool_proto::v1::ErrorKind::Timeout,
                "ScheduleToCloseTimeout",
                "schedule_to_close_timeout passed before the activity finished".to_owned(),
            );
            let e = ErrorColumns::from(&error);
            let rows = sqlx::query(
                "UPDATE activities SET status = 4, finished_at = ?1, \
                 error_kind = ?3, error_type = ?4, error_message = ?5, \
                 error_details_type = NULL, error_details = NULL \
                 WHERE id IN (SELECT id FROM activities \
                   WHERE status = 1 AND expires_at IS NOT NULL AND expires_at <= ?1 LIMIT ?2) \
                 RETURNING namespace, workflow_id, activity_id",
            )
            .bind(now)
            .bind(i64::from(*limit))
            .bind(e.kind)
            .bind(e.error_type)
            .bind(e.message)
            .fetch_all(&mut *conn)
            .await?;
            let keys = rows
                .iter()
                .map(|r| {
                    Ok(Key {
                        namespace: r.try_get(0)?,
                        workflow_id: r.try_get(1)?,
                        activity_id: r.try_get(2)?,
                    })
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()?;
            Ok(Outcome::Expired(keys))
        }
        Op::Cancel { key, reason } => cancel(conn, key, reason, now).await,
        Op::Redrive { key } => redrive(conn, key, now).await,
        Op::Prune { before, limit } => {
            let done = sqlx::query(
                "DELETE FROM activities WHERE id IN (SELECT id FROM activities \
                 WHERE status >= 3 AND finished_at < ?1 LIMIT ?2)",
            )
            .bind(before)
            .bind(i64::from(*limit))
            .execute(&mut *conn)
            .await?;
            Ok(Outcome::Pruned(done.rows_affected()))
        }
    }
}

async fn submit_all(
    conn: &mut SqliteConnection,
    batch: &[NewActivity],
    now: UnixMillis,
) -> Result<Outcome, Error> {
    // A savepoint makes a multi-activity submit all or nothing inside the larger
    // group-commit transaction.
    let atomic = batch.len() > 1;
    if atomic {
        sqlx::query("SAVEPOINT submit").execute(&mut *conn).await?;
    }
    let mut submitted = Vec::with_capacity(batch.len());
    for (index, new) in batch.iter().enumerate() {
        match submit(conn, new, now).await? {
            Ok(s) => submitted.push(s),
            Err(existing_type) => {
                if atomic {
                    sqlx::query("ROLLBACK TO submit")
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query("RELEASE submit").execute(&mut *conn).await?;
                }
                return Ok(Outcome::Conflict {
                    index,
                    existing_type,
                });
            }
        }
    }
    if atomic {
        sqlx::query("RELEASE submit").execute(&mut *conn).await?;
    }
    Ok(Outcome::Submitted(submitted))
}

/// Inserts one activity; `Err(existing_type)` when its key exists with another type.
async fn submit(
    conn: &mut SqliteConnection,
    new: &NewActivity,
    now: UnixMillis,
) -> Result<Result<Submitted, String>, Error> {
    let non_retryable = encode_list(&new.retry.non_retryable);
    let inserted = sqlx::query(
        "INSERT INTO activities (namespace, workflow_id, activity_id, activity_type, status, \
         max_attempts, initial_interval_ms, backoff_coefficient, max_interval_ms, non_retryable, \
         heartbeat_timeout_ms, start_to_close_ms, schedule_to_close_ms, priority, input_type, \
         input, created_at, next_at, expires_at) \
         VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
                 ?16 + ?12) \
         ON CONFLICT (namespace, workflow_id, activity_id) DO NOTHING RETURNING id",
    )
    .bind(&new.key.namespace)
    .bind(&new.key.workflow_id)
    .bind(&new.key.activity_id)
    .bind(&new.activity_type)
    .bind(i64::from(new.retry.max_attempts))
    .bind(new.retry.initial_interval_ms)
    .bind(new.retry.backoff_coefficient)
    .bind(new.retry.max_interval_ms)
    .bind(non_retryable)
    .bind(new.timeouts.heartbeat_ms)
    .bind(new.timeouts.start_to_close_ms)
    .bind(new.timeouts.schedule_to_close_ms)
    .bind(i64::from(new.priority))
    .bind(&new.input.content_type)
    .bind(&new.input.data)
    .bind(now)
    .bind(new.next_at)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(inserted) = inserted {
        let row = sqlite_bulk::new_row(inserted.try_get(0)?, new, now);
        return Ok(Ok(Submitted { row, created: true }));
    }
    let existing = select_by_key(conn, &new.key).await?.ok_or_else(|| {
        Error::Corrupt(format!(
            "{:?} conflicted on insert but cannot be read",
            new.key
        ))
    })?;
    if existing.activity_type == new.activity_type {
        Ok(Ok(Submitted {
            row: existing,
            created: false,
        }))
    } else {
        Ok(Err(existing.activity_type))
    }
}

async fn finish(
    conn: &mut SqliteConnection,
    id: i64,
    attempt: u32,
    transition: &Transition,
    lease_expired_by: Option<UnixMillis>,
    now: UnixMillis,
) -> Result<Outcome, Error> {
    let attempt = i64::from(attempt);
    // The last parameter of each statement is the lease guard: NULL for every
    // ending but a reclaim.
    let done = match transition {
        Transition::Complete { output } => {
            sqlx::query(
                "UPDATE activities SET status = 3, output_type = ?3, output = ?4, \
                 finished_at = ?5, lease_expires_at = NULL \
                 WHERE id = ?1 AND attempt = ?2 AND status = 2 \
                 AND (?6 IS NULL OR lease_expires_at < ?6)",
            )
            .bind(id)
            .bind(attempt)
            .bind(&output.content_type)
            .bind(&output.data)
            .bind(now)
            .bind(lease_expired_by)
            .execute(&mut *conn)
            .await?
        }
        Transition::Retry { next_at, error } => {
            let e = ErrorColumns::from(error);
            sqlx::query(
                "UPDATE activities SET status = 1, next_at = ?3, lease_expires_at = NULL, \
                 error_kind = ?4, error_type = ?5, error_message = ?6, \
                 error_details_type = ?7, error_details = ?8 \
                 WHERE id = ?1 AND attempt = ?2 AND status = 2 \
                 AND (?9 IS NULL OR lease_expires_at < ?9)",
            )
            .bind(id)
            .bind(attempt)
            .bind(next_at)
            .bind(e.kind)
            .bind(e.error_type)
            .bind(e.message)
            .bind(e.details_type)
            .bind(e.details)
            .bind(lease_expired_by)
            .execute(&mut *conn)
            .await?
        }
        Transition::Snooze { .. } | Transition::Release => {
            let next_at = match transition {
                Transition::Snooze { next_at } => *next_at,
                _ => now,
            };
            sqlx::query(
                "UPDATE activities SET status = 1, next_at = ?3, uncounted = uncounted + 1, \
                 lease_expires_at = NULL WHERE id = ?1 AND attempt = ?2 AND status = 2 \
                 AND (?4 IS NULL OR lease_expires_at < ?4)",
            )
            .bind(id)
            .bind(attempt)
            .bind(next_at)
            .bind(lease_expired_by)
            .execute(&mut *conn)
            .await?
        }
        Transition::Fail { error } => {
            let e = ErrorColumns::from(error);
            sqlx::query(
                "UPDATE activities SET status = 4, finished_at = ?3, lease_expires_at = NULL, \
                 error_kind = ?4, error_type = ?5, error_message = ?6, \
                 error_details_type = ?7, error_details = ?8 \
                 WHERE id = ?1 AND attempt = ?2 AND status = 2 \
                 AND (?9 IS NULL OR lease_expires_at < ?9)",
            )
            .bind(id)
            .bind(attempt)
            .bind(now)
            .bind(e.kind)
            .bind(e.error_type)
            .bind(e.message)
            .bind(e.details_type)
            .bind(e.details)
            .bind(lease_expired_by)
            .execute(&mut *conn)
            .await?
        }
    };
    Ok(Outcome::Finished {
        accepted: done.rows_affected() == 1,
    })
}

async fn cancel(
    conn: &mut SqliteConnection,
    key: &Key,
    reason: &str,
    now: UnixMillis,
) -> Result<Outcome, Error> {
    let Some(mut row) = select_by_key(conn, key).await? else {
        return Ok(Outcome::NotFound);
    };
    if !matches!(
        row.status,
        ActivityStatus::Scheduled | ActivityStatus::Running
    ) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    let error = cancelled_error(reason);
    let e = ErrorColumns::from(&error);
    sqlx::query(
        "UPDATE activities SET status = 5, finished_at = ?2, lease_expires_at = NULL, \
         error_kind = ?3, error_type = ?4, error_message = ?5, \
         error_details_type = NULL, error_details = NULL WHERE id = ?1",
    )
    .bind(row.id)
    .bind(now)
    .bind(e.kind)
    .bind(e.error_type)
    .bind(e.message)
    .execute(&mut *conn)
    .await?;
    let prior = row.status;
    row.status = ActivityStatus::Cancelled;
    row.finished_at = Some(now);
    row.lease_expires_at = None;
    row.last_error = Some(error);
    Ok(Outcome::Cancelled { prior, row })
}

/// What a cancelled activity shows as its last error: who stopped it and why.
pub(crate) fn cancelled_error(reason: &str) -> ActivityError {
    ActivityError {
        kind: spool_proto::v1::ErrorKind::Terminal as i32,
        r#type: "Cancelled".to_owned(),
        message: if reason.is_empty() {
            "cancelled by request".to_owned()
        } else {
            reason.to_owned()
        },
        details: None,
        next_retry_delay: None,
    }
}

async fn redrive(
    conn: &mut SqliteConnection,
    key: &Key,
    now: UnixMillis,
) -> Result<Outcome, Error> {
    let Some(mut row) = select_by_key(conn, key).await? else {
        return Ok(Outcome::NotFound);
    };
    if !matches!(
        row.status,
        ActivityStatus::Failed | ActivityStatus::Cancelled
    ) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    // Every attempt so far becomes uncounted: a fresh budget, while `attempt` keeps
    // growing so late results of old attempts stay fenced out.
    sqlx::query(
        "UPDATE activities SET status = 1, next_at = ?2, uncounted = attempt, \
         finished_at = NULL, output_type = NULL, output = NULL WHERE id = ?1",
    )
    .bind(row.id)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    row.status = ActivityStatus::Scheduled;
    row.next_at = now;
    row.uncounted = row.attempt;
    row.finished_at = None;
    row.output = None;
    Ok(Outcome::Redriven { row })
}

async fn select_by_key(
    conn: &mut SqliteConnection,
    key: &Key,
) -> Result<Option<ActivityRow>, Error> {
    let row = sqlx::query(concat!(
        "SELECT ",
        columns!(),
        " FROM activities WHERE namespace = ?1 AND workflow_id = ?2 AND activity_id = ?3"
    ))
    .bind(&key.namespace)
    .bind(&key.workflow_id)
    .bind(&key.activity_id)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(decode).transpose()
}

/// The error columns of a row, flattened for binding.
pub(super) struct ErrorColumns<'a> {
    pub kind: i64,
    pub error_type: &'a str,
    pub message: &'a str,
    pub details_type: Option<&'a str>,
    pub details: Option<&'a [u8]>,
}

impl<'a> From<&'a ActivityError> for ErrorColumns<'a> {
    fn from(e: &'a ActivityError) -> Self {
        Self {
            kind: i64::from(e.kind),
            error_type: &e.r#type,
            message: &e.message,
            details_type: e.details.as_ref().map(|d| d.content_type.as_str()),
            details: e.details.as_ref().map(|d| d.data.as_slice()),
        }
    }
}

pub(super) fn encode_list(items: &[String]) -> Option<String> {
    if items.is_empty() {
        None
    } else {
        serde_json::to_string(items).ok()
    }
}

pub(super) fn status_from(value: i64) -> Result<ActivityStatus, Error> {
    i32::try_from(value)
        .ok()
        .and_then(|v| ActivityStatus::try_from(v).ok())
        .filter(|s| *s != ActivityStatus::Unspecified)
        .ok_or_else(|| Error::Corrupt(format!("unknown status {value}")))
}

pub(super) fn u32_from(value: i64, column: &str) -> Result<u32, Error> {
    u32::try_from(value).map_err(|_| Error::Corrupt(format!("{column} out of range: {value}")))
}

fn payload(content_type: Option<String>, data: Option<Vec<u8>>) -> Option<Payload> {
    data.map(|data| Payload {
        content_type: content_type.unwrap_or_default(),
        data,
    })
}

fn decode(row: &SqliteRow) -> Result<ActivityRow, Error> {
    let non_retryable: Option<String> = row.try_get("non_retryable")?;
    let non_retryable = match non_retryable {
        Some(json) => serde_json::from_str(&json)
            .map_err(|e| Error::Corrupt(format!("non_retryable: {e}")))?,
        None => Vec::new(),
    };
    let error_kind: Option<i64> = row.try_get("error_kind")?;
    let last_error = match error_kind {
        Some(kind) => Some(ActivityError {
            kind: i32::try_from(kind).unwrap_or_default(),
            r#type: row
                .try_get::<Option<String>, _>("error_type")?
                .unwrap_or_default(),
            message: row
                .try_get::<Option<String>, _>("error_message")?
                .unwrap_or_default(),
            details: payload(
                row.try_get("error_details_type")?,
                row.try_get("error_details")?,
            ),
            next_retry_delay: None,
        }),
        None => None,
    };
    Ok(ActivityRow {
        id: row.try_get("id")?,
        key: Key {
            namespace: row.try_get("namespace")?,
            workflow_id: row.try_get("workflow_id")?,
            activity_id: row.try_get("activity_id")?,
        },
        activity_type: row.try_get("activity_type")?,
        status: status_from(row.try_get("status")?)?,
        attempt: u32_from(row.try_get("attempt")?, "attempt")?,
        uncounted: u32_from(row.try_get("uncounted")?, "uncounted")?,
        retry: RetrySpec {
            max_attempts: u32_from(row.try_get("max_attempts")?, "max_attempts")?,
            initial_interval_ms: row.try_get("initial_interval_ms")?,
            backoff_coefficient: row.try_get("backoff_coefficient")?,
            max_interval_ms: row.try_get("max_interval_ms")?,
            non_retryable,
        },
        timeouts: Timeouts {
            heartbeat_ms: row.try_get("heartbeat_timeout_ms")?,
            start_to_close_ms: row.try_get("start_to_close_ms")?,
            schedule_to_close_ms: row.try_get("schedule_to_close_ms")?,
        },
        priority: i32::try_from(row.try_get::<i64, _>("priority")?)
            .map_err(|_| Error::Corrupt("priority out of range".to_owned()))?,
        input: Payload {
            content_type: row.try_get("input_type")?,
            data: row.try_get("input")?,
        },
        output: payload(row.try_get("output_type")?, row.try_get("output")?),
        last_error,
        heartbeat_details: payload(
            row.try_get("heartbeat_type")?,
            row.try_get("heartbeat_details")?,
        ),
        created_at: row.try_get("created_at")?,
        next_at: row.try_get("next_at")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        worker_id: row.try_get("worker_id")?,
    })
}
