-- Waiting rows with a concurrency key are claimed key by key, a row from each of
-- many keys in one claim. Indexed here, each claim deleted an entry from a leaf
-- of this index per key it served, and every one of those leaves was written to
-- the WAL and fsync'd with the claim's commit: most of a keyed drain's writes. The
-- writer, the only connection that changes rows, now keeps that index in memory
-- (`keyed_waiting`, a table of an in-memory database attached to its own
-- connection, rebuilt from the rows when it opens), so the claim writes only the
-- rows it takes.
DROP INDEX activities_keyed;
