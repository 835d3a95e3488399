//! Settings: the configuration file, its validation and secret references.
//!
//! The file is TOML read through the `config` crate, with `DRIFTLESS__`
//! environment overrides (`DRIFTLESS__SERVER__WORKERS=8`). Validation collects
//! *every* problem, each naming the key and, where there is one, the target, so
//! `driftless check` can list them all at once. This module never touches the
//! network, git, SQLite or a backend; it only reads the config file and, for
//! `check`, looks at whether referenced files exist.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::backend::BackendConfig;
pub use crate::git::GitAuth;
use crate::paths::resolve;
pub use crate::secret::SecretRef;

/// Where the configuration is read from when neither `--config` nor
/// `DRIFTLESS_CONFIG` says otherwise.
pub const DEFAULT_CONFIG_PATH: &str = "config/driftless.toml";

const DEFAULT_STATE_DIR: &str = "/var/lib/driftless";
const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
const DEFAULT_WORKERS: usize = 4;
const DEFAULT_INTERVAL: Duration = Duration::from_secs(5 * 60);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
const DEFAULT_MAX_BODY: usize = 5 * 1024 * 1024;
const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_MAX_CONNECTIONS: usize = 256;
const DEFAULT_REPEAT_AFTER: Duration = Duration::from_secs(6 * 3600);
// The most each duration key takes: past these, a value is a typo.
const MAX_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
const MAX_REPEAT_AFTER: Duration = Duration::from_secs(30 * 24 * 3600);
const MAX_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5 * 60);
const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);
/// Marks a target without its own `notify` list until defaults are known.
const INHERIT: &str = "\u{0}defaults";

/// One problem found in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `targets[web]`, `server`, … — where the key lives.
    pub section: String,
    /// The key at fault, e.g. `interval` or `backend.binary`.
    pub key: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.section.is_empty() {
            write!(f, "key `{}`: {}", self.key, self.message)
        } else {
            write!(f, "{}: key `{}`: {}", self.section, self.key, self.message)
        }
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("config file {path} has {} problem(s):\n{}", .problems.len(), list(.problems))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The file these settings came from.
    pub source: PathBuf,
    pub state_dir: PathBuf,
    pub server: Server,
    pub targets: Vec<Target>,
    pub receivers: Vec<Receiver>,
    pub tokens: Vec<Token>,
    pub defaults: Defaults,
    pub notifiers: Vec<crate::notify::NotifierConfig>,
}

/// `[defaults]`: what targets that say nothing get.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// Notifiers for targets without a `notify` list.
    pub notify: Vec<String>,
    /// While a target keeps failing with the same message, how often to say
    /// it again (`still_failing`).
    pub repeat_after: Duration,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub listen: SocketAddr,
    pub workers: usize,
    /// Request bodies larger than this are answered 413 unread.
    pub max_body_bytes: usize,
    /// A connection that has not sent its request headers by then is closed.
    pub header_read_timeout: Duration,
    /// A request (other than a reconcile that waits) must finish by then.
    pub request_timeout: Duration,
    /// Connections served at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// The URL people reach driftless at, for links in notifications.
    pub public_url: Option<String>,
    /// Who may see the HTML page at `/`.
    pub page: PageAccess,
    /// Who may scrape `/metrics`: anyone (`Open`, the default) or a token
    /// with a read scope (`Token`).
    pub metrics: PageAccess,
}

/// Who may see the HTML page at `/` (`[server] page`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageAccess {
    /// A token with a `read` scope, given as the password of HTTP Basic
    /// authentication (the browser asks) or as a bearer token; the page shows
    /// only the targets that token may read. The default.
    Token,
    /// Anyone who reaches the listener sees every target.
    Open,
    /// No page: `/` answers 404.
    Off,
}

/// Which forge a receiver speaks for: how it signs and what it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ForgeKind {
    Github,
    Gitea,
    Forgejo,
    Gitlab,
    Generic,
}

/// A webhook endpoint: `POST /hooks/{name}`.
#[derive(Debug, Clone)]
pub struct Receiver {
    pub name: String,
    pub forge: ForgeKind,
    pub secret: SecretRef,
}

/// An API token: its SHA-256 digest (never the token) and what it may do.
#[derive(Debug, Clone)]
pub struct Token {
    pub name: String,
    /// Lowercase hex SHA-256 of the token.
    pub sha256: String,
    /// `reconcile:<glob>`, `pause:<glob>`, `approve:<glob>`, `read` or `read:<glob>`.
    pub scopes: Vec<String>,
}

/// One reconciled target.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    /// A URL (`https://`, `ssh://`, `git://`, `file://`, `user@host:path`) or
    /// an absolute local path (relative ones are resolved at load time).
    pub repo: String,
    pub branch: String,
    /// Subdirectory of the repository the backend works in ("" = root).
    pub path: PathBuf,
    pub interval: Duration,
    pub timeout: Duration,
    pub git: GitAuth,
    pub backend: BackendConfig,
    /// The notifiers told about this target (its own list, or the defaults).
    pub notify: Vec<String>,
    /// The repository's web page, for commit links (derived from `repo` for
    /// https and ssh URLs unless set).
    pub web_url: Option<String>,
}

impl Target {
    /// What git needs of this target.
    pub fn source(&self) -> crate::git::Source<'_> {
        crate::git::Source {
            target: &self.name,
            repo: &self.repo,
            branch: &self.branch,
            path: &self.path,
            auth: &self.git,
        }
    }
}

