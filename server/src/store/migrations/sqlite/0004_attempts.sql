-- Attempt history. The last attempt that ended is described by the activity row
-- itself: its worker (worker_id, worker_identity, worker_node, set by the claim),
-- started_at, and how and when it ended (attempt_outcome, attempt_ended_at, set by
-- the ending's one SET clause only when the row was RUNNING), with last_error. So
-- the common case, an attempt that finishes the activity, writes nothing more. An
-- attempt followed by another (a retry, a snooze, a release; or a re-drive after
-- the end) is copied into `attempts` by a trigger, in the same statement, before
-- the row's columns move on to the next attempt.
ALTER TABLE activities ADD COLUMN worker_identity TEXT;
ALTER TABLE activities ADD COLUMN worker_node TEXT;
ALTER TABLE activities ADD COLUMN attempt_outcome TEXT;
ALTER TABLE activities ADD COLUMN attempt_ended_at INTEGER;

CREATE TABLE attempts (
    activity_row       INTEGER NOT NULL,
    attempt            INTEGER NOT NULL,
    worker_id          TEXT,
    worker_identity    TEXT,
    worker_node        TEXT,
    started_at         INTEGER,
    ended_at           INTEGER,
    outcome            TEXT NOT NULL,
    error_kind         INTEGER,
    error_type         TEXT,
    error_message      TEXT,
    error_details_type TEXT,
    error_details      BLOB,
    PRIMARY KEY (activity_row, attempt)
) WITHOUT ROWID;

-- RUNNING back to SCHEDULED: the attempt that just ended. Outcomes with no error
-- of their own record none (the row keeps an earlier attempt's last_error). Only
-- the newest 25 records of an activity are kept.
CREATE TRIGGER attempt_rescheduled AFTER UPDATE OF status ON activities
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

-- A finished activity re-driven: its last attempt, described by the row until now,
-- is kept (unless a record of it exists: a row cancelled while it waited).
CREATE TRIGGER attempt_redriven AFTER UPDATE OF status ON activities
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

-- History lives as long as its activity (retention prunes both).
CREATE TRIGGER attempts_pruned AFTER DELETE ON activities
BEGIN
    DELETE FROM attempts WHERE activity_row = OLD.id;
END;
