-- driftless state: targets, the job queue, and the run log (provenance).
-- Times are Unix milliseconds (UTC).

CREATE TABLE targets (
    name                 TEXT PRIMARY KEY NOT NULL,
    backend              TEXT NOT NULL,
    last_applied_sha     TEXT,
    last_result          TEXT,
    last_message         TEXT,
    last_run_id          INTEGER,
    last_run_at          INTEGER,
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    backend_digest       TEXT,
    updated_at           INTEGER NOT NULL
) STRICT;

CREATE TABLE jobs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    target        TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done')),
    -- JSON array of triggers in arrival order, each at most once:
    -- "interval", "manual", "webhook", "cli"
    triggers      TEXT NOT NULL,
    requested_sha TEXT,
    -- JSON array of forge delivery ids folded into this job
    delivery_ids  TEXT NOT NULL DEFAULT '[]',
    attempts      INTEGER NOT NULL DEFAULT 0,
    not_before    INTEGER NOT NULL DEFAULT 0,
    lease_owner   TEXT,
    lease_until   INTEGER,
    run_id        INTEGER,
    outcome       TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
) STRICT;

-- At most one queued and at most one running job per target: a newer request
-- updates the queued job instead of adding another.
CREATE UNIQUE INDEX jobs_one_queued_per_target ON jobs (target) WHERE state = 'queued';
CREATE UNIQUE INDEX jobs_one_running_per_target ON jobs (target) WHERE state = 'running';
CREATE INDEX jobs_claim ON jobs (state, not_before, id);

CREATE TABLE runs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    target        TEXT NOT NULL,
    job_id        INTEGER REFERENCES jobs (id),
    operation     TEXT NOT NULL CHECK (operation IN ('apply', 'destroy')),
    trigger       TEXT NOT NULL,
    delivery_id   TEXT,
    requested_sha TEXT,
    sha           TEXT,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    duration_ms   INTEGER,
    -- NULL while the run is in progress
    result        TEXT CHECK (result IN ('no_change', 'changed', 'failed', 'interrupted')),
    message       TEXT,
    output_tail   TEXT
) STRICT;

CREATE INDEX runs_by_target ON runs (target, id DESC);
