//! Every statement the PostgreSQL store runs, in one place. What a write does is
//! decided in `store::change`; these only say it in PostgreSQL's SQL. Statuses appear
//! as the wire enum's numbers: 1 SCHEDULED, 2 RUNNING, 3 COMPLETED, 4 FAILED,
//! 5 CANCELLED.
//!
//! Writes that take many rows take them as arrays (`UNNEST`): every statement is a
//! network round trip, so a run of hundreds of rows must not be hundreds of
//! statements. One row is an array of one.
//!
//! Statements are prepared once per connection, so PostgreSQL soon plans them
//! without their values (a generic plan). A statement that picks rows with a
//! `LIMIT $n` subquery therefore writes `id = ANY(ARRAY(subquery))`, never
//! `id IN (subquery)`: for the `IN` form a generic plan may hash-join the whole
//! table against the subquery (a sequential scan per claim, growing with the
//! table), while `ANY(ARRAY(…))` is always one index probe per picked id.

/// The values of endings (`change::Ending`), one array each, bound as `$1`…`$14` in
/// the order `write::Endings` binds them and named `e_*` (apart from the table's
/// own columns); a statement's own arrays follow, named by `$extra`.
macro_rules! endings {
    ($($extra:literal),*) => {
        concat!(
            "UNNEST($1::BIGINT[], $2::BIGINT[], $3::BIGINT[], $4::BIGINT[], $5::TEXT[], \
             $6::BYTEA[], $7::BOOL[], $8::BIGINT[], $9::TEXT[], $10::TEXT[], $11::TEXT[], \
             $12::BYTEA[], $13::TEXT[], $14::BIGINT[]", $(", ", $extra,)* ") AS v(e_status, \
             e_next_at, e_finished_at, e_uncounted, e_output_type, e_output, e_set_error, \
             e_error_kind, e_error_type, e_error_message, e_error_details_type, e_error_details, \
             e_outcome, e_ended_at"
        )
    };
}

/// The one `SET` clause of every ending, over `endings!`' `v`.
macro_rules! ending {
    () => {
        concat!(
        "status = v.e_status, next_at = COALESCE(v.e_next_at, a.next_at), \
         finished_at = v.e_finished_at, uncounted = a.uncounted + v.e_uncounted, \
         lease_expires_at = NULL, output_type = v.e_output_type, output = v.e_output, \
         error_kind = CASE WHEN v.e_set_error THEN v.e_error_kind ELSE a.error_kind END, \
         error_type = CASE WHEN v.e_set_error THEN v.e_error_type ELSE a.error_type END, \
         error_message = CASE WHEN v.e_set_error THEN v.e_error_message ELSE a.error_message END, \
         error_details_type = CASE WHEN v.e_set_error THEN v.e_error_details_type \
           ELSE a.error_details_type END, \
         error_details = CASE WHEN v.e_set_error THEN v.e_error_details ELSE a.error_details END, \
         attempt_outcome = CASE WHEN a.status = 2 THEN v.e_outcome ELSE a.attempt_outcome END, \
         attempt_ended_at = CASE WHEN a.status = 2 THEN v.e_ended_at ELSE a.attempt_ended_at END, \
         claim_band = CASE WHEN v.e_next_at IS NULL THEN a.claim_band ELSE ", band!("a.priority", "a.concurrency_key"), " END, \
         claim_rank = COALESCE(", rank!("v.e_next_at", "a.priority"), ", a.claim_rank), \
         fair_at = CASE WHEN v.e_next_at IS NULL THEN a.fair_at END"
        )
    };
}

/// The typed empty BYTEA and NULLs `light_columns!` needs.
macro_rules! light {
    () => {
        light_columns!("''::BYTEA", "NULL::TEXT", "NULL::BYTEA")
    };
}

/// A savepoint's three statements.
pub struct Savepoint {
    pub open: &'static str,
    pub rollback: &'static str,
    pub release: &'static str,
}

/// Around a run of submits inserted as one.
pub const SUBMIT_RUN: Savepoint = Savepoint {
    open: "SAVEPOINT submit_run",
    rollback: "ROLLBACK TO SAVEPOINT submit_run",
    release: "RELEASE SAVEPOINT submit_run",
};

