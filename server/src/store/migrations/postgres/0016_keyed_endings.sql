-- Submits and endings of keyed attempts count themselves, once per key per
-- statement: the statements that end RUNNING rows (a batch of endings, a cancel)
-- move their keys' counts set-based, in the same statement (`fk` in
-- `sql::FINISH`), and so does a submit (below). The per-row
-- trigger now runs only when a row that was not RUNNING moves (a waiting row
-- cancelled or expired, a row re-driven), and the claim counts its own rows.
-- - An ending that leaves a key with neither waiting nor running rows leaves its
--   row (a statement cannot both update and delete it); the prune deletes such
--   rows, found by `concurrency_keys_idle`, while keys without waiting rows are
--   out of the claim's index altogether (`concurrency_keys_ready` is partial).
DROP TRIGGER keyed_moved ON activities;
CREATE TRIGGER keyed_moved AFTER UPDATE OF status ON activities
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL AND OLD.status <> NEW.status
          AND OLD.status <> 2 AND NEW.status <> 2)
    EXECUTE FUNCTION spool_keyed_moved();

DROP INDEX concurrency_keys_ready;
CREATE INDEX concurrency_keys_ready
    ON concurrency_keys (namespace, activity_type, served_at, concurrency_key)
    WHERE waiting > 0;
CREATE INDEX concurrency_keys_idle ON concurrency_keys (namespace, activity_type)
    WHERE waiting = 0 AND running = 0;

-- A submit counts its keys' new rows the same way, once per key (`ik` in
-- `sql::INSERT`).
DROP TRIGGER keyed_inserted ON activities;
DROP FUNCTION spool_keyed_inserted();
