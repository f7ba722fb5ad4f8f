//! Dialect-neutral pieces of a stored row: decoding from any sqlx row, the JSON of
//! `non_retryable`, range checks on integer columns, and the rule that no stored
//! row can poison a read: a row that cannot be decoded is reported (a log line and
//! `spool_rows_unreadable_total`) and left out of the read, never fails it.
//!
//! Integer columns are decoded leniently: a REAL where an INTEGER belongs (SQLite
//! keeps whatever type a value had, and an older version could overflow a time into
//! a REAL) is read as the nearest integer, saturating.

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

/// An integer column, or a REAL where an integer belongs, saturated.
pub(super) fn int<'r, R>(row: &'r R, column: &'r str) -> Result<i64, Error>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    f64: Decode<'r, R::Database> + Type<R::Database>,
{
    match row.try_get::<i64, _>(column) {
        Ok(v) => Ok(v),
        // `as` saturates at the bounds of i64 (and maps NaN to 0).
        Err(e) => row
            .try_get::<f64, _>(column)
            .map(|f| f as i64)
            .map_err(|_| e.into()),
    }
}

/// [`int`] for a nullable column.
fn opt_int<'r, R>(row: &'r R, column: &'r str) -> Result<Option<i64>, Error>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    f64: Decode<'r, R::Database> + Type<R::Database>,
{
    match row.try_get::<Option<i64>, _>(column) {
        Ok(v) => Ok(v),
        Err(e) => row
            .try_get::<Option<f64>, _>(column)
            .map(|f| f.map(|f| f as i64))
            .map_err(|_| e.into()),
    }
}

/// Decodes every row that can be; each that cannot is reported and left out.
/// `read` names the read in the report.
pub(super) fn decode_all<R>(rows: &[R], read: &'static str) -> Vec<ActivityRow>
where
    R: Row,
    for<'r> &'r str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> f64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    rows.iter()
        .filter_map(|row| match decode(row) {
            Ok(decoded) => Some(decoded),
            Err(e) => {
                unreadable(read, row.try_get::<i64, _>("id").ok(), &e);
                None
            }
        })
        .collect()
}

/// Reports a row left out of a read because it cannot be decoded.
pub(super) fn unreadable(read: &'static str, id: Option<i64>, error: &Error) {
    tracing::error!(read, id, %error, "a stored row cannot be read; it is left out");
    crate::metrics::row_unreadable(read);
}

/// The rows of a page: as many of `sizes` (`(id, bytes)` in id order, one more
/// than `limit` if there are that many) as fit `limit` and `max_bytes`, and at
/// least one. Returns the last id taken and whether more rows follow.
pub(super) fn page_bounds(sizes: &[(i64, i64)], limit: u32, max_bytes: usize) -> (i64, bool) {
    // What a row costs on the wire besides its stored bytes: ids, times, framing.
    const ROW_OVERHEAD: usize = 512;
    let mut total = 0usize;
    let mut taken = 0usize;
    for &(_, size) in sizes {
        let cost = usize::try_from(size)
            .unwrap_or(0)
            .saturating_add(ROW_OVERHEAD);
        if taken == limit as usize || (taken > 0 && total.saturating_add(cost) > max_bytes) {
            break;
        }
        total = total.saturating_add(cost);
        taken += 1;
    }
    let last = sizes.get(taken.saturating_sub(1)).map_or(0, |s| s.0);
    (last, taken < sizes.len())
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
    let error_kind = opt_int(row, "error_kind")?;
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
        id: int(row, "id")?,
        key: Key {
            namespace: row.try_get("namespace")?,
            workflow_id: row.try_get("workflow_id")?,
            activity_id: row.try_get("activity_id")?,
        },
        activity_type: row.try_get("activity_type")?,
        status: status_from(int(row, "status")?)?,
        attempt: u32_from(int(row, "attempt")?, "attempt")?,
        uncounted: u32_from(int(row, "uncounted")?, "uncounted")?,
        retry: RetrySpec {
            max_attempts: u32_from(int(row, "max_attempts")?, "max_attempts")?,
            initial_interval_ms: int(row, "initial_interval_ms")?,
            backoff_coefficient: row.try_get("backoff_coefficient")?,
            max_interval_ms: int(row, "max_interval_ms")?,
            non_retryable,
        },
        timeouts: Timeouts {
            heartbeat_ms: opt_int(row, "heartbeat_timeout_ms")?,
            start_to_close_ms: opt_int(row, "start_to_close_ms")?,
            schedule_to_close_ms: opt_int(row, "schedule_to_close_ms")?,
        },
        priority: i32::try_from(int(row, "priority")?)
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
        created_at: int(row, "created_at")?,
        next_at: int(row, "next_at")?,
        started_at: opt_int(row, "started_at")?,
        finished_at: opt_int(row, "finished_at")?,
        lease_expires_at: opt_int(row, "lease_expires_at")?,
        worker_id: row.try_get("worker_id")?,
        expires_at: opt_int(row, "expires_at")?,
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
        expires_at: expires_at(now, new.timeouts.schedule_to_close_ms),
    }
}

/// When schedule-to-close fails an activity whose window starts at `from`:
/// computed here, saturating, and bound as an integer, never added up in SQL.
pub(crate) fn expires_at(
    from: UnixMillis,
    schedule_to_close_ms: Option<i64>,
) -> Option<UnixMillis> {
    schedule_to_close_ms.map(|ms| from.saturating_add(ms))
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
        let Ok(status) = status_from(status) else {
            tracing::error!(
                status,
                rows = n,
                "rows with an unknown status are left out of Stats"
            );
            crate::metrics::row_unreadable("stats");
            continue;
        };
        match status {
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
