-- The outputs a target's last successful apply left (a JSON object), for
-- the targets whose `inputs` name them. Recorded only for targets that
-- some target takes inputs from.
CREATE TABLE target_outputs (
    target      TEXT PRIMARY KEY,
    run_id      INTEGER NOT NULL,
    outputs     TEXT NOT NULL,
    recorded_at INTEGER NOT NULL
) STRICT;
