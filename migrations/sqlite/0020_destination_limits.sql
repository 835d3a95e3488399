-- A forge or notifier destination (API host and credential) that answered
-- with a rate limit: nothing is sent to it before paused_until (Unix ms),
-- by any instance. strikes counts limits that named no time (the pause
-- then doubles from 60 s); a send that succeeds removes the row.
CREATE TABLE destination_limits (
    destination  TEXT PRIMARY KEY,
    label        TEXT NOT NULL,
    paused_until INTEGER NOT NULL,
    strikes      INTEGER NOT NULL DEFAULT 0,
    reason       TEXT NOT NULL,
    updated_at   INTEGER NOT NULL
) STRICT;
