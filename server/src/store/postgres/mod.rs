//! PostgreSQL, for more than one node: several servers share one database.
//!
//! Each batch is one transaction. Claims take rows with `FOR UPDATE SKIP LOCKED`,
//! so nodes claiming at once never take the same row and never wait on each other;
//! cancels, re-drives and expiries lock the rows they change. A multi-activity
//! submit is all or nothing through a savepoint (cheap here).
//!
//! The schema is `migrations/postgres`, the same table as SQLite's in PostgreSQL's
//! types; statuses are the wire enum's numbers.
//!
//! Time is the database's (`DbClock`): every node stamps leases and due times
//! with it and judges them by it, so skew between the nodes' own clocks cannot
//! reclaim a live attempt or hold a due row back.
//!
//! Every session sets `statement_timeout`, `lock_timeout` and
//! `idle_in_transaction_session_timeout` (unless the URL's `options` do), so a node
//! that stalls mid-transaction cannot block the others for long. The URL's
//! `sslmode` (and `sslrootcert`, `sslcert`, `sslkey`) is honoured, with rustls.
//!
//! Nodes tell each other about committed changes with `NOTIFY` on one channel
//! ([`CHANNEL`]): each notification is a JSON envelope of events from one node,
//! which every other node's listener turns into wake-ups. A node ignores its own.

use std::{str::FromStr, sync::Arc};

use sqlx::{
    PgConnection, Row,
    migrate::{Migration, MigrationType, Migrator},
    postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow},
};
use tokio::sync::mpsc;

use super::{
    ActivityError, ActivityRow, Claim, DueTimes, Error, Event, HeartbeatDetails, Key, ListPage,
    ListQuery, NewActivity, Op, Outcome, Remote, RunningPage, StatusCounts, Store, Submitted,
    Transition,
    rows::{self, cancelled_error, encode_list},
};

mod bulk;
mod notify;

pub use notify::CHANNEL;

use spool_proto::time::UnixMillis;

fn migrator() -> Migrator {
    Migrator::with_migrations(vec![Migration::new(
        1,
        "activities".into(),
        MigrationType::Simple,
        sqlx::SqlSafeStr::into_sql_str(include_str!("../migrations/postgres/0001_activities.sql")),
        false,
    )])
}

/// How long a statement, a wait for a lock, or an open transaction left idle may
/// last on our sessions, unless the URL's `options` say otherwise: a stalled node
/// must not hold locks that block the others for long.
const SESSION_LIMITS: [(&str, &str); 3] = [
    ("statement_timeout", "30s"),
    ("lock_timeout", "10s"),
    ("idle_in_transaction_session_timeout", "60s"),
];

/// How long taking a pooled connection may wait (and so how long start-up keeps
/// trying an unreachable server).
const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `options` with [`SESSION_LIMITS`] added where the URL does not set them.
fn session_limits(options: PgConnectOptions) -> PgConnectOptions {
    let set = options.get_options().unwrap_or_default().to_owned();
    let missing: Vec<_> = SESSION_LIMITS
        .iter()
        .filter(|(name, _)| !set.contains(name))
        .copied()
        .collect();
    if missing.is_empty() {
        options
    } else {
        options.options(missing)
    }
}

/// The database's clock, read without a round trip: the database's time at the
/// last sync plus the monotonic time elapsed since. Every node stamps and judges
/// times by it, so their own wall clocks (skewed, or stepped) do not matter: a
/// lease renewed by one node is judged by the same clock on every other.
struct DbClock {
    /// The database's time (Unix ms) at an instant of this process.
    anchor: std::sync::Mutex<(UnixMillis, std::time::Instant)>,
}

/// How often the clock is synced with the database (the monotonic clock drifts
/// little between syncs).
const CLOCK_SYNC: std::time::Duration = std::time::Duration::from_secs(10);

impl DbClock {
    fn now(&self) -> UnixMillis {
        let (at, instant) = *self.anchor.lock().unwrap_or_else(|e| e.into_inner());
        at.saturating_add(i64::try_from(instant.elapsed().as_millis()).unwrap_or(i64::MAX))
    }

