//! Configuration mistakes are refused with an error naming the key and the
//! target, by `driftless check` and at start-up of every command.

use std::process::Command;
use std::time::Duration;

use crate::common::*;

fn write(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
    let p = dir.join("driftless.toml");
    std::fs::write(&p, body).expect("write config");
    p
}

/// Every command here should answer at once: `serve` with a bad config
/// must exit, never start serving, so each is bounded.
fn driftless(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    output_within(
        Command::new(bin())
            .arg("--config")
            .arg(config)
            .args(args)
            .env_remove("DRIFTLESS__SERVER__WORKERS")
            .stdin(std::process::Stdio::null()),
        Duration::from_secs(60),
    )
}

const BROKEN: &str = r#"
state_dir = "state"
[server]
listen = "localhost-ish"

[[targets]]
name = "web"
repo = "https://git.example.net/infra.git"
interval = "every now and then"
[targets.backend]
kind = "exec"
apply = ["./deploy.sh"]

[[targets]]
name = "web"
repo = "https://git.example.net/infra.git"
path = "../../etc"
[targets.backend]
kind = "terraform"
binary = "terraform"

[[targets]]
name = "db"
repo = "https://git.example.net/infra.git"
colour = "blue"
[targets.backend]
kind = "exec"
apply = ["./db.sh"]

[[targets]]
name = "Cache Server"
repo = "https://git.example.net/infra.git"
[targets.backend]
kind = "terraform"
binaryy = "tofu"
"#;

#[test]
fn check_lists_every_problem_with_key_and_target() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write(dir.path(), BROKEN);
    let out = driftless(&config, &["check"]);
    assert_eq!(out.status.code(), Some(1));
    let report = text(&out.stdout);
    for expected in [
        "server: key `listen`: `localhost-ish` is not an address:port",
        "targets[web]: key `interval`: `every now and then` is not a duration",
        "targets[web]: key `path`: `../../etc` must be a subdirectory",
        "targets[web]: key `name`: duplicate target name `web`",
        "targets[db]: key `colour`: unknown field `colour`",
        "targets[Cache Server]: key `backend.binaryy`: unknown field `binaryy`",
    ] {
        assert!(
            report.contains(expected),
            "missing {expected:?} in:\n{report}"
        );
    }
    assert!(report.contains(&config.display().to_string()), "{report}");
}

#[test]
fn every_command_refuses_a_bad_config_at_start_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write(dir.path(), BROKEN);
    for args in [&["serve"][..], &["status"], &["tick", "--all"]] {
        let out = driftless(&config, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains("targets[db]: key `colour`"), "{args:?}: {err}");
    }
    assert!(
        !dir.path().join("state").exists(),
        "a bad config must not create state"
    );
}

#[test]
fn environment_overrides_are_validated_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write(
        dir.path(),
        "state_dir = \"state\"\n[[targets]]\nname = \"a\"\nrepo = \"https://example.net/r.git\"\n\
         [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n",
    );
    let run = |workers: &str| {
        output_within(
            Command::new(bin())
                .args(["--config", config.to_str().expect("utf8"), "check"])
                .env("DRIFTLESS__SERVER__WORKERS", workers),
            std::time::Duration::from_secs(300),
        )
    };
    let bad = run("0");
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text(&bad.stdout).contains("server: key `workers`: 0 is not between 1 and 64"),
        "{}",
        text(&bad.stdout)
    );
    assert_eq!(run("3").status.code(), Some(0));
    // A target's key, by index or by name; a variable naming no target is
    // a problem that names the variable.
    let with = |k: &str, v: &str| {
        output_within(
            Command::new(bin())
                .args([
                    "--config",
                    config.to_str().expect("utf8"),
                    "status",
                    "--json",
                ])
                .env(k, v),
            std::time::Duration::from_secs(300),
        )
    };
    for var in [
        "DRIFTLESS__TARGETS__0__BRANCH",
        "DRIFTLESS__TARGETS__A__BRANCH",
    ] {
        let out = with(var, "release");
        assert!(out.status.success(), "{var}: {}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v[0]["branch"], "release", "{var}");
    }
    let out = with("DRIFTLESS__TARGETS__3__INTERVAL", "1m");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(
            "environment: key `DRIFTLESS__TARGETS__3__INTERVAL`: names entry 3, but the file has 1"
        ),
        "{}",
        text(&out.stderr)
    );
    // DRIFTLESS_CONFIG names the file when --config is absent.
    let out = output_within(
        Command::new(bin())
            .arg("check")
            .env("DRIFTLESS_CONFIG", &config),
        std::time::Duration::from_secs(300),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

#[test]
fn check_looks_at_secret_files_and_binaries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write(
        dir.path(),
        "state_dir = \"state\"\n[[targets]]\nname = \"net\"\nrepo = \"https://example.net/r.git\"\n\
         [targets.git]\ntoken_file = \"secrets/missing-token\"\n\
         [targets.backend]\nkind = \"terraform\"\nbinary = \"no-such-tofu\"\n",
    );
    let out = driftless(&config, &["check"]);
    assert_eq!(out.status.code(), Some(1));
    let report = text(&out.stdout);
    assert!(
        report.contains("targets[net]: key `git.token_file`: cannot read secret file:"),
        "{report}"
    );
    assert!(report.contains("secrets/missing-token"), "{report}");
    assert!(
        report.contains("targets[net]: key `backend.binary`: `no-such-tofu` is not on the PATH"),
        "{report}"
    );
}

