//! The pulumi backend against `tests/pulumi_standin.py`, a stand-in for the
//! Pulumi CLI 3.x (which cannot be installed here): real argument building,
//! real parsing of the streamed engine events, a file:// backend.

use std::path::{Path, PathBuf};

use crate::common::*;
use serde_json::Value;

const PASSPHRASE: &str = "canary-pulumi-passphrase-31d9";

fn program(size: u32, extra: &str) -> String {
    format!(
        "name: site\nruntime: yaml\nresources:\n  bucket:\n    type: test:index:Bucket\n    properties:\n      name: site-${{pulumi.stack}}\n      size: {size}\n{extra}outputs:\n  bucketName: ${{bucket.name}}\n"
    )
}

fn standin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pulumi_standin.py")
}

struct Fx {
    root: tempfile::TempDir,
    remote: Remote,
    s: Setup,
    backend: PathBuf,
    log: PathBuf,
}

fn fixture(extra_backend: &str) -> Fx {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("stack/Pulumi.yaml", &program(1, ""))], "site");
    let backend = root.path().join("pulumi-state");
    std::fs::create_dir_all(&backend).expect("mkdir");
    let log = root.path().join("pulumi-calls.jsonl");
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"site\"\nrepo = \"{}\"\npath = \"stack\"\ntimeout = \"1m\"\n\
         [targets.backend]\nkind = \"pulumi\"\nstack = \"prod\"\nbinary = {}\n\
         env = {{ PULUMI_BACKEND_URL = \"file://{}\", PULUMI_CONFIG_PASSPHRASE = \"env:TEST_PULUMI_PASSPHRASE\", PULUMI_STANDIN_LOG = {}, HOME = {} }}\n{extra_backend}\n",
        remote.url(),
        toml_str(&standin().display().to_string()),
        backend.display(),
        toml_str(&log.display().to_string()),
        toml_str(&root.path().display().to_string()),
    ));
    Fx {
        root,
        remote,
        s,
        backend,
        log,
    }
}

impl Fx {
    /// `driftless <args>` with the passphrase in the environment, at
    /// debug level.
    fn run(&self, args: &[&str]) -> std::process::Output {
        output_within(
            std::process::Command::new(bin())
                .args(["--config", self.s.config.to_str().expect("utf8")])
                .args(args)
                .env("TEST_PULUMI_PASSPHRASE", PASSPHRASE)
                .env("RUST_LOG", "debug"),
            std::time::Duration::from_secs(300),
        )
    }

    fn tick(&self) -> (Option<i32>, String) {
        let out = output_within(
            std::process::Command::new(bin())
                .args([
                    "--config",
                    self.s.config.to_str().expect("utf8"),
                    "tick",
                    "site",
                ])
                .env("TEST_PULUMI_PASSPHRASE", PASSPHRASE)
                .env("RUST_LOG", "debug"),
            std::time::Duration::from_secs(300),
        );
        (out.status.code(), text(&out.stdout) + &text(&out.stderr))
    }

    fn status(&self) -> (String, String) {
        let st = self.s.target_status("site");
        (
            st["last_result"].as_str().unwrap_or("").to_string(),
            st["last_message"].as_str().unwrap_or("").to_string(),
        )
    }

    fn cloud(&self) -> Value {
        std::fs::read_to_string(self.backend.join("cloud.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null)
    }

    fn calls(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).expect("json")["argv"]
                    .as_array()
                    .expect("argv")
                    .iter()
                    .map(|a| a.as_str().unwrap_or("").to_string())
                    .collect()
            })
            .collect()
    }
}

const URN: &str = "urn:pulumi:prod::site::test:index:Bucket::bucket";