    /// Reads the database's clock, placing the reading at the middle of the round
    /// trip.
    async fn sync(&self, pool: &PgPool) -> Result<(), Error> {
        let sent = std::time::Instant::now();
        let db: i64 =
            sqlx::query_scalar("SELECT (extract(epoch from clock_timestamp()) * 1000)::BIGINT")
                .fetch_one(pool)
                .await?;
        let round_trip = sent.elapsed();
        *self.anchor.lock().unwrap_or_else(|e| e.into_inner()) = (db, sent + round_trip / 2);
        Ok(())
    }

    /// Keeps the clock synced while the store lives.
    fn keep_synced(clock: &Arc<Self>, pool: PgPool) {
        let clock = Arc::downgrade(clock);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(CLOCK_SYNC).await;
                let Some(clock) = clock.upgrade() else { return };
                if let Err(e) = clock.sync(&pool).await {
                    tracing::warn!(error = %e, "cannot read the database's clock; keeping the last reading");
                }
            }
        });
    }
}

pub struct PostgresStore {
    /// Time as the database tells it (see [`DbClock`]).
    clock: Arc<DbClock>,
    /// Writes (the committer's transactions) and the server's own reads (due
    /// times, reclaims), apart from the API's callers so the committer never waits
    /// behind a caller's List.
    pool: PgPool,
    /// Reads for callers of the API (Get, List, Stats, Waits).
    readers: PgPool,
    /// This node's id in notifications, so it can ignore its own.
    node: String,
}

impl PostgresStore {
    /// Connects to `postgres://…` and runs migrations.
    pub async fn open(url: &str) -> Result<Self, Error> {
        Self::open_with(PgConnectOptions::from_str(url)?).await
    }

    pub async fn open_with(options: PgConnectOptions) -> Result<Self, Error> {
        let options = session_limits(options);
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options.clone())
            .await?;
        let readers = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_lazy_with(options);
        let mut conn = pool.acquire().await?;
        migrator().run_direct(None, &mut *conn, false).await?;
        drop(conn);
        let clock = Arc::new(DbClock {
            anchor: std::sync::Mutex::new((
                spool_proto::time::now_millis(),
                std::time::Instant::now(),
            )),
        });
        clock.sync(&pool).await?;
        DbClock::keep_synced(&clock, pool.clone());
        Ok(Self {
            clock,
            pool,
            readers,
            node: uuid::Uuid::now_v7().to_string(),
        })
    }
}

