//! Running external commands: argv in, captured and redacted output out.
//!
//! Every command a backend runs goes through [`run`]: an argv vector (never a
//! shell string), its own process group, stdin closed, `GIT_TERMINAL_PROMPT=0`,
//! stdout and stderr captured (through unlinked files, so a command that
//! outlives driftless never dies of a broken pipe), and a deadline after which the whole group is
//! sent SIGTERM and, after a grace period, SIGKILL. This module knows nothing
//! about backends, targets or git.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use std::future::Future;
use std::os::fd::RawFd;

use tokio::process::Command;

tokio::task_local! {
    /// A file descriptor every command started in this task inherits.
    static INHERITED_FD: RawFd;
}

/// Run `fut` so that every command it starts inherits `fd` (normally closed
/// on exec). The tick uses this for the target's lock: a command that
/// outlives driftless (the daemon was killed) keeps the target locked until
/// it exits, so a restarted daemon cannot converge the target alongside it.
pub async fn with_inherited_fd<F: Future>(fd: RawFd, fut: F) -> F::Output {
    INHERITED_FD.scope(fd, fut).await
}

/// A program every command is started through — `argv`, then `--`, then
/// the command's own argv — and bytes it reads from a pipe whose descriptor
/// number is in [`WRAPPER_FD_ENV`] (never in its argv or environment). On
/// PostgreSQL this is the keeper of the job's lease (`keeper`); this module
/// neither reads nor shows the bytes.
#[derive(Clone)]
pub struct Wrapper {
    pub argv: Vec<String>,
    pub secret: std::sync::Arc<Vec<u8>>,
}

/// The environment variable naming the wrapper's pipe.
pub const WRAPPER_FD_ENV: &str = "DRIFTLESS_KEEPER_FD";

tokio::task_local! {
    /// The wrapper of every command started in this task.
    static WRAPPER: Wrapper;
}

/// Run `fut` so that every command it starts goes through `wrapper`, if any.
pub async fn with_wrapper<F: Future>(wrapper: Option<Wrapper>, fut: F) -> F::Output {
    match wrapper {
        Some(w) => WRAPPER.scope(w, fut).await,
        None => fut.await,
    }
}

/// Where the output of every command a task starts that is [`Spec::shown`]
/// goes as it comes, in complete lines, redacted with the command's own redactor — beside the
/// capture `run` returns, not instead of it. A run's output (`tick::output`)
/// is one; the sink must not block.
pub type OutputSink = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

tokio::task_local! {
    static OUTPUT: OutputSink;
}

/// Run `fut` so that every command it starts also writes to `sink`: a line
/// `$ argv` first, then its output as it comes.
pub async fn with_output<F: Future>(sink: OutputSink, fut: F) -> F::Output {
    OUTPUT.scope(sink, fut).await
}

/// Larger than this and writing the wrapper's bytes into its pipe before
/// it starts could block.
const WRAPPER_SECRET_MAX: usize = 32 * 1024;

use crate::redact::{self, Redactor};

/// How much of the interleaved output is kept for the run record.
pub const TAIL_BYTES: usize = 16 * 1024;
/// The most of one stream kept in memory for parsing (the end is kept).
const STREAM_CAP: usize = 32 * 1024 * 1024;
/// After SIGTERM on timeout, how long the group gets before SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// What to run.
#[derive(Debug, Clone)]
pub struct Spec {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
    /// Kill the process group when this instant passes.
    pub deadline: Option<Instant>,
    /// Bytes written to the command's stdin (closed afterwards); none: stdin
    /// is /dev/null.
    pub stdin: Option<std::sync::Arc<Vec<u8>>>,
    /// Its output is part of the run's output (`with_output`): only a
    /// backend's own work (apply, destroy, a plan's progress), whose
    /// output driftless already shows as a run's tail — never a command
    /// that prints data (a decrypted file, `terraform show -json`,
    /// `compose config`, outputs), which the redactor cannot know.
    pub shown: bool,
    /// How a line of its output reads in the run's output (a tool's
    /// machine-readable line as its human message); as it is when `None`.
    pub view: Option<LineView>,
}

/// How a line of a command's output reads in a run's output.
pub type LineView = fn(&str) -> String;

impl Spec {
    pub fn new(argv: Vec<String>, cwd: &Path) -> Self {
        Spec {
            argv,
            cwd: cwd.to_path_buf(),
            env: BTreeMap::new(),
            deadline: None,
            stdin: None,
            shown: false,
            view: None,
        }
    }

