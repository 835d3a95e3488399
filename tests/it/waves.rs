//! Rollouts in waves (`[[groups]] rollout`): a new commit goes to wave 1,
//! then — once every member of a wave is applied and healthy and `pause`
//! has passed — to the next; an unhealthy member halts the rollout and
//! later waves keep the commit they had; a daemon killed mid-rollout
//! resumes at the wave it was in.
//!
//! Four exec targets on one repository, `a` to `d`, in waves
//! `[1, "50%", "100%"]`: `a`, then `b`, then `c` and `d`. Each apply
//! writes the version it applied to `live-<name>` and a line (version and
//! time) to `applied-<name>.log`; each target's health check fails while
//! the file `bad-<name>` exists, which the test controls.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

const SECRET: &str = "waves-hook-secret";
/// May read everything, approve nothing.
const VIEWER: &str = "viewer-token-for-waves-0001";
const MEMBERS: [&str; 4] = ["a", "b", "c", "d"];

struct Fleet {
    root: tempfile::TempDir,
    remote: Remote,
    setup: Setup,
    sink: Service,
    clock: std::path::PathBuf,
}

impl Fleet {
    fn new(database: &str, pause: &str) -> Fleet {
        Fleet::with(database, pause, |_| String::new())
    }

    /// `extra(member)`: more TOML for that member's table.
    fn with(database: &str, pause: &str, extra: impl Fn(&str) -> String) -> Fleet {
        Fleet::with_backend(database, pause, extra, |_, _| String::new())
    }

    /// As [`Fleet::with`], `backend(member)` more TOML for that member's
    /// `[targets.backend]` (given the root directory's path).
    fn with_backend(
        database: &str,
        pause: &str,
        extra: impl Fn(&str) -> String,
        backend: impl Fn(&str, &str) -> String,
    ) -> Fleet {
        let root = tempfile::tempdir().expect("tempdir");
        let remote = Remote::new(root.path(), "fleet");
        remote.commit(&[("v.txt", "1\n")], "1");
        let sink = Service::http_sink(root.path(), 0);
        let secret = root.path().join("hook-secret");
        std::fs::write(&secret, SECRET).expect("write");
        let r = root.path().display().to_string();
        let clock = root.path().join("clock");
        std::fs::write(&clock, "0").expect("write");
        let mut cfg = format!(
            "{database}[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n\
             [[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\n\
             [[groups]]\nname = \"fleet\"\ntargets = [\"a\", \"b\", \"c\", \"d\"]\n\
             rollout = {{ waves = [1, \"50%\", \"100%\"], pause = \"{pause}\" }}\n\n",
            toml_str(&secret.display().to_string()),
            sink.port
        ) + &token_table("viewer", VIEWER, &["read"]);
        for m in MEMBERS {
            cfg.push_str(&exec_target(
                m,
                &remote.url(),
                &format!(
                    "interval = \"1s\"\nnotify = [\"hook\"]\n{}\n\
                     [targets.health]\ngrace = \"0s\"\ninterval = \"1s\"\ntimeout = \"2s\"\n\
                     [[targets.health.checks]]\ncommand = [\"sh\", \"-c\", \"if [ -e {r}/slow-{m} ]; then sleep 3; fi; test ! -e {r}/bad-{m}\"]\n",
                    extra(m)
                ),
                &format!(
                    "apply = [\"sh\", \"-c\", \"cp v.txt {r}/live-{m}; echo $(cat v.txt) $(date +%s%N) >> {r}/applied-{m}.log\"]\n{}",
                    backend(m, &r)
                ),
            ));
        }
        let setup = Setup::new(&cfg);
        Fleet {
            root,
            remote,
            setup,
            sink,
            clock,
        }
    }

    /// `serve` on the movable windows clock (`tests/it/windows.rs`).
    fn serve(&self) -> Daemon {
        Daemon::start_with_clock(&self.setup, &self.clock)
    }

    fn live(&self, m: &str) -> String {
        std::fs::read_to_string(self.root.path().join(format!("live-{m}")))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// Each time `m` applied version `v` (Unix ns).
    fn applied(&self, m: &str, v: &str) -> Vec<u128> {
        std::fs::read_to_string(self.root.path().join(format!("applied-{m}.log")))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(ver, _)| *ver == v)
            .filter_map(|(_, t)| t.trim().parse().ok())
            .collect()
    }

    fn bad(&self, m: &str, bad: bool) {
        self.flag("bad", m, bad);
    }