fn decode(row: &PgRow) -> Result<ActivityRow, Error> {
    rows::decode(&rows::Sqlx(row))
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    async fn apply(&self, ops: Arc<[Op]>, now: UnixMillis) -> Result<Vec<Outcome>, Error> {
        let mut tx = self.pool.begin().await?;
        let mut outcomes = Vec::with_capacity(ops.len());
        let mut start = 0;
        while start < ops.len() {
            let end = rows::run_end(&ops, start);
            match bulk(&mut tx, &ops[start..end], now).await? {
                Some(bulk) => outcomes.extend(bulk),
                None => {
                    for op in &ops[start..end] {
                        outcomes.push(apply_one(&mut tx, op, now).await?);
                    }
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

    async fn list(&self, query: &ListQuery) -> Result<ListPage, Error> {
        // Sizes first, so the page is cut by bytes before any payload is read
        // (`octet_length` takes a TOASTed value's size from its header).
        let status = query.status.map(|s| s as i64);
        let sizes: Vec<(i64, i64)> = sqlx::query(
            "SELECT id, (octet_length(input) + COALESCE(octet_length(output), 0) \
               + COALESCE(octet_length(error_details), 0) \
               + COALESCE(octet_length(heartbeat_details), 0) \
               + COALESCE(octet_length(error_message), 0))::BIGINT \
             FROM activities WHERE namespace = $1 AND id > $2 \
               AND ($3::BIGINT IS NULL OR status = $3) AND ($4::TEXT IS NULL OR activity_type = $4) \
             ORDER BY id LIMIT $5",
        )
        .bind(&query.namespace)
        .bind(query.after_id)
        .bind(status)
        .bind(query.activity_type.as_deref())
        .bind(i64::from(query.limit) + 1)
        .fetch_all(&self.readers)
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get::<Option<i64>, _>(1)?.unwrap_or(0))))
        .collect::<Result<_, sqlx::Error>>()?;
        if sizes.is_empty() {
            return Ok(ListPage::default());
        }
        let (last, more) = rows::page_bounds(&sizes, query.limit, query.max_bytes);
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM activities WHERE namespace = $1 AND id > $2 AND id <= $5 \
              AND ($3::BIGINT IS NULL OR status = $3) AND ($4::TEXT IS NULL OR activity_type = $4) \
              ORDER BY id"
        ))
        .bind(&query.namespace)
        .bind(query.after_id)
        .bind(status)
        .bind(query.activity_type.as_deref())
        .bind(last)
        .fetch_all(&self.readers)
        .await?;
        Ok(ListPage {
            rows: rows::decode_all(&rows, "list"),
            next_after: more.then_some(last),
        })
    }

    async fn stats(&self, namespace: &str) -> Result<StatusCounts, Error> {
        let rows = sqlx::query(
            "SELECT status, COUNT(*) FROM activities WHERE namespace = $1 GROUP BY status",
        )
        .bind(namespace)
        .fetch_all(&self.readers)
        .await?;
        let pairs = rows
            .iter()
            .map(|row| Ok((row.try_get::<i64, _>(0)?, row.try_get::<i64, _>(1)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        rows::status_counts(pairs)
    }

    async fn running(&self, after_id: i64, limit: u32) -> Result<RunningPage, Error> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            light_columns!("''::BYTEA", "NULL::TEXT", "NULL::BYTEA"),
            " FROM activities WHERE status = 2 AND id > $1 ORDER BY id LIMIT $2"
        ))
        .bind(after_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(RunningPage {
            next_after: (rows.len() == limit as usize)
                .then(|| rows.last().and_then(|r| r.try_get::<i64, _>("id").ok()))
                .flatten(),
            rows: rows::decode_all(&rows, "running"),
        })
    }

    async fn expired_leases(&self, now: UnixMillis, limit: u32) -> Result<Vec<ActivityRow>, Error> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            light_columns!("''::BYTEA", "NULL::TEXT", "NULL::BYTEA"),
            " FROM activities WHERE status = 2 AND lease_expires_at < $1 \
              ORDER BY lease_expires_at LIMIT $2"
        ))
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows::decode_all(&rows, "expired_leases"))
    }

    fn single_node(&self) -> bool {
        false
    }

    fn now(&self) -> UnixMillis {
        self.clock.now()
    }

    async fn publish(&self, events: Vec<Event>) -> Result<(), Error> {
        notify::publish(&self.pool, &self.node, events).await
    }

    async fn subscribe(&self) -> Result<Option<mpsc::Receiver<Remote>>, Error> {
        notify::subscribe(self.pool.clone(), self.node.clone())
            .await
            .map(Some)
    }

    async fn due_times(&self, after: UnixMillis, limit: u32) -> Result<DueTimes, Error> {
        let rows = sqlx::query(
            "SELECT next_at, namespace, activity_type FROM activities \
             WHERE status = 1 AND next_at > $1 ORDER BY next_at LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        let rows = rows
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(rows::due_times(rows, limit))
    }
}

/// A run's set-based execution, when it has more than one row and the bulk path
/// can take it (see `bulk`).
async fn bulk(
    conn: &mut PgConnection,
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
            bulk::submit_run(conn, &batches, now).await
        }
        Some(Op::Finish { .. }) if run.len() >= 2 => bulk::finish_run(conn, run, now).await,
        _ => Ok(None),
    }
}

