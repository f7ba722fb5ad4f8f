-- Headers: small string metadata (a W3C traceparent, a tenant) stored with each
-- activity as a JSON object, delivered with every attempt. NULL means none.
ALTER TABLE activities ADD COLUMN headers TEXT;
