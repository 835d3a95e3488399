//! Webhook intake over real HTTP, with the forges' real payloads (byte for
//! byte, from tests/fixtures/webhooks) signed here the way each forge signs.
//! The server runs in-process without workers, so every queued job stays in
//! the database to be checked and nothing is ever fetched.

use crate::common::*;
use serde_json::Value;

const SECRET: &str = "It's a Secret to Everybody";
const GITLAB_TOKEN: &str = "gitlab-shared-token-5d2f";

fn setup() -> (Intake, Setup, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("hook-secret");
    std::fs::write(&secret, format!("{SECRET}\n")).expect("write");
    let gl = dir.path().join("gitlab-token");
    std::fs::write(&gl, GITLAB_TOKEN).expect("write");
    let sec = toml_str(&secret.display().to_string());
    let mut cfg = String::new();
    for (name, forge, file) in [
        ("github", "github", &sec),
        ("gitea", "gitea", &sec),
        ("forgejo", "forgejo", &sec),
        ("gitlab", "gitlab", &toml_str(&gl.display().to_string())),
        ("scripts", "generic", &sec),
    ] {
        cfg.push_str(&format!(
            "[[receivers]]\nname = \"{name}\"\nforge = \"{forge}\"\nsecret_file = {file}\n\n"
        ));
    }
    let targets = [
        // name, repo (spelled differently from the payload on purpose), branch, path
        (
            "wp-pipeline",
            "git@github.com:woodpecker-ci/woodpecker.git",
            "main",
            "pipeline",
        ),
        (
            "wp-docs",
            "https://github.com/woodpecker-ci/woodpecker",
            "main",
            "docs",
        ),
        (
            "wp-dev",
            "ssh://git@github.com/woodpecker-ci/woodpecker",
            "dev",
            "",
        ),
        (
            "oxiduct-web",
            "https://github.com/6543/oxiduct.git",
            "main",
            "web",
        ),
        (
            "hello-new",
            "https://github.com/Codertocat/Hello-World",
            "master",
            "nothing-here",
        ),
        (
            "drone-feature",
            "https://github.com/bradrydzewski/drone-test-go.git",
            "feature-branch",
            "",
        ),
        (
            "multi-aaa",
            "http://127.0.0.1:3000/Test-CI/multi-line-secrets",
            "main",
            "aaa",
        ),
        (
            "multi-bbb",
            "http://127.0.0.1:3000/Test-CI/multi-line-secrets.git",
            "main",
            "bbb",
        ),
        (
            "legacy",
            "git@try.gitea.io:gogits/hello-world.git",
            "master",
            "",
        ),
        (
            "initial",
            "http://localhost:3000/example/example",
            "master",
            "elsewhere",
        ),
        (
            "codeberg",
            "https://codeberg.org/meisam/woodpecktester",
            "fdsafdsa",
            "deploy",
        ),
        ("gl-cmd", "git@10.40.8.5:test/woodpecker.git", "main", "cmd"),
        (
            "gl-web",
            "http://10.40.8.5:3200/test/woodpecker",
            "main",
            "web",
        ),
        (
            "script-target",
            "https://git.example.net/ops/infra.git",
            "main",
            "x",
        ),
    ];
    for (name, repo, branch, path) in targets {
        cfg.push_str(&format!(
            "[[targets]]\nname = \"{name}\"\nrepo = \"{repo}\"\nbranch = \"{branch}\"\npath = \"{path}\"\ninterval = \"1h\"\n\
             [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n\n"
        ));
    }
    let s = Setup::new(&cfg);
    // A small body cap for the 413 test.
    let text = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(
        &s.config,
        text.replacen("workers = 4\n", "workers = 4\nmax_body_bytes = 65536\n", 1),
    )
    .expect("config");
    let intake = Intake::start(&s);
    (intake, s, dir)
}

fn github_headers<'a>(event: &'a str, delivery: &'a str, sig: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("Content-Type", "application/json"),
        ("X-GitHub-Event", event),
        ("X-GitHub-Delivery", delivery),
        ("X-Hub-Signature-256", sig),
        ("User-Agent", "GitHub-Hookshot/044aadd"),
    ]
}

