-- Nomad deployments, as Nomad really behaves: hook dispatches that survive a
-- fresh state database, hook instances Nomad may have garbage-collected,
-- and failures whose live index moved (an auto-revert).

-- Random, per deployment: part of the dispatch idempotency token, so a new
-- state database (ids from 1 again) never matches an old dispatched child.
-- NULL for deployments recorded before this migration (their tokens stay
-- `driftless-<id>-<phase>`).
ALTER TABLE nomad_deployments ADD COLUMN hook_nonce TEXT;
-- The dispatched child job of each hook, recorded right after the dispatch:
-- a tick that resumes the hook waits for exactly that instance, and says so
-- when Nomad no longer has it.
ALTER TABLE nomad_deployments ADD COLUMN pre_hook_child TEXT;
ALTER TABLE nomad_deployments ADD COLUMN post_hook_child TEXT;
-- When the register was answered (Unix ms): waiting for Nomad to start a
-- deployment is bounded from here.
ALTER TABLE nomad_deployments ADD COLUMN registered_at INTEGER;
-- A failed deployment: the live JobModifyIndex when it failed (after an
-- auto-revert, the revert's). The same spec is not registered again at it.
ALTER TABLE nomad_deployments ADD COLUMN failed_at_index INTEGER;
