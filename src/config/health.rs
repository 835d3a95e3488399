//! `[targets.health]` (and `[defaults.health]`, and a target set's): its
//! checks and timings, every problem named by its key — a URL that does
//! not parse or carries credentials, a port out of range, a command this
//! machine does not have (`check`), a placeholder that is not
//! `${outputs.NAME}`. Running the checks is `health`'s.

use super::*;
use crate::health::{Check, Health, HttpCheck, OnUnhealthy, OwnCheck};

/// `health`: checks after every apply; the run is `changed` only once
/// every one passes (docs/health.md).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    /// The checks, each one of `http`, `tcp`, `command`, `services`
    /// (compose) or `on_host` (pi).
    #[schemars(with = "Option<Vec<RawCheck>>")]
    checks: Option<Vec<Value>>,
    /// Before the first check. Default: 0s.
    grace: Option<String>,
    /// Between rounds of checks. Default: 5s.
    interval: Option<String>,
    /// Until every check must pass. Default: 1m.
    timeout: Option<String>,
    /// `report`: keep what was applied; `rollback`: apply the last healthy
    /// commit again and hold the target there. Default: report.
    #[schemars(extend("enum" = ["report", "rollback"]))]
    on_unhealthy: Option<String>,
    /// An interval tick that applied nothing checks too. Default: false.
    recheck: Option<bool>,
    /// pi under `rollback`: the host undoes the change by itself unless
    /// driftless confirms it within this. Default: grace + timeout + 1m.
    confirm_within: Option<String>,
}

/// One `[[targets.health.checks]]` entry.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawCheck {
    /// A URL that must answer `status` (may name outputs:
    /// `${outputs.endpoint}/healthz`).
    http: Option<String>,
    /// `host:port` that must accept a connection.
    tcp: Option<String>,
    /// argv run in the target's path; exit 0 is healthy.
    command: Option<Vec<String>>,
    /// compose: every service of the project is running (and healthy, if
    /// it has a healthcheck).
    services: Option<bool>,
    /// pi: argv run on the host; exit 0 is healthy.
    on_host: Option<Vec<String>>,
    /// `http`: the status expected. Default: 200.
    status: Option<u16>,
    /// `http`: text the body must contain.
    body: Option<String>,
    /// `http`: a regular expression the body must match.
    body_regex: Option<String>,
    /// `http`: extra CA roots (PEM) for the URL's certificate.
    ca_file: Option<String>,
}

const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
const MAX_INTERVAL: Duration = Duration::from_secs(600);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
const MAX_GRACE: Duration = Duration::from_secs(3600);
/// A watchdog's `confirm_within`, unless said: the checks' whole time
/// and this.
const DEFAULT_CONFIRM_SLACK: Duration = Duration::from_secs(60);
/// Checks in one table: a round runs them all.
const MAX_CHECKS: usize = 20;

pub(super) fn validate_health(
    raw: Value,
    section: &str,
    base: &Path,
    machine: bool,
    problems: &mut Vec<Problem>,
) -> Option<Health> {
    let raw = read_table::<RawHealth>(raw, section, "health.", problems)?;
    let before = problems.len();
    let grace = match raw.grace.as_deref().map(str::trim) {
        Some("0" | "0s") => Duration::ZERO,
        g => duration(
            section,
            "health.grace",
            g,
            Duration::ZERO,
            MAX_GRACE,
            problems,
        ),
    };
    let interval = duration(
        section,
        "health.interval",
        raw.interval.as_deref(),
        DEFAULT_INTERVAL,
        MAX_INTERVAL,
        problems,
    );
    let timeout = duration(
        section,
        "health.timeout",
        raw.timeout.as_deref(),
        DEFAULT_TIMEOUT,
        MAX_TIMEOUT,
        problems,
    );
    let confirm_within = raw.confirm_within.as_deref().map(|c| {
        duration(
            section,
            "health.confirm_within",
            Some(c),
            DEFAULT_CONFIRM_SLACK,
            MAX_TIMEOUT,
            problems,
        )
    });
    let on_unhealthy = match raw.on_unhealthy.as_deref() {
        None | Some("report") => OnUnhealthy::Report,
        Some("rollback") => OnUnhealthy::Rollback,
        Some(other) => {
            problems.push(problem(
                section,
                "health.on_unhealthy",
                format!(
                    "`{other}` is not one of \"report\" (keep what was applied and say so) \
                     or \"rollback\" (apply the last healthy commit again)"
                ),
            ));
            OnUnhealthy::Report
        }
    };
    let raw_checks = raw.checks.unwrap_or_default();
    if raw_checks.is_empty() {
        problems.push(problem(
            section,
            "health.checks",
            "name at least one check: [[targets.health.checks]] with http = \"URL\", \
             tcp = \"host:port\" or command = [\"argv\", …]",
        ));
    } else if raw_checks.len() > MAX_CHECKS {
        problems.push(problem(
            section,
            "health.checks",
            format!(
                "{} checks; at most {MAX_CHECKS} run in one round",
                raw_checks.len()
            ),
        ));
    }
    let checks: Vec<Check> = raw_checks
        .into_iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let key = format!("health.checks[{i}]");
            validate_check(c, section, &key, base, machine, problems)
        })
        .collect();
    (problems.len() == before).then_some(Health {
        checks,
        grace,
        interval,
        timeout,
        on_unhealthy,
        recheck: raw.recheck.unwrap_or(false),
        confirm_within,
    })
}

