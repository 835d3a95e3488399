//! A run's whole output, kept (issue 48): every line its commands print,
//! redacted, bounded at 4 MiB a run, read by `driftless logs` and
//! `GET /api/v1/runs/{id}/output` — on SQLite and on PostgreSQL. Real
//! driftless, real commands, real git remotes.

use crate::common::*;

const SECRET: &str = "logs-canary-8d1f2e";
const KEY_LINE: &str = "MIIEowIBAAKCAQEAlogskeyline";
const READER: &str = "logs-reader-token-0001";
const OTHER: &str = "logs-other-token-0002";

/// Target `app` (exec) printing `lines` numbered lines to stdout, one to
/// stderr, the secret (an env value) and each line of a multi-line one,
/// then exiting `code`; tokens that may read `app` or only `other`.
fn setup(database: &str, root: &std::path::Path, lines: u32, code: u32) -> (Remote, Setup) {
    setup_with(
        database,
        root,
        &format!("i=1; while [ $i -le {lines} ]; do echo line $i; i=$((i+1)); done; "),
        code,
    )
}

/// As [`setup`], the numbered lines printed by `lines`.
fn setup_with(database: &str, root: &std::path::Path, lines: &str, code: u32) -> (Remote, Setup) {
    let remote = Remote::new(root, "infra");
    remote.commit(&[("v", "1")], "first");
    let script = format!(
        "{lines}echo to-stderr >&2; echo token=$TOKEN; printf '%s\\n' \"$KEY\"; exit {code}"
    );
    let s = Setup::new(&format!(
        "{database}{}{}{}",
        token_table("reader", READER, &["read:app"]),
        token_table("other", OTHER, &["read:other"]),
        exec_target(
            "app",
            &remote.url(),
            "interval = \"1h\"",
            &format!(
                "apply = [\"sh\", \"-c\", {}]\nenv = {{ TOKEN = \"env:LOGS_TOKEN\", KEY = \"env:LOGS_KEY\" }}",
                toml_str(&script)
            ),
        ),
    ));
    (remote, s)
}

fn tick(s: &Setup) -> std::process::Output {
    output_within(&mut tick_command(s), std::time::Duration::from_secs(120))
}

/// `driftless tick app` with the run's secrets in its environment.
fn tick_command(s: &Setup) -> std::process::Command {
    let mut c = std::process::Command::new(bin());
    c.arg("--config")
        .arg(&s.config)
        .args(["tick", "app"])
        .env("LOGS_TOKEN", SECRET)
        .env(
            "LOGS_KEY",
            format!("-----BEGIN KEY-----\n{KEY_LINE}\n-----END KEY-----"),
        );
    c
}

