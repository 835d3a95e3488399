//! Crash chaos on intake: a stream of signed GitHub pushes for a handful of
//! targets while the daemon is `kill -9`ed and restarted at random moments.
//! Every delivery answered 2xx must end up applied (the target at or past its
//! newest accepted commit), every accepted delivery id must be on record, and
//! no job may be left running. The same with three instances on one
//! PostgreSQL database, where no two applies of a target may overlap either.
//!
//! `DRIFTLESS_CHAOS_PUSHES` sets the number of pushes (default 1000, about
//! 80 s; run it with more by hand).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;

const SECRET: &str = "chaos-hook-secret";
const TARGETS: usize = 4;

/// A push the daemon answered 2xx.
struct Accepted {
    target: usize,
    sha: String,
    delivery: String,
    /// Its place in the stream: the n-th commit (the history is linear, so
    /// a commit is at or past this one when its place is at least this).
    n: i64,
    /// When its first attempt was sent (Unix ms): a run that covers it
    /// started after this.
    sent_ms: i64,
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A run as the per-delivery check reads it: target, commit, the commit
/// its push asked for, start (Unix ms), result, message.
type RunRow = (
    String,
    Option<String>,
    Option<String>,
    i64,
    Option<String>,
    Option<String>,
);

/// What the SQLite chaos test reads once everything settled: the
/// delivery ids on record, jobs still running, (job accepted, run started)
/// of webhook jobs, every run, jobs closed in silence.
type Read = (Vec<String>, i64, Vec<(i64, i64)>, Vec<RunRow>, Outcomes);

/// (a job's outcome, how many jobs ended so).
type Outcomes = Vec<(String, i64)>;

const RUNS: &str = "SELECT target, sha, requested_sha, started_at, result, message FROM runs";

/// The accepted deliveries no run accounts for: for each, a run of its
/// target that started after it was sent must have applied (or found
/// applied) its commit or a later one — or, for a job driftless died
/// during `queue::MAX_ATTEMPTS` times, have failed saying so (the owners
/// are told) for that commit or a later one. `place` maps a commit to its
/// place in the stream.
fn unaccounted<'a>(
    accepted: &'a [Accepted],
    runs: &[RunRow],
    place: &std::collections::HashMap<String, i64>,
) -> Vec<&'a str> {
    let at = |sha: &Option<String>| sha.as_ref().and_then(|s| place.get(s)).copied();
    accepted
        .iter()
        .filter(|a| {
            let name = format!("t{}", a.target);
            !runs
                .iter()
                .any(|(target, sha, requested, started, result, message)| {
                    if *target != name || *started < a.sent_ms {
                        return false;
                    }
                    match result.as_deref() {
                        Some("changed" | "no_change") => at(sha).is_some_and(|n| n >= a.n),
                        Some("failed") => {
                            message
                                .as_deref()
                                .is_some_and(|m| m.starts_with("not run: driftless was stopped"))
                                && at(requested).is_some_and(|n| n >= a.n)
                        }
                        _ => false,
                    }
                })
        })
        .map(|a| a.delivery.as_str())
        .collect()
}

