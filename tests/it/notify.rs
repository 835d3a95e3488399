//! Notifications against real servers on 127.0.0.1: an HTTP receiver for
//! the webhook and Slack notifiers, aiosmtpd for email, Synapse for Matrix.
//! Runs are driven with `driftless tick`, which delivers the outbox before
//! it exits.

use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const HOOK_SECRET: &str = "notify-hook-secret-3c1f";

/// An exec target that fails with the content of `fail` (if present).
fn failing_target(remote: &Remote, notify: &str, extra: &str) -> String {
    exec_target(
        "app",
        &remote.url(),
        &format!("notify = {notify}\nweb_url = \"https://git.example.net/ops/infra\"\n{extra}"),
        "apply = [\"sh\", \"-c\", \"if [ -f fail ]; then cat fail >&2; exit 1; fi\"]\nalways = true",
    )
}

fn events(sink: &Service, path: &str) -> Vec<Value> {
    sink.requests()
        .into_iter()
        .filter(|r| r["path"] == path && r["answered"] == 200)
        .map(|r| serde_json::from_str(r["body"].as_str().expect("body")).expect("json body"))
        .collect()
}

#[test]
fn the_transitions_drive_exactly_the_expected_notifications() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/ok", "1")], "first");
    let sink = Service::http_sink(root.path(), 0);
    let secret = root.path().join("hook-secret");
    std::fs::write(&secret, HOOK_SECRET).expect("write");
    let slack_url = root.path().join("slack-url");
    std::fs::write(
        &slack_url,
        format!("http://127.0.0.1:{}/slack/T000/B000/XXXX", sink.port),
    )
    .expect("write");
    let cfg = format!(
        "[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{p}/hook\"\nsecret_file = {s}\nheaders = {{ X-Team = \"ops\" }}\n\n\
         [[notifiers]]\nname = \"changes\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{p}/changes\"\nevents = [\"changed\"]\n\n\
         [[notifiers]]\nname = \"chat\"\nkind = \"slack\"\nurl_file = {u}\n\n\
         {t}",
        p = sink.port,
        s = toml_str(&secret.display().to_string()),
        u = toml_str(&slack_url.display().to_string()),
        t = failing_target(
            &remote,
            "[\"hook\", \"changes\", \"chat\"]",
            "path = \"app\""
        ),
    );
    let s = Setup::new(&cfg);
    let cfg = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(
        &s.config,
        cfg.replacen(
            "workers = 4\n",
            "workers = 4\npublic_url = \"https://driftless.example.net/\"\n",
            1,
        ),
    )
    .expect("config");
    let tick = |code: i32| {
        let out = s.run(&["tick", "app"]);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    };

    tick(0); // first run: changed (only the opted-in notifier hears)
    let a = remote.commit(&[("app/fail", "disk full on /var\n")], "break");
    tick(1); // success → fail: failed
    tick(1); // same message: nothing
    let b = remote.commit(
        &[("app/fail", "network unreachable\n")],
        "break differently",
    );
    tick(1); // new message: failed
    let c = remote.delete("app/fail", "fix");
    tick(0); // recovered

    let hook = events(&sink, "/hook");
    let kinds: Vec<&str> = hook
        .iter()
        .map(|e| e["event"].as_str().expect("event"))
        .collect();
    assert_eq!(kinds, ["failed", "failed", "recovered"], "{hook:#?}");
    assert_eq!(hook[0]["sha"], a);
    assert_eq!(hook[0]["short_sha"], &a[..12]);
    assert!(
        hook[0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("disk full on /var"),
        "{}",
        hook[0]
    );
    assert_eq!(hook[0]["consecutive_failures"], 1);
    assert_eq!(hook[0]["target"], "app");
    assert_eq!(hook[0]["backend"], "exec");
    assert_eq!(hook[0]["trigger"], "cli");
    assert_eq!(
        hook[0]["commit_url"],
        format!("https://git.example.net/ops/infra/commit/{a}")
    );
    let run_url = hook[0]["run_url"].as_str().expect("run_url");
    assert!(
        run_url.starts_with("https://driftless.example.net/api/v1/runs/"),
        "{run_url}"
    );
    assert_eq!(hook[1]["sha"], b);
    assert!(
        hook[1]["message"]
            .as_str()
            .unwrap_or("")
            .contains("network unreachable")
    );
    assert_eq!(hook[1]["consecutive_failures"], 3);
    assert_eq!(hook[2]["sha"], c);
    assert_eq!(hook[2]["consecutive_failures"], 3);
    assert!(hook[2]["failing_for_ms"].as_i64().expect("failing_for_ms") >= 0);

    // Every webhook body is signed, and carries the extra header.
    for r in sink.requests().iter().filter(|r| r["path"] == "/hook") {
        let body = r["body"].as_str().expect("body");
        let want = format!("sha256={}", hmac_hex(HOOK_SECRET, body.as_bytes()));
        assert_eq!(r["headers"]["x-driftless-signature-256"], want.as_str());
        assert_eq!(r["headers"]["x-team"], "ops");
        assert_eq!(r["headers"]["content-type"], "application/json");
    }
    // The opted-in notifier heard about the changes only.
    let changes: Vec<String> = events(&sink, "/changes")
        .iter()
        .map(|e| e["event"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(changes, ["changed"]);
    // Slack got text and blocks for the same three events.
    let slack = events(&sink, "/slack/T000/B000/XXXX");
    assert_eq!(slack.len(), 3);
    assert!(
        slack[0]["text"]
            .as_str()
            .unwrap_or("")
            .contains("app: failed at"),
        "{}",
        slack[0]
    );
    assert!(slack[0]["blocks"].as_array().is_some_and(|b| !b.is_empty()));
    // Nothing left in the outbox.
    let out = s.run(&["notify", "pending"]);
    assert!(
        text(&out.stdout).contains("no notifications pending"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn a_failure_that_only_differs_in_its_timestamps_is_told_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    // Like many tools, the error carries the time, a duration and a request
    // id, all different on every attempt.
    remote.commit(
        &[
            (
                "app/deploy.sh",
                "echo \"$(date -u +%Y-%m-%dT%H:%M:%S.%NZ) request $(cat /proc/sys/kernel/random/uuid): \
                 $(cat reason) after $(date +%N | cut -c1-3)ms\" >&2\nexit 1\n",
            ),
            ("app/reason", "disk full on /var\n"),
        ],
        "a deploy that fails",
    );
    let sink = Service::http_sink(root.path(), 0);
    let s = Setup::new(&format!(
        "[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\n{}",
        sink.port,
        exec_target(
            "app",
            &remote.url(),
            "notify = [\"hook\"]\npath = \"app\"",
            "apply = [\"sh\", \"deploy.sh\"]\nalways = true",
        )
    ));
    let mut messages = Vec::new();
    for _ in 0..3 {
        let out = s.run(&["tick", "app"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        messages.push(s.history("app")[0]["message"].to_string());
    }
    // The raw messages did differ.
    assert!(
        messages[0] != messages[1] && messages[1] != messages[2],
        "{messages:#?}"
    );
    remote.commit(&[("app/reason", "network unreachable\n")], "worse");
    let out = s.run(&["tick", "app"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));

    let hook = events(&sink, "/hook");
    let told: Vec<(&str, &str)> = hook
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(told.len(), 2, "{told:#?}");
    assert!(
        told[0].0 == "failed" && told[0].1.contains("disk full"),
        "{told:#?}"
    );
    assert!(
        told[1].0 == "failed" && told[1].1.contains("network unreachable"),
        "{told:#?}"
    );
}

#[test]
fn email_is_retried_until_the_server_is_back_and_never_changes_the_result() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    let sha = remote.commit(&[("fail", "terraform state is locked\n")], "first");
    let port = free_port(); // nothing listens here yet
    let cfg = format!(
        "[[notifiers]]\nname = \"ops-mail\"\nkind = \"email\"\nhost = \"127.0.0.1\"\nport = {port}\ntls = \"none\"\n\
         from = \"driftless@example.net\"\nto = [\"ops@example.net\", \"oncall@example.net\"]\n\n{}",
        failing_target(&remote, "[\"ops-mail\"]", "")
    );
    let s = Setup::new(&cfg);
    let out = s.run(&["tick", "app"]);
    // The run failed because of the backend, not the notifier.
    assert_eq!(out.status.code(), Some(1));
    let st = s.target_status("app");
    assert_eq!(st["last_result"], "failed");
    assert!(
        st["last_message"]
            .as_str()
            .unwrap_or("")
            .contains("terraform state is locked")
    );
    let log = text(&out.stderr);
    assert!(
        log.contains("notification failed") && log.contains("ops-mail"),
        "{log}"
    );
    let pending = text(&s.run(&["notify", "pending"]).stdout);
    assert!(
        pending.contains("ops-mail") && pending.contains("failed"),
        "{pending}"
    );

    // The server comes up; the next pass (after the 2 s backoff) delivers.
    let smtp = Service::smtp(root.path(), port);
    std::thread::sleep(Duration::from_millis(2200));
    let out = s.run(&["tick", "app"]); // same message: no new notification
    assert_eq!(out.status.code(), Some(1));
    wait_for(Duration::from_secs(10), "the mail", || {
        !smtp.mails().is_empty()
    });
    // Undo quoted-printable soft line breaks.
    let mails: Vec<String> = smtp
        .mails()
        .iter()
        .map(|m| m.replace("=\r\n", "").replace("=\n", ""))
        .collect();
    assert_eq!(mails.len(), 1, "{mails:#?}");
    let m = &mails[0];
    assert!(
        m.contains(&format!(
            "Subject: [driftless] app: failed at {}",
            &sha[..12]
        )),
        "{m}"
    );
    assert!(
        m.contains("ops@example.net") && m.contains("oncall@example.net"),
        "{m}"
    );
    assert!(m.contains("terraform state is locked"), "{m}");
    let pending = text(&s.run(&["notify", "pending"]).stdout);
    assert!(pending.contains("no notifications pending"), "{pending}");
}

#[test]
fn matrix_messages_arrive_once_even_when_sent_twice() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("fail", "apply timed out\n")], "first");
    let (synapse, token, room) = Service::synapse(root.path());
    let token_file = root.path().join("matrix-token");
    std::fs::write(&token_file, &token).expect("write");
    let cfg = format!(
        "[[notifiers]]\nname = \"matrix\"\nkind = \"matrix\"\nhomeserver = \"http://127.0.0.1:{}\"\n\
         access_token_file = {}\nroom_id = \"{room}\"\n\n{}",
        synapse.port,
        toml_str(&token_file.display().to_string()),
        failing_target(&remote, "[\"matrix\"]", "")
    );
    let s = Setup::new(&cfg);
    assert_eq!(s.run(&["tick", "app"]).status.code(), Some(1));
    let msgs = synapse.matrix_messages(&token, &room);
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert!(
        msgs[0].contains("app: failed at") && msgs[0].contains("apply timed out"),
        "{}",
        msgs[0]
    );

    // Resend the same notification (as after a crash between send and
    // record): the transaction id makes the homeserver ignore the repeat.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        let store = driftless::store::Store::open(&s.db()).await.expect("db");
        let q = sqlx::query("UPDATE notifications SET state = 'pending', next_attempt_at = 0");
        store.write_one("test", q).await.expect("reset");
    });
    assert_eq!(s.run(&["tick", "app"]).status.code(), Some(1)); // delivers the due row again
    let pending = text(&s.run(&["notify", "pending"]).stdout);
    assert!(pending.contains("no notifications pending"), "{pending}");
    assert_eq!(
        synapse.matrix_messages(&token, &room).len(),
        1,
        "posted twice"
    );

    // notify test goes through too.
    let out = s.run(&["notify", "test", "matrix"]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    let msgs = synapse.matrix_messages(&token, &room);
    assert_eq!(msgs.len(), 2);
    assert!(msgs[1].contains("test notification"), "{}", msgs[1]);
}

#[test]
fn secrets_never_reach_a_message_or_a_log_line() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("x", "1")], "first");
    let sink = Service::http_sink(root.path(), 1); // the first delivery fails
    let output_canary = "canary-output-9d7e1b";
    let url_canary = "canary-url-4f2a8c";
    let password_canary = "canary-password-61b0e3";
    let url_file = root.path().join("slack-url");
    std::fs::write(
        &url_file,
        format!("http://127.0.0.1:{}/services/{url_canary}", sink.port),
    )
    .expect("write");
    let password_file = root.path().join("smtp-password");
    std::fs::write(&password_file, password_canary).expect("write");
    let closed = free_port();
    let cfg = format!(
        "[[notifiers]]\nname = \"chat\"\nkind = \"slack\"\nurl_file = {}\n\n\
         [[notifiers]]\nname = \"mail\"\nkind = \"email\"\nhost = \"127.0.0.1\"\nport = {closed}\ntls = \"none\"\n\
         username = \"driftless\"\npassword_file = {}\nfrom = \"d@example.net\"\nto = [\"ops@example.net\"]\n\n\
         {}",
        toml_str(&url_file.display().to_string()),
        toml_str(&password_file.display().to_string()),
        exec_target(
            "app",
            &remote.url(),
            "notify = [\"chat\", \"mail\"]",
            "apply = [\"sh\", \"-c\", \"echo using $API_KEY; echo failed with key $API_KEY >&2; exit 1\"]\n\
             env = { API_KEY = \"env:DRIFTLESS_TEST_API_KEY\" }",
        )
    );
    let s = Setup::new(&cfg);
    let mut logs = String::new();
    for _ in 0..3 {
        let out = output_within(
            std::process::Command::new(bin())
                .args(["--config", s.config.to_str().expect("utf8"), "tick", "app"])
                .env("DRIFTLESS_TEST_API_KEY", output_canary)
                .env("RUST_LOG", "debug"),
            std::time::Duration::from_secs(300),
        );
        logs.push_str(&text(&out.stdout));
        logs.push_str(&text(&out.stderr));
        std::thread::sleep(Duration::from_millis(2100)); // past the first backoff
    }
    // The Slack message was delivered on the second attempt.
    let delivered: Vec<Value> = sink.requests();
    assert!(
        delivered.iter().any(|r| r["answered"] == 200),
        "{delivered:#?}"
    );
    let bodies: String = delivered
        .iter()
        .map(|r| r["body"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(bodies.contains("[REDACTED]"), "{bodies}");
    for canary in [output_canary, url_canary, password_canary] {
        assert!(!bodies.contains(canary), "{canary} in a delivered message");
        assert!(!logs.contains(canary), "{canary} in the logs:\n{logs}");
    }
    assert!(
        logs.contains("notifier=chat") && logs.contains("notifier=mail"),
        "{logs}"
    );
    // Nor in the outbox or the run records.
    let dump = text(&s.run(&["notify", "pending", "--all"]).stdout)
        + &serde_json::to_string(&s.history("app")).expect("json");
    for canary in [output_canary, url_canary, password_canary] {
        assert!(!dump.contains(canary), "{canary} stored: {dump}");
    }
}

#[test]
fn the_daemon_sends_notifications_promptly() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("fail", "quota exceeded\n")], "first");
    let sink = Service::http_sink(root.path(), 0);
    let cfg = format!(
        "[defaults]\nnotify = [\"hook\"]\n\n[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\n{}",
        sink.port,
        exec_target(
            "app",
            &remote.url(),
            "interval = \"1h\"",
            "apply = [\"sh\", \"-c\", \"if [ -f fail ]; then cat fail >&2; exit 1; fi\"]"
        )
    );
    let s = Setup::new(&cfg);
    let daemon = s.serve();
    wait_for(Duration::from_secs(20), "the failure notification", || {
        !events(&sink, "/hook").is_empty()
    });
    let e = &events(&sink, "/hook")[0];
    assert_eq!(e["event"], "failed");
    assert_eq!(e["trigger"], "interval");
    assert!(
        e["message"]
            .as_str()
            .unwrap_or("")
            .contains("quota exceeded")
    );
    drop(daemon);
}

