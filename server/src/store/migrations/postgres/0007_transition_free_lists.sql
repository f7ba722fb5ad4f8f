-- Every update of an activity changes a column some index covers, so each new row
-- version gets an entry in every index whose predicate it meets. An index on all
-- rows by namespace therefore cost an entry per transition (three per activity)
-- for the sake of List and Stats. They read instead:
-- - every status: the primary key in id order, filtered by namespace (or the
--   unique key, when the planner finds the namespace small);
-- - SCHEDULED and RUNNING rows: `activities_due` and `activities_running`, which
--   the claim and the lease sweep need anyway;
-- - finished rows: `activities_ended`, one entry per activity when it finishes.
DROP INDEX activities_namespace;
CREATE INDEX activities_ended ON activities (namespace, status, id) WHERE status >= 3;
