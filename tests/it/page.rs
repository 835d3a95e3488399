//! `GET /` in headless Chromium (Debian's `chromium`): every target with its
//! last result and commit, every Nomad deployment waiting for approval with
//! its redacted diff and the curl line that approves it. The screenshot is
//! kept in target/tmp/page.png and named in the test output. Who may see it:
//! a token with a read scope by default (HTTP Basic, so the browser asks),
//! anyone with `page = "open"`, nobody with `page = "off"`.

use crate::common::*;

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
    let mut tokens = String::new();
    let mut secret = std::collections::HashMap::new();
    for (name, scopes) in [
        ("ops", r#"["read", "approve:*"]"#),
        ("web", r#"["read:site"]"#),
        ("deployer", r#"["reconcile:*"]"#),
    ] {
        let (t, digest) = driftless::auth::new_token().expect("token");
        tokens.push_str(&format!(
            "[[tokens]]\nname = \"{name}\"\nsha256 = \"{digest}\"\nscopes = {scopes}\n\n"
        ));
        secret.insert(name, t);
    }
    let s = Setup::new(&format!(
        "{tokens}{}\n[[targets]]\nname = \"cluster\"\nrepo = \"{}\"\npath = \"jobs\"\ninterval = \"1h\"\n\
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
    // The exec target fails (its message is what the page must escape); the
    // Nomad one waits for approval.
    for (t, code) in [("site", 1), ("cluster", 0)] {
        let out = s.run(&["tick", t]);
        assert_eq!(out.status.code(), Some(code), "{t}: {}", text(&out.stderr));
    }
    let intake = Intake::start(&s);
    let url = format!("http://ops:{}@127.0.0.1:{}/", secret["ops"], intake.port);

    // Without a token: 401 and a Basic challenge, nothing about the targets.
    let r = intake.get("/");
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(
        r.header("www-authenticate"),
        Some("Basic realm=\"driftless\", charset=\"UTF-8\""),
        "{:?}",
        r.headers
    );
    for r in [
        basic(&intake, "anyone", "dl_not-a-token"),
        http(
            intake.port,
            "GET",
            "/",
            &[("Authorization", "Bearer dl_not-a-token")],
            b"",
        ),
    ] {
        assert_eq!(r.status, 401, "{}", r.body);
    }
    assert!(
        !r.body.contains("cluster") && !r.body.contains("site"),
        "{}",
        r.body
    );
    // A token that reads nothing: 403, named.
    let r = basic(&intake, "me", &secret["deployer"]);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(
        r.body.contains("`deployer` has no read scope"),
        "{}",
        r.body
    );
    // A token that reads one target sees that target only.
    let r = basic(&intake, "me", &secret["web"]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("<strong>site</strong>"), "{}", r.body);
    assert!(
        !r.body.contains("cluster") && !r.body.contains("/approve"),
        "a target outside the token's read scope is shown:\n{}",
        r.body
    );
    // The same page through a bearer token.
    let bearer = format!("Bearer {}", secret["ops"]);
    let r = http(intake.port, "GET", "/", &[("Authorization", &bearer)], b"");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("<strong>cluster</strong>"), "{}", r.body);

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
        "Deployment 1: nomad plan of job default/web of <strong>cluster</strong>",
        "new job",
        "[REDACTED]",
        "/api/v1/deployments/1/approve",
        "plan_hash",
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

/// `GET /` with HTTP Basic credentials.
fn basic(intake: &Intake, user: &str, password: &str) -> HttpResponse {
    use base64::Engine as _;
    let creds = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    http(
        intake.port,
        "GET",
        "/",
        &[("Authorization", &format!("Basic {creds}"))],
        b"",
    )
}

#[test]
fn an_open_page_needs_no_token_and_an_off_page_is_not_there() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("x", "1")], "first");
    let target = exec_target("lan-box", &remote.url(), "", "apply = [\"true\"]");
    // The default page with no token that may read: the daemon says so.
    let nobody = Setup::new(&target);
    let daemon = nobody.serve();
    assert!(
        daemon.log_text().contains("nobody can open the page at /"),
        "{}",
        daemon.log_text()
    );
    drop(daemon);

    let open = Setup::new(&format!("page = \"open\"\n\n{target}"));
    let daemon = open.serve();
    assert!(
        !daemon.log_text().contains("nobody can open the page"),
        "{}",
        daemon.log_text()
    );
    drop(daemon);
    let intake = Intake::start(&open);
    let r = intake.get("/");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("<strong>lan-box</strong>"), "{}", r.body);
    drop(intake);

    let off = Setup::new(&format!("page = \"off\"\n\n{target}"));
    let intake = Intake::start(&off);
    let r = intake.get("/");
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(!r.body.contains("lan-box"), "{}", r.body);
    // The API is not affected.
    assert_eq!(intake.get("/api/v1/targets").status, 401);

    let bad = Setup::new(&format!("page = \"public\"\n\n{target}"));
    let out = bad.run(&["check"]);
    assert!(!out.status.success());
    let err = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        err.contains("key `page`") && err.contains("`public` is not one of"),
        "{err}"
    );
}

