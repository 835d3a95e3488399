//! Unwritable state: the state directory on a small tmpfs that fills up
//! (a read-only remount is refused by the kernel while the daemon holds the
//! database open for writing, so a full disk is what is tested). While
//! driftless cannot write, a tick stops
//! before the backend and names the file, /readyz is not ready, and a
//! webhook is answered 503 — never 2xx for what was not persisted. When space
//! returns, it recovers and nothing accepted is lost. Needs root (mount).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

const SECRET: &str = "unwritable-secret";

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("mkdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs needs root (CI runs as root)");
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn push(remote: &Remote, port: u16, n: u32) -> (String, Option<u16>, String) {
    let sha = remote.commit(&[("app/v", &n.to_string())], &format!("push {n}"));
    let body = github_push_body(&remote.url(), &sha, &["app/v"]);
    let sig = format!("sha256={}", hmac_hex(SECRET, &body));
    let r = http(
        port,
        "POST",
        "/hooks/github",
        &[
            ("Content-Type", "application/json"),
            ("X-GitHub-Event", "push"),
            ("X-GitHub-Delivery", &format!("d-{n}")),
            ("X-Hub-Signature-256", &sig),
        ],
        &body,
    );
    (sha, Some(r.status), r.body)
}

#[test]
fn a_full_state_dir_refuses_work_and_recovers() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/v", "0"), ("ticker/v", "0")], "first");
    let marker = root.path().join("applied.log");
    let ticks = root.path().join("ticks.log");
    let secret = root.path().join("secret");
    std::fs::write(&secret, SECRET).expect("write");
    let (token, digest) = driftless::auth::new_token().expect("token");
    let s = Setup::new(&format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n\
         [[tokens]]\nname = \"ops\"\nsha256 = \"{digest}\"\nscopes = [\"reconcile:*\"]\n\n{}{}",
        toml_str(&secret.display().to_string()),
        exec_target(
            "app",
            &remote.url(),
            "path = \"app\"\ninterval = \"1h\"",
            &format!(
                "apply = [\"sh\", \"-c\", \"git rev-parse HEAD >> {}; sleep 2\"]\nalways = true",
                marker.display()
            )
        ),
        // A target the interval ticks every second, and one left alone.
        exec_target(
            "ticker",
            &remote.url(),
            "path = \"ticker\"\ninterval = \"1s\"",
            &format!(
                "apply = [\"sh\", \"-c\", \"echo tick >> {}\"]\nalways = true",
                ticks.display()
            )
        ) + &exec_target(
            "idle",
            &remote.url(),
            "interval = \"1h\"",
            "apply = [\"true\"]"
        )
    ));
    let _mount = Tmpfs::mount(&s.state, "24m");
    let daemon = s.serve();
    let auth = format!("Bearer {token}");
    let reconcile = || {
        http(
            daemon.port,
            "POST",
            "/api/v1/targets/app/reconcile",
            &[("Authorization", &auth)],
            b"",
        )
    };
    wait_for(Duration::from_secs(20), "the first apply", || {
        s.target_status("app")["last_result"] == "changed"
            && s.target_status("app")["running"] == false
    });
    let applied = || {
        std::fs::read_to_string(&marker)
            .unwrap_or_default()
            .lines()
            .count()
    };
    assert_eq!(applied(), 1);

    // One apply runs, a second job waits behind it; then the disk fills.
    assert_eq!(reconcile().status, 202);
    wait_for(Duration::from_secs(10), "the second apply running", || {
        applied() == 2
    });
    let queued = reconcile();
    assert_eq!(queued.status, 202, "{queued:?}");
    let filler = s.state.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=64"])
        .arg(format!("of={}", filler.display()))
        .output();
    let ticked = log_lines(&ticks).len();

    let (_, code, _) = push(&remote, daemon.port, 1);
    assert_ne!(
        code.map(|c| (200..300).contains(&c)),
        Some(true),
        "a delivery was acknowledged on a full disk"
    );
    assert_eq!(code, Some(503));
    assert_eq!(
        reconcile().status,
        503,
        "an API reconcile was acknowledged on a full disk"
    );
    assert_eq!(http_get(daemon.port, "/readyz").map(|r| r.0), Some(503));
    let out = s.run(&["tick", "idle"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains("driftless.db"),
        "the error does not name the file: {err}"
    );
    assert!(
        err.contains("database or disk is full") && !err.contains("FOREIGN KEY"),
        "the error does not say the disk is full: {err}"
    );
    // While the disk is full, neither the job queued before it filled nor
    // the interval runs anything.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        applied(),
        2,
        "a backend ran although its run could not be recorded"
    );
    assert_eq!(
        log_lines(&ticks).len(),
        ticked,
        "the interval ran a target on a full disk"
    );

    // Space returns: the job that waited runs, the interval goes on, and
    // the forge's retry is accepted and applied.
    std::fs::remove_file(&filler).expect("rm filler");
    wait_for(Duration::from_secs(10), "ready again", || {
        http_get(daemon.port, "/readyz").is_some_and(|r| r.0 == 200)
    });
    wait_for(Duration::from_secs(30), "the queued job run", || {
        applied() >= 3
    });
    wait_for(
        Duration::from_secs(30),
        "the interval ticking again",
        || log_lines(&ticks).len() > ticked,
    );
    // Every connection in the pool must be usable again, not just the one
    // the readiness probe got (a commit that failed on the full disk once
    // left a pooled connection unusable: "begin_with at non-zero
    // transaction depth").
    let mut sha = String::new();
    for n in 2..12 {
        let (s2, code, body) = push(&remote, daemon.port, n);
        assert_eq!(code, Some(202), "push {n}: {body}\n{}", daemon.log_text());
        sha = s2;
    }
    wait_for(Duration::from_secs(60), "the push applied", || {
        s.target_status("app")["last_applied_sha"] == sha.as_str()
    });

    drop(daemon);
}

