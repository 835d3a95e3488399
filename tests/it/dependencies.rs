//! Targets that depend on each other (`depends_on`): a push converging a
//! chain in order while an independent target runs beside it, the order
//! kept across a `kill -9` of the daemon, a failed dependency blocking its
//! dependents (told once) until it recovers, and `check` / `graph` on the
//! configuration.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const SECRET: &str = "hook-secret-for-the-dependency-tests";

/// An exec target that logs `start <name>` and `end <name>` around its
/// apply (which takes `secs` and fails while its `v` file says `bad`), and
/// appends the `v` it applied to `<name>.applied`.
fn chain_target(
    root: &Path,
    repo: &str,
    name: &str,
    after: &[&str],
    secs: u32,
    notify: bool,
) -> String {
    let log = root.join("order.log");
    let applied = root.join(format!("{name}.applied"));
    let deps = if after.is_empty() {
        String::new()
    } else {
        format!(
            "depends_on = [{}]\n",
            after
                .iter()
                .map(|d| format!("\"{d}\""))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let notify = if notify { "notify = [\"hook\"]\n" } else { "" };
    let script = format!(
        "echo start {name} >> {log}; sleep {secs}; \
         if [ \"$(cat v)\" = bad ]; then echo refused >&2; exit 1; fi; \
         echo \"$(cat v)\" >> {applied}; echo end {name} >> {log}",
        log = log.display(),
        applied = applied.display(),
    );
    exec_target(
        name,
        repo,
        &format!("path = \"{name}\"\ninterval = \"1h\"\n{deps}{notify}"),
        &format!("apply = [\"sh\", \"-c\", {}]", toml_str(&script)),
    )
}

struct World {
    root: tempfile::TempDir,
    remote: Remote,
    /// network's own repository, with `split`; else `remote` holds it too.
    net: Option<Remote>,
    setup: Setup,
}

/// network ← dns ← app, and `other` on its own; a GitHub receiver and,
/// with `sink`, a webhook notifier every target tells.
fn world(sink: Option<&Service>, slow: u32, split: bool) -> World {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("network/v", "1"),
            ("dns/v", "1"),
            ("app/v", "1"),
            ("other/v", "1"),
        ],
        "first",
    );
    let net = split.then(|| {
        let net = Remote::new(root.path(), "net");
        net.commit(&[("network/v", "1")], "first");
        net
    });
    let secret = root.path().join("hook-secret");
    std::fs::write(&secret, SECRET).expect("write");
    let mut cfg = format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n",
        toml_str(&secret.display().to_string())
    );
    if let Some(sink) = sink {
        cfg.push_str(&format!(
            "[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\n",
            sink.port
        ));
    }
    let (r, u, n) = (root.path(), remote.url(), sink.is_some());
    // The dependents come first in the file: the order is the graph's, not
    // the configuration's.
    let targets = [
        chain_target(r, &u, "app", &["dns"], 0, n),
        chain_target(r, &u, "dns", &["network"], 0, n),
        chain_target(
            r,
            &net.as_ref().map_or_else(|| u.clone(), Remote::url),
            "network",
            &[],
            slow,
            n,
        ),
        chain_target(r, &u, "other", &[], slow, n),
    ]
    .concat();
    cfg.push_str(&targets);
    let setup = Setup::new(&cfg);
    World {
        root,
        remote,
        net,
        setup,
    }
}

fn order_log(w: &World) -> Vec<String> {
    log_lines(&w.root.path().join("order.log"))
}

fn applied(w: &World, name: &str) -> Vec<String> {
    log_lines(&w.root.path().join(format!("{name}.applied")))
}

fn idle(w: &World) -> bool {
    w.setup
        .status()
        .iter()
        .all(|t| t["queued"] == false && t["running"] == false && !t["last_result"].is_null())
}

/// Commit `files` and deliver the push; with a split world, network's
/// files go to its own repository, pushed first. The last commit made.
fn push(w: &World, port: u16, files: &[(&str, &str)], id: &str) -> String {
    let (own, rest): (Vec<_>, Vec<_>) = files
        .iter()
        .partition(|(p, _)| w.net.is_some() && p.starts_with("network/"));
    let mut sha = String::new();
    for (remote, files, id) in [
        (w.net.as_ref(), own, format!("{id}-net")),
        (Some(&w.remote), rest, id.to_string()),
    ] {
        let Some(remote) = remote.filter(|_| !files.is_empty()) else {
            continue;
        };
        sha = remote.commit(&files, &id);
        let changed: Vec<&str> = files.iter().map(|(p, _)| *p).collect();
        let body = github_push_body(&remote.url(), &sha, &changed);
        let r = deliver_github_push(port, SECRET, &body, &id);
        assert_eq!(r.status, 202, "{r:?}");
    }
    sha
}

