//! SQL fragments both dialects write into their statements: the columns every
//! row decoder reads, the claim order (band and rank), fairness strides, rate
//! buckets and concurrency limits, so each is said once.

/// The columns every row decoder reads, in this order, so every query returns the
/// same shape.
macro_rules! columns {
    () => {
        "id, namespace, workflow_id, activity_id, activity_type, status, attempt, uncounted, \
         max_attempts, initial_interval_ms, backoff_coefficient, max_interval_ms, non_retryable, \
         heartbeat_timeout_ms, start_to_close_ms, schedule_to_close_ms, priority, input_type, \
         input, output_type, output, error_kind, error_type, error_message, error_details_type, \
         error_details, heartbeat_type, heartbeat_details, created_at, next_at, started_at, \
         finished_at, lease_expires_at, worker_id, expires_at, headers, concurrency_key, \
         fairness_key"
    };
}

/// `SELECT` from `activities` of the columns every row decoder reads (`rows`),
/// or of the invoking dialect's `light!` ones (`light`), then `$rest`.
macro_rules! select_rows {
    (rows $rest:literal) => {
        concat!("SELECT ", columns!(), " FROM activities ", $rest)
    };
    (light $rest:literal) => {
        concat!("SELECT ", light!(), " FROM activities ", $rest)
    };
}

/// [`columns!`] without the payloads (input, output and both sets of details come
/// back empty), for reads that need an activity's identity and policy but must not
/// hold megabytes per row in memory: start-up reclaim, lease reclaim, and the
/// existing keys of a batch submit. Arguments: the dialect's empty BLOB, its typed
/// NULL TEXT and its typed NULL BLOB.
macro_rules! light_columns {
    ($empty_blob:literal, $null_text:literal, $null_blob:literal) => {
        concat!(
            "id, namespace, workflow_id, activity_id, activity_type, status, attempt, uncounted, \
             max_attempts, initial_interval_ms, backoff_coefficient, max_interval_ms, non_retryable, \
             heartbeat_timeout_ms, start_to_close_ms, schedule_to_close_ms, priority, \
             '' AS input_type, ",
            $empty_blob,
            " AS input, ",
            $null_text,
            " AS output_type, ",
            $null_blob,
            " AS output, error_kind, error_type, error_message, ",
            $null_text,
            " AS error_details_type, ",
            $null_blob,
            " AS error_details, ",
            $null_text,
            " AS heartbeat_type, ",
            $null_blob,
            " AS heartbeat_details, created_at, next_at, started_at, finished_at, \
             lease_expires_at, worker_id, expires_at, headers, concurrency_key, fairness_key"
        )
    };
}

/// The one setting the claim order depends on (see the priority aging migration):
/// how many milliseconds of waiting one level of priority is worth, 0 for strict
/// priority. An uncorrelated subquery, run once a statement by either dialect.
macro_rules! aging {
    () => {
        "(SELECT priority_aging_ms FROM dispatch_settings)"
    };
}

/// How many waiting rows of a type a listing of fairness weights counts
/// ([`fairness::WAITING_COUNTED`]), written into the SQL so that PostgreSQL plans
/// the listing's range scan knowing its limit.
macro_rules! waiting_counted {
    () => {
        "100000"
    };
}

/// Where a row of priority `$priority` and concurrency key `$key` goes in the
/// claim order (`claim_band`): keyed rows after every unkeyed one, 2^40 on (see
/// the concurrency keys migration), so the claim of unkeyed rows stops before them:
/// it takes `claim_band < 2^39`, below every keyed band (2^40 less a priority,
/// which is an `i32`) and above every unkeyed one.
macro_rules! band {
    ($priority:literal, $key:literal) => {
        concat!(
            "CASE WHEN ",
            $key,
            " IS NULL THEN 0 ELSE 1099511627776 END + CASE WHEN ",
            aging!(),
            " > 0 THEN 0 ELSE -",
            $priority,
            " END"
        )
    };
}

