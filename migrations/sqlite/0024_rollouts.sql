-- Rollouts in waves (a [[target_sets]] or [[groups]] entry's `rollout`):
-- one row per commit rolled out, `seq` counting a unit's rollouts. The
-- newest row of a name is the rollout in force; its `wave` is written
-- before that wave's jobs are queued, so a restart resumes there.
-- members: JSON [[target, wave], ...], fixed when the rollout starts.
-- state: running | halted | done | superseded | aborted.
CREATE TABLE rollouts (
    name            TEXT NOT NULL,
    seq             INTEGER NOT NULL,
    sha             TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('running', 'halted', 'done', 'superseded', 'aborted')),
    wave            INTEGER NOT NULL,
    members         TEXT NOT NULL,
    wave_started_at INTEGER NOT NULL,
    wave_done_at    INTEGER,
    reason          TEXT,
    decided_by      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (name, seq)
) STRICT;
