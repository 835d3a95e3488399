//! Secret canaries: a distinct canary value in every secret input driftless
//! takes, then every output path driven — debug logs of the daemon and of
//! one-shot commands, API answers, CLI output, delivered notifications,
//! every file in the state directory (the SQLite database and its WAL
//! included, and the checkout a SOPS file was decrypted in), error
//! messages. No canary may appear in any of them.

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use sha2::{Digest, Sha256};

const HOOK: &str = "CnryHookQ5d1cXw9";
const API: &str = "CnryApiTkn8e2fLp4";
const API_WRONG: &str = "CnryApiWrong3a9bRt";
const SMTP: &str = "CnrySmtpPw77c4Jd";
const SLACK: &str = "CnrySlackUrl1f6eMq";
const MATRIX: &str = "CnryMtxTkb40dVz2";
const NOTIFY_SIG: &str = "CnryNtfySig92aaKe";
const GIT: &str = "CnryGitTkc3e8Hu";
const GIT_WRONG: &str = "CnryGitWrong0d5fPb";
const TF_VAR: &str = "CnryTfSens6b21Yo";
const ENV: &str = "CnryBkEnve7f3Ga";
/// A value in a SOPS-encrypted file, decrypted for an apply.
const SOPS: &str = "CnrySopsVal2b8dNi";
/// Characters that JSON, URLs and shells escape: a leak in an escaped form
/// would not show as the raw string.
const QUOTED: &str = "Cnry \"q/+% x-5e1aTs";

const ALL: [&str; 13] = [
    HOOK, API, API_WRONG, SMTP, SLACK, MATRIX, NOTIFY_SIG, GIT, GIT_WRONG, TF_VAR, ENV, QUOTED,
    SOPS,
];

/// The user names that go with a secret on the wire: the encoded forms of
/// `user:secret` (HTTP Basic) and `\0user\0secret` (SMTP AUTH PLAIN) are
/// looked for too.
const USERS: [&str; 2] = ["deploy", "driftless"];

/// A canary as it could leak: raw, base64 (standard and URL-safe, alone,
/// as HTTP Basic and as SMTP AUTH PLAIN), percent-encoded, JSON-escaped.
fn forms(c: &str) -> Vec<String> {
    use base64::Engine;
    let b64 = |b: &[u8]| {
        [
            base64::engine::general_purpose::STANDARD.encode(b),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b),
        ]
    };
    let mut out = vec![c.to_string()];
    out.extend(b64(c.as_bytes()));
    for u in USERS {
        out.extend(b64(format!("{u}:{c}").as_bytes()));
        out.extend(b64(format!("\0{u}\0{c}").as_bytes()));
    }
    out.push(form_urlencoded::byte_serialize(c.as_bytes()).collect());
    let json = serde_json::to_string(c).unwrap_or_default();
    out.push(json.trim_matches('"').to_string());
    out.sort();
    out.dedup();
    out
}

/// Shell that prints, last, ~20 KB, then `$API_KEY` alone on a line, then
/// 12 bytes less than a run's output tail (16 KiB), in one write: the
/// tail's cut then falls inside the secret, and a cut made before redaction
/// would keep its last 12 characters. (What the command printed before
/// comes 0.3 s earlier, so that it is read first and the cut stays there.)
const BIG_OUTPUT: &str = "f=$(mktemp); { head -c 20000 /dev/zero | tr '\\\\0' x; echo; printf '%s\\\\n' \\\"$API_KEY\\\"; head -c 16370 /dev/zero | tr '\\\\0' y; echo; } > $f; cat $f; rm -f $f;";

const MAIN_TF: &str = r#"
variable "db_password" {
  type      = string
  sensitive = true
}

resource "terraform_data" "db" {
  input = var.db_password
}

output "password" {
  value     = terraform_data.db.output
  sensitive = true
}

output "plain" {
  value = "not-a-secret"
}
"#;

fn file(dir: &Path, name: &str, content: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, content).expect("write secret file");
    toml_str(&p.display().to_string())
}

