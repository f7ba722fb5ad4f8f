//! PostgreSQL's side of [`Store::apply`](crate::store::Store::apply): each op of a
//! batch as its statements in `sql`, with the values `store::change` decides.
//!
//! Like ops next to each other in a batch run as one statement where that gives the
//! same result as running them one by one: a run of submits inserts with one
//! `INSERT … SELECT FROM UNNEST`, a run of attempt endings ends with one `UPDATE …
//! FROM UNNEST` (split where a row repeats, so each ending sees the one before).
//! A submit is all or nothing through a savepoint.

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, Row, postgres::PgArguments, query::Query};

use super::{decode, sql};
use crate::store::{
    ActivityRow, ActivityStatus, Claim, Error, HeartbeatDetails, Key, NewActivity, Op, Outcome,
    change::{self, Conflict, Ending, Found},
    rows,
};
use spool_proto::time::UnixMillis;

type PgQuery<'q> = Query<'q, sqlx::Postgres, PgArguments>;

/// Runs `ops` in order inside the caller's transaction.
pub(super) async fn apply(
    conn: &mut PgConnection,
    ops: &[Op],
    now: UnixMillis,
) -> Result<Vec<Outcome>, Error> {
    let mut outcomes = Vec::with_capacity(ops.len());
    let mut start = 0;
    while start < ops.len() {
        let end = run_end(ops, start);
        let run = &ops[start..end];
        match &run[0] {
            Op::Submit(_) => outcomes.extend(submit_run(conn, run, now).await?),
            Op::Finish { .. } => outcomes.extend(finish(conn, run, now).await?),
            op => outcomes.push(apply_one(conn, op, now).await?),
        }
        start = end;
    }
    Ok(outcomes)
}

/// The end of the run of like ops (submits, or attempt endings) starting at
/// `start`: always at least one op, so a caller stepping through runs advances.
fn run_end(ops: &[Op], start: usize) -> usize {
    let same = |a: &Op, b: &Op| {
        matches!(
            (a, b),
            (Op::Submit(_), Op::Submit(_)) | (Op::Finish { .. }, Op::Finish { .. })
        )
    };
    ops[start + 1..]
        .iter()
        .position(|op| !same(&ops[start], op))
        .map_or(ops.len(), |n| start + 1 + n)
}

