//! `[[target_sets]]`: one target per directory matching `paths`. A
//! directory pushed becomes a member at that commit (its first run's
//! trigger is `directory`), a removed one is orphaned — its history and
//! last applied state kept, nothing destroyed, nothing failed — and a
//! `[[targets]]` entry of a member's name overrides it; with
//! `destroy_removed` the removed member's destroy runs. `check` lists what
//! a set makes at the branch tip. Real git remotes, the real daemon,
//! signed GitHub pushes; one test with a policy judging one member, on
//! PostgreSQL.

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const SECRET: &str = "hook-secret-for-the-target-set-tests";

/// A set `s-` over `stacks/*` whose exec apply appends the directory's
/// `v` to `<root>/<dir>.applied` and whose destroy appends to
/// `<root>/<dir>.destroyed`; with `override_db`, `[[targets]]` entry
/// `s-db` overrides the member of `stacks/db` (it writes `db.override`).
fn setup(root: &Path, remote: &Remote, destroy_removed: bool, override_db: bool) -> Setup {
    setup_with(root, remote, destroy_removed, override_db, "")
}

/// As [`setup`], with `extra` keys in the set's table.
fn setup_with(
    root: &Path,
    remote: &Remote,
    destroy_removed: bool,
    override_db: bool,
    extra: &str,
) -> Setup {
    let secret = root.join("hook-secret");
    std::fs::write(&secret, SECRET).expect("write");
    let r = root.display();
    let apply = format!("echo \"$(cat v)\" >> {r}/\"$(basename \"$PWD\")\".applied");
    let destroy = format!("echo \"$(cat v)\" >> {r}/\"$(basename \"$PWD\")\".destroyed");
    let over = format!("echo \"$(cat v)\" >> {r}/db.override");
    let cfg = format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {secret}\n\n\
         [[target_sets]]\nname_prefix = \"s-\"\nrepo = \"{url}\"\npaths = \"stacks/*\"\n\
         interval = \"1h\"\ndestroy_removed = {destroy_removed}\n{extra}\
         [target_sets.backend]\nkind = \"exec\"\napply = [\"sh\", \"-c\", {apply}]\n\
         destroy = [\"sh\", \"-c\", {destroy}]\n\n{db}",
        secret = toml_str(&secret.display().to_string()),
        url = remote.url(),
        apply = toml_str(&apply),
        destroy = toml_str(&destroy),
        db = if override_db {
            exec_target(
                "s-db",
                &remote.url(),
                "path = \"stacks/db\"\ninterval = \"1h\"",
                &format!("apply = [\"sh\", \"-c\", {}]", toml_str(&over)),
            )
        } else {
            String::new()
        },
    );
    Setup::new(&cfg)
}

fn applied(root: &Path, name: &str) -> Vec<String> {
    log_lines(&root.join(name))
}

fn push(remote: &Remote, port: u16, sha: &str, changed: &[&str], id: &str) -> Value {
    let body = github_push_body(&remote.url(), sha, changed);
    let r = deliver_github_push(port, SECRET, &body, id);
    assert_eq!(r.status, 202, "{r:?}");
    r.json()
}

