//! Statements of settings and sessions: resume tickets and takeovers, the
//! priority aging and its re-ranking pass, limits and weights set and removed.

/// Deletes up to `$2` tickets last saved before `$1`.
pub const PRUNE_TICKETS: &str = "DELETE FROM worker_sessions WHERE worker_id = ANY(ARRAY( \
     SELECT worker_id FROM worker_sessions WHERE updated_at < $1 LIMIT $2))";

/// Keeps session `$1`'s ticket `$2` for caller `$3` and registration `$4`, at `$5`.
pub const SAVE_TICKET: &str = "INSERT INTO worker_sessions \
       (worker_id, ticket, caller, registration, updated_at) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (worker_id) DO UPDATE SET ticket = EXCLUDED.ticket, \
       caller = EXCLUDED.caller, registration = EXCLUDED.registration, \
       updated_at = EXCLUDED.updated_at";

/// Replaces session `$1`'s ticket `$2` with `$3`, if caller `$4` and registration
/// `$5` match (at `$6`); a row back means taken.
pub const TAKE_TICKET: &str = "UPDATE worker_sessions SET ticket = $3, updated_at = $6 \
     WHERE worker_id = $1 AND ticket = $2 AND caller = $4 AND registration = $5 \
     RETURNING worker_id";

/// Session `$1`'s RUNNING rows, now node `$2`'s (without payloads).
pub const ADOPT: &str = concat!(
    "UPDATE activities AS a SET worker_node = $2 WHERE a.worker_id = $1 AND a.status = 2 \
     RETURNING ",
    light!()
);

/// Sets the priority aging to `$1` ms, when it is not that already, and starts a
/// pass that ranks every row stored so far again ([`RERANK_RANGE`]); the row
/// lock makes nodes changing it at once take turns.
pub const SET_PRIORITY_AGING: &str = "UPDATE dispatch_settings SET priority_aging_ms = $1, \
     rerank_after = 0, rerank_to = (SELECT COALESCE(MAX(id), 0) FROM activities) \
     WHERE priority_aging_ms <> $1";

/// Where the re-ranking pass stands, while one is left to do; a node whose
/// step finds the row locked (another node's step, or a change of the
/// setting) leaves this round to it.
pub const RERANK_PENDING: &str = "SELECT rerank_after, rerank_to FROM dispatch_settings \
     WHERE rerank_after < rerank_to FOR UPDATE SKIP LOCKED";

/// Puts the waiting rows with ids in `($1, $2]` where the current setting ranks
/// them: a range of the primary key.
pub const RERANK_RANGE: &str = concat!(
    "UPDATE activities SET claim_band = ",
    band!("priority", "concurrency_key"),
    ", claim_rank = ",
    rank!("COALESCE(fair_at, next_at)", "priority"),
    " WHERE id > $1 AND id <= $2 AND status = 1"
);

/// The pass has ranked every id up to `$1`.
pub const RERANK_MOVE: &str = "UPDATE dispatch_settings SET rerank_after = $1";

/// Sets a rate limit (`$3` rows per `$4` ms, `$5` at once, one per `$6` ns); a
/// replaced one keeps its bucket.
pub const SET_RATE_LIMIT: &str = "INSERT INTO rate_limits \
       (namespace, activity_type, per_period, period_ms, burst, interval_ns) \
     VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (namespace, activity_type) DO UPDATE SET per_period = excluded.per_period, \
       period_ms = excluded.period_ms, burst = excluded.burst, \
       interval_ns = excluded.interval_ns";

pub const REMOVE_RATE_LIMIT: &str =
    "DELETE FROM rate_limits WHERE namespace = $1 AND activity_type = $2";

pub const SET_KEY_RATE_LIMIT: &str = set_key_rate_limit!("$");

pub const REMOVE_KEY_RATE_LIMIT: &str = "DELETE FROM key_rate_limits \
     WHERE namespace = $1 AND activity_type = $2 AND concurrency_key = $3";

/// Sets the concurrency limit of type `$2` of namespace `$1` to `$3` running rows
/// per key.
pub const SET_CONCURRENCY_LIMIT: &str = "INSERT INTO concurrency_limits \
       (namespace, activity_type, max_running, strategy) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (namespace, activity_type) DO UPDATE SET max_running = excluded.max_running, \
       strategy = excluded.strategy";

pub const REMOVE_CONCURRENCY_LIMIT: &str =
    "DELETE FROM concurrency_limits WHERE namespace = $1 AND activity_type = $2";

/// Sets what key `$3` of type `$2` of namespace `$1` may run (`$4`, the type's
/// limit when NULL) and its weight `$5`.
pub const SET_KEY_LIMIT: &str = "INSERT INTO concurrency_key_limits \
       (namespace, activity_type, concurrency_key, max_running, weight) \
       VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (namespace, activity_type, concurrency_key) \
       DO UPDATE SET max_running = excluded.max_running, weight = excluded.weight";

pub const REMOVE_KEY_LIMIT: &str = "DELETE FROM concurrency_key_limits \
     WHERE namespace = $1 AND activity_type = $2 AND concurrency_key = $3";

pub const SET_FAIRNESS_WEIGHT: &str = "INSERT INTO fairness_weights \
       (namespace, activity_type, fairness_key, weight) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (namespace, activity_type, fairness_key) \
       DO UPDATE SET weight = excluded.weight";

pub const REMOVE_FAIRNESS_WEIGHT: &str = "DELETE FROM fairness_weights \
     WHERE namespace = $1 AND activity_type = $2 AND fairness_key = $3";

/// The statements above, for the settings' writes (`store::settings`).
pub const SETTINGS: crate::store::settings::Statements = setting_statements!();
