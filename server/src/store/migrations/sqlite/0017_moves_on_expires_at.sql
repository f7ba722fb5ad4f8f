-- The three triggers on a row's moves between statuses fire on `expires_at`, not
-- `status`. SQLite runs an `AFTER UPDATE OF status` trigger's program for every row
-- that any statement setting `status` updates, its `WHEN` tested inside, and keeps
-- the row's old and new values for it; the claim (SCHEDULED to RUNNING) and an
-- ending that is final (RUNNING to COMPLETED, FAILED or CANCELLED) are most of the
-- writer's updates, and none of the three does anything for them. So the statements
-- whose moves the triggers follow name `expires_at` in their `SET` (re-driving sets
-- it; ending a RUNNING row SCHEDULED again, cancelling and expiring set it to
-- itself), and the claim and a final ending do not. The bodies are unchanged.

DROP TRIGGER attempt_rescheduled;
CREATE TRIGGER attempt_rescheduled AFTER UPDATE OF expires_at ON activities
WHEN OLD.status = 2 AND NEW.status = 1
BEGIN
    INSERT OR REPLACE INTO attempts (activity_row, attempt, worker_id, worker_identity,
        worker_node, started_at, ended_at, outcome, error_kind, error_type, error_message,
        error_details_type, error_details)
    SELECT NEW.id, OLD.attempt, OLD.worker_id, OLD.worker_identity, OLD.worker_node,
        OLD.started_at, NEW.attempt_ended_at, ifnull(NEW.attempt_outcome, 'unknown'),
        CASE WHEN e.has THEN NEW.error_kind END,
        CASE WHEN e.has THEN NEW.error_type END,
        CASE WHEN e.has THEN NEW.error_message END,
        CASE WHEN e.has THEN NEW.error_details_type END,
        CASE WHEN e.has THEN NEW.error_details END
    FROM (SELECT ifnull(NEW.attempt_outcome, '') NOT IN ('completed', 'snoozed', 'released')
            AS has) AS e;
    DELETE FROM attempts
    WHERE OLD.attempt > 25 AND activity_row = NEW.id AND attempt <= OLD.attempt - 25;
END;

DROP TRIGGER attempt_redriven;
CREATE TRIGGER attempt_redriven AFTER UPDATE OF expires_at ON activities
WHEN OLD.status >= 3 AND NEW.status = 1 AND OLD.attempt_outcome IS NOT NULL
BEGIN
    INSERT OR IGNORE INTO attempts (activity_row, attempt, worker_id, worker_identity,
        worker_node, started_at, ended_at, outcome, error_kind, error_type, error_message,
        error_details_type, error_details)
    SELECT OLD.id, OLD.attempt, OLD.worker_id, OLD.worker_identity, OLD.worker_node,
        OLD.started_at, OLD.attempt_ended_at, OLD.attempt_outcome,
        CASE WHEN e.has THEN OLD.error_kind END,
        CASE WHEN e.has THEN OLD.error_type END,
        CASE WHEN e.has THEN OLD.error_message END,
        CASE WHEN e.has THEN OLD.error_details_type END,
        CASE WHEN e.has THEN OLD.error_details END
    FROM (SELECT OLD.attempt_outcome NOT IN ('completed', 'snoozed', 'released') AS has) AS e;
END;

DROP TRIGGER keyed_moved;
CREATE TRIGGER keyed_moved AFTER UPDATE OF expires_at ON activities
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