/// Around one submit of several activities, all or nothing.
pub const SUBMIT: Savepoint = Savepoint {
    open: "SAVEPOINT submit",
    rollback: "ROLLBACK TO SAVEPOINT submit",
    release: "RELEASE SAVEPOINT submit",
};

/// The arrays of a submit, one per column, as `v` (with `o`, each row's place).
macro_rules! submitted {
    ($($extra:literal),*) => {
        concat!(
            "UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::BIGINT[], $6::BIGINT[], \
             $7::FLOAT8[], $8::BIGINT[], $9::TEXT[], $10::BIGINT[], $11::BIGINT[], \
             $12::BIGINT[], $13::BIGINT[], $14::TEXT[], $15::BYTEA[], $16::BIGINT[], \
             $18::BIGINT[], $19::TEXT[], $20::TEXT[]", $(", ", $extra,)* ") WITH ORDINALITY \
             AS v(ns, wf, act, ty, max, ii, bc, mi, nr, hb, s2c, sched, pr, it, inp, nx, ex, hd, ck"
        )
    };
}

/// Inserts the rows of `$rows` (`submitted!`, with `fk` and `fa`, their fairness
/// key and `fair_at`, in the order `$order`) whose keys do not exist yet, after
/// the CTEs `$with`; returns
/// the id and key of each row it inserted. `$17` is the submit time. Their
/// concurrency keys count them as waiting, once per key (`ik`, locking the keys'
/// rows in key order, so that two nodes' submits never wait on each other in a
/// cycle); a key that starts
/// waiting starts at the lowest pass of those waiting (`spool_key_pass`, read
/// once per type: `vt`).
macro_rules! insert {
    ($with:expr, $rows:expr, $order:literal) => {
        concat!(
            "WITH ",
            $with,
            "ins AS (INSERT INTO activities (namespace, workflow_id, activity_id, \
             activity_type, status, max_attempts, initial_interval_ms, backoff_coefficient, \
             max_interval_ms, non_retryable, heartbeat_timeout_ms, start_to_close_ms, \
             schedule_to_close_ms, priority, input_type, input, created_at, next_at, expires_at, \
             headers, concurrency_key, fairness_key, fair_at, claim_band, claim_rank) \
             SELECT ns, wf, act, ty, 1, max, ii, bc, mi, nr, hb, s2c, sched, pr, it, inp, $17, nx, \
               ex, hd, ck, fk, fa, ",
            band!("pr", "ck"),
            ", ",
            rank!("COALESCE(fa, nx)", "pr"),
            " FROM ",
            $rows,
            $order,
            " ON CONFLICT (namespace, workflow_id, activity_id) DO NOTHING \
             RETURNING id, namespace, workflow_id, activity_id, activity_type, concurrency_key), \
             vt AS MATERIALIZED (SELECT namespace, activity_type, \
               spool_key_pass(namespace, activity_type) AS pass \
               FROM (SELECT DISTINCT namespace, activity_type FROM ins \
                     WHERE concurrency_key IS NOT NULL) AS typed), \
             ik AS (INSERT INTO concurrency_keys \
                 (namespace, activity_type, concurrency_key, waiting, served_at) \
               SELECT i.namespace, i.activity_type, i.concurrency_key, COUNT(*), MIN(vt.pass) \
               FROM ins AS i JOIN vt ON vt.namespace = i.namespace \
                 AND vt.activity_type = i.activity_type \
               WHERE i.concurrency_key IS NOT NULL \
               GROUP BY i.namespace, i.activity_type, i.concurrency_key \
               ORDER BY i.namespace, i.activity_type, i.concurrency_key \
               ON CONFLICT (namespace, activity_type, concurrency_key) \
               DO UPDATE SET waiting = concurrency_keys.waiting + excluded.waiting, \
                 served_at = CASE WHEN concurrency_keys.waiting = 0 \
                   THEN GREATEST(concurrency_keys.served_at, excluded.served_at) \
                   ELSE concurrency_keys.served_at END) \
             SELECT id, namespace, workflow_id, activity_id FROM ins"
        )
    };
}

