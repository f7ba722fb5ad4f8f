-- What happens to a key's activities beyond its limit: 0 they wait (queue), 1 the
-- newest are cancelled, 2 the oldest are cancelled (see `store::concurrency`).
ALTER TABLE concurrency_limits ADD COLUMN strategy INTEGER NOT NULL DEFAULT 0
    CHECK (strategy IN (0, 1, 2));
