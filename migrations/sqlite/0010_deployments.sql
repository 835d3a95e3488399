-- One ledger of deployments for every backend. Until now Nomad's
-- deployments (0004) and the other backends' plans (0008) were two tables
-- sharing one id sequence; they become one `deployments` table, so a
-- deployment is listed, decided, told and audited one way whichever backend
-- made it. The columns every deployment has come first; a Nomad
-- deployment (one job's) also fills the job columns (NULL for the others).
-- Nomad's `completed` is now `applied`, as for every backend, and its
-- `spec_hash` is its `plan_hash`. The event log (0005) covers every
-- backend's deployments.

CREATE TABLE deployments (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    target       TEXT NOT NULL,
    backend      TEXT NOT NULL,
    commit_sha   TEXT NOT NULL,
    -- what a person approves: keyed (0009) for plans; Nomad's is the
    -- SHA-256 of the job JSON it would register
    plan_hash    TEXT NOT NULL,
    -- the backend's own hash (never shown); NULL for Nomad and old plans
    backend_hash TEXT,
    policy       TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN (
                     'detected', 'pending_approval', 'approved', 'pre_hook', 'applying',
                     'post_hook', 'applied', 'failed', 'rejected', 'superseded')),
    summary      TEXT NOT NULL,
    -- redacted before it gets here (Nomad's: its plan diff as JSON)
    diff         TEXT NOT NULL,
    destructive  INTEGER NOT NULL CHECK (destructive IN (0, 1)),
    -- the file applying exactly this plan needs, under the state directory
    artifact     TEXT,
    decided_by   TEXT,
    decided_at   INTEGER,
    message      TEXT,
    notified_at  INTEGER,
    superseded_notified_at INTEGER,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    -- Nomad: the job (cluster = address + region), its file, the live
    -- JobModifyIndex planned against (the CAS value), and what followed
    cluster             TEXT,
    namespace           TEXT,
    job                 TEXT,
    file                TEXT,
    job_modify_index    INTEGER,
    registered_index    INTEGER,
    eval_id             TEXT,
    nomad_deployment_id TEXT,
    pre_hook            TEXT,
    post_hook           TEXT,
    hook_timeout_ms     INTEGER,
    hook_nonce          TEXT,
    pre_hook_child      TEXT,
    post_hook_child     TEXT,
    registered_at       INTEGER,
    failed_at_index     INTEGER,
    CHECK ((backend = 'nomad') = (job IS NOT NULL))
) STRICT;

INSERT INTO deployments (
    id, target, backend, commit_sha, plan_hash, backend_hash, policy, state, summary, diff,
    destructive, artifact, decided_by, decided_at, message, notified_at,
    superseded_notified_at, created_at, updated_at, cluster, namespace, job, file,
    job_modify_index, registered_index, eval_id, nomad_deployment_id, pre_hook, post_hook,
    hook_timeout_ms, hook_nonce, pre_hook_child, post_hook_child, registered_at,
    failed_at_index)
SELECT d.id, d.target, 'nomad', d.commit_sha, d.spec_hash, NULL, d.policy,
       CASE d.state WHEN 'completed' THEN 'applied' ELSE d.state END,
       d.diff_summary, d.diff,
       -- a task group removed from the job stops its allocations
       CASE WHEN NOT json_valid(d.diff) THEN 0
            WHEN EXISTS (SELECT 1 FROM json_each(d.diff, '$.TaskGroups')
                         WHERE json_extract(value, '$.Type') = 'Deleted') THEN 1
            ELSE 0 END,
       NULL,
       (SELECT e.actor FROM nomad_events e
         WHERE e.deployment_id = d.id AND e.from_state = 'pending_approval'
         ORDER BY e.id LIMIT 1),
       (SELECT e.at FROM nomad_events e
         WHERE e.deployment_id = d.id AND e.from_state = 'pending_approval'
         ORDER BY e.id LIMIT 1),
       d.message, d.notified_at, NULL, d.created_at, d.updated_at,
       d.cluster, d.namespace, d.job, d.file, d.job_modify_index, d.registered_index,
       d.eval_id, d.nomad_deployment_id, d.pre_hook, d.post_hook, d.hook_timeout_ms,
       d.hook_nonce, d.pre_hook_child, d.post_hook_child, d.registered_at, d.failed_at_index
FROM nomad_deployments d;

INSERT INTO deployments (
    id, target, backend, commit_sha, plan_hash, backend_hash, policy, state, summary, diff,
    destructive, artifact, decided_by, decided_at, message, notified_at,
    superseded_notified_at, created_at, updated_at)
SELECT id, target, backend, commit_sha, plan_hash, backend_hash, policy, state, summary, diff,
       destructive, artifact, decided_by, decided_at, message, notified_at,
       superseded_notified_at, created_at, updated_at
FROM plans;

-- Ids go on from where the shared sequence was: "deployment N" never names
-- two things, even across this migration.
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'deployments', 0
    WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'deployments');
UPDATE sqlite_sequence SET seq = MAX(seq,
        COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'nomad_deployments'), 0),
        COALESCE((SELECT MAX(id) FROM deployments), 0))
    WHERE name = 'deployments';

CREATE TABLE deployment_events (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment_id INTEGER NOT NULL REFERENCES deployments (id),
    target        TEXT NOT NULL,
    -- `driftless`, or `token:<name>` for a person's request
    actor         TEXT NOT NULL,
    from_state    TEXT,
    to_state      TEXT NOT NULL,
    message       TEXT,
    at            INTEGER NOT NULL
) STRICT;

INSERT INTO deployment_events (id, deployment_id, target, actor, from_state, to_state, message, at)
SELECT id, deployment_id, target, actor, from_state,
       CASE to_state WHEN 'completed' THEN 'applied' ELSE to_state END, message, at
FROM nomad_events;

DROP TRIGGER nomad_events_no_update;
DROP TRIGGER nomad_events_no_delete;
DROP TABLE nomad_events;
DROP TABLE nomad_deployments;
DROP TABLE plans;

CREATE INDEX deployment_events_by_target ON deployment_events (target, id);
CREATE TRIGGER deployment_events_no_update BEFORE UPDATE ON deployment_events
BEGIN SELECT RAISE(ABORT, 'deployment_events is append-only'); END;
CREATE TRIGGER deployment_events_no_delete BEFORE DELETE ON deployment_events
BEGIN SELECT RAISE(ABORT, 'deployment_events is append-only'); END;

-- One open deployment per Nomad job, and one open plan per target of the
-- other backends (a target plans as a whole, Nomad job by job): an index
-- survives a crash, a mutex doesn't.
CREATE UNIQUE INDEX deployments_one_open_per_job ON deployments (cluster, namespace, job)
    WHERE backend = 'nomad'
      AND state IN ('detected', 'pending_approval', 'pre_hook', 'applying', 'post_hook');
CREATE UNIQUE INDEX deployments_one_open_per_target ON deployments (target)
    WHERE backend <> 'nomad' AND state IN ('pending_approval', 'approved', 'applying');
CREATE INDEX deployments_by_job ON deployments (cluster, namespace, job, id);
CREATE INDEX deployments_by_target ON deployments (target, id);
CREATE INDEX deployments_by_state ON deployments (state, id);