#[test]
fn pulumi_lifecycle_with_refresh_catching_drift() {
    let f = fixture("");
    let mut logs = String::new();
    let (code, out) = f.tick();
    logs += &out;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.status(), ("changed".into(), "pulumi up: 1 create".into()));
    assert_eq!(f.cloud()[URN]["size"], 1);
    // The stack was selected (created) first, then up with every flag.
    let calls = f.calls();
    assert_eq!(
        calls[0],
        [
            "stack",
            "select",
            "--create",
            "--non-interactive",
            "--stack",
            "prod"
        ]
    );
    assert_eq!(
        calls[1],
        [
            "up",
            "--yes",
            "--skip-preview",
            "--non-interactive",
            "--json",
            "--stack",
            "prod",
            "--refresh"
        ]
    );

    let (code, out) = f.tick();
    logs += &out;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.status(), ("no_change".into(), "pulumi up: 1 same".into()));

    let bigger = f
        .remote
        .commit(&[("stack/Pulumi.yaml", &program(2, ""))], "bigger");
    let (code, out) = f.tick();
    logs += &out;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.status(), ("changed".into(), "pulumi up: 1 update".into()));

    // Someone changes the bucket behind Pulumi's back: refresh notices and
    // up puts it back.
    let mut cloud = f.cloud();
    cloud[URN]["size"] = Value::from(99);
    std::fs::write(f.backend.join("cloud.json"), cloud.to_string()).expect("write");
    let (code, out) = f.tick();
    logs += &out;
    assert_eq!(code, Some(0), "{out}");
    // driftless's part: it asked for the refresh, and reports the drift
    // repaired as the update it was, at the commit it applied.
    assert_eq!(f.status(), ("changed".into(), "pulumi up: 1 update".into()));
    let ups: Vec<Vec<String>> = f.calls().into_iter().filter(|c| c[0] == "up").collect();
    assert_eq!(ups.len(), 4, "{ups:?}");
    for c in &ups {
        assert_eq!(c.iter().filter(|a| *a == "--refresh").count(), 1, "{c:?}");
    }
    let last = &f.s.history("site")[0];
    assert_eq!(last["sha"], bigger, "{last}");
    assert_eq!(last["result"], "changed", "{last}");
    // And with nothing drifted the next up is `same` again.
    let (code, out) = f.tick();
    logs += &out;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.status(), ("no_change".into(), "pulumi up: 1 same".into()));

    let out = f.run(&["outputs", "site", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let o: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(o["bucketName"], "site-prod");

    let out = f.run(&["destroy", "site", "--yes"]);
    logs += &text(&out.stdout);
    logs += &text(&out.stderr);
    assert!(out.status.success(), "{logs}");
    assert_eq!(f.cloud(), serde_json::json!({}));
    assert!(
        f.calls()
            .iter()
            .any(|c| c[0] == "destroy" && c.contains(&"--yes".to_string()))
    );
    let history = serde_json::to_string(&f.s.history("site")).expect("json");
    assert!(!logs.contains(PASSPHRASE) && !history.contains(PASSPHRASE));
}

#[test]
fn without_refresh_drift_goes_unnoticed() {
    // Why `refresh = true` is the default: the same drift as above, and
    // Pulumi reports nothing to do.
    let f = fixture("refresh = false");
    assert_eq!(f.tick().0, Some(0));
    let mut cloud = f.cloud();
    cloud[URN]["size"] = Value::from(99);
    std::fs::write(f.backend.join("cloud.json"), cloud.to_string()).expect("write");
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.status(), ("no_change".into(), "pulumi up: 1 same".into()));
    // driftless's part: `refresh = false` leaves the flag off every up.
    let ups: Vec<Vec<String>> = f.calls().into_iter().filter(|c| c[0] == "up").collect();
    assert_eq!(ups.len(), 2, "{ups:?}");
    for c in &ups {
        assert!(!c.iter().any(|a| a == "--refresh"), "{c:?}");
    }
}

#[test]
fn a_failing_resource_fails_with_the_diagnostic() {
    let f = fixture("");
    f.remote.commit(
        &[(
            "stack/Pulumi.yaml",
            &program(1, "  quota:\n    type: test:index:Bucket\n    properties:\n      fail: \"quota exceeded for project site\"\n"),
        )],
        "over quota",
    );
    let (code, out) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    let (result, msg) = f.status();
    assert_eq!(result, "failed");
    // Pulumi (since 3.227) exits 1 for a failed update; the engine's
    // colour markup never reaches the message.
    assert!(
        msg.contains("quota: quota exceeded for project site")
            && msg.contains("exited with code 1"),
        "{msg}"
    );
    assert!(!msg.contains("<{%"), "colour markup in {msg}");
}

