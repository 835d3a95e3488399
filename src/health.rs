//! Health after an apply (`[targets.health]`): the checks — `http`,
//! `tcp`, `command` — and [`watch`], which runs them from the controller
//! after `grace`, every `interval`, until all of them pass or `timeout`
//! ends, and says which one failed last and how. URLs and addresses may
//! name the target's outputs (`${outputs.NAME}`), filled in just before a
//! check runs. Every message passes the run's redactor.
//!
//! It knows nothing of runs, the store, git or backends: what an unhealthy
//! verdict does to a target (report, quarantine, roll back) is
//! `tick::health`'s.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::process;
use crate::redact::Redactor;

/// `[targets.health]`, validated (`config::health`).
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    pub checks: Vec<Check>,
    /// Time after the apply before the first check.
    pub grace: Duration,
    /// Time between two rounds of checks.
    pub interval: Duration,
    /// How long after `grace` the checks may take to pass.
    pub timeout: Duration,
    pub on_unhealthy: OnUnhealthy,
    /// Check health on an interval tick that applied nothing, too.
    pub recheck: bool,
    /// Under `rollback`, on a backend that arms a watchdog (pi): how long
    /// the host waits for driftless to confirm a change (its checks
    /// passed, over a new connection) before undoing it by itself.
    pub confirm_within: Option<Duration>,
}

/// What an unhealthy apply leads to (`on_unhealthy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnhealthy {
    /// Keep what was applied and report it; the commit is not applied
    /// again until a newer one arrives or a person retries.
    Report,
    /// Apply the last commit that was applied and healthy, and hold the
    /// target there until a newer commit arrives or a person retries.
    Rollback,
}

impl OnUnhealthy {
    pub fn as_str(self) -> &'static str {
        match self {
            OnUnhealthy::Report => "report",
            OnUnhealthy::Rollback => "rollback",
        }
    }
}

/// One check: healthy when it passes.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// `http = "URL"`: an answer with the expected status (any 2xx unless
    /// `status` says), and the body holding `body` / matching `body_regex`.
    Http(HttpCheck),
    /// `tcp = "host:port"`: a connection is accepted.
    Tcp { address: String },
    /// `command = [argv]`: exits 0, run in the target's directory of the
    /// checkout with its inputs in the environment.
    Command { argv: Vec<String> },
    /// A check only the target's backend can run ([`Own`]).
    Own(OwnCheck),
}

/// The checks a backend runs itself, each a key of its own
/// (`Kind::own_checks` says which a backend serves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnCheck {
    /// `services = true` (compose): every service has its containers
    /// running, and healthy where their image or service declares a
    /// HEALTHCHECK, as dockerd reports them.
    Services,
    /// `on_host = [argv]` (pi): exits 0 on the host, run over a new ssh
    /// connection in its `remote_dir`.
    OnHost(Vec<String>),
}

impl OwnCheck {
    /// Its key in `[[targets.health.checks]]`.
    pub fn key(&self) -> &'static str {
        match self {
            OwnCheck::Services => "services",
            OwnCheck::OnHost(_) => "on_host",
        }
    }
}

/// The target's backend, running the checks only it can
/// ([`Check::Own`]): `Err` says what is unhealthy.
pub trait Own: Sync {
    fn check<'a>(&'a self, check: &'a OwnCheck) -> crate::model::BoxFuture<'a, Result<(), String>>;
}

#[derive(Debug, Clone, PartialEq)]
pub struct HttpCheck {
    pub url: String,
    pub status: Option<u16>,
    pub body: Option<String>,
    pub body_regex: Option<String>,
    /// PEM roots to trust, besides the system's, for an https URL.
    pub ca_file: Option<PathBuf>,
}

impl Check {
    /// The check as configured, placeholders unfilled: `http URL`.
    pub fn label(&self) -> String {
        match self {
            Check::Http(h) => format!("http {}", h.url),
            Check::Tcp { address } => format!("tcp {address}"),
            Check::Command { argv } => format!("command `{}`", argv.join(" ")),
            Check::Own(OwnCheck::Services) => "services".to_string(),
            Check::Own(OwnCheck::OnHost(argv)) => format!("on_host `{}`", argv.join(" ")),
        }
    }

