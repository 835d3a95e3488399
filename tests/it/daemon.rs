//! The daemon and its queue, through the real `driftless serve`: requests
//! folded while a target runs, targets in parallel, recovery after
//! `kill -9`, and no overlapping applies of one target against concurrent
//! one-shot ticks.

use std::time::Duration;

use crate::common::*;
use driftless::model::Trigger;
use driftless::queue::{Queue, Request};
use driftless::store::Store;

fn idle(s: &Setup, name: &str) -> bool {
    let st = s.target_status(name);
    st["queued"] == false && st["running"] == false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_requests_while_running_give_one_more_apply_at_the_newest_sha() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/v", "0")], "first");
    let log = root.path().join("applies.log");
    let gate = root.path().join("release");
    // Each apply records the commit it sees, then waits for the gate.
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "path = \"app\"\ninterval = \"1h\"",
        &format!(
            "apply = [\"sh\", \"-c\", \"echo start $(git rev-parse HEAD) >> {log}; \
             i=0; while [ ! -f {gate} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; \
             echo end >> {log}\"]\nalways = true",
            log = log.display(),
            gate = gate.display()
        ),
    ));
    let daemon = s.serve();
    // The first interval tick of a never-run target starts at once.
    wait_for(Duration::from_secs(20), "the first apply to start", || {
        log_lines(&log).len() == 1
    });

    let queue = Queue::new(
        Store::open(&s.db())
            .await
            .expect("open the daemon's database"),
    );
    let mut newest = String::new();
    for i in 1..=50 {
        newest = remote.commit(&[("app/v", &i.to_string())], &format!("push {i}"));
        queue
            .enqueue(&Request {
                target: "app".into(),
                trigger: Trigger::Webhook,
                sha: Some(newest.clone()),
                delivery_id: Some(format!("delivery-{i}")),
                receiver: None,
            })
            .await
            .expect("enqueue");
    }
    std::fs::write(&gate, "go").expect("open the gate");
    wait_for(Duration::from_secs(30), "the queue to drain", || {
        log_lines(&log).iter().filter(|l| *l == "end").count() >= 2 && idle(&s, "app")
    });
    // Nothing else is waiting: the fifty requests were folded into one job
    // beside the first, and both are done.
    let all = sql_rows(&s.db(), "SELECT id, state FROM jobs WHERE target = 'app'");
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all.iter().all(|j| j["state"] == "done"), "{all:?}");
    let lines = log_lines(&log);
    let starts: Vec<&String> = lines.iter().filter(|l| l.starts_with("start")).collect();
    assert_eq!(
        starts.len(),
        2,
        "expected exactly one more apply: {lines:?}"
    );
    assert_eq!(*starts[1], format!("start {newest}"));
    let runs = s.history("app");
    assert_eq!(runs[0]["sha"], newest);
    assert_eq!(runs[0]["requested_sha"], newest);
    assert_eq!(runs[0]["trigger"], "webhook");
    assert_eq!(runs[0]["delivery_id"], "delivery-50");
    // Every delivery id is on record in the job that ran.
    let ids: String = sqlx::query_scalar("SELECT delivery_ids FROM jobs WHERE run_id = $1")
        .bind(runs[0]["id"].as_i64().expect("run id"))
        .fetch_one(queue.store().pool())
        .await
        .expect("job row");
    let ids: Vec<String> = serde_json::from_str(&ids).expect("json");
    assert_eq!(ids.len(), 50);
    assert_eq!(ids[0], "delivery-1");
    drop(daemon);
}

#[test]
fn two_targets_converge_at_the_same_time() {
    // Each apply says it started, then waits (up to 30 s) for the other to
    // have started too: both succeed only if they run at the same time,
    // however slowly the machine starts them.
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("x", "1")], "first");
    let mut targets = String::new();
    for (name, other) in [("left", "right"), ("right", "left")] {
        let mark = |n: &str| root.path().join(format!("{n}.started"));
        targets.push_str(&exec_target(
            name,
            &remote.url(),
            "interval = \"1h\"",
            &format!(
                "apply = [\"sh\", \"-c\", \"touch {me}; i=0; \
                 while [ ! -f {other} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; \
                 [ -f {other} ]\"]\nalways = true",
                me = mark(name).display(),
                other = mark(other).display()
            ),
        ));
    }
    let s = Setup::new(&targets);
    let daemon = s.serve();
    wait_for(Duration::from_secs(60), "both applies", || {
        ["left", "right"]
            .iter()
            .all(|t| !s.target_status(t)["last_result"].is_null())
    });
    for t in ["left", "right"] {
        let st = s.target_status(t);
        assert_eq!(
            st["last_result"], "changed",
            "{t} did not run beside the other: {st}"
        );
    }
    drop(daemon);
}

