//! Settings: the configuration file and its validation into one list of
//! problems. This file holds the settings' types, loading (TOML through the
//! `config` crate, `DRIFTLESS__` overrides) and the top-level validation;
//! `server` validates `[server]`, receivers and tokens, `target` one
//! `[[targets]]` table, `checks` the checks they share.
//!
//! The file is TOML read through the `config` crate, with `DRIFTLESS__`
//! environment overrides (`DRIFTLESS__SERVER__WORKERS=8`). Validation collects
//! *every* problem, each naming the key and, where there is one, the target, so
//! `driftless check` can list them all at once. This module never touches the
//! network, git, SQLite or a backend; it only reads the config file and, for
//! `check`, looks at whether referenced files exist.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::backend::BackendConfig;
pub use crate::git::{GitAuth, Verification};
use crate::paths::resolve;
pub use crate::secret::SecretRef;

mod checks;
pub mod database;
mod decrypt;
pub mod graph;
mod health;
mod policies;
mod repo_url;
mod rollouts;
mod server;
mod sets;
mod target;
mod top;
mod verify;
mod windows;

pub use checks::valid_name;
use checks::{duration, problem, read_table};
pub use policies::PolicyConfig;
pub use repo_url::normalize_repo;
pub use server::valid_scope;
use server::{validate_receivers, validate_server, validate_tokens};
pub use sets::{Expansion, Found, TargetSet, literal_part};
#[cfg(test)]
use target::url_credentials;
use target::validate_target;
use top::RawTop;
pub use top::json_schema;

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
/// How long runs are kept by default (`[history] keep`).
const DEFAULT_HISTORY_KEEP: Duration = Duration::from_secs(90 * 24 * 3600);
/// The longest `[history] keep` (ten years).
const MAX_HISTORY_KEEP: Duration = Duration::from_secs(3650 * 24 * 3600);
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
    /// `[[forges]]`: where commit statuses go.
    pub forges: Vec<crate::notify::forge::ForgeConfig>,
    /// `[history]`: how long runs are kept.
    pub history: History,
    /// `[database]`: a PostgreSQL database instead of SQLite in
    /// `state_dir`.
    pub database: Option<database::Database>,
    /// `[[target_sets]]`: targets made from directories. Their members, as
    /// far as they are known, are in `targets` (each with its `set`).
    pub target_sets: Vec<TargetSet>,
    /// `[[groups]]`: `[[targets]]` entries rolled out in waves together.
    pub groups: Vec<Group>,
    /// `[[policies]]`: Rego files every plan of the targets they cover is
    /// evaluated against.
    pub policies: Vec<PolicyConfig>,
    /// `targets` by name, made at the first lookup (`Settings::target`):
    /// a tick looks up its target, its dependents and who takes its
    /// outputs, and scanning 10,000 targets for them was a twentieth of a
    /// no-op tick's CPU.
    index: TargetIndex,
}

/// Where each of `Settings::targets` is, by name, and who depends on or
/// takes inputs from whom. Made once, when first asked; a copy of the
/// settings starts without one (its targets may be changed). Used only
/// while `targets` is the list it was made of (the same allocation and
/// length), and a target found by name is checked to bear it; otherwise
/// the answer comes from a scan.
#[derive(Debug, Default)]
struct TargetIndex(std::sync::OnceLock<Index>);

impl Clone for TargetIndex {
    fn clone(&self) -> Self {
        TargetIndex::default()
    }
}

#[derive(Debug)]
struct Index {
    /// The list it was made of: where it was, how many targets it held.
    ptr: usize,
    len: usize,
    at: HashMap<String, usize>,
    /// Targets that depend on each target (`depends_on`), by position.
    dependents: HashMap<String, Vec<usize>>,
    /// Targets whose outputs another target takes as inputs.
    consumed: HashSet<String>,
}