/// A terraform plan waiting under `policy = "approval"` is approved from
/// the page in headless Chromium: the viewer whose token may approve gets
/// the buttons (a read-only one does not), pressing Approve records the
/// decision for exactly that plan and applies nothing, and the next tick
/// applies it. Refused: a form posted from another site (even with a valid
/// CSRF token), a form without or with a wrong CSRF token, and any API
/// change made with HTTP Basic credentials. Screenshots before and after
/// are kept in target/tmp/.
#[test]
fn a_person_approves_a_plan_from_the_page_and_other_sites_cannot() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[(
            "network/main.tf",
            "resource \"terraform_data\" \"greeting\" {\n  input = \"hello\"\n}\n",
        )],
        "network",
    );
    let (ops, ops_digest) = driftless::auth::new_token().expect("token");
    let (viewer, viewer_digest) = driftless::auth::new_token().expect("token");
    let s = Setup::new(&format!(
        "[[tokens]]\nname = \"ops\"\nsha256 = \"{ops_digest}\"\nscopes = [\"read\", \"approve:net\"]\n\n\
         [[tokens]]\nname = \"viewer\"\nsha256 = \"{viewer_digest}\"\nscopes = [\"read\"]\n\n\
         [[targets]]\nname = \"net\"\nrepo = \"{}\"\npath = \"network\"\ninterval = \"1h\"\n\
         policy = \"approval\"\n[targets.backend]\nkind = \"terraform\"\n\
         env = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n",
        remote.url()
    ));
    let out = s.run(&["tick", "net"]);
    let said = text(&out.stdout);
    assert!(
        said.contains("waits for approval"),
        "{said}{}",
        text(&out.stderr)
    );
    let state_file = s.state.join("checkouts/net/network/terraform.tfstate");
    let intake = Intake::start(&s);
    let list = api_call(
        intake.port,
        "GET",
        "/api/v1/deployments?state=pending_approval",
        &ops,
        &serde_json::Value::Null,
    )
    .json();
    let id = list[0]["id"].as_i64().expect("a pending plan");
    let hash = list[0]["plan_hash"].as_str().expect("hash").to_string();
    let basic = |token: &str| {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("me:{token}"))
        )
    };

    // The API changes nothing for Basic credentials (a browser sends them
    // by itself).
    let r = http(
        intake.port,
        "POST",
        &format!("/api/v1/deployments/{id}/reject"),
        &[("Authorization", &basic(&ops))],
        b"",
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("HTTP Basic"), "{}", r.body);
    // The page's forms need their CSRF token.
    // The approve form posted with the ops token, and `extra` headers.
    let post_form = |extra: &[(&str, &str)], body: &str| {
        let auth = basic(&ops);
        let mut headers = vec![
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ];
        headers.extend_from_slice(extra);
        http(
            intake.port,
            "POST",
            &format!("/deployments/{id}/approve"),
            &headers,
            body.as_bytes(),
        )
    };
    let form = |body: &str| post_form(&[], body);
    let r = form(&format!("plan_hash={hash}&csrf={}", "ab".repeat(32)));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("CSRF token does not match"), "{}", r.body);
    assert_eq!(form(&format!("plan_hash={hash}")).status, 400);
    // A read-only viewer sees the plan, not the buttons.
    let r = http(
        intake.port,
        "GET",
        "/",
        &[("Authorization", &basic(&viewer))],
        b"",
    );
    assert!(
        r.body.contains(&format!(
            "Deployment {id}: terraform plan of <strong>net</strong>"
        )) && r.body.contains("+ terraform_data.greeting (create)")
            && !r.body.contains("Approve this plan"),
        "{}",
        r.body
    );

    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let profile = root.path().join("chromium-profile");
    let page = format!("http://127.0.0.1:{}/", intake.port);
    let auth = serde_json::json!({ "headers": { "Authorization": basic(&ops) } });
    let before_html = root.path().join("before.html");
    let shot_before = tmp.join("page-plan-waiting.png");
    cdp(
        &profile,
        &serde_json::json!([auth, { "goto": page }, { "screenshot": shot_before }, { "html": before_html }]),
    );
    let before = std::fs::read_to_string(&before_html).expect("html");
    assert!(before.contains("Approve this plan"), "{before}");
    // The form's own CSRF token, as an attacker who learnt it would use it
    // from a page of theirs: the browser says it comes from another site.
    let csrf = before
        .split(&format!("action=\"/deployments/{id}/approve\""))
        .nth(1)
        .and_then(|rest| rest.split("name=\"csrf\" value=\"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .expect("the approve form's csrf field")
        .to_string();
    let evil = format!(
        "data:text/html,<form method=post action=\"{page}deployments/{id}/approve\">\
         <input name=plan_hash value={hash}><input name=csrf value={csrf}></form>\
         <script>document.forms[0].submit()</script>"
    );
    let evil_html = root.path().join("evil.html");
    cdp(
        &profile,
        &serde_json::json!([auth, { "goto": evil }, { "wait_url": format!("/deployments/{id}/approve") }, { "html": evil_html }]),
    );
    let refused = std::fs::read_to_string(&evil_html).expect("html");
    assert!(
        refused.contains("Refused: this form was sent from another site."),
        "{refused}"
    );
    // The same token from a client that sends no `Sec-Fetch-Site`: the
    // origin it names decides (another site, a sandboxed `null`, a
    // Referer elsewhere when there is no Origin, another port).
    let own = format!("http://127.0.0.1:{}", intake.port);
    let other_port = format!("http://127.0.0.1:{}", intake.port.wrapping_add(1));
    let post_from = |header: &str, value: &str, csrf: &str| {
        post_form(&[(header, value)], &format!("plan_hash={hash}&csrf={csrf}"))
    };
    for (header, value) in [
        ("Origin", "https://evil.example"),
        ("Origin", "null"),
        ("Origin", other_port.as_str()),
        ("Referer", "https://evil.example/x.html"),
    ] {
        let r = post_from(header, value, &csrf);
        assert_eq!(r.status, 403, "{header}: {value}: {}", r.body);
        assert!(
            r.body.contains("sent from another site") && r.body.contains(header),
            "{}",
            r.body
        );
    }
    // The page's own origin with a wrong token is still refused by the
    // token, not by the origin.
    let r = post_from("Origin", &own, &"cd".repeat(32));
    assert!(r.body.contains("CSRF token does not match"), "{}", r.body);
    let pending = |token: &str| {
        api_call(
            intake.port,
            "GET",
            &format!("/api/v1/deployments/{id}"),
            token,
            &serde_json::Value::Null,
        )
        .json()
    };
    assert_eq!(pending(&ops)["state"], "pending_approval");

    // The person presses Approve, on the target's own page.
    let after_html = root.path().join("after.html");
    let shot_after = tmp.join("page-plan-approved.png");
    let lines = cdp(
        &profile,
        &serde_json::json!([
            auth,
            { "goto": format!("{page}targets/net") },
            { "click": format!("#deployment-{id} button.approve") },
            { "html": after_html },
            { "screenshot": shot_after },
        ]),
    );
    let after = std::fs::read_to_string(&after_html).expect("html");
    assert!(
        after.contains(&format!(
            "Deployment {id} of net is approved: the next tick applies"
        )),
        "{after}\n{lines:?}"
    );
    let d = pending(&ops);
    assert_eq!(
        (&d["state"], &d["decided_by"]),
        (&"approved".into(), &"token:ops".into()),
        "{d}"
    );
    assert!(!state_file.exists(), "the page applied something");
    for shot in [&shot_before, &shot_after] {
        let png = std::fs::read(shot).expect("screenshot");
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 5_000,
            "{}",
            shot.display()
        );
    }
    report(&format!(
        "page: screenshots of a waiting plan and of its approval at {} and {}",
        shot_before.display(),
        shot_after.display()
    ));
    drop(intake);
    let out = s.run(&["tick", "net"]);
    assert!(
        text(&out.stdout).contains("net: changed"),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(state_file.exists());
}
