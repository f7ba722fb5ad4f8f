-- One row per activity. Times are Unix milliseconds; durations are milliseconds.
-- status: 1 SCHEDULED, 2 RUNNING, 3 COMPLETED, 4 FAILED, 5 CANCELLED (the wire enum).
CREATE TABLE activities (
    id                   INTEGER PRIMARY KEY,
    namespace            TEXT    NOT NULL,
    workflow_id          TEXT    NOT NULL,
    activity_id          TEXT    NOT NULL,
    activity_type        TEXT    NOT NULL,
    status               INTEGER NOT NULL,
    -- The attempt number: only ever grows, and fences results.
    attempt              INTEGER NOT NULL DEFAULT 0,
    -- Attempts that do not count against max_attempts (snoozes, drain releases,
    -- and every attempt before an operator re-drive).
    uncounted            INTEGER NOT NULL DEFAULT 0,
    max_attempts         INTEGER NOT NULL,
    initial_interval_ms  INTEGER NOT NULL,
    backoff_coefficient  REAL    NOT NULL,
    max_interval_ms      INTEGER NOT NULL,
    non_retryable        TEXT,
    heartbeat_timeout_ms INTEGER,
    start_to_close_ms    INTEGER,
    schedule_to_close_ms INTEGER,
    priority             INTEGER NOT NULL DEFAULT 0,
    input_type           TEXT    NOT NULL DEFAULT '',
    input                BLOB    NOT NULL,
    output_type          TEXT,
    output               BLOB,
    error_kind           INTEGER,
    error_type           TEXT,
    error_message        TEXT,
    error_details_type   TEXT,
    error_details        BLOB,
    heartbeat_type       TEXT,
    heartbeat_details    BLOB,
    created_at           INTEGER NOT NULL,
    next_at              INTEGER NOT NULL,
    started_at           INTEGER,
    finished_at          INTEGER,
    lease_expires_at     INTEGER,
    -- created_at + schedule_to_close_ms: when the activity fails as TIMEOUT.
    expires_at           INTEGER,
    worker_id            TEXT,
    UNIQUE (namespace, workflow_id, activity_id)
);

-- The claim: the next due rows of one type, highest priority first, then oldest.
CREATE INDEX activities_due
    ON activities (namespace, activity_type, priority DESC, next_at, id)
    WHERE status = 1;

-- The dispatch timer: the next due times of delayed rows, in order.
CREATE INDEX activities_upcoming ON activities (next_at) WHERE status = 1;

-- Schedule-to-close sweeps of rows still waiting.
CREATE INDEX activities_expiry ON activities (expires_at)
    WHERE status = 1 AND expires_at IS NOT NULL;

-- Lease sweeps and start-up reclaim.
CREATE INDEX activities_running ON activities (lease_expires_at) WHERE status = 2;

-- List and Stats by status; retention pruning of finished rows.
CREATE INDEX activities_status ON activities (namespace, status, id);
CREATE INDEX activities_finished ON activities (finished_at) WHERE status >= 3;