/// Where a row of priority `$priority` due at `$at` goes within its band
/// (`claim_rank`); NULL when `$at` is.
macro_rules! rank {
    ($at:literal, $priority:literal) => {
        concat!($at, " - ", $priority, " * ", aging!())
    };
}

/// The virtual time (ms) of the row of namespace `$ns`, type `$ty` and band `$band`
/// the claim would take first at `$now` (see `store::fairness`), read along
/// `activities_due`: rows not due yet (delayed, or retrying) are not the head;
/// NULL when the band has no row due.
macro_rules! fair_head {
    ($ns:literal, $ty:literal, $band:literal, $now:literal) => {
        concat!(
            "(SELECT h.claim_rank + h.priority * ",
            aging!(),
            " FROM activities AS h WHERE h.namespace = ",
            $ns,
            " AND h.activity_type = ",
            $ty,
            " AND h.status = 1 AND h.claim_band = ",
            $band,
            " AND h.next_at <= ",
            $now,
            " ORDER BY h.claim_rank LIMIT 1)"
        )
    };
}

/// How far a row of fairness key `$key` of namespace `$ns` and type `$ty` moves
/// its chain (µs): by the weight set for the key (`fairness_weights`), else by
/// `$given`, the stride of the row's own weight (see `store::fairness`).
macro_rules! fair_stride {
    ($ns:literal, $ty:literal, $key:literal, $given:literal) => {
        concat!(
            "COALESCE((SELECT ",
            fair_stride_us!(),
            " / w.weight FROM fairness_weights AS w WHERE w.namespace = ",
            $ns,
            " AND w.activity_type = ",
            $ty,
            " AND w.fairness_key = ",
            $key,
            "), ",
            $given,
            ")"
        )
    };
}

/// How far a row of weight 1 moves its fairness key's chain (`fairness::STRIDE_US`).
macro_rules! fair_stride_us {
    () => {
        "1000"
    };
}

/// How far a row moves its key's pass at weight 1 (`concurrency::STRIDE`).
macro_rules! stride {
    () => {
        "1000000"
    };
}

/// The rate limits of namespace `$ns` (of all, when NULL): each type's, then each
/// key's with its bucket from the key's row, as `rows::rate_limit_use` reads them.
macro_rules! rate_limits {
    ($ns:literal) => {
        concat!(
            "SELECT * FROM (SELECT namespace, activity_type, per_period, period_ms, burst, \
               interval_ns, tat_ns, NULL AS concurrency_key FROM rate_limits WHERE ",
            $ns,
            " IS NULL OR namespace = ",
            $ns,
            " UNION ALL \
             SELECT r.namespace, r.activity_type, r.per_period, r.period_ms, r.burst, \
               r.interval_ns, COALESCE((SELECT k.tat_ns FROM concurrency_keys AS k \
                 WHERE k.namespace = r.namespace AND k.activity_type = r.activity_type \
                   AND k.concurrency_key = r.concurrency_key), 0), r.concurrency_key \
             FROM key_rate_limits AS r WHERE ",
            $ns,
            " IS NULL OR r.namespace = ",
            $ns,
            ") AS l ORDER BY 1, 2, 8 NULLS FIRST"
        )
    };
}

/// Sets one key's rate limit, with the dialect's placeholder prefix `$p`: `1`
/// namespace, `2` type, `3` rows per `4` milliseconds, `5` at once, one per `6`
/// nanoseconds, `7` the key. Its bucket, on the key's row, is kept.
macro_rules! set_key_rate_limit {
    ($p:literal) => {
        concat!(
            "INSERT INTO key_rate_limits (namespace, activity_type, per_period, period_ms, \
               burst, interval_ns, concurrency_key) VALUES (",
            $p,
            "1, ",
            $p,
            "2, ",
            $p,
            "3, ",
            $p,
            "4, ",
            $p,
            "5, ",
            $p,
            "6, ",
            $p,
            "7) ON CONFLICT (namespace, activity_type, concurrency_key) DO UPDATE SET \
               per_period = excluded.per_period, period_ms = excluded.period_ms, \
               burst = excluded.burst, interval_ns = excluded.interval_ns"
        )
    };
}

