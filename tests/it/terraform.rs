//! The terraform backend against real terraform (`terraform_data`, local
//! state), through `driftless tick`, `outputs` and `destroy`.

use crate::common::*;
use std::time::Duration;

const MAIN_TF: &str = r#"
variable "greeting" {
  type = string
}

resource "terraform_data" "greeting" {
  input = var.greeting
}

output "greeting" {
  value = terraform_data.greeting.output
}

output "token" {
  value     = "sensitive-${var.greeting}"
  sensitive = true
}
"#;

/// A remote whose `network/` holds `tf` and a `prod.tfvars` saying hello;
/// the commit.
fn network(root: &std::path::Path, tf: &str) -> (Remote, String) {
    let remote = Remote::new(root, "infra");
    let sha = remote.commit(
        &[
            ("network/main.tf", tf),
            ("network/prod.tfvars", "greeting = \"hello\"\n"),
        ],
        "network",
    );
    (remote, sha)
}

fn terraform_available() {
    let ok = std::process::Command::new("terraform")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "these tests need `terraform` on the PATH (see .ci/run)");
}

fn setup(remote: &Remote) -> Setup {
    Setup::new(&format!(
        "[[targets]]\nname = \"net\"\nrepo = \"{}\"\npath = \"network\"\ntimeout = \"2m\"\n\
         [targets.backend]\nkind = \"terraform\"\nvar_files = [\"prod.tfvars\"]\n\
         env = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n",
        remote.url()
    ))
}

fn tick(s: &Setup) -> (Option<i32>, String) {
    let out = s.run(&["tick", "net"]);
    (out.status.code(), text(&out.stdout) + &text(&out.stderr))
}

#[test]
fn terraform_lifecycle() {
    terraform_available();
    let root = tempfile::tempdir().expect("tempdir");
    let (remote, first) = network(root.path(), MAIN_TF);
    let s = setup(&remote);

    // First tick creates the resource.
    let (code, out) = tick(&s);
    assert_eq!(code, Some(0), "{out}");
    let st = s.target_status("net");
    assert_eq!(st["last_result"], "changed", "{st}");
    assert_eq!(st["last_applied_sha"], first);
    assert!(
        st["last_message"]
            .as_str()
            .unwrap_or("")
            .contains("1 added"),
        "{st}"
    );

    // Nothing changed: no_change.
    let (code, out) = tick(&s);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(s.target_status("net")["last_result"], "no_change");

    // A changed variable: changed.
    let second = remote.commit(
        &[("network/prod.tfvars", "greeting = \"bonjour\"\n")],
        "french",
    );
    let (code, out) = tick(&s);
    assert_eq!(code, Some(0), "{out}");
    let st = s.target_status("net");
    assert_eq!(st["last_result"], "changed", "{st}");
    assert_eq!(st["last_applied_sha"], second);

    // outputs: the value, sensitive ones masked.
    let out = s.run(&["outputs", "net", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["greeting"], "bonjour");
    assert_eq!(v["token"], "(sensitive)");
    assert!(!text(&out.stdout).contains("sensitive-bonjour"));

    // A syntax error: failed with terraform's message; the SHA stays.
    remote.commit(
        &[("network/broken.tf", "resource \"terraform_data\" \"x\" {\n")],
        "oops",
    );
    let (code, out) = tick(&s);
    assert_eq!(code, Some(1), "{out}");
    let st = s.target_status("net");
    assert_eq!(st["last_result"], "failed");
    assert_eq!(st["last_applied_sha"], second, "a failed run moved the SHA");
    let msg = st["last_message"].as_str().unwrap_or("");
    assert!(
        msg.contains("Unclosed configuration block") && msg.contains("broken.tf"),
        "{msg}"
    );
    assert_eq!(st["consecutive_failures"], 1);

    // Fix it, then destroy: the resource is gone from the state.
    remote.delete("network/broken.tf", "fix");
    let (code, out) = tick(&s);
    assert_eq!(code, Some(0), "{out}");
    let out = s.run(&["destroy", "net"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "destroy without --yes must refuse"
    );
    let out = s.run(&["destroy", "net", "--yes"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("changed"),
        "{}",
        text(&out.stdout)
    );
    let workdir = s.checkout("net").join("network");
    let list = std::process::Command::new("terraform")
        .args(["state", "list"])
        .current_dir(&workdir)
        .env("TF_CLI_CONFIG_FILE", "/dev/null")
        .output()
        .expect("terraform state list");
    assert!(list.status.success());
    assert_eq!(
        text(&list.stdout).trim(),
        "",
        "resources remain after destroy"
    );
    let st = s.target_status("net");
    assert_eq!(st["last_applied_sha"], serde_json::Value::Null);
    let runs = s.history("net");
    assert_eq!(runs[0]["operation"], "destroy");
    assert_eq!(runs[0]["result"], "changed");
}

#[test]
fn init_runs_when_the_lock_file_changes_and_not_otherwise() {
    terraform_available();
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("network/main.tf", MAIN_TF),
            ("network/prod.tfvars", "greeting = \"hello\"\n"),
        ],
        "network",
    );
    let s = setup(&remote);
    assert_eq!(tick(&s).0, Some(0));
    let runs = s.history("net");
    assert!(
        runs[0]["output_tail"]
            .as_str()
            .unwrap_or("")
            .contains("successfully initialized")
    );
    assert_eq!(tick(&s).0, Some(0));
    let runs = s.history("net");
    assert!(
        !runs[0]["output_tail"]
            .as_str()
            .unwrap_or("")
            .contains("Initializing"),
        "init ran although nothing it depends on changed: {}",
        runs[0]["output_tail"]
    );
    // A backend block appears: init runs again.
    remote.commit(
        &[(
            "network/backend.tf",
            "terraform {\n  backend \"local\" {}\n}\n",
        )],
        "explicit local backend",
    );
    let (code, out) = tick(&s);
    assert_eq!(code, Some(0), "{out}");
    let runs = s.history("net");
    assert!(
        runs[0]["output_tail"]
            .as_str()
            .unwrap_or("")
            .contains("Initializing"),
        "init did not run after the backend changed: {}",
        runs[0]["output_tail"]
    );
}

#[test]
fn workspace_is_selected_or_created_and_vars_are_passed() {
    terraform_available();
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("network/main.tf", MAIN_TF),
            ("network/prod.tfvars", "greeting = \"from-file\"\n"),
        ],
        "network",
    );
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"net\"\nrepo = \"{}\"\npath = \"network\"\n\
         [targets.backend]\nkind = \"terraform\"\nworkspace = \"staging\"\n\
         vars = {{ greeting = \"from-config\" }}\nenv = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n",
        remote.url()
    ));
    let (code, out) = tick(&s);
    assert_eq!(code, Some(0), "{out}");
    let workdir = s.checkout("net").join("network");
    assert!(
        workdir
            .join("terraform.tfstate.d/staging/terraform.tfstate")
            .is_file(),
        "the apply did not go to the staging workspace"
    );
    let out = s.run(&["outputs", "net", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["greeting"], "from-config");
    assert_eq!(tick(&s).0, Some(0));
    assert_eq!(s.target_status("net")["last_result"], "no_change");
}

