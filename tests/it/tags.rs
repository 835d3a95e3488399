//! `tag = "v*"`: a target follows the highest version tag matching the
//! pattern, refuses a tag that moves backwards, is reached by tag pushes,
//! and with `verify` needs the tag itself signed.

use std::path::Path;
use std::time::Duration;

use crate::common::*;

const SECRET: &str = "tags-hook-secret";

/// An exec target following `v*` tags of `remote`, logging the applied
/// version; `extra` goes into the target table.
fn setup(remote: &Remote, log: &Path, extra: &str) -> Setup {
    let secret = log.with_file_name("hook-secret");
    std::fs::write(&secret, SECRET).expect("secret");
    Setup::new(&format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n\
         [[targets]]\nname = \"app\"\nrepo = \"{}\"\ntag = \"v*\"\ninterval = \"1h\"\n{extra}\n\
         [targets.backend]\nkind = \"exec\"\napply = [\"sh\", \"-c\", \"echo applied $(cat version) >> {}\"]\n",
        toml_str(&secret.display().to_string()),
        remote.url(),
        log.display()
    ))
}

/// Tag `at` (a commit) as `name` with `how` (e.g. `["-a", "-m", "x"]`;
/// none: lightweight), after `config` (`-c` settings), and push the tag.
fn tag(remote: &Remote, name: &str, at: &str, config: &[&str], how: &[&str]) {
    let mut args: Vec<&str> = Vec::new();
    for c in config {
        args.extend(["-c", c]);
    }
    args.push("tag");
    args.extend_from_slice(how);
    args.extend([name, at]);
    git(&remote.work, &args);
    git(
        &remote.work,
        &["push", "-q", "origin", &format!("refs/tags/{name}")],
    );
}

fn tick(s: &Setup) -> (Option<i32>, serde_json::Value, String) {
    let out = s.run(&["tick", "app"]);
    let run = s.history("app").into_iter().next().expect("a run");
    (out.status.code(), run, text(&out.stderr))
}

#[test]
fn the_highest_version_tag_is_applied_and_a_lower_one_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let log = root.path().join("applied.log");
    let c1 = remote.commit(&[("version", "1")], "one");
    tag(&remote, "v1.0.0", &c1, &[], &[]);
    let s = setup(&remote, &log, "");
    let checked = succeeded(&s.run(&["check"]), "check");
    assert!(checked.contains(" tag v* path ."), "{checked}");
    assert_eq!(s.target_status("app")["tag"], "v*");

    let (code, run, _) = tick(&s);
    assert_eq!(
        (code, &run["result"]),
        (Some(0), &"changed".into()),
        "{run}"
    );
    assert_eq!(run["sha"], c1.as_str());

    // A commit on the branch is not a release: nothing moves.
    let c2 = remote.commit(&[("version", "2")], "two");
    let (code, run, _) = tick(&s);
    assert_eq!(
        (code, &run["result"]),
        (Some(0), &"no_change".into()),
        "{run}"
    );
    assert_eq!(run["sha"], c1.as_str());

    // A matching tag that is not a version is left out, said once.
    tag(&remote, "vnext", &c2, &[], &[]);
    let (_, run, log_text) = tick(&s);
    assert_eq!(run["sha"], c1.as_str(), "{run}");
    assert!(log_text.contains("is not a version"), "{log_text}");

    // Semver order, not the names': v1.10.0 is above v1.9.0.
    tag(&remote, "v1.9.0", &c1, &[], &[]);
    tag(&remote, "v1.10.0", &c2, &[], &["-a", "-m", "release 1.10"]);
    let (code, run, _) = tick(&s);
    assert_eq!(
        (code, &run["result"]),
        (Some(0), &"changed".into()),
        "{run}"
    );
    assert_eq!(run["sha"], c2.as_str());
    assert_eq!(log_lines(&log), ["applied 1", "applied 2"]);

    // The tag deleted: the highest left is lower than what was applied.
    git(
        &remote.work,
        &["push", "-q", "origin", ":refs/tags/v1.10.0"],
    );
    let (code, run, _) = tick(&s);
    assert_eq!(code, Some(1), "{run}");
    let message = run["message"].as_str().unwrap_or("");
    assert!(
        message.contains("the tag moved backwards")
            && message.contains("v1.9.0")
            && message.contains("v1.10.0"),
        "{message}"
    );
    assert_eq!(s.target_status("app")["last_applied_sha"], c2.as_str());
    assert_eq!(log_lines(&log).len(), 2, "a lower tag was applied");

    // A tag push reaches the target through the webhook, and a higher
    // tag is applied.
    let c3 = remote.commit(&[("version", "3")], "three");
    tag(&remote, "v2.0.0", &c3, &[], &["-a", "-m", "release 2"]);
    let daemon = s.serve();
    let mut body: serde_json::Value =
        serde_json::from_slice(&github_push_body(&remote.url(), &c3, &[])).expect("json");
    body["ref"] = "refs/tags/v2.0.0".into();
    let body = serde_json::to_vec(&body).expect("json");
    let r = deliver_github_push(daemon.port, SECRET, &body, "tag-1");
    assert_eq!(r.status, 202, "{r:?}");
    assert_eq!(r.json()["queued"][0]["target"], "app", "{r:?}");
    wait_for(Duration::from_secs(30), "v2.0.0 applied", || {
        log_lines(&log).last().is_some_and(|l| l == "applied 3")
    });
}

#[test]
fn with_verify_the_tag_itself_must_be_signed() {
    let root = tempfile::tempdir().expect("tempdir");
    let (alice, public) = ssh_key(root.path(), "alice");
    let remote = Remote::new(root.path(), "infra");
    let log = root.path().join("applied.log");
    let s = setup(
        &remote,
        &log,
        &verify_ssh_table(root.path(), "alice@example.net", &public),
    );
    let as_alice = format!("user.signingkey={}", alice.display());
    let signed = ["gpg.format=ssh", as_alice.as_str()];

    let c1 = remote.commit(&[("version", "1")], "one");
    tag(&remote, "v1.0.0", &c1, &signed, &["-s", "-m", "release 1"]);
    let (code, run, _) = tick(&s);
    assert_eq!(
        (code, &run["result"]),
        (Some(0), &"changed".into()),
        "{run}"
    );

    let c2 = remote.commit(&[("version", "2")], "two");
    for (name, how, says) in [
        (
            "v1.1.0",
            &["-a", "-m", "unsigned"][..],
            "tag v1.1.0 refused: not signed",
        ),
        (
            "v1.2.0",
            &[][..],
            "tag v1.2.0 refused: a lightweight tag carries no signature",
        ),
    ] {
        tag(&remote, name, &c2, &[], how);
        let (code, run, _) = tick(&s);
        assert_eq!(code, Some(1), "{run}");
        let message = run["message"].as_str().unwrap_or("");
        assert!(message.contains(says), "{message}");
        assert_eq!(s.target_status("app")["last_applied_sha"], c1.as_str());
    }
    assert_eq!(log_lines(&log), ["applied 1"]);

    tag(
        &remote,
        "v1.3.0",
        &c2,
        &signed,
        &["-s", "-m", "release 1.3"],
    );
    let (code, run, _) = tick(&s);
    assert_eq!(
        (code, &run["result"]),
        (Some(0), &"changed".into()),
        "{run}"
    );
    assert_eq!(log_lines(&log), ["applied 1", "applied 2"]);
}