/// What Gitea sends: its own headers plus Gogs' and GitHub's.
fn gitea_headers(
    prefix: &str,
    event: &str,
    delivery: &str,
    hex_sig: &str,
    form: bool,
) -> Vec<(String, String)> {
    let mut h = vec![
        (
            "Content-Type".to_string(),
            if form {
                "application/x-www-form-urlencoded"
            } else {
                "application/json"
            }
            .to_string(),
        ),
        (format!("X-{prefix}-Event"), event.to_string()),
        (format!("X-{prefix}-Delivery"), delivery.to_string()),
        (format!("X-{prefix}-Signature"), hex_sig.to_string()),
        ("X-Gogs-Event".into(), event.to_string()),
        ("X-Gogs-Delivery".into(), delivery.to_string()),
        ("X-Gogs-Signature".into(), hex_sig.to_string()),
        ("X-GitHub-Event".into(), event.to_string()),
        ("X-GitHub-Delivery".into(), delivery.to_string()),
        ("X-Hub-Signature-256".into(), format!("sha256={hex_sig}")),
    ];
    if prefix == "Forgejo" {
        // Forgejo sends the Gitea headers too.
        h.push(("X-Gitea-Event".into(), event.to_string()));
        h.push(("X-Gitea-Delivery".into(), delivery.to_string()));
        h.push(("X-Gitea-Signature".into(), hex_sig.to_string()));
    }
    h
}