/// The lock files of stack `prod` of project `site`, where the DIY backend
/// keeps them.
fn locks(f: &Fx) -> Vec<PathBuf> {
    let dir = f.backend.join(".pulumi/locks/organization/site/prod");
    std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[test]
fn a_stack_lock_left_by_a_killed_up_is_reported_and_never_deleted() {
    let f = fixture("");
    assert_eq!(f.tick().0, Some(0));
    // An update that takes long; Pulumi is killed in the middle of it.
    f.remote.commit(
        &[(
            "stack/Pulumi.yaml",
            &program(2, "").replace("      size: 2\n", "      size: 2\n      sleep: 60\n"),
        )],
        "slow",
    );
    let mut tick = std::process::Command::new(bin())
        .args([
            "--config",
            f.s.config.to_str().expect("utf8"),
            "tick",
            "site",
        ])
        .env("TEST_PULUMI_PASSPHRASE", PASSPHRASE)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tick");
    // The lock file, once Pulumi has written it whole.
    let read_lock = || -> Option<Value> {
        let path = locks(&f).into_iter().next()?;
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
    };
    wait_for(
        std::time::Duration::from_secs(20),
        "the stack's lock",
        || read_lock().is_some(),
    );
    let lock = read_lock().expect("lock");
    let pid = lock["pid"].as_i64().expect("pid");
    // SAFETY: kill(2) on the stand-in's pid, which this test just read.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    assert_eq!(tick.wait().expect("wait").code(), Some(1));
    assert_eq!(locks(&f).len(), 1, "the killed update's lock is left");

    f.remote
        .commit(&[("stack/Pulumi.yaml", &program(3, ""))], "fast again");
    let (code, out) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    let (_, msg) = f.status();
    for want in [
        "stack `prod` is locked by another Pulumi update".to_string(),
        format!("(pid {pid}) since "),
        "`pulumi cancel --yes --stack prod`".to_string(),
    ] {
        assert!(msg.contains(&want), "{want:?} missing: {msg}");
    }
    assert_eq!(locks(&f).len(), 1, "driftless deleted a stack lock");

    // A person clears it, in their own clone of the project; the next tick
    // goes on.
    let clone = f.root.path().join("clone");
    std::fs::create_dir_all(&clone).expect("mkdir");
    std::fs::write(clone.join("Pulumi.yaml"), program(3, "")).expect("write");
    let out = std::process::Command::new(standin())
        .args(["cancel", "--yes", "--non-interactive", "--stack", "prod"])
        .current_dir(&clone)
        .env(
            "PULUMI_BACKEND_URL",
            format!("file://{}", f.backend.display()),
        )
        .output()
        .expect("pulumi cancel");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.cloud()[URN]["size"], 3);
}