#[test]
fn no_accepted_push_is_lost_across_kill_9() {
    let _one_at_a_time = heavy();
    let pushes = pushes();
    let root = tempfile::tempdir().expect("tempdir");
    let (remote, secret) = repository(root.path());
    let mut cfg = format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n",
        toml_str(&secret.display().to_string())
    );
    for i in 0..TARGETS {
        cfg.push_str(&exec_target(
            &format!("t{i}"),
            &remote.url(),
            &format!("path = \"t{i}\"\ninterval = \"1h\""),
            "apply = [\"sh\", \"-c\", \"sleep 0.05\"]",
        ));
    }
    let s = Setup::new(&cfg);
    let daemon = Arc::new(Mutex::new(Some(s.serve())));
    let port = daemon.lock().expect("lock").as_ref().expect("daemon").port;
    // A forge sends to one address: every restart listens where the first
    // daemon did.
    let fixed = std::fs::read_to_string(&s.config)
        .expect("config")
        .replacen(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
            1,
        );
    std::fs::write(&s.config, fixed).expect("config");

    // The killer: kill -9 and restart at random moments while pushes flow.
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    // When each kill happened (Unix ms).
    let kill_times: Arc<Mutex<Vec<i64>>> = Default::default();
    let killer = {
        let (stop, kills, daemon, config, kill_times) = (
            stop.clone(),
            kills.clone(),
            daemon.clone(),
            s.config.clone(),
            kill_times.clone(),
        );
        let setup_dir = s.path().to_path_buf();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(fastrand::u64(200..900)));
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let mut d = daemon.lock().expect("lock");
                if let Some(old) = d.take() {
                    old.kill9();
                    kills.fetch_add(1, Ordering::Relaxed);
                    kill_times.lock().expect("lock").push(unix_ms());
                }
                std::thread::sleep(Duration::from_millis(fastrand::u64(0..300)));
                *d = Some(Daemon::start_with(&config, &setup_dir));
            }
        })
    };

    // The stream: a commit per push, then the signed delivery, retried a
    // little like a forge would while the daemon is down.
    let mut accepted: Vec<Accepted> = Vec::new();
    let mut place = std::collections::HashMap::new();
    let mut sent = 0;
    let stream_started = std::time::Instant::now();
    for n in 0..pushes {
        let t = fastrand::usize(0..TARGETS);
        let sha = remote.commit(
            &[(&format!("t{t}/v"), &n.to_string())],
            &format!("push {n}"),
        );
        place.insert(sha.clone(), n as i64);
        let body = github_push_body(&remote.url(), &sha, &[&format!("t{t}/v")]);
        let sig = format!("sha256={}", hmac_hex(SECRET, &body));
        let delivery = format!("chaos-{n}");
        let sent_ms = unix_ms();
        for _attempt in 0..3 {
            sent += 1;
            let r = try_post(port, &body, &sig, &delivery);
            if matches!(r, Some(200..=299)) {
                accepted.push(Accepted {
                    target: t,
                    sha: sha.clone(),
                    delivery: delivery.clone(),
                    n: n as i64,
                    sent_ms,
                });
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let stream_time = stream_started.elapsed();
    killer.join().expect("killer");
    // A final restart, then let everything settle.
    {
        let mut d = daemon.lock().expect("lock");
        if let Some(old) = d.take() {
            old.kill9();
        }
        *d = Some(Daemon::start_with(&s.config, s.path()));
    }
    wait_for(Duration::from_secs(120), "every target idle", || {
        s.status()
            .iter()
            .all(|t| t["queued"] == false && t["running"] == false)
    });

    // Every target is at or past its newest accepted commit.
    let lost = targets_behind(&s, &remote, &accepted);
    // Every accepted delivery id is on record, and nothing is stuck running.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let (recorded, running, spans, runs, closed): Read = rt.block_on(async {
        let store = driftless::store::Store::open(&s.db()).await.expect("db");
        let runs = sqlx::query_as(RUNS)
            .fetch_all(store.pool())
            .await
            .expect("runs");
        // A job closed without a run of its own that is neither folded,
        // skipped nor unaffected: closed in silence.
        let closed: Outcomes = sqlx::query_as(NO_RUN)
            .fetch_all(store.pool())
            .await
            .expect("jobs");
        let closed = silent(&closed);
        let ids = sqlx::query_scalar("SELECT delivery_id FROM deliveries")
            .fetch_all(store.pool())
            .await
            .expect("deliveries");
        let running = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE state = 'running'")
            .fetch_one(store.pool())
            .await
            .expect("jobs");
        // When each webhook job was accepted, and when its run started.
        let spans = sqlx::query_as(
            "SELECT j.created_at, r.started_at FROM jobs j JOIN runs r ON r.job_id = j.id
             WHERE j.triggers LIKE '%webhook%' AND r.result IN ('changed', 'no_change')",
        )
        .fetch_all(store.pool())
        .await
        .expect("runs");
        (ids, running, spans, runs, closed)
    });
    let kill_times = kill_times.lock().expect("lock").clone();
    // Accepted before a kill, applied after it: the queue carried it
    // across the crash.
    let survived = spans
        .iter()
        .filter(|(accepted_at, ran_at)| kill_times.iter().any(|k| accepted_at < k && k < ran_at))
        .count();
    let missing: Vec<&String> = accepted
        .iter()
        .map(|a| &a.delivery)
        .filter(|d| !recorded.contains(d))
        .collect();
    let unrun = unaccounted(&accepted, &runs, &place);
    let gave_up = given_up(&runs);
    report(&format!(
        "chaos: {pushes} pushes, {sent} deliveries sent, {} accepted, {} kills, {survived} jobs accepted before a kill and run after it, {} lost, {} accepted ids missing, {} accepted deliveries without a run after them, {gave_up} jobs failed as interrupted {} times, closed in silence: {closed:?}",
        accepted.len(),
        kills.load(Ordering::Relaxed),
        lost,
        missing.len(),
        unrun.len(),
        driftless::queue::MAX_ATTEMPTS,
    ));
    // The daemon was killed about every half second to second (the killer
    // waits 0.2-0.9 s, kills, waits 0-0.3 s, restarts), ...
    let kills_n = kills.load(Ordering::Relaxed);
    let every = stream_time / (kills_n.max(1) as u32);
    assert!(
        kills_n > 0 && every >= Duration::from_millis(300) && every <= Duration::from_secs(3),
        "{kills_n} kills in {stream_time:?}: one every {every:?}"
    );
    // ... most deliveries were still accepted (a forge retries the rest) ...
    assert!(
        accepted.len() * 10 >= pushes * 6,
        "only {} of {pushes} pushes accepted",
        accepted.len()
    );
    // ... and some accepted jobs outlived a kill before they ran.
    assert!(survived > 0, "no accepted job was carried across a kill");
    assert_eq!(lost, 0, "accepted pushes were not applied");
    assert!(
        missing.is_empty(),
        "accepted deliveries not on record: {missing:?}"
    );
    assert!(
        unrun.is_empty(),
        "accepted deliveries with no run of their target after them at or past their commit: {unrun:?}"
    );
    assert!(closed.is_empty(), "jobs closed without a run: {closed:?}");
    assert_eq!(running, 0, "jobs left running");
}

