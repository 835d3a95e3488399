//! Git sync against real remotes: a bare repo over file:// and over
//! `git daemon` (git://) on 127.0.0.1, driven through `driftless tick`.

use crate::common::*;
use std::process::Command;
use std::time::Duration;

/// An exec target that does nothing but succeed, so the tick's git sync is
/// what is under test.
fn setup_for(repo_url: &str) -> Setup {
    Setup::new(&exec_target(
        "site",
        repo_url,
        "path = \"site\"",
        "apply = [\"true\"]\nalways = true",
    ))
}

fn sync_scenario(remote: &Remote, url: &str) {
    let first = remote.commit(
        &[
            ("site/index.html", "v1"),
            ("site/old.txt", "to be deleted"),
            ("site/.gitignore", "*.log\n"),
            ("other/readme", "not this target"),
        ],
        "first",
    );
    let s = setup_for(url);
    let out = s.run(&["tick", "site"]);
    assert!(
        out.status.success(),
        "tick failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let checkout = s.checkout("site");
    assert_eq!(git(&checkout, &["rev-parse", "HEAD"]), first);
    assert_eq!(
        std::fs::read_to_string(checkout.join("site/index.html")).expect("file"),
        "v1"
    );
    assert_eq!(s.target_status("site")["last_applied_sha"], first);

    // An ignored file written between ticks (like .terraform/) survives;
    // a tracked file edited by hand is put back.
    std::fs::write(checkout.join("site/debug.log"), "keep me").expect("write");
    std::fs::write(checkout.join("site/index.html"), "edited by hand").expect("write");

    let second = remote.delete("site/old.txt", "delete old.txt");
    let second2 = remote.commit(&[("site/index.html", "v2")], "v2");
    assert_ne!(second, second2);
    let out = s.run(&["tick", "site"]);
    assert!(out.status.success(), "tick failed: {}", text(&out.stderr));
    assert_eq!(git(&checkout, &["rev-parse", "HEAD"]), second2);
    assert!(
        !checkout.join("site/old.txt").exists(),
        "deleted file still in the checkout"
    );
    assert_eq!(
        std::fs::read_to_string(checkout.join("site/index.html")).expect("file"),
        "v2"
    );
    assert_eq!(
        std::fs::read_to_string(checkout.join("site/debug.log")).expect("ignored file"),
        "keep me"
    );
    assert_eq!(s.target_status("site")["last_applied_sha"], second2);
    let runs = s.history("site");
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["sha"], second2);
    assert_eq!(runs[0]["trigger"], "cli");
    assert_eq!(runs[1]["sha"], first);
}

#[test]
fn file_remote_checkout_follows_the_branch() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let url = remote.url();
    sync_scenario(&remote, &url);
}

#[test]
fn git_daemon_remote_checkout_follows_the_branch() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let daemon = GitDaemon::start(root.path());
    let url = format!("git://127.0.0.1:{}/infra.git", daemon.port);
    sync_scenario(&remote, &url);
}