fn refs(h: &[(String, String)]) -> Vec<(&str, &str)> {
    h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

fn form_body(json: &[u8]) -> Vec<u8> {
    let encoded: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", std::str::from_utf8(json).expect("utf8"))
        .finish();
    encoded.into_bytes()
}

fn queued_targets(r: &HttpResponse) -> Vec<String> {
    let v = r.json();
    let mut t: Vec<String> = v["queued"]
        .as_array()
        .unwrap_or_else(|| panic!("no queued list: {v}"))
        .iter()
        .map(|q| q["target"].as_str().expect("target").to_string())
        .collect();
    t.sort();
    t
}

fn after(fixture_bytes: &[u8]) -> String {
    let v: Value = serde_json::from_slice(fixture_bytes).expect("json");
    v["after"].as_str().expect("after").to_string()
}

#[test]
fn githubs_published_signature_vector_is_accepted() {
    // The vector signs "Hello, World!", which is not a push: it must pass the
    // signature check and then be refused as a body (400), not as a signature (401).
    let (intake, _s, _d) = setup();
    let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    let r = intake.post(
        "/hooks/github",
        &github_headers("push", "vector", sig),
        b"Hello, World!",
    );
    assert_eq!(r.status, 400, "{r:?}");
    let r = intake.post(
        "/hooks/github",
        &github_headers("push", "vector", sig),
        b"Hello, World?",
    );
    assert_eq!(r.status, 401, "{r:?}");
    assert!(intake.jobs().is_empty());
}

#[test]
fn each_forges_real_push_queues_every_target_tracking_the_branch() {
    let (intake, _s, _d) = setup();
    // (receiver, delivery id, headers, body, targets expected to be queued)
    type Case<'a> = (
        &'a str,
        &'a str,
        Vec<(String, String)>,
        Vec<u8>,
        Vec<&'a str>,
    );
    let cases: Vec<Case> = {
        let mut v = Vec::new();
        // GitHub, JSON: both targets on woodpecker's main (which of them the
        // push changed is for git to say, after the fetch).
        let body = fixture("github/push-branch.json");
        let sig = format!("sha256={}", hmac_hex(SECRET, &body));
        v.push((
            "github",
            "gh-1",
            github_headers("push", "gh-1", &sig)
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            body,
            vec!["wp-docs", "wp-pipeline"],
        ));
        // GitHub, form-encoded (its default), a forced push.
        let json = fixture("github/push-branch-forced.json");
        let body = form_body(&json);
        let sig = format!("sha256={}", hmac_hex(SECRET, &body));
        let mut h: Vec<(String, String)> = github_headers("push", "gh-2", &sig)
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        h[0].1 = "application/x-www-form-urlencoded".into();
        v.push(("github", "gh-2", h, body, vec!["oxiduct-web"]));
        // GitHub, a new branch.
        let body = fixture("github/push-branch-create.json");
        let sig = format!("sha256={}", hmac_hex(SECRET, &body));
        v.push((
            "github",
            "gh-3",
            github_headers("push", "gh-3", &sig)
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            body,
            vec!["hello-new"],
        ));
        // Gitea, JSON, three commits.
        let body = fixture("gitea/push-branch-multi.json");
        let hex = hmac_hex(SECRET, &body);
        v.push((
            "gitea",
            "gt-1",
            gitea_headers("Gitea", "push", "gt-1", &hex, false),
            body,
            vec!["multi-aaa", "multi-bbb"],
        ));
        // Gitea, form-encoded: the signature is over the JSON inside `payload`.
        let json = fixture("gitea/push-branch-legacy.json");
        let hex = hmac_hex(SECRET, &json);
        v.push((
            "gitea",
            "gt-2",
            gitea_headers("Gitea", "push", "gt-2", &hex, true),
            form_body(&json),
            vec!["legacy"],
        ));
        // Gitea, the push creating a branch: every target on it.
        let body = fixture("gitea/push-branch-initial.json");
        let hex = hmac_hex(SECRET, &body);
        v.push((
            "gitea",
            "gt-3",
            gitea_headers("Gitea", "push", "gt-3", &hex, false),
            body,
            vec!["initial"],
        ));
        // Forgejo (codeberg), a new branch with no commits listed.
        let body = fixture("forgejo/push-branch-create-codeberg.json");
        let hex = hmac_hex(SECRET, &body);
        v.push((
            "forgejo",
            "fj-1",
            gitea_headers("Forgejo", "push", "fj-1", &hex, false),
            body,
            vec!["codeberg"],
        ));
        // GitLab: the token in clear.
        let body = fixture("gitlab/push-branch.json");
        v.push((
            "gitlab",
            "gl-1",
            vec![
                ("Content-Type".into(), "application/json".into()),
                ("X-Gitlab-Event".into(), "Push Hook".into()),
                ("X-Gitlab-Token".into(), GITLAB_TOKEN.into()),
                ("X-Gitlab-Event-UUID".into(), "gl-1".into()),
            ],
            body,
            vec!["gl-cmd", "gl-web"],
        ));
        v
    };
    for (receiver, delivery, headers, body, expect) in cases {
        let r = intake.post(&format!("/hooks/{receiver}"), &refs(&headers), &body);
        assert_eq!(r.status, 202, "{receiver} {delivery}: {r:?}");
        assert_eq!(
            queued_targets(&r),
            expect,
            "{receiver} {delivery}: {}",
            r.body
        );
        let jobs = intake.jobs();
        for t in &expect {
            let job = jobs
                .iter()
                .find(|j| j.target == *t)
                .unwrap_or_else(|| panic!("no job for {t}"));
            assert_eq!(job.state, "queued");
            assert_eq!(job.triggers, vec!["webhook"]);
            assert_eq!(job.delivery_ids, vec![delivery.to_string()]);
            assert_eq!(job.receiver.as_deref(), Some(receiver));
            let json = if body.starts_with(b"payload=") {
                form_urlencoded::parse(&body)
                    .find(|(k, _)| k == "payload")
                    .expect("payload")
                    .1
                    .into_owned()
                    .into_bytes()
            } else {
                body.clone()
            };
            assert_eq!(job.requested_sha.as_deref(), Some(after(&json).as_str()));
        }
    }
    // Nothing else was queued: not the targets of other branches or
    // repositories.
    let mut all: Vec<String> = intake.jobs().into_iter().map(|j| j.target).collect();
    all.sort();
    assert_eq!(
        all,
        [
            "codeberg",
            "gl-cmd",
            "gl-web",
            "hello-new",
            "initial",
            "legacy",
            "multi-aaa",
            "multi-bbb",
            "oxiduct-web",
            "wp-docs",
            "wp-pipeline"
        ]
    );
}