async fn apply_one(conn: &mut PgConnection, op: &Op, now: UnixMillis) -> Result<Outcome, Error> {
    match op {
        Op::Submit(batch) => submit_all(conn, batch, now).await,
        Op::Claim(claim) => claim_rows(conn, claim, now).await.map(Outcome::Claimed),
        Op::Finish {
            attempt,
            transition,
            lease_expired_by,
        } => finish(
            conn,
            attempt.id,
            attempt.attempt,
            transition,
            *lease_expired_by,
            now,
        )
        .await
        .map(|accepted| Outcome::Finished { accepted }),
        Op::Cancel { key, reason } => cancel(conn, key, reason, now).await,
        Op::Redrive { key } => redrive(conn, key, now).await,
        Op::Prune { before, limit } => {
            let done = sqlx::query(
                "DELETE FROM activities WHERE id IN (SELECT id FROM activities \
                 WHERE status >= 3 AND finished_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
            )
            .bind(before)
            .bind(i64::from(*limit))
            .execute(&mut *conn)
            .await?;
            Ok(Outcome::Pruned(done.rows_affected()))
        }
        Op::Renew {
            attempts,
            lease_expires_at,
        } => {
            let ids: Vec<i64> = attempts.iter().map(|a| a.0).collect();
            let numbers: Vec<i64> = attempts.iter().map(|a| i64::from(a.1)).collect();
            let rows = sqlx::query(
                "UPDATE activities AS a SET lease_expires_at = $1 \
                 FROM UNNEST($2::BIGINT[], $3::BIGINT[]) AS v(id, attempt) \
                 WHERE a.id = v.id AND a.attempt = v.attempt AND a.status = 2 \
                 RETURNING a.id, a.attempt",
            )
            .bind(lease_expires_at)
            .bind(ids)
            .bind(numbers)
            .fetch_all(&mut *conn)
            .await?;
            let renewed = rows
                .iter()
                .map(|r| {
                    Ok((
                        r.try_get::<i64, _>(0)?,
                        rows::u32_from(r.try_get(1)?, "attempt")?,
                    ))
                })
                .collect::<Result<Vec<_>, Error>>()?;
            Ok(Outcome::Renewed(renewed))
        }
        Op::RecordHeartbeats(beats) => record_heartbeats(conn, beats).await.map(Outcome::Recorded),
        Op::ExpireScheduled { limit } => expire_scheduled(conn, *limit, now)
            .await
            .map(Outcome::Expired),
    }
}

async fn submit_all(
    conn: &mut PgConnection,
    batch: &[NewActivity],
    now: UnixMillis,
) -> Result<Outcome, Error> {
    let atomic = batch.len() > 1;
    if atomic {
        sqlx::query("SAVEPOINT submit").execute(&mut *conn).await?;
    }
    let mut submitted = Vec::with_capacity(batch.len());
    for (index, new) in batch.iter().enumerate() {
        match submit(conn, new, now, atomic).await? {
            Ok(s) => submitted.push(s),
            Err(existing_type) => {
                if atomic {
                    sqlx::query("ROLLBACK TO SAVEPOINT submit")
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query("RELEASE SAVEPOINT submit")
                        .execute(&mut *conn)
                        .await?;
                }
                return Ok(Outcome::Conflict {
                    index,
                    existing_type,
                });
            }
        }
    }
    if atomic {
        sqlx::query("RELEASE SAVEPOINT submit")
            .execute(&mut *conn)
            .await?;
    }
    Ok(Outcome::Submitted(submitted))
}

