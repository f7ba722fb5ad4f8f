//! The SQLite writer: a thread of its own that owns the one writing connection and
//! runs each batch of ops as one `BEGIN IMMEDIATE` … `COMMIT` transaction
//! (`synchronous=FULL`: durable before the reply is sent).
//!
//! A batch crosses threads once each way (the ops in, the outcomes out); every
//! statement inside runs on this thread against prepared, cached statements.
//!
//! Invariant: a batch is all or nothing. Any error rolls the whole transaction back
//! and is returned; nothing of that batch is written. If even the rollback fails and
//! the connection is left inside a transaction, it is replaced by a fresh one, so
//! one failure cannot fail every later batch.

use std::{collections::HashMap, path::Path, sync::Arc, thread::JoinHandle};

use spool_proto::time::UnixMillis;
use tokio::sync::oneshot;

use super::raw::{Connection, NotUtf8, Query, SqliteError};
use crate::store::{
    ActivityError, ActivityRow, Claim, Error, HeartbeatDetails, Key, NewActivity, Op, Outcome,
    Submitted, Transition,
    rows::{self, cancelled_error, encode_list},
};

struct Job {
    ops: Arc<[Op]>,
    now: UnixMillis,
    reply: oneshot::Sender<Result<Vec<Outcome>, Error>>,
}