/// In `lines` (from `order.log`), no target starts while a target it
/// depends on is running, or before that one has ended once.
fn assert_in_order(lines: &[String]) {
    let deps = [("dns", "network"), ("app", "dns")];
    let mut running: Vec<&str> = Vec::new();
    let mut ended: Vec<&str> = Vec::new();
    for l in lines {
        let (what, name) = l.split_once(' ').expect("`start x` or `end x`");
        if what == "start" {
            for (t, d) in deps {
                if t == name {
                    assert!(
                        !running.contains(&d) && ended.contains(&d),
                        "{name} started before {d} had finished: {lines:?}"
                    );
                }
            }
            running.push(name);
        } else {
            running.retain(|r| *r != name);
            ended.push(name);
        }
    }
}

#[test]
fn a_push_converges_a_chain_in_dependency_order_and_the_order_survives_kill_9() {
    let w = world(None, 2, false);
    let daemon = w.setup.serve();
    // The first interval ticks of never-run targets: all four queued at
    // once, claimed in the graph's order.
    wait_for(Duration::from_secs(60), "the first round", || idle(&w));
    let first = order_log(&w);
    assert_eq!(first.len(), 8, "{first:?}");
    assert_in_order(&first);

    let sha = push(
        &w,
        daemon.port,
        &[
            ("network/v", "2"),
            ("dns/v", "2"),
            ("app/v", "2"),
            ("other/v", "2"),
        ],
        "all-2",
    );
    // While network applies, dns and app wait on it (and app on dns), and
    // the independent target runs beside it.
    wait_for(Duration::from_secs(30), "dns to wait on network", || {
        let s = w.setup.target_status("dns");
        s["queued"] == true && s["waiting_on"] == serde_json::json!(["network"])
    });
    let app = w.setup.target_status("app");
    assert_eq!(app["depends_on"], serde_json::json!(["dns"]), "{app}");
    assert_eq!(
        app["waiting_on"],
        serde_json::json!(["dns", "network"]),
        "{app}"
    );
    let text = text(&w.setup.run(&["status"]).stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("dns ") && l.contains("waiting on network")),
        "{text}"
    );
    wait_for(Duration::from_secs(30), "the second round", || idle(&w));
    let second = order_log(&w)[first.len()..].to_vec();
    assert_eq!(second.len(), 8, "{second:?}");
    assert_in_order(&second);
    let (net_end, other_start) = (
        second.iter().position(|l| l == "end network"),
        second.iter().position(|l| l == "start other"),
    );
    assert!(
        other_start < net_end,
        "the independent target waited for the chain: {second:?}"
    );
    assert_eq!(w.setup.history("app")[0]["sha"], sha);
    // The queue held them back: none of their runs had to be blocked.
    for t in ["dns", "app"] {
        let runs = w.setup.history(t);
        assert!(runs.iter().all(|r| r["result"] == "changed"), "{runs:?}");
    }

    // kill -9 while network applies: its orphaned command runs on, the new
    // daemon runs network's job again, and dns and app still come after.
    let seen = order_log(&w).len();
    push(
        &w,
        daemon.port,
        &[("network/v", "3"), ("dns/v", "3"), ("app/v", "3")],
        "all-3",
    );
    wait_for(Duration::from_secs(30), "network to start", || {
        order_log(&w)[seen..].contains(&"start network".to_string())
    });
    daemon.kill9();
    let daemon = w.setup.serve();
    wait_for(Duration::from_secs(60), "the third round", || {
        idle(&w) && applied(&w, "app").last().map(String::as_str) == Some("3")
    });
    let third = order_log(&w)[seen..].to_vec();
    assert_in_order(&third);
    assert_eq!(applied(&w, "dns").last().map(String::as_str), Some("3"));
    drop(daemon);
}