/// How many rows key row `k` may take at `$now` (milliseconds) from its own
/// bucket `r` (a large number when it has none; 0 or less when it is empty).
macro_rules! key_tokens {
    ($now:literal) => {
        concat!(
            "CASE WHEN r.interval_ns IS NULL THEN 2147483647 ELSE (",
            $now,
            " * 1000000 + r.burst * r.interval_ns - CASE WHEN k.tat_ns > ",
            $now,
            " * 1000000 THEN k.tat_ns ELSE ",
            $now,
            " * 1000000 END) / r.interval_ns END"
        )
    };
}

/// `$table AS $alias` joined to a key row `k` on its key: the key's own limits
/// (`concurrency_key_limits AS x`, see the key shares migration), its own rate
/// limit (`key_rate_limits AS r`), a CTE of its rows.
macro_rules! key_join {
    ($table:literal, $alias:literal) => {
        concat!(
            "LEFT JOIN ",
            $table,
            " AS ",
            $alias,
            " ON ",
            $alias,
            ".namespace = k.namespace AND ",
            $alias,
            ".activity_type = k.activity_type AND ",
            $alias,
            ".concurrency_key = k.concurrency_key"
        )
    };
}

/// The first time (nanoseconds) after `$now` (milliseconds) one of the keys of
/// type `$type` of namespace `$ns` with rows waiting gets a token back from its
/// own bucket (but those `$skip` leaves out); NULL when none will.
macro_rules! key_refill {
    ($ns:literal, $type:literal, $now:literal, $skip:literal) => {
        concat!(
            "(SELECT MIN(k.tat_ns - (r.burst - 1) * r.interval_ns) \
             FROM key_rate_limits AS r JOIN concurrency_keys AS k \
               ON k.namespace = r.namespace AND k.activity_type = r.activity_type \
               AND k.concurrency_key = r.concurrency_key \
             WHERE r.namespace = ",
            $ns,
            " AND r.activity_type = ",
            $type,
            " AND k.waiting > 0 AND k.tat_ns - (r.burst - 1) * r.interval_ns > ",
            $now,
            " * 1000000",
            $skip,
            ")"
        )
    };
}

/// The concurrency limits of namespace `$ns` (of all, when NULL): each type's,
/// then each key's, as `rows::concurrency_limit` reads them. `$int` casts a sum
/// back to the dialect's integer.
macro_rules! concurrency_limits {
    ($ns:literal, $int:literal) => {
        concat!(
            "SELECT l.namespace, l.activity_type, NULL AS concurrency_key, l.max_running, \
               1 AS weight, \
               (SELECT COUNT(*) FROM concurrency_keys AS k \
                 WHERE k.namespace = l.namespace AND k.activity_type = l.activity_type \
                   AND (k.waiting > 0 OR k.running > 0)), \
               (SELECT COALESCE(SUM(k.running), 0)",
            $int,
            " FROM concurrency_keys AS k \
                 WHERE k.namespace = l.namespace AND k.activity_type = l.activity_type), \
               l.strategy, \
               (SELECT COALESCE(SUM(k.waiting), 0)",
            $int,
            " FROM concurrency_keys AS k ",
            key_join!("concurrency_key_limits", "x"),
            " WHERE k.namespace = l.namespace AND k.activity_type = l.activity_type \
                   AND k.running >= COALESCE(x.max_running, l.max_running)) \
             FROM concurrency_limits AS l WHERE ",
            $ns,
            " IS NULL OR l.namespace = ",
            $ns,
            " UNION ALL \
             SELECT x.namespace, x.activity_type, x.concurrency_key, \
               COALESCE(x.max_running, 0), x.weight, \
               (SELECT COUNT(*) FROM concurrency_keys AS k WHERE k.namespace = x.namespace \
                 AND k.activity_type = x.activity_type AND k.concurrency_key = x.concurrency_key \
                 AND (k.waiting > 0 OR k.running > 0)), \
               COALESCE((SELECT k.running FROM concurrency_keys AS k \
                 WHERE k.namespace = x.namespace AND k.activity_type = x.activity_type \
                   AND k.concurrency_key = x.concurrency_key), 0), \
               COALESCE((SELECT l.strategy FROM concurrency_limits AS l \
                 WHERE l.namespace = x.namespace AND l.activity_type = x.activity_type), 0), \
               COALESCE((SELECT k.waiting FROM concurrency_keys AS k \
                 WHERE k.namespace = x.namespace AND k.activity_type = x.activity_type \
                   AND k.concurrency_key = x.concurrency_key \
                   AND k.running >= COALESCE(x.max_running, (SELECT l.max_running \
                     FROM concurrency_limits AS l WHERE l.namespace = x.namespace \
                       AND l.activity_type = x.activity_type), 9223372036854775807)), 0) \
             FROM concurrency_key_limits AS x WHERE ",
            $ns,
            " IS NULL OR x.namespace = ",
            $ns
        )
    };
}

