-- The same as SQLite's 0004_attempts: one record per ended attempt, written by a
-- trigger whenever a row leaves RUNNING; the ending's UPDATE sets attempt_outcome
-- and attempt_ended_at, the claim sets worker_identity and worker_node.
ALTER TABLE activities ADD COLUMN worker_identity TEXT;
ALTER TABLE activities ADD COLUMN worker_node TEXT;
ALTER TABLE activities ADD COLUMN attempt_outcome TEXT;
ALTER TABLE activities ADD COLUMN attempt_ended_at BIGINT;

CREATE TABLE attempts (
    activity_row       BIGINT NOT NULL,
    attempt            BIGINT NOT NULL,
    worker_id          TEXT,
    worker_identity    TEXT,
    worker_node        TEXT,
    started_at         BIGINT,
    ended_at           BIGINT,
    outcome            TEXT NOT NULL,
    error_kind         BIGINT,
    error_type         TEXT,
    error_message      TEXT,
    error_details_type TEXT,
    error_details      BYTEA,
    PRIMARY KEY (activity_row, attempt)
);

CREATE FUNCTION spool_attempt_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    has_error BOOLEAN := COALESCE(NEW.attempt_outcome, '')
        NOT IN ('completed', 'snoozed', 'released');
BEGIN
    INSERT INTO attempts (activity_row, attempt, worker_id, worker_identity, worker_node,
        started_at, ended_at, outcome, error_kind, error_type, error_message,
        error_details_type, error_details)
    VALUES (NEW.id, OLD.attempt, OLD.worker_id, OLD.worker_identity, OLD.worker_node,
        OLD.started_at, NEW.attempt_ended_at, COALESCE(NEW.attempt_outcome, 'unknown'),
        CASE WHEN has_error THEN NEW.error_kind END,
        CASE WHEN has_error THEN NEW.error_type END,
        CASE WHEN has_error THEN NEW.error_message END,
        CASE WHEN has_error THEN NEW.error_details_type END,
        CASE WHEN has_error THEN NEW.error_details END)
    ON CONFLICT (activity_row, attempt) DO UPDATE SET
        worker_id = EXCLUDED.worker_id, worker_identity = EXCLUDED.worker_identity,
        worker_node = EXCLUDED.worker_node, started_at = EXCLUDED.started_at,
        ended_at = EXCLUDED.ended_at, outcome = EXCLUDED.outcome,
        error_kind = EXCLUDED.error_kind, error_type = EXCLUDED.error_type,
        error_message = EXCLUDED.error_message,
        error_details_type = EXCLUDED.error_details_type,
        error_details = EXCLUDED.error_details;
    IF OLD.attempt > 25 THEN
        DELETE FROM attempts WHERE activity_row = NEW.id AND attempt <= OLD.attempt - 25;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER attempt_ended AFTER UPDATE OF status ON activities
FOR EACH ROW WHEN (OLD.status = 2 AND NEW.status <> 2)
EXECUTE FUNCTION spool_attempt_ended();

CREATE FUNCTION spool_attempts_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM attempts WHERE activity_row = OLD.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER attempts_pruned AFTER DELETE ON activities
FOR EACH ROW EXECUTE FUNCTION spool_attempts_pruned();