/// Inserts activities none of which has a fairness key (see `insert!`).
pub const INSERT: &str = insert!(
    "",
    concat!(
        "(SELECT *, NULL::TEXT AS fk, NULL::BIGINT AS fa FROM ",
        submitted!(),
        ", o)) AS v"
    ),
    ""
);

/// Inserts activities some of which have a fairness key (`$21`, with `$22` the
/// stride of each's own weight, which a weight set for the key replaces: see
/// `store::fairness`), leaving out those already stored
/// (which must not move a chain): each key's chain moves on by its rows' strides
/// in one upsert per key and band, in key order so that two nodes lock chains in
/// the same order (`fc`, which also returns where the
/// chain was before them: from the later of the chain and the head of the band,
/// or now when the band has no row waiting), and each row is placed at its key's start plus the strides of its key's
/// rows up to it (`fv`, in one pass over the rows: a join of the rows to their
/// places would be a nested loop over two CTEs).
pub const INSERT_FAIR: &str = insert!(
    concat!(
        "s AS MATERIALIZED (SELECT *, ",
        band!("pr", "ck"),
        " AS bd, ",
        fair_stride!("v.ns", "v.ty", "v.fk", "v.gs"),
        " AS fs FROM ",
        submitted!("$21::TEXT[]", "$22::BIGINT[]"),
        ", fk, gs, o) WHERE NOT EXISTS (SELECT 1 FROM activities AS e \
           WHERE e.namespace = v.ns AND e.workflow_id = v.wf AND e.activity_id = v.act)), \
         fg AS (SELECT ns, ty, bd, fk, SUM(fs)::BIGINT AS total FROM s \
           WHERE fk IS NOT NULL GROUP BY ns, ty, bd, fk), \
         fc AS (INSERT INTO fairness_keys AS f \
             (namespace, activity_type, claim_band, fairness_key, last_us, span_us) \
           SELECT ns, ty, bd, fk, COALESCE(",
        fair_head!("fg.ns", "fg.ty", "fg.bd", "$17"),
        ", $17) * 1000 + total, total FROM fg ORDER BY ns, ty, bd, fk \
           ON CONFLICT (namespace, activity_type, claim_band, fairness_key) \
           DO UPDATE SET last_us = GREATEST(f.last_us + excluded.span_us, excluded.last_us), \
             span_us = excluded.span_us \
           RETURNING namespace, activity_type, claim_band, fairness_key, \
             last_us - span_us AS start), \
         fv AS (SELECT s.*, CASE WHEN fc.start IS NOT NULL THEN GREATEST((fc.start \
             + (SUM(s.fs) OVER (PARTITION BY s.ns, s.ty, s.bd, s.fk ORDER BY s.o))::BIGINT) \
             / 1000, \
             CASE WHEN s.nx > $17 THEN s.nx END) END AS fa \
           FROM s LEFT JOIN fc ON fc.namespace = s.ns AND fc.activity_type = s.ty \
             AND fc.claim_band = s.bd AND fc.fairness_key = s.fk), "
    ),
    "fv AS v",
    // The window of `fv` leaves them in key order; ids follow the submit's.
    " ORDER BY o"
);

pub const SELECT_BY_KEY: &str =
    select_rows!(rows "WHERE namespace = $1 AND workflow_id = $2 AND activity_id = $3");

/// [`SELECT_BY_KEY`] without payloads.
pub const SELECT_LIGHT_BY_KEY: &str =
    select_rows!(light "WHERE namespace = $1 AND workflow_id = $2 AND activity_id = $3");

/// [`SELECT_LIGHT_BY_KEY`], locking the row for the rest of the transaction.
pub const LOCK_BY_KEY: &str = select_rows!(light "WHERE namespace = $1 AND workflow_id = $2 AND activity_id = $3 \
      FOR UPDATE");

