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
    let remote = Remote::new(root, "infra");
    remote.commit(&[("v", "1")], "first");
    let script = format!(
        "i=1; while [ $i -le {lines} ]; do echo line $i; i=$((i+1)); done; \
         echo to-stderr >&2; echo token=$TOKEN; printf '%s\\n' \"$KEY\"; exit {code}"
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
    output_within(
        std::process::Command::new(bin())
            .arg("--config")
            .arg(&s.config)
            .args(["tick", "app"])
            .env("LOGS_TOKEN", SECRET)
            .env(
                "LOGS_KEY",
                format!("-----BEGIN KEY-----\n{KEY_LINE}\n-----END KEY-----"),
            ),
        std::time::Duration::from_secs(120),
    )
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