#[test]
fn missing_branch_or_path_fails_loudly_and_keeps_the_last_sha() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let sha = remote.commit(&[("site/index.html", "v1")], "first");
    let s = Setup::new(&format!(
        "{}{}",
        exec_target(
            "site",
            &remote.url(),
            "path = \"site\"",
            "apply = [\"true\"]"
        ),
        exec_target(
            "elsewhere",
            &remote.url(),
            "branch = \"production\"",
            "apply = [\"true\"]"
        )
    ));
    assert!(s.run(&["tick", "site"]).status.success());

    // The path disappears in the next commit: failed, last applied SHA stays.
    git(&remote.work, &["rm", "-q", "-r", "site"]);
    remote.commit(&[("moved/index.html", "v1")], "move site");
    let out = s.run(&["tick", "site"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let st = s.target_status("site");
    assert_eq!(st["last_applied_sha"], sha);
    assert_eq!(st["last_result"], "failed");
    assert!(
        st["last_message"]
            .as_str()
            .unwrap_or("")
            .contains("path `site` does not exist"),
        "{st}"
    );

    let out = s.run(&["tick", "elsewhere"]);
    assert_eq!(out.status.code(), Some(1));
    let msg = s.target_status("elsewhere")["last_message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(msg.contains("branch `production` does not exist"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_syncs_of_one_remote_share_a_fetch() {
    use driftless::config::GitAuth;
    use driftless::git::Git;
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let sha = remote.commit(&[("a", "1")], "first");
    let git = Git::new(&root.path().join("state"));
    let url = remote.url();
    // Ten targets on one repo and branch, synced at once.
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let (git, url) = (git.clone(), url.clone());
        set.spawn(async move { git.fetch(&url, "main", &GitAuth::default()).await });
    }
    while let Some(r) = set.join_next().await {
        assert_eq!(r.expect("join").expect("fetch"), sha);
    }
    // The first request starts a fetch; requests made after it started
    // cannot trust it (a push may have landed in between) and share the
    // next one. Ten serial fetches would mean no sharing at all.
    assert!(
        git.fetch_count() <= 2,
        "{} fetches for 10 concurrent requests",
        git.fetch_count()
    );
    // A later request fetches again.
    let newer = remote.commit(&[("a", "2")], "second");
    assert_eq!(
        git.fetch(&url, "main", &GitAuth::default())
            .await
            .expect("fetch"),
        newer
    );
}

/// gix writes a pack per fetch; the cache merges them once there are more
/// than git's `gc.autoPackLimit` (50), keeping a commit a force-push left
/// behind. (Found by the soak: with a thousand packs every tick's object
/// lookups searched a thousand indexes, and the daemon slowed fourfold.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_fetched_many_times_keeps_few_packs_and_every_object() {
    use driftless::config::GitAuth;
    use driftless::git::Git;
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let git = Git::new(&root.path().join("state"));
    let url = remote.url();
    let first = remote.commit(&[("a", "0")], "first");
    assert_eq!(
        git.fetch(&url, "main", &GitAuth::default())
            .await
            .expect("fetch"),
        first
    );
    // A commit fetched, then abandoned by a force-push.
    let abandoned = remote.commit(&[("a", "abandoned")], "abandoned");
    git.fetch(&url, "main", &GitAuth::default())
        .await
        .expect("fetch");
    let mut tip = remote.force_commit(&first, &[("a", "rewritten")], "rewritten");
    git.fetch(&url, "main", &GitAuth::default())
        .await
        .expect("fetch");
    let packs = || -> usize {
        let caches: Vec<_> = std::fs::read_dir(root.path().join("state/git"))
            .expect("caches")
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "git"))
            .collect();
        assert_eq!(caches.len(), 1, "one cache per remote");
        std::fs::read_dir(caches[0].path().join("objects/pack"))
            .expect("pack dir")
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "pack"))
            .count()
    };
    let mut most = 0;
    for n in 0..60 {
        tip = remote.commit(&[("a", &format!("v{n}"))], &format!("v{n}"));
        assert_eq!(
            git.fetch(&url, "main", &GitAuth::default())
                .await
                .expect("fetch"),
            tip
        );
        most = most.max(packs());
    }
    assert!(most <= 50, "the cache grew to {most} packs");
    assert!(packs() < 20, "{} packs after the merge", packs());
    // Every object is still there: the tip, and the abandoned commit.
    let at = |sha: String| {
        let git = git.clone();
        let url = url.clone();
        async move { git.tree_at(&url, &sha, std::path::Path::new("")).await }
    };
    assert!(at(tip).await.is_some(), "the tip's tree is gone");
    assert!(
        at(abandoned).await.is_some(),
        "the abandoned commit was dropped"
    );
}