#[test]
fn receivers_and_tokens_are_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write(
        dir.path(),
        "state_dir = \"state\"\n\
         [[receivers]]\nname = \"github\"\nforge = \"github\"\n\
         [[receivers]]\nname = \"gl\"\nforge = \"gitlub\"\nsecret_file = \"s\"\n\
         [[receivers]]\nname = \"gitea\"\nforge = \"gitea\"\nsecret_file = \"missing-secret\"\n\
         [[tokens]]\nname = \"ops\"\nsha256 = \"abc\"\nscopes = [\"deploy:*\"]\n",
    );
    let out = driftless(&config, &["check"]);
    assert_eq!(out.status.code(), Some(1));
    let report = text(&out.stdout);
    for expected in [
        "receivers[github]: key `secret_file`: a receiver needs a secret",
        "receivers[gl]: key `forge`: unknown forge `gitlub`",
        "receivers[gitea]: key `secret_file`: cannot read secret file:",
        "tokens[ops]: key `sha256`: must be the 64-character hex SHA-256",
        "tokens[ops]: key `scopes`: `deploy:*` is not a scope",
    ] {
        assert!(
            report.contains(expected),
            "missing {expected:?} in:\n{report}"
        );
    }
    // serve refuses to start without the receiver's secret, naming it.
    let fixed = std::fs::read_to_string(&config)
        .expect("read")
        .replace("[[receivers]]\nname = \"github\"\nforge = \"github\"\n", "")
        .replace(
            "[[receivers]]\nname = \"gl\"\nforge = \"gitlub\"\nsecret_file = \"s\"\n",
            "",
        )
        .replace(
            "[[tokens]]\nname = \"ops\"\nsha256 = \"abc\"\nscopes = [\"deploy:*\"]\n",
            "",
        );
    std::fs::write(&config, fixed).expect("write");
    let out = driftless(&config, &["serve"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("receivers[gitea]: key `secret_file`"), "{err}");
}

#[test]
fn notifiers_are_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write(
        dir.path(),
        "state_dir = \"state\"\n[defaults]\nnotify = [\"pager\"]\nrepeat_after = \"often\"\n\
         [[notifiers]]\nname = \"mail\"\nkind = \"email\"\nhost = \"smtp.example.net\"\ntls = \"none\"\nfrom = \"d@example.net\"\nto = []\n\
         [[notifiers]]\nname = \"room\"\nkind = \"matrix\"\nhomeserver = \"matrix.example.net\"\naccess_token_file = \"t\"\nroom_id = \"ops\"\n\
         [[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"https://hooks.example.net/x\"\nevents = [\"exploded\"]\n\
         [[notifiers]]\nname = \"chat\"\nkind = \"slack\"\nurl_file = \"missing-slack-url\"\n\
         [[targets]]\nname = \"a\"\nrepo = \"https://example.net/r.git\"\nnotify = [\"chat\", \"nobody\"]\n\
         [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n",
    );
    let out = driftless(&config, &["check"]);
    assert_eq!(out.status.code(), Some(1));
    let report = text(&out.stdout);
    for expected in [
        "defaults: key `notify`: no notifier named `pager`",
        "defaults: key `repeat_after`: `often` is not a duration",
        "notifiers[mail]: key `tls`: `none` (no encryption) is only accepted for a loopback host",
        "notifiers[mail]: key `to`: must list at least one address",
        "notifiers[room]: key `homeserver`: must be an http(s):// URL",
        "notifiers[room]: key `room_id`: `ops` is not a room id",
        "notifiers[hook]: key `events`",
        "targets[a]: key `notify`: no notifier named `nobody`",
        "notifiers[chat]: key `url_file`: cannot read secret file:",
    ] {
        assert!(
            report.contains(expected),
            "missing {expected:?} in:\n{report}"
        );
    }
}

