//! PostgreSQL's side of [`Store::apply`](crate::store::Store::apply): each op of a
//! batch as its statements in `sql`, with the values `store::change` decides.
//!
//! Like ops next to each other in a batch run as one statement where that gives the
//! same result as running them one by one: a run of submits inserts with one
//! `INSERT … SELECT FROM UNNEST`, a run of attempt endings ends with one `UPDATE …
//! FROM UNNEST` (split where a row repeats, so each ending sees the one before).
//! A submit is all or nothing through a savepoint.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::Arc,
};

use sqlx::{
    PgConnection, Row,
    postgres::{PgArguments, PgRow},
    query::Query,
};

use super::{decode, sql};
use crate::store::{
    ActivityRow, ActivityStatus, Claim, Error, HeartbeatDetails, Key, NewActivity, Op, Outcome,
    change::{self, Conflict, Ending, Found},
    concurrency, fairness, rate, rows,
};
use spool_proto::time::UnixMillis;

mod settings;
mod submits;

use settings::*;
use submits::*;

type PgQuery<'q> = Query<'q, sqlx::Postgres, PgArguments>;

/// Runs `ops` inside the caller's transaction, in order, apart from the one
/// reordering [`runs`] makes where it cannot change any result.
pub(super) async fn apply(
    conn: &mut PgConnection,
    ops: &[Op],
    now: UnixMillis,
) -> Result<Vec<Outcome>, Error> {
    let mut outcomes: Vec<Option<Outcome>> = ops.iter().map(|_| None).collect();
    let mut buckets = batch_buckets(ops);
    for run in runs(ops) {
        let refs: Vec<&Op> = run.iter().map(|&i| &ops[i]).collect();
        if matches!(refs.first(), Some(Op::Claim(_)))
            && let Some((namespaces, types)) = buckets.take()
        {
            sqlx::query(sql::LOCK_BATCH_BUCKETS)
                .bind(namespaces)
                .bind(types)
                .execute(&mut *conn)
                .await?;
        }
        let done = match refs.first() {
            Some(Op::Submit(_)) => submit_run(conn, &refs, now).await?,
            Some(Op::Finish { .. }) => finish(conn, &refs, now).await?,
            Some(op) => vec![apply_one(conn, op, now).await?],
            None => Vec::new(),
        };
        if done.len() != run.len() {
            return Err(Error::Corrupt(format!(
                "{} ops gave {} outcomes",
                run.len(),
                done.len()
            )));
        }
        for (i, outcome) in run.into_iter().zip(done) {
            outcomes[i] = Some(outcome);
        }
    }
    outcomes
        .into_iter()
        .map(|o| o.ok_or_else(|| Error::Corrupt("an op without an outcome".to_owned())))
        .collect()
}

/// The order `ops` run in, as runs of like ops (indices into `ops`), each run one
/// statement where it can be. Ops run in batch order, except that submits and
/// attempt endings at the front of a batch (requests as they arrived, before any
/// other kind of op and before the claims) run as one run of submits and then one
/// run of endings, when no key is both submitted and ended there: a submit then
/// only inserts or reads rows no ending touches, and an ending is fenced by a row
/// id no insert can take, so the order between them changes nothing. Under load
/// they alternate, and run by run each would cost a round trip.
fn runs(ops: &[Op]) -> Vec<Vec<usize>> {
    let front = ops
        .iter()
        .position(|op| !matches!(op, Op::Submit(_) | Op::Finish { .. }))
        .unwrap_or(ops.len());
    let mut runs = Vec::new();
    let mut start = 0;
    if front > 1 && disjoint(&ops[..front]) {
        let (submits, endings): (Vec<usize>, Vec<usize>) =
            (0..front).partition(|&i| matches!(ops[i], Op::Submit(_)));
        runs.extend([submits, endings].into_iter().filter(|r| !r.is_empty()));
        start = front;
    }
    while start < ops.len() {
        let end = run_end(ops, start);
        runs.push((start..end).collect());
        start = end;
    }
    runs
}

