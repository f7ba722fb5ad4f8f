-- Rate limits of one concurrency key of a type, beside the type's own: at most
-- `per_period` of the key's rows each `period_ms`, `burst` at once. The bucket's
-- state, `tat_ns` (as in `rate_limits`), is on the key's row of
-- `concurrency_keys`, which the claim serving the key already reads and moves on.
-- A key with a limit keeps its row while it has no rows, so that its bucket is
-- not forgotten between them.
CREATE TABLE key_rate_limits (
    namespace       TEXT    NOT NULL,
    activity_type   TEXT    NOT NULL,
    concurrency_key TEXT    NOT NULL,
    per_period      INTEGER NOT NULL CHECK (per_period > 0),
    period_ms       INTEGER NOT NULL CHECK (period_ms > 0),
    burst           INTEGER NOT NULL CHECK (burst > 0),
    interval_ns     INTEGER NOT NULL CHECK (interval_ns > 0),
    PRIMARY KEY (namespace, activity_type, concurrency_key)
);

ALTER TABLE concurrency_keys ADD COLUMN tat_ns INTEGER NOT NULL DEFAULT 0;

DROP TRIGGER keyed_moved;
CREATE TRIGGER keyed_moved AFTER UPDATE OF status ON activities
WHEN NEW.concurrency_key IS NOT NULL AND OLD.status <> NEW.status
     AND NOT (OLD.status = 1 AND NEW.status = 2)
BEGIN
    UPDATE concurrency_keys
       SET waiting = waiting + (NEW.status = 1) - (OLD.status = 1),
           running = running + (NEW.status = 2) - (OLD.status = 2)
     WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
       AND concurrency_key = NEW.concurrency_key;
    DELETE FROM concurrency_keys
     WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
       AND concurrency_key = NEW.concurrency_key AND waiting = 0 AND running = 0
       AND NOT EXISTS (SELECT 1 FROM key_rate_limits AS r
                        WHERE r.namespace = NEW.namespace
                          AND r.activity_type = NEW.activity_type
                          AND r.concurrency_key = NEW.concurrency_key);
END;