#[test]
fn a_missing_config_file_says_how_to_name_one() {
    let out = output_within(
        Command::new(bin()).args(["--config", "/nonexistent/driftless.toml", "status"]),
        std::time::Duration::from_secs(300),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("/nonexistent/driftless.toml") && err.contains("--config"),
        "{err}"
    );
}

#[test]
fn target_paths_are_normalised_once_and_shown_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = String::from("state_dir = \"state\"\n");
    for (name, path) in [("a", "./sub/dir"), ("b", "sub//dir/"), ("c", ".")] {
        cfg.push_str(&format!(
            "[[targets]]\nname = \"{name}\"\nrepo = \"https://git.example.net/infra.git\"\npath = \"{path}\"\n\
             [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n"
        ));
    }
    let config = write(dir.path(), &cfg);
    let out = driftless(&config, &["check"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for line in [
        "  a: exec from https://git.example.net/infra.git branch main path sub/dir",
        "  b: exec from https://git.example.net/infra.git branch main path sub/dir",
        "  c: exec from https://git.example.net/infra.git branch main path .",
    ] {
        assert!(stdout.contains(line), "{line:?} not in {stdout}");
    }
    let out = driftless(&config, &["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let paths: Vec<&str> = v
        .as_array()
        .expect("list")
        .iter()
        .map(|t| t["path"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(paths, ["sub/dir", "sub/dir", ""]);
}

#[test]
fn check_names_every_problem_inside_tables_and_looks_at_broken_targets_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let not_git = dir.path().join("not-a-repo");
    std::fs::create_dir_all(&not_git).expect("mkdir");
    let config = write(
        dir.path(),
        &format!(
            r#"
state_dir = "state"

[[targets]]
name = "net"
repo = "https://git.example.net/infra.git"
interval = "soon"
[targets.git]
token_file = "/nonexistent/token"
[targets.backend]
kind = "terraform"
binary = "no-such-terraform-bin"
var_files = "prod.tfvars"
lock_timeoutt = "1m"

[[targets]]
name = "gone"
repo = "file:///nonexistent/infra.git"
[targets.backend]
kind = "exec"
apply = ["true"]

[[targets]]
name = "plain"
repo = "{}"
[targets.backend]
kind = "exec"
apply = ["true"]

[[notifiers]]
name = "mail"
kind = "email"
host = "smtp.example.net"
port = "twenty-five"
from = "driftless@example.net"
to = ["ops@example.net"]
colour = "blue"
"#,
            not_git.display()
        ),
    );
    let out = driftless(&config, &["check"]);
    assert_eq!(out.status.code(), Some(1));
    let report = text(&out.stdout);
    for expected in [
        "targets[net]: key `interval`: `soon` is not a duration".to_string(),
        "targets[net]: key `backend.lock_timeoutt`: unknown field `lock_timeoutt`".into(),
        "targets[net]: key `backend.var_files`: invalid type: string \"prod.tfvars\", expected a sequence".into(),
        // the machine checks of a target that has schema problems too
        "targets[net]: key `git.token_file`: cannot read secret".into(),
        "targets[gone]: key `repo`: local repository /nonexistent/infra.git does not exist".into(),
        format!("targets[plain]: key `repo`: {} is not a git repository", not_git.display()),
        "notifiers[mail]: key `port`: invalid type: string \"twenty-five\"".into(),
        "notifiers[mail]: key `colour`: unknown field `colour`".into(),
    ] {
        assert!(report.contains(&expected), "missing {expected:?} in:\n{report}");
    }
}

/// A backend's own checks (past the schema) report every problem in the
/// table, each under its own key, not just the first one.
#[test]
fn check_reports_every_problem_a_backend_finds_each_with_its_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write(
        dir.path(),
        r#"
state_dir = "state"

[[targets]]
name = "net"
repo = "https://git.example.net/infra.git"
[targets.backend]
kind = "terraform"
binary = " "
var_files = ["../outside.tfvars", "/etc/abs.tfvars"]
lock_timeout = "soon"
workspace = "has space"

[[targets]]
name = "pi"
repo = "https://git.example.net/infra.git"
[targets.backend]
kind = "pi"
host = ""
user = "-oProxyCommand=x"
remote_dir = "/"
action = "systemd"
"#,
    );
    let out = driftless(&config, &["check"]);
    assert_eq!(out.status.code(), Some(1));
    let report = text(&out.stdout);
    for expected in [
        "targets[net]: key `backend.binary`: `binary` must name the terraform or tofu program",
        "targets[net]: key `backend.var_files`: `var_files` entry `../outside.tfvars`",
        "targets[net]: key `backend.var_files`: `var_files` entry `/etc/abs.tfvars`",
        "targets[net]: key `backend.lock_timeout`: `lock_timeout` `soon`",
        "targets[net]: key `backend.workspace`: `workspace` `has space`",
        "targets[pi]: key `backend.host`: `host` must name the host",
        "targets[pi]: key `backend.user`: `user` must name the remote user",
        "targets[pi]: key `backend.remote_dir`: `remote_dir` `/`",
        "targets[pi]: key `backend.units`: action `systemd` needs `units`",
    ] {
        assert!(
            report.contains(expected),
            "missing {expected:?} in:\n{report}"
        );
    }
}

#[test]
fn every_command_flag_and_argument_has_a_help_line() {
    let help = |args: &[&str]| {
        let out = output_within(
            Command::new(bin()).args(args).arg("--help"),
            std::time::Duration::from_secs(300),
        );
        assert!(out.status.success(), "{args:?}");
        text(&out.stdout)
    };
    let top = help(&[]);
    let commands: Vec<String> = top
        .split("Commands:")
        .nth(1)
        .expect("a command list")
        .split("Options:")
        .next()
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() >= 15, "{commands:?}");
    let mut pages = Vec::new();
    for c in &commands {
        let page = help(&[c.as_str()]);
        if let Some(subs) = page.split("Commands:").nth(1) {
            for sub in subs.split("Options:").next().unwrap_or("").lines() {
                if let Some(s) = sub.split_whitespace().next().filter(|s| *s != "help") {
                    pages.push((format!("{c} {s}"), help(&[c.as_str(), s])));
                }
            }
        }
        pages.push((c.clone(), page));
    }
    for (name, page) in pages {
        for section in ["Arguments:", "Options:"] {
            let Some(body) = page.split(section).nth(1) else {
                continue;
            };
            for line in body
                .trim_start_matches('\n')
                .split("\n\n")
                .next()
                .unwrap_or("")
                .lines()
                .filter(|l| !l.trim().is_empty())
            {
                let words: Vec<&str> = line.split_whitespace().collect();
                // "<NAME>  help" or "--flag <V>  help": a name and at least
                // one word of help.
                let named = words
                    .iter()
                    .take_while(|w| {
                        w.starts_with('-')
                            || w.starts_with('<')
                            || w.starts_with('[')
                            || w.ends_with(',')
                    })
                    .count();
                assert!(
                    words.len() > named && named > 0,
                    "`driftless {name} --help`: no help for `{}`",
                    line.trim()
                );
            }
        }
    }
}

/// A `policy` other than `auto` needs a backend that can plan; `check`
/// says which and why, each naming the key.
#[test]
fn a_policy_needs_a_backend_that_can_plan() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = |name: &str, policy: &str, backend: &str| {
        format!(
            "[[targets]]\nname = \"{name}\"\nrepo = \"https://example.net/r.git\"\npolicy = \"{policy}\"\n\
             [targets.backend]\n{backend}\n"
        )
    };
    let config = write(
        dir.path(),
        &format!(
            "state_dir = \"state\"\n{}{}{}{}{}{}{}{}{}{}",
            target("tf", "detect", "kind = \"terraform\""),
            target("sh", "detect", "kind = \"exec\"\napply = [\"true\"]"),
            target("gated", "approval", "kind = \"terraform\""),
            target(
                "gated-sh",
                "approve_destructive",
                "kind = \"exec\"\napply = [\"true\"]"
            ),
            target("odd", "sometimes", "kind = \"terraform\""),
            target(
                "jobs",
                "approve_destructive",
                "kind = \"nomad\"\naddress = \"http://127.0.0.1:4646\"\njobs = \"*.nomad.hcl\""
            ),
            target(
                "jobs-two",
                "approval",
                "kind = \"nomad\"\naddress = \"http://127.0.0.1:4646\"\ndefault_policy = \"none\""
            ),
            target(
                "jobs-ok",
                "detect",
                "kind = \"nomad\"\naddress = \"http://127.0.0.1:4646\""
            ),
            // One vocabulary: a job's `none` is the target's `detect`,
            // under either name.
            target(
                "jobs-none",
                "detect",
                "kind = \"nomad\"\naddress = \"http://127.0.0.1:4646\"\ndefault_policy = \"none\""
            ),
            target(
                "jobs-detect",
                "detect",
                "kind = \"nomad\"\naddress = \"http://127.0.0.1:4646\"\ndefault_policy = \"detect\""
            ),
        ),
    );
    let out = output_within(
        Command::new(bin()).args(["--config", config.to_str().expect("utf8"), "check"]),
        std::time::Duration::from_secs(300),
    );
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    for line in [
        "targets[sh]: key `policy`: `detect` needs a backend that can plan; this `exec` target cannot (exec and pi can with a `plan` command)",
        "targets[gated-sh]: key `policy`: `approve_destructive` needs a backend that can plan; this `exec` target cannot (exec and pi can with a `plan` command)",
        "targets[odd]: key `policy`: `sometimes` is not one of \"auto\", \"approval\", \"approve_destructive\", \"detect\"",
        "targets[jobs]: key `policy`: `approve_destructive` on a nomad target: Nomad's plan does not say whether a change deletes something; use \"approval\", or a job's `meta { driftless_policy }`",
        "targets[jobs-two]: key `policy`: `approval` says one thing and the backend's `default_policy` `none` another: set one of them",
    ] {
        assert!(
            said.lines()
                .any(|l| l.trim().trim_start_matches("- ") == line),
            "no `{line}` in:\n{said}"
        );
    }
    for ok in ["tf", "gated", "jobs-ok"] {
        assert!(
            !said.contains(&format!("targets[{ok}]: key `policy`")),
            "{said}"
        );
    }
    for ok in ["jobs-none", "jobs-detect"] {
        assert!(!said.contains(&format!("targets[{ok}]")), "{said}");
    }
}

/// Each problem of `check` names its full key, once: a value of the wrong
/// type (`server.workers`, `targets[t].interval`, `history.keep`), a
/// required backend key of the wrong type (one line, not "invalid type"
/// and then "missing field"), an input naming an unknown target (by the
/// input's key, not `depends_on`), a dependency cycle beside the other
/// problems, and a limit in the units the key accepts.
#[test]
fn check_names_the_key_at_fault_once_each_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exec = |name: &str, extra: &str| {
        format!(
            "[[targets]]\nname = \"{name}\"\nrepo = \"https://git.example.net/infra.git\"\n{extra}\n\
             [targets.backend]\nkind = \"exec\"\napply = [\"./go\"]\n\n"
        )
    };
    let config = write(
        dir.path(),
        &format!(
            "state_dir = \"state\"\n[server]\nworkers = \"four\"\n[history]\nkeep = 7\n\n{}{}{}{}{}\
             [[targets]]\nname = \"typed\"\nrepo = \"https://git.example.net/infra.git\"\n\
             [targets.backend]\nkind = \"exec\"\napply = \"./go\"\n",
            exec("t", "interval = 30"),
            exec("a", "depends_on = [\"b\"]"),
            exec("b", "depends_on = [\"a\"]"),
            exec("consumer", "inputs = { simple = \"nowhere.outputs.id\" }"),
            exec("old", "timeout = \"20d\""),
        ),
    );
    let out = driftless(&config, &["check"]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stdout) + &text(&out.stderr);
    for (line, what) in [
        ("server: key `workers`", "invalid type"),
        ("key `history.keep`", "invalid type"),
        ("targets[t]: key `interval`", "invalid type"),
        ("targets[typed]: key `backend.apply`", "invalid type"),
        (
            "targets[consumer]: key `inputs.simple`",
            "no target named `nowhere`",
        ),
        (
            "targets[a]: key `depends_on`",
            "a dependency cycle: a → b → a",
        ),
        ("targets[old]: key `timeout`", "(at most 1d)"),
    ] {
        assert!(
            said.lines().any(|l| l.contains(line) && l.contains(what)),
            "no line with {line} and {what}:\n{said}"
        );
    }
    assert!(!said.contains("(table)"), "{said}");
    assert!(!said.contains("missing field `apply`"), "{said}");
    assert!(
        !said.contains("targets[consumer]: key `depends_on`"),
        "{said}"
    );
    assert!(!said.contains("years") && !said.contains("days"), "{said}");
}
