//! Set-based SQLite paths for runs of like ops in one batch: many submits in one
//! `INSERT`, many attempt endings in one `UPDATE` per kind.
//!
//! Why: sqlx runs each SQLite statement on the connection's own thread, so every
//! statement costs a cross-thread round trip (a wake-up and a context switch) that
//! dwarfs SQLite's own work on small rows. A whole run goes in as one JSON parameter
//! read with `json_each`, so the SQL text is static and its prepared statement cached.
//!
//! Each path returns `None` when the run is not one it can do set-wise with the
//! same result as op-by-op execution (a key conflict, an id twice, a lease guard);
//! the caller then runs the ops one by one. Nothing is left written in that case.

use std::collections::{HashMap, HashSet};

use sqlx::{Row, SqliteConnection};

use super::{
    ActivityRow, ActivityStatus, Error, NewActivity, Op, Outcome, Submitted, Transition,
    sqlite::{ErrorColumns, encode_list},
};
use spool_proto::time::UnixMillis;

/// Inserts every activity of a run of `Op::Submit`s in one statement. `None` (with
/// nothing written) if any key already exists or repeats within the run.
pub async fn submit_run(
    conn: &mut SqliteConnection,
    ops: &[&[NewActivity]],
    now: UnixMillis,
) -> Result<Option<Vec<Outcome>>, Error> {
    let total: usize = ops.iter().map(|b| b.len()).sum();
    let mut keys = HashSet::with_capacity(total);
    let mut rows = Vec::with_capacity(total);
    for new in ops.iter().flat_map(|b| b.iter()) {
        if !keys.insert((
            &new.key.namespace,
            &new.key.workflow_id,
            &new.key.activity_id,
        )) {
            return Ok(None);
        }
        rows.push(serde_json::json!([
            new.key.namespace,
            new.key.workflow_id,
            new.key.activity_id,
            new.activity_type,
            new.retry.max_attempts,
            new.retry.initial_interval_ms,
            new.retry.backoff_coefficient,
            new.retry.max_interval_ms,
            encode_list(&new.retry.non_retryable),
            new.timeouts.heartbeat_ms,
            new.timeouts.start_to_close_ms,
            new.timeouts.schedule_to_close_ms,
            new.priority,
            new.input.content_type,
            hex(&new.input.data),
            new.next_at,
        ]));
    }
    sqlx::query("SAVEPOINT bulk_submit")
        .execute(&mut *conn)
        .await?;
    let inserted = sqlx::query(
        "INSERT INTO activities (namespace, workflow_id, activity_id, activity_type, status, \
         max_attempts, initial_interval_ms, backoff_coefficient, max_interval_ms, non_retryable, \
         heartbeat_timeout_ms, start_to_close_ms, schedule_to_close_ms, priority, input_type, \
         input, created_at, next_at, expires_at) \
         SELECT v->>0, v->>1, v->>2, v->>3, 1, v->>4, v->>5, v->>6, v->>7, v->>8, v->>9, \
                v->>10, v->>11, v->>12, v->>13, unhex(v->>14), ?2, v->>15, ?2 + (v->>11) \
         FROM (SELECT value AS v FROM json_each(?1)) WHERE true \
         ON CONFLICT (namespace, workflow_id, activity_id) DO NOTHING \
         RETURNING id, namespace, workflow_id, activity_id",
    )
    .bind(serde_json::Value::Array(rows).to_string())
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    if inserted.len() != total {
        // Some key exists already: let the op-by-op path sort out which op sees what.
        sqlx::query("ROLLBACK TO bulk_submit")
            .execute(&mut *conn)
            .await?;
        sqlx::query("RELEASE bulk_submit")
            .execute(&mut *conn)
            .await?;
        return Ok(None);
    }
    sqlx::query("RELEASE bulk_submit")
        .execute(&mut *conn)
        .await?;
    let mut ids: HashMap<(String, String, String), i64> = HashMap::with_capacity(total);
    for row in &inserted {
        ids.insert(
            (row.try_get(1)?, row.try_get(2)?, row.try_get(3)?),
            row.try_get(0)?,
        );
    }
    let mut outcomes = Vec::with_capacity(ops.len());
    for batch in ops {
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
                row: new_row(id, new, now),
                created: true,
            });
        }
        outcomes.push(Outcome::Submitted(submitted));
    }
    Ok(Some(outcomes))
}

