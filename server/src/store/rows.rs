//! Dialect-neutral pieces of a stored row: the one row decoder (over [`Columns`],
//! which sqlx rows of either dialect and the SQLite writer's rows implement), the JSON of
//! `non_retryable`, range checks on integer columns, and the rule that no stored
//! row can poison a read: a row that cannot be decoded is reported (a log line and
//! `spool_rows_unreadable_total`) and left out of the read, never fails it.
//!
//! Integer columns are decoded leniently: a REAL where an INTEGER belongs (SQLite
//! keeps whatever type a value had, and an older version could overflow a time into
//! a REAL) is read as the nearest integer, saturating.

use sqlx::{ColumnIndex, Decode, Row, Type};

use spool_proto::time::UnixMillis;

use super::{ActivityError, ActivityRow, ActivityStatus, Error, Key, Payload, RetrySpec, Timeouts};

/// Headers as stored: a JSON object, or NULL for none.
pub(super) fn encode_headers(headers: &super::Headers) -> Option<String> {
    if headers.is_empty() {
        None
    } else {
        serde_json::to_string(headers).ok()
    }
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

/// Decodes every row that can be; each that cannot is reported and left out.
/// `read` names the read in the report.
pub(super) fn decode_all<R: 'static>(rows: &[R], read: &'static str) -> Vec<ActivityRow>
where
    for<'a> Sqlx<'a, R>: Columns,
{
    rows.iter()
        .map(Sqlx)
        .filter_map(|row| match decode(&row) {
            Ok(decoded) => Some(decoded),
            Err(e) => {
                unreadable(read, row.opt_int(col::ID).ok().flatten(), &e);
                None
            }
        })
        .collect()
}

/// Reports a row left out of a read because it cannot be decoded.
pub(super) fn unreadable(read: &'static str, id: Option<i64>, error: &Error) {
    tracing::error!(read, id, %error, "a stored row cannot be read; it is left out");
    count_unreadable(read);
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

/// The statements that read a list page's ids and sizes in one order, one for each
/// way rows of a status are indexed (each store's `sql::LIST_SIZES`).
pub(super) struct ListSizes {
    pub any: &'static str,
    pub scheduled: &'static str,
    pub running: &'static str,
    pub ended: &'static str,
}

impl ListSizes {
    /// The statement for rows of `status` (every status when `None`).
    pub fn of(&self, status: Option<ActivityStatus>) -> &'static str {
        match status {
            None | Some(ActivityStatus::Unspecified) => self.any,
            Some(ActivityStatus::Scheduled) => self.scheduled,
            Some(ActivityStatus::Running) => self.running,
            Some(
                ActivityStatus::Completed | ActivityStatus::Failed | ActivityStatus::Cancelled,
            ) => self.ended,
        }
    }
}

/// The ids of a page whose last row is `last`, in the order `sizes` has them.
pub(super) fn page_ids(sizes: &[(i64, i64)], last: i64, newest_first: bool) -> Vec<i64> {
    sizes
        .iter()
        .map(|&(id, _)| id)
        .take_while(|&id| if newest_first { id >= last } else { id <= last })
        .collect()
}

/// Where each column of `columns!()` (and `light_columns!()`) sits in a row.
#[allow(dead_code)]
pub(super) mod col {
    pub const ID: usize = 0;
    pub const NAMESPACE: usize = 1;
    pub const WORKFLOW_ID: usize = 2;
    pub const ACTIVITY_ID: usize = 3;
    pub const ACTIVITY_TYPE: usize = 4;
    pub const STATUS: usize = 5;
    pub const ATTEMPT: usize = 6;
    pub const UNCOUNTED: usize = 7;
    pub const MAX_ATTEMPTS: usize = 8;
    pub const INITIAL_INTERVAL_MS: usize = 9;
    pub const BACKOFF_COEFFICIENT: usize = 10;
    pub const MAX_INTERVAL_MS: usize = 11;
    pub const NON_RETRYABLE: usize = 12;
    pub const HEARTBEAT_TIMEOUT_MS: usize = 13;
    pub const START_TO_CLOSE_MS: usize = 14;
    pub const SCHEDULE_TO_CLOSE_MS: usize = 15;
    pub const PRIORITY: usize = 16;
    pub const INPUT_TYPE: usize = 17;
    pub const INPUT: usize = 18;
    pub const OUTPUT_TYPE: usize = 19;
    pub const OUTPUT: usize = 20;
    pub const ERROR_KIND: usize = 21;
    pub const ERROR_TYPE: usize = 22;
    pub const ERROR_MESSAGE: usize = 23;
    pub const ERROR_DETAILS_TYPE: usize = 24;
    pub const ERROR_DETAILS: usize = 25;
    pub const HEARTBEAT_TYPE: usize = 26;
    pub const HEARTBEAT_DETAILS: usize = 27;
    pub const CREATED_AT: usize = 28;
    pub const NEXT_AT: usize = 29;
    pub const STARTED_AT: usize = 30;
    pub const FINISHED_AT: usize = 31;
    pub const LEASE_EXPIRES_AT: usize = 32;
    pub const WORKER_ID: usize = 33;
    pub const EXPIRES_AT: usize = 34;
    pub const HEADERS: usize = 35;
    pub const CONCURRENCY_KEY: usize = 36;
    pub const FAIRNESS_KEY: usize = 37;
}

