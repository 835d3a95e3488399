//! The nomad backend against `tests/nomad_standin.py` (Nomad's HTTP API as
//! published; no Nomad binary can be installed here), one test per
//! invariant, each trying to break it. The stand-in's journal records every
//! request driftless made, in order.

use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

const CANARY: &str = "canary-nomad-env-4b7e91";

fn web_job(image: &str, meta: &str) -> String {
    format!(
        r#"job "web" {{
  datacenters = ["dc1"]
  meta {{
{meta}
  }}
  group "web" {{
    count = 2
    scaling {{
      enabled = true
      min     = 1
      max     = 10
    }}
    task "server" {{
      driver = "docker"
      config {{
        image = "{image}"
      }}
      env {{
        DB_PASSWORD = "{CANARY}"
        PORT        = "8080"
      }}
      template {{
        data        = "password={CANARY}"
        destination = "local/app.env"
      }}
    }}
  }}
  group "worker" {{
    count = 1
    task "work" {{
      driver = "exec"
      config {{
        command = "/bin/worker"
      }}
    }}
  }}
}}
"#
    )
}

const AUTO: &str = "    driftless_policy = \"auto\"";

struct Fixture {
    _root: tempfile::TempDir,
    remote: Remote,
    nomad: NomadStandin,
    s: Setup,
}

fn fixture(extra_backend: &str) -> Fixture {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.25", AUTO))],
        "web",
    );
    let nomad = NomadStandin::start(root.path());
    let token = root.path().join("nomad-token");
    std::fs::write(&token, format!("{}\n", nomad.token)).expect("write");
    let s = Setup::new(&target("cluster", &remote, &nomad, &token, extra_backend));
    Fixture {
        _root: root,
        remote,
        nomad,
        s,
    }
}

fn target(
    name: &str,
    remote: &Remote,
    nomad: &NomadStandin,
    token: &std::path::Path,
    extra: &str,
) -> String {
    format!(
        "[[targets]]\nname = \"{name}\"\nrepo = \"{}\"\npath = \"jobs\"\ninterval = \"1h\"\n\
         [targets.backend]\nkind = \"nomad\"\naddress = \"{}\"\ntoken_file = {}\n{extra}\n\n",
        remote.url(),
        nomad.address(),
        toml_str(&token.display().to_string()),
    )
}

impl Fixture {
    /// One tick; returns (exit code, stdout+stderr, the journal entries this
    /// tick added).
    fn tick(&self) -> (Option<i32>, String, Vec<Value>) {
        let before = self.nomad.journal().len();
        let out = self.s.run(&["tick", "cluster"]);
        let j = self.nomad.journal();
        (
            out.status.code(),
            text(&out.stdout) + &text(&out.stderr),
            j[before..].to_vec(),
        )
    }

    fn message(&self) -> String {
        self.s.target_status("cluster")["last_message"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// The Nomad deployments as stored: each row's columns, and the
    /// fields of its `detail` (Nomad's own) beside them. `diff` is Nomad's
    /// diff as JSON (`plan_diff` in the detail), `diff_text` the lines
    /// people read (the `diff` column).
    fn deployments(&self) -> Vec<Value> {
        let mut rows = sql_rows(
            &self.s.db(),
            "SELECT *, plan_hash AS spec_hash, summary AS diff_summary FROM deployments WHERE backend = 'nomad' ORDER BY id",
        );
        for row in &mut rows {
            let detail: Value = serde_json::from_str(row["detail"].as_str().unwrap_or("{}"))
                .expect("a deployment's detail is JSON");
            if let (Some(row), Some(detail)) = (row.as_object_mut(), detail.as_object()) {
                let text = row.insert("diff".into(), detail["plan_diff"].clone());
                row.insert("diff_text".into(), text.unwrap_or_default());
                for (k, v) in detail {
                    row.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
        }
        rows
    }

    fn sql(&self, statement: &str) {
        sql_exec(&self.s.db(), statement)
    }

    fn image(&self) -> String {
        self.nomad.job("web").expect("live job")["TaskGroups"][0]["Tasks"][0]["Config"]["image"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }
}

fn registers(j: &[Value]) -> Vec<&Value> {
    j.iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/v1/jobs")
        .collect()
}

/// Plan before every write, CAS on every register: in `j` (one tick's
/// requests), every register is preceded by a plan of exactly the job it
/// registers, and carries EnforceIndex with the index that plan (or a
/// fresh one) answered. Returns the number of registers.
fn assert_plan_then_cas(j: &[Value], nomad: &NomadStandin) -> usize {
    let mut n = 0;
    for (i, r) in j.iter().enumerate() {
        if !(r["method"] == "POST" && r["path"] == "/v1/jobs") {
            continue;
        }
        n += 1;
        let job = &r["body"]["Job"];
        let plan = j[..i]
            .iter()
            .rev()
            .find(|p| {
                p["method"] == "POST"
                    && p["path"] == format!("/v1/job/{}/plan", job["ID"].as_str().unwrap_or(""))
            })
            .unwrap_or_else(|| panic!("register without a plan in the same tick: {r}"));
        assert_eq!(
            &plan["body"]["Job"], job,
            "registered a spec that was not planned"
        );
        assert_eq!(plan["body"]["Diff"], true);
        assert_eq!(r["body"]["EnforceIndex"], true, "register without CAS: {r}");
        // The index the plan was made against is the journal's `index` then.
        assert_eq!(
            r["body"]["JobModifyIndex"],
            nomad_index_at_plan(plan),
            "CAS index is not the one read at the plan"
        );
    }
    for r in j {
        assert_eq!(
            r["token"],
            nomad.token.as_str(),
            "request without the ACL token"
        );
        assert_ne!(r["method"], "DELETE", "driftless asked Nomad to stop a job");
    }
    n
}

/// The live JobModifyIndex when the plan was answered: the stand-in answers
/// a plan with the live job's index (0 for a new job); the journal keeps the
/// job body, so look it up from the plan's answer recorded by the stand-in.
fn nomad_index_at_plan(plan: &Value) -> Value {
    plan["live_job_modify_index"].clone()
}

#[test]
fn plan_before_every_write_and_cas_on_every_register() {
    let f = fixture("");
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(assert_plan_then_cas(&j, &f.nomad), 1, "{j:#?}");
    assert_eq!(f.s.target_status("cluster")["last_result"], "changed");
    let d = f.deployments();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0]["state"], "applying");
    assert_eq!(d[0]["job_modify_index"], 0);
    // Parse first, by Nomad, with Canonicalize.
    assert_eq!(j[0]["path"], "/v1/jobs/parse");
    assert_eq!(j[0]["body"]["Canonicalize"], true);

    // Nomad's deployment is running: the next tick plans (no diff),
    // registers nothing and keeps following it.
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(assert_plan_then_cas(&j, &f.nomad), 0);
    assert!(f.message().contains("running"), "{}", f.message());
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.deployments()[0]["state"], "applied");
    let (_, _, j) = f.tick();
    assert_eq!(
        assert_plan_then_cas(&j, &f.nomad),
        0,
        "a register without a diff"
    );
    assert_eq!(f.s.target_status("cluster")["last_result"], "no_change");

    // A new commit: one plan, one register at the live index.
    let live_index = f.nomad.job("web").expect("job")["JobModifyIndex"].clone();
    let sha = f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.27", AUTO))],
        "bump",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(assert_plan_then_cas(&j, &f.nomad), 1);
    assert_eq!(registers(&j)[0]["body"]["JobModifyIndex"], live_index);
    assert_eq!(f.image(), "nginx:1.27");
    let d = f.deployments();
    assert_eq!(d.len(), 2);
    assert_eq!(d[1]["commit_sha"], sha);

    // driftless never writes to git and never writes meta into the job.
    assert_eq!(git(&f.remote.bare, &["rev-parse", "main"]), sha);
    let live = f.nomad.job("web").expect("job");
    assert_eq!(live["Meta"], json!({ "driftless_policy": "auto" }));
    assert_eq!(live["TaskGroups"][0]["Meta"], Value::Null);
}

#[test]
fn a_job_changed_between_plan_and_register_is_not_overwritten() {
    let f = fixture("");
    assert_eq!(f.tick().0, Some(0));
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0));
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.27", AUTO))],
        "bump",
    );
    // Someone edits the live job right after driftless's plan.
    f.nomad.control(
        "after_plan",
        json!({ "Action": "edit", "ID": "web",
                "Path": ["TaskGroups", 0, "Tasks", 0, "Config", "image"], "Value": "nginx:hotfix" }),
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        f.message().contains("job modified outside driftless"),
        "{}",
        f.message()
    );
    assert_eq!(
        f.image(),
        "nginx:hotfix",
        "the manual change was overwritten"
    );
    // Exactly one register was tried, and refused by CAS; the fresh plan
    // showed a different diff, so no second try.
    assert_eq!(registers(&j).len(), 1, "{j:#?}");
    assert_eq!(f.deployments().last().expect("row")["state"], "failed");
}

#[test]
fn a_failed_spec_is_not_retried_at_the_same_index_but_a_new_commit_is() {
    let f = fixture("");
    f.nomad.control(
        "fail",
        json!({ "Path": "/v1/jobs", "Method": "POST", "Status": 500,
                "Body": "rpc error: 1 error occurred: task group web: invalid count", "Times": 1 }),
    );
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(1));
    assert_eq!(registers(&j).len(), 1);
    assert!(f.message().contains("invalid count"), "{}", f.message());
    // No apply loop.
    for _ in 0..3 {
        let (code, _, j) = f.tick();
        assert_eq!(code, Some(1));
        assert!(registers(&j).is_empty(), "re-applied a failed spec: {j:#?}");
        assert!(f.message().contains("not retried"), "{}", f.message());
        assert!(
            f.message().contains("`driftless retry cluster`"),
            "{}",
            f.message()
        );
    }
    // A person asks for one more try: registered again, at the same index.
    let before = f.nomad.journal().len();
    let out = f.s.run(&["retry", "cluster"]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("cluster: changed"), "{said}");
    assert_eq!(registers(&f.nomad.journal()[before..]).len(), 1);
    assert_eq!(f.s.history("cluster")[0]["trigger"], "retry");
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0));
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.26", AUTO))],
        "fix",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(registers(&j).len(), 1);
    assert_eq!(f.image(), "nginx:1.26");
}

#[test]
fn scaling_groups_keep_their_live_count() {
    let f = fixture("");
    assert_eq!(f.tick().0, Some(0));
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0));
    // The autoscaler scales the web group: not drift.
    f.nomad
        .control("scale", json!({ "ID": "web", "Group": "web", "Count": 6 }));
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(0));
    assert!(registers(&j).is_empty(), "undid the autoscaler: {j:#?}");
    // A hand-scaled group without scaling is drift, and git wins.
    f.nomad.control(
        "scale",
        json!({ "ID": "web", "Group": "worker", "Count": 3 }),
    );
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(0));
    assert_eq!(assert_plan_then_cas(&j, &f.nomad), 1);
    let live = f.nomad.job("web").expect("job");
    assert_eq!(live["TaskGroups"][0]["Count"], 6);
    assert_eq!(live["TaskGroups"][1]["Count"], 1);
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0));

    // The autoscaler acts between plan and register: the CAS fails, a
    // fresh plan shows the same diff, and the register goes through at the
    // new index with the autoscaler's count.
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.27", AUTO))],
        "bump",
    );
    f.nomad.control(
        "after_plan",
        json!({ "Action": "scale", "ID": "web", "Group": "web", "Count": 8 }),
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(registers(&j).len(), 2, "{j:#?}");
    assert_eq!(assert_plan_then_cas(&j, &f.nomad), 2);
    let live = f.nomad.job("web").expect("job");
    assert_eq!(live["TaskGroups"][0]["Count"], 8);
    assert_eq!(f.image(), "nginx:1.27");
}