/// The rate-limit buckets the claims of `ops` may lock, as namespaces and types,
/// when there are several claims and they name more than one type: each claim
/// locks its own in one order (`sql::LOCK_BUCKETS`), but one after the other
/// they could lock them in any ([`sql::LOCK_BATCH_BUCKETS`]).
fn batch_buckets(ops: &[Op]) -> Option<(Vec<&str>, Vec<&str>)> {
    let claims: Vec<&Claim> = crate::store::claims(ops).collect();
    let buckets: BTreeSet<(&str, &str)> = claims
        .iter()
        .flat_map(|c| c.activity_types.iter().map(|t| (&*c.namespace, &**t)))
        .collect();
    (claims.len() > 1 && buckets.len() > 1).then(|| buckets.into_iter().unzip())
}

/// Whether no key is both submitted and ended among `ops`.
fn disjoint(ops: &[Op]) -> bool {
    let ended: HashSet<&Key> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Finish { attempt, .. } => Some(&attempt.key),
            _ => None,
        })
        .collect();
    ended.is_empty()
        || !ops.iter().any(|op| match op {
            Op::Submit(batch) => batch.iter().any(|new| ended.contains(&new.key)),
            _ => false,
        })
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
        Op::Finish { .. } => finish(conn, &[op], now)
            .await?
            .pop()
            .ok_or_else(|| Error::Corrupt("an ending without an outcome".to_owned())),
        Op::Claim(claim) => claim_rows(conn, claim, now).await,
        Op::Cancel { key, reason } => cancel(conn, key, reason, now).await,
        Op::Redrive { key } => redrive(conn, key, now).await,
        Op::EnforceConcurrency {
            namespace,
            activity_type,
            keys,
        } => enforce(conn, namespace, activity_type, keys, now).await,
        Op::Setting(change) => write_setting(conn, change.write(&sql::SETTINGS)).await,
        Op::Rerank { ids } => rerank(conn, *ids).await.map(Outcome::Reranked),
        Op::Prune { before, limit } => prune(conn, *before, *limit, now).await.map(Outcome::Pruned),
        Op::Renew {
            attempts,
            lease_expires_at,
        } => renew(conn, attempts, *lease_expires_at)
            .await
            .map(Outcome::Renewed),
        Op::RecordHeartbeats(beats) => record_heartbeats(conn, beats).await.map(Outcome::Recorded),
        Op::ExpireScheduled { limit } => expire_scheduled(conn, *limit, now)
            .await
            .map(Outcome::Expired),
    }
}

async fn claim_rows(
    conn: &mut PgConnection,
    claim: &Claim,
    now: UnixMillis,
) -> Result<Outcome, Error> {
    if claim.activity_types.len() > 1 {
        let types: Vec<&str> = claim.activity_types.iter().map(|t| &**t).collect();
        sqlx::query(sql::LOCK_BUCKETS)
            .bind(&*claim.namespace)
            .bind(&types)
            .execute(&mut *conn)
            .await?;
    }
    let mut claimed = Vec::new();
    let mut throttled = Vec::new();
    for activity_type in &claim.activity_types {
        let Some(left) = claim.left_after(claimed.len()) else {
            break;
        };
        let rows = bind_claim(sqlx::query(sql::CLAIM), claim, activity_type, left, now)
            .fetch_all(&mut *conn)
            .await?;
        let took = claimed_rows(
            &rows,
            rows::COLUMNS,
            activity_type,
            now,
            left,
            &mut throttled,
        )?;
        claimed.extend(took);
    }
    Ok(Outcome::Claimed {
        rows: claimed,
        throttled,
    })
}