    /// The output names its placeholders use.
    pub fn outputs_named(&self) -> Vec<String> {
        match self {
            Check::Http(h) => placeholders(&h.url).unwrap_or_default(),
            Check::Tcp { address } => placeholders(address).unwrap_or_default(),
            Check::Command { .. } | Check::Own(_) => Vec::new(),
        }
    }
}

/// A quarantine in words, as status, the page and a held tick say it: the
/// target at `at` while the tip `tip` was found unhealthy for `reason` —
/// held at the healthy commit, or at the unhealthy one as applied.
pub fn hold_words(at: &str, tip: &str, reason: &str) -> String {
    use crate::model::short_sha;
    if at == tip {
        format!(
            "held at {} (unhealthy, kept as applied): {reason}; not applied again until a \
             newer commit or `driftless retry`",
            short_sha(tip)
        )
    } else {
        format!(
            "held at {} (healthy); tip {} unhealthy: {reason}",
            short_sha(at),
            short_sha(tip)
        )
    }
}

const OPEN: &str = "${outputs.";

/// The output names in `s`'s `${outputs.NAME}` placeholders, in order.
/// `Err` names what is malformed.
pub fn placeholders(s: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        let after = &rest[i..];
        let Some(tail) = after.strip_prefix(OPEN) else {
            return Err(format!(
                "`{}` is not a placeholder: write ${{outputs.NAME}}",
                after.split('}').next().unwrap_or(after)
            ));
        };
        let Some(end) = tail.find('}') else {
            return Err("a `${outputs.` placeholder is not closed with `}`".into());
        };
        let name = &tail[..end];
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!("`{name}` is not an output name"));
        }
        names.push(name.to_string());
        rest = &tail[end + 1..];
    }
    Ok(names)
}