#[test]
fn invalid_meta_means_policy_none_and_an_error() {
    for meta in [
        "    driftless_policy = \"yolo\"",
        "    driftless_policy = \"auto\"\n    driftless_polcy = \"auto\"",
    ] {
        let f = fixture("");
        f.remote.commit(
            &[("jobs/web.nomad.hcl", &web_job("nginx:1.25", meta))],
            "bad meta",
        );
        let (code, out, j) = f.tick();
        assert_eq!(code, Some(0), "{out}");
        assert!(registers(&j).is_empty(), "registered under invalid meta");
        assert!(
            out.contains("ERROR") && out.contains("web.nomad.hcl") && out.contains("driftless_pol"),
            "{out}"
        );
        assert!(f.message().contains("policy none"), "{}", f.message());
        assert!(f.nomad.job("web").is_none());
    }
}

#[test]
fn approval_policy_never_registers_by_itself() {
    let f = fixture("default_policy = \"approval\"");
    f.remote.commit(
        &[(
            "jobs/web.nomad.hcl",
            &web_job("nginx:1.25", "    team = \"web\""),
        )],
        "no policy in meta",
    );
    for _ in 0..5 {
        let (code, out, j) = f.tick();
        assert_eq!(code, Some(0), "{out}");
        assert!(registers(&j).is_empty());
    }
    let d = f.deployments();
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!(d[0]["state"], "pending_approval");
    assert!(
        f.message().contains("waiting for approval"),
        "{}",
        f.message()
    );
    // A newer commit supersedes the pending one.
    f.remote.commit(
        &[(
            "jobs/web.nomad.hcl",
            &web_job("nginx:1.26", "    team = \"web\""),
        )],
        "newer",
    );
    assert_eq!(f.tick().0, Some(0));
    let d = f.deployments();
    assert_eq!(d.len(), 2);
    assert_eq!(d[0]["state"], "superseded");
    assert_eq!(d[1]["state"], "pending_approval");
}

#[test]
fn one_active_deployment_per_job_under_two_concurrent_ticks() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.25", AUTO))],
        "web",
    );
    let nomad = NomadStandin::start(root.path());
    let token = root.path().join("nomad-token");
    std::fs::write(&token, &nomad.token).expect("write");
    // Two targets that (wrongly) manage the same job, ticking at once; the
    // register is slowed so the second tick plans and tries to record its
    // deployment while the first one's is active.
    let s = Setup::new(&format!(
        "{}{}",
        target("one", &remote, &nomad, &token, ""),
        target("two", &remote, &nomad, &token, "")
    ));
    nomad.control(
        "delay",
        json!({ "Path": "/v1/jobs", "Method": "POST", "Seconds": 2 }),
    );
    let spawn = |name: &str| {
        output_within(
            std::process::Command::new(bin()).args([
                "--config",
                s.config.to_str().expect("utf8"),
                "tick",
                name,
            ]),
            std::time::Duration::from_secs(300),
        )
    };
    let (a, b) = std::thread::scope(|sc| {
        let a = sc.spawn(|| spawn("one"));
        let b = sc.spawn(|| spawn("two"));
        (a.join().expect("one"), b.join().expect("two"))
    });
    let regs = registers(&nomad.journal()).len();
    assert_eq!(regs, 1, "both ticks registered");
    let codes = [a.status.code(), b.status.code()];
    assert!(
        codes.contains(&Some(0)) && codes.contains(&Some(1)),
        "{codes:?}"
    );
    let loser = if a.status.code() == Some(1) {
        "one"
    } else {
        "two"
    };
    let msg = s.target_status(loser)["last_message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    // Refused by the unique index, or seen at the start of the tick.
    assert!(
        msg.contains("already has an active deployment")
            || msg.contains("has an active deployment (1, "),
        "{msg}\none: {}\ntwo: {}",
        text(&a.stderr),
        text(&b.stderr)
    );
}

#[test]
fn state_is_persisted_before_acting() {
    // The deployment row cannot be written: nothing reaches Nomad.
    let f = fixture("");
    assert!(f.s.run(&["status"]).status.success()); // creates the database
    f.sql(
        "CREATE TRIGGER no_deployments BEFORE INSERT ON deployments
         BEGIN SELECT RAISE(ABORT, 'injected: disk says no'); END;",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        registers(&j).is_empty(),
        "registered without a record: {j:#?}"
    );
    assert!(
        f.message().contains("cannot record its deployment") && f.message().contains("injected"),
        "{}",
        f.message()
    );
    // The move to `applying` cannot be written: still nothing registered.
    f.sql(
        "DROP TRIGGER no_deployments;
         CREATE TRIGGER no_applying BEFORE UPDATE ON deployments WHEN NEW.state = 'applying'
         BEGIN SELECT RAISE(ABORT, 'injected: no applying'); END;",
    );
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(1));
    assert!(
        registers(&j).is_empty(),
        "registered before `applying` was on disk"
    );
    assert!(f.nomad.job("web").is_none());
    f.sql("DROP TRIGGER no_applying;");
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(registers(&j).len(), 1);
}

