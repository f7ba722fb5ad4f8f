//! Every statement the SQLite store runs, in one place. What a write does is decided
//! in `store::change`; these only say it in SQLite's SQL. Statuses appear as the
//! wire enum's numbers: 1 SCHEDULED, 2 RUNNING, 3 COMPLETED, 4 FAILED, 5 CANCELLED.

use std::sync::LazyLock;

/// The one `SET` clause of every ending (`change::Ending`), its values bound as
/// `?1`…`?14` in the order `writer::bind_ending` binds them; each statement's own
/// parameters start at `?15`.
macro_rules! ending {
    () => {
        concat!(
            "status = ?1, next_at = COALESCE(?2, next_at), finished_at = ?3, \
         uncounted = uncounted + ?4, lease_expires_at = NULL, output_type = ?5, output = ?6, \
         error_kind = CASE WHEN ?7 THEN ?8 ELSE error_kind END, \
         error_type = CASE WHEN ?7 THEN ?9 ELSE error_type END, \
         error_message = CASE WHEN ?7 THEN ?10 ELSE error_message END, \
         error_details_type = CASE WHEN ?7 THEN ?11 ELSE error_details_type END, \
         error_details = CASE WHEN ?7 THEN ?12 ELSE error_details END, \
         attempt_outcome = CASE WHEN status = 2 THEN ?13 ELSE attempt_outcome END, \
         attempt_ended_at = CASE WHEN status = 2 THEN ?14 ELSE attempt_ended_at END, \
         claim_band = CASE WHEN ?2 IS NULL THEN claim_band ELSE ",
            band!("priority", "concurrency_key"),
            " END, \
         claim_rank = COALESCE(",
            rank!("?2", "priority"),
            ", claim_rank), fair_at = CASE WHEN ?2 IS NULL THEN fair_at END"
        )
    };
}

/// Which row an ending of [`FINISH`] and [`FINISH_AGAIN`] applies to.
macro_rules! finish_where {
    () => {
        " WHERE id = ?15 AND attempt = ?16 AND status = 2 \
          AND (?17 IS NULL OR lease_expires_at < ?17) \
          AND (?18 IS NULL OR worker_node = ?18)"
    };
}

/// The typed empty BLOB and NULLs `light_columns!` needs.
macro_rules! light {
    () => {
        light_columns!("X''", "NULL", "NULL")
    };
}

/// Inserts one activity unless its key exists: `?21` its fairness key, `?22` its
/// place on the key's chain (`FAIR_PLACE`).
pub const INSERT: &str = concat!(
    "INSERT INTO activities (namespace, workflow_id, activity_id, \
     activity_type, status, max_attempts, initial_interval_ms, backoff_coefficient, \
     max_interval_ms, non_retryable, heartbeat_timeout_ms, start_to_close_ms, \
     schedule_to_close_ms, priority, input_type, input, created_at, next_at, expires_at, \
     headers, concurrency_key, fairness_key, fair_at, claim_band, claim_rank) \
     VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, \
             ?19, ?20, ?21, ?22, ",
    band!("?13", "?20"),
    ", ",
    rank!("COALESCE(?22, ?17)", "?13"),
    ") ON CONFLICT (namespace, workflow_id, activity_id) DO NOTHING RETURNING id"
);

/// Moves the chain of fairness key `?3` of type `?2` of namespace `?1` on by
/// the key's set weight's stride, else by `?5` µs, for a row of priority `?6` and
/// concurrency key `?7` submitted at `?4` (ms), and returns where it is now: from
/// the later of the chain and the head of the row's band, or now when the band has
/// no row waiting (see `store::fairness`).
pub const FAIR_PLACE: &str = concat!(
    "INSERT INTO fairness_keys (namespace, activity_type, claim_band, fairness_key, last_us) \
     SELECT ?1, ?2, b.band, ?3, COALESCE(",
    fair_head!("?1", "?2", "b.band", "?4"),
    ", ?4) * 1000 + b.stride \
     FROM (SELECT ",
    band!("?6", "?7"),
    " AS band, ",
    fair_stride!("?1", "?2", "?3", "?5"),
    " AS stride) AS b WHERE TRUE \
     ON CONFLICT (namespace, activity_type, claim_band, fairness_key) \
       DO UPDATE SET last_us = MAX(last_us + ",
    fair_stride!("?1", "?2", "?3", "?5"),
    ", excluded.last_us) \
     RETURNING last_us"
);

/// Deletes the chains of fairness keys that no longer change where a row goes:
/// those behind the head of their band, or behind `?1` (ms) when it has no row
/// waiting (see `store::fairness`).
pub const SWEEP_FAIRNESS: &str = concat!(
    "DELETE FROM fairness_keys AS f WHERE f.last_us <= COALESCE(",
    fair_head!("f.namespace", "f.activity_type", "f.claim_band", "?1"),
    ", ?1) * 1000"
);

/// Whether activity `?3` of workflow `?2` of namespace `?1` is stored.
pub const EXISTS_BY_KEY: &str =
    "SELECT 1 FROM activities WHERE namespace = ?1 AND workflow_id = ?2 AND activity_id = ?3";

pub const SELECT_BY_KEY: &str =
    select_rows!(rows "WHERE namespace = ?1 AND workflow_id = ?2 AND activity_id = ?3");