    /// The same command, its output part of the run's ([`Spec::shown`]).
    pub fn shown(mut self) -> Self {
        self.shown = true;
        self
    }

    /// The command line as shown in messages: argv joined by spaces.
    pub fn display(&self) -> String {
        self.argv.join(" ")
    }
}

/// What came back. Text fields are already redacted.
#[derive(Debug, Clone)]
pub struct Output {
    /// The exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The last [`TAIL_BYTES`] of stdout and stderr, interleaved by line.
    pub tail: String,
    /// The deadline passed and the group was killed.
    pub timed_out: bool,
    pub duration: Duration,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.timed_out
    }

    /// The last `n` non-empty stderr lines, joined by ` | ` (what a failure
    /// message quotes).
    pub fn stderr_summary(&self, n: usize) -> String {
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        lines[lines.len().saturating_sub(n)..].join(" | ")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("empty command")]
    Empty,
    #[error("cannot start `{program}` in {cwd}: {reason}")]
    Spawn {
        program: String,
        cwd: String,
        reason: String,
    },
    #[error("waiting for `{program}` failed: {reason}")]
    Wait { program: String, reason: String },
}

#[derive(Default)]
struct Capture {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    combined: Vec<u8>,
}

/// Append `chunk` to `buf`; past twice `cap`, keep only the last `cap`
/// bytes. The cut is made in redacted text: the buffer is redacted whole
/// first, so a secret the cut would cross is already masked and no piece of
/// it survives (a raw cut could keep its second half, which the final
/// redaction no longer recognises). Redacting text twice changes nothing,
/// and a secret whose first bytes end the kept text is still found whole
/// once the rest arrives.
fn push_capped(buf: &mut Vec<u8>, chunk: &[u8], cap: usize, redactor: &Redactor) {
    buf.extend_from_slice(chunk);
    if buf.len() > cap * 2 {
        let text = redactor.redact(&String::from_utf8_lossy(buf));
        let mut start = text.len().saturating_sub(cap);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        *buf = text.as_bytes()[start..].to_vec();
    }
}

/// One output stream: an unlinked file the command writes to (appending),
/// and how far we have read it. A file, not a pipe: a command that outlives
/// driftless (the daemon was killed mid-apply) must not die of SIGPIPE on
/// its next write — terraform would then exit before saving its state.
struct Stream {
    file: std::fs::File,
    read: u64,
    /// Bytes read past the last newline.
    partial: Vec<u8>,
    is_stdout: bool,
}

impl Stream {
    fn new(is_stdout: bool) -> std::io::Result<Stream> {
        let file = tempfile::tempfile()?;
        // O_APPEND on the shared open file description: the command's writes
        // always go to the end, whatever offset we read at (we use pread).
        use std::os::fd::AsRawFd;
        // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
        let ok = unsafe {
            let fd = file.as_raw_fd();
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags != -1 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_APPEND) != -1
        };
        if !ok {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Stream {
            file,
            read: 0,
            partial: Vec::new(),
            is_stdout,
        })
    }

    /// Move what the command wrote since the last call into `cap`, line by
    /// line; at `eof`, the unfinished last line too (and an unfinished line
    /// longer than [`STREAM_CAP`], which is never dropped unredacted).
    fn drain(
        &mut self,
        cap: &mut Capture,
        eof: bool,
        redactor: &Redactor,
        sink: Option<(&OutputSink, Option<LineView>)>,
    ) {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match self.file.read_at(&mut buf, self.read) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.read += n as u64;
                    self.partial.extend_from_slice(&buf[..n]);
                }
            }
        }
        let mut rest = std::mem::take(&mut self.partial);
        let upto = if eof || rest.len() > STREAM_CAP {
            rest.len()
        } else {
            rest.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1)
        };
        self.partial = rest.split_off(upto);
        if rest.is_empty() {
            return;
        }
        let stream = if self.is_stdout {
            &mut cap.stdout
        } else {
            &mut cap.stderr
        };
        push_capped(stream, &rest, STREAM_CAP, redactor);
        push_capped(&mut cap.combined, &rest, TAIL_BYTES, redactor);
        // Whole lines only (but at the end or past the cap), so a secret
        // (each line of a multi-line one is registered too) is never
        // split across two writes.
        if let Some((sink, view)) = sink {
            let raw = String::from_utf8_lossy(&rest);
            let mut text = match view {
                Some(view) => {
                    redactor.redact(&raw.lines().map(view).collect::<Vec<_>>().join("\n"))
                }
                None => redactor.redact(&raw),
            };
            if !text.ends_with('\n') {
                text.push('\n');
            }
            sink(&text);
        }
    }
}

