//! Set-based PostgreSQL paths for runs of like ops in one batch: many submits in
//! one `INSERT … SELECT FROM UNNEST`, many attempt endings in one `UPDATE … FROM
//! UNNEST` per kind. Every statement is a network round trip, so a run of hundreds
//! of rows must not be hundreds of statements.
//!
//! Each path returns `None` when the run is not one it can do set-wise with the
//! same result as op-by-op execution (a key that exists or repeats, an id twice, a
//! lease guard); the caller then runs the ops one by one. Nothing is left written
//! in that case (the submit path undoes its insert with a savepoint).

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, Row};

use crate::store::{Error, NewActivity, Op, Outcome, Submitted, Transition, rows};
use spool_proto::time::UnixMillis;

/// Inserts every activity of a run of submits in one statement; `None` (nothing
/// written) if any key exists already or repeats within the run.
pub async fn submit_run(
    conn: &mut PgConnection,
    batches: &[&[NewActivity]],
    now: UnixMillis,
) -> Result<Option<Vec<Outcome>>, Error> {
    let all: Vec<&NewActivity> = batches.iter().flat_map(|b| b.iter()).collect();
    let mut keys = HashSet::with_capacity(all.len());
    if !all.iter().all(|n| keys.insert(&n.key)) {
        return Ok(None);
    }
    let col = |f: &dyn Fn(&NewActivity) -> String| all.iter().map(|n| f(n)).collect::<Vec<_>>();
    let int = |f: &dyn Fn(&NewActivity) -> i64| all.iter().map(|n| f(n)).collect::<Vec<_>>();
    let opt =
        |f: &dyn Fn(&NewActivity) -> Option<i64>| all.iter().map(|n| f(n)).collect::<Vec<_>>();
    sqlx::query("SAVEPOINT bulk_submit")
        .execute(&mut *conn)
        .await?;
    let inserted = sqlx::query(
        "INSERT INTO activities (namespace, workflow_id, activity_id, activity_type, status, \
         max_attempts, initial_interval_ms, backoff_coefficient, max_interval_ms, non_retryable, \
         heartbeat_timeout_ms, start_to_close_ms, schedule_to_close_ms, priority, input_type, \
         input, created_at, next_at, expires_at) \
         SELECT ns, wf, act, ty, 1, max, ii, bc, mi, nr, hb, s2c, sched, pr, it, inp, $17, nx, ex \
         FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::BIGINT[], $6::BIGINT[], \
                     $7::FLOAT8[], $8::BIGINT[], $9::TEXT[], $10::BIGINT[], $11::BIGINT[], \
                     $12::BIGINT[], $13::BIGINT[], $14::TEXT[], $15::BYTEA[], $16::BIGINT[], \
                     $18::BIGINT[]) \
           AS v(ns, wf, act, ty, max, ii, bc, mi, nr, hb, s2c, sched, pr, it, inp, nx, ex) \
         ON CONFLICT (namespace, workflow_id, activity_id) DO NOTHING \
         RETURNING id, namespace, workflow_id, activity_id",
    )
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
        rows::expires_at(now, n.timeouts.schedule_to_close_ms)
    }))
    .fetch_all(&mut *conn)
    .await?;
    if inserted.len() != all.len() {
        sqlx::query("ROLLBACK TO SAVEPOINT bulk_submit")
            .execute(&mut *conn)
            .await?;
        sqlx::query("RELEASE SAVEPOINT bulk_submit")
            .execute(&mut *conn)
            .await?;
        return Ok(None);
    }
    sqlx::query("RELEASE SAVEPOINT bulk_submit")
        .execute(&mut *conn)
        .await?;
    let mut ids: HashMap<(String, String, String), i64> = HashMap::with_capacity(all.len());
    for row in &inserted {
        ids.insert(
            (row.try_get(1)?, row.try_get(2)?, row.try_get(3)?),
            row.try_get(0)?,
        );
    }
    let mut outcomes = Vec::with_capacity(batches.len());
    for batch in batches {
        let mut submitted = Vec::with_capacity(batch.len());
        for new in batch.iter() {
            let k = (
                new.key.namespace.clone(),
                new.key.workflow_id.clone(),
                new.key.activity_id.clone(),
            );
            let id = ids
                .get(&k)
                .copied()
                .ok_or_else(|| Error::Corrupt(format!("inserted row {k:?} not returned")))?;
            submitted.push(Submitted {
                row: rows::new_row(id, new, now),
                created: true,
            });
        }
        outcomes.push(Outcome::Submitted(submitted));
    }
    Ok(Some(outcomes))
}

