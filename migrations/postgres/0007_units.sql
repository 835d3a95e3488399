-- A deployment of one unit of a target (a Nomad job today) is told apart
-- by four columns every backend that deploys units shares — `unit` (its
-- name within the target, what a pause names), `unit_key` (unique among a
-- backend's open deployments), `unit_label` (what people read),
-- `on_approval` (the state a person's approval takes it to) and `detail` (the backend's own fields, a JSON object only it reads and
-- writes) — instead of Nomad's own columns, which move into `detail`.
-- Nomad's plan diff (JSON) is kept there as `plan_diff`.
-- `nomad_job_pauses` becomes `unit_pauses`. (SQLite's 0022.)
ALTER TABLE deployments ADD COLUMN unit TEXT;
ALTER TABLE deployments ADD COLUMN unit_key TEXT;
ALTER TABLE deployments ADD COLUMN unit_label TEXT;
ALTER TABLE deployments ADD COLUMN on_approval TEXT;
ALTER TABLE deployments ADD COLUMN detail TEXT;
UPDATE deployments SET
    unit = job,
    unit_key = cluster || chr(10) || namespace || chr(10) || job,
    unit_label = 'job ' || namespace || '/' || job,
    on_approval = CASE WHEN pre_hook IS NOT NULL THEN 'pre_hook' ELSE 'applying' END,
    detail = json_build_object(
        'cluster', cluster, 'namespace', namespace, 'job', job, 'file', file,
        'job_modify_index', job_modify_index, 'registered_index', registered_index,
        'eval_id', eval_id, 'nomad_deployment_id', nomad_deployment_id,
        'pre_hook', pre_hook, 'post_hook', post_hook, 'hook_timeout_ms', hook_timeout_ms,
        'hook_nonce', hook_nonce, 'pre_hook_child', pre_hook_child,
        'post_hook_child', post_hook_child, 'registered_at', registered_at,
        'failed_at_index', failed_at_index, 'plan_diff', diff)::text
WHERE job IS NOT NULL;
DROP INDEX deployments_one_open_per_job;
DROP INDEX deployments_one_open_per_target;
DROP INDEX deployments_by_job;
-- Dropping the columns drops the CHECK that tied Nomad to its job column.
ALTER TABLE deployments
    DROP COLUMN cluster, DROP COLUMN namespace, DROP COLUMN job, DROP COLUMN file,
    DROP COLUMN job_modify_index, DROP COLUMN registered_index, DROP COLUMN eval_id,
    DROP COLUMN nomad_deployment_id, DROP COLUMN pre_hook, DROP COLUMN post_hook,
    DROP COLUMN hook_timeout_ms, DROP COLUMN hook_nonce, DROP COLUMN pre_hook_child,
    DROP COLUMN post_hook_child, DROP COLUMN registered_at, DROP COLUMN failed_at_index;
ALTER TABLE deployments ADD CONSTRAINT deployments_unit_check CHECK (
    (unit IS NULL) = (unit_key IS NULL) AND (unit IS NULL) = (unit_label IS NULL)
    AND (unit IS NULL) = (on_approval IS NULL) AND (unit IS NULL) = (detail IS NULL)
    AND (on_approval IS NULL OR on_approval IN ('approved', 'pre_hook', 'applying'))
    AND (detail IS NULL OR json_typeof(detail::json) = 'object'));
CREATE UNIQUE INDEX deployments_one_open_per_unit ON deployments (backend, unit_key)
    WHERE unit_key IS NOT NULL
      AND state IN ('detected', 'pending_approval', 'approved', 'pre_hook', 'applying',
                    'pending_promotion', 'promoting', 'post_hook');
CREATE UNIQUE INDEX deployments_one_open_per_target ON deployments (target)
    WHERE unit_key IS NULL AND state IN ('pending_approval', 'approved', 'applying');
CREATE INDEX deployments_by_unit ON deployments (backend, unit_key, id);
ALTER TABLE nomad_job_pauses RENAME TO unit_pauses;
ALTER TABLE unit_pauses RENAME COLUMN job TO unit;
