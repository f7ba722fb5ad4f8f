-- Rate limits of one concurrency key of a type, beside the type's own: at most
-- `per_period` of the key's rows each `period_ms`, `burst` at once. The bucket's
-- state, `tat_ns` (as in `rate_limits`), is on the key's row of
-- `concurrency_keys`, which the claim serving the key locks, so every node takes
-- from the one bucket. A key with a limit keeps its row while it has no rows, so
-- that its bucket is not forgotten between them (see `spool_keyed_moved` in the
-- `0016_keyed_endings` migration, and `sql::SWEEP_KEYS`).
CREATE TABLE key_rate_limits (
    namespace       TEXT   NOT NULL,
    activity_type   TEXT   NOT NULL,
    concurrency_key TEXT   NOT NULL,
    per_period      BIGINT NOT NULL CHECK (per_period > 0),
    period_ms       BIGINT NOT NULL CHECK (period_ms > 0),
    burst           BIGINT NOT NULL CHECK (burst > 0),
    interval_ns     BIGINT NOT NULL CHECK (interval_ns > 0),
    PRIMARY KEY (namespace, activity_type, concurrency_key)
);

ALTER TABLE concurrency_keys ADD COLUMN tat_ns BIGINT NOT NULL DEFAULT 0;