impl Settings {
    pub fn target(&self, name: &str) -> Option<&Target> {
        self.targets.iter().find(|t| t.name == name)
    }

    pub fn locks_dir(&self) -> PathBuf {
        self.state_dir.join("locks")
    }

    pub fn database_path(&self) -> PathBuf {
        self.state_dir.join("driftless.db")
    }
}

// ---------------------------------------------------------------------------
// Raw shapes, deserialized section by section so one bad target does not hide
// the problems of the others.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTop {
    state_dir: Option<String>,
    server: Option<Value>,
    #[serde(default)]
    targets: Vec<Value>,
    #[serde(default)]
    receivers: Vec<Value>,
    #[serde(default)]
    tokens: Vec<Value>,
    defaults: Option<RawDefaults>,
    #[serde(default)]
    notifiers: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    notify: Option<Vec<String>>,
    repeat_after: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReceiver {
    name: String,
    forge: String,
    secret_file: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    name: String,
    sha256: String,
    scopes: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    workers: Option<i64>,
    max_body_bytes: Option<i64>,
    header_read_timeout: Option<String>,
    request_timeout: Option<String>,
    max_connections: Option<i64>,
    public_url: Option<String>,
    page: Option<String>,
    metrics: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    name: String,
    repo: String,
    branch: Option<String>,
    path: Option<String>,
    interval: Option<String>,
    timeout: Option<String>,
    git: Option<RawGit>,
    notify: Option<Vec<String>>,
    web_url: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGit {
    token_file: Option<String>,
    username: Option<String>,
    identity_file: Option<String>,
    known_hosts_file: Option<String>,
    ca_file: Option<String>,
}

/// Load and validate the configuration at `path`, applying `DRIFTLESS__`
/// environment overrides.
pub fn load(path: &Path) -> Result<Settings, ConfigError> {
    load_with_env(path, true)
}

fn load_with_env(path: &Path, env: bool) -> Result<Settings, ConfigError> {
    settle(path, parse(path, env, false)?)
}

/// Settings only when there was no problem at all.
fn settle(
    path: &Path,
    (settings, problems): (Option<Settings>, Vec<Problem>),
) -> Result<Settings, ConfigError> {
    match settings {
        Some(s) if problems.is_empty() => Ok(s),
        _ => Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        }),
    }
}

/// Read and validate: the settings that could be made sense of (targets,
/// receivers and tokens with problems are left out) and every problem.
fn parse(
    path: &Path,
    env: bool,
    machine: bool,
) -> Result<(Option<Settings>, Vec<Problem>), ConfigError> {
    if !path.is_file() {
        return Err(ConfigError::Read {
            path: path.to_path_buf(),
            message: "no such file (pass --config PATH or set DRIFTLESS_CONFIG)".into(),
        });
    }
    let builder = config::Config::builder().add_source(
        config::File::from(path)
            .format(config::FileFormat::Toml)
            .required(true),
    );
    let base = path
        .canonicalize()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."));
    parse_built(builder, path, &base, env, machine)
}

/// Parse and validate configuration text as if it were the file `path`
/// (named in messages; relative paths resolve against `base`), without
/// environment overrides or touching the file system. What `load` does
/// after reading the file; the config fuzz target drives it.
pub fn from_toml_str(text: &str, path: &Path, base: &Path) -> Result<Settings, ConfigError> {
    let builder = config::Config::builder()
        .add_source(config::File::from_str(text, config::FileFormat::Toml));
    settle(path, parse_built(builder, path, base, false, false)?)
}

fn parse_built(
    builder: config::ConfigBuilder<config::builder::DefaultState>,
    path: &Path,
    base: &Path,
    env: bool,
    machine: bool,
) -> Result<(Option<Settings>, Vec<Problem>), ConfigError> {
    let mut raw: Value = builder
        .build()
        .and_then(|c| c.try_deserialize())
        .map_err(|e| ConfigError::Read {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    let mut problems = Vec::new();
    if env {
        let mut vars: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX))
            .collect();
        vars.sort();
        apply_env(&mut raw, &vars, &mut problems);
    }
    let settings = validate(raw, path, base, machine, &mut problems);
    Ok((settings, problems))
}

const ENV_PREFIX: &str = "DRIFTLESS__";

/// `DRIFTLESS__A__B=value` overrides, applied to the file's table: `__`
/// between levels, keys in any case; a list of tables (`targets`,
/// `receivers`, `tokens`, `notifiers`) is entered by index
/// (`DRIFTLESS__TARGETS__0__INTERVAL`) or by the entry's name
/// (`DRIFTLESS__TARGETS__WEB__INTERVAL`). `true`/`false` and integers are
/// read as such, anything else as a string. A variable that names no
/// entry is a problem naming the variable. (The `config` crate's own
/// environment source makes `targets` a table of `0`, `1`, …, which no
/// longer reads as a list.)
fn apply_env(raw: &mut Value, vars: &[(String, String)], problems: &mut Vec<Problem>) {
    for (name, value) in vars {
        let path: Vec<String> = name[ENV_PREFIX.len()..]
            .split("__")
            .map(str::to_ascii_lowercase)
            .collect();
        if path.iter().any(String::is_empty) {
            problems.push(problem("environment", name, "has an empty level (`____`)"));
            continue;
        }
        let parsed = match value.as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            v => v
                .parse::<i64>()
                .map(Value::from)
                .unwrap_or_else(|_| Value::String(v.to_string())),
        };
        if let Err(why) = set_path(raw, &path, parsed) {
            problems.push(problem("environment", name, why));
        }
    }
}