#[test]
fn https_style_token_auth_is_sent_and_never_shown() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let sha = remote.commit(&[("site/index.html", "v1")], "first");
    let token = "tok-4e1d9b7c2a66f0";
    let (server, ca) = GitHttp::start_tls(root.path(), "deploy", token);
    let url = format!("https://127.0.0.1:{}/infra.git", server.port);
    let ca = format!("ca_file = {}", toml_str(&ca.display().to_string()));
    let good = root.path().join("good-token");
    let bad = root.path().join("bad-token");
    std::fs::write(&good, format!("{token}\n")).expect("write");
    std::fs::write(&bad, "tok-wrong-0000000\n").expect("write");
    let target = |name: &str, git: &str| {
        format!(
            "[[targets]]\nname = \"{name}\"\nrepo = \"{url}\"\n{git}\n[targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n\n"
        )
    };
    let s = Setup::new(&format!(
        "{}{}{}{}",
        target(
            "good",
            &format!(
                "[targets.git]\nusername = \"deploy\"\ntoken_file = {}\n{ca}",
                toml_str(&good.display().to_string())
            )
        ),
        target(
            "wrong",
            &format!(
                "[targets.git]\nusername = \"deploy\"\ntoken_file = {}\n{ca}",
                toml_str(&bad.display().to_string())
            )
        ),
        target("none", &format!("[targets.git]\n{ca}")),
        target("untrusted", ""),
    ));

    let out = s.run(&["tick", "good"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(s.target_status("good")["last_applied_sha"], sha);
    assert!(server.requests().contains(" ok"), "{}", server.requests());

    let out = s.run(&["tick", "wrong"]);
    assert_eq!(out.status.code(), Some(1));
    let msg = s.target_status("wrong")["last_message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        msg.contains("git fetch of branch `main`") && msg.contains(&url),
        "{msg}"
    );
    let all = format!("{msg}{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        !all.contains("tok-wrong-0000000") && !all.contains(token),
        "token shown: {all}"
    );

    let out = s.run(&["tick", "none"]);
    assert_eq!(out.status.code(), Some(1));
    let msg = s.target_status("none")["last_message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(msg.contains("git.token_file"), "{msg}");

    // Without the CA, the server's certificate is not trusted.
    let out = s.run(&["tick", "untrusted"]);
    assert_eq!(out.status.code(), Some(1));
    let msg = s.target_status("untrusted")["last_message"]
        .as_str()
        .unwrap_or("")
        .to_lowercase();
    assert!(msg.contains("certificate"), "{msg}");
}

#[test]
fn ssh_remote_uses_the_configured_key_and_checks_the_host_key() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let sha = remote.commit(&[("site/index.html", "v1")], "first");
    let sshd = Sshd::start(root.path());
    let url = format!(
        "ssh://{}@127.0.0.1:{}{}",
        sshd.user,
        sshd.port,
        remote.bare.display()
    );
    let wrong_hosts = root.path().join("wrong_known_hosts");
    std::fs::write(
        &wrong_hosts,
        format!("[127.0.0.1]:{} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n", sshd.port),
    )
    .expect("write");
    let target = |name: &str, known: &std::path::Path| {
        format!(
            "[[targets]]\nname = \"{name}\"\nrepo = \"{url}\"\n[targets.git]\nidentity_file = {}\nknown_hosts_file = {}\n\
             [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n\n",
            toml_str(&sshd.client_key.display().to_string()),
            toml_str(&known.display().to_string())
        )
    };
    let s = Setup::new(&format!(
        "{}{}",
        target("trusted", &sshd.known_hosts),
        target("spoofed", &wrong_hosts)
    ));
    let out = s.run(&["tick", "trusted"]);
    assert!(
        out.status.success(),
        "{}{}\nsshd log:\n{}",
        text(&out.stdout),
        text(&out.stderr),
        std::fs::read_to_string(&sshd.log).unwrap_or_default()
    );
    assert_eq!(s.target_status("trusted")["last_applied_sha"], sha);

    // A host key that does not match known_hosts: refused, nothing applied.
    let out = s.run(&["tick", "spoofed"]);
    assert_eq!(out.status.code(), Some(1));
    let st = s.target_status("spoofed");
    assert_eq!(st["last_applied_sha"], serde_json::Value::Null);
    let msg = st["last_message"].as_str().unwrap_or("");
    assert!(msg.contains("git fetch of branch `main`"), "{msg}");
    assert!(msg.contains("Host key verification failed"), "{msg}");
}

#[test]
fn git_lock_files_left_by_a_killed_tick_do_not_block_later_ones() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("site/index.html", "v1")], "first");
    let s = setup_for(&remote.url());
    assert!(s.run(&["tick", "site"]).status.success());
    // What a kill -9 mid-fetch and mid-reset leaves behind.
    let cache = std::fs::read_dir(s.state.join("git"))
        .expect("caches")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "git"))
        .expect("a cache");
    std::fs::write(cache.join("refs/remotes/origin/main.lock"), "").expect("write");
    std::fs::write(cache.join("packed-refs.lock"), "").expect("write");
    std::fs::write(s.checkout("site").join(".git/index.lock"), "").expect("write");
    let sha = remote.commit(&[("site/index.html", "v2")], "v2");
    let out = s.run(&["tick", "site"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(s.target_status("site")["last_applied_sha"], sha);
    assert!(
        text(&out.stderr).contains("removed a git lock file"),
        "{}",
        text(&out.stderr)
    );
}

/// `tick <target>` under `strace -f -e trace=<calls>`, which must succeed
/// with `no_change`: the trace.
fn traced_no_op_tick(s: &Setup, target: &str, calls: &str) -> String {
    let (stdout, trace) = traced_tick(s, target, calls);
    assert!(stdout.contains("no_change"), "{stdout}");
    trace
}

/// A one-shot tick of `target` under `strace -f`, tracing `calls`: what
/// it printed, and the trace.
fn traced_tick(s: &Setup, target: &str, calls: &str) -> (String, String) {
    let traced = s.path().join(format!("{target}.trace"));
    let out = Command::new("strace")
        .args(["-f", "-qq", "-e", &format!("trace={calls}"), "-o"])
        .arg(&traced)
        .arg(bin())
        .arg("--config")
        .arg(&s.config)
        .args(["tick", target])
        .output()
        .expect("strace runs");
    let stdout = succeeded(&out, "the traced tick");
    (stdout, std::fs::read_to_string(&traced).expect("trace"))
}

/// A tick whose branch tip is the commit its checkout already holds, with
/// nothing edited there, starts no process at all — no fetch (the local
/// remote's ref is read directly and the cache has it), no reset (the
/// index's stat data shows the tracked files untouched), no command (the
/// digest is unchanged) — as `strace` sees it. A tracked file edited by
/// hand is still put back by the next tick though the tip did not move.
#[test]
fn a_tick_with_nothing_to_do_starts_no_process_and_still_puts_back_a_hand_edit() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[("site/index.html", "v1"), ("site/app.conf", "port=80\n")],
        "first",
    );
    let s = Setup::new(&exec_target(
        "site",
        &remote.url(),
        "path = \"site\"",
        "apply = [\"true\"]",
    ));
    assert!(s.run(&["tick", "site"]).status.success());
    // The very next tick (files and index most likely written in the same
    // second: "racily clean", settled by their content, as git does).
    let trace = traced_no_op_tick(&s, "site", "execve,execveat");
    let started: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("execve(") || l.contains("execveat("))
        .collect();
    assert_eq!(
        started.len(),
        1,
        "processes started besides driftless:\n{trace}"
    );
    assert!(started[0].contains(&bin().display().to_string()), "{trace}");

    // A hand edit (size and mtime put back, as careful hands might): the
    // next tick, at the same tip, restores git's file.
    let conf = s.checkout("site").join("site/app.conf");
    let mtime = std::fs::metadata(&conf)
        .expect("meta")
        .modified()
        .expect("mtime");
    std::fs::write(&conf, "port=81\n").expect("edit");
    std::fs::File::options()
        .write(true)
        .open(&conf)
        .and_then(|f| f.set_modified(mtime))
        .expect("mtime back");
    assert!(s.run(&["tick", "site"]).status.success());
    assert_eq!(std::fs::read_to_string(&conf).expect("read"), "port=80\n");
}

