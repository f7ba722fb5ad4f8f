-- The same as SQLite's 0004_attempts: the last ended attempt is described by the
-- activity row (worker_identity and worker_node set by the claim, attempt_outcome
-- and attempt_ended_at by an ending of a RUNNING row); an attempt followed by
-- another, or by a re-drive, is copied into `attempts` by a trigger.
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

CREATE FUNCTION spool_attempt_kept() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    -- RUNNING back to SCHEDULED: the attempt that just ended, as the new row
    -- says; a re-drive: the last attempt, as the old row said.
    rescheduled BOOLEAN := OLD.status = 2;
    src activities := CASE WHEN rescheduled THEN NEW ELSE OLD END;
    has_error BOOLEAN := COALESCE(src.attempt_outcome, '')
        NOT IN ('completed', 'snoozed', 'released');
BEGIN
    INSERT INTO attempts (activity_row, attempt, worker_id, worker_identity, worker_node,
        started_at, ended_at, outcome, error_kind, error_type, error_message,
        error_details_type, error_details)
    VALUES (OLD.id, OLD.attempt, OLD.worker_id, OLD.worker_identity, OLD.worker_node,
        OLD.started_at, src.attempt_ended_at, COALESCE(src.attempt_outcome, 'unknown'),
        CASE WHEN has_error THEN src.error_kind END,
        CASE WHEN has_error THEN src.error_type END,
        CASE WHEN has_error THEN src.error_message END,
        CASE WHEN has_error THEN src.error_details_type END,
        CASE WHEN has_error THEN src.error_details END)
    ON CONFLICT (activity_row, attempt) DO NOTHING;
    IF rescheduled AND OLD.attempt > 25 THEN
        DELETE FROM attempts WHERE activity_row = OLD.id AND attempt <= OLD.attempt - 25;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER attempt_rescheduled AFTER UPDATE OF status ON activities
FOR EACH ROW WHEN (OLD.status = 2 AND NEW.status = 1)
EXECUTE FUNCTION spool_attempt_kept();

CREATE TRIGGER attempt_redriven AFTER UPDATE OF status ON activities
FOR EACH ROW WHEN (OLD.status >= 3 AND NEW.status = 1 AND OLD.attempt_outcome IS NOT NULL)
EXECUTE FUNCTION spool_attempt_kept();

CREATE FUNCTION spool_attempts_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM attempts WHERE activity_row = OLD.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER attempts_pruned AFTER DELETE ON activities
FOR EACH ROW EXECUTE FUNCTION spool_attempts_pruned();