fn names(s: &Setup) -> Vec<String> {
    s.status()
        .iter()
        .map(|t| t["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn a_set_gains_a_member_when_its_directory_is_pushed_and_orphans_it_when_removed() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "homelab");
    remote.commit(
        &[
            ("stacks/web/v", "1"),
            ("stacks/db/v", "1"),
            ("stacks/notes.txt", "a file, not a directory"),
            ("other/v", "1"),
        ],
        "first",
    );
    let s = setup(root.path(), &remote, false, true);

    // check lists what the set makes at the tip: the override is not one.
    let out = s.run(&["check"]);
    let said = succeeded(&out, "check");
    assert!(
        said.contains("target_sets[s-]: `stacks/*` at ") && said.contains("makes 1 target(s)"),
        "{said}"
    );
    assert!(said.contains("  s-web: exec path stacks/web"), "{said}");

    let daemon = s.serve();
    wait_for(Duration::from_secs(60), "the members' first runs", || {
        applied(root.path(), "web.applied") == ["1"]
            && applied(root.path(), "db.override") == ["1"]
            && s.status().iter().all(|t| !t["last_result"].is_null())
    });
    let web = s.target_status("s-web");
    assert_eq!(web["target_set"], "s-", "{web}");
    assert_eq!(web["path"], "stacks/web", "{web}");
    assert!(s.target_status("s-db")["target_set"].is_null());
    let trigger = |runs: &[Value]| runs[0]["trigger"].as_str().unwrap_or_default().to_string();
    assert!(trigger(&s.history("s-web")).contains("directory"));
    assert!(
        !root.path().join("db.applied").exists(),
        "the override ran, not the member"
    );

    // A directory pushed is a member at that commit.
    let added = remote.commit(&[("stacks/cache/v", "1")], "add cache");
    let answer = push(
        &remote,
        daemon.port,
        &added,
        &["stacks/cache/v"],
        "add-cache",
    );
    // (The command writes before its run is recorded: wait for the record.)
    wait_for(Duration::from_secs(30), "the new member's run", || {
        applied(root.path(), "cache.applied") == ["1"]
            && s.history("s-cache")
                .first()
                .is_some_and(|r| !r["result"].is_null())
    });
    let runs = s.history("s-cache");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["sha"], added, "{runs:?}");
    assert!(trigger(&runs).contains("directory"), "{runs:?}");
    assert_eq!(runs[0]["result"], "changed", "{runs:?}");
    // The push itself queued the members it found (and no failure).
    assert!(answer["queued"].is_array(), "{answer}");

    // A directory removed: its member is orphaned, nothing destroyed or
    // failed, its history and last applied commit kept.
    let web_sha = s.target_status("s-web")["last_applied_sha"].clone();
    let web_runs = s.history("s-web").len();
    std::fs::remove_dir_all(remote.work.join("stacks/web")).expect("rm");
    let removed = remote.commit(&[("stacks/cache/v", "2")], "remove web");
    push(
        &remote,
        daemon.port,
        &removed,
        &["stacks/web/v", "stacks/cache/v"],
        "rm-web",
    );
    wait_for(Duration::from_secs(30), "web to be orphaned", || {
        s.target_status("s-web")["orphaned_since"].is_string()
            && applied(root.path(), "cache.applied") == ["1", "2"]
    });
    let web = s.target_status("s-web");
    assert_eq!(web["orphaned_at_sha"], removed, "{web}");
    assert_eq!(web["last_applied_sha"], web_sha, "{web}");
    assert!(web["destroyed_at"].is_null(), "{web}");
    assert!(!root.path().join("web.destroyed").exists());
    assert_eq!(
        s.history("s-web").len(),
        web_runs,
        "no run for a removed directory"
    );
    for t in s.status() {
        assert_ne!(t["last_result"], "failed", "{t}");
    }
    let said = text(&s.run(&["status"]).stdout);
    assert!(
        said.lines()
            .any(|l| l.starts_with("s-web ") && l.contains("orphaned (directory removed at")),
        "{said}"
    );

    // Across a restart the members are the database's until the set is
    // listed again; the orphan stays one and is never applied.
    assert!(daemon.stop().success());
    let daemon = s.serve();
    let out = s.run(&["tick", "s-web"]);
    assert!(!out.status.success(), "an orphan is not a target");
    assert!(
        text(&out.stderr).contains("`s-web`"),
        "{}",
        text(&out.stderr)
    );
    let mut all = names(&s);
    all.sort();
    assert_eq!(all, ["s-cache", "s-db", "s-web"]);

    // Put back, it is a member again at the commit that brought it.
    let back = remote.commit(&[("stacks/web/v", "3")], "web is back");
    push(&remote, daemon.port, &back, &["stacks/web/v"], "web-back");
    wait_for(Duration::from_secs(30), "web's return", || {
        applied(root.path(), "web.applied") == ["1", "3"]
            && s.target_status("s-web")["last_applied_sha"] == back
    });
    let web = s.target_status("s-web");
    assert!(web["orphaned_since"].is_null(), "{web}");
    assert_eq!(web["last_applied_sha"], back, "{web}");
    assert!(daemon.stop().success());
}

#[test]
fn destroy_removed_destroys_a_removed_member_and_a_push_to_an_empty_set_is_not_ignored() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "homelab");
    remote.commit(&[("readme", "no stacks yet")], "first");
    let s = setup(root.path(), &remote, true, false);
    let daemon = s.serve();

    // No member yet: the push is for the set all the same.
    let first = remote.commit(&[("stacks/app/v", "1")], "the first stack");
    let answer = push(
        &remote,
        daemon.port,
        &first,
        &["stacks/app/v"],
        "first-stack",
    );
    assert!(
        answer["ignored"].is_null(),
        "a push to a set's branch is not ignored: {answer}"
    );
    // (Its record, not only its command: a member never applied is not
    // destroyed.)
    wait_for(Duration::from_secs(30), "the first member's run", || {
        applied(root.path(), "app.applied") == ["1"]
            && s.target_status("s-app")["last_applied_sha"] == first
    });

    std::fs::remove_dir_all(remote.work.join("stacks/app")).expect("rm");
    let gone = remote.commit(&[("readme", "no stacks again")], "remove app");
    push(&remote, daemon.port, &gone, &["stacks/app/v"], "rm-app");
    wait_for(Duration::from_secs(30), "app's destroy", || {
        applied(root.path(), "app.destroyed") == ["1"]
    });
    wait_for(
        Duration::from_secs(10),
        "app to be marked destroyed",
        || s.target_status("s-app")["destroyed_at"].is_string(),
    );
    let runs = s.history("s-app");
    assert_eq!(runs[0]["operation"], "destroy", "{runs:?}");
    assert_eq!(runs[0]["trigger"], "directory", "{runs:?}");
    assert_eq!(
        runs[0]["sha"], first,
        "destroyed at what it last applied: {runs:?}"
    );
    let text = text(&s.run(&["status"]).stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("s-app ") && l.contains("destroyed (directory removed)")),
        "{text}"
    );
    assert!(daemon.stop().success());
}