#[test]
fn kill_9_mid_apply_then_restart_runs_the_job_again() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let sha = remote.commit(&[("x", "1")], "first");
    let log = root.path().join("apply.log");
    // The command writes to its stdout and stderr after the daemon is gone
    // (with pipes it would die of SIGPIPE there and never say "finished"),
    // and stamps each line with the time.
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "interval = \"1h\"",
        &format!(
            "apply = [\"sh\", \"-c\", \"echo started $(date +%s.%N) >> {l}; sleep 5; \
             echo to stdout after the kill; echo to stderr after the kill >&2; \
             echo finished $(date +%s.%N) >> {l}\"]",
            l = log.display()
        ),
    ));
    let daemon = s.serve();
    wait_for(Duration::from_secs(20), "the apply to start", || {
        log_lines(&log).len() == 1
    });
    daemon.kill9();
    // Restart at once: the orphaned command still holds the target's lock,
    // so the restarted daemon must wait for it, then run the job again.
    let daemon = s.serve();
    let up = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    wait_for(
        Duration::from_secs(60),
        "the job to run again and finish",
        || log_lines(&log).len() >= 4 && idle(&s, "app"),
    );
    let lines = log_lines(&log);
    let kinds: Vec<&str> = lines
        .iter()
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(
        kinds,
        ["started", "finished", "started", "finished"],
        "the orphan died or the rerun overlapped it: {lines:?}"
    );
    let at = |i: usize| -> f64 {
        lines[i]
            .split_whitespace()
            .nth(1)
            .and_then(|t| t.parse().ok())
            .expect("a time stamp")
    };
    // The restarted daemon was up while the orphan still ran (so it had to
    // wait for it), and started the rerun only after the orphan finished.
    assert!(
        up < at(1),
        "the restart came after the orphan finished: the waiting path never ran"
    );
    assert!(
        at(2) >= at(1),
        "the rerun started before the orphan finished: {lines:?}"
    );
    let runs = s.history("app");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0]["result"], "changed");
    assert_eq!(runs[0]["sha"], sha);
    assert_eq!(runs[1]["result"], "interrupted");
    assert_eq!(runs[0]["trigger"], "interval");
    let st = s.target_status("app");
    assert_eq!(st["last_applied_sha"], sha);
    assert!(
        daemon.log_text().contains("requeued jobs"),
        "{}",
        daemon.log_text()
    );
    let status = daemon.stop();
    assert!(
        status.success(),
        "daemon did not stop cleanly on SIGTERM: {status}"
    );
}

/// Check a log of "start PID" / "end PID" lines: strictly alternating, each
/// end matching the start before it. Returns the number of applies.
fn assert_no_overlap(name: &str, lines: &[String]) -> usize {
    let mut open: Option<&str> = None;
    let mut n = 0;
    for (i, l) in lines.iter().enumerate() {
        let (kind, pid) = l.split_once(' ').unwrap_or((l, ""));
        match (kind, open) {
            ("start", None) => open = Some(pid),
            ("end", Some(p)) if p == pid => {
                open = None;
                n += 1;
            }
            _ => panic!(
                "{name}: overlapping or torn applies at line {i}: {:?}",
                &lines[i.saturating_sub(3)..(i + 2).min(lines.len())]
            ),
        }
    }
    assert!(open.is_none(), "{name}: an apply started and never ended");
    n
}

