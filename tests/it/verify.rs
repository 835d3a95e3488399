//! `[targets.verify]`: only commits signed by a listed key are applied,
//! checked with the real git, gpg and ssh-keygen on throwaway keys, in an
//! isolated setting (the host user's keyrings and git config never count).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// An exec target on `remote` that logs each apply, with `verify`.
fn setup(remote: &Remote, log: &Path, verify: &str) -> Setup {
    Setup::new(&format!(
        "[[targets]]\nname = \"app\"\nrepo = \"{}\"\ninterval = \"1h\"\n{verify}\n\
         [targets.backend]\nkind = \"exec\"\napply = [\"sh\", \"-c\", \"echo applied >> {}\"]\nalways = true\n",
        remote.url(),
        log.display()
    ))
}

fn applies(log: &Path) -> usize {
    log_lines(log).len()
}

/// The newest run after a tick, and the tick's exit code.
fn tick(s: &Setup, env: &[(&str, &str)]) -> (Option<i32>, serde_json::Value) {
    let out = output_within(
        Command::new(bin())
            .arg("--config")
            .arg(&s.config)
            .args(["tick", "app"])
            .envs(env.iter().copied()),
        std::time::Duration::from_secs(120),
    );
    let run = s.history("app").into_iter().next().expect("a run");
    (out.status.code(), run)
}

