-- What a plan was made from beside its commit (JSON: the inputs as
-- recorded, a keyed digest of decrypted values, a digest of the backend
-- table): a plan whose inputs changed is superseded, never applied.
ALTER TABLE deployments ADD COLUMN made_from TEXT;
