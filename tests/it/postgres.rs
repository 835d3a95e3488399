//! driftless on PostgreSQL (`[database]`): the real binary against a real
//! throwaway cluster (Debian's postgresql, `driftless::store::testing`).

use std::time::Duration;

use crate::common::*;

/// A new database in this test process's cluster.
fn database() -> String {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(driftless::store::testing::database())
}

fn on_postgres(url: &str, targets: &str) -> Setup {
    Setup::new(&format!("[database]\nurl = {}\n\n{targets}", toml_str(url)))
}

/// A tick applies and is recorded in PostgreSQL (no SQLite file appears);
/// `status` and `history` read it back from any process; while `serve`
/// holds the database, a one-shot tick elsewhere is refused, saying why,
/// and works again once the daemon stopped.
#[test]
fn runs_are_recorded_in_postgres_and_one_process_runs_backends() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let first = remote.commit(&[("app/config", "v1\n")], "first");
    let log = root.path().join("applied.log");
    let s = on_postgres(
        &database(),
        &exec_target(
            "app",
            &remote.url(),
            "path = \"app\"",
            &format!(
                "apply = [\"sh\", \"-c\", \"cat config >> {}\"]",
                log.display()
            ),
        ),
    );
    let out = s.run(&["tick", "app"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let app = s.target_status("app");
    assert_eq!(app["last_result"], "changed", "{app}");
    assert_eq!(app["last_applied_sha"], first.as_str(), "{app}");
    assert_eq!(s.history("app").len(), 1);
    assert!(
        !s.db().exists(),
        "a SQLite database was made beside [database]"
    );

    let second = remote.commit(&[("app/config", "v2\n")], "second");
    let daemon = s.serve();
    let out = s.run(&["tick", "app"]);
    assert!(!out.status.success(), "a second process ran backends");
    let err = text(&out.stderr);
    assert!(err.contains("another driftless process"), "{err}");
    assert_eq!(s.target_status("app")["last_applied_sha"], first.as_str());
    // `status` needs no hold: it reads while the daemon runs.
    assert_eq!(s.status().len(), 1);
    daemon.stop();
    let out = s.run(&["tick", "app"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(s.target_status("app")["last_applied_sha"], second.as_str());
    assert_eq!(
        std::fs::read_to_string(&log).expect("applied"),
        "v1\nv2\n",
        "each commit applied once"
    );
}

/// A database that cannot be opened is named by its URL without the
/// password in it; the password appears nowhere.
#[test]
fn a_password_in_the_url_is_never_shown() {
    let url = database();
    let (_, socket) = url.split_once('?').expect("socket parameter");
    let wrong = format!("postgres://postgres:s3cret-pw@localhost/no_such_db?{socket}");
    let s = on_postgres(&wrong, "");
    let out = output_within(
        std::process::Command::new(bin())
            .arg("--config")
            .arg(&s.config)
            .args(["status", "--json"]),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!all.contains("s3cret-pw"), "{all}");
    assert!(
        all.contains("postgres://postgres:***@localhost/no_such_db"),
        "{all}"
    );
}
