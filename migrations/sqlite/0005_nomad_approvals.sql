-- Nomad approvals and pauses: who did what to a deployment, append-only, and
-- the jobs a person paused (which only ever makes driftless do less).

-- when the owners were told a deployment waits for approval
ALTER TABLE nomad_deployments ADD COLUMN notified_at INTEGER;
-- the hooks the job's meta named when it was planned (parameterized batch
-- jobs in the same target path), and how long each may run
ALTER TABLE nomad_deployments ADD COLUMN pre_hook TEXT;
ALTER TABLE nomad_deployments ADD COLUMN post_hook TEXT;
ALTER TABLE nomad_deployments ADD COLUMN hook_timeout_ms INTEGER;

CREATE TABLE nomad_events (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment_id INTEGER NOT NULL REFERENCES nomad_deployments (id),
    target        TEXT NOT NULL,
    -- `driftless`, or `token:<name>` for a person's request
    actor         TEXT NOT NULL,
    from_state    TEXT,
    to_state      TEXT NOT NULL,
    message       TEXT,
    at            INTEGER NOT NULL
) STRICT;

CREATE INDEX nomad_events_by_target ON nomad_events (target, id);

CREATE TRIGGER nomad_events_no_update BEFORE UPDATE ON nomad_events
BEGIN SELECT RAISE(ABORT, 'nomad_events is append-only'); END;
CREATE TRIGGER nomad_events_no_delete BEFORE DELETE ON nomad_events
BEGIN SELECT RAISE(ABORT, 'nomad_events is append-only'); END;

CREATE TABLE nomad_job_pauses (
    target    TEXT NOT NULL,
    job       TEXT NOT NULL,
    paused_by TEXT NOT NULL,
    paused_at INTEGER NOT NULL,
    PRIMARY KEY (target, job)
) STRICT;