#[test]
fn a_failure_that_lasts_is_told_again_after_repeat_after() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/fail", "disk full on /var\n")], "broken");
    let sink = Service::http_sink(root.path(), 0);
    let s = Setup::new(&format!(
        "[defaults]\nrepeat_after = \"2s\"\n\n\
         [[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\n{}",
        sink.port,
        failing_target(&remote, "[\"hook\"]", "path = \"app\"")
    ));
    let tick = || {
        let out = s.run(&["tick", "app"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    };
    tick(); // failed
    tick(); // the same failure, told less than 2 s ago: nothing
    std::thread::sleep(Duration::from_millis(2100));
    tick(); // still failing after 2 s: still_failing
    tick(); // told just now: nothing
    let hook = events(&sink, "/hook");
    let kinds: Vec<&str> = hook
        .iter()
        .map(|e| e["event"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["failed", "still_failing"], "{hook:#?}");
    assert_eq!(hook[1]["consecutive_failures"], 3, "{}", hook[1]);
    assert!(
        hook[1]["message"]
            .as_str()
            .unwrap_or("")
            .contains("disk full on /var"),
        "{}",
        hook[1]
    );
    assert!(
        hook[1]["failing_for_ms"].as_i64().unwrap_or(0) >= 2000,
        "{}",
        hook[1]
    );
}

#[test]
fn a_notifier_that_never_answers_is_given_up_after_its_attempts_with_an_error() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/fail", "disk full on /var\n")], "broken");
    let closed = free_port(); // nothing listens here
    let s = Setup::new(&format!(
        "[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{closed}/hook\"\n\
         attempts = 2\nretry_after = \"1s\"\n\n{}",
        failing_target(&remote, "[\"hook\"]", "path = \"app\"")
    ));
    let out = s.run(&["tick", "app"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let log = text(&out.stderr);
    assert!(
        log.contains("notification failed; will retry") && log.contains("retry_in=1s"),
        "{log}"
    );
    let pending = text(&s.run(&["notify", "pending"]).stdout);
    assert!(
        pending.contains("hook") && pending.contains("pending"),
        "{pending}"
    );

    // Not retried before its time.
    let out = s.run(&["tick", "app"]);
    assert!(
        !text(&out.stderr).contains("notification"),
        "{}",
        text(&out.stderr)
    );
    std::thread::sleep(Duration::from_millis(1100));
    // The second attempt is the last: given up, said as an ERROR.
    let out = s.run(&["tick", "app"]);
    let log = text(&out.stderr);
    let given_up: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("notification given up"))
        .collect();
    assert_eq!(given_up.len(), 1, "{log}");
    assert!(
        given_up[0].contains("ERROR")
            && given_up[0].contains("attempts=2")
            && given_up[0].contains("hook"),
        "{log}"
    );
    // Gone from the outbox, kept for `--all`, and never tried again.
    let pending = text(&s.run(&["notify", "pending"]).stdout);
    assert!(pending.contains("no notifications pending"), "{pending}");
    let all = text(&s.run(&["notify", "pending", "--all"]).stdout);
    assert!(all.contains("given_up") && all.contains("hook"), "{all}");
    std::thread::sleep(Duration::from_millis(2100));
    let out = s.run(&["tick", "app"]);
    assert!(
        !text(&out.stderr).contains("notification"),
        "{}",
        text(&out.stderr)
    );
    // The backend's result was never touched by the notifier's trouble.
    assert_eq!(s.target_status("app")["last_result"], "failed");
}

#[test]
fn attempts_and_retry_after_out_of_range_are_named() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("app/ok", "1")], "first");
    let s = Setup::new(&format!(
        "[[notifiers]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:9/hook\"\n\
         attempts = 0\nretry_after = \"1h\"\n\n{}",
        failing_target(&remote, "[\"hook\"]", "")
    ));
    let out = s.run(&["check"]);
    let err = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("attempts") && err.contains("between 1 and 100"),
        "{err}"
    );
    assert!(
        err.contains("retry_after") && err.contains("between 1s and 10m"),
        "{err}"
    );
}

