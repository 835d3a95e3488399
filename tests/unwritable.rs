//! Unwritable state: the state directory on a small tmpfs that fills up
//! (a read-only remount is refused by the kernel while the daemon holds the
//! database open for writing, so a full disk is what is tested). While
//! driftless cannot write, a tick stops
//! before the backend and names the file, /readyz is not ready, and a
//! webhook is answered 503 — never 2xx for what was not persisted. When space
//! returns, it recovers and nothing accepted is lost. Needs root (mount).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const SECRET: &str = "unwritable-secret";

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("mkdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs needs root (CI runs as root)");
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn push(remote: &Remote, port: u16, n: u32) -> (String, Option<u16>, String) {
    let sha = remote.commit(&[("app/v", &n.to_string())], &format!("push {n}"));
    let body = github_push_body(&remote.url(), &sha, &["app/v"]);
    let sig = format!("sha256={}", hmac_hex(SECRET, &body));
    let r = http(
        port,
        "POST",
        "/hooks/github",
        &[
            ("Content-Type", "application/json"),
            ("X-GitHub-Event", "push"),
            ("X-GitHub-Delivery", &format!("d-{n}")),
            ("X-Hub-Signature-256", &sig),
        ],
        &body,
    );
    (sha, Some(r.status), r.body)
}

#[test]
fn a_full_state_dir_refuses_work_and_recovers() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/v", "0")], "first");
    let marker = root.path().join("applied.log");
    let secret = root.path().join("secret");
    std::fs::write(&secret, SECRET).expect("write");
    let s = Setup::new(&format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n{}",
        toml_str(&secret.display().to_string()),
        exec_target(
            "app",
            &remote.url(),
            "path = \"app\"\ninterval = \"1h\"",
            &format!(
                "apply = [\"sh\", \"-c\", \"git rev-parse HEAD >> {}\"]\nalways = true",
                marker.display()
            )
        )
    ));
    let _mount = Tmpfs::mount(&s.state, "24m");
    let daemon = s.serve();
    wait_for(Duration::from_secs(20), "the first apply", || {
        s.target_status("app")["last_result"] == "changed"
    });
    let applied = || {
        std::fs::read_to_string(&marker)
            .unwrap_or_default()
            .lines()
            .count()
    };
    assert_eq!(applied(), 1);

    // The disk fills up.
    let filler = s.state.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=64"])
        .arg(format!("of={}", filler.display()))
        .output();
    let (_, code, _) = push(&remote, daemon.port, 1);
    assert_ne!(
        code.map(|c| (200..300).contains(&c)),
        Some(true),
        "a delivery was acknowledged on a full disk"
    );
    assert_eq!(code, Some(503));
    assert_eq!(http_get(daemon.port, "/readyz").map(|r| r.0), Some(503));
    let out = s.run(&["tick", "app"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("driftless.db"),
        "the error does not name the file: {err}"
    );
    assert_eq!(
        applied(),
        1,
        "the backend ran although the run could not be recorded"
    );

    // Space returns: the forge's retry is accepted and applied.
    std::fs::remove_file(&filler).expect("rm filler");
    wait_for(Duration::from_secs(10), "ready again", || {
        http_get(daemon.port, "/readyz").is_some_and(|r| r.0 == 200)
    });
    // Every connection in the pool must be usable again, not just the one
    // the readiness probe got (a commit that failed on the full disk once
    // left a pooled connection unusable: "begin_with at non-zero
    // transaction depth").
    let mut sha = String::new();
    for n in 2..12 {
        let (s2, code, body) = push(&remote, daemon.port, n);
        assert_eq!(code, Some(202), "push {n}: {body}\n{}", daemon.log_text());
        sha = s2;
    }
    wait_for(Duration::from_secs(30), "the push applied", || {
        s.target_status("app")["last_applied_sha"] == sha.as_str()
    });

    drop(daemon);
}