/// [`SELECT_BY_KEY`] without payloads.
pub const SELECT_LIGHT_BY_KEY: &str =
    select_rows!(light "WHERE namespace = ?1 AND workflow_id = ?2 AND activity_id = ?3");

/// The next `?4` due rows without a concurrency key of type `?3` of namespace
/// `?2` at `?1`, in claim order, read without changing them: the writer then
/// claims them with [`CLAIM_ROWS`] in the same transaction. Read once here, a
/// row is neither looked up a second time nor copied through the temporary
/// table a `RETURNING` fills; the writer being the only one writing, no row can
/// change between the two.
pub const CLAIM_PICK: &str = select_rows!(rows "INDEXED BY activities_due \
     WHERE namespace = ?2 AND activity_type = ?3 AND status = 1 AND next_at <= ?1 \
       AND (expires_at IS NULL OR expires_at > ?1) AND claim_band < 549755813888 \
     ORDER BY claim_band, claim_rank, id LIMIT ?4");

/// Claims the rows picked by [`CLAIM_PICK`] whose ids are `?6`…`?37` (up to
/// [`CLAIM_ROWS_AT_ONCE`]; the slots left unbound are NULL and match nothing):
/// `?1` now, `?2` worker, `?3` lease end, `?4` the worker's identity, `?5` the
/// node. One statement for many rows rather than one a row: a statement's own
/// cost (binding, opening a cursor on every index, halting) was a seventh of a
/// claim's. `OR IGNORE` because no constraint can fail here, and a statement
/// that could abort after changing some rows would first copy every page it
/// touches into a statement journal; the writer counts the rows changed instead.
/// `writer::claimed_as` reads a row as this leaves it.
pub const CLAIM_ROWS: &str = "UPDATE OR IGNORE activities SET status = 2, \
     attempt = attempt + 1, started_at = ?1, worker_id = ?2, lease_expires_at = ?3, \
     worker_identity = ?4, worker_node = ?5 \
     WHERE id IN (?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, \
       ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33, ?34, ?35, ?36, \
       ?37) AND status = 1";

/// How many ids [`CLAIM_ROWS`] takes.
pub const CLAIM_ROWS_AT_ONCE: usize = 32;

/// Claims up to `?6` due rows of concurrency key `?9` of type `?5` of namespace
/// `?4` at `?1` for worker `?2` (lease end `?3`, its identity `?7`, the node
/// `?8`; the `SET` of [`CLAIM_ROWS`]), in claim order, read from the
/// writer's own index of them ([`KEYED_WAITING`]); setting `concurrency_key` to
/// itself fires the trigger that takes the rows out of it.
pub const CLAIM_KEYED: &str = concat!(
    "UPDATE activities SET status = 2, attempt = attempt + 1, started_at = ?1, \
     worker_id = ?2, lease_expires_at = ?3, worker_identity = ?7, \
     worker_node = ?8, concurrency_key = concurrency_key \
     WHERE id IN (SELECT w.id FROM keyed_waiting AS w \
         JOIN main.activities AS a ON a.id = w.id \
       WHERE w.concurrency_key = ?9 AND w.namespace = ?4 AND w.activity_type = ?5 \
         AND w.next_at <= ?1 AND a.status = 1 \
         AND (a.expires_at IS NULL OR a.expires_at > ?1) \
       ORDER BY w.claim_band, w.claim_rank, w.id LIMIT ?6) \
     RETURNING ",
    columns!(),
    ", claim_band, claim_rank"
);

/// [`CLAIM_KEYED`] of one row of each concurrency key in the JSON array `?9`, at
/// most `?6`: one statement where a claim serves many keys.
pub const CLAIM_KEYED_ROUND: &str = concat!(
    "UPDATE activities SET status = 2, attempt = attempt + 1, started_at = ?1, \
     worker_id = ?2, lease_expires_at = ?3, worker_identity = ?7, \
     worker_node = ?8, concurrency_key = concurrency_key \
     WHERE id IN (SELECT (SELECT w.id FROM keyed_waiting AS w \
           JOIN main.activities AS a ON a.id = w.id \
         WHERE w.concurrency_key = r.value AND w.namespace = ?4 AND w.activity_type = ?5 \
           AND w.next_at <= ?1 AND a.status = 1 \
           AND (a.expires_at IS NULL OR a.expires_at > ?1) \
         ORDER BY w.claim_band, w.claim_rank, w.id LIMIT 1) \
       FROM json_each(?9) AS r LIMIT ?6) \
     RETURNING ",
    columns!(),
    ", claim_band, claim_rank"
);

