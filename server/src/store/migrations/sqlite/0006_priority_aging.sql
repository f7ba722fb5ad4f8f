-- The claim takes due rows in the order of two columns, written wherever `next_at`
-- is (submit, retry, snooze, redrive), so that order stays one index range:
-- - with strict priority (`priority_aging_ms` = 0), `claim_band` is -priority and
--   `claim_rank` is `next_at`: highest priority first, then longest due;
-- - with aging, `claim_band` is 0 and `claim_rank` is
--   `next_at - priority * priority_aging_ms`: one level of priority is worth that
--   long a wait, so a low priority row is overtaken only by rows of higher
--   priority that came due less than (difference × aging) after it.
-- The writes read the setting from `dispatch_settings` themselves; changing it
-- re-ranks every waiting row in the same transaction.
CREATE TABLE dispatch_settings (
    one               INTEGER PRIMARY KEY CHECK (one = 1),
    priority_aging_ms INTEGER NOT NULL CHECK (priority_aging_ms >= 0)
);
INSERT INTO dispatch_settings (one, priority_aging_ms) VALUES (1, 0);

ALTER TABLE activities ADD COLUMN claim_band INTEGER NOT NULL DEFAULT 0;
ALTER TABLE activities ADD COLUMN claim_rank INTEGER NOT NULL DEFAULT 0;
UPDATE activities SET claim_band = -priority, claim_rank = next_at WHERE status = 1;

-- `next_at` rides along, so the claim's due test and the counts of delayed rows
-- read the index alone.
DROP INDEX activities_due;
CREATE INDEX activities_due
    ON activities (namespace, activity_type, claim_band, claim_rank, id, next_at)
    WHERE status = 1;
