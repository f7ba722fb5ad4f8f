-- The same table as the SQLite schema of the same number, in PostgreSQL's types.
-- Times are Unix milliseconds; durations are milliseconds; every integer is BIGINT.
-- status: 1 SCHEDULED, 2 RUNNING, 3 COMPLETED, 4 FAILED, 5 CANCELLED (the wire enum).
CREATE TABLE activities (
    id                   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace            TEXT             NOT NULL,
    workflow_id          TEXT             NOT NULL,
    activity_id          TEXT             NOT NULL,
    activity_type        TEXT             NOT NULL,
    status               BIGINT           NOT NULL,
    attempt              BIGINT           NOT NULL DEFAULT 0,
    uncounted            BIGINT           NOT NULL DEFAULT 0,
    max_attempts         BIGINT           NOT NULL,
    initial_interval_ms  BIGINT           NOT NULL,
    backoff_coefficient  DOUBLE PRECISION NOT NULL,
    max_interval_ms      BIGINT           NOT NULL,
    non_retryable        TEXT,
    heartbeat_timeout_ms BIGINT,
    start_to_close_ms    BIGINT,
    schedule_to_close_ms BIGINT,
    priority             BIGINT           NOT NULL DEFAULT 0,
    input_type           TEXT             NOT NULL DEFAULT '',
    input                BYTEA            NOT NULL,
    output_type          TEXT,
    output               BYTEA,
    error_kind           BIGINT,
    error_type           TEXT,
    error_message        TEXT,
    error_details_type   TEXT,
    error_details        BYTEA,
    heartbeat_type       TEXT,
    heartbeat_details    BYTEA,
    created_at           BIGINT           NOT NULL,
    next_at              BIGINT           NOT NULL,
    started_at           BIGINT,
    finished_at          BIGINT,
    lease_expires_at     BIGINT,
    expires_at           BIGINT,
    worker_id            TEXT,
    UNIQUE (namespace, workflow_id, activity_id)
);

CREATE INDEX activities_due
    ON activities (namespace, activity_type, priority DESC, next_at, id)
    WHERE status = 1;

CREATE INDEX activities_upcoming ON activities (next_at) WHERE status = 1;

CREATE INDEX activities_expiry ON activities (expires_at)
    WHERE status = 1 AND expires_at IS NOT NULL;

CREATE INDEX activities_running ON activities (lease_expires_at) WHERE status = 2;

CREATE INDEX activities_status ON activities (namespace, status, id);
CREATE INDEX activities_finished ON activities (finished_at) WHERE status >= 3;