/// Sets × windows: a removed member's destroy (`destroy_removed`) waits
/// while the set's change window is shut — the member stays, its destroy
/// pending, nothing destroyed — and runs at the first refresh once it is
/// open. The windows' clock is moved, as in `windows.rs` (a debug build
/// reads the offset from `DRIFTLESS_DEBUG_CLOCK_FILE`).
#[test]
fn a_removed_members_destroy_waits_for_the_sets_window() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "homelab");
    remote.commit(&[("readme", "no stacks yet")], "first");
    let clock = root.path().join("clock");
    // Two hours on: past the deny window, which is open.
    std::fs::write(&clock, "7200").expect("write");
    let window = format!(
        "windows = [{{ deny = \"{} - {} UTC\" }}]\n",
        utc_minute(-60),
        utc_minute(60)
    );
    let s = setup_with(root.path(), &remote, true, false, &window);
    let daemon = Daemon::start_with_clock(&s, &clock);
    let first = remote.commit(&[("stacks/app/v", "1")], "a stack");
    push(&remote, daemon.port, &first, &["stacks/app/v"], "add-app");
    wait_for(Duration::from_secs(30), "the member's apply", || {
        applied(root.path(), "app.applied") == ["1"]
            && s.target_status("s-app")["last_applied_sha"] == first
    });

    // Now: inside the deny window. The directory goes; the destroy waits.
    std::fs::write(&clock, "0").expect("write");
    std::fs::remove_dir_all(remote.work.join("stacks/app")).expect("rm");
    let gone = remote.commit(&[("readme", "no stacks again")], "remove app");
    push(&remote, daemon.port, &gone, &["stacks/app/v"], "rm-app");
    wait_for(Duration::from_secs(30), "the destroy held back", || {
        std::fs::read_to_string(&daemon.log)
            .is_ok_and(|l| l.contains("s-app") && l.contains("was not destroyed"))
    });
    assert!(
        applied(root.path(), "app.destroyed").is_empty(),
        "destroyed inside the deny window"
    );
    let member = s.target_status("s-app");
    assert!(member["destroyed_at"].is_null(), "{member}");
    assert!(names(&s).contains(&"s-app".to_string()), "still a member");

    // The window opens; the next refresh (a push) destroys it.
    std::fs::write(&clock, "7200").expect("write");
    let later = remote.commit(&[("readme", "still no stacks")], "later");
    push(&remote, daemon.port, &later, &["readme"], "later");
    wait_for(Duration::from_secs(30), "app's destroy", || {
        applied(root.path(), "app.destroyed") == ["1"]
    });
    wait_for(Duration::from_secs(10), "app marked destroyed", || {
        s.target_status("s-app")["destroyed_at"].is_string()
    });
    let runs = s.history("s-app");
    assert_eq!(runs[0]["operation"], "destroy", "{runs:?}");
    assert_eq!(runs[0]["trigger"], "directory", "{runs:?}");
    assert!(daemon.stop().success());
}

