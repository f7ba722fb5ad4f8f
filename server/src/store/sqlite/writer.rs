//! The SQLite writer: a thread of its own that owns the one writing connection and
//! runs each batch of ops as one `BEGIN IMMEDIATE` … `COMMIT` transaction
//! (`synchronous=FULL`: durable before the reply is sent).
//!
//! A batch crosses threads once each way (the ops in, the outcomes out); every
//! statement inside runs on this thread against prepared, cached statements.
//!
//! Invariants:
//! - a batch is all or nothing. Any error rolls the whole transaction back and is
//!   returned; nothing of that batch is written. If even the rollback fails and the
//!   connection is left inside a transaction, it is replaced by a fresh one, so one
//!   failure cannot fail every later batch;
//! - the concurrency keys' counts are current for every statement that reads them:
//!   the moves of keyed rows out of RUNNING, which this writer counts itself
//!   ([`KeyMoves`]), are written before any op but an ending, and before `COMMIT`;
//! - its connection's own index of the waiting keyed rows ([`sql::KEYED_WAITING`],
//!   in memory) holds exactly the SCHEDULED rows with a concurrency key: filled
//!   from the file when the connection opens and after a failed `COMMIT`, and
//!   kept by the submit and by triggers in the same transaction as every change
//!   of those rows, which are all made here (the priority aging's re-ranking
//!   included).

use std::{collections::HashMap, path::Path, sync::Arc, thread::JoinHandle};

use spool_proto::time::UnixMillis;
use tokio::sync::oneshot;

use super::{
    raw::{ColumnError, Connection, Query, SqliteError},
    sql,
};
use crate::store::{
    ActivityRow, ActivityStatus, Attempt, Claim, Error, Fairness, HeartbeatDetails, Key,
    NewActivity, Op, Outcome, Transition,
    change::{self, Conflict, Ending, Entry, Found},
    concurrency, fairness, rate,
    rows::{self, encode_list},
};

mod claims;
mod endings;
mod settings;

use claims::claim_rows;
use endings::*;
use settings::*;

enum Job {
    Batch {
        ops: Arc<[Op]>,
        now: UnixMillis,
        reply: oneshot::Sender<Result<Vec<Outcome>, Error>>,
    },
    /// Sets the priority aging (ms), starting a re-ranking pass if it changed.
    PriorityAging {
        per_level_ms: i64,
        reply: oneshot::Sender<Result<bool, Error>>,
    },
}

/// The writer thread's name, as tools that measure its CPU look for it.
pub const WRITER_THREAD: &str = "spool-sqlite-writer";

/// Where a keyed claim's `RETURNING` puts `claim_band` (then `claim_rank`), after
/// the row's columns.
const CLAIM_BAND: std::ffi::c_int = rows::COLUMNS as std::ffi::c_int;

