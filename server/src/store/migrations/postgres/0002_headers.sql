-- The same as SQLite's 0003_headers: headers as a JSON object, NULL for none.
ALTER TABLE activities ADD COLUMN headers TEXT;