/// How many columns `columns!()` has: a statement may return more after them.
pub(super) const COLUMNS: usize = col::FAIRNESS_KEY + 1;

/// A result row read by column position: what every dialect's rows offer the one
/// decoder. Each read is strict (a NULL in a required column, text that is not
/// UTF-8, a string where a number belongs are errors) except that an integer
/// column holding a REAL is read as the nearest integer, saturating.
pub(super) trait Columns {
    fn opt_int(&self, i: usize) -> Result<Option<i64>, Error>;
    fn real(&self, i: usize) -> Result<f64, Error>;
    fn opt_text(&self, i: usize) -> Result<Option<String>, Error>;
    fn opt_blob(&self, i: usize) -> Result<Option<Vec<u8>>, Error>;

    fn int(&self, i: usize) -> Result<i64, Error> {
        self.opt_int(i)?
            .ok_or_else(|| Error::Corrupt(format!("column {i} is NULL")))
    }

    fn text(&self, i: usize) -> Result<String, Error> {
        self.opt_text(i)?
            .ok_or_else(|| Error::Corrupt(format!("column {i} is NULL")))
    }
}

/// A sqlx row (SQLite's read pools, PostgreSQL) read by position.
pub(super) struct Sqlx<'r, R>(pub &'r R);

impl<R> Columns for Sqlx<'_, R>
where
    R: Row,
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> f64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    fn opt_int(&self, i: usize) -> Result<Option<i64>, Error> {
        match self.0.try_get::<Option<i64>, _>(i) {
            Ok(v) => Ok(v),
            // `as` saturates at the bounds of i64 (and maps NaN to 0).
            Err(e) => self
                .0
                .try_get::<Option<f64>, _>(i)
                .map(|f| f.map(|f| f as i64))
                .map_err(|_| e.into()),
        }
    }

    fn real(&self, i: usize) -> Result<f64, Error> {
        Ok(self.0.try_get(i)?)
    }

    fn opt_text(&self, i: usize) -> Result<Option<String>, Error> {
        Ok(self.0.try_get(i)?)
    }

    fn opt_blob(&self, i: usize) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.0.try_get(i)?)
    }
}

