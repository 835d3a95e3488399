//! The ansible backend against real ansible-core (`connection: local`).

use crate::common::*;

const PLAYBOOK: &str = r#"- hosts: all
  gather_facts: false
  tasks:
    - name: write the greeting
      ansible.builtin.copy:
        content: "{{ greeting }}\n"
        dest: "{{ dest }}"
    - name: fail on request
      ansible.builtin.command: "false"
      when: fail | default(false) | bool
"#;

fn python() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    text(&out.stdout).trim().to_string()
}

fn ansible_available() {
    let ok = std::process::Command::new("ansible-playbook")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "these tests need ansible-playbook (pip install ansible-core; see tests/run.sh)"
    );
}

struct World {
    root: tempfile::TempDir,
    remote: Remote,
    setup: Setup,
}

fn world(mode: &str, extra: &str) -> World {
    world_with(mode, "", extra)
}

/// `target_extra` goes into the target's table, `extra` into its backend's.
fn world_with(mode: &str, target_extra: &str, extra: &str) -> World {
    ansible_available();
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let dest = root.path().join("greeting.txt");
    remote.commit(
        &[
            ("play/site.yml", PLAYBOOK),
            // The interpreter is set explicitly: discovery picks the wrong one here.
            (
                "play/inventory.ini",
                &format!(
                    "box ansible_connection=local ansible_python_interpreter={}\n",
                    python()
                ),
            ),
            (
                "play/vars.yml",
                &format!("greeting: hello\ndest: {}\n", dest.display()),
            ),
        ],
        "playbook",
    );
    let setup = Setup::new(&format!(
        "[[targets]]\nname = \"box\"\nrepo = \"{}\"\npath = \"play\"\n{target_extra}\n\
         [targets.backend]\nkind = \"ansible\"\nplaybook = \"site.yml\"\ninventory = \"inventory.ini\"\n\
         extra_vars_files = [\"vars.yml\"]\nmode = \"{mode}\"\n{extra}\n",
        remote.url()
    ));
    World {
        root,
        remote,
        setup,
    }
}

fn tick(w: &World) -> (i32, serde_json::Value) {
    let out = w.setup.run(&["tick", "box"]);
    let code = out.status.code().unwrap_or(-1);
    (
        code,
        w.setup.history("box").into_iter().next().expect("a run"),
    )
}

fn greeting(w: &World) -> String {
    std::fs::read_to_string(w.root.path().join("greeting.txt")).unwrap_or_default()
}

