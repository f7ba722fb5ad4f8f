-- A claim serves only the concurrency keys with a row due now: a key whose rows
-- are all due later must not take a place among the keys a claim serves (the
-- claim came back empty while another key's row was due, and that row waited
-- for the next one to come due). This index answers "has key K a row due by
-- now?" with one probe, however many of K's rows are due later.
CREATE INDEX activities_keyed_due
    ON activities (namespace, activity_type, concurrency_key, next_at)
    WHERE status = 1 AND concurrency_key IS NOT NULL;
