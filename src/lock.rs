//! The per-target lock: an OS file lock on `<state_dir>/locks/<target>.lock`.
//!
//! Held for a whole tick by whoever runs it — the daemon's worker or a
//! one-shot `driftless tick` — so one target never converges twice at once.
//! The kernel drops the lock when the holder dies: there is no stale-lock
//! cleanup, and this module must never add one (no PID files, no timeouts).

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

/// A held lock; dropping it releases the lock.
#[derive(Debug)]
pub struct TargetLock {
    _file: File,
    path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("target `{target}` is locked by another tick ({path})")]
    Busy { target: String, path: PathBuf },
    #[error("cannot open lock file {path}: {reason}")]
    Io { path: PathBuf, reason: String },
}

impl TargetLock {
    /// Try to take the lock without waiting.
    pub fn try_acquire(locks_dir: &Path, target: &str) -> Result<TargetLock, LockError> {
        let path = locks_dir.join(format!("{target}.lock"));
        let io = |e: std::io::Error| LockError::Io {
            path: path.clone(),
            reason: e.to_string(),
        };
        std::fs::create_dir_all(locks_dir).map_err(io)?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => Ok(TargetLock { _file: file, path }),
            Err(TryLockError::WouldBlock) => Err(LockError::Busy {
                target: target.to_string(),
                path,
            }),
            Err(TryLockError::Error(e)) => Err(io(e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptor holding the lock, for commands that must keep it.
    pub fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self._file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_refused_until_release() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = TargetLock::try_acquire(dir.path(), "web").expect("first");
        let b = TargetLock::try_acquire(dir.path(), "web");
        assert!(matches!(b, Err(LockError::Busy { .. })), "{b:?}");
        // another target is independent
        let _c = TargetLock::try_acquire(dir.path(), "db").expect("other target");
        drop(a);
        TargetLock::try_acquire(dir.path(), "web").expect("after release");
    }
}