/// A freshly inserted row, built from what was inserted.
pub fn new_row(id: i64, new: &NewActivity, now: UnixMillis) -> ActivityRow {
    ActivityRow {
        id,
        key: new.key.clone(),
        activity_type: new.activity_type.clone(),
        status: ActivityStatus::Scheduled,
        attempt: 0,
        uncounted: 0,
        retry: new.retry.clone(),
        timeouts: new.timeouts,
        priority: new.priority,
        input: new.input.clone(),
        output: None,
        last_error: None,
        heartbeat_details: None,
        created_at: now,
        next_at: new.next_at,
        started_at: None,
        finished_at: None,
        lease_expires_at: None,
        worker_id: None,
    }
}

/// Ends every attempt of a run of `Op::Finish`es with one statement per kind of
/// ending. `None` if an id repeats or an op carries a lease guard.
pub async fn finish_run(
    conn: &mut SqliteConnection,
    ops: &[Op],
    now: UnixMillis,
) -> Result<Option<Vec<Outcome>>, Error> {
    let mut seen = HashSet::with_capacity(ops.len());
    let (mut complete, mut retry, mut fail, mut reschedule) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
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
        let (id, n) = (attempt.id, attempt.attempt);
        match transition {
            Transition::Complete { output } => {
                complete.push(serde_json::json!([
                    id,
                    n,
                    output.content_type,
                    hex(&output.data)
                ]));
            }
            Transition::Retry { next_at, error } => {
                let e = ErrorColumns::from(error);
                retry.push(serde_json::json!([
                    id,
                    n,
                    next_at,
                    e.kind,
                    e.error_type,
                    e.message,
                    e.details_type,
                    e.details.map(|d| hex(&d))
                ]));
            }
            Transition::Fail { error } => {
                let e = ErrorColumns::from(error);
                fail.push(serde_json::json!([
                    id,
                    n,
                    e.kind,
                    e.error_type,
                    e.message,
                    e.details_type,
                    e.details.map(|d| hex(&d))
                ]));
            }
            Transition::Snooze { next_at } => reschedule.push(serde_json::json!([id, n, next_at])),
            Transition::Release => reschedule.push(serde_json::json!([id, n, now])),
        }
    }
    let mut accepted: HashSet<i64> = HashSet::with_capacity(ops.len());
    if !complete.is_empty() {
        let rows = sqlx::query(
            "UPDATE activities SET status = 3, output_type = j.value->>2, \
             output = unhex(j.value->>3), finished_at = ?2, lease_expires_at = NULL \
             FROM json_each(?1) AS j \
             WHERE activities.id = j.value->>0 AND activities.attempt = j.value->>1 \
               AND activities.status = 2 \
             RETURNING activities.id",
        )
        .bind(serde_json::Value::Array(complete).to_string())
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
        collect(&rows, &mut accepted)?;
    }
    if !retry.is_empty() {
        let rows = sqlx::query(
            "UPDATE activities SET status = 1, next_at = j.value->>2, lease_expires_at = NULL, \
             error_kind = j.value->>3, error_type = j.value->>4, error_message = j.value->>5, \
             error_details_type = j.value->>6, error_details = unhex(j.value->>7) \
             FROM json_each(?1) AS j \
             WHERE activities.id = j.value->>0 AND activities.attempt = j.value->>1 \
               AND activities.status = 2 \
             RETURNING activities.id",
        )
        .bind(serde_json::Value::Array(retry).to_string())
        .fetch_all(&mut *conn)
        .await?;
        collect(&rows, &mut accepted)?;
    }
    if !fail.is_empty() {
        let rows = sqlx::query(
            "UPDATE activities SET status = 4, finished_at = ?2, lease_expires_at = NULL, \
             error_kind = j.value->>2, error_type = j.value->>3, error_message = j.value->>4, \
             error_details_type = j.value->>5, error_details = unhex(j.value->>6) \
             FROM json_each(?1) AS j \
             WHERE activities.id = j.value->>0 AND activities.attempt = j.value->>1 \
               AND activities.status = 2 \
             RETURNING activities.id",
        )
        .bind(serde_json::Value::Array(fail).to_string())
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
        collect(&rows, &mut accepted)?;
    }
    if !reschedule.is_empty() {
        let rows = sqlx::query(
            "UPDATE activities SET status = 1, next_at = j.value->>2, \
             uncounted = uncounted + 1, lease_expires_at = NULL \
             FROM json_each(?1) AS j \
             WHERE activities.id = j.value->>0 AND activities.attempt = j.value->>1 \
               AND activities.status = 2 \
             RETURNING activities.id",
        )
        .bind(serde_json::Value::Array(reschedule).to_string())
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

fn collect(rows: &[sqlx::sqlite::SqliteRow], into: &mut HashSet<i64>) -> Result<(), Error> {
    for row in rows {
        into.insert(row.try_get(0)?);
    }
    Ok(())
}

/// Lower-case hex, which SQLite's `unhex` turns back into a blob.
fn hex(data: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(data.len() * 2);
    for b in data {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}