impl TargetIndex {
    /// The index of `targets`, if it is still the list it was made of.
    fn of<'a>(&'a self, targets: &[Target]) -> Option<&'a Index> {
        let index = self.0.get_or_init(|| {
            let mut index = Index {
                ptr: targets.as_ptr() as usize,
                len: targets.len(),
                at: HashMap::new(),
                dependents: HashMap::new(),
                consumed: HashSet::new(),
            };
            for (i, t) in targets.iter().enumerate() {
                index.at.insert(t.name.clone(), i);
                for d in &t.depends_on {
                    index.dependents.entry(d.clone()).or_default().push(i);
                }
                index
                    .consumed
                    .extend(t.inputs.iter().map(|input| input.target.clone()));
            }
            index
        });
        (index.ptr == targets.as_ptr() as usize && index.len == targets.len()).then_some(index)
    }
}

/// `[history]`: what the run history keeps. Every run that changed or
/// failed is a row of its own and a streak of identical `no_change` runs
/// is one row (with its count), either way kept for `keep`; each target's
/// last run and the run that last changed it are kept whatever their age.
#[derive(Debug, Clone)]
pub struct History {
    pub keep: Duration,
}

/// `[defaults]`: what targets that say nothing get.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// Notifiers for targets without a `notify` list.
    pub notify: Vec<String>,
    /// While a target keeps failing with the same message, how often to say
    /// it again (`still_failing`).
    pub repeat_after: Duration,
    /// The forge commit statuses go to for targets that name none.
    pub forge: Option<String>,
    /// `[defaults.verify]`: for targets without their own `verify`.
    pub verify: Option<Verification>,
    /// `[defaults.health]`: for targets without their own.
    pub health: Option<crate::health::Health>,
    /// `[defaults] windows`: for targets without their own.
    pub windows: crate::window::Windows,
}

pub use rollouts::Group;

/// What a rollout in waves covers: a `[[target_sets]]` entry's members or
/// a `[[groups]]` entry's targets, as the settings know them now.
#[derive(Debug, Clone)]
pub struct RolloutUnit<'a> {
    pub name: &'a str,
    pub rollout: &'a crate::rollout::Rollout,
    /// In configuration order (a set's members as listed now).
    pub members: Vec<&'a Target>,
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
    /// `repo` normalised ([`normalize_repo`]): what the repository URLs of
    /// a push or pull request are compared with.
    pub repo_key: String,
    pub branch: String,
    /// `tag = "v*"`: the target follows the highest version tag matching
    /// this pattern instead of `branch`.
    pub tag: Option<String>,
    /// Subdirectory of the repository the backend works in ("" = root).
    pub path: PathBuf,
    /// `checkout = "sparse"`: the directories its checkout holds (`path`,
    /// then `extra_paths`), as git's sparse checkout in cone mode; empty:
    /// a full checkout.
    pub sparse: Vec<PathBuf>,
    pub interval: Duration,
    pub timeout: Duration,
    pub git: GitAuth,
    pub backend: BackendConfig,
    /// The notifiers told about this target (its own list, or the defaults).
    pub notify: Vec<String>,
    /// The repository's web page, for commit links (derived from `repo` for
    /// https and ssh URLs unless set).
    pub web_url: Option<String>,
    /// What a tick may do with it (`policy`).
    pub policy: Policy,
    /// Where its commit statuses go (`forge`, or `[defaults] forge`), with
    /// the repository's path there.
    pub statuses: Option<StatusTo>,
    /// `forge_repo` as written (the repository path on the forge when the
    /// repo URL does not say it).
    pub forge_repo: Option<String>,
    /// Which pull requests are planned and shown on the forge (`previews`).
    pub previews: Previews,
    /// The keys its commits must be signed with (`verify`, or `[defaults]
    /// verify`); none: commits are not checked.
    pub verify: Option<Verification>,
    /// SOPS files decrypted for its runs (`[targets.decrypt]`).
    pub decrypt: Option<crate::decrypt::Sops>,
    /// The targets that must have converged before it runs (`depends_on`,
    /// and every target an input comes from).
    pub depends_on: Vec<String>,
    /// Other targets' recorded outputs passed to its backend (`inputs`).
    pub inputs: Vec<Input>,
    /// Checks after each apply (`[targets.health]`, or `[defaults.health]`).
    pub health: Option<crate::health::Health>,
    /// When its work may start (`windows`, or `[defaults] windows`; no
    /// entries: any time).
    pub windows: crate::window::Windows,
    /// `windows` as the target's own table said it (`None`: not said, so
    /// `[defaults] windows` apply).
    pub own_windows: Option<crate::window::Windows>,
    /// The rollout in waves it is a member of: its `[[target_sets]]`
    /// entry's `name` (when that set has a `rollout`) or its `[[groups]]`
    /// entry's.
    pub rollout_of: Option<String>,
    /// The `name_prefix` of the `[[target_sets]]` entry that made it from
    /// its directory (`path`); `None` for a `[[targets]]` entry.
    pub set: Option<String>,
}

