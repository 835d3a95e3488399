-- The members of [[target_sets]]: one row per target a set made from a
-- directory, kept when the directory is removed (the member is then
-- orphaned: its runs and last applied state stay, nothing is destroyed
-- unless the set says destroy_removed, and then `destroyed_at` says when).
-- A daemon starts with the members these rows list, before it has fetched.
CREATE TABLE set_members (
    target       TEXT PRIMARY KEY NOT NULL,
    target_set   TEXT NOT NULL,
    dir          TEXT NOT NULL,
    added_sha    TEXT NOT NULL,
    added_at     INTEGER NOT NULL,
    orphaned_sha TEXT,
    orphaned_at  INTEGER,
    destroyed_at INTEGER
) STRICT;
