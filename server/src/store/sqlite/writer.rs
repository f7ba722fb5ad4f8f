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
    ActivityRow, ActivityStatus, Claim, Error, Fairness, HeartbeatDetails, Key, NewActivity, Op,
    Outcome,
    change::{self, Conflict, Ending, Entry, Found},
    concurrency, fairness, rate,
    rows::{self, encode_list},
};

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

/// [`Writer::set_priority_aging`], in one transaction.
fn set_priority_aging(conn: &mut Connection, per_level_ms: i64) -> Result<bool, Error> {
    let run = |conn: &mut Connection| -> Result<bool, Error> {
        conn.query("BEGIN IMMEDIATE")
            .and_then(Query::execute)
            .map_err(sqlite)?;
        let changed = conn
            .query(sql::SET_PRIORITY_AGING)
            .map(|q| q.bind(&per_level_ms))
            .and_then(Query::execute)
            .map_err(sqlite)?;
        commit(conn)?;
        Ok(changed > 0)
    };
    let result = run(conn);
    if result.is_err() {
        rollback(conn);
    }
    result
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
    let result = ops
        .iter()
        .map(|op| {
            // Every other op may read the keys' counts: they are brought up to date
            // first.
            if !matches!(op, Op::Finish { .. }) {
                moves.write(conn)?;
            }
            apply_one(conn, op, now, &mut moves)
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|outcomes| {
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
                conn.query(sql::KEY_ENDED_WAITING)
                    .map(|q| bind(q, &of, ended).bind(&back))
                    .and_then(Query::execute)
                    .map_err(sqlite)?;
                continue;
            }
            // The common case is one update of the key's row; a key left with
            // nothing goes, unless it keeps a bucket.
            for statement in [sql::KEY_ENDED, sql::KEY_IDLE, sql::KEY_ENDED_ALL] {
                let changed = conn
                    .query(statement)
                    .map(|q| bind(q, &of, ended))
                    .and_then(Query::execute)
                    .map_err(sqlite)?;
                if changed > 0 {
                    break;
                }
            }
        }
        Ok(())
    }
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
        } => {
            let ending = Ending::of(transition, now);
            let statement = match ending.status {
                ActivityStatus::Scheduled => sql::FINISH_AGAIN,
                _ if lean(&ending) => sql::FINISH_LEAN,
                _ => sql::FINISH,
            };
            let q = conn.query(statement).map_err(sqlite)?;
            let changed = bind_ending(q, &ending)
                .bind(&attempt.id)
                .bind(&i64::from(attempt.attempt))
                .bind(lease_expired_by)
                .bind(&attempt.owner_node.as_deref())
                .execute()
                .map_err(sqlite)?;
            let accepted = changed == 1;
            // The row was RUNNING with this attempt, so its key is the attempt's.
            if accepted && let Some(key) = &attempt.concurrency_key {
                moves.record(
                    attempt.key.namespace.clone(),
                    attempt.activity_type.clone(),
                    key.to_string(),
                    ending.status == ActivityStatus::Scheduled,
                );
            }
            Ok(Outcome::Finished { accepted })
        }
        Op::Cancel { key, reason } => cancel(conn, key, reason, now, moves),
        Op::Redrive { key } => redrive(conn, key, now),
        Op::SetRateLimit(limit) => {
            let statement = match limit.key {
                None => sql::SET_RATE_LIMIT,
                Some(_) => sql::SET_KEY_RATE_LIMIT,
            };
            let q = conn
                .query(statement)
                .map_err(sqlite)?
                .bind(limit.namespace.as_str())
                .bind(limit.activity_type.as_str())
                .bind(&i64::from(limit.per_period))
                .bind(&limit.period_ms())
                .bind(&i64::from(limit.burst))
                .bind(&limit.interval_ns());
            match &limit.key {
                None => q,
                Some(key) => q.bind(key.as_str()),
            }
            .execute()
            .map(|_| Outcome::RateLimitSet)
            .map_err(sqlite)
        }
        Op::SetConcurrencyLimit {
            namespace,
            activity_type,
            max_running,
            strategy,
        } => conn
            .query(sql::SET_CONCURRENCY_LIMIT)
            .map(|q| {
                q.bind(namespace.as_str())
                    .bind(activity_type.as_str())
                    .bind(&i64::from(*max_running))
                    .bind(&strategy.code())
            })
            .and_then(Query::execute)
            .map(|_| Outcome::ConcurrencyLimitSet)
            .map_err(sqlite),
        Op::EnforceConcurrency {
            namespace,
            activity_type,
            keys,
        } => enforce(conn, namespace, activity_type, keys, now, moves),
        Op::SetKeyLimit {
            namespace,
            activity_type,
            key,
            max_running,
            weight,
        } => conn
            .query(sql::SET_KEY_LIMIT)
            .map(|q| {
                q.bind(namespace.as_str())
                    .bind(activity_type.as_str())
                    .bind(key.as_str())
                    .bind(&max_running.map(i64::from))
                    .bind(&i64::from(*weight))
            })
            .and_then(Query::execute)
            .map(|_| Outcome::ConcurrencyLimitSet)
            .map_err(sqlite),
        Op::RemoveConcurrencyLimit {
            namespace,
            activity_type,
            key,
        } => {
            let statement = match key {
                None => sql::REMOVE_CONCURRENCY_LIMIT,
                Some(_) => sql::REMOVE_KEY_LIMIT,
            };
            remove(conn, statement, namespace, activity_type, key.as_deref())
                .map(Outcome::ConcurrencyLimitRemoved)
        }
        Op::SetFairnessWeight(set) => conn
            .query(sql::SET_FAIRNESS_WEIGHT)
            .map(|q| {
                q.bind(set.namespace.as_str())
                    .bind(set.activity_type.as_str())
                    .bind(set.key.as_str())
                    .bind(&i64::from(set.weight))
            })
            .and_then(Query::execute)
            .map(|_| Outcome::FairnessWeightSet)
            .map_err(sqlite),
        Op::RemoveFairnessWeight {
            namespace,
            activity_type,
            key,
        } => remove(
            conn,
            sql::REMOVE_FAIRNESS_WEIGHT,
            namespace,
            activity_type,
            Some(key),
        )
        .map(Outcome::FairnessWeightRemoved),
        Op::RemoveRateLimit {
            namespace,
            activity_type,
            key,
        } => {
            let statement = match key {
                None => sql::REMOVE_RATE_LIMIT,
                Some(_) => sql::REMOVE_KEY_RATE_LIMIT,
            };
            remove(conn, statement, namespace, activity_type, key.as_deref())
                .map(Outcome::RateLimitRemoved)
        }
        Op::Prune { before, limit } => {
            let pruned = conn
                .query(sql::PRUNE)
                .map(|q| q.bind(before).bind(&i64::from(*limit)))
                .and_then(Query::execute)
                .map_err(sqlite)?;
            // And the chains of fairness keys no row can be placed by any more.
            conn.query(sql::SWEEP_FAIRNESS)
                .map(|q| q.bind(&now))
                .and_then(Query::execute)
                .map_err(sqlite)?;
            Ok(Outcome::Pruned(pruned))
        }
        Op::Rerank { ids } => rerank(conn, *ids).map(Outcome::Reranked),
        Op::Renew {
            attempts,
            lease_expires_at,
        } => {
            let mut renewed = Vec::with_capacity(attempts.len());
            for &(id, attempt) in attempts {
                let changed = conn
                    .query(sql::RENEW)
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

/// One step of the re-ranking pass, if one is left: the next `ids` ids.
fn rerank(conn: &mut Connection, ids: u32) -> Result<Option<crate::store::Reranked>, Error> {
    let pending = {
        let mut q = conn.query(sql::RERANK_PENDING).map_err(sqlite)?;
        if q.step().map_err(sqlite)? {
            Some((q.int(0), q.int(1)))
        } else {
            None
        }
    };
    let Some((after, to)) = pending else {
        return Ok(None);
    };
    let upto = after.saturating_add(i64::from(ids)).min(to);
    let rows = conn
        .query(sql::RERANK_RANGE)
        .map(|q| q.bind(&after).bind(&upto))
        .and_then(Query::execute)
        .map_err(sqlite)?;
    conn.query(sql::RERANK_MOVE)
        .map(|q| q.bind(&upto))
        .and_then(Query::execute)
        .map_err(sqlite)?;
    Ok(Some(crate::store::Reranked {
        rows,
        done: upto >= to,
    }))
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

fn claim_rows(conn: &mut Connection, claim: &Claim, now: UnixMillis) -> Result<Outcome, Error> {
    let now_ns = rate::nanos(now);
    let mut claimed = Vec::new();
    let mut throttled = Vec::new();
    for activity_type in &claim.activity_types {
        let Some(asked) = claim.left_after(claimed.len()) else {
            break;
        };
        let bucket = bucket(conn, &claim.namespace, activity_type)?;
        let left = bucket.map_or(asked, |b| asked.min(b.available(now_ns)));
        let before = claimed.len();
        let of = Of {
            claim,
            activity_type,
            now,
        };
        // Rows with a concurrency key first, the keys with room by weight, then
        // the rest (see the `0009_concurrency_keys` and `0012_key_shares`
        // migrations).
        if left > 0 {
            claim_keyed(conn, &of, left, &mut claimed)?;
        }
        let taken = i64::try_from(claimed.len() - before).unwrap_or(i64::MAX);
        if left > taken {
            claim_unkeyed(conn, &of, left - taken, &mut claimed)?;
        }
        let taken = i64::try_from(claimed.len() - before).unwrap_or(i64::MAX);
        let mut refill = None;
        if let Some(bucket) = bucket {
            let spent = bucket.take(now_ns, taken);
            if taken > 0 {
                conn.query(sql::SPEND)
                    .map(|q| {
                        q.bind(&*claim.namespace)
                            .bind(&**activity_type)
                            .bind(&spent.tat_ns)
                    })
                    .and_then(Query::execute)
                    .map_err(sqlite)?;
            }
            refill = spent.refills_at(now_ns);
        }
        // Held back: fewer rows than asked, and none left in the type's bucket or
        // in a waiting key's.
        if taken < asked {
            let key = key_refill(conn, &claim.namespace, activity_type, now)?;
            let key = key.and_then(|at| rate::refill_millis(at, now_ns));
            if let Some(at) = refill.into_iter().chain(key).min() {
                throttled.push((activity_type.clone(), at));
            }
        }
    }
    Ok(Outcome::Claimed {
        rows: claimed,
        throttled,
    })
}

/// Claims up to `left` due rows of the concurrency keys of a type with room onto
/// `claimed`: a share each by weight, lowest pass first, then counts what each
/// key was given and moves its pass on.
fn claim_keyed(
    conn: &mut Connection,
    of: &Of<'_>,
    left: i64,
    claimed: &mut Vec<ActivityRow>,
) -> Result<(), Error> {
    let keys = ready_keys(conn, &of.claim.namespace, of.activity_type, left, of.now)?;
    if keys.is_empty() {
        return Ok(());
    }
    let total: i64 = keys.iter().map(|k| k.weight).sum();
    let count = keys.len();
    let shares: Vec<i64> = keys
        .iter()
        .map(|k| concurrency::share(left, k.weight, total, k.room))
        .collect();
    let mut given = HashMap::new();
    let before = claimed.len();
    if count > 1 && shares.iter().all(|&s| s == 1) {
        // A row each, from as many keys as there are slots: one statement.
        let names: Vec<&str> = keys.iter().map(|k| k.key.as_str()).collect();
        let names = serde_json::to_string(&names)
            .map_err(|e| Error::Corrupt(format!("concurrency keys: {e}")))?;
        let rows = Rows::OneOfEach(&names);
        run_claim(conn, of, left, rows, claimed, &mut given)?;
    } else {
        for (k, share) in keys.iter().zip(shares) {
            let taken = i64::try_from(claimed.len() - before).unwrap_or(i64::MAX);
            let limit = share.min(left - taken);
            if limit <= 0 {
                break;
            }
            let rows = Rows::OfKey(&k.key);
            run_claim(conn, of, limit, rows, claimed, &mut given)?;
        }
    }
    // One statement a key served (the claim's own rows are not counted by a
    // trigger, see the `0012_key_shares` migration).
    let taken: i64 = given.values().sum();
    for k in &keys {
        let rows = given.get(&k.key).copied().unwrap_or(0);
        // A key that gave nothing though the claim had room has no due row: it
        // moves on a stride all the same, so that keys with due rows come first.
        let strides = match rows {
            0 if taken < left => 1,
            0 => continue,
            rows => rows,
        };
        conn.query(sql::SERVE_KEY)
            .map(|q| {
                q.bind(&*of.claim.namespace)
                    .bind(of.activity_type)
                    .bind(k.key.as_str())
                    .bind(&rows)
                    .bind(&(strides * concurrency::stride(k.weight)))
                    .bind(&k.interval_ns)
                    .bind(&rate::nanos(of.now))
            })
            .and_then(Query::execute)
            .map_err(sqlite)?;
    }
    Ok(())
}

/// The type a claim is taking rows of, for whom, and when.
struct Of<'a> {
    claim: &'a Claim,
    activity_type: &'a str,
    now: UnixMillis,
}

/// Which rows of a type with concurrency keys a claim statement takes.
enum Rows<'a> {
    /// Those of one key.
    OfKey(&'a str),
    /// One of each key in this JSON array.
    OneOfEach(&'a str),
}

/// Claims up to `limit` due rows of one type without a concurrency key onto
/// `claimed`, in claim order: picked in one read, then taken one by one
/// (`sql::CLAIM_PICK`).
fn claim_unkeyed(
    conn: &mut Connection,
    of: &Of<'_>,
    limit: i64,
    claimed: &mut Vec<ActivityRow>,
) -> Result<(), Error> {
    let Of {
        claim,
        activity_type,
        now,
    } = *of;
    // Each row boxed as it is read: a row is large, and a vector of rows grown
    // one doubling at a time copies every row it holds at each step (5 % of the
    // writer's instructions in a drain); the claimed rows then get their room
    // at once, now that their number is known.
    let mut picked = Vec::new();
    {
        let mut q = conn
            .query(sql::CLAIM_PICK)
            .map_err(sqlite)?
            .bind(&now)
            .bind(&*claim.namespace)
            .bind(activity_type)
            .bind(&limit);
        while q.step().map_err(sqlite)? {
            picked.push((q.int(0), decode(&q).map(Box::new)));
        }
    }
    claimed.reserve(picked.len());
    for (id, row) in picked {
        let taken = conn
            .query(sql::CLAIM_ROW)
            .map(|q| {
                q.bind(&now)
                    .bind(&*claim.worker_id)
                    .bind(&claim.lease_expires_at)
                    .bind(&*claim.identity)
                    .bind(&*claim.node)
                    .bind(&id)
            })
            .and_then(Query::execute)
            .map_err(sqlite)?;
        if taken == 0 {
            return Err(Error::Corrupt(format!(
                "row {id} was picked as due and could not be claimed"
            )));
        }
        // An unreadable row stays RUNNING, undelivered, until its lease lapses;
        // it must not stop every other claim. A read that failed (out of memory)
        // fails the batch instead, to be tried again.
        match row.and_then(|row| claimed_as(*row, claim, now)) {
            Ok(row) => claimed.push(row),
            Err(e) if e.class() == crate::store::Class::Transient => return Err(e),
            Err(e) => rows::unreadable("claim", Some(id), &e),
        }
    }
    Ok(())
}

/// A row read before [`sql::CLAIM_ROW`] as that update left it.
fn claimed_as(mut row: ActivityRow, claim: &Claim, now: UnixMillis) -> Result<ActivityRow, Error> {
    row.attempt = row
        .attempt
        .checked_add(1)
        .ok_or_else(|| Error::Corrupt(format!("row {} has run too many attempts", row.id)))?;
    row.status = ActivityStatus::Running;
    row.started_at = Some(now);
    row.worker_id = Some(claim.worker_id.to_string());
    row.lease_expires_at = Some(claim.lease_expires_at);
    Ok(row)
}

/// Claims up to `limit` due rows of one type's concurrency keys onto `claimed`,
/// counting them by key in `given`.
fn run_claim(
    conn: &mut Connection,
    of: &Of<'_>,
    limit: i64,
    rows: Rows<'_>,
    claimed: &mut Vec<ActivityRow>,
    given: &mut HashMap<String, i64>,
) -> Result<(), Error> {
    let Of {
        claim,
        activity_type,
        now,
    } = *of;
    let (statement, key) = match rows {
        Rows::OfKey(key) => (sql::CLAIM_KEYED, key),
        Rows::OneOfEach(keys) => (sql::CLAIM_KEYED_ROUND, keys),
    };
    let mut q = conn
        .query(statement)
        .map_err(sqlite)?
        .bind(&now)
        .bind(&*claim.worker_id)
        .bind(&claim.lease_expires_at)
        .bind(&*claim.namespace)
        .bind(activity_type)
        .bind(&limit)
        .bind(&*claim.identity)
        .bind(&*claim.node)
        .bind(key);
    // The update returns its rows in the table's order; they are sent in the
    // order returned, so put them in claim order (band, rank, id).
    let mut taken = Vec::new();
    while q.step().map_err(sqlite)? {
        // Every row claimed is counted, readable or not (a key that is not UTF-8
        // cannot be submitted).
        if let Ok(Some(key)) = rows::Columns::opt_text(&q, rows::col::CONCURRENCY_KEY) {
            *given.entry(key).or_default() += 1;
        }
        // An unreadable row stays RUNNING, undelivered, until its lease lapses; it
        // must not stop every other claim.
        match decode(&q) {
            Ok(row) => {
                let order = (q.int(CLAIM_BAND), q.int(CLAIM_BAND + 1), row.id);
                taken.push((order, row));
            }
            Err(e) if e.class() == crate::store::Class::Transient => return Err(e),
            Err(e) => rows::unreadable("claim", Some(q.int(0)), &e),
        }
    }
    taken.sort_by_key(|(order, _)| *order);
    claimed.extend(taken.into_iter().map(|(_, row)| row));
    Ok(())
}

/// Deletes a limit of a namespace's type (with `key`, of that key) with
/// `statement`; true when there was one.
fn remove(
    conn: &mut Connection,
    statement: &'static str,
    namespace: &str,
    activity_type: &str,
    key: Option<&str>,
) -> Result<bool, Error> {
    let q = conn
        .query(statement)
        .map_err(sqlite)?
        .bind(namespace)
        .bind(activity_type);
    match key {
        None => q,
        Some(key) => q.bind(key),
    }
    .execute()
    .map(|removed| removed > 0)
    .map_err(sqlite)
}

/// A concurrency key ready to be served.
struct ReadyKey {
    key: String,
    room: i64,
    weight: i64,
    /// Its own bucket's, if it has one.
    interval_ns: Option<i64>,
}

/// The concurrency keys of a namespace's type with rows waiting, room to run more
/// and tokens in their own bucket at `now`, lowest pass first (at most `limit`).
fn ready_keys(
    conn: &mut Connection,
    namespace: &str,
    activity_type: &str,
    limit: i64,
    now: UnixMillis,
) -> Result<Vec<ReadyKey>, Error> {
    let mut q = conn
        .query(sql::READY_KEYS)
        .map_err(sqlite)?
        .bind(namespace)
        .bind(activity_type)
        .bind(&limit)
        .bind(&now);
    let mut keys = Vec::new();
    while q.step().map_err(sqlite)? {
        let key = q.text(0)?;
        keys.push(ReadyKey {
            key,
            room: q.int(1),
            weight: q.int(2),
            interval_ns: rows::Columns::opt_int(&q, 3)?,
        });
    }
    Ok(keys)
}

/// When (nanoseconds) a key of a namespace's type held back by its own rate limit
/// has a token again, after `now`.
fn key_refill(
    conn: &mut Connection,
    namespace: &str,
    activity_type: &str,
    now: UnixMillis,
) -> Result<Option<i64>, Error> {
    let mut q = conn
        .query(sql::KEY_REFILL)
        .map_err(sqlite)?
        .bind(namespace)
        .bind(activity_type)
        .bind(&now);
    Ok(if q.step().map_err(sqlite)? {
        rows::Columns::opt_int(&q, 0)?
    } else {
        None
    })
}

/// The rate limit bucket of a namespace's type, if it has one.
fn bucket(
    conn: &mut Connection,
    namespace: &str,
    activity_type: &str,
) -> Result<Option<rate::Bucket>, Error> {
    let mut q = conn
        .query(sql::BUCKET)
        .map_err(sqlite)?
        .bind(namespace)
        .bind(activity_type);
    Ok(if q.step().map_err(sqlite)? {
        Some(rate::Bucket {
            interval_ns: q.int(0).max(1),
            burst: q.int(1).max(1),
            tat_ns: q.int(2),
        })
    } else {
        None
    })
}

/// Whether `sql::FINISH_LEAN` writes what `sql::FINISH` would: the ending keeps
/// `next_at` (and so the row's place in claim order) and the last error, and
/// adds nothing to `uncounted`. Every completion does; the shorter statement
/// leaves out the `CASE`s that would only keep what is stored.
fn lean(e: &Ending<'_>) -> bool {
    e.next_at.is_none() && e.error.is_none() && e.uncounted == 0
}

/// Binds an ending's values as `?1`…`?14`, the order of `sql::ending!`.
fn bind_ending<'c>(q: Query<'c>, e: &Ending<'_>) -> Query<'c> {
    let (output_type, output) = e.output_columns();
    let error = e.error;
    let details = error.and_then(|e| e.details.as_ref());
    q.bind(&(e.status as i64))
        .bind(&e.next_at)
        .bind(&e.finished_at)
        .bind(&e.uncounted)
        .bind(&output_type)
        .bind(&output)
        .bind(&i64::from(error.is_some()))
        .bind(&error.map(|e| i64::from(e.kind)))
        .bind(&error.map(|e| e.r#type.as_str()))
        .bind(&error.map(|e| e.message.as_str()))
        .bind(&details.map(|d| d.content_type.as_str()))
        .bind(&details.map(|d| d.data.as_slice()))
        .bind(&e.outcome.name())
        .bind(&e.ended_at)
}

fn cancel(
    conn: &mut Connection,
    key: &Key,
    reason: &str,
    now: UnixMillis,
    moves: &mut KeyMoves,
) -> Result<Outcome, Error> {
    let Some(row) = select_one(conn, key, sql::SELECT_LIGHT_BY_KEY)? else {
        return Ok(Outcome::NotFound);
    };
    if !crate::store::cancellable(row.status) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    let error = change::cancelled_error(reason);
    let ending = Ending::finished(ActivityStatus::Cancelled, now, Some(&error));
    let q = conn.query(sql::CANCEL).map_err(sqlite)?;
    let mut q = bind_ending(q, &ending).bind(&row.id);
    let stored = returned(&mut q)?;
    drop(q);
    // A running row's key is counted here and now: the caller may read the counts
    // next (the trigger counts a waiting row's).
    if row.status == ActivityStatus::Running
        && let Some(key) = &stored.concurrency_key
    {
        moves.record(
            stored.key.namespace.clone(),
            stored.activity_type.clone(),
            key.clone(),
            false,
        );
        moves.write(conn)?;
    }
    Ok(Outcome::Cancelled {
        prior: row.status,
        row: stored,
    })
}

fn redrive(conn: &mut Connection, key: &Key, now: UnixMillis) -> Result<Outcome, Error> {
    let Some(row) = select_one(conn, key, sql::SELECT_LIGHT_BY_KEY)? else {
        return Ok(Outcome::NotFound);
    };
    if !crate::store::redrivable(row.status) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    let redrive = change::Redrive::of(&row, now);
    let mut q = conn
        .query(sql::REDRIVE)
        .map_err(sqlite)?
        .bind(&row.id)
        .bind(&redrive.next_at)
        .bind(&redrive.expires_at);
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
            .query(sql::RECORD_HEARTBEAT)
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

/// `Op::EnforceConcurrency`: cancels the rows of each of `keys` beyond its limit
/// that its strategy picks (see `concurrency::Strategy`).
fn enforce(
    conn: &mut Connection,
    namespace: &str,
    activity_type: &str,
    keys: &[String],
    now: UnixMillis,
    moves: &mut KeyMoves,
) -> Result<Outcome, Error> {
    let names = serde_json::to_string(keys)
        .map_err(|e| Error::Corrupt(format!("concurrency keys: {e}")))?;
    let mut over = Vec::new();
    {
        let mut q = conn
            .query(sql::OVER_LIMIT)
            .map_err(sqlite)?
            .bind(namespace)
            .bind(activity_type)
            .bind(names.as_str());
        while q.step().map_err(sqlite)? {
            over.push((q.text(0)?, q.int(1), q.int(2)));
        }
    }
    let mut cancelled = Vec::new();
    for (key, max_running, code) in over {
        let strategy = concurrency::Strategy::from_code(code)
            .ok_or_else(|| Error::Corrupt("unknown concurrency strategy".to_owned()))?;
        let beyond = match strategy {
            concurrency::Strategy::Queue => continue,
            concurrency::Strategy::CancelNewest => sql::ACTIVE_OF_KEY,
            concurrency::Strategy::CancelInProgress => sql::ACTIVE_OF_KEY_NEWEST,
        };
        let mut rows = Vec::new();
        {
            let mut q = conn
                .query(beyond)
                .map_err(sqlite)?
                .bind(namespace)
                .bind(activity_type)
                .bind(key.as_str())
                .bind(&max_running);
            while q.step().map_err(sqlite)? {
                rows.push(Key {
                    namespace: namespace.to_owned(),
                    workflow_id: q.text(0)?,
                    activity_id: q.text(1)?,
                });
            }
        }
        let reason = strategy.reason(&key, max_running);
        for row in rows {
            if let Outcome::Cancelled { prior, row } = cancel(conn, &row, &reason, now, moves)? {
                cancelled.push((prior, row));
            }
        }
    }
    Ok(Outcome::Enforced(cancelled))
}

fn expire_scheduled(conn: &mut Connection, limit: u32, now: UnixMillis) -> Result<Vec<Key>, Error> {
    let error = change::schedule_to_close_error();
    let ending = Ending::finished(ActivityStatus::Failed, now, Some(&error));
    let q = conn.query(sql::EXPIRE).map_err(sqlite)?;
    let mut q = bind_ending(q, &ending).bind(&now).bind(&i64::from(limit));
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
            libsqlite3_sys::SQLITE_BLOB | libsqlite3_sys::SQLITE_TEXT => Ok(self.opt_blob(c)?),
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