/// A config whose resource's create provisioner logs its start and end
/// around a sleep, with its state in `state` (a local backend path).
fn slow_tf(log: &std::path::Path, state: &std::path::Path) -> String {
    format!(
        r#"
terraform {{
  backend "local" {{
    path = "{state}"
  }}
}}

resource "terraform_data" "slow" {{
  input = "v1"
  provisioner "local-exec" {{
    command = "echo started >> {log}; sleep 3; echo finished >> {log}"
  }}
}}

output "slow" {{
  value = terraform_data.slow.output
}}
"#,
        state = state.display(),
        log = log.display()
    )
}

#[test]
fn kill_9_mid_terraform_apply_then_restart_waits_for_it_and_converges() {
    terraform_available();
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let log = root.path().join("provisioner.log");
    let state = root.path().join("net.tfstate");
    let sha = remote.commit(&[("network/main.tf", &slow_tf(&log, &state))], "slow");
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"net\"\nrepo = \"{}\"\npath = \"network\"\ntimeout = \"2m\"\n\
         interval = \"1h\"\n\
         [targets.backend]\nkind = \"terraform\"\n\
         env = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n",
        remote.url()
    ));
    let daemon = s.serve();
    wait_for(
        Duration::from_secs(60),
        "terraform's apply to start",
        || log_lines(&log) == ["started"],
    );
    daemon.kill9();
    // The orphaned terraform keeps the target's lock (its inherited fd) and
    // its own state lock until it exits; the restarted daemon must wait for
    // it and then converge without a second create running beside it.
    let daemon = s.serve();
    wait_for(Duration::from_secs(90), "the job to run again", || {
        s.history("net").len() >= 2
            && s.target_status("net")["last_applied_sha"] == sha
            && jobs(&s.db()).iter().all(|j| j.state == "done")
    });
    assert_eq!(
        log_lines(&log),
        ["started", "finished"],
        "the create ran twice or was cut short"
    );
    let runs = s.history("net");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[1]["result"], "interrupted", "{runs:?}");
    // The orphan finished the create and wrote the state, so the rerun
    // finds nothing to do.
    assert_eq!(runs[0]["result"], "no_change", "{runs:?}");
    assert_eq!(runs[0]["sha"], sha);
    let out = s.run(&["outputs", "net"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("v1"), "{}", text(&out.stdout));
    let status = daemon.stop();
    assert!(status.success(), "{status}");
}

#[test]
fn a_state_lock_held_elsewhere_fails_with_its_id_and_how_to_clear_it() {
    terraform_available();
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let log = root.path().join("provisioner.log");
    let state = root.path().join("net.tfstate");
    let main_tf = slow_tf(&log, &state);
    remote.commit(&[("network/main.tf", &main_tf)], "slow");
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"net\"\nrepo = \"{}\"\npath = \"network\"\ntimeout = \"2m\"\n\
         [targets.backend]\nkind = \"terraform\"\n\
         env = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n",
        remote.url()
    ));
    // Another terraform on the same state, stopped at its approval prompt:
    // it holds the state lock, as a remote backend's lock left by a killed
    // apply would.
    let other = root.path().join("other");
    std::fs::create_dir_all(&other).expect("mkdir");
    std::fs::write(other.join("main.tf"), &main_tf).expect("write");
    let tf = |args: &[&str]| {
        let mut c = std::process::Command::new("terraform");
        c.args(args)
            .current_dir(&other)
            .env("TF_CLI_CONFIG_FILE", "/dev/null");
        c
    };
    let init = tf(&["init", "-input=false"])
        .output()
        .expect("terraform init");
    assert!(init.status.success(), "{}", text(&init.stderr));
    let mut holder = tf(&["apply"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("terraform apply");
    let info_file = root.path().join(".net.tfstate.lock.info");
    wait_for(
        Duration::from_secs(30),
        "the other terraform's lock",
        || std::fs::read_to_string(&info_file).is_ok_and(|t| t.contains("\"ID\"")),
    );
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&info_file).expect("lock info"))
            .expect("lock info JSON");
    let id = info["ID"].as_str().expect("lock ID").to_string();

    let (code, out) = tick(&s);
    assert_eq!(code, Some(1), "{out}");
    let st = s.target_status("net");
    assert_eq!(st["last_result"], "failed", "{st}");
    let msg = st["last_message"].as_str().unwrap_or("").to_string();
    for want in [
        "state is locked",
        id.as_str(),
        "OperationTypeApply",
        &format!("terraform force-unlock {id}"),
        "lock_timeout",
    ] {
        assert!(msg.contains(want), "message lacks {want:?}: {msg}");
    }
    assert!(
        log_lines(&log).is_empty(),
        "the apply ran under a held lock"
    );
    // The other process's lock survived: never force-unlocked, its holder
    // still running, the same lock on record.
    assert!(
        holder.try_wait().expect("holder").is_none(),
        "the lock's holder is gone"
    );
    let after: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&info_file).expect("lock info kept"))
            .expect("lock info JSON");
    assert_eq!(after["ID"], id.as_str(), "{after}");
    let probe = tf(&["plan", "-input=false", "-lock-timeout=0s"])
        .output()
        .expect("terraform plan");
    assert!(
        !probe.status.success() && text(&probe.stderr).contains(&id),
        "the state lock is no longer held: {}",
        text(&probe.stderr)
    );

    // The holder goes away: the next tick converges.
    let _ = holder.kill();
    let _ = holder.wait();
    let (code, out) = tick(&s);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(s.target_status("net")["last_result"], "changed");
    assert_eq!(log_lines(&log), ["started", "finished"]);
}