/// The claim's common table expressions, with its parameters' placeholders: up
/// to `$limit` due rows of one type, at `$now`, for `$worker` (its identity, and
/// the node it is connected to), leased until `$lease`. Rows another node is
/// claiming are skipped, not waited for.
/// - `b`: the type's rate limit bucket (see `store::rate`), locked, so nodes
///   claiming the type take turns with it; no row when the type is not limited;
/// - `kc`: the concurrency keys with a row due and room to run more, lowest
///   pass first, locked (one another node is serving is skipped); a key whose
///   rows are all due later is passed over, not given a place (keys before it
///   with nothing due would leave a due row waiting); the room counts
///   the attempts the statement's endings `fe` ended, so a slot an ending frees
///   is refilled by the same statement;
/// - `k`: rows of those keys, each key's room at most, and a share of the claim
///   by its weight (`concurrency::share`), in claim order;
/// - `c`: rows without a key, for what is left;
/// - `kt`, `kb`: what `k` gave each key of `kc`, counted with what the
///   statement's endings `fe` (`ended!`, or `none_ended!`) did to it, its pass
///   moved on (`concurrency::stride`), and its own bucket; a key that gave
///   nothing though the claim had room (its rows are not due) moves on one
///   stride, so that keys with due rows come first;
/// - `s`: what `k` and `c` took from the bucket.
///
/// Together no more than the bucket allows. A statement of these must define
/// `fe` before them.
macro_rules! claim_ctes {
    ($now:literal, $worker:literal, $lease:literal, $namespace:literal, $type:literal,
     $limit:literal, $identity:literal, $node:literal) => {
        concat!(
            "b AS (SELECT interval_ns, burst, GREATEST(tat_ns, ",
            $now,
            " * 1000000) AS base FROM rate_limits WHERE namespace = ",
            $namespace,
            " AND activity_type = ",
            $type,
            " FOR UPDATE), \
             kc AS (SELECT k.concurrency_key AS ck, \
                 COALESCE(x.weight, 1) AS weight, r.interval_ns, \
                 LEAST(COALESCE(x.max_running, (SELECT max_running \
                 FROM concurrency_limits AS l WHERE l.namespace = ",
            $namespace,
            " AND l.activity_type = ",
            $type,
            "), 2147483647) - (k.running - COALESCE(e.n, 0)), ",
            key_tokens!($now),
            ") AS room FROM concurrency_keys AS k ",
            key_join!("concurrency_key_limits", "x"),
            " ",
            key_join!("key_rate_limits", "r"),
            " ",
            key_join!("fe", "e"),
            " WHERE k.namespace = ",
            $namespace,
            " AND k.activity_type = ",
            $type,
            " AND k.ready \
               AND EXISTS (SELECT 1 FROM activities AS d WHERE d.namespace = ",
            $namespace,
            " AND d.activity_type = ",
            $type,
            " AND d.concurrency_key = k.concurrency_key AND d.status = 1 AND d.next_at <= ",
            $now,
            " AND (d.expires_at IS NULL OR d.expires_at > ",
            $now,
            ")) \
               AND k.running - COALESCE(e.n, 0) < COALESCE(x.max_running, (SELECT max_running \
                 FROM concurrency_limits AS l WHERE l.namespace = ",
            $namespace,
            " AND l.activity_type = ",
            $type,
            "), 2147483647) AND ",
            key_tokens!($now),
            " > 0 ORDER BY k.served_at, k.concurrency_key LIMIT ",
            $limit,
            " FOR UPDATE OF k SKIP LOCKED), \
             k AS (UPDATE activities SET ",
            claimed!($now, $worker, $lease, $identity, $node),
            " WHERE id = ANY(ARRAY(SELECT a.id FROM kc CROSS JOIN LATERAL (SELECT id \
                 FROM activities WHERE namespace = ",
            $namespace,
            " AND activity_type = ",
            $type,
            " AND concurrency_key = kc.ck AND status = 1 AND next_at <= ",
            $now,
            " AND (expires_at IS NULL OR expires_at > ",
            $now,
            ") ORDER BY claim_band, claim_rank, id LIMIT LEAST(kc.room, GREATEST(1, (",
            allowed!($now, $limit),
            " * kc.weight + (SELECT SUM(weight) FROM kc)::BIGINT - 1) \
                 / (SELECT SUM(weight) FROM kc)::BIGINT)) \
                 FOR UPDATE SKIP LOCKED) AS a \
               LIMIT ",
            allowed!($now, $limit),
            ")) RETURNING ",
            columns!(),
            ", claim_band AS o_band, claim_rank AS o_rank), \
             c AS (UPDATE activities SET ",
            claimed!($now, $worker, $lease, $identity, $node),
            " WHERE id = ANY(ARRAY(SELECT id FROM activities \
               WHERE namespace = ",
            $namespace,
            " AND activity_type = ",
            $type,
            " AND status = 1 AND next_at <= ",
            $now,
            " AND (expires_at IS NULL OR expires_at > ",
            $now,
            ") AND claim_band < 549755813888 \
               ORDER BY claim_band, claim_rank, id LIMIT GREATEST(0, ",
            allowed!($now, $limit),
            " - (SELECT COUNT(*) FROM k)) FOR UPDATE SKIP LOCKED)) RETURNING ",
            columns!(),
            ", claim_band AS o_band, claim_rank AS o_rank), \
             kt AS (SELECT kc.ck, kc.weight, kc.interval_ns, COALESCE(g.n, 0) AS n FROM kc \
               LEFT JOIN (SELECT concurrency_key, COUNT(*) AS n FROM k GROUP BY concurrency_key) \
                 AS g ON g.concurrency_key = kc.ck), \
             kb AS (UPDATE concurrency_keys AS q \
               SET waiting = q.waiting - kt.n + COALESCE(fe.back, 0), \
                 running = q.running + kt.n - COALESCE(fe.n, 0), \
                 served_at = q.served_at + (",
            stride!(),
            " / kt.weight) * CASE WHEN kt.n > 0 THEN kt.n \
                   WHEN (SELECT COUNT(*) FROM k) < ",
            allowed!($now, $limit),
            " THEN 1 ELSE 0 END, \
                 tat_ns = CASE WHEN kt.interval_ns IS NULL OR kt.n = 0 THEN q.tat_ns \
                   ELSE GREATEST(q.tat_ns, ",
            $now,
            " * 1000000) + kt.n * kt.interval_ns END \
               FROM kt LEFT JOIN fe ON fe.namespace = ",
            $namespace,
            " AND fe.activity_type = ",
            $type,
            " AND fe.concurrency_key = kt.ck \
               WHERE q.namespace = ",
            $namespace,
            " AND q.activity_type = ",
            $type,
            " AND q.concurrency_key = kt.ck \
                 AND (kt.n > 0 OR fe.n IS NOT NULL OR (SELECT COUNT(*) FROM k) < ",
            allowed!($now, $limit),
            ") RETURNING q.concurrency_key, q.waiting, q.tat_ns), \
             s AS (UPDATE rate_limits AS r SET tat_ns = b.base + ",
            taken!(),
            " * b.interval_ns FROM b WHERE r.namespace = ",
            $namespace,
            " AND r.activity_type = ",
            $type,
            " AND (EXISTS (SELECT 1 FROM k) OR EXISTS (SELECT 1 FROM c)))"
        )
    };
}

