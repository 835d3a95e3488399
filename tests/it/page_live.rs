//! The page kept live (issue 48), in headless Chromium (Debian's
//! `chromium`, driven by tests/cdp.py) against a real `driftless serve`:
//! rows grouped by state move when a run starts and ends without a reload;
//! a running target's page shows its lines as they are printed; a secret
//! the run prints is `[REDACTED]` on the page, in the stream and in what is
//! kept; a viewer whose token reads `web*` sees neither the rows nor the
//! streams of other targets. Screenshots under target/tmp/.

use crate::common::*;

const SECRET: &str = "page-live-canary-5c1a";
const ALL: &str = "page-live-all-token-0001";
const WEB: &str = "page-live-web-token-0002";

fn basic(token: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("viewer:{token}"))
    )
}

/// `web-app` prints `count` (a file in the repository) lines a second
/// apart, then the secret and `fin42` (a word its command line, which
/// the output shows first, does not hold); `db-main` fails.
fn setup(root: &std::path::Path) -> (Remote, Setup) {
    let remote = Remote::new(root, "infra");
    remote.commit(&[("web/count", "1"), ("db/v", "1")], "first");
    let web = "n=$(cat count); i=1; while [ $i -le $n ]; do echo tick $i; sleep 1; i=$((i+1)); done; \
               echo secret=$TOKEN; echo fin$((40+2))";
    let s = Setup::new(&format!(
        "{}{}{}\n{}",
        token_table("all", ALL, &["read", "reconcile:*"]),
        token_table("web", WEB, &["read:web*"]),
        exec_target(
            "web-app",
            &remote.url(),
            "path = \"web\"\ninterval = \"1h\"",
            &format!(
                "apply = [\"sh\", \"-c\", {}]\nenv = {{ TOKEN = \"env:PAGE_TOKEN\" }}",
                toml_str(web)
            ),
        ),
        exec_target(
            "db-main",
            &remote.url(),
            "path = \"db\"\ninterval = \"1h\"",
            "apply = [\"sh\", \"-c\", \"echo db-line; exit 1\"]",
        ),
    ));
    (remote, s)
}

/// The value of the `n`th `step` line cdp.py printed.
fn step(out: &[String], step: &str, n: usize) -> serde_json::Value {
    let line = out
        .iter()
        .filter(|l| l.starts_with(&format!("{{\"{step}\"")))
        .nth(n)
        .unwrap_or_else(|| panic!("no {step} #{n} in {out:?}"));
    serde_json::from_str::<serde_json::Value>(line).expect("json")[step].clone()
}

fn shots() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp");
    std::fs::create_dir_all(&dir).expect("target/tmp");
    dir
}