fn set_path(v: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some((first, rest)) = path.split_first() else {
        *v = value;
        return Ok(());
    };
    match v {
        Value::Object(m) => {
            let next = m
                .entry(first.clone())
                .or_insert_with(|| Value::Object(Default::default()));
            set_path(next, rest, value)
        }
        Value::Array(a) => {
            let len = a.len();
            let found = match first.parse::<usize>() {
                Ok(i) => a.get_mut(i).ok_or(format!(
                    "names entry {i}, but the file has {len} (numbered from 0)"
                ))?,
                Err(_) => a
                    .iter_mut()
                    .find(|e| e.get("name").and_then(Value::as_str) == Some(first.as_str()))
                    .ok_or(format!("names `{first}`, but no entry has that name"))?,
            };
            if rest.is_empty() {
                return Err("would replace a whole entry: name a key inside it".into());
            }
            set_path(found, rest, value)
        }
        _ => Err(format!(
            "goes inside `{first}`'s parent, which is a value, not a table"
        )),
    }
}

/// Like [`load`], then also check what can only be seen on this machine:
/// secret files readable, local repositories present. Returns every problem.
pub fn check(path: &Path) -> Result<Settings, ConfigError> {
    let (settings, mut problems) = parse(path, true, true)?;
    let Some(settings) = settings else {
        return Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        });
    };
    for t in &settings.targets {
        let section = format!("targets[{}]", t.name);
        problems.extend(
            t.backend
                .check_environment()
                .into_iter()
                .map(|(key, msg)| problem(&section, &format!("backend.{key}"), msg)),
        );
    }
    for n in &settings.notifiers {
        for (key, secret) in n.secrets() {
            if let Err(e) = secret.load() {
                problems.push(problem(
                    &format!("notifiers[{}]", n.name),
                    key,
                    e.to_string(),
                ));
            }
        }
    }
    for r in &settings.receivers {
        if let Err(e) = r.secret.load() {
            problems.push(problem(
                &format!("receivers[{}]", r.name),
                "secret_file",
                e.to_string(),
            ));
        }
    }
    if problems.is_empty() {
        Ok(settings)
    } else {
        Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        })
    }
}

fn problem(section: &str, key: &str, message: impl Into<String>) -> Problem {
    Problem {
        section: section.to_string(),
        key: key.to_string(),
        message: message.into(),
    }
}

/// serde's "unknown field `x`, expected one of …" names the key; pull it out
/// so the problem's `key` is right.
fn serde_problem(section: &str, prefix: &str, err: &serde_json::Error) -> Problem {
    let msg = err.to_string();
    let key = msg
        .split('`')
        .nth(1)
        .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"))
        .map(|k| format!("{prefix}{k}"))
        .unwrap_or_else(|| prefix.trim_end_matches('.').to_string());
    let key = if key.is_empty() {
        "(table)".into()
    } else {
        key
    };
    // serde_json appends " at line 0 column 0" to errors from `from_value`.
    let msg = msg
        .split(" at line ")
        .next()
        .unwrap_or(msg.as_str())
        .to_string();
    problem(section, &key, msg)
}

fn validate(
    raw: Value,
    path: &Path,
    base: &Path,
    machine: bool,
    problems: &mut Vec<Problem>,
) -> Option<Settings> {
    let top: RawTop = match serde_json::from_value(raw) {
        Ok(t) => t,
        Err(e) => {
            problems.push(serde_problem("", "", &e));
            return None;
        }
    };
    let state_dir = match top.state_dir.as_deref() {
        Some("") => {
            problems.push(problem("", "state_dir", "must not be empty"));
            PathBuf::new()
        }
        Some(s) => resolve(base, s),
        None => PathBuf::from(DEFAULT_STATE_DIR),
    };
    let server = validate_server(top.server, problems);

    let mut targets = Vec::new();
    let mut seen = HashSet::new();
    for (i, raw) in top.targets.into_iter().enumerate() {
        let name = raw.get("name").and_then(Value::as_str).map(str::to_string);
        let label = name
            .as_ref()
            .map(|n| format!("targets[{n}]"))
            .unwrap_or_else(|| format!("targets[{i}]"));
        if let Some(n) = &name
            && !seen.insert(n.clone())
        {
            problems.push(problem(
                &label,
                "name",
                format!("duplicate target name `{n}`"),
            ));
        }
        if let Some(t) = validate_target(raw, &label, base, machine, problems) {
            targets.push(t);
        }
    }
    let receivers = validate_receivers(top.receivers, base, problems);
    let tokens = validate_tokens(top.tokens, problems);
    let notifiers = validate_notifiers(top.notifiers, base, problems);
    let raw_defaults = top.defaults.unwrap_or(RawDefaults {
        notify: None,
        repeat_after: None,
    });
    let defaults = Defaults {
        notify: raw_defaults.notify.unwrap_or_default(),
        repeat_after: duration(
            "defaults",
            "repeat_after",
            raw_defaults.repeat_after.as_deref(),
            DEFAULT_REPEAT_AFTER,
            MAX_REPEAT_AFTER,
            problems,
        ),
    };
    let known = |n: &String| {
        notifiers
            .iter()
            .any(|x: &crate::notify::NotifierConfig| &x.name == n)
    };
    for n in &defaults.notify {
        if !known(n) {
            problems.push(problem(
                "defaults",
                "notify",
                format!("no notifier named `{n}`"),
            ));
        }
    }
    for t in &mut targets {
        // A target without a `notify` list gets the defaults; an explicit
        // empty list means no notifications for it.
        if t.notify == [INHERIT.to_string()] {
            t.notify = defaults.notify.clone();
            continue;
        }
        for n in &t.notify {
            if !known(n) {
                problems.push(problem(
                    &format!("targets[{}]", t.name),
                    "notify",
                    format!("no notifier named `{n}`"),
                ));
            }
        }
    }
    Some(Settings {
        source: path.to_path_buf(),
        state_dir,
        server,
        targets,
        receivers,
        tokens,
        defaults,
        notifiers,
    })
}