#[test]
fn a_one_shot_tick_lists_the_sets_first_and_runs_new_members_itself() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "homelab");
    remote.commit(&[("stacks/a/v", "1"), ("stacks/b/v", "1")], "first");
    let s = setup(root.path(), &remote, false, false);

    // No daemon ever ran: `tick --all` lists the set, then runs them all.
    succeeded(&s.run(&["tick", "--all"]), "tick --all");
    assert_eq!(applied(root.path(), "a.applied"), ["1"]);
    assert_eq!(applied(root.path(), "b.applied"), ["1"]);
    for t in s.status() {
        assert_eq!(t["queued"], false, "nothing left for a daemon: {t}");
    }

    // A new directory, named on the command line before anything knew it.
    remote.commit(&[("stacks/c/v", "1")], "add c");
    succeeded(&s.run(&["tick", "s-c"]), "tick s-c");
    assert_eq!(applied(root.path(), "c.applied"), ["1"]);

    // A removed one is orphaned by the next listing; the others run.
    std::fs::remove_dir_all(remote.work.join("stacks/b")).expect("rm");
    remote.commit(&[("stacks/a/v", "2")], "remove b");
    succeeded(&s.run(&["tick", "--all"]), "tick --all");
    assert_eq!(applied(root.path(), "a.applied"), ["1", "2"]);
    assert_eq!(applied(root.path(), "b.applied"), ["1"]);
    assert!(s.target_status("s-b")["orphaned_since"].is_string());
    for t in s.status() {
        assert_eq!(t["queued"], false, "{t}");
    }
}

