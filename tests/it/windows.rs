//! Change windows (`windows`): outside a window a push's job waits queued
//! and the fallback interval does not run; when the window opens the
//! newest commit is applied once; a person may override (scope
//! `override:<target>`, `tick --override-window`) and the run says so.
//!
//! The clock is moved, never waited for: a debug build of driftless adds
//! the seconds written in the file `DRIFTLESS_DEBUG_CLOCK_FILE` names to
//! the time windows are judged by (`window::now`; release builds never
//! read it). Each test's deny window is a one-off range around the real
//! now, and writing `7200` to the file takes the clock past its end. One
//! test puts a policy on the target: an override is judged like any apply.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;

const SECRET: &str = "windows-hook-secret";
/// May reconcile `web`, not override its window.
const DEV: &str = "dev-token-for-windows-0001";
/// May override `web`'s window as well.
const OPS: &str = "ops-token-for-windows-0002";

struct World {
    root: tempfile::TempDir,
    remote: Remote,
    setup: Setup,
    clock: PathBuf,
}

impl World {
    /// Target `web` (exec, appending `v.txt` to `applied.log` on each
    /// apply, interval 1s) behind a deny window from an hour ago to an
    /// hour from now, with a GitHub receiver and the two tokens.
    fn new(database: &str) -> World {
        let root = tempfile::tempdir().expect("tempdir");
        let remote = Remote::new(root.path(), "infra");
        remote.commit(&[("v.txt", "1\n")], "first");
        let secret = root.path().join("hook-secret");
        std::fs::write(&secret, SECRET).expect("write");
        let clock = root.path().join("clock");
        std::fs::write(&clock, "0").expect("write");
        let log = root.path().join("applied.log");
        let cfg = format!(
            "{database}[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n{}{}\n{}",
            toml_str(&secret.display().to_string()),
            token_table("dev", DEV, &["reconcile:web", "read"]),
            token_table("ops", OPS, &["reconcile:web", "override:web", "read"]),
            exec_target(
                "web",
                &remote.url(),
                &format!(
                    "interval = \"1s\"\nwindows = [{{ deny = \"{} - {} UTC\" }}]",
                    utc_minute(-60),
                    utc_minute(60)
                ),
                &format!(
                    "apply = [\"sh\", \"-c\", \"cat v.txt >> {}\"]",
                    log.display()
                ),
            ),
        );
        let setup = Setup::new(&cfg);
        World {
            root,
            remote,
            setup,
            clock,
        }
    }

    /// `serve` on the real clock: a job held back by a window looks again
    /// once a minute, as in a release build.
    fn serve_real_clock(&self) -> Daemon {
        Daemon::start(&self.setup)
    }

    /// `serve` on the movable clock (a held-back job looks again each second).
    fn serve(&self) -> Daemon {
        Daemon::start_with_clock(&self.setup, &self.clock)
    }

    /// The one-shot CLI on the same clock.
    fn run(&self, args: &[&str]) -> std::process::Output {
        output_within(
            std::process::Command::new(bin())
                .arg("--config")
                .arg(&self.setup.config)
                .args(args)
                .env("DRIFTLESS_DEBUG_CLOCK_FILE", &self.clock)
                .stdin(std::process::Stdio::null()),
            Duration::from_secs(120),
        )
    }

    fn push(&self, port: u16, v: &str, id: &str) -> String {
        let sha = self.remote.commit(&[("v.txt", &format!("{v}\n"))], v);
        let body = github_push_body(&self.remote.url(), &sha, &["v.txt"]);
        let r = deliver_github_push(port, SECRET, &body, id);
        assert_eq!(r.status, 202, "{}", r.body);
        sha
    }

    fn applied(&self) -> Vec<String> {
        log_lines(&self.root.path().join("applied.log"))
    }

    fn window(&self) -> serde_json::Value {
        self.setup.target_status("web")["window"].clone()
    }