fn validate_server(raw: Option<Value>, problems: &mut Vec<Problem>) -> Server {
    let mut server = Server {
        listen: DEFAULT_LISTEN
            .parse()
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080))),
        workers: DEFAULT_WORKERS,
        max_body_bytes: DEFAULT_MAX_BODY,
        header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        request_timeout: DEFAULT_REQUEST_TIMEOUT,
        max_connections: DEFAULT_MAX_CONNECTIONS,
        public_url: None,
        page: PageAccess::Token,
        metrics: PageAccess::Open,
    };
    let Some(raw) = raw else { return server };
    let raw: RawServer = match serde_json::from_value(raw) {
        Ok(r) => r,
        Err(e) => {
            problems.push(serde_problem("server", "", &e));
            return server;
        }
    };
    if let Some(listen) = raw.listen {
        match listen.parse() {
            Ok(a) => server.listen = a,
            Err(_) => problems.push(problem(
                "server",
                "listen",
                format!("`{listen}` is not an address:port such as 127.0.0.1:8080"),
            )),
        }
    }
    if let Some(w) = within("workers", raw.workers, 1..=64, problems) {
        server.workers = w as usize;
    }
    if let Some(b) = within(
        "max_body_bytes",
        raw.max_body_bytes,
        1024..=1 << 30,
        problems,
    ) {
        server.max_body_bytes = b as usize;
    }
    if let Some(c) = within(
        "max_connections",
        raw.max_connections,
        1..=100_000,
        problems,
    ) {
        server.max_connections = c as usize;
    }
    if let Some(u) = raw.public_url {
        let u = u.trim().trim_end_matches('/').to_string();
        if u.starts_with("http://") || u.starts_with("https://") {
            server.public_url = Some(u);
        } else {
            problems.push(problem(
                "server",
                "public_url",
                format!("`{u}` must be an http:// or https:// URL"),
            ));
        }
    }
    use PageAccess::{Off, Open, Token};
    if let Some(m) = one_of(
        "metrics",
        raw.metrics,
        &[("open", Open), ("token", Token)],
        problems,
    ) {
        server.metrics = m;
    }
    let pages = [("token", Token), ("open", Open), ("off", Off)];
    if let Some(p) = one_of("page", raw.page, &pages, problems) {
        server.page = p;
    }
    server.header_read_timeout = duration(
        "server",
        "header_read_timeout",
        raw.header_read_timeout.as_deref(),
        DEFAULT_HEADER_READ_TIMEOUT,
        MAX_HEADER_READ_TIMEOUT,
        problems,
    );
    server.request_timeout = duration(
        "server",
        "request_timeout",
        raw.request_timeout.as_deref(),
        DEFAULT_REQUEST_TIMEOUT,
        MAX_REQUEST_TIMEOUT,
        problems,
    );
    server
}

/// `[server] key`'s number, if it is given and within `range`.
fn within(
    key: &str,
    value: Option<i64>,
    range: std::ops::RangeInclusive<i64>,
    problems: &mut Vec<Problem>,
) -> Option<i64> {
    let v = value?;
    if range.contains(&v) {
        return Some(v);
    }
    problems.push(problem(
        "server",
        key,
        format!("{v} is not between {} and {}", range.start(), range.end()),
    ));
    None
}

/// `[server] key`'s word, if it is given and one of `choices`.
fn one_of<T: Copy>(
    key: &str,
    value: Option<String>,
    choices: &[(&str, T)],
    problems: &mut Vec<Problem>,
) -> Option<T> {
    let v = value?;
    if let Some((_, t)) = choices.iter().find(|(name, _)| *name == v) {
        return Some(*t);
    }
    let names: Vec<String> = choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
    problems.push(problem(
        "server",
        key,
        format!("`{v}` is not one of {}", names.join(", ")),
    ));
    None
}

fn validate_receivers(raw: Vec<Value>, base: &Path, problems: &mut Vec<Problem>) -> Vec<Receiver> {
    let mut out: Vec<Receiver> = Vec::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let label = raw
            .get("name")
            .and_then(Value::as_str)
            .map(|n| format!("receivers[{n}]"))
            .unwrap_or_else(|| format!("receivers[{i}]"));
        let r: RawReceiver = match serde_json::from_value(raw) {
            Ok(r) => r,
            Err(e) => {
                problems.push(serde_problem(&label, "", &e));
                continue;
            }
        };
        if !valid_name(&r.name) {
            problems.push(problem(
                &label,
                "name",
                format!(
                    "`{}` is not a safe receiver name (a-z, 0-9, '_', '.', '-')",
                    r.name
                ),
            ));
            continue;
        }
        if out.iter().any(|o| o.name == r.name) {
            problems.push(problem(
                &label,
                "name",
                format!("duplicate receiver name `{}`", r.name),
            ));
            continue;
        }
        let forge = match r.forge.as_str() {
            "github" => ForgeKind::Github,
            "gitea" => ForgeKind::Gitea,
            "forgejo" => ForgeKind::Forgejo,
            "gitlab" => ForgeKind::Gitlab,
            "generic" => ForgeKind::Generic,
            other => {
                problems.push(problem(
                    &label,
                    "forge",
                    format!(
                        "unknown forge `{other}`: use github, gitea, forgejo, gitlab or generic"
                    ),
                ));
                continue;
            }
        };
        let Some(secret) = r.secret_file.filter(|s| !s.trim().is_empty()) else {
            problems.push(problem(
                &label,
                "secret_file",
                "a receiver needs a secret (a file path or \"env:NAME\"): unsigned deliveries are never accepted",
            ));
            continue;
        };
        out.push(Receiver {
            name: r.name,
            forge,
            secret: SecretRef::parse(&secret, base),
        });
    }
    out
}