/// The writer's own index of the waiting rows that have a concurrency key, in
/// claim order key by key (see the `0018_keyed_waiting_in_memory` migration): a
/// table of an in-memory database of the writer's connection. The submit adds
/// its keyed rows ([`KEYED_WAITING_ADD`]); temporary triggers follow every other
/// statement that moves a keyed row into or out of SCHEDULED: a delete, and
/// every update that names `expires_at` (the moves the attempt records follow,
/// `0017_moves_on_expires_at`) or `concurrency_key` (the keyed claims, which set
/// it to itself). Filled by [`KEYED_WAITING_FILL`].
pub const KEYED_WAITING: &str = "\
ATTACH DATABASE ':memory:' AS writer;
CREATE TABLE writer.keyed_waiting (
    concurrency_key TEXT    NOT NULL,
    namespace       TEXT    NOT NULL,
    activity_type   TEXT    NOT NULL,
    claim_band      INTEGER NOT NULL,
    claim_rank      INTEGER NOT NULL,
    id              INTEGER NOT NULL,
    next_at         INTEGER NOT NULL,
    PRIMARY KEY (concurrency_key, namespace, activity_type, claim_band, claim_rank, id)
) WITHOUT ROWID;
CREATE INDEX writer.keyed_waiting_due
    ON keyed_waiting (concurrency_key, namespace, activity_type, next_at);
CREATE TEMP TRIGGER keyed_waiting_moved AFTER UPDATE OF expires_at, concurrency_key
    ON main.activities
WHEN NEW.concurrency_key IS NOT NULL AND (OLD.status = 1 OR NEW.status = 1)
BEGIN
    DELETE FROM keyed_waiting
     WHERE OLD.status = 1 AND concurrency_key = OLD.concurrency_key
       AND namespace = OLD.namespace AND activity_type = OLD.activity_type
       AND claim_band = OLD.claim_band AND claim_rank = OLD.claim_rank AND id = OLD.id;
    INSERT INTO keyed_waiting
    SELECT NEW.concurrency_key, NEW.namespace, NEW.activity_type, NEW.claim_band,
           NEW.claim_rank, NEW.id, NEW.next_at
     WHERE NEW.status = 1;
END;
CREATE TEMP TRIGGER keyed_waiting_deleted AFTER DELETE ON main.activities
WHEN OLD.status = 1 AND OLD.concurrency_key IS NOT NULL
BEGIN
    DELETE FROM keyed_waiting
     WHERE concurrency_key = OLD.concurrency_key
       AND namespace = OLD.namespace AND activity_type = OLD.activity_type
       AND claim_band = OLD.claim_band AND claim_rank = OLD.claim_rank AND id = OLD.id;
END;";

/// Adds row `?1`, just inserted, to [`KEYED_WAITING`] if it waits with a key.
pub const KEYED_WAITING_ADD: &str = "INSERT INTO writer.keyed_waiting \
     SELECT concurrency_key, namespace, activity_type, claim_band, claim_rank, id, next_at \
       FROM main.activities WHERE id = ?1 AND status = 1 AND concurrency_key IS NOT NULL";

/// Fills [`KEYED_WAITING`] from the rows, afresh. Keyed rows sort after every
/// unkeyed one of their type in `activities_due` (`claim_band` from 2^39 on, see
/// the `0009_concurrency_keys` migration), and every type with keyed rows
/// waiting has their keys in `concurrency_keys`: so this reads only the keyed
/// part of `activities_due`, however many unkeyed rows wait. Sorted first, the
/// rows go into the index in its order: a server with 1,000,000 keyed rows
/// waiting starts in 1.3 s, against 3.9 s with the rows in the order read.
pub const KEYED_WAITING_FILL: &str = "\
BEGIN;
DELETE FROM writer.keyed_waiting;
INSERT INTO writer.keyed_waiting
SELECT a.concurrency_key, a.namespace, a.activity_type, a.claim_band, a.claim_rank, a.id,
       a.next_at
  FROM (SELECT DISTINCT namespace, activity_type FROM main.concurrency_keys) AS t
  JOIN main.activities AS a INDEXED BY activities_due
    ON a.namespace = t.namespace AND a.activity_type = t.activity_type
 WHERE a.status = 1 AND a.claim_band >= 549755813888 AND a.concurrency_key IS NOT NULL
 ORDER BY 1, 2, 3, 4, 5, 6;
COMMIT;";

/// Up to `?3` concurrency keys of type `?2` of namespace `?1` with a row due,
/// room to run more and tokens in their own bucket at `?4` (milliseconds), lowest
/// pass first. A key whose rows are all due later is passed over, not counted
/// against `?3`: keys before it in pass order with nothing due must not hold a
/// due row back (the claim would come back empty, and the group wait for the
/// next row to come due); with that room (or fewer tokens), their weight and bucket's
/// interval (see the `0012_key_shares` and `0013_key_rate_limits` migrations).
pub const READY_KEYS: &str = concat!(
    "SELECT concurrency_key, room, weight, interval_ns FROM (\
       SELECT k.concurrency_key, k.served_at, COALESCE(x.weight, 1) AS weight, r.interval_ns, \
         MIN(COALESCE(x.max_running, (SELECT max_running FROM concurrency_limits AS l \
                   WHERE l.namespace = ?1 AND l.activity_type = ?2), 2147483647) - k.running, ",
    key_tokens!("?4"),
    ") AS room \
       FROM concurrency_keys AS k INDEXED BY concurrency_keys_ready ",
    key_join!("concurrency_key_limits", "x"),
    " ",
    key_join!("key_rate_limits", "r"),
    " WHERE k.namespace = ?1 AND k.activity_type = ?2 AND k.waiting > 0 \
         AND EXISTS (SELECT 1 FROM keyed_waiting AS w INDEXED BY keyed_waiting_due \
           JOIN main.activities AS a ON a.id = w.id \
           WHERE w.concurrency_key = k.concurrency_key AND w.namespace = ?1 \
             AND w.activity_type = ?2 AND w.next_at <= ?4 \
             AND (a.expires_at IS NULL OR a.expires_at > ?4)) \
       ORDER BY k.served_at, k.concurrency_key) \
     WHERE room > 0 LIMIT ?3"
);

