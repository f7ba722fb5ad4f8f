-- Every status change rewrote two entries of `activities_status` (namespace,
-- status, id): a delete and an insert for each claim and each ending, on the one
-- writer every transition goes through. Lists and counts are served instead by
-- indexes a transition does not touch, or touches once:
-- - `activities_namespace` (namespace, id): written when a row is inserted, never
--   again (neither column changes), for lists of every status;
-- - `activities_ended` (namespace, status, id) of finished rows: one entry when a
--   row finishes, for lists and counts of a finished status;
-- - SCHEDULED and RUNNING rows are listed and counted through `activities_due` and
--   `activities_running`, which the claim and the ending maintain anyway.
DROP INDEX activities_status;
CREATE INDEX activities_namespace ON activities (namespace, id);
CREATE INDEX activities_ended ON activities (namespace, status, id) WHERE status >= 3;