#[test]
fn committed_symlinks_never_take_terraform_out_of_the_checkout() {
    terraform_available();
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("network/main.tf", MAIN_TF)], "network");
    // The var file is a link to a file of the controller's (one of the
    // test's own, standing for /etc/passwd).
    let controller = root.path().join("controller-secret.tfvars");
    std::fs::write(&controller, "greeting = \"controller-secret-71c0\"\n").expect("write");
    let controller = controller.to_str().expect("utf8").to_string();
    remote.symlink(
        "network/prod.tfvars",
        &controller,
        "var file -> the controller's file",
    );
    let s = setup(&remote);
    let (code, out) = tick(&s);
    assert_eq!(code, Some(1), "{out}");
    let st = s.target_status("net");
    let msg = st["last_message"].as_str().unwrap_or("");
    assert!(
        msg.contains(&format!(
            "`var_files` `prod.tfvars` resolves to {controller}, outside the target's checkout"
        )),
        "{msg}"
    );
    let history = serde_json::to_string(&s.history("net")).expect("json");
    assert!(
        !history.contains("controller-secret-71c0"),
        "the controller's file in a run: {history}"
    );

    // `.terraform` committed as a link: driftless would write its init
    // marker (and terraform its plugins) through it.
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).expect("mkdir");
    remote.commit(
        &[("network/prod.tfvars", "greeting = \"hello\"\n")],
        "a real var file",
    );
    remote.symlink(
        "network/.terraform",
        outside.to_str().expect("utf8"),
        ".terraform -> outside",
    );
    let (code, out) = tick(&s);
    assert_eq!(code, Some(1), "{out}");
    let msg = s.target_status("net")["last_message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        msg.contains(".terraform") && msg.contains("outside the target's checkout"),
        "{msg}"
    );
    assert_eq!(
        std::fs::read_dir(&outside).expect("read").count(),
        0,
        "something was written through the link"
    );

    // The target's path itself a link out of the checkout: refused before
    // any backend runs.
    let s2 = Setup::new(&format!(
        "[[targets]]\nname = \"net\"\nrepo = \"{}\"\npath = \"elsewhere\"\ntimeout = \"2m\"\n\
         [targets.backend]\nkind = \"terraform\"\nenv = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n",
        remote.url()
    ));
    std::fs::write(outside.join("main.tf"), MAIN_TF).expect("write");
    remote.symlink(
        "elsewhere",
        outside.to_str().expect("utf8"),
        "path -> outside",
    );
    let (code, out) = tick(&s2);
    assert_eq!(code, Some(1), "{out}");
    let msg = s2.target_status("net")["last_message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        msg.contains("path `elsewhere`") && msg.contains("outside the checkout"),
        "{msg}"
    );
    assert_eq!(
        std::fs::read_dir(&outside).expect("read").count(),
        1,
        "terraform ran in it"
    );
}

const PLANNED_TF: &str = r#"
variable "greeting" {
  type = string
}

variable "secret" {
  type      = string
  sensitive = true
}

resource "terraform_data" "greeting" {
  input = var.greeting
}

resource "terraform_data" "pinned" {
  input            = "same"
  triggers_replace = [var.greeting]
}

resource "terraform_data" "secret" {
  input = var.secret
}
"#;

