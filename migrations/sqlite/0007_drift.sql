-- Drift found by a `policy = "detect"` target's plan: its hash (a new hash
-- is news for the owners), what differs (summary and address-and-action
-- lines, never a value), and since when (Unix ms). NULL: no drift.
ALTER TABLE targets ADD COLUMN drift_hash TEXT;
ALTER TABLE targets ADD COLUMN drift_summary TEXT;
ALTER TABLE targets ADD COLUMN drift_since INTEGER;