/// The notifications the sink received, as (target, event).
fn told(sink: &Service) -> Vec<(String, String)> {
    sink.requests()
        .iter()
        .filter_map(|r| serde_json::from_str::<Value>(r["body"].as_str()?).ok())
        .map(|d| {
            (
                d["target"].as_str().unwrap_or("").to_string(),
                d["event"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn a_failed_dependency_blocks_its_dependents_told_once_until_it_recovers() {
    let sinks = tempfile::tempdir().expect("tempdir");
    let sink = Service::http_sink(sinks.path(), 0);
    let w = world(Some(&sink), 0, true);
    let daemon = w.setup.serve();
    wait_for(Duration::from_secs(60), "the first round", || idle(&w));
    let applied_sha = |t: &str| w.setup.target_status(t)["last_applied_sha"].clone();
    let (dns_sha, app_sha) = (applied_sha("dns"), applied_sha("app"));
    assert!(
        dns_sha.is_string() && app_sha.is_string(),
        "{dns_sha} {app_sha}"
    );

    // network fails: dns does not run (blocked by network), nor app
    // (blocked by dns); each told once.
    push(
        &w,
        daemon.port,
        &[("network/v", "bad"), ("dns/v", "2"), ("app/v", "2")],
        "bad-1",
    );
    wait_for(Duration::from_secs(30), "app blocked", || {
        idle(&w) && w.setup.target_status("app")["last_result"] == "blocked"
    });
    let dns = w.setup.history("dns");
    assert_eq!(dns[0]["result"], "blocked", "{dns:?}");
    let why = dns[0]["message"].as_str().unwrap_or("");
    assert!(
        why.starts_with("blocked by `network`: its last run failed"),
        "{why}"
    );
    let why = w.setup.history("app")[0]["message"].to_string();
    assert!(why.contains("blocked by `dns`"), "{why}");
    assert_eq!(applied(&w, "dns"), ["1"], "a blocked target ran");
    assert_eq!(applied(&w, "app"), ["1"], "a blocked target ran");
    // A blocked run keeps the commit last applied: nothing of the new one
    // was applied.
    assert_eq!(
        (applied_sha("dns"), applied_sha("app")),
        (dns_sha.clone(), app_sha.clone()),
        "a blocked run moved the commit last applied"
    );

    // Another push while network still fails: blocked again, not told again.
    push(
        &w,
        daemon.port,
        &[("network/w", "x"), ("dns/v", "3"), ("app/v", "3")],
        "bad-2",
    );
    wait_for(Duration::from_secs(30), "the second blocked round", || {
        idle(&w)
            && w.setup
                .history("app")
                .iter()
                .filter(|r| r["result"] == "blocked")
                .count()
                == 2
    });
    wait_for(Duration::from_secs(30), "the notifications", || {
        told(&sink).len() >= 3
    });
    std::thread::sleep(Duration::from_secs(2));
    let mut events = told(&sink);
    events.sort();
    let pair = |t: &str, e: &str| (t.to_string(), e.to_string());
    assert_eq!(
        events,
        [
            pair("app", "blocked"),
            pair("dns", "blocked"),
            pair("network", "failed")
        ],
        "told more than once"
    );

    // network recovers: dns and app run again with no push of their own,
    // applying what was pushed meanwhile, in order.
    let seen = order_log(&w).len();
    push(&w, daemon.port, &[("network/v", "4")], "good");
    wait_for(Duration::from_secs(30), "app to run again", || {
        idle(&w) && applied(&w, "app").last().map(String::as_str) == Some("3")
    });
    assert_eq!(applied(&w, "dns").last().map(String::as_str), Some("3"));
    assert_in_order(&order_log(&w)[seen..]);
    let app = &w.setup.history("app")[0];
    // The push queued app too, but left its files alone: without the
    // dependency's wake-up its job would close as unaffected.
    assert!(
        app["trigger"]
            .as_str()
            .is_some_and(|t| t.contains("dependency")),
        "{app}"
    );
    wait_for(Duration::from_secs(30), "the recoveries", || {
        told(&sink).len() >= 6
    });
    let recovered: Vec<String> = told(&sink)
        .into_iter()
        .filter(|(_, e)| e == "recovered")
        .map(|(t, _)| t)
        .collect();
    assert_eq!(recovered.len(), 3, "{recovered:?}");
    for t in ["network", "dns", "app"] {
        assert!(recovered.contains(&t.to_string()), "{t}: {recovered:?}");
    }
    drop(daemon);
}

fn config_with(dir: &Path, targets: &[(&str, &str)]) -> PathBuf {
    let remote = dir.join("repo.git");
    if !remote.exists() {
        Remote::new(dir, "repo").commit(&[("x", "1")], "first");
    }
    let mut cfg = format!(
        "state_dir = {}\n",
        toml_str(&dir.join("state").display().to_string())
    );
    for (name, deps) in targets {
        cfg.push_str(&exec_target(
            name,
            &remote.display().to_string(),
            &format!("depends_on = {deps}"),
            "apply = [\"true\"]",
        ));
    }
    let path = dir.join("driftless.toml");
    std::fs::write(&path, cfg).expect("write");
    path
}

fn driftless(config: &Path, args: &[&str]) -> (bool, String) {
    let out = output_within(
        std::process::Command::new(bin())
            .arg("--config")
            .arg(config)
            .args(args),
        Duration::from_secs(60),
    );
    (out.status.success(), text(&out.stdout) + &text(&out.stderr))
}

#[test]
fn check_refuses_cycles_and_unknown_names_and_graph_prints_the_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cyclic = config_with(
        dir.path(),
        &[
            ("a", "[\"c\"]"),
            ("b", "[\"a\"]"),
            ("c", "[\"b\"]"),
            ("d", "[]"),
        ],
    );
    let (ok, said) = driftless(&cyclic, &["check"]);
    assert!(!ok, "{said}");
    assert!(said.contains("a → c → b → a"), "{said}");
    assert!(said.contains("depends_on"), "{said}");
    let (ok, said) = driftless(&cyclic, &["graph"]);
    assert!(!ok && said.contains("cycle"), "{said}");

    let unknown = config_with(dir.path(), &[("a", "[\"nope\"]"), ("b", "[\"b\"]")]);
    let (ok, said) = driftless(&unknown, &["check"]);
    assert!(!ok, "{said}");
    assert!(
        said.contains("targets[a]") && said.contains("no target named `nope`"),
        "{said}"
    );
    assert!(
        said.contains("targets[b]") && said.contains("the target itself"),
        "{said}"
    );

    let inputs = config_with(
        dir.path(),
        &[(
            "a",
            "[]\ninputs = { \"1X\" = \"b.outputs.c\", Y = \"nonsense\", Z = \"ghost.outputs.id\" }",
        )],
    );
    let (ok, said) = driftless(&inputs, &["check"]);
    assert!(!ok, "{said}");
    for wanted in [
        "key `inputs.1X`: an input's name must be an environment variable name",
        "key `inputs.Y`: `nonsense` is not `<target>.outputs.<output>`",
        "no target named `ghost`",
    ] {
        assert!(said.contains(wanted), "{wanted}: {said}");
    }

    let fine = config_with(
        dir.path(),
        &[
            ("vms", "[\"network\", \"dns\"]"),
            ("dns", "[\"network\"]"),
            ("network", "[]"),
            ("mail", "[]"),
        ],
    );
    let (ok, said) = driftless(&fine, &["check"]);
    assert!(ok, "{said}");
    assert!(said.contains("after network, dns"), "{said}");
    let (ok, said) = driftless(&fine, &["graph"]);
    assert!(ok, "{said}");
    assert_eq!(
        said,
        "1.\n  network\n  mail\n2.\n  dns (after network)\n3.\n  vms (after network, dns)\n"
    );
    let (ok, said) = driftless(&fine, &["graph", "--dot"]);
    assert!(ok, "{said}");
    for edge in [
        "\"network\" -> \"vms\";",
        "\"dns\" -> \"vms\";",
        "\"network\" -> \"dns\";",
    ] {
        assert!(said.contains(edge), "{edge}: {said}");
    }
    assert!(said.starts_with("digraph"), "{said}");
}

/// A sensitive terraform output passed as an input.
const CANARY: &str = "canary-sensitive-output-0f3a9c";

/// terraform's output taken as an exec target's input: applied in order,
/// passed as the variable named, and a changed output runs the target
/// that takes it again with no change to its own files; an input naming an
/// output that does not exist fails the run, naming both.
#[test]
fn a_terraform_output_reaches_an_exec_target_and_its_change_runs_it_again() {
    let root = tempfile::tempdir().expect("tempdir");
    let net = Remote::new(root.path(), "net");
    net.commit(
        &[
            (
                "network/main.tf",
                "variable \"v\" {\n  type = string\n}\n\
                 resource \"terraform_data\" \"net\" {\n  input = var.v\n}\n\
                 output \"vpc_id\" {\n  value = \"vpc-${terraform_data.net.output}\"\n}\n\
                 variable \"t\" {\n  type = string\n  sensitive = true\n}\n\
                 output \"token\" {\n  value = var.t\n  sensitive = true\n}\n",
            ),
            ("network/net.auto.tfvars", "v = \"1\"\n"),
            ("network/token.auto.tfvars", &format!("t = \"{CANARY}\"\n")),
        ],
        "first",
    );
    let apps = Remote::new(root.path(), "apps");
    apps.commit(&[("dns/zone", "example.net\n")], "first");
    let secret = root.path().join("hook-secret");
    std::fs::write(&secret, SECRET).expect("write");
    let applied = root.path().join("dns.applied");
    let token = root.path().join("dns.token");
    let s = Setup::new(&format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n\
         [[targets]]\nname = \"network\"\nrepo = {}\npath = \"network\"\ninterval = \"1h\"\ntimeout = \"2m\"\n\
         [targets.backend]\nkind = \"terraform\"\nenv = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n\n{}{}",
        toml_str(&secret.display().to_string()),
        toml_str(&net.url()),
        exec_target(
            "dns",
            &apps.url(),
            "path = \"dns\"\ninterval = \"1h\"\n\
             inputs = { VPC_ID = \"network.outputs.vpc_id\", TOKEN = \"network.outputs.token\" }",
            &format!(
                "apply = [\"sh\", \"-c\", {}]",
                toml_str(&format!(
                    "echo \"$VPC_ID $(cat zone)\" >> {}; echo \"$TOKEN\" > {}; echo \"token is $TOKEN\"",
                    applied.display(),
                    token.display()
                ))
            ),
        ),
        exec_target(
            "mail",
            &apps.url(),
            "path = \"dns\"\ninterval = \"1h\"\ninputs = { X = \"network.outputs.nope\" }",
            "apply = [\"true\"]",
        ),
    ));
    let daemon = s.serve();
    let settled = |runs: usize| {
        s.status()
            .iter()
            .all(|t| t["queued"] == false && t["running"] == false && !t["last_result"].is_null())
            && s.history("dns").len() >= runs
    };
    wait_for(Duration::from_secs(120), "the first round", || settled(1));
    assert_eq!(log_lines(&applied), ["vpc-1 example.net"]);
    let dns = &s.history("dns")[0];
    assert_eq!(dns["result"], "changed", "{dns}");
    // The sensitive output reached the command, and nothing driftless
    // shows or keeps: masked in the run's output, not in the database
    // (terraform's own state holds it, by terraform's design).
    assert_eq!(log_lines(&token), [CANARY]);
    let tail = dns["output_tail"].as_str().unwrap_or("");
    assert!(tail.contains("token is [REDACTED]"), "{dns}");
    let shown = text(&s.run(&["outputs", "network"]).stdout);
    assert!(shown.contains("token = (sensitive)"), "{shown}");
    let mail = &s.history("mail")[0];
    assert_eq!(mail["result"], "failed", "{mail}");
    assert!(
        mail["message"].as_str().is_some_and(|m| m
            .contains("input `X`: `network` has no output `nope` (its outputs: token, vpc_id)")),
        "{mail}"
    );

    // A push to network's repository alone: its output changes, and dns
    // runs again with the new value though nothing of its own changed.
    let sha = net.commit(&[("network/net.auto.tfvars", "v = \"2\"\n")], "v2");
    let body = github_push_body(&net.url(), &sha, &["network/net.auto.tfvars"]);
    let r = deliver_github_push(daemon.port, SECRET, &body, "net-v2");
    assert_eq!(r.status, 202, "{r:?}");
    wait_for(Duration::from_secs(120), "dns to run again", || settled(2));
    assert_eq!(
        log_lines(&applied),
        ["vpc-1 example.net", "vpc-2 example.net"]
    );
    assert_eq!(s.history("dns")[0]["trigger"], "dependency");
    assert_eq!(log_lines(&token), [CANARY]);
    // An interval round later: the same input, nothing to do.
    let out = s.run(&["tick", "dns"]);
    assert!(
        text(&out.stdout).contains("dns: no_change"),
        "{}",
        text(&out.stdout)
    );
    let said = daemon.log_text() + &text(&out.stdout) + &text(&out.stderr);
    drop(daemon);
    assert!(!said.contains(CANARY), "the sensitive output is in the log");
    for f in ["driftless.db", "driftless.db-wal"] {
        let bytes = std::fs::read(s.state.join(f)).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(CANARY),
            "the sensitive output is in {f}"
        );
    }
}

/// A producer under `policy = "approval"`: while its plan waits, the
/// target taking its output is blocked; once the plan is approved and
/// applied, its outputs are recorded and the taker runs with them.
#[test]
fn an_approved_plans_outputs_reach_the_target_that_waited_for_it() {
    const OPS: &str = "ops-token-dependencies-approval-7";
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("base/v", "1\n"), ("app/x", "1\n")], "first");
    let got = root.path().join("app.got");
    let s = Setup::new(&format!(
        "{}{}{}",
        token_table("ops", OPS, &["approve:base", "read"]),
        exec_target(
            "base",
            &remote.url(),
            "path = \"base\"\ninterval = \"1h\"\npolicy = \"approval\"",
            "apply = [\"true\"]\nplan = [\"sh\", \"-c\", \"echo \\\"~ v (to $(cat v))\\\"\"]\n\
             outputs = [\"sh\", \"-c\", \"echo \\\"{\\\\\\\"v\\\\\\\": \\\\\\\"$(cat v)\\\\\\\"}\\\"\"]",
        ),
        exec_target(
            "app",
            &remote.url(),
            "path = \"app\"\ninterval = \"1h\"\ninputs = { BASE_V = \"base.outputs.v\" }",
            &format!(
                "apply = [\"sh\", \"-c\", {}]",
                toml_str(&format!("echo \"$BASE_V\" >> {}", got.display()))
            ),
        ),
    ));
    let daemon = s.serve();
    let who = Approver {
        port: daemon.port,
        token: OPS,
    };
    wait_for(Duration::from_secs(60), "base's plan to wait", || {
        !who.pending().is_empty() && s.target_status("app")["last_result"] == "blocked"
    });
    let why = s.history("app")[0]["message"].to_string();
    assert!(
        why.contains("blocked by `base`: its plan waits for approval"),
        "{why}"
    );
    let pending = who.pending();
    who.approve(&pending[0]);
    wait_for(
        Duration::from_secs(60),
        "app to run with base's output",
        || !log_lines(&got).is_empty(),
    );
    assert_eq!(log_lines(&got), ["1"]);
    let app = &s.history("app")[0];
    assert_eq!(
        app["result"],
        "changed",
        "app: {:#?}\nbase: {:#?}",
        s.history("app"),
        s.history("base")
    );
    drop(daemon);
}

