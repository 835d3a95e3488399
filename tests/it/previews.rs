//! Pull-request previews through the daemon: a pull request's head is
//! planned in a checkout of its own and shown on the pull request in one
//! comment, edited in place on every new head, with a
//! `driftless/<target>/preview` status; nothing is applied, forks are not
//! planned unless asked, a pull request that touches no target path is
//! planned for none, a closed one drops its queued previews, and a preview
//! neither waits for an apply nor blocks one. Against the real binary, git
//! remotes on disk and `tests/forge_standin.py`.

use std::time::Duration;

use serde_json::Value;

use crate::common::*;

const SECRET: &str = "preview-hook-secret";
const CANARY: &str = "canary-preview-secret-61f0";
/// A value in a SOPS file of the target: a preview must never see it.
const SOPS_CANARY: &str = "canary-preview-sops-7d2e";

struct Fx {
    root: tempfile::TempDir,
    forge: ForgeStandin,
    remote: Remote,
    s: Setup,
    main: String,
    kind: &'static str,
    /// Every plan the target ran, one line each: the `v` it planned.
    plans: std::path::PathBuf,
    applies: std::path::PathBuf,
}

/// An exec target `app` (path `app`) with `previews`, its statuses and
/// comments on forge `f` of `kind`, behind a `kind` receiver. Its plan
/// prints one line with `v` and a secret from the environment and writes
/// `v` to a log; when the checkout has `slow-plan` it first waits for the
/// file `release-plan` (`Fx::release`), and the apply with `slow-apply` for
/// `release-apply` (two minutes at most).
fn fx(kind: &'static str, previews: &str) -> Fx {
    fx_with(kind, previews, false)
}

/// [`fx`], and with `base`: an exec target `base` whose output `v` is
/// `base/v`, which `app` takes as the input `BASE_V`.
fn fx_with(kind: &'static str, previews: &str, base: bool) -> Fx {
    fx_opts(kind, previews, base, false)
}

/// [`fx_with`], and with `sops`: `app/secret.yaml` holds `value:
/// SOPS_CANARY` encrypted for an age key `app` decrypts with, and the plan
/// prints its `value` line too.
fn fx_opts(kind: &'static str, previews: &str, base: bool, sops: bool) -> Fx {
    let root = tempfile::tempdir().expect("tempdir");
    let forge = ForgeStandin::start(root.path());
    let remote = Remote::new(root.path(), "infra");
    let mut files = vec![
        ("app/v", "1\n".to_string()),
        ("docs/README", "hi\n".to_string()),
    ];
    if base {
        files.extend([
            ("base/v", "produced-value".to_string()),
            (
                "base/out.sh",
                "printf '{\"v\": \"%s\"}\\n' \"$(cat v)\"\n".to_string(),
            ),
        ]);
    }
    let mut decrypt = String::new();
    let mut show_secret = "";
    if sops {
        let (key, recipient) = age_key(root.path(), "age.key");
        files.push((
            "app/secret.yaml",
            sops_encrypt(
                root.path(),
                "secret.yaml",
                &format!("value: {SOPS_CANARY}\n"),
                &recipient,
            ),
        ));
        decrypt = format!(
            "\n[targets.decrypt]\nsops = true\nage_key_file = {}",
            toml_str(&key.display().to_string())
        );
        show_secret = "; grep '^value' secret.yaml";
    }
    let files: Vec<(&str, &str)> = files.iter().map(|(p, c)| (*p, c.as_str())).collect();
    let main = remote.commit(&files, "first");
    let secret_file = root.path().join("hook-secret");
    std::fs::write(&secret_file, SECRET).expect("write");
    let plans = root.path().join("plans.log");
    let applies = root.path().join("applies.log");
    let repo = if kind == "gitlab" {
        "group/infra"
    } else {
        "me/infra"
    };
    let hold = |file: &str, until: &std::path::Path| {
        format!(
            "if [ -f {file} ]; then n=0; while [ ! -f {u} ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done; fi",
            u = until.display()
        )
    };
    let plan = format!(
        "plan = [\"sh\", \"-c\", \"{}; cat v >> {p}; echo \\\"~ app.v $(cat v) $SECRET\\\"{show_secret}\"]",
        hold("slow-plan", &root.path().join("release-plan")),
        p = plans.display()
    );
    let apply = format!(
        "apply = [\"sh\", \"-c\", \"{}; cat v >> {a}\"]\nenv = {{ SECRET = \"env:PREVIEW_SECRET\" }}",
        hold("slow-apply", &root.path().join("release-apply")),
        a = applies.display()
    );
    let producer = if base {
        exec_target(
            "base",
            &remote.url(),
            "path = \"base\"\ninterval = \"1h\"",
            "apply = [\"true\"]\noutputs = [\"sh\", \"out.sh\"]",
        )
    } else {
        String::new()
    };
    let takes = if base {
        "\ninputs = { BASE_V = \"base.outputs.v\" }"
    } else {
        ""
    };
    let s = Setup::new(&format!(
        "[[receivers]]\nname = \"{kind}\"\nforge = \"{kind}\"\nsecret_file = {}\n\n{}{}{producer}",
        toml_str(&secret_file.display().to_string()),
        exec_target(
            "app",
            &remote.url(),
            &format!(
                "path = \"app\"\nforge = \"f\"\nforge_repo = \"{repo}\"\ninterval = \"1h\"\npreviews = {previews}{takes}{decrypt}"
            ),
            &format!("{plan}\n{apply}"),
        ),
        forge.table("f", kind),
    ));
    Fx {
        root,
        forge,
        remote,
        s,
        main,
        kind,
        plans,
        applies,
    }
}