#[test]
fn no_two_applies_of_one_target_ever_overlap() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("x", "1")], "first");
    let (token, digest) = driftless::auth::new_token().expect("token");
    let mut targets = format!(
        "[[tokens]]\nname = \"ops\"\nsha256 = \"{digest}\"\nscopes = [\"reconcile:*\"]\n\n"
    );
    for name in ["a", "b"] {
        let log = root.path().join(format!("{name}.log"));
        targets.push_str(&exec_target(
            name,
            &remote.url(),
            "interval = \"1h\"",
            &format!(
                "apply = [\"sh\", \"-c\", \"echo start $$ >> {l}; sleep 0.05; echo end $$ >> {l}\"]\nalways = true",
                l = log.display()
            ),
        ));
    }
    let s = Setup::with_workers(&targets, 4);
    let daemon = s.serve();
    let stop = Arc::new(AtomicBool::new(false));
    // Concurrent one-shot ticks on the same targets from three threads, and
    // the daemon's workers, fed through the API by a fourth. The interval is
    // not used to bring the daemon in: it counts from the last run of any
    // trigger, so busy one-shot ticks rightly keep it from firing.
    let config = s.config.clone();
    let mut handles: Vec<_> = (0..3)
        .map(|_| {
            let config = config.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut codes = Vec::new();
                while codes.len() < 12 || !stop.load(Ordering::SeqCst) {
                    let out = output_within(
                        std::process::Command::new(bin()).args([
                            "--config",
                            config.to_str().expect("utf8"),
                            "tick",
                            "a",
                            "b",
                        ]),
                        std::time::Duration::from_secs(300),
                    );
                    codes.push(out.status.code());
                }
                codes
            })
        })
        .collect();
    let port = daemon.port;
    let feeder_stop = stop.clone();
    handles.push(std::thread::spawn(move || {
        let auth = format!("Bearer {token}");
        let mut codes = Vec::new();
        while !feeder_stop.load(Ordering::SeqCst) {
            for name in ["a", "b"] {
                let path = format!("/api/v1/targets/{name}/reconcile");
                let r = http(port, "POST", &path, &[("Authorization", &auth)], b"");
                assert_eq!(r.status, 202, "{path}: {}", r.body);
            }
            codes.push(Some(0));
            std::thread::sleep(Duration::from_millis(100));
        }
        codes
    }));
    let both_took_part = |name: &str| {
        let runs = s.history(name);
        let by = |t: &str| runs.iter().filter(|r| r["trigger"] == t).count();
        by("cli") >= 5 && by("manual") >= 5
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !(both_took_part("a") && both_took_part("b")) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::SeqCst);
    let mut busy = 0;
    for h in handles {
        for code in h.join().expect("thread") {
            assert!(matches!(code, Some(0) | Some(75)), "tick exited {code:?}");
            busy += usize::from(code == Some(75));
        }
    }
    // A graceful stop lets a running apply finish and record its result; a
    // kill would leave a run row whose command may still be writing its log.
    let status = daemon.stop();
    assert!(status.success(), "daemon did not stop cleanly: {status}");
    for name in ["a", "b"] {
        let lines = log_lines(&root.path().join(format!("{name}.log")));
        let applies = assert_no_overlap(name, &lines);
        let runs = s.history(name);
        let by = |t: &str| runs.iter().filter(|r| r["trigger"] == t).count();
        // Both the daemon and the one-shot ticks must have taken part.
        assert!(
            by("cli") >= 5 && by("manual") >= 5,
            "{name}: cli {} manual {} (busy exits: {busy})",
            by("cli"),
            by("manual")
        );
        assert_eq!(
            runs.len(),
            applies,
            "{name}: every recorded run is one apply"
        );
    }
}