/// The chain, one step each: terraform produces `vpc_id`; an exec
/// target takes it as `VPC_ID` and produces `greeting` from it; a compose
/// project takes that for interpolation (`${GREETING}`). `tick --all`
/// converges them in order, and a change of terraform's variable reaches
/// the container's environment through both.
#[test]
fn terraform_exec_and_compose_converge_as_a_chain_passing_outputs() {
    let root = tempfile::tempdir().expect("tempdir");
    let docker = Dockerd::start(root.path());
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            (
                "network/main.tf",
                "variable \"v\" {\n  type = string\n}\n\
                 resource \"terraform_data\" \"net\" {\n  input = var.v\n}\n\
                 output \"vpc_id\" {\n  value = \"vpc-${terraform_data.net.output}\"\n}\n",
            ),
            ("network/net.auto.tfvars", "v = \"1\"\n"),
            ("dns/zone", "example.net\n"),
            (
                "app/compose.yaml",
                &format!(
                    "services:\n  web:\n    image: {TEST_IMAGE}\n    command: [\"sh\", \"-c\", \"sleep 3600\"]\n    \
                     network_mode: none\n    environment:\n      GREETING: ${{GREETING:-unset}}\n"
                ),
            ),
        ],
        "first",
    );
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"app\"\nrepo = {repo}\npath = \"app\"\n\
         inputs = {{ GREETING = \"dns.outputs.greeting\" }}\n\
         [targets.backend]\nkind = \"compose\"\ncommand = \"docker-compose\"\nhost = \"{host}\"\n\n\
         [[targets]]\nname = \"network\"\nrepo = {repo}\npath = \"network\"\ntimeout = \"2m\"\n\
         [targets.backend]\nkind = \"terraform\"\nenv = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n\n{dns}",
        repo = toml_str(&remote.url()),
        host = docker.host,
        dns = exec_target(
            "dns",
            &remote.url(),
            "path = \"dns\"\ninputs = { VPC_ID = \"network.outputs.vpc_id\" }",
            "apply = [\"true\"]\n\
             outputs = [\"sh\", \"-c\", \"echo \\\"{\\\\\\\"greeting\\\\\\\": \\\\\\\"hi-$VPC_ID\\\\\\\"}\\\"\"]",
        ),
    ));
    let env = || {
        text(
            &docker
                .docker(&["inspect", "--format", "{{json .Config.Env}}", "app_web_1"])
                .stdout,
        )
    };
    let tick_all = || {
        let out = s.run(&["tick", "--all"]);
        let said = text(&out.stdout) + &text(&out.stderr);
        assert!(out.status.success(), "{said}");
        text(&out.stdout)
    };
    let said = tick_all();
    let at = |t: &str| {
        said.find(&format!("{t}: "))
            .unwrap_or_else(|| panic!("{t} not ticked: {said}"))
    };
    assert!(at("network") < at("dns") && at("dns") < at("app"), "{said}");
    assert!(env().contains("GREETING=hi-vpc-1"), "{}", env());

    remote.commit(&[("network/net.auto.tfvars", "v = \"2\"\n")], "v2");
    let said = tick_all();
    assert!(said.contains("app: changed"), "{said}");
    assert!(env().contains("GREETING=hi-vpc-2"), "{}", env());
    // Nothing new: nothing to do anywhere.
    let said = tick_all();
    for t in ["network", "dns", "app"] {
        assert!(said.contains(&format!("{t}: no_change")), "{said}");
    }
}