fn validate_check(
    raw: Value,
    section: &str,
    key: &str,
    base: &Path,
    machine: bool,
    problems: &mut Vec<Problem>,
) -> Option<Check> {
    let c = read_table::<RawCheck>(raw, section, &format!("{key}."), problems)?;
    let kinds = [
        c.http.is_some(),
        c.tcp.is_some(),
        c.command.is_some(),
        c.services.is_some(),
        c.on_host.is_some(),
    ];
    if kinds.iter().filter(|k| **k).count() != 1 {
        problems.push(problem(
            section,
            key,
            "give exactly one of http = \"URL\", tcp = \"host:port\", command = [\"argv\", …], \
             services = true (compose) or on_host = [\"argv\", …] (pi)",
        ));
        return None;
    }
    let http_only = [
        ("status", c.status.is_some()),
        ("body", c.body.is_some()),
        ("body_regex", c.body_regex.is_some()),
        ("ca_file", c.ca_file.is_some()),
    ];
    if c.http.is_none() {
        for (k, _) in http_only.iter().filter(|(_, set)| *set) {
            problems.push(problem(
                section,
                &format!("{key}.{k}"),
                "belongs to an http check only",
            ));
        }
    }
    if let Some(url) = c.http {
        return validate_http(
            HttpCheck {
                url,
                status: c.status,
                body: c.body,
                body_regex: c.body_regex,
                ca_file: c.ca_file.map(|f| resolve(base, &f)),
            },
            section,
            key,
            machine,
            problems,
        );
    }
    if let Some(address) = c.tcp {
        return validate_tcp(address, section, &format!("{key}.tcp"), problems);
    }
    match (c.services, c.on_host) {
        (Some(true), _) => return Some(Check::Own(OwnCheck::Services)),
        (Some(false), _) => {
            problems.push(problem(
                section,
                &format!("{key}.services"),
                "false checks nothing: leave the check out",
            ));
            return None;
        }
        (_, Some(argv)) if argv.first().is_none_or(String::is_empty) => {
            problems.push(problem(
                section,
                &format!("{key}.on_host"),
                "must name a program to run on the host",
            ));
            return None;
        }
        (_, Some(argv)) => return Some(Check::Own(OwnCheck::OnHost(argv))),
        (None, None) => {}
    }
    let argv = c.command.unwrap_or_default();
    let k = format!("{key}.command");
    let Some(program) = argv.first() else {
        problems.push(problem(section, &k, "must name a program"));
        return None;
    };
    if program.is_empty() {
        problems.push(problem(section, &k, "the program must not be empty"));
        return None;
    }
    // A program with a slash in its name is the repository's (found in
    // the checkout when the check runs) or an absolute path.
    if machine {
        let missing = if program.starts_with('/') {
            !Path::new(program).is_file()
        } else {
            !program.contains('/') && crate::backend::find_on_path(program).is_none()
        };
        if missing {
            problems.push(problem(
                section,
                &k,
                format!("`{program}` is not a program on this machine (not on the PATH, or no such file)"),
            ));
        }
    }
    Some(Check::Command { argv })
}

