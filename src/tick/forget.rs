//! A checkout belongs to one repository: what a target's checkout is a
//! checkout of (repository, path, backend kind; `git::checkout_identity`)
//! is noted in it at its first tick, and a tick or `driftless plan` whose
//! target now names another one (its `repo` changed, or a removed target's
//! name was given to a new one) is refused before anything moves — the
//! checkout's untracked files (terraform's local state, `.terraform/`)
//! belong to the old one, and planning the new repository against them can
//! destroy what nobody removed. `driftless forget TARGET` starts such a
//! target clean, under its lock. This module must not call a backend.

use std::path::PathBuf;

use super::{Reconciler, TickError};
use crate::config::Target;
use crate::lock::{LockError, TargetLock};

impl Reconciler {
    /// What `target`'s checkout must be a checkout of.
    fn identity(target: &Target) -> String {
        crate::git::checkout_identity(&target.repo_key, &target.path, target.backend.kind())
    }

    /// `Err(why)` when `target`'s checkout is noted to be a checkout of
    /// something else.
    pub(super) fn own_checkout(&self, target: &Target) -> Result<(), String> {
        let dir = self.git.checkout_path(&target.name);
        let want = Self::identity(target);
        match crate::git::checkout_of(&dir) {
            Ok(Some(had)) if had != want => Err(format!(
                "the checkout {} is a checkout of {}, not of {} as `{}` now says: its untracked \
                 files (terraform's local state, `.terraform/`, …) belong to that one, and \
                 using them for another could change what nobody asked to; move what you need \
                 from it, then `driftless forget {}` to start clean",
                dir.display(),
                one_line(&had),
                one_line(&want),
                target.name,
                target.name
            )),
            Ok(_) => Ok(()),
            Err(e) => Err(format!(
                "cannot read what the checkout {} is a checkout of: {e}",
                dir.display()
            )),
        }
    }

    /// Note in `target`'s checkout (just moved) what it is a checkout of.
    pub(super) fn note_checkout(&self, target: &Target) -> Result<(), String> {
        let dir = self.git.checkout_path(&target.name);
        let want = Self::identity(target);
        match crate::git::checkout_of(&dir) {
            Ok(Some(had)) if had == want => Ok(()),
            _ => crate::git::note_checkout_of(&dir, &want).map_err(|e| {
                format!(
                    "cannot note what the checkout {} is a checkout of: {e}",
                    dir.display()
                )
            }),
        }
    }

    /// `driftless forget TARGET`: start target `name` clean — its
    /// checkout, preview checkout, plan files and followed-tag note
    /// removed, its last applied commit, digest and recorded outputs
    /// forgotten (its run history stays). Under the target's lock; `Busy`
    /// when a tick holds it. Returns what was removed.
    pub async fn forget(&self, name: &str) -> Result<Vec<PathBuf>, TickError> {
        if !crate::config::valid_name(name) {
            return Err(TickError::UnknownTarget(name.to_string()));
        }
        let settings = self.app.settings();
        let _lock = match TargetLock::try_acquire(&settings.locks_dir(), name) {
            Ok(l) => l,
            Err(e @ LockError::Busy { .. }) => {
                return Err(TickError::Refused {
                    target: name.to_string(),
                    why: format!("{e}: try again when its tick has ended"),
                });
            }
            Err(e) => return Err(TickError::Lock(e)),
        };
        let mut removed = Vec::new();
        for path in [
            self.git.checkout_path(name),
            self.git.preview_dir(name),
            settings.plans_dir(name),
            settings.followed_tag_note(name),
        ] {
            let gone = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            match gone {
                Ok(()) => removed.push(path),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(TickError::Refused {
                        target: name.to_string(),
                        why: format!("cannot remove {}: {e}", path.display()),
                    });
                }
            }
        }
        self.app.store.forget_target(name).await?;
        self.app.store.forget_outputs(name).await?;
        Ok(removed)
    }
}

/// `repository X\npath p\nbackend k\n` as one line.
fn one_line(identity: &str) -> String {
    identity.trim().replace('\n', ", ")
}
