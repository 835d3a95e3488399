-- Notifications: per-target failure tracking and the outbox a sender drains.

ALTER TABLE targets ADD COLUMN failing_since INTEGER;
ALTER TABLE targets ADD COLUMN last_notified_at INTEGER;
ALTER TABLE targets ADD COLUMN last_notified_message TEXT;

CREATE TABLE notifications (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    -- random, stable across retries: Matrix transaction id, webhook delivery id
    uid             TEXT NOT NULL UNIQUE,
    notifier        TEXT NOT NULL,
    target          TEXT NOT NULL,
    run_id          INTEGER,
    event           TEXT NOT NULL,
    -- the JSON event document, as sent by the webhook notifier
    document        TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('pending', 'sent', 'given_up')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    sent_at         INTEGER
) STRICT;

CREATE INDEX notifications_due ON notifications (state, next_attempt_at);