#[test]
fn the_targets_namespace_is_for_jobs_that_name_none() {
    let f = fixture("namespace = \"prod\"");
    let named = |id: &str, ns: &str| {
        web_job("nginx:1.25", AUTO).replace(
            "job \"web\" {\n",
            &format!("job \"{id}\" {{\n  namespace = \"{ns}\"\n"),
        )
    };
    f.remote.commit(
        &[
            ("jobs/api.nomad.hcl", &named("api", "default")),
            ("jobs/batch.nomad.hcl", &named("batch", "team")),
        ],
        "api in default, batch in team",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let mut placed: Vec<(String, String)> = registers(&j)
        .iter()
        .map(|r| {
            (
                r["body"]["Job"]["ID"].as_str().unwrap_or("").to_string(),
                r["body"]["Job"]["Namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect();
    placed.sort();
    assert_eq!(
        placed,
        [
            ("api".to_string(), "default".to_string()),
            ("batch".into(), "team".into()),
            ("web".into(), "prod".into()),
        ],
        "{j:#?}"
    );
    // And that is where Nomad has them.
    let live = |id: &str, ns: &str| {
        http(
            f.nomad.port,
            "GET",
            &format!("/v1/job/{id}?namespace={ns}"),
            &[("X-Nomad-Token", &f.nomad.token)],
            b"",
        )
        .status
    };
    assert_eq!(live("web", "prod"), 200);
    assert_eq!(live("web", "default"), 404);
    assert_eq!(live("api", "default"), 200);
    assert_eq!(live("api", "prod"), 404);
    assert_eq!(live("batch", "team"), 200);
    // A second tick sees no change anywhere.
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(registers(&j).is_empty(), "{j:#?}");
}

#[test]
fn killed_mid_register_resumes_without_a_second_register() {
    let f = fixture("");
    // The register is slow; the tick is killed while it is in flight (Nomad
    // still performs it).
    f.nomad.control(
        "delay",
        json!({ "Path": "/v1/jobs", "Method": "POST", "Seconds": 2 }),
    );
    let mut child = spawn_tick(&f);
    wait_for(
        Duration::from_secs(20),
        "the register to be in flight",
        || {
            let r = http(f.nomad.port, "GET", "/_standin/arrived", &[], b"");
            r.json().as_array().is_some_and(|a| {
                a.iter()
                    .any(|q| q["method"] == "POST" && q["path"] == "/v1/jobs")
            })
        },
    );
    assert!(
        f.deployments()
            .first()
            .is_some_and(|d| d["state"] == "applying"),
        "the register was sent before `applying` was recorded"
    );
    let _ = child.kill();
    let _ = child.wait();
    wait_for(
        Duration::from_secs(10),
        "Nomad to finish the register",
        || f.nomad.job("web").is_some(),
    );
    let d = f.deployments();
    assert_eq!(d[0]["registered_index"], Value::Null, "{d:#?}");
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(registers(&j).is_empty(), "registered twice: {j:#?}");
    let d = f.deployments();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0]["state"], "applying");
    assert!(d[0]["registered_index"].as_i64().is_some(), "{d:#?}");
    assert!(f.message().contains("confirmed"), "{}", f.message());
}

#[test]
fn no_job_is_ever_stopped() {
    let f = fixture("");
    assert_eq!(f.tick().0, Some(0));
    f.remote.delete("jobs/web.nomad.hcl", "remove web");
    f.remote.commit(
        &[(
            "jobs/other.nomad.hcl",
            &web_job("nginx:1.25", AUTO).replace("job \"web\"", "job \"other\""),
        )],
        "other",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(j.iter().all(|r| r["method"] != "DELETE"));
    assert!(
        f.message().contains("orphaned") && f.message().contains("default/web"),
        "{}",
        f.message()
    );
    let live = f.nomad.job("web").expect("web still registered");
    assert_eq!(live["Stop"], false);
    let out = f.s.run(&["outputs", "cluster", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let o: Value = serde_json::from_slice(&out.stdout).expect("outputs JSON");
    assert_eq!(o["orphans"], json!(["default/web"]), "{o:#}");

    // destroy is refused unless allowed.
    let before = f.nomad.journal().len();
    let out = f.s.run(&["destroy", "cluster", "--yes"]);
    assert!(!out.status.success());
    let all = text(&out.stdout) + &text(&out.stderr) + &f.message();
    assert!(all.contains("never stops Nomad jobs"), "{all}");
    assert!(
        f.nomad.journal()[before..]
            .iter()
            .all(|r| r["method"] != "DELETE")
    );
}

#[test]
fn destroy_with_allow_destroy_deregisters_without_purge() {
    let f = fixture("allow_destroy = true");
    assert_eq!(f.tick().0, Some(0));
    let out = f.s.run(&["destroy", "cluster", "--yes"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let deletes: Vec<Value> = f
        .nomad
        .journal()
        .into_iter()
        .filter(|r| r["method"] == "DELETE")
        .collect();
    assert_eq!(deletes.len(), 1);
    assert!(
        deletes[0]["query"]
            .as_str()
            .unwrap_or("")
            .contains("purge=false")
    );
    assert_eq!(f.nomad.job("web").expect("not purged")["Stop"], true);

    // The stopped job registered again is an edit of it (Stop true ->
    // false), as Nomad's plan diffs it, not a new job.
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.26", AUTO))],
        "back",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(registers(&j).len(), 1, "{j:#?}");
    let msg = f.message();
    assert!(
        msg.contains("Stop edited") && !msg.contains("new job"),
        "{msg}"
    );
    assert_eq!(f.nomad.job("web").expect("web")["Stop"], false);
}

#[test]
fn a_failed_nomad_deployment_fails_the_run_and_notifies() {
    let root = tempfile::tempdir().expect("tempdir");
    let sink = Service::http_sink(root.path(), 0);
    let f = fixture("");
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    std::fs::write(
        &f.s.config,
        format!(
            "{cfg}\n[defaults]\nnotify = [\"hook\"]\n\n[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n",
            sink.port
        ),
    )
    .expect("config");
    assert_eq!(f.tick().0, Some(0));
    f.nomad.control(
        "deployment",
        json!({ "ID": "web", "Status": "failed", "Description": "Failed due to progress deadline" }),
    );
    let (code, _, _) = f.tick();
    assert_eq!(code, Some(1));
    assert!(f.message().contains("progress deadline"), "{}", f.message());
    assert_eq!(f.deployments()[0]["state"], "failed");
    let sent: Vec<Value> = sink.requests();
    assert!(
        sent.iter().any(|r| r["body"]
            .as_str()
            .unwrap_or("")
            .contains("progress deadline")),
        "{sent:#?}"
    );
    let bodies: String = sent
        .iter()
        .map(|r| r["body"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(!bodies.contains(CANARY), "a job secret in a notification");
    assert!(
        !bodies.contains(&f.nomad.token),
        "the Nomad token in a notification"
    );
}

#[test]
fn a_parse_error_names_the_file_and_nomads_message() {
    let f = fixture("");
    f.remote.commit(
        &[("jobs/broken.nomad.hcl", "job \"broken\" {\n  group {\n")],
        "broken",
    );
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(1));
    let msg = f.message();
    assert!(
        msg.contains("broken.nomad.hcl") && msg.contains("Nomad could not parse it"),
        "{msg}"
    );
    // The other job was still reconciled.
    assert_eq!(registers(&j).len(), 1);
}

#[test]
fn secrets_never_leave_the_diff_unredacted() {
    let f = fixture("");
    let out = output_within(
        std::process::Command::new(bin())
            .args([
                "--config",
                f.s.config.to_str().expect("utf8"),
                "tick",
                "cluster",
            ])
            .env("RUST_LOG", "debug"),
        std::time::Duration::from_secs(300),
    );
    assert!(out.status.success());
    f.remote.commit(
        &[(
            "jobs/web.nomad.hcl",
            &web_job("nginx:1.25", AUTO).replace(CANARY, &format!("{CANARY}-2")),
        )],
        "rotate",
    );
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0));
    f.remote.commit(
        &[(
            "jobs/web.nomad.hcl",
            &web_job("nginx:1.25", "    driftless_policy = \"none\"")
                .replace(CANARY, &format!("{CANARY}-3")),
        )],
        "drift",
    );
    let log2 = f.s.run(&["tick", "cluster"]);
    let mut seen = text(&out.stdout) + &text(&out.stderr);
    seen += &text(&log2.stdout);
    seen += &text(&log2.stderr);
    for args in [
        &["status", "--json"][..],
        &["history", "cluster", "--json"],
        &["outputs", "cluster"],
    ] {
        let o = f.s.run(args);
        seen += &text(&o.stdout);
        seen += &text(&o.stderr);
    }
    let rows = serde_json::to_string(&f.deployments()).expect("json");
    seen += &rows;
    seen += &String::from_utf8_lossy(&std::fs::read(f.s.db()).unwrap_or_default());
    assert!(rows.contains("[REDACTED]"), "{rows}");
    assert!(!seen.contains(CANARY), "a job secret escaped: {seen}");
    assert!(!seen.contains(&f.nomad.token), "the Nomad token escaped");
    // What Nomad itself was sent is the real thing.
    assert!(
        f.nomad
            .job("web")
            .expect("job")
            .to_string()
            .contains(CANARY)
    );
}

#[test]
fn tls_with_a_private_ca_and_a_client_certificate() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.25", AUTO))],
        "web",
    );
    let (nomad, ca, cert, key) = NomadStandin::start_mtls(root.path());
    let token = root.path().join("nomad-token");
    std::fs::write(&token, &nomad.token).expect("write");
    let file = |p: &std::path::Path| toml_str(&p.display().to_string());
    let s = Setup::new(&format!(
        "{}{}{}",
        target(
            "good",
            &remote,
            &nomad,
            &token,
            &format!(
                "ca_file = {}\nclient_cert_file = {}\nclient_key_file = {}",
                file(&ca),
                file(&cert),
                file(&key)
            )
        ),
        target(
            "nocert",
            &remote,
            &nomad,
            &token,
            &format!("ca_file = {}", file(&ca))
        ),
        target(
            "noca",
            &remote,
            &nomad,
            &token,
            &format!(
                "client_cert_file = {}\nclient_key_file = {}",
                file(&cert),
                file(&key)
            )
        ),
    ));
    let out = s.run(&["tick", "good"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(s.target_status("good")["last_result"], "changed");
    let out = s.run(&["outputs", "good", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let o: Value = serde_json::from_slice(&out.stdout).expect("outputs JSON");
    assert_eq!(o["jobs"]["web"]["live_version"], 0, "{o:#}");

    for (name, want) in [
        ("nocert", "cannot reach Nomad at https://"),
        ("noca", "certificate"),
    ] {
        let out = s.run(&["tick", name]);
        assert_eq!(out.status.code(), Some(1));
        let msg = s.target_status(name)["last_message"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(msg.contains(want), "{name}: {msg}");
        assert!(!msg.contains(&nomad.token));
    }
}

// ------------------------------------------------ approvals and pauses

const APPROVER: &str = "approver-token-6c1d";
const READER: &str = "reader-token-0b9e";

/// A fixture with policy approval and two API tokens: one that may approve
/// (and pause) the target, one that may only read and reconcile it; the
/// HTTP API served in-process (no workers: ticks are driven by the test).
fn approval_fixture(policy: &str) -> (Fixture, Intake) {
    let f = fixture(&format!("default_policy = \"{policy}\""));
    f.remote.commit(
        &[(
            "jobs/web.nomad.hcl",
            &web_job("nginx:1.25", "    team = \"web\""),
        )],
        "no policy in meta",
    );
    let mut cfg = std::fs::read_to_string(&f.s.config).expect("config");
    cfg.push_str(&token_table(
        "ops",
        APPROVER,
        &["approve:clus*", "pause:cluster", "read"],
    ));
    cfg.push_str(&token_table(
        "viewer",
        READER,
        &["reconcile:cluster", "read"],
    ));
    std::fs::write(&f.s.config, cfg).expect("config");
    let intake = Intake::start_at_listen(&f.s);
    (f, intake)
}

fn api(intake: &Intake, method: &str, path: &str, token: &str, body: Value) -> HttpResponse {
    api_call(intake.port, method, path, token, &body)
}

fn pending(intake: &Intake) -> Vec<Value> {
    let r = api(
        intake,
        "GET",
        "/api/v1/deployments?state=pending_approval",
        READER,
        Value::Null,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    match r.json() {
        Value::Array(a) => a,
        other => panic!("{other}"),
    }
}

#[test]
fn approval_with_the_right_scope_registers_exactly_the_approved_spec() {
    let (f, intake) = approval_fixture("approval");
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(0));
    assert!(registers(&j).is_empty());
    let p = pending(&intake);
    assert_eq!(p.len(), 1, "{p:#?}");
    let id = p[0]["id"].as_i64().expect("id");
    let hash = p[0]["spec_hash"].as_str().expect("hash").to_string();
    // The fields every backend's deployments have.
    assert_eq!(
        (&p[0]["backend"], &p[0]["plan_hash"], &p[0]["destructive"]),
        (&"nomad".into(), &hash.clone().into(), &false.into()),
        "{p:#?}"
    );
    assert!(
        p[0]["created_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{p:#?}"
    );
    // The diff is there for a person, redacted.
    let shown = api(
        &intake,
        "GET",
        &format!("/api/v1/deployments/{id}"),
        READER,
        Value::Null,
    );
    assert_eq!(shown.status, 200);
    assert!(
        shown.body.contains("[REDACTED]") && !shown.body.contains(CANARY),
        "{}",
        shown.body
    );

    let before = f.nomad.journal().len();
    let approve = |token: &str, hash: &str| {
        api(
            &intake,
            "POST",
            &format!("/api/v1/deployments/{id}/approve"),
            token,
            json!({ "spec_hash": hash }),
        )
    };
    assert_eq!(approve("no-such-token", &hash).status, 401);
    assert_eq!(
        approve(READER, &hash).status,
        403,
        "reconcile+read may not approve"
    );
    let stale = approve(APPROVER, "0000");
    assert_eq!(stale.status, 409, "{}", stale.body);
    assert!(stale.body.contains("stale"), "{}", stale.body);
    assert!(
        registers(&f.nomad.journal()[before..]).is_empty(),
        "the API registered"
    );

    let ok = approve(APPROVER, &hash);
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.json()["state"], "applying");
    // Approving twice: no longer pending.
    assert_eq!(approve(APPROVER, &hash).status, 409);
    // Nothing reaches Nomad from the API itself; the next tick registers.
    assert!(registers(&f.nomad.journal()[before..]).is_empty());
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(assert_plan_then_cas(&j, &f.nomad), 1);
    assert_eq!(f.image(), "nginx:1.25");
    let d = f.deployments();
    assert_eq!(d.len(), 1);
    assert!(d[0]["registered_index"].as_i64().is_some());

    // Every state change is an event: who, what, from which state.
    let out = f.s.run(&["events", "cluster", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ev: Value = serde_json::from_slice(&out.stdout).expect("events");
    let steps: Vec<(String, String, String)> = ev
        .as_array()
        .expect("list")
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap_or("").to_string(),
                e["from"].as_str().unwrap_or("-").to_string(),
                e["to"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        steps[0],
        ("driftless".into(), "-".into(), "pending_approval".into())
    );
    assert_eq!(
        steps[1],
        (
            "token:ops".into(),
            "pending_approval".into(),
            "applying".into()
        )
    );
    assert_eq!(
        steps[2],
        ("driftless".into(), "applying".into(), "applying".into())
    );
    // Events are append-only, enforced by the database.
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\ntry:\n    c.execute('DELETE FROM deployment_events')\n    c.commit()\n    print('deleted')\nexcept sqlite3.DatabaseError as e:\n    print(e)")
        .arg(f.s.db())
        .output()
        .expect("python3");
    assert!(
        text(&out.stdout).contains("append-only"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn an_approved_spec_that_git_or_the_live_job_moved_away_from_is_not_registered() {
    let (f, intake) = approval_fixture("approval");
    assert_eq!(f.tick().0, Some(0));
    let p = pending(&intake);
    let (id, hash) = (p[0]["id"].as_i64().expect("id"), p[0]["spec_hash"].clone());
    // A newer commit lands between the approval and the tick.
    f.remote.commit(
        &[(
            "jobs/web.nomad.hcl",
            &web_job("nginx:1.26", "    team = \"web\""),
        )],
        "newer",
    );
    let r = api(
        &intake,
        "POST",
        &format!("/api/v1/deployments/{id}/approve"),
        APPROVER,
        json!({ "spec_hash": hash }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // The approval was for the older spec: that deployment is superseded,
    // nothing is registered, and the newer commit gets its own pending
    // deployment in the same tick.
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        registers(&j).is_empty(),
        "registered a spec nobody approved"
    );
    assert!(
        f.message()
            .contains(&format!("deployment {id} superseded by commit")),
        "{}",
        f.message()
    );
    let p = pending(&intake);
    assert_eq!(p.len(), 1);
    assert_ne!(p[0]["id"], id);
    let d = f.deployments();
    assert_eq!(
        d.iter().find(|r| r["id"] == id).expect("the approved one")["state"],
        "superseded"
    );

    // Once the job is live: approved, then someone changes the live job
    // before the tick -- the CAS rule holds after an approval too.
    let id2 = p[0]["id"].as_i64().expect("id");
    let r = api(
        &intake,
        "POST",
        &format!("/api/v1/deployments/{id2}/approve"),
        APPROVER,
        json!({ "spec_hash": p[0]["spec_hash"] }),
    );
    assert_eq!(r.status, 200);
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(0));
    assert_eq!(registers(&j).len(), 1);
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0));
    f.remote.commit(
        &[(
            "jobs/web.nomad.hcl",
            &web_job("nginx:1.27", "    team = \"web\""),
        )],
        "1.27",
    );
    assert_eq!(f.tick().0, Some(0));
    let p = pending(&intake);
    let id3 = p[0]["id"].as_i64().expect("id");
    let r = api(
        &intake,
        "POST",
        &format!("/api/v1/deployments/{id3}/approve"),
        APPROVER,
        json!({ "spec_hash": p[0]["spec_hash"] }),
    );
    assert_eq!(r.status, 200);
    f.nomad.control(
        "edit",
        json!({ "ID": "web", "Path": ["TaskGroups", 0, "Tasks", 0, "Config", "image"], "Value": "nginx:hotfix" }),
    );
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(1));
    assert!(registers(&j).is_empty());
    assert!(
        f.message().contains("job modified outside driftless"),
        "{}",
        f.message()
    );
    assert_eq!(f.image(), "nginx:hotfix");
}

#[test]
fn a_paused_job_is_planned_but_never_registered_or_approved() {
    let (f, intake) = approval_fixture("auto");
    let pause = |path: &str| api(&intake, "POST", path, APPROVER, Value::Null);
    assert_eq!(
        api(
            &intake,
            "POST",
            "/api/v1/targets/cluster/jobs/web/pause",
            READER,
            Value::Null
        )
        .status,
        403
    );
    assert_eq!(pause("/api/v1/targets/cluster/jobs/web/pause").status, 200);
    for _ in 0..3 {
        let (code, _, j) = f.tick();
        assert_eq!(code, Some(0));
        assert!(registers(&j).is_empty(), "registered a paused job");
        assert!(
            j.iter().any(|r| r["path"] == "/v1/job/web/plan"),
            "not planned"
        );
        assert!(
            f.message().contains("paused by a person"),
            "{}",
            f.message()
        );
    }
    assert_eq!(pause("/api/v1/targets/cluster/jobs/web/resume").status, 200);
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(0));
    assert_eq!(registers(&j).len(), 1);

    // Under approval: a paused job's deployment cannot be approved.
    f.remote.commit(
        &[(
            "jobs/web.nomad.hcl",
            &web_job("nginx:1.26", "    driftless_policy = \"approval\""),
        )],
        "approval now",
    );
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0));
    assert_eq!(f.tick().0, Some(0));
    let p = pending(&intake);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!(pause("/api/v1/targets/cluster/jobs/web/pause").status, 200);
    let r = api(
        &intake,
        "POST",
        &format!("/api/v1/deployments/{}/approve", p[0]["id"]),
        APPROVER,
        json!({ "spec_hash": p[0]["spec_hash"] }),
    );
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("paused"), "{}", r.body);
    // Reject ends it.
    let r = api(
        &intake,
        "POST",
        &format!("/api/v1/deployments/{}/reject", p[0]["id"]),
        APPROVER,
        Value::Null,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["state"], "rejected");
    assert!(pending(&intake).is_empty());
}

#[test]
fn the_cli_approves_through_the_api() {
    let (f, intake) = approval_fixture("approval");
    assert_eq!(f.tick().0, Some(0));
    let id = pending(&intake)[0]["id"].as_i64().expect("id");
    let cli = |args: &[&str], token: &str| {
        output_within(
            std::process::Command::new(bin())
                .args(["--config", f.s.config.to_str().expect("utf8")])
                .args(args)
                .env("DRIFTLESS_TOKEN", token),
            std::time::Duration::from_secs(300),
        )
    };
    let out = cli(&["deployments", "--pending"], READER);
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("pending_approval"),
        "{}",
        text(&out.stdout)
    );
    let out = cli(&["approve", &id.to_string()], READER);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("403"), "{}", text(&out.stdout));
    let out = cli(&["approve", &id.to_string()], APPROVER);
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("approved: now applying"),
        "{}",
        text(&out.stdout)
    );
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(0));
    assert_eq!(registers(&j).len(), 1);
    drop(intake);
}

#[test]
fn owners_are_told_once_that_a_deployment_waits_for_approval() {
    let root = tempfile::tempdir().expect("tempdir");
    let sink = Service::http_sink(root.path(), 0);
    let f = fixture("default_policy = \"approval\"");
    f.remote.commit(
        &[(
            "jobs/web.nomad.hcl",
            &web_job("nginx:1.25", "    team = \"web\""),
        )],
        "no policy in meta",
    );
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    std::fs::write(
        &f.s.config,
        format!(
            "{cfg}\n[defaults]\nnotify = [\"hook\"]\n\n[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n",
            sink.port
        ),
    )
    .expect("config");
    let told = || -> Vec<Value> {
        sink.requests()
            .into_iter()
            .map(|r| {
                serde_json::from_str(r["body"].as_str().unwrap_or("null")).unwrap_or(Value::Null)
            })
            .filter(|d| d["event"] == "pending_approval")
            .collect()
    };
    // Told by the tick that made the deployment (the target's first), not
    // by a later one.
    assert_eq!(f.tick().0, Some(0));
    wait_for(
        Duration::from_secs(10),
        "the first tick's pending_approval",
        || !told().is_empty(),
    );
    for _ in 0..2 {
        assert_eq!(f.tick().0, Some(0));
    }
    let sent = told();
    assert_eq!(sent.len(), 1, "{sent:#?}");
    let d = &f.deployments()[0];
    let msg = sent[0]["message"].as_str().unwrap_or("");
    let id = d["id"].as_i64().expect("id");
    for want in [
        format!("driftless approve {id}"),
        d["spec_hash"].as_str().expect("hash").to_string(),
        "default/web".to_string(),
        "new job".to_string(),
    ] {
        assert!(msg.contains(&want), "{want:?} missing: {msg}");
    }
    assert!(!sent[0].to_string().contains(CANARY));
}

// ------------------------------------------------------------------ hooks

const HOOKS: &str = "    driftless_policy    = \"auto\"\n    driftless_pre_hook  = \"db-migrate\"\n    driftless_post_hook = \"smoke-test\"\n    driftless_hook_timeout = \"20s\"";

fn hook_job(name: &str) -> String {
    format!(
        r#"job "{name}" {{
  type = "batch"
  parameterized {{
    meta_required = ["driftless_deployment"]
    meta_optional = ["driftless_job", "driftless_commit", "driftless_phase"]
  }}
  group "run" {{
    task "run" {{
      driver = "exec"
      config {{
        command = "/bin/{name}"
      }}
    }}
  }}
}}
"#
    )
}

fn hooks_fixture(web_meta: &str) -> Fixture {
    let f = fixture("");
    f.remote.commit(
        &[
            ("jobs/web.nomad.hcl", &web_job("nginx:1.25", web_meta)),
            ("jobs/db-migrate.nomad.hcl", &hook_job("db-migrate")),
            ("jobs/smoke-test.nomad.hcl", &hook_job("smoke-test")),
        ],
        "hooks",
    );
    f
}

fn dispatches<'a>(j: &'a [Value], hook: &str) -> Vec<&'a Value> {
    j.iter()
        .filter(|r| r["path"] == format!("/v1/job/{hook}/dispatch"))
        .collect()
}