#[test]
fn digest_mode_skips_unchanged_inputs_and_reads_the_recap() {
    let w = world("digest", "");
    let (code, run) = tick(&w);
    assert_eq!(code, 0, "{run}");
    assert_eq!(run["result"], "changed", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains("changed on box"),
        "{run}"
    );
    assert_eq!(greeting(&w), "hello\n");

    let (_, run) = tick(&w);
    assert_eq!(run["result"], "no_change");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains("inputs unchanged"),
        "{run}"
    );
    assert_eq!(
        run["output_tail"], "",
        "ansible ran although nothing changed"
    );

    w.remote.commit(
        &[(
            "play/vars.yml",
            &format!(
                "greeting: bonjour\ndest: {}\n",
                w.root.path().join("greeting.txt").display()
            ),
        )],
        "french",
    );
    let (_, run) = tick(&w);
    assert_eq!(run["result"], "changed");
    assert_eq!(greeting(&w), "bonjour\n");

    // outputs: the recap per host
    let out = w.setup.run(&["outputs", "box", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["box"]["changed"], 1, "{v}");
    assert_eq!(v["box"]["failed"], 0);

    // No destroy playbook: a clear failure, nothing run.
    let out = w.setup.run(&["destroy", "box", "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("no `destroy_playbook`"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn always_mode_runs_every_tick_and_reports_no_change_from_the_recap() {
    let w = world("always", "");
    assert_eq!(tick(&w).1["result"], "changed");
    let (_, run) = tick(&w);
    assert_eq!(run["result"], "no_change", "{run}");
    assert!(
        run["output_tail"]
            .as_str()
            .unwrap_or("")
            .contains("PLAY RECAP"),
        "ansible did not run: {run}"
    );
}

#[test]
fn check_drift_repairs_a_hand_edit_despite_an_unchanged_digest() {
    let w = world("digest", "check_drift = true");
    assert_eq!(tick(&w).1["result"], "changed");
    let (_, run) = tick(&w);
    assert_eq!(run["result"], "no_change", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains("--check reports no drift"),
        "{run}"
    );
    std::fs::write(w.root.path().join("greeting.txt"), "edited by hand\n").expect("write");
    let (_, run) = tick(&w);
    assert_eq!(run["result"], "changed", "{run}");
    assert_eq!(greeting(&w), "hello\n");
}

#[test]
fn a_failing_task_names_the_task_and_the_host() {
    let w = world("digest", "");
    let sha = w.remote.commit(
        &[(
            "play/vars.yml",
            &format!(
                "greeting: hi\ndest: {}\nfail: true\n",
                w.root.path().join("greeting.txt").display()
            ),
        )],
        "break",
    );
    let (code, run) = tick(&w);
    assert_eq!(code, 1);
    assert_eq!(run["result"], "failed");
    assert_eq!(run["sha"], sha);
    let msg = run["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("host box") && msg.contains("task `fail on request`"),
        "{msg}"
    );
    // A failed run stores no digest: the next tick runs again.
    let (_, run) = tick(&w);
    assert_eq!(run["result"], "failed");
    assert!(
        run["output_tail"]
            .as_str()
            .unwrap_or("")
            .contains("PLAY RECAP")
    );
}

/// `policy = "approval"` on an ansible target: the plan is `--check`, one
/// line per task that would change a host and never a value; nothing runs
/// for real until it is approved; a stale approval is refused and a newer
/// commit supersedes the waiting plan; after the approved run a check finds
/// nothing to do; a hand edit is a new plan that waits, and rejecting it
/// leaves the edit alone.
#[test]
fn an_ansible_plan_is_a_check_and_only_an_approved_one_runs() {
    const OPS: &str = "ops-token-ansible-2b4e";
    const CANARY: &str = "canary-ansible-greeting-7d31";
    let w = world_with(
        "digest",
        "policy = \"approval\"\ninterval = \"1h\"",
        &token_table("ops", OPS, &["approve:box", "read"]),
    );
    let intake = Intake::start(&w.setup);
    let who = Approver {
        port: intake.port,
        token: OPS,
    };
    let (code, run) = tick(&w);
    assert_eq!(code, 0, "{run}");
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| m
                .contains("waits for approval: 1 task(s) would change 1 host(s) (destructive)")),
        "{run}"
    );
    assert_eq!(greeting(&w), "", "ran before approval");
    let p = who.pending();
    assert_eq!(
        (&p[0]["backend"], &p[0]["diff"]),
        (&"ansible".into(), &"~ box: write the greeting".into()),
        "{p:?}"
    );
    let dest = w.root.path().join("greeting.txt");
    let newer = who.refuses_stale_and_supersedes(
        || {
            w.remote.commit(
                &[(
                    "play/vars.yml",
                    &format!("greeting: hi {CANARY}\ndest: {}\n", dest.display()),
                )],
                "hi",
            );
        },
        || {
            tick(&w);
        },
    );
    assert_eq!(greeting(&w), "", "ran before approval");
    who.approve(&newer);
    let (code, run) = tick(&w);
    assert_eq!((code, &run["result"]), (0, &"changed".into()), "{run}");
    assert_eq!(
        greeting(&w),
        format!("hi {CANARY}\n"),
        "the newer commit's plan ran"
    );
    who.assert_plans_keep_out(&w.setup, CANARY);
    let (_, run) = tick(&w);
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("no changes: the real world matches")),
        "{run}"
    );
    assert!(who.pending().is_empty());

    std::fs::write(w.root.path().join("greeting.txt"), "edited by hand\n").expect("write");
    tick(&w);
    let p = who.pending();
    assert_eq!(p.len(), 1, "{p:?}");
    who.reject(p[0]["id"].as_i64().expect("id"));
    let (_, run) = tick(&w);
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| m.contains("was rejected by token:ops")),
        "{run}"
    );
    assert_eq!(greeting(&w), "edited by hand\n");
}

/// `policy = "detect"` on an ansible target: every tick runs `--check`,
/// records what a run would change as the target's drift, and never runs
/// the playbook for real.
#[test]
fn an_ansible_detect_target_records_the_check_and_changes_nothing() {
    let w = world_with("digest", "policy = \"detect\"\ninterval = \"1h\"", "");
    for _ in 0..2 {
        let (code, run) = tick(&w);
        assert_eq!(code, 0, "{run}");
    }
    assert_detected(&w.setup, "box", "~ box: write the greeting");
    assert_eq!(greeting(&w), "", "detect ran the playbook");
}
