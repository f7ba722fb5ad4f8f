-- The writer counts a keyed row's moves out of RUNNING itself, once per key for
-- a run of endings, where a trigger ran three statements for every row ended (see
-- `writer::KeyMoves`): the ending reports the row's key and new status, and the
-- writer moves each key's counts before the next statement that reads them. A
-- cancel of a RUNNING row is counted the same way. The trigger keeps the moves of
-- rows neither leaving nor entering RUNNING (a waiting row cancelled or expired, a
-- finished row re-driven); the claim counts the moves into RUNNING (see
-- `0012_key_shares`).
DROP TRIGGER keyed_moved;
CREATE TRIGGER keyed_moved AFTER UPDATE OF status ON activities
WHEN NEW.concurrency_key IS NOT NULL AND OLD.status <> NEW.status
     AND OLD.status <> 2 AND NEW.status <> 2
BEGIN
    INSERT INTO concurrency_keys (namespace, activity_type, concurrency_key, waiting, served_at)
    SELECT NEW.namespace, NEW.activity_type, NEW.concurrency_key, 1,
           (SELECT COALESCE(MIN(served_at), 0) FROM concurrency_keys
             WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
               AND waiting > 0)
     WHERE NEW.status = 1
    ON CONFLICT (namespace, activity_type, concurrency_key)
        DO UPDATE SET waiting = waiting + 1,
                      served_at = CASE WHEN waiting = 0 THEN MAX(served_at, excluded.served_at)
                                       ELSE served_at END;
    UPDATE concurrency_keys SET waiting = waiting - (OLD.status = 1)
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

-- The keyed index leads with the key: every statement reads it by namespace, type
-- and key together, and a search compares far fewer columns when the first one
-- already tells two entries apart (namespace and type are the same for most).
DROP INDEX activities_keyed;
CREATE INDEX activities_keyed
    ON activities (concurrency_key, namespace, activity_type, claim_band, claim_rank, id, next_at)
    WHERE status = 1 AND concurrency_key IS NOT NULL;
