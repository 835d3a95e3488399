//! Health gates (`[targets.health]`): an apply is `changed` only once its
//! checks pass; an unhealthy commit is reported, never applied again by
//! itself, and under `rollback` the last healthy commit is applied back
//! and held until a newer commit or a person's `retry`; a restart during
//! the checks resumes them without applying again.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::common::*;

/// An HTTP server on loopback that answers every request with the status
/// the test sets, and counts the requests.
struct Answerer {
    port: u16,
    status: Arc<AtomicU16>,
    asked: Arc<AtomicUsize>,
}

impl Answerer {
    fn start(status: u16) -> Answerer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (st, asked) = (
            Arc::new(AtomicU16::new(status)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (st2, asked2) = (st.clone(), asked.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                let mut line = String::new();
                // The request line and headers, up to the blank line.
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if line == "\r\n" || line == "\n" {
                        break;
                    }
                    line.clear();
                }
                asked2.fetch_add(1, Ordering::SeqCst);
                let code = st2.load(Ordering::SeqCst);
                let body = if code == 200 { "ok" } else { "down" };
                let _ = write!(
                    conn,
                    "HTTP/1.1 {code} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Answerer {
            port,
            status: st,
            asked,
        }
    }

    fn set(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/healthz", self.port)
    }
}

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn newest(s: &Setup, target: &str) -> Value {
    s.history(target).into_iter().next().expect("a run")
}

fn events(s: &Setup) -> Vec<String> {
    sql_rows(&s.db(), "SELECT event FROM notifications ORDER BY id")
        .into_iter()
        .filter_map(|r| r["event"].as_str().map(str::to_string))
        .collect()
}

/// `on_unhealthy = "report"`: an apply whose http check answers 503 is
/// `unhealthy`, says which check and what it answered, tells the owners
/// once, and its commit is not applied again by a later tick; a newer
/// commit that is healthy is `changed` and `recovered`.
#[test]
fn an_unhealthy_apply_is_reported_and_not_applied_again_until_a_newer_commit() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("v", "1")], "first");
    let applies = root.path().join("applies.log");
    let server = Answerer::start(503);
    let token = root.path().join("forge-token");
    std::fs::write(&token, "forge-token-health").expect("token");
    let s = Setup::new(&format!(
        "[[notifiers]]\nname = \"ops\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:9/\"\n\
         [[forges]]\nname = \"gh\"\nkind = \"github\"\napi_url = \"http://127.0.0.1:9/\"\n\
         token_file = {}\n\
         [defaults]\nnotify = [\"ops\"]\n\n{}",
        toml_str(&token.display().to_string()),
        exec_target(
            "web",
            &remote.url(),
            &format!(
                "forge = \"gh\"\nforge_repo = \"me/infra\"\n[targets.health]\ngrace = \"0s\"\ninterval = \"1s\"\ntimeout = \"3s\"\n\
                 [[targets.health.checks]]\nhttp = \"{}\"\n",
                server.url()
            ),
            &format!(
                "apply = [\"sh\", \"-c\", \"echo applied >> {}\"]",
                applies.display()
            ),
        )
    ));
    let out = s.run(&["tick", "web"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let run = newest(&s, "web");
    assert_eq!(run["result"], "unhealthy", "{run} {}", text(&out.stderr));
    let said = run["message"].as_str().unwrap_or("");
    assert!(
        said.starts_with("applied but unhealthy: ")
            && said.contains(&format!("http {} answered 503", server.url())),
        "{said}"
    );
    assert!(
        server.asked.load(Ordering::SeqCst) >= 2,
        "checked more than once"
    );
    // The commit status says it too.
    let statuses = sql_rows(
        &s.db(),
        "SELECT state, description FROM forge_statuses ORDER BY id DESC LIMIT 1",
    );
    assert_eq!(statuses[0]["state"], "failure", "{statuses:?}");
    assert!(
        statuses[0]["description"]
            .as_str()
            .unwrap_or("")
            .starts_with("applied but unhealthy: http"),
        "{statuses:?}"
    );
    assert_eq!(lines(&applies), 1);
    let st = s.target_status("web");
    assert_eq!(st["last_result"], "unhealthy");
    assert!(st["quarantined_sha"].is_string(), "{st}");
    assert!(
        st["hold"]
            .as_str()
            .unwrap_or("")
            .contains("not applied again"),
        "{st}"
    );

    // Another tick does not apply the unhealthy commit again.
    let out = s.run(&["tick", "web"]);
    assert_eq!(out.status.code(), Some(1));
    let run = newest(&s, "web");
    assert_eq!(run["result"], "held", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains("not applied again"),
        "{run}"
    );
    assert_eq!(lines(&applies), 1, "the unhealthy commit was applied again");
    assert_eq!(events(&s), ["unhealthy"], "told once");
    let doc: Value = serde_json::from_str(
        sql_rows(&s.db(), "SELECT document FROM notifications")[0]["document"]
            .as_str()
            .unwrap_or("{}"),
    )
    .expect("a JSON document");
    assert_eq!(doc["event"], "unhealthy", "{doc}");

    // A person's retry while it still answers 503: nothing to apply, but
    // the checks run again and the quarantine holds (unchecked, the
    // retry's `no_change` lifted it as healthy).
    let asked = server.asked.load(Ordering::SeqCst);
    let out = s.run(&["retry", "web"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let run = newest(&s, "web");
    assert_eq!(run["result"], "unhealthy", "{run}");
    assert!(server.asked.load(Ordering::SeqCst) > asked, "checked again");
    let st = s.target_status("web");
    assert!(st["quarantined_sha"].is_string(), "{st}");
    assert_ne!(st["healthy_sha"], st["quarantined_sha"], "{st}");
    assert_eq!(lines(&applies), 1);

    // The service is fixed and a newer commit arrives: applied, healthy.
    server.set(200);
    let fixed = remote.commit(&[("v", "2")], "second");
    let out = s.run(&["tick", "web"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let run = newest(&s, "web");
    assert_eq!(run["result"], "changed", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains("(healthy after"),
        "{run}"
    );
    let st = s.target_status("web");
    assert_eq!(st["healthy_sha"], fixed.as_str(), "{st}");
    assert!(st.get("quarantined_sha").is_none(), "{st}");
    // Told of the first apply and of the retry (a person's new try), then
    // of the recovery.
    assert_eq!(events(&s), ["unhealthy", "unhealthy", "recovered"]);
    assert_eq!(lines(&applies), 2);
}

/// `on_unhealthy = "rollback"`: the unhealthy commit is applied, found
/// unhealthy, and the last healthy commit is applied back as a run of its
/// own (`rolled_back`); later ticks hold it there (`held`) without
/// applying the bad commit; `retry` tries the bad commit once more; a
/// newer healthy commit ends the hold.
#[test]
fn rollback_applies_the_last_healthy_commit_and_holds_it_until_a_newer_one() {
    rollback_holds("");
}

/// The same on PostgreSQL: the quarantine, the hold and the rollback job
/// are the database's, as on SQLite.
#[test]
fn rollback_holds_on_postgres_too() {
    rollback_holds(&postgres_table());
}

/// The rollback scenario, with `database` (TOML, or "" for SQLite).
fn rollback_holds(database: &str) {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let good = remote.commit(&[("version.txt", "good\n")], "good");
    let live = root.path().join("live.txt");
    let applies = root.path().join("applies.log");
    let s = Setup::new(
        &(database.to_string()
            + &exec_target(
                "web",
                &remote.url(),
                &format!(
                    "[targets.health]\ngrace = \"0s\"\ninterval = \"1s\"\ntimeout = \"2s\"\n\
             on_unhealthy = \"rollback\"\n\
             [[targets.health.checks]]\ncommand = [\"grep\", \"-q\", \"good\", \"{}\"]\n",
                    live.display()
                ),
                &format!(
                    "apply = [\"sh\", \"-c\", \"cp version.txt {l}; echo $(cat version.txt) >> {a}\"]",
                    l = live.display(),
                    a = applies.display()
                ),
            )),
    );
    let out = s.run(&["tick", "web"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(s.target_status("web")["healthy_sha"], good.as_str());

    let bad = remote.commit(&[("version.txt", "broken\n")], "bad");
    let out = s.run(&["tick", "web"]);
    assert_eq!(out.status.code(), Some(1));
    let run = newest(&s, "web");
    assert_eq!(run["result"], "unhealthy", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains("`grep -q good"),
        "{run}"
    );
    let st = s.target_status("web");
    assert_eq!(st["quarantined_sha"], bad.as_str());
    assert_eq!(st["queued"], true, "a rollback is queued: {st}");

    // A daemon takes the queued rollback: the healthy commit is applied
    // back, as a run of its own.
    let daemon = s.serve();
    wait_for(Duration::from_secs(30), "the rollback", || {
        newest(&s, "web")["result"] == "rolled_back"
    });
    drop(daemon);
    let run = newest(&s, "web");
    eprintln!("rollback cost (exec): {} ms", run["duration_ms"]);
    assert_eq!(run["sha"], good.as_str(), "{run}");
    assert_eq!(run["trigger"], "rollback", "{run}");
    assert_eq!(std::fs::read_to_string(&live).expect("live"), "good\n");
    let st = s.target_status("web");
    assert_eq!(st["last_applied_sha"], good.as_str());
    let hold = st["hold"].as_str().unwrap_or("");
    assert!(
        hold.starts_with(&format!(
            "held at {} (healthy); tip {} unhealthy: ",
            &good[..12],
            &bad[..12]
        )),
        "{hold}"
    );

    // Held: the bad commit is not applied again by a tick.
    let out = s.run(&["tick", "web"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(newest(&s, "web")["result"], "held");
    assert_eq!(std::fs::read_to_string(&live).expect("live"), "good\n");
    let kinds = std::fs::read_to_string(&applies).expect("applies");
    assert_eq!(kinds, "good\nbroken\ngood\n", "applied: {kinds}");

    // A person's retry applies the bad commit once more; still bad, it is
    // quarantined again, and the next one-shot tick takes over the
    // rollback it queued.
    let out = s.run(&["retry", "web"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert_eq!(newest(&s, "web")["result"], "unhealthy");
    assert_eq!(s.target_status("web")["queued"], true);
    let out = s.run(&["tick", "web"]);
    assert_eq!(out.status.code(), Some(1), "a rollback is not green");
    assert_eq!(newest(&s, "web")["result"], "rolled_back");
    assert_eq!(
        s.target_status("web")["queued"],
        false,
        "the rollback job was taken over"
    );
    let kinds = std::fs::read_to_string(&applies).expect("applies");
    assert_eq!(
        kinds, "good\nbroken\ngood\nbroken\ngood\n",
        "applied: {kinds}"
    );

    // A newer, healthy commit ends the hold.
    let fixed = remote.commit(&[("version.txt", "good again\n")], "fixed");
    let out = s.run(&["tick", "web"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let st = s.target_status("web");
    assert_eq!(st["last_result"], "changed", "{st}");
    assert_eq!(st["healthy_sha"], fixed.as_str());
    assert!(st.get("hold").is_none(), "{st}");
}

/// A daemon killed while the checks wait out `grace` resumes them after
/// its restart: the commit is applied once, and the run that ends the
/// health phase says it resumed.
#[test]
fn a_restart_during_the_grace_period_resumes_the_checks_without_applying_again() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let sha = remote.commit(&[("v", "1")], "first");
    let applies = root.path().join("applies.log");
    let server = Answerer::start(200);
    let s = Setup::new(&exec_target(
        "web",
        &remote.url(),
        &format!(
            "interval = \"1h\"\n[targets.health]\ngrace = \"8s\"\ninterval = \"1s\"\ntimeout = \"10s\"\n\
             [[targets.health.checks]]\nhttp = \"{}\"\n",
            server.url()
        ),
        &format!(
            "apply = [\"sh\", \"-c\", \"echo applied >> {}\"]",
            applies.display()
        ),
    ));
    let daemon = s.serve();
    wait_for(Duration::from_secs(30), "the health phase to begin", || {
        sql_rows(&s.db(), "SELECT health_run FROM targets WHERE name = 'web'")
            .first()
            .is_some_and(|r| r["health_run"].is_i64())
    });
    daemon.kill9();
    assert_eq!(
        server.asked.load(Ordering::SeqCst),
        0,
        "checked within grace"
    );
    let _daemon = s.serve();
    wait_for(
        Duration::from_secs(60),
        "the resumed checks to pass",
        || s.history("web").iter().any(|r| r["result"] == "changed"),
    );
    assert_eq!(lines(&applies), 1, "applied again after the restart");
    let runs = s.history("web");
    let done = runs
        .iter()
        .find(|r| r["result"] == "changed")
        .expect("changed");
    assert!(
        done["message"].as_str().unwrap_or("").contains("resumed"),
        "{done}"
    );
    assert_eq!(s.target_status("web")["healthy_sha"], sha.as_str());
}

/// Approvals × health: an approved plan applied is health-gated like any
/// apply, and the rollback of an approval target is a plan of the healthy
/// commit that waits for a person — nothing rolls back unattended.
#[test]
fn an_approval_target_rolls_back_only_through_an_approved_plan() {
    const OPS: &str = "ops-token-health-4e1a";
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let good = remote.commit(&[("app/desired.txt", "good\n")], "good");
    let world = root.path().join("world.txt");
    let plan = "cmp -s desired.txt \\\"$WORLD\\\" || echo '~ file world.txt (update)'";
    let s = Setup::new(&format!(
        "{}{}",
        token_table("ops", OPS, &["approve:app", "read"]),
        exec_target(
            "app",
            &remote.url(),
            &format!(
                "path = \"app\"\npolicy = \"approval\"\n\
                 [targets.health]\ninterval = \"1s\"\ntimeout = \"2s\"\non_unhealthy = \"rollback\"\n\
                 [[targets.health.checks]]\ncommand = [\"grep\", \"-qx\", \"good\", {}]\n",
                toml_str(&world.display().to_string())
            ),
            &format!(
                "apply = [\"sh\", \"-c\", \"cp desired.txt \\\"$WORLD\\\"\"]\n\
                 plan = [\"sh\", \"-c\", \"{plan}\"]\nenv = {{ WORLD = {} }}",
                toml_str(&world.display().to_string())
            ),
        )
    ));
    let intake = Intake::start(&s);
    let who = Approver {
        port: intake.port,
        token: OPS,
    };
    let tick = || {
        let out = s.run(&["tick", "app"]);
        (out.status.code(), text(&out.stdout) + &text(&out.stderr))
    };
    let read = || std::fs::read_to_string(&world).unwrap_or_default();
    let approve_one = |commit: &str| {
        let p = who.pending();
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0]["commit"], commit, "{p:?}");
        who.approve(&p[0]);
    };

    tick();
    approve_one(&good);
    let (code, out) = tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("(healthy after"), "{out}");

    let bad = remote.commit(&[("app/desired.txt", "broken\n")], "bad");
    tick();
    approve_one(&bad);
    let (code, out) = tick();
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(newest(&s, "app")["result"], "unhealthy");
    assert_eq!(read(), "broken\n");

    // The rollback plans the healthy commit and waits for a person.
    let (_, out) = tick();
    assert!(out.contains("waits for approval"), "{out}");
    assert_eq!(read(), "broken\n", "rolled back unattended");
    approve_one(&good);
    let (code, out) = tick();
    assert_eq!(code, Some(1), "{out}");
    let run = newest(&s, "app");
    assert_eq!(run["result"], "rolled_back", "{run}");
    assert_eq!(read(), "good\n");
    // Held: the next tick plans nothing for the bad tip.
    let (_, out) = tick();
    assert!(who.pending().is_empty(), "{out}");
    assert_eq!(newest(&s, "app")["result"], "held", "{out}");
}

/// terraform × health: a check names an output (`${outputs.endpoint}`),
/// read after the apply and filled into the URL, in the run's message too.
#[test]
fn a_terraform_check_names_an_output() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let server = Answerer::start(200);
    let tf = |port: u16| {
        format!(
            "resource \"terraform_data\" \"web\" {{\n  input = \"{port}\"\n}}\n\
             output \"endpoint\" {{\n  value = \"http://127.0.0.1:${{terraform_data.web.output}}\"\n}}\n"
        )
    };
    remote.commit(&[("web/main.tf", &tf(server.port))], "up");
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"web\"\nrepo = \"{}\"\npath = \"web\"\ntimeout = \"2m\"\n\
         [targets.health]\ninterval = \"1s\"\ntimeout = \"2s\"\n\
         [[targets.health.checks]]\nhttp = \"${{outputs.endpoint}}/healthz\"\n\
         [targets.backend]\nkind = \"terraform\"\nenv = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n",
        remote.url()
    ));
    let out = s.run(&["tick", "web"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        server.asked.load(Ordering::SeqCst) >= 1,
        "the output's URL was checked"
    );

    let closed = free_port();
    remote.commit(&[("web/main.tf", &tf(closed))], "moved");
    let out = s.run(&["tick", "web"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let run = newest(&s, "web");
    assert_eq!(run["result"], "unhealthy", "{run}");
    assert!(
        run["message"].as_str().unwrap_or("").contains(&format!(
            "http http://127.0.0.1:{closed}/healthz did not answer"
        )),
        "{run}"
    );
}

/// compose × health on a real dockerd: an image whose HEALTHCHECK fails
/// (`services = true` reads it from dockerd) makes the apply `unhealthy`,
/// and the rollback brings back the previous commit's containers, healthy.
#[test]
fn a_compose_service_whose_healthcheck_fails_is_rolled_back() {
    let root = tempfile::tempdir().expect("tempdir");
    let docker = Dockerd::start(root.path());
    let ctx = root.path().join("image");
    std::fs::create_dir_all(&ctx).expect("mkdir");
    std::fs::write(
        ctx.join("Dockerfile"),
        format!(
            "FROM {TEST_IMAGE}\nHEALTHCHECK --interval=1s --timeout=1s --retries=1 \
             CMD [\"/bin/sh\", \"-c\", \"[ -f /ok ]\"]\n"
        ),
    )
    .expect("Dockerfile");
    let built = std::process::Command::new("docker")
        .args(["build", "-q", "-t", "driftless-test/healthcheck:1"])
        .arg(&ctx)
        .env("DOCKER_HOST", &docker.host)
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .expect("docker build");
    assert!(built.status.success(), "{}", text(&built.stderr));
    let compose = |script: &str| {
        format!(
            "services:\n  web:\n    image: driftless-test/healthcheck:1\n    network_mode: none\n    \
             command: [\"sh\", \"-c\", \"{script}\"]\n"
        )
    };
    let remote = Remote::new(root.path(), "infra");
    let good = remote.commit(
        &[("app/compose.yaml", &compose("echo > /ok; sleep 3600"))],
        "good",
    );
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"app\"\nrepo = \"{}\"\npath = \"app\"\n\
         [targets.health]\ninterval = \"1s\"\ntimeout = \"15s\"\non_unhealthy = \"rollback\"\n\
         [[targets.health.checks]]\nservices = true\n\
         [targets.backend]\nkind = \"compose\"\ncommand = \"docker-compose\"\nhost = \"{}\"\n",
        remote.url(),
        docker.host
    ));
    let out = s.run(&["tick", "app"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(newest(&s, "app")["result"], "changed");

    remote.commit(&[("app/compose.yaml", &compose("sleep 3600"))], "bad");
    let out = s.run(&["tick", "app"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let run = newest(&s, "app");
    assert_eq!(run["result"], "unhealthy", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains("services: app_web_1 is unhealthy"),
        "{run}"
    );

    let out = s.run(&["tick", "app"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let run = newest(&s, "app");
    eprintln!("rollback cost (compose): {} ms", run["duration_ms"]);
    assert_eq!(run["result"], "rolled_back", "{run}");
    assert_eq!(run["sha"], good.as_str());
    let id = docker.docker(&[
        "ps",
        "-q",
        "--filter",
        "label=com.docker.compose.project=app",
    ]);
    let id = text(&id.stdout).trim().to_string();
    let health = docker.docker(&["inspect", "--format", "{{.State.Health.Status}}", &id]);
    assert_eq!(
        text(&health.stdout).trim(),
        "healthy",
        "{}",
        text(&health.stderr)
    );
    let cmd = docker.docker(&["inspect", "--format", "{{json .Config.Cmd}}", &id]);
    assert!(
        text(&cmd.stdout).contains("echo > /ok"),
        "{}",
        text(&cmd.stdout)
    );
}

/// pi × rollback, the magic rollback: a commit whose activation makes the
/// host refuse driftless's key cannot be rolled back over ssh. The apply
/// armed a watchdog on the host first; unconfirmed, it puts the previous
/// tree back and runs its activation again, and the next tick finds the
/// host reachable and healthy at the previous commit.
#[test]
fn a_pi_change_that_locks_driftless_out_is_undone_by_the_host_itself() {
    let root = tempfile::tempdir().expect("tempdir");
    let sshd = Sshd::start(root.path());
    let keys = sshd
        .client_key
        .parent()
        .expect("the sshd dir")
        .join("authorized_keys");
    let good_keys = std::fs::read_to_string(&keys).expect("authorized_keys");
    let remote = Remote::new(root.path(), "infra");
    let good = remote.commit(
        &[("pi/authorized_keys", &good_keys), ("pi/marker", "good\n")],
        "good",
    );
    let remote_dir = root.path().join("live");
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"pi\"\nrepo = \"{}\"\npath = \"pi\"\n\
         [targets.health]\ninterval = \"1s\"\ntimeout = \"3s\"\non_unhealthy = \"rollback\"\n\
         confirm_within = \"8s\"\n\
         [[targets.health.checks]]\non_host = [\"cat\", \"marker\"]\n\
         [targets.backend]\nkind = \"pi\"\nhost = \"127.0.0.1\"\nport = {}\nuser = \"{}\"\n\
         identity_file = {}\nknown_hosts_file = {}\nremote_dir = {}\naction = \"command\"\n\
         command = [\"cp\", \"authorized_keys\", {}]\n",
        remote.url(),
        sshd.port,
        sshd.user,
        toml_str(&sshd.client_key.display().to_string()),
        toml_str(&sshd.known_hosts.display().to_string()),
        toml_str(&remote_dir.display().to_string()),
        toml_str(&keys.display().to_string()),
    ));
    let out = s.run(&["tick", "pi"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(newest(&s, "pi")["result"], "changed");
    let watchdog = root.path().join("live.driftless-watchdog.pid");
    assert!(
        !watchdog.exists(),
        "a confirmed change leaves no watchdog armed"
    );

    // The bad commit replaces the host's authorized keys: driftless is
    // locked out, its checks fail, and nothing it sends reaches the host.
    remote.commit(
        &[("pi/authorized_keys", "# nobody\n"), ("pi/marker", "bad\n")],
        "locks driftless out",
    );
    let out = s.run(&["tick", "pi"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let run = newest(&s, "pi");
    assert_eq!(run["result"], "unhealthy", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains("on_host `cat marker`"),
        "{run}"
    );
    assert_eq!(std::fs::read_to_string(&keys).expect("keys"), "# nobody\n");

    // The host undoes it by itself within confirm_within.
    wait_for(
        Duration::from_secs(30),
        "the watchdog to undo the change",
        || std::fs::read_to_string(&keys).is_ok_and(|k| k == good_keys) && !watchdog.exists(),
    );
    assert_eq!(
        std::fs::read_to_string(remote_dir.join("marker")).expect("marker"),
        "good\n"
    );
    // The next tick reaches the host and holds it at the healthy commit.
    let out = s.run(&["tick", "pi"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let run = newest(&s, "pi");
    eprintln!(
        "rollback cost (pi, after the host undid it): {} ms",
        run["duration_ms"]
    );
    assert_eq!(run["result"], "rolled_back", "{run}");
    assert_eq!(run["sha"], good.as_str());
    assert_eq!(
        std::fs::read_to_string(remote_dir.join("marker")).expect("marker"),
        "good\n"
    );
}

/// `recheck = true`: a tick that applied nothing checks too; a target
/// that was healthy and is not any more is `unhealthy` with nothing
/// applied and nothing quarantined, and `recovered` when it is again.
#[test]
fn recheck_reports_health_that_drifted_without_applying_or_quarantining() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let sha = remote.commit(&[("v", "1")], "first");
    let applies = root.path().join("applies.log");
    let server = Answerer::start(200);
    let s = Setup::new(&exec_target(
        "web",
        &remote.url(),
        &format!(
            "[targets.health]\ninterval = \"1s\"\ntimeout = \"2s\"\nrecheck = true\n\
             [[targets.health.checks]]\ntcp = \"127.0.0.1:{}\"\n\
             [[targets.health.checks]]\nhttp = \"{}\"\n",
            server.port,
            server.url()
        ),
        &format!(
            "apply = [\"sh\", \"-c\", \"echo applied >> {}\"]",
            applies.display()
        ),
    ));
    assert!(s.run(&["tick", "web"]).status.success());
    server.set(500);
    let out = s.run(&["tick", "web"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let run = newest(&s, "web");
    assert_eq!(run["result"], "unhealthy", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains("nothing was applied"),
        "{run}"
    );
    let st = s.target_status("web");
    assert!(st.get("quarantined_sha").is_none(), "{st}");
    assert_eq!(st["last_applied_sha"], sha.as_str());
    server.set(200);
    let out = s.run(&["tick", "web"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(newest(&s, "web")["result"], "no_change");
    assert_eq!(lines(&applies), 1, "nothing applied again");
}

/// Dependencies × health: a target whose dependency is unhealthy (here a
/// `tcp` check finds nothing listening) is blocked, says why, and runs
/// nothing.
#[test]
fn an_unhealthy_dependency_blocks_its_dependents() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("db/v", "1"), ("app/v", "1")], "first");
    let applies = root.path().join("app.log");
    let closed = free_port();
    let s = Setup::new(&format!(
        "{}{}",
        exec_target(
            "db",
            &remote.url(),
            &format!(
                "path = \"db\"\n[targets.health]\ninterval = \"1s\"\ntimeout = \"2s\"\n\
                 [[targets.health.checks]]\ntcp = \"127.0.0.1:{closed}\"\n"
            ),
            "apply = [\"true\"]",
        ),
        exec_target(
            "app",
            &remote.url(),
            "path = \"app\"\ndepends_on = [\"db\"]",
            &format!(
                "apply = [\"sh\", \"-c\", \"echo applied >> {}\"]",
                applies.display()
            ),
        )
    ));
    let out = s.run(&["tick", "db"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let run = newest(&s, "db");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("tcp 127.0.0.1:{closed}: ")),
        "{run}"
    );
    let out = s.run(&["tick", "app"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let run = newest(&s, "app");
    assert_eq!(run["result"], "blocked", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("blocked by `db`: it is unhealthy: applied but unhealthy: tcp"),
        "{run}"
    );
    assert_eq!(lines(&applies), 0);
}

/// Target sets × health: `[target_sets.health]` gates every member on its
/// own; a member whose checks fail is `unhealthy` while its sibling is
/// `changed`.
#[test]
fn a_sets_health_table_gates_each_member() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[("stacks/a/ok", "yes\n"), ("stacks/b/v", "1\n")],
        "two stacks",
    );
    let s = Setup::new(&format!(
        "[[target_sets]]\nname_prefix = \"s-\"\nrepo = \"{}\"\npaths = \"stacks/*\"\n\
         [target_sets.health]\ninterval = \"1s\"\ntimeout = \"2s\"\n\
         [[target_sets.health.checks]]\ncommand = [\"test\", \"-f\", \"ok\"]\n\
         [target_sets.backend]\nkind = \"exec\"\napply = [\"true\"]\n",
        remote.url()
    ));
    let out = s.run(&["tick", "--all"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(newest(&s, "s-a")["result"], "changed");
    let b = newest(&s, "s-b");
    assert_eq!(b["result"], "unhealthy", "{b}");
    assert!(
        b["message"]
            .as_str()
            .unwrap_or("")
            .contains("`test -f ok` exited with code 1"),
        "{b}"
    );
}