/// A scope is `reconcile:<glob>`, `pause:<glob>`, `approve:<glob>`, `read` or
/// `read:<glob>`.
pub fn valid_scope(s: &str) -> bool {
    match s.split_once(':') {
        None => s == "read",
        Some((verb, glob)) => {
            matches!(verb, "reconcile" | "pause" | "approve" | "read")
                && !glob.is_empty()
                && glob
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_.-*?".contains(&c))
        }
    }
}

fn validate_tokens(raw: Vec<Value>, problems: &mut Vec<Problem>) -> Vec<Token> {
    let mut out: Vec<Token> = Vec::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let label = raw
            .get("name")
            .and_then(Value::as_str)
            .map(|n| format!("tokens[{n}]"))
            .unwrap_or_else(|| format!("tokens[{i}]"));
        let t: RawToken = match serde_json::from_value(raw) {
            Ok(t) => t,
            Err(e) => {
                problems.push(serde_problem(&label, "", &e));
                continue;
            }
        };
        let before = problems.len();
        let digest = t.sha256.trim().to_ascii_lowercase();
        if digest.len() != 64 || !digest.bytes().all(|c| c.is_ascii_hexdigit()) {
            problems.push(problem(
                &label,
                "sha256",
                "must be the 64-character hex SHA-256 of the token, as printed by `driftless token new`",
            ));
        }
        if t.scopes.is_empty() {
            problems.push(problem(&label, "scopes", "must list at least one scope"));
        }
        for sc in &t.scopes {
            if !valid_scope(sc) {
                problems.push(problem(
                    &label,
                    "scopes",
                    format!("`{sc}` is not a scope: use reconcile:<target glob>, pause:<target glob>, approve:<target glob>, read or read:<target glob>"),
                ));
            }
        }
        if out.iter().any(|o| o.name == t.name) {
            problems.push(problem(
                &label,
                "name",
                format!("duplicate token name `{}`", t.name),
            ));
        }
        if out.iter().any(|o| o.sha256 == digest) {
            problems.push(problem(
                &label,
                "sha256",
                "the same digest is used by another token",
            ));
        }
        if problems.len() == before {
            out.push(Token {
                name: t.name,
                sha256: digest,
                scopes: t.scopes,
            });
        }
    }
    out
}