/// `inputs = { NAME = "<target>.outputs.<output>" }`: one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// The variable's name (terraform: `TF_VAR_<name>` when lowercase).
    pub name: String,
    /// The target whose output it is.
    pub target: String,
    /// The output's name.
    pub output: String,
}

/// `previews`: which pull requests into the target's branch are planned,
/// with the plan posted on the pull request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Previews {
    /// None (the default).
    Off,
    /// `true`: those whose head is in the target's own repository.
    SameRepository,
    /// `"forks"`: from forks as well. A plan can run the pull request's
    /// code (terraform's external data sources, a pulumi program, an exec
    /// `plan` command), so this lets anyone who can open a pull request
    /// run code on this machine with the target's credentials.
    Forks,
}

impl Previews {
    /// Whether a pull request from a fork (or not) is planned.
    pub fn plans(self, from_fork: bool) -> bool {
        match self {
            Previews::Off => false,
            Previews::SameRepository => !from_fork,
            Previews::Forks => true,
        }
    }
}

/// A forge and a repository on it, for a target's commit statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusTo {
    pub forge: String,
    /// `owner/name` (GitLab: the project path).
    pub repo: String,
}

/// What a tick may do with a target (`policy`, default `auto`): the one
/// policy vocabulary, kept in `deploy`.
pub use crate::deploy::Policy;

impl Target {
    /// The commit's page on the repository's forge, when `web_url` (set or
    /// derived from `repo`) says where: GitHub, Gitea, Forgejo and GitLab
    /// all answer `<web_url>/commit/<sha>`.
    pub fn commit_url(&self, sha: &str) -> Option<String> {
        self.web_url.as_ref().map(|w| format!("{w}/commit/{sha}"))
    }

    /// The policy the tick itself follows. On a backend that reviews each
    /// unit on its own (`Kind::reviews_units`: Nomad's jobs) `approval` is
    /// its units' default, which the backend applies unit by unit (a
    /// job's meta may override it), so that tick goes through `apply`; its
    /// `detect` is the target's own, as on every backend: every tick plans
    /// (Nomad's plan dry-run per job) and nothing is written, whatever a
    /// unit says.
    pub fn tick_policy(&self) -> Policy {
        match self.policy {
            Policy::Detect => Policy::Detect,
            _ if self.backend.reviews_units() => Policy::Auto,
            p => p,
        }
    }

    /// Said after a failure of a target with a sparse checkout: what its
    /// checkout holds, since a file the backend needs elsewhere in the
    /// repository is missing there. Empty for a full checkout.
    pub fn sparse_hint(&self) -> String {
        if self.sparse.is_empty() {
            return String::new();
        }
        let dirs: Vec<String> = self
            .sparse
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect();
        format!(
            " (its checkout is sparse: only {} and the repository's top-level files are there; \
             a directory it needs elsewhere goes in `extra_paths`)",
            dirs.join(", ")
        )
    }

    /// What git needs of this target.
    pub fn source(&self) -> crate::git::Source<'_> {
        crate::git::Source {
            target: &self.name,
            repo: &self.repo,
            branch: &self.branch,
            path: &self.path,
            sparse: &self.sparse,
            auth: &self.git,
        }
    }
}