/// Ends every attempt of a run of `Op::Finish`es with one statement per kind of
/// ending; `None` if an id repeats or an op carries a lease guard.
pub async fn finish_run(
    conn: &mut PgConnection,
    ops: &[Op],
    now: UnixMillis,
) -> Result<Option<Vec<Outcome>>, Error> {
    let mut seen = HashSet::with_capacity(ops.len());
    #[derive(Default)]
    struct Kind {
        ids: Vec<i64>,
        attempts: Vec<i64>,
    }
    let (mut complete, mut retry, mut fail, mut reschedule) = (
        Kind::default(),
        Kind::default(),
        Kind::default(),
        Kind::default(),
    );
    let (mut outputs, mut output_types) = (Vec::new(), Vec::new());
    let mut retry_at = Vec::new();
    let mut reschedule_at = Vec::new();
    // Error columns of retries, then of failures.
    let mut errors: [ErrorColumns; 2] = Default::default();
    for op in ops {
        let Op::Finish {
            attempt,
            transition,
            lease_expired_by: None,
        } = op
        else {
            return Ok(None);
        };
        if !seen.insert(attempt.id) {
            return Ok(None);
        }
        let (id, n) = (attempt.id, i64::from(attempt.attempt));
        let kind = match transition {
            Transition::Complete { output } => {
                output_types.push(output.content_type.clone());
                outputs.push(output.data.clone());
                &mut complete
            }
            Transition::Retry { next_at, error } => {
                retry_at.push(*next_at);
                push_error(&mut errors[0], error);
                &mut retry
            }
            Transition::Fail { error } => {
                push_error(&mut errors[1], error);
                &mut fail
            }
            Transition::Snooze { next_at } => {
                reschedule_at.push(*next_at);
                &mut reschedule
            }
            Transition::Release => {
                reschedule_at.push(now);
                &mut reschedule
            }
        };
        kind.ids.push(id);
        kind.attempts.push(n);
    }
    let mut accepted: HashSet<i64> = HashSet::with_capacity(ops.len());
    if !complete.ids.is_empty() {
        let rows = sqlx::query(
            "UPDATE activities AS a SET status = 3, output_type = v.ty, output = v.out, \
             finished_at = $5, lease_expires_at = NULL \
             FROM UNNEST($1::BIGINT[], $2::BIGINT[], $3::TEXT[], $4::BYTEA[]) AS v(id, attempt, ty, out) \
             WHERE a.id = v.id AND a.attempt = v.attempt AND a.status = 2 RETURNING a.id",
        )
        .bind(&complete.ids)
        .bind(&complete.attempts)
        .bind(&output_types)
        .bind(&outputs)
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
        collect(&rows, &mut accepted)?;
    }
    let [retry_errors, fail_errors] = errors;
    if !retry.ids.is_empty() {
        let rows = sqlx::query(
            "UPDATE activities AS a SET status = 1, next_at = v.next_at, lease_expires_at = NULL, \
             error_kind = v.kind, error_type = v.ty, error_message = v.msg, \
             error_details_type = v.dty, error_details = v.det \
             FROM UNNEST($1::BIGINT[], $2::BIGINT[], $3::BIGINT[], $4::BIGINT[], $5::TEXT[], \
                         $6::TEXT[], $7::TEXT[], $8::BYTEA[]) \
               AS v(id, attempt, next_at, kind, ty, msg, dty, det) \
             WHERE a.id = v.id AND a.attempt = v.attempt AND a.status = 2 RETURNING a.id",
        )
        .bind(&retry.ids)
        .bind(&retry.attempts)
        .bind(&retry_at)
        .bind(&retry_errors.0)
        .bind(&retry_errors.1)
        .bind(&retry_errors.2)
        .bind(&retry_errors.3)
        .bind(&retry_errors.4)
        .fetch_all(&mut *conn)
        .await?;
        collect(&rows, &mut accepted)?;
    }
    if !fail.ids.is_empty() {
        let rows = sqlx::query(
            "UPDATE activities AS a SET status = 4, finished_at = $8, lease_expires_at = NULL, \
             error_kind = v.kind, error_type = v.ty, error_message = v.msg, \
             error_details_type = v.dty, error_details = v.det \
             FROM UNNEST($1::BIGINT[], $2::BIGINT[], $3::BIGINT[], $4::TEXT[], $5::TEXT[], \
                         $6::TEXT[], $7::BYTEA[]) \
               AS v(id, attempt, kind, ty, msg, dty, det) \
             WHERE a.id = v.id AND a.attempt = v.attempt AND a.status = 2 RETURNING a.id",
        )
        .bind(&fail.ids)
        .bind(&fail.attempts)
        .bind(&fail_errors.0)
        .bind(&fail_errors.1)
        .bind(&fail_errors.2)
        .bind(&fail_errors.3)
        .bind(&fail_errors.4)
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
        collect(&rows, &mut accepted)?;
    }
    if !reschedule.ids.is_empty() {
        let rows = sqlx::query(
            "UPDATE activities AS a SET status = 1, next_at = v.next_at, \
             uncounted = a.uncounted + 1, lease_expires_at = NULL \
             FROM UNNEST($1::BIGINT[], $2::BIGINT[], $3::BIGINT[]) AS v(id, attempt, next_at) \
             WHERE a.id = v.id AND a.attempt = v.attempt AND a.status = 2 RETURNING a.id",
        )
        .bind(&reschedule.ids)
        .bind(&reschedule.attempts)
        .bind(&reschedule_at)
        .fetch_all(&mut *conn)
        .await?;
        collect(&rows, &mut accepted)?;
    }
    Ok(Some(
        ops.iter()
            .map(|op| match op {
                Op::Finish { attempt, .. } => Outcome::Finished {
                    accepted: accepted.contains(&attempt.id),
                },
                _ => Outcome::Finished { accepted: false },
            })
            .collect(),
    ))
}

type ErrorColumns = (
    Vec<i64>,
    Vec<String>,
    Vec<String>,
    Vec<Option<String>>,
    Vec<Option<Vec<u8>>>,
);

fn push_error(columns: &mut ErrorColumns, e: &super::ActivityError) {
    columns.0.push(i64::from(e.kind));
    columns.1.push(e.r#type.clone());
    columns.2.push(e.message.clone());
    columns
        .3
        .push(e.details.as_ref().map(|d| d.content_type.clone()));
    columns.4.push(e.details.as_ref().map(|d| d.data.clone()));
}

fn collect(rows: &[sqlx::postgres::PgRow], into: &mut HashSet<i64>) -> Result<(), Error> {
    for row in rows {
        into.insert(row.try_get(0)?);
    }
    Ok(())
}