/// The `SET` clause of a claimed row.
macro_rules! claimed {
    ($now:literal, $worker:literal, $lease:literal, $identity:literal, $node:literal) => {
        concat!(
            "status = 2, attempt = attempt + 1, started_at = ",
            $now,
            ", worker_id = ",
            $worker,
            ", lease_expires_at = ",
            $lease,
            ", worker_identity = ",
            $identity,
            ", worker_node = ",
            $node
        )
    };
}

/// How many rows the claim may take: `$limit`, or fewer if the bucket `b` says so.
macro_rules! allowed {
    ($now:literal, $limit:literal) => {
        concat!(
            "LEAST(",
            $limit,
            ", COALESCE((SELECT GREATEST(0, LEAST(burst, (",
            $now,
            " * 1000000 + burst * interval_ns - base) / interval_ns)) FROM b), ",
            $limit,
            "))"
        )
    };
}

/// After `claim_ctes!`: the rows it took.
macro_rules! taken {
    () => {
        "((SELECT COUNT(*) FROM k) + (SELECT COUNT(*) FROM c))"
    };
}

/// After `claim_ctes!`: when the type's bucket, or the bucket of one of its keys
/// with rows waiting, gives a row again (`rate::Bucket::refills_at`, in
/// nanoseconds); NULL when none limits. A key the claim served is read as `kb`
/// left it, the others as they were.
macro_rules! refill {
    ($now:literal, $namespace:literal, $type:literal) => {
        concat!(
            "LEAST((SELECT base + (",
            taken!(),
            " - burst + 1) * interval_ns FROM b), \
             (SELECT MIN(kb.tat_ns - (r.burst - 1) * r.interval_ns) FROM kb \
               JOIN key_rate_limits AS r ON r.namespace = ",
            $namespace,
            " AND r.activity_type = ",
            $type,
            " AND r.concurrency_key = kb.concurrency_key \
               WHERE kb.waiting > 0 AND kb.tat_ns - (r.burst - 1) * r.interval_ns > ",
            $now,
            " * 1000000), ",
            key_refill!(
                $namespace,
                $type,
                $now,
                " AND k.concurrency_key NOT IN (SELECT concurrency_key FROM kb)"
            ),
            ")"
        )
    };
}