/// `driftless plan` against real terraform: what applying the branch tip
/// would change, by address and action, without changing anything (no
/// state written, no run recorded, the plan file removed), the same hash
/// for the same plan, a replacement called destructive, and no value shown
/// (a sensitive variable's canary never appears).
#[test]
fn plan_shows_what_apply_would_change_and_changes_nothing() {
    terraform_available();
    const CANARY: &str = "plan-canary-4f1d9e";
    let root = tempfile::tempdir().expect("tempdir");
    let (remote, first) = network(root.path(), PLANNED_TF);
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"net\"\nrepo = \"{}\"\npath = \"network\"\ntimeout = \"2m\"\n\
         [targets.backend]\nkind = \"terraform\"\nvar_files = [\"prod.tfvars\"]\n\
         vars = {{ secret = \"{CANARY}\" }}\nenv = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n\n\
         {}",
        remote.url(),
        exec_target("sh", &remote.url(), "", "apply = [\"true\"]")
    ));
    let plan = |args: &[&str]| {
        let mut all = vec!["plan"];
        all.extend_from_slice(args);
        let out = s.run(&all);
        let said = text(&out.stdout) + &text(&out.stderr);
        assert!(
            !said.contains(CANARY),
            "the sensitive value was shown:\n{said}"
        );
        (out.status.code(), text(&out.stdout))
    };
    let plans_dir = s.state.join("plans").join("net");
    let state_file = || {
        s.state
            .join("checkouts")
            .join("net")
            .join("network/terraform.tfstate")
    };

    let (code, out) = plan(&["net"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.starts_with(&format!(
            "net at {}: 3 to add, 0 to change, 0 to destroy\n",
            &first[..12]
        )),
        "{out}"
    );
    for line in [
        "+ terraform_data.greeting (create)",
        "+ terraform_data.pinned (create)",
        "+ terraform_data.secret (create)",
    ] {
        assert!(out.lines().any(|l| l == line), "no `{line}` in:\n{out}");
    }
    assert!(!out.contains("destructive"), "{out}");
    // Nothing was applied or recorded, and the plan file is gone.
    assert!(s.history("net").is_empty(), "a plan recorded a run");
    assert!(!state_file().exists(), "a plan wrote terraform state");
    let left: Vec<_> = std::fs::read_dir(&plans_dir)
        .expect("the plans directory")
        .collect();
    assert!(left.is_empty(), "plan files left behind: {left:?}");

    // The same plan twice: the same hash.
    let hash = |out: &str| -> String {
        let v: serde_json::Value = serde_json::from_str(out).expect("plan --json");
        v["plan_hash"].as_str().expect("plan_hash").to_string()
    };
    let (_, a) = plan(&["net", "--json"]);
    // terraform stamps each plan to the second: the hash must not see it.
    std::thread::sleep(Duration::from_millis(1100));
    let (_, b) = plan(&["net", "--json"]);
    let first_hash = hash(&a);
    assert_eq!(first_hash.len(), 64, "{a}");
    assert_eq!(first_hash, hash(&b));
    let v: serde_json::Value = serde_json::from_str(&a).expect("json");
    assert_eq!(
        (v["changes"].clone(), v["destructive"].clone()),
        (true.into(), false.into())
    );
    assert_eq!(v["commit"], first.as_str());

    // Applied: nothing left to plan.
    let (code, out) = tick(&s);
    assert_eq!(code, Some(0), "{out}");
    // The run's output reads as terraform's messages, not its JSON lines,
    // and never shows the sensitive value.
    let logs = text(&s.run(&["logs", "net"]).stdout);
    assert!(
        logs.contains("$ terraform apply ")
            && logs.contains("Apply complete! Resources: 3 added, 0 changed, 0 destroyed.")
            && !logs.contains("\"@level\"")
            && !logs.contains(CANARY),
        "{logs}"
    );
    assert!(state_file().exists());
    let (code, out) = plan(&["net"]);
    assert_eq!(
        (code, out.trim()),
        (
            Some(0),
            format!("net at {}: no changes", &first[..12]).as_str()
        )
    );

    // Only an output changes: a change all the same (terraform's own plan
    // report says so; no resource does).
    let first = remote.commit(
        &[(
            "network/extra.tf",
            "output \"extra\" {\n  value = \"x\"\n}\n",
        )],
        "an output",
    );
    let (code, out) = plan(&["net"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.lines().any(|l| l == "~ output.extra (create)"), "{out}");
    let (code, out) = tick(&s);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = plan(&["net"]);
    assert_eq!(code, Some(0), "{out}");

    // A new greeting updates one resource and replaces another.
    let second = remote.commit(&[("network/prod.tfvars", "greeting = \"bye\"\n")], "bye");
    let (code, out) = plan(&["net"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.starts_with(&format!(
            "net at {}: 1 to add, 1 to change, 1 to destroy (destructive: deletes or replaces)\n",
            &second[..12]
        )),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l == "~ terraform_data.greeting (update)"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l == "-/+ terraform_data.pinned (delete, create)"),
        "{out}"
    );
    let (_, j) = plan(&["net", "--json"]);
    assert_ne!(hash(&j), first_hash);
    // Still nothing applied: the last run is the first commit's.
    assert_eq!(s.target_status("net")["last_applied_sha"], first);

    // A backend that cannot plan says so.
    let (code, out) = plan(&["sh"]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(
        out.trim(),
        "error: target `sh` (exec) cannot plan: give it a `plan` command"
    );
}

/// `policy = "detect"` against real terraform: every tick plans and applies
/// nothing; a difference is drift (in `status`, `/metrics` and one
/// `drift_detected` event however many ticks see it), and once the real
/// world matches git (here: someone applied by hand) it is over, told once
/// (`drift_resolved`). The last applied commit never moves.
#[test]
fn a_detect_target_reports_drift_once_and_its_end_once_and_applies_nothing() {
    terraform_available();
    let root = tempfile::tempdir().expect("tempdir");
    let (remote, sha) = network(root.path(), MAIN_TF);
    let sink = Service::http_sink(root.path(), 0);
    let s = Setup::new(&format!(
        "[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\n\
         [[targets]]\nname = \"net\"\nrepo = \"{}\"\npath = \"network\"\ntimeout = \"2m\"\n\
         policy = \"detect\"\nnotify = [\"hook\"]\n\
         [targets.backend]\nkind = \"terraform\"\nvar_files = [\"prod.tfvars\"]\n\
         env = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n",
        sink.port,
        remote.url()
    ));
    let workdir = s.state.join("checkouts/net/network");
    let events = || -> Vec<String> {
        sink.requests()
            .iter()
            .map(|r| {
                let doc: serde_json::Value =
                    serde_json::from_str(r["body"].as_str().expect("body")).expect("json");
                doc["event"].as_str().unwrap_or("?").to_string()
            })
            .collect()
    };

    // The second tick finds the same drift: it joins the first run's row
    // (a streak), and nobody is told twice.
    for _ in 0..2 {
        let (code, out) = tick(&s);
        assert_eq!(code, Some(0), "{out}");
        assert!(
            out.contains(&format!(
                "no_change at {} (run 1): drift at {}: 1 to add, 0 to change, 0 to destroy, 2 output(s) to change (policy detect: nothing applied)",
                &sha[..12],
                &sha[..12]
            )),
            "{out}"
        );
        assert!(
            !workdir.join("terraform.tfstate").exists(),
            "detect applied something"
        );
        let st = s.target_status("net");
        assert_eq!(st["policy"], "detect");
        assert!(st["last_applied_sha"].is_null(), "{st}");
        assert!(
            st["drift"]
                .as_str()
                .is_some_and(|d| d.lines().any(|l| l == "+ terraform_data.greeting (create)")),
            "{st}"
        );
    }
    assert_eq!(events(), ["drift_detected"], "one event for one drift");
    let runs = s.history("net");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["repeats"], 2, "{runs:?}");
    let intake = Intake::start(&s);
    let metrics = intake.get("/metrics");
    assert!(
        metrics.body.contains("driftless_drift{target=\"net\"} 1"),
        "{}",
        metrics.body
    );
    drop(intake);

    // Someone applies by hand: the real world now matches git.
    let by_hand = std::process::Command::new("terraform")
        .args([
            "apply",
            "-auto-approve",
            "-input=false",
            "-var-file=prod.tfvars",
        ])
        .current_dir(&workdir)
        .env("TF_CLI_CONFIG_FILE", "/dev/null")
        .output()
        .expect("terraform apply");
    assert!(by_hand.status.success(), "{}", text(&by_hand.stderr));
    for _ in 0..2 {
        let (code, out) = tick(&s);
        assert_eq!(code, Some(0), "{out}");
        assert!(
            out.contains(&format!("no drift: the real world matches {}", &sha[..12])),
            "{out}"
        );
    }
    let st = s.target_status("net");
    assert!(st["drift"].is_null(), "{st}");
    assert_eq!(events(), ["drift_detected", "drift_resolved"]);
    let intake = Intake::start(&s);
    assert!(
        intake
            .get("/metrics")
            .body
            .contains("driftless_drift{target=\"net\"} 0")
    );
}

// ------------------------------------------------------------ approvals

const OPS: &str = "ops-token-5e0a7c";
const VIEWER: &str = "viewer-token-a91f3d";

/// A terraform target `net` with `policy`, the sensitive variable set to
/// `canary`, a webhook notifier into `sink`, an approver token (`ops`) and
/// a read-only one (`viewer`); a long interval, so the daemon ticks when
/// asked.
fn review_setup(remote: &Remote, sink: &Service, policy: &str, canary: &str) -> Setup {
    Setup::new(&format!(
        "[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\n\
         [[targets]]\nname = \"net\"\nrepo = \"{}\"\npath = \"network\"\ntimeout = \"2m\"\n\
         interval = \"1h\"\npolicy = \"{policy}\"\nnotify = [\"hook\"]\n\
         [targets.backend]\nkind = \"terraform\"\nvar_files = [\"prod.tfvars\"]\n\
         vars = {{ secret = \"{canary}\" }}\nenv = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n{}{}",
        sink.port,
        remote.url(),
        token_table("ops", OPS, &["approve:net", "reconcile:net", "read"]),
        token_table("viewer", VIEWER, &["read"]),
    ))
}

/// The daemon's API, as the tests of approvals use it.
struct Api<'a> {
    d: &'a Daemon,
}