/// A one-shot command opens the database once — a no-op tick reads
/// through its write connection, which is free of a transaction whenever
/// it reads, and a second connection would read the whole schema again —,
/// runs its statements on its own thread (no SQLite thread of sqlx's, to which
/// each statement would be handed and its rows handed back), syncs to
/// disk only what must survive a power cut, and leaves
/// SQLite's write-ahead log to the next command while it is small
/// (folding it into the database costs three `fsync`s) but folds it in
/// once it is over half a megabyte, so that no command reads more than
/// that before its first statement.
#[test]
fn a_one_shot_tick_opens_the_database_once_runs_it_in_place_and_keeps_the_log_small() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("site/index.html", "v1")], "first");
    let s = Setup::new(&exec_target(
        "site",
        &remote.url(),
        "path = \"site\"",
        "apply = [\"true\"]",
    ));
    // The first tick made the database and folded the log it left (over
    // half a megabyte); the next starts a new log, which syncs its header.
    for _ in 0..2 {
        assert!(s.run(&["tick", "site"]).status.success());
    }
    let trace = traced_no_op_tick(&s, "site", "openat,prctl,fsync,fdatasync");
    // sqlx names its SQLite threads as it starts them.
    let threads: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("PR_SET_NAME"))
        .collect();
    assert!(
        !threads.is_empty() && !threads.iter().any(|l| l.contains("sqlx")),
        "threads started: {threads:#?}"
    );
    let db = format!("\"{}\"", s.db().display());
    let opened = trace.lines().filter(|l| l.contains(&db)).count();
    assert_eq!(opened, 1, "the database opened {opened} times:\n{trace}");
    // Synced: the run's end, and the state directory once (the log's
    // entry in it). The job's claim and the run's start are not: a power
    // cut may lose them, for nothing has run (a run that runs its backend
    // syncs its start first, below), and the end syncs them too.
    let syncs = trace
        .lines()
        .filter(|l| l.contains("fsync(") || l.contains("fdatasync("))
        .count();
    assert!(syncs <= 2, "{syncs} syncs:\n{trace}");
    // The log each of a dozen no-op ticks leaves (about 80 KB a tick).
    let wal = s.db().with_extension("db-wal");
    let sizes: Vec<u64> = (0..12)
        .map(|_| {
            assert!(s.run(&["tick", "site"]).status.success());
            std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0)
        })
        .collect();
    assert!(
        sizes.iter().all(|&n| n <= 512 * 1024),
        "a log over half a megabyte was left behind: {sizes:?}"
    );
    assert!(
        sizes.iter().any(|&n| n > 0),
        "every tick folded the log in: {sizes:?}"
    );
    assert!(
        sizes.windows(2).any(|w| w[1] < w[0]),
        "the log was never folded in: {sizes:?}"
    );
    assert_eq!(s.history("site").len(), 2, "every run on record");
}