async fn apply_one(conn: &mut PgConnection, op: &Op, now: UnixMillis) -> Result<Outcome, Error> {
    match op {
        Op::Submit(batch) => submit(conn, batch, now).await,
        Op::Finish { .. } => finish(conn, std::slice::from_ref(op), now)
            .await?
            .pop()
            .ok_or_else(|| Error::Corrupt("an ending without an outcome".to_owned())),
        Op::Claim(claim) => claim_rows(conn, claim, now).await.map(Outcome::Claimed),
        Op::Cancel { key, reason } => cancel(conn, key, reason, now).await,
        Op::Redrive { key } => redrive(conn, key, now).await,
        Op::Prune { before, limit } => {
            let done = sqlx::query(sql::PRUNE)
                .bind(before)
                .bind(i64::from(*limit))
                .execute(&mut *conn)
                .await?;
            // Tickets of sessions not opened or resumed since then go too.
            sqlx::query(sql::PRUNE_TICKETS)
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
            let rows = sqlx::query(sql::RENEW)
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

/// A run of submits: every activity inserted by one statement when none of their
/// keys exists or repeats (the common case); otherwise that insert is undone and
/// each submit runs on its own, as it would alone.
async fn submit_run(
    conn: &mut PgConnection,
    run: &[Op],
    now: UnixMillis,
) -> Result<Vec<Outcome>, Error> {
    let batches: Vec<&[NewActivity]> = run
        .iter()
        .filter_map(|op| match op {
            Op::Submit(batch) => Some(batch.as_slice()),
            _ => None,
        })
        .collect();
    let all: Vec<&NewActivity> = batches.iter().flat_map(|b| b.iter()).collect();
    let mut keys = HashSet::with_capacity(all.len());
    if all.len() >= 2 && all.iter().all(|n| keys.insert(&n.key)) {
        begin(conn, &sql::SUBMIT_RUN).await?;
        let ids = insert(conn, &all, now).await?;
        let complete = ids.len() == all.len();
        end(conn, &sql::SUBMIT_RUN, !complete).await?;
        if complete {
            let mut outcomes = Vec::with_capacity(batches.len());
            for batch in batches {
                let entries = batch
                    .iter()
                    .map(|new| {
                        ids.get(&new.key)
                            .map(|&id| change::Entry::Created(id))
                            .ok_or_else(|| {
                                Error::Corrupt(format!("inserted {:?} not returned", new.key))
                            })
                    })
                    .collect::<Result<Vec<_>, Error>>()?;
                outcomes.push(Outcome::Submitted(change::submitted(batch, entries, now)?));
            }
            return Ok(outcomes);
        }
    }
    let mut outcomes = Vec::with_capacity(batches.len());
    for batch in batches {
        outcomes.push(submit(conn, batch, now).await?);
    }
    Ok(outcomes)
}

/// One submit, all or nothing: inserts what is new, then settles each activity
/// against what its insert did or found.
async fn submit(
    conn: &mut PgConnection,
    batch: &[NewActivity],
    now: UnixMillis,
) -> Result<Outcome, Error> {
    let atomic = batch.len() > 1;
    if atomic {
        begin(conn, &sql::SUBMIT).await?;
    }
    let all: Vec<&NewActivity> = batch.iter().collect();
    let ids = insert(conn, &all, now).await?;
    // One activity is answered with its stored row whole; a batch without payloads,
    // so a batch naming one large stored row many times costs no memory.
    let lookup = if atomic {
        sql::SELECT_LIGHT_BY_KEY
    } else {
        sql::SELECT_BY_KEY
    };
    let mut existing: HashMap<&Key, Option<ActivityRow>> = HashMap::new();
    for new in batch.iter().filter(|n| !ids.contains_key(&n.key)) {
        if !existing.contains_key(&new.key) {
            let row = select_one(conn, &new.key, lookup).await?;
            existing.insert(&new.key, row);
        }
    }
    let settled = change::settle(batch, |new| {
        if let Some(&id) = ids.get(&new.key) {
            return Ok(Found::Inserted(id));
        }
        match existing.get_mut(&new.key) {
            Some(row) => row
                .take()
                .map(|row| Found::Existing(Box::new(row)))
                .ok_or_else(|| {
                    Error::Corrupt(format!(
                        "{:?} conflicted on insert but cannot be read",
                        new.key
                    ))
                }),
            None => Err(Error::Corrupt(format!("{:?} was not looked up", new.key))),
        }
    })?;
    match settled {
        Ok(entries) => {
            if atomic {
                end(conn, &sql::SUBMIT, false).await?;
            }
            Ok(Outcome::Submitted(change::submitted(batch, entries, now)?))
        }
        Err(Conflict {
            index,
            existing_type,
        }) => {
            if atomic {
                end(conn, &sql::SUBMIT, true).await?;
            }
            Ok(Outcome::Conflict {
                index,
                existing_type,
            })
        }
    }
}

/// Opens `savepoint`.
async fn begin(conn: &mut PgConnection, savepoint: &sql::Savepoint) -> Result<(), Error> {
    sqlx::query(savepoint.open).execute(&mut *conn).await?;
    Ok(())
}

/// Keeps what was written since `savepoint`, or with `undo` rolls it back.
async fn end(conn: &mut PgConnection, savepoint: &sql::Savepoint, undo: bool) -> Result<(), Error> {
    if undo {
        sqlx::query(savepoint.rollback).execute(&mut *conn).await?;
    }
    sqlx::query(savepoint.release).execute(&mut *conn).await?;
    Ok(())
}

/// Inserts each activity whose key does not exist (a key repeated in `all` once);
/// the id of each row inserted, by key.
async fn insert(
    conn: &mut PgConnection,
    all: &[&NewActivity],
    now: UnixMillis,
) -> Result<HashMap<Key, i64>, Error> {
    let col = |f: &dyn Fn(&NewActivity) -> String| all.iter().map(|n| f(n)).collect::<Vec<_>>();
    let int = |f: &dyn Fn(&NewActivity) -> i64| all.iter().map(|n| f(n)).collect::<Vec<_>>();
    let opt =
        |f: &dyn Fn(&NewActivity) -> Option<i64>| all.iter().map(|n| f(n)).collect::<Vec<_>>();
    let inserted = sqlx::query(sql::INSERT)
        .bind(col(&|n| n.key.namespace.clone()))
        .bind(col(&|n| n.key.workflow_id.clone()))
        .bind(col(&|n| n.key.activity_id.clone()))
        .bind(col(&|n| n.activity_type.clone()))
        .bind(int(&|n| i64::from(n.retry.max_attempts)))
        .bind(int(&|n| n.retry.initial_interval_ms))
        .bind(
            all.iter()
                .map(|n| n.retry.backoff_coefficient)
                .collect::<Vec<_>>(),
        )
        .bind(int(&|n| n.retry.max_interval_ms))
        .bind(
            all.iter()
                .map(|n| rows::encode_list(&n.retry.non_retryable))
                .collect::<Vec<_>>(),
        )
        .bind(opt(&|n| n.timeouts.heartbeat_ms))
        .bind(opt(&|n| n.timeouts.start_to_close_ms))
        .bind(opt(&|n| n.timeouts.schedule_to_close_ms))
        .bind(int(&|n| i64::from(n.priority)))
        .bind(col(&|n| n.input.content_type.clone()))
        .bind(all.iter().map(|n| n.input.data.clone()).collect::<Vec<_>>())
        .bind(int(&|n| n.next_at))
        .bind(now)
        .bind(opt(&|n| {
            change::expires_at(now, n.timeouts.schedule_to_close_ms)
        }))
        .bind(
            all.iter()
                .map(|n| rows::encode_headers(&n.headers))
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await?;
    let mut ids = HashMap::with_capacity(inserted.len());
    for row in &inserted {
        let key = Key {
            namespace: row.try_get(1)?,
            workflow_id: row.try_get(2)?,
            activity_id: row.try_get(3)?,
        };
        ids.insert(key, row.try_get(0)?);
    }
    Ok(ids)
}

async fn claim_rows(
    conn: &mut PgConnection,
    claim: &Claim,
    now: UnixMillis,
) -> Result<Vec<ActivityRow>, Error> {
    let mut claimed = Vec::new();
    for activity_type in &claim.activity_types {
        let Some(left) = claim.left_after(claimed.len()) else {
            break;
        };
        let rows = sqlx::query(sql::CLAIM)
            .bind(now)
            .bind(&*claim.worker_id)
            .bind(claim.lease_expires_at)
            .bind(&*claim.namespace)
            .bind(&**activity_type)
            .bind(left)
            .bind(&*claim.identity)
            .bind(&*claim.node)
            .fetch_all(&mut *conn)
            .await?;
        // An unreadable row stays RUNNING, undelivered, until its lease lapses; it
        // must not stop every other claim.
        claimed.extend(rows::decode_all(&rows, "claim"));
    }
    Ok(claimed)
}

/// The values of endings, one array per column of `sql::endings!`.
#[derive(Default)]
struct Endings {
    status: Vec<i64>,
    next_at: Vec<Option<i64>>,
    finished_at: Vec<Option<i64>>,
    uncounted: Vec<i64>,
    output_type: Vec<Option<String>>,
    output: Vec<Option<Vec<u8>>>,
    set_error: Vec<bool>,
    error_kind: Vec<Option<i64>>,
    error_type: Vec<Option<String>>,
    error_message: Vec<Option<String>>,
    error_details_type: Vec<Option<String>>,
    error_details: Vec<Option<Vec<u8>>>,
    outcome: Vec<&'static str>,
    ended_at: Vec<i64>,
}

impl Endings {
    fn of(ending: &Ending<'_>) -> Self {
        let mut endings = Self::default();
        endings.push(ending);
        endings
    }

    fn push(&mut self, e: &Ending<'_>) {
        let (output_type, output) = e.output_columns();
        let details = e.error.and_then(|e| e.details.as_ref());
        self.status.push(e.status as i64);
        self.next_at.push(e.next_at);
        self.finished_at.push(e.finished_at);
        self.uncounted.push(e.uncounted);
        self.output_type.push(output_type.map(str::to_owned));
        self.output.push(output.map(<[u8]>::to_vec));
        self.set_error.push(e.error.is_some());
        self.error_kind.push(e.error.map(|e| i64::from(e.kind)));
        self.error_type.push(e.error.map(|e| e.r#type.clone()));
        self.error_message.push(e.error.map(|e| e.message.clone()));
        self.error_details_type
            .push(details.map(|d| d.content_type.clone()));
        self.error_details.push(details.map(|d| d.data.clone()));
        self.outcome.push(e.outcome.name());
        self.ended_at.push(e.ended_at);
    }

    /// Binds the arrays as `$1`…`$14`.
    fn bind(self, q: PgQuery<'_>) -> PgQuery<'_> {
        q.bind(self.status)
            .bind(self.next_at)
            .bind(self.finished_at)
            .bind(self.uncounted)
            .bind(self.output_type)
            .bind(self.output)
            .bind(self.set_error)
            .bind(self.error_kind)
            .bind(self.error_type)
            .bind(self.error_message)
            .bind(self.error_details_type)
            .bind(self.error_details)
            .bind(self.outcome)
            .bind(self.ended_at)
    }
}

/// Ends the attempts of a run of `Op::Finish`es: one statement for each stretch of
/// the run in which no row repeats.
async fn finish(
    conn: &mut PgConnection,
    run: &[Op],
    now: UnixMillis,
) -> Result<Vec<Outcome>, Error> {
    let mut outcomes = Vec::with_capacity(run.len());
    let mut start = 0;
    while start < run.len() {
        let mut seen = HashSet::new();
        let mut endings = Endings::default();
        let (mut ids, mut attempts, mut guards) = (Vec::new(), Vec::new(), Vec::new());
        let mut nodes: Vec<Option<String>> = Vec::new();
        let mut end = start;
        for op in &run[start..] {
            let Op::Finish {
                attempt,
                transition,
                lease_expired_by,
            } = op
            else {
                return Err(Error::Corrupt("a run of endings holds another op".into()));
            };
            if !seen.insert(attempt.id) {
                break;
            }
            endings.push(&Ending::of(transition, now));
            ids.push(attempt.id);
            attempts.push(i64::from(attempt.attempt));
            guards.push(*lease_expired_by);
            nodes.push(attempt.owner_node.as_deref().map(str::to_owned));
            end += 1;
        }
        let ended = endings
            .bind(sqlx::query(sql::FINISH))
            .bind(&ids)
            .bind(attempts)
            .bind(guards)
            .bind(nodes)
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|r| r.try_get::<i64, _>(0))
            .collect::<Result<HashSet<i64>, _>>()?;
        outcomes.extend(ids.iter().map(|id| Outcome::Finished {
            accepted: ended.contains(id),
        }));
        start = end;
    }
    Ok(outcomes)
}

async fn cancel(
    conn: &mut PgConnection,
    key: &Key,
    reason: &str,
    now: UnixMillis,
) -> Result<Outcome, Error> {
    let Some(row) = select_one(conn, key, sql::LOCK_BY_KEY).await? else {
        return Ok(Outcome::NotFound);
    };
    if !crate::store::cancellable(row.status) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    let error = change::cancelled_error(reason);
    let ending = Ending::finished(ActivityStatus::Cancelled, now, Some(&error));
    let stored = Endings::of(&ending)
        .bind(sqlx::query(sql::CANCEL))
        .bind(row.id)
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
    let Some(row) = select_one(conn, key, sql::SELECT_LIGHT_BY_KEY).await? else {
        return Ok(Outcome::NotFound);
    };
    if !redrivable(row.status) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    // Terminal rows are never claimed, so locking this one costs no one; read it
    // again under the lock in case a concurrent re-drive got there first.
    let Some(row) = select_one(conn, key, sql::LOCK_BY_KEY).await? else {
        return Ok(Outcome::NotFound);
    };
    if !redrivable(row.status) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    let redrive = change::Redrive::of(&row, now);
    let stored = sqlx::query(sql::REDRIVE)
        .bind(row.id)
        .bind(redrive.next_at)
        .bind(redrive.expires_at)
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
        let done = sqlx::query(sql::RECORD_HEARTBEAT)
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
    let error = change::schedule_to_close_error();
    let ending = Ending::finished(ActivityStatus::Failed, now, Some(&error));
    let rows = Endings::of(&ending)
        .bind(sqlx::query(sql::EXPIRE))
        .bind(now)
        .bind(i64::from(limit))
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

/// The row `sql` (a `SELECT` of the `columns!()` shape by key) finds.
pub(super) async fn select_one(
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