#[test]
fn a_passphrase_stack_without_its_passphrase_names_the_variables() {
    let f = fixture("");
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    let without = cfg.replace(
        "PULUMI_CONFIG_PASSPHRASE = \"env:TEST_PULUMI_PASSPHRASE\", ",
        "",
    );
    assert_ne!(cfg, without);
    std::fs::write(&f.s.config, &without).expect("write");
    let (code, _) = f.tick();
    assert_eq!(code, Some(1));
    let (_, msg) = f.status();
    assert!(
        msg.contains("passphrase must be set")
            && msg.contains("PULUMI_CONFIG_PASSPHRASE_FILE = \"/path/to/a/file\"")
            && msg.contains("in the target's backend `env`"),
        "{msg}"
    );
    // From a file, as the README suggests.
    let file = f.root.path().join("passphrase");
    std::fs::write(&file, format!("{PASSPHRASE}\n")).expect("write");
    std::fs::write(
        &f.s.config,
        without.replace(
            "env = { ",
            &format!(
                "env = {{ PULUMI_CONFIG_PASSPHRASE_FILE = {}, ",
                toml_str(&file.display().to_string())
            ),
        ),
    )
    .expect("write");
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn missing_login_or_binary_is_named() {
    let f = fixture("");
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    let no_login = cfg.replace(
        &format!("PULUMI_BACKEND_URL = \"file://{}\", ", f.backend.display()),
        "",
    );
    assert_ne!(cfg, no_login);
    std::fs::write(&f.s.config, &no_login).expect("write");
    let (code, _) = f.tick();
    assert_eq!(code, Some(1));
    let (_, msg) = f.status();
    assert!(
        msg.contains("no backend login") && msg.contains("PULUMI_BACKEND_URL"),
        "{msg}"
    );

    let missing = f.root.path().join("no-such-pulumi");
    std::fs::write(
        &f.s.config,
        cfg.replace(
            &toml_str(&standin().display().to_string()),
            &toml_str(&missing.display().to_string()),
        ),
    )
    .expect("write");
    let (code, _) = f.tick();
    assert_eq!(code, Some(1));
    let (_, msg) = f.status();
    assert!(msg.contains("no-such-pulumi"), "{msg}");
    let out = f.run(&["check"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stdout).contains("no-such-pulumi")
            || text(&out.stderr).contains("no-such-pulumi")
    );
}

/// `policy = "approve_destructive"` on a Pulumi stack: the plan is `preview
/// --json`; creates and updates are applied unattended (after a second
/// preview to the same hash), a replacement waits for a person, a preview
/// that changed since it was approved (the cloud edited behind Pulumi's
/// back, seen through --refresh) runs no `up`, a stale approval is refused
/// and a newer commit supersedes the waiting plan, and `driftless retry` makes
/// a new plan that is applied once approved.
#[test]
fn a_pulumi_replacement_waits_and_a_changed_preview_is_not_applied() {
    const OPS: &str = "ops-token-pulumi-8f02";
    let f = fixture("");
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    let cfg = cfg.replacen(
        "[targets.backend]",
        "policy = \"approve_destructive\"\ninterval = \"1h\"\n[targets.backend]",
        1,
    ) + &token_table("ops", OPS, &["approve:site", "read"]);
    std::fs::write(&f.s.config, cfg).expect("config");
    let replace_on_name = "    options:\n      replaceOnChanges: [name]\n";
    f.remote.commit(
        &[("stack/Pulumi.yaml", &program(1, replace_on_name))],
        "replace on name",
    );
    let intake = Intake::start(&f.s);
    let who = Approver {
        port: intake.port,
        token: OPS,
    };
    let pending = || who.pending();
    let approve = |p: &Value| {
        who.approve(p);
    };
    let ups = || f.calls().iter().filter(|c| c[0] == "up").count();

    // A create: applied unattended, after previewing twice.
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("pulumi up: 1 create"), "{out}");
    let previews = f.calls().iter().filter(|c| c[0] == "preview").count();
    assert_eq!((previews, ups()), (2, 1), "{:?}", f.calls());
    // An update: unattended too.
    f.remote.commit(
        &[("stack/Pulumi.yaml", &program(2, replace_on_name))],
        "size 2",
    );
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.cloud()[URN]["size"], 2);

    // A rename replaces the bucket: it waits.
    let renamed =
        program(2, replace_on_name).replace("site-${pulumi.stack}", "www-${pulumi.stack}");
    f.remote
        .commit(&[("stack/Pulumi.yaml", &renamed)], "rename");
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let p = pending();
    assert_eq!(
        (&p[0]["backend"], &p[0]["destructive"], &p[0]["diff"]),
        (
            &"pulumi".into(),
            &true.into(),
            &"-/+ bucket (test:index:Bucket, replace)".into()
        ),
        "{p:?}"
    );
    assert_eq!(ups(), 2, "a replacement ran unattended");
    assert_eq!(f.cloud()[URN]["name"], "site-prod");
    let newer = who.refuses_stale_and_supersedes(
        || {
            f.remote.commit(
                &[(
                    "stack/Pulumi.yaml",
                    &program(3, replace_on_name)
                        .replace("site-${pulumi.stack}", "www-${pulumi.stack}"),
                )],
                "rename, size 3",
            );
        },
        || {
            let (code, out) = f.tick();
            assert_eq!(code, Some(0), "{out}");
        },
    );
    assert_eq!(ups(), 2, "an up ran before approval");

    // The cloud is edited by hand before the approval is acted on.
    let mut cloud = f.cloud();
    cloud[URN]["size"] = 9.into();
    std::fs::write(f.backend.join("cloud.json"), cloud.to_string()).expect("write");
    approve(&newer);
    let (code, out) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("the plan changed since it was approved"),
        "{out}"
    );
    assert_eq!(ups(), 2, "an up ran for a plan nobody approved");
    assert_eq!(f.cloud()[URN]["size"], 9);

    let out = f.run(&["retry", "site"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let p = pending();
    assert_eq!(p.len(), 1, "{p:?}");
    approve(&p[0]);
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        (&f.cloud()[URN]["name"], &f.cloud()[URN]["size"]),
        (&"www-prod".into(), &3.into())
    );
    assert!(!out.contains(PASSPHRASE));
    who.assert_plans_keep_out(&f.s, PASSPHRASE);
}