fn validate_target(
    mut raw: Value,
    label: &str,
    base: &Path,
    machine: bool,
    problems: &mut Vec<Problem>,
) -> Option<Target> {
    // The backend table is checked on its own so its problems name `backend.*`.
    let backend_raw = raw.as_object_mut().and_then(|o| o.remove("backend"));
    let backend = match backend_raw {
        None => {
            problems.push(problem(label, "backend", "missing table [targets.backend]"));
            None
        }
        Some(b) => match BackendConfig::from_value(b, base) {
            Ok(b) => Some(b),
            Err(errs) => {
                for (key, msg) in errs {
                    problems.push(problem(label, &format!("backend.{key}"), msg));
                }
                None
            }
        },
    };
    let raw: RawTarget = match serde_json::from_value(raw) {
        Ok(r) => r,
        Err(e) => {
            problems.push(serde_problem(label, "", &e));
            return None;
        }
    };
    if !valid_name(&raw.name) {
        problems.push(problem(
            label,
            "name",
            format!(
                "`{}` is not a safe target name: use 1-63 characters from a-z, 0-9, '_', '.', '-', starting with a letter or digit",
                raw.name
            ),
        ));
    }
    let repo = raw.repo.trim().to_string();
    let repo = if repo.is_empty() {
        problems.push(problem(label, "repo", "must not be empty"));
        repo
    } else if is_url(&repo) {
        if let Some(why) = url_credentials(&repo) {
            // Never echo the URL: it holds the secret.
            problems.push(problem(
                label,
                "repo",
                format!(
                    "the repository URL carries {why}, which would show in status, logs and the page: \
                     remove it and put the token in a file named by [targets.git] token_file \
                     (and the user, if any, in [targets.git] username)"
                ),
            ));
        }
        repo
    } else {
        resolve(base, &repo).to_string_lossy().into_owned()
    };
    let branch = raw.branch.unwrap_or_else(|| "main".into());
    if !valid_branch(&branch) {
        problems.push(problem(
            label,
            "branch",
            format!("`{branch}` is not a valid branch name"),
        ));
    }
    let path = raw.path.unwrap_or_default();
    if Path::new(&path).is_absolute()
        || Path::new(&path)
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        problems.push(problem(
            label,
            "path",
            format!("`{path}` must be a subdirectory of the repository (relative, no `..`)"),
        ));
    }
    // Normalised once, here: `./sub//dir/` is `sub/dir`, `.` the root. Git
    // (routing, checkouts) and every message see only this spelling.
    let rel: PathBuf = Path::new(&path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let interval = duration(
        label,
        "interval",
        raw.interval.as_deref(),
        DEFAULT_INTERVAL,
        MAX_INTERVAL,
        problems,
    );
    let timeout = duration(
        label,
        "timeout",
        raw.timeout.as_deref(),
        DEFAULT_TIMEOUT,
        MAX_TIMEOUT,
        problems,
    );
    let git = match raw.git {
        None => GitAuth::default(),
        Some(g) => {
            let empty = |key: &str, v: &Option<String>, problems: &mut Vec<Problem>| {
                if v.as_deref() == Some("") {
                    problems.push(problem(label, key, "must not be empty"));
                }
            };
            empty("git.token_file", &g.token_file, problems);
            empty("git.identity_file", &g.identity_file, problems);
            empty("git.known_hosts_file", &g.known_hosts_file, problems);
            empty("git.ca_file", &g.ca_file, problems);
            if g.token_file.is_some() && g.identity_file.is_some() {
                problems.push(problem(
                    label,
                    "git.token_file",
                    "set either token_file (https) or identity_file (ssh), not both",
                ));
            }
            if g.known_hosts_file.is_some() && g.identity_file.is_none() {
                problems.push(problem(
                    label,
                    "git.known_hosts_file",
                    "only used with identity_file (ssh)",
                ));
            }
            GitAuth {
                token: g.token_file.as_deref().map(|s| SecretRef::parse(s, base)),
                username: g.username,
                identity_file: g.identity_file.as_deref().map(|s| resolve(base, s)),
                known_hosts_file: g.known_hosts_file.as_deref().map(|s| resolve(base, s)),
                ca_file: g.ca_file.as_deref().map(|s| resolve(base, s)),
            }
        }
    };
    let web_url = match raw.web_url {
        Some(u) if u.starts_with("http://") || u.starts_with("https://") => {
            Some(u.trim_end_matches('/').to_string())
        }
        Some(u) => {
            problems.push(problem(
                label,
                "web_url",
                format!("`{u}` must be an http:// or https:// URL"),
            ));
            None
        }
        None => derive_web_url(&repo),
    };
    // What only this machine can tell, for `check`: looked at whatever else
    // is wrong with the target.
    if machine {
        if let Some(token) = &git.token
            && let Err(e) = token.load()
        {
            problems.push(problem(label, "git.token_file", e.to_string()));
        }
        for (key, file) in [
            ("git.identity_file", &git.identity_file),
            ("git.known_hosts_file", &git.known_hosts_file),
            ("git.ca_file", &git.ca_file),
        ] {
            if let Some(f) = file
                && !f.is_file()
            {
                problems.push(problem(
                    label,
                    key,
                    format!("{} is not a readable file", f.display()),
                ));
            }
        }
        let local = repo.strip_prefix("file://").unwrap_or(&repo).to_string();
        if Path::new(&local).is_absolute() {
            let p = Path::new(&local);
            if !p.exists() {
                problems.push(problem(
                    label,
                    "repo",
                    format!("local repository {local} does not exist"),
                ));
            } else {
                let bare = p.join("HEAD").is_file() && p.join("objects").is_dir();
                if !bare && !p.join(".git").exists() {
                    problems.push(problem(
                        label,
                        "repo",
                        format!("{local} is not a git repository (no HEAD and objects, no .git)"),
                    ));
                }
            }
        }
    }
    // With problems, the target is still returned, for `check` to look at
    // what it can (its files, its binary); `load` refuses the whole file.
    let backend = backend?;
    Some(Target {
        name: raw.name,
        repo,
        branch,
        path: rel,
        interval,
        timeout,
        git,
        backend,
        notify: raw.notify.unwrap_or_else(|| vec![INHERIT.to_string()]),
        web_url,
    })
}

/// `https://host/o/r.git` and `git@host:o/r.git` → `https://host/o/r`.
fn derive_web_url(repo: &str) -> Option<String> {
    let (host, path) = if let Some(rest) = repo.strip_prefix("https://") {
        let (authority, path) = rest.split_once('/')?;
        (authority.rsplit('@').next()?.to_string(), path.to_string())
    } else if let Some(rest) = repo.strip_prefix("ssh://") {
        let (authority, path) = rest.split_once('/')?;
        let host = authority.rsplit('@').next()?;
        (host.split(':').next()?.to_string(), path.to_string())
    } else if !repo.contains("://") && repo.contains('@') && repo.contains(':') {
        let (authority, path) = repo.split_once(':')?;
        (authority.rsplit('@').next()?.to_string(), path.to_string())
    } else {
        return None;
    };
    let path = path.trim_end_matches('/');
    let path = path.strip_suffix(".git").unwrap_or(path);
    (!host.is_empty() && !path.is_empty()).then(|| format!("https://{host}/{path}"))
}

fn validate_notifiers(
    raw: Vec<Value>,
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Vec<crate::notify::NotifierConfig> {
    let mut out: Vec<crate::notify::NotifierConfig> = Vec::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let label = raw
            .get("name")
            .and_then(Value::as_str)
            .map(|n| format!("notifiers[{n}]"))
            .unwrap_or_else(|| format!("notifiers[{i}]"));
        match crate::notify::NotifierConfig::from_value(raw, base) {
            Ok(n) => {
                if !valid_name(&n.name) {
                    problems.push(problem(
                        &label,
                        "name",
                        format!("`{}` is not a safe notifier name", n.name),
                    ));
                } else if out.iter().any(|o| o.name == n.name) {
                    problems.push(problem(
                        &label,
                        "name",
                        format!("duplicate notifier name `{}`", n.name),
                    ));
                } else {
                    out.push(n);
                }
            }
            Err(errs) => {
                for (key, msg) in errs {
                    problems.push(problem(&label, &key, msg));
                }
            }
        }
    }
    out
}

