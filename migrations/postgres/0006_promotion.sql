-- A deployment can wait for a person twice: before it is applied
-- (`pending_approval`) and, for a Nomad deployment with canaries, after its
-- canaries are placed and before the rest is rolled out
-- (`pending_promotion`, then `promoting` once a person promoted it and
-- until Nomad is asked to). `waiting_since` is when it began to wait for
-- promotion; `overdue_at` when it had waited past the backend's bound, and
-- `overdue_notified_at` when the owners were told so. (SQLite's 0021.)
ALTER TABLE deployments DROP CONSTRAINT deployments_state_check;
ALTER TABLE deployments ADD CONSTRAINT deployments_state_check CHECK (state IN (
    'detected', 'pending_approval', 'approved', 'pre_hook', 'applying',
    'pending_promotion', 'promoting', 'post_hook', 'applied', 'failed',
    'rejected', 'superseded'));
ALTER TABLE deployments ADD COLUMN waiting_since BIGINT;
ALTER TABLE deployments ADD COLUMN overdue_at BIGINT;
ALTER TABLE deployments ADD COLUMN overdue_notified_at BIGINT;
DROP INDEX deployments_one_open_per_job;
CREATE UNIQUE INDEX deployments_one_open_per_job ON deployments (cluster, namespace, job)
    WHERE backend = 'nomad'
      AND state IN ('detected', 'pending_approval', 'pre_hook', 'applying', 'pending_promotion',
                    'promoting', 'post_hook');
