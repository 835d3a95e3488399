//! Policies as code (`[[policies]]`, Rego evaluated in-process) against
//! real plans: terraform's (`terraform_data`), through `driftless tick`,
//! `plan --json` and `policy test|eval`. The policy files are the ones in
//! `tests/fixtures/policies/`, copied beside the configuration (never in
//! the repository).

use crate::common::*;

const TF: &str = r#"
variable "greeting" {
  type = string
}

resource "terraform_data" "a" {
  input = var.greeting
}

resource "terraform_data" "b" {
  input = "b"
}
"#;

const TF_WITHOUT_B: &str = r#"
variable "greeting" {
  type = string
}

resource "terraform_data" "a" {
  input = var.greeting
}
"#;

/// The fixture policy `name` (a file under tests/fixtures/policies/).
fn fixture(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/policies")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A policy directory beside the configuration holding `files`.
fn policy_dir(root: &std::path::Path, files: &[(&str, String)]) -> std::path::PathBuf {
    let dir = root.join("policy");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for (n, t) in files {
        std::fs::write(dir.join(n), t).expect("write policy");
    }
    dir
}

/// `doc` checked against docs/schemas/plan-document.json by a real
/// JSON-Schema validator (PyPI's check-jsonschema).
fn assert_matches_the_schema(dir: &std::path::Path, doc: &serde_json::Value) {
    let file = dir.join("document.json");
    std::fs::write(&file, doc.to_string()).expect("write");
    let schema =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schemas/plan-document.json");
    let out = std::process::Command::new("check-jsonschema")
        .arg("--schemafile")
        .arg(&schema)
        .arg(&file)
        .output()
        .expect("check-jsonschema (tests/run.sh installs it)");
    assert!(
        out.status.success(),
        "the plan document does not match its schema:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

fn terraform_setup(remote: &Remote, policies: &str) -> Setup {
    Setup::new(&format!(
        "[[targets]]\nname = \"prod-net\"\nrepo = \"{}\"\npath = \"network\"\ntimeout = \"2m\"\n\
         interval = \"1h\"\n\
         [targets.backend]\nkind = \"terraform\"\nvar_files = [\"prod.tfvars\"]\n\
         env = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n\n{policies}",
        remote.url()
    ))
}

fn tick(s: &Setup, target: &str) -> (Option<i32>, String) {
    let out = s.run(&["tick", target]);
    (out.status.code(), text(&out.stdout) + &text(&out.stderr))
}

fn state_list(s: &Setup, target: &str) -> String {
    let out = std::process::Command::new("terraform")
        .args(["state", "list"])
        .current_dir(s.checkout(target).join("network"))
        .env("TF_CLI_CONFIG_FILE", "/dev/null")
        .output()
        .expect("terraform state list");
    text(&out.stdout)
}

/// `prod-net` (terraform) at a first commit, under policy `no-deletes`
/// whose `files` is `files` in a directory holding no_deletes.rego: the
/// tempdir, that directory, the remote, the commit, the setup.
fn no_deletes_world(files: &str) -> (tempfile::TempDir, std::path::PathBuf, Remote, String, Setup) {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = policy_dir(
        root.path(),
        &[("no_deletes.rego", fixture("no_deletes.rego"))],
    );
    let remote = Remote::new(root.path(), "infra");
    let first = remote.commit(
        &[
            ("network/main.tf", TF),
            ("network/prod.tfvars", "greeting = \"hello\"\n"),
        ],
        "first",
    );
    let s = terraform_setup(
        &remote,
        &format!(
            "[[policies]]\nname = \"no-deletes\"\nfiles = [\"{}/{files}\"]\n",
            dir.display()
        ),
    );
    (root, dir, remote, first, s)
}

#[test]
fn an_auto_terraform_target_is_planned_judged_and_only_what_passes_is_applied() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = policy_dir(
        root.path(),
        &[
            ("no_deletes.rego", fixture("no_deletes.rego")),
            ("approve_updates.rego", fixture("approve_updates.rego")),
        ],
    );
    let remote = Remote::new(root.path(), "infra");
    // The repository ships a policy that would deny everything: it must
    // change nothing (a repository never judges itself).
    let first = remote.commit(
        &[
            ("network/main.tf", TF),
            ("network/prod.tfvars", "greeting = \"hello\"\n"),
            (
                "network/deny_all.rego",
                "package main\n\ndeny contains \"from the repository\" if true\n",
            ),
            (
                "policy/deny_all.rego",
                "package main\n\ndeny contains \"from the repository\" if true\n",
            ),
        ],
        "first",
    );
    let s = terraform_setup(
        &remote,
        &format!(
            "[[policies]]\nname = \"no-deletes\"\nfiles = [\"{}/no_deletes.rego\"]\ntargets = [\"prod-*\"]\n\n\
             [[policies]]\nname = \"approve-updates\"\nfiles = [\"{}/approve_*.rego\"]\npackage = \"driftless.approvals\"\n",
            dir.display(),
            dir.display()
        ),
    );
    let check = s.run(&["check"]);
    let said = text(&check.stdout) + &text(&check.stderr);
    assert!(check.status.success(), "{said}");
    assert!(
        said.contains("policies[no-deletes]: 1 file(s), package main; covers prod-net"),
        "{said}"
    );

    // Creations pass, with the warning on the run.
    let (code, out) = tick(&s, "prod-net");
    assert_eq!(code, Some(0), "{out}");
    let st = s.target_status("prod-net");
    assert_eq!(st["last_result"], "changed", "{st}");
    assert_eq!(st["last_applied_sha"], first, "{st}");
    let msg = st["last_message"].as_str().unwrap_or("");
    assert!(
        msg.contains("policy `no-deletes` warns: 2 resource(s) created"),
        "{st}"
    );
    assert!(!msg.contains("from the repository"), "{st}");
    assert_eq!(state_list(&s, "prod-net").lines().count(), 2);

    // A delete is denied: nothing applied, the run failed naming the policy.
    let second = remote.commit(&[("network/main.tf", TF_WITHOUT_B)], "drop b");
    let (code, out) = tick(&s, "prod-net");
    assert_ne!(code, Some(0), "{out}");
    let st = s.target_status("prod-net");
    assert_eq!(st["last_result"], "failed", "{st}");
    assert_eq!(st["last_applied_sha"], first, "{st}");
    let msg = st["last_message"].as_str().unwrap_or("");
    assert!(
        msg.contains("denied by policy `no-deletes`: terraform_data.b would be deleted")
            && msg.contains("nothing applied"),
        "{st}"
    );
    assert!(state_list(&s, "prod-net").contains("terraform_data.b"));
    let rows = sql_rows(
        &s.db(),
        "SELECT state, decided_by, commit_sha FROM deployments WHERE target = 'prod-net' ORDER BY id",
    );
    let last = rows.last().expect("a deployment row");
    assert_eq!(last["state"], "failed", "{rows:?}");
    assert_eq!(last["decided_by"], "policy", "{rows:?}");
    assert_eq!(last["commit_sha"], second.as_str(), "{rows:?}");
    // Ticking again at the same commit applies nothing and says so.
    let (code, _) = tick(&s, "prod-net");
    assert_ne!(code, Some(0));
    assert!(state_list(&s, "prod-net").contains("terraform_data.b"));

    // The next allowed commit applies.
    let third = remote.commit(&[("network/main.tf", TF)], "keep b after all");
    let (code, out) = tick(&s, "prod-net");
    assert_eq!(code, Some(0), "{out}");
    let st = s.target_status("prod-net");
    assert_eq!(st["last_applied_sha"], third, "{st}");

    // An update asks for a person: the auto target's plan waits.
    remote.commit(
        &[("network/prod.tfvars", "greeting = \"bonjour\"\n")],
        "bonjour",
    );
    let (code, out) = tick(&s, "prod-net");
    assert_eq!(code, Some(0), "{out}");
    let st = s.target_status("prod-net");
    assert_eq!(st["last_applied_sha"], third, "{st}");
    let msg = st["last_message"].as_str().unwrap_or("");
    assert!(
        msg.contains("waits for approval")
            && msg.contains(
                "policy `approve-updates` requires approval: terraform_data.a changes in place"
            ),
        "{st}"
    );
    let rows = sql_rows(
        &s.db(),
        "SELECT id, state FROM deployments WHERE target = 'prod-net' ORDER BY id DESC LIMIT 1",
    );
    assert_eq!(rows[0]["state"], "pending_approval", "{rows:?}");
    let waiting = rows[0]["id"].clone();

    // The policies change on the controller: the waiting plan is what
    // they were made from no longer, so it is superseded and judged again.
    std::fs::write(
        dir.join("approve_updates.rego"),
        fixture("approve_updates.rego") + "\n# reviewed\n",
    )
    .expect("write");
    let (code, out) = tick(&s, "prod-net");
    assert_eq!(code, Some(0), "{out}");
    let rows = sql_rows(
        &s.db(),
        "SELECT id, state, message FROM deployments WHERE target = 'prod-net' ORDER BY id DESC LIMIT 2",
    );
    assert_eq!(rows[1]["id"], waiting, "{rows:?}");
    assert_eq!(rows[1]["state"], "superseded", "{rows:?}");
    assert!(
        rows[1]["message"]
            .as_str()
            .is_some_and(|m| m.contains("the policies in force changed")),
        "{rows:?}"
    );
    assert_eq!(rows[0]["state"], "pending_approval", "{rows:?}");
    assert_eq!(s.target_status("prod-net")["last_applied_sha"], third);

    // The person asked sees why on the plan's card, on the target's page
    // and on the front page.
    const VIEWER: &str = "dl_viewer-policies-5c1e";
    let cfg = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(&s.config, cfg + &token_table("viewer", VIEWER, &["read"])).expect("config");
    let d = s.serve();
    for path in ["/targets/prod-net", "/"] {
        let r = http(
            d.port,
            "GET",
            path,
            &[("Authorization", &format!("Bearer {VIEWER}"))],
            b"",
        );
        let page = r.body;
        assert_eq!(r.status, 200, "{page}");
        // On the card with the plan and its buttons, not only in the row.
        let card = page
            .split_once(&format!("id=\"deployment-{}\"", rows[0]["id"]))
            .and_then(|(_, card)| card.split_once("</div>"))
            .map(|(card, _)| card)
            .unwrap_or_else(|| panic!("{path}: no card for the plan: {page}"));
        assert!(
            card.contains(
                "policy `approve-updates` requires approval: terraform_data.a changes in place"
            ),
            "{path}: {card}"
        );
    }
    d.stop();
}

#[test]
fn a_policy_that_does_not_parse_fails_closed_and_its_fix_applies() {
    let (_root, dir, _remote, first, s) = no_deletes_world("*.rego");
    std::fs::write(
        dir.join("broken.rego"),
        "package main\n\ndeny contains msg if {\n  msg := \n}\n",
    )
    .expect("write");
    let check = s.run(&["check"]);
    let said = text(&check.stdout) + &text(&check.stderr);
    assert!(!check.status.success(), "{said}");
    assert!(said.contains("broken.rego:4:"), "{said}");

    let (code, out) = tick(&s, "prod-net");
    assert_ne!(code, Some(0), "{out}");
    let st = s.target_status("prod-net");
    assert_eq!(st["last_result"], "failed", "{st}");
    assert!(st["last_applied_sha"].is_null(), "{st}");
    let msg = st["last_message"].as_str().unwrap_or("");
    assert!(
        msg.contains("policy `no-deletes`")
            && msg.contains("broken.rego:4:")
            && msg.contains("nothing applied"),
        "{st}"
    );
    assert_eq!(state_list(&s, "prod-net").trim(), "");

    // Fixed on the controller: the next tick evaluates again and applies.
    std::fs::remove_file(dir.join("broken.rego")).expect("rm");
    let (code, out) = tick(&s, "prod-net");
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(s.target_status("prod-net")["last_applied_sha"], first);
}

#[test]
fn plan_json_prints_the_document_and_policy_commands_judge_it() {
    let (root, dir, remote, _, s) = no_deletes_world("no_deletes.rego");
    let (code, out) = tick(&s, "prod-net");
    assert_eq!(code, Some(0), "{out}");
    remote.commit(&[("network/main.tf", TF_WITHOUT_B)], "drop b");

    let out = s.run(&["plan", "--json", "prod-net"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plan --json");
    let doc = &v["document"];
    assert_eq!(doc["version"], 1, "{doc}");
    assert_eq!(doc["backend"], "terraform", "{doc}");
    assert_eq!(
        doc["files_changed"],
        serde_json::json!(["network/main.tf"]),
        "{doc}"
    );
    assert_eq!(doc["inputs"], serde_json::json!({}), "{doc}");
    let changes = doc["changes"].as_array().expect("changes");
    let b = changes
        .iter()
        .find(|c| c["address"] == "terraform_data.b")
        .expect("b in changes");
    assert_eq!(b["action"], "delete", "{doc}");
    assert_eq!(b["type"], "terraform_data", "{doc}");
    assert_eq!(b["before"]["input"], "b", "{doc}");
    assert!(doc["resource_changes"].is_array(), "{doc}");
    assert_matches_the_schema(root.path(), doc);
    assert_eq!(doc["resource_changes"], doc["raw"]["resource_changes"]);
    assert!(
        v["policies"]["deny"][0]["message"] == "terraform_data.b would be deleted",
        "{v}"
    );
    // Nothing was applied by planning.
    assert!(state_list(&s, "prod-net").contains("terraform_data.b"));

    // The recorded document, judged again offline.
    let recorded = root.path().join("plan.json");
    std::fs::write(&recorded, &out.stdout).expect("write");
    let out = s.run(&[
        "policy",
        "eval",
        "prod-net",
        "--input",
        recorded.to_str().expect("utf8"),
    ]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("deny: policy `no-deletes`: terraform_data.b would be deleted"),
        "{said}"
    );

    // The policy's own tests.
    let out = s.run(&["policy", "test"]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("PASS no-deletes: test_a_delete_is_denied")
            && said.contains("PASS no-deletes: test_a_create_passes")
            && said.contains("2 passed, 0 failed"),
        "{said}"
    );
    std::fs::write(
        dir.join("no_deletes.rego"),
        fixture("no_deletes.rego").replace("count(deny) == 0", "count(deny) == 1"),
    )
    .expect("write");
    let out = s.run(&["policy", "test", "no-deletes"]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("FAIL no-deletes: test_a_create_passes"),
        "{said}"
    );
}

const COMPOSE: &str = r#"services:
  web:
    image: IMAGE
    command: ["sh", "-c", "sleep 3600"]
    network_mode: none
"#;

/// "No image tag `latest`" on a compose target on a real dockerd: the
/// service's model (`config --format json`) is the change's `after`.
#[test]
fn a_compose_service_on_latest_is_denied_and_the_pinned_one_applies() {
    let root = tempfile::tempdir().expect("tempdir");
    let docker = Dockerd::start(root.path());
    let tagged = docker.docker(&["tag", TEST_IMAGE, "driftless-test/busybox:latest"]);
    assert!(tagged.status.success(), "{}", text(&tagged.stderr));
    let dir = policy_dir(
        root.path(),
        &[("no_latest.rego", fixture("no_latest.rego"))],
    );
    let remote = Remote::new(root.path(), "infra");
    let first = remote.commit(
        &[("app/compose.yaml", &COMPOSE.replace("IMAGE", TEST_IMAGE))],
        "pinned",
    );
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"app\"\nrepo = \"{}\"\npath = \"app\"\ninterval = \"1h\"\n\
         [targets.backend]\nkind = \"compose\"\ncommand = \"docker-compose\"\nhost = \"{}\"\n\n\
         [[policies]]\nname = \"no-latest\"\nfiles = [\"{}/no_latest.rego\"]\n",
        remote.url(),
        docker.host,
        dir.display()
    ));
    let (code, out) = tick(&s, "app");
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(s.target_status("app")["last_applied_sha"], first);
    let image = |d: &Dockerd| {
        text(
            &d.docker(&[
                "ps",
                "--filter",
                "label=com.docker.compose.project=app",
                "--format",
                "{{.Image}}",
            ])
            .stdout,
        )
        .trim()
        .to_string()
    };
    assert_eq!(image(&docker), TEST_IMAGE);

    remote.commit(
        &[(
            "app/compose.yaml",
            &COMPOSE.replace("IMAGE", "driftless-test/busybox:latest"),
        )],
        "latest",
    );
    let (code, out) = tick(&s, "app");
    assert_ne!(code, Some(0), "{out}");
    let st = s.target_status("app");
    assert_eq!(st["last_result"], "failed", "{st}");
    assert_eq!(st["last_applied_sha"], first, "{st}");
    assert!(
        st["last_message"].as_str().unwrap_or("").contains(
            "denied by policy `no-latest`: service web: image driftless-test/busybox:latest floats"
        ),
        "{st}"
    );
    assert_eq!(image(&docker), TEST_IMAGE, "the denied image was applied");

    let third = remote.commit(
        &[(
            "app/compose.yaml",
            &COMPOSE
                .replace("IMAGE", TEST_IMAGE)
                .replace("sleep 3600", "sleep 3601"),
        )],
        "pinned again",
    );
    let (code, out) = tick(&s, "app");
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(s.target_status("app")["last_applied_sha"], third);
}

/// Policies × verify: a target that verifies signatures gives the policy
/// who signed the commit (`input.signer`, from the verification — noted, so
/// a commit verified before reads the same), and a policy can let only one
/// of the listed signers through. Real ssh-keygen signatures.
#[test]
fn a_policy_reads_who_signed_the_commit() {
    let root = tempfile::tempdir().expect("tempdir");
    let (alice, alice_pub) = ssh_key(root.path(), "alice");
    let (bob, bob_pub) = ssh_key(root.path(), "bob");
    let allowed = root.path().join("allowed_signers");
    std::fs::write(
        &allowed,
        format!("alice@example.net {alice_pub}\nbob@example.net {bob_pub}\n"),
    )
    .expect("allowed signers");
    let dir = policy_dir(
        root.path(),
        &[(
            "alice.rego",
            "package main\n\nimport rego.v1\n\n\
             deny contains msg if {\n\tinput.signer.name != \"alice@example.net\"\n\
             \tmsg := sprintf(\"only alice may change this, not %s (%s)\", [input.signer.name, input.signer.key])\n}\n\n\
             deny contains \"no signer\" if not input.signer.name\n"
                .to_string(),
        )],
    );
    let remote = Remote::new(root.path(), "infra");
    let log = root.path().join("applies.log");
    let sink = Service::http_sink(root.path(), 0);
    let s = Setup::new(&format!(
        "[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\n\
         {}\n[targets.verify]\nallowed_signers_file = {}\n\n\
         [[policies]]\nname = \"alice-only\"\nfiles = [\"{}/alice.rego\"]\n",
        sink.port,
        exec_target(
            "app",
            &remote.url(),
            "interval = \"1h\"\nnotify = [\"hook\"]",
            &format!(
                "plan = [\"sh\", \"-c\", \"echo \\\"~ app.v $(cat v)\\\"\"]\n\
                 apply = [\"sh\", \"-c\", \"cat v >> {}\"]",
                log.display()
            ),
        ),
        toml_str(&allowed.display().to_string()),
        dir.display()
    ));
    let by = |key: &std::path::Path| {
        [
            "gpg.format=ssh".to_string(),
            format!("user.signingkey={}", key.display()),
        ]
    };
    let sign = |files: &[(&str, &str)], key: &std::path::Path| {
        let c = by(key);
        remote.commit_signed(files, "signed", &[&c[0], &c[1]], &[])
    };

    let first = sign(&[("v", "1\n")], &alice);
    let (code, said) = tick(&s, "app");
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(log_lines(&log), ["1"], "{said}");
    assert_eq!(s.target_status("app")["last_applied_sha"], first.as_str());
    // No person approved it: the run says it was applied unattended.
    let run = &s.history("app")[0];
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| m.contains(", applied unattended): ") && !m.contains("approved")),
        "{run}"
    );

    // Bob is a listed signer (verify passes) but not the one the policy
    // lets through: denied, naming him and his key; nothing applied.
    let second = sign(&[("v", "2\n")], &bob);
    let (code, said) = tick(&s, "app");
    assert_eq!(code, Some(1), "{said}");
    let run = &s.history("app")[0];
    let msg = run["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("denied by policy `alice-only`: only alice may change this, not bob@example.net (SHA256:"),
        "{run}"
    );
    assert_eq!(log_lines(&log), ["1"], "a denied plan was applied");
    // The owners are told, with the policy's words.
    wait_for(
        std::time::Duration::from_secs(30),
        "the failure told",
        || {
            sink.requests().iter().any(|r| {
                serde_json::from_str::<serde_json::Value>(r["body"].as_str().unwrap_or(""))
                    .is_ok_and(|d| {
                        d["event"] == "failed"
                            && d["message"].as_str().is_some_and(|m| {
                                m.contains(
                                    "denied by policy `alice-only`: only alice may change this",
                                )
                            })
                    })
            })
        },
    );

    // The verification of bob's commit is noted: `plan --json` does not
    // verify again, and the document still names him, in the schema.
    let out = s.run(&["plan", "--json", "app"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("plan --json: {e}: {}", text(&out.stderr)));
    let doc = &v["document"];
    assert_eq!(doc["commit"], second.as_str(), "{v}");
    assert_eq!(doc["signer"]["name"], "bob@example.net", "{v}");
    assert_eq!(doc["signer"]["on"], "commit", "{v}");
    assert!(
        doc["signer"]["key"]
            .as_str()
            .is_some_and(|k| k.starts_with("SHA256:")),
        "{v}"
    );
    assert_matches_the_schema(root.path(), doc);

    // Alice signs the next: applied.
    sign(&[("v", "3\n")], &alice);
    let (code, said) = tick(&s, "app");
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(log_lines(&log), ["1", "3"], "{said}");
}