/// Start a tick and kill it as soon as it has dispatched `hook`.
/// Kill a tick while `hook` runs (web's deployment must be in `state`),
/// let the hook finish on its own, tick again: that tick succeeds and the
/// hook has exactly one instance. Returns the second tick's journal.
fn kill_during_hook_then_tick(f: &Fixture, hook: &str, state: &str) -> Vec<Value> {
    f.nomad
        .control("hook_outcome", json!({ "ID": hook, "Status": "running" }));
    kill_tick_once_dispatched(f, hook);
    let d = f.deployments();
    let web = d.iter().find(|r| r["job"] == "web").expect("web");
    assert_eq!(web["state"], state, "{d:#?}");
    f.nomad
        .control("hook_outcome", json!({ "ID": hook, "Status": "complete" }));
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(instances(f, hook), 1, "the hook {hook} ran twice");
    j
}

/// `driftless tick cluster` in the background, its output discarded.
fn spawn_tick(f: &Fixture) -> std::process::Child {
    std::process::Command::new(bin())
        .args([
            "--config",
            f.s.config.to_str().expect("utf8"),
            "tick",
            "cluster",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tick")
}

fn kill_tick_once_dispatched(f: &Fixture, hook: &str) {
    let mut child = spawn_tick(f);
    wait_for(Duration::from_secs(20), "the hook dispatched", || {
        !dispatches(&f.nomad.journal(), hook).is_empty()
    });
    let _ = child.kill();
    let _ = child.wait();
}

/// How many instances of the parameterized job `hook` Nomad has.
fn instances(f: &Fixture, hook: &str) -> usize {
    http(f.nomad.port, "GET", "/_standin/jobs", &[], b"")
        .json()
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|j| j["ParentID"] == hook)
        .count()
}

fn position(j: &[Value], f: impl Fn(&Value) -> bool) -> usize {
    j.iter().position(f).unwrap_or(usize::MAX)
}

#[test]
fn hooks_are_dispatched_once_around_the_register_with_their_meta() {
    let f = hooks_fixture(HOOKS);
    let sha = git(&f.remote.bare, &["rev-parse", "main"]);
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    // The hook jobs are registered (plan + CAS) before the pre hook is
    // dispatched, and the pre hook before the job.
    assert_eq!(assert_plan_then_cas(&j, &f.nomad), 3);
    let reg_of = |id: &str| {
        position(&j, |r| {
            r["path"] == "/v1/jobs" && r["body"]["Job"]["ID"] == id
        })
    };
    let pre = dispatches(&j, "db-migrate");
    assert_eq!(pre.len(), 1, "{j:#?}");
    let pre_at = position(&j, |r| r["path"] == "/v1/job/db-migrate/dispatch");
    assert!(
        reg_of("db-migrate") < pre_at && pre_at < reg_of("web"),
        "{j:#?}"
    );
    assert!(
        dispatches(&j, "smoke-test").is_empty(),
        "post hook before the deployment"
    );
    let d = f.deployments();
    let web = d
        .iter()
        .find(|r| r["job"] == "web")
        .expect("web deployment");
    let meta = &pre[0]["body"]["Meta"];
    assert_eq!(meta["driftless_deployment"], web["id"].to_string());
    assert_eq!(meta["driftless_job"], "web");
    assert_eq!(meta["driftless_commit"], sha.as_str());
    assert_eq!(meta["driftless_phase"], "pre");
    // The token is unique to this deployment of this installation: a
    // random nonce, then the id and the phase.
    let nonce = web["hook_nonce"].as_str().expect("a nonce");
    assert_eq!(nonce.len(), 16, "{nonce}");
    assert_eq!(
        pre[0]["body"]["IdempotencyToken"],
        format!("driftless-{nonce}-{}-pre", web["id"])
    );

    // Nomad's deployment succeeds: the post hook runs, once.
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let post = dispatches(&j, "smoke-test");
    assert_eq!(post.len(), 1);
    assert_eq!(post[0]["body"]["Meta"]["driftless_phase"], "post");
    let d = f.deployments();
    let web = d
        .iter()
        .find(|r| r["job"] == "web")
        .expect("web deployment");
    assert_eq!(web["state"], "applied", "{d:#?}");
    let (_, _, j) = f.tick();
    assert!(dispatches(&j, "db-migrate").is_empty() && dispatches(&j, "smoke-test").is_empty());
}

#[test]
fn a_failed_pre_hook_blocks_the_register() {
    let f = hooks_fixture(HOOKS);
    f.nomad.control(
        "hook_outcome",
        json!({ "ID": "db-migrate", "Status": "failed" }),
    );
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(1));
    assert!(
        !j.iter()
            .any(|r| r["path"] == "/v1/jobs" && r["body"]["Job"]["ID"] == "web"),
        "registered after a failed pre hook"
    );
    assert!(
        f.message().contains("pre hook failed; nothing registered"),
        "{}",
        f.message()
    );
    assert!(f.nomad.job("web").is_none());
}

#[test]
fn a_hook_missing_from_git_fails_the_deployment() {
    let f = hooks_fixture(&HOOKS.replace("db-migrate", "no-such-hook"));
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(1));
    assert!(
        !j.iter()
            .any(|r| r["path"] == "/v1/jobs" && r["body"]["Job"]["ID"] == "web")
    );
    assert!(
        f.message()
            .contains("`no-such-hook` is not a parameterized job in this target's path"),
        "{}",
        f.message()
    );
}

