-- Pull-request previews. `pull_requests`: one row per pull request a
-- preview was queued for, with the newest head an event gave, whether it
-- is still open, and driftless's one comment on it as an outbox of its own
-- (the newest body and its `version`; the sender records the version it
-- sent and the forge's id of the comment, so the comment is created once
-- and then edited in place). `previews`: one row per (pull request,
-- target), a job folded by head: a newer head queues the row again, and a
-- result is only kept for the head it was planned at.

CREATE TABLE pull_requests (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    forge           TEXT NOT NULL,
    repo            TEXT NOT NULL,
    number          INTEGER NOT NULL,
    head_sha        TEXT NOT NULL,
    open            INTEGER NOT NULL DEFAULT 1 CHECK (open IN (0, 1)),
    comment_id      TEXT,
    body            TEXT,
    version         INTEGER NOT NULL DEFAULT 0,
    sent_version    INTEGER NOT NULL DEFAULT 0,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    given_up        INTEGER NOT NULL DEFAULT 0 CHECK (given_up IN (0, 1)),
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    UNIQUE (forge, repo, number)
) STRICT;

CREATE INDEX pull_requests_comment_due ON pull_requests (next_attempt_at)
    WHERE sent_version < version AND given_up = 0;

CREATE TABLE previews (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    pull_request INTEGER NOT NULL REFERENCES pull_requests (id),
    target       TEXT NOT NULL,
    head_sha     TEXT NOT NULL,
    head_ref     TEXT NOT NULL,
    state        TEXT NOT NULL
                 CHECK (state IN ('queued', 'running', 'planned', 'failed', 'unaffected', 'dropped')),
    changes      INTEGER NOT NULL DEFAULT 0 CHECK (changes IN (0, 1)),
    destructive  INTEGER NOT NULL DEFAULT 0 CHECK (destructive IN (0, 1)),
    summary      TEXT,
    diff         TEXT,
    owner        TEXT,
    queued_at    INTEGER NOT NULL,
    started_at   INTEGER,
    finished_at  INTEGER,
    UNIQUE (pull_request, target)
) STRICT;

CREATE INDEX previews_queued ON previews (queued_at) WHERE state = 'queued';
