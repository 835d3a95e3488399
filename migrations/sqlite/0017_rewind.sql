-- A rewind a person accepted (`driftless retry --accept-rewind`): the
-- branch tip, not descending from the commit last applied, that a
-- verifying target may apply. Cleared by the next successful apply.
ALTER TABLE targets ADD COLUMN rewind_accepted TEXT;