/// The rows a claim of `asked` rows returned (the claim's columns, NULL when it
/// took none, with the bucket's refill time at `refill`), noting in `throttled`
/// when the type's rate limit held rows back and gives one again.
fn claimed_rows(
    rows: &[PgRow],
    refill: usize,
    activity_type: &Arc<str>,
    now: UnixMillis,
    asked: i64,
    throttled: &mut Vec<(Arc<str>, UnixMillis)>,
) -> Result<Vec<ActivityRow>, Error> {
    let mut claimed = Vec::with_capacity(rows.len());
    let mut taken = 0;
    for row in rows {
        if row.try_get::<Option<i64>, _>(0)?.is_some() {
            taken += 1;
            // An unreadable row stays RUNNING, undelivered, until its lease lapses;
            // it must not stop every other claim.
            claimed.extend(rows::decode_all(std::slice::from_ref(row), "claim"));
        }
    }
    // Held back: fewer rows than asked, and none left in the bucket.
    if taken < asked
        && let Some(first) = rows.first()
        && let Some(at) = first.try_get::<Option<i64>, _>(refill)?
        && let Some(at) = rate::refill_millis(at, rate::nanos(now))
    {
        throttled.push((activity_type.clone(), at));
    }
    Ok(claimed)
}

/// Binds the claim's eight values (`sql::claim!`'s placeholders, in order): up
/// to `left` rows of `activity_type`.
fn bind_claim<'q>(
    q: PgQuery<'q>,
    claim: &'q Claim,
    activity_type: &'q str,
    left: i64,
    now: UnixMillis,
) -> PgQuery<'q> {
    q.bind(now)
        .bind(&*claim.worker_id)
        .bind(claim.lease_expires_at)
        .bind(&*claim.namespace)
        .bind(activity_type)
        .bind(left)
        .bind(&*claim.identity)
        .bind(&*claim.node)
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

/// The endings of one `sql::FINISH`, with their fences: bound as `$1`…`$18`.
#[derive(Default)]
struct Fenced {
    endings: Endings,
    ids: Vec<i64>,
    attempts: Vec<i64>,
    guards: Vec<Option<i64>>,
    nodes: Vec<Option<String>>,
}

impl Fenced {
    fn push(&mut self, op: &Op, now: UnixMillis) -> Result<(), Error> {
        let Op::Finish {
            attempt,
            transition,
            lease_expired_by,
        } = op
        else {
            return Err(Error::Corrupt("a run of endings holds another op".into()));
        };
        self.endings.push(&Ending::of(transition, now));
        self.ids.push(attempt.id);
        self.attempts.push(i64::from(attempt.attempt));
        self.guards.push(*lease_expired_by);
        self.nodes
            .push(attempt.owner_node.as_deref().map(str::to_owned));
        Ok(())
    }

    /// Binds `$1`…`$18`; the ids, to read the outcomes by.
    fn bind(self, q: PgQuery<'_>) -> (PgQuery<'_>, Vec<i64>) {
        let q = self
            .endings
            .bind(q)
            .bind(self.ids.clone())
            .bind(self.attempts)
            .bind(self.guards)
            .bind(self.nodes);
        (q, self.ids)
    }
}

/// Each ending's outcome, in order: accepted if `ended` has its row.
fn finished(ids: &[i64], ended: &HashSet<i64>) -> impl Iterator<Item = Outcome> {
    ids.iter().map(|id| Outcome::Finished {
        accepted: ended.contains(id),
    })
}

/// Ends the attempts of a run of `Op::Finish`es: one statement for each stretch of
/// the run in which no row repeats.
async fn finish(
    conn: &mut PgConnection,
    run: &[&Op],
    now: UnixMillis,
) -> Result<Vec<Outcome>, Error> {
    let mut outcomes = Vec::with_capacity(run.len());
    let mut start = 0;
    while start < run.len() {
        let mut seen = HashSet::new();
        let mut fenced = Fenced::default();
        for op in &run[start..] {
            if let Op::Finish { attempt, .. } = op
                && !seen.insert(attempt.id)
            {
                break;
            }
            fenced.push(op, now)?;
        }
        let (query, ids) = fenced.bind(sqlx::query(sql::FINISH));
        let ended = query
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|r| r.try_get::<i64, _>(0))
            .collect::<Result<HashSet<i64>, _>>()?;
        outcomes.extend(finished(&ids, &ended));
        start += ids.len();
    }
    Ok(outcomes)
}

/// A batch that can run as one statement with no transaction around it: endings
/// of distinct rows, then at most one claim of one type (or that claim alone).
/// This is the batch a busy dispatch loop makes: the results that came in, and the
/// claim that refills the slots they freed.
pub(super) struct OneStatement<'a> {
    endings: &'a [Op],
    claim: Option<&'a Claim>,
}

