//! OS file locks: the per-target lock on `<state_dir>/locks/<target>.lock`,
//! and the daemon's lock on `<state_dir>/serve.lock`.
//!
//! A target's lock is held for a whole tick by whoever runs it — the
//! daemon's worker or a one-shot `driftless tick` — so one target never
//! converges twice at once. The daemon's lock keeps a second `serve` off the
//! same state directory (one-shot ticks and the CLI work beside it); it
//! holds the daemon's PID, for the message only, and the address it
//! listens on, for a CLI whose config asks for port 0. The kernel drops a lock
//! when its holder dies: there is no stale-lock cleanup, and this module
//! must never add one (no PID checks, no timeouts).

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
    #[error(
        "another `driftless serve` ({holder}) is running on this state directory ({path}); stop it first (one-shot `driftless tick` and the CLI can run beside it)"
    )]
    Serving { path: PathBuf, holder: String },
}

/// The daemon's hold on its state directory; dropping it releases it.
#[derive(Debug)]
pub struct ServeLock {
    file: File,
}

impl ServeLock {
    /// Take `<state_dir>/serve.lock`, or say which process holds it.
    pub fn try_acquire(state_dir: &Path) -> Result<ServeLock, LockError> {
        use std::io::{Read, Seek, Write};
        use std::os::unix::fs::OpenOptionsExt;
        let path = state_dir.join("serve.lock");
        let io = |e: std::io::Error| LockError::Io {
            path: path.clone(),
            reason: e.to_string(),
        };
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        // [`serving_addr`] holds a shared lock for an instant to see whether
        // a daemon lives: a few short retries keep that from looking like a
        // second daemon.
        let mut locked = file.try_lock();
        for _ in 0..10 {
            if !matches!(locked, Err(TryLockError::WouldBlock)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            locked = file.try_lock();
        }
        match locked {
            Ok(()) => {
                file.set_len(0).map_err(io)?;
                file.rewind().map_err(io)?;
                write!(file, "{}", std::process::id()).map_err(io)?;
                Ok(ServeLock { file })
            }
            Err(TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let holder = match pid.split_whitespace().next().unwrap_or("") {
                    "" => "PID unknown".to_string(),
                    p => format!("PID {p}"),
                };
                Err(LockError::Serving { path, holder })
            }
            Err(TryLockError::Error(e)) => Err(io(e)),
        }
    }
}

impl ServeLock {
    /// Note where the daemon listens (after the PID), so the CLI finds a
    /// daemon whose `listen` asked for port 0.
    pub fn record_addr(&mut self, addr: std::net::SocketAddr) -> Result<(), std::io::Error> {
        use std::io::Write;
        write!(self.file, " {addr}")?;
        self.file.flush()
    }
}

/// The address the daemon serving `state_dir` noted in its lock file, if
/// one is serving there now.
pub fn serving_addr(state_dir: &Path) -> Option<std::net::SocketAddr> {
    let path = state_dir.join("serve.lock");
    let file = File::open(&path).ok()?;
    // Held means a daemon lives; a file nobody holds is a past one's.
    if file.try_lock_shared().is_ok() {
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
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

    #[test]
    fn a_second_serve_is_told_the_first_ones_pid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = ServeLock::try_acquire(dir.path()).expect("first");
        // (one process, two opens: flock locks are per open file)
        let second = ServeLock::try_acquire(dir.path());
        let Err(LockError::Serving { holder, .. }) = second else {
            panic!("a second serve was allowed: {second:?}");
        };
        assert_eq!(holder, format!("PID {}", std::process::id()));
        drop(first);
        ServeLock::try_acquire(dir.path()).expect("after release");
    }

    /// `serving_addr` holds a shared lock for an instant: a daemon starting
    /// in that instant waits it out rather than taking it for a second
    /// daemon.
    #[test]
    fn a_passing_look_at_the_lock_is_not_a_second_daemon() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("serve.lock");
        std::fs::write(&path, "").expect("write");
        let (held, go) = std::sync::mpsc::channel();
        let looker = std::thread::spawn(move || {
            let f = File::open(&path).expect("open");
            f.lock_shared().expect("shared lock");
            held.send(()).expect("send");
            std::thread::sleep(std::time::Duration::from_millis(30));
            drop(f);
        });
        go.recv().expect("held");
        let lock = ServeLock::try_acquire(dir.path());
        looker.join().expect("looker");
        assert!(lock.is_ok(), "{lock:?}");
    }

    /// The address a daemon notes is what the CLI finds while it lives.
    #[test]
    fn the_noted_address_is_found_while_the_daemon_holds_the_lock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut lock = ServeLock::try_acquire(dir.path()).expect("lock");
        assert_eq!(serving_addr(dir.path()), None, "no address noted yet");
        let addr: std::net::SocketAddr = "127.0.0.1:40123".parse().expect("addr");
        lock.record_addr(addr).expect("note");
        assert_eq!(serving_addr(dir.path()), Some(addr));
        drop(lock);
        assert_eq!(serving_addr(dir.path()), None, "a past daemon's address");
    }
}