/// Every file under `dir` that may hold driftless's own output. Terraform's
/// state is left out: terraform keeps sensitive values in its state in
/// plaintext by design (the README says to protect the state directory).
fn state_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("terraform.tfstate") || name == ".terraform" {
            continue;
        }
        if p.is_dir() {
            state_files(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// How many consecutive characters of a canary count as a piece of it.
const PIECE: usize = 8;

/// Every piece of `c` ([`PIECE`] characters long).
fn pieces(c: &str) -> Vec<&str> {
    let idx: Vec<usize> = c.char_indices().map(|(i, _)| i).chain([c.len()]).collect();
    idx.windows(PIECE + 1).map(|w| &c[w[0]..w[PIECE]]).collect()
}

fn assert_clean(what: &str, text: &str) {
    for c in ALL {
        for f in forms(c) {
            assert!(
                !text.contains(&f),
                "canary {c:?} found in {what}, as {f:?}:\n{text}"
            );
        }
        for p in pieces(c) {
            if let Some(at) = text.find(p) {
                let around: String = text[at..].chars().take(80).collect();
                panic!("{PIECE} characters of canary {c:?} ({p:?}) found in {what}: {around:?}");
            }
        }
    }
}

#[test]
fn no_secret_reaches_any_output() {
    terraform_on_path();
    let root = tempfile::tempdir().expect("tempdir");
    let secrets = root.path().join("secrets");
    std::fs::create_dir_all(&secrets).expect("mkdir");

    // Git over https with a token (and one target with a wrong one).
    let remote = Remote::new(root.path(), "infra");
    let sha = remote.commit(
        &[("app/run.sh", "echo start\n"), ("tf/main.tf", MAIN_TF)],
        "first",
    );
    let (git_server, ca) = GitHttp::start_tls(root.path(), "deploy", GIT);
    let https = format!("https://127.0.0.1:{}/infra.git", git_server.port);
    let ca = toml_str(&ca.display().to_string());
    let git_token = file(&secrets, "git-token", GIT);
    let git_wrong = file(&secrets, "git-wrong", GIT_WRONG);
    // A SOPS file for the local remote, and the age key it needs (its
    // secret line is a canary too).
    let (age_key_file, recipient) = age_key(&secrets, "age.key");
    let age_secret = std::fs::read_to_string(&age_key_file)
        .expect("age key")
        .lines()
        .find(|l| l.starts_with("AGE-SECRET-KEY-"))
        .expect("the key line")
        .to_string();
    let encrypted = sops_encrypt(
        root.path(),
        "secret.yaml",
        &format!("value: {SOPS}\n"),
        &recipient,
    );
    remote.commit(&[("sops/secret.yaml", &encrypted)], "a SOPS file");
    let age_key_file = toml_str(&age_key_file.display().to_string());

    // Notification receivers: an HTTP sink for webhook, Slack and Matrix
    // (its first answer fails, so the retry path logs too); a real SMTP
    // server that requires AUTH with the password (so it is used), and one
    // more mail notifier on a closed port, so the error path runs too.
    let sink = Service::http_sink(root.path(), 1);
    let smtp = Service::smtp_auth(root.path(), "driftless", SMTP);
    let slack_url = file(
        &secrets,
        "slack-url",
        &format!("http://127.0.0.1:{}/services/{SLACK}", sink.port),
    );
    let matrix_token = file(&secrets, "matrix-token", MATRIX);
    let smtp_password = file(&secrets, "smtp-password", SMTP);
    let notify_sig = file(&secrets, "notify-signing", NOTIFY_SIG);
    let hook_secret = file(&secrets, "hook-secret", HOOK);
    let closed = free_port();
    let api_digest = hex::encode(Sha256::digest(API.as_bytes()));

    let cfg = format!(
        r#"
[defaults]
notify = ["hook", "chat", "matrix", "mail", "mail-down"]

[[notifiers]]
name = "hook"
kind = "webhook"
url = "http://127.0.0.1:{sink}/hook"
secret_file = {notify_sig}

[[notifiers]]
name = "chat"
kind = "slack"
url_file = {slack_url}

[[notifiers]]
name = "matrix"
kind = "matrix"
homeserver = "http://127.0.0.1:{sink}"
access_token_file = {matrix_token}
room_id = "!ops:example.net"

[[notifiers]]
name = "mail"
kind = "email"
host = "127.0.0.1"
port = {smtp_port}
tls = "none"
username = "driftless"
password_file = {smtp_password}
from = "driftless@example.net"
to = ["ops@example.net"]

[[notifiers]]
name = "mail-down"
kind = "email"
host = "127.0.0.1"
port = {closed}
tls = "none"
username = "driftless"
password_file = {smtp_password}
from = "driftless@example.net"
to = ["ops@example.net"]

[[receivers]]
name = "github"
forge = "github"
secret_file = {hook_secret}

[[tokens]]
name = "ops"
sha256 = "{api_digest}"
scopes = ["reconcile:*", "pause:*", "read"]

[[targets]]
name = "app"
repo = "{https}"
path = "app"
interval = "1h"
[targets.git]
username = "deploy"
token_file = {git_token}
ca_file = {ca}
[targets.backend]
kind = "exec"
apply = ["sh", "-c", "echo using key $API_KEY and $QUOTED; echo failed: key $API_KEY rejected >&2; sleep 0.3; {big} exit 1"]
always = true
env = {{ API_KEY = "env:CANARY_BACKEND_ENV", QUOTED = "env:CANARY_QUOTED" }}

[[targets]]
name = "wronggit"
repo = "{https}"
interval = "1h"
[targets.git]
username = "deploy"
token_file = {git_wrong}
ca_file = {ca}
[targets.backend]
kind = "exec"
apply = ["true"]

[[targets]]
name = "sops"
repo = "{repo}"
path = "sops"
interval = "1h"
[targets.decrypt]
sops = true
age_key_file = {age_key_file}
[targets.backend]
kind = "exec"
apply = ["sh", "-c", "cat secret.yaml; cat secret.yaml >&2; exit 1"]
always = true

# The plan path: a detected plan (daemon and `tick`), `plan` and `retry`
# read the decrypted file too.
[[targets]]
name = "sopsplan"
repo = "{repo}"
path = "sops"
interval = "1h"
policy = "detect"
[targets.decrypt]
sops = true
age_key_file = {age_key_file}
[targets.backend]
kind = "exec"
plan = ["sh", "-c", "echo '~ secret'; cat secret.yaml; cat secret.yaml >&2"]
apply = ["sh", "-c", "cat secret.yaml"]

[[targets]]
name = "tf"
repo = "{repo}"
path = "tf"
interval = "1h"
timeout = "2m"
[targets.backend]
kind = "terraform"
env = {{ TF_CLI_CONFIG_FILE = "/dev/null", TF_VAR_db_password = "env:CANARY_TF_VAR" }}
"#,
        sink = sink.port,
        smtp_port = smtp.port,
        big = BIG_OUTPUT,
        repo = remote.url(),
    );
    let s = Setup::new(&cfg);
    let env = [
        ("RUST_LOG", "debug"),
        ("CANARY_BACKEND_ENV", ENV),
        ("CANARY_TF_VAR", TF_VAR),
        ("CANARY_QUOTED", QUOTED),
    ];
    let daemon = Daemon::start_with_env(&s.config, s.path(), &env);
    let port = daemon.port;
    let mut seen = String::new();

    // Every target runs once at start-up: app fails (notifications),
    // wronggit fails at git, tf creates its resource.
    wait_for(Duration::from_secs(120), "every target's first run", || {
        ["app", "wronggit", "tf", "sops", "sopsplan"]
            .iter()
            .all(|t| s.history(t).first().is_some_and(|r| !r["result"].is_null()))
    });
    assert_eq!(s.target_status("app")["last_result"], "failed");
    assert_eq!(s.target_status("wronggit")["last_result"], "failed");
    assert_eq!(s.target_status("tf")["last_result"], "changed");
    assert_eq!(s.target_status("sops")["last_result"], "failed");
    let tail = s.history("sops")[0]["output_tail"].clone();
    assert!(
        tail.as_str()
            .is_some_and(|t| t.contains("value: [REDACTED]")),
        "the apply did not see the decrypted file: {tail}"
    );
    wait_for(Duration::from_secs(60), "notifications delivered", || {
        let reqs = sink.requests();
        let ok = |p: &str| {
            reqs.iter()
                .any(|r| r["answered"] == 200 && r["path"].as_str().unwrap_or("").starts_with(p))
        };
        ok("/hook") && ok("/services/") && ok("/_matrix/") && !smtp.mails().is_empty()
    });
    // The password was used: the server required AUTH and took it.
    assert!(
        smtp.auth_log().iter().any(|l| l.starts_with("auth ok")),
        "{:?}",
        smtp.auth_log()
    );

    // Webhooks: one signed push, one signed with the wrong key.
    let body = github_push_body(&https, &sha, &["app/run.sh"]);
    let sig = format!("sha256={}", hmac_hex(HOOK, &body));
    let headers = |sig: &str| {
        vec![
            ("Content-Type", "application/json".to_string()),
            ("X-GitHub-Event", "push".to_string()),
            ("X-GitHub-Delivery", format!("d-{}", fastrand::u32(..))),
            ("X-Hub-Signature-256", sig.to_string()),
        ]
    };
    let post = |h: Vec<(&str, String)>, body: &[u8]| {
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        http(port, "POST", "/hooks/github", &h, body)
    };
    let r = post(headers(&sig), &body);
    assert_eq!(r.status, 202, "{}", r.body);
    seen.push_str(&r.body);
    let wrong = format!("sha256={}", hmac_hex(API_WRONG, &body));
    let r = post(headers(&wrong), &body);
    assert_eq!(r.status, 401);
    seen.push_str(&r.body);

    // The API, with the right token and with a wrong one.
    let bearer = format!("Bearer {API}");
    let wrong_bearer = format!("Bearer {API_WRONG}");
    let r = http(
        port,
        "POST",
        "/api/v1/targets/app/reconcile?wait=60s",
        &[("Authorization", &bearer)],
        b"",
    );
    assert!(
        r.status == 200 || r.status == 202,
        "{} {}",
        r.status,
        r.body
    );
    seen.push_str(&r.body);
    let mut paths = vec![
        "/".to_string(),
        "/api/v1/targets".to_string(),
        "/api/v1/targets/app".into(),
        "/api/v1/targets/app/runs".into(),
        "/api/v1/targets/wronggit/runs".into(),
        "/api/v1/targets/tf/runs".into(),
        "/api/v1/targets/sops/runs".into(),
        "/api/v1/targets/sopsplan/runs".into(),
        "/api/v1/deployments".into(),
        "/metrics".into(),
        "/readyz".into(),
    ];
    for t in ["app", "wronggit", "tf", "sops", "sopsplan"] {
        for run in s.history(t) {
            paths.push(format!("/api/v1/runs/{}", run["id"]));
            paths.push(format!("/api/v1/jobs/{}", run["job"]));
        }
    }
    for p in &paths {
        let r = http(port, "GET", p, &[("Authorization", &bearer)], b"");
        assert_eq!(r.status, 200, "{p}: {}", r.body);
        if p == "/" {
            assert!(r.body.contains("wronggit"), "{}", r.body);
        }
        seen.push_str(&r.body);
        // A wrong token is refused everywhere but the open endpoints.
        let r = http(port, "GET", p, &[("Authorization", &wrong_bearer)], b"");
        let open = p == "/metrics" || p == "/readyz";
        assert_eq!(r.status, if open { 200 } else { 401 }, "{p}: {}", r.body);
        seen.push_str(&r.body);
    }
    let r = http(
        port,
        "POST",
        "/api/v1/targets/app/pause",
        &[("Authorization", &wrong_bearer)],
        b"",
    );
    assert_eq!(r.status, 401);
    seen.push_str(&r.body);

    // One-shot commands at debug level, with the same environment.
    let cli = |args: &[&str]| {
        let out = output_within(
            std::process::Command::new(bin())
                .arg("--config")
                .arg(&s.config)
                .args(args)
                .envs(env.iter().copied())
                .env("DRIFTLESS_TOKEN", API),
            std::time::Duration::from_secs(300),
        );
        text(&out.stdout) + &text(&out.stderr)
    };
    let log_path = daemon.log.clone();
    let stop = daemon.stop();
    assert!(stop.success(), "{stop}");
    for args in [
        &["tick", "app"][..],
        &["tick", "wronggit"],
        &["tick", "tf"],
        &["tick", "sops"],
        &["tick", "sopsplan"],
        &["plan", "sopsplan"],
        &["retry", "sopsplan"],
        &["plan", "app"],
        &["retry", "app"],
        &["history", "sopsplan", "--json"],
        &["history", "sops", "--json"],
        &["status"],
        &["status", "--json"],
        &["history", "app", "--json"],
        &["history", "wronggit", "--json"],
        &["history", "tf", "--json"],
        &["outputs", "tf"],
        &["outputs", "app"],
        &["check"],
        &["notify", "pending", "--all"],
        &["notify", "test", "hook"],
    ] {
        seen.push_str(&cli(args));
    }
    // `plan` read the decrypted file, and showed it masked.
    let plan = cli(&["plan", "sopsplan"]);
    assert!(plan.contains("value: [REDACTED]"), "{plan}");
    // The sensitive output is masked, the plain one shown.
    let outputs = cli(&["outputs", "tf"]);
    assert!(outputs.contains("not-a-secret"), "{outputs}");

    // What the daemon logged at debug level.
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        log.contains("DEBUG"),
        "the daemon did not log at debug level"
    );
    assert!(log.contains("notifier=mail"), "{log}");
    seen.push_str(&log);

    // What the notification receivers got (bodies; the Slack URL path and
    // the Matrix Authorization header are where those secrets belong).
    let reqs = sink.requests();
    assert!(reqs.len() >= 3, "{reqs:#?}");
    for r in &reqs {
        seen.push_str(r["body"].as_str().unwrap_or(""));
        if let Some(h) = r["headers"].as_object() {
            for (k, v) in h {
                if k != "authorization" {
                    seen.push_str(&format!("{k}: {v}\n"));
                }
            }
        }
    }
    for m in smtp.mails() {
        seen.push_str(&m);
    }
    assert!(seen.contains("[REDACTED]"), "nothing was redacted at all?");
    assert_clean("logs, API answers, CLI output or notifications", &seen);
    assert!(!seen.contains(&age_secret), "the age key was shown");

    // Every file in the state directory, byte for byte.
    let mut files = Vec::new();
    state_files(&s.state, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("driftless.db")),
        "{files:?}"
    );
    for f in files {
        let bytes = std::fs::read(&f).unwrap_or_default();
        let t = String::from_utf8_lossy(&bytes);
        assert!(
            !t.contains(&age_secret),
            "the age key is in {}",
            f.display()
        );
        for c in ALL {
            for form in forms(c) {
                assert!(
                    !t.contains(&form),
                    "canary {c:?} stored in {} as {form:?}",
                    f.display()
                );
            }
            for p in pieces(c) {
                assert!(
                    !t.contains(p),
                    "{PIECE} characters of canary {c:?} ({p:?}) stored in {}",
                    f.display()
                );
            }
        }
    }
}

fn terraform_on_path() {
    let ok = std::process::Command::new("terraform")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "this test needs `terraform` on the PATH (see .ci/run)");
}