/// The activity row in `row`, which holds the columns of `columns!()` (or
/// `light_columns!()`) in that order. The only row decoder: every dialect and every
/// read goes through it.
pub(super) fn decode(row: &impl Columns) -> Result<ActivityRow, Error> {
    let non_retryable = match row.opt_text(col::NON_RETRYABLE)? {
        Some(json) => serde_json::from_str(&json)
            .map_err(|e| Error::Corrupt(format!("non_retryable: {e}")))?,
        None => Vec::new(),
    };
    let payload = |ty: usize, data: usize| -> Result<Option<Payload>, Error> {
        Ok(match row.opt_blob(data)? {
            Some(data) => Some(Payload {
                content_type: row.opt_text(ty)?.unwrap_or_default(),
                data,
            }),
            None => None,
        })
    };
    let last_error = match row.opt_int(col::ERROR_KIND)? {
        Some(kind) => Some(ActivityError {
            kind: i32::try_from(kind).unwrap_or_default(),
            r#type: row.opt_text(col::ERROR_TYPE)?.unwrap_or_default(),
            message: row.opt_text(col::ERROR_MESSAGE)?.unwrap_or_default(),
            details: payload(col::ERROR_DETAILS_TYPE, col::ERROR_DETAILS)?,
            next_retry_delay: None,
        }),
        None => None,
    };
    Ok(ActivityRow {
        id: row.int(col::ID)?,
        key: Key {
            namespace: row.text(col::NAMESPACE)?,
            workflow_id: row.text(col::WORKFLOW_ID)?,
            activity_id: row.text(col::ACTIVITY_ID)?,
        },
        activity_type: row.text(col::ACTIVITY_TYPE)?,
        status: status_from(row.int(col::STATUS)?)?,
        attempt: u32_from(row.int(col::ATTEMPT)?, "attempt")?,
        uncounted: u32_from(row.int(col::UNCOUNTED)?, "uncounted")?,
        retry: RetrySpec {
            max_attempts: u32_from(row.int(col::MAX_ATTEMPTS)?, "max_attempts")?,
            initial_interval_ms: row.int(col::INITIAL_INTERVAL_MS)?,
            backoff_coefficient: row.real(col::BACKOFF_COEFFICIENT)?,
            max_interval_ms: row.int(col::MAX_INTERVAL_MS)?,
            non_retryable,
        },
        timeouts: Timeouts {
            heartbeat_ms: row.opt_int(col::HEARTBEAT_TIMEOUT_MS)?,
            start_to_close_ms: row.opt_int(col::START_TO_CLOSE_MS)?,
            schedule_to_close_ms: row.opt_int(col::SCHEDULE_TO_CLOSE_MS)?,
        },
        priority: i32::try_from(row.int(col::PRIORITY)?)
            .map_err(|_| Error::Corrupt("priority out of range".to_owned()))?,
        input: Payload {
            content_type: row.text(col::INPUT_TYPE)?,
            data: row.opt_blob(col::INPUT)?.unwrap_or_default(),
        },
        output: payload(col::OUTPUT_TYPE, col::OUTPUT)?,
        last_error,
        heartbeat_details: payload(col::HEARTBEAT_TYPE, col::HEARTBEAT_DETAILS)?,
        created_at: row.int(col::CREATED_AT)?,
        next_at: row.int(col::NEXT_AT)?,
        started_at: row.opt_int(col::STARTED_AT)?,
        finished_at: row.opt_int(col::FINISHED_AT)?,
        lease_expires_at: row.opt_int(col::LEASE_EXPIRES_AT)?,
        worker_id: row.opt_text(col::WORKER_ID)?,
        expires_at: row.opt_int(col::EXPIRES_AT)?,
        headers: match row.opt_text(col::HEADERS)? {
            Some(json) => {
                serde_json::from_str(&json).map_err(|e| Error::Corrupt(format!("headers: {e}")))?
            }
            None => super::Headers::new(),
        },
        concurrency_key: row.opt_text(col::CONCURRENCY_KEY)?,
        fairness_key: row.opt_text(col::FAIRNESS_KEY)?,
    })
}

/// One attempt record, from the columns of `HISTORY` in order: attempt,
/// worker_id, worker_identity, worker_node, started_at, ended_at, outcome, then the
/// five error columns.
pub(super) fn decode_attempt(row: &impl Columns) -> Result<super::AttemptRecord, Error> {
    let error = match row.opt_int(7)? {
        Some(kind) => Some(ActivityError {
            kind: i32::try_from(kind).unwrap_or_default(),
            r#type: row.opt_text(8)?.unwrap_or_default(),
            message: row.opt_text(9)?.unwrap_or_default(),
            details: match row.opt_blob(11)? {
                Some(data) => Some(Payload {
                    content_type: row.opt_text(10)?.unwrap_or_default(),
                    data,
                }),
                None => None,
            },
            next_retry_delay: None,
        }),
        None => None,
    };
    Ok(super::AttemptRecord {
        attempt: u32_from(row.int(0)?, "attempt")?,
        worker_id: row.opt_text(1)?,
        identity: row.opt_text(2)?,
        node: row.opt_text(3)?,
        started_at: row.opt_int(4)?,
        ended_at: row.opt_int(5)?,
        outcome: row.text(6)?,
        error,
    })
}

/// Every readable attempt record of a read, oldest first.
pub(super) fn decode_attempts(
    rows: impl IntoIterator<Item = impl Columns>,
) -> Vec<super::AttemptRecord> {
    rows.into_iter()
        .filter_map(|r| match decode_attempt(&r) {
            Ok(a) => Some(a),
            Err(e) => {
                unreadable("history", None, &e);
                None
            }
        })
        .collect()
}