impl Api<'_> {
    fn call(&self, method: &str, path: &str, token: &str, body: serde_json::Value) -> HttpResponse {
        api_call(self.d.port, method, path, token, &body)
    }

    fn deployment(&self, id: i64) -> serde_json::Value {
        let r = self.call(
            "GET",
            &format!("/api/v1/deployments/{id}"),
            VIEWER,
            serde_json::Value::Null,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    }

    fn pending(&self) -> Vec<serde_json::Value> {
        let r = self.call(
            "GET",
            "/api/v1/deployments?state=pending_approval",
            VIEWER,
            serde_json::Value::Null,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json().as_array().cloned().expect("a list")
    }

    /// The one pending deployment, once there is one other than `not`.
    fn wait_pending(&self, not: &[i64]) -> serde_json::Value {
        let mut found = None;
        wait_for(
            Duration::from_secs(120),
            "a plan waiting for approval",
            || {
                let p = self.pending();
                found = p
                    .into_iter()
                    .find(|d| !not.contains(&d["id"].as_i64().unwrap_or(0)));
                found.is_some()
            },
        );
        found.expect("pending")
    }

    fn approve(&self, id: i64, token: &str, hash: &str) -> HttpResponse {
        self.call(
            "POST",
            &format!("/api/v1/deployments/{id}/approve"),
            token,
            serde_json::json!({ "plan_hash": hash }),
        )
    }

    /// A reconcile that waits for its job; the job's run.
    fn reconcile(&self) -> serde_json::Value {
        let r = self.call(
            "POST",
            "/api/v1/targets/net/reconcile?wait=120s",
            OPS,
            serde_json::Value::Null,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["run"].clone()
    }

    fn wait_state(&self, id: i64, state: &str) -> serde_json::Value {
        let mut last = serde_json::Value::Null;
        wait_for(
            Duration::from_secs(120),
            &format!("deployment {id} {state}"),
            || {
                last = self.deployment(id);
                last["state"] == state
            },
        );
        last
    }
}

/// `policy = "approval"` against real terraform, through the daemon, its
/// API and the CLI: a push waits and changes nothing until a person with
/// the approve scope approves exactly the plan shown (a stale hash is 409);
/// the approved plan is terraform's saved plan file, applied as is; a newer
/// push supersedes a waiting plan (told once, its approval refused); a plan
/// whose state moved after it was made is refused by terraform and applies
/// nothing, and holds the target until `driftless retry`; the sensitive
/// value never shows.
#[test]
fn an_approval_target_applies_exactly_the_approved_plan_and_nothing_else() {
    terraform_available();
    const CANARY: &str = "approval-canary-93be1c";
    let root = tempfile::tempdir().expect("tempdir");
    let (remote, first) = network(root.path(), PLANNED_TF);
    let sink = Service::http_sink(root.path(), 0);
    let s = review_setup(&remote, &sink, "approval", CANARY);
    let workdir = s.state.join("checkouts/net/network");
    let d = Daemon::start(&s);
    let api = Api { d: &d };

    // The daemon's first tick plans; nothing is applied.
    let p1 = api.wait_pending(&[]);
    let id1 = p1["id"].as_i64().expect("id");
    let hash1 = p1["plan_hash"].as_str().expect("plan_hash").to_string();
    assert_eq!(
        (
            &p1["backend"],
            &p1["commit"],
            &p1["destructive"],
            &p1["summary"]
        ),
        (
            &"terraform".into(),
            &first.as_str().into(),
            &false.into(),
            &"3 to add, 0 to change, 0 to destroy".into()
        ),
        "{p1}"
    );
    assert_eq!(hash1.len(), 64, "{p1}");
    assert!(
        p1["diff"]
            .as_str()
            .is_some_and(|d| d.lines().any(|l| l == "+ terraform_data.secret (create)")),
        "{p1}"
    );
    assert!(
        !workdir.join("terraform.tfstate").exists(),
        "applied before approval"
    );
    assert_eq!(
        s.plan_files("net").len(),
        1,
        "the plan file is kept for its approval"
    );
    // `driftless deployments --pending` lists it with its backend.
    let out = output_within(
        std::process::Command::new(bin())
            .args(["--config", s.config.to_str().expect("utf8")])
            .args(["deployments", "--pending"])
            .env("DRIFTLESS_TOKEN", VIEWER),
        Duration::from_secs(60),
    );
    let listed = text(&out.stdout);
    assert!(
        listed.lines().any(|l| l.starts_with(&format!("{id1} "))
            && l.contains(" terraform ")
            && l.contains("pending_approval")
            && l.contains("3 to add, 0 to change, 0 to destroy")),
        "{listed}{}",
        text(&out.stderr)
    );
    // Ticking again keeps the same plan waiting.
    let run = api.reconcile();
    assert_eq!(run["result"], "no_change", "{run}");
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| m.starts_with(&format!("deployment {id1} waits for approval"))),
        "{run}"
    );
    assert_eq!(api.pending().len(), 1);

    // Refused: another's hash, a reader, no hash; nothing applied.
    let stale = api.approve(id1, OPS, &"0".repeat(64));
    assert_eq!(stale.status, 409, "{}", stale.body);
    assert!(stale.body.contains("stale plan"), "{}", stale.body);
    assert_eq!(api.approve(id1, VIEWER, &hash1).status, 403);
    let none = api.call(
        "POST",
        &format!("/api/v1/deployments/{id1}/approve"),
        OPS,
        serde_json::json!({}),
    );
    assert_eq!(none.status, 400, "{}", none.body);
    assert!(!workdir.join("terraform.tfstate").exists());

    // The CLI shows the plan and approves exactly it; the daemon applies it.
    let out = output_within(
        std::process::Command::new(bin())
            .args(["--config", s.config.to_str().expect("utf8")])
            .args(["approve", &id1.to_string()])
            .env("DRIFTLESS_TOKEN", OPS),
        Duration::from_secs(60),
    );
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("+ terraform_data.greeting (create)")
            && said.contains("approved: now approved"),
        "{said}"
    );
    let applied = api.wait_state(id1, "applied");
    assert_eq!(applied["decided_by"], "token:ops", "{applied}");
    assert_eq!(
        greeting_in_state(&workdir.join("terraform.tfstate")).as_deref(),
        Some("hello")
    );
    assert_eq!(s.target_status("net")["last_applied_sha"], first);
    assert!(s.plan_files("net").is_empty(), "{:?}", s.plan_files("net"));
    let last = &s.history("net")[0];
    assert_eq!(last["result"], "changed", "{last}");
    assert!(
        last["message"].as_str().is_some_and(|m| m.starts_with(&format!(
            "deployment {id1} (3 to add, 0 to change, 0 to destroy at {}, approved by token:ops): Apply complete!",
            &first[..12]
        ))),
        "{last}"
    );
    let again = api.approve(id1, OPS, &hash1);
    assert_eq!(again.status, 409, "{}", again.body);

    // A newer push supersedes the waiting plan; its approval is refused.
    let second = remote.commit(&[("network/prod.tfvars", "greeting = \"bye\"\n")], "bye");
    api.reconcile();
    let p2 = api.wait_pending(&[id1]);
    let id2 = p2["id"].as_i64().expect("id");
    assert_eq!(
        (&p2["commit"], &p2["destructive"]),
        (&second.as_str().into(), &true.into())
    );
    let third = remote.commit(&[("network/prod.tfvars", "greeting = \"ciao\"\n")], "ciao");
    api.reconcile();
    let p3 = api.wait_pending(&[id1, id2]);
    let id3 = p3["id"].as_i64().expect("id");
    assert_eq!(p3["commit"], third.as_str());
    let superseded = api.deployment(id2);
    assert_eq!(superseded["state"], "superseded", "{superseded}");
    let late = api.approve(id2, OPS, p2["plan_hash"].as_str().expect("hash"));
    assert_eq!(late.status, 409, "{}", late.body);
    assert!(late.body.contains("superseded"), "{}", late.body);
    assert_eq!(s.plan_files("net").len(), 1, "{:?}", s.plan_files("net"));
    assert_eq!(
        greeting_in_state(&workdir.join("terraform.tfstate")).as_deref(),
        Some("hello")
    );

    // Someone changes the state after the plan was made: terraform refuses
    // the approved plan file, nothing is applied.
    let by_hand = std::process::Command::new("terraform")
        .args([
            "apply",
            "-auto-approve",
            "-input=false",
            "-var=greeting=by-hand",
            "-var=secret=x",
        ])
        .current_dir(&workdir)
        .env("TF_CLI_CONFIG_FILE", "/dev/null")
        .output()
        .expect("terraform apply");
    assert!(by_hand.status.success(), "{}", text(&by_hand.stderr));
    let ok = api.approve(id3, OPS, p3["plan_hash"].as_str().expect("hash"));
    assert_eq!(ok.status, 200, "{}", ok.body);
    let failed = api.wait_state(id3, "failed");
    assert!(
        failed["message"].as_str().is_some_and(
            |m| m.contains("the approved plan is stale") && m.contains("Saved plan is stale")
        ),
        "{failed}"
    );
    assert_eq!(
        greeting_in_state(&workdir.join("terraform.tfstate")).as_deref(),
        Some("by-hand")
    );
    assert_eq!(s.target_status("net")["last_applied_sha"], first);
    // It holds the target: no new plan until a retry.
    let run = api.reconcile();
    assert_eq!(run["result"], "failed", "{run}");
    assert!(
        run["message"].as_str().is_some_and(|m| m
            .contains(&format!("deployment {id3} at {} was failed", &third[..12]))
            && m.ends_with("nothing is applied until a new commit or `driftless retry net`")),
        "{run}"
    );
    assert!(api.pending().is_empty());
    let out = output_within(
        std::process::Command::new(bin())
            .args(["--config", s.config.to_str().expect("utf8")])
            .args(["retry", "net"])
            .env("DRIFTLESS_TOKEN", OPS),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        text(&out.stdout) + &text(&out.stderr)
    );
    let p4 = api.wait_pending(&[id1, id2, id3]);
    let id4 = p4["id"].as_i64().expect("id");
    assert_eq!(p4["commit"], third.as_str());
    assert_eq!(
        api.approve(id4, OPS, p4["plan_hash"].as_str().expect("hash"))
            .status,
        200
    );
    api.wait_state(id4, "applied");
    assert_eq!(
        greeting_in_state(&workdir.join("terraform.tfstate")).as_deref(),
        Some("ciao")
    );
    assert_eq!(s.target_status("net")["last_applied_sha"], third);

    // Told once per plan that waited, once of the superseded one; the
    // sensitive value nowhere.
    let told = || -> Vec<(String, i64)> {
        sink.requests()
            .iter()
            .filter_map(|r| {
                let doc: serde_json::Value = serde_json::from_str(r["body"].as_str()?).ok()?;
                let event = doc["event"].as_str()?.to_string();
                let id = doc["run_url"].as_str()?.rsplit('/').next()?.parse().ok()?;
                matches!(event.as_str(), "pending_approval" | "superseded").then_some((event, id))
            })
            .collect()
    };
    let want: Vec<(String, i64)> = [
        ("pending_approval", id1),
        ("pending_approval", id2),
        ("superseded", id2),
        ("pending_approval", id3),
        ("pending_approval", id4),
    ]
    .iter()
    .map(|(e, i)| (e.to_string(), *i))
    .collect();
    wait_for(Duration::from_secs(30), "the notifications", || {
        told().len() >= want.len()
    });
    assert_eq!(told(), want);
    let bodies: String = sink.requests().iter().map(|r| r.to_string()).collect();
    assert!(
        bodies.contains(&format!("driftless approve {id1}")),
        "{bodies}"
    );
    assert!(
        bodies.contains(&hash1),
        "the approval command names the plan"
    );
    let listed = api.call(
        "GET",
        "/api/v1/deployments",
        VIEWER,
        serde_json::Value::Null,
    );
    for seen in [bodies, listed.body, d.log_text()] {
        assert!(
            !seen.contains(CANARY),
            "the sensitive value leaked:\n{seen}"
        );
    }
}