#[test]
fn directories_that_make_no_target_are_told_once() {
    let sinks = tempfile::tempdir().expect("tempdir");
    let sink = Service::http_sink(sinks.path(), 0);
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "homelab");
    remote.commit(
        &[
            ("stacks/a_b/v", "1"),
            ("stacks/A_b/v", "1"),
            ("stacks/ok/v", "1"),
        ],
        "first",
    );
    let base = setup(root.path(), &remote, false, false);
    let cfg = std::fs::read_to_string(&base.config).expect("config");
    let cfg = cfg
        .replace(
            "[[target_sets]]\n",
            &format!(
                "[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\n[[target_sets]]\nnotify = [\"hook\"]\n",
                sink.port
            ),
        );
    std::fs::write(&base.config, cfg).expect("write");
    let s = base;
    let told = || -> Vec<Value> {
        sink.requests()
            .iter()
            .filter_map(|r| serde_json::from_str::<Value>(r["body"].as_str()?).ok())
            .collect()
    };
    let daemon = s.serve();
    wait_for(Duration::from_secs(30), "the refusal to be told", || {
        !told().is_empty() && applied(root.path(), "ok.applied") == ["1"]
    });
    let doc = &told()[0];
    assert_eq!(doc["target"], "target_sets[s-]", "{doc}");
    assert_eq!(doc["event"], "failed", "{doc}");
    let msg = doc["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("`stacks/A_b` and `stacks/a_b` both make target `s-a_b`"),
        "{msg}"
    );

    // Listed again with the same refusal: not told again.
    let next = remote.commit(&[("stacks/ok/v", "2")], "ok 2");
    push(&remote, daemon.port, &next, &["stacks/ok/v"], "ok-2");
    wait_for(Duration::from_secs(30), "ok's second run", || {
        applied(root.path(), "ok.applied") == ["1", "2"]
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(told().len(), 1, "{:?}", told());

    // Resolved: the member is made.
    std::fs::remove_dir_all(remote.work.join("stacks/A_b")).expect("rm");
    let fixed = remote.commit(&[("readme", "renamed")], "one a_b");
    push(&remote, daemon.port, &fixed, &["stacks/A_b/v"], "fixed");
    wait_for(Duration::from_secs(30), "s-a_b's run", || {
        applied(root.path(), "a_b.applied") == ["1"]
    });
    assert!(daemon.stop().success());
}

/// With `destroy_removed`, a pushed directory whose name maps to an
/// existing member's (`A_b` beside `a_b`, `..x` beside `x`) is refused —
/// the member keeps its name, its directory and its state, and nothing is
/// destroyed — and a symbolic link where a directory is looked for is
/// refused by name, never followed or skipped in silence.
#[test]
fn a_pushed_directory_never_takes_a_members_name_nor_destroys_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "homelab");
    remote.commit(
        &[
            ("stacks/a_b/v", "1"),
            ("stacks/x/v", "1"),
            ("stacks/ok/v", "1"),
        ],
        "first",
    );
    let s = setup(root.path(), &remote, true, false);
    // One-shot ticks: `tick --all` lists the set (the same refresh a
    // daemon runs after a push) before it runs the members, so what the
    // listing destroyed is done when it returns.
    succeeded(&s.run(&["tick", "--all"]), "tick --all");
    for d in ["a_b", "x", "ok"] {
        assert_eq!(applied(root.path(), &format!("{d}.applied")), ["1"]);
    }
    remote.commit(
        &[("stacks/A_b/v", "new"), ("stacks/..x/v", "new")],
        "lookalikes",
    );
    remote.symlink("stacks/link", "../elsewhere", "a link");
    remote.commit(&[("stacks/ok/v", "2")], "ok 2");
    let out = s.run(&["tick", "--all"]);
    let said = text(&out.stderr);
    assert!(
        said.contains("`stacks/..x`") && said.contains("`stacks/A_b`"),
        "{said}"
    );
    assert_eq!(applied(root.path(), "ok.applied"), ["1", "2"]);
    // The set was listed at the tip: nothing was destroyed, and the
    // members keep their directories.
    for d in ["a_b", "x", "A_b", "..x"] {
        assert!(
            applied(root.path(), &format!("{d}.destroyed")).is_empty(),
            "{d} was destroyed"
        );
    }
    for (name, dir) in [("s-a_b", "stacks/a_b"), ("s-x", "stacks/x")] {
        let st = s.target_status(name);
        assert!(st["destroyed_at"].is_null(), "{st}");
        assert!(st["orphaned_since"].is_null(), "{st}");
        assert_eq!(st["path"], dir, "{st}");
    }
    assert_eq!(applied(root.path(), "A_b.applied"), Vec::<String>::new());
    let shown = text(&s.run(&["status"]).stdout);
    assert!(!shown.contains("destroyed"), "{shown}");
    // `check` names the link among what the tip refuses.
    let out = s.run(&["check"]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(said.contains("`stacks/link` is a symbolic link"), "{said}");
}

/// A paused member runs nothing, its destroy included: with
/// `destroy_removed`, removing its directory leaves it a paused member
/// (`tick --all` destroys nothing and the pause stays) until `resume`,
/// after which the next listing destroys it.
#[test]
fn a_paused_members_destroy_waits_for_resume() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "homelab");
    remote.commit(&[("stacks/app/v", "1"), ("stacks/ok/v", "1")], "first");
    let s = setup(root.path(), &remote, true, false);
    succeeded(&s.run(&["tick", "--all"]), "tick --all");
    assert_eq!(applied(root.path(), "app.applied"), ["1"]);
    succeeded(&s.run(&["pause", "s-app"]), "pause");
    std::fs::remove_dir_all(remote.work.join("stacks/app")).expect("rm");
    remote.commit(&[("stacks/ok/v", "2")], "remove app");
    succeeded(&s.run(&["tick", "--all"]), "tick --all");
    assert_eq!(applied(root.path(), "ok.applied"), ["1", "2"]);
    assert!(
        applied(root.path(), "app.destroyed").is_empty(),
        "a paused member was destroyed"
    );
    let st = s.target_status("s-app");
    assert_eq!(st["paused"], true, "{st}");
    assert!(st["destroyed_at"].is_null(), "{st}");
    succeeded(&s.run(&["resume", "s-app"]), "resume");
    succeeded(&s.run(&["tick", "--all"]), "tick --all");
    assert_eq!(applied(root.path(), "app.destroyed"), ["1"]);
}