/// A plan a person approves is the plan that runs, inputs included: a
/// terraform target under `policy = "approval"` takes `greeting` from an
/// exec target. When the producer's output changes in a commit that leaves
/// the consumer's files alone, an approved plan made with the old value is
/// not applied — the run says "inputs changed: `greeting`", never "the plan
/// changed" — and a waiting one is superseded the same way; the new plan,
/// approved, applies the new value.
#[test]
fn an_approved_plan_made_with_old_inputs_is_superseded_not_applied() {
    const OPS: &str = "ops-token-dependencies-identity-41";
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("base/v", "1"),
            ("base/out.sh", "printf '{\"v\": \"%s\"}\\n' \"$(cat v)\"\n"),
            (
                "net/main.tf",
                "variable \"greeting\" {\n  type = string\n}\n\
                 resource \"terraform_data\" \"g\" {\n  input = var.greeting\n}\n",
            ),
        ],
        "first",
    );
    let s = Setup::new(&format!(
        "{}{}\n[[targets]]\nname = \"net\"\nrepo = \"{}\"\npath = \"net\"\ninterval = \"1h\"\n\
         policy = \"approval\"\ninputs = {{ greeting = \"base.outputs.v\" }}\n\
         [targets.backend]\nkind = \"terraform\"\nenv = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n",
        token_table("ops", OPS, &["approve:net", "read"]),
        exec_target(
            "base",
            &remote.url(),
            "path = \"base\"\ninterval = \"1h\"",
            "apply = [\"true\"]\noutputs = [\"sh\", \"out.sh\"]",
        ),
        remote.url()
    ));
    let tick = |args: &[&str]| {
        let out = s.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    };
    let producer = |v: &str| {
        remote.commit(&[("base/v", v)], &format!("base {v}"));
        tick(&["tick", "base"]);
    };
    let state = s.state.join("checkouts/net/net/terraform.tfstate");
    let applied_value = || {
        std::fs::read_to_string(&state)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| {
                v["resources"][0]["instances"][0]["attributes"]["input"]["value"]
                    .as_str()
                    .map(str::to_string)
            })
    };
    tick(&["tick", "--all"]);
    let intake = Intake::start(&s);
    let who = Approver {
        port: intake.port,
        token: OPS,
    };
    let deployment = |id: i64| {
        who.call(
            "GET",
            &format!("/api/v1/deployments/{id}"),
            serde_json::Value::Null,
        )
    };
    let first = who.pending();
    assert_eq!(first.len(), 1, "{first:?}");
    who.approve(&first[0]);

    // The producer's output changes; the consumer's files do not.
    producer("2");
    tick(&["tick", "net"]);
    let run = s.history("net")[0].clone();
    let message = run["message"].as_str().unwrap_or("").to_string();
    assert!(
        message.contains("was approved but not applied: inputs changed: `greeting`"),
        "{message}"
    );
    assert!(!message.contains("the plan changed"), "{message}");
    assert_eq!(applied_value(), None, "the old value was applied");
    let id = first[0]["id"].as_i64().expect("id");
    let old = deployment(id);
    assert_eq!(old["state"], "superseded", "{old}");
    assert_eq!(
        old["message"], "superseded: inputs changed: `greeting`",
        "{old}"
    );

    // Its successor, made with the new value, is the one that applies.
    let second = who.pending();
    assert_eq!(second.len(), 1, "{second:?}");
    who.approve(&second[0]);
    tick(&["tick", "net"]);
    assert_eq!(applied_value().as_deref(), Some("2"));
    assert_eq!(s.history("net")[0]["result"], "changed");

    // A plan that waits is superseded the same way, and its approval is
    // refused, saying why.
    producer("3");
    tick(&["tick", "net"]);
    let third = who.pending();
    assert_eq!(third.len(), 1, "{third:?}");
    producer("4");
    tick(&["tick", "net"]);
    let fourth = who.pending();
    assert_eq!(fourth.len(), 1, "{fourth:?}");
    assert_ne!(fourth[0]["id"], third[0]["id"]);
    let third_id = third[0]["id"].as_i64().expect("id");
    assert_eq!(
        deployment(third_id)["message"],
        "superseded: inputs changed: `greeting`"
    );
    let r = api_call(
        intake.port,
        "POST",
        &format!("/api/v1/deployments/{third_id}/approve"),
        OPS,
        &serde_json::json!({ "plan_hash": third[0]["plan_hash"] }),
    );
    assert_eq!(r.status, 409, "{r:?}");
    assert!(r.body.contains("inputs changed"), "{r:?}");
    who.approve(&fourth[0]);
    tick(&["tick", "net"]);
    assert_eq!(applied_value().as_deref(), Some("4"));
}