#[test]
fn tags_deletions_and_other_events_queue_nothing() {
    let (intake, _s, _d) = setup();
    let gh = |fixture_name: &str, event: &str, delivery: &str| {
        let body = fixture(fixture_name);
        let sig = format!("sha256={}", hmac_hex(SECRET, &body));
        intake.post(
            "/hooks/github",
            &github_headers(event, delivery, &sig),
            &body,
        )
    };
    for (f, delivery, reason) in [
        // No target here follows tags (tests/it/tags.rs has one that does).
        (
            "github/push-tag-create.json",
            "t1",
            "no target follows tag `",
        ),
        (
            "github/push-tag-delete.json",
            "t2",
            "no target follows tag `",
        ),
        (
            "github/push-branch-delete.json",
            "t3",
            "branch `feature-branch` was deleted",
        ),
    ] {
        let r = gh(f, "push", delivery);
        assert_eq!(r.status, 202, "{f}: {r:?}");
        let v = r.json();
        assert_eq!(v["queued"], serde_json::json!([]), "{f}");
        assert!(
            v["ignored"].as_str().unwrap_or("").contains(reason),
            "{f}: {v}"
        );
    }
    // A push to a branch no target tracks.
    let body = fixture("github/push-branch.json");
    let text = String::from_utf8(body)
        .expect("utf8")
        .replace("refs/heads/main", "refs/heads/feature-x");
    let sig = format!("sha256={}", hmac_hex(SECRET, text.as_bytes()));
    let r = intake.post(
        "/hooks/github",
        &github_headers("push", "t4", &sig),
        text.as_bytes(),
    );
    assert_eq!(r.status, 202);
    assert!(
        r.json()["ignored"]
            .as_str()
            .unwrap_or("")
            .contains("no target follows branch `feature-x`"),
        "{}",
        r.body
    );
    // Gitea's create and delete events are not pushes.
    for (f, event, delivery) in [
        ("gitea/create-event-tag.json", "create", "t5"),
        ("gitea/delete-event-branch.json", "delete", "t6"),
    ] {
        let body = fixture(f);
        let hex = hmac_hex(SECRET, &body);
        let r = intake.post(
            "/hooks/gitea",
            &refs(&gitea_headers("Gitea", event, delivery, &hex, false)),
            &body,
        );
        assert_eq!(r.status, 202, "{f}: {r:?}");
        assert!(
            r.json()["ignored"]
                .as_str()
                .unwrap_or("")
                .contains(&format!("`{event}` event is not a push")),
            "{}",
            r.body
        );
    }
    // GitLab: a tag push, and a branch deletion.
    for (f, event) in [
        ("gitlab/tag-push-create.json", "Tag Push Hook"),
        ("gitlab/push-branch-delete.json", "Push Hook"),
    ] {
        let r = intake.post(
            "/hooks/gitlab",
            &[
                ("X-Gitlab-Event", event),
                ("X-Gitlab-Token", GITLAB_TOKEN),
                ("Content-Type", "application/json"),
            ],
            &fixture(f),
        );
        assert_eq!(r.status, 202, "{f}: {r:?}");
        assert_eq!(r.json()["queued"], serde_json::json!([]));
    }
    // A ping answers 200.
    let body = fixture("github/ping.json");
    let sig = format!("sha256={}", hmac_hex(SECRET, &body));
    let r = intake.post("/hooks/github", &github_headers("ping", "p1", &sig), &body);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(intake.jobs().is_empty(), "{:?}", intake.jobs());
}

#[test]
fn a_repeated_delivery_id_is_answered_once() {
    let (intake, _s, _d) = setup();
    let body = fixture("github/push-branch.json");
    let sig = format!("sha256={}", hmac_hex(SECRET, &body));
    let r = intake.post(
        "/hooks/github",
        &github_headers("push", "same-id", &sig),
        &body,
    );
    assert_eq!(r.status, 202);
    for _ in 0..3 {
        let r = intake.post(
            "/hooks/github",
            &github_headers("push", "same-id", &sig),
            &body,
        );
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.json()["duplicate"], true);
    }
    // One job per target tracking the branch, each with the delivery once.
    let jobs = intake.jobs();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    for j in &jobs {
        assert_eq!(j.delivery_ids, vec!["same-id"]);
    }
    // The same id at another receiver is another delivery.
    let gbody = fixture("gitea/push-branch-multi.json");
    let hex = hmac_hex(SECRET, &gbody);
    let r = intake.post(
        "/hooks/gitea",
        &refs(&gitea_headers("Gitea", "push", "same-id", &hex, false)),
        &gbody,
    );
    assert_eq!(r.status, 202, "{r:?}");
}