    /// Move the windows' clock `seconds` from the real time.
    fn move_clock(&self, seconds: i64) {
        std::fs::write(&self.clock, seconds.to_string()).expect("write clock");
    }
}

fn log_lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn metric(port: u16, line: &str) -> bool {
    http_get(port, "/metrics").is_some_and(|(_, body)| body.lines().any(|l| l == line))
}

/// Outside the window nothing runs — not the 1-second interval, not two
/// pushes, which fold into one queued job that `status`, the API and
/// `/metrics` show waiting with the opening; when the window opens (the
/// clock moved past it) the newest commit is applied once.
#[test]
fn a_deny_window_keeps_pushes_queued_and_applies_the_newest_once_when_it_opens() {
    let w = World::new("");
    let d = w.serve();
    w.push(d.port, "2", "delivery-2");
    let newest = w.push(d.port, "3", "delivery-3");
    wait_for(
        Duration::from_secs(20),
        "the job waits for its window",
        || w.window()["waiting"] == true,
    );
    // Several looks of the workers and the scheduler later: still nothing.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        w.applied().is_empty(),
        "applied in a closed window: {:?}",
        w.applied()
    );
    assert!(
        w.setup.history("web").is_empty(),
        "{:?}",
        w.setup.history("web")
    );
    let win = w.window();
    assert_eq!(win["open"], false, "{win}");
    assert!(
        win["state"]
            .as_str()
            .is_some_and(|s| s.starts_with("closed; opens ")),
        "{win}"
    );
    let status = w.run(&["status"]);
    assert!(
        text(&status.stdout).contains("queued, waiting for its window (closed; opens "),
        "{}",
        text(&status.stdout)
    );
    // The page says the same: the row is among the waiting ones, in
    // words, and the target's page names its windows.
    let page = |path: &str| api_call(d.port, "GET", path, DEV, &serde_json::Value::Null).body;
    let board = page("/");
    let waiting = board
        .split("<tbody id=\"g-waiting\">")
        .nth(1)
        .and_then(|rest| rest.split("</tbody>").next())
        .unwrap_or_default();
    assert!(
        waiting.contains("id=\"t-web\"") && waiting.contains(">waits for its window<"),
        "{board}"
    );
    let target = page("/targets/web");
    assert!(
        target.contains("<dt>windows</dt>") && target.contains("window closed; opens "),
        "{target}"
    );
    let queued = jobs(&w.setup.db())
        .into_iter()
        .filter(|j| j.state == "queued")
        .collect::<Vec<_>>();
    assert_eq!(queued.len(), 1, "the pushes fold into one job: {queued:?}");
    assert_eq!(queued[0].requested_sha.as_deref(), Some(newest.as_str()));
    assert!(metric(d.port, "driftless_window_open{target=\"web\"} 0"));

    w.move_clock(2 * 3600);
    wait_for(Duration::from_secs(20), "the newest commit applied", || {
        !w.applied().is_empty()
    });
    // The interval now runs too; it applies nothing new.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(w.applied(), ["3"], "applied once, the newest");
    let runs = w.setup.history("web");
    let changed: Vec<_> = runs.iter().filter(|r| r["result"] == "changed").collect();
    assert_eq!(changed.len(), 1, "{runs:?}");
    assert_eq!(changed[0]["sha"], newest.as_str());
    assert!(
        changed[0]["trigger"]
            .as_str()
            .is_some_and(|t| t.contains("webhook")),
        "{}",
        changed[0]
    );
    assert!(metric(d.port, "driftless_window_open{target=\"web\"} 1"));
    assert_eq!(w.window()["waiting"], false);
}

/// A person overrides the window through the API: a token without
/// `override:web` is refused naming the scope; with it the waiting push's
/// job runs at once, its run's trigger saying `override`.
#[test]
fn an_override_starts_the_waiting_job_at_once_and_the_run_says_so() {
    override_applies("");
}

/// The same on PostgreSQL: the override makes the waiting job (held back
/// by the database's `not_before`) runnable at once.
#[test]
fn an_override_starts_the_waiting_job_on_postgres_too() {
    override_applies(&postgres_table());
}

