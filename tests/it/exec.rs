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

/// An exec target with a `plan` command under `policy = "approval"`: the
/// plan waits and nothing runs until it is approved; an approved plan is
/// planned again before `apply` and applied only if it is still the same
/// (someone changed the world meanwhile: refused, nothing applied, held
/// until `driftless retry`, whose new plan waits for its own approval).
#[test]
fn an_exec_plan_waits_for_approval_and_a_plan_that_changed_is_not_applied() {
    const OPS: &str = "ops-token-exec-77d1";
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/desired.txt", "v1\n")], "first");
    let world = root.path().join("world.txt");
    let plan = "if [ -f \\\"$WORLD\\\" ] && cmp -s desired.txt \\\"$WORLD\\\"; then exit 0; fi; \
                if [ -f \\\"$WORLD\\\" ]; then echo \\\"~ file world.txt (update from $(cat \\\"$WORLD\\\"))\\\"; \
                else echo '+ file world.txt (create)'; fi";
    let s = Setup::new(&format!(
        "{}{}",
        token_table("ops", OPS, &["approve:app", "read"]),
        exec_target(
            "app",
            &remote.url(),
            "path = \"app\"\npolicy = \"approval\"",
            &format!(
                "apply = [\"sh\", \"-c\", \"cp desired.txt \\\"$WORLD\\\"\"]\n\
                 plan = [\"sh\", \"-c\", \"{plan}\"]\nenv = {{ WORLD = {} }}",
                toml_str(&world.display().to_string())
            ),
        )
    ));
    let tick = |args: &[&str]| {
        let out = s.run(args);
        (out.status.code(), text(&out.stdout) + &text(&out.stderr))
    };
    let intake = Intake::start(&s);
    let who = Approver {
        port: intake.port,
        token: OPS,
    };
    let pending = || who.pending();
    let approve = |p: &serde_json::Value| {
        who.approve(p);
    };
    let read = || std::fs::read_to_string(&world).ok();

    let (code, out) = tick(&["tick", "app"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("waits for approval: 1 to add, 0 to change, 0 to destroy"),
        "{out}"
    );
    assert_eq!(read(), None, "applied before approval");
    let p1 = pending();
    assert_eq!(
        (&p1[0]["backend"], &p1[0]["diff"]),
        (&"exec".into(), &"+ file world.txt (create)".into()),
        "{p1:?}"
    );
    approve(&p1[0]);
    let (code, out) = tick(&["tick", "app"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("app: changed"), "{out}");
    assert_eq!(read().as_deref(), Some("v1\n"));

    remote.commit(&[("app/desired.txt", "v2\n")], "v2");
    tick(&["tick", "app"]);
    let p2 = pending();
    assert_eq!(p2[0]["diff"], "~ file world.txt (update from v1)", "{p2:?}");
    // Someone changes the world after the plan was made.
    std::fs::write(&world, "by hand\n").expect("write");
    approve(&p2[0]);
    let (code, out) = tick(&["tick", "app"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("the plan changed since it was approved"),
        "{out}"
    );
    assert_eq!(
        read().as_deref(),
        Some("by hand\n"),
        "a changed plan was applied"
    );
    let (code, out) = tick(&["tick", "app"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("`driftless retry app`"), "{out}");
    assert!(pending().is_empty());

    let (code, out) = tick(&["retry", "app"]);
    assert_eq!(code, Some(0), "{out}");
    let p3 = pending();
    assert_eq!(
        p3[0]["diff"], "~ file world.txt (update from by hand)",
        "{p3:?}"
    );
    approve(&p3[0]);
    let (code, out) = tick(&["tick", "app"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(read().as_deref(), Some("v2\n"));
}

/// A secret a `plan` command prints (an `env:` value) is masked wherever
/// the plan goes: the stored plan and the API, the page, the owners'
/// `pending_approval` notification, the log and the state database.
#[test]
fn a_secret_in_a_plan_reaches_no_one() {
    const CANARY: &str = "plan-canary-secret-0c5e7d";
    const OPS: &str = "ops-token-exec-canary-41";
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/x", "1")], "first");
    let sink = Service::http_sink(root.path(), 0);
    let s = Setup::new(&format!(
        "[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n{}{}",
        sink.port,
        token_table("ops", OPS, &["approve:app", "read"]),
        exec_target(
            "app",
            &remote.url(),
            "path = \"app\"\npolicy = \"approval\"\nnotify = [\"hook\"]",
            "apply = [\"true\"]\nplan = [\"sh\", \"-c\", \"echo \\\"~ token (now $API_TOKEN)\\\"\"]\n\
             env = { API_TOKEN = \"env:TEST_PLAN_CANARY\" }",
        )
    ));
    let out = output_within(
        std::process::Command::new(bin())
            .args(["--config", s.config.to_str().expect("utf8"), "tick", "app"])
            .env("TEST_PLAN_CANARY", CANARY)
            .env("RUST_LOG", "debug"),
        Duration::from_secs(120),
    );
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(said.contains("waits for approval"), "{said}");
    wait_for(Duration::from_secs(30), "the notification", || {
        !sink.requests().is_empty()
    });
    let intake = Intake::start(&s);
    let api = api_call(
        intake.port,
        "GET",
        "/api/v1/deployments",
        OPS,
        &serde_json::Value::Null,
    );
    assert!(
        api.body.contains("~ token (now [REDACTED])"),
        "{}",
        api.body
    );
    let page = http(
        intake.port,
        "GET",
        "/",
        &[("Authorization", &format!("Bearer {OPS}"))],
        b"",
    );
    assert!(page.body.contains("[REDACTED]"), "{}", page.body);
    // The hash people see is keyed per installation: the same plan in
    // another state directory has another plan_hash, so a hash says nothing
    // about the plan text (or a secret in it) that it was made from.
    let listed = api.json();
    let other = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "path = \"app\"\npolicy = \"approval\"",
        "apply = [\"true\"]\nplan = [\"sh\", \"-c\", \"echo \\\"~ token (now $API_TOKEN)\\\"\"]\n\
         env = { API_TOKEN = \"env:TEST_PLAN_CANARY\" }",
    ));
    let out = output_within(
        std::process::Command::new(bin())
            .args([
                "--config",
                other.config.to_str().expect("utf8"),
                "plan",
                "app",
                "--json",
            ])
            .env("TEST_PLAN_CANARY", CANARY),
        Duration::from_secs(120),
    );
    let there: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plan --json");
    assert_eq!(there["diff"], listed[0]["diff"], "{there}");
    assert_ne!(there["plan_hash"], listed[0]["plan_hash"], "{there}");
    let db = std::fs::read(s.db()).expect("db");
    let wal = std::fs::read(s.state.join("driftless.db-wal")).unwrap_or_default();
    let notified: String = sink.requests().iter().map(|r| r.to_string()).collect();
    for (what, seen) in [
        ("the CLI and the log", said),
        ("the API", api.body),
        ("the page", page.body),
        ("the notification", notified),
        ("the database", String::from_utf8_lossy(&db).into_owned()),
        (
            "the database's WAL",
            String::from_utf8_lossy(&wal).into_owned(),
        ),
    ] {
        assert!(!seen.contains(CANARY), "the secret reached {what}");
    }
}

/// The same plan mechanism under the other policies, on exec: `detect`
/// reports what the plan says and never runs `apply`, and under `approval`
/// a commit elsewhere in the repository carries the waiting plan along
/// while a newer commit of the target's files supersedes it (its approval
/// refused with 409), whose successor waits in its place.
#[test]
fn an_exec_detect_target_never_applies_and_a_newer_commit_supersedes_a_waiting_plan() {
    const OPS: &str = "ops-token-exec-supersede-5";
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/v", "1\n")], "first");
    let applied = root.path().join("applied.log");
    let backend = format!(
        "apply = [\"sh\", \"-c\", \"cat v >> {}\"]\nplan = [\"sh\", \"-c\", \"echo \\\"~ v (to $(cat v))\\\"\"]",
        applied.display()
    );
    let s = Setup::new(&format!(
        "{}{}{}",
        token_table("ops", OPS, &["approve:gated", "read"]),
        exec_target(
            "watch",
            &remote.url(),
            "path = \"app\"\npolicy = \"detect\"",
            &backend
        ),
        exec_target(
            "gated",
            &remote.url(),
            "path = \"app\"\npolicy = \"approval\"",
            &backend
        ),
    ));
    let tick = |t: &str| {
        let out = s.run(&["tick", t]);
        let said = text(&out.stdout) + &text(&out.stderr);
        assert!(out.status.success(), "{said}");
        said
    };
    for _ in 0..2 {
        let said = tick("watch");
        assert!(said.contains("drift at"), "{said}");
    }
    assert!(
        s.target_status("watch")["drift"]
            .as_str()
            .is_some_and(|d| d.contains("~ v (to 1)")),
        "{}",
        s.target_status("watch")
    );
    assert!(!applied.exists(), "detect applied");

    tick("gated");
    let intake = Intake::start(&s);
    let who = Approver {
        port: intake.port,
        token: OPS,
    };
    let first = who.pending();
    assert_eq!(first[0]["diff"], "~ v (to 1)", "{first:?}");
    // A commit elsewhere in the repository leaves the target's files as
    // they were: the waiting plan is carried to it, not superseded, and
    // nobody is asked again.
    let elsewhere = remote.commit(&[("docs/readme", "hello\n")], "docs");
    tick("gated");
    let carried = who.pending();
    assert_eq!(carried.len(), 1, "{carried:?}");
    assert_eq!(
        (
            &carried[0]["id"],
            &carried[0]["plan_hash"],
            &carried[0]["commit"]
        ),
        (
            &first[0]["id"],
            &first[0]["plan_hash"],
            &elsewhere.clone().into()
        ),
        "{carried:?}"
    );
    let id = first[0]["id"].as_i64().expect("id");
    let states = || -> Vec<String> {
        sql_rows(
            &s.db(),
            &format!(
                "SELECT to_state FROM deployment_events WHERE deployment_id = {id} ORDER BY id"
            ),
        )
        .iter()
        .map(|r| r["to_state"].as_str().unwrap_or("").to_string())
        .collect()
    };
    assert_eq!(states(), ["pending_approval", "pending_approval"]);
    remote.commit(&[("app/v", "2\n")], "second");
    tick("gated");
    let second = who.pending();
    assert_eq!(second.len(), 1, "{second:?}");
    assert_eq!(second[0]["diff"], "~ v (to 2)");
    assert_eq!(
        states(),
        ["pending_approval", "pending_approval", "superseded"]
    );
    let late = api_call(
        intake.port,
        "POST",
        &format!("/api/v1/deployments/{id}/approve"),
        OPS,
        &serde_json::json!({ "plan_hash": first[0]["plan_hash"] }),
    );
    assert_eq!(late.status, 409, "{}", late.body);
    assert!(late.body.contains("superseded"), "{}", late.body);
    who.approve(&second[0]);
    tick("gated");
    assert_eq!(
        log_lines(&applied),
        ["2"],
        "only the newer commit's plan is applied"
    );
}

/// With no daemon (ticks from a systemd timer), one-shot ticks prune the
/// history older than `[history] keep` every ten minutes: the runs past it
/// go, but the target's last run and the run that last changed it stay.
#[test]
fn one_shot_ticks_prune_the_history_now_and_then() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let s = Setup::new(&format!(
        "[history]\nkeep = \"1s\"\n\n{}",
        exec_target("app", &remote.url(), "path = \"app\"", "apply = [\"true\"]")
    ));
    for v in ["v1", "v2", "v3"] {
        remote.commit(&[("app/config", v)], v);
        let out = s.run(&["tick", "app"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let ids = |s: &Setup| -> Vec<i64> {
        s.history("app")
            .iter()
            .map(|r| r["id"].as_i64().expect("id"))
            .collect()
    };
    assert_eq!(ids(&s), [3, 2, 1], "pruned before ten minutes passed");
    std::thread::sleep(Duration::from_millis(1200));
    // Ten minutes on since the last prune.
    let mark = s.state.join("history.pruned");
    std::fs::File::options()
        .write(true)
        .open(&mark)
        .and_then(|f| f.set_modified(std::time::SystemTime::now() - Duration::from_secs(601)))
        .expect("the prune mark is there, and older");
    let out = s.run(&["tick", "app"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(ids(&s), [4, 3], "the last run and the last change stay");
}

/// What a repository's command prints cannot drive the terminal of whoever
/// reads it: escape sequences (colours, a screen clear, a window title)
/// and carriage returns are taken out of the run's message and output
/// tail as stored, of a plan, and of everything the CLI prints.
#[test]
fn a_commands_terminal_escapes_are_neither_stored_nor_printed() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            (
                "app/apply.sh",
                "printf 'ok\\033[2J\\033]0;pwned\\007 done\\r\\n'\n\
                 printf 'bad\\033[31m red\\rhidden\\n' >&2\nexit 1\n",
            ),
            (
                "app/plan.sh",
                "printf '+ \\033[1mthing\\033[0m (create)\\033]8;;http://x\\033\\\\\\n'\n",
            ),
        ],
        "first",
    );
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "path = \"app\"",
        "apply = [\"sh\", \"apply.sh\"]\nplan = [\"sh\", \"plan.sh\"]",
    ));
    let esc = |what: &str, s: &str| {
        assert!(
            !s.contains('\u{1b}') && !s.contains('\r') && !s.contains('\u{7}'),
            "{what} carries a control character: {s:?}"
        );
    };
    let out = s.run(&["tick", "app"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    esc("tick's output", &(text(&out.stdout) + &text(&out.stderr)));
    let st = s.target_status("app");
    let message = st["last_message"].as_str().unwrap_or("").to_string();
    esc("the stored message", &message);
    // A lone carriage return is a line break: what it would have hidden
    // is shown.
    assert!(message.contains("hidden"), "{message:?}");
    let runs = s.history("app");
    let tail = runs[0]["output_tail"].as_str().unwrap_or("").to_string();
    esc("the stored output", &tail);
    assert!(
        tail.contains("ok done") && tail.contains("bad red\nhidden"),
        "{tail:?}"
    );
    for args in [
        &["history", "app"][..],
        &["status"][..],
        &["plan", "app"][..],
    ] {
        let out = s.run(args);
        let all = text(&out.stdout) + &text(&out.stderr);
        esc(&args.join(" "), &all);
        if args[0] == "plan" {
            assert!(all.contains("+ thing (create)"), "{all}");
        }
    }
}