#[test]
fn a_failed_post_hook_fails_the_deployment_after_the_register() {
    let f = hooks_fixture(HOOKS);
    f.nomad.control(
        "hook_outcome",
        json!({ "ID": "smoke-test", "Status": "failed" }),
    );
    assert_eq!(f.tick().0, Some(0));
    assert!(f.nomad.job("web").is_some());
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    let (code, _, _) = f.tick();
    assert_eq!(code, Some(1));
    assert!(
        f.message().contains("post hook failed after the register"),
        "{}",
        f.message()
    );
}

#[test]
fn a_tick_killed_during_the_pre_hook_resumes_without_a_second_instance() {
    let f = hooks_fixture(HOOKS);
    // The next tick finds the same instance (same idempotency token) and
    // registers.
    let j = kill_during_hook_then_tick(&f, "db-migrate", "pre_hook");
    // The killed tick may have recorded the child it dispatched (then the
    // next one follows it) or not (then it dispatches again with the same
    // token and Nomad hands back the same child): either way one instance,
    // which `kill_during_hook_then_tick` asserts.
    let all = f.nomad.journal();
    let n = dispatches(&all, "db-migrate").len();
    assert!((1..=2).contains(&n), "{n} dispatches of the pre hook");
    assert_eq!(
        j.iter()
            .filter(|r| r["path"] == "/v1/jobs" && r["body"]["Job"]["ID"] == "web")
            .count(),
        1
    );
    assert!(f.nomad.job("web").is_some());
}

#[test]
fn a_tick_killed_during_the_post_hook_resumes_without_a_second_instance() {
    let f = hooks_fixture(HOOKS);
    assert_eq!(f.tick().0, Some(0));
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    let j = kill_during_hook_then_tick(&f, "smoke-test", "post_hook");
    assert!(registers(&j).is_empty(), "registered again: {j:#?}");
    let d = f.deployments();
    let web = d.iter().find(|r| r["job"] == "web").expect("web");
    assert_eq!(web["state"], "applied", "{d:#?}");
}

// ------------------------------------------------ as Nomad really behaves

/// A hook job whose `parameterized` block is `param`.
fn hook_job_with(name: &str, param: &str) -> String {
    hook_job(name).replace(
        "  parameterized {\n    meta_required = [\"driftless_deployment\"]\n    meta_optional = [\"driftless_job\", \"driftless_commit\", \"driftless_phase\"]\n  }",
        &format!("  parameterized {{\n{param}\n  }}"),
    )
}

#[test]
fn a_hook_gets_only_the_meta_its_job_declares_and_one_needing_more_fails_before_any_register() {
    // Nomad refuses a dispatch carrying a key the parameterized job does
    // not declare (validateDispatchRequest): this hook declares one.
    let f = hooks_fixture(&HOOKS.replace("    driftless_post_hook = \"smoke-test\"\n", ""));
    f.remote.commit(
        &[(
            "jobs/db-migrate.nomad.hcl",
            &hook_job_with(
                "db-migrate",
                "    meta_required = [\"driftless_deployment\"]",
            ),
        )],
        "a hook that takes one key",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let pre = dispatches(&j, "db-migrate");
    assert_eq!(pre.len(), 1, "{j:#?}");
    let keys: Vec<&String> = pre[0]["body"]["Meta"]
        .as_object()
        .expect("meta")
        .keys()
        .collect();
    assert_eq!(keys, ["driftless_deployment"]);
    assert!(f.nomad.job("web").is_some(), "not registered: {out}");

    // A hook that requires a key driftless cannot fill: the deployment
    // fails before any register or dispatch, naming the key.
    f.remote.commit(
        &[
            (
                "jobs/db-migrate.nomad.hcl",
                &hook_job_with(
                    "db-migrate",
                    "    meta_required = [\"driftless_deployment\", \"ticket\"]",
                ),
            ),
            (
                "jobs/web.nomad.hcl",
                &web_job(
                    "nginx:1.26",
                    &HOOKS.replace("    driftless_post_hook = \"smoke-test\"\n", ""),
                ),
            ),
        ],
        "a hook that needs a ticket",
    );
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(1));
    assert!(dispatches(&j, "db-migrate").is_empty(), "{j:#?}");
    assert!(
        !j.iter()
            .any(|r| r["path"] == "/v1/jobs" && r["body"]["Job"]["ID"] == "web"),
        "registered web: {j:#?}"
    );
    let msg = f.message();
    assert!(
        msg.contains("requires the dispatch meta key `ticket`")
            && msg.contains("nothing registered"),
        "{msg}"
    );
    assert_eq!(f.image(), "nginx:1.25");

    // A hook whose dispatch needs a payload (Nomad refuses one without it
    // at dispatch, after the main job would have been registered): the
    // same, before any register.
    f.remote.commit(
        &[
            (
                "jobs/db-migrate.nomad.hcl",
                &hook_job_with(
                    "db-migrate",
                    "    payload = \"required\"\n    meta_required = [\"driftless_deployment\"]",
                ),
            ),
            (
                "jobs/web.nomad.hcl",
                &web_job(
                    "nginx:1.27",
                    &HOOKS.replace("    driftless_post_hook = \"smoke-test\"\n", ""),
                ),
            ),
        ],
        "a hook that needs a payload",
    );
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(1));
    assert!(dispatches(&j, "db-migrate").is_empty(), "{j:#?}");
    assert!(
        !j.iter()
            .any(|r| r["path"] == "/v1/jobs" && r["body"]["Job"]["ID"] == "web"),
        "registered web: {j:#?}"
    );
    let msg = f.message();
    assert!(
        msg.contains("requires a dispatch payload") && msg.contains("nothing registered"),
        "{msg}"
    );
    assert_eq!(f.image(), "nginx:1.25");
}

#[test]
fn a_token_limited_to_the_targets_namespace_is_enough() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("jobs/web.nomad.hcl", &web_job("nginx:1.25", HOOKS)),
            ("jobs/db-migrate.nomad.hcl", &hook_job("db-migrate")),
            ("jobs/smoke-test.nomad.hcl", &hook_job("smoke-test")),
        ],
        "web with hooks",
    );
    let nomad = NomadStandin::start(root.path());
    // The policy the README gives for `auto` with hooks, in `prod` only
    // (acl/policy.go names the capabilities).
    let limited = "prod-only-token-77f2";
    nomad.control(
        "acl_token",
        json!({ "SecretID": limited, "Namespaces": {
            "prod": ["parse-job", "read-job", "submit-job", "dispatch-job"] } }),
    );
    let token = root.path().join("nomad-token");
    std::fs::write(&token, limited).expect("write");
    let s = Setup::new(&target(
        "cluster",
        &remote,
        &nomad,
        &token,
        "namespace = \"prod\"",
    ));
    let out = s.run(&["tick", "cluster"]);
    let log = text(&out.stdout) + &text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{log}");
    let j = nomad.journal();
    // (404 is a job not registered yet.)
    let refused: Vec<&Value> = j
        .iter()
        .filter(|r| r["status"] != 200 && r["status"] != 404)
        .collect();
    assert!(refused.is_empty(), "{refused:#?}");
    for r in &j {
        assert!(
            r["query"].as_str().unwrap_or("").contains("namespace=prod"),
            "a call outside the token's namespace: {r}"
        );
    }
    assert!(j.iter().any(|r| r["path"] == "/v1/jobs/parse"), "{j:#?}");
    // Nomad enforces it: the same token in `default` is refused.
    let r = http(
        nomad.port,
        "POST",
        "/v1/jobs/parse",
        &[("X-Nomad-Token", limited)],
        json!({ "JobHCL": web_job("nginx:1", AUTO) })
            .to_string()
            .as_bytes(),
    );
    assert_eq!((r.status, r.body.trim()), (403, "Permission denied"));
}

fn reverting_job(image: &str) -> String {
    web_job(image, HOOKS).replace(
        "  group \"web\" {\n    count = 2\n",
        "  group \"web\" {\n    count = 2\n    update {\n      auto_revert = true\n    }\n",
    )
}

#[test]
fn an_auto_reverted_deployment_fails_runs_no_post_hook_and_is_not_registered_again() {
    let f = hooks_fixture(HOOKS);
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &reverting_job("nginx:1.25"))],
        "auto revert",
    );
    assert_eq!(f.tick().0, Some(0));
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0), "version 0 deployed and stable");
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &reverting_job("nginx:1.26"))],
        "1.26",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(registers(&j).len(), 1);
    // Version 1 fails; Nomad rolls back to version 0 (a new version, 2) and
    // its deployment succeeds: the latest deployment is the revert's.
    f.nomad.control(
        "deployment",
        json!({ "ID": "web", "Status": "failed", "Description": "Failed due to unhealthy allocations" }),
    );
    assert_eq!(f.image(), "nginx:1.25", "the stand-in rolled back");
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(1));
    let msg = f.message();
    assert!(
        msg.contains("rolling back to job version 0") && msg.contains("failed"),
        "{msg}"
    );
    assert!(
        dispatches(&j, "smoke-test").is_empty(),
        "post hook ran: {j:#?}"
    );
    assert!(registers(&j).is_empty(), "{j:#?}");
    let d = f.deployments();
    let web = d.iter().rev().find(|r| r["job"] == "web").expect("web");
    assert_eq!(web["state"], "failed", "{d:#?}");
    // No loop: the same spec is not registered again at the revert's index.
    for _ in 0..2 {
        let (code, _, j) = f.tick();
        assert_eq!(code, Some(1));
        assert!(registers(&j).is_empty(), "registered again: {j:#?}");
        assert!(f.message().contains("not retried"), "{}", f.message());
    }
    assert_eq!(f.image(), "nginx:1.25");
}

#[test]
fn registers_nomad_starts_no_deployment_for_settle_and_waiting_for_one_is_bounded() {
    let f = fixture("");
    assert_eq!(f.tick().0, Some(0));
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0));
    // max_parallel = 0: Nomad starts no deployment for the new version (the
    // latest deployment stays the old one's).
    let no_update = |image: &str| {
        web_job(image, AUTO).replace(
            "  group \"web\" {\n",
            "  update {\n    max_parallel = 0\n  }\n  group \"web\" {\n",
        )
    };
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &no_update("nginx:1.26"))],
        "no update strategy",
    );
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let d = f.deployments();
    let web = d.iter().rev().find(|r| r["job"] == "web").expect("web");
    assert_eq!(web["state"], "applied", "{d:#?}");
    assert!(
        f.message().contains("no group has an update strategy"),
        "{}",
        f.message()
    );
    // The next push is applied: nothing is stuck in `applying`.
    f.remote
        .commit(&[("jobs/web.nomad.hcl", &no_update("nginx:1.27"))], "1.27");
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(0));
    assert_eq!(registers(&j).len(), 1);
    assert_eq!(f.image(), "nginx:1.27");

    // A batch job: no deployment, completed at once.
    f.remote.commit(
        &[("jobs/nightly.nomad.hcl", &hook_job("nightly").replace(
            "  parameterized {\n    meta_required = [\"driftless_deployment\"]\n    meta_optional = [\"driftless_job\", \"driftless_commit\", \"driftless_phase\"]\n  }\n",
            "",
        ))],
        "a batch job",
    );
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let d = f.deployments();
    let nightly = d
        .iter()
        .rev()
        .find(|r| r["job"] == "nightly")
        .expect("nightly");
    assert_eq!(nightly["state"], "applied", "{d:#?}");
    assert!(
        nightly["message"]
            .as_str()
            .unwrap_or("")
            .contains("no deployments for batch jobs"),
        "{nightly}"
    );
}

