//! Commit statuses: every forge kind gets the run's state on the commit it
//! applied, in its own dialect, from the persistent outbox; a forge that is
//! down gets the newest state once it is back, and never changes a run; its
//! token never leaves the file it is in. Against `tests/forge_standin.py`.

use std::time::Duration;

use crate::common::*;

/// An exec target `app` that fails when the file `v` says `bad`, sending
/// its statuses to forge `f` as `repo`.
fn setup(
    root: &std::path::Path,
    forge: &ForgeStandin,
    kind: &str,
    repo: &str,
) -> (Remote, Setup, String) {
    let remote = Remote::new(root, "infra");
    let first = remote.commit(&[("app/v", "1\n")], "first");
    let s = Setup::new(&format!(
        "{}{}",
        exec_target(
            "app",
            &remote.url(),
            &format!("path = \"app\"\nforge = \"f\"\nforge_repo = \"{repo}\""),
            "apply = [\"sh\", \"-c\", \"test \\\"$(cat v)\\\" != bad\"]",
        ),
        forge.table("f", kind),
    ));
    s.set_public_url("https://driftless.example.net/");
    (remote, s, first)
}

/// An exec target `app` (path `app`, 1h interval) with `apply`, its
/// statuses on forge `f`, behind a GitHub receiver signed with `secret`.
fn pushed_target(
    root: &std::path::Path,
    forge: &ForgeStandin,
    secret: &str,
    apply: &str,
) -> (Remote, Setup) {
    let remote = Remote::new(root, "infra");
    remote.commit(&[("app/v", "1\n")], "first");
    let secret_file = root.join("hook-secret");
    std::fs::write(&secret_file, secret).expect("write");
    let s = Setup::new(&format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n{}{}",
        toml_str(&secret_file.display().to_string()),
        exec_target(
            "app",
            &remote.url(),
            "path = \"app\"\nforge = \"f\"\nforge_repo = \"me/infra\"\ninterval = \"1h\"",
            apply,
        ),
        forge.table("f", "github"),
    ));
    (remote, s)
}

fn tick(s: &Setup) -> (Option<i32>, String) {
    let out = s.run(&["tick", "app"]);
    (out.status.code(), text(&out.stdout) + &text(&out.stderr))
}

/// GitHub, Gitea, Forgejo and GitLab: a success on the commit a run
/// applied and a failure on the one it could not, each in the forge's own
/// endpoint, auth header and state names, with the run's message and its
/// link; GitLab's project path URL-encoded.
#[test]
fn each_forge_gets_the_runs_state_on_the_commit_it_applied() {
    for (kind, auth, failed, repo) in [
        ("github", "Bearer", "failure", "me/infra"),
        ("gitea", "token", "failure", "me/infra"),
        ("forgejo", "token", "failure", "me/infra"),
        ("gitlab", "PRIVATE-TOKEN", "failed", "group/sub/infra"),
    ] {
        let root = tempfile::tempdir().expect("tempdir");
        let forge = ForgeStandin::start(root.path());
        let (remote, s, sha) = setup(root.path(), &forge, kind, repo);
        let (code, said) = tick(&s);
        assert_eq!(code, Some(0), "{kind}: {said}");
        assert_eq!(
            forge.states(&sha, "driftless/app"),
            ["success"],
            "{kind}: {:#?}",
            forge.journal()
        );
        let j = forge.journal();
        let last = j.last().expect("a request");
        assert_eq!(
            (&last["repo"], &last["auth"], &last["auth_ok"]),
            (&repo.into(), &auth.into(), &true.into()),
            "{kind}: {last}"
        );
        assert!(
            last["body"]["description"]
                .as_str()
                .is_some_and(|d| d.contains("succeeded")),
            "{kind}: {last}"
        );
        assert!(
            last["body"]["target_url"]
                .as_str()
                .is_some_and(|u| u == "https://driftless.example.net/api/v1/runs/1"),
            "{kind}: {last}"
        );
        if kind == "gitlab" {
            assert!(
                last["path"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("/api/v4/projects/group%2Fsub%2Finfra/")),
                "{last}"
            );
        }

        // Ticks that find nothing to do: the first says so (a new
        // description), the next ones are one streak with the same link
        // and description, which the forge is not sent again.
        for _ in 0..3 {
            assert_eq!(tick(&s).0, Some(0), "{kind}");
        }
        let rows = sql_rows(
            &s.db(),
            &format!("SELECT version FROM forge_statuses WHERE sha = '{sha}'"),
        );
        assert_eq!(rows, [serde_json::json!({"version": 2})], "{kind}");

        let bad = remote.commit(&[("app/v", "bad\n")], "bad");
        let (code, said) = tick(&s);
        assert_eq!(code, Some(1), "{kind}: {said}");
        assert_eq!(forge.states(&bad, "driftless/app"), [failed], "{kind}");
        // The same result again: recorded again, and taken by every forge
        // (GitLab makes a new status for a final state sent again).
        tick(&s);
        let rows = sql_rows(
            &s.db(),
            &format!("SELECT * FROM forge_statuses WHERE sha = '{bad}'"),
        );
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(
            (
                &rows[0]["version"],
                &rows[0]["sent_version"],
                &rows[0]["last_error"]
            ),
            (&2.into(), &2.into(), &serde_json::Value::Null),
            "{kind}: {rows:?}"
        );
        assert_eq!(
            forge
                .states(&sha, "driftless/app")
                .last()
                .map(String::as_str),
            Some("success"),
            "{kind}"
        );
    }
}

