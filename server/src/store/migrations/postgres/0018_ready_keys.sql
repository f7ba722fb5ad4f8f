-- A submit adds to its keys' `waiting`, and `waiting` was named in the predicate
-- of `concurrency_keys_ready` (`WHERE waiting > 0`), so no such update could be
-- heap-only (see `0017_hot_key_endings`): each wrote a new entry in every index of
-- the table. The claim's index now names `ready`, a stored column PostgreSQL keeps
-- equal to `waiting > 0` for every statement of every version, which changes only
-- when a key starts or stops waiting. A claim still moves its keys' passes, an
-- indexed column; submits and endings update their keys in place.
-- Nodes of the version before ask for `waiting > 0`, which this index cannot
-- serve: during a rolling upgrade their claims read all of a type's keys and sort
-- them (slower, and as correct) until they are replaced.
ALTER TABLE concurrency_keys ADD COLUMN ready BOOLEAN GENERATED ALWAYS AS (waiting > 0) STORED;
DROP INDEX concurrency_keys_ready;
CREATE INDEX concurrency_keys_ready
    ON concurrency_keys (namespace, activity_type, served_at, concurrency_key)
    WHERE ready;

CREATE OR REPLACE FUNCTION spool_key_pass(ns TEXT, ty TEXT) RETURNS BIGINT
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(MIN(served_at), 0) FROM concurrency_keys
     WHERE namespace = ns AND activity_type = ty AND ready
$$;