/// A target's checks that only its backend can run are ones it serves
/// (`Kind::own_checks`): for its own table, `[defaults.health]` and a
/// set's, once the target has its backend and its health.
pub(super) fn check_own(t: &mut Target, problems: &mut Vec<Problem>) {
    let section = format!("targets[{}]", t.name);
    let watchdog = t.backend.arms_watchdog();
    let kind = t.backend.kind();
    let Some(h) = t.health.as_mut() else { return };
    // A backend whose change can cut driftless off (pi) arms a watchdog
    // under `rollback`: the host undoes an unconfirmed change itself.
    let checks_take = h.grace + h.timeout;
    match (
        watchdog && h.on_unhealthy == OnUnhealthy::Rollback,
        h.confirm_within,
    ) {
        (true, None) => h.confirm_within = Some(checks_take + DEFAULT_CONFIRM_SLACK),
        (true, Some(c)) if c <= checks_take => problems.push(problem(
            &section,
            "health.confirm_within",
            format!(
                "{} is not longer than grace + timeout ({}): the host would undo the change \
                 before its checks could pass",
                humantime::format_duration(c),
                humantime::format_duration(checks_take)
            ),
        )),
        (true, Some(_)) => {}
        (false, Some(_)) => problems.push(problem(
            &section,
            "health.confirm_within",
            format!(
                "only a backend that arms a watchdog on its host (pi), under \
                 on_unhealthy = \"rollback\", waits for a confirmation; the {kind} backend with \
                 on_unhealthy = \"{}\" does not",
                h.on_unhealthy.as_str()
            ),
        )),
        (false, None) => {}
    }
    let h = &*h;
    let serves = t.backend.own_checks();
    for (i, c) in h.checks.iter().enumerate() {
        if let Check::Own(o) = c
            && !serves.contains(&o.key())
        {
            problems.push(problem(
                &section,
                &format!("health.checks[{i}].{}", o.key()),
                format!(
                    "the {kind} backend cannot check `{}`{}",
                    o.key(),
                    match o {
                        OwnCheck::Services => " (compose's: its services' containers)",
                        OwnCheck::OnHost(_) => " (pi's: a command on the host over ssh)",
                    }
                ),
            ));
        }
    }
}

fn validate_http(
    h: HttpCheck,
    section: &str,
    key: &str,
    machine: bool,
    problems: &mut Vec<Problem>,
) -> Option<Check> {
    let k = format!("{key}.http");
    let before = problems.len();
    match crate::health::placeholders(&h.url) {
        Err(e) => problems.push(problem(section, &k, e)),
        Ok(names) => {
            // A URL that begins with a placeholder is whole only once the
            // output is known; the rest is parsed with each placeholder
            // standing for a plain word.
            if !h.url.starts_with("${") {
                let mut sample = h.url.clone();
                for n in &names {
                    sample = sample.replace(&format!("${{outputs.{n}}}"), "x");
                }
                match reqwest::Url::parse(&sample) {
                    Err(e) => problems.push(problem(
                        section,
                        &k,
                        format!("`{}` is not a URL: {e}", h.url),
                    )),
                    Ok(u) if !matches!(u.scheme(), "http" | "https") => problems.push(problem(
                        section,
                        &k,
                        format!("`{}` is not an http:// or https:// URL", u.scheme()),
                    )),
                    Ok(_) => {}
                }
            }
        }
    }
    if let Some(why) = target::url_credentials(&h.url) {
        problems.push(problem(
            section,
            &k,
            format!(
                "the URL carries {why}, which would show in runs, statuses and notifications: \
                 a health check URL must not hold a secret"
            ),
        ));
    }
    if let Some(s) = h.status
        && !(100..=599).contains(&s)
    {
        problems.push(problem(
            section,
            &format!("{key}.status"),
            format!("{s} is not an HTTP status (100-599)"),
        ));
    }
    if let Some(re) = &h.body_regex
        && let Err(e) = regex_lite::Regex::new(re)
    {
        problems.push(problem(
            section,
            &format!("{key}.body_regex"),
            format!("not a regular expression: {e}"),
        ));
    }
    if let Some(ca) = &h.ca_file
        && machine
        && std::fs::read(ca).is_err()
    {
        problems.push(problem(
            section,
            &format!("{key}.ca_file"),
            format!("{} is not a readable file", ca.display()),
        ));
    }
    (problems.len() == before).then_some(Check::Http(h))
}

