-- Cheaper bookkeeping of concurrency keys, which ran at every insert, claim and
-- ending of a keyed row:
-- - a claim only moves a row from waiting to running: it has its own trigger, with
--   no check for a key left empty;
-- - the index of keys is no longer partial on `waiting > 0`, so a change of the
--   counts alone can be a HOT update (the claim's read skips keys with nothing
--   waiting; a key with neither waiting nor running rows is deleted anyway).
DROP TRIGGER keyed_moved ON activities;

CREATE FUNCTION spool_keyed_claimed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE concurrency_keys
       SET waiting = waiting - 1, running = running + 1, served_at = NEW.started_at
     WHERE namespace = NEW.namespace AND activity_type = NEW.activity_type
       AND concurrency_key = NEW.concurrency_key;
    RETURN NULL;
END
$$;

CREATE TRIGGER keyed_claimed AFTER UPDATE OF status ON activities
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL AND OLD.status = 1 AND NEW.status = 2)
    EXECUTE FUNCTION spool_keyed_claimed();

CREATE TRIGGER keyed_moved AFTER UPDATE OF status ON activities
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL AND OLD.status <> NEW.status
          AND NOT (OLD.status = 1 AND NEW.status = 2))
    EXECUTE FUNCTION spool_keyed_moved();

DROP INDEX concurrency_keys_ready;
CREATE INDEX concurrency_keys_ready
    ON concurrency_keys (namespace, activity_type, served_at, concurrency_key);