pub struct Writer {
    /// To the writer thread; dropping it (with the `Writer`) ends the thread.
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Opens the writing connection on `path` (migrated already) and starts the thread.
    pub fn start(path: &Path) -> Result<Self, Error> {
        let mut conn = Connection::open(path).map_err(sqlite)?;
        let (jobs, inbox) = std::sync::mpsc::channel::<Job>();
        let reopen_path = path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("spool-sqlite-writer".to_owned())
            .spawn(move || {
                while let Ok(job) = inbox.recv() {
                    let result = run_batch(&mut conn, &job.ops, job.now);
                    if result.is_err() {
                        recover(&mut conn, &reopen_path);
                    }
                    let _ = job.reply.send(result);
                }
            })
            .map_err(|source| Error::Open {
                path: path.display().to_string(),
                source,
            })?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    pub async fn apply(&self, ops: Arc<[Op]>, now: UnixMillis) -> Result<Vec<Outcome>, Error> {
        let (reply, outcome) = oneshot::channel();
        let gone = || Error::Corrupt("the SQLite writer thread has stopped".to_owned());
        self.jobs
            .as_ref()
            .ok_or_else(gone)?
            .send(Job { ops, now, reply })
            .map_err(|_| gone())?;
        outcome.await.map_err(|_| gone())?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the channel ends the thread after its current batch; joining
        // makes sure the connection is closed (and the WAL checkpointed) before
        // the database lock is released.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// After a failed batch: a connection its ROLLBACK left inside a transaction would
/// fail every later `BEGIN`; replace it with a fresh one.
fn recover(conn: &mut Connection, path: &Path) {
    if !conn.in_transaction() {
        return;
    }
    tracing::error!(
        "the writing connection is stuck in a transaction after a failed rollback; reopening it"
    );
    match Connection::open(path) {
        Ok(fresh) => *conn = fresh,
        Err(e) => tracing::error!(error = %e, "cannot reopen the writing connection"),
    }
}

impl From<NotUtf8> for Error {
    fn from(e: NotUtf8) -> Self {
        Error::Corrupt(e.to_string())
    }
}

fn sqlite(e: SqliteError) -> Error {
    Error::Sqlite {
        code: e.code,
        message: e.message,
    }
}

fn run_batch(conn: &mut Connection, ops: &[Op], now: UnixMillis) -> Result<Vec<Outcome>, Error> {
    conn.query("BEGIN IMMEDIATE")
        .and_then(|q| q.execute())
        .map_err(sqlite)?;
    let result = ops
        .iter()
        .map(|op| apply_one(conn, op, now))
        .collect::<Result<Vec<_>, _>>()
        .and_then(|outcomes| {
            conn.query("COMMIT")
                .and_then(|q| q.execute())
                .map_err(sqlite)?;
            Ok(outcomes)
        });
    // SQLite rolls some failures back by itself (a full disk, for one): then there
    // is no transaction left to roll back.
    if result.is_err()
        && conn.in_transaction()
        && let Err(e) = conn.query("ROLLBACK").and_then(|q| q.execute())
    {
        // The caller checks whether the connection is still inside a transaction.
        tracing::error!(error = %e, "ROLLBACK failed");
    }
    result
}

fn apply_one(conn: &mut Connection, op: &Op, now: UnixMillis) -> Result<Outcome, Error> {
    match op {
        Op::Submit(batch) => submit_all(conn, batch, now),
        Op::Claim(claim) => claim_rows(conn, claim, now).map(Outcome::Claimed),
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
        .map(|accepted| Outcome::Finished { accepted }),
        Op::Cancel { key, reason } => cancel(conn, key, reason, now),
        Op::Redrive { key } => redrive(conn, key, now),
        Op::Prune { before, limit } => conn
            .query(
                "DELETE FROM activities WHERE id IN (SELECT id FROM activities \
                 WHERE status >= 3 AND finished_at < ?1 LIMIT ?2)",
            )
            .map(|q| q.bind(before).bind(&i64::from(*limit)))
            .and_then(Query::execute)
            .map(Outcome::Pruned)
            .map_err(sqlite),
        Op::Renew {
            attempts,
            lease_expires_at,
        } => {
            let mut renewed = Vec::with_capacity(attempts.len());
            for &(id, attempt) in attempts {
                let changed = conn
                    .query(
                        "UPDATE activities SET lease_expires_at = ?1 \
                         WHERE id = ?2 AND attempt = ?3 AND status = 2",
                    )
                    .map(|q| q.bind(lease_expires_at).bind(&id).bind(&i64::from(attempt)))
                    .and_then(Query::execute)
                    .map_err(sqlite)?;
                if changed == 1 {
                    renewed.push((id, attempt));
                }
            }
            Ok(Outcome::Renewed(renewed))
        }
        Op::RecordHeartbeats(beats) => record_heartbeats(conn, beats).map(Outcome::Recorded),
        Op::ExpireScheduled { limit } => expire_scheduled(conn, *limit, now).map(Outcome::Expired),
    }
}

fn submit_all(
    conn: &mut Connection,
    batch: &[NewActivity],
    now: UnixMillis,
) -> Result<Outcome, Error> {
    if let [new] = batch {
        return Ok(match submit(conn, new, now)? {
            Ok(submitted) => Outcome::Submitted(vec![submitted]),
            Err(existing_type) => Outcome::Conflict {
                index: 0,
                existing_type,
            },
        });
    }
    // All or nothing without a savepoint (which would copy every page it touches
    // into a sub-journal): check every key first, write only if all can be.
    // Nothing else writes between the check and the inserts: this is the one
    // writer, inside one transaction.
    enum Plan {
        Insert,
        Existing(Box<ActivityRow>),
        SameAs(usize),
    }
    let mut first: HashMap<&Key, usize> = HashMap::with_capacity(batch.len());
    let mut plans = Vec::with_capacity(batch.len());
    for (index, new) in batch.iter().enumerate() {
        if let Some(&earlier) = first.get(&new.key) {
            if batch[earlier].activity_type != new.activity_type {
                return Ok(Outcome::Conflict {
                    index,
                    existing_type: batch[earlier].activity_type.clone(),
                });
            }
            plans.push(Plan::SameAs(earlier));
            continue;
        }
        first.insert(&new.key, index);
        match select_light(conn, &new.key)? {
            Some(row) if row.activity_type != new.activity_type => {
                return Ok(Outcome::Conflict {
                    index,
                    existing_type: row.activity_type,
                });
            }
            Some(row) => plans.push(Plan::Existing(Box::new(row))),
            None => plans.push(Plan::Insert),
        }
    }
    let mut submitted: Vec<Submitted> = Vec::with_capacity(batch.len());
    for (new, plan) in batch.iter().zip(plans) {
        let s = match plan {
            Plan::Insert => match submit(conn, new, now)? {
                Ok(s) => s,
                Err(_) => {
                    return Err(Error::Corrupt(format!(
                        "{:?} appeared during its own batch",
                        new.key
                    )));
                }
            },
            Plan::Existing(row) => Submitted {
                row: *row,
                created: false,
            },
            Plan::SameAs(earlier) => Submitted {
                row: submitted[earlier].row.clone(),
                created: false,
            },
        };
        submitted.push(s);
    }
    Ok(Outcome::Submitted(submitted))
}

/// Inserts one activity; `Err(existing_type)` when its key exists with another type.
fn submit(
    conn: &mut Connection,
    new: &NewActivity,
    now: UnixMillis,
) -> Result<Result<Submitted, String>, Error> {
    let non_retryable = encode_list(&new.retry.non_retryable);
    let mut q = conn
        .query(
            "INSERT INTO activities (namespace, workflow_id, activity_id, activity_type, status, \
             max_attempts, initial_interval_ms, backoff_coefficient, max_interval_ms, non_retryable, \
             heartbeat_timeout_ms, start_to_close_ms, schedule_to_close_ms, priority, input_type, \
             input, created_at, next_at, expires_at) \
             VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
                     ?18) \
             ON CONFLICT (namespace, workflow_id, activity_id) DO NOTHING RETURNING id",
        )
        .map_err(sqlite)?
        .bind(&new.key.namespace)
        .bind(&new.key.workflow_id)
        .bind(&new.key.activity_id)
        .bind(&new.activity_type)
        .bind(&i64::from(new.retry.max_attempts))
        .bind(&new.retry.initial_interval_ms)
        .bind(&new.retry.backoff_coefficient)
        .bind(&new.retry.max_interval_ms)
        .bind(&non_retryable)
        .bind(&new.timeouts.heartbeat_ms)
        .bind(&new.timeouts.start_to_close_ms)
        .bind(&new.timeouts.schedule_to_close_ms)
        .bind(&i64::from(new.priority))
        .bind(&new.input.content_type)
        .bind(&new.input.data)
        .bind(&now)
        .bind(&new.next_at)
        .bind(&rows::expires_at(now, new.timeouts.schedule_to_close_ms));
    let inserted = if q.step().map_err(sqlite)? {
        Some(q.int(0))
    } else {
        None
    };
    drop(q);
    if let Some(id) = inserted {
        return Ok(Ok(Submitted {
            row: rows::new_row(id, new, now),
            created: true,
        }));
    }
    rows::existing_outcome(new, select_by_key(conn, &new.key)?)
}

/// An existing row without its payloads (see `light_columns!`): what a batch
/// submit answers for a key that exists, so a batch naming one large stored row many
/// times costs no memory.
fn select_light(conn: &mut Connection, key: &Key) -> Result<Option<ActivityRow>, Error> {
    select_one(
        conn,
        key,
        concat!(
            "SELECT ",
            light_columns!("X''", "NULL", "NULL"),
            " FROM activities WHERE namespace = ?1 AND workflow_id = ?2 AND activity_id = ?3"
        ),
    )
}

fn claim_rows(
    conn: &mut Connection,
    claim: &Claim,
    now: UnixMillis,
) -> Result<Vec<ActivityRow>, Error> {
    let mut claimed = Vec::new();
    for activity_type in &claim.activity_types {
        let left = i64::from(claim.limit) - claimed.len() as i64;
        if left <= 0 {
            break;
        }
        let mut q = conn
            .query(concat!(
                "UPDATE activities SET status = 2, attempt = attempt + 1, started_at = ?1, \
                 worker_id = ?2, lease_expires_at = ?3 \
                 WHERE id IN (SELECT id FROM activities \
                   WHERE namespace = ?4 AND activity_type = ?5 AND status = 1 AND next_at <= ?1 \
                     AND (expires_at IS NULL OR expires_at > ?1) \
                   ORDER BY priority DESC, next_at, id LIMIT ?6) \
                 RETURNING ",
                columns!()
            ))
            .map_err(sqlite)?
            .bind(&now)
            .bind(&*claim.worker_id)
            .bind(&claim.lease_expires_at)
            .bind(&*claim.namespace)
            .bind(&**activity_type)
            .bind(&left);
        while q.step().map_err(sqlite)? {
            // An unreadable row stays RUNNING, undelivered, until its lease lapses;
            // it must not stop every other claim.
            match decode(&q) {
                Ok(row) => claimed.push(row),
                Err(e) => rows::unreadable("claim", Some(q.int(0)), &e),
            }
        }
    }
    Ok(claimed)
}

/// Ends an attempt, fenced by attempt and status (and the lease guard if given);
/// true if the row changed.
fn finish(
    conn: &mut Connection,
    id: i64,
    attempt: u32,
    transition: &Transition,
    lease_expired_by: Option<UnixMillis>,
    now: UnixMillis,
) -> Result<bool, Error> {
    let attempt = i64::from(attempt);
    // The last parameter of each statement is the lease guard: NULL for every
    // ending but a reclaim.
    let changed = match transition {
        Transition::Complete { output } => conn
            .query(
                "UPDATE activities SET status = 3, output_type = ?3, output = ?4, \
                 finished_at = ?5, lease_expires_at = NULL \
                 WHERE id = ?1 AND attempt = ?2 AND status = 2 \
                 AND (?6 IS NULL OR lease_expires_at < ?6)",
            )
            .map(|q| {
                q.bind(&id)
                    .bind(&attempt)
                    .bind(&output.content_type)
                    .bind(&output.data)
                    .bind(&now)
                    .bind(&lease_expired_by)
            })
            .and_then(Query::execute),
        Transition::Retry { next_at, error } => conn
            .query(
                "UPDATE activities SET status = 1, next_at = ?3, lease_expires_at = NULL, \
                 error_kind = ?4, error_type = ?5, error_message = ?6, \
                 error_details_type = ?7, error_details = ?8 \
                 WHERE id = ?1 AND attempt = ?2 AND status = 2 \
                 AND (?9 IS NULL OR lease_expires_at < ?9)",
            )
            .map(|q| {
                bind_error(q.bind(&id).bind(&attempt).bind(next_at), error).bind(&lease_expired_by)
            })
            .and_then(Query::execute),
        Transition::Snooze { .. } | Transition::Release => {
            let next_at = match transition {
                Transition::Snooze { next_at } => *next_at,
                _ => now,
            };
            conn.query(
                "UPDATE activities SET status = 1, next_at = ?3, uncounted = uncounted + 1, \
                 lease_expires_at = NULL WHERE id = ?1 AND attempt = ?2 AND status = 2 \
                 AND (?4 IS NULL OR lease_expires_at < ?4)",
            )
            .map(|q| {
                q.bind(&id)
                    .bind(&attempt)
                    .bind(&next_at)
                    .bind(&lease_expired_by)
            })
            .and_then(Query::execute)
        }
        Transition::Fail { error } => conn
            .query(
                "UPDATE activities SET status = 4, finished_at = ?3, lease_expires_at = NULL, \
                 error_kind = ?4, error_type = ?5, error_message = ?6, \
                 error_details_type = ?7, error_details = ?8 \
                 WHERE id = ?1 AND attempt = ?2 AND status = 2 \
                 AND (?9 IS NULL OR lease_expires_at < ?9)",
            )
            .map(|q| {
                bind_error(q.bind(&id).bind(&attempt).bind(&now), error).bind(&lease_expired_by)
            })
            .and_then(Query::execute),
    }
    .map_err(sqlite)?;
    Ok(changed == 1)
}

/// Binds an error's five columns: kind, type, message, details type, details.
fn bind_error<'c>(q: Query<'c>, e: &ActivityError) -> Query<'c> {
    q.bind(&i64::from(e.kind))
        .bind(&e.r#type)
        .bind(&e.message)
        .bind(&e.details.as_ref().map(|d| d.content_type.as_str()))
        .bind(&e.details.as_ref().map(|d| d.data.as_slice()))
}

fn cancel(
    conn: &mut Connection,
    key: &Key,
    reason: &str,
    now: UnixMillis,
) -> Result<Outcome, Error> {
    let Some(row) = select_light(conn, key)? else {
        return Ok(Outcome::NotFound);
    };
    if !crate::store::cancellable(row.status) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    let error = cancelled_error(reason);
    let mut q = conn
        .query(concat!(
            "UPDATE activities SET status = 5, finished_at = ?2, lease_expires_at = NULL, \
             error_kind = ?3, error_type = ?4, error_message = ?5, \
             error_details_type = ?6, error_details = ?7 WHERE id = ?1 RETURNING ",
            columns!()
        ))
        .map_err(sqlite)?;
    q = bind_error(q.bind(&row.id).bind(&now), &error);
    let stored = returned(&mut q)?;
    Ok(Outcome::Cancelled {
        prior: row.status,
        row: stored,
    })
}

fn redrive(conn: &mut Connection, key: &Key, now: UnixMillis) -> Result<Outcome, Error> {
    let Some(row) = select_light(conn, key)? else {
        return Ok(Outcome::NotFound);
    };
    if !crate::store::redrivable(row.status) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    // Every attempt so far becomes uncounted: a fresh budget, while `attempt` keeps
    // growing so late results of old attempts stay fenced out. The schedule-to-close
    // window starts again too.
    let mut q = conn
        .query(concat!(
            "UPDATE activities SET status = 1, next_at = ?2, uncounted = attempt, \
             finished_at = NULL, output_type = NULL, output = NULL, expires_at = ?3 \
             WHERE id = ?1 RETURNING ",
            columns!()
        ))
        .map_err(sqlite)?
        .bind(&row.id)
        .bind(&now)
        .bind(&rows::expires_at(now, row.timeouts.schedule_to_close_ms));
    let stored = returned(&mut q)?;
    Ok(Outcome::Redriven { row: stored })
}

/// The row an `UPDATE … RETURNING columns!()` of one row stored.
fn returned(q: &mut Query<'_>) -> Result<ActivityRow, Error> {
    if q.step().map_err(sqlite)? {
        decode(q)
    } else {
        Err(Error::Corrupt(
            "a row read in this transaction was not there to update".to_owned(),
        ))
    }
}

fn record_heartbeats(conn: &mut Connection, beats: &[HeartbeatDetails]) -> Result<u64, Error> {
    let mut recorded = 0;
    for beat in beats {
        recorded += conn
            .query(
                "UPDATE activities SET heartbeat_type = ?3, heartbeat_details = ?4 \
                 WHERE id = ?1 AND attempt = ?2 AND status = 2",
            )
            .map(|q| {
                q.bind(&beat.id)
                    .bind(&i64::from(beat.attempt))
                    .bind(&beat.details.as_ref().map(|d| d.content_type.as_str()))
                    .bind(&beat.details.as_ref().map(|d| d.data.as_slice()))
            })
            .and_then(Query::execute)
            .map_err(sqlite)?;
    }
    Ok(recorded)
}

fn expire_scheduled(conn: &mut Connection, limit: u32, now: UnixMillis) -> Result<Vec<Key>, Error> {
    let error = crate::store::server_error(
        spool_proto::v1::ErrorKind::Timeout,
        "ScheduleToCloseTimeout",
        "schedule_to_close_timeout passed before the activity finished".to_owned(),
    );
    let mut q = conn
        .query(
            "UPDATE activities SET status = 4, finished_at = ?1, \
             error_kind = ?3, error_type = ?4, error_message = ?5, \
             error_details_type = ?6, error_details = ?7 \
             WHERE id IN (SELECT id FROM activities \
               WHERE status = 1 AND expires_at IS NOT NULL AND expires_at <= ?1 LIMIT ?2) \
             RETURNING namespace, workflow_id, activity_id",
        )
        .map_err(sqlite)?;
    q = bind_error(q.bind(&now).bind(&i64::from(limit)), &error);
    let mut keys = Vec::new();
    while q.step().map_err(sqlite)? {
        keys.push(Key {
            namespace: q.text(0)?,
            workflow_id: q.text(1)?,
            activity_id: q.text(2)?,
        });
    }
    Ok(keys)
}

fn select_by_key(conn: &mut Connection, key: &Key) -> Result<Option<ActivityRow>, Error> {
    select_one(
        conn,
        key,
        concat!(
            "SELECT ",
            columns!(),
            " FROM activities WHERE namespace = ?1 AND workflow_id = ?2 AND activity_id = ?3"
        ),
    )
}

/// The row `sql` (a `SELECT` of the `columns!()` shape by key) finds.
fn select_one(
    conn: &mut Connection,
    key: &Key,
    sql: &'static str,
) -> Result<Option<ActivityRow>, Error> {
    let mut q = conn
        .query(sql)
        .map_err(sqlite)?
        .bind(&key.namespace)
        .bind(&key.workflow_id)
        .bind(&key.activity_id);
    if q.step().map_err(sqlite)? {
        decode(&q).map(Some)
    } else {
        Ok(None)
    }
}

/// A row in `columns!()` order.
fn decode(q: &Query<'_>) -> Result<ActivityRow, Error> {
    rows::decode(q)
}

/// The writer's rows, read by position as strictly as the sqlx pools read theirs:
/// a value of the wrong storage class is an error, except a REAL in an integer
/// column, read as the nearest integer, saturating.
impl rows::Columns for Query<'_> {
    fn opt_int(&self, i: usize) -> Result<Option<i64>, Error> {
        let c = column(i)?;
        match self.column_type(c) {
            libsqlite3_sys::SQLITE_NULL => Ok(None),
            libsqlite3_sys::SQLITE_INTEGER => Ok(Some(self.int(c))),
            // `as` saturates at the bounds of i64 (and maps NaN to 0).
            libsqlite3_sys::SQLITE_FLOAT => Ok(Some(self.real(c) as i64)),
            _ => Err(wrong_class(i, "a number")),
        }
    }

