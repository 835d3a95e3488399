-- A deployment of one unit of a target (a Nomad job today) is no longer
-- told apart by Nomad's own columns: every backend that deploys units
-- writes the same four, and what only it needs is its own JSON.
--
--   unit        the unit's name within its target (a Nomad job's id); what
--               a pause names (`unit_pauses`)
--   unit_key    unique among a backend's open deployments (Nomad: cluster,
--               namespace and job, joined by newlines, which none of them
--               may contain)
--   unit_label  what people read ("job default/web")
--   on_approval the state a person's approval takes it to (the step the
--               backend takes next: Nomad's `pre_hook` or `applying`)
--   detail      the backend's own fields, a JSON object it alone reads and
--               writes (shown as they are by the API)
--
-- All five are NULL for a deployment of a whole target (a plan). Nomad's
-- columns move into `detail` under their own names; its plan diff (JSON)
-- is kept there as `plan_diff` (`diff` is what people read, and stays as
-- it was for the rows recorded before). `nomad_job_pauses` becomes
-- `unit_pauses`.
--
-- SQLite cannot drop a column named in a CHECK constraint or an index: the
-- table is rebuilt as in 0021, its child deployment_events with it.

CREATE TABLE deployments_new (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    target       TEXT NOT NULL,
    backend      TEXT NOT NULL,
    commit_sha   TEXT NOT NULL,
    plan_hash    TEXT NOT NULL,
    backend_hash TEXT,
    policy       TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN (
                     'detected', 'pending_approval', 'approved', 'pre_hook', 'applying',
                     'pending_promotion', 'promoting', 'post_hook', 'applied', 'failed',
                     'rejected', 'superseded')),
    summary      TEXT NOT NULL,
    diff         TEXT NOT NULL,
    destructive  INTEGER NOT NULL CHECK (destructive IN (0, 1)),
    artifact     TEXT,
    decided_by   TEXT,
    decided_at   INTEGER,
    message      TEXT,
    notified_at  INTEGER,
    superseded_notified_at INTEGER,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    made_from           TEXT,
    waiting_since       INTEGER,
    overdue_at          INTEGER,
    overdue_notified_at INTEGER,
    unit         TEXT,
    unit_key     TEXT,
    unit_label   TEXT,
    on_approval  TEXT CHECK (on_approval IS NULL OR on_approval IN (
                     'approved', 'pre_hook', 'applying')),
    detail       TEXT CHECK (detail IS NULL OR json_type(detail) = 'object'),
    CHECK ((unit IS NULL) = (unit_key IS NULL) AND (unit IS NULL) = (unit_label IS NULL)
           AND (unit IS NULL) = (on_approval IS NULL) AND (unit IS NULL) = (detail IS NULL))
) STRICT;

INSERT INTO deployments_new (
    id, target, backend, commit_sha, plan_hash, backend_hash, policy, state, summary, diff,
    destructive, artifact, decided_by, decided_at, message, notified_at,
    superseded_notified_at, created_at, updated_at, made_from, waiting_since, overdue_at,
    overdue_notified_at, unit, unit_key, unit_label, on_approval, detail)
SELECT id, target, backend, commit_sha, plan_hash, backend_hash, policy, state, summary, diff,
    destructive, artifact, decided_by, decided_at, message, notified_at,
    superseded_notified_at, created_at, updated_at, made_from, waiting_since, overdue_at,
    overdue_notified_at,
    job,
    CASE WHEN job IS NOT NULL THEN cluster || char(10) || namespace || char(10) || job END,
    CASE WHEN job IS NOT NULL
         THEN 'job ' || namespace || '/' || job END,
    CASE WHEN job IS NULL THEN NULL WHEN pre_hook IS NOT NULL THEN 'pre_hook'
         ELSE 'applying' END,
    CASE WHEN job IS NOT NULL THEN json_object(
        'cluster', cluster, 'namespace', namespace, 'job', job, 'file', file,
        'job_modify_index', job_modify_index, 'registered_index', registered_index,
        'eval_id', eval_id, 'nomad_deployment_id', nomad_deployment_id,
        'pre_hook', pre_hook, 'post_hook', post_hook, 'hook_timeout_ms', hook_timeout_ms,
        'hook_nonce', hook_nonce, 'pre_hook_child', pre_hook_child,
        'post_hook_child', post_hook_child, 'registered_at', registered_at,
        'failed_at_index', failed_at_index, 'plan_diff', diff) END
FROM deployments;

CREATE TABLE deployment_events_new (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment_id INTEGER NOT NULL REFERENCES deployments_new (id),
    target        TEXT NOT NULL,
    actor         TEXT NOT NULL,
    from_state    TEXT,
    to_state      TEXT NOT NULL,
    message       TEXT,
    at            INTEGER NOT NULL
) STRICT;

INSERT INTO deployment_events_new (id, deployment_id, target, actor, from_state, to_state,
                                   message, at)
SELECT id, deployment_id, target, actor, from_state, to_state, message, at
FROM deployment_events;

INSERT INTO sqlite_sequence (name, seq)
    SELECT n, 0 FROM (SELECT 'deployments_new' AS n UNION ALL SELECT 'deployment_events_new')
    WHERE n NOT IN (SELECT name FROM sqlite_sequence);
UPDATE sqlite_sequence SET seq = MAX(seq,
        COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'deployments'), 0))
    WHERE name = 'deployments_new';
UPDATE sqlite_sequence SET seq = MAX(seq,
        COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'deployment_events'), 0))
    WHERE name = 'deployment_events_new';

DROP TRIGGER deployment_events_no_update;
DROP TRIGGER deployment_events_no_delete;
DROP TABLE deployment_events;
DROP TABLE deployments;
ALTER TABLE deployments_new RENAME TO deployments;
ALTER TABLE deployment_events_new RENAME TO deployment_events;

CREATE INDEX deployment_events_by_target ON deployment_events (target, id);
CREATE TRIGGER deployment_events_no_update BEFORE UPDATE ON deployment_events
BEGIN SELECT RAISE(ABORT, 'deployment_events is append-only'); END;
CREATE TRIGGER deployment_events_no_delete BEFORE DELETE ON deployment_events
BEGIN SELECT RAISE(ABORT, 'deployment_events is append-only'); END;

-- One open deployment per unit (of a backend), one open plan per target.
CREATE UNIQUE INDEX deployments_one_open_per_unit ON deployments (backend, unit_key)
    WHERE unit_key IS NOT NULL
      AND state IN ('detected', 'pending_approval', 'approved', 'pre_hook', 'applying',
                    'pending_promotion', 'promoting', 'post_hook');
CREATE UNIQUE INDEX deployments_one_open_per_target ON deployments (target)
    WHERE unit_key IS NULL AND state IN ('pending_approval', 'approved', 'applying');
CREATE INDEX deployments_by_unit ON deployments (backend, unit_key, id);
CREATE INDEX deployments_by_target ON deployments (target, id);
CREATE INDEX deployments_by_state ON deployments (state, id);

ALTER TABLE nomad_job_pauses RENAME TO unit_pauses;
ALTER TABLE unit_pauses RENAME COLUMN job TO unit;