/// `policy = "approve_destructive"`: a plan that only creates is applied
/// unattended (and recorded as decided by driftless); one that replaces
/// something waits, and a rejected plan holds the target, applies nothing
/// and leaves no plan file.
#[test]
fn approve_destructive_applies_creations_and_waits_on_replacements() {
    terraform_available();
    let root = tempfile::tempdir().expect("tempdir");
    let (remote, first) = network(root.path(), PLANNED_TF);
    let sink = Service::http_sink(root.path(), 0);
    let s = review_setup(&remote, &sink, "approve_destructive", "x");
    let workdir = s.state.join("checkouts/net/network");
    let d = Daemon::start(&s);
    let api = Api { d: &d };
    wait_for(Duration::from_secs(120), "the first apply recorded", || {
        s.target_status("net")["last_applied_sha"] == first
    });
    assert_eq!(
        greeting_in_state(&workdir.join("terraform.tfstate")).as_deref(),
        Some("hello")
    );
    let all = api.call(
        "GET",
        "/api/v1/deployments",
        VIEWER,
        serde_json::Value::Null,
    );
    let list = all.json();
    let only = &list[0];
    assert_eq!(
        (
            &only["state"],
            &only["decided_by"],
            &only["destructive"],
            &only["commit"]
        ),
        (
            &"applied".into(),
            &"driftless".into(),
            &false.into(),
            &first.as_str().into()
        ),
        "{list}"
    );

    remote.commit(&[("network/prod.tfvars", "greeting = \"bye\"\n")], "bye");
    api.reconcile();
    let p = api.wait_pending(&[]);
    let id = p["id"].as_i64().expect("id");
    assert_eq!(p["destructive"], true, "{p}");
    assert_eq!(
        greeting_in_state(&workdir.join("terraform.tfstate")).as_deref(),
        Some("hello")
    );
    let r = api.call(
        "POST",
        &format!("/api/v1/deployments/{id}/reject"),
        OPS,
        serde_json::Value::Null,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["state"], "rejected");
    wait_for(
        Duration::from_secs(60),
        "the rejected plan's file removed",
        || s.plan_files("net").is_empty(),
    );
    let run = api.reconcile();
    assert_eq!(run["result"], "no_change", "{run}");
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| m.contains("was rejected by token:ops")),
        "{run}"
    );
    assert!(api.pending().is_empty());
    assert_eq!(
        greeting_in_state(&workdir.join("terraform.tfstate")).as_deref(),
        Some("hello")
    );
    assert_eq!(s.target_status("net")["last_applied_sha"], first);
}