    fn real(&self, i: usize) -> Result<f64, Error> {
        let c = column(i)?;
        match self.column_type(c) {
            libsqlite3_sys::SQLITE_INTEGER | libsqlite3_sys::SQLITE_FLOAT => Ok(self.real(c)),
            _ => Err(wrong_class(i, "a number")),
        }
    }

    fn opt_text(&self, i: usize) -> Result<Option<String>, Error> {
        let c = column(i)?;
        match self.column_type(c) {
            libsqlite3_sys::SQLITE_NULL => Ok(None),
            libsqlite3_sys::SQLITE_TEXT => Ok(self.opt_text(c)?),
            _ => Err(wrong_class(i, "text")),
        }
    }

    fn opt_blob(&self, i: usize) -> Result<Option<Vec<u8>>, Error> {
        let c = column(i)?;
        match self.column_type(c) {
            libsqlite3_sys::SQLITE_NULL => Ok(None),
            libsqlite3_sys::SQLITE_BLOB | libsqlite3_sys::SQLITE_TEXT => Ok(self.opt_blob(c)),
            _ => Err(wrong_class(i, "bytes")),
        }
    }
}

fn column(i: usize) -> Result<i32, Error> {
    i32::try_from(i).map_err(|_| Error::Corrupt(format!("no column {i}")))
}

