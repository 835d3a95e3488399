//! The pi (SSH host) backend against a real sshd on 127.0.0.1: the tree is
//! shipped exactly, the command action runs in it, host keys are checked,
//! and paths with spaces and quotes survive the remote shell.

use std::path::{Path, PathBuf};

use crate::common::*;

fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).expect("prefix").display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

struct World {
    root: tempfile::TempDir,
    remote: Remote,
    sshd: Sshd,
    remote_dir: PathBuf,
    result: PathBuf,
}

fn world() -> World {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("pi/marker", "v1\n"),
            ("pi/conf/app.conf", "port = 80\n"),
            ("pi/name with spaces.txt", "spaces\n"),
            ("pi/old.txt", "to be deleted\n"),
            ("elsewhere/x", "not shipped\n"),
        ],
        "first",
    );
    let sshd = Sshd::start(root.path());
    let remote_dir = root.path().join("deploy dir 'quoted' \"too\"");
    let result = root.path().join("result of apply.txt");
    World {
        root,
        remote,
        sshd,
        remote_dir,
        result,
    }
}

fn target(w: &World, name: &str, known_hosts: &Path) -> String {
    format!(
        "[[targets]]\nname = \"{name}\"\nrepo = \"{}\"\npath = \"pi\"\n\
         [targets.backend]\nkind = \"pi\"\nhost = \"127.0.0.1\"\nport = {}\nuser = \"{}\"\n\
         identity_file = {}\nknown_hosts_file = {}\nremote_dir = {}\naction = \"command\"\n\
         command = [\"sh\", \"-c\", \"cp marker \\\"$1\\\" && echo shipped\", \"sh\", {}]\n\
         outputs = [\"sh\", \"-c\", \"printf '{{\\\"marker\\\": \\\"%s\\\"}}' \\\"$(cat marker)\\\"\"]\n\n",
        w.remote.url(),
        w.sshd.port,
        w.sshd.user,
        toml_str(&w.sshd.client_key.display().to_string()),
        toml_str(&known_hosts.display().to_string()),
        toml_str(&w.remote_dir.display().to_string()),
        toml_str(&w.result.display().to_string()),
    )
}

