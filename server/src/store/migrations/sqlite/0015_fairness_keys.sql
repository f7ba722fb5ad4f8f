-- Fairness keys (see `store::fairness`): a row submitted with one is ranked by a
-- virtual due time, `fair_at`, placed on its key's chain, so that the claim's
-- usual order serves the keys of a type in turn.
-- - `fairness_key` is kept for reads; `fair_at` is what the rank was computed from
--   (a change of the priority aging ranks the row from it again), cleared when
--   the row is rescheduled.
-- - `fairness_keys` holds each key's chain per band (`last_us`, microseconds);
--   a chain behind the head of its band (or behind now, when the band has no
--   row due) changes nothing, and the pruner deletes it, reading the
--   table whole: it holds a row per key with rows submitted lately, and an index
--   of `last_us` would cost every submit an entry.
ALTER TABLE activities ADD COLUMN fairness_key TEXT;
ALTER TABLE activities ADD COLUMN fair_at INTEGER;

CREATE TABLE fairness_keys (
    namespace     TEXT    NOT NULL,
    activity_type TEXT    NOT NULL,
    claim_band    INTEGER NOT NULL,
    fairness_key  TEXT    NOT NULL,
    last_us       INTEGER NOT NULL,
    PRIMARY KEY (namespace, activity_type, claim_band, fairness_key)
);