/// ntfy and Discord, against a stand-in of each written from their own
/// source and API documentation: a failure is one ntfy message (JSON
/// publish: topic, title, priority high, tags, click to the commit, the
/// access token as a bearer) and one Discord embed that pings nobody; a
/// 429 from either pauses that destination for the wait it named (Discord's
/// Retry-After; ntfy names none: a minute), then the message goes through,
/// never changing the run; the ntfy token and the Discord webhook token are in no output and
/// no file of the state directory.
#[test]
fn ntfy_and_discord_get_each_event_and_a_rate_limit_is_retried() {
    let root = tempfile::tempdir().expect("tempdir");
    let chat = ChatStandin::start(root.path());
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("fail", "the disk is full\n")], "failing");
    let token_file = root.path().join("ntfy-token");
    std::fs::write(&token_file, format!("{}\n", chat.ntfy_token)).expect("write");
    let discord_file = root.path().join("discord-url");
    std::fs::write(
        &discord_file,
        format!("http://127.0.0.1:{}{}\n", chat.port, chat.discord_path),
    )
    .expect("write");
    let s = Setup::new(&format!(
        "{}\n[[notifiers]]\nname = \"phone\"\nkind = \"ntfy\"\nurl = \"http://127.0.0.1:{}/driftless-ops\"\n\
         token_file = {}\ntags = {{ recovered = [\"white_check_mark\"] }}\n\
         [[notifiers]]\nname = \"chat\"\nkind = \"discord\"\nurl_file = {}\n",
        failing_target(&remote, "[\"phone\", \"chat\"]", ""),
        chat.port,
        toml_str(&token_file.display().to_string()),
        toml_str(&discord_file.display().to_string()),
    ));
    let tick = |code: i32| -> String {
        let out = s.run(&["tick", "app"]);
        let said = text(&out.stdout) + &text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{said}");
        said
    };
    chat.rate_limit(2);
    let mut said = tick(1);
    let j = chat.journal();
    assert_eq!(j.len(), 2, "{j:#?}");
    assert!(j.iter().all(|r| r["answered"] == 429), "{j:#?}");
    assert!(said.contains("WARN") && said.contains("429"), "{said}");
    assert_eq!(s.history("app")[0]["result"], "failed");
    // Each destination is paused for what it said: Discord its Retry-After
    // (1 s), ntfy — whose 429 names no time — a minute.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let limits = sql_rows(
        &s.db(),
        "SELECT label, paused_until FROM destination_limits ORDER BY label",
    );
    let wait = |who: &str| {
        limits
            .iter()
            .find(|l| l["label"].as_str().is_some_and(|x| x.starts_with(who)))
            .and_then(|l| l["paused_until"].as_i64())
            .map(|u| u - now_ms)
    };
    assert!(
        wait("notifier `chat`").is_some_and(|w| w <= 2000),
        "{limits:?}"
    );
    assert!(
        wait("notifier `phone`").is_some_and(|w| (55_000..=61_000).contains(&w)),
        "{limits:?}"
    );

    // Past Discord's wait: the next tick's sender sends its message; ntfy
    // is not called while its pause holds.
    std::thread::sleep(Duration::from_millis(2200));
    said += &tick(1);
    assert_eq!(
        chat.journal()
            .iter()
            .filter(|r| r["route"] == "ntfy")
            .count(),
        1,
        "ntfy was called while paused"
    );
    // A minute later (the pause made to have passed): ntfy's too.
    sql_exec(
        &s.db(),
        "UPDATE destination_limits SET paused_until = 0;
         UPDATE notifications SET next_attempt_at = 0 WHERE state = 'pending';",
    );
    said += &tick(1);
    let sent: Vec<Value> = chat
        .journal()
        .into_iter()
        .filter(|r| {
            r["answered"]
                .as_u64()
                .is_some_and(|c| (200..300).contains(&c))
        })
        .collect();
    let ntfy: Vec<&Value> = sent.iter().filter(|r| r["route"] == "ntfy").collect();
    let discord: Vec<&Value> = sent.iter().filter(|r| r["route"] == "discord").collect();
    assert_eq!((ntfy.len(), discord.len()), (1, 1), "{sent:#?}");
    let n = &ntfy[0]["body"];
    assert_eq!(n["topic"], "driftless-ops");
    assert_eq!(n["priority"], 4, "{n}");
    assert_eq!(n["tags"], serde_json::json!(["driftless", "failed"]));
    assert!(
        n["title"]
            .as_str()
            .is_some_and(|t| t.starts_with("driftless: app: failed at ")),
        "{n}"
    );
    assert!(
        n["message"]
            .as_str()
            .is_some_and(|m| m.contains("the disk is full")),
        "{n}"
    );
    assert!(
        n["click"]
            .as_str()
            .is_some_and(|c| c.starts_with("https://git.example.net/ops/infra/commit/")),
        "{n}"
    );
    assert_eq!(
        ntfy[0]["authorization"],
        format!("Bearer {}", chat.ntfy_token)
    );
    let d = &discord[0]["body"];
    assert_eq!(d["allowed_mentions"], serde_json::json!({ "parse": [] }));
    let embed = &d["embeds"][0];
    assert!(
        embed["title"]
            .as_str()
            .is_some_and(|t| t.starts_with("app: failed at ")),
        "{d}"
    );
    assert!(
        embed["description"]
            .as_str()
            .is_some_and(|m| m.contains("the disk is full")),
        "{d}"
    );
    assert_eq!(embed["color"], 0xd03030);
    // The second failure has the same message: nothing new was told.
    let rows = sql_rows(
        &s.db(),
        "SELECT notifier, state, attempts FROM notifications ORDER BY id",
    );
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| r["state"] == "sent"), "{rows:?}");

    for secret in [chat.ntfy_token.as_str(), chat.discord_path.as_str()] {
        let secret = secret.rsplit('/').next().unwrap_or(secret);
        assert!(!said.contains(secret), "a secret in the output: {said}");
        assert_state_keeps_out(&s.state, secret);
    }
}

