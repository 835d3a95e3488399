//! The exec backend and the one-shot `tick` command: digest idempotency, the
//! exit-code convention, timeouts that kill the whole process group, the
//! lock's exit code 75, and secrets kept out of what is recorded.

use std::time::{Duration, Instant};

use crate::common::*;

#[test]
fn digest_skips_unchanged_inputs_without_running_anything() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/config", "v1\n"), ("docs/readme", "x")], "first");
    let counter = root.path().join("runs.log");
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "path = \"app\"",
        &format!(
            "apply = [\"sh\", \"-c\", \"cat config >> {}\"]",
            counter.display()
        ),
    ));
    let tick = || {
        let out = s.run(&["tick", "app"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        s.target_status("app")["last_result"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(tick(), "changed");
    assert_eq!(log_lines(&counter), vec!["v1"]);
    assert_eq!(tick(), "no_change");
    // A commit outside the target's path does not change its digest.
    remote.commit(&[("docs/readme", "y")], "docs");
    assert_eq!(tick(), "no_change");
    assert_eq!(
        log_lines(&counter),
        vec!["v1"],
        "apply ran although nothing changed"
    );
    // A commit inside the path does.
    remote.commit(&[("app/config", "v2\n")], "v2");
    assert_eq!(tick(), "changed");
    assert_eq!(log_lines(&counter), vec!["v1", "v2"]);
}

#[test]
fn a_failed_apply_is_retried_and_never_moves_the_sha() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let good = remote.commit(&[("ok", "1")], "first");
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "",
        "apply = [\"sh\", \"-c\", \"if [ -f broken ]; then echo 'boom: disk on fire' >&2; exit 1; fi\"]",
    ));
    assert!(s.run(&["tick", "app"]).status.success());
    remote.commit(&[("broken", "1")], "break it");
    for n in 1..=2 {
        let out = s.run(&["tick", "app"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
        let st = s.target_status("app");
        assert_eq!(st["last_applied_sha"], good);
        assert_eq!(st["consecutive_failures"], n);
        let msg = st["last_message"].as_str().unwrap_or("");
        assert!(
            msg.contains("exited with code 1") && msg.contains("boom: disk on fire"),
            "{msg}"
        );
    }
    let fixed = remote.delete("broken", "fix");
    assert!(s.run(&["tick", "app"]).status.success());
    let st = s.target_status("app");
    assert_eq!(st["last_applied_sha"], fixed);
    assert_eq!(st["consecutive_failures"], 0);
}

#[test]
fn always_mode_reads_the_exit_code_convention() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("code", "3")], "first");
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "",
        "apply = [\"sh\", \"-c\", \"exit $(cat code)\"]\nalways = true",
    ));
    let tick = |expect_exit: i32| {
        let out = s.run(&["tick", "app"]);
        assert_eq!(
            out.status.code(),
            Some(expect_exit),
            "{}",
            text(&out.stdout)
        );
        s.target_status("app")["last_result"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(tick(0), "no_change");
    assert_eq!(tick(0), "no_change");
    remote.commit(&[("code", "0")], "changed");
    assert_eq!(tick(0), "changed");
    assert_eq!(tick(0), "changed", "always = true runs every tick");
    remote.commit(&[("code", "7")], "broken");
    assert_eq!(tick(1), "failed");
}

#[test]
fn in_digest_mode_exit_code_3_is_a_failure_and_stores_no_digest() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("code", "3")], "first");
    let counter = root.path().join("runs.log");
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "",
        &format!(
            "apply = [\"sh\", \"-c\", \"echo run >> {}; exit $(cat code)\"]",
            counter.display()
        ),
    ));
    // Without `always`, 3 is just a failing exit code: the run fails, and the
    // next tick runs the command again (no digest was stored).
    for n in 1..=2 {
        let out = s.run(&["tick", "app"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
        let st = s.target_status("app");
        assert_eq!(st["last_result"], "failed");
        assert!(
            st["last_message"]
                .as_str()
                .unwrap_or("")
                .contains("exited with code 3"),
            "{st}"
        );
        assert_eq!(log_lines(&counter).len(), n);
    }
}

#[test]
fn timeout_kills_the_command_and_its_children() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("x", "1")], "first");
    let pidfile = root.path().join("child.pid");
    let s = Setup::new(&exec_target(
        "slow",
        &remote.url(),
        "timeout = \"2s\"",
        &format!(
            "apply = [\"sh\", \"-c\", \"sleep 300 & echo $! > {}; wait\"]",
            pidfile.display()
        ),
    ));
    let started = Instant::now();
    let out = s.run(&["tick", "slow"]);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(took < Duration::from_secs(30), "tick took {took:?}");
    let st = s.target_status("slow");
    let msg = st["last_message"].as_str().unwrap_or("");
    assert!(msg.contains("timed out after 2s"), "{msg}");
    assert!(msg.contains("process group"), "{msg}");
    let pid = std::fs::read_to_string(&pidfile).expect("pid file");
    let pid = pid.trim();
    // The grandchild (sleep 300) must be gone, not orphaned.
    wait_for(Duration::from_secs(10), "the child to die", || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // gone, or a zombie waiting for init to reap it
        stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z")
    });
}

#[test]
fn a_held_lock_exits_75_and_runs_nothing() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("x", "1")], "first");
    let marker = root.path().join("ran");
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "",
        &format!("apply = [\"touch\", \"{}\"]", marker.display()),
    ));
    let locks = s.state.join("locks");
    std::fs::create_dir_all(&locks).expect("mkdir");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(locks.join("app.lock"))
        .expect("open lock");
    f.try_lock().expect("take the lock");
    let out = s.run(&["tick", "app"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("busy"));
    assert!(!marker.exists());
    assert!(s.history("app").is_empty(), "a busy tick recorded a run");
    drop(f);
    assert_eq!(s.run(&["tick", "app"]).status.code(), Some(0));
    assert!(marker.exists());
}

#[test]
fn secrets_from_env_references_are_masked_in_records() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("x", "1")], "first");
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "",
        "apply = [\"sh\", \"-c\", \"echo token is $API_TOKEN; echo failing with $API_TOKEN >&2; exit 1\"]\n\
         env = { API_TOKEN = \"env:DRIFTLESS_TEST_TOKEN\" }",
    ));
    let secret = "canary-7f3a9c1e5b";
    let out = output_within(
        std::process::Command::new(bin())
            .args(["--config", s.config.to_str().expect("utf8"), "tick", "app"])
            .env("DRIFTLESS_TEST_TOKEN", secret),
        std::time::Duration::from_secs(300),
    );
    assert_eq!(out.status.code(), Some(1));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!all.contains(secret), "secret in CLI output: {all}");
    let runs = s.history("app");
    let dump = serde_json::to_string(&runs).expect("json");
    assert!(!dump.contains(secret), "secret in the run record: {dump}");
    assert!(dump.contains("token is [REDACTED]"), "{dump}");
    // And not in the database file at all.
    let db = std::fs::read(s.db()).expect("db");
    let wal = std::fs::read(s.state.join("driftless.db-wal")).unwrap_or_default();
    for bytes in [db, wal] {
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "secret stored in the state database"
        );
    }
}