#[test]
fn a_deployment_nomad_has_not_started_yet_is_waited_for_within_the_timeout() {
    let f = fixture("");
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    // 8 s, not less: every request to Nomad is bounded by the timeout too,
    // and the stand-in's first parse (python-hcl2 building its grammar)
    // took over 4 s on a loaded machine (CI failed so once).
    std::fs::write(
        &f.s.config,
        cfg.replace("interval = \"1h\"", "interval = \"1h\"\ntimeout = \"8s\""),
    )
    .expect("config");
    // The scheduler has not processed the register's evaluation yet: no
    // deployment exists, but Nomad will start one.
    f.nomad.control("eval_delay", json!({ "Seconds": 2 }));
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let d = f.deployments();
    assert_eq!(
        d[0]["state"], "applying",
        "completed before Nomad deployed it: {d:#?}"
    );
    assert!(f.message().contains("evaluation"), "{}", f.message());
    std::thread::sleep(Duration::from_millis(2200));
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(f.message().contains("running"), "{}", f.message());
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0));
    assert_eq!(f.deployments()[0]["state"], "applied");

    // An evaluation that never gets processed: bounded by the timeout.
    f.nomad.control("eval_delay", json!({ "Seconds": 3600 }));
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.26", AUTO))],
        "1.26",
    );
    assert_eq!(f.tick().0, Some(0));
    std::thread::sleep(Duration::from_millis(8500));
    let (code, _, _) = f.tick();
    assert_eq!(code, Some(1));
    assert!(
        f.message()
            .contains("Nomad started no deployment within 8s"),
        "{}",
        f.message()
    );
}

#[test]
fn a_push_after_a_deployment_is_applied_by_that_pushs_tick() {
    let f = fixture("");
    assert_eq!(f.tick().0, Some(0));
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    // The tick that settles the deployment also applies the new commit.
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.26", AUTO))],
        "1.26",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(registers(&j).len(), 1, "{j:#?}");
    assert_eq!(f.image(), "nginx:1.26");
    let d = f.deployments();
    assert_eq!(
        d.iter()
            .map(|r| r["state"].as_str().unwrap_or(""))
            .collect::<Vec<_>>(),
        ["applied", "applying"]
    );
    // A newer commit while Nomad still runs the deployment supersedes it.
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.27", AUTO))],
        "1.27",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(registers(&j).len(), 1, "{j:#?}");
    assert_eq!(f.image(), "nginx:1.27");
    let d = f.deployments();
    assert_eq!(d[1]["state"], "superseded", "{d:#?}");
    assert!(
        d[1]["message"]
            .as_str()
            .unwrap_or("")
            .contains("while Nomad deployment"),
        "{d:#?}"
    );
}

#[test]
fn a_newer_commit_supersedes_a_deployment_waiting_on_its_pre_hook() {
    let f = hooks_fixture(HOOKS);
    f.nomad.control(
        "hook_outcome",
        json!({ "ID": "db-migrate", "Status": "running" }),
    );
    kill_tick_once_dispatched(&f, "db-migrate");
    assert_eq!(
        f.deployments()
            .iter()
            .find(|r| r["job"] == "web")
            .expect("web")["state"],
        "pre_hook"
    );
    f.nomad.control(
        "hook_outcome",
        json!({ "ID": "db-migrate", "Status": "complete" }),
    );
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.26", HOOKS))],
        "1.26",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let d = f.deployments();
    let webs: Vec<&Value> = d.iter().filter(|r| r["job"] == "web").collect();
    assert_eq!(webs.len(), 2, "{d:#?}");
    assert_eq!(webs[0]["state"], "superseded");
    assert_eq!(webs[1]["state"], "applying");
    // The newer deployment ran its own pre hook (another token), then
    // registered the newer spec.
    let pre = dispatches(&j, "db-migrate");
    assert_eq!(pre.len(), 1);
    assert!(
        pre[0]["body"]["IdempotencyToken"]
            .as_str()
            .unwrap_or("")
            .ends_with(&format!("-{}-pre", webs[1]["id"]))
    );
    assert_eq!(f.image(), "nginx:1.26");
}

#[test]
fn a_hook_is_judged_by_its_final_allocations() {
    let f = hooks_fixture(HOOKS);
    // Nomad reschedules the failed allocation; the second one completes.
    f.nomad.control(
        "hook_outcome",
        json!({ "ID": "smoke-test", "Status": "failed_then_complete" }),
    );
    f.nomad.control(
        "hook_outcome",
        json!({ "ID": "db-migrate", "Status": "failed_then_complete" }),
    );
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        f.nomad.job("web").is_some(),
        "the pre hook succeeded in the end"
    );
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        f.message().contains(
            "post hook `smoke-test` succeeded after 1 failed allocation Nomad rescheduled"
        ),
        "{}",
        f.message()
    );
    // Failed again after the reschedule: a failure.
    f.nomad.control(
        "hook_outcome",
        json!({ "ID": "db-migrate", "Status": "failed" }),
    );
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.26", HOOKS))],
        "1.26",
    );
    let (code, _, _) = f.tick();
    assert_eq!(code, Some(1));
    assert!(
        f.message()
            .contains("1 of its 1 final allocations failed after 1 failed allocation"),
        "{}",
        f.message()
    );
    assert_eq!(f.image(), "nginx:1.25");
}

#[test]
fn hook_tokens_never_match_a_child_of_another_state_database() {
    let f = hooks_fixture(HOOKS);
    assert_eq!(f.tick().0, Some(0));
    let fresh_state_then_push = |image: &str| {
        std::fs::remove_dir_all(&f.s.state).expect("rm state");
        f.remote
            .commit(&[("jobs/web.nomad.hcl", &web_job(image, HOOKS))], image);
    };
    // Two fresh databases in a row each give web's deployment id 1.
    fresh_state_then_push("nginx:1.26");
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.deployments()[0]["id"], 1);
    assert_eq!(f.image(), "nginx:1.26");
    fresh_state_then_push("nginx:1.27");
    f.nomad.control(
        "hook_outcome",
        json!({ "ID": "db-migrate", "Status": "failed" }),
    );
    let (code, _, _) = f.tick();
    assert_eq!(f.deployments()[0]["id"], 1);
    // The pre hook really ran (and failed): it did not find the previous
    // database's instance of deployment 1 and take it as done.
    assert_eq!(code, Some(1));
    assert!(f.message().contains("pre hook failed"), "{}", f.message());
    assert_eq!(f.image(), "nginx:1.26");
    assert_eq!(instances(&f, "db-migrate"), 3);
}

#[test]
fn a_resumed_hook_whose_instance_nomad_collected_fails_saying_so() {
    let f = hooks_fixture(HOOKS);
    f.nomad.control(
        "hook_outcome",
        json!({ "ID": "db-migrate", "Status": "running" }),
    );
    // Kill the tick once it has recorded the instance it dispatched.
    let mut child = spawn_tick(&f);
    wait_for(Duration::from_secs(20), "the child recorded", || {
        f.deployments()
            .iter()
            .any(|r| r["job"] == "web" && !r["pre_hook_child"].is_null())
    });
    let _ = child.kill();
    let _ = child.wait();
    f.nomad.control(
        "hook_outcome",
        json!({ "ID": "db-migrate", "Status": "complete" }),
    );
    let gc = f.nomad.control("gc", json!({}));
    assert_eq!(gc["collected"].as_array().map(Vec::len), Some(1), "{gc}");
    let out = f.s.run(&["tick", "cluster"]);
    let log = text(&out.stdout) + &text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{log}");
    let msg = f.message();
    assert!(
        msg.contains("is gone (Nomad garbage-collected it)") && msg.contains("unknown"),
        "{msg}"
    );
    assert!(log.contains("WARN"), "{log}");
    // Not dispatched again, not registered.
    assert_eq!(instances(&f, "db-migrate"), 0);
    assert!(f.nomad.job("web").is_none());
}

#[test]
fn unchanged_fields_and_url_credentials_never_leave_a_contextual_diff() {
    let url_token = "ghp-canary-url-token-5a1b";
    let arg_secret = "canary-arg-secret-9e2d";
    let job = |image: &str, path: &str| {
        web_job(image, AUTO).replace(
            "        image = \"",
            &format!("        args  = [\"--api-key-file\", \"{arg_secret}\"]\n        image = \""),
        ).replace(
            "      template {",
            &format!("      artifact {{\n        source = \"https://{url_token}@git.example.net/{path}\"\n      }}\n      template {{"),
        )
    };
    let f = fixture("");
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &job("nginx:1.25", "a.tgz"))],
        "args",
    );
    assert_eq!(f.tick().0, Some(0));
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    // Only the image and the artifact change: the Config object lists the
    // unchanged `args[1]` too (Type None), and the artifact's GetterSource
    // carries the token in both Old and New.
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &job("nginx:1.26", "b.tgz"))],
        "1.26",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(registers(&j).len(), 1);
    // The second deployment's diff, as stored and as `outputs` shows it.
    // (The first one, a new job, lists every value as Added: a person
    // approving a new job sees what it runs.)
    let d = f.deployments();
    let rows = d[1]["diff"].as_str().expect("diff").to_string();
    let mut seen = rows.clone();
    seen += d[1]["diff_text"].as_str().expect("the lines people read");
    let o = f.s.run(&["outputs", "cluster", "--json"]);
    seen += &text(&o.stdout);
    seen += &text(&o.stderr);
    assert!(rows.contains("args[1]"), "the diff lost the field: {rows}");
    assert!(
        rows.contains("nginx:1.26"),
        "a changed image is shown: {rows}"
    );
    assert!(
        !seen.contains(arg_secret),
        "an unchanged config value escaped: {rows}"
    );
    assert!(!seen.contains(url_token), "a URL token escaped: {rows}");
}

#[test]
fn a_job_file_or_its_variables_linked_out_of_the_checkout_are_refused() {
    let f = fixture("");
    let controller = f._root.path().join("controller.hcl");
    std::fs::write(&controller, web_job("controller-secret-image-8e1f", AUTO)).expect("write");
    let to = controller.to_str().expect("utf8");
    f.remote
        .symlink("jobs/evil.nomad.hcl", to, "a job that is a link");
    f.remote
        .symlink("jobs/web.vars.hcl", to, "variables that are a link");
    let (code, _, j) = f.tick();
    assert_eq!(code, Some(1));
    let msg = f.message();
    assert!(
        msg.contains(&format!(
            "`jobs` `evil.nomad.hcl` resolves to {to}, outside the target's checkout"
        )),
        "{msg}"
    );
    assert!(
        msg.contains(&format!(
            "`(its variables file)` `web.vars.hcl` resolves to {to}"
        )),
        "{msg}"
    );
    let sent = serde_json::to_string(&j).expect("json");
    assert!(
        !sent.contains("controller-secret-image-8e1f"),
        "the controller's file went to Nomad"
    );
}