fn whole_output_kept(database: &str) {
    let root = tempfile::tempdir().expect("tempdir");
    let (_remote, s) = setup(database, root.path(), 3000, 0);
    assert!(tick(&s).status.success());

    let out = s.run(&["logs", "app"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let logs = text(&out.stdout);
    // Every line, in order, far past the 16 KiB tail a run keeps.
    let first = logs.find("line 1\n").expect("line 1");
    let last = logs.find("line 3000\n").expect("line 3000");
    assert!(first < last);
    assert_eq!(logs.matches("\nline ").count(), 3000);
    assert!(
        logs.starts_with("$ "),
        "the commands are named: {}",
        &logs[..200]
    );
    assert!(logs.contains("to-stderr\n") && logs.contains("token=[REDACTED]\n"));
    assert!(
        !logs.contains(SECRET) && !logs.contains(KEY_LINE),
        "a secret in the logs"
    );
    let tail = s.history("app")[0]["output_tail"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(!tail.contains("line 1\n") && tail.len() < logs.len());

    // The same through the API, for a caller who may read the target only.
    let intake = Intake::start(&s);
    let id = s.history("app")[0]["id"].as_i64().expect("run id");
    let path = format!("/api/v1/runs/{id}/output");
    let r = api_call(intake.port, "GET", &path, READER, &serde_json::Value::Null);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["output"], logs.as_str());
    assert_eq!(v["result"], "changed");
    let last_seq = v["last"].as_i64().expect("last");
    let r = api_call(
        intake.port,
        "GET",
        &format!("{path}?after={last_seq}"),
        READER,
        &serde_json::Value::Null,
    );
    assert_eq!(
        (r.json()["output"].clone(), r.json()["last"].clone()),
        ("".into(), last_seq.into())
    );
    let r = api_call(intake.port, "GET", &path, OTHER, &serde_json::Value::Null);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(!r.body.contains("line 1"));
}

#[test]
fn a_runs_whole_output_is_kept_redacted_and_read_by_logs_and_the_api() {
    whole_output_kept("");
}

#[test]
fn a_runs_whole_output_is_kept_on_postgres_too() {
    whole_output_kept(&postgres_table());
}

/// A failed run's logs say how its command ended and exit 1; a run that
/// prints more than 4 MiB keeps 4 MiB and says where it was cut.
#[test]
fn a_failed_runs_logs_exit_1_and_a_flood_is_cut_at_4_mib() {
    let root = tempfile::tempdir().expect("tempdir");
    let (remote, s) = setup("", root.path(), 3, 3);
    assert!(!tick(&s).status.success());
    let out = s.run(&["logs", "app"]);
    assert_eq!(out.status.code(), Some(1));
    let logs = text(&out.stdout);
    assert!(
        logs.contains("line 3\n") && logs.ends_with("[driftless: exit code 3]\n"),
        "{logs}"
    );
    let failed_run = s.history("app")[0]["id"].as_i64().expect("id");

    // 6 MB of output in one run.
    let cfg = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(
        &s.config,
        cfg.replacen("while [ $i -le 3 ]", "while [ $i -le 400000 ]", 1)
            .replacen("exit 3", "exit 0", 1),
    )
    .expect("config");
    remote.commit(&[("v", "2")], "flood");
    assert!(tick(&s).status.success());
    let out = s.run(&["logs", "app"]);
    assert_eq!(out.status.code(), Some(0));
    let logs = text(&out.stdout);
    assert!(
        logs.ends_with(
            "[driftless: output cut at 4 MiB; the rest of this run's output is not kept]\n"
        ),
        "{}",
        &logs[logs.len().saturating_sub(300)..]
    );
    assert!(logs.len() <= 4 * 1024 * 1024 + 100, "{}", logs.len());
    assert!(logs.contains("line 1\n"));
    assert!(!logs.contains("line 400000\n"));

    // An older run by its id; an id of no run of the target.
    let out = s.run(&["logs", "app", "--run", &failed_run.to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).ends_with("[driftless: exit code 3]\n"));
    let out = s.run(&["logs", "app", "--run", "999"]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(said.contains("target `app` has no run 999"), "{said}");
}

/// The daemon's runs keep their output as the one-shot tick's do (its
/// workers run a run's future on their own, smaller stacks).
#[test]
fn a_daemons_runs_keep_their_output_too() {
    let root = tempfile::tempdir().expect("tempdir");
    let (_remote, s) = setup("", root.path(), 5, 0);
    let d = Daemon::start_with_env(
        &s.config,
        s.path(),
        &[
            ("LOGS_TOKEN", SECRET),
            (
                "LOGS_KEY",
                "-----BEGIN KEY-----\nMIIEowIBAAKCAQEAlogskeyline\n-----END KEY-----",
            ),
        ],
    );
    wait_for(std::time::Duration::from_secs(60), "the first run", || {
        s.history("app")
            .first()
            .is_some_and(|r| r["result"] == "changed")
    });
    let out = s.run(&["logs", "app"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let logs = text(&out.stdout);
    assert!(
        logs.contains("line 5\n") && logs.contains("token=[REDACTED]\n"),
        "{logs}"
    );
    drop(d);
}

/// The id of `app`'s first run, once it has begun.
fn first_run(s: &Setup) -> i64 {
    let mut id = None;
    wait_for(
        std::time::Duration::from_secs(60),
        "the run to begin",
        || {
            id = s.history("app").first().and_then(|r| r["id"].as_i64());
            id.is_some()
        },
    );
    id.expect("run id")
}

/// Following a running run (`?follow=1`): its lines arrive while it goes,
/// each chunk an event numbered by its chunk; a reader that reconnects with
/// `Last-Event-ID` gets the rest without a duplicate, then the end with the
/// result, and the stream closes. Redacted as the kept output is. `serve`
/// is the instance the reader asks; `run` starts the run (the same daemon,
/// or another process on the same database).
fn follow_a_running_run(database: &str, other_process: bool) {
    let root = tempfile::tempdir().expect("tempdir");
    // Eight lines half a second apart: about four seconds of run.
    let (_remote, s) = setup_with(
        database,
        root.path(),
        "i=1; while [ $i -le 8 ]; do echo slow $i; sleep 0.5; i=$((i+1)); done; ",
        0,
    );
    let env = [
        ("LOGS_TOKEN", SECRET.to_string()),
        (
            "LOGS_KEY",
            format!("-----BEGIN KEY-----\n{KEY_LINE}\n-----END KEY-----"),
        ),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // The reader's instance: a daemon that runs `app` itself, or one that
    // only serves while a one-shot tick (another process) runs it.
    let (port, _daemon, _intake, mut tick) = if other_process {
        let intake = Intake::start(&s);
        let tick = tick_command(&s)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("tick");
        (intake.port, None, Some(intake), Some(tick))
    } else {
        let d = Daemon::start_with_env(&s.config, s.path(), &env);
        (d.port, Some(d), None, None)
    };
    let id = first_run(&s);
    // `driftless logs -f` beside the stream: into a pipe, and on a
    // terminal (util-linux's `script` gives it one) with its progress line.
    let piped = spawn_logs_follower(&s, false);
    let tty = spawn_logs_follower(&s, true);
    let path = format!("/api/v1/runs/{id}/output?follow=1");
    let auth = format!("Bearer {READER}");
    let within = std::time::Duration::from_secs(30);

    let mut first = sse_get(port, &path, &[("Authorization", &auth)]).open();
    // A second reader of the same run at the same time, read at the end
    // (the readers of one run share what is read for them).
    let mut beside = sse_get(port, &path, &[("Authorization", &auth)]).open();
    let mut got = Vec::new();
    while !got.iter().any(|e: &SseEvent| e.data.contains("slow 2\n")) {
        let e = first.next_event(within).expect("an event");
        assert_eq!(e.event, "output", "{e:?}");
        got.push(e);
    }
    let running = s.history("app")[0]["result"].clone();
    assert!(
        running.is_null(),
        "line 2 arrived only after the run ended ({running})"
    );
    drop(first);
    let last = got.last().and_then(|e| e.id.clone()).expect("an id");
    let mut second = sse_get(
        port,
        &path,
        &[("Authorization", &auth), ("Last-Event-ID", &last)],
    )
    .open();
    let end = loop {
        let e = second.next_event(within).expect("an event");
        if e.event == "end" {
            break e;
        }
        assert_eq!(e.event, "output", "{e:?}");
        got.push(e);
    };
    assert_eq!(
        second.next_event(within),
        None,
        "the stream closes after its end"
    );
    let end: serde_json::Value = serde_json::from_str(&end.data).expect("end is JSON");
    assert_eq!(
        (end["run"].as_i64(), end["result"].as_str()),
        (Some(id), Some("changed"))
    );

    // Numbered 1, 2, … with neither a gap nor a repeat across the two
    // connections, and together exactly what was kept.
    let ids: Vec<i64> = got
        .iter()
        .map(|e| {
            e.id.as_deref()
                .and_then(|i| i.parse().ok())
                .expect("numbered")
        })
        .collect();
    assert_eq!(ids, (1..=ids.len() as i64).collect::<Vec<_>>());
    assert!(ids.len() >= 3, "the output came in one piece: {ids:?}");
    let streamed: String = got.iter().map(|e| e.data.as_str()).collect();
    let kept = api_call(
        port,
        "GET",
        &format!("/api/v1/runs/{id}/output"),
        READER,
        &serde_json::Value::Null,
    );
    assert_eq!(streamed, kept.json()["output"].as_str().expect("output"));
    assert!(streamed.contains("slow 8\n") && streamed.contains("token=[REDACTED]\n"));
    assert!(!streamed.contains(SECRET) && !streamed.contains(KEY_LINE));

    let mut together = String::new();
    while let Some(e) = beside.next_event(within) {
        if e.event == "output" {
            together.push_str(&e.data);
        }
    }
    assert_eq!(
        together, streamed,
        "two readers of one run saw different output"
    );

    // A finished run: everything, the end, closed — at once.
    let mut again = sse_get(port, &path, &[("Authorization", &auth)]).open();
    let mut events = Vec::new();
    while let Some(e) = again.next_event(within) {
        events.push(e);
    }
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("end"));
    assert_eq!(events.len(), ids.len() + 1);

    // Another target's reader, a bad resume point, a bad flag.
    let other = format!("Bearer {OTHER}");
    match sse_get(port, &path, &[("Authorization", &other)]) {
        Sse::Refused { status, body } => assert!(status == 403 && !body.contains("slow"), "{body}"),
        Sse::Open(_) => panic!("another target's token follows app's run"),
    }
    match sse_get(
        port,
        &path,
        &[("Authorization", &auth), ("Last-Event-ID", "x")],
    ) {
        Sse::Refused { status, body } => {
            assert!(status == 400 && body.contains("Last-Event-ID"), "{body}")
        }
        Sse::Open(_) => panic!("a bad Last-Event-ID was taken"),
    }
    let r = api_call(
        port,
        "GET",
        &format!("/api/v1/runs/{id}/output?follow=maybe"),
        READER,
        &serde_json::Value::Null,
    );
    assert!(r.status == 400 && r.body.contains("`follow`"), "{}", r.body);
    if let Some(t) = tick.as_mut() {
        assert!(t.wait().expect("tick").success());
    }

    // To the second, as history shows it: the lines come ~3 s before.
    let finished = s.history("app")[0]["finished_at"]
        .as_str()
        .and_then(|t| humantime::parse_rfc3339(t).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
        .expect("finished");
    let (out, err, second_line_at) = piped.join().expect("logs -f");
    assert!(
        second_line_at.is_some_and(|at| at < finished),
        "logs -f printed `slow 2` at {second_line_at:?}, the run ended at {finished}"
    );
    assert_eq!(out, streamed, "logs -f printed what was kept");
    assert!(err.contains(&format!("run {id}: changed")), "{err}");
    let (screen, _, _) = tty.join().expect("logs -f on a terminal");
    assert!(
        screen.contains("slow 8") && screen.contains("running 0m0") && screen.contains(" lines"),
        "{screen}"
    );
}

/// `driftless logs app -f`, its stdout read as it comes: (stdout, stderr,
/// when `slow 2` arrived in ms since the epoch). On a terminal (`tty`),
/// stdout and stderr are the terminal's one stream.
fn spawn_logs_follower(
    s: &Setup,
    tty: bool,
) -> std::thread::JoinHandle<(String, String, Option<i64>)> {
    use std::io::BufRead;
    let mut c = if tty {
        let mut c = std::process::Command::new("script");
        let line = format!(
            "{} --config {} logs app -f",
            bin().display(),
            s.config.display()
        );
        c.args(["-qefc", &line, "/dev/null"]);
        c
    } else {
        let mut c = std::process::Command::new(bin());
        c.arg("--config").arg(&s.config).args(["logs", "app", "-f"]);
        c
    };
    let mut child = c
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("logs -f");
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        let mut out = String::new();
        let mut at = None;
        let mut lines = std::io::BufReader::new(stdout);
        let mut line = String::new();
        while lines.read_line(&mut line).unwrap_or(0) > 0 {
            if at.is_none() && line.contains("slow 2") {
                at = Some(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as i64),
                );
            }
            out.push_str(&line);
            line.clear();
        }
        let done = child.wait_with_output().expect("logs -f ends");
        assert!(done.status.success(), "logs -f: {:?}", done.status);
        (out, text(&done.stderr), at)
    })
}

#[test]
fn a_running_runs_output_is_followed_live_and_resumed_without_duplicates() {
    follow_a_running_run("", false);
}

/// On PostgreSQL the reader asks an instance that is not running the
/// command: the database relays the chunks.
#[test]
fn a_run_on_another_instance_is_followed_through_postgres() {
    follow_a_running_run(&postgres_table(), true);
}

/// A daemon told to stop closes its followers at once — it does not hold
/// its shutdown open for them while it lets the running apply finish.
#[test]
fn a_stopping_daemon_closes_its_followers_at_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let (_remote, s) = setup_with(
        "",
        root.path(),
        "i=1; while [ $i -le 8 ]; do echo slow $i; sleep 0.5; i=$((i+1)); done; ",
        0,
    );
    let d = Daemon::start_with_env(
        &s.config,
        s.path(),
        &[("LOGS_TOKEN", SECRET), ("LOGS_KEY", KEY_LINE)],
    );
    let path = format!("/api/v1/runs/{}/output?follow=1", first_run(&s));
    let auth = format!("Bearer {READER}");
    let mut reader = sse_get(d.port, &path, &[("Authorization", &auth)]).open();
    let first = reader
        .next_event(std::time::Duration::from_secs(30))
        .expect("an event");
    assert_eq!(first.event, "output");
    let (tx, rx) = std::sync::mpsc::channel();
    let watcher = std::thread::spawn(move || {
        let mut last = first;
        while let Some(e) = reader.next_event(std::time::Duration::from_secs(60)) {
            last = e;
        }
        let _ = tx.send(std::time::Instant::now());
        last
    });
    let told = std::time::Instant::now();
    let stopped = std::thread::spawn(move || d.stop());
    let closed = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the stream closed");
    let last = watcher.join().expect("watcher");
    assert!(
        closed.duration_since(told) < std::time::Duration::from_millis(1500) && last.event != "end",
        "the stream stayed open {:?} after the stop, until {last:?}",
        closed.duration_since(told)
    );
    assert!(stopped.join().expect("stop").success());
    // The apply the daemon let finish is recorded whole.
    assert_eq!(s.history("app")[0]["result"], "changed");
}

/// A followed run that repeats the unchanged run before it is folded into
/// that row when it ends (history keeps one row per streak): its stream
/// ends naming that row, `folded`, with the output it printed, and
/// `logs -f` ends with that row's result.
#[test]
fn a_followed_run_folded_into_its_streak_ends_naming_the_streak() {
    const OPS: &str = "logs-ops-token-0003";
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("v", "1")], "first");
    // Exit 3 is exec's `no_change`.
    let script = "i=1; while [ $i -le 4 ]; do echo slow $i; sleep 0.5; i=$((i+1)); done; exit 3";
    let s = Setup::new(&format!(
        "{}{}",
        token_table("ops", OPS, &["read", "reconcile:*"]),
        exec_target(
            "app",
            &remote.url(),
            "interval = \"1h\"",
            &format!(
                "apply = [\"sh\", \"-c\", {}]\nalways = true",
                toml_str(script)
            ),
        ),
    ));
    let d = Daemon::start(&s);
    let newest = || s.history("app").first().cloned().unwrap_or_default();
    let reconcile = || {
        let r = api_call(
            d.port,
            "POST",
            "/api/v1/targets/app/reconcile?wait=60s",
            OPS,
            &serde_json::Value::Null,
        );
        assert_eq!(r.status, 200, "{}", r.body);
    };
    wait_for(std::time::Duration::from_secs(60), "the first run", || {
        newest()["result"] == "no_change"
    });
    // The streak's row: the first manual run.
    reconcile();
    let streak = newest();
    assert_eq!(
        (&streak["trigger"], &streak["result"]),
        (&"manual".into(), &"no_change".into())
    );
    let streak = streak["id"].as_i64().expect("id");
    // The same again, followed while it goes.
    let port = d.port;
    let again = std::thread::spawn(move || {
        api_call(
            port,
            "POST",
            "/api/v1/targets/app/reconcile",
            OPS,
            &serde_json::Value::Null,
        )
    });
    let mut id = None;
    wait_for(std::time::Duration::from_secs(30), "the third run", || {
        let n = newest();
        id = n["id"]
            .as_i64()
            .filter(|i| *i > streak && n["result"].is_null());
        id.is_some()
    });
    let id = id.expect("id");
    assert_eq!(again.join().expect("join").status, 202);
    let follower = spawn_logs_follower(&s, false);
    let auth = format!("Bearer {OPS}");
    let mut stream = sse_get(
        d.port,
        &format!("/api/v1/runs/{id}/output?follow=1"),
        &[("Authorization", &auth)],
    )
    .open();
    let mut output = String::new();
    let end = loop {
        let e = stream
            .next_event(std::time::Duration::from_secs(30))
            .expect("an event");
        match e.event.as_str() {
            "output" => output.push_str(&e.data),
            "end" => break e,
            other => panic!("{other}: {e:?}"),
        }
    };
    let end: serde_json::Value = serde_json::from_str(&end.data).expect("json");
    assert_eq!(
        (&end["run"], &end["result"], &end["folded"]),
        (&streak.into(), &"no_change".into(), &true.into()),
        "{end}"
    );
    assert!(output.contains("slow 4\n"), "{output}");
    assert_eq!(
        s.history("app")
            .iter()
            .filter(|r| r["trigger"] == "manual")
            .count(),
        1,
        "the run was not folded"
    );
    let (_, err, _) = follower.join().expect("logs -f");
    assert!(err.contains(&format!("run {streak}: no_change")), "{err}");
}