/// Counts the `?4` rows a claim gave key `?3` of type `?2` of namespace `?1`,
/// moves its pass on by `?5` (`concurrency::stride` a row), and its bucket, if it
/// has one, by its interval `?6` a row from `?7` (nanoseconds).
pub const SERVE_KEY: &str = "UPDATE concurrency_keys \
     SET waiting = waiting - ?4, running = running + ?4, served_at = served_at + ?5, \
       tat_ns = CASE WHEN ?6 IS NULL OR ?4 = 0 THEN tat_ns ELSE MAX(tat_ns, ?7) + ?4 * ?6 END \
     WHERE namespace = ?1 AND activity_type = ?2 AND concurrency_key = ?3";

/// Sets the concurrency limit of type `?2` of namespace `?1` to `?3` running rows
/// per key.
pub const SET_CONCURRENCY_LIMIT: &str = "INSERT INTO concurrency_limits \
       (namespace, activity_type, max_running, strategy) VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (namespace, activity_type) DO UPDATE SET max_running = excluded.max_running, \
       strategy = excluded.strategy";

pub const REMOVE_CONCURRENCY_LIMIT: &str =
    "DELETE FROM concurrency_limits WHERE namespace = ?1 AND activity_type = ?2";

/// Sets what key `?3` of type `?2` of namespace `?1` may run (`?4`, the type's
/// limit when NULL) and its weight `?5`.
pub const SET_KEY_LIMIT: &str = "INSERT INTO concurrency_key_limits \
       (namespace, activity_type, concurrency_key, max_running, weight) \
       VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (namespace, activity_type, concurrency_key) \
       DO UPDATE SET max_running = excluded.max_running, weight = excluded.weight";

pub const REMOVE_KEY_LIMIT: &str = "DELETE FROM concurrency_key_limits \
     WHERE namespace = ?1 AND activity_type = ?2 AND concurrency_key = ?3";

pub const SET_FAIRNESS_WEIGHT: &str = "INSERT INTO fairness_weights \
       (namespace, activity_type, fairness_key, weight) VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (namespace, activity_type, fairness_key) \
       DO UPDATE SET weight = excluded.weight";

pub const REMOVE_FAIRNESS_WEIGHT: &str = "DELETE FROM fairness_weights \
     WHERE namespace = ?1 AND activity_type = ?2 AND fairness_key = ?3";

/// The fairness weights of namespace `?1` (of all, when NULL), in order (see
/// `rows::fairness_weight`).
pub const FAIRNESS_WEIGHTS: &str = "SELECT namespace, activity_type, fairness_key, weight \
     FROM fairness_weights WHERE ?1 IS NULL OR namespace = ?1 ORDER BY 1, 2, 3";

/// The waiting rows of type `?2` of namespace `?1` by fairness key, among the
/// first `waiting_counted!` in claim order (one range of `activities_due`), and
/// whether more are waiting (read along the index alone).
pub const WAITING_BY_FAIRNESS_KEY: &str = concat!(
    "SELECT fairness_key, COUNT(*), \
       EXISTS (SELECT 1 FROM activities INDEXED BY activities_due \
         WHERE namespace = ?1 AND activity_type = ?2 AND status = 1 \
         ORDER BY claim_band, claim_rank, id LIMIT 1 OFFSET ",
    waiting_counted!(),
    ") FROM (SELECT fairness_key FROM activities INDEXED BY activities_due \
         WHERE namespace = ?1 AND activity_type = ?2 AND status = 1 \
         ORDER BY claim_band, claim_rank, id LIMIT ",
    waiting_counted!(),
    ") GROUP BY fairness_key"
);

/// The concurrency limits of namespace `?1` (of all, when NULL), each type's then
/// its keys', in order (see `rows::concurrency_limit`).
pub const CONCURRENCY_LIMITS: &str = concat!(
    "SELECT * FROM (",
    concurrency_limits!("?1", ""),
    ") ORDER BY 1, 2, 3 NULLS FIRST"
);

/// Ends attempt `?16` of row `?15` for good, if it still runs (and, with `?17`,
/// only if its lease expired before then; with `?18`, only while it is that
/// node's). The writer counts a keyed row's move (see the `0014_keyed_endings`
/// migration); no trigger follows it (`0017_moves_on_expires_at`).
pub const FINISH: &str = concat!("UPDATE activities SET ", ending!(), finish_where!());

/// [`FINISH`] of an ending that keeps `next_at` and the last error and counts
/// the attempt (every completion; see `writer::lean`): only the columns it
/// changes, bound in the order of `ending!` (`?1`, `?3`, `?5`, `?6`, `?13`,
/// `?14`) with [`FINISH`]'s own parameters, so that the two cannot drift apart.
pub const FINISH_LEAN: &str = concat!(
    "UPDATE activities SET status = ?1, finished_at = ?3, lease_expires_at = NULL, \
     output_type = ?5, output = ?6, attempt_outcome = ?13, attempt_ended_at = ?14",
    finish_where!()
);

