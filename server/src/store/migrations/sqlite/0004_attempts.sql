-- Attempt history: one record per ended attempt, written by the database itself
-- whenever a row leaves RUNNING, so that no way of ending an attempt (a result, a
-- timeout, a lost worker, a cancel, a drain) can forget one. The ending's writer
-- decides what the record says: it sets attempt_outcome and attempt_ended_at in the
-- same UPDATE; the claim sets worker_identity and worker_node.
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

-- Outcomes that carry no error of their own keep none (the row keeps the previous
-- attempt's last_error). Only the last 25 attempts of an activity are kept.
CREATE TRIGGER attempt_ended AFTER UPDATE OF status ON activities
WHEN OLD.status = 2 AND NEW.status <> 2
BEGIN
    INSERT OR REPLACE INTO attempts (activity_row, attempt, worker_id, worker_identity,
        worker_node, started_at, ended_at, outcome, error_kind, error_type, error_message,
        error_details_type, error_details)
    SELECT NEW.id, OLD.attempt, OLD.worker_id, OLD.worker_identity, OLD.worker_node,
        OLD.started_at, NEW.attempt_ended_at, ifnull(NEW.attempt_outcome, 'unknown'),
        e.kind, e.type, e.message, e.details_type, e.details
    FROM (SELECT
            CASE WHEN has THEN NEW.error_kind END AS kind,
            CASE WHEN has THEN NEW.error_type END AS type,
            CASE WHEN has THEN NEW.error_message END AS message,
            CASE WHEN has THEN NEW.error_details_type END AS details_type,
            CASE WHEN has THEN NEW.error_details END AS details
          FROM (SELECT ifnull(NEW.attempt_outcome, '')
                  NOT IN ('completed', 'snoozed', 'released') AS has)) AS e;
    DELETE FROM attempts WHERE activity_row = NEW.id AND attempt <= OLD.attempt - 25;
END;

-- History lives as long as its activity (retention prunes both).
CREATE TRIGGER attempts_pruned AFTER DELETE ON activities
BEGIN
    DELETE FROM attempts WHERE activity_row = OLD.id;
END;
