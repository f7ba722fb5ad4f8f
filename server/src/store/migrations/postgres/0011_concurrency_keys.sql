-- Concurrency keys: of the waiting rows sharing a key, at most the type's
-- `max_running` (no limit when it has none) are RUNNING at once.
-- - Keyed rows sort after every unkeyed one in `activities_due` (their
--   `claim_band` is offset by 2^40), so the claim of unkeyed rows stops before
--   them, and they are claimed key by key from `activities_keyed`.
-- - `concurrency_keys` counts each key's waiting and running rows, kept by the
--   triggers below on every status change, and when it was last served, so claims
--   go round the keys with room. A claim locks the key rows it serves (skipping
--   those another node is serving), so nodes never give a key more than its room.
--   A key with neither waiting nor running rows is deleted.
ALTER TABLE activities ADD COLUMN concurrency_key TEXT;
CREATE INDEX activities_keyed
    ON activities (namespace, activity_type, concurrency_key, claim_band, claim_rank, id)
    INCLUDE (next_at)
    WHERE status = 1 AND concurrency_key IS NOT NULL;

CREATE TABLE concurrency_limits (
    namespace     TEXT   NOT NULL,
    activity_type TEXT   NOT NULL,
    max_running   BIGINT NOT NULL CHECK (max_running > 0),
    PRIMARY KEY (namespace, activity_type)
);

CREATE TABLE concurrency_keys (
    namespace       TEXT   NOT NULL,
    activity_type   TEXT   NOT NULL,
    concurrency_key TEXT   NOT NULL,
    waiting         BIGINT NOT NULL DEFAULT 0,
    running         BIGINT NOT NULL DEFAULT 0,
    served_at       BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, activity_type, concurrency_key)
);
CREATE INDEX concurrency_keys_ready
    ON concurrency_keys (namespace, activity_type, served_at, concurrency_key)
    WHERE waiting > 0;

CREATE FUNCTION spool_keyed_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO concurrency_keys (namespace, activity_type, concurrency_key, waiting)
    VALUES (NEW.namespace, NEW.activity_type, NEW.concurrency_key, (NEW.status = 1)::INT)
    ON CONFLICT (namespace, activity_type, concurrency_key)
        DO UPDATE SET waiting = concurrency_keys.waiting + (NEW.status = 1)::INT;
    RETURN NULL;
END
$$;

CREATE TRIGGER keyed_inserted AFTER INSERT ON activities
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION spool_keyed_inserted();

CREATE FUNCTION spool_keyed_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE concurrency_keys
       SET waiting = waiting + (NEW.status = 1)::INT - (OLD.status = 1)::INT,
           running = running + (NEW.status = 2)::INT - (OLD.status = 2)::INT,
           served_at = CASE WHEN NEW.status = 2 THEN NEW.started_at ELSE served_at END
     WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
       AND concurrency_key = NEW.concurrency_key;
    DELETE FROM concurrency_keys
     WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
       AND concurrency_key = NEW.concurrency_key AND waiting = 0 AND running = 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER keyed_moved AFTER UPDATE OF status ON activities
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL AND OLD.status <> NEW.status)
    EXECUTE FUNCTION spool_keyed_moved();