/// How many completions [`COMPLETE_ROWS`] ends in one statement.
pub const COMPLETE_ROWS_AT_ONCE: usize = 32;

/// [`FINISH_LEAN`] of up to [`COMPLETE_ROWS_AT_ONCE`] endings alike but for their
/// rows, attempts and outputs, none guarded by its lease and each of another
/// row: `?1` the status, `?2` `finished_at`, `?3` the attempt's outcome, `?4` its
/// end, `?5` the node (as `?18` of [`FINISH`]); then the k-th ending's (from 0)
/// row `?(6+4k)`, output type `?(7+4k)`, output `?(8+4k)` and attempt `?(9+4k)`.
/// The rows are bound in ascending order and the slots after the last filled
/// with the last again: a row's values are then found by halving the slots (five
/// comparisons a value, where a `CASE` of every slot took sixteen on average).
///
/// One statement for many rather than one a row, as [`CLAIM_ROWS`] (a statement's
/// binding, cursors and halt), and `OR IGNORE` for the same reason: no constraint
/// can fail here (no column it sets is `NOT NULL` but `status`). The endings
/// accepted are the rows it updates, which the writer is told of as they are
/// written (`raw::Query::execute_updated`). Not by `RETURNING`: SQLite runs one
/// as a trigger, and a statement with one updates in two passes, first copying
/// every row it changes into a temporary table; nor by reading the rows still
/// running first, a second seek of every row.
pub static COMPLETE_ROWS: LazyLock<String> = LazyLock::new(|| {
    let ids: Vec<String> = (0..COMPLETE_ROWS_AT_ONCE)
        .map(|k| format!("?{}", completion_slot(k)))
        .collect();
    format!(
        "UPDATE OR IGNORE activities SET status = ?1, finished_at = ?2, \
         lease_expires_at = NULL, output_type = {}, output = {}, attempt_outcome = ?3, \
         attempt_ended_at = ?4 \
         WHERE id IN ({}) AND status = 2 AND attempt = {} AND (?5 IS NULL OR worker_node = ?5)",
        slot_value(0..COMPLETE_ROWS_AT_ONCE, 1),
        slot_value(0..COMPLETE_ROWS_AT_ONCE, 2),
        ids.join(", "),
        slot_value(0..COMPLETE_ROWS_AT_ONCE, 3),
    )
});

/// The parameter of the row of the k-th [`COMPLETE_ROWS`] slot (from 0); its
/// output type, output and attempt follow it.
const fn completion_slot(k: usize) -> usize {
    6 + 4 * k
}

/// The parameter `of` after the row's own among the [`COMPLETE_ROWS`] slots
/// `slots`, found by halving them (their rows ascend).
fn slot_value(slots: std::ops::Range<usize>, of: usize) -> String {
    if slots.len() == 1 {
        return format!("?{}", completion_slot(slots.start) + of);
    }
    let mid = slots.start + slots.len() / 2;
    format!(
        "CASE WHEN id < ?{} THEN {} ELSE {} END",
        completion_slot(mid),
        slot_value(slots.start..mid, of),
        slot_value(mid..slots.end, of)
    )
}

/// [`FINISH`] of an attempt whose row waits again (a retry, a snooze, a release):
/// `expires_at` is set so that the attempt's history is kept
/// (`0017_moves_on_expires_at`).
pub const FINISH_AGAIN: &str = concat!(
    "UPDATE activities SET ",
    ending!(),
    ", expires_at = expires_at",
    finish_where!()
);

/// Counts `?4` rows of key `?3` of type `?2` of namespace `?1` out of RUNNING,
/// unless they were all it had (then [`KEY_IDLE`]). Only the table's row changes:
/// `running` is in no index.
pub const KEY_ENDED: &str = "UPDATE concurrency_keys SET running = running - ?4 \
     WHERE namespace = ?1 AND activity_type = ?2 AND concurrency_key = ?3 \
       AND (waiting > 0 OR running > ?4)";

/// [`KEY_ENDED`] whatever the key has left.
pub const KEY_ENDED_ALL: &str = "UPDATE concurrency_keys SET running = running - ?4 \
     WHERE namespace = ?1 AND activity_type = ?2 AND concurrency_key = ?3";

/// [`KEY_ENDED`] of `?4` rows, `?5` of them waiting again: a key that starts
/// waiting again starts at the lowest pass of the keys waiting now (see
/// `0012_key_shares`).
pub const KEY_ENDED_WAITING: &str = "UPDATE concurrency_keys \
     SET running = running - ?4, waiting = waiting + ?5, \
       served_at = CASE WHEN waiting = 0 THEN MAX(served_at, \
         (SELECT COALESCE(MIN(k.served_at), 0) FROM concurrency_keys AS k \
           WHERE k.namespace = ?1 AND k.activity_type = ?2 AND k.waiting > 0)) \
         ELSE served_at END \
     WHERE namespace = ?1 AND activity_type = ?2 AND concurrency_key = ?3";