impl<'a> OneStatement<'a> {
    /// `ops` as one statement, if they can be.
    pub(super) fn of(ops: &'a [Op]) -> Option<Self> {
        let (claim, endings) = match ops.split_last() {
            Some((Op::Claim(claim), endings)) => (Some(claim), endings),
            _ => (None, ops),
        };
        let mut seen = HashSet::with_capacity(endings.len());
        let fits = claim.is_none_or(|c| c.activity_types.len() == 1)
            && (claim.is_some() || !endings.is_empty())
            && endings
                .iter()
                .all(|op| matches!(op, Op::Finish { attempt, .. } if seen.insert(attempt.id)));
        fits.then_some(Self { endings, claim })
    }
}

/// Runs `batch` as that one statement, which PostgreSQL commits by itself: one
/// round trip where a transaction costs four (BEGIN, the endings, the claim,
/// COMMIT).
pub(super) async fn apply_one_statement(
    conn: &mut PgConnection,
    batch: OneStatement<'_>,
    now: UnixMillis,
) -> Result<Vec<Outcome>, Error> {
    let OneStatement { endings, claim } = batch;
    let Some(claim) = claim else {
        let refs: Vec<&Op> = endings.iter().collect();
        return finish(conn, &refs, now).await;
    };
    if endings.is_empty() {
        return Ok(vec![claim_rows(conn, claim, now).await?]);
    }
    let mut fenced = Fenced::default();
    for op in endings {
        fenced.push(op, now)?;
    }
    let (query, ids) = fenced.bind(sqlx::query(sql::FINISH_AND_CLAIM));
    let (Some(activity_type), Some(left)) = (claim.activity_types.first(), claim.left_after(0))
    else {
        return Err(Error::Corrupt("a claim of no type or of nothing".into()));
    };
    let rows = bind_claim(query, claim, activity_type, left, now)
        .fetch_all(&mut *conn)
        .await?;
    let mut ended = HashSet::new();
    if let Some(first) = rows.first()
        && let Some(all) = first.try_get::<Option<Vec<i64>>, _>(rows::COLUMNS)?
    {
        ended = all.into_iter().collect();
    }
    let mut throttled = Vec::new();
    let claimed = claimed_rows(
        &rows,
        rows::COLUMNS + 1,
        activity_type,
        now,
        left,
        &mut throttled,
    )?;
    let mut outcomes: Vec<Outcome> = finished(&ids, &ended).collect();
    outcomes.push(Outcome::Claimed {
        rows: claimed,
        throttled,
    });
    Ok(outcomes)
}

/// `Op::EnforceConcurrency`: cancels the rows of each of `keys` beyond its limit
/// that its strategy picks (see `concurrency::Strategy`).
async fn enforce(
    conn: &mut PgConnection,
    namespace: &str,
    activity_type: &str,
    keys: &[String],
    now: UnixMillis,
) -> Result<Outcome, Error> {
    let over: Vec<(String, i64, i64)> = sqlx::query_as(sql::OVER_LIMIT)
        .bind(namespace)
        .bind(activity_type)
        .bind(keys)
        .fetch_all(&mut *conn)
        .await?;
    let mut cancelled = Vec::new();
    for (key, max_running, code) in over {
        let strategy = concurrency::Strategy::from_code(code)?;
        let Some(beyond) = beyond_limit!(strategy) else {
            continue;
        };
        let rows: Vec<(String, String)> = sqlx::query_as(beyond)
            .bind(namespace)
            .bind(activity_type)
            .bind(&key)
            .bind(max_running)
            .fetch_all(&mut *conn)
            .await?;
        let reason = strategy.reason(&key, max_running);
        for (workflow_id, activity_id) in rows {
            let row = Key {
                namespace: namespace.to_owned(),
                workflow_id,
                activity_id,
            };
            if let Outcome::Cancelled { prior, row } = cancel(conn, &row, &reason, now).await? {
                cancelled.push((prior, row));
            }
        }
    }
    Ok(Outcome::Enforced(cancelled))
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
    let ending = Ending::expired(now);
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
