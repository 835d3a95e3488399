//! The keeper of a job's lease around one backend command, on PostgreSQL.
//!
//! Several instances share one PostgreSQL database; a file lock keeps two
//! applies of a target apart on one host only. Across hosts, what keeps
//! them apart is the running job's claim (its row, unique per target,
//! `lease_until` by the server's clock): nobody takes a job over before
//! its claim has run out. A command must therefore never run past its
//! job's claim — not even when the instance that started it was killed
//! (an orphaned `terraform apply` goes on). So on PostgreSQL every command
//! is started through `driftless __keep -- <argv>` (`process::Wrapper`):
//! this small process renews the claim on a connection of its own for as
//! long as its command lives, and stops the command before the claim can
//! run out when it cannot renew it:
//!
//! - renewed every third of the lease; each renewal counts from the moment
//!   it was sent, so the keeper's own deadline (`sent + lease − margin`)
//!   always falls before the server's `lease_until` (`server now + lease`,
//!   read after the send), whatever the hosts' clocks say;
//! - no renewal for `lease − margin − grace`: SIGTERM to the command (a
//!   terraform saves its state); at `lease − margin`: SIGKILL to the
//!   command's whole process group, this keeper included;
//! - a renewal refused (the job is not this instance's any more, or its
//!   claim already ran out): SIGKILL at once;
//! - the command cannot outlive its keeper: it is started with
//!   `PR_SET_PDEATHSIG = SIGKILL`; the keeper ignores SIGTERM, SIGINT and
//!   SIGHUP (a signal to the process group reaches the command, which
//!   decides) and exits with the command's status, or dies of its signal.
//!
//! It reads what it needs (the database URL with its password, the lease)
//! from a pipe, never from its argv or environment, and shows neither. It
//! knows nothing of backends or targets, and decides nothing but whether
//! its command may go on.

use std::ffi::OsString;
use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::process::{WRAPPER_FD_ENV, Wrapper};
use crate::queue::Lease;

/// `driftless __keep -- <argv>`: the hidden first argument.
pub const ARG: &str = "__keep";

/// The exit status of a keeper that could not start its command.
const CANNOT_START: u8 = 125;

/// What the keeper reads from its pipe.
#[derive(Serialize, Deserialize)]
struct Handoff {
    url: String,
    lease: Lease,
}

/// The wrapper that starts every command of the job holding `lease` on the
/// database at `url` through a keeper.
pub fn wrapper(url: &crate::store::ConnectUrl, lease: Lease) -> Wrapper {
    let handoff = Handoff {
        url: url.expose().to_string(),
        lease,
    };
    Wrapper {
        // This very binary, even if replaced on disk since it started.
        argv: vec!["/proc/self/exe".into(), ARG.into()],
        secret: std::sync::Arc::new(serde_json::to_vec(&handoff).unwrap_or_default()),
    }
}

/// How a keeper times its renewals, from the lease.
#[derive(Clone, Copy, Debug)]
struct Timing {
    lease: Duration,
    /// Stop this much before the claim could run out.
    margin: Duration,
    /// SIGTERM this much before SIGKILL.
    grace: Duration,
    every: Duration,
    retry: Duration,
}

impl Timing {
    fn of(lease: Duration) -> Timing {
        Timing {
            lease,
            margin: lease / 10,
            grace: lease / 6,
            every: lease / 3,
            retry: lease / 15,
        }
    }

    /// The last instant the command may live, after a renewal sent at `sent`.
    fn deadline(&self, sent: Instant) -> Instant {
        sent + self.lease - self.margin
    }
}

#[derive(Debug, thiserror::Error)]
enum KeeperError {
    #[error("no command after `--`")]
    NoCommand,
    #[error("cannot read what it was given ({WRAPPER_FD_ENV}): {0}")]
    Handoff(String),
    #[error("cannot start its runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot reach the database to hold job {job}'s claim: {reason}")]
    Database { job: i64, reason: String },
    #[error(
        "job {job} is no longer this instance's (its claim ran out or was taken over); the command was not started"
    )]
    NotOurs { job: i64 },
    #[error("cannot start `{program}`: {reason}")]
    Spawn { program: String, reason: String },
}

/// The keeper's entry point: `args` is what follows [`ARG`].
pub fn main(args: &[OsString]) -> ExitCode {
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("driftless keeper: {e}");
            ExitCode::from(CANNOT_START)
        }
    }
}

fn run(args: &[OsString]) -> Result<ExitCode, KeeperError> {
    let command: Vec<OsString> = match args.split_first() {
        Some((dashes, rest)) if dashes == "--" && !rest.is_empty() => rest.to_vec(),
        _ => return Err(KeeperError::NoCommand),
    };
    let handoff = read_handoff()?;
    // A signal to the process group is for the command; the keeper waits
    // for it to act on it.
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: setting a signal's disposition to ignored, before any
        // thread is started.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(KeeperError::Runtime)?;
    let status = runtime.block_on(keep(handoff, command))?;
    Ok(exit_as(status))
}

fn read_handoff() -> Result<Handoff, KeeperError> {
    use std::os::fd::FromRawFd;
    let bad = |e: String| KeeperError::Handoff(e);
    let fd: i32 = std::env::var(WRAPPER_FD_ENV)
        .map_err(|e| bad(e.to_string()))?
        .parse()
        .map_err(|e: std::num::ParseIntError| bad(e.to_string()))?;
    if fd < 3 {
        return Err(bad(format!("descriptor {fd} is not a pipe of ours")));
    }
    // SAFETY: the descriptor was opened for this process by its parent
    // (`process::run`), and nothing else here uses it; it is closed when
    // the file is dropped.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| bad(e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))
}

