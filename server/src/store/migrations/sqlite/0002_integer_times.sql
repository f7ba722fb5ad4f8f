-- Repairs rows an older version could poison: a time or duration that overflowed
-- 64-bit integers in SQL arithmetic was stored as a REAL, which every read then
-- refused. CAST saturates at the bounds of a 64-bit integer. (Times are now computed,
-- saturating, before they reach a statement, and bound as integers.) One pass over
-- the table, once.
UPDATE activities SET
    expires_at = CASE WHEN typeof(expires_at) = 'real' THEN CAST(expires_at AS INTEGER) ELSE expires_at END,
    next_at = CASE WHEN typeof(next_at) = 'real' THEN CAST(next_at AS INTEGER) ELSE next_at END,
    created_at = CASE WHEN typeof(created_at) = 'real' THEN CAST(created_at AS INTEGER) ELSE created_at END,
    started_at = CASE WHEN typeof(started_at) = 'real' THEN CAST(started_at AS INTEGER) ELSE started_at END,
    finished_at = CASE WHEN typeof(finished_at) = 'real' THEN CAST(finished_at AS INTEGER) ELSE finished_at END,
    lease_expires_at = CASE WHEN typeof(lease_expires_at) = 'real' THEN CAST(lease_expires_at AS INTEGER) ELSE lease_expires_at END,
    heartbeat_timeout_ms = CASE WHEN typeof(heartbeat_timeout_ms) = 'real' THEN CAST(heartbeat_timeout_ms AS INTEGER) ELSE heartbeat_timeout_ms END,
    start_to_close_ms = CASE WHEN typeof(start_to_close_ms) = 'real' THEN CAST(start_to_close_ms AS INTEGER) ELSE start_to_close_ms END,
    schedule_to_close_ms = CASE WHEN typeof(schedule_to_close_ms) = 'real' THEN CAST(schedule_to_close_ms AS INTEGER) ELSE schedule_to_close_ms END
WHERE typeof(expires_at) = 'real'
   OR typeof(next_at) = 'real'
   OR typeof(created_at) = 'real'
   OR typeof(started_at) = 'real'
   OR typeof(finished_at) = 'real'
   OR typeof(lease_expires_at) = 'real'
   OR typeof(heartbeat_timeout_ms) = 'real'
   OR typeof(start_to_close_ms) = 'real'
   OR typeof(schedule_to_close_ms) = 'real';
