-- A deployment can wait for a person twice: before it is applied
-- (`pending_approval`) and, for a Nomad deployment with canaries, after its
-- canaries are placed and before the rest is rolled out
-- (`pending_promotion`, then `promoting` once a person promoted it and
-- until Nomad is asked to). Both are states of the one deployment record,
-- decided through the same approve call. `waiting_since` is when it began
-- to wait for promotion; `overdue_at` when it had waited past the
-- backend's bound, and `overdue_notified_at` when the owners were told so.
--
-- SQLite cannot change a CHECK constraint in place: the table is rebuilt
-- (https://www.sqlite.org/lang_altertable.html, "Making Other Kinds Of
-- Table Schema Changes"). Its one child, deployment_events, is rebuilt
-- with it, pointing at the new table, whose rename then carries the
-- reference (SQLite >= 3.26 rewrites foreign keys on RENAME); ids and both
-- AUTOINCREMENT sequences go on from where they were.

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
    made_from           TEXT,
    waiting_since       INTEGER,
    overdue_at          INTEGER,
    overdue_notified_at INTEGER,
    CHECK ((backend = 'nomad') = (job IS NOT NULL))
) STRICT;

INSERT INTO deployments_new (
    id, target, backend, commit_sha, plan_hash, backend_hash, policy, state, summary, diff,
    destructive, artifact, decided_by, decided_at, message, notified_at,
    superseded_notified_at, created_at, updated_at, cluster, namespace, job, file,
    job_modify_index, registered_index, eval_id, nomad_deployment_id, pre_hook, post_hook,
    hook_timeout_ms, hook_nonce, pre_hook_child, post_hook_child, registered_at,
    failed_at_index, made_from)
SELECT id, target, backend, commit_sha, plan_hash, backend_hash, policy, state, summary, diff,
    destructive, artifact, decided_by, decided_at, message, notified_at,
    superseded_notified_at, created_at, updated_at, cluster, namespace, job, file,
    job_modify_index, registered_index, eval_id, nomad_deployment_id, pre_hook, post_hook,
    hook_timeout_ms, hook_nonce, pre_hook_child, post_hook_child, registered_at,
    failed_at_index, made_from
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

-- The sequences go on from the old tables' (a row deleted at the end of
-- the old table does not give its id to a new one).
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

CREATE UNIQUE INDEX deployments_one_open_per_job ON deployments (cluster, namespace, job)
    WHERE backend = 'nomad'
      AND state IN ('detected', 'pending_approval', 'pre_hook', 'applying', 'pending_promotion',
                    'promoting', 'post_hook');
CREATE UNIQUE INDEX deployments_one_open_per_target ON deployments (target)
    WHERE backend <> 'nomad' AND state IN ('pending_approval', 'approved', 'applying');
CREATE INDEX deployments_by_job ON deployments (cluster, namespace, job, id);
CREATE INDEX deployments_by_target ON deployments (target, id);
CREATE INDEX deployments_by_state ON deployments (state, id);