#[test]
fn the_command_action_converges_the_exact_tree() {
    let w = world();
    let s = Setup::new(&target(&w, "pi", &w.sshd.known_hosts));
    let out = s.run(&["tick", "pi"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let st = s.target_status("pi");
    assert_eq!(st["last_result"], "changed", "{st}");
    assert_eq!(
        files_under(&w.remote_dir),
        ["conf/app.conf", "marker", "name with spaces.txt", "old.txt"]
    );
    assert_eq!(std::fs::read_to_string(&w.result).expect("result"), "v1\n");

    // Unchanged: no ssh at all.
    std::fs::remove_file(&w.result).expect("rm");
    assert!(s.run(&["tick", "pi"]).status.success());
    assert_eq!(s.target_status("pi")["last_result"], "no_change");
    assert!(
        !w.result.exists(),
        "the command ran although nothing changed"
    );

    // A deleted file disappears from the host; an edit arrives.
    w.remote.delete("pi/old.txt", "drop old");
    let sha = w.remote.commit(&[("pi/marker", "v2\n")], "v2");
    assert!(s.run(&["tick", "pi"]).status.success());
    assert_eq!(
        files_under(&w.remote_dir),
        ["conf/app.conf", "marker", "name with spaces.txt"]
    );
    assert_eq!(std::fs::read_to_string(&w.result).expect("result"), "v2\n");
    assert_eq!(s.target_status("pi")["last_applied_sha"], sha);
    assert!(
        !w.root
            .path()
            .join("deploy dir 'quoted' \"too\".driftless-old")
            .exists(),
        "the previous tree was left behind"
    );

    // A committed symlink reaches the host as a symlink, never as the
    // controller's file it points to.
    let controller = w.root.path().join("controller-only.txt");
    std::fs::write(&controller, "controller-secret-3d9a\n").expect("write");
    w.remote.symlink(
        "pi/link",
        controller.to_str().expect("utf8"),
        "a link to the controller's file",
    );
    assert!(s.run(&["tick", "pi"]).status.success());
    let shipped = w.remote_dir.join("link");
    assert!(
        std::fs::symlink_metadata(&shipped).is_ok_and(|m| m.file_type().is_symlink()),
        "the link was not shipped as a link"
    );
    assert_eq!(std::fs::read_link(&shipped).expect("link"), controller);

    // outputs: the command's JSON, run on the host.
    let out = s.run(&["outputs", "pi", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["marker"], "v2");
}

#[test]
fn an_unknown_host_key_is_refused_and_nothing_is_shipped() {
    let w = world();
    let wrong = w.root.path().join("wrong_known_hosts");
    std::fs::write(
        &wrong,
        format!("[127.0.0.1]:{} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n", w.sshd.port),
    )
    .expect("write");
    let s = Setup::new(&target(&w, "pi", &wrong));
    let out = s.run(&["tick", "pi"]);
    assert_eq!(out.status.code(), Some(1));
    let msg = s.target_status("pi")["last_message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        msg.contains("ssh to root@127.0.0.1") || msg.contains("ssh to"),
        "{msg}"
    );
    assert!(msg.contains("Host key verification failed"), "{msg}");
    assert!(!w.remote_dir.exists());
}

#[test]
fn a_failing_remote_command_reports_its_stderr() {
    let w = world();
    let cfg = target(&w, "pi", &w.sshd.known_hosts).replace(
        "command = [\"sh\", \"-c\", \"cp marker \\\"$1\\\" && echo shipped\", \"sh\",",
        "command = [\"sh\", \"-c\", \"echo 'the service refused to start' >&2; exit 4\", \"sh\",",
    );
    let s = Setup::new(&cfg);
    let out = s.run(&["tick", "pi"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let msg = s.target_status("pi")["last_message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        msg.contains("exited with 4") && msg.contains("the service refused to start"),
        "{msg}"
    );
    assert_eq!(
        s.target_status("pi")["last_applied_sha"],
        serde_json::Value::Null
    );
}

/// A pi target with a `plan` command under `policy = "approval"`, against
/// the real sshd: the plan runs on the host in a copy of the new tree
/// beside the live one (which it can read through `DRIFTLESS_LIVE_DIR`)
/// and leaves neither changed; nothing is deployed until the plan is
/// approved; after the deploy the plan finds nothing to do.
#[test]
fn a_pi_plan_runs_on_the_host_beside_the_live_tree_and_waits_for_approval() {
    const OPS: &str = "ops-token-pi-9a3c";
    let w = world();
    let plan = "plan = [\"sh\", \"-c\", \"if cmp -s marker \\\"$DRIFTLESS_LIVE_DIR/marker\\\"; then exit 0; fi; \
                echo \\\"~ marker (live: $(cat \\\"$DRIFTLESS_LIVE_DIR/marker\\\" 2>/dev/null || echo none))\\\"\"]\n";
    let config = target(&w, "pi", &w.sshd.known_hosts).replacen(
        "path = \"pi\"\n",
        "path = \"pi\"\npolicy = \"approval\"\ninterval = \"1h\"\n",
        1,
    ) + plan
        + &token_table("ops", OPS, &["approve:pi", "read"]);
    let s = Setup::new(&config);
    let staging = format!("{}.driftless-plan", w.remote_dir.display());
    let tick = || {
        let out = s.run(&["tick", "pi"]);
        let said = text(&out.stdout) + &text(&out.stderr);
        assert!(out.status.success(), "{said}");
        said
    };
    let said = tick();
    assert!(
        said.contains("waits for approval: 0 to add, 1 to change, 0 to destroy"),
        "{said}"
    );
    assert!(!w.remote_dir.exists(), "deployed before approval");
    assert!(
        !Path::new(&staging).exists(),
        "the plan's copy was left on the host"
    );
    assert!(!w.result.exists());

    let intake = Intake::start(&s);
    let who = Approver {
        port: intake.port,
        token: OPS,
    };
    let list = who.pending();
    assert_eq!(
        (&list[0]["backend"], &list[0]["diff"]),
        (&"pi".into(), &"~ marker (live: none)".into()),
        "{list:?}"
    );
    who.approve(&list[0]);
    let said = tick();
    assert!(said.contains("pi: changed"), "{said}");
    assert_eq!(std::fs::read_to_string(&w.result).expect("result"), "v1\n");
    let said = tick();
    assert!(
        said.contains("no changes: the real world matches"),
        "{said}"
    );
    assert!(!Path::new(&staging).exists());
}

/// A pi target's `inputs` reach its remote command's environment exactly
/// (quotes, a newline, a `$`), read by the remote shell from its stdin,
/// never from a command line.
#[test]
fn inputs_reach_the_remote_command() {
    let w = world();
    let greeting = "it's \"quoted\"\nline two $HOME";
    w.remote.commit(
        &[(
            "producer/out.json",
            &serde_json::json!({ "greeting": greeting }).to_string(),
        )],
        "producer",
    );
    let producer = exec_target(
        "producer",
        &w.remote.url(),
        "path = \"producer\"",
        "apply = [\"true\"]\noutputs = [\"cat\", \"out.json\"]",
    );
    let pi = target(&w, "pi", &w.sshd.known_hosts)
        .replace(
            "command = [\"sh\", \"-c\", \"cp marker \\\"$1\\\" && echo shipped\", \"sh\",",
            "command = [\"sh\", \"-c\", \"printf '%s' \\\"$GREETING\\\" > \\\"$1\\\"\", \"sh\",",
        )
        .replace(
            "[targets.backend]",
            "inputs = { GREETING = \"producer.outputs.greeting\" }\n[targets.backend]",
        );
    assert!(pi.contains("$GREETING"), "{pi}");
    let s = Setup::new(&(producer + &pi));
    succeeded(&s.run(&["tick", "--all"]), "tick --all");
    let got = std::fs::read_to_string(&w.result).expect("the remote command wrote it");
    assert_eq!(got, greeting);
}
