-- Nomad deployments: what driftless planned for one job, and how far it got.
-- A row is written before driftless acts on it (invariant: state persisted
-- before acting); its diff is redacted before it gets here.

CREATE TABLE nomad_deployments (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    target              TEXT NOT NULL,
    -- the Nomad address (+ region): two clusters may run jobs of one name
    cluster             TEXT NOT NULL,
    namespace           TEXT NOT NULL,
    job                 TEXT NOT NULL,
    -- the job file, relative to the target's path
    file                TEXT NOT NULL,
    commit_sha          TEXT NOT NULL,
    -- SHA-256 of the exact job JSON driftless would register
    spec_hash           TEXT NOT NULL,
    policy              TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN (
                            'detected', 'pending_approval', 'pre_hook', 'applying',
                            'post_hook', 'completed', 'failed', 'rejected', 'superseded')),
    -- the live JobModifyIndex the plan was made against (the CAS value)
    job_modify_index    INTEGER NOT NULL,
    -- Nomad's plan diff, redacted, as JSON; and a one-line summary
    diff                TEXT NOT NULL,
    diff_summary        TEXT NOT NULL,
    -- after the register: the JobModifyIndex Nomad gave our version
    registered_index    INTEGER,
    eval_id             TEXT,
    nomad_deployment_id TEXT,
    message             TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL
) STRICT;

-- One active deployment per job: an index survives a crash, a mutex doesn't.
CREATE UNIQUE INDEX nomad_one_active_per_job ON nomad_deployments (cluster, namespace, job)
    WHERE state IN ('detected', 'pending_approval', 'pre_hook', 'applying', 'post_hook');

CREATE INDEX nomad_deployments_by_job ON nomad_deployments (cluster, namespace, job, id);
CREATE INDEX nomad_deployments_by_target ON nomad_deployments (target, id);