fn override_applies(database: &str) {
    let w = World::new(database);
    // On the real clock the waiting job would look again only in a
    // minute: the override itself must make it runnable.
    let d = w.serve_real_clock();
    let sha = w.push(d.port, "2", "delivery-2");
    wait_for(
        Duration::from_secs(20),
        "the job waits for its window",
        || w.window()["waiting"] == true,
    );
    let path = "/api/v1/targets/web/reconcile?override_window=1";
    let refused = api_call(d.port, "POST", path, DEV, &serde_json::Value::Null);
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.body.contains("override:web"), "{}", refused.body);
    assert!(w.applied().is_empty());

    let started = std::time::Instant::now();
    let r = api_call(
        d.port,
        "POST",
        &format!("{path}&wait=30s"),
        OPS,
        &serde_json::Value::Null,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let done = r.json();
    assert_eq!(done["run"]["result"], "changed", "{done}");
    assert_eq!(done["run"]["sha"], sha.as_str(), "{done}");
    assert_eq!(done["run"]["trigger"], "webhook,override", "{done}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the override waited {:?}",
        started.elapsed()
    );
    assert_eq!(w.applied(), ["2"]);
    // The window is still shut: the next push waits again.
    let v3 = w.push(d.port, "3", "delivery-3");
    wait_for(Duration::from_secs(20), "the next push waits", || {
        w.window()["waiting"] == true
    });
    assert_eq!(w.applied(), ["2"]);
    // The CLI's way: `driftless reconcile --now`, through the daemon.
    let out = output_within(
        std::process::Command::new(bin())
            .arg("--config")
            .arg(&w.setup.config)
            .args(["reconcile", "--now", "--wait", "30s", "web"])
            .env("DRIFTLESS_TOKEN", OPS)
            .stdin(std::process::Stdio::null()),
        Duration::from_secs(60),
    );
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(
        said.starts_with(&format!("web: changed at {}", &v3[..12]))
            && said.contains("trigger webhook,override"),
        "{said}"
    );
    assert_eq!(w.applied(), ["2", "3"]);
}