/// The settings in force, shared by every part of a running daemon. A
/// `[[target_sets]]` member comes and goes with its directory while the
/// daemon runs, so the whole `Settings` is swapped for one with the new
/// member list (`replace`); readers take the one in force (`get`) and keep
/// it for as long as they work with it. Cheap to clone.
#[derive(Clone)]
pub struct Live(std::sync::Arc<std::sync::RwLock<std::sync::Arc<Settings>>>);

impl Live {
    pub fn new(settings: Settings) -> Live {
        Live(std::sync::Arc::new(std::sync::RwLock::new(
            std::sync::Arc::new(settings),
        )))
    }

    /// The settings in force now.
    pub fn get(&self) -> std::sync::Arc<Settings> {
        // A writer that panicked left a whole `Arc` in place: still good.
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Put `settings` in force.
    pub fn replace(&self, settings: Settings) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = std::sync::Arc::new(settings);
    }
}

impl Settings {
    pub fn target(&self, name: &str) -> Option<&Target> {
        let indexed = self
            .index
            .of(&self.targets)
            .and_then(|ix| ix.at.get(name))
            .and_then(|&i| self.targets.get(i))
            .filter(|t| t.name == name);
        indexed.or_else(|| self.targets.iter().find(|t| t.name == name))
    }

    /// The targets that depend on `name` (`depends_on`), in the order of
    /// `targets`.
    pub fn dependents(&self, name: &str) -> Vec<&Target> {
        match self.index.of(&self.targets) {
            Some(ix) => ix
                .dependents
                .get(name)
                .map(|at| at.iter().filter_map(|&i| self.targets.get(i)).collect())
                .unwrap_or_default(),
            None => graph::dependents(&self.targets, name),
        }
    }

    /// Whether another target takes `name`'s outputs as inputs.
    pub fn consumed(&self, name: &str) -> bool {
        match self.index.of(&self.targets) {
            Some(ix) => ix.consumed.contains(name),
            None => self
                .targets
                .iter()
                .any(|t| t.inputs.iter().any(|i| i.target == name)),
        }
    }

    pub fn locks_dir(&self) -> PathBuf {
        self.state_dir.join("locks")
    }

    pub fn database_path(&self) -> PathBuf {
        self.state_dir.join("driftless.db")
    }

    /// Where target `name`'s plan artifacts are kept.
    pub fn plans_dir(&self, name: &str) -> PathBuf {
        self.state_dir.join("plans").join(name)
    }

    /// The note of the tag a target that follows tags applied last.
    pub fn followed_tag_note(&self, name: &str) -> PathBuf {
        self.state_dir.join("tags").join(name)
    }

    /// The note of the files a target's run has decrypted (`decrypt`).
    pub fn decrypted_note(&self, name: &str) -> PathBuf {
        self.state_dir.join("decrypted").join(name)
    }

    /// Where a target's pull request previews write their (discarded) plans.
    pub fn preview_plans_dir(&self, name: &str) -> PathBuf {
        self.state_dir.join("previews").join("plans").join(name)
    }

    /// The locks of the targets' preview checkouts: not the apply locks.
    pub fn preview_locks_dir(&self) -> PathBuf {
        self.state_dir.join("previews").join("locks")
    }

    /// The policies (`[[policies]]`) that cover target `name`, in the
    /// order configured.
    pub fn policies_for(&self, name: &str) -> Vec<&crate::policy::Spec> {
        self.policies
            .iter()
            .filter(|p| p.covers(name))
            .map(|p| &p.spec)
            .collect()
    }
}

// ---------------------------------------------------------------------------
// Raw shapes (`top`), deserialized section by section so one bad target
// does not hide the problems of the others.

/// Load and validate the configuration at `path`, applying `DRIFTLESS__`
/// environment overrides.
pub fn load(path: &Path) -> Result<Settings, ConfigError> {
    load_with_env(path, true)
}

