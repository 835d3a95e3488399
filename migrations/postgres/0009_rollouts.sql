-- Rollouts in waves (a [[target_sets]] or [[groups]] entry's `rollout`):
-- one row per commit rolled out, `seq` counting a unit's rollouts. The
-- newest row of a name is the rollout in force; its `wave` is written
-- before that wave's jobs are queued, so a restart resumes there.
-- members: JSON [[target, wave], ...], fixed when the rollout starts.
-- state: running | halted | done | superseded | aborted.
CREATE TABLE rollouts (
    name            TEXT NOT NULL,
    seq             BIGINT NOT NULL,
    sha             TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('running', 'halted', 'done', 'superseded', 'aborted')),
    wave            BIGINT NOT NULL,
    members         TEXT NOT NULL,
    wave_started_at BIGINT NOT NULL,
    wave_done_at    BIGINT,
    reason          TEXT,
    decided_by      TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    PRIMARY KEY (name, seq)
);