/// `driftless plan` on a Nomad target: Nomad's own parse and plan dry-run
/// per job, one line per job that would change, and nothing registered or
/// recorded (no deployment row, no register in the journal).
#[test]
fn plan_shows_the_jobs_that_would_change_and_registers_nothing() {
    let f = fixture("");
    assert_eq!(f.tick().0, Some(0));
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0));
    let out = f.s.run(&["plan", "cluster"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("no changes"),
        "{}",
        text(&out.stdout)
    );

    f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.27", AUTO))],
        "1.27",
    );
    let rows = || {
        sql_rows(
            &f.s.db(),
            "SELECT COUNT(*) AS n FROM deployments WHERE backend = 'nomad'",
        )
    };
    let (before_rows, before) = (rows(), f.nomad.journal().len());
    let out = f.s.run(&["plan", "cluster"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{said}{}", text(&out.stderr));
    assert!(
        said.lines()
            .any(|l| l.starts_with("~ job default/web (web.nomad.hcl, policy auto): ")),
        "{said}"
    );
    let j = f.nomad.journal();
    assert!(registers(&j[before..]).is_empty(), "a plan registered");
    assert!(
        j[before..].iter().any(|r| r["path"] == "/v1/job/web/plan"),
        "no Nomad plan call: {:?}",
        &j[before..]
    );
    assert_eq!(rows(), before_rows, "a plan recorded a deployment");
    assert!(!said.contains(CANARY), "{said}");
}

/// A Nomad target's `policy` is its jobs' default: under `policy =
/// "approval"` a job that names no policy waits for approval, and a job
/// whose meta says `auto` is still registered at once.
#[test]
fn a_targets_policy_is_its_jobs_default_and_a_jobs_meta_still_overrides_it() {
    let f = fixture("");
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    let cfg = cfg.replacen(
        "[targets.backend]",
        "policy = \"approval\"\n[targets.backend]",
        1,
    );
    std::fs::write(&f.s.config, cfg).expect("config");
    f.remote.commit(
        &[
            (
                "jobs/web.nomad.hcl",
                &web_job("nginx:1.25", "    team = \"web\""),
            ),
            (
                "jobs/api.nomad.hcl",
                &web_job("nginx:1.25", AUTO).replacen("job \"web\"", "job \"api\"", 1),
            ),
        ],
        "two jobs",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let registered: Vec<String> = registers(&j)
        .iter()
        .map(|r| r["body"]["Job"]["ID"].as_str().unwrap_or("?").to_string())
        .collect();
    assert_eq!(registered, ["api"], "{out}");
    let waiting = sql_rows(
        &f.s.db(),
        "SELECT unit AS job FROM deployments WHERE state = 'pending_approval'",
    );
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(waiting[0]["job"], "web");
    assert_eq!(f.s.target_status("cluster")["policy"], "approval");
}

/// `policy = "detect"` on a Nomad target is the target's, as on every
/// backend: every tick runs Nomad's plan dry-run for each job, records what
/// registering would change as the target's drift, and registers nothing,
/// not even a job whose meta says `auto`; no deployment is recorded.
#[test]
fn a_nomad_detect_target_plans_every_job_and_registers_none() {
    let f = fixture("");
    f.s.target_keys("policy = \"detect\"");
    for _ in 0..2 {
        let (code, out, j) = f.tick();
        assert_eq!(code, Some(0), "{out}");
        assert!(registers(&j).is_empty(), "detect registered: {out}");
        assert!(
            j.iter().any(|r| r["path"] == "/v1/job/web/plan"),
            "no Nomad plan call: {j:?}"
        );
    }
    assert_detected(&f.s, "cluster", "+ job default/web (");
    assert!(f.deployments().is_empty(), "{:?}", f.deployments());
    assert!(f.nomad.job("web").is_none(), "the job is live");
}

/// A job declaring `image` and `motd` takes them from another target's
/// outputs (`inputs`): Nomad's parse gets them as `Variables`, after the
/// job's own `.vars.hcl`, quoted so that quotes, backslashes, newlines and
/// `${` arrive exactly; a changed output registers the job again; an input
/// the `.vars.hcl` sets as well fails the job naming the variable.
#[test]
fn inputs_reach_a_job_as_hcl_variables() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let job = r#"variable "image" {}
variable "motd" {}
variable "region" {
  default = "nowhere"
}
job "web" {
  datacenters = ["dc1"]
  meta {
    driftless_policy = "auto"
  }
  group "web" {
    task "server" {
      driver = "docker"
      config {
        image = "${var.image}"
      }
      env {
        MOTD   = "${var.motd}"
        REGION = "${var.region}"
      }
    }
  }
}
"#;
    let motd = "say \"hi\" \\ then\na ${literal} and %{that}";
    let outputs = |image: &str| {
        serde_json::to_string(&json!({ "image": image, "motd": motd })).expect("json")
    };
    remote.commit(
        &[
            ("jobs/web.nomad.hcl", job),
            ("jobs/web.vars.hcl", "region = \"eu\"\n"),
            ("images/out.json", &outputs("nginx:1.27")),
        ],
        "web",
    );
    let nomad = NomadStandin::start(root.path());
    let token = root.path().join("nomad-token");
    std::fs::write(&token, format!("{}\n", nomad.token)).expect("write");
    let producer = exec_target(
        "images",
        &remote.url(),
        "path = \"images\"\ninterval = \"1h\"",
        "apply = [\"true\"]\noutputs = [\"cat\", \"out.json\"]",
    );
    let consumer = target(
        "cluster",
        &remote,
        &nomad,
        &token,
        "",
    )
    .replace(
        "[targets.backend]",
        "inputs = { image = \"images.outputs.image\", motd = \"images.outputs.motd\" }\n[targets.backend]",
    );
    let s = Setup::new(&(producer + &consumer));
    let task = || {
        let job = nomad.job("web").expect("web registered");
        job["TaskGroups"][0]["Tasks"][0].clone()
    };

    succeeded(&s.run(&["tick", "--all"]), "tick --all");
    // The job the producer's new outputs queued for the cluster is the one
    // `tick --all` ran next: none is left waiting for a daemon.
    assert_eq!(s.target_status("cluster")["queued"], false);
    let t = task();
    assert_eq!(t["Config"]["image"], "nginx:1.27", "{t}");
    assert_eq!(t["Env"]["MOTD"], motd, "{t}");
    assert_eq!(
        t["Env"]["REGION"], "eu",
        "the job's own .vars.hcl still counts: {t}"
    );

    // The producer's output changes, nothing of the job's: registered again.
    remote.commit(&[("images/out.json", &outputs("nginx:1.28"))], "1.28");
    succeeded(&s.run(&["tick", "--all"]), "tick --all");
    assert_eq!(s.target_status("cluster")["queued"], false);
    assert_eq!(task()["Config"]["image"], "nginx:1.28");
    assert_eq!(s.history("cluster")[0]["result"], "changed");

    // The job's .vars.hcl sets an input's variable too: Nomad's error.
    remote.commit(
        &[(
            "jobs/web.vars.hcl",
            "region = \"eu\"\nimage = \"nginx:0\"\n",
        )],
        "clash",
    );
    let out = s.run(&["tick", "cluster"]);
    assert!(!out.status.success());
    let said = s.target_status("cluster")["last_message"].to_string();
    assert!(said.contains("\\\"image\\\" was already set"), "{said}");
    assert_eq!(
        task()["Config"]["image"],
        "nginx:1.28",
        "nothing registered"
    );
}

/// The scheduler makes the deployment, then marks the evaluation complete:
/// when it does so between driftless's read of the deployments and its
/// read of the evaluation, the deployment is not missed — driftless does
/// not record "completed without a deployment", follows the deployment,
/// and sees its auto-revert.
#[test]
fn an_evaluation_completed_between_two_reads_does_not_hide_its_deployment() {
    let f = fixture("");
    f.nomad.control("eval_on_read", json!({ "On": true }));
    // The register; then the tick that follows it reads the deployments
    // (none yet), then the evaluation (complete, its deployment made).
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let paths: Vec<&str> = j.iter().filter_map(|r| r["path"].as_str()).collect();
    let eval_read = paths.iter().position(|p| p.starts_with("/v1/evaluation/"));
    let deps_read = paths.iter().position(|p| p.ends_with("/deployments"));
    assert!(
        matches!((deps_read, eval_read), (Some(a), Some(b)) if a < b),
        "the race was not set up: {paths:?} {}",
        f.message()
    );
    let d = f.deployments();
    assert_eq!(
        d[0]["state"],
        "applying",
        "settled before following Nomad's deployment: {d:#?}\n{}",
        f.message()
    );
    assert!(
        !f.message().contains("without a deployment"),
        "{}",
        f.message()
    );
    f.nomad.control("eval_on_read", json!({ "On": false }));
    // The deployment fails and Nomad reverts the job: driftless says so.
    f.nomad.control(
        "deployment",
        json!({ "ID": "web", "Status": "failed", "Description": "Failed due to progress deadline" }),
    );
    let (code, _, _) = f.tick();
    assert_eq!(code, Some(1), "{}", f.message());
    assert!(
        f.message().contains("failed") && f.message().contains("progress deadline"),
        "{}",
        f.message()
    );
    assert_eq!(f.deployments()[0]["state"], "failed");
}

// ------------------------------------------------------------------ canaries

/// The web group with an `update` block placing `canary` canaries.
fn canary_job(image: &str, update: &str) -> String {
    web_job(image, AUTO).replace(
        "  group \"web\" {\n    count = 2\n",
        &format!("  group \"web\" {{\n    count = 2\n    update {{\n{update}\n    }}\n"),
    )
}

/// A fixture whose web job is deployed and stable with canaries set up
/// (a first version gets none: nothing runs yet to be replaced), then a
/// new image pushed: its deployment places canaries.
fn canary_fixture(update: &str, extra: &str) -> (Fixture, Intake, Service) {
    let f = fixture(extra);
    let sink = Service::http_sink(f._root.path(), 0);
    let mut cfg = std::fs::read_to_string(&f.s.config).expect("config");
    cfg.push_str(&token_table(
        "ops",
        APPROVER,
        &["approve:cluster", "pause:cluster", "read"],
    ));
    cfg.push_str(&format!(
        "\n[defaults]\nnotify = [\"hook\"]\n\n[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n",
        sink.port
    ));
    std::fs::write(&f.s.config, cfg).expect("config");
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &canary_job("nginx:1.25", update))],
        "canaries",
    );
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.deployments().last().expect("one")["state"], "applied");
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &canary_job("nginx:1.26", update))],
        "1.26",
    );
    let intake = Intake::start_at_listen(&f.s);
    (f, intake, sink)
}

/// The events the sink received, by kind, with their messages.
fn told(sink: &Service, event: &str) -> Vec<String> {
    sink.requests()
        .into_iter()
        .map(|r| serde_json::from_str(r["body"].as_str().unwrap_or("null")).unwrap_or(Value::Null))
        .filter(|d: &Value| d["event"] == event)
        .map(|d| d["message"].as_str().unwrap_or("").to_string())
        .collect()
}

fn promotes(j: &[Value]) -> Vec<&Value> {
    j.iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/v1/deployment/promote/"))
        })
        .collect()
}