/// The names of the targets configured in `path`, as far as it makes
/// sense: a file with problems still names the targets it could read,
/// and one that does not read names none. For a shell completing a target
/// name (`driftless completions`), which must never fail.
pub fn target_names(path: &Path) -> Vec<String> {
    match parse(path, true, false) {
        Ok((Some(s), _)) => s.targets.iter().map(|t| t.name.clone()).collect(),
        _ => Vec::new(),
    }
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
        // A checkout belongs to one repository, path and backend kind.
        let dir = crate::git::checkout_root(&settings.state_dir).join(&t.name);
        let want = crate::git::checkout_identity(&t.repo_key, &t.path, t.backend.kind());
        if let Ok(Some(had)) = crate::git::checkout_of(&dir)
            && had != want
        {
            problems.push(problem(
                &section,
                "repo",
                format!(
                    "the checkout {} is a checkout of {}, not of {}: its untracked files belong                      to that one; move what you need from it, then `driftless forget {}` to start                      clean",
                    dir.display(),
                    had.trim().replace('\n', ", "),
                    want.trim().replace('\n', ", "),
                    t.name
                ),
            ));
        }
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

fn validate(
    raw: Value,
    path: &Path,
    base: &Path,
    machine: bool,
    problems: &mut Vec<Problem>,
) -> Option<Settings> {
    let top = read_table::<RawTop>(raw, "", "", problems)?;
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
    let forges = validate_forges(top.forges, base, problems);
    let raw_defaults = top.defaults.unwrap_or_default();
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
        forge: raw_defaults.forge,
        verify: raw_defaults
            .verify
            .and_then(|v| verify::validate_verify(v, "defaults", base, machine, problems)),
        health: raw_defaults
            .health
            .and_then(|v| health::validate_health(v, "defaults", base, machine, problems)),
        windows: raw_defaults
            .windows
            .and_then(|v| windows::validate_windows(v, "defaults", problems))
            .unwrap_or_default(),
    };
    let database = top
        .database
        .and_then(|d| database::validate_database(d, base, problems));
    let history = History {
        keep: duration(
            "history",
            "keep",
            top.history.and_then(|h| h.keep).as_deref(),
            DEFAULT_HISTORY_KEEP,
            MAX_HISTORY_KEEP,
            problems,
        ),
    };
    if let Some(f) = &defaults.forge
        && !forges.iter().any(|x| &x.name == f)
    {
        problems.push(problem(
            "defaults",
            "forge",
            format!("no [[forges]] entry named `{f}`"),
        ));
    }
    for n in &defaults.notify {
        if !notifiers.iter().any(|x| &x.name == n) {
            problems.push(problem(
                "defaults",
                "notify",
                format!("no notifier named `{n}`"),
            ));
        }
    }
    for t in &mut targets {
        finish_target(t, &forges, &defaults, &notifiers, problems);
    }
    graph::validate(&targets, problems);
    // Set and group names, one namespace (rollouts and scopes name them).
    let mut unit_names = HashSet::new();
    let mut target_sets: Vec<TargetSet> = Vec::new();
    for (i, raw) in top.target_sets.into_iter().enumerate() {
        let Some(mut set) = sets::validate_set(raw, i, base, machine, problems) else {
            continue;
        };
        let label = set.label();
        if let Some(n) = &set.name {
            rollouts::unit_name(n, &label, &targets, &mut unit_names, problems);
        }
        if target_sets.iter().any(|s| s.name_prefix == set.name_prefix) {
            problems.push(problem(
                &label,
                "name_prefix",
                format!("two [[target_sets]] have name_prefix `{}`: it names the set, so it must be unique", set.name_prefix),
            ));
            continue;
        }
        let before = problems.len();
        finish_target(&mut set.sample, &forges, &defaults, &notifiers, problems);
        for p in &mut problems[before..] {
            p.section = label.clone();
        }
        // Members wait on `[[targets]]` entries only: a set's members come
        // and go with directories, so no order could be checked for them.
        for d in &set.sample.depends_on {
            if !targets.iter().any(|t| &t.name == d) {
                problems.push(problem(
                    &label,
                    "depends_on",
                    format!("no [[targets]] entry named `{d}` (a set's members may depend on [[targets]] entries only)"),
                ));
            }
        }
        target_sets.push(set);
    }
    let groups = rollouts::validate_groups(top.groups, &mut targets, &mut unit_names, problems);
    let policies = policies::validate_policies(top.policies, base, problems);
    for t in &targets {
        policies::check_covered(&policies, t, &format!("targets[{}]", t.name), problems);
    }
    Some(Settings {
        groups,
        policies,
        source: path.to_path_buf(),
        state_dir,
        server,
        targets,
        receivers,
        tokens,
        defaults,
        notifiers,
        forges,
        history,
        database,
        target_sets,
        index: TargetIndex::default(),
    })
}

