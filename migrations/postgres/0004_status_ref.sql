-- The branch (or a merge request's head ref) a commit status is about:
-- GitLab refuses a status for a commit no branch contains unless `ref` is
-- given, and finds the pending status to update by name and ref.
ALTER TABLE forge_statuses ADD COLUMN git_ref TEXT;
