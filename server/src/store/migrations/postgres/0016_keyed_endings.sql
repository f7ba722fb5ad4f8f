-- Statements count keyed rows once per key, set-based, in the statement that
-- moves them: a submit (`ik` in `sql::INSERT`), a claim (`kb`), a batch of
-- endings (`fk`, or `kb` for the keys the same statement claims), a cancel of a
-- RUNNING row (`kd`). The per-row triggers did it before, and nodes of the
-- version before still rely on them during a rolling upgrade, so the triggers
-- stay for those nodes' sessions only: every session of this version sets
-- `spool.keyed_counts = statement`, and the triggers leave its rows alone. The
-- moves of a row that is not RUNNING and does not become so (a waiting row
-- cancelled or expired, a row re-driven) are counted by the trigger for every
-- session.
-- - A key that starts waiting (a new key, a re-driven row) starts at the lowest
--   pass of the keys waiting now (see the `0014_key_shares` migration).
-- - An ending that leaves a key with neither waiting nor running rows leaves its
--   row (a statement cannot both update and delete it); the prune deletes such
--   rows, found by `concurrency_keys_idle`, and keys without waiting rows are out
--   of the claim's index altogether (`concurrency_keys_ready` is partial).
CREATE OR REPLACE FUNCTION spool_key_pass(ns TEXT, ty TEXT) RETURNS BIGINT
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(MIN(served_at), 0) FROM concurrency_keys
     WHERE namespace = ns AND activity_type = ty AND waiting > 0
$$;

CREATE OR REPLACE FUNCTION spool_keyed_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO concurrency_keys (namespace, activity_type, concurrency_key, waiting, served_at)
    VALUES (NEW.namespace, NEW.activity_type, NEW.concurrency_key, (NEW.status = 1)::INT,
            spool_key_pass(NEW.namespace, NEW.activity_type))
    ON CONFLICT (namespace, activity_type, concurrency_key)
        DO UPDATE SET waiting = concurrency_keys.waiting + excluded.waiting;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION spool_keyed_claimed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE concurrency_keys
       SET waiting = waiting - 1, running = running + 1, served_at = served_at + 1000000
     WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
       AND concurrency_key = NEW.concurrency_key;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION spool_keyed_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 1 THEN
        INSERT INTO concurrency_keys (namespace, activity_type, concurrency_key, waiting, served_at)
        VALUES (NEW.namespace, NEW.activity_type, NEW.concurrency_key, 1,
                spool_key_pass(NEW.namespace, NEW.activity_type))
        ON CONFLICT (namespace, activity_type, concurrency_key)
            DO UPDATE SET waiting = concurrency_keys.waiting + 1,
                          running = concurrency_keys.running - (OLD.status = 2)::INT,
                          served_at = CASE WHEN concurrency_keys.waiting = 0
                                           THEN GREATEST(concurrency_keys.served_at, excluded.served_at)
                                           ELSE concurrency_keys.served_at END;
    ELSE
        UPDATE concurrency_keys
           SET waiting = waiting - (OLD.status = 1)::INT,
               running = running - (OLD.status = 2)::INT
         WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
           AND concurrency_key = NEW.concurrency_key;
        DELETE FROM concurrency_keys
         WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
           AND concurrency_key = NEW.concurrency_key AND waiting = 0 AND running = 0
           AND NOT EXISTS (SELECT 1 FROM key_rate_limits AS r
                            WHERE r.namespace = NEW.namespace
                              AND r.activity_type = NEW.activity_type
                              AND r.concurrency_key = NEW.concurrency_key);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER keyed_inserted ON activities;
CREATE TRIGGER keyed_inserted AFTER INSERT ON activities
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL
          AND current_setting('spool.keyed_counts', true) IS DISTINCT FROM 'statement')
    EXECUTE FUNCTION spool_keyed_inserted();

DROP TRIGGER keyed_claimed ON activities;
CREATE TRIGGER keyed_claimed AFTER UPDATE OF status ON activities
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL AND OLD.status = 1 AND NEW.status = 2
          AND current_setting('spool.keyed_counts', true) IS DISTINCT FROM 'statement')
    EXECUTE FUNCTION spool_keyed_claimed();

DROP TRIGGER keyed_moved ON activities;
CREATE TRIGGER keyed_moved AFTER UPDATE OF status ON activities
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL AND OLD.status <> NEW.status
          AND OLD.status <> 2 AND NEW.status <> 2)
    EXECUTE FUNCTION spool_keyed_moved();
CREATE TRIGGER keyed_ended AFTER UPDATE OF status ON activities
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL AND OLD.status = 2 AND NEW.status <> 2
          AND current_setting('spool.keyed_counts', true) IS DISTINCT FROM 'statement')
    EXECUTE FUNCTION spool_keyed_moved();

DROP INDEX concurrency_keys_ready;
CREATE INDEX concurrency_keys_ready
    ON concurrency_keys (namespace, activity_type, served_at, concurrency_key)
    WHERE waiting > 0;
CREATE INDEX concurrency_keys_idle ON concurrency_keys (namespace, activity_type)
    WHERE waiting = 0 AND running = 0;