/// `s` with each `${outputs.NAME}` replaced by that output's value (a
/// string as it is, anything else as JSON). `Err` names a missing output.
pub fn fill(
    s: &str,
    outputs: &serde_json::Map<String, serde_json::Value>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find(OPEN) {
        out.push_str(&rest[..i]);
        let tail = &rest[i + OPEN.len()..];
        let end = tail
            .find('}')
            .ok_or_else(|| "a `${outputs.` placeholder is not closed with `}`".to_string())?;
        let name = &tail[..end];
        match outputs.get(name) {
            Some(serde_json::Value::String(v)) => out.push_str(v),
            Some(v) => out.push_str(&v.to_string()),
            None => {
                return Err(format!(
                    "the target has no output `{name}` (its last apply recorded {})",
                    if outputs.is_empty() {
                        "none".to_string()
                    } else {
                        outputs.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                ));
            }
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// What a check runs with.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    /// The target's directory in the checkout: where a command runs.
    pub workdir: PathBuf,
    /// The target's inputs, in a command's environment.
    pub env: BTreeMap<String, String>,
    /// The target's outputs, for placeholders.
    pub outputs: serde_json::Map<String, serde_json::Value>,
    /// Masks the run's secrets (and sensitive outputs) in every message.
    pub redactor: Redactor,
}

/// What [`watch`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every check passed, `after` the watch began (grace included).
    Healthy { after: Duration, rounds: u32 },
    /// A check still failed when the timeout ended: `reason` says which
    /// and how (redacted).
    Unhealthy { reason: String, rounds: u32 },
}

/// The longest a single check may take, whatever the interval.
const MAX_TRY: Duration = Duration::from_secs(30);
/// The shortest time an http or tcp check is given.
const MIN_TRY: Duration = Duration::from_secs(2);
/// The shortest time a check that starts a program is given (`command`,
/// and the backends' own: compose's `services` starts docker-compose
/// twice, ~0.8 s each unloaded on an x86 and seconds on a loaded Pi; pi's
/// `on_host` opens an ssh connection). With 2 s such a check failed every
/// round on a busy host and a healthy apply was rolled back.
const MIN_TRY_PROGRAM: Duration = Duration::from_secs(10);

impl Check {
    /// The time this check is given to answer in a round run every
    /// `interval`: the interval, at least [`MIN_TRY`] (a program:
    /// [`MIN_TRY_PROGRAM`]), at most [`MAX_TRY`].
    pub fn time_given(&self, interval: Duration) -> Duration {
        let least = match self {
            Check::Http(_) | Check::Tcp { .. } => MIN_TRY,
            Check::Command { .. } | Check::Own(_) => MIN_TRY_PROGRAM,
        };
        interval.clamp(least, MAX_TRY)
    }
}

/// Watch `health`'s checks: after what is left of `grace` (`already` has
/// passed since the apply, for a watch resumed after a restart), a round
/// every `interval` until one passes whole or `timeout` (after grace) has
/// passed; the last round's failure is the reason.
pub async fn watch(health: &Health, probe: &Probe, own: &dyn Own, already: Duration) -> Verdict {
    let began = Instant::now();
    tokio::time::sleep(health.grace.saturating_sub(already)).await;
    let left = (health.grace + health.timeout).saturating_sub(already.max(health.grace));
    let deadline = Instant::now() + left;
    let mut rounds = 0;
    loop {
        rounds += 1;
        match round(&health.checks, probe, own, health.interval).await {
            Ok(()) => {
                return Verdict::Healthy {
                    after: began.elapsed() + already,
                    rounds,
                };
            }
            Err(reason) if Instant::now() + health.interval >= deadline => {
                return Verdict::Unhealthy {
                    reason: probe.redactor.redact(&reason),
                    rounds,
                };
            }
            Err(_) => tokio::time::sleep(health.interval).await,
        }
    }
}

/// One round: every check in order; the first failure is the round's.
async fn round(
    checks: &[Check],
    probe: &Probe,
    own: &dyn Own,
    interval: Duration,
) -> Result<(), String> {
    for c in checks {
        let each = c.time_given(interval);
        match tokio::time::timeout(each, one(c, probe, own, each)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(format!(
                    "{} did not answer within {}",
                    shown(c, probe),
                    humantime::format_duration(each)
                ));
            }
        }
    }
    Ok(())
}

/// The check as it runs: placeholders filled where they can be.
fn shown(c: &Check, probe: &Probe) -> String {
    let label = c.label();
    fill(&label, &probe.outputs).unwrap_or(label)
}

async fn one(c: &Check, probe: &Probe, own: &dyn Own, each: Duration) -> Result<(), String> {
    match c {
        Check::Http(h) => http(h, probe, each).await,
        Check::Tcp { address } => {
            let address =
                fill(address, &probe.outputs).map_err(|e| format!("tcp {address}: {e}"))?;
            tokio::net::TcpStream::connect(address.as_str())
                .await
                .map(drop)
                .map_err(|e| format!("tcp {address}: {e}"))
        }
        Check::Own(o) => own
            .check(o)
            .await
            .map_err(|e| format!("{}: {e}", c.label())),
        Check::Command { argv } => {
            let mut spec = process::Spec::new(argv.clone(), &probe.workdir);
            spec.env = probe.env.clone();
            spec.deadline = Some(Instant::now() + each);
            let out = process::run(&spec, &probe.redactor)
                .await
                .map_err(|e| format!("command `{}`: {e}", spec.display()))?;
            if out.success() {
                return Ok(());
            }
            let said = out.stderr_summary(3);
            let said = if said.is_empty() {
                redacted_tail(&out.stdout)
            } else {
                said
            };
            Err(format!(
                "{}{}",
                process::describe_exit(&spec, &out, Some(each)),
                if said.is_empty() {
                    String::new()
                } else {
                    format!(": {said}")
                }
            ))
        }
    }
}

/// The last line of `text` (already redacted by the process runner).
fn redacted_tail(text: &str) -> String {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

/// The most of a body an http check reads.
const BODY_MAX: usize = 64 * 1024;

async fn http(h: &HttpCheck, probe: &Probe, each: Duration) -> Result<(), String> {
    let url = fill(&h.url, &probe.outputs).map_err(|e| format!("http {}: {e}", h.url))?;
    let said = |what: String| format!("http {url} {what}");
    let mut b = reqwest::Client::builder().timeout(each);
    if let Some(ca) = &h.ca_file {
        let pem = std::fs::read(ca)
            .map_err(|e| said(format!("cannot be checked: ca_file {}: {e}", ca.display())))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| said(format!("cannot be checked: ca_file {}: {e}", ca.display())))?;
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    let client = b
        .build()
        .map_err(|e| said(format!("cannot be checked: {e}")))?;
    let resp = client
        .get(url.as_str())
        .send()
        .await
        .map_err(|e| said(format!("did not answer: {}", crate::error::chain(&e))))?;
    let status = resp.status().as_u16();
    let expected = match h.status {
        Some(s) => status == s,
        None => (200..300).contains(&status),
    };
    if !expected {
        return Err(said(format!(
            "answered {status}{}",
            h.status.map(|s| format!(", not {s}")).unwrap_or_default()
        )));
    }
    if h.body.is_none() && h.body_regex.is_none() {
        return Ok(());
    }
    let mut body = Vec::new();
    let mut resp = resp;
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| said(format!("broke off its body: {}", crate::error::chain(&e))))?
    {
        body.extend_from_slice(&chunk);
        if body.len() >= BODY_MAX {
            body.truncate(BODY_MAX);
            break;
        }
    }
    let body = String::from_utf8_lossy(&body);
    if let Some(want) = &h.body
        && !body.contains(want.as_str())
    {
        return Err(said(format!(
            "answered {status} without `{want}` in its body"
        )));
    }
    if let Some(re) = &h.body_regex {
        let re = regex_lite::Regex::new(re).map_err(|e| said(format!("body_regex: {e}")))?;
        if !re.is_match(&body) {
            return Err(said(format!(
                "answered {status} with a body that does not match `{re}`"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_that_starts_a_program_is_given_ten_seconds_at_least() {
        let s = Duration::from_secs;
        let http = Check::Tcp {
            address: "127.0.0.1:1".into(),
        };
        let program = Check::Command {
            argv: vec!["true".into()],
        };
        assert_eq!(http.time_given(s(1)), s(2));
        assert_eq!(http.time_given(s(5)), s(5));
        assert_eq!(program.time_given(s(1)), s(10));
        assert_eq!(Check::Own(OwnCheck::Services).time_given(s(1)), s(10));
        assert_eq!(program.time_given(s(20)), s(20));
        assert_eq!(program.time_given(s(300)), s(30));
    }

    #[test]
    fn placeholders_are_read_and_filled_and_a_missing_output_is_named() {
        assert_eq!(
            placeholders("${outputs.endpoint}/healthz?x=${outputs.port}").unwrap(),
            vec!["endpoint", "port"]
        );
        assert!(
            placeholders("${env.X}")
                .unwrap_err()
                .contains("not a placeholder")
        );
        assert!(
            placeholders("${outputs.x")
                .unwrap_err()
                .contains("not closed")
        );
        assert!(
            placeholders("${outputs.a b}")
                .unwrap_err()
                .contains("not an output name")
        );
        let mut o = serde_json::Map::new();
        o.insert("endpoint".into(), "http://127.0.0.1:8080".into());
        o.insert("port".into(), 8080.into());
        assert_eq!(
            fill("${outputs.endpoint}/h?p=${outputs.port}", &o).unwrap(),
            "http://127.0.0.1:8080/h?p=8080"
        );
        let e = fill("${outputs.nope}", &o).unwrap_err();
        assert!(
            e.contains("no output `nope`") && e.contains("endpoint, port"),
            "{e}"
        );
    }
}
