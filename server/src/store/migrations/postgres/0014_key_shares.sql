-- Weighted fair shares between concurrency keys, and limits for one key:
-- - `concurrency_key_limits` holds what is set for one key of a type: its own
--   `max_running` (the type's when NULL) and its `weight`.
-- - `concurrency_keys.served_at` becomes the key's pass (stride scheduling): a
--   claim serves the ready keys of lowest pass, and moves each on by
--   `n × 1,000,000 / weight` for the n rows it gave it. A key that starts waiting
--   again (or anew) starts at the lowest pass of the keys waiting now, so it is
--   served among the next but earns no credit for the time it was away. Keys
--   always waiting are served in proportion to their weights.
-- - Passes start afresh (they were times).
-- - The claim keeps each key's counts and pass itself, once per key it served
--   (see the `0016_keyed_endings` migration for the per-row trigger).
UPDATE concurrency_keys SET served_at = 0;

CREATE TABLE concurrency_key_limits (
    namespace       TEXT   NOT NULL,
    activity_type   TEXT   NOT NULL,
    concurrency_key TEXT   NOT NULL,
    max_running     BIGINT CHECK (max_running > 0),
    weight          BIGINT NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    PRIMARY KEY (namespace, activity_type, concurrency_key)
);