/// A forge that is down: the run is recorded as it happened, the status
/// waits with a WARN that names the forge (never its token), and once the
/// forge is back the newest state is sent, once; the token is in no output
/// and in no file of the state directory.
#[test]
fn a_forge_that_is_down_gets_the_newest_state_later_and_runs_are_unaffected() {
    let root = tempfile::tempdir().expect("tempdir");
    let forge = ForgeStandin::start(root.path());
    let (_remote, s, sha) = setup(root.path(), &forge, "github", "me/infra");
    forge.down(true);
    let (code, mut said) = tick(&s);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(s.history("app")[0]["result"], "changed");
    assert!(
        said.contains("WARN") && said.contains("forge `f` answered 503"),
        "{said}"
    );
    let rows = sql_rows(&s.db(), "SELECT * FROM forge_statuses");
    assert_eq!(
        (&rows[0]["state"], &rows[0]["sent_version"]),
        (&"success".into(), &0.into()),
        "{rows:?}"
    );
    assert!(forge.states(&sha, "driftless/app").is_empty());
    // `notify pending` lists it, with why it waits.
    let pending = text(&s.run(&["notify", "pending"]).stdout);
    assert!(
        pending.contains("driftless/app") && pending.contains("answered 503"),
        "{pending}"
    );

    forge.down(false);
    // Past the first retry's wait (2 s): the next tick's sender sends it.
    std::thread::sleep(std::time::Duration::from_millis(2200));
    let (code, more) = tick(&s);
    said += &more;
    assert_eq!(code, Some(0), "{more}");
    assert_eq!(forge.states(&sha, "driftless/app"), ["success"]);
    let rows = sql_rows(&s.db(), "SELECT * FROM forge_statuses");
    assert_eq!(rows[0]["sent_version"], rows[0]["version"], "{rows:?}");

    assert!(
        !said.contains(&forge.token),
        "the forge token in the output"
    );
    assert_state_keeps_out(&s.state, &forge.token);
}

