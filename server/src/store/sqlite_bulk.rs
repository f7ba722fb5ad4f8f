//! Set-based SQLite paths: many submits in one `INSERT`, many attempt endings in
//! one `UPDATE` per kind, a claim in one `SELECT` and one `UPDATE`.
//!
//! Why: sqlx runs each SQLite statement on the connection's own thread, so every
//! statement costs a cross-thread round trip (a wake-up and a context switch), and
//! so does every row a statement returns; both dwarf SQLite's own work on small
//! rows. So a whole run goes in as one JSON parameter read with `json_each` (the SQL
//! text is static and its prepared statement cached), and what comes back is at
//! most one row, a JSON array built by SQLite.
//!
//! Each path returns `None` when the run is not one it can do set-wise with the
//! same result as op-by-op execution (a key conflict, an id twice, a lease guard);
//! the caller then runs the ops one by one. Nothing is left written in that case.

use std::collections::{HashMap, HashSet};

use std::sync::Arc;

use sqlx::{Row, SqliteConnection};

use super::{
    ActivityRow, ActivityStatus, Claim, Error, Key, NewActivity, Op, Outcome, Payload, RetrySpec,
    Submitted, Timeouts, Transition,
    sqlite::{ErrorColumns, encode_list, u32_from},
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
                    e.details.map(hex)
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
                    e.details.map(hex)
                ]));
            }
            Transition::Snooze { next_at } => reschedule.push(serde_json::json!([id, n, next_at])),
            Transition::Release => reschedule.push(serde_json::json!([id, n, now])),
        }
    }
    // Which fences hold, asked once for the whole run (one row back); the updates
    // below carry the same fence, so they change exactly these rows.
    let fences: Vec<serde_json::Value> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Finish { attempt, .. } => Some(serde_json::json!([attempt.id, attempt.attempt])),
            _ => None,
        })
        .collect();
    let row = sqlx::query(
        "SELECT json_group_array(a.id) FROM json_each(?1) AS j \
         JOIN activities AS a ON a.id = j.value->>0 \
         WHERE a.attempt = j.value->>1 AND a.status = 2",
    )
    .bind(serde_json::Value::Array(fences).to_string())
    .fetch_one(&mut *conn)
    .await?;
    let ids: Vec<i64> = serde_json::from_str(&row.try_get::<String, _>(0)?)
        .map_err(|e| Error::Corrupt(format!("fence check: {e}")))?;
    let accepted: HashSet<i64> = ids.into_iter().collect();
    if !complete.is_empty() {
        sqlx::query(
            "UPDATE activities SET status = 3, output_type = j.value->>2, \
             output = unhex(j.value->>3), finished_at = ?2, lease_expires_at = NULL \
             FROM json_each(?1) AS j \
             WHERE activities.id = j.value->>0 AND activities.attempt = j.value->>1 \
               AND activities.status = 2",
        )
        .bind(serde_json::Value::Array(complete).to_string())
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    if !retry.is_empty() {
        sqlx::query(
            "UPDATE activities SET status = 1, next_at = j.value->>2, lease_expires_at = NULL, \
             error_kind = j.value->>3, error_type = j.value->>4, error_message = j.value->>5, \
             error_details_type = j.value->>6, error_details = unhex(j.value->>7) \
             FROM json_each(?1) AS j \
             WHERE activities.id = j.value->>0 AND activities.attempt = j.value->>1 \
               AND activities.status = 2",
        )
        .bind(serde_json::Value::Array(retry).to_string())
        .execute(&mut *conn)
        .await?;
    }
    if !fail.is_empty() {
        sqlx::query(
            "UPDATE activities SET status = 4, finished_at = ?2, lease_expires_at = NULL, \
             error_kind = j.value->>2, error_type = j.value->>3, error_message = j.value->>4, \
             error_details_type = j.value->>5, error_details = unhex(j.value->>6) \
             FROM json_each(?1) AS j \
             WHERE activities.id = j.value->>0 AND activities.attempt = j.value->>1 \
               AND activities.status = 2",
        )
        .bind(serde_json::Value::Array(fail).to_string())
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    if !reschedule.is_empty() {
        sqlx::query(
            "UPDATE activities SET status = 1, next_at = j.value->>2, \
             uncounted = uncounted + 1, lease_expires_at = NULL \
             FROM json_each(?1) AS j \
             WHERE activities.id = j.value->>0 AND activities.attempt = j.value->>1 \
               AND activities.status = 2",
        )
        .bind(serde_json::Value::Array(reschedule).to_string())
        .execute(&mut *conn)
        .await?;
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

/// Claims due rows for a worker: per type (in the claim's order), one `SELECT` of
/// the next due rows as a JSON array, then one `UPDATE` of exactly those ids. Inside
/// the writer's `BEGIN IMMEDIATE` transaction nothing else changes them in between.
/// The rows returned carry what a task needs; not their output, last error or
/// heartbeat details.
pub async fn claim(
    conn: &mut SqliteConnection,
    claim: &Claim,
    now: UnixMillis,
) -> Result<Vec<ActivityRow>, Error> {
    let mut claimed = Vec::new();
    for activity_type in &claim.activity_types {
        let left = i64::from(claim.limit) - claimed.len() as i64;
        if left <= 0 {
            break;
        }
        let row = sqlx::query(
            "SELECT json_group_array(json_array(id, workflow_id, activity_id, attempt, uncounted, \
               max_attempts, initial_interval_ms, backoff_coefficient, max_interval_ms, \
               non_retryable, heartbeat_timeout_ms, start_to_close_ms, schedule_to_close_ms, \
               priority, input_type, hex(input), created_at, next_at)) \
             FROM (SELECT * FROM activities \
               WHERE namespace = ?1 AND activity_type = ?2 AND status = 1 AND next_at <= ?3 \
               ORDER BY priority DESC, next_at, id LIMIT ?4)",
        )
        .bind(&*claim.namespace)
        .bind(&**activity_type)
        .bind(now)
        .bind(left)
        .fetch_one(&mut *conn)
        .await?;
        let found: Vec<Vec<serde_json::Value>> =
            serde_json::from_str(&row.try_get::<String, _>(0)?)
                .map_err(|e| Error::Corrupt(format!("claim: {e}")))?;
        if found.is_empty() {
            continue;
        }
        let ids: Vec<i64> = found
            .iter()
            .filter_map(|r| r.first().and_then(|v| v.as_i64()))
            .collect();
        sqlx::query(
            "UPDATE activities SET status = 2, attempt = attempt + 1, started_at = ?1, \
             worker_id = ?2, lease_expires_at = ?3 \
             WHERE id IN (SELECT value FROM json_each(?4))",
        )
        .bind(now)
        .bind(&*claim.worker_id)
        .bind(claim.lease_expires_at)
        .bind(serde_json::to_string(&ids).unwrap_or_default())
        .execute(&mut *conn)
        .await?;
        for r in found {
            claimed.push(claimed_row(&r, claim, activity_type, now)?);
        }
    }
    Ok(claimed)
}

/// A claimed row from its JSON array (the column order of [`claim`]'s `SELECT`),
/// as it is after the claim's `UPDATE`.
fn claimed_row(
    r: &[serde_json::Value],
    claim: &Claim,
    activity_type: &Arc<str>,
    now: UnixMillis,
) -> Result<ActivityRow, Error> {
    let bad = |what: &str| Error::Corrupt(format!("claimed row: {what}"));
    let int = |i: usize| {
        r.get(i)
            .and_then(|v| v.as_i64())
            .ok_or_else(|| bad("integer"))
    };
    let opt_int = |i: usize| r.get(i).and_then(|v| v.as_i64());
    let text = |i: usize| r.get(i).and_then(|v| v.as_str()).map(str::to_owned);
    let non_retryable = match text(9) {
        Some(json) => serde_json::from_str(&json).map_err(|_| bad("non_retryable"))?,
        None => Vec::new(),
    };
    let input = unhex(&text(15).unwrap_or_default()).ok_or_else(|| bad("input"))?;
    Ok(ActivityRow {
        id: int(0)?,
        key: Key {
            namespace: claim.namespace.to_string(),
            workflow_id: text(1).ok_or_else(|| bad("workflow_id"))?,
            activity_id: text(2).ok_or_else(|| bad("activity_id"))?,
        },
        activity_type: activity_type.to_string(),
        status: ActivityStatus::Running,
        attempt: u32_from(int(3)?, "attempt")? + 1,
        uncounted: u32_from(int(4)?, "uncounted")?,
        retry: RetrySpec {
            max_attempts: u32_from(int(5)?, "max_attempts")?,
            initial_interval_ms: int(6)?,
            backoff_coefficient: r
                .get(7)
                .and_then(|v| v.as_f64())
                .ok_or_else(|| bad("backoff_coefficient"))?,
            max_interval_ms: int(8)?,
            non_retryable,
        },
        timeouts: Timeouts {
            heartbeat_ms: opt_int(10),
            start_to_close_ms: opt_int(11),
            schedule_to_close_ms: opt_int(12),
        },
        priority: i32::try_from(int(13)?).map_err(|_| bad("priority"))?,
        input: Payload {
            content_type: text(14).unwrap_or_default(),
            data: input,
        },
        output: None,
        last_error: None,
        heartbeat_details: None,
        created_at: int(16)?,
        next_at: int(17)?,
        started_at: Some(now),
        finished_at: None,
        lease_expires_at: Some(claim.lease_expires_at),
        worker_id: Some(claim.worker_id.to_string()),
    })
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
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
