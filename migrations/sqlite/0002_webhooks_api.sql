-- Webhook deliveries (dedupe), pause, receivers on jobs and runs, a row to
-- prove the database takes writes (/readyz).

CREATE TABLE deliveries (
    receiver    TEXT NOT NULL,
    delivery_id TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    -- what came of it: "queued 2 job(s)", "ignored: tag push", ...
    outcome     TEXT NOT NULL,
    PRIMARY KEY (receiver, delivery_id)
) STRICT;

CREATE INDEX deliveries_by_age ON deliveries (received_at);

ALTER TABLE targets ADD COLUMN paused_at INTEGER;
ALTER TABLE targets ADD COLUMN paused_by TEXT;

ALTER TABLE jobs ADD COLUMN receiver TEXT;
ALTER TABLE runs ADD COLUMN receiver TEXT;

CREATE TABLE health (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    probed_at INTEGER NOT NULL
) STRICT;
