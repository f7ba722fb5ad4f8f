//! The PostgreSQL store's reads: pages of activities cut by size, counts,
//! histories, the rows the sweep and the timer read, and limits with their use.

/// A page's ids and stored sizes, to cut it by bytes before any payload is read
/// (`octet_length` takes a TOASTed value's size from its header): `$1` namespace,
/// `$2` the cursor, `$3` the status or NULL, `$4` the type or NULL, `$5` the most
/// rows. Each status reads where its rows are indexed anyway (see the
/// `0007_transition_free_lists` migration).
macro_rules! list_sizes {
    ($rows:literal, $after:literal, $order:literal) => {
        concat!(
            "SELECT id, (octet_length(input) \
               + COALESCE(octet_length(output), 0) + COALESCE(octet_length(error_details), 0) \
               + COALESCE(octet_length(heartbeat_details), 0) \
               + COALESCE(octet_length(error_message), 0))::BIGINT \
             FROM activities WHERE ",
            $rows,
            " AND id ",
            $after,
            " $2 AND ($3::BIGINT IS NULL OR status = $3) \
               AND ($4::TEXT IS NULL OR activity_type = $4) \
             ORDER BY id ",
            $order,
            " LIMIT $5"
        )
    };
}

/// Which rows a list reads, by the status asked for.
macro_rules! list_paths {
    ($after:literal, $order:literal) => {
        crate::store::rows::ListSizes {
            any: list_sizes!("namespace = $1", $after, $order),
            scheduled: list_sizes!("namespace = $1 AND status = 1", $after, $order),
            running: list_sizes!("status = 2 AND namespace = $1", $after, $order),
            // A finished status is always named on this path; `status >= 3` is
            // what lets the planner prove the partial index applies.
            ended: list_sizes!(
                "namespace = $1 AND status >= 3 AND status = $3",
                $after,
                $order
            ),
        }
    };
}

pub const LIST_SIZES: crate::store::rows::ListSizes = list_paths!(">", "");

/// [`LIST_SIZES`] newest first: ids below `$2`.
pub const LIST_SIZES_NEWEST: crate::store::rows::ListSizes = list_paths!("<", "DESC");

/// Whether the statement of [`LIST_SIZES`] is kept prepared. Not here: planned
/// for its values each time (an unnamed statement), since a generic plan cannot
/// tell a namespace or a status of a hundred rows from one of a million, and
/// walked the primary key through every row of the table for them. Planning
/// costs a fraction of a millisecond; a List is not dispatch.
pub const LIST_SIZES_KEPT: bool = false;

/// [`LIST`]'s `$1`: the page's ids, as an array.
pub fn page_ids(ids: Vec<i64>) -> Vec<i64> {
    ids
}

/// The rows of a page: the ids `$1` that still have status `$2` (or any, when
/// NULL), since a row may have moved on after its size was read.
pub const LIST: &str =
    select_rows!(rows "WHERE id = ANY($1) AND ($2::BIGINT IS NULL OR status = $2) ORDER BY id");

/// [`LIST`] newest first.
pub const LIST_NEWEST: &str = select_rows!(rows "WHERE id = ANY($1) AND ($2::BIGINT IS NULL OR status = $2) \
      ORDER BY id DESC");

/// Counts of one namespace by status, from the same indexes as the lists.
pub const STATS: &str = "SELECT 1::BIGINT, COUNT(*) FROM activities \
       WHERE namespace = $1 AND status = 1 \
     UNION ALL \
     SELECT 2::BIGINT, COUNT(*) FROM activities WHERE status = 2 AND namespace = $1 \
     UNION ALL \
     SELECT status, COUNT(*) FROM activities WHERE namespace = $1 AND status >= 3 \
     GROUP BY status";

/// The attempt records of row `$1`, oldest first (columns as `rows::decode_attempt`
/// reads them): those kept in `attempts`, then the last one, which a finished row
/// describes itself (see the `0003_attempts` migration).
pub const HISTORY: &str = "SELECT attempt, worker_id, worker_identity, worker_node, \
       started_at, ended_at, outcome, error_kind, error_type, error_message, \
       error_details_type, error_details \
     FROM attempts WHERE activity_row = $1 \
     UNION ALL \
     SELECT attempt, worker_id, worker_identity, worker_node, started_at, attempt_ended_at, \
       attempt_outcome, CASE WHEN has THEN error_kind END, CASE WHEN has THEN error_type END, \
       CASE WHEN has THEN error_message END, CASE WHEN has THEN error_details_type END, \
       CASE WHEN has THEN error_details END \
     FROM (SELECT a.*, a.attempt_outcome NOT IN ('completed', 'snoozed', 'released') AS has \
           FROM activities a WHERE a.id = $1 AND a.status >= 3 \
             AND a.attempt_outcome IS NOT NULL \
             AND NOT EXISTS (SELECT 1 FROM attempts t \
                             WHERE t.activity_row = $1 AND t.attempt = a.attempt)) AS last \
     ORDER BY 1";