/// Slack's incoming webhook as Slack answers it (`tests/chat_standin.py`):
/// a long failure message fits the section block's 3000 characters (else
/// `invalid_blocks`), and a 429 waits for its Retry-After — one call while
/// limited, no attempt spent — and then goes through.
#[test]
fn slack_gets_a_message_it_accepts_and_its_rate_limit_is_waited_out() {
    let root = tempfile::tempdir().expect("tempdir");
    let chat = ChatStandin::start(root.path());
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("fail", &"the disk is full ".repeat(400))], "failing");
    let url_file = root.path().join("slack-url");
    std::fs::write(
        &url_file,
        format!(
            "http://127.0.0.1:{}/services/T0/B0/secret-slack-token\n",
            chat.port
        ),
    )
    .expect("write");
    let s = Setup::new(&format!(
        "{}\n[[notifiers]]\nname = \"chat\"\nkind = \"slack\"\nurl_file = {}\n",
        failing_target(&remote, "[\"chat\"]", ""),
        toml_str(&url_file.display().to_string()),
    ));
    chat.rate_limit(1);
    let out = s.run(&["tick", "app"]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("rate-limited"), "{said}");
    let j = chat.journal();
    assert_eq!(j.len(), 1, "{j:#?}");
    assert_eq!(j[0]["answered"], 429);
    std::thread::sleep(Duration::from_millis(1200));
    let out = s.run(&["tick", "app"]);
    assert_eq!(out.status.code(), Some(1));
    let j = chat.journal();
    let ok: Vec<&Value> = j.iter().filter(|r| r["answered"] == 200).collect();
    assert_eq!(ok.len(), 1, "{j:#?}");
    let body = &ok[0]["body"];
    assert!(
        body["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("driftless: app: failed")),
        "{body}"
    );
    let rows = sql_rows(&s.db(), "SELECT state, attempts FROM notifications");
    assert_eq!(rows, [serde_json::json!({"state": "sent", "attempts": 1})]);
}