fn last_applied(s: &Setup) -> String {
    s.target_status("app")["last_applied_sha"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn checkout_head(s: &Setup) -> String {
    git(&s.checkout("app"), &["rev-parse", "HEAD"])
}

/// Assert the tick refused `sha` saying `why`, ran nothing and moved
/// nothing: the last applied commit is still `applied`.
fn assert_refused(
    s: &Setup,
    log: &Path,
    before: usize,
    ran: (Option<i32>, serde_json::Value),
    sha: &str,
    why: &str,
    applied: &str,
) {
    let (code, run) = ran;
    assert_eq!(code, Some(1), "{run}");
    assert_eq!(run["result"], "failed", "{run}");
    let message = run["message"].as_str().unwrap_or("");
    assert!(
        message.contains(&format!("commit {sha} refused")) && message.contains(why),
        "expected `{why}` for {sha}: {message}"
    );
    assert_eq!(applies(log), before, "the apply ran for a refused commit");
    assert_eq!(last_applied(s), applied);
    assert_eq!(checkout_head(s), applied, "the checkout moved");
}

fn ssh_fingerprint(key: &Path) -> String {
    let out = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(key.with_extension("pub"))
        .output()
        .expect("ssh-keygen -l");
    succeeded(&out, "ssh-keygen -l")
        .split_whitespace()
        .nth(1)
        .expect("a fingerprint")
        .to_string()
}

#[test]
fn ssh_signed_commits_are_applied_and_unsigned_or_unlisted_ones_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let (alice, alice_pub) = ssh_key(root.path(), "alice");
    let (mallory, mallory_pub) = ssh_key(root.path(), "mallory");
    let remote = Remote::new(root.path(), "infra");
    let log = root.path().join("applies.log");
    let s = setup(
        &remote,
        &log,
        &verify_ssh_table(root.path(), "alice@example.net", &alice_pub),
    );
    let as_alice = format!("user.signingkey={}", alice.display());
    let as_mallory = format!("user.signingkey={}", mallory.display());

    let first = remote.commit_signed(&[("v", "1")], "signed", &["gpg.format=ssh", &as_alice], &[]);
    let (code, run) = tick(&s, &[]);
    assert_eq!(
        (code, &run["result"]),
        (Some(0), &"changed".into()),
        "{run}"
    );
    assert_eq!(last_applied(&s), first);

    // Unsigned: refused, nothing moves.
    let unsigned = remote.commit(&[("v", "2")], "unsigned");
    let ran = tick(&s, &[]);
    assert_eq!(
        ran.1["sha"],
        unsigned.as_str(),
        "the run records the refused commit"
    );
    assert_refused(&s, &log, 1, ran, &unsigned, "not signed", &first);

    // Signed by a key the file does not list: refused, naming the key.
    let unlisted = remote.commit_signed(
        &[("v", "3")],
        "mallory",
        &["gpg.format=ssh", &as_mallory],
        &[],
    );
    let ran = tick(&s, &[]);
    assert_refused(
        &s,
        &log,
        1,
        ran,
        &unlisted,
        &ssh_fingerprint(&mallory),
        &first,
    );
    // The host user's git config does not count: a ~/.gitconfig allowing
    // mallory changes nothing.
    let home = root.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let theirs = root.path().join("their_allowed_signers");
    std::fs::write(&theirs, format!("mallory@example.net {mallory_pub}\n")).expect("theirs");
    std::fs::write(
        home.join(".gitconfig"),
        format!(
            "[gpg \"ssh\"]\n\tallowedSignersFile = {}\n",
            theirs.display()
        ),
    )
    .expect("gitconfig");
    let ran = tick(&s, &[("HOME", home.to_str().expect("utf8"))]);
    assert_refused(
        &s,
        &log,
        1,
        ran,
        &unlisted,
        "no entry of allowed_signers_file",
        &first,
    );

    // Alice signs again: applied.
    let next = remote.commit_signed(
        &[("v", "4")],
        "alice again",
        &["gpg.format=ssh", &as_alice],
        &[],
    );
    let (code, run) = tick(&s, &[]);
    assert_eq!(
        (code, &run["result"]),
        (Some(0), &"changed".into()),
        "{run}"
    );
    assert_eq!(last_applied(&s), next);
    assert_eq!(applies(&log), 2);
    // Verified once: the next tick asks no one (nothing is noted twice).
    let (code, run) = tick(&s, &[]);
    assert_eq!(code, Some(0), "{run}");
    assert_eq!(applies(&log), 3);
}

/// A private GnuPG home with keys made by gpg itself; its agent is stopped
/// when dropped.
struct Gpg {
    home: PathBuf,
}

impl Gpg {
    fn new(dir: &Path) -> Gpg {
        let home = dir.join("signer-gnupg");
        std::fs::create_dir_all(&home).expect("mkdir");
        std::fs::set_permissions(&home, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .expect("chmod");
        Gpg { home }
    }

    fn gpg(&self, args: &[&str]) -> String {
        let out = Command::new("gpg")
            .arg("--homedir")
            .arg(&self.home)
            .args([
                "--batch",
                "--quiet",
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
            ])
            .args(args)
            .output()
            .expect("gpg (apt-get install gnupg)");
        succeeded(&out, &format!("gpg {args:?}"))
    }

    /// A new signing key for `uid`, valid for `days`, made `faked` (gpg's
    /// --faked-system-time) or now; its fingerprint.
    fn key(&self, uid: &str, days: u32, faked: Option<&str>) -> String {
        let expire = format!("{days}d");
        let mut args = vec![];
        if let Some(t) = faked {
            args.extend(["--faked-system-time", t]);
        }
        args.extend(["--quick-gen-key", uid, "ed25519", "sign", &expire]);
        self.gpg(&args);
        let listing = self.gpg(&["--with-colons", "--list-keys", uid]);
        listing
            .lines()
            .find_map(|l| l.strip_prefix("fpr:"))
            .and_then(|l| l.split(':').find(|f| !f.is_empty()))
            .expect("a fingerprint")
            .to_string()
    }

    fn export(&self, fingerprint: &str, to: &Path) {
        let armored = self.gpg(&["--armor", "--export", fingerprint]);
        std::fs::write(to, armored).expect("keyring");
    }

    fn home(&self) -> &str {
        self.home.to_str().expect("utf8")
    }
}

impl Drop for Gpg {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .arg("--homedir")
            .arg(&self.home)
            .args(["--kill", "all"])
            .status();
    }
}

#[test]
fn gpg_signed_commits_with_mode_all_refuse_an_unsigned_one_under_a_signed_tip() {
    let root = tempfile::tempdir().expect("tempdir");
    let gpg = Gpg::new(root.path());
    let signer = gpg.key("Signer <signer@example.net>", 30, None);
    let other = gpg.key("Other <other@example.net>", 30, None);
    // A key made two days ago that expired a day later.
    let past = (std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86400))
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        .to_string();
    let expired = gpg.key("Expired <expired@example.net>", 1, Some(&past));
    let keyring = root.path().join("keyring.asc");
    let both = root.path().join("both.asc");
    gpg.export(&signer, &keyring);
    {
        let armored = gpg.gpg(&["--armor", "--export", &signer, &expired]);
        std::fs::write(&both, armored).expect("keyring");
    }
    // Signing as the expired key needs gpg at its time.
    let faked_gpg = root.path().join("gpg-then");
    std::fs::write(
        &faked_gpg,
        format!(
            "#!/bin/sh\nexec gpg --faked-system-time {}  \"$@\"\n",
            past.parse::<u64>().expect("n") + 3600
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(
        &faked_gpg,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let remote = Remote::new(root.path(), "infra");
    let log = root.path().join("applies.log");
    let verify = |mode: &str, file: &Path| {
        format!(
            "[targets.verify]\ngpg_keyring_file = {}\nmode = \"{mode}\"",
            toml_str(&file.display().to_string())
        )
    };
    let s = setup(&remote, &log, &verify("all", &keyring));
    let env = [("GNUPGHOME", gpg.home())];
    let sign_as = |fpr: &str| format!("user.signingkey={fpr}");

    let first = remote.commit_signed(&[("v", "1")], "signed", &[&sign_as(&signer)], &env);
    let (code, run) = tick(&s, &[]);
    assert_eq!(
        (code, &run["result"]),
        (Some(0), &"changed".into()),
        "{run}"
    );

    // Signed by a key not in the keyring: refused, naming it — even with
    // the host's GNUPGHOME holding that key.
    let by_other = remote.commit_signed(&[("v", "2")], "other", &[&sign_as(&other)], &env);
    let ran = tick(&s, &env);
    assert_refused(
        &s,
        &log,
        1,
        ran,
        &by_other,
        &other[other.len() - 16..],
        &first,
    );

    // mode = "all": a signed tip on top of an unsigned commit is refused,
    // naming the unsigned one; "head" looks at the tip alone.
    git(&remote.work, &["reset", "-q", "--hard", &first]);
    git(&remote.work, &["push", "-q", "--force", "origin", "main"]);
    let unsigned = remote.commit(&[("v", "3")], "unsigned");
    let tip = remote.commit_signed(&[("v", "4")], "signed tip", &[&sign_as(&signer)], &env);
    let ran = tick(&s, &[]);
    assert_eq!(ran.1["sha"], tip.as_str(), "{}", ran.1);
    assert_refused(&s, &log, 1, ran, &unsigned, "not signed", &first);
    let config = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(
        &s.config,
        config.replace("mode = \"all\"", "mode = \"head\""),
    )
    .expect("config");
    let (code, run) = tick(&s, &[]);
    assert_eq!(
        (code, &run["result"]),
        (Some(0), &"changed".into()),
        "{run}"
    );
    assert_eq!(last_applied(&s), tip);

    // A key that has expired: refused, saying so.
    let config = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(
        &s.config,
        config.replace(
            &toml_str(&keyring.display().to_string()),
            &toml_str(&both.display().to_string()),
        ),
    )
    .expect("config");
    let stale = remote.commit_signed(
        &[("v", "5")],
        "expired key",
        &[
            &sign_as(&expired),
            &format!("gpg.program={}", faked_gpg.display()),
        ],
        &env,
    );
    let ran = tick(&s, &[]);
    assert_refused(&s, &log, 2, ran, &stale, "has expired", &tip);
}

/// A force push of a verified target's branch back to an older signed
/// commit is refused, naming both commits, until a person accepts that
/// very commit (`retry --accept-rewind`, or the API with `approve`); the
/// acceptance is spent by the apply, so the next rewind is refused again.
/// `allow_rewind = true` applies rewinds, saying so; without `verify` a
/// rewind is applied and the run and a WARN say "rewound from X to Y".
#[test]
fn a_force_push_back_to_an_older_signed_commit_waits_for_a_person() {
    const OPS: &str = "ops-token-rewind-41";
    const BOT: &str = "bot-token-rewind-41";
    let root = tempfile::tempdir().expect("tempdir");
    let (alice, alice_pub) = ssh_key(root.path(), "alice");
    let remote = Remote::new(root.path(), "infra");
    let log = root.path().join("applies.log");
    let verify = verify_ssh_table(root.path(), "alice@example.net", &alice_pub);
    let s = setup(&remote, &log, &verify);
    let tokens = format!(
        "{}{}",
        token_table("ops", OPS, &["reconcile:app", "approve:app", "read"]),
        token_table("bot", BOT, &["reconcile:app", "read"])
    );
    let config = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(&s.config, format!("{config}{tokens}")).expect("config");
    let as_alice = format!("user.signingkey={}", alice.display());
    let signed =
        |v: &str| remote.commit_signed(&[("v", v)], v, &["gpg.format=ssh", &as_alice], &[]);
    let short = |sha: &str| sha[..12].to_string();

    let old = signed("1");
    assert_eq!(tick(&s, &[]).1["result"], "changed");
    let new = signed("2");
    assert_eq!(tick(&s, &[]).1["result"], "changed");
    assert_eq!(applies(&log), 2);

    // Back to the older signed commit: refused, naming both, nothing moves.
    remote.force_to(&old);
    let ran = tick(&s, &[]);
    let message = ran.1["message"].as_str().unwrap_or("").to_string();
    assert!(
        message.contains(&format!("rewound from {} to {}", short(&new), short(&old)))
            && message.contains(&new)
            && message.contains("--accept-rewind app"),
        "{message}"
    );
    assert_refused(&s, &log, 2, ran, &old, "does not descend", &new);
    // Again at the interval: still refused.
    let ran = tick(&s, &[]);
    assert_refused(&s, &log, 2, ran, &old, "does not descend", &new);

    // A person accepts it: that commit is applied, and the run says so.
    let out = s.run(&["retry", "--accept-rewind", "app"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let run = s.history("app").into_iter().next().expect("a run");
    assert_eq!(run["result"], "changed", "{run}");
    assert!(
        run["message"].as_str().is_some_and(|m| m.contains(&format!(
            "rewound from {} to {} (accepted by a person)",
            short(&new),
            short(&old)
        ))),
        "{run}"
    );
    assert_eq!(last_applied(&s), old);
    assert_eq!(applies(&log), 3);
    // Nothing left to accept.
    let out = s.run(&["retry", "--accept-rewind", "app"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("nothing to accept"),
        "{}",
        text(&out.stderr)
    );

    // The acceptance was spent: forward, then back again, is refused again.
    let newer = signed("3");
    assert_eq!(tick(&s, &[]).1["result"], "changed");
    remote.force_to(&old);
    let ran = tick(&s, &[]);
    assert_refused(&s, &log, 4, ran, &old, "does not descend", &newer);
    // Through the API: a token without `approve` may not accept it; one
    // with it may, and the next tick applies it.
    let intake = Intake::start(&s);
    let path = "/api/v1/targets/app/retry?accept_rewind=1";
    let r = api_call(intake.port, "POST", path, BOT, &serde_json::Value::Null);
    assert_eq!(r.status, 403, "{r:?}");
    let ran = tick(&s, &[]);
    assert_refused(&s, &log, 4, ran, &old, "does not descend", &newer);
    let r = api_call(intake.port, "POST", path, OPS, &serde_json::Value::Null);
    assert_eq!(r.status, 202, "{r:?}");
    drop(intake);
    assert_eq!(tick(&s, &[]).1["result"], "changed");
    assert_eq!(last_applied(&s), old);

    // allow_rewind = true: applied, and said.
    let config = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(
        &s.config,
        config.replace(&verify, &format!("{verify}\nallow_rewind = true")),
    )
    .expect("config");
    let newest = signed("4");
    assert_eq!(tick(&s, &[]).1["result"], "changed");
    remote.force_to(&old);
    let (code, run) = tick(&s, &[]);
    assert_eq!(
        (code, &run["result"]),
        (Some(0), &"changed".into()),
        "{run}"
    );
    assert!(
        run["message"]
            .as_str()
            .is_some_and(|m| m.starts_with(&format!(
                "rewound from {} to {}",
                short(&newest),
                short(&old)
            ))),
        "{run}"
    );
}

#[test]
fn without_verify_a_rewind_is_applied_and_said() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let log = root.path().join("applies.log");
    let s = setup(&remote, &log, "");
    let old = remote.commit(&[("v", "1")], "one");
    assert!(s.run(&["tick", "app"]).status.success());
    let new = remote.commit(&[("v", "2")], "two");
    assert!(s.run(&["tick", "app"]).status.success());
    remote.force_to(&old);
    let out = s.run(&["tick", "app"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = format!("rewound from {} to {}", &new[..12], &old[..12]);
    assert!(text(&out.stderr).contains("WARN"), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&said), "{}", text(&out.stdout));
    assert_eq!(last_applied(&s), old);
    assert_eq!(applies(&log), 3);
    // Forward again: nothing to say.
    remote.force_to(&new);
    let out = s.run(&["tick", "app"]);
    assert!(
        !text(&out.stdout).contains("rewound"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(last_applied(&s), new);
    // A history of its own (neither ahead nor behind) is said as such.
    let other = remote.force_commit(&old, &[("w", "x")], "elsewhere");
    let out = s.run(&["tick", "app"]);
    assert!(
        text(&out.stdout).contains(&format!(
            "history rewritten from {} to {}",
            &new[..12],
            &other[..12]
        )),
        "{}",
        text(&out.stdout)
    );
}

/// An unsigned tip is refused on every path that checks out or plans, not
/// only `tick`'s: `plan` (whose command would run the commit's code),
/// `retry`, a `detect` target's plan, and the daemon's jobs. None of them
/// runs the plan or apply command, moves the checkout, or the commit last
/// applied.
#[test]
fn an_unsigned_tip_is_refused_on_every_path_that_checks_out() {
    let root = tempfile::tempdir().expect("tempdir");
    let (alice, alice_pub) = ssh_key(root.path(), "alice");
    let remote = Remote::new(root.path(), "infra");
    let ran = root.path().join("ran.log");
    let verify = verify_ssh_table(root.path(), "alice@example.net", &alice_pub);
    let backend = format!(
        "[targets.backend]\nkind = \"exec\"\n\
         plan = [\"sh\", \"-c\", \"echo plan >> {l}; echo '~ v'\"]\n\
         apply = [\"sh\", \"-c\", \"echo apply >> {l}\"]\nalways = true\n",
        l = ran.display()
    );
    let secret = root.path().join("hook-secret");
    std::fs::write(&secret, "verify-paths-secret").expect("write");
    let s = Setup::new(&format!(
        "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {secret}\n\n\
         [[targets]]\nname = \"app\"\nrepo = \"{repo}\"\ninterval = \"1h\"\n{verify}\n{backend}\n\
         [[targets]]\nname = \"watch\"\nrepo = \"{repo}\"\ninterval = \"1h\"\npolicy = \"detect\"\n{verify}\n{backend}",
        repo = remote.url(),
        secret = toml_str(&secret.display().to_string()),
    ));
    let as_alice = format!("user.signingkey={}", alice.display());
    let first = remote.commit_signed(&[("v", "1")], "signed", &["gpg.format=ssh", &as_alice], &[]);
    for t in ["app", "watch"] {
        let out = s.run(&["tick", t]);
        assert!(out.status.success(), "{t}: {}", text(&out.stderr));
    }
    let before = log_lines(&ran).len();
    assert!(before >= 2, "{:?}", log_lines(&ran));
    let unsigned = remote.commit(&[("v", "2")], "unsigned");
    let refused = |what: &str, out: &std::process::Output| {
        let said = text(&out.stdout) + &text(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{what}: {said}");
        assert!(
            said.contains(&format!("commit {unsigned} refused")) && said.contains("not signed"),
            "{what}: {said}"
        );
        assert_eq!(log_lines(&ran).len(), before, "{what} ran a command");
        for t in ["app", "watch"] {
            assert_eq!(
                git(&s.checkout(t), &["rev-parse", "HEAD"]),
                first,
                "{what}: {t}'s checkout moved"
            );
        }
        assert_eq!(last_applied(&s), first, "{what}");
    };
    refused("plan", &s.run(&["plan", "app"]));
    refused("retry", &s.run(&["retry", "app"]));
    refused("detect", &s.run(&["tick", "watch"]));
    let out = s.run(&["tick", "app"]);
    refused("tick", &out);

    // The daemon's jobs, from a signed push of another unsigned commit.
    let daemon = s.serve();
    let unsigned = remote.commit(&[("v", "3")], "unsigned again");
    let body = github_push_body(&remote.url(), &unsigned, &["v"]);
    let r = deliver_github_push(daemon.port, "verify-paths-secret", &body, "verify-paths-1");
    assert_eq!(r.status, 202, "{}", r.body);
    wait_for(
        std::time::Duration::from_secs(60),
        "the daemon's runs",
        || {
            ["app", "watch"].iter().all(|t| {
                s.history(t)
                    .iter()
                    .any(|r| r["trigger"] == "webhook" && !r["result"].is_null())
            })
        },
    );
    drop(daemon);
    for t in ["app", "watch"] {
        let run = s
            .history(t)
            .into_iter()
            .find(|r| r["trigger"] == "webhook")
            .expect("a push's run");
        let message = run["message"].as_str().unwrap_or("");
        assert!(
            run["result"] == "failed" && message.contains(&format!("commit {unsigned} refused")),
            "{t}: {run}"
        );
    }
    assert_eq!(log_lines(&ran).len(), before, "the daemon ran a command");
}

/// `mode = "all"` checks the commits since the last applied one; when the
/// tip is the commit last applied (verify turned on for a target already
/// at an unsigned commit) there are none, and the tip itself is checked,
/// as under `mode = "head"`: it is refused, naming it, and nothing runs.
/// (Found by mutation testing: `git log` was then given no commit at all.)
#[test]
fn mode_all_with_nothing_new_checks_the_tip_itself() {
    let root = tempfile::tempdir().expect("tempdir");
    let (_alice, alice_pub) = ssh_key(root.path(), "alice");
    let remote = Remote::new(root.path(), "infra");
    let log = root.path().join("applies.log");
    let s = setup(&remote, &log, "");
    let unsigned = remote.commit(&[("v", "1")], "unsigned");
    let (code, run) = tick(&s, &[]);
    assert_eq!(
        (code, &run["result"]),
        (Some(0), &"changed".into()),
        "{run}"
    );
    assert_eq!(last_applied(&s), unsigned);
    let config = std::fs::read_to_string(&s.config).expect("config");
    let verify = format!(
        "{}\nmode = \"all\"",
        verify_ssh_table(root.path(), "alice@example.net", &alice_pub)
    );
    std::fs::write(
        &s.config,
        config.replace(
            "interval = \"1h\"\n",
            &format!("interval = \"1h\"\n{verify}\n"),
        ),
    )
    .expect("config");
    let ran = tick(&s, &[]);
    assert_refused(&s, &log, 1, ran, &unsigned, "not signed", &unsigned);
}