fn wrong_class(i: usize, wanted: &str) -> Error {
    Error::Corrupt(format!("column {i} does not hold {wanted}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Payload, RetrySpec, Timeouts};

    /// A migrated database file in `dir`, and a writing connection to it.
    async fn fresh(dir: &tempfile::TempDir) -> (std::path::PathBuf, Connection) {
        let path = dir.path().join("spool.db");
        let url = format!("sqlite://{}", path.display());
        // Creates and migrates the file; the store's own writer is dropped with it.
        drop(
            super::super::SqliteStore::open(&url)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let conn = Connection::open(&path).unwrap_or_else(|e| panic!("{e}"));
        (path, conn)
    }

    #[tokio::test]
    async fn a_connection_left_in_a_transaction_is_replaced() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (path, mut conn) = fresh(&dir).await;
        // As a failed ROLLBACK would leave it.
        conn.batch("BEGIN IMMEDIATE")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(conn.in_transaction());
        recover(&mut conn, &path);
        assert!(!conn.in_transaction());
        let outcome = run_batch(
            &mut conn,
            &[Op::Prune {
                before: 0,
                limit: 1,
            }],
            0,
        );
        assert!(outcome.is_ok(), "batches run again: {outcome:?}");
    }

    /// Text that is not UTF-8 makes the row unreadable (an error the reads count
    /// and skip), never a silently repaired string.
    #[tokio::test]
    async fn text_that_is_not_utf8_is_an_error_not_a_repair() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (_, mut conn) = fresh(&dir).await;
        let key = Key {
            namespace: "default".into(),
            workflow_id: "wf".into(),
            activity_id: "a".into(),
        };
        let new = NewActivity {
            key: key.clone(),
            activity_type: "t".into(),
            input: Payload::default(),
            next_at: 0,
            retry: RetrySpec {
                max_attempts: 1,
                initial_interval_ms: 1,
                backoff_coefficient: 1.0,
                max_interval_ms: 1,
                non_retryable: Vec::new(),
            },
            timeouts: Timeouts::default(),
            priority: 0,
        };
        run_batch(&mut conn, &[Op::Submit(vec![new])], 0).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            select_by_key(&mut conn, &key)
                .unwrap_or_else(|e| panic!("{e}"))
                .is_some()
        );
        conn.batch("UPDATE activities SET worker_id = CAST(X'C328' AS TEXT)")
            .unwrap_or_else(|e| panic!("{e}"));
        match select_by_key(&mut conn, &key) {
            Err(Error::Corrupt(why)) => assert!(why.contains("UTF-8"), "{why}"),
            other => panic!("expected a corrupt row, got {other:?}"),
        }
    }
}