/// How often output is moved from the files into the capture while the
/// command runs (this also decides how stdout and stderr interleave in the
/// tail).
const POLL: Duration = Duration::from_millis(50);

fn signal_group(pgid: i32, signal: i32) {
    if pgid > 0 {
        // SAFETY: killpg only sends a signal; a stale pgid yields ESRCH.
        unsafe {
            libc::killpg(pgid, signal);
        }
    }
}

/// SIGKILLs a process group when dropped, unless its id was set to 0.
struct GroupGuard(i32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        signal_group(self.0, libc::SIGKILL);
    }
}

/// Run `spec` to completion (or its deadline) and capture its output.
pub async fn run(spec: &Spec, redactor: &Redactor) -> Result<Output, ProcessError> {
    let program = spec.argv.first().ok_or(ProcessError::Empty)?;
    let started = Instant::now();
    let spawn_err = |e: std::io::Error| ProcessError::Spawn {
        program: program.clone(),
        cwd: spec.cwd.display().to_string(),
        reason: format!("cannot create a file for its output: {e}"),
    };
    let mut out = Stream::new(true).map_err(spawn_err)?;
    let mut err = Stream::new(false).map_err(spawn_err)?;
    let mut capture = Capture::default();
    let sink = OUTPUT
        .try_with(OutputSink::clone)
        .ok()
        .filter(|_| spec.shown);
    let sink = sink.as_ref();
    let (mut cmd, wrapper_pipe) = command(spec, program)?;
    cmd.stdout(Stdio::from(out.file.try_clone().map_err(spawn_err)?))
        .stderr(Stdio::from(err.file.try_clone().map_err(spawn_err)?));
    let mut child = cmd.spawn().map_err(|e| ProcessError::Spawn {
        program: program.clone(),
        cwd: spec.cwd.display().to_string(),
        reason: e.to_string(),
    })?;
    if let Some(sink) = sink {
        sink(&format!("$ {}\n", redactor.redact(&shown_argv(&spec.argv))));
    }
    let pgid = child.id().map(|p| p as i32).unwrap_or(0);
    // A run dropped before its command ended (its tick was stopped: its
    // lease was lost) takes the command's whole group down with it, not
    // only the leader `kill_on_drop` reaches.
    let mut group = GroupGuard(pgid);
    if let (Some(data), Some(mut stdin)) = (spec.stdin.clone(), child.stdin.take()) {
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            // A command that exits without reading it all is not our error.
            let _ = stdin.write_all(&data).await;
            let _ = stdin.shutdown().await;
        });
    }
    // The command's copies of the files were moved into it; ours stay.
    drop(cmd);
    drop(wrapper_pipe);

    let wait_err = |e: std::io::Error| ProcessError::Wait {
        program: program.clone(),
        reason: e.to_string(),
    };
    let mut timed_out = false;
    let deadline = spec.deadline;
    let status = loop {
        let sleep = match deadline {
            Some(d) => POLL.min(d.saturating_duration_since(Instant::now())),
            None => POLL,
        };
        tokio::select! {
            s = child.wait() => break s.map_err(wait_err)?,
            _ = tokio::time::sleep(sleep) => {}
        }
        out.drain(&mut capture, false, redactor, sink.map(|s| (s, spec.view)));
        err.drain(&mut capture, false, redactor, sink.map(|s| (s, spec.view)));
        if deadline.is_some_and(|d| Instant::now() >= d) {
            timed_out = true;
            break stop_group(&mut child, pgid).await.map_err(wait_err)?;
        }
    };
    group.0 = 0;
    out.drain(&mut capture, true, redactor, sink.map(|s| (s, spec.view)));
    err.drain(&mut capture, true, redactor, sink.map(|s| (s, spec.view)));
    if let Some(sink) = sink {
        sink(&match (timed_out, status.code()) {
            (true, _) => "[driftless: killed at its deadline]\n".to_string(),
            (false, Some(0)) => String::new(),
            (false, Some(c)) => format!("[driftless: exit code {c}]\n"),
            (false, None) => "[driftless: killed by a signal]\n".to_string(),
        });
    }
    let stdout = String::from_utf8_lossy(&capture.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&capture.stderr).into_owned();
    let combined = String::from_utf8_lossy(&capture.combined).into_owned();
    Ok(Output {
        code: status.code(),
        stdout: redactor.redact(&stdout),
        stderr: redactor.redact(&stderr),
        // Redact before cutting, so a secret on the cut is not half-shown
        // (`push_capped` keeps to the same rule).
        tail: redact::tail(&redactor.redact(&combined), TAIL_BYTES),
        timed_out,
        duration: started.elapsed(),
    })
}