/// Synapse's own rate limit (`rc_message`: one message, then one per
/// 5 s): a message it refuses with 429 M_LIMIT_EXCEEDED and
/// `retry_after_ms` pauses the destination for that long — no call in
/// between, no attempt spent — and every message arrives in the end.
#[test]
fn matrix_rate_limits_from_synapse_are_waited_out() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(&[("fail", "first failure\n")], "first");
    let (synapse, token, room) =
        Service::synapse_with(root.path(), "{per_second: 0.2, burst_count: 1}");
    let token_file = root.path().join("matrix-token");
    std::fs::write(&token_file, &token).expect("write");
    let cfg = format!(
        "[[notifiers]]\nname = \"matrix\"\nkind = \"matrix\"\nhomeserver = \"http://127.0.0.1:{}\"\n\
         access_token_file = {}\nroom_id = \"{room}\"\n\n{}",
        synapse.port,
        toml_str(&token_file.display().to_string()),
        failing_target(&remote, "[\"matrix\"]", "")
    );
    let s = Setup::new(&cfg);
    let run = |args: &[&str]| {
        let out = s.run(args);
        text(&out.stdout) + &text(&out.stderr)
    };
    let mut said = run(&["tick", "app"]);
    // A new failure, another message, right after.
    remote.commit(&[("fail", "second failure\n")], "second");
    said += &run(&["tick", "app"]);
    assert!(
        said.contains("rate-limited") && said.contains("M_LIMIT_EXCEEDED"),
        "{said}"
    );
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64
    };
    let until = || {
        sql_rows(&s.db(), "SELECT paused_until FROM destination_limits")
            .first()
            .and_then(|r| r["paused_until"].as_i64())
            .unwrap_or(0)
    };
    let wait = until() - now_ms();
    assert!(
        (500..=6_000).contains(&wait),
        "paused for {wait} ms, not Synapse's retry_after_ms"
    );
    let pending = run(&["notify", "pending"]);
    assert!(pending.contains("notifier `matrix`"), "{pending}");
    // Each pause waited out, the messages arrive, each sent with one
    // attempt: the refusals spent none.
    let started = std::time::Instant::now();
    while synapse.matrix_messages(&token, &room).len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "{:#?}",
            synapse.matrix_messages(&token, &room)
        );
        let left = (until() - now_ms()).max(0) as u64;
        std::thread::sleep(Duration::from_millis(left + 300));
        run(&["tick", "app"]);
    }
    let rows = sql_rows(
        &s.db(),
        "SELECT state, attempts FROM notifications ORDER BY id",
    );
    assert!(
        rows.iter()
            .all(|r| r["state"] == "sent" && r["attempts"] == 1),
        "{rows:?}"
    );
}