impl Fx {
    fn serve(&self) -> Daemon {
        let d = Daemon::start_with_env(
            &self.s.config,
            self.s.path(),
            &[("RUST_LOG", "info"), ("PREVIEW_SECRET", CANARY)],
        );
        wait_for(Duration::from_secs(60), "the first tick", || {
            self.s
                .status()
                .iter()
                .all(|t| t["running"] == false && !t["last_result"].is_null())
        });
        d
    }

    /// Let a held plan (`"plan"`) or apply (`"apply"`) go on.
    fn release(&self, what: &str) {
        std::fs::write(self.root.path().join(format!("release-{what}")), "").expect("release");
    }

    fn head_ref(&self, number: u64) -> String {
        if self.kind == "gitlab" {
            format!("refs/merge-requests/{number}/head")
        } else {
            format!("refs/pull/{number}/head")
        }
    }

    /// Push `files` as pull request `number`'s new head, deliver the event
    /// (`action` in the forge's words) and return the head and the answer.
    fn open(
        &self,
        d: &Daemon,
        number: u64,
        files: &[(&str, &str)],
        action: &str,
        fork: bool,
    ) -> (String, Value) {
        let head = self
            .remote
            .pull_request(&self.head_ref(number), files, "change");
        let answer = self.deliver(d, number, &head, action, fork);
        (head, answer)
    }

    fn deliver(&self, d: &Daemon, number: u64, head: &str, action: &str, fork: bool) -> Value {
        let (body, event) = pull_body(self.kind, action, &self.remote.url(), number, head, fork);
        let id = format!("pr-{number}-{action}-{}", fastrand::u32(..));
        let r = deliver_event(d.port, self.kind, event, SECRET, &body, &id);
        assert_eq!(r.status, 202, "{}", r.body);
        r.json()
    }

    /// driftless's comments on pull request `number`.
    fn comments(&self, number: u64) -> Vec<Value> {
        self.forge
            .comments()
            .into_iter()
            .filter(|c| c["number"] == number)
            .collect()
    }

    fn previews(&self) -> Vec<Value> {
        sql_rows(
            &self.s.db(),
            "SELECT p.*, r.number FROM previews p JOIN pull_requests r ON r.id = p.pull_request ORDER BY p.id",
        )
    }

    fn preview_state(&self, number: u64) -> Option<String> {
        self.previews()
            .into_iter()
            .find(|p| p["number"] == number)
            .and_then(|p| p["state"].as_str().map(str::to_string))
    }