/// `fe` (see `ended!`) of a statement that ends nothing.
macro_rules! none_ended {
    () => {
        "fe AS (SELECT NULL::TEXT AS namespace, NULL::TEXT AS activity_type, \
           NULL::TEXT AS concurrency_key, 0::BIGINT AS n, 0::BIGINT AS back WHERE FALSE)"
    };
}

/// Locks the rate limit buckets of types `$2` of namespace `$1`, in one order. A
/// claim of several types takes them first: its statements, one a type, each lock
/// their type's bucket until the transaction ends, and two claims that met in
/// different orders (the committer rotates a worker's types between claims, and
/// may write two batches at once) would wait for each other.
pub const LOCK_BUCKETS: &str = "SELECT 1 FROM rate_limits \
     WHERE namespace = $1 AND activity_type = ANY($2) ORDER BY activity_type FOR UPDATE";

/// Locks the rate-limit buckets of the pairs (`$1[i]`, `$2[i]`) in the order
/// [`LOCK_BUCKETS`] locks one namespace's: a batch whose claims lock several
/// buckets locks them all first, so two batches (or two nodes' batches) whose
/// claims name them in different orders do not wait for each other.
pub const LOCK_BATCH_BUCKETS: &str = "SELECT 1 FROM rate_limits AS r \
     JOIN unnest($1::TEXT[], $2::TEXT[]) AS b (namespace, activity_type) \
       ON r.namespace = b.namespace AND r.activity_type = b.activity_type \
     ORDER BY r.namespace, r.activity_type FOR UPDATE OF r";

/// Claims up to `$6` due rows of one type: `$1` now, `$2` worker, `$3` lease end,
/// `$4` namespace, `$5` type, `$7` the worker's identity, `$8` the node. One row
/// at least: the claimed rows' columns in claim order, which is the order they are
/// sent in (all NULL when it claimed none), then `refill!`.
pub const CLAIM: &str = concat!(
    "WITH ",
    none_ended!(),
    ", ",
    claim_ctes!("$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8"),
    " SELECT ",
    columns!(),
    ", ",
    refill!("$1", "$4", "$5"),
    " FROM (SELECT 1) AS one \
     LEFT JOIN (SELECT * FROM k UNION ALL SELECT * FROM c) AS r ON TRUE \
     ORDER BY r.o_band, r.o_rank, r.id"
);

/// Ends attempts: attempt `$16[i]` of row `$15[i]`, if it still runs (and, where
/// `$17[i]` is not NULL, only if its lease expired before then; where `$18[i]` is
/// not NULL, only while the row is that node's). Returns the ids it ended. No row
/// may appear twice.
macro_rules! finish {
    () => {
        concat!(
            "UPDATE activities AS a SET ",
            ending!(),
            " FROM ",
            endings!(
                "$15::BIGINT[]",
                "$16::BIGINT[]",
                "$17::BIGINT[]",
                "$18::TEXT[]"
            ),
            ", f_id, f_attempt, f_guard, f_node) \
             WHERE a.id = v.f_id AND a.attempt = v.f_attempt AND a.status = 2 \
               AND (v.f_guard IS NULL OR a.lease_expires_at < v.f_guard) \
               AND (v.f_node IS NULL OR a.worker_node = v.f_node) \
             RETURNING a.id, a.namespace, a.activity_type, a.concurrency_key, a.status"
        )
    };
}

