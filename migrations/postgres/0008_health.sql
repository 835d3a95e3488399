-- Health gates (issue 45): what a target's health checks found.
--   healthy_sha: the last commit applied and found healthy (or applied
--     with no checks to pass): what a rollback applies.
--   quarantined_sha / quarantine_reason: a commit found unhealthy; it is
--     not applied again until a newer commit arrives or a person retries.
--   health_run / health_since: a run whose health phase has begun (its
--     apply done, recorded before the first check): a restart resumes the
--     checks instead of applying again.
ALTER TABLE targets ADD COLUMN healthy_sha TEXT;
ALTER TABLE targets ADD COLUMN quarantined_sha TEXT;
ALTER TABLE targets ADD COLUMN quarantine_reason TEXT;
ALTER TABLE targets ADD COLUMN health_run BIGINT;
ALTER TABLE targets ADD COLUMN health_since BIGINT;
UPDATE targets SET healthy_sha = last_applied_sha
 WHERE last_result IN ('changed', 'no_change');

-- A run's result may also be `unhealthy`, `rolled_back` or `held`.
ALTER TABLE runs DROP CONSTRAINT runs_result_check;
ALTER TABLE runs ADD CONSTRAINT runs_result_check CHECK (result IN (
    'no_change', 'changed', 'failed', 'interrupted', 'blocked', 'unhealthy', 'rolled_back', 'held'));