/// Through the daemon: a pushed commit is `pending` ("queued") on the forge
/// as soon as the push is durable, then gets the run's result, in that
/// order, and nothing after it.
#[test]
fn a_pushed_commit_is_pending_until_its_run_ends() {
    const SECRET: &str = "forge-status-hook-secret";
    let root = tempfile::tempdir().expect("tempdir");
    let forge = ForgeStandin::start(root.path());
    // Slow enough that the sender (every 2 s) sees the pending state.
    let (remote, s) = pushed_target(
        root.path(),
        &forge,
        SECRET,
        "apply = [\"sh\", \"-c\", \"sleep 5\"]",
    );
    let daemon = s.serve();
    wait_for(Duration::from_secs(60), "the first tick", || {
        s.status()
            .iter()
            .all(|t| t["running"] == false && !t["last_result"].is_null())
    });
    let sha = remote.commit(&[("app/v", "2\n")], "second");
    let body = github_push_body(&remote.url(), &sha, &["app/v"]);
    let r = deliver_github_push(daemon.port, SECRET, &body, "forge-status-1");
    assert_eq!(r.status, 202, "{}", r.body);
    wait_for(Duration::from_secs(60), "the run's status", || {
        forge.states(&sha, "driftless/app").len() >= 2
    });
    assert_eq!(forge.states(&sha, "driftless/app"), ["pending", "success"]);
    let first = forge
        .journal()
        .into_iter()
        .find(|j| j["sha"] == sha.as_str())
        .expect("a request");
    assert_eq!(first["body"]["description"], "queued", "{first}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(forge.states(&sha, "driftless/app"), ["pending", "success"]);
}

/// A run stopped at the target's timeout is `error` on the forge (driftless
/// could not finish), not `failure` (the change was refused).
#[test]
fn a_run_stopped_at_its_timeout_is_an_error() {
    let root = tempfile::tempdir().expect("tempdir");
    let forge = ForgeStandin::start(root.path());
    let remote = Remote::new(root.path(), "infra");
    let sha = remote.commit(&[("app/v", "1\n")], "first");
    let s = Setup::new(&format!(
        "{}{}",
        exec_target(
            "app",
            &remote.url(),
            "path = \"app\"\ntimeout = \"2s\"\nforge = \"f\"\nforge_repo = \"me/infra\"",
            "apply = [\"sleep\", \"30\"]",
        ),
        forge.table("f", "github"),
    ));
    let (code, said) = tick(&s);
    assert_eq!(code, Some(1), "{said}");
    assert_eq!(forge.states(&sha, "driftless/app"), ["error"], "{said}");
    let j = forge.journal();
    assert!(
        j[0]["body"]["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("timed out: ")),
        "{j:?}"
    );
}

/// Two pushes queued before a run: the newer commit gets the run's result,
/// the older one "superseded by <newer>" (its changes are in the newer
/// commit the run applied), and neither is left pending.
#[test]
fn a_commit_folded_into_a_newer_push_is_superseded() {
    const SECRET: &str = "forge-status-fold-secret";
    let root = tempfile::tempdir().expect("tempdir");
    let forge = ForgeStandin::start(root.path());
    let (remote, s) = pushed_target(root.path(), &forge, SECRET, "apply = [\"true\"]");
    let intake = Intake::start(&s);
    let mut shas = Vec::new();
    for n in 2..4 {
        let sha = remote.commit(&[("app/v", &format!("{n}\n"))], &format!("v{n}"));
        let body = github_push_body(&remote.url(), &sha, &["app/v"]);
        let r = deliver_github_push(intake.port, SECRET, &body, &format!("fold-{n}"));
        assert_eq!(r.status, 202, "{}", r.body);
        shas.push(sha);
    }
    let (code, said) = tick(&s);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(forge.states(&shas[1], "driftless/app"), ["success"]);
    assert_eq!(forge.states(&shas[0], "driftless/app"), ["success"]);
    let older = forge
        .journal()
        .into_iter()
        .find(|j| j["sha"] == shas[0].as_str())
        .expect("a request");
    assert_eq!(
        older["body"]["description"],
        format!(
            "superseded by {}, whose run covers this commit",
            &shas[1][..12]
        ),
        "{older}"
    );
}

/// An exec target `app` whose run fails with a message of more than 500
/// characters (ten `é`, two bytes each, then `x`s), its statuses on forge
/// `f` of `kind`, whose token is `token_file`.
fn long_failure(
    root: &std::path::Path,
    forge: &ForgeStandin,
    kind: &str,
    repo: &str,
    token_file: &std::path::Path,
) -> (Setup, String) {
    let remote = Remote::new(root, "infra");
    let sha = remote.commit(
        &[(
            "app/fail.sh",
            "{ printf 'éééééééééé'; head -c 490 /dev/zero | tr '\\0' x; echo; } >&2\nexit 1\n",
        )],
        "first",
    );
    let table = forge.table("f", kind).replace(
        &toml_str(&forge.token_file.display().to_string()),
        &toml_str(&token_file.display().to_string()),
    );
    let s = Setup::new(&format!(
        "{}{table}",
        exec_target(
            "app",
            &remote.url(),
            &format!("path = \"app\"\nforge = \"f\"\nforge_repo = \"{repo}\""),
            "apply = [\"sh\", \"fail.sh\"]",
        ),
    ));
    (s, sha)
}

/// A failed run with a long message still leaves its state on the commit:
/// the description is cut by characters, its marker included, to the
/// forge's own limit — GitHub 140 (it refuses 141 with 422), GitLab 255
/// (400) — and Gitea and Forgejo, which keep it as TEXT, get it whole.
#[test]
fn a_long_failure_message_fits_each_forges_description_limit() {
    for (kind, failed, limit, repo) in [
        ("github", "failure", Some(140), "me/infra"),
        ("gitlab", "failed", Some(255), "group/infra"),
        ("gitea", "failure", None, "me/infra"),
    ] {
        let root = tempfile::tempdir().expect("tempdir");
        let forge = ForgeStandin::start(root.path());
        let (s, sha) = long_failure(root.path(), &forge, kind, repo, &forge.token_file);
        let (code, said) = tick(&s);
        assert_eq!(code, Some(1), "{kind}: {said}");
        assert_eq!(
            forge.states(&sha, "driftless/app"),
            [failed],
            "{kind}: the forge did not take the status: {:#?}\n{said}",
            forge.journal()
        );
        let j = forge.journal();
        let sent = j.last().expect("a request")["body"]["description"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(sent.contains("éééééééééé"), "{kind}: {sent}");
        match limit {
            Some(max) => {
                assert_eq!(sent.chars().count(), max, "{kind}: {sent}");
                assert!(sent.ends_with(" […]"), "{kind}: {sent}");
            }
            None => assert!(sent.contains(&"x".repeat(490)), "{kind}: {sent}"),
        }
        let rows = sql_rows(
            &s.db(),
            "SELECT last_error, sent_version FROM forge_statuses",
        );
        assert_eq!(
            rows[0]["last_error"],
            serde_json::Value::Null,
            "{kind}: {rows:?}"
        );
    }
}

/// A status the forge refuses for a reason that sending it again cannot
/// change (GitHub 403 "Resource not accessible", a token that may only
/// read; the same holds for a 422) is given up at the first answer, with
/// an ERROR that names the forge and what it said — not retried on the
/// backoff as if the forge were down. `notify pending --all` shows why.
#[test]
fn a_status_the_forge_refuses_for_good_is_given_up_at_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let forge = ForgeStandin::start(root.path());
    let readonly = root.path().join("forge-token-ro");
    std::fs::write(&readonly, format!("{}-ro\n", forge.token)).expect("write");
    let (s, sha) = long_failure(root.path(), &forge, "github", "me/infra", &readonly);
    let (code, said) = tick(&s);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("ERROR")
            && said.contains("forge `f` answered 403")
            && said.contains("Resource not accessible"),
        "{said}"
    );
    let rows = sql_rows(
        &s.db(),
        &format!("SELECT attempts, given_up, sent_version FROM forge_statuses WHERE sha = '{sha}'"),
    );
    assert_eq!(
        rows,
        [serde_json::json!({"attempts": 1, "given_up": 1, "sent_version": 0})],
        "{said}"
    );
    let posts = forge
        .journal()
        .iter()
        .filter(|r| r["sha"] == sha.as_str())
        .count();
    assert_eq!(posts, 1, "{:#?}", forge.journal());
    let pending = text(&s.run(&["notify", "pending", "--all"]).stdout);
    assert!(pending.contains("answered 403"), "{pending}");
    assert!(
        !said.contains(&forge.token),
        "the forge token in the output"
    );
}

/// GitLab statuses name their `ref` (the target's branch): GitLab refuses
/// a status for a commit no branch contains without it (404 "References
/// for commit Not Found"), and finds the pending status to update by name
/// and ref — the same `ref` goes with `pending` and with the result. On a
/// GitHub Enterprise server (any GitHub API URL but api.github.com without
/// a path of its own) the API root is `/api/v3`.
#[test]
fn gitlab_statuses_name_their_ref_and_github_enterprise_is_under_api_v3() {
    let root = tempfile::tempdir().expect("tempdir");
    let forge = ForgeStandin::start(root.path());
    let (_remote, s, sha) = setup(root.path(), &forge, "gitlab", "group/infra");
    forge.orphan(&sha);
    let (code, said) = tick(&s);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(
        forge.states(&sha, "driftless/app"),
        ["success"],
        "{:#?}",
        forge.journal()
    );
    for r in forge.journal() {
        assert_eq!(r["body"]["ref"], "main", "{r}");
    }

    let root = tempfile::tempdir().expect("tempdir");
    let forge = ForgeStandin::start(root.path());
    let (_remote, s, sha) = setup(root.path(), &forge, "github", "me/infra");
    let (code, said) = tick(&s);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(forge.states(&sha, "driftless/app"), ["success"]);
    let j = forge.journal();
    assert!(
        j.iter().all(|r| r["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/api/v3/repos/me/infra/statuses/"))),
        "{j:#?}"
    );
}

