-- History that does not grow without bound. A streak of identical
-- `no_change` runs of a target (same commit, trigger and message, no
-- delivery) is one row: `repeats` counts the runs, `started_at` is the
-- first one's start, `finished_at`, `duration_ms`, `output_tail` and
-- `job_id` the newest one's. Runs are pruned after `[history] keep`
-- (each target's last run and the run that last changed it excepted),
-- and finished jobs no run refers to after a day, in small batches.

ALTER TABLE runs ADD COLUMN repeats INTEGER NOT NULL DEFAULT 1;

-- Pruning reads runs by age and jobs by the runs that name them.
CREATE INDEX runs_by_finish ON runs (finished_at);
CREATE INDEX runs_by_job ON runs (job_id);
CREATE INDEX jobs_done_by_age ON jobs (updated_at) WHERE state = 'done';
