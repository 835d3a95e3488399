-- Plans that wait for a person (`policy = "approval"` / "approve_destructive"),
-- for every backend that can plan but Nomad (whose deployments keep their
-- own table, 0004). A row is written before the plan is shown or applied;
-- its diff is redacted before it gets here; `artifact` is the file applying
-- exactly this plan needs (terraform's saved plan), under the state
-- directory, removed when the plan is applied, rejected or superseded.
--
-- Ids: a plan and a Nomad deployment are both "deployment N" to a person
-- (`driftless approve N`), so plans take their id from nomad_deployments'
-- AUTOINCREMENT sequence (store::plans::next_id): one id names one thing.

CREATE TABLE plans (
    id           INTEGER PRIMARY KEY,
    target       TEXT NOT NULL,
    backend      TEXT NOT NULL,
    commit_sha   TEXT NOT NULL,
    -- SHA-256 over what applying it would do (the tool's own plan document)
    plan_hash    TEXT NOT NULL,
    policy       TEXT NOT NULL,
    summary      TEXT NOT NULL,
    diff         TEXT NOT NULL,
    destructive  INTEGER NOT NULL CHECK (destructive IN (0, 1)),
    artifact     TEXT,
    state        TEXT NOT NULL CHECK (state IN (
                     'pending_approval', 'approved', 'applying', 'applied',
                     'failed', 'rejected', 'superseded')),
    -- `driftless` (a policy applied it unattended) or `token:<name>`
    decided_by   TEXT,
    decided_at   INTEGER,
    message      TEXT,
    -- when the owners were told it waits (pending_approval) or was superseded
    notified_at  INTEGER,
    superseded_notified_at INTEGER,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
) STRICT;

-- One open plan per target: an index survives a crash, a mutex doesn't.
CREATE UNIQUE INDEX plans_one_open_per_target ON plans (target)
    WHERE state IN ('pending_approval', 'approved', 'applying');
CREATE INDEX plans_by_target ON plans (target, id);

-- The shared id sequence needs its row before the first Nomad deployment.
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'nomad_deployments', COALESCE((SELECT MAX(id) FROM nomad_deployments), 0)
    WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'nomad_deployments');
