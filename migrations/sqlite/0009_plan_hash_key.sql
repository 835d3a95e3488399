-- Plan hashes people see are keyed: plan_hash = HMAC-SHA256(this key, the
-- backend's own hash). A backend hashes its tool's plan document, which can
-- hold sensitive values (terraform's `show -json` does), so an unkeyed
-- hash would let anyone who reads it test guesses of such a value. The key
-- never leaves this database; `backend_hash` (never shown) is what the
-- backend compares when it applies an approved plan.
CREATE TABLE keys (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
) STRICT;

ALTER TABLE plans ADD COLUMN backend_hash TEXT;