fn duration(
    label: &str,
    key: &str,
    raw: Option<&str>,
    default: Duration,
    max: Duration,
    problems: &mut Vec<Problem>,
) -> Duration {
    let Some(raw) = raw else { return default };
    if let Some(unit) = calendar_unit(raw) {
        problems.push(problem(
            label,
            key,
            format!(
                "`{raw}` counts in {unit}, which nobody means here (`M` is months, `m` minutes; `y` years): \
                 write it in s, m, h or d, such as \"5m\" or \"2h\""
            ),
        ));
        return default;
    }
    match humantime::parse_duration(raw.trim()) {
        Ok(d) if d < Duration::from_secs(1) => {
            problems.push(problem(
                label,
                key,
                format!("`{raw}` is shorter than one second"),
            ));
            default
        }
        Ok(d) if d > max => {
            problems.push(problem(
                label,
                key,
                format!(
                    "`{raw}` is longer than the most this key takes ({})",
                    humantime::format_duration(max)
                ),
            ));
            default
        }
        Ok(d) => d,
        Err(e) => {
            problems.push(problem(
                label,
                key,
                format!("`{raw}` is not a duration such as \"90s\", \"5m\" or \"1h30m\" ({e})"),
            ));
            default
        }
    }
}

/// A month or year unit in a duration (humantime reads `5M` as five
/// months and `1y` as a year).
fn calendar_unit(raw: &str) -> Option<&'static str> {
    let mut unit = String::new();
    let mut units = Vec::new();
    for c in raw.trim().chars().chain(std::iter::once(' ')) {
        if c.is_alphabetic() {
            unit.push(c);
        } else if !unit.is_empty() {
            units.push(std::mem::take(&mut unit));
        }
    }
    units.iter().find_map(|u| match u.as_str() {
        "M" | "month" | "months" | "mo" => Some("months"),
        "y" | "year" | "years" => Some("years"),
        _ => None,
    })
}

/// Target names end up in file names, URLs and SQL rows: keep them boring.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase() | b[0].is_ascii_digit()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_.-".contains(c))
        && !name.contains("..")
}

fn valid_branch(b: &str) -> bool {
    !b.is_empty()
        && !b.starts_with('-')
        && !b.starts_with('/')
        && !b.ends_with('/')
        && !b.ends_with(".lock")
        && !b.contains("..")
        && !b.contains("@{")
        && !b
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c))
}

/// What credentials a repository URL carries, if any: any user information
/// over http(s) and other schemes (`https://TOKEN@host` is GitHub's
/// token-clone form), a password over ssh (a bare `git@` user is not a
/// secret).
fn url_credentials(url: &str) -> Option<&'static str> {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (s.to_ascii_lowercase(), r),
        None => ("scp".to_string(), url),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let authority = if scheme == "scp" {
        authority
            .split_once(':')
            .map(|(a, _)| a)
            .unwrap_or(authority)
    } else {
        authority
    };
    let (userinfo, _) = authority.rsplit_once('@')?;
    if userinfo.contains(':') {
        return Some("a user name and password");
    }
    let ssh = matches!(scheme.as_str(), "ssh" | "git+ssh" | "ssh+git" | "scp");
    (!ssh).then_some("user information (a token, as in https://TOKEN@host)")
}