/// A destroyed target has not converged: `destroy` of a target others
/// depend on is refused without `--force`, naming them; with it, the
/// destroyed target's outputs are forgotten and its dependents are
/// `blocked` ("it was destroyed") until it is applied again. And a one-shot
/// `tick` keeps the queue's order: with a push for `net` queued behind its
/// pause, `tick dns` records `blocked` naming `net` instead of applying
/// the new commit before it.
#[test]
fn a_destroyed_or_queued_dependency_holds_its_dependents() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("net/id", "n1"),
            ("net/out.sh", "printf '{\"id\": \"%s\"}\\n' \"$(cat id)\"\n"),
            ("dns/v", "1"),
        ],
        "first",
    );
    let got = root.path().join("dns.got");
    let secret = root.path().join("hook-secret");
    std::fs::write(&secret, SECRET).expect("secret");
    let s = Setup::new(&format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n{}{}",
        toml_str(&secret.display().to_string()),
        exec_target(
            "net",
            &remote.url(),
            "path = \"net\"\ninterval = \"1h\"",
            "apply = [\"true\"]\ndestroy = [\"true\"]\noutputs = [\"sh\", \"out.sh\"]",
        ),
        exec_target(
            "dns",
            &remote.url(),
            "path = \"dns\"\ninterval = \"1h\"\ninputs = { NET_ID = \"net.outputs.id\" }",
            &format!(
                "apply = [\"sh\", \"-c\", {}]\nalways = true",
                toml_str(&format!("echo \"$NET_ID $(cat v)\" >> {}", got.display()))
            ),
        ),
    ));
    succeeded(&s.run(&["tick", "--all"]), "tick --all");
    assert_eq!(log_lines(&got), ["n1 1"]);

    // Refused without --force, naming the dependent; nothing destroyed.
    let out = s.run(&["destroy", "net", "--yes"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("`dns`") && text(&out.stderr).contains("--force"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(s.history("net")[0]["operation"], "apply");
    let out = s.run(&["destroy", "net", "--yes", "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(s.history("net")[0]["operation"], "destroy");
    let out = s.run(&["tick", "dns"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let run = &s.history("dns")[0];
    assert_eq!(run["result"], "blocked", "{run}");
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| m.contains("blocked by `net`: it was destroyed")),
        "{run}"
    );
    assert_eq!(
        log_lines(&got),
        ["n1 1"],
        "dns ran with a destroyed net's outputs"
    );
    succeeded(&s.run(&["tick", "net"]), "tick net");
    succeeded(&s.run(&["tick", "dns"]), "tick dns");
    assert_eq!(log_lines(&got), ["n1 1", "n1 1"]);

    // A push for both, `net` paused: its job waits queued, and a one-shot
    // tick of `dns` does not overtake it.
    succeeded(&s.run(&["pause", "net"]), "pause net");
    let intake = Intake::start(&s);
    let sha = remote.commit(&[("net/id", "n2"), ("dns/v", "2")], "both");
    let body = github_push_body(&remote.url(), &sha, &["net/id", "dns/v"]);
    let r = deliver_github_push(intake.port, SECRET, &body, "both-1");
    assert_eq!(r.status, 202, "{r:?}");
    drop(intake);
    let out = s.run(&["tick", "dns"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let run = &s.history("dns")[0];
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| m.contains("blocked by `net`: a job of it is queued")),
        "{run}"
    );
    assert_eq!(log_lines(&got), ["n1 1", "n1 1"], "dns overtook net");
    // Resumed, a daemon runs the push's jobs: `net` first, then `dns`
    // with its new output.
    succeeded(&s.run(&["resume", "net"]), "resume net");
    let daemon = s.serve();
    wait_for(Duration::from_secs(60), "both to converge in order", || {
        log_lines(&got).last().map(String::as_str) == Some("n2 2")
    });
    drop(daemon);
}
