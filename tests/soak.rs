//! Overlap soak: the daemon (four workers, 1 s intervals) fed signed pushes
//! and API reconciles while one-shot `driftless tick`s run on the same
//! targets, until at least `DRIFTLESS_SOAK_TICKS` applies (default 1000)
//! have happened. No two applies of one target may overlap, and every apply
//! must have seen a complete checkout of the commit its run recorded.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;

const SECRET: &str = "soak-secret";
const TARGETS: usize = 3;

#[test]
fn thousands_of_ticks_from_every_trigger_never_overlap() {
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
                "apply = [\"sh\", \"-c\", \"echo start $$ $(git rev-parse HEAD) $(cat marker) >> {l}; sleep 0.01; echo end $$ >> {l}\"]\nalways = true",
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

    // API reconciles.
    let api = {
        let (stop, auth) = (stop.clone(), format!("Bearer {token}"));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let t = fastrand::usize(0..TARGETS);
                let _ = http(
                    port,
                    "POST",
                    &format!("/api/v1/targets/t{t}/reconcile"),
                    &[("Authorization", &auth)],
                    b"",
                );
                std::thread::sleep(Duration::from_millis(5));
            }
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
                    let out = std::process::Command::new(bin())
                        .args([
                            "--config",
                            config.to_str().expect("utf8"),
                            "tick",
                            &format!("t{t}"),
                        ])
                        .output()
                        .expect("tick");
                    *codes.entry(out.status.code()).or_insert(0) += 1;
                    std::thread::sleep(Duration::from_millis(50));
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
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    api.join().expect("api");
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
    // SIGTERM, not a kill: an interval run that starts after the drain check
    // finishes and is recorded, so the log and the run records still agree.
    let status = daemon.stop();
    assert!(status.success(), "daemon did not stop cleanly: {status}");

    // Check every target's log.
    let mut seen: HashMap<String, String> = HashMap::new(); // sha -> marker it showed
    let mut total = 0;
    for t in 0..TARGETS {
        let lines = log_lines(&root.path().join(format!("t{t}.log")));
        let mut open: Option<String> = None;
        for (i, l) in lines.iter().enumerate() {
            let parts: Vec<&str> = l.split_whitespace().collect();
            match (parts.as_slice(), &open) {
                (["start", pid, sha, marker], None) => {
                    open = Some(pid.to_string());
                    total += 1;
                    if let Some(prev) = seen.insert(format!("t{t}:{sha}"), marker.to_string()) {
                        assert_eq!(&prev, marker, "t{t}: one commit showed two markers");
                    }
                }
                (["end", pid], Some(p)) if p == pid => open = None,
                _ => panic!(
                    "t{t}: overlapping or torn applies at line {i}: {:?}",
                    &lines[i.saturating_sub(2)..(i + 2).min(lines.len())]
                ),
            }
        }
        assert!(open.is_none(), "t{t}: an apply never ended");
        // The log and the run records agree.
        let runs = s.history(&format!("t{t}"));
        let changed = runs.iter().filter(|r| r["result"] == "changed").count();
        assert_eq!(
            changed,
            lines.iter().filter(|l| l.starts_with("start")).count(),
            "t{t}: runs vs applies"
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
        "soak: {total} applies over {TARGETS} targets in {:.0?}, {n} pushes, one-shot tick exits {cli_codes:?}, 0 overlaps",
        started.elapsed()
    ));
    assert!(total >= want);
}