/// Deletes the row of key `?3` of type `?2` of namespace `?1`, whose last `?4`
/// running rows ended with none waiting, unless it keeps a bucket of its own.
pub const KEY_IDLE: &str = "DELETE FROM concurrency_keys \
     WHERE namespace = ?1 AND activity_type = ?2 AND concurrency_key = ?3 \
       AND waiting = 0 AND running = ?4 \
       AND NOT EXISTS (SELECT 1 FROM key_rate_limits AS r \
         WHERE r.namespace = ?1 AND r.activity_type = ?2 AND r.concurrency_key = ?3)";

/// Ends row `?15`, which the same transaction found cancellable (`expires_at`
/// set to itself: the triggers follow the move, `0017_moves_on_expires_at`).
pub const CANCEL: &str = concat!(
    "UPDATE activities SET ",
    ending!(),
    ", expires_at = expires_at WHERE id = ?15 RETURNING ",
    columns!()
);

/// Ends up to `?16` SCHEDULED rows whose schedule-to-close deadline passed by `?15`
/// (`expires_at` set to itself: the triggers follow the move).
pub const EXPIRE: &str = concat!(
    "UPDATE activities SET ",
    ending!(),
    ", expires_at = expires_at WHERE id IN (SELECT id FROM activities \
       WHERE status = 1 AND expires_at IS NOT NULL AND expires_at <= ?15 LIMIT ?16) \
     RETURNING namespace, workflow_id, activity_id"
);

/// Re-drives row `?1` (see `change::Redrive`): due at `?2`, deadline `?3`.
pub const REDRIVE: &str = concat!(
    "UPDATE activities SET status = 1, next_at = ?2, uncounted = attempt, \
     finished_at = NULL, output_type = NULL, output = NULL, error_kind = NULL, \
     error_type = NULL, error_message = NULL, error_details_type = NULL, error_details = NULL, \
     expires_at = ?3, claim_band = ",
    band!("priority", "concurrency_key"),
    ", claim_rank = ",
    rank!("?2", "priority"),
    ", fair_at = NULL WHERE id = ?1 RETURNING ",
    columns!()
);

/// Extends the lease of attempt `?3` of row `?2` to `?1`, if it still runs.
pub const RENEW: &str = "UPDATE activities SET lease_expires_at = ?1 \
     WHERE id = ?2 AND attempt = ?3 AND status = 2";

/// Stores the heartbeat details of attempt `?2` of row `?1`, if it still runs.
pub const RECORD_HEARTBEAT: &str = "UPDATE activities SET heartbeat_type = ?3, \
     heartbeat_details = ?4 WHERE id = ?1 AND attempt = ?2 AND status = 2";

/// Deletes up to `?2` rows finished before `?1`.
pub const PRUNE: &str = "DELETE FROM activities WHERE id IN (SELECT id FROM activities \
     WHERE status >= 3 AND finished_at < ?1 LIMIT ?2)";

/// A page's ids and stored sizes, to cut it by bytes before any payload is read
/// (`length` of a BLOB reads its size from the record header, not the blob):
/// `?1` namespace, `?2` the cursor, `?3` the status or NULL, `?4` the type or NULL,
/// `?5` the most rows. Each reads along the index named, none of which a status
/// change rewrites (see the `0005_transition_free_lists` migration); `INDEXED BY`
/// makes a plan that cannot use it an error, not a scan.
macro_rules! list_sizes {
    ($path:literal, $after:literal, $order:literal) => {
        concat!(
            "SELECT id, length(input) + ifnull(length(output), 0) \
               + ifnull(length(error_details), 0) + ifnull(length(heartbeat_details), 0) \
               + ifnull(length(error_message), 0) \
             FROM activities ",
            $path,
            " AND id ",
            $after,
            " ?2 AND (?3 IS NULL OR status = ?3) AND (?4 IS NULL OR activity_type = ?4) \
             ORDER BY id ",
            $order,
            " LIMIT ?5"
        )
    };
}

/// Which rows a list reads, and along which index.
macro_rules! list_paths {
    ($after:literal, $order:literal) => {
        crate::store::rows::ListSizes {
            any: list_sizes!(
                "INDEXED BY activities_namespace WHERE namespace = ?1",
                $after,
                $order
            ),
            // The due index holds every SCHEDULED row, in claim order: the page is
            // sorted from the namespace's waiting rows, read from the index alone.
            scheduled: list_sizes!(
                "INDEXED BY activities_due WHERE namespace = ?1 AND status = 1",
                $after,
                $order
            ),
            // RUNNING rows are at most the workers' slots (and the rows claimed
            // ahead for them), whatever the namespace holds.
            running: list_sizes!(
                "INDEXED BY activities_running WHERE status = 2 AND namespace = ?1",
                $after,
                $order
            ),
            // A finished status is always named on this path: the seek takes it.
            ended: list_sizes!(
                "INDEXED BY activities_ended WHERE namespace = ?1 AND status >= 3 AND status = ?3",
                $after,
                $order
            ),
        }
    };
}

pub const LIST_SIZES: crate::store::rows::ListSizes = list_paths!(">", "");
/// [`LIST_SIZES`] newest first: ids below `?2`.
pub const LIST_SIZES_NEWEST: crate::store::rows::ListSizes = list_paths!("<", "DESC");