/// `policy = "detect"` on a Pulumi stack: every tick previews, records what
/// `up` would do as the target's drift, and never runs `up`.
#[test]
fn a_pulumi_detect_target_previews_and_never_runs_up() {
    let f = fixture("");
    f.s.target_keys("policy = \"detect\"\ninterval = \"1h\"");
    for _ in 0..2 {
        let (code, out) = f.tick();
        assert_eq!(code, Some(0), "{out}");
    }
    assert_detected(&f.s, "site", "+ bucket (test:index:Bucket, create)");
    assert!(
        !f.calls().iter().any(|c| c[0] == "up"),
        "detect ran up: {:?}",
        f.calls()
    );
    assert!(f.cloud()[URN].is_null(), "{}", f.cloud());
}

/// The real `pulumi preview --json` is not byte-stable (new states carry
/// `created`/`modified` set at preview time; independent resources' steps
/// come in the order the parallel step executor emits them), and the
/// stand-in is not either: an approved preview of an unchanged program
/// still holds when the apply previews again, and the root stack resource
/// is no change of its own.
#[test]
fn a_pulumi_approval_holds_across_previews_that_differ_only_in_time_and_order() {
    const OPS: &str = "ops-token-pulumi-5c1e";
    let f = fixture("");
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    let cfg = cfg.replacen(
        "[targets.backend]",
        "policy = \"approval\"\ninterval = \"1h\"\n[targets.backend]",
        1,
    ) + &token_table("ops", OPS, &["approve:site", "read"]);
    std::fs::write(&f.s.config, cfg).expect("config");
    let mut many = program(1, "");
    let at = many.find("outputs:").expect("outputs");
    let more: String = (1..=5)
        .map(|i| {
            format!("  extra{i}:\n    type: test:index:Bucket\n    properties:\n      name: extra-{i}\n      size: {i}\n")
        })
        .collect();
    many.insert_str(at, &more);
    f.remote
        .commit(&[("stack/Pulumi.yaml", &many)], "six buckets");
    let intake = Intake::start(&f.s);
    let who = Approver {
        port: intake.port,
        token: OPS,
    };
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let p = who.pending();
    assert_eq!(p.len(), 1, "{p:?}");
    let diff = p[0]["diff"].as_str().unwrap_or("");
    assert_eq!(diff.lines().count(), 6, "{diff}");
    assert!(!diff.contains("pulumi:pulumi:Stack"), "{diff}");
    assert_eq!(
        p[0]["summary"], "6 to add, 0 to change, 0 to destroy",
        "{p:?}"
    );

    // Two previews of the program as it is now differ, byte for byte.
    let checkout = f.s.checkout("site").join("stack");
    let preview = || {
        let out = std::process::Command::new("python3")
            .arg(standin())
            .args(["preview", "--non-interactive", "--json", "--stack", "prod"])
            .current_dir(&checkout)
            .env(
                "PULUMI_BACKEND_URL",
                format!("file://{}", f.backend.display()),
            )
            .env("PULUMI_CONFIG_PASSPHRASE", PASSPHRASE)
            .env("HOME", f.root.path())
            .output()
            .expect("the stand-in");
        succeeded(&out, "pulumi preview")
    };
    let (one, two) = (preview(), preview());
    assert_ne!(one, two, "the stand-in's previews are byte-stable");
    assert!(one.contains("\"created\""), "{one}");

    who.approve(&p[0]);
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        !out.contains("the plan changed since it was approved"),
        "{out}"
    );
    let ups = f.calls().iter().filter(|c| c[0] == "up").count();
    assert_eq!(ups, 1, "{:?}", f.calls());
    assert_eq!(f.status().0, "changed", "{out}");
    assert_eq!(f.cloud().as_object().map(|o| o.len()), Some(6));
}