#[test]
fn the_page_moves_rows_and_streams_a_runs_lines_live_and_only_what_a_viewer_may_read() {
    let root = tempfile::tempdir().expect("tempdir");
    let (remote, s) = setup(root.path());
    let d = Daemon::start_with_env(&s.config, s.path(), &[("PAGE_TOKEN", SECRET)]);
    wait_for(std::time::Duration::from_secs(60), "the first runs", || {
        let done = |t: &str| s.history(t).first().is_some_and(|r| !r["result"].is_null());
        done("web-app") && done("db-main")
    });
    // Five lines a second apart from now on.
    remote.commit(&[("web/count", "5")], "longer");
    let base = format!("http://127.0.0.1:{}", d.port);
    let reconcile = serde_json::json!({"request": {
        "url": format!("{base}/api/v1/targets/web-app/reconcile"),
        "method": "POST",
        "headers": {"Authorization": format!("Bearer {ALL}")}
    }});
    let dir = shots();
    let profile = root.path().join("chromium");
    let in_group = |g: &str| format!("!!document.querySelector('#g-{g} #t-web-app')");
    let board = cdp(
        &profile,
        &serde_json::json!([
            {"headers": {"Authorization": basic(ALL)}},
            {"goto": format!("{base}/")},
            {"wait_js": "document.querySelector('#g-failing #t-db-main .state').textContent"},
            {"eval": "window.__notReloaded = true"},
            reconcile,
            {"wait_js": in_group("running")},
            {"wait_js": "!!document.querySelector('#t-web-app .live-badge')"},
            {"screenshot": dir.join("page-live-dashboard-running.png").display().to_string()},
            {"wait_js": in_group("fine")},
            {"eval": "[window.__notReloaded === true, document.querySelector('#t-web-app .state').textContent, document.querySelector('#sec-running').hidden]"},
            {"screenshot": dir.join("page-live-dashboard.png").display().to_string()},
        ]),
    );
    assert_eq!(
        step(&board, "wait_js", 0),
        "failed",
        "db-main shows as failing"
    );
    assert_eq!(
        step(&board, "eval", 1),
        serde_json::json!([true, "applied", true]),
        "the row moved back to converged, the page never reloaded"
    );

    // The target's page: a run started after it was opened is shown as it
    // prints.
    remote.commit(&[("web/count", "4"), ("web/again", "1")], "again");
    let page = cdp(
        &profile,
        &serde_json::json!([
            {"headers": {"Authorization": basic(ALL)}},
            {"goto": format!("{base}/targets/web-app")},
            {"eval": "window.__notReloaded = true"},
            reconcile,
            {"wait_js": "(o => o && o.textContent.includes('tick 2') && !o.textContent.includes('fin42') && o.textContent)(document.getElementById('output'))"},
            {"screenshot": dir.join("page-live-target-running.png").display().to_string()},
            {"wait_js": "(e => e && e.textContent.includes('ended') && e.textContent)(document.getElementById('run-end'))"},
            {"eval": "[window.__notReloaded === true, document.getElementById('output').textContent]"},
            {"screenshot": dir.join("page-live-target.png").display().to_string()},
            // Dark mode from the system's preference; a phone's width.
            {"media": "dark"},
            {"eval": "getComputedStyle(document.body).backgroundColor"},
            {"screenshot": dir.join("page-live-target-dark.png").display().to_string()},
            {"viewport": [390, 844]},
            {"eval": "document.documentElement.scrollWidth <= window.innerWidth && document.getElementById('t-web-app').getBoundingClientRect().height < 300"},
            // A moment for the new viewport to be painted.
            {"wait_js": "(window.__p = window.__p || Date.now(), Date.now() - window.__p > 500)"},
            {"screenshot": dir.join("page-live-target-phone.png").display().to_string()},
        ]),
    );
    assert_eq!(step(&page, "eval", 2), "rgb(21, 21, 21)", "dark mode");
    assert_eq!(
        step(&page, "eval", 3),
        true,
        "the page is wider than a phone, or its row a column of words"
    );
    let live = step(&page, "wait_js", 0);
    assert!(
        live.as_str().is_some_and(|t| t.contains("tick 1")),
        "{live}"
    );
    let ended = step(&page, "eval", 1);
    assert_eq!(ended[0], true, "the target's page reloaded");
    let page_text = ended[1].as_str().expect("output").to_string();
    assert!(
        page_text.contains("tick 4")
            && page_text.contains("secret=[REDACTED]")
            && page_text.contains("fin42"),
        "{page_text}"
    );
    assert!(!page_text.contains(SECRET));
    let said = step(&page, "wait_js", 1);
    assert!(
        said.as_str().is_some_and(|t| t.contains("ended: changed")),
        "{said}"
    );

    // A viewer who may read web* only.
    let scoped = cdp(
        &profile,
        &serde_json::json!([
            {"headers": {"Authorization": basic(WEB)}},
            {"goto": format!("{base}/")},
            {"wait_js": "document.querySelector('#t-web-app .state').textContent"},
            {"eval": "document.documentElement.outerHTML"},
        ]),
    );
    let scoped = step(&scoped, "eval", 0).as_str().expect("html").to_string();
    assert!(
        scoped.contains("t-web-app") && !scoped.contains("db-main"),
        "{scoped}"
    );

    // What was kept and what a plain reader of the stream gets: redacted.
    let run = s.history("web-app")[0]["id"].as_i64().expect("run");
    let kept = api_call(
        d.port,
        "GET",
        &format!("/api/v1/runs/{run}/output"),
        ALL,
        &serde_json::Value::Null,
    );
    assert!(kept.body.contains("secret=[REDACTED]") && !kept.body.contains(SECRET));
    // Without JavaScript: the run's page holds its whole output.
    let plain = http(
        d.port,
        "GET",
        &format!("/runs/{run}"),
        &[("Authorization", &basic(ALL))],
        b"",
    );
    assert!(
        plain.status == 200
            && plain.body.contains("tick 4")
            && plain.body.contains("secret=[REDACTED]")
            && !plain.body.contains(SECRET),
        "{}",
        plain.body
    );
    let mut stream = sse_get(
        d.port,
        &format!("/runs/{run}/events"),
        &[("Authorization", &basic(ALL))],
    )
    .open();
    let mut streamed = String::new();
    while let Some(e) = stream.next_event(std::time::Duration::from_secs(30)) {
        streamed.push_str(&e.data);
    }
    assert!(streamed.contains("secret=[REDACTED]") && !streamed.contains(SECRET));

    // The web* viewer's streams: no other target's row, run or page.
    let mut rows = sse_get(d.port, "/events", &[("Authorization", &basic(WEB))]).open();
    let first = rows
        .next_event(std::time::Duration::from_secs(30))
        .expect("a row");
    assert!(first.data.contains("web-app"), "{first:?}");
    let db_run = s.history("db-main")[0]["id"].as_i64().expect("db run");
    for path in [
        "/events?target=db-main".to_string(),
        format!("/runs/{db_run}/events"),
    ] {
        match sse_get(d.port, &path, &[("Authorization", &basic(WEB))]) {
            Sse::Refused { status, body } => {
                assert!(status == 403 && !body.contains("db-line"), "{path}: {body}")
            }
            Sse::Open(_) => panic!("{path}: the web* viewer follows db-main"),
        }
    }
    for path in ["/targets/db-main".to_string(), format!("/runs/{db_run}")] {
        let r = http(d.port, "GET", &path, &[("Authorization", &basic(WEB))], b"");
        assert!(
            r.status == 403 && !r.body.contains("db-line"),
            "{path}: {}",
            r.body
        );
    }
    // The stream never names db-main, whatever changes meanwhile.
    std::thread::spawn(move || {
        let _ = api_call(
            d.port,
            "POST",
            "/api/v1/targets/db-main/reconcile?wait=30s",
            ALL,
            &serde_json::Value::Null,
        );
        // Ends the row stream below: the daemon stops.
        d.stop()
    });
    while let Some(e) = rows.next_event(std::time::Duration::from_secs(60)) {
        assert!(!e.data.contains("db-main"), "{e:?}");
    }
    report(&format!(
        "page: screenshots of the live page in {}",
        dir.display()
    ));
}
