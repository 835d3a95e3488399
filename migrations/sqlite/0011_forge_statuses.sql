-- Commit statuses for the forges, an outbox of its own: one row per
-- (forge, repository, commit, context) holding the newest state driftless
-- has for it. A new state bumps `version`; the sender sends the row and
-- records the version it sent, so a state retried late can never overwrite
-- a newer one (the newer one is the only one there is), and a state that
-- changed while it was being sent is sent again.

CREATE TABLE forge_statuses (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    forge           TEXT NOT NULL,
    repo            TEXT NOT NULL,
    sha             TEXT NOT NULL,
    context         TEXT NOT NULL,
    target          TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('pending', 'success', 'failure', 'error')),
    description     TEXT NOT NULL,
    target_url      TEXT,
    version         INTEGER NOT NULL,
    sent_version    INTEGER NOT NULL DEFAULT 0,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    last_error      TEXT,
    given_up        INTEGER NOT NULL DEFAULT 0 CHECK (given_up IN (0, 1)),
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    UNIQUE (forge, repo, sha, context)
) STRICT;

CREATE INDEX forge_statuses_due ON forge_statuses (next_attempt_at)
    WHERE sent_version < version AND given_up = 0;
