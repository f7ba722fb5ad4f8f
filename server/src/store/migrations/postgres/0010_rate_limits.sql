-- Rate limits of (namespace, activity type), enforced by the claim as a token
-- bucket kept in one number (GCRA): `tat_ns` is when the bucket is next full
-- again, in nanoseconds of the store's clock. A claim at `now` may take up to
-- (now + burst × interval − max(tat, now)) / interval rows, and moves `tat_ns` on
-- by one interval per row it took, in the same transaction: every node claiming
-- the type takes its rows from the one bucket.
CREATE TABLE rate_limits (
    namespace     TEXT NOT NULL,
    activity_type TEXT NOT NULL,
    -- As set: at most `per_period` rows per `period_ms`, and `burst` at once.
    per_period    BIGINT NOT NULL CHECK (per_period > 0),
    period_ms     BIGINT NOT NULL CHECK (period_ms > 0),
    burst         BIGINT NOT NULL CHECK (burst > 0),
    -- period_ms × 1e6 / per_period: the time one row's token takes to come back.
    interval_ns   BIGINT NOT NULL CHECK (interval_ns > 0),
    tat_ns        BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, activity_type)
);
