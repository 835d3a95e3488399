//! `GET /` in headless Chromium (Debian's `chromium`): every target with its
//! last result and commit, every Nomad deployment waiting for approval with
//! its redacted diff and the curl line that approves it. The screenshot is
//! kept in target/tmp/page.png and named in the test output.

mod common;

use common::*;

const CANARY: &str = "canary-page-secret-71ac";

fn chromium(args: &[&str], profile: &std::path::Path) -> std::process::Output {
    std::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("run chromium (apt-get install chromium; see tests/run.sh)")
}

#[test]
fn the_page_shows_targets_and_pending_approvals_in_a_browser() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("site/index.html", "<p>hello</p>"),
            (
                "jobs/web.nomad.hcl",
                &format!(
                    "job \"web\" {{\n  meta {{\n    driftless_policy = \"approval\"\n  }}\n  group \"web\" {{\n    task \"server\" {{\n      driver = \"docker\"\n      config {{\n        image = \"nginx:1.25\"\n      }}\n      env {{\n        DB_PASSWORD = \"{CANARY}\"\n      }}\n    }}\n  }}\n}}\n"
                ),
            ),
        ],
        "site and web",
    );
    let nomad = NomadStandin::start(root.path());
    let token = root.path().join("nomad-token");
    std::fs::write(&token, &nomad.token).expect("write");
    let s = Setup::new(&format!(
        "{}\n[[targets]]\nname = \"cluster\"\nrepo = \"{}\"\npath = \"jobs\"\ninterval = \"1h\"\n\
         [targets.backend]\nkind = \"nomad\"\naddress = \"{}\"\ntoken_file = {}\n",
        exec_target(
            "site",
            &remote.url(),
            "path = \"site\"\ninterval = \"1h\"",
            "apply = [\"sh\", \"-c\", \"echo <b>rendered</b> >&2; exit 1\"]\nalways = true"
        ),
        remote.url(),
        nomad.address(),
        toml_str(&token.display().to_string()),
    ));
    for t in ["site", "cluster"] {
        let out = s.run(&["tick", t]);
        assert!(out.status.code().is_some(), "{}", text(&out.stderr));
    }
    let intake = Intake::start(&s);
    let url = format!("http://127.0.0.1:{}/", intake.port);

    let profile = root.path().join("chromium-profile");
    let out = chromium(&["--dump-dom", &url], &profile);
    assert!(out.status.success(), "chromium: {}", text(&out.stderr));
    let dom = text(&out.stdout);
    for want in [
        "<h1>driftless</h1>",
        "site",
        "failed",
        "cluster",
        "Waiting for approval",
        "Deployment 1: default/web of <strong>cluster</strong>",
        "new job",
        "[REDACTED]",
        "/api/v1/deployments/1/approve",
        "spec_hash",
        "driftless approve 1",
    ] {
        assert!(dom.contains(want), "the page lacks {want:?}:\n{dom}");
    }
    // Markup from a message is shown as text, not rendered.
    assert!(dom.contains("&lt;b&gt;rendered&lt;/b&gt;"), "{dom}");
    assert!(!dom.contains(CANARY), "a job secret on the page");

    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("page.png");
    let _ = std::fs::remove_file(&shot);
    let out = chromium(
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1200,1000",
            &url,
        ],
        &profile,
    );
    assert!(out.status.success(), "chromium: {}", text(&out.stderr));
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    report(&format!("page: screenshot of GET / at {}", shot.display()));
}
