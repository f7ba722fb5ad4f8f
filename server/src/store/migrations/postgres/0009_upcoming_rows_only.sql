-- `activities_upcoming` arms the dispatch timer: it only needs rows that were not
-- yet due when written (delayed submits, retries, snoozes). A row submitted to run
-- at once (`next_at` at or before `created_at`) is due on commit, and its type is
-- marked due then, so it no longer costs an entry here on insert and another on
-- claim. The due-time read names the same condition, so it uses this index.
DROP INDEX activities_upcoming;
CREATE INDEX activities_upcoming ON activities (next_at)
    WHERE status = 1 AND next_at > created_at;