#[test]
fn canaries_wait_for_a_person_to_promote_them_through_the_approve_call() {
    let (f, intake, sink) = canary_fixture("      canary = 1", "promotion_wait = \"2s\"");
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(registers(&j).len(), 1);
    // The next tick follows Nomad's deployment.
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let d = f.deployments().last().cloned().expect("deployment");
    let id = d["id"].as_i64().expect("id");
    assert_eq!(d["state"], "pending_promotion", "{d:#?}");
    assert!(
        f.message().contains("requires promotion") && f.message().contains("0 of 1"),
        "{}",
        f.message()
    );
    // Listed where every waiting deployment is, and told to the owners.
    let listed = api(
        &intake,
        "GET",
        "/api/v1/deployments?state=pending_promotion",
        APPROVER,
        Value::Null,
    );
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(listed.json()[0]["id"], id, "{}", listed.body);
    let waiting = told(&sink, "pending_approval");
    assert_eq!(waiting.len(), 1, "{waiting:#?}");
    assert!(
        waiting[0].contains("waits for promotion")
            && waiting[0].contains(&format!("driftless approve {id}")),
        "{}",
        waiting[0]
    );
    // The page shows it with a Promote button for who may approve.
    let page = {
        use base64::Engine as _;
        let creds = base64::engine::general_purpose::STANDARD.encode(format!("ops:{APPROVER}"));
        http(
            intake.port,
            "GET",
            "/",
            &[("Authorization", &format!("Basic {creds}"))],
            b"",
        )
    };
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("Waiting for promotion")
            && page.body.contains("Promote its canaries")
            && page.body.contains(&format!("/deployments/{id}/approve")),
        "{}",
        page.body
    );
    // Rejecting canaries is not something driftless can do: it says what is.
    let hash = d["plan_hash"].as_str().expect("hash").to_string();
    let rejected = api(
        &intake,
        "POST",
        &format!("/api/v1/deployments/{id}/reject"),
        APPROVER,
        Value::Null,
    );
    assert_eq!(rejected.status, 409, "{}", rejected.body);
    assert!(
        rejected.body.contains("nomad deployment fail"),
        "{}",
        rejected.body
    );

    // Promoted before the canary is healthy: Nomad refuses, the run says
    // why, the deployment waits again and the owners hear it again.
    let approve = || {
        api(
            &intake,
            "POST",
            &format!("/api/v1/deployments/{id}/approve"),
            APPROVER,
            json!({ "plan_hash": hash }),
        )
    };
    // A paused job is not promoted either.
    let pause = |verb: &str| {
        let r = api(
            &intake,
            "POST",
            &format!("/api/v1/targets/cluster/jobs/web/{verb}"),
            APPROVER,
            Value::Null,
        );
        assert_eq!(r.status, 200, "{verb}: {}", r.body);
    };
    pause("pause");
    let refused = approve();
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert!(refused.body.contains("paused"), "{}", refused.body);
    pause("resume");
    let ok = approve();
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.json()["state"], "promoting");
    assert!(promotes(&f.nomad.journal()).is_empty(), "the API promoted");
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(promotes(&j).len(), 1, "{j:#?}");
    assert!(f.message().contains("0/1 healthy"), "{}", f.message());
    assert_eq!(
        f.deployments().last().expect("d")["state"],
        "pending_promotion"
    );
    assert_eq!(told(&sink, "pending_approval").len(), 2);

    // Past promotion_wait the owners are told once that it still waits;
    // the deployment is not failed for it.
    std::thread::sleep(Duration::from_millis(2500));
    for _ in 0..2 {
        let (code, out, j) = f.tick();
        assert_eq!(code, Some(0), "{out}");
        assert!(
            promotes(&j).is_empty() && registers(&j).is_empty(),
            "{j:#?}"
        );
        assert!(
            f.message().contains("waiting for promotion"),
            "{}",
            f.message()
        );
    }
    let waiting = told(&sink, "pending_approval");
    assert_eq!(waiting.len(), 3, "{waiting:#?}");
    assert!(
        waiting[2].contains("still waiting for promotion"),
        "{}",
        waiting[2]
    );
    assert_eq!(
        f.deployments().last().expect("d")["state"],
        "pending_promotion"
    );

    // Healthy canaries, promoted again: Nomad promotes, the rest rolls out.
    f.nomad
        .control("canaries", json!({ "ID": "web", "Healthy": 1 }));
    assert_eq!(approve().status, 200);
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let p = promotes(&j);
    assert_eq!(p.len(), 1, "{j:#?}");
    assert_eq!(p[0]["body"]["All"], true);
    assert_eq!(p[0]["status"], 200);
    assert_eq!(f.deployments().last().expect("d")["state"], "applying");
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.deployments().last().expect("d")["state"], "applied");
    assert_eq!(f.image(), "nginx:1.26");
    // Who promoted it is on the record.
    let events = sql_rows(
        &f.s.db(),
        &format!(
            "SELECT actor, from_state, to_state FROM deployment_events WHERE deployment_id = {id} ORDER BY id"
        ),
    );
    assert!(
        events
            .iter()
            .any(|e| e["actor"] == "token:ops" && e["to_state"] == "promoting"),
        "{events:#?}"
    );
}

#[test]
fn a_token_that_cannot_promote_is_named_and_the_deployment_waits() {
    let (f, intake, _sink) = canary_fixture("      canary = 1", "");
    // Registers, but holds neither submit-job nor promote-deployment
    // (acl/policy.go: register-job and plan-job are capabilities of their own).
    let limited = "register-only-token-41c9";
    f.nomad.control(
        "acl_token",
        json!({ "SecretID": limited, "Namespaces": {
            "default": ["parse-job", "read-job", "plan-job", "register-job"] } }),
    );
    let token = f._root.path().join("nomad-token");
    std::fs::write(&token, limited).expect("write");
    for _ in 0..2 {
        let (code, out, _) = f.tick();
        assert_eq!(code, Some(0), "{out}");
    }
    let d = f.deployments().last().cloned().expect("d");
    assert_eq!(d["state"], "pending_promotion", "{d:#?}");
    f.nomad
        .control("canaries", json!({ "ID": "web", "Healthy": 1 }));
    let ok = api(
        &intake,
        "POST",
        &format!("/api/v1/deployments/{}/approve", d["id"]),
        APPROVER,
        json!({ "plan_hash": d["plan_hash"] }),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(promotes(&j)[0]["status"], 403);
    let msg = f.message();
    assert!(
        msg.contains("submit-job")
            && msg.contains("promote-deployment")
            && msg.contains("`default`"),
        "{msg}"
    );
    let waiting = f.deployments().last().cloned().expect("d");
    assert_eq!(waiting["state"], "pending_promotion");
    // A newer commit while it waits for promotion supersedes it (Nomad
    // cancels its deployment for the newer version) and is registered.
    f.remote.commit(
        &[(
            "jobs/web.nomad.hcl",
            &canary_job("nginx:1.27", "      canary = 1"),
        )],
        "1.27",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(registers(&j).len(), 1, "{j:#?}");
    let d = f.deployments();
    let old = d.iter().find(|r| r["id"] == waiting["id"]).expect("old");
    assert_eq!(old["state"], "superseded", "{d:#?}");
    assert!(
        old["message"]
            .as_str()
            .is_some_and(|m| m.contains("superseded by commit")),
        "{old:#?}"
    );
    assert_eq!(f.image(), "nginx:1.27");
}

#[test]
fn auto_promoted_canaries_need_nobody() {
    let (f, _intake, sink) = canary_fixture("      canary = 1\n      auto_promote = true", "");
    for _ in 0..2 {
        let (code, out, _) = f.tick();
        assert_eq!(code, Some(0), "{out}");
    }
    assert_eq!(f.deployments().last().expect("d")["state"], "applying");
    assert!(
        f.message().contains("automatic promotion"),
        "{}",
        f.message()
    );
    f.nomad
        .control("canaries", json!({ "ID": "web", "Healthy": 1 }));
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.deployments().last().expect("d")["state"], "applied");
    assert!(promotes(&f.nomad.journal()).is_empty());
    assert!(told(&sink, "pending_approval").is_empty());
}

#[test]
fn canaries_wait_and_are_promoted_on_postgresql_too() {
    let root = tempfile::tempdir().expect("tempdir");
    let url = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(driftless::store::testing::database());
    let remote = Remote::new(root.path(), "infra");
    let update = "      canary = 1";
    remote.commit(
        &[("jobs/web.nomad.hcl", &canary_job("nginx:1.25", update))],
        "web",
    );
    let nomad = NomadStandin::start(root.path());
    let token = root.path().join("nomad-token");
    std::fs::write(&token, format!("{}\n", nomad.token)).expect("write");
    let s = Setup::new(&format!(
        "[database]\nurl = {}\n\n{}{}",
        toml_str(&url),
        target(
            "cluster",
            &remote,
            &nomad,
            &token,
            "promotion_wait = \"1s\""
        ),
        token_table("ops", APPROVER, &["approve:cluster", "read"]),
    ));
    let f = Fixture {
        _root: root,
        remote,
        nomad,
        s,
    };
    assert_eq!(f.tick().0, Some(0));
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0));
    f.remote.commit(
        &[("jobs/web.nomad.hcl", &canary_job("nginx:1.26", update))],
        "1.26",
    );
    for _ in 0..2 {
        let (code, out, _) = f.tick();
        assert_eq!(code, Some(0), "{out}");
    }
    let intake = Intake::start_at_listen(&f.s);
    let get = |path: &str| {
        let r = api(&intake, "GET", path, APPROVER, Value::Null);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let waiting = get("/api/v1/deployments?state=pending_promotion");
    let id = waiting[0]["id"].as_i64().expect("a deployment waits");
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(f.tick().0, Some(0));
    let d = get(&format!("/api/v1/deployments/{id}"));
    assert!(d["overdue_at"].as_i64().is_some(), "{d:#}");
    f.nomad
        .control("canaries", json!({ "ID": "web", "Healthy": 1 }));
    let ok = api(
        &intake,
        "POST",
        &format!("/api/v1/deployments/{id}/approve"),
        APPROVER,
        json!({ "plan_hash": d["plan_hash"] }),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(promotes(&j).len(), 1);
    assert_eq!(
        get(&format!("/api/v1/deployments/{id}"))["state"],
        "applying"
    );
}

#[test]
fn a_plan_superseded_at_the_same_commit_says_what_changed_instead() {
    let (f, intake) = approval_fixture("approval");
    assert_eq!(f.tick().0, Some(0));
    let p = pending(&intake);
    let ok = api(
        &intake,
        "POST",
        &format!("/api/v1/deployments/{}/approve", p[0]["id"]),
        APPROVER,
        json!({ "plan_hash": p[0]["plan_hash"] }),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(f.tick().0, Some(0));
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    assert_eq!(f.tick().0, Some(0));
    f.remote.commit(
        &[(
            "jobs/web.nomad.hcl",
            &web_job("nginx:1.26", "    team = \"web\""),
        )],
        "1.26",
    );
    assert_eq!(f.tick().0, Some(0));
    assert_eq!(pending(&intake).len(), 1);
    // An autoscaler moves the scaled group: the spec git gives now (with
    // the live count) is not the waiting one's, at the same commit.
    f.nomad
        .control("scale", json!({ "ID": "web", "Group": "web", "Count": 5 }));
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let d = f.deployments();
    let superseded: Vec<&Value> = d.iter().filter(|r| r["state"] == "superseded").collect();
    assert_eq!(superseded.len(), 1, "{d:#?}");
    let msg = superseded[0]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("at the same commit") && !msg.contains("superseded by commit"),
        "{msg}"
    );
}

/// "No image tag `latest`" on the stand-in's plan: a job whose task floats
/// is judged before anything is registered, and a pinned one registers.
#[test]
fn a_policy_judges_the_plan_before_any_register() {
    let dir = tempfile::tempdir().expect("tempdir");
    let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/policies/no_latest.rego");
    std::fs::copy(&from, dir.path().join("no_latest.rego")).expect("copy policy");
    let f = fixture(&format!(
        "\n[[policies]]\nname = \"no-latest\"\nfiles = [\"{}/no_latest.rego\"]\n",
        dir.path().display()
    ));
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(registers(&j).len(), 1, "{j:#?}");
    f.nomad
        .control("deployment", json!({ "ID": "web", "Status": "successful" }));
    let (code, out, _) = f.tick();
    assert_eq!(code, Some(0), "{out}");

    f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:latest", AUTO))],
        "float",
    );
    let (code, out, j) = f.tick();
    assert_ne!(code, Some(0), "{out}");
    assert!(registers(&j).is_empty(), "registered anyway: {j:#?}");
    assert_eq!(f.image(), "nginx:1.25");
    let msg = f.message();
    assert!(
        msg.contains(
            "denied by policy `no-latest`: job default/web task server: image nginx:latest floats"
        ) && msg.contains("nothing registered"),
        "{msg}"
    );
    assert!(!msg.contains(CANARY), "{msg}");

    f.remote.commit(
        &[("jobs/web.nomad.hcl", &web_job("nginx:1.27", AUTO))],
        "pinned",
    );
    let (code, out, j) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(registers(&j).len(), 1, "{j:#?}");
    assert_eq!(f.image(), "nginx:1.27");
}