/// Policies × target sets × PostgreSQL: a policy whose `targets` glob names
/// one member judges that member's plans only; its denial holds it at the
/// denied commit (recorded on PostgreSQL as a failed deployment decided by
/// `policy`) while the other member applies the same push; the next allowed
/// commit applies.
#[test]
fn a_policy_judges_the_set_members_it_names_on_postgresql() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "homelab");
    remote.commit(&[("stacks/web/v", "1"), ("stacks/db/v", "1")], "first");
    let policy = root.path().join("no_nine.rego");
    std::fs::write(
        &policy,
        "package main\n\nimport rego.v1\n\n\
         deny contains \"v may not be 9\" if {\n\tsome c in input.changes\n\tstartswith(c.address, \"v 9\")\n}\n",
    )
    .expect("policy");
    let r = root.path().display();
    let apply = format!("echo \"$(cat v)\" >> {r}/\"$(basename \"$PWD\")\".applied");
    let s = Setup::new(&format!(
        "{}[[target_sets]]\nname_prefix = \"s-\"\nrepo = \"{}\"\npaths = \"stacks/*\"\ninterval = \"1h\"\n\
         [target_sets.backend]\nkind = \"exec\"\nplan = [\"sh\", \"-c\", \"echo \\\"~ v $(cat v)\\\"\"]\n\
         apply = [\"sh\", \"-c\", {}]\n\n\
         [[policies]]\nname = \"no-nine\"\nfiles = [{}]\ntargets = [\"s-web\"]\n",
        postgres_table(),
        remote.url(),
        toml_str(&apply),
        toml_str(&policy.display().to_string()),
    ));
    succeeded(&s.run(&["tick", "--all"]), "tick --all");
    assert_eq!(applied(root.path(), "web.applied"), ["1"]);
    assert_eq!(applied(root.path(), "db.applied"), ["1"]);

    let nine = remote.commit(&[("stacks/web/v", "9"), ("stacks/db/v", "9")], "nine");
    let out = s.run(&["tick", "--all"]);
    assert!(!out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        applied(root.path(), "db.applied"),
        ["1", "9"],
        "s-db is not covered"
    );
    assert_eq!(
        applied(root.path(), "web.applied"),
        ["1"],
        "a denied plan applied"
    );
    let web = s.target_status("s-web");
    assert_eq!(web["last_result"], "failed", "{web}");
    let msg = web["last_message"].as_str().unwrap_or("");
    assert!(
        msg.contains("denied by policy `no-nine`: v may not be 9")
            && msg.contains("nothing applied"),
        "{web}"
    );
    // The refusal is on record, on PostgreSQL: the deployment's events.
    let out = s.run(&["events", "s-web", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events: Value = serde_json::from_slice(&out.stdout).expect("events --json");
    let refused: Vec<&Value> = events
        .as_array()
        .map(|e| e.iter().filter(|e| e["actor"] == "policy").collect())
        .unwrap_or_default();
    assert_eq!(refused.len(), 1, "{events:#}");
    assert_eq!(
        (&refused[0]["to"], &refused[0]["message"]),
        (
            &"failed".into(),
            &"denied by policy `no-nine`: v may not be 9".into()
        ),
        "{events:#}"
    );
    assert!(
        msg.contains(&nine[..12]),
        "the denied commit is named: {web}"
    );

    // Held: another tick at the same commit applies nothing, asks nothing.
    let _ = s.run(&["tick", "s-web"]);
    assert_eq!(applied(root.path(), "web.applied"), ["1"]);

    remote.commit(&[("stacks/web/v", "2")], "two");
    succeeded(&s.run(&["tick", "--all"]), "tick --all");
    assert_eq!(applied(root.path(), "web.applied"), ["1", "2"]);
    assert_eq!(applied(root.path(), "db.applied"), ["1", "9"]);
}
