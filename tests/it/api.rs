//! The HTTP API and webhooks end to end, through the real `driftless serve`:
//! a signed push applied at exactly its commit, scoped tokens, `?wait=`,
//! pause and resume, metrics.

use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

const SECRET: &str = "hook-secret-for-the-e2e-test";

struct World {
    root: tempfile::TempDir,
    remote: Remote,
    setup: Setup,
    tokens: Vec<(String, String)>,
}

impl World {
    fn token(&self, name: &str) -> String {
        let t = &self
            .tokens
            .iter()
            .find(|(n, _)| n == name)
            .expect("token")
            .1;
        format!("Bearer {t}")
    }
}

/// Three exec targets on one local repository (each logs the commit it
/// applies), a GitHub receiver, and tokens with different scopes.
fn world() -> World {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("site/index.html", "v1"),
            ("api/main.py", "v1"),
            ("db/schema.sql", "v1"),
        ],
        "first",
    );
    let secret = root.path().join("hook-secret");
    std::fs::write(&secret, SECRET).expect("write");
    let mut cfg = format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n",
        toml_str(&secret.display().to_string())
    );
    let mut tokens = Vec::new();
    for (name, scopes) in [
        ("deployer", r#"["reconcile:web-*", "read"]"#),
        ("admin", r#"["reconcile:*", "pause:*", "read"]"#),
        ("viewer", r#"["read:web-*"]"#),
    ] {
        let (token, digest) = driftless::auth::new_token().expect("token");
        cfg.push_str(&format!(
            "[[tokens]]\nname = \"{name}\"\nsha256 = \"{digest}\"\nscopes = {scopes}\n\n"
        ));
        tokens.push((name.to_string(), token));
    }
    for (name, path) in [("web-site", "site"), ("web-api", "api"), ("db", "db")] {
        let log = root.path().join(format!("{name}.log"));
        cfg.push_str(&exec_target(
            name,
            &remote.url(),
            &format!("path = \"{path}\"\ninterval = \"1h\""),
            &format!(
                "apply = [\"sh\", \"-c\", \"git rev-parse HEAD >> {}\"]\nalways = true",
                log.display()
            ),
        ));
    }
    let setup = Setup::new(&cfg);
    World {
        root,
        remote,
        setup,
        tokens,
    }
}

fn applied(w: &World, name: &str) -> Vec<String> {
    std::fs::read_to_string(w.root.path().join(format!("{name}.log")))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn wait_idle(w: &World) {
    wait_for(Duration::from_secs(30), "every target idle", || {
        w.setup
            .status()
            .iter()
            .all(|t| t["queued"] == false && t["running"] == false && !t["last_result"].is_null())
    });
}

/// A GitHub push for the local repository, built on GitHub's own payload.
fn github_push(w: &World, sha: &str, changed: &[&str]) -> Vec<u8> {
    github_push_body(&w.remote.url(), sha, changed)
}

fn deliver(port: u16, body: &[u8], delivery: &str) -> HttpResponse {
    deliver_github_push(port, SECRET, body, delivery)
}

#[test]
fn a_signed_push_applies_exactly_the_affected_target_at_that_commit() {
    let w = world();
    let daemon = w.setup.serve();
    wait_idle(&w); // the first interval ticks of never-run targets
    let before: Vec<usize> = ["web-site", "web-api", "db"]
        .iter()
        .map(|t| applied(&w, t).len())
        .collect();
    assert_eq!(before, [1, 1, 1]);

    let sha = w.remote.commit(&[("site/index.html", "v2")], "site v2");
    let r = deliver(
        daemon.port,
        &github_push(&w, &sha, &["site/index.html"]),
        "e2e-1",
    );
    assert_eq!(r.status, 202, "{r:?}");
    assert_eq!(r.json()["queued"][0]["target"], "web-site");
    wait_for(Duration::from_secs(30), "the push to be applied", || {
        applied(&w, "web-site").len() == 2
    });
    wait_idle(&w);
    assert_eq!(applied(&w, "web-site")[1], sha);
    assert_eq!(
        applied(&w, "web-api").len(),
        1,
        "a target whose path was not touched ticked"
    );
    assert_eq!(applied(&w, "db").len(), 1);
    let run = &w.setup.history("web-site")[0];
    assert_eq!(run["sha"], sha);
    assert_eq!(run["trigger"], "webhook");
    assert_eq!(run["delivery_id"], "e2e-1");
    assert_eq!(run["receiver"], "github");

    // The same delivery again: nothing (no job is even queued).
    let before = jobs(&w.setup.db());
    let r = deliver(
        daemon.port,
        &github_push(&w, &sha, &["site/index.html"]),
        "e2e-1",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["duplicate"], true);
    let after = jobs(&w.setup.db());
    assert_eq!(after.len(), before.len(), "{after:?}");
    assert!(after.iter().all(|j| j.state == "done"), "{after:?}");
    assert_eq!(applied(&w, "web-site").len(), 2);

    // A push touching only api/ ticks only web-api.
    let sha2 = w.remote.commit(&[("api/main.py", "v2")], "api v2");
    let r = deliver(
        daemon.port,
        &github_push(&w, &sha2, &["api/main.py"]),
        "e2e-2",
    );
    assert_eq!(r.status, 202, "{r:?}");
    wait_for(Duration::from_secs(30), "web-api applied", || {
        applied(&w, "web-api").len() == 2
    });
    wait_idle(&w);
    assert_eq!(applied(&w, "web-api")[1], sha2);
    assert_eq!(applied(&w, "web-site").len(), 2);
    assert_eq!(applied(&w, "db").len(), 1);

    // Metrics count what happened.
    let (code, text) = http_get(daemon.port, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    assert!(
        text.contains(
            "driftless_webhook_deliveries_total{receiver=\"github\",outcome=\"queued\"} 2"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "driftless_webhook_deliveries_total{receiver=\"github\",outcome=\"duplicate\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("driftless_ticks_total{target=\"web-api\",result=\"changed\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("driftless_last_success_timestamp_seconds{target=\"db\"}"),
        "{text}"
    );
    // Every target has a queued count, 0 included; the content type is the
    // format written (OpenMetrics text, which ends with `# EOF`).
    for t in ["web-site", "web-api", "db"] {
        assert!(
            text.contains(&format!("driftless_jobs_queued{{target=\"{t}\"}} 0")),
            "{t}: {text}"
        );
    }
    let r = http(daemon.port, "GET", "/metrics", &[], b"");
    assert_eq!(
        r.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(r.body.trim_end().ends_with("# EOF"), "{}", r.body);
    assert_eq!(http_get(daemon.port, "/readyz").map(|r| r.0), Some(200));
}

#[test]
fn metrics_can_ask_for_a_read_token() {
    let w = world();
    let cfg = std::fs::read_to_string(&w.setup.config).expect("config");
    std::fs::write(
        &w.setup.config,
        cfg.replacen("[server]\n", "[server]\nmetrics = \"token\"\n", 1),
    )
    .expect("config");
    let daemon = w.setup.serve();
    let get = |auth: Option<&str>| {
        let h: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
        http(daemon.port, "GET", "/metrics", &h, b"").status
    };
    assert_eq!(get(None), 401);
    assert_eq!(get(Some("Bearer not-a-token")), 401);
    assert_eq!(get(Some(&w.token("viewer"))), 200);
}

#[test]
fn tokens_and_scopes() {
    let w = world();
    let daemon = w.setup.serve();
    wait_idle(&w);
    let p = daemon.port;
    let get = |path: &str, auth: Option<&str>| {
        let h: Vec<(&str, &str)> = auth.map(|a| vec![("Authorization", a)]).unwrap_or_default();
        http(p, "GET", path, &h, b"")
    };
    let post = |path: &str, auth: &str| http(p, "POST", path, &[("Authorization", auth)], b"");

    // No token, a wrong one, a malformed header: 401.
    for auth in [
        None,
        Some("Bearer dl_nope"),
        Some("dl_nope"),
        Some("Basic YWxhZGRpbjpvcGVuc2VzYW1l"),
    ] {
        let r = get("/api/v1/targets", auth);
        assert_eq!(r.status, 401, "{auth:?}: {r:?}");
        assert!(r.json()["error"].is_string());
    }
    // Read scopes filter what is listed.
    let names = |r: HttpResponse| -> Vec<String> {
        r.json()
            .as_array()
            .expect("list")
            .iter()
            .map(|t| t["name"].as_str().expect("name").to_string())
            .collect()
    };
    assert_eq!(
        names(get("/api/v1/targets", Some(&w.token("viewer")))),
        ["web-site", "web-api"]
    );
    assert_eq!(
        names(get("/api/v1/targets", Some(&w.token("admin")))),
        ["web-site", "web-api", "db"]
    );
    assert_eq!(
        get("/api/v1/targets/db", Some(&w.token("viewer"))).status,
        403
    );
    let t = get("/api/v1/targets/web-api", Some(&w.token("viewer")));
    assert_eq!(t.status, 200);
    assert_eq!(t.json()["backend"], "exec");
    assert!(t.json()["last_applied_sha"].is_string());
    // One target's record, read alone, is its record in the listing.
    let listed = get("/api/v1/targets", Some(&w.token("viewer"))).json();
    let in_list = listed
        .as_array()
        .and_then(|all| all.iter().find(|l| l["name"] == "web-api"))
        .cloned();
    assert_eq!(Some(t.json()), in_list);
    let runs = get(
        "/api/v1/targets/web-api/runs?limit=5",
        Some(&w.token("viewer")),
    );
    assert_eq!(runs.status, 200);
    assert_eq!(runs.json().as_array().map(Vec::len), Some(1));

    // Reconcile needs reconcile:<target>.
    assert_eq!(
        post("/api/v1/targets/db/reconcile", &w.token("deployer")).status,
        403
    );
    assert_eq!(
        post("/api/v1/targets/web-api/reconcile", &w.token("viewer")).status,
        403
    );
    let r = post("/api/v1/targets/web-api/reconcile", &w.token("deployer"));
    assert_eq!(r.status, 202, "{r:?}");
    let job = r.json()["job"].as_i64().expect("job id");
    wait_for(Duration::from_secs(30), "the manual job", || {
        get(&format!("/api/v1/jobs/{job}"), Some(&w.token("viewer"))).json()["state"] == "done"
    });
    let j = get(&format!("/api/v1/jobs/{job}"), Some(&w.token("viewer"))).json();
    assert_eq!(j["triggers"], json!(["manual"]));
    assert_eq!(j["run"]["result"], "changed");
    assert_eq!(get(&format!("/api/v1/jobs/{job}"), None).status, 401);
    assert_eq!(
        get("/api/v1/jobs/999999", Some(&w.token("admin"))).status,
        404
    );
    assert_eq!(
        post("/api/v1/targets/nope/reconcile", &w.token("admin")).status,
        404
    );

    // ?wait= holds the answer until the run is recorded.
    let sha = w.remote.commit(&[("db/schema.sql", "v2")], "schema v2");
    let r = post("/api/v1/targets/db/reconcile?wait=60s", &w.token("admin"));
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    assert_eq!(v["state"], "done");
    assert_eq!(v["run"]["result"], "changed");
    assert_eq!(v["run"]["sha"], sha);
    assert_eq!(applied(&w, "db").last(), Some(&sha));
    let r = post("/api/v1/targets/db/reconcile?wait=soon", &w.token("admin"));
    assert_eq!(r.status, 400);

    // Every refusal is JSON naming what is at fault: a duplicate or
    // unparsable parameter, a limit out of range (refused, not clamped),
    // an id that is not a number, an unknown endpoint.
    let admin = w.token("admin");
    for (path, names) in [
        ("/api/v1/targets/db/runs?limit=1&limit=2", "`limit`"),
        ("/api/v1/targets/db/runs?limit=ten", "`limit`"),
        ("/api/v1/targets/db/runs?limit=-1", "`limit`"),
        ("/api/v1/targets/db/runs?limit=0", "`limit`"),
        ("/api/v1/targets/db/runs?limit=1001", "`limit`"),
        ("/api/v1/deployments?limit=-1", "`limit`"),
        ("/api/v1/deployments?state=a&state=b", "`state`"),
        ("/api/v1/runs/abc", "`abc`"),
        ("/api/v1/jobs/1x", "`1x`"),
        ("/api/v1/deployments/-", "`-`"),
    ] {
        let r = get(path, Some(&admin));
        assert_eq!(r.status, 400, "{path}: {r:?}");
        let error = r.json()["error"].as_str().map(str::to_string);
        assert!(
            error.as_deref().is_some_and(|e| e.contains(names)),
            "{path}: {r:?}"
        );
    }
    let r = get("/api/v1/nothing-here", Some(&admin));
    assert_eq!(r.status, 404, "{r:?}");
    assert!(r.json()["error"].is_string(), "{r:?}");
    drop(daemon);
}

#[test]
fn a_push_of_an_older_commit_applies_the_branch_tip_and_records_both() {
    let w = world();
    let daemon = w.setup.serve();
    wait_idle(&w);
    // Two pushes land; the forge's delivery for the first arrives after
    // both are on the branch.
    let a = w.remote.commit(&[("site/index.html", "a")], "a");
    let b = w.remote.commit(&[("site/index.html", "b")], "b");
    assert_ne!(a, b);
    let r = deliver(
        daemon.port,
        &github_push(&w, &a, &["site/index.html"]),
        "tip-a",
    );
    assert_eq!(r.status, 202, "{r:?}");
    wait_for(Duration::from_secs(30), "the push applied", || {
        applied(&w, "web-site").len() == 2
    });
    wait_idle(&w);
    // What the apply saw, what its run records, and what was asked for.
    assert_eq!(
        applied(&w, "web-site")[1],
        b,
        "the apply did not see the tip"
    );
    let run = &w.setup.history("web-site")[0];
    assert_eq!(run["sha"], b.as_str());
    assert_eq!(run["requested_sha"], a.as_str());
    assert_eq!(
        w.setup.target_status("web-site")["last_applied_sha"],
        b.as_str()
    );
    drop(daemon);
}

#[test]
fn which_targets_a_push_affects_comes_from_git_not_from_the_payloads_file_lists() {
    let w = world();
    let daemon = w.setup.serve();
    wait_idle(&w);
    let first = git(&w.remote.bare, &["rev-parse", "main"]);
    let counts = || -> Vec<usize> {
        ["web-site", "web-api", "db"]
            .iter()
            .map(|t| applied(&w, t).len())
            .collect()
    };
    assert_eq!(counts(), [1, 1, 1]);

    // A push whose commit lists no files (GitHub sends empty lists for big
    // commits): git says db changed; the others are not run at all.
    let x = w.remote.commit(&[("db/schema.sql", "v2")], "schema v2");
    let r = deliver(daemon.port, &github_push(&w, &x, &[]), "git-1");
    assert_eq!(r.status, 202, "{r:?}");
    wait_for(Duration::from_secs(30), "db applied", || {
        applied(&w, "db").len() == 2
    });
    wait_idle(&w);
    assert_eq!(counts(), [1, 1, 2]);
    assert_eq!(applied(&w, "db")[1], x);
    // The jobs of the others were closed, saying why, with no run.
    let jobs: Vec<i64> = r.json()["queued"]
        .as_array()
        .expect("queued")
        .iter()
        .filter(|q| q["target"] != "db")
        .filter_map(|q| q["job"].as_i64())
        .collect();
    assert_eq!(jobs.len(), 2);
    for id in jobs {
        let j = http(
            daemon.port,
            "GET",
            &format!("/api/v1/jobs/{id}"),
            &[("Authorization", &w.token("admin"))],
            b"",
        )
        .json();
        assert_eq!(j["state"], "done", "{j}");
        assert!(j["run"].is_null(), "{j}");
    }
    assert_eq!(w.setup.history("web-api").len(), 1);

    // A force push that drops the db commit, with a payload that lists only
    // the new commit's file and no `forced` flag (as Gitea, Forgejo and
    // GitLab send it): db is put back to what the branch now holds.
    let y = w
        .remote
        .force_commit(&first, &[("site/index.html", "v9")], "site v9, db dropped");
    let r = deliver(
        daemon.port,
        &github_push(&w, &y, &["site/index.html"]),
        "git-2",
    );
    assert_eq!(r.status, 202, "{r:?}");
    wait_for(Duration::from_secs(30), "site and db applied", || {
        counts() == [2, 1, 3]
    });
    wait_idle(&w);
    assert_eq!(
        counts(),
        [2, 1, 3],
        "web-api ran although git says its path is unchanged"
    );
    assert_eq!(applied(&w, "db")[2], y);
    assert_eq!(applied(&w, "web-site")[1], y);
    drop(daemon);
}

#[test]
fn a_paused_target_is_never_ticked_until_resumed() {
    let w = world();
    let daemon = w.setup.serve();
    wait_idle(&w);
    let p = daemon.port;
    let admin = w.token("admin");
    let post = |path: &str, auth: &str| http(p, "POST", path, &[("Authorization", auth)], b"");

    assert_eq!(
        post("/api/v1/targets/web-site/pause", &w.token("deployer")).status,
        403
    );
    let r = post("/api/v1/targets/web-site/pause", &admin);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["changed"], true);
    let st = w.setup.target_status("web-site");
    assert_eq!(st["paused"], true);
    assert_eq!(st["paused_by"], "token:admin");

    // Manual reconcile: 409. A push: queued, and it waits there.
    let r = post("/api/v1/targets/web-site/reconcile", &admin);
    assert_eq!(r.status, 409, "{r:?}");
    assert!(r.json()["error"].as_str().unwrap_or("").contains("paused"));
    let sha = w.remote.commit(&[("site/index.html", "v3")], "site v3");
    let r = deliver(p, &github_push(&w, &sha, &["site/index.html"]), "paused-1");
    assert_eq!(r.status, 202);
    assert_eq!(r.json()["paused"], json!(["web-site"]));
    let queued: Vec<Value> = r.json()["queued"].as_array().cloned().unwrap_or_default();
    let job = queued
        .iter()
        .find(|q| q["target"] == "web-site")
        .and_then(|q| q["job"].as_i64())
        .unwrap_or_else(|| panic!("no job for the paused target: {queued:?}"));
    // A one-shot tick skips it too.
    let out = w.setup.run(&["tick", "web-site"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stdout).contains("paused"),
        "{}",
        text(&out.stdout)
    );
    // The workers took the delivery's other jobs (queued after this one)
    // and left this one alone.
    let others: Vec<i64> = queued
        .iter()
        .filter(|q| q["target"] != "web-site")
        .filter_map(|q| q["job"].as_i64())
        .collect();
    assert_eq!(others.len(), 2, "{queued:?}");
    wait_for(Duration::from_secs(30), "the other targets' jobs", || {
        jobs(&w.setup.db())
            .iter()
            .filter(|j| others.contains(&j.id))
            .all(|j| j.state == "done")
    });
    assert_eq!(applied(&w, "web-site").len(), 1);
    let j = http(
        p,
        "GET",
        &format!("/api/v1/jobs/{job}"),
        &[("Authorization", &admin)],
        b"",
    )
    .json();
    assert_eq!(j["state"], "queued", "{j}");

    // Resume: the push that waited is applied, with nothing else asked.
    let r = post("/api/v1/targets/web-site/resume", &admin);
    assert_eq!(r.status, 200);
    wait_for(Duration::from_secs(30), "the queued push applied", || {
        applied(&w, "web-site").last() == Some(&sha)
    });
    // The apply's log line comes before its run is recorded: wait for the job.
    let job_now = || {
        http(
            p,
            "GET",
            &format!("/api/v1/jobs/{job}"),
            &[("Authorization", &admin)],
            b"",
        )
        .json()
    };
    wait_for(Duration::from_secs(30), "the resumed job done", || {
        job_now()["state"] == "done"
    });
    let j = job_now();
    assert_eq!(j["run"]["sha"], sha, "{j}");
    assert!(
        j["triggers"]
            .as_array()
            .is_some_and(|t| t.contains(&json!("webhook"))),
        "{j}"
    );
    // The forge's Redeliver is a duplicate: nothing was lost to need it.
    let r = deliver(p, &github_push(&w, &sha, &["site/index.html"]), "paused-1");
    assert_eq!(
        (r.status, r.json()["duplicate"].clone()),
        (200, json!(true))
    );

    // The CLI pauses and resumes too.
    let out = w.setup.run(&["pause", "db"]);
    assert!(out.status.success());
    assert_eq!(w.setup.target_status("db")["paused"], true);
    assert!(w.setup.run(&["resume", "db"]).status.success());
    assert_eq!(w.setup.target_status("db")["paused"], false);
}

#[test]
fn token_new_prints_a_token_and_its_digest() {
    let out = output_within(
        std::process::Command::new(bin()).args(["token", "new", "ci"]),
        std::time::Duration::from_secs(300),
    );
    assert!(out.status.success());
    let text = text(&out.stdout);
    let token = text
        .lines()
        .find(|l| l.starts_with("dl_"))
        .expect("a token line");
    let digest = driftless::auth::digest(token);
    assert!(text.contains(&format!("sha256 = \"{digest}\"")), "{text}");
    assert!(text.contains("name = \"ci\""));
}

#[test]
fn a_paused_target_with_a_one_second_interval_never_runs() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("x", "1")], "first");
    let log = root.path().join("runs.log");
    let s = Setup::new(&exec_target(
        "fast",
        &remote.url(),
        "interval = \"1s\"",
        &format!(
            "apply = [\"sh\", \"-c\", \"echo run >> {}\"]\nalways = true",
            log.display()
        ),
    ));
    let daemon = s.serve();
    wait_for(Duration::from_secs(20), "the interval ticking", || {
        log_lines(&log).len() >= 2
    });
    let out = s.run(&["pause", "fast"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // A run already claimed when the pause landed may finish; then nothing,
    // over four of the interval's periods (absence has no event to wait on).
    wait_for(Duration::from_secs(30), "the claimed run to finish", || {
        let st = s.target_status("fast");
        st["running"] == false
    });
    let paused_at = log_lines(&log).len();
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        log_lines(&log).len(),
        paused_at,
        "the interval ran a paused target"
    );
    assert!(s.run(&["resume", "fast"]).status.success());
    wait_for(Duration::from_secs(10), "the interval again", || {
        log_lines(&log).len() > paused_at
    });
    drop(daemon);
}

#[test]
fn delivery_ids_are_forgotten_after_seven_days_and_not_before() {
    let w = world();
    let sha = w.remote.commit(&[("site/index.html", "v2")], "site v2");
    let body = github_push(&w, &sha, &["site/index.html"]);
    let daemon = w.setup.serve();
    for id in ["delivery-8-days-old", "delivery-6-days-old"] {
        let r = deliver(daemon.port, &body, id);
        assert_eq!(r.status, 202, "{id}: {r:?}");
        let again = deliver(daemon.port, &body, id);
        assert_eq!(again.status, 200, "{id}: {again:?}");
        assert_eq!(again.json()["duplicate"], true, "{id}: {again:?}");
    }
    wait_idle(&w);
    assert!(daemon.stop().success());
    let day_ms = 24 * 3600 * 1000;
    let db = w.setup.db();
    sql_exec(
        &db,
        &format!(
            "UPDATE deliveries SET received_at = received_at - {} WHERE delivery_id = 'delivery-8-days-old';\n\
             UPDATE deliveries SET received_at = received_at - {} WHERE delivery_id = 'delivery-6-days-old';",
            8 * day_ms,
            6 * day_ms
        ),
    );
    // The daemon forgets ids older than seven days when it starts (and
    // hourly): the forge may redeliver those as new; a younger id stays a
    // duplicate.
    let daemon = w.setup.serve();
    wait_for(
        Duration::from_secs(10),
        "the old delivery id forgotten",
        || {
            sql_rows(
                &db,
                "SELECT 1 FROM deliveries WHERE delivery_id = 'delivery-8-days-old'",
            )
            .is_empty()
        },
    );
    let kept = sql_rows(
        &db,
        "SELECT delivery_id FROM deliveries ORDER BY delivery_id",
    );
    assert_eq!(
        kept,
        vec![serde_json::json!({"delivery_id": "delivery-6-days-old"})]
    );
    let r = deliver(daemon.port, &body, "delivery-8-days-old");
    assert_eq!(r.status, 202, "{r:?}");
    let r = deliver(daemon.port, &body, "delivery-6-days-old");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["duplicate"], true, "{r:?}");
    wait_idle(&w);
}