/// Whether the statement of [`LIST_SIZES`] is kept prepared: yes, SQLite's
/// planner does not look at the values bound.
pub const LIST_SIZES_KEPT: bool = true;

/// [`LIST`]'s `?1`: the page's ids, as a JSON array (SQLite binds no arrays).
pub fn page_ids(ids: Vec<i64>) -> String {
    serde_json::Value::from(ids).to_string()
}

/// The rows of a page: the ids in the JSON array `?1` that still have status `?2`
/// (or any, when NULL), since a row may have moved on after its size was read.
pub const LIST: &str = select_rows!(rows "WHERE id IN (SELECT value FROM json_each(?1)) \
      AND (?2 IS NULL OR status = ?2) ORDER BY id");

/// [`LIST`] newest first.
pub const LIST_NEWEST: &str = select_rows!(rows "WHERE id IN (SELECT value FROM json_each(?1)) \
      AND (?2 IS NULL OR status = ?2) ORDER BY id DESC");

/// Counts of one namespace by status, from the same indexes as the lists.
pub const STATS: &str = "SELECT 1, COUNT(*) FROM activities INDEXED BY activities_due \
       WHERE namespace = ?1 AND status = 1 \
     UNION ALL \
     SELECT 2, COUNT(*) FROM activities INDEXED BY activities_running \
       WHERE status = 2 AND namespace = ?1 \
     UNION ALL \
     SELECT status, COUNT(*) FROM activities INDEXED BY activities_ended \
       WHERE namespace = ?1 AND status >= 3 GROUP BY status";

/// The attempt records of row `?1`, oldest first (columns as `rows::decode_attempt`
/// reads them): those kept in `attempts`, then the last one, which a finished row
/// describes itself (see the `0004_attempts` migration).
pub const HISTORY: &str = "SELECT attempt, worker_id, worker_identity, worker_node, \
       started_at, ended_at, outcome, error_kind, error_type, error_message, \
       error_details_type, error_details \
     FROM attempts WHERE activity_row = ?1 \
     UNION ALL \
     SELECT attempt, worker_id, worker_identity, worker_node, started_at, attempt_ended_at, \
       attempt_outcome, CASE WHEN has THEN error_kind END, CASE WHEN has THEN error_type END, \
       CASE WHEN has THEN error_message END, CASE WHEN has THEN error_details_type END, \
       CASE WHEN has THEN error_details END \
     FROM (SELECT *, attempt_outcome NOT IN ('completed', 'snoozed', 'released') AS has \
           FROM activities WHERE id = ?1 AND status >= 3 AND attempt_outcome IS NOT NULL \
             AND NOT EXISTS (SELECT 1 FROM attempts \
                             WHERE activity_row = ?1 AND attempts.attempt = activities.attempt)) \
     ORDER BY 1";

/// Counts by namespace, type, status and whether a SCHEDULED row waits past `?1`
/// (`rows::type_counts`); only the statuses a backlog is made of. Waiting rows are
/// counted from the due index alone.
pub const TYPE_COUNTS: &str = "SELECT namespace, activity_type, 1, \
       CASE WHEN next_at > ?1 THEN 1 ELSE 0 END AS later, COUNT(*) \
     FROM activities INDEXED BY activities_due WHERE status = 1 \
     GROUP BY namespace, activity_type, later \
     UNION ALL \
     SELECT namespace, activity_type, 2, 0, COUNT(*) \
     FROM activities INDEXED BY activities_running WHERE status = 2 \
     GROUP BY namespace, activity_type \
     UNION ALL \
     SELECT namespace, activity_type, 4, 0, COUNT(*) \
     FROM activities INDEXED BY activities_ended WHERE status >= 3 AND status = 4 \
     GROUP BY namespace, activity_type";

pub const RUNNING: &str = select_rows!(light "WHERE status = 2 AND id > ?1 ORDER BY id LIMIT ?2");

pub const EXPIRED_LEASES: &str = select_rows!(light "WHERE status = 2 AND lease_expires_at < ?1 \
      ORDER BY lease_expires_at LIMIT ?2");

/// Sets the priority aging to `?1` ms, when it is not that already (the first
/// statement of its transaction: it takes the write lock at once), and starts a
/// pass that ranks every row stored so far again ([`RERANK_RANGE`]).
pub const SET_PRIORITY_AGING: &str = "UPDATE dispatch_settings SET priority_aging_ms = ?1, \
     rerank_after = 0, rerank_to = (SELECT COALESCE(MAX(id), 0) FROM activities) \
     WHERE priority_aging_ms <> ?1";

/// Where the re-ranking pass stands, while one is left to do.
pub const RERANK_PENDING: &str =
    "SELECT rerank_after, rerank_to FROM dispatch_settings WHERE rerank_after < rerank_to";

/// Puts the waiting rows with ids in `(?1, ?2]` where the current setting ranks
/// them: a range of the rowid, whatever other index would serve `status = 1`.
/// `expires_at = expires_at` moves each keyed row in the writer's index too.
pub const RERANK_RANGE: &str = concat!(
    "UPDATE activities NOT INDEXED SET claim_band = ",
    band!("priority", "concurrency_key"),
    ", claim_rank = ",
    rank!("COALESCE(fair_at, next_at)", "priority"),
    ", expires_at = expires_at WHERE id > ?1 AND id <= ?2 AND status = 1"
);