/// The daemon as a library: built on a listener bound to port 0, it serves
/// on the port the kernel chose, applies, and returns from `run_until` when
/// told to stop; while it lives a second daemon on the same state
/// directory is refused, and after it stopped one may start again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_built_on_port_0_serves_applies_and_stops_when_told() {
    use driftless::daemon::Daemon as Served;
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let head = remote.commit(&[("app/v", "0")], "first");
    let marker = root.path().join("applied");
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "path = \"app\"\ninterval = \"1h\"",
        &format!(
            "apply = [\"sh\", \"-c\", \"git rev-parse HEAD > {}\"]",
            marker.display()
        ),
    ));
    let settings = driftless::config::load(&s.config).expect("config");
    assert_eq!(settings.server.listen.port(), 0);
    let app = driftless::app::App::open(settings).await.expect("app");
    let rec = driftless::tick::Reconciler::new(app);
    let bind = || async {
        tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
    };
    let daemon = Served::build(rec.clone(), bind().await)
        .await
        .expect("build");
    let port = daemon.port();
    assert_ne!(port, 0);
    match Served::build(rec.clone(), bind().await).await {
        Err(e) => assert!(e.to_string().contains("another `driftless serve`"), "{e}"),
        Ok(_) => panic!("a second daemon was built on the same state directory"),
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(daemon.run_until(stopped));
    let get = move |path: &'static str| tokio::task::spawn_blocking(move || http_get(port, path));
    assert_eq!(
        get("/healthz").await.expect("join").map(|(c, _)| c),
        Some(200)
    );
    // A never-run target's first interval tick starts at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&marker)
        .map(|m| m.trim().to_string())
        .ok()
        != Some(head.clone())
    {
        assert!(std::time::Instant::now() < deadline, "no apply within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The CLI finds a daemon whose `listen` asked for port 0 through the
    // address it noted in serve.lock (an unknown token: 401 from the API).
    let approve = {
        let config = s.config.clone();
        move || {
            let out = output_within(
                std::process::Command::new(bin())
                    .arg("--config")
                    .arg(&config)
                    .args(["approve", "424242"])
                    .env("DRIFTLESS_TOKEN", "dl_no_such_token")
                    .stdin(std::process::Stdio::null()),
                Duration::from_secs(60),
            );
            text(&out.stdout)
        }
    };
    let said = tokio::task::spawn_blocking(approve.clone())
        .await
        .expect("join");
    assert_eq!(
        said.trim(),
        "error: 401 Unauthorized: a valid bearer token is required"
    );
    assert_eq!(
        driftless::lock::serving_addr(&s.state).map(|a| a.port()),
        Some(port)
    );
    stop.send(true).expect("the daemon listens for the stop");
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("run_until returned within 30 s")
        .expect("join")
        .expect("a clean stop");
    assert_eq!(get("/healthz").await.expect("join"), None, "still serving");
    // serve.lock is an flock on an open file description: a child another
    // test of this process is forking at that moment holds a copy of the
    // descriptor until it execs, so the lock may outlive the daemon by that
    // instant here (never in `driftless serve`, whose process exits).
    let state = s.state.clone();
    tokio::task::spawn_blocking(move || {
        wait_for(Duration::from_secs(10), "serve.lock released", || {
            driftless::lock::serving_addr(&state).is_none()
        })
    })
    .await
    .expect("join");
    let said = tokio::task::spawn_blocking(approve).await.expect("join");
    assert!(
        said.contains("[server] listen asks for port 0 and no `driftless serve` is running"),
        "{said}"
    );
    Served::build(rec, bind().await)
        .await
        .expect("a new daemon once the first stopped");
}

/// A one-shot `tick` killed mid-apply leaves its command running (it holds
/// the target's lock); a daemon started then, given a push for the same
/// target, waits for that orphan before it applies — its interval run and
/// the push's alike — and the killed tick's run does not stay `running`.
#[test]
fn a_one_shot_tick_killed_mid_apply_never_overlaps_the_daemon() {
    const SECRET: &str = "one-shot-kill-secret";
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/x", "1")], "first");
    let log = root.path().join("apply.log");
    let secret = root.path().join("hook-secret");
    std::fs::write(&secret, SECRET).expect("write");
    let s = Setup::new(&format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n{}",
        toml_str(&secret.display().to_string()),
        exec_target(
            "app",
            &remote.url(),
            "path = \"app\"\ninterval = \"1h\"",
            &format!(
                "apply = [\"sh\", \"-c\", \"echo start $$ >> {l}; sleep 4; echo end $$ >> {l}\"]\nalways = true",
                l = log.display()
            ),
        ),
    ));
    let mut tick = std::process::Command::new(bin())
        .args(["--config", s.config.to_str().expect("utf8"), "tick", "app"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start a one-shot tick");
    wait_for(Duration::from_secs(30), "the tick's apply to start", || {
        log_lines(&log).len() == 1
    });
    tick.kill().expect("kill -9 the tick");
    let _ = tick.wait();

    let daemon = s.serve();
    let sha = remote.commit(&[("app/x", "2")], "second");
    let body = github_push_body(&remote.url(), &sha, &["app/x"]);
    let r = deliver_github_push(daemon.port, SECRET, &body, "one-shot-kill-1");
    assert_eq!(r.status, 202, "{}", r.body);
    wait_for(Duration::from_secs(60), "the pushed commit applied", || {
        idle(&s, "app") && s.target_status("app")["last_applied_sha"] == sha.as_str()
    });
    let lines = log_lines(&log);
    let applies = assert_no_overlap("app", &lines);
    assert!(
        applies >= 2,
        "the orphan or the daemon's apply is missing: {lines:?}"
    );
    let runs = s.history("app");
    assert!(
        runs.iter().all(|r| !r["result"].is_null()),
        "a run left running: {runs:#?}"
    );
    assert!(
        runs.iter().any(|r| r["trigger"] == "cli"),
        "the killed tick's run is not on record: {runs:#?}"
    );
    drop(daemon);
}

/// A job whose run takes driftless down (here the command kills the daemon)
/// is not run for ever, nor closed without a word: after
/// `queue::MAX_ATTEMPTS` interrupted runs its next claim records a failed
/// run that says why, the owners are told, and a new push runs the target
/// again.
#[test]
fn a_job_that_keeps_killing_the_daemon_fails_with_its_reason_and_owners_are_told() {
    const SECRET: &str = "job-kills-daemon-secret";
    let root = tempfile::tempdir().expect("tempdir");
    let sink = Service::http_sink(root.path(), 0);
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/x", "1")], "first");
    let log = root.path().join("apply.log");
    let secret = root.path().join("hook-secret");
    std::fs::write(&secret, SECRET).expect("write");
    // With `boom` in the commit the command kills its parent, the daemon,
    // after 3 s (time for a restarted daemon to answer /healthz first).
    let s = Setup::new(&format!(
        "[defaults]\nnotify = [\"hook\"]\n\n[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\n\
         [[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n{}",
        sink.port,
        toml_str(&secret.display().to_string()),
        exec_target(
            "app",
            &remote.url(),
            "path = \"app\"\ninterval = \"1h\"",
            &format!(
                "apply = [\"sh\", \"-c\", \"echo run >> {l}; if [ -f boom ]; then sleep 3; kill -9 $PPID; sleep 1; fi\"]\nalways = true",
                l = log.display()
            ),
        ),
    ));
    let mut daemon = s.serve();
    wait_for(Duration::from_secs(30), "the first run", || {
        s.history("app")
            .first()
            .is_some_and(|r| r["result"] == "changed")
    });
    let boom = remote.commit(&[("app/boom", "")], "a commit whose apply kills driftless");
    let body = github_push_body(&remote.url(), &boom, &["app/boom"]);
    let r = deliver_github_push(daemon.port, SECRET, &body, "kills-1");
    assert_eq!(r.status, 202, "{}", r.body);
    let given_up = |s: &Setup| {
        s.history("app").first().is_some_and(|r| {
            r["result"] == "failed"
                && r["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("not run: driftless was stopped"))
        })
    };
    let mut restarts = 0;
    while !given_up(&s) {
        assert!(
            daemon.exited_within(Duration::from_secs(60)),
            "the daemon was not killed and the job did not end: {:#?}",
            s.history("app")
        );
        restarts += 1;
        assert!(
            restarts <= 8,
            "restarted {restarts} times: {:#?}",
            s.history("app")
        );
        daemon = s.serve();
        wait_for(
            Duration::from_secs(60),
            "the recovered job's next run",
            || given_up(&s) || daemon.exited_within(Duration::from_millis(10)),
        );
    }
    let runs = s.history("app");
    let interrupted = runs.iter().filter(|r| r["result"] == "interrupted").count();
    assert_eq!(interrupted, 5, "{runs:#?}");
    let message = runs[0]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("during each of this job's last 5 runs")
            && message.contains("driftless retry app"),
        "{message}"
    );
    assert_eq!(runs[0]["sha"], serde_json::Value::Null, "{}", runs[0]);
    // The command did not run a sixth time; the owners were told.
    assert_eq!(log_lines(&log).len(), 1 + 5, "{:?}", log_lines(&log));
    wait_for(Duration::from_secs(30), "the owners told", || {
        sink.requests().iter().any(|r| {
            r["body"].as_str().is_some_and(|b| {
                b.contains("\"event\":\"failed\"") && b.contains("not run: driftless was stopped")
            })
        })
    });
    // A new push runs the target again.
    remote.delete("app/boom", "no more boom");
    let fixed = remote.commit(&[("app/x", "2")], "fixed");
    let body = github_push_body(&remote.url(), &fixed, &["app/x"]);
    let r = deliver_github_push(daemon.port, SECRET, &body, "kills-2");
    assert_eq!(r.status, 202, "{}", r.body);
    let applied = || s.target_status("app")["last_applied_sha"] == fixed.as_str();
    let start = std::time::Instant::now();
    while !applied() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        applied(),
        "the fixed commit was not applied: {:#?}\n{}",
        s.history("app"),
        daemon.log_text()
    );
    drop(daemon);
}
