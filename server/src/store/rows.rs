//! Dialect-neutral pieces of a stored row: decoding from any sqlx row, the JSON of
//! `non_retryable`, and range checks on integer columns.

use sqlx::{ColumnIndex, Decode, Row, Type};

use spool_proto::time::UnixMillis;

use super::{
    ActivityError, ActivityRow, ActivityStatus, Error, Key, NewActivity, Payload, RetrySpec,
    Timeouts,
};

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

/// The end of the run of like ops (submits, or attempt endings) starting at
/// `start`: always at least one op, so a caller stepping through runs advances.
pub(super) fn run_end(ops: &[super::Op], start: usize) -> usize {
    use super::Op;
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

pub(super) fn payload(content_type: Option<String>, data: Option<Vec<u8>>) -> Option<Payload> {
    data.map(|data| Payload {
        content_type: content_type.unwrap_or_default(),
        data,
    })
}

/// An activity row from any sqlx row holding the columns of `columns!()`.
pub(super) fn decode<'r, R>(row: &'r R) -> Result<ActivityRow, Error>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    f64: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
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
        expires_at: row.try_get("expires_at")?,
    })
}

/// A freshly inserted row, built from what was inserted.
pub(super) fn new_row(id: i64, new: &NewActivity, now: UnixMillis) -> ActivityRow {
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
        expires_at: new
            .timeouts
            .schedule_to_close_ms
            .map(|ms| now.saturating_add(ms)),
    }
}

/// The outcome of a submit whose insert did nothing: the key exists, with the
/// same type (`created = false`) or another (`Err(existing type)`).
pub(super) fn existing_outcome(
    new: &NewActivity,
    existing: Option<ActivityRow>,
) -> Result<Result<super::Submitted, String>, Error> {
    let existing = existing.ok_or_else(|| {
        Error::Corrupt(format!(
            "{:?} conflicted on insert but cannot be read",
            new.key
        ))
    })?;
    if existing.activity_type == new.activity_type {
        Ok(Ok(super::Submitted {
            row: existing,
            created: false,
        }))
    } else {
        Ok(Err(existing.activity_type))
    }
}

/// Per-status counts from `(status, count)` pairs.
pub(super) fn status_counts(
    pairs: impl IntoIterator<Item = (i64, i64)>,
) -> Result<super::StatusCounts, Error> {
    let mut counts = super::StatusCounts::default();
    for (status, n) in pairs {
        let n = u64::try_from(n).unwrap_or(0);
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

/// Folds `(next_at, namespace, type)` rows read in `next_at` order, at most
/// `limit` of them, into due times: rows sharing all three make one entry, and a
/// read that stopped at its limit is incomplete.
pub(super) fn due_times(rows: Vec<(UnixMillis, String, String)>, limit: u32) -> super::DueTimes {
    let complete = rows.len() < limit as usize;
    let times: std::collections::BTreeSet<_> = rows.into_iter().collect();
    super::DueTimes {
        times: times.into_iter().collect(),
        complete,
    }
}