/// A command past its deadline: SIGTERM to its group, then SIGKILL after
/// the grace (and to the children of a leader that went).
async fn stop_group(
    child: &mut tokio::process::Child,
    pgid: i32,
) -> std::io::Result<std::process::ExitStatus> {
    signal_group(pgid, libc::SIGTERM);
    match tokio::time::timeout(KILL_GRACE, child.wait()).await {
        Ok(s) => {
            // The leader is gone; make sure its children are too.
            signal_group(pgid, libc::SIGKILL);
            s
        }
        Err(_) => {
            signal_group(pgid, libc::SIGKILL);
            child.wait().await
        }
    }
}

/// The command `spec` runs as (through the task's wrapper, the keeper,
/// when there is one), in its own process group, with the wrapper's bytes
/// in a pipe it inherits (kept open, returned, until the command has
/// started) and the task's inherited descriptor kept across exec. Its
/// stdout and stderr are the caller's to set.
fn command(
    spec: &Spec,
    program: &str,
) -> Result<(Command, Option<std::io::PipeReader>), ProcessError> {
    let wrapper = WRAPPER.try_with(Wrapper::clone).ok();
    let mut cmd = match &wrapper {
        None => {
            let mut c = Command::new(program);
            c.args(&spec.argv[1..]);
            c
        }
        Some(w) => {
            let Some(keeper) = w.argv.first() else {
                return Err(ProcessError::Empty);
            };
            let mut c = Command::new(keeper);
            c.args(&w.argv[1..]).arg("--").args(&spec.argv);
            c
        }
    };
    // The wrapper's bytes, in a pipe it inherits (kept open until the
    // command has started).
    let mut wrapper_pipe = None;
    if let Some(w) = &wrapper {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let pipe_err = |e: std::io::Error| ProcessError::Spawn {
            program: program.to_string(),
            cwd: spec.cwd.display().to_string(),
            reason: format!("cannot pass its keeper what it needs: {e}"),
        };
        if w.secret.len() > WRAPPER_SECRET_MAX {
            return Err(pipe_err(std::io::Error::other("too much to pass")));
        }
        let (reader, mut writer) = std::io::pipe().map_err(pipe_err)?;
        writer.write_all(&w.secret).map_err(pipe_err)?;
        drop(writer);
        let fd = reader.as_raw_fd();
        cmd.env(WRAPPER_FD_ENV, fd.to_string());
        keep_across_exec(&mut cmd, fd);
        wrapper_pipe = Some(reader);
    }
    cmd.current_dir(&spec.cwd)
        .envs(&spec.env)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .process_group(0)
        .kill_on_drop(true);
    if let Ok(fd) = INHERITED_FD.try_with(|fd| *fd) {
        keep_across_exec(&mut cmd, fd);
    }
    Ok((cmd, wrapper_pipe))
}