/// A forge that says its rate limit is spent (GitHub: 403 with
/// `x-ratelimit-remaining: 0` and the reset time; GitLab: 429 with
/// `Retry-After`) gets no further call until the time it named — the
/// status waits, its attempts not spent, `notify pending` and `/metrics`
/// show the paused destination and until when — and the status arrives
/// after the reset, through the daemon's sender.
#[test]
fn a_rate_limited_forge_is_left_alone_until_its_reset_and_then_gets_the_status() {
    for (kind, shape, repo) in [
        ("github", "primary", "me/infra"),
        ("gitlab", "gitlab", "group/infra"),
    ] {
        let root = tempfile::tempdir().expect("tempdir");
        let forge = ForgeStandin::start(root.path());
        let (remote, s, first) = setup(root.path(), &forge, kind, repo);
        forge.rate_limit(shape, 4.0);
        let (code, said) = tick(&s);
        assert_eq!(code, Some(0), "{kind}: {said}");
        assert!(
            said.contains("rate-limited") && said.contains("forge `f`"),
            "{kind}: {said}"
        );
        // A second run while limited: its status waits too, no call made.
        let second = remote.commit(&[("app/v", "2\n")], "second");
        let (code, said) = tick(&s);
        assert_eq!(code, Some(0), "{kind}: {said}");
        let limited_calls = forge
            .journal()
            .iter()
            .filter(|r| r["limited"] == true)
            .count();
        assert_eq!(limited_calls, 1, "{kind}: {:#?}", forge.journal());
        let rows = sql_rows(&s.db(), "SELECT attempts, given_up FROM forge_statuses");
        assert!(
            rows.iter()
                .all(|r| r["attempts"] == 0 && r["given_up"] == 0),
            "{kind}: {rows:?}"
        );
        let pending = text(&s.run(&["notify", "pending"]).stdout);
        assert!(
            pending.contains("RATE-LIMITED DESTINATION") && pending.contains("forge `f`"),
            "{kind}: {pending}"
        );
        let daemon = s.serve();
        let metrics = http(daemon.port, "GET", "/metrics", &[], b"").body;
        assert!(
            metrics.contains("driftless_destination_paused_until_timestamp_seconds{destination=\"forge `f` (127.0.0.1:"),
            "{kind}: {metrics}"
        );
        wait_for(
            std::time::Duration::from_secs(30),
            "the statuses after the reset",
            || {
                forge
                    .states(&first, "driftless/app")
                    .last()
                    .map(String::as_str)
                    == Some("success")
                    && forge
                        .states(&second, "driftless/app")
                        .last()
                        .map(String::as_str)
                        == Some("success")
            },
        );
        let limited_calls = forge
            .journal()
            .iter()
            .filter(|r| r["limited"] == true)
            .count();
        assert_eq!(limited_calls, 1, "{kind}: {:#?}", forge.journal());
        let pending = text(&s.run(&["notify", "pending"]).stdout);
        assert!(!pending.contains("RATE-LIMITED"), "{kind}: {pending}");
        drop(daemon);
    }
}