/// Jobs closed with no run, by outcome.
const NO_RUN: &str = "SELECT COALESCE(outcome, '(none)'), COUNT(*) FROM jobs
     WHERE state = 'done' AND run_id IS NULL GROUP BY outcome";

/// Of `no_run` (outcome, count), the jobs closed in silence: neither merged
/// into another job (which the per-delivery check follows), skipped (paused, a busy interval tick, a removed
/// target) nor left alone by a push that did not affect their target.
fn silent(no_run: &[(String, i64)]) -> Outcomes {
    no_run
        .iter()
        .filter(|(o, _)| {
            !(o.starts_with("skipped")
                || o.starts_with("unaffected")
                || o.starts_with("merged into job"))
                && o != "target no longer configured"
        })
        .cloned()
        .collect()
}

/// How many runs failed because driftless died during their job too often.
fn given_up(runs: &[RunRow]) -> usize {
    runs.iter()
        .filter(|r| {
            r.5.as_deref()
                .is_some_and(|m| m.starts_with("not run: driftless was stopped"))
        })
        .count()
}

/// How many targets are not at or past their newest accepted commit
/// (`accepted`: target, commit, delivery), as `setup`'s `status` says.
fn targets_behind(setup: &Setup, remote: &Remote, accepted: &[Accepted]) -> usize {
    let mut lost = 0;
    for t in 0..TARGETS {
        let Some(newest) = accepted
            .iter()
            .rev()
            .find(|a| a.target == t)
            .map(|a| &a.sha)
        else {
            continue;
        };
        let st = setup.target_status(&format!("t{t}"));
        let applied = st["last_applied_sha"].as_str().unwrap_or("").to_string();
        let ok = !applied.is_empty()
            && std::process::Command::new("git")
                .args(["merge-base", "--is-ancestor", newest, &applied])
                .current_dir(&remote.work)
                .status()
                .is_ok_and(|s| s.success());
        if !ok {
            lost += 1;
            eprintln!("t{t}: newest accepted {newest}, applied {applied:?}: {st}");
        }
    }
    lost
}

