-- Concurrency keys: of the waiting rows sharing a key, at most the type's
-- `max_running` (no limit when it has none) are RUNNING at once.
-- - Keyed rows sort after every unkeyed one in `activities_due` (their
--   `claim_band` is offset by 2^40), so the claim of unkeyed rows stops before
--   them, and they are claimed key by key from `activities_keyed`.
-- - `concurrency_keys` counts each key's waiting and running rows, kept by the
--   triggers below on every status change, and when it was last served, so claims
--   go round the keys with room. A key with neither is deleted.
ALTER TABLE activities ADD COLUMN concurrency_key TEXT;
CREATE INDEX activities_keyed
    ON activities (namespace, activity_type, concurrency_key, claim_band, claim_rank, id, next_at)
    WHERE status = 1 AND concurrency_key IS NOT NULL;

CREATE TABLE concurrency_limits (
    namespace     TEXT    NOT NULL,
    activity_type TEXT    NOT NULL,
    max_running   INTEGER NOT NULL CHECK (max_running > 0),
    PRIMARY KEY (namespace, activity_type)
);

CREATE TABLE concurrency_keys (
    namespace       TEXT    NOT NULL,
    activity_type   TEXT    NOT NULL,
    concurrency_key TEXT    NOT NULL,
    waiting         INTEGER NOT NULL DEFAULT 0,
    running         INTEGER NOT NULL DEFAULT 0,
    served_at       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, activity_type, concurrency_key)
);
CREATE INDEX concurrency_keys_ready
    ON concurrency_keys (namespace, activity_type, served_at, concurrency_key)
    WHERE waiting > 0;

CREATE TRIGGER keyed_inserted AFTER INSERT ON activities
WHEN NEW.concurrency_key IS NOT NULL
BEGIN
    INSERT INTO concurrency_keys (namespace, activity_type, concurrency_key, waiting)
    VALUES (NEW.namespace, NEW.activity_type, NEW.concurrency_key, NEW.status = 1)
    ON CONFLICT (namespace, activity_type, concurrency_key)
        DO UPDATE SET waiting = waiting + (NEW.status = 1);
END;

CREATE TRIGGER keyed_moved AFTER UPDATE OF status ON activities
WHEN NEW.concurrency_key IS NOT NULL AND OLD.status <> NEW.status
BEGIN
    UPDATE concurrency_keys
       SET waiting = waiting + (NEW.status = 1) - (OLD.status = 1),
           running = running + (NEW.status = 2) - (OLD.status = 2),
           served_at = CASE WHEN NEW.status = 2 THEN NEW.started_at ELSE served_at END
     WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
       AND concurrency_key = NEW.concurrency_key;
    DELETE FROM concurrency_keys
     WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
       AND concurrency_key = NEW.concurrency_key AND waiting = 0 AND running = 0;
END;