/// A daemon with one exec target on a github receiver.
fn serving(root: &Path, remote: &Remote, apply: &str) -> (Setup, Daemon) {
    let secret = root.join("secret");
    std::fs::write(&secret, SECRET).expect("write");
    let s = Setup::new(&format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n{}",
        toml_str(&secret.display().to_string()),
        exec_target(
            "app",
            &remote.url(),
            "path = \"app\"\ninterval = \"1h\"",
            &format!(
                "apply = [\"sh\", \"-c\", {}]\nalways = true",
                toml_str(apply)
            ),
        )
    ));
    let daemon = s.serve();
    (s, daemon)
}

#[test]
fn a_database_deleted_or_replaced_under_the_daemon_is_never_written_into() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/v", "0")], "first");
    let (s, daemon) = serving(root.path(), &remote, "true");
    wait_for(Duration::from_secs(20), "the first apply", || {
        s.target_status("app")["last_result"] == "changed"
    });
    let (_, code, _) = push(&remote, daemon.port, 1);
    assert_eq!(code, Some(202));

    // Replaced (a restore copied over it): a new file at the path.
    let db = s.db();
    let copy = root.path().join("copy.db");
    std::fs::copy(&db, &copy).expect("copy");
    std::fs::rename(&copy, &db).expect("replace");
    let (_, code, body) = push(&remote, daemon.port, 2);
    assert_eq!(code, Some(503), "{body}");
    assert_eq!(http_get(daemon.port, "/readyz").map(|r| r.0), Some(503));
    let log = daemon.log_text();
    assert!(
        log.contains("ERROR")
            && log.contains("was replaced by another file")
            && log.contains(&db.display().to_string()),
        "{log}"
    );
    assert_eq!(
        log.matches("the state database was replaced by another file")
            .count(),
        1,
        "said more than once: {log}"
    );
    // The file at the path was never written by the daemon after it changed.
    let before = std::fs::read(&db).expect("read");
    let (_, code, _) = push(&remote, daemon.port, 3);
    assert_eq!(code, Some(503));
    assert_eq!(std::fs::read(&db).expect("read"), before);
    drop(daemon);

    // Deleted: a restart refuses to start over with an empty database.
    std::fs::remove_file(&db).expect("rm");
    for ext in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{ext}", db.display()));
    }
    let out = s.run(&["status"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains("no database") && err.contains("restore it"),
        "{err}"
    );
    assert!(!db.exists(), "an empty database was created");
}