/// Renew the claim on `conn` (connecting first if there is none), within
/// `limit`.
async fn renew(
    conn: &mut Option<crate::store::db::Conn>,
    handoff: &Handoff,
    limit: Duration,
) -> Result<bool, String> {
    let attempt = async {
        if conn.is_none() {
            *conn = Some(
                crate::store::db::connect_keeper(&handoff.url)
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        let Some(c) = conn.as_mut() else {
            return Err("no connection".to_string());
        };
        handoff.lease.renew(c).await.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(limit, attempt).await {
        Ok(Ok(ours)) => Ok(ours),
        Ok(Err(e)) => {
            *conn = None;
            Err(e)
        }
        Err(_) => {
            *conn = None;
            Err(format!("no answer within {} ms", limit.as_millis()))
        }
    }
}

async fn keep(
    handoff: Handoff,
    command: Vec<OsString>,
) -> Result<std::process::ExitStatus, KeeperError> {
    let job = handoff.lease.job;
    let timing = Timing::of(handoff.lease.duration());
    let mut conn = None;
    let sent = Instant::now();
    match renew(&mut conn, &handoff, timing.lease - timing.margin).await {
        Ok(true) => {}
        Ok(false) => return Err(KeeperError::NotOurs { job }),
        Err(reason) => return Err(KeeperError::Database { job, reason }),
    }
    let mut deadline = timing.deadline(sent);
    let mut next = sent + timing.every;

    let program = command[0].to_string_lossy().into_owned();
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]).env_remove(WRAPPER_FD_ENV);
    let keeper_pid = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (signal, prctl, getppid).
    unsafe {
        cmd.pre_exec(move || {
            for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            #[cfg(target_os = "linux")]
            {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                // The keeper died before the line above: so must we.
                if libc::getppid() != keeper_pid {
                    return Err(std::io::Error::other("its keeper is gone"));
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| KeeperError::Spawn {
        program: program.clone(),
        reason: e.to_string(),
    })?;
    let pid = child.id().map(|p| p as libc::pid_t).unwrap_or(0);
    let mut termed = false;
    loop {
        let wake = if termed {
            deadline
        } else {
            next.min(deadline - timing.grace)
        };
        tokio::select! {
            status = child.wait() => {
                if termed {
                    // Stopped for the lease: what it started goes too.
                    stop_all(pid);
                }
                return status.map_err(|e| KeeperError::Spawn { program, reason: e.to_string() });
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
        let now = Instant::now();
        if now >= deadline {
            eprintln!(
                "driftless keeper: job {job}'s claim on the database could not be renewed in time; \
                 `{program}` and its process group are killed so that no other instance applies beside it"
            );
            stop_all(pid);
            let _ = child.wait().await;
            return Ok(killed());
        }
        if now >= next {
            let sent = Instant::now();
            match renew(
                &mut conn,
                &handoff,
                deadline.saturating_duration_since(sent),
            )
            .await
            {
                Ok(true) => {
                    deadline = timing.deadline(sent);
                    next = sent + timing.every;
                }
                Ok(false) => {
                    eprintln!(
                        "driftless keeper: job {job} is no longer this instance's (its claim ran out or was taken over); \
                         `{program}` is killed"
                    );
                    stop_all(pid);
                    let _ = child.wait().await;
                    return Ok(killed());
                }
                Err(reason) => {
                    eprintln!("driftless keeper: cannot renew job {job}'s claim: {reason}");
                    next = Instant::now() + timing.retry;
                }
            }
        }
        if !termed && Instant::now() >= deadline - timing.grace {
            termed = true;
            eprintln!(
                "driftless keeper: job {job}'s claim on the database could not be renewed; \
                 `{program}` is asked to stop (SIGTERM) before the claim runs out"
            );
            // SAFETY: kill only sends a signal.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }
}

/// SIGKILL the command and what it started: the whole process group when
/// the keeper leads it (as `process::run` makes it), else the command.
fn stop_all(pid: libc::pid_t) {
    // SAFETY: getpgrp/getpid read; kill/killpg only send signals.
    unsafe {
        if libc::getpgrp() == libc::getpid() {
            libc::killpg(libc::getpgrp(), libc::SIGKILL);
        } else if pid > 0 {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// The status of a command killed by SIGKILL.
fn killed() -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    std::process::ExitStatus::from_raw(libc::SIGKILL)
}

/// Leave as the command did: its exit code, or dying of its signal.
fn exit_as(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    if let Some(sig) = status.signal() {
        // SAFETY: restoring the default disposition and raising the signal
        // the command died of, so the parent sees the same.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
        return ExitCode::from(128u8.saturating_add(sig as u8));
    }
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keeper_stops_before_the_claim_can_run_out() {
        let t = Timing::of(Duration::from_secs(30));
        let sent = Instant::now();
        // The server's claim runs to (its now, read after `sent`) + lease.
        assert!(t.deadline(sent) < sent + t.lease);
        assert!(t.deadline(sent) - t.grace > sent + t.every);
        // one failed renewal is retried before SIGTERM
        assert!(sent + t.every + t.retry < t.deadline(sent) - t.grace);
    }

    #[test]
    fn nothing_it_is_given_appears_in_its_argv() {
        let url = crate::store::ConnectUrl::new("postgres://u:s3cret@h/db".into());
        let w = wrapper(
            &url,
            Lease {
                job: 1,
                owner: "o".into(),
                lease_ms: 30_000,
            },
        );
        assert!(w.argv.iter().all(|a| !a.contains("s3cret")));
        assert!(String::from_utf8_lossy(&w.secret).contains("s3cret"));
    }
}
