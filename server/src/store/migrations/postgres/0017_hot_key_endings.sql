-- An ending changes only its key's `running` (and `waiting` when it retries), so
-- its update of the key's row can be a heap-only tuple (HOT): a new version on the
-- same page and no new index entries. PostgreSQL allows that only when no indexed
-- column changes, and a column in a partial index's predicate counts:
-- `concurrency_keys_idle` (`WHERE waiting = 0 AND running = 0`) made every
-- ending's update write a new entry in each of the table's indexes. The prune
-- finds idle keys by reading the table instead (`sql::SWEEP_KEYS`; it holds one
-- row per key with rows waiting or running, and runs once a pass); pages are left
-- half empty so that the new versions fit beside the old.
DROP INDEX concurrency_keys_idle;
ALTER TABLE concurrency_keys SET (fillfactor = 50);