/// Counts by namespace, type, status and whether a SCHEDULED row waits past `$1`
/// (`rows::type_counts`); only the statuses a backlog is made of.
pub const TYPE_COUNTS: &str = "SELECT namespace, activity_type, 1::BIGINT, \
       (CASE WHEN next_at > $1 THEN 1 ELSE 0 END)::BIGINT AS later, COUNT(*) \
     FROM activities WHERE status = 1 GROUP BY namespace, activity_type, later \
     UNION ALL \
     SELECT namespace, activity_type, 2::BIGINT, 0::BIGINT, COUNT(*) \
     FROM activities WHERE status = 2 GROUP BY namespace, activity_type \
     UNION ALL \
     SELECT namespace, activity_type, 4::BIGINT, 0::BIGINT, COUNT(*) \
     FROM activities WHERE status >= 3 AND status = 4 GROUP BY namespace, activity_type";

pub const RUNNING: &str = select_rows!(light "WHERE status = 2 AND id > $1 ORDER BY id LIMIT $2");

pub const EXPIRED_LEASES: &str = select_rows!(light "WHERE status = 2 AND lease_expires_at < $1 \
      ORDER BY lease_expires_at LIMIT $2");

/// The next due times, along `activities_upcoming`: rows that were not due when
/// written (see the `0009_upcoming_rows_only` migration).
pub const DUE_TIMES: &str = "SELECT next_at, namespace, activity_type FROM activities \
     WHERE status = 1 AND next_at > created_at AND next_at > $1 \
     ORDER BY next_at LIMIT $2";

/// The rate limits of namespace `$1` (of all, when NULL), in order.
pub const RATE_LIMITS: &str = rate_limits!("$1::TEXT");

/// The fairness weights of namespace `$1` (of all, when NULL), in order (see
/// `rows::fairness_weight`).
pub const FAIRNESS_WEIGHTS: &str = "SELECT namespace, activity_type, fairness_key, weight \
     FROM fairness_weights WHERE $1::TEXT IS NULL OR namespace = $1 ORDER BY 1, 2, 3";

/// The waiting rows of type `$2` of namespace `$1` by fairness key, among the
/// first `waiting_counted!` in claim order (one range of `activities_due`), and
/// whether more are waiting.
pub const WAITING_BY_FAIRNESS_KEY: &str = concat!(
    "SELECT fairness_key, COUNT(*), \
       EXISTS (SELECT 1 FROM activities \
         WHERE namespace = $1 AND activity_type = $2 AND status = 1 \
         ORDER BY claim_band, claim_rank, id LIMIT 1 OFFSET ",
    waiting_counted!(),
    ") FROM (SELECT fairness_key FROM activities \
         WHERE namespace = $1 AND activity_type = $2 AND status = 1 \
         ORDER BY claim_band, claim_rank, id LIMIT ",
    waiting_counted!(),
    ") AS w GROUP BY fairness_key"
);

/// The concurrency limits of namespace `$1` (of all, when NULL), each type's then
/// its keys', in order (see `rows::concurrency_limit`).
pub const CONCURRENCY_LIMITS: &str = concat!(
    "SELECT * FROM (",
    concurrency_limits!("$1::TEXT", "::BIGINT"),
    ") AS l ORDER BY 1, 2, 3 NULLS FIRST"
);

/// The waiting and running rows of concurrency key `$3` of type `$2` of
/// namespace `$1`.
pub const CONCURRENCY_KEY: &str = "SELECT waiting, running FROM concurrency_keys \
     WHERE namespace = $1 AND activity_type = $2 AND concurrency_key = $3 \
       AND (waiting > 0 OR running > 0)";

/// The keys of the array `$3` of type `$2` of namespace `$1` with more rows
/// waiting and running than their limit and a strategy that cancels: each with
/// its limit and strategy.
pub const OVER_LIMIT: &str = over_limit!("$1", "$2", "= ANY($3)");

/// The keys (workflow, activity) of the waiting and running rows of key `$3` of
/// type `$2` of namespace `$1` after the first `$4`, in id order `$order`
/// (read along the keyed and the lease index, never the whole table).
macro_rules! active_of_key {
    ($order:literal) => {
        concat!(
            "SELECT workflow_id, activity_id FROM (\
       SELECT id, workflow_id, activity_id FROM activities \
         WHERE namespace = $1 AND activity_type = $2 AND concurrency_key = $3 \
           AND status = 1 \
       UNION ALL \
       SELECT id, workflow_id, activity_id FROM activities \
         WHERE status = 2 AND namespace = $1 AND activity_type = $2 \
           AND concurrency_key = $3) AS active \
     ORDER BY id ",
            $order,
            " OFFSET $4"
        )
    };
}

/// `active_of_key!` oldest first.
pub const ACTIVE_OF_KEY: &str = active_of_key!("ASC");

/// `active_of_key!` newest first.
pub const ACTIVE_OF_KEY_NEWEST: &str = active_of_key!("DESC");