/// Inserts one activity; `Err(existing_type)` when its key exists with another type.
/// With `light`, an existing row is read without its payloads (a batch's answer).
async fn submit(
    conn: &mut PgConnection,
    new: &NewActivity,
    now: UnixMillis,
    light: bool,
) -> Result<Result<Submitted, String>, Error> {
    let inserted = sqlx::query(
        "INSERT INTO activities (namespace, workflow_id, activity_id, activity_type, status, \
         max_attempts, initial_interval_ms, backoff_coefficient, max_interval_ms, non_retryable, \
         heartbeat_timeout_ms, start_to_close_ms, schedule_to_close_ms, priority, input_type, \
         input, created_at, next_at, expires_at) \
         VALUES ($1, $2, $3, $4, 1, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
                 $18) \
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
    .bind(encode_list(&new.retry.non_retryable))
    .bind(new.timeouts.heartbeat_ms)
    .bind(new.timeouts.start_to_close_ms)
    .bind(new.timeouts.schedule_to_close_ms)
    .bind(i64::from(new.priority))
    .bind(&new.input.content_type)
    .bind(&new.input.data)
    .bind(now)
    .bind(new.next_at)
    .bind(rows::expires_at(now, new.timeouts.schedule_to_close_ms))
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(inserted) = inserted {
        return Ok(Ok(Submitted {
            row: rows::new_row(inserted.try_get(0)?, new, now),
            created: true,
        }));
    }
    let existing = if light {
        select_light(conn, &new.key, false).await?
    } else {
        select_by_key(conn, &new.key).await?
    };
    rows::existing_outcome(new, existing)
}

async fn claim_rows(
    conn: &mut PgConnection,
    claim: &Claim,
    now: UnixMillis,
) -> Result<Vec<ActivityRow>, Error> {
    let mut claimed = Vec::new();
    for activity_type in &claim.activity_types {
        let left = i64::from(claim.limit) - claimed.len() as i64;
        if left <= 0 {
            break;
        }
        let rows = sqlx::query(concat!(
            "UPDATE activities SET status = 2, attempt = attempt + 1, started_at = $1, \
             worker_id = $2, lease_expires_at = $3 \
             WHERE id IN (SELECT id FROM activities \
               WHERE namespace = $4 AND activity_type = $5 AND status = 1 AND next_at <= $1 \
                 AND (expires_at IS NULL OR expires_at > $1) \
               ORDER BY priority DESC, next_at, id LIMIT $6 FOR UPDATE SKIP LOCKED) \
             RETURNING ",
            columns!()
        ))
        .bind(now)
        .bind(&*claim.worker_id)
        .bind(claim.lease_expires_at)
        .bind(&*claim.namespace)
        .bind(&**activity_type)
        .bind(left)
        .fetch_all(&mut *conn)
        .await?;
        // An unreadable row stays RUNNING, undelivered, until its lease lapses; it
        // must not stop every other claim.
        claimed.extend(rows::decode_all(&rows, "claim"));
    }
    Ok(claimed)
}