    /// While `slow-<m>` exists, `m`'s health check takes three seconds.
    fn slow(&self, m: &str, slow: bool) {
        self.flag("slow", m, slow);
    }

    fn flag(&self, flag: &str, m: &str, bad: bool) {
        let p = self.root.path().join(format!("{flag}-{m}"));
        if bad {
            std::fs::write(p, "").expect("write");
        } else {
            std::fs::remove_file(p).expect("remove");
        }
    }

    /// `rollout status --json`: the rollout of `fleet`, once started.
    fn rollout(&self) -> Value {
        let out = self.setup.run(&["rollout", "status", "fleet", "--json"]);
        assert!(out.status.success(), "{}", text(&out.stdout));
        let list: Vec<Value> = serde_json::from_slice(&out.stdout).expect("json");
        list.into_iter().next().unwrap_or(Value::Null)
    }

    fn push(&self, port: u16, v: &str) -> String {
        let sha = self.remote.commit(&[("v.txt", &format!("{v}\n"))], v);
        let body = github_push_body(&self.remote.url(), &sha, &["v.txt"]);
        let r = deliver_github_push(port, SECRET, &body, &format!("push-{v}"));
        assert_eq!(r.status, 202, "{}", r.body);
        sha
    }

    /// Wait until the rollout of `sha` is `state`.
    fn wait_rollout(&self, sha: &str, state: &str, within: Duration) -> Value {
        let start = Instant::now();
        loop {
            let last = self.rollout();
            if last["sha"] == sha && last["state"] == state {
                return last;
            }
            assert!(
                start.elapsed() < within,
                "timed out after {within:?} waiting for the rollout of {sha} {state}; last seen: {last:#}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The first rollout: every member takes version 1 (their first apply
    /// is not staged) and the rollout of it ends `done`.
    fn settled(&self) -> String {
        let first = git(&self.remote.work, &["rev-parse", "HEAD"]);
        self.wait_rollout(&first, "done", Duration::from_secs(60));
        for m in MEMBERS {
            assert_eq!(self.live(m), "1", "{m}");
        }
        first
    }

    /// What the notifier was told about the rollout.
    fn told(&self) -> Vec<Value> {
        self.sink
            .requests()
            .iter()
            .filter_map(|r| serde_json::from_str::<Value>(r["body"].as_str()?).ok())
            .filter(|d| d["target"] == "rollout `fleet`")
            .collect()
    }
}

fn member_state(rollout: &Value, m: &str) -> String {
    rollout["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|x| x["target"] == m))
        .and_then(|x| x["state"].as_str())
        .unwrap_or("")
        .to_string()
}

/// An unhealthy member of wave 1 halts the rollout: waves 2 and 3 stay at
/// the commit they had, the owners are told once, `rollout status` says
/// why. `rollout resume` once it is healthy again carries the commit to
/// every wave.
#[test]
fn an_unhealthy_first_wave_halts_the_rollout_and_later_waves_keep_their_commit() {
    let forges = tempfile::tempdir().expect("tempdir");
    let forge = ForgeStandin::start(forges.path());
    let f = Fleet::with(&(forge.table("f", "github") + "\n"), "0s", |_| {
        "forge = \"f\"\nforge_repo = \"me/fleet\"".to_string()
    });
    let d = f.serve();
    f.settled();
    f.bad("a", true);
    let v2 = f.push(d.port, "2");
    let halted = f.wait_rollout(&v2, "halted", Duration::from_secs(60));
    assert!(
        halted["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("halted at wave 1: `a` is unhealthy")),
        "{halted}"
    );
    assert_eq!(f.live("a"), "2", "wave 1 took the commit");
    // Several seconds of 1-second intervals and rollout looks later, the
    // later waves still have the commit they had.
    std::thread::sleep(Duration::from_secs(4));
    for m in ["b", "c", "d"] {
        assert_eq!(f.live(m), "1", "{m} took the commit of a halted rollout");
        assert!(f.applied(m, "2").is_empty(), "{m}");
    }
    let now = f.rollout();
    assert_eq!(now["state"], "halted");
    assert_eq!(member_state(&now, "a"), "failed", "{now}");
    assert_eq!(member_state(&now, "c"), "held", "{now}");
    let runs = f.setup.history("c");
    assert!(
        runs[0]["message"].as_str().is_some_and(
            |m| m.contains("the rollout `fleet` of") && m.contains("this target is in wave 3")
        ),
        "{}",
        runs[0]
    );
    wait_for(Duration::from_secs(20), "the owners told", || {
        !f.told().is_empty()
    });
    std::thread::sleep(Duration::from_secs(2));
    let told = f.told();
    assert_eq!(told.len(), 1, "told once: {told:?}");
    assert!(
        told[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("halted at wave 1")),
        "{}",
        told[0]
    );

    // Resuming is a person's decision: `approve:fleet`.
    let refused = api_call(
        d.port,
        "POST",
        "/api/v1/rollouts/fleet/resume",
        VIEWER,
        &Value::Null,
    );
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.body.contains("approve:fleet"), "{}", refused.body);
    let seen = api_call(
        d.port,
        "GET",
        "/api/v1/rollouts/fleet",
        VIEWER,
        &Value::Null,
    );
    assert_eq!(seen.json()["state"], "halted", "{}", seen.body);

    // The commit says so on the forge, in a context of the rollout's own.
    let context = "driftless/rollout/fleet";
    wait_for(
        Duration::from_secs(20),
        "the rollout's failure status",
        || forge.states(&v2, context).last().map(String::as_str) == Some("failure"),
    );
    let posted = forge.journal();
    let halted_status = posted
        .iter()
        .rev()
        .find(|r| r["body"]["context"] == context)
        .expect("a status of the rollout");
    assert!(
        halted_status["body"]["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("halted at wave 1: `a` is unhealthy")),
        "{halted_status}"
    );

    f.bad("a", false);
    // The retry of `a` (its health checks: the commit is applied) takes
    // seconds: the rollout is looked at (every second) while `a`'s
    // unhealthy result and quarantine from before the resume are still on
    // record. They are stale, not a new failure.
    f.slow("a", true);
    let out = f.setup.run(&["rollout", "resume", "fleet"]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    let resumed = f.wait_rollout(&v2, "running", Duration::from_secs(10));
    assert_eq!(member_state(&resumed, "a"), "waiting", "{resumed}");
    f.wait_rollout(&v2, "done", Duration::from_secs(60));
    assert_eq!(told.len(), f.told().len(), "told again: {:?}", f.told());
    for m in MEMBERS {
        assert_eq!(f.live(m), "2", "{m}");
    }
    wait_for(
        Duration::from_secs(20),
        "the rollout's success status",
        || forge.states(&v2, context).last().map(String::as_str) == Some("success"),
    );
    let states = forge.states(&v2, context);
    assert_eq!(
        states.first().map(String::as_str),
        Some("pending"),
        "{states:?}"
    );
}

/// All healthy: the commit reaches every wave in order, each wave no
/// sooner than `pause` after the one before it was through. A daemon
/// killed with SIGKILL during a pause resumes at the same wave: wave 1 is
/// not applied again.
#[test]
fn every_wave_in_order_with_its_pause_and_a_kill_9_resumes_at_the_same_wave() {
    waves_survive_a_kill("");
}

/// The same on PostgreSQL: the rollout's wave is the database's.
#[test]
fn every_wave_in_order_and_a_kill_9_resumes_on_postgres_too() {
    waves_survive_a_kill(&postgres_table());
}

fn waves_survive_a_kill(database: &str) {
    let pause = Duration::from_secs(3);
    let f = Fleet::new(database, "3s");
    let d = f.serve();
    f.settled();
    let v2 = f.push(d.port, "2");
    // Wave 1 through: its pause has begun.
    wait_for(Duration::from_secs(60), "wave 1 through", || {
        let r = f.rollout();
        r["sha"] == v2.as_str() && r["wave"] == 1 && !r["wave_done_at"].is_null()
    });
    assert!(f.applied("b", "2").is_empty(), "wave 2 before the pause");
    d.kill9();
    let started = Instant::now();
    let d = f.serve();
    f.wait_rollout(&v2, "done", Duration::from_secs(90));
    drop(d);
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(
        f.applied("a", "2").len(),
        1,
        "wave 1 applied again after the restart"
    );
    let first = |m: &str| f.applied(m, "2").into_iter().min().expect("applied");
    let (a, b) = (first("a"), first("b"));
    let (c, dd) = (first("c"), first("d"));
    let gap = |from: u128, to: u128| Duration::from_nanos((to.saturating_sub(from)) as u64);
    assert!(gap(a, b) >= pause, "wave 2 {:?} after wave 1", gap(a, b));
    assert!(gap(b, c) >= pause, "wave 3 {:?} after wave 2", gap(b, c));
    assert!(gap(b, dd) >= pause, "wave 3 {:?} after wave 2", gap(b, dd));
    for m in MEMBERS {
        assert_eq!(f.live(m), "2", "{m}");
    }
}

/// A wave that cannot start outside a member's change window waits for it:
/// `c` (wave 3) sits behind a deny window around now, so the rollout stays
/// at wave 3 — `d` of the same wave applied, `c` not — until the window
/// opens (the clock moved past it); then it is done.
#[test]
fn a_wave_waits_for_its_members_window() {
    let window = format!(
        "windows = [{{ deny = \"{} - {} UTC\" }}]",
        utc_minute(-60),
        utc_minute(60)
    );
    let f = Fleet::with("", "0s", |m| {
        if m == "c" {
            window.clone()
        } else {
            String::new()
        }
    });
    let d = f.serve();
    // `c` never applied: its first apply waits for the window as well.
    f.wait_rollout(
        &git(&f.remote.work, &["rev-parse", "HEAD"]),
        "running",
        Duration::from_secs(30),
    );
    wait_for(Duration::from_secs(30), "the rollout at wave 3", || {
        f.rollout()["wave"] == 3
    });
    // Several looks later it is still there: `c` waits for its window.
    std::thread::sleep(Duration::from_secs(3));
    for m in ["a", "b", "d"] {
        assert_eq!(f.live(m), "1", "{m}");
    }
    assert_eq!(f.live("c"), "", "applied in a closed window");
    let r = f.rollout();
    assert_eq!(r["state"], "running", "{r}");
    assert_eq!(r["wave"], 3, "{r}");
    assert_eq!(member_state(&r, "c"), "waiting", "{r}");
    assert_eq!(member_state(&r, "d"), "done", "{r}");
    std::fs::write(&f.clock, "7200").expect("move the clock");
    f.settled();
    drop(d);
}

/// Waves × approvals: a member of wave 2 under `policy = "approval"` holds
/// its wave while its plan waits — the rollout stays `running`, nothing
/// halts, wave 3 keeps the commit it had — and approving the plan lets
/// the wave through and the commit on to wave 3.
#[test]
fn a_wave_waits_for_its_members_approval_without_halting() {
    const OPS: &str = "ops-token-for-waves-0002";
    let f = Fleet::with_backend(
        &token_table("ops", OPS, &["approve:b", "read"]),
        "0s",
        |m| {
            if m == "b" {
                "policy = \"approval\"".into()
            } else {
                String::new()
            }
        },
        |m, r| {
            if m == "b" {
                format!(
                    "plan = [\"sh\", \"-c\", \"cmp -s v.txt {r}/live-b || echo '~ file live-b (to '$(cat v.txt)')'\"]"
                )
            } else {
                String::new()
            }
        },
    );
    let d = f.serve();
    let ops = Approver {
        port: d.port,
        token: OPS,
    };
    let plan_of = |v: &str| {
        let mut found = None;
        wait_for(Duration::from_secs(30), "b's plan waiting", || {
            found = ops.pending().into_iter().find(|p| {
                p["diff"]
                    .as_str()
                    .is_some_and(|x| x.contains(&format!("(to {v})")))
            });
            found.is_some()
        });
        found.unwrap_or_default()
    };
    // `b`'s first apply waits for approval like any other.
    ops.approve(&plan_of("1"));
    f.settled();

    let two = f.push(d.port, "2");
    wait_for(
        Duration::from_secs(30),
        "the rollout of 2 at wave 2",
        || {
            let r = f.rollout();
            r["sha"] == two.as_str() && r["wave"] == 2
        },
    );
    let waiting = plan_of("2");
    // Several looks later: held, not halted, and wave 3 keeps 1.
    std::thread::sleep(Duration::from_secs(3));
    let r = f.rollout();
    assert_eq!(r["state"], "running", "{r:#}");
    assert_eq!(r["wave"], 2, "{r:#}");
    assert_eq!(member_state(&r, "b"), "waiting", "{r:#}");
    assert_eq!((f.live("a"), f.live("b")), ("2".into(), "1".into()));
    assert_eq!((f.live("c"), f.live("d")), ("1".into(), "1".into()));

    ops.approve(&waiting);
    f.wait_rollout(&two, "done", Duration::from_secs(60));
    for m in MEMBERS {
        assert_eq!(f.live(m), "2", "{m}");
    }
    assert!(
        f.applied("c", "2")[0] > f.applied("b", "2")[0],
        "wave 3 before the approved wave 2"
    );
    drop(d);
}

/// A `[[target_sets]]` entry with a `name` and a `rollout`: its members
/// (one per directory) are the rollout's, in name order, and a commit
/// that changes every directory reaches `s-x` first, then the others.
#[test]
fn a_target_sets_members_roll_out_in_waves() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "stacks");
    let files = |v: &str| -> Vec<(String, String)> {
        ["x", "y", "z"]
            .iter()
            .map(|d| (format!("hosts/{d}/v.txt"), format!("{v}\n")))
            .collect()
    };
    let commit = |v: &str| {
        let f = files(v);
        let refs: Vec<(&str, &str)> = f.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        remote.commit(&refs, v)
    };
    let first = commit("1");
    let r = root.path().display().to_string();
    let s = Setup::new(&format!(
        "[[target_sets]]\nname = \"stacks\"\nname_prefix = \"s-\"\nrepo = \"{}\"\npaths = \"hosts/*\"\n\
         interval = \"1s\"\nrollout = {{ waves = [1, \"100%\"], pause = \"2s\" }}\n\
         [target_sets.backend]\nkind = \"exec\"\n\
         apply = [\"sh\", \"-c\", \"echo $(cat v.txt) $(basename $PWD) $(date +%s%N) >> {r}/applied.log\"]\n",
        remote.url()
    ));
    let d = s.serve();
    let rollout = || -> Value {
        let out = s.run(&["rollout", "status", "stacks", "--json"]);
        serde_json::from_slice::<Vec<Value>>(&out.stdout)
            .ok()
            .and_then(|v| v.into_iter().next())
            .unwrap_or(Value::Null)
    };
    wait_for(Duration::from_secs(60), "the first rollout done", || {
        let r = rollout();
        r["sha"] == first.as_str() && r["state"] == "done"
    });
    let v2 = commit("2");
    wait_for(Duration::from_secs(60), "the second rollout done", || {
        let r = rollout();
        r["sha"] == v2.as_str() && r["state"] == "done"
    });
    drop(d);
    let r = rollout();
    let waves: Vec<(String, i64)> = r["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["target"].as_str().unwrap_or("").to_string(),
                m["wave"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        waves,
        [
            ("s-x".to_string(), 1),
            ("s-y".to_string(), 2),
            ("s-z".to_string(), 2)
        ]
    );
    let log = std::fs::read_to_string(root.path().join("applied.log")).expect("applied");
    let at = |who: &str| -> u128 {
        log.lines()
            .filter_map(|l| {
                let mut w = l.split(' ');
                let (v, m, t) = (w.next()?, w.next()?, w.next()?);
                (v == "2" && m == who).then(|| t.parse().ok()).flatten()
            })
            .min()
            .unwrap_or_else(|| panic!("{who} never applied 2:\n{log}"))
    };
    let (x, y, z) = (at("x"), at("y"), at("z"));
    assert!(
        y > x + 2_000_000_000 && z > x + 2_000_000_000,
        "x {x}, y {y}, z {z}:\n{log}"
    );
}

/// A newer commit supersedes a halted rollout and starts its own from the
/// first wave: the fix reaches every member, and the halted rollout is on
/// record as `superseded`.
#[test]
fn a_newer_commit_supersedes_a_halted_rollout() {
    let f = Fleet::new("", "0s");
    let d = f.serve();
    f.settled();
    f.bad("a", true);
    let v2 = f.push(d.port, "2");
    f.wait_rollout(&v2, "halted", Duration::from_secs(60));
    f.bad("a", false);
    let v3 = f.push(d.port, "3");
    f.wait_rollout(&v3, "done", Duration::from_secs(60));
    drop(d);
    for m in MEMBERS {
        assert_eq!(f.live(m), "3", "{m}");
        assert!(
            f.applied(m, "2").is_empty() || m == "a",
            "{m} took the halted commit"
        );
    }
    let rows = sql_rows(
        &f.setup.db(),
        "SELECT sha, state FROM rollouts WHERE name = 'fleet' ORDER BY seq",
    );
    let states: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["sha"].as_str().unwrap_or("").to_string(),
                r["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(states.len(), 3, "{states:?}");
    assert_eq!(states[1], (v2, "superseded".to_string()));
    assert_eq!(states[2], (v3, "done".to_string()));
}