/// Without a daemon: a one-shot `tick` outside the window applies nothing,
/// says when it opens and exits 0 (a systemd timer is not failed);
/// `--override-window` applies, its run's trigger `override`. `check`
/// explains the window in words.
#[test]
fn a_one_shot_tick_outside_its_window_says_when_it_opens_unless_overridden() {
    let w = World::new("");
    let check = w.run(&["check"]);
    assert!(check.status.success(), "{}", text(&check.stdout));
    let said = text(&check.stdout);
    assert!(
        said.contains("windows: work may start any time but: from ")
            && said.contains("window now: closed; opens "),
        "{said}"
    );

    let out = w.run(&["tick", "web"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("web: waiting: outside its change window; opens "),
        "{}",
        text(&out.stdout)
    );
    assert!(w.applied().is_empty());
    assert!(w.setup.history("web").is_empty());

    let out = w.run(&["tick", "--override-window", "web"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(w.applied(), ["1"]);
    let runs = w.setup.history("web");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["trigger"], "override");

    // Past the window, a plain tick applies.
    w.remote.commit(&[("v.txt", "2\n")], "2");
    w.move_clock(2 * 3600);
    let out = w.run(&["tick", "web"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(w.applied(), ["1", "2"]);
}

/// Outside its window a target with `recheck = true` still has its health
/// checked on the interval, at the commit it has, and nothing applied: a
/// pushed commit waits, and a failing check is reported `unhealthy`.
#[test]
fn health_rechecks_go_on_outside_the_window_and_apply_nothing() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("v.txt", "1\n")], "first");
    let log = root.path().join("applied.log");
    let sick = root.path().join("sick");
    let s = Setup::new(&exec_target(
        "web",
        &remote.url(),
        &format!(
            "interval = \"1s\"\nwindows = [{{ deny = \"{} - {} UTC\" }}]\n\
             [targets.health]\ngrace = \"0s\"\ninterval = \"1s\"\ntimeout = \"1s\"\nrecheck = true\n\
             [[targets.health.checks]]\ncommand = [\"sh\", \"-c\", \"test ! -e {}\"]\n",
            utc_minute(-60),
            utc_minute(60),
            sick.display()
        ),
        &format!(
            "apply = [\"sh\", \"-c\", \"cat v.txt >> {}\"]",
            log.display()
        ),
    ));
    let out = s.run(&["tick", "--override-window", "web"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    remote.commit(&[("v.txt", "2\n")], "second");
    let d = s.serve();
    let rechecked = |result: &str| {
        s.history("web").into_iter().find(|r| {
            r["trigger"] == "interval"
                && r["result"] == result
                && r["message"].as_str().is_some_and(|m| {
                    m.contains("outside its change window: nothing applied, health rechecked")
                })
        })
    };
    wait_for(
        Duration::from_secs(30),
        "a recheck outside the window",
        || rechecked("no_change").is_some(),
    );
    std::fs::write(&sick, "").expect("write");
    wait_for(Duration::from_secs(30), "an unhealthy recheck", || {
        rechecked("unhealthy").is_some()
    });
    drop(d);
    let run = rechecked("unhealthy").expect("run");
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| m.contains("nothing was applied")),
        "{run}"
    );
    assert_eq!(log_lines(&log), ["1"], "applied outside the window");
    let first = git(&remote.work, &["rev-list", "--max-parents=0", "HEAD"]);
    assert_eq!(run["sha"], first.trim(), "{run}");
}

/// Windows × policies: outside its window a target under a policy is
/// neither planned nor judged (nothing recorded); an override is judged
/// like any apply — allowed and applied, or denied and nothing applied —
/// and a denied commit stays held after the window opens, until a new one.
#[test]
fn an_override_is_judged_by_the_policies_and_a_denial_outlives_the_window() {
    let w = World::new("");
    let policy = w.root.path().join("no_two.rego");
    std::fs::write(
        &policy,
        "package main\n\nimport rego.v1\n\n\
         deny contains \"v may not be 2\" if {\n\tsome c in input.changes\n\tc.address == \"v 2\"\n}\n",
    )
    .expect("policy");
    let cfg = std::fs::read_to_string(&w.setup.config).expect("config");
    let cfg = cfg.replacen(
        "apply = [",
        "plan = [\"sh\", \"-c\", \"echo \\\"~ v $(cat v.txt)\\\"\"]\napply = [",
        1,
    ) + &format!(
        "\n[[policies]]\nname = \"no-two\"\nfiles = [{}]\n",
        toml_str(&policy.display().to_string())
    );
    std::fs::write(&w.setup.config, cfg).expect("config");
    let events = || {
        let out = w.run(&["events", "web", "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("events --json")
    };

    let out = w.run(&["tick", "web"]);
    assert!(
        text(&out.stdout).contains("web: waiting: outside its change window; opens "),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(events(), serde_json::json!([]), "judged outside its window");
    assert!(w.setup.history("web").is_empty());

    let out = w.run(&["tick", "--override-window", "web"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(w.applied(), ["1"]);

    w.remote.commit(&[("v.txt", "2\n")], "2");
    let out = w.run(&["tick", "--override-window", "web"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let run = &w.setup.history("web")[0];
    assert_eq!(run["trigger"], "override", "{run}");
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| m.contains("denied by policy `no-two`: v may not be 2")),
        "{run}"
    );
    assert_eq!(w.applied(), ["1"], "a denied override applied");

    // The window opens: the denied commit is still held, not applied.
    w.move_clock(2 * 3600);
    let _ = w.run(&["tick", "web"]);
    assert_eq!(
        w.applied(),
        ["1"],
        "the window's opening applied a denied commit"
    );
    w.remote.commit(&[("v.txt", "3\n")], "3");
    let out = w.run(&["tick", "web"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(w.applied(), ["1", "3"]);
}