    fn log(path: &std::path::Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// Same-repository pull requests on GitHub, Gitea and GitLab: planned at
/// the head, one comment with the plan (its secret masked) and a pending
/// then success preview status on the head; a new head edits the same
/// comment (never a second one, a person's comment left alone) and gets
/// its own status; nothing is applied, the target stays at `main`, and the
/// secret is in no comment, status, log or state file.
#[test]
fn a_pull_request_gets_one_comment_edited_on_each_new_head() {
    for (kind, update) in [
        ("github", "synchronize"),
        ("gitea", "synchronized"),
        ("gitlab", "update"),
    ] {
        let f = fx(kind, "true");
        let d = f.serve();
        let opened = if kind == "gitlab" { "open" } else { "opened" };
        let (head, answer) = f.open(&d, 7, &[("app/v", "2\n")], opened, false);
        assert_eq!(
            answer["previews"],
            serde_json::json!(["app"]),
            "{kind}: {answer}"
        );
        wait_for(Duration::from_secs(60), "the preview comment", || {
            f.comments(7).len() == 1
        });
        let c = &f.comments(7)[0];
        let body = c["body"].as_str().unwrap_or("");
        assert!(
            body.starts_with("<!-- driftless:preview -->"),
            "{kind}: {body}"
        );
        assert!(body.contains(&head[..12]), "{kind}: {body}");
        assert!(
            body.contains("| `app` | 0 to add, 1 to change, 0 to destroy |"),
            "{kind}: {body}"
        );
        assert!(body.contains("~ app.v 2 [REDACTED]"), "{kind}: {body}");
        wait_for(Duration::from_secs(30), "the preview status", || {
            f.forge
                .states(&head, "driftless/app/preview")
                .last()
                .is_some_and(|s| s == "success")
        });
        assert_eq!(
            f.forge.states(&head, "driftless/app/preview"),
            ["pending", "success"],
            "{kind}"
        );

        let (newer, _) = f.open(&d, 7, &[("app/v", "3\n")], update, false);
        wait_for(Duration::from_secs(60), "the comment edited", || {
            f.comments(7)[0]["body"]
                .as_str()
                .is_some_and(|b| b.contains(&newer[..12]))
        });
        let all = f.comments(7);
        assert_eq!(all.len(), 1, "{kind}: one comment, edited: {all:#?}");
        assert!(
            all[0]["edits"].as_i64().unwrap_or(0) >= 1,
            "{kind}: {all:#?}"
        );
        assert!(
            all[0]["body"].as_str().unwrap_or("").contains("~ app.v 3"),
            "{kind}"
        );
        wait_for(Duration::from_secs(30), "the newer head's status", || {
            f.forge
                .states(&newer, "driftless/app/preview")
                .last()
                .is_some_and(|s| s == "success")
        });
        let journal = f.forge.journal();
        let creates = journal
            .iter()
            .filter(|j| j["method"] == "POST" && j["number"] == 7)
            .count();
        assert_eq!(creates, 1, "{kind}: created once: {journal:#?}");
        assert!(journal.iter().all(|j| j["auth_ok"] == true), "{kind}");

        // Nothing of the pull request was applied.
        assert_eq!(Fx::log(&f.applies), ["1"], "{kind}");
        assert_eq!(Fx::log(&f.plans), ["2", "3"], "{kind}");
        let st = &f.s.status()[0];
        assert_eq!(st["last_applied_sha"], f.main.as_str(), "{kind}: {st}");
        assert_eq!(f.s.history("app").len(), 1, "{kind}");

        let log = std::fs::read_to_string(&d.log).unwrap_or_default();
        d.stop();
        for (what, text) in [
            (
                "comments",
                serde_json::to_string(&f.forge.comments()).unwrap_or_default(),
            ),
            (
                "forge journal",
                serde_json::to_string(&journal).unwrap_or_default(),
            ),
            ("daemon log", log),
        ] {
            assert!(!text.contains(CANARY), "{kind}: the secret in the {what}");
            assert!(
                !text.contains(&f.forge.token),
                "{kind}: the forge token in the {what}"
            );
        }
        assert_state_keeps_out(&f.s.state, CANARY);
        assert_state_keeps_out(&f.s.state, &f.forge.token);
    }
}

/// A pull request from a fork runs nothing with `previews = true` (a plan
/// can run its code), and the answer says why; with `previews = "forks"`
/// it is planned.
#[test]
fn a_fork_pull_request_is_planned_only_with_previews_forks() {
    let f = fx("github", "true");
    let d = f.serve();
    let (_, answer) = f.open(&d, 3, &[("app/v", "fork\n")], "synchronize", true);
    assert!(
        answer["ignored"]
            .as_str()
            .is_some_and(|w| w.contains("from a fork")),
        "{answer}"
    );
    assert!(answer.get("previews").is_none(), "{answer}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(f.previews().is_empty(), "{:?}", f.previews());
    assert!(f.comments(3).is_empty());
    assert!(Fx::log(&f.plans).is_empty(), "a fork's code ran");
    d.stop();

    f.s.edit_config(|c| c.replace("previews = true", "previews = \"forks\""));
    let d = f.serve();
    let (head, answer) = f.open(&d, 3, &[("app/v", "fork2\n")], "synchronize", true);
    assert_eq!(answer["previews"], serde_json::json!(["app"]), "{answer}");
    wait_for(Duration::from_secs(60), "the fork's preview", || {
        f.comments(3).len() == 1
    });
    assert!(
        f.comments(3)[0]["body"]
            .as_str()
            .is_some_and(|b| b.contains(&head[..12]))
    );
    assert_eq!(Fx::log(&f.plans), ["fork2"]);
}

/// A pull request that changes nothing under the target's path (git says
/// so, from the merge base to the head) is planned for no target: no plan
/// runs, no comment and no status appear.
#[test]
fn a_pull_request_touching_no_target_path_is_planned_for_none() {
    let f = fx("gitea", "true");
    let d = f.serve();
    let (head, answer) = f.open(&d, 5, &[("docs/README", "more\n")], "opened", false);
    assert_eq!(
        answer["previews"],
        serde_json::json!(["app"]),
        "queued for git to decide: {answer}"
    );
    wait_for(Duration::from_secs(60), "the preview decided", || {
        f.preview_state(5).as_deref() == Some("unaffected")
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(Fx::log(&f.plans).is_empty(), "planned anyway");
    assert!(f.comments(5).is_empty(), "{:?}", f.comments(5));
    assert!(f.forge.states(&head, "driftless/app/preview").is_empty());
    // `main` moving on after the pull request was opened does not make it
    // touch the path: git compares from the merge base.
    f.remote.commit(&[("app/v", "9\n")], "main moves");
    let newer = f
        .remote
        .pull_request(&f.head_ref(5), &[("docs/README", "again\n")], "docs");
    f.deliver(&d, 5, &newer, "synchronized", false);
    wait_for(Duration::from_secs(60), "the newer head decided", || {
        f.previews()
            .iter()
            .any(|p| p["head_sha"] == newer.as_str() && p["state"] == "unaffected")
    });
    assert!(Fx::log(&f.plans).is_empty(), "planned anyway");
}

/// A preview never takes the target's apply lock: a pull request opened
/// while an apply runs is planned and commented before the apply ends; a
/// push while a slow preview plans is applied before the preview ends. A
/// pull request closed while its preview is queued behind another is
/// dropped and never planned.
#[test]
fn a_preview_neither_waits_for_an_apply_nor_blocks_one_and_a_closed_one_is_dropped() {
    let f = fx("github", "true");
    let d = f.serve();
    // An apply held until released.
    let sha = f
        .remote
        .commit(&[("app/v", "2\n"), ("app/slow-apply", "")], "slow apply");
    let body = github_push_body(&f.remote.url(), &sha, &["app/v"]);
    assert_eq!(
        deliver_github_push(d.port, SECRET, &body, "push-1").status,
        202
    );
    wait_for(Duration::from_secs(30), "the apply running", || {
        f.s.status()[0]["running"] == true
    });
    f.open(&d, 1, &[("app/v", "pr1\n")], "opened", false);
    wait_for(Duration::from_secs(30), "the preview comment", || {
        f.comments(1).len() == 1
    });
    assert_eq!(
        f.s.status()[0]["running"],
        true,
        "the preview waited for the apply"
    );
    f.release("apply");
    wait_for(Duration::from_secs(60), "the apply done", || {
        Fx::log(&f.applies).len() == 2
    });

    // A preview held until released; meanwhile a second pull request queues
    // behind it and is closed, and a push is applied.
    let (_, _) = f.open(
        &d,
        2,
        &[("app/v", "pr2\n"), ("app/slow-plan", "")],
        "opened",
        false,
    );
    wait_for(Duration::from_secs(30), "the slow preview running", || {
        f.preview_state(2).as_deref() == Some("running")
    });
    let (pr3, _) = f.open(&d, 3, &[("app/v", "pr3\n")], "opened", false);
    assert_eq!(f.preview_state(3).as_deref(), Some("queued"));
    let closed = f.deliver(&d, 3, &pr3, "closed", false);
    assert_eq!(closed["dropped_previews"], 1, "{closed}");
    let t = std::time::Instant::now();
    let sha = f.remote.commit(&[("app/v", "4\n")], "fast apply");
    let body = github_push_body(&f.remote.url(), &sha, &["app/v"]);
    assert_eq!(
        deliver_github_push(d.port, SECRET, &body, "push-2").status,
        202
    );
    wait_for(Duration::from_secs(30), "the push applied", || {
        Fx::log(&f.applies).last().is_some_and(|v| v == "4")
    });
    assert_eq!(
        f.preview_state(2).as_deref(),
        Some("running"),
        "the apply waited for the preview ({:?} after the push)",
        t.elapsed()
    );
    f.release("plan");
    wait_for(Duration::from_secs(30), "the slow preview done", || {
        f.preview_state(2).as_deref() == Some("planned")
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(f.preview_state(3).as_deref(), Some("dropped"));
    assert!(
        !Fx::log(&f.plans).contains(&"pr3".to_string()),
        "a closed pull request was planned"
    );
    assert!(f.comments(3).is_empty());
}

/// terraform: a preview plans the pull request against the target's real
/// state (a change to what is there, not an add of it again) and leaves
/// that state as it was: same bytes, no lock left, nothing applied.
#[test]
fn a_terraform_preview_plans_against_the_real_state_and_leaves_it_alone() {
    let root = tempfile::tempdir().expect("tempdir");
    let forge = ForgeStandin::start(root.path());
    let remote = Remote::new(root.path(), "infra");
    let tf = "variable \"greeting\" {\n  type = string\n}\n\nresource \"terraform_data\" \"greeting\" {\n  input = var.greeting\n}\n";
    let main = remote.commit(
        &[
            ("network/main.tf", tf),
            ("network/prod.tfvars", "greeting = \"hello\"\n"),
        ],
        "network",
    );
    let secret_file = root.path().join("hook-secret");
    std::fs::write(&secret_file, SECRET).expect("write");
    let s = Setup::new(&format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n\
         [[targets]]\nname = \"net\"\nrepo = \"{}\"\npath = \"network\"\ntimeout = \"2m\"\ninterval = \"1h\"\n\
         forge = \"f\"\nforge_repo = \"me/infra\"\npreviews = true\n\
         [targets.backend]\nkind = \"terraform\"\nvar_files = [\"prod.tfvars\"]\n\
         env = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n{}",
        toml_str(&secret_file.display().to_string()),
        remote.url(),
        forge.table("f", "github"),
    ));
    let d = s.serve();
    wait_for(Duration::from_secs(120), "the first apply", || {
        s.status()[0]["last_result"] == "changed"
    });
    let live = s.state.join("checkouts/net/network");
    let state = std::fs::read(live.join("terraform.tfstate")).expect("the live state");

    let head = remote.pull_request(
        "refs/pull/4/head",
        &[("network/prod.tfvars", "greeting = \"bonjour\"\n")],
        "bonjour",
    );
    let (body, event) = pull_body("github", "opened", &remote.url(), 4, &head, false);
    let r = deliver_event(d.port, "github", event, SECRET, &body, "tf-pr-4");
    assert_eq!(r.status, 202, "{}", r.body);
    wait_for(Duration::from_secs(120), "the preview comment", || {
        !forge.comments().is_empty()
    });
    let comment = forge.comments()[0]["body"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        comment.contains("| `net` | 0 to add, 1 to change, 0 to destroy |"),
        "planned against the real state: {comment}"
    );
    assert!(comment.contains("terraform_data.greeting"), "{comment}");
    wait_for(Duration::from_secs(30), "the preview status", || {
        forge
            .states(&head, "driftless/net/preview")
            .last()
            .is_some_and(|s| s == "success")
    });
    d.stop();
    assert_eq!(
        std::fs::read(live.join("terraform.tfstate")).expect("the live state"),
        state,
        "the preview wrote the target's state"
    );
    assert!(!live.join(".terraform.tfstate.lock.info").exists());
    let st = &s.status()[0];
    assert_eq!(st["last_applied_sha"], main.as_str(), "{st}");
    assert_eq!(s.history("net").len(), 1);
}

/// The comment is found again by its hidden marker when driftless lost its
/// id (a crash between creating it and recording the id): edited, never a
/// second one. One deleted by a person is written anew on the next head.
/// A forge that is down meanwhile gets the newest comment once it is back.
#[test]
fn the_comment_is_found_by_its_marker_and_survives_a_forge_that_is_down() {
    let f = fx("github", "true");
    let d = f.serve();
    f.open(&d, 8, &[("app/v", "a\n")], "opened", false);
    wait_for(Duration::from_secs(60), "the comment", || {
        f.comments(8).len() == 1
    });
    d.stop();
    sql_exec(&f.s.db(), "UPDATE pull_requests SET comment_id = NULL");

    let d = f.serve();
    let (b, _) = f.open(&d, 8, &[("app/v", "b\n")], "synchronize", false);
    wait_for(Duration::from_secs(60), "the comment edited", || {
        f.comments(8)[0]["body"]
            .as_str()
            .is_some_and(|x| x.contains(&b[..12]))
    });
    assert_eq!(f.comments(8).len(), 1, "{:#?}", f.comments(8));
    let first = f.comments(8)[0]["id"].clone();

    f.forge.delete_comment(&first);
    f.forge.down(true);
    let (c, _) = f.open(&d, 8, &[("app/v", "c\n")], "synchronize", false);
    wait_for(Duration::from_secs(60), "the preview planned", || {
        f.previews()
            .iter()
            .any(|p| p["head_sha"] == c.as_str() && p["state"] == "planned")
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(f.comments(8).is_empty());
    let pending = text(&f.s.run(&["notify", "pending"]).stdout);
    assert!(
        pending.contains("#8") && pending.contains("503"),
        "{pending}"
    );
    f.forge.down(false);
    wait_for(Duration::from_secs(60), "the comment written anew", || {
        f.comments(8).len() == 1
    });
    let again = &f.comments(8)[0];
    assert_ne!(again["id"], first);
    assert!(
        again["body"].as_str().is_some_and(|x| x.contains(&c[..12])),
        "{again}"
    );
    let log = std::fs::read_to_string(&d.log).unwrap_or_default();
    assert!(
        log.contains("WARN") && log.contains("pull request comment failed"),
        "{log}"
    );
}

/// A preview plans with the inputs recorded now, and says which: its plan
/// in the comment starts with each input, where it comes from and a
/// fingerprint of its value (never the value), so a reader can tell a
/// preview made before the producer's outputs changed.
#[test]
fn a_preview_says_which_inputs_it_planned_with() {
    let f = fx_with("github", "true", true);
    let d = f.serve();
    let (_, answer) = f.open(&d, 9, &[("app/v", "2\n")], "opened", false);
    assert_eq!(answer["previews"], serde_json::json!(["app"]), "{answer}");
    wait_for(Duration::from_secs(60), "the preview comment", || {
        f.comments(9)
            .first()
            .is_some_and(|c| c["body"].as_str().is_some_and(|b| b.contains("~ app.v 2")))
    });
    let body = f.comments(9)[0]["body"].as_str().unwrap_or("").to_string();
    use sha2::Digest as _;
    let print = hex::encode(sha2::Sha256::digest(b"\"produced-value\""));
    assert!(
        body.contains(&format!(
            "planned with the inputs recorded now: `BASE_V` = base.outputs.v (fingerprint {})",
            &print[..12]
        )),
        "{body}"
    );
    assert!(
        !body.contains("produced-value"),
        "the input's value is in the comment: {body}"
    );
    drop(d);
}

/// A pull request's code is not trusted with the target's secrets: the
/// preview of a target with `[targets.decrypt]` plans the SOPS file as it
/// is in git, encrypted, while the target's own runs decrypt it; the value
/// is in no comment, status, and no file of the state directory.
#[test]
fn a_preview_never_decrypts() {
    let f = fx_opts("github", "true", false, true);
    let d = f.serve();
    // The target's own run decrypted it (its plan showed it masked).
    let (head, _) = f.open(&d, 9, &[("app/v", "2\n")], "opened", false);
    wait_for(Duration::from_secs(60), "the preview comment", || {
        f.comments(9).len() == 1
    });
    let body = f.comments(9)[0]["body"].as_str().unwrap_or("").to_string();
    assert!(body.contains(&head[..12]), "{body}");
    assert!(
        body.contains("value: ENC[AES256_GCM,"),
        "the preview did not plan the encrypted file: {body}"
    );
    assert!(!body.contains("value: [REDACTED]"), "decrypted: {body}");
    assert!(!body.contains(SOPS_CANARY), "{body}");
    for r in f.forge.journal() {
        assert!(!r.to_string().contains(SOPS_CANARY), "{r}");
    }
    drop(d);
    assert_state_keeps_out(&f.s.state, SOPS_CANARY);
}

/// A policy covering the target judges the pull request's plan too: the
/// comment shows the denial beside the plan and the head's preview status
/// is a failure, before anyone merges; nothing is applied.
#[test]
fn a_preview_shows_what_the_policies_make_of_the_plan() {
    let f = fx("github", "true");
    let policy = f.root.path().join("no_three.rego");
    std::fs::write(
        &policy,
        "package main\n\nimport rego.v1\n\n\
         deny contains msg if {\n\tsome c in input.changes\n\tstartswith(c.address, \"app.v 3\")\n\tmsg := \"v may not be 3\"\n}\n\n\
         warn contains \"v changes\" if count(input.changes) > 0\n",
    )
    .expect("write policy");
    let mut config = std::fs::read_to_string(&f.s.config).expect("config");
    config.push_str(&format!(
        "\n[[policies]]\nname = \"no-three\"\nfiles = [{}]\n",
        toml_str(&policy.display().to_string())
    ));
    std::fs::write(&f.s.config, config).expect("config");
    let d = f.serve();

    let (head, _) = f.open(&d, 11, &[("app/v", "3\n")], "opened", false);
    wait_for(Duration::from_secs(60), "the preview comment", || {
        f.comments(11)
            .first()
            .is_some_and(|c| c["body"].as_str().is_some_and(|b| b.contains("~ app.v 3")))
    });
    let body = f.comments(11)[0]["body"].as_str().unwrap_or("").to_string();
    assert!(
        body.contains("| `app` | **denied**: 0 to add, 1 to change, 0 to destroy; denied by policy `no-three`: v may not be 3 |"),
        "{body}"
    );
    assert!(
        body.contains("policies: warn: policy `no-three`: v changes"),
        "{body}"
    );
    assert!(!body.contains(CANARY), "{body}");
    wait_for(Duration::from_secs(30), "the preview status", || {
        f.forge
            .states(&head, "driftless/app/preview")
            .last()
            .is_some_and(|s| s == "failure")
    });

    // A head the policy allows: a plain plan, warned, and success.
    let (newer, _) = f.open(&d, 11, &[("app/v", "4\n")], "synchronize", false);
    wait_for(Duration::from_secs(60), "the comment edited", || {
        f.comments(11)[0]["body"]
            .as_str()
            .is_some_and(|b| b.contains(&newer[..12]))
    });
    let body = f.comments(11)[0]["body"].as_str().unwrap_or("").to_string();
    assert!(
        body.contains("| `app` | 0 to add, 1 to change, 0 to destroy; 1 policy warning(s) |"),
        "{body}"
    );
    wait_for(Duration::from_secs(30), "the newer head's status", || {
        f.forge
            .states(&newer, "driftless/app/preview")
            .last()
            .is_some_and(|s| s == "success")
    });
    // The target's own apply of main (judged too: warned, allowed) writes
    // its "1"; no head's value ever reached the applies log.
    wait_for(Duration::from_secs(30), "main applied", || {
        f.s.status()[0]["last_applied_sha"] == f.main.as_str()
    });
    assert_eq!(Fx::log(&f.applies), ["1"], "a preview applied something");
    drop(d);
}