pub struct Writer {
    /// To the writer thread; dropping it (with the `Writer`) ends the thread.
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Opens the writing connection on `path` (migrated already) and starts the thread.
    pub fn start(path: &Path) -> Result<Self, Error> {
        let mut conn = open(path)?;
        let (jobs, inbox) = std::sync::mpsc::channel::<Job>();
        let reopen_path = path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name(WRITER_THREAD.to_owned())
            .spawn(move || {
                while let Ok(job) = inbox.recv() {
                    let conn = &mut conn;
                    let path = &reopen_path;
                    match job {
                        Job::Batch { ops, now, reply } => {
                            let _ = reply.send(run(conn, path, |c| run_batch(c, &ops, now)));
                        }
                        Job::PriorityAging {
                            per_level_ms,
                            reply,
                        } => {
                            let _ = reply
                                .send(run(conn, path, |c| set_priority_aging(c, per_level_ms)));
                        }
                    }
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
        self.send(Job::Batch { ops, now, reply })?;
        outcome.await.map_err(|_| gone())?
    }

    /// Stores the priority aging, `per_level_ms` a level: whether that changed it.
    pub async fn set_priority_aging(&self, per_level_ms: i64) -> Result<bool, Error> {
        let (reply, outcome) = oneshot::channel();
        self.send(Job::PriorityAging {
            per_level_ms,
            reply,
        })?;
        outcome.await.map_err(|_| gone())?
    }

    fn send(&self, job: Job) -> Result<(), Error> {
        self.jobs
            .as_ref()
            .ok_or_else(gone)?
            .send(job)
            .map_err(|_| gone())
    }
}

fn gone() -> Error {
    Error::Corrupt("the SQLite writer thread has stopped".to_owned())
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

/// Runs one job's transaction on the connection, and [`recover`]s if it failed.
fn run<T>(
    conn: &mut Connection,
    path: &Path,
    job: impl FnOnce(&mut Connection) -> Result<T, Error>,
) -> Result<T, Error> {
    let result = job(conn);
    if result.is_err() {
        recover(conn, path);
    }
    result
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
    reopen(conn, path);
}

fn reopen(conn: &mut Connection, path: &Path) {
    match open(path) {
        Ok(fresh) => *conn = fresh,
        Err(e) => tracing::error!(error = %e, "cannot reopen the writing connection"),
    }
}

/// Opens the writing connection, with its own index of the keyed waiting rows
/// ([`sql::KEYED_WAITING`]) built from the rows.
fn open(path: &Path) -> Result<Connection, Error> {
    let mut conn = Connection::open(path).map_err(sqlite)?;
    conn.batch(sql::KEYED_WAITING).map_err(sqlite)?;
    conn.batch(sql::KEYED_WAITING_FILL).map_err(sqlite)?;
    Ok(conn)
}

impl From<ColumnError> for Error {
    fn from(e: ColumnError) -> Self {
        match e {
            ColumnError::NotUtf8 { .. } => Error::Corrupt(e.to_string()),
            ColumnError::Sqlite(e) => sqlite(e),
        }
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
    let mut moves = KeyMoves::default();
    let result = apply_all(conn, ops, now, &mut moves).and_then(|outcomes| {
        moves.write(conn)?;
        commit(conn)?;
        Ok(outcomes)
    });
    if result.is_err() {
        rollback(conn);
    }
    result
}

/// Commits the writer's transaction. The database in memory that holds the index
/// of keyed waiting rows commits apart from the file: after a `COMMIT` that
/// failed, the index is built again from the rows rather than trusted.
fn commit(conn: &mut Connection) -> Result<(), Error> {
    let Err(failed) = conn.query("COMMIT").and_then(|q| q.execute()) else {
        return Ok(());
    };
    rollback(conn);
    if !conn.in_transaction()
        && let Err(e) = conn.batch(sql::KEYED_WAITING_FILL)
    {
        tracing::error!(error = %e, "cannot rebuild the index of keyed waiting rows");
    }
    Err(sqlite(failed))
}

/// Rolls back what is left of a failed transaction. SQLite rolls some failures
/// back by itself (a full disk, for one): then there is nothing left to roll
/// back. The caller checks whether the connection is still inside a transaction.
fn rollback(conn: &mut Connection) {
    if conn.in_transaction()
        && let Err(e) = conn.query("ROLLBACK").and_then(|q| q.execute())
    {
        tracing::error!(error = %e, "ROLLBACK failed");
    }
}

/// Moves of keyed rows out of RUNNING, counted per key and written once per key
/// before anything reads the counts (see the `0014_keyed_endings` migration).
#[derive(Default)]
struct KeyMoves {
    /// (namespace, type, key) → (rows ended, of which waiting again).
    keys: HashMap<(String, String, String), (i64, i64)>,
}

impl KeyMoves {
    fn record(&mut self, namespace: String, activity_type: String, key: String, waits: bool) {
        let moved = self
            .keys
            .entry((namespace, activity_type, key))
            .or_default();
        moved.0 += 1;
        moved.1 += i64::from(waits);
    }

    fn write(&mut self, conn: &mut Connection) -> Result<(), Error> {
        for (of, (ended, back)) in self.keys.drain() {
            fn bind<'c>(q: Query<'c>, of: &(String, String, String), ended: i64) -> Query<'c> {
                q.bind(of.0.as_str())
                    .bind(of.1.as_str())
                    .bind(of.2.as_str())
                    .bind(&ended)
            }
            if back > 0 {
                conn.run(sql::KEY_ENDED_WAITING, |q| bind(q, &of, ended).bind(&back))
                    .map_err(sqlite)?;
                continue;
            }
            // The common case is one update of the key's row; a key left with
            // nothing goes, unless it keeps a bucket.
            for statement in [sql::KEY_ENDED, sql::KEY_IDLE, sql::KEY_ENDED_ALL] {
                let changed = conn
                    .run(statement, |q| bind(q, &of, ended))
                    .map_err(sqlite)?;
                if changed > 0 {
                    break;
                }
            }
        }
        Ok(())
    }
}

/// Applies `ops` in order, each answered in its place; a run of alike endings
/// shares one statement.
fn apply_all(
    conn: &mut Connection,
    ops: &[Op],
    now: UnixMillis,
    moves: &mut KeyMoves,
) -> Result<Vec<Outcome>, Error> {
    let mut outcomes = Vec::with_capacity(ops.len());
    let mut rest = ops;
    while let Some(op) = rest.first() {
        let alike = alike_endings_ahead(rest, now);
        if alike > 1 {
            finish_many(conn, &rest[..alike], now, moves, &mut outcomes)?;
            rest = &rest[alike..];
            continue;
        }
        // Every other op may read the keys' counts: they are brought up to date
        // first.
        if !matches!(op, Op::Finish { .. }) {
            moves.write(conn)?;
        }
        outcomes.push(apply_one(conn, op, now, moves)?);
        rest = &rest[1..];
    }
    Ok(outcomes)
}

fn apply_one(
    conn: &mut Connection,
    op: &Op,
    now: UnixMillis,
    moves: &mut KeyMoves,
) -> Result<Outcome, Error> {
    match op {
        Op::Submit(batch) => submit(conn, batch, now),
        Op::Claim(claim) => claim_rows(conn, claim, now),
        Op::Finish {
            attempt,
            transition,
            lease_expired_by,
        } => finish(conn, attempt, transition, *lease_expired_by, now, moves),
        Op::Cancel { key, reason } => cancel(conn, key, reason, now, moves),
        Op::Redrive { key } => redrive(conn, key, now),
        Op::EnforceConcurrency {
            namespace,
            activity_type,
            keys,
        } => enforce(conn, namespace, activity_type, keys, now, moves),
        Op::Setting(change) => write_setting(conn, change.write(&sql::SETTINGS)),
        Op::Prune { before, limit } => prune(conn, *before, *limit, now).map(Outcome::Pruned),
        Op::Rerank { ids } => rerank(conn, *ids).map(Outcome::Reranked),
        Op::Renew {
            attempts,
            lease_expires_at,
        } => renew(conn, attempts, *lease_expires_at).map(Outcome::Renewed),
        Op::RecordHeartbeats(beats) => record_heartbeats(conn, beats).map(Outcome::Recorded),
        Op::ExpireScheduled { limit } => expire_scheduled(conn, *limit, now).map(Outcome::Expired),
    }
}

/// All or nothing without a savepoint (which would copy every page it touches into
/// a sub-journal): every key is looked up and settled first, and only a batch
/// without a conflict inserts. Nothing else writes between the lookups and the
/// inserts: this is the one writer, inside one transaction.
fn submit(conn: &mut Connection, batch: &[NewActivity], now: UnixMillis) -> Result<Outcome, Error> {
    // One activity (the common case) is inserted first, one statement when its key
    // is new, and answered with its stored row whole when it is not; a batch is
    // answered without payloads, so naming one large stored row many times costs
    // no memory.
    let single = batch.len() == 1;
    let settled = change::settle(batch, |new| {
        if single && let Some(id) = insert(conn, new, now)? {
            return Ok(Found::Inserted(id));
        }
        let lookup = if single {
            sql::SELECT_BY_KEY
        } else {
            sql::SELECT_LIGHT_BY_KEY
        };
        Ok::<_, Error>(match select_one(conn, &new.key, lookup)? {
            Some(row) => Found::Existing(Box::new(row)),
            None if single => {
                return Err(Error::Corrupt(format!(
                    "{:?} conflicted on insert but cannot be read",
                    new.key
                )));
            }
            None => Found::Absent,
        })
    })?;
    let mut entries = match settled {
        Ok(entries) => entries,
        Err(Conflict {
            index,
            existing_type,
        }) => {
            return Ok(Outcome::Conflict {
                index,
                existing_type,
            });
        }
    };
    for (new, entry) in batch.iter().zip(entries.iter_mut()) {
        if let Entry::Insert = entry {
            let id = insert(conn, new, now)?.ok_or_else(|| {
                Error::Corrupt(format!("{:?} appeared during its own batch", new.key))
            })?;
            *entry = Entry::Created(id);
        }
    }
    change::submitted(batch, entries, now).map(Outcome::Submitted)
}

/// Inserts one activity unless its key exists; the new row's id.
fn insert(conn: &mut Connection, new: &NewActivity, now: UnixMillis) -> Result<Option<i64>, Error> {
    let fair_at = match &new.fairness {
        // A stored key is not submitted again, and must not move its chain.
        Some(_) if exists(conn, &new.key)? => return Ok(None),
        Some(fairness) => Some(place(conn, new, fairness, now)?),
        None => None,
    };
    let non_retryable = encode_list(&new.retry.non_retryable);
    let mut q = conn
        .query(sql::INSERT)
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
        .bind(&change::expires_at(now, new.timeouts.schedule_to_close_ms))
        .bind(&rows::encode_headers(&new.headers))
        .bind(&new.concurrency_key.as_deref())
        .bind(&new.fairness.as_ref().map(|f| f.key.as_str()))
        .bind(&fair_at);
    let id = if q.step().map_err(sqlite)? {
        Some(q.int(0))
    } else {
        None
    };
    drop(q);
    // Here rather than by a trigger, which would run for every row inserted.
    if let (Some(id), Some(_)) = (id, &new.concurrency_key) {
        conn.query(sql::KEYED_WAITING_ADD)
            .map_err(sqlite)?
            .bind(&id)
            .execute()
            .map_err(sqlite)?;
    }
    Ok(id)
}

/// Whether the activity `key` names is stored.
fn exists(conn: &mut Connection, key: &Key) -> Result<bool, Error> {
    conn.query(sql::EXISTS_BY_KEY)
        .map_err(sqlite)?
        .bind(&key.namespace)
        .bind(&key.workflow_id)
        .bind(&key.activity_id)
        .step()
        .map_err(sqlite)
}

/// Moves the chain of a new row's fairness key on by the row, and answers the
/// row's `fair_at` (see `store::fairness`).
fn place(
    conn: &mut Connection,
    new: &NewActivity,
    fairness: &Fairness,
    now: UnixMillis,
) -> Result<i64, Error> {
    let mut q = conn
        .query(sql::FAIR_PLACE)
        .map_err(sqlite)?
        .bind(&new.key.namespace)
        .bind(&new.activity_type)
        .bind(fairness.key.as_str())
        .bind(&now)
        .bind(&fairness::stride_us(fairness.weight))
        .bind(&i64::from(new.priority))
        .bind(&new.concurrency_key.as_deref());
    if !q.step().map_err(sqlite)? {
        return Err(Error::Corrupt(
            "a fairness key's chain was not returned".to_owned(),
        ));
    }
    Ok(fairness::fair_at(q.int(0), new.next_at, now))
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
            // The type is read once: `raw::Query::opt_text` would read it again.
            libsqlite3_sys::SQLITE_TEXT => Ok(Some(self.utf8(c)?)),
            _ => Err(wrong_class(i, "text")),
        }
    }

    fn opt_blob(&self, i: usize) -> Result<Option<Vec<u8>>, Error> {
        let c = column(i)?;
        match self.column_type(c) {
            libsqlite3_sys::SQLITE_NULL => Ok(None),
            libsqlite3_sys::SQLITE_BLOB | libsqlite3_sys::SQLITE_TEXT => {
                Ok(Some(self.bytes(c, false)?))
            }
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
mod tests;