/// A run whose checkout is already at the tip begins without waiting for
/// the disk, yet it is on disk before its backend runs: an exec target
/// with `always = true` (its apply runs at every tick) at a commit it has
/// applied syncs the log between the tick's start and its apply command's.
#[test]
fn a_run_at_the_tip_is_on_disk_before_its_backend_runs() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("site/index.html", "v1")], "first");
    let s = Setup::new(&exec_target(
        "site",
        &remote.url(),
        "path = \"site\"",
        "always = true\napply = [\"true\"]",
    ));
    let stdout = synced_before_it_starts(&s, "true", "the apply command");
    assert!(stdout.contains("changed"), "{stdout}");
    assert_eq!(s.history("site").len(), 3, "every run on record");
}

/// A third one-shot tick of `site` under `strace`, asserted to sync
/// something between its own start and the start of `program` (`what`,
/// for the message); what it printed. The first tick made the database
/// and folded the log it left; the second started a new log, which syncs
/// its header as it does: only the third shows whether the run syncs.
fn synced_before_it_starts(s: &Setup, program: &str, what: &str) -> String {
    for _ in 0..2 {
        assert!(s.run(&["tick", "site"]).status.success());
    }
    let (stdout, trace) = traced_tick(s, "site", "execve,fsync,fdatasync");
    let lines: Vec<&str> = trace.lines().collect();
    let started = lines
        .iter()
        .position(|l| {
            l.contains("execve(") && l.contains(&format!("{program}\"")) && l.ends_with("= 0")
        })
        .unwrap_or_else(|| panic!("{what} never started:\n{trace}"));
    assert!(
        lines[1..started]
            .iter()
            .any(|l| l.contains("fsync(") || l.contains("fdatasync(")),
        "{what} started before anything was synced:\n{trace}"
    );
    stdout
}