/// The child keeps descriptor `fd` across exec.
fn keep_across_exec(cmd: &mut Command, fd: i32) {
    // SAFETY: fcntl is async-signal-safe; it only clears FD_CLOEXEC on
    // the child's copy of the descriptor table.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A command line as a run's output shows it: the value of a `-var
/// name=value` (terraform's and OpenTofu's way to pass variables, secret
/// ones included) shown as `name=…`.
fn shown_argv(argv: &[String]) -> String {
    let mut out: Vec<String> = Vec::with_capacity(argv.len());
    for (i, a) in argv.iter().enumerate() {
        let after_var = i > 0 && argv[i - 1] == "-var";
        let masked = match (after_var, a.strip_prefix("-var=")) {
            (true, _) => a.split_once('=').map(|(k, _)| format!("{k}=…")),
            (false, Some(kv)) => kv.split_once('=').map(|(k, _)| format!("-var={k}=…")),
            _ => None,
        };
        out.push(masked.unwrap_or_else(|| a.clone()));
    }
    out.join(" ")
}

/// A one-line account of how a command ended, for messages.
pub fn describe_exit(spec: &Spec, out: &Output, timeout: Option<Duration>) -> String {
    if out.timed_out {
        match timeout {
            Some(t) => format!(
                "`{}` timed out after {} and was killed with its process group",
                spec.display(),
                humantime::format_duration(t)
            ),
            None => format!("`{}` timed out and was killed", spec.display()),
        }
    } else {
        match out.code {
            Some(c) => format!("`{}` exited with code {c}", spec.display()),
            None => format!("`{}` was killed by a signal", spec.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `-var` value never shows in a run's output's command lines.
    #[test]
    fn a_var_value_is_not_shown() {
        let argv: Vec<String> = [
            "terraform",
            "apply",
            "-var",
            "secret=s3cr3t",
            "-var=b=x",
            "-json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            shown_argv(&argv),
            "terraform apply -var secret=… -var=b=… -json"
        );
    }

    fn sh(script: &str) -> Spec {
        Spec::new(
            vec!["sh".into(), "-c".into(), script.into()],
            Path::new("/"),
        )
    }

    #[tokio::test]
    async fn captures_and_redacts() {
        let r = Redactor::new().with("topsecret");
        let out = run(&sh("echo out topsecret; echo err >&2; exit 3"), &r)
            .await
            .expect("run");
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout, "out [REDACTED]\n");
        assert_eq!(out.stderr, "err\n");
        assert!(out.tail.contains("out [REDACTED]") && out.tail.contains("err"));
        assert!(!out.timed_out);
    }

    /// A secret on the spot where the kept tail begins is masked, not cut
    /// in two: ~20 KB, the secret, then a little less than the tail's size,
    /// all in one write, so the buffer is trimmed once with the secret
    /// straddling the cut.
    #[tokio::test]
    async fn no_piece_of_a_secret_survives_a_cut() {
        let secret = "Zq8vW3nR5tY1kP7mX2cB9dF4";
        let r = Redactor::new().with(secret);
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("out");
        let after = TAIL_BYTES - 12;
        let text = format!("{}\n{secret}\n{}\n", "x".repeat(20_000), "y".repeat(after));
        std::fs::write(&file, &text).expect("write");
        let out = run(&sh(&format!("cat {}", file.display())), &r)
            .await
            .expect("run");
        assert!(out.tail.len() <= TAIL_BYTES + 64, "{}", out.tail.len());
        for w in secret.as_bytes().windows(6) {
            let w = std::str::from_utf8(w).expect("ascii");
            assert!(!out.tail.contains(w), "{w:?} of the secret is in the tail");
            assert!(!out.stdout.contains(w), "{w:?} of the secret is in stdout");
        }
    }

    #[tokio::test]
    async fn deadline_kills_the_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("survivor");
        // The child spawns a grandchild that would write the marker later.
        let mut spec = sh(&format!("(sleep 3; touch {}) & sleep 30", marker.display()));
        spec.deadline = Some(Instant::now() + Duration::from_millis(300));
        let out = run(&spec, &Redactor::new()).await.expect("run");
        assert!(out.timed_out);
        assert!(out.duration < Duration::from_secs(10), "{:?}", out.duration);
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!marker.exists(), "grandchild outlived the timeout");
    }

    fn output(code: Option<i32>, timed_out: bool, stderr: &str) -> Output {
        Output {
            code,
            stdout: String::new(),
            stderr: stderr.into(),
            tail: String::new(),
            timed_out,
            duration: Duration::ZERO,
        }
    }

    /// What callers read of an ended command: success is exit code 0 and
    /// no timeout; the failure summary is the last non-empty stderr lines;
    /// the one-line account names the command and how it ended.
    #[test]
    fn an_ended_command_is_described_as_it_ended() {
        assert!(output(Some(0), false, "").success());
        assert!(!output(Some(0), true, "").success());
        assert!(!output(Some(1), false, "").success());
        assert!(!output(None, false, "").success());
        let o = output(Some(2), false, "one\n\n  two  \nthree\n");
        assert_eq!(o.stderr_summary(2), "two | three");
        assert_eq!(o.stderr_summary(9), "one | two | three");
        let spec = sh("exit 2");
        assert_eq!(spec.display(), "sh -c exit 2");
        assert_eq!(
            describe_exit(&spec, &o, None),
            "`sh -c exit 2` exited with code 2"
        );
        assert_eq!(
            describe_exit(&spec, &output(None, false, ""), None),
            "`sh -c exit 2` was killed by a signal"
        );
        assert_eq!(
            describe_exit(
                &spec,
                &output(None, true, ""),
                Some(Duration::from_secs(90))
            ),
            "`sh -c exit 2` timed out after 1m 30s and was killed with its process group"
        );
    }

    /// A buffer is cut only past twice its cap, to its last `cap` bytes at
    /// most, on a character boundary.
    #[test]
    fn a_capped_buffer_keeps_its_end_within_the_cap() {
        let r = Redactor::new();
        let mut buf = Vec::new();
        push_capped(&mut buf, "a".repeat(150).as_bytes(), 101, &r);
        assert_eq!(buf.len(), 150, "cut below twice the cap");
        // 'é' is two bytes: the last 101 bytes begin inside one, so the cut
        // moves forward to the next character.
        push_capped(&mut buf, "é".repeat(60).as_bytes(), 101, &r);
        assert_eq!(buf.len(), 100);
        let text = String::from_utf8(buf.clone()).expect("a character boundary");
        assert_eq!(text, "é".repeat(50));
    }

    /// stdout and stderr interleave in the tail line by line, in the order
    /// they were written; an unfinished last line is kept at the end.
    #[tokio::test]
    async fn the_tail_interleaves_whole_lines_and_keeps_an_unfinished_one() {
        let out = run(
            &sh("printf 'out'; sleep 0.3; echo err >&2; sleep 0.3; echo 1; printf last"),
            &Redactor::new(),
        )
        .await
        .expect("run");
        assert_eq!(out.stdout, "out1\nlast");
        assert_eq!(out.tail, "err\nout1\nlast");
    }

    /// A deadline in the future does not end a command that ends first.
    #[tokio::test]
    async fn a_command_ending_before_its_deadline_is_not_timed_out() {
        // Longer than several polls, so the deadline is checked while it runs.
        let mut spec = sh("sleep 0.3; exit 0");
        spec.deadline = Some(Instant::now() + Duration::from_secs(30));
        let out = run(&spec, &Redactor::new()).await.expect("run");
        assert!(out.success() && !out.timed_out, "{out:?}");
    }

    /// A command started under `with_inherited_fd` holds that descriptor.
    #[tokio::test]
    async fn a_command_inherits_the_descriptor_it_is_given() {
        use std::os::fd::AsRawFd;
        let file = tempfile::tempfile().expect("tempfile");
        let fd = file.as_raw_fd();
        let out = with_inherited_fd(
            fd,
            run(
                &sh(&format!("test -e /proc/self/fd/{fd}")),
                &Redactor::new(),
            ),
        )
        .await
        .expect("run");
        assert_eq!(out.code, Some(0), "fd {fd} was not inherited");
        let out = run(
            &sh(&format!("test -e /proc/self/fd/{fd}")),
            &Redactor::new(),
        )
        .await
        .expect("run");
        assert_eq!(
            out.code,
            Some(1),
            "fd {fd} leaked into a command not given it"
        );
    }

    /// A run dropped before its command ended takes the whole process
    /// group with it, not only the leader.
    #[tokio::test]
    async fn a_dropped_run_kills_its_command_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("pid");
        let spec = sh(&format!("sleep 30 & echo $! > {}; wait", pidfile.display()));
        let r = Redactor::new();
        let running = run(&spec, &r);
        let pid = tokio::select! {
            _ = running => panic!("ended by itself"),
            pid = async {
                loop {
                    if let Ok(p) = std::fs::read_to_string(&pidfile)
                        && let Ok(p) = p.trim().parse::<i32>()
                    {
                        break p;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            } => pid,
        };
        // The run future is dropped here; its group gets SIGKILL.
        let gone = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: signal 0 only checks the process exists.
            let exists = unsafe { libc::kill(pid, 0) } == 0;
            !exists
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))
        });
        assert!(
            gone,
            "the command's background child {pid} outlived the run"
        );
    }

    #[tokio::test]
    async fn missing_program_is_a_clear_error() {
        let spec = Spec::new(vec!["/nonexistent/prog".into()], Path::new("/"));
        let e = run(&spec, &Redactor::new()).await.expect_err("spawn fails");
        assert!(e.to_string().contains("/nonexistent/prog"), "{e}");
    }
}