/// After `f AS (finish!())`: `fe`, the keys of the attempts it ended, with how
/// many ended and how many of those wait again (retried). Each ended attempt was
/// RUNNING (see the `0016_keyed_endings` migration).
macro_rules! ended {
    () => {
        "fe AS (SELECT namespace, activity_type, concurrency_key, COUNT(*) AS n, \
           COUNT(*) FILTER (WHERE status = 1) AS back FROM f \
         WHERE concurrency_key IS NOT NULL \
         GROUP BY namespace, activity_type, concurrency_key)"
    };
}

/// After `ended!`: `fk`, those keys' counts moved, once per key, but for the keys
/// `$skip` leaves to `kb` (a statement must not update a row twice). A key that
/// waits again after none did (a retry) starts level with the keys waiting, as
/// a new key does: no credit for the turns it was away for.
macro_rules! ended_keys {
    ($skip:literal) => {
        concat!(
            "fk AS (UPDATE concurrency_keys AS q \
               SET running = q.running - fe.n, waiting = q.waiting + fe.back, \
                 served_at = CASE WHEN q.waiting = 0 AND fe.back > 0 \
                   THEN GREATEST(q.served_at, spool_key_pass(q.namespace, q.activity_type)) \
                   ELSE q.served_at END FROM fe \
               WHERE q.namespace = fe.namespace AND q.activity_type = fe.activity_type \
                 AND q.concurrency_key = fe.concurrency_key",
            $skip,
            ")"
        )
    };
}

pub const FINISH: &str = concat!(
    "WITH f AS (",
    finish!(),
    "), ",
    ended!(),
    ", ",
    ended_keys!(""),
    " SELECT id FROM f"
);

/// [`FINISH`] (`$1`…`$18`) and [`CLAIM`] (`$19`…`$26`) as one statement, so a
/// batch of endings and a claim commits without a transaction around it. They
/// cannot meet: the endings touch RUNNING rows, the claim SCHEDULED ones, and
/// one statement sees one snapshot (a row an ending reschedules is claimed by
/// the next batch). One row back at least: the claimed rows' columns in claim
/// order (all NULL when it claimed nothing), then the array of ids ended, then
/// `refill!`.
pub const FINISH_AND_CLAIM: &str = concat!(
    "WITH f AS (",
    finish!(),
    "), ",
    ended!(),
    ", ",
    claim_ctes!("$19", "$20", "$21", "$22", "$23", "$24", "$25", "$26"),
    ", ",
    // The keys the claim locked are `kb`'s, endings and all.
    ended_keys!(
        " AND NOT (fe.namespace = $22 AND fe.activity_type = $23            AND fe.concurrency_key IN (SELECT ck FROM kc))"
    ),
    " SELECT ",
    columns!(),
    ", e.ended, ",
    refill!("$19", "$22", "$23"),
    " FROM (SELECT array_agg(id) AS ended FROM f) AS e \
     LEFT JOIN (SELECT * FROM k UNION ALL SELECT * FROM c) AS r ON TRUE \
     ORDER BY r.o_band, r.o_rank, r.id"
);

/// Ends row `$15`, locked and found cancellable by the same transaction; when it
/// was RUNNING with a key, counts it out of the key's running rows (a waiting
/// row's move is counted by the trigger).
pub const CANCEL: &str = concat!(
    "WITH was AS (SELECT status FROM activities WHERE id = $15), \
     cancelled AS (UPDATE activities AS a SET ",
    ending!(),
    " FROM ",
    endings!(),
    ") WHERE a.id = $15 RETURNING ",
    columns!(),
    "), kd AS (UPDATE concurrency_keys AS q SET running = q.running - 1 \
       FROM cancelled AS c, was WHERE was.status = 2 AND q.namespace = c.namespace \
         AND q.activity_type = c.activity_type AND q.concurrency_key = c.concurrency_key) \
     SELECT * FROM cancelled"
);