/// What a target gets once every table is read: its commit statuses
/// (`settle_forge`), its inputs' targets as dependencies, `[defaults]
/// verify` and `notify` when it has none of its own, and its notifiers
/// checked. For `[[targets]]` entries at load time and for a set's
/// members whenever they are made.
fn finish_target(
    t: &mut Target,
    forges: &[crate::notify::forge::ForgeConfig],
    defaults: &Defaults,
    notifiers: &[crate::notify::NotifierConfig],
    problems: &mut Vec<Problem>,
) {
    settle_forge(t, forges, defaults, problems);
    // An input's target is a dependency, listed or not.
    for i in &t.inputs {
        if !t.depends_on.contains(&i.target) {
            t.depends_on.push(i.target.clone());
        }
    }
    if t.verify.is_none() {
        t.verify = defaults.verify.clone();
    }
    if t.health.is_none() {
        t.health = defaults.health.clone();
    }
    // A target's own windows replace the defaults' (no merging).
    t.windows = t
        .own_windows
        .clone()
        .unwrap_or_else(|| defaults.windows.clone());
    health::check_own(t, problems);
    // A target without a `notify` list gets the defaults; an explicit
    // empty list means no notifications for it.
    if t.notify == [INHERIT.to_string()] {
        t.notify = defaults.notify.clone();
        return;
    }
    for n in &t.notify {
        if !notifiers.iter().any(|x| &x.name == n) {
            problems.push(problem(
                &format!("targets[{}]", t.name),
                "notify",
                format!("no notifier named `{n}`"),
            ));
        }
    }
}

fn validate_forges(
    raw: Vec<Value>,
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Vec<crate::notify::forge::ForgeConfig> {
    let mut out: Vec<crate::notify::forge::ForgeConfig> = Vec::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let label = raw
            .get("name")
            .and_then(Value::as_str)
            .map(|n| format!("forges[{n}]"))
            .unwrap_or_else(|| format!("forges[{i}]"));
        match crate::notify::forge::ForgeConfig::from_value(raw, base) {
            Ok(f) if !valid_name(&f.name) => problems.push(problem(
                &label,
                "name",
                format!("`{}` is not a safe forge name", f.name),
            )),
            Ok(f) if out.iter().any(|o| o.name == f.name) => problems.push(problem(
                &label,
                "name",
                format!("duplicate forge name `{}`", f.name),
            )),
            Ok(f) => out.push(f),
            Err(errs) => {
                for (key, msg) in errs {
                    problems.push(problem(&label, &key, msg));
                }
            }
        }
    }
    out
}

