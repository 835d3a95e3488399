-- Dependencies between targets (`depends_on`). `target_deps` holds, for
-- every target, each target it waits on directly or through others; the
-- daemon writes it from its configuration when it starts. A queued job is
-- not claimed while a job of one of its target's ancestors is queued or
-- running.
CREATE TABLE target_deps (
    target   TEXT NOT NULL,
    ancestor TEXT NOT NULL,
    PRIMARY KEY (target, ancestor)
) STRICT, WITHOUT ROWID;

-- A run that did not start its backend because a dependency has not
-- converged is `blocked`. SQLite cannot change a CHECK constraint in place:
-- the runs table is rebuilt with the same columns, rows and indexes.
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
    result        TEXT CHECK (result IN ('no_change', 'changed', 'failed', 'interrupted', 'blocked')),
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
