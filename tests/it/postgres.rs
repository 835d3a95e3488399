//! driftless on PostgreSQL (`[database]`): the real binary against a real
//! throwaway cluster (Debian's postgresql, `driftless::store::testing`).

use std::time::Duration;

use crate::common::*;

/// A new database in this test process's cluster.
fn database() -> String {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(driftless::store::testing::database())
}

fn on_postgres(url: &str, targets: &str) -> Setup {
    Setup::new(&format!("[database]\nurl = {}\n\n{targets}", toml_str(url)))
}

/// Run `sql` on the database at `url` (the cluster's `postgres` one when
/// None).
fn sql(url: Option<&str>, sql: &str) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(driftless::store::testing::execute(url, sql))
}

/// A token allowed to reconcile `app`.
const TOKEN: &str = "ops-token-0123456789abcdef";

/// `POST /api/v1/targets/app/reconcile` with [`TOKEN`]: the status.
fn reconcile(port: u16) -> u16 {
    http(
        port,
        "POST",
        "/api/v1/targets/app/reconcile",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
        b"",
    )
    .status
}

/// The lines of `log` (empty when it does not exist yet).
fn lines(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// An exec target `app` whose apply appends `start` to `log`, sleeps
/// `secs`, then appends `end`: applies that overlapped show as two
/// `start`s in a row.
fn slow_target(remote: &Remote, log: &std::path::Path, secs: u32) -> String {
    exec_target(
        "app",
        &remote.url(),
        "path = \"app\"",
        &format!(
            "apply = [\"sh\", \"-c\", \"echo start >> {log}; sleep {secs}; echo end >> {log}\"]",
            log = log.display()
        ),
    )
}

/// No two `start`s without an `end` between them.
fn assert_no_overlap(log: &std::path::Path) {
    let lines = lines(log);
    for pair in lines.windows(2) {
        assert!(
            !(pair[0] == "start" && pair[1] == "start"),
            "two applies of one target overlapped: {lines:?}"
        );
    }
}

/// A tick applies and is recorded in PostgreSQL (no SQLite file appears);
/// `status` and `history` read it back from another host (another state
/// directory); while one host's daemon applies the target, a one-shot tick
/// on the other finds it busy (exit 75) and applies nothing, and works
/// once the apply is over.
#[test]
fn runs_are_recorded_in_postgres_and_a_target_applies_on_one_host_at_a_time() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let first = remote.commit(&[("app/config", "v1\n")], "first");
    let log = root.path().join("applied.log");
    let url = database();
    let config = format!(
        "[database]\nurl = {}\n\n{}{}",
        toml_str(&url),
        slow_target(&remote, &log, 4),
        token_table("ops", TOKEN, &["reconcile:app"])
    );
    let a = Setup::new(&config);
    let b = Setup::new(&config);
    let out = a.run(&["tick", "app"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let app = b.target_status("app");
    assert_eq!(app["last_result"], "changed", "{app}");
    assert_eq!(app["last_applied_sha"], first.as_str(), "{app}");
    assert_eq!(b.history("app").len(), 1);
    assert!(
        !a.db().exists() && !b.db().exists(),
        "a SQLite database was made beside [database]"
    );

    let second = remote.commit(&[("app/config", "v2\n")], "second");
    let daemon = a.serve();
    assert_eq!(reconcile(daemon.port), 202);
    wait_for(Duration::from_secs(60), "host a's apply to start", || {
        lines(&log).len() == 3
    });
    let out = b.run(&["tick", "app"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "host b's tick while host a applies: {}",
        text(&out.stderr)
    );
    wait_for(Duration::from_secs(60), "host a's apply to end", || {
        lines(&log).len() == 4
    });
    wait_for(
        Duration::from_secs(30),
        "host a's run to be recorded",
        || b.target_status("app")["last_applied_sha"] == second.as_str(),
    );
    daemon.stop();
    let out = b.run(&["tick", "app"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_no_overlap(&log);
    assert_eq!(
        lines(&log),
        ["start", "end", "start", "end"],
        "each commit applied once"
    );
}

/// The daemon applying a target is killed with SIGKILL mid-apply; its
/// command goes on, orphaned. Another host's daemon on the same database
/// takes the job over only after the command ended — its keeper renewed
/// the job's lease for as long as it lived, though the lease is a tenth of
/// the command's time — and applies it again. Nothing overlaps.
#[test]
fn an_orphaned_command_keeps_its_target_from_every_other_host() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/config", "v1\n")], "first");
    let log = root.path().join("applied.log");
    let config = format!(
        "[database]\nurl = {}\nlease = \"3s\"\n\n{}",
        toml_str(&database()),
        slow_target(&remote, &log, 10)
    );
    let a = Setup::new(&config);
    let b = Setup::new(&config);
    let daemon = a.serve();
    wait_for(Duration::from_secs(60), "host a's apply to start", || {
        lines(&log) == ["start"]
    });
    daemon.kill9();
    let other = b.serve();
    wait_for(
        Duration::from_secs(90),
        "host b to apply after the orphan",
        || lines(&log).len() >= 4,
    );
    assert_no_overlap(&log);
    assert_eq!(lines(&log), ["start", "end", "start", "end"]);
    wait_for(
        Duration::from_secs(30),
        "host b's run to be recorded",
        || b.target_status("app")["last_result"] == "changed",
    );
    let results: Vec<String> = b
        .history("app")
        .iter()
        .map(|r| r["result"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(results.contains(&"interrupted".to_string()), "{results:?}");
    other.stop();
}

/// A job taken from the daemon running it (its claim given to another
/// instance) has its command killed by the command's keeper within a
/// lease, rather than left to run beside the new owner.
#[test]
fn a_command_whose_job_was_taken_over_is_killed() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/config", "v1\n")], "first");
    let log = root.path().join("applied.log");
    let url = database();
    let config = format!(
        "[database]\nurl = {}\nlease = \"3s\"\n\n{}",
        toml_str(&url),
        slow_target(&remote, &log, 37)
    );
    let a = Setup::new(&config);
    let daemon = a.serve();
    wait_for(Duration::from_secs(60), "the apply to start", || {
        lines(&log) == ["start"]
    });
    let sleeping = || {
        let out = std::process::Command::new("pgrep")
            .args(["-f", "sleep 37"])
            .output()
            .expect("pgrep");
        !out.stdout.is_empty()
    };
    assert!(sleeping(), "the command is not running");
    sql(
        Some(&url),
        "UPDATE jobs SET lease_owner = 'another-instance' WHERE state = 'running'",
    );
    wait_for(Duration::from_secs(5), "the command to be killed", || {
        !sleeping()
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(lines(&log), ["start"], "the command went on");
    let all = daemon.log_text();
    assert!(all.contains("lost the lease"), "{all}");
    daemon.stop();
}

/// The database refuses the daemon mid-apply (its connections terminated,
/// new ones refused): the daemon answers 503 and is not ready, the
/// command's keeper stops it before the job's lease can run out, and once
/// the database takes connections again the daemon is ready and recovers
/// by itself, applying again. Nothing overlaps.
#[test]
fn a_database_outage_stops_the_command_and_the_daemon_recovers() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/config", "v1\n")], "first");
    let log = root.path().join("applied.log");
    let url = database();
    let name = url
        .split_once("localhost/")
        .and_then(|(_, rest)| rest.split('?').next())
        .expect("database name")
        .to_string();
    let config = format!(
        "[database]\nurl = {}\nlease = \"3s\"\n\n{}{}",
        toml_str(&url),
        slow_target(&remote, &log, 8),
        token_table("ops", TOKEN, &["reconcile:app"])
    );
    let a = Setup::new(&config);
    let daemon = a.serve();
    wait_for(Duration::from_secs(60), "the apply to start", || {
        lines(&log) == ["start"]
    });
    sql(
        None,
        &format!(
            "ALTER DATABASE {name} ALLOW_CONNECTIONS false;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
        ),
    );
    let outage = std::time::Instant::now();
    // Nothing is acknowledged that cannot be recorded, and the daemon says
    // it is not ready.
    assert_eq!(reconcile(daemon.port), 503);
    assert_eq!(http_get(daemon.port, "/readyz").map(|(c, _)| c), Some(503));
    std::thread::sleep(Duration::from_secs(5).saturating_sub(outage.elapsed()));
    sql(
        None,
        &format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"),
    );
    wait_for(
        Duration::from_secs(30),
        "the daemon to be ready again",
        || http_get(daemon.port, "/readyz").is_some_and(|(c, _)| c == 200),
    );
    wait_for(Duration::from_secs(90), "the daemon to apply again", || {
        lines(&log).len() >= 3
    });
    assert_eq!(
        lines(&log),
        ["start", "start", "end"],
        "the first command outlived the lease"
    );
    let all = daemon.log_text();
    assert!(all.contains("lease"), "{all}");
    daemon.stop();
}

/// A database that cannot be opened is named by its URL without the
/// password in it; the password appears nowhere.
#[test]
fn a_password_in_the_url_is_never_shown() {
    let url = database();
    let (_, socket) = url.split_once('?').expect("socket parameter");
    let wrong = format!("postgres://postgres:s3cret-pw@localhost/no_such_db?{socket}");
    let s = on_postgres(&wrong, "");
    let out = output_within(
        std::process::Command::new(bin())
            .arg("--config")
            .arg(&s.config)
            .args(["status", "--json"]),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!all.contains("s3cret-pw"), "{all}");
    assert!(
        all.contains("postgres://postgres:***@localhost/no_such_db"),
        "{all}"
    );
}

/// The PostgreSQL server itself crashes mid-apply (`pg_ctl -m immediate
/// stop`) and is started again 5 s later: what was acknowledged before
/// (an API reconcile answered 202) is applied after, what came during the
/// outage was refused (503), the command running at the crash was stopped
/// before its lease could run out, and the daemon recovers by itself.
#[test]
fn a_server_crash_and_restart_loses_nothing_acknowledged() {
    let cluster = driftless::store::testing::OwnCluster::new();
    let url = cluster.create("crash");
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/config", "v1\n")], "first");
    let log = root.path().join("applied.log");
    let config = format!(
        "[database]\nurl = {}\nlease = \"3s\"\n\n{}{}",
        toml_str(&url),
        slow_target(&remote, &log, 8),
        token_table("ops", TOKEN, &["reconcile:app"])
    );
    let a = Setup::new(&config);
    let daemon = a.serve();
    wait_for(Duration::from_secs(60), "the first apply to start", || {
        lines(&log) == ["start"]
    });
    // Acknowledged: it must run after the one running now.
    assert_eq!(reconcile(daemon.port), 202);
    cluster.crash();
    let down = std::time::Instant::now();
    assert_eq!(reconcile(daemon.port), 503);
    assert_eq!(http_get(daemon.port, "/readyz").map(|(c, _)| c), Some(503));
    std::thread::sleep(Duration::from_secs(5).saturating_sub(down.elapsed()));
    assert_eq!(lines(&log), ["start"], "the command outlived its lease");
    cluster.start();
    wait_for(
        Duration::from_secs(30),
        "the daemon to be ready again",
        || http_get(daemon.port, "/readyz").is_some_and(|(c, _)| c == 200),
    );
    wait_for(
        Duration::from_secs(90),
        "the acknowledged reconcile to be applied",
        || lines(&log).len() >= 3,
    );
    assert_eq!(lines(&log), ["start", "start", "end"]);
    wait_for(Duration::from_secs(30), "the run to be recorded", || {
        let t = a.target_status("app");
        t["last_result"] == "changed" && t["queued"] == false && t["running"] == false
    });
    daemon.stop();
}

/// Two instances on one database, both scheduling the same target: its
/// first interval tick runs once, not once per instance, and the failure
/// it ends with is sent once, though both instances' outbox senders look
/// (end to end; that two senders racing for the same rows attempt each
/// once is `notify::outbox::tests::two_senders_…`, on both databases).
#[test]
fn two_instances_run_an_interval_tick_once_and_send_its_notification_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/config", "v1\n")], "first");
    let sink = Service::http_sink(root.path(), 0);
    let config = format!(
        "[database]\nurl = {}\n\n[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\n{}",
        toml_str(&database()),
        sink.port,
        exec_target(
            "app",
            &remote.url(),
            "notify = [\"hook\"]\npath = \"app\"\ninterval = \"1h\"",
            "apply = [\"sh\", \"-c\", \"sleep 1; echo the disk is full >&2; exit 1\"]",
        )
    );
    let a = Setup::new(&config);
    let b = Setup::new(&config);
    let first = a.serve();
    let second = b.serve();
    wait_for(Duration::from_secs(60), "the failure to be sent", || {
        !sink.requests().is_empty()
    });
    // Both senders look every 2 s: a second send would have come by now.
    std::thread::sleep(Duration::from_secs(7));
    let sent = sink.requests();
    assert_eq!(sent.len(), 1, "{sent:#?}");
    let runs = b.history("app");
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0]["result"], "failed");
    first.stop();
    second.stop();
}

/// Review gates across instances. A terraform plan made on host a is
/// approved and applied on host b, where its plan file is not: b plans
/// again and applies only because its plan is the same (same hash); the
/// file on a is never used. When the state moved between the approval and
/// the apply, b's plan differs: nothing is applied, the approval is
/// superseded, and b's plan waits for a person in its place.
#[test]
fn an_approved_plan_made_on_another_host_is_applied_only_if_planned_the_same() {
    let root = tempfile::tempdir().expect("tempdir");
    // The state both hosts share, as a remote backend would hold it.
    let state = root.path().join("shared/net.tfstate");
    let tf = format!(
        "terraform {{\n  backend \"local\" {{\n    path = {}\n  }}\n}}\n\n\
         variable \"greeting\" {{\n  type = string\n}}\n\n\
         resource \"terraform_data\" \"greeting\" {{\n  input = var.greeting\n}}\n",
        toml_str(&state.display().to_string())
    );
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("network/main.tf", &tf),
            ("network/prod.tfvars", "greeting = \"v1\"\n"),
        ],
        "v1",
    );
    let config = format!(
        "[database]\nurl = {}\n\n[[targets]]\nname = \"net\"\nrepo = {}\npath = \"network\"\n\
         timeout = \"2m\"\ninterval = \"1h\"\npolicy = \"approval\"\n[targets.backend]\n\
         kind = \"terraform\"\nvar_files = [\"prod.tfvars\"]\n\
         env = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n\n{}",
        toml_str(&database()),
        toml_str(&remote.url()),
        token_table("ops", TOKEN, &["approve:net", "reconcile:net", "read"])
    );
    let a = Setup::new(&config);
    let b = Setup::new(&config);

    // Host a plans; host b's daemon is where it gets approved and applied.
    let out = a.run(&["tick", "net"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let on_a = a.plan_files("net");
    assert_eq!(on_a.len(), 1, "{on_a:?}");
    let d = b.serve();
    let ops = Approver {
        port: d.port,
        token: TOKEN,
    };
    let p1 = ops.pending();
    assert_eq!(p1.len(), 1, "{p1:?}");
    ops.approve(&p1[0]);
    let deployment = |id: &serde_json::Value| {
        ops.call(
            "GET",
            &format!("/api/v1/deployments/{id}"),
            serde_json::Value::Null,
        )
    };
    wait_for(Duration::from_secs(120), "host b to apply it", || {
        deployment(&p1[0]["id"])["state"] == "applied"
    });
    assert_eq!(greeting_in_state(&state).as_deref(), Some("v1"));
    let run = &b.history("net")[0];
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| m.contains("made again on this host (its plan file ")
                && m.contains("and found the same")),
        "{run}"
    );
    assert_eq!(
        a.plan_files("net"),
        on_a,
        "host a's plan file was not left alone"
    );

    // The next commit, planned on a; then the state moves under it.
    remote.commit(&[("network/prod.tfvars", "greeting = \"v2\"\n")], "v2");
    let out = a.run(&["tick", "net"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let p2 = ops.pending();
    assert_eq!(p2.len(), 1, "{p2:?}");
    let scratch = root.path().join("outside");
    std::fs::create_dir_all(&scratch).expect("mkdir");
    std::fs::write(scratch.join("main.tf"), &tf).expect("write");
    for args in [
        &["init", "-input=false"][..],
        &[
            "apply",
            "-input=false",
            "-auto-approve",
            "-var",
            "greeting=outside",
        ],
    ] {
        let out = std::process::Command::new("terraform")
            .args(args)
            .current_dir(&scratch)
            .env("TF_CLI_CONFIG_FILE", "/dev/null")
            .output()
            .expect("terraform");
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    ops.approve(&p2[0]);
    wait_for(Duration::from_secs(120), "host b to plan again", || {
        deployment(&p2[0]["id"])["state"] == "superseded"
    });
    let old = deployment(&p2[0]["id"]);
    assert!(
        old["message"]
            .as_str()
            .is_some_and(|m| m.contains("differs from the approved one")),
        "{old}"
    );
    assert_eq!(
        greeting_in_state(&state).as_deref(),
        Some("outside"),
        "applied unapproved"
    );
    // The new plan is recorded just after the approved one is marked
    // superseded (its own write): wait for it rather than race it.
    wait_for(Duration::from_secs(30), "the new plan to wait", || {
        !ops.pending().is_empty()
    });
    let p3 = ops.pending();
    assert_eq!(p3.len(), 1, "{p3:?}");
    assert_ne!(p3[0]["id"], p2[0]["id"]);
    assert_eq!(p3[0]["commit"], p2[0]["commit"]);
    // Approved, b applies its own plan: its file is on b.
    ops.approve(&p3[0]);
    wait_for(
        Duration::from_secs(120),
        "host b to apply the new plan",
        || deployment(&p3[0]["id"])["state"] == "applied",
    );
    assert_eq!(greeting_in_state(&state).as_deref(), Some("v2"));
    let run = &b.history("net")[0];
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| !m.contains("made again") && m.contains("Apply complete")),
        "{run}"
    );
    d.stop();
}

/// `[database]` over TLS, against a server that refuses connections
/// without it: with `sslmode = "verify-full"` and the `ca_file` that signed
/// the server's certificate, runs are recorded there; a server certificate
/// from another CA is refused, and so is a connection without TLS, each
/// saying so and naming the database.
#[test]
fn the_database_is_reached_over_tls_verified_against_its_ca_file() {
    let root = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(&root.path().join("ca"));
    let (cert, key) = ca.issue("postgres", true);
    let other = TestCa::new(&root.path().join("other"));
    let cluster = driftless::store::testing::OwnCluster::with_tls(&cert, &key);
    cluster.create("tls");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/config", "v1\n")], "first");
    let setup = |tls: &str| {
        Setup::new(&format!(
            "[database]\nurl = {}\n{tls}\n\n{}",
            toml_str(&cluster.tcp_url("tls")),
            exec_target("app", &remote.url(), "path = \"app\"", "apply = [\"true\"]")
        ))
    };
    let ca_file = |ca: &TestCa| format!("ca_file = {}", toml_str(&ca.pem().display().to_string()));

    let good = setup(&format!("sslmode = \"verify-full\"\n{}", ca_file(&ca)));
    let out = good.run(&["tick", "app"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Applied under its keeper, which renews the claim over TLS too.
    let runs = good.history("app");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["result"], "changed", "{}", runs[0]);

    let wrong = setup(&format!("sslmode = \"verify-full\"\n{}", ca_file(&other)));
    let out = wrong.run(&["tick", "app"]);
    let said = text(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&cluster.tcp_url("tls")) && said.to_lowercase().contains("certificate"),
        "{said}"
    );

    let plain = setup("sslmode = \"disable\"");
    let out = plain.run(&["tick", "app"]);
    let said = text(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&cluster.tcp_url("tls")) && said.contains("no encryption"),
        "{said}"
    );
    assert_eq!(good.history("app").len(), 1, "a run recorded without TLS");
}

/// A rate limit one instance is answered holds for every instance on the
/// database: the pause is a row they all read, so the forge gets one call
/// while it says it is limited, whichever instance sends, and both
/// statuses arrive after the reset.
#[test]
fn a_rate_limit_holds_across_instances() {
    let root = tempfile::tempdir().expect("tempdir");
    let url = database();
    let forge = ForgeStandin::start(root.path());
    let remote = Remote::new(root.path(), "infra");
    let sha = remote.commit(&[("a/v", "1\n"), ("b/v", "1\n")], "first");
    let targets = ["a", "b"]
        .iter()
        .map(|t| {
            exec_target(
                t,
                &remote.url(),
                &format!("path = \"{t}\"\nforge = \"f\"\nforge_repo = \"me/infra\""),
                "apply = [\"true\"]",
            )
        })
        .collect::<String>()
        + &forge.table("f", "github");
    let one = on_postgres(&url, &targets);
    let two = on_postgres(&url, &targets);
    forge.rate_limit("primary", 5.0);
    let out = one.run(&["tick", "a"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("rate-limited"),
        "{}",
        text(&out.stderr)
    );
    let out = two.run(&["tick", "b"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let limited = || {
        forge
            .journal()
            .iter()
            .filter(|r| r["limited"] == true)
            .count()
    };
    assert_eq!(limited(), 1, "{:#?}", forge.journal());
    let pending = text(&two.run(&["notify", "pending"]).stdout);
    assert!(pending.contains("forge `f`"), "{pending}");
    std::thread::sleep(Duration::from_secs(6));
    let out = two.run(&["tick", "b"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for t in ["a", "b"] {
        assert_eq!(
            forge
                .states(&sha, &format!("driftless/{t}"))
                .last()
                .map(String::as_str),
            Some("success"),
            "{t}: {:#?}",
            forge.journal()
        );
    }
    assert_eq!(limited(), 1, "{:#?}", forge.journal());
}
