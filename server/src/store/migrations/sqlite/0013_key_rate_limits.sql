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

-- A key that starts waiting (a new key, a re-driven row whose key had gone)
-- starts at the lowest pass of the keys waiting now (see `0012_key_shares`).
DROP TRIGGER keyed_inserted;
CREATE TRIGGER keyed_inserted AFTER INSERT ON activities
WHEN NEW.concurrency_key IS NOT NULL
BEGIN
    INSERT INTO concurrency_keys (namespace, activity_type, concurrency_key, waiting, served_at)
    VALUES (NEW.namespace, NEW.activity_type, NEW.concurrency_key, NEW.status = 1,
            (SELECT COALESCE(MIN(served_at), 0) FROM concurrency_keys
              WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
                AND waiting > 0))
    ON CONFLICT (namespace, activity_type, concurrency_key)
        DO UPDATE SET waiting = waiting + excluded.waiting,
                      served_at = CASE WHEN waiting = 0 THEN MAX(served_at, excluded.served_at)
                                       ELSE served_at END;
END;

DROP TRIGGER keyed_moved;
CREATE TRIGGER keyed_moved AFTER UPDATE OF status ON activities
WHEN NEW.concurrency_key IS NOT NULL AND OLD.status <> NEW.status
     AND NOT (OLD.status = 1 AND NEW.status = 2)
BEGIN
    INSERT INTO concurrency_keys (namespace, activity_type, concurrency_key, waiting, served_at)
    SELECT NEW.namespace, NEW.activity_type, NEW.concurrency_key, 1,
           (SELECT COALESCE(MIN(served_at), 0) FROM concurrency_keys
             WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
               AND waiting > 0)
     WHERE NEW.status = 1
    ON CONFLICT (namespace, activity_type, concurrency_key)
        DO UPDATE SET waiting = waiting + 1, running = running - (OLD.status = 2),
                      served_at = CASE WHEN waiting = 0 THEN MAX(served_at, excluded.served_at)
                                       ELSE served_at END;
    UPDATE concurrency_keys
       SET waiting = waiting - (OLD.status = 1), running = running - (OLD.status = 2)
     WHERE NEW.status <> 1 AND namespace = NEW.namespace
       AND activity_type = NEW.activity_type AND concurrency_key = NEW.concurrency_key;
    DELETE FROM concurrency_keys
     WHERE NEW.status <> 1 AND namespace = NEW.namespace
       AND activity_type = NEW.activity_type AND concurrency_key = NEW.concurrency_key
       AND waiting = 0 AND running = 0
       AND NOT EXISTS (SELECT 1 FROM key_rate_limits AS r
                        WHERE r.namespace = NEW.namespace
                          AND r.activity_type = NEW.activity_type
                          AND r.concurrency_key = NEW.concurrency_key);
END;