/// A run at the tip of a target with health checks is on disk before they
/// run, though its backend has nothing to do (`recheck = true`: a tick
/// that applied nothing checks too).
#[test]
fn a_run_at_the_tip_is_on_disk_before_its_health_checks_run() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("site/index.html", "v1")], "first");
    let s = Setup::new(&exec_target(
        "site",
        &remote.url(),
        "path = \"site\"\n[targets.health]\ninterval = \"1s\"\ntimeout = \"5s\"\n\
         recheck = true\n[[targets.health.checks]]\ncommand = [\"test\", \"-f\", \"index.html\"]\n",
        "apply = [\"true\"]",
    ));
    let stdout = synced_before_it_starts(&s, "test", "the health check");
    assert!(stdout.contains("no_change"), "{stdout}");
}

/// An interval tick takes a fetch of its repository made within its
/// interval: targets on one repository share one fetch a round instead of
/// one each (counted at a real `git http-backend`), and a commit pushed
/// without a webhook still reaches every target within two intervals.
#[test]
fn interval_ticks_of_targets_on_one_repository_share_a_fetch_a_round() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("site/index.html", "v1")], "first");
    let token = "tok-7f3a91c0d2e4b5";
    let (server, ca) = GitHttp::start_tls(root.path(), "deploy", token);
    let token_file = root.path().join("token");
    std::fs::write(&token_file, token).expect("write");
    let url = format!("https://127.0.0.1:{}/infra.git", server.port);
    let names = ["a", "b", "c", "d"];
    let targets: String = names
        .iter()
        .map(|n| {
            format!(
                "[[targets]]\nname = \"{n}\"\nrepo = \"{url}\"\npath = \"site\"\ninterval = \"1s\"\n\
                 [targets.git]\nusername = \"deploy\"\ntoken_file = {}\nca_file = {}\n\
                 [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n\n",
                toml_str(&token_file.display().to_string()),
                toml_str(&ca.display().to_string())
            )
        })
        .collect();
    // One worker: the ticks come one after another, so none shares a
    // fetch merely by overlapping another's.
    let s = Setup::with_workers(&targets, 1);
    let daemon = s.serve();
    let ticks = || -> i64 {
        names
            .iter()
            .flat_map(|n| s.history(n))
            .map(|r| r["repeats"].as_i64().unwrap_or(1))
            .sum()
    };
    wait_for(Duration::from_secs(60), "every target's first run", || {
        names.iter().all(|n| !s.history(n).is_empty())
    });
    let fetches = || {
        server
            .requests()
            .lines()
            .filter(|l| l.contains("info/refs?service=git-upload-pack") && l.contains(" 200 "))
            .count() as i64
    };
    let (ticks0, fetches0) = (ticks(), fetches());
    std::thread::sleep(Duration::from_secs(6));
    let (ticked, fetched) = (ticks() - ticks0, fetches() - fetches0);
    // The scheduler looks once a second, so a 1 s target ticks every 1 to
    // 2 s plus its run: four of them tick 8 to 24 times in 6 s with one
    // worker (≥ 12 held only when the passes happened to line up). Eight
    // are enough to show the fetches shared below.
    assert!(ticked >= 8, "only {ticked} interval ticks in 6 s");
    assert!(
        fetched * 2 <= ticked,
        "{fetched} fetches for {ticked} ticks of four targets on one repository"
    );
    let newer = remote.commit(&[("site/index.html", "v2")], "second");
    wait_for(
        Duration::from_secs(10),
        "the new commit on every target",
        || {
            names
                .iter()
                .all(|n| s.target_status(n)["last_applied_sha"] == newer)
        },
    );
    drop(daemon);
}