#[test]
fn a_second_serve_on_one_state_directory_is_refused_naming_the_first() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/v", "0")], "first");
    let (s, daemon) = serving(root.path(), &remote, "true");
    wait_for(
        Duration::from_secs(20),
        "the first daemon's first apply",
        || {
            s.target_status("app")["last_result"] == "changed"
                && s.target_status("app")["running"] == false
        },
    );
    let out = output_within(
        Command::new(bin())
            .args(["--config", s.config.to_str().expect("utf8"), "serve"])
            .env("DRIFTLESS__SERVER__LISTEN", "127.0.0.1:0"),
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("another `driftless serve` (PID ")
            && err.contains("is running on this state directory"),
        "{err}"
    );
    // One-shot ticks still work beside it.
    let out = s.run(&["tick", "app"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    drop(daemon);
}

#[test]
fn a_disk_that_fills_during_an_apply_keeps_the_result_and_runs_nothing_twice() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/v", "0")], "first");
    let marker = root.path().join("applied.log");
    // The second apply fills the state directory's disk as it finishes.
    let s_dir_hint = root.path().join("state-dir");
    let apply = format!(
        "git rev-parse HEAD >> {m}; if [ -f {f} ]; then dd if=/dev/zero of=\"$(cat {f})/filler\" bs=1M count=64 2>/dev/null; fi; true",
        m = marker.display(),
        f = s_dir_hint.display()
    );
    let secret = root.path().join("secret");
    std::fs::write(&secret, SECRET).expect("write");
    let s = Setup::new(&format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n{}",
        toml_str(&secret.display().to_string()),
        exec_target(
            "app",
            &remote.url(),
            "path = \"app\"\ninterval = \"1h\"",
            &format!(
                "apply = [\"sh\", \"-c\", {}]\nalways = true",
                toml_str(&apply)
            ),
        )
    ));
    let _mount = Tmpfs::mount(&s.state, "24m");
    let daemon = s.serve();
    wait_for(Duration::from_secs(20), "the first apply", || {
        s.target_status("app")["last_result"] == "changed"
    });
    std::fs::write(&s_dir_hint, s.state.display().to_string()).expect("write");
    let (sha, code, _) = push(&remote, daemon.port, 1);
    assert_eq!(code, Some(202));
    wait_for(
        Duration::from_secs(30),
        "driftless waiting for space",
        || {
            daemon
                .log_text()
                .contains("cannot record the finished run; keeping its result")
        },
    );
    std::fs::remove_file(&s_dir_hint).expect("rm");
    std::thread::sleep(Duration::from_secs(2));
    std::fs::remove_file(s.state.join("filler")).expect("rm filler");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while s.target_status("app")["last_applied_sha"] != sha.as_str() {
        assert!(
            std::time::Instant::now() < deadline,
            "the result was not recorded: {}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let runs = s.history("app");
    assert_eq!(runs[0]["result"], "changed", "{runs:?}");
    assert_eq!(runs[0]["sha"], sha.as_str());
    assert!(
        runs.iter().all(|r| r["result"] != "interrupted"),
        "recorded as if the process had died: {runs:?}"
    );
    let lines = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(
        lines.lines().filter(|l| *l == sha).count(),
        1,
        "applied twice: {lines}"
    );
    drop(daemon);
}

#[test]
fn the_state_directory_is_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/v", "0")], "first");
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "path = \"app\"",
        "apply = [\"true\"]",
    ));
    // As a shell, or Docker, with a permissive umask would start it.
    let out = Command::new("sh")
        .arg("-c")
        .arg("umask 000; exec \"$0\" --config \"$1\" tick app")
        .arg(bin())
        .arg(&s.config)
        .output()
        .expect("tick");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&s.state), 0o700, "the state directory");
    for f in ["driftless.db", "driftless.db-wal", "driftless.db-shm"] {
        let p = s.state.join(f);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{f}");
        }
    }
    assert!(s.state.join("driftless.db").exists());
}

/// A finished run the database refuses for a reason that is not the disk
/// (here a trigger raising an error, as a constraint would) is not retried
/// as a full disk is: the tick fails at once, naming the database's
/// refusal, and holds nothing. Only disk trouble on the same database is
/// waited out (`a_disk_that_fills_during_an_apply_keeps_the_result_and_runs_nothing_twice`).
#[test]
fn a_run_the_database_refuses_to_record_fails_loudly_and_is_not_retried() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("site/v", "1")], "v1");
    let s = Setup::new(&exec_target(
        "site",
        &remote.url(),
        "path = \"site\"",
        "apply = [\"true\"]",
    ));
    assert!(s.run(&["tick", "site"]).status.success());
    sql_exec(
        &s.db(),
        "CREATE TRIGGER no_end BEFORE UPDATE OF finished_at ON runs
         WHEN NEW.finished_at IS NOT NULL
         BEGIN SELECT RAISE(ABORT, 'injected: the run may not end'); END;",
    );
    remote.commit(&[("site/v", "2")], "v2");
    let out = output_within(
        Command::new(bin())
            .arg("--config")
            .arg(&s.config)
            .args(["tick", "site"])
            .stdin(std::process::Stdio::null()),
        Duration::from_secs(60),
    );
    let said = text(&out.stdout) + &text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("injected: the run may not end"), "{said}");
}