/// The keys of type `$2` of namespace `$1` among those `$keys` selects (a
/// condition on `k.concurrency_key`) with more rows waiting and running than their
/// limit (the key's own, else the type's) and a strategy that cancels: each with
/// that limit and the type's strategy.
macro_rules! over_limit {
    ($ns:literal, $type:literal, $keys:literal) => {
        concat!(
            "SELECT k.concurrency_key, COALESCE(x.max_running, l.max_running), l.strategy \
             FROM concurrency_limits AS l \
             JOIN concurrency_keys AS k ON k.namespace = l.namespace \
               AND k.activity_type = l.activity_type ",
            key_join!("concurrency_key_limits", "x"),
            " WHERE l.namespace = ",
            $ns,
            " AND l.activity_type = ",
            $type,
            " AND k.concurrency_key ",
            $keys,
            " AND l.strategy > 0 AND k.waiting + k.running > COALESCE(x.max_running, l.max_running) \
             ORDER BY k.concurrency_key"
        )
    };
}

/// The invoking dialect's [`Statements`](crate::store::settings::Statements),
/// from its `sql` module's constants (the names are the same in both).
macro_rules! setting_statements {
    () => {
        crate::store::settings::Statements {
            set_rate_limit: SET_RATE_LIMIT,
            set_key_rate_limit: SET_KEY_RATE_LIMIT,
            set_concurrency_limit: SET_CONCURRENCY_LIMIT,
            set_key_limit: SET_KEY_LIMIT,
            set_fairness_weight: SET_FAIRNESS_WEIGHT,
            remove_rate_limit: REMOVE_RATE_LIMIT,
            remove_key_rate_limit: REMOVE_KEY_RATE_LIMIT,
            remove_concurrency_limit: REMOVE_CONCURRENCY_LIMIT,
            remove_key_limit: REMOVE_KEY_LIMIT,
            remove_fairness_weight: REMOVE_FAIRNESS_WEIGHT,
        }
    };
}

/// The statement that picks a key's active rows beyond its limit for a
/// [`Strategy`](crate::store::concurrency::Strategy) to cancel, from the invoking
/// dialect's `sql` module; `None` for the strategy that cancels nothing.
macro_rules! beyond_limit {
    ($strategy:expr) => {
        match $strategy {
            crate::store::concurrency::Strategy::Queue => None,
            crate::store::concurrency::Strategy::CancelNewest => Some(sql::ACTIVE_OF_KEY),
            crate::store::concurrency::Strategy::CancelInProgress => {
                Some(sql::ACTIVE_OF_KEY_NEWEST)
            }
        }
    };
}

/// A dialect's embedded migrations, named by their files' stems in
/// `migrations/<dialect>/` (`0001_activities`: version 1, `activities`).
macro_rules! migrations {
    ($dialect:literal, $($stem:literal),+ $(,)?) => {
        sqlx::migrate::Migrator::with_migrations(vec![$(
            crate::store::migration(
                $stem,
                include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/src/store/migrations/",
                    $dialect,
                    "/",
                    $stem,
                    ".sql"
                )),
            ),
        )+])
    };
}
