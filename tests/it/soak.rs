//! Overlap soak: the daemon (four workers, 1 s intervals) fed signed pushes
//! and API reconciles while one-shot `driftless tick`s run on the same
//! targets, until at least `DRIFTLESS_SOAK_TICKS` applies (default 1000)
//! have happened. Each apply holds its target for 100 ms, so two that
//! overlapped would show. No two applies of one target may overlap, every
//! apply must have seen a complete checkout of the commit its run records,
//! every trigger must have taken part, and every answer along the way must
//! be the one documented.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;

const SECRET: &str = "soak-secret";
const TARGETS: usize = 3;

#[test]
fn thousands_of_ticks_from_every_trigger_never_overlap() {
    let _one_at_a_time = heavy();
    let want: usize = std::env::var("DRIFTLESS_SOAK_TICKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let init: Vec<(String, String)> = (0..TARGETS)
        .map(|t| (format!("t{t}/marker"), "m0".to_string()))
        .collect();
    let refs: Vec<(&str, &str)> = init.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    remote.commit(&refs, "first");
    let secret = root.path().join("secret");
    std::fs::write(&secret, SECRET).expect("write");
    let (token, digest) = driftless::auth::new_token().expect("token");
    let mut cfg = format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n\
         [[tokens]]\nname = \"soak\"\nsha256 = \"{digest}\"\nscopes = [\"reconcile:*\"]\n\n",
        toml_str(&secret.display().to_string())
    );
    for t in 0..TARGETS {
        let log = root.path().join(format!("t{t}.log"));
        cfg.push_str(&exec_target(
            &format!("t{t}"),
            &remote.url(),
            &format!("path = \"t{t}\"\ninterval = \"1s\""),
            &format!(
                "apply = [\"sh\", \"-c\", \"echo start $$ $(git rev-parse HEAD) $(cat marker) >> {l}; sleep 0.1; echo end $$ >> {l}\"]\nalways = true",
                l = log.display()
            ),
        ));
    }
    let s = Setup::with_workers(&cfg, 4);
    let daemon = s.serve();
    let port = daemon.port;
    let applies = || -> usize {
        (0..TARGETS)
            .map(|t| {
                log_lines(&root.path().join(format!("t{t}.log")))
                    .iter()
                    .filter(|l| l.starts_with("start"))
                    .count()
            })
            .sum()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();

    // API reconciles: each answered 202 with a job.
    let api = {
        let (stop, auth) = (stop.clone(), format!("Bearer {token}"));
        std::thread::spawn(move || {
            let mut answers: BTreeMap<u16, usize> = BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                let t = fastrand::usize(0..TARGETS);
                let r = http(
                    port,
                    "POST",
                    &format!("/api/v1/targets/t{t}/reconcile"),
                    &[("Authorization", &auth)],
                    b"",
                );
                assert!(
                    r.status != 202 || r.json()["job"].as_i64().is_some(),
                    "202 without a job: {r:?}"
                );
                *answers.entry(r.status).or_insert(0) += 1;
                std::thread::sleep(Duration::from_millis(40));
            }
            answers
        })
    };
    // One-shot ticks.
    let cli: Vec<_> = (0..2)
        .map(|_| {
            let (stop, config) = (stop.clone(), s.config.clone());
            std::thread::spawn(move || {
                let mut codes = BTreeMap::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = fastrand::usize(0..TARGETS);
                    let out = output_within(
                        std::process::Command::new(bin()).args([
                            "--config",
                            config.to_str().expect("utf8"),
                            "tick",
                            &format!("t{t}"),
                        ]),
                        std::time::Duration::from_secs(300),
                    );
                    *codes.entry(out.status.code()).or_insert(0) += 1;
                    std::thread::sleep(Duration::from_millis(150));
                }
                codes
            })
        })
        .collect();
    // Pushes, each a new marker in one target, delivered signed.
    let mut n = 0;
    while applies() < want {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "only {} applies in 10 minutes",
            applies()
        );
        n += 1;
        let t = fastrand::usize(0..TARGETS);
        let sha = remote.commit(
            &[(&format!("t{t}/marker"), &format!("m{n}"))],
            &format!("push {n}"),
        );
        let body = github_push_body(&remote.url(), &sha, &[&format!("t{t}/marker")]);
        let sig = format!("sha256={}", hmac_hex(SECRET, &body));
        let r = http(
            port,
            "POST",
            "/hooks/github",
            &[
                ("X-GitHub-Event", "push"),
                ("X-GitHub-Delivery", &format!("soak-{n}")),
                ("X-Hub-Signature-256", &sig),
            ],
            &body,
        );
        assert_eq!(r.status, 202, "{r:?}");
        std::thread::sleep(Duration::from_millis(60));
    }
    stop.store(true, Ordering::Relaxed);
    let api_answers = api.join().expect("api");
    let mut cli_codes: BTreeMap<Option<i32>, usize> = BTreeMap::new();
    for c in cli {
        for (k, v) in c.join().expect("cli") {
            *cli_codes.entry(k).or_insert(0) += v;
        }
    }
    wait_for(Duration::from_secs(60), "the queue to drain", || {
        s.status()
            .iter()
            .all(|t| t["queued"] == false && t["running"] == false)
    });
    // The interval is a fallback: it comes due only a second after a
    // target's last run, which the other triggers may never leave it on a
    // loaded machine. Idle now, every target gets its interval tick.
    wait_for(
        Duration::from_secs(30),
        "an interval tick once idle",
        || {
            (0..TARGETS).any(|t| {
                s.history(&format!("t{t}"))
                    .iter()
                    .any(|r| r["trigger"].as_str().unwrap_or("").contains("interval"))
            })
        },
    );
    // SIGTERM, not a kill: an interval run that starts after the drain check
    // finishes and is recorded, so the log and the run records still agree.
    let status = daemon.stop();
    assert!(status.success(), "daemon did not stop cleanly: {status}");

    // Check every target's log.
    let mut seen: HashMap<String, String> = HashMap::new(); // sha -> marker it showed
    let mut total = 0;
    let mut overlaps = 0;
    let mut by_trigger: BTreeMap<String, usize> = BTreeMap::new();
    for t in 0..TARGETS {
        let lines = log_lines(&root.path().join(format!("t{t}.log")));
        let mut open: Option<String> = None;
        let mut applied_shas: Vec<String> = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            let parts: Vec<&str> = l.split_whitespace().collect();
            match (parts.as_slice(), &open) {
                (["start", pid, sha, marker], None) => {
                    open = Some(pid.to_string());
                    total += 1;
                    applied_shas.push(sha.to_string());
                    if let Some(prev) = seen.insert(format!("t{t}:{sha}"), marker.to_string()) {
                        assert_eq!(&prev, marker, "t{t}: one commit showed two markers");
                    }
                }
                (["end", pid], Some(p)) if p == pid => open = None,
                _ => {
                    overlaps += 1;
                    eprintln!(
                        "t{t}: overlapping or torn applies at line {i}: {:?}",
                        &lines[i.saturating_sub(2)..(i + 2).min(lines.len())]
                    );
                    // Resynchronise on the next start.
                    open = parts
                        .first()
                        .filter(|k| **k == "start")
                        .and(parts.get(1))
                        .map(|p| p.to_string());
                }
            }
        }
        assert!(open.is_none(), "t{t}: an apply never ended");
        // The log and the run records agree: the commits the applies saw
        // are exactly the commits their runs record.
        let runs = s.history(&format!("t{t}"));
        let mut recorded: Vec<String> = runs
            .iter()
            .filter(|r| r["result"] == "changed")
            .map(|r| r["sha"].as_str().unwrap_or("").to_string())
            .collect();
        recorded.sort();
        applied_shas.sort();
        assert_eq!(
            recorded, applied_shas,
            "t{t}: the commits applied vs the commits recorded"
        );
        for r in &runs {
            for trigger in r["trigger"].as_str().unwrap_or("").split(',') {
                *by_trigger.entry(trigger.to_string()).or_insert(0) += 1;
            }
        }
    }
    // Every way of starting work took part.
    for trigger in ["webhook", "manual", "interval", "cli"] {
        assert!(
            by_trigger.get(trigger).is_some_and(|n| *n > 0),
            "no run was started by {trigger}: {by_trigger:?}"
        );
    }
    // Every apply saw the commit's own marker: a complete checkout of that SHA.
    for (key, marker) in &seen {
        let (t, sha) = key.split_once(':').expect("key");
        let want = git(&remote.work, &["show", &format!("{sha}:{t}/marker")]);
        assert_eq!(
            &want, marker,
            "{t} at {sha} saw marker {marker}, the commit has {want}"
        );
    }
    report(&format!(
        "soak: {total} applies over {TARGETS} targets in {:.0?}, {n} pushes, runs by trigger {by_trigger:?}, API answers {api_answers:?}, one-shot tick exits {cli_codes:?}, {overlaps} overlaps",
        started.elapsed()
    ));
    assert_eq!(overlaps, 0, "applies of one target overlapped");
    assert_eq!(
        api_answers.keys().copied().collect::<Vec<_>>(),
        [202],
        "API reconciles answered otherwise: {api_answers:?}"
    );
    // A one-shot tick either ran (0) or found the target busy (75).
    assert!(
        cli_codes.keys().all(|k| matches!(k, Some(0) | Some(75))),
        "one-shot ticks exited otherwise: {cli_codes:?}"
    );
    assert!(
        cli_codes.get(&Some(0)).is_some_and(|n| *n > 0),
        "no one-shot tick ever ran: {cli_codes:?}"
    );
    assert!(total >= want);
}