/// The pass has ranked every id up to `?1`.
pub const RERANK_MOVE: &str = "UPDATE dispatch_settings SET rerank_after = ?1";

/// Walks the narrow `(next_at)` index of rows that were not due when written (see
/// the `0007_upcoming_rows_only` migration) in order and stops at `?2` rows; rows sharing
/// a time, namespace and type are folded by the caller, not by a GROUP BY (which
/// would read every row before the limit applies).
pub const DUE_TIMES: &str = "SELECT next_at, namespace, activity_type FROM activities \
     WHERE status = 1 AND next_at > created_at AND next_at > ?1 \
     ORDER BY next_at LIMIT ?2";

/// The bucket of type `?2` of namespace `?1`, when the type is rate limited (see
/// `store::rate` and the `0008_rate_limits` migration).
pub const BUCKET: &str = "SELECT interval_ns, burst, tat_ns FROM rate_limits \
     WHERE namespace = ?1 AND activity_type = ?2";

/// What a claim took from that bucket: `?3` its new `tat_ns`.
pub const SPEND: &str =
    "UPDATE rate_limits SET tat_ns = ?3 WHERE namespace = ?1 AND activity_type = ?2";

/// Sets a rate limit (`?3` rows per `?4` ms, `?5` at once, one per `?6` ns); a
/// replaced one keeps its bucket.
pub const SET_RATE_LIMIT: &str = "INSERT INTO rate_limits \
       (namespace, activity_type, per_period, period_ms, burst, interval_ns) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
     ON CONFLICT (namespace, activity_type) DO UPDATE SET per_period = excluded.per_period, \
       period_ms = excluded.period_ms, burst = excluded.burst, \
       interval_ns = excluded.interval_ns";

pub const REMOVE_RATE_LIMIT: &str =
    "DELETE FROM rate_limits WHERE namespace = ?1 AND activity_type = ?2";

/// The rate limits of namespace `?1` (of all, when NULL), in order.
pub const RATE_LIMITS: &str = rate_limits!("?1");

pub const SET_KEY_RATE_LIMIT: &str = set_key_rate_limit!("?");

pub const REMOVE_KEY_RATE_LIMIT: &str = "DELETE FROM key_rate_limits \
     WHERE namespace = ?1 AND activity_type = ?2 AND concurrency_key = ?3";

/// The limits' and weights' statements, for their writes (`store::settings`).
pub const SETTINGS: crate::store::settings::Statements = setting_statements!();

/// When a key of type `?2` of namespace `?1` held back by its own rate limit has
/// a token again, after `?3` (milliseconds).
pub const KEY_REFILL: &str = concat!("SELECT ", key_refill!("?1", "?2", "?3", ""));

/// The waiting and running rows of concurrency key `?3` of type `?2` of
/// namespace `?1`.
pub const CONCURRENCY_KEY: &str = "SELECT waiting, running FROM concurrency_keys \
     WHERE namespace = ?1 AND activity_type = ?2 AND concurrency_key = ?3 \
       AND (waiting > 0 OR running > 0)";

/// The keys of the JSON array `?3` of type `?2` of namespace `?1` with more rows
/// waiting and running than their limit and a strategy that cancels: each with
/// its limit and strategy.
pub const OVER_LIMIT: &str = over_limit!("?1", "?2", "IN (SELECT value FROM json_each(?3))");

/// The keys (workflow, activity) of the waiting and running rows of key `?3` of
/// type `?2` of namespace `?1` after the first `?4`, in id order `$order`
/// (read along the keyed and the lease index, never the whole table).
macro_rules! active_of_key {
    ($order:literal) => {
        concat!(
            "SELECT workflow_id, activity_id FROM (\
       SELECT a.id, a.workflow_id, a.activity_id FROM keyed_waiting AS w \
         JOIN main.activities AS a ON a.id = w.id \
         WHERE w.concurrency_key = ?3 AND w.namespace = ?1 AND w.activity_type = ?2 \
           AND a.status = 1 \
       UNION ALL \
       SELECT id, workflow_id, activity_id FROM activities INDEXED BY activities_running \
         WHERE status = 2 AND namespace = ?1 AND activity_type = ?2 \
           AND concurrency_key = ?3) AS active \
     ORDER BY id ",
            $order,
            " LIMIT -1 OFFSET ?4"
        )
    };
}

/// `active_of_key!` oldest first.
pub const ACTIVE_OF_KEY: &str = active_of_key!("ASC");

/// `active_of_key!` newest first.
pub const ACTIVE_OF_KEY_NEWEST: &str = active_of_key!("DESC");

/// The newest time stored: the last row's creation or the latest ending, read
/// from the ends of the primary key and of `activities_finished`.
pub const NEWEST_TIME: &str = "SELECT MAX(t) FROM ( \
     SELECT created_at AS t FROM (SELECT created_at FROM activities ORDER BY id DESC LIMIT 1) \
     UNION ALL \
     SELECT t FROM (SELECT finished_at AS t FROM activities INDEXED BY activities_finished \
                    WHERE status >= 3 ORDER BY finished_at DESC LIMIT 1))";