/// Per-type counts from the rows of `TYPE_COUNTS`: namespace, type, status,
/// whether a SCHEDULED row is not due yet (1) and the count.
pub(super) fn type_counts(
    rows: impl IntoIterator<Item = impl Columns>,
) -> Result<Vec<super::TypeCounts>, Error> {
    let mut out: std::collections::BTreeMap<(String, String), super::TypeCounts> =
        std::collections::BTreeMap::new();
    for row in rows {
        let (namespace, activity_type) = (row.text(0)?, row.text(1)?);
        let n = u64::try_from(row.int(4)?).unwrap_or(0);
        let counts = out
            .entry((namespace.clone(), activity_type.clone()))
            .or_insert_with(|| super::TypeCounts {
                namespace,
                activity_type,
                ..Default::default()
            });
        match (status_from(row.int(2)?), row.int(3)? != 0) {
            (Ok(ActivityStatus::Scheduled), false) => counts.due += n,
            (Ok(ActivityStatus::Scheduled), true) => counts.delayed += n,
            (Ok(ActivityStatus::Running), _) => counts.running += n,
            (Ok(ActivityStatus::Failed), _) => counts.failed += n,
            _ => {}
        }
    }
    Ok(out.into_values().collect())
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
            count_unreadable("stats");
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

/// A rate limit and what is left of it at `now`, from the columns of the
/// dialects' `RATE_LIMITS`: namespace, type, per_period, period_ms, burst,
/// interval_ns, tat_ns.
pub(super) fn rate_limit_use(
    row: &impl Columns,
    now: UnixMillis,
) -> Result<super::rate::RateLimitUse, Error> {
    let count = |i: usize, what: &str| {
        u32::try_from(row.int(i)?).map_err(|_| Error::Corrupt(format!("rate limit {what}")))
    };
    let period_ms =
        u64::try_from(row.int(3)?).map_err(|_| Error::Corrupt("rate limit period".to_owned()))?;
    let bucket = super::rate::Bucket {
        interval_ns: row.int(5)?.max(1),
        burst: row.int(4)?.max(1),
        tat_ns: row.int(6)?,
    };
    Ok(super::rate::RateLimitUse {
        limit: super::rate::RateLimit {
            namespace: row.text(0)?,
            activity_type: row.text(1)?,
            key: row.opt_text(7)?,
            per_period: count(2, "per period")?,
            period: std::time::Duration::from_millis(period_ms),
            burst: count(4, "burst")?,
        },
        available: u32::try_from(bucket.available(super::rate::nanos(now))).unwrap_or(u32::MAX),
    })
}

/// A concurrency limit and its use, from the columns of the dialects'
/// `CONCURRENCY_LIMITS`: namespace, type, max_running, keys, running, strategy,
/// held.
pub(super) fn concurrency_limit(
    row: &impl Columns,
) -> Result<super::concurrency::ConcurrencyLimit, Error> {
    let count = |i: usize| count(row, i);
    let small = |i: usize, what: &str| {
        u32::try_from(row.int(i)?).map_err(|_| Error::Corrupt(format!("{what} out of range")))
    };
    Ok(super::concurrency::ConcurrencyLimit {
        namespace: row.text(0)?,
        activity_type: row.text(1)?,
        key: row.opt_text(2)?,
        max_running: small(3, "concurrency limit")?,
        weight: small(4, "concurrency key weight")?,
        keys: count(5)?,
        running: count(6)?,
        strategy: super::concurrency::Strategy::from_code(row.int(7)?)?,
        held: count(8)?,
    })
}

/// A fairness key's weight, from the columns of the dialects'
/// `FAIRNESS_WEIGHTS`: namespace, type, key, weight.
pub(super) fn fairness_weight(
    row: &impl Columns,
) -> Result<super::fairness::FairnessWeight, Error> {
    Ok(super::fairness::FairnessWeight {
        namespace: row.text(0)?,
        activity_type: row.text(1)?,
        key: row.text(2)?,
        weight: u32_from(row.int(3)?, "weight")?,
    })
}

/// A count in column `i`, which is never negative.
fn count(row: &impl Columns, i: usize) -> Result<u64, Error> {
    u64::try_from(row.int(i)?).map_err(|_| Error::Corrupt("a negative count".to_owned()))
}

/// One concurrency key's waiting and running rows, from the columns of the
/// dialects' `CONCURRENCY_KEY`.
pub(super) fn key_counts(row: &impl Columns) -> Result<(u64, u64), Error> {
    Ok((count(row, 0)?, count(row, 1)?))
}

/// Counts a row left out of a read (`spool_rows_unreadable_total`, described with
/// the server's other metrics): the store counts through the metrics facade, so
/// it needs nothing of the server's metrics module.
fn count_unreadable(read: &'static str) {
    metrics::counter!("spool_rows_unreadable_total", "read" => read).increment(1);
}