/// kill -9 while an approved plan is being applied: the restarted daemon
/// waits for the orphaned terraform (it holds the target's lock), then
/// marks the plan failed — what it changed is not known to driftless —
/// and never applies it a second time; `driftless retry` plans again and
/// finds what the orphan finished.
#[test]
fn kill_9_mid_apply_of_an_approved_plan_fails_it_and_never_applies_it_twice() {
    terraform_available();
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let log = root.path().join("provisioner.log");
    let state = root.path().join("net.tfstate");
    let sha = remote.commit(&[("network/main.tf", &slow_tf(&log, &state))], "slow");
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"net\"\nrepo = \"{}\"\npath = \"network\"\ntimeout = \"2m\"\n\
         interval = \"1h\"\npolicy = \"approval\"\n\
         [targets.backend]\nkind = \"terraform\"\n\
         env = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n{}{}",
        remote.url(),
        token_table("ops", OPS, &["approve:net", "reconcile:net", "read"]),
        token_table("viewer", VIEWER, &["read"]),
    ));
    let daemon = s.serve();
    let api = Api { d: &daemon };
    let p = api.wait_pending(&[]);
    let id = p["id"].as_i64().expect("id");
    let r = api.approve(id, OPS, p["plan_hash"].as_str().expect("hash"));
    assert_eq!(r.status, 200, "{}", r.body);
    wait_for(
        Duration::from_secs(60),
        "terraform's apply of the approved plan to start",
        || log_lines(&log) == ["started"],
    );
    daemon.kill9();
    let daemon = s.serve();
    let api = Api { d: &daemon };
    let failed = api.wait_state(id, "failed");
    assert!(
        failed["message"]
            .as_str()
            .is_some_and(|m| m.contains("was being applied when driftless stopped")),
        "{failed}"
    );
    wait_for(Duration::from_secs(30), "the orphan to finish", || {
        log_lines(&log) == ["started", "finished"]
    });
    let runs = s.history("net");
    assert_eq!(runs[0]["result"], "failed", "{runs:?}");
    drop(daemon);
    let out = s.run(&["retry", "net"]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(
        said.contains("no changes: the real world matches"),
        "{said}"
    );
    assert_eq!(s.target_status("net")["last_applied_sha"], sha);
    assert_eq!(
        log_lines(&log),
        ["started", "finished"],
        "the approved plan was applied twice"
    );
}