fn is_url(s: &str) -> bool {
    s.contains("://") || (s.contains('@') && s.contains(':') && !s.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_str(s: &str) -> Result<Settings, ConfigError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.toml");
        std::fs::write(&p, s).expect("write");
        load_with_env(&p, false)
    }

    fn problems(s: &str) -> Vec<Problem> {
        match load_str(s) {
            Err(ConfigError::Invalid { problems, .. }) => problems,
            other => panic!("expected problems, got {other:?}"),
        }
    }

    #[test]
    fn names() {
        for ok in ["web", "a", "prod-network", "x_1.2"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "Web", "-x", "a/b", "a..b", "a b", &"a".repeat(64), "é"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn defaults_apply() {
        let s = load_str(
            r#"
            state_dir = "st"
            [[targets]]
            name = "one"
            repo = "https://example.net/r.git"
            [targets.backend]
            kind = "exec"
            apply = ["true"]
            "#,
        )
        .expect("valid");
        let t = &s.targets[0];
        assert_eq!(t.branch, "main");
        assert_eq!(t.interval, Duration::from_secs(300));
        assert_eq!(t.timeout, Duration::from_secs(1800));
        assert_eq!(s.server.workers, 4);
        assert!(s.state_dir.is_absolute());
    }

    #[test]
    fn every_problem_is_listed_with_key_and_target() {
        let p = problems(
            r#"
            [server]
            workers = 0
            [[targets]]
            name = "web"
            repo = "https://example.net/r.git"
            interval = "5 parsecs"
            intervall = "5m"
            [targets.backend]
            kind = "exec"
            apply = ["true"]
            [[targets]]
            name = "web"
            repo = "https://example.net/r.git"
            path = "../etc"
            [targets.backend]
            kind = "terraform"
            binaryy = "tofu"
            [[targets]]
            name = "Bad Name"
            repo = "x"
            [targets.backend]
            kind = "exec"
            apply = ["true"]
            "#,
        );
        let text: Vec<String> = p.iter().map(ToString::to_string).collect();
        let has = |section: &str, key: &str| p.iter().any(|q| q.section == section && q.key == key);
        assert!(has("server", "workers"), "{text:#?}");
        assert!(has("targets[web]", "intervall"), "{text:#?}");
        assert!(has("targets[web]", "backend.binaryy"), "{text:#?}");
        assert!(has("targets[Bad Name]", "name"), "{text:#?}");
        // the first `web` has both a bad key and a bad duration: the unknown
        // key stops that section, the second `web` reports its path.
        assert!(has("targets[web]", "path"), "{text:#?}");
    }

    #[test]
    fn bad_duration_and_duplicate_names() {
        let p = problems(
            r#"
            [[targets]]
            name = "a"
            repo = "https://example.net/r.git"
            interval = "soon"
            [targets.backend]
            kind = "exec"
            apply = ["true"]
            [[targets]]
            name = "b"
            repo = "https://example.net/r.git"
            [targets.backend]
            kind = "exec"
            apply = ["true"]
            [[targets]]
            name = "b"
            repo = "https://example.net/r.git"
            [targets.backend]
            kind = "exec"
            apply = ["true"]
            "#,
        );
        assert!(
            p.iter().any(|q| q.section == "targets[a]"
                && q.key == "interval"
                && q.message.contains("soon")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|q| q.section == "targets[b]"
                && q.key == "name"
                && q.message.contains("duplicate")),
            "{p:?}"
        );
    }

    #[test]
    fn unknown_backend_kind() {
        let p = problems(
            r#"
            [[targets]]
            name = "a"
            repo = "https://example.net/r.git"
            [targets.backend]
            kind = "terraforn"
            "#,
        );
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].key, "backend.kind");
        assert!(p[0].message.contains("terraforn"), "{p:?}");
    }

    #[test]
    fn credentials_in_repository_urls_are_found() {
        for url in [
            "https://ghp_abc123@github.com/o/r.git",
            "https://bob:s3cret@git.example.net/o/r",
            "http://token@10.0.0.1:3000/o/r",
            "ssh://git:pw@host/o/r",
        ] {
            assert!(url_credentials(url).is_some(), "{url}");
        }
        for url in [
            "https://github.com/o/r.git",
            "ssh://git@host:2222/o/r",
            "git@github.com:o/r.git",
            "git://host/o/r",
            "https://host/o/r@v1",
        ] {
            assert_eq!(url_credentials(url), None, "{url}");
        }
        let p = problems(
            "[[targets]]\nname = \"t\"\nrepo = \"https://ghp_canary7@github.com/o/r.git\"\n[targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n",
        );
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].key, "repo");
        assert!(p[0].message.contains("token_file"), "{}", p[0].message);
        assert!(!p[0].to_string().contains("ghp_canary7"));
    }

    #[test]
    fn durations_nobody_means_are_refused() {
        let toml = |interval: &str, timeout: &str| {
            format!(
                "[[targets]]\nname = \"t\"\nrepo = \"https://h/o/r\"\ninterval = \"{interval}\"\ntimeout = \"{timeout}\"\n[targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n"
            )
        };
        let target = |i: &str, t: &str| problems(&toml(i, t));
        assert!(load_str(&toml("5m", "30m")).is_ok());
        assert!(load_str(&toml("1h 30m", "1d")).is_ok());
        let p = target("5M", "1y");
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].key == "interval" && p[0].message.contains("months"),
            "{p:?}"
        );
        assert!(
            p[1].key == "timeout" && p[1].message.contains("years"),
            "{p:?}"
        );
        let p = target("8d", "25h");
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].message
                .contains("longer than the most this key takes (7days)"),
            "{p:?}"
        );
        assert!(p[1].message.contains("(1day)"), "{p:?}");
    }

    #[test]
    fn environment_overrides_reach_list_entries_by_index_or_name() {
        let toml = "[[targets]]\nname = \"web\"\nrepo = \"https://h/o/r\"\n[targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n\
                    [[targets]]\nname = \"db\"\nrepo = \"https://h/o/r\"\n[targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n";
        let mut raw: Value = serde_json::to_value(
            config::Config::builder()
                .add_source(config::File::from_str(toml, config::FileFormat::Toml))
                .build()
                .expect("build")
                .try_deserialize::<Value>()
                .expect("value"),
        )
        .expect("json");
        let mut p = Vec::new();
        let vars = [
            ("DRIFTLESS__TARGETS__0__INTERVAL", "10m"),
            ("DRIFTLESS__TARGETS__DB__BRANCH", "prod"),
            ("DRIFTLESS__SERVER__WORKERS", "3"),
            ("DRIFTLESS__TARGETS__7__INTERVAL", "1m"),
            ("DRIFTLESS__TARGETS__NOPE__INTERVAL", "1m"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        apply_env(&mut raw, &vars, &mut p);
        assert_eq!(raw["targets"][0]["interval"], "10m");
        assert_eq!(raw["targets"][1]["branch"], "prod");
        assert_eq!(raw["server"]["workers"], 3);
        let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "DRIFTLESS__TARGETS__7__INTERVAL",
                "DRIFTLESS__TARGETS__NOPE__INTERVAL"
            ],
            "{p:?}"
        );
        assert!(p[0].message.contains("the file has 2"), "{p:?}");
    }
}