/// Policies × Pulumi: an `auto` stack a policy covers is previewed and
/// judged before every `up` — an update is warned with the sizes from the
/// preview's steps (before and after), a replacement is denied and
/// nothing runs `up`, and the next allowed commit applies.
#[test]
fn a_policy_judges_a_pulumi_preview_before_up() {
    let f = fixture("");
    let policy = f.root.path().join("no_replacements.rego");
    std::fs::write(
        &policy,
        "package main\n\n\
         deny contains msg if {\n  some c in input.changes\n  c.action in {\"replace\", \"delete\"}\n  \
         msg := sprintf(\"%s would be %sd\", [c.address, c.action])\n}\n\n\
         warn contains msg if {\n  some c in input.changes\n  c.action == \"update\"\n  \
         msg := sprintf(\"bucket size %v -> %v\", [c.before.size, c.after.size])\n}\n",
    )
    .expect("write");
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    std::fs::write(
        &f.s.config,
        cfg + &format!(
            "\n[[policies]]\nname = \"no-replacements\"\nfiles = [{}]\n",
            toml_str(&policy.display().to_string())
        ),
    )
    .expect("config");
    let replace_on_name = "    options:\n      replaceOnChanges: [name]\n";
    f.remote.commit(
        &[("stack/Pulumi.yaml", &program(1, replace_on_name))],
        "replace on name",
    );
    let ups = || f.calls().iter().filter(|c| c[0] == "up").count();

    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(ups(), 1, "{:?}", f.calls());
    f.remote.commit(
        &[("stack/Pulumi.yaml", &program(2, replace_on_name))],
        "size 2",
    );
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let (result, msg) = f.status();
    assert_eq!(result, "changed", "{msg}");
    assert!(
        msg.contains("policy `no-replacements` warns: bucket size 1 -> 2"),
        "{msg}"
    );
    assert_eq!(f.cloud()[URN]["size"], 2);

    // A rename replaces the bucket: denied, no `up`.
    let renamed =
        program(2, replace_on_name).replace("site-${pulumi.stack}", "www-${pulumi.stack}");
    f.remote
        .commit(&[("stack/Pulumi.yaml", &renamed)], "rename");
    let (code, out) = f.tick();
    assert_ne!(code, Some(0), "{out}");
    let (result, msg) = f.status();
    assert_eq!(result, "failed", "{msg}");
    assert!(
        msg.contains(&format!(
            "denied by policy `no-replacements`: {URN} would be replaced"
        )) && msg.contains("nothing applied"),
        "{msg}"
    );
    assert_eq!(ups(), 2, "an up ran for a denied plan: {:?}", f.calls());
    assert_eq!(f.cloud()[URN]["name"], "site-prod");

    // The rename taken back with a size change: allowed, applied.
    f.remote.commit(
        &[("stack/Pulumi.yaml", &program(3, replace_on_name))],
        "size 3 instead",
    );
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(ups(), 3, "{:?}", f.calls());
    assert_eq!(
        (&f.cloud()[URN]["name"], &f.cloud()[URN]["size"]),
        (&"site-prod".into(), &3.into())
    );
}