/// A checkout belongs to one repository: when a target's `repo` changes,
/// the old checkout (with terraform's local state of the old repository's
/// resources) is not reused — the tick and `check` refuse, naming both
/// repositories and `driftless forget`, and nothing is planned or
/// destroyed; after `forget`, the target starts clean.
#[test]
fn a_checkout_is_never_reused_for_another_repository() {
    terraform_available();
    let root = tempfile::tempdir().expect("tempdir");
    let (old, _) = network(
        root.path(),
        "resource \"terraform_data\" \"old\" {\n  input = \"kept\"\n}\n",
    );
    let new = Remote::new(root.path(), "other");
    new.commit(
        &[
            (
                "network/main.tf",
                "resource \"terraform_data\" \"new\" {\n  input = \"fresh\"\n}\n",
            ),
            ("network/prod.tfvars", ""),
        ],
        "another repository",
    );
    let s = setup(&old);
    let (code, said) = tick(&s);
    assert_eq!(code, Some(0), "{said}");
    let state = s.state.join("checkouts/net/network/terraform.tfstate");
    let resources = || std::fs::read_to_string(&state).unwrap_or_default();
    assert!(resources().contains("terraform_data") && resources().contains("\"old\""));

    // The target now names another repository.
    let config = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(&s.config, config.replace(&old.url(), &new.url())).expect("config");
    let (code, said) = tick(&s);
    assert_eq!(code, Some(1), "{said}");
    let message = s.history("net")[0]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    // Both repositories named, as normalised (`file:<path>`, lowercase,
    // without `.git`).
    let named = |r: &Remote| {
        let path = r.bare.display().to_string().to_lowercase();
        message.contains(path.trim_end_matches(".git"))
    };
    assert!(
        named(&old) && named(&new),
        "{} {} {message}",
        old.bare.display(),
        new.bare.display()
    );
    assert!(message.contains("driftless forget net"), "{message}");
    assert!(
        resources().contains("\"old\""),
        "the old repository's resource was destroyed"
    );
    let out = s.run(&["check"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("targets[net]: key `repo`")
            && text(&out.stdout).contains("driftless forget net"),
        "{}",
        text(&out.stdout)
    );

    // Forgotten, it starts clean from the new repository.
    succeeded(&s.run(&["forget", "net"]), "forget");
    let (code, said) = tick(&s);
    assert_eq!(code, Some(0), "{said}");
    assert!(resources().contains("\"new\"") && !resources().contains("\"old\""));
}
