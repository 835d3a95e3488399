//! The terraform backend against real terraform (`terraform_data`, local
//! state), through `driftless tick`, `outputs` and `destroy`.

mod common;

use common::*;

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
    let remote = Remote::new(root.path(), "infra");
    let first = remote.commit(
        &[
            ("network/main.tf", MAIN_TF),
            ("network/prod.tfvars", "greeting = \"hello\"\n"),
        ],
        "network",
    );
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
