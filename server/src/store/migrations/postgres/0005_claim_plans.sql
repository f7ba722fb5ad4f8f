-- The claim must always be a range scan of `activities_due`, whatever the planner
-- believes about the table. `activities_status` (namespace, status, id) matched the
-- claim's `namespace = $4 AND status = 1` with two equalities, so on statistics
-- taken when the table was empty (or held only finished rows) a generic plan chose
-- it and sorted every scheduled row of the namespace on each claim. Listing and
-- counting by namespace need no status in the key: the status rides along, for
-- index-only counts and filters.
DROP INDEX activities_status;
CREATE INDEX activities_namespace ON activities (namespace, id) INCLUDE (status);