/// Ends up to `$16` SCHEDULED rows whose schedule-to-close deadline passed by `$15`.
pub const EXPIRE: &str = concat!(
    "UPDATE activities AS a SET ",
    ending!(),
    " FROM ",
    endings!(),
    ") WHERE a.id = ANY(ARRAY(SELECT id FROM activities \
       WHERE status = 1 AND expires_at IS NOT NULL AND expires_at <= $15 \
       LIMIT $16 FOR UPDATE SKIP LOCKED)) \
     RETURNING a.namespace, a.workflow_id, a.activity_id"
);

/// Re-drives row `$1` (see `change::Redrive`): due at `$2`, deadline `$3`.
pub const REDRIVE: &str = concat!(
    "UPDATE activities SET status = 1, next_at = $2, uncounted = attempt, \
     finished_at = NULL, output_type = NULL, output = NULL, error_kind = NULL, \
     error_type = NULL, error_message = NULL, error_details_type = NULL, error_details = NULL, \
     expires_at = $3, claim_band = ",
    band!("priority", "concurrency_key"),
    ", claim_rank = ",
    rank!("$2", "priority"),
    ", fair_at = NULL WHERE id = $1 RETURNING ",
    columns!()
);

/// Extends to `$1` the leases of attempts `$3[i]` of rows `$2[i]` that still run;
/// returns those it extended.
pub const RENEW: &str = "UPDATE activities AS a SET lease_expires_at = $1 \
     FROM UNNEST($2::BIGINT[], $3::BIGINT[]) AS v(id, attempt) \
     WHERE a.id = v.id AND a.attempt = v.attempt AND a.status = 2 \
     RETURNING a.id, a.attempt";

/// Stores the heartbeat details of attempt `$2` of row `$1`, if it still runs.
pub const RECORD_HEARTBEAT: &str = "UPDATE activities SET heartbeat_type = $3, \
     heartbeat_details = $4 WHERE id = $1 AND attempt = $2 AND status = 2";

/// Deletes up to `$2` rows finished before `$1`.
pub const PRUNE: &str = "DELETE FROM activities WHERE id = ANY(ARRAY(SELECT id FROM activities \
     WHERE status >= 3 AND finished_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))";

/// Deletes up to `$1` rows of keys with neither waiting nor running rows that an
/// ending left (see the `0016_keyed_endings` migration), but those with a rate
/// limit of their own, whose bucket they keep. It reads the table, which holds a
/// row per key in use: an index of idle keys would cost every ending's update its
/// place on the page (see the `0017_hot_key_endings` migration).
pub const SWEEP_KEYS: &str = "DELETE FROM concurrency_keys AS q USING (\
       SELECT namespace, activity_type, concurrency_key FROM concurrency_keys AS k \
       WHERE waiting = 0 AND running = 0 AND NOT EXISTS (SELECT 1 FROM key_rate_limits AS r \
         WHERE r.namespace = k.namespace AND r.activity_type = k.activity_type \
           AND r.concurrency_key = k.concurrency_key) \
       LIMIT $1 FOR UPDATE SKIP LOCKED) AS d \
     WHERE q.namespace = d.namespace AND q.activity_type = d.activity_type \
       AND q.concurrency_key = d.concurrency_key";

/// Deletes up to `$2` chains of fairness keys that no longer change where a row
/// goes: those behind the head of their band, or behind `$1` (ms) when it has no
/// row waiting (see `store::fairness`); one a submit holds is skipped.
pub const SWEEP_FAIRNESS: &str = concat!(
    "DELETE FROM fairness_keys AS q USING (\
       SELECT namespace, activity_type, claim_band, fairness_key FROM fairness_keys AS f \
       WHERE last_us <= COALESCE(",
    fair_head!("f.namespace", "f.activity_type", "f.claim_band", "$1"),
    ", $1) * 1000 LIMIT $2 FOR UPDATE SKIP LOCKED) AS d \
     WHERE q.namespace = d.namespace AND q.activity_type = d.activity_type \
       AND q.claim_band = d.claim_band AND q.fairness_key = d.fairness_key"
);

// After the macros above, which they use.
mod reads;
mod settings;

pub use reads::*;
pub use settings::*;
