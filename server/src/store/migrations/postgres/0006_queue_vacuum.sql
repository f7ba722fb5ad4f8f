-- `activities` is a queue: every row is inserted, updated two or three times and
-- deleted after the retention period, and each update leaves a dead row version
-- and dead index entries behind until vacuum removes them. Autovacuum's defaults
-- wait until a fifth of the table is dead (millions of rows on a large table); a
-- queue table must be vacuumed after a small fraction changed, and allowed to work
-- faster. Operators may tune these further with ALTER TABLE (docs/OPERATIONS.md).
--
-- Vacuum must also not truncate the table's empty tail: truncating takes an
-- ACCESS EXCLUSIVE lock, and every claim, result and submit queues behind it for
-- as long as vacuum holds it (seconds of stalled dispatch were measured under
-- churn). A queue table refills the pages it freed within seconds anyway.
ALTER TABLE activities SET (
    vacuum_truncate = false,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_limit = 2000
);