fn validate_tcp(
    address: String,
    section: &str,
    k: &str,
    problems: &mut Vec<Problem>,
) -> Option<Check> {
    if let Err(e) = crate::health::placeholders(&address) {
        problems.push(problem(section, k, e));
        return None;
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        problems.push(problem(section, k, format!("`{address}` is not host:port")));
        return None;
    };
    if host.is_empty() {
        problems.push(problem(section, k, format!("`{address}` names no host")));
        return None;
    }
    if !port.starts_with("${") && !matches!(port.parse::<u16>(), Ok(p) if p > 0) {
        problems.push(problem(
            section,
            k,
            format!("`{port}` is not a port (1-65535)"),
        ));
        return None;
    }
    Some(Check::Tcp { address })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems_of(health: &str) -> Vec<Problem> {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            format!(
                "[[targets]]\nname = \"web\"\nrepo = \"https://git.example.net/r.git\"\n{health}\n\
                 [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n"
            ),
        )
        .expect("write");
        super::parse(&file, false, true).expect("read").1
    }

    /// Each bad key is named, with the target; a good table passes.
    #[test]
    fn every_bad_health_key_is_named() {
        let ok = problems_of(
            "[targets.health]\ngrace = \"0s\"\ninterval = \"2s\"\ntimeout = \"1m\"\n\
             on_unhealthy = \"rollback\"\nrecheck = true\n\
             [[targets.health.checks]]\nhttp = \"${outputs.endpoint}/healthz\"\nstatus = 204\nbody_regex = \"^ok\"\n\
             [[targets.health.checks]]\ntcp = \"127.0.0.1:${outputs.port}\"\n\
             [[targets.health.checks]]\ncommand = [\"sh\", \"-c\", \"true\"]\n",
        );
        assert!(ok.is_empty(), "{ok:?}");
        let cases: &[(&str, &str, &str)] = &[
            ("http = \"not a url\"", "health.checks[0].http", "not a URL"),
            (
                "http = \"ftp://h/x\"",
                "health.checks[0].http",
                "not an http",
            ),
            (
                "http = \"https://u:secret@h/x\"",
                "health.checks[0].http",
                "must not hold a secret",
            ),
            (
                "http = \"http://h/${env.X}\"",
                "health.checks[0].http",
                "placeholder",
            ),
            (
                "http = \"http://h/\"\nstatus = 700",
                "health.checks[0].status",
                "100-599",
            ),
            (
                "http = \"http://h/\"\nbody_regex = \"(\"",
                "health.checks[0].body_regex",
                "regular",
            ),
            (
                "tcp = \"127.0.0.1:70000\"",
                "health.checks[0].tcp",
                "not a port",
            ),
            ("tcp = \"localhost\"", "health.checks[0].tcp", "host:port"),
            (
                "command = [\"no-such-program-here\"]",
                "health.checks[0].command",
                "not a program",
            ),
            ("command = []", "health.checks[0].command", "name a program"),
            (
                "tcp = \"h:1\"\nhttp = \"http://h/\"",
                "health.checks[0]",
                "exactly one",
            ),
            (
                "tcp = \"h:1\"\nstatus = 200",
                "health.checks[0].status",
                "http check only",
            ),
            ("tcp = \"h:1\"\nwhat = 1", "health.checks[0].what", ""),
            (
                "services = true",
                "health.checks[0].services",
                "exec backend cannot",
            ),
            (
                "on_host = [\"true\"]",
                "health.checks[0].on_host",
                "exec backend cannot",
            ),
            ("on_host = []", "health.checks[0].on_host", "name a program"),
        ];
        for (check, key, says) in cases {
            let p = problems_of(&format!(
                "[targets.health]\n[[targets.health.checks]]\n{check}\n"
            ));
            assert!(
                p.iter().any(|p| p.section == "targets[web]"
                    && p.key == *key
                    && p.message.contains(says)),
                "{check}: {p:?}"
            );
        }
        let p = problems_of(
            "[targets.health]\non_unhealthy = \"rollback\"\nconfirm_within = \"5m\"\n\
             [[targets.health.checks]]\ntcp = \"h:1\"\n",
        );
        assert!(
            p.len() == 1
                && p[0].key == "health.confirm_within"
                && p[0].message.contains("the exec backend"),
            "{p:?}"
        );
        let p = problems_of("[targets.health]\non_unhealthy = \"revert\"\ninterval = \"20m\"\n");
        let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            ["health.interval", "health.on_unhealthy", "health.checks"],
            "{p:?}"
        );
    }
}