/// A fetch that fails once (one 502 from the proxy in front of the git
/// server, which then answers again) fails that apply loudly and checks
/// nothing out: it does not fall back to the last applied commit and
/// report that as converged. The next tick applies the pushed commit.
#[test]
fn an_apply_whose_fetch_fails_once_fails_and_the_next_tick_applies() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let first = remote.commit(&[("site/index.html", "v1")], "first");
    let token = "tok-91c0d2e4b7a3f5";
    let (server, ca) = GitHttp::start_tls(root.path(), "deploy", token);
    let token_file = root.path().join("token");
    std::fs::write(&token_file, token).expect("write");
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"site\"\nrepo = \"https://127.0.0.1:{}/infra.git\"\n\
         [targets.git]\nusername = \"deploy\"\ntoken_file = {}\nca_file = {}\n\
         [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n",
        server.port,
        toml_str(&token_file.display().to_string()),
        toml_str(&ca.display().to_string())
    ));
    let out = s.run(&["tick", "site"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(s.target_status("site")["last_applied_sha"], first);

    let second = remote.commit(&[("site/index.html", "v2")], "v2");
    let blip = root.path().join(".fail-next-request");
    std::fs::write(&blip, "").expect("arm");
    let out = s.run(&["tick", "site"]);
    assert!(
        server.requests().contains(" 502 blip"),
        "{}",
        server.requests()
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let st = s.target_status("site");
    assert_eq!(st["last_result"], "failed", "{st}");
    assert_eq!(st["last_applied_sha"], first, "{st}");
    assert!(
        st["last_message"]
            .as_str()
            .unwrap_or("")
            .contains("git fetch of branch `main`"),
        "{st}"
    );
    assert_eq!(
        git(&s.checkout("site"), &["rev-parse", "HEAD"]),
        first,
        "the checkout moved though nothing was applied"
    );

    let out = s.run(&["tick", "site"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(s.target_status("site")["last_applied_sha"], second);
}

/// A cache a killed process left half-made (a non-empty directory without
/// a HEAD: gix refuses to initialise it) is made again, not a failure of
/// every later fetch. Found by the PostgreSQL chaos test: kill -9 during the
/// first fetch left a target failing forever.
#[test]
fn a_half_made_cache_left_by_a_killed_fetch_is_made_again() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("site/index.html", "one")], "one");
    let s = setup_for(&remote.url());
    let out = s.run(&["tick", "site"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let caches: Vec<std::path::PathBuf> = std::fs::read_dir(s.state.join("git"))
        .expect("git dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.extension().is_some_and(|x| x == "git"))
        .collect();
    assert_eq!(caches.len(), 1, "{caches:?}");
    // What a killed init leaves: files, no HEAD.
    std::fs::remove_file(caches[0].join("HEAD")).expect("rm HEAD");
    std::fs::write(caches[0].join("description"), "half made").expect("write");
    let second = remote.commit(&[("site/index.html", "two")], "two");
    let out = s.run(&["tick", "site"]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert_eq!(
        s.target_status("site")["last_applied_sha"],
        second,
        "{said}"
    );
    assert!(caches[0].join("HEAD").is_file());
}