#[test]
fn every_rejection_queues_nothing_and_says_nothing_about_why() {
    let (intake, _s, _d) = setup();
    let body = fixture("github/push-branch.json");
    let good = format!("sha256={}", hmac_hex(SECRET, &body));
    let wrong_secret = format!("sha256={}", hmac_hex("not the secret", &body));
    let other_bytes = format!(
        "sha256={}",
        hmac_hex(SECRET, b"{\"ref\":\"refs/heads/main\"}")
    );
    let mut unauthorized = Vec::new();
    // no signature
    unauthorized.push(intake.post(
        "/hooks/github",
        &[
            ("X-GitHub-Event", "push"),
            ("Content-Type", "application/json"),
        ],
        &body,
    ));
    // malformed signature, wrong signature, wrong secret, signature over other bytes
    for sig in [
        "sha256=zz",
        "sha256=00ff",
        wrong_secret.as_str(),
        other_bytes.as_str(),
        &good[7..],
    ] {
        unauthorized.push(intake.post("/hooks/github", &github_headers("push", "x", sig), &body));
    }
    // the body changed after signing (one byte)
    let mut tampered = body.clone();
    tampered[10] ^= 1;
    unauthorized.push(intake.post(
        "/hooks/github",
        &github_headers("push", "x", &good),
        &tampered,
    ));
    // Gitea's empty signature headers (a hook without a secret)
    let gbody = fixture("gitea/push-branch-multi.json");
    unauthorized.push(intake.post(
        "/hooks/gitea",
        &refs(&gitea_headers("Gitea", "push", "x", "", false)),
        &gbody,
    ));
    // GitLab with a wrong or missing token
    unauthorized.push(intake.post(
        "/hooks/gitlab",
        &[("X-Gitlab-Event", "Push Hook"), ("X-Gitlab-Token", "guess")],
        &fixture("gitlab/push-branch.json"),
    ));
    unauthorized.push(intake.post(
        "/hooks/gitlab",
        &[("X-Gitlab-Event", "Push Hook")],
        &fixture("gitlab/push-branch.json"),
    ));
    // generic without a signature
    unauthorized.push(intake.post("/hooks/scripts", &[], br#"{"repo":"https://git.example.net/ops/infra.git","ref":"refs/heads/main","after":"abc"}"#));
    for r in &unauthorized {
        assert_eq!(r.status, 401, "{r:?}");
        assert_eq!(
            r.json(),
            serde_json::json!({ "error": "unauthorized" }),
            "the body must not say which check failed"
        );
    }

    // malformed JSON after a valid signature: 400
    let junk = b"{\"ref\": \"refs/heads/main\", ";
    let sig = format!("sha256={}", hmac_hex(SECRET, junk));
    let r = intake.post("/hooks/github", &github_headers("push", "x", &sig), junk);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(
        r.json()["error"].as_str().unwrap_or("").contains("JSON"),
        "{}",
        r.body
    );

    // oversized body: 413 (the cap is 64 KiB in this config)
    let big = vec![b' '; 100 * 1024];
    let sig = format!("sha256={}", hmac_hex(SECRET, &big));
    let r = intake.post("/hooks/github", &github_headers("push", "x", &sig), &big);
    assert_eq!(r.status, 413, "{r:?}");

    // unknown receiver: 404; wrong method: 405
    let r = intake.post(
        "/hooks/bitbucket",
        &github_headers("push", "x", &good),
        &body,
    );
    assert_eq!(r.status, 404, "{r:?}");
    let r = http(intake.port, "GET", "/hooks/github", &[], b"");
    assert_eq!(r.status, 405, "{r:?}");

    assert!(
        intake.jobs().is_empty(),
        "a rejected delivery queued a job: {:?}",
        intake.jobs()
    );
}

#[test]
fn generic_senders_sign_the_raw_body() {
    let (intake, _s, _d) = setup();
    let body = br#"{"repo": "git@git.example.net:ops/infra.git", "ref": "refs/heads/main", "after": "0123456789abcdef0123456789abcdef01234567"}"#;
    let sig = format!("sha256={}", hmac_hex(SECRET, body));
    let r = intake.post(
        "/hooks/scripts",
        &[("X-Hub-Signature-256", &sig), ("X-Delivery-Id", "g1")],
        body,
    );
    assert_eq!(r.status, 202, "{r:?}");
    assert_eq!(queued_targets(&r), vec!["script-target"]);
    let jobs = intake.jobs();
    assert_eq!(
        jobs[0].requested_sha.as_deref(),
        Some("0123456789abcdef0123456789abcdef01234567")
    );
}