/// `DRIFTLESS_CHAOS_PUSHES`, or 1000.
fn pushes() -> usize {
    std::env::var("DRIFTLESS_CHAOS_PUSHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// The repository the pushes go to (a file `t<i>/v` per target), and the
/// receiver's secret in a file.
fn repository(root: &std::path::Path) -> (Remote, std::path::PathBuf) {
    let remote = Remote::new(root, "infra");
    let files: Vec<(String, String)> = (0..TARGETS)
        .map(|i| (format!("t{i}/v"), "0".to_string()))
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    remote.commit(&refs, "first");
    let secret = root.join("secret");
    std::fs::write(&secret, SECRET).expect("write");
    (remote, secret)
}

/// POST a delivery; `None` when the daemon is not there to answer.
fn try_post(port: u16, body: &[u8], sig: &str, delivery: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let head = format!(
        "POST /hooks/github HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n\
         X-GitHub-Event: push\r\nX-GitHub-Delivery: {delivery}\r\nX-Hub-Signature-256: {sig}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split_whitespace().nth(1)?.parse().ok()
}

/// Three instances (`serve`, each with its own state directory, as on three
/// hosts) started at once on one new PostgreSQL database; signed pushes
/// spread across them while one or another is `kill -9`ed and restarted
/// at random, its running commands orphaned. Every accepted delivery is on record and
/// applied, every target at or past its newest accepted commit, no job is
/// left running — and no two applies of a target ever overlapped, whoever
/// ran them and however they were orphaned: each apply writes `start` and,
/// 0.3 s later (4 s for `t0`, past the 3 s lease), `end` to its target's
/// log, and no `start` may follow a `start`.
///
/// `DRIFTLESS_CHAOS_PUSHES` sets the number of pushes (default 1000).
#[test]
fn three_instances_on_postgres_lose_nothing_and_never_overlap() {
    const INSTANCES: usize = 3;
    let _one_at_a_time = heavy();
    let pushes = pushes();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let url = rt.block_on(driftless::store::testing::database());
    let root = tempfile::tempdir().expect("tempdir");
    let (remote, secret) = repository(root.path());
    let logs: Vec<std::path::PathBuf> = (0..TARGETS)
        .map(|i| root.path().join(format!("t{i}.log")))
        .collect();
    let mut cfg = format!(
        "[database]\nurl = {}\nlease = \"3s\"\n\n[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n",
        toml_str(&url),
        toml_str(&secret.display().to_string())
    );
    for (i, log) in logs.iter().enumerate() {
        cfg.push_str(&exec_target(
            &format!("t{i}"),
            &remote.url(),
            &format!("path = \"t{i}\"\ninterval = \"1h\""),
            &format!(
                "apply = [\"sh\", \"-c\", \"echo start >> {log}; sleep {secs}; echo end >> {log}\"]",
                log = log.display(),
                // t0's applies outlive the lease: one orphaned by a kill
                // is kept from the other instances by its keeper alone.
                secs = if i == 0 { "4" } else { "0.3" }
            ),
        ));
    }
    // Each instance on a port of its own, kept across restarts (a load
    // balancer sends to fixed addresses).
    let setups: Vec<Setup> = (0..INSTANCES).map(|_| Setup::new(&cfg)).collect();
    let mut ports = Vec::new();
    let mut first = Vec::new();
    // All three start at once on the empty database: the migrations are
    // applied by whichever gets there first, and the others wait for them.
    let started: Vec<Daemon> = std::thread::scope(|scope| {
        let handles: Vec<_> = setups.iter().map(|s| scope.spawn(|| s.serve())).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("an instance started"))
            .collect()
    });
    for (s, d) in setups.iter().zip(started) {
        let port = d.port;
        let fixed = std::fs::read_to_string(&s.config)
            .expect("config")
            .replacen(
                "listen = \"127.0.0.1:0\"",
                &format!("listen = \"127.0.0.1:{port}\""),
                1,
            );
        std::fs::write(&s.config, fixed).expect("config");
        ports.push(port);
        first.push(Some(d));
    }
    let daemons = Arc::new(Mutex::new(first));

    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (stop, kills, daemons) = (stop.clone(), kills.clone(), daemons.clone());
        let places: Vec<(std::path::PathBuf, std::path::PathBuf)> = setups
            .iter()
            .map(|s| (s.config.clone(), s.path().to_path_buf()))
            .collect();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(fastrand::u64(300..1500)));
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let i = fastrand::usize(0..INSTANCES);
                let old = daemons.lock().expect("lock")[i].take();
                if let Some(old) = old {
                    old.kill9();
                    kills.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(fastrand::u64(0..300)));
                let (config, dir) = &places[i];
                let new = Daemon::start_with(config, dir);
                daemons.lock().expect("lock")[i] = Some(new);
            }
        })
    };

    let mut accepted: Vec<Accepted> = Vec::new();
    let mut place = std::collections::HashMap::new();
    let mut sent = 0;
    let mut answered_by = [0usize; INSTANCES];
    for n in 0..pushes {
        let t = fastrand::usize(0..TARGETS);
        let sha = remote.commit(
            &[(&format!("t{t}/v"), &n.to_string())],
            &format!("push {n}"),
        );
        place.insert(sha.clone(), n as i64);
        let sent_ms = unix_ms();
        let body = github_push_body(&remote.url(), &sha, &[&format!("t{t}/v")]);
        let sig = format!("sha256={}", hmac_hex(SECRET, &body));
        let delivery = format!("chaos-pg-{n}");
        // The balancer tries the instances from a random one on.
        let from = fastrand::usize(0..INSTANCES);
        for attempt in 0..INSTANCES * 2 {
            let i = (from + attempt) % INSTANCES;
            sent += 1;
            if matches!(try_post(ports[i], &body, &sig, &delivery), Some(200..=299)) {
                accepted.push(Accepted {
                    target: t,
                    sha: sha.clone(),
                    delivery: delivery.clone(),
                    n: n as i64,
                    sent_ms,
                });
                answered_by[i] += 1;
                break;
            }
            if attempt + 1 >= INSTANCES {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    killer.join().expect("killer");
    // Every instance up again, then let everything settle.
    for (i, s) in setups.iter().enumerate() {
        let mut d = daemons.lock().expect("lock");
        if d[i].is_none() {
            d[i] = Some(s.serve());
        }
    }
    wait_for(Duration::from_secs(180), "every target idle", || {
        setups[0]
            .status()
            .iter()
            .all(|t| t["queued"] == false && t["running"] == false)
    });

    // Read from another instance than the one the waiting asked.
    let lost = targets_behind(&setups[1], &remote, &accepted);
    let (recorded, running, runs, closed): (Vec<String>, i64, Vec<RunRow>, Outcomes) =
        rt.block_on(async {
            let store = driftless::store::Store::open_postgres(&url)
                .await
                .expect("db");
            let runs = sqlx::query_as(RUNS)
                .fetch_all(store.pool())
                .await
                .expect("runs");
            let closed: Outcomes = sqlx::query_as(NO_RUN)
                .fetch_all(store.pool())
                .await
                .expect("jobs");
            let closed = silent(&closed);
            let ids = sqlx::query_scalar("SELECT delivery_id FROM deliveries")
                .fetch_all(store.pool())
                .await
                .expect("deliveries");
            let running = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE state = 'running'")
                .fetch_one(store.pool())
                .await
                .expect("jobs");
            (ids, running, runs, closed)
        });
    let missing: Vec<&String> = accepted
        .iter()
        .map(|a| &a.delivery)
        .filter(|d| !recorded.contains(d))
        .collect();
    let unrun = unaccounted(&accepted, &runs, &place);
    let gave_up = given_up(&runs);
    let mut applies = 0;
    let mut overlaps = 0;
    for log in &logs {
        let lines: Vec<String> = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        applies += lines.iter().filter(|l| *l == "start").count();
        overlaps += lines
            .windows(2)
            .filter(|w| w[0] == "start" && w[1] == "start")
            .count();
    }
    report(&format!(
        "chaos on PostgreSQL: {INSTANCES} instances, {pushes} pushes, {sent} deliveries sent, {} accepted (by instance: {answered_by:?}), {} kills, {applies} applies, {overlaps} overlapping, {lost} lost, {} accepted ids missing, {} accepted deliveries without a run after them, {gave_up} jobs failed as interrupted {} times, closed in silence: {closed:?}",
        accepted.len(),
        kills.load(Ordering::Relaxed),
        missing.len(),
        unrun.len(),
        driftless::queue::MAX_ATTEMPTS,
    ));
    assert!(kills.load(Ordering::Relaxed) > 0, "nothing was killed");
    assert!(
        answered_by.iter().all(|n| *n > 0),
        "an instance accepted nothing: {answered_by:?}"
    );
    assert!(
        accepted.len() * 10 >= pushes * 8,
        "only {} of {pushes} pushes accepted",
        accepted.len()
    );
    assert_eq!(overlaps, 0, "applies of one target overlapped");
    assert_eq!(lost, 0, "accepted pushes were not applied");
    assert!(
        missing.is_empty(),
        "accepted deliveries not on record: {missing:?}"
    );
    assert!(
        unrun.is_empty(),
        "accepted deliveries with no run of their target after them at or past their commit: {unrun:?}"
    );
    assert!(closed.is_empty(), "jobs closed without a run: {closed:?}");
    assert_eq!(running, 0, "jobs left running");
}
