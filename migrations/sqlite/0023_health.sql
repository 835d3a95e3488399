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
ALTER TABLE targets ADD COLUMN health_run INTEGER;
ALTER TABLE targets ADD COLUMN health_since INTEGER;
UPDATE targets SET healthy_sha = last_applied_sha
 WHERE last_result IN ('changed', 'no_change');

-- A run's result may also be `unhealthy` (applied, its checks failed),
-- `rolled_back` (the last healthy commit applied again) or `held` (a tick
-- while the target is held there). SQLite cannot change a CHECK
-- constraint in place: the runs table is rebuilt with the same columns,
-- rows and indexes (as in 0014).
CREATE TABLE runs_new (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    target        TEXT NOT NULL,
    job_id        INTEGER REFERENCES jobs (id),
    operation     TEXT NOT NULL CHECK (operation IN ('apply', 'destroy')),
    trigger       TEXT NOT NULL,
    delivery_id   TEXT,
    requested_sha TEXT,
    sha           TEXT,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    duration_ms   INTEGER,
    -- NULL while the run is in progress
    result        TEXT CHECK (result IN ('no_change', 'changed', 'failed', 'interrupted', 'blocked',
                                        'unhealthy', 'rolled_back', 'held')),
    message       TEXT,
    output_tail   TEXT,
    receiver      TEXT,
    repeats       INTEGER NOT NULL DEFAULT 1
) STRICT;

INSERT INTO runs_new (id, target, job_id, operation, trigger, delivery_id, requested_sha, sha,
                      started_at, finished_at, duration_ms, result, message, output_tail,
                      receiver, repeats)
    SELECT id, target, job_id, operation, trigger, delivery_id, requested_sha, sha,
           started_at, finished_at, duration_ms, result, message, output_tail,
           receiver, repeats
    FROM runs;

-- Run ids are never reused: the new table's sequence starts where the old
-- one's was (a pruned newest run included).
DELETE FROM sqlite_sequence WHERE name = 'runs_new';
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'runs_new', seq FROM sqlite_sequence WHERE name = 'runs';

DROP TABLE runs;
ALTER TABLE runs_new RENAME TO runs;

CREATE INDEX runs_by_target ON runs (target, id DESC);
CREATE INDEX runs_by_finish ON runs (finished_at);
CREATE INDEX runs_by_job ON runs (job_id);