/// A target's commit statuses: its `forge` (or `[defaults] forge`),
/// which must be a `[[forges]]` entry, and the repository's path there,
/// `forge_repo` or read from the repo URL.
fn settle_forge(
    t: &mut Target,
    forges: &[crate::notify::forge::ForgeConfig],
    defaults: &Defaults,
    problems: &mut Vec<Problem>,
) {
    let label = format!("targets[{}]", t.name);
    let forge = match t
        .statuses
        .take()
        .map(|s| s.forge)
        .or_else(|| defaults.forge.clone())
    {
        Some(f) => f,
        None => {
            if t.previews != Previews::Off {
                problems.push(problem(
                    &label,
                    "previews",
                    "previews are posted on the pull request: name the target's `forge` (or set [defaults] forge)",
                ));
            }
            return;
        }
    };
    if !forges.iter().any(|x| x.name == forge) {
        problems.push(problem(
            &label,
            "forge",
            format!("no [[forges]] entry named `{forge}`"),
        ));
        return;
    }
    let repo = match t
        .forge_repo
        .clone()
        .or_else(|| crate::notify::forge::repo_of(&t.repo))
    {
        Some(r) => r,
        None => {
            problems.push(problem(
                &label,
                "forge_repo",
                format!(
                    "the repository's path on forge `{forge}` cannot be read from `repo`; set forge_repo = \"owner/name\""
                ),
            ));
            return;
        }
    };
    t.statuses = Some(StatusTo { forge, repo });
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

    /// Targets found by name, their dependents and whether their outputs
    /// are taken answer as a scan of `targets` does: from the index, from a
    /// copy's own index, and once the list changed after its index was
    /// made.
    #[test]
    fn targets_are_found_by_name_as_a_scan_finds_them() {
        let target = |name: &str, extra: &str| {
            format!(
                "[[targets]]\nname = \"{name}\"\nrepo = \"https://h/o/r\"\npath = \"{name}\"\n{extra}\n\
                 [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n"
            )
        };
        let s = load_str(&format!(
            "state_dir = \"/tmp/x\"\n{}{}{}",
            target("a", ""),
            target("b", "depends_on = [\"a\"]"),
            target("c", "inputs = { X = \"a.outputs.y\" }"),
        ))
        .expect("valid");
        let names = |ts: Vec<&Target>| ts.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        let same_as_a_scan = |s: &Settings, name: &str| {
            assert_eq!(
                s.target(name).map(|t| &t.name),
                s.targets.iter().find(|t| t.name == name).map(|t| &t.name),
                "{name}"
            );
            assert_eq!(
                names(s.dependents(name)),
                names(graph::dependents(&s.targets, name)),
                "{name}"
            );
            assert_eq!(
                s.consumed(name),
                s.targets
                    .iter()
                    .any(|t| t.inputs.iter().any(|i| i.target == name)),
                "{name}"
            );
        };
        for name in ["a", "b", "c", "nobody"] {
            same_as_a_scan(&s, name);
        }
        assert_eq!(names(s.dependents("a")), ["b", "c"]);
        assert!(s.consumed("a") && !s.consumed("b"));
        // A copy whose list grows after its index was made.
        let mut grown = s.clone();
        assert!(grown.target("a").is_some());
        let mut d = grown.targets[1].clone();
        d.name = "d".into();
        d.depends_on = vec!["b".into()];
        grown.targets.push(d);
        for name in ["a", "b", "c", "d", "nobody"] {
            same_as_a_scan(&grown, name);
        }
        assert_eq!(names(grown.dependents("b")), ["d"]);
        // Nor does the original see what its copy gained.
        assert!(s.target("d").is_none() && s.dependents("b").is_empty());
        // A copy made after the original's index, with members of sets.
        let members = s.with_members(vec![]);
        for name in ["a", "b", "c", "nobody"] {
            same_as_a_scan(&members, name);
        }
    }

    /// A target's forge must be a `[[forges]]` entry, the repository's
    /// path there must be known, and a forge entry names its bad keys.
    #[test]
    fn forges_and_the_targets_that_name_them() {
        let target = |name: &str, repo: &str, extra: &str| {
            format!(
                "[[targets]]\nname = \"{name}\"\nrepo = \"{repo}\"\n{extra}\n\
                 [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n"
            )
        };
        let forge = "[[forges]]\nname = \"gh\"\nkind = \"github\"\n\
                     api_url = \"https://api.github.com/\"\ntoken_file = \"env:GH\"\n";
        let ok = load_str(&format!(
            "{}{}{}{forge}",
            target("a", "https://github.com/me/infra.git", "forge = \"gh\""),
            target(
                "b",
                "/srv/git/infra",
                "forge = \"gh\"\nforge_repo = \"me/other\""
            ),
            target("c", "/srv/git/infra", ""),
        ))
        .expect("valid");
        let to = |n: usize| ok.targets[n].statuses.clone();
        assert_eq!(
            (to(0), to(1), to(2)),
            (
                Some(StatusTo {
                    forge: "gh".into(),
                    repo: "me/infra".into()
                }),
                Some(StatusTo {
                    forge: "gh".into(),
                    repo: "me/other".into()
                }),
                None
            )
        );
        assert_eq!(ok.forges[0].api_url, "https://api.github.com");
        let shown: Vec<String> = problems(&format!(
            "[defaults]\nforge = \"nope\"\n{}{}{forge}\
             [[forges]]\nname = \"bad\"\nkind = \"bitbucket\"\napi_url = \"x\"\ntoken_file = \"t\"\n",
            target("a", "/srv/git/infra", "forge = \"gh\""),
            target("b", "https://github.com/me/infra", "forge = \"gl\""),
        ))
        .iter()
        .map(|p| p.to_string())
        .collect();
        for want in [
            "defaults: key `forge`: no [[forges]] entry named `nope`",
            "targets[a]: key `forge_repo`: the repository's path on forge `gh` cannot be read from `repo`; set forge_repo = \"owner/name\"",
            "targets[b]: key `forge`: no [[forges]] entry named `gl`",
            "forges[bad]: key `kind`: `bitbucket` is not one of github, gitea, forgejo, gitlab",
        ] {
            assert!(
                shown.iter().any(|p| p == want),
                "{want:?} not in {shown:#?}"
            );
        }
    }

    #[test]
    fn previews_are_checked() {
        let forge = "[[forges]]\nname = \"gh\"\nkind = \"github\"\n\
                     api_url = \"https://api.github.com\"\ntoken_file = \"env:GH\"\n";
        let target = |name: &str, extra: &str, plan: &str| {
            format!(
                "[[targets]]\nname = \"{name}\"\nrepo = \"https://github.com/me/infra\"\n{extra}\n\
                 [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n{plan}\n"
            )
        };
        let plan = "plan = [\"true\"]";
        let ok = load_str(&format!(
            "{}{}{}{forge}",
            target("a", "forge = \"gh\"\npreviews = true", plan),
            target("b", "forge = \"gh\"\npreviews = \"forks\"", plan),
            target("c", "", ""),
        ))
        .expect("valid");
        let p: Vec<Previews> = ok.targets.iter().map(|t| t.previews).collect();
        assert_eq!(
            p,
            [Previews::SameRepository, Previews::Forks, Previews::Off]
        );
        assert!(!Previews::SameRepository.plans(true) && Previews::Forks.plans(true));
        let shown: Vec<String> = problems(&format!(
            "{}{}{}{forge}",
            target("a", "forge = \"gh\"\npreviews = \"yes\"", plan),
            target("b", "previews = true", plan),
            target("c", "forge = \"gh\"\npreviews = true", ""),
        ))
        .iter()
        .map(|p| p.to_string())
        .collect();
        for want in [
            "targets[a]: key `previews`: `\"yes\"` is not one of true, false, \"forks\" (plan pull requests from forks too)",
            "targets[b]: key `previews`: previews are posted on the pull request: name the target's `forge` (or set [defaults] forge)",
            "targets[c]: key `previews`: previews need a backend that can plan; this `exec` target cannot (exec and pi can with a `plan` command)",
        ] {
            assert!(
                shown.iter().any(|p| p == want),
                "{want:?} not in {shown:#?}"
            );
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
                .contains("longer than the most this key takes (at most 7d)"),
            "{p:?}"
        );
        assert!(p[1].message.contains("(at most 1d)"), "{p:?}");
        // [history] keep: 90 days unless said, in the same units.
        let history = |keep: &str| format!("[history]\nkeep = \"{keep}\"\n{}", toml("5m", "30m"));
        let keep = |k: &str| load_str(&history(k)).map(|s| s.history.keep);
        assert_eq!(
            load_str(&toml("5m", "30m")).map(|s| s.history.keep).ok(),
            Some(Duration::from_secs(90 * 24 * 3600))
        );
        assert_eq!(keep("30d").ok(), Some(Duration::from_secs(30 * 24 * 3600)));
        let p = problems(&history("3M"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].section == "history" && p[0].key == "keep" && p[0].message.contains("months"),
            "{p:?}"
        );
        let p = problems("[history]\nkeep_runs = 3\n");
        assert!(p.iter().any(|p| p.message.contains("keep_runs")), "{p:?}");
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