/// Ends an attempt, fenced by attempt and status (and the lease guard if given);
/// true if the row changed.
async fn finish(
    conn: &mut PgConnection,
    id: i64,
    attempt: u32,
    transition: &Transition,
    lease_expired_by: Option<UnixMillis>,
    now: UnixMillis,
) -> Result<bool, Error> {
    let attempt = i64::from(attempt);
    // The last parameter of each statement is the lease guard: NULL for every
    // ending but a reclaim.
    let done =
        match transition {
            Transition::Complete { output } => {
                sqlx::query(
                    "UPDATE activities SET status = 3, output_type = $3, output = $4, \
                 finished_at = $5, lease_expires_at = NULL \
                 WHERE id = $1 AND attempt = $2 AND status = 2 \
                 AND ($6::BIGINT IS NULL OR lease_expires_at < $6)",
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
                bind_error(
                    sqlx::query(
                        "UPDATE activities SET status = 1, next_at = $3, lease_expires_at = NULL, \
                     error_kind = $4, error_type = $5, error_message = $6, \
                     error_details_type = $7, error_details = $8 \
                     WHERE id = $1 AND attempt = $2 AND status = 2 \
                     AND ($9::BIGINT IS NULL OR lease_expires_at < $9)",
                    )
                    .bind(id)
                    .bind(attempt)
                    .bind(next_at),
                    error,
                )
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
                    "UPDATE activities SET status = 1, next_at = $3, uncounted = uncounted + 1, \
                 lease_expires_at = NULL WHERE id = $1 AND attempt = $2 AND status = 2 \
                 AND ($4::BIGINT IS NULL OR lease_expires_at < $4)",
                )
                .bind(id)
                .bind(attempt)
                .bind(next_at)
                .bind(lease_expired_by)
                .execute(&mut *conn)
                .await?
            }
            Transition::Fail { error } => bind_error(
                sqlx::query(
                    "UPDATE activities SET status = 4, finished_at = $3, lease_expires_at = NULL, \
                     error_kind = $4, error_type = $5, error_message = $6, \
                     error_details_type = $7, error_details = $8 \
                     WHERE id = $1 AND attempt = $2 AND status = 2 \
                     AND ($9::BIGINT IS NULL OR lease_expires_at < $9)",
                )
                .bind(id)
                .bind(attempt)
                .bind(now),
                error,
            )
            .bind(lease_expired_by)
            .execute(&mut *conn)
            .await?,
        };
    Ok(done.rows_affected() == 1)
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Binds an error's five columns: kind, type, message, details type, details.
fn bind_error<'q>(q: PgQuery<'q>, e: &'q ActivityError) -> PgQuery<'q> {
    q.bind(i64::from(e.kind))
        .bind(&e.r#type)
        .bind(&e.message)
        .bind(e.details.as_ref().map(|d| d.content_type.as_str()))
        .bind(e.details.as_ref().map(|d| d.data.as_slice()))
}

async fn cancel(
    conn: &mut PgConnection,
    key: &Key,
    reason: &str,
    now: UnixMillis,
) -> Result<Outcome, Error> {
    let Some(row) = select_light(conn, key, true).await? else {
        return Ok(Outcome::NotFound);
    };
    if !crate::store::cancellable(row.status) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    let error = cancelled_error(reason);
    let stored = bind_error(
        sqlx::query(concat!(
            "UPDATE activities SET status = 5, finished_at = $2, lease_expires_at = NULL, \
             error_kind = $3, error_type = $4, error_message = $5, \
             error_details_type = $6, error_details = $7 WHERE id = $1 RETURNING ",
            columns!()
        ))
        .bind(row.id)
        .bind(now),
        &error,
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(Outcome::Cancelled {
        prior: row.status,
        row: decode(&stored)?,
    })
}

async fn redrive(conn: &mut PgConnection, key: &Key, now: UnixMillis) -> Result<Outcome, Error> {
    // No lock on a row in the wrong state: a SCHEDULED row locked here would be
    // skipped by another node's claim (SKIP LOCKED) and its group taken for empty.
    let redrivable = crate::store::redrivable;
    let Some(row) = select_light(conn, key, false).await? else {
        return Ok(Outcome::NotFound);
    };
    if !redrivable(row.status) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    // Terminal rows are never claimed, so locking this one costs no one; read it
    // again under the lock in case a concurrent re-drive got there first.
    let Some(row) = select_light(conn, key, true).await? else {
        return Ok(Outcome::NotFound);
    };
    if !redrivable(row.status) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    // As in SQLite: a fresh budget and schedule-to-close window; `attempt` keeps growing.
    let stored = sqlx::query(concat!(
        "UPDATE activities SET status = 1, next_at = $2, uncounted = attempt, \
         finished_at = NULL, output_type = NULL, output = NULL, expires_at = $3 \
         WHERE id = $1 RETURNING ",
        columns!()
    ))
    .bind(row.id)
    .bind(now)
    .bind(rows::expires_at(now, row.timeouts.schedule_to_close_ms))
    .fetch_one(&mut *conn)
    .await?;
    Ok(Outcome::Redriven {
        row: decode(&stored)?,
    })
}

async fn record_heartbeats(
    conn: &mut PgConnection,
    beats: &[HeartbeatDetails],
) -> Result<u64, Error> {
    let mut recorded = 0;
    for beat in beats {
        let done = sqlx::query(
            "UPDATE activities SET heartbeat_type = $3, heartbeat_details = $4 \
             WHERE id = $1 AND attempt = $2 AND status = 2",
        )
        .bind(beat.id)
        .bind(i64::from(beat.attempt))
        .bind(beat.details.as_ref().map(|d| d.content_type.as_str()))
        .bind(beat.details.as_ref().map(|d| d.data.as_slice()))
        .execute(&mut *conn)
        .await?;
        recorded += done.rows_affected();
    }
    Ok(recorded)
}

async fn expire_scheduled(
    conn: &mut PgConnection,
    limit: u32,
    now: UnixMillis,
) -> Result<Vec<Key>, Error> {
    let error = crate::store::server_error(
        spool_proto::v1::ErrorKind::Timeout,
        "ScheduleToCloseTimeout",
        "schedule_to_close_timeout passed before the activity finished".to_owned(),
    );
    let rows = bind_error(
        sqlx::query(
            "UPDATE activities SET status = 4, finished_at = $1, \
             error_kind = $3, error_type = $4, error_message = $5, \
             error_details_type = $6, error_details = $7 \
             WHERE id IN (SELECT id FROM activities \
               WHERE status = 1 AND expires_at IS NOT NULL AND expires_at <= $1 \
               LIMIT $2 FOR UPDATE SKIP LOCKED) \
             RETURNING namespace, workflow_id, activity_id",
        )
        .bind(now)
        .bind(i64::from(limit)),
        &error,
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(Key {
                namespace: r.try_get(0)?,
                workflow_id: r.try_get(1)?,
                activity_id: r.try_get(2)?,
            })
        })
        .collect()
}

/// One row by key.
async fn select_by_key(conn: &mut PgConnection, key: &Key) -> Result<Option<ActivityRow>, Error> {
    select_one(
        conn,
        key,
        concat!(
            "SELECT ",
            columns!(),
            " FROM activities WHERE namespace = $1 AND workflow_id = $2 AND activity_id = $3"
        ),
    )
    .await
}

/// One row by key without its payloads (see `light_columns!`); with `lock`,
/// locked for the rest of the transaction.
async fn select_light(
    conn: &mut PgConnection,
    key: &Key,
    lock: bool,
) -> Result<Option<ActivityRow>, Error> {
    let sql = if lock {
        concat!(
            "SELECT ",
            light_columns!("''::BYTEA", "NULL::TEXT", "NULL::BYTEA"),
            " FROM activities WHERE namespace = $1 AND workflow_id = $2 AND activity_id = $3 FOR UPDATE"
        )
    } else {
        concat!(
            "SELECT ",
            light_columns!("''::BYTEA", "NULL::TEXT", "NULL::BYTEA"),
            " FROM activities WHERE namespace = $1 AND workflow_id = $2 AND activity_id = $3"
        )
    };
    select_one(conn, key, sql).await
}

/// The row `sql` (a `SELECT` of the `columns!()` shape by key) finds.
async fn select_one(
    conn: &mut PgConnection,
    key: &Key,
    sql: &'static str,
) -> Result<Option<ActivityRow>, Error> {
    let row = sqlx::query(sql)
        .bind(&key.namespace)
        .bind(&key.workflow_id)
        .bind(&key.activity_id)
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(decode).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_url() -> String {
        std::env::var("SPOOL_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| panic!("SPOOL_TEST_POSTGRES_URL must name a PostgreSQL server"))
    }

    /// A store in a schema of its own, with `extra` session options.
    async fn store_with(extra: &[(&str, &str)]) -> PostgresStore {
        let url = test_url();
        let schema = format!("spool_test_{}", uuid::Uuid::new_v4().simple());
        let options = PgConnectOptions::from_str(&url)
            .unwrap_or_else(|e| panic!("{e}"))
            .options([("search_path", schema.as_str())])
            .options(extra.iter().copied());
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&admin)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        PostgresStore::open_with(options)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The next remote item that `wanted` accepts, within 10 s (other tests' nodes
    /// share the channel, so unrelated events are skipped).
    async fn next_matching(
        rx: &mut mpsc::Receiver<Remote>,
        wanted: impl Fn(&Remote) -> bool,
    ) -> Remote {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(remote)) if wanted(&remote) => return remote,
                Ok(Some(_)) => {}
                Ok(None) => panic!("the listener stopped"),
                Err(_) => panic!("nothing matching arrived within 10 s"),
            }
        }
    }

    /// Publish/subscribe between two nodes: one's events reach the other, not
    /// itself; a listener whose connection is cut comes back and says `Resync`.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn events_reach_other_nodes_and_a_cut_listener_resyncs() {
        let a = store_with(&[]).await;
        let b = store_with(&[]).await;
        let mut from_a = a
            .subscribe()
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("no listener"));
        let mut from_b = b
            .subscribe()
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("no listener"));
        let key = Key {
            namespace: "default".into(),
            workflow_id: format!("wf-{}", uuid::Uuid::new_v4().simple()),
            activity_id: "a".into(),
        };
        let finished = Event::Finished { key: key.clone() };
        let is_ours = |r: &Remote| matches!(r, Remote::Event(Event::Finished { key: k }) if k.workflow_id == key.workflow_id);
        b.publish(vec![finished.clone()])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(next_matching(&mut from_a, is_ours).await, Remote::Event(e) if e == finished)
        );
        // A node does not hear itself: b's own listener gets a's next event, never its own.
        let second = Event::Finished {
            key: Key {
                activity_id: "b".into(),
                ..key.clone()
            },
        };
        a.publish(vec![second.clone()])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(next_matching(&mut from_b, is_ours).await, Remote::Event(e) if e == second),
            "b heard a, not its own earlier event"
        );
        // Cut every listening connection: each listener reconnects and says Resync.
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE query ILIKE 'LISTEN%' AND pid <> pg_backend_pid()",
        )
        .execute(&a.pool)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            next_matching(&mut from_a, |r| matches!(r, Remote::Resync)).await,
            Remote::Resync
        ));
    }

    /// Callers holding every API read connection do not hold up the committer's
    /// writes or the server's own reads.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn writes_never_wait_behind_callers_reads() {
        let store = store_with(&[]).await;
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(
                store
                    .readers
                    .acquire()
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
            );
        }
        let quick = std::time::Duration::from_secs(2);
        let applied = tokio::time::timeout(
            quick,
            store.apply(
                Arc::from(vec![Op::Prune {
                    before: 0,
                    limit: 1,
                }]),
                0,
            ),
        )
        .await;
        assert!(matches!(applied, Ok(Ok(_))), "a write waited: {applied:?}");
        let due = tokio::time::timeout(quick, store.due_times(0, 10)).await;
        assert!(matches!(due, Ok(Ok(_))), "due times waited");
        drop(held);
    }

    /// `sslmode` in the URL is honoured: `require` speaks TLS (the server's own
    /// certificate here is self-signed), `verify-full` refuses a certificate no
    /// trusted CA signed.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn the_urls_sslmode_is_honoured() {
        let url = test_url();
        let with = |mode: &str| {
            let separator = if url.contains('?') { '&' } else { '?' };
            format!("{url}{separator}sslmode={mode}")
        };
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&with("require"))
            .await
            .unwrap_or_else(|e| panic!("sslmode=require: {e}"));
        let encrypted: bool =
            sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .fetch_one(&pool)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(encrypted, "sslmode=require must speak TLS");
        let verified = PostgresStore::open(&with("verify-full")).await;
        assert!(
            verified.is_err(),
            "verify-full must refuse the self-signed certificate"
        );
    }

    /// Every pooled session carries the limits, and a URL's own setting wins.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn sessions_set_statement_lock_and_idle_timeouts() {
        let store = store_with(&[("lock_timeout", "3s")]).await;
        let show = |name: &'static str| {
            let pool = store.pool.clone();
            async move {
                sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!("SHOW {name}")))
                    .fetch_one(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
            }
        };
        assert_eq!(show("statement_timeout").await, "30s");
        assert_eq!(show("idle_in_transaction_session_timeout").await, "1min");
        assert_eq!(
            show("lock_timeout").await,
            "3s",
            "the URL's own setting wins"
        );
    }
}
