//! One `[[targets]]` table: its repository (a URL or a path, with no
//! credentials in it), branch, path inside the checkout, interval and
//! timeout, git credentials, notifiers, the commit-page URL derived from the
//! repository's, its `verify` and `decrypt` tables (`config::verify`,
//! `config::decrypt`), and its backend
//! table (validated by the backend's own `Kind`). Every problem is
//! collected with the target's label.

use std::collections::BTreeMap;

use schemars::JsonSchema;

use super::*;

/// A `[[targets]]` entry: one directory of a repository's branch (or
/// tag), converged by one backend.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = with_backend)]
pub(super) struct RawTarget {
    /// The target's name: 1-63 characters from a-z, 0-9, '_', '.', '-',
    /// starting with a letter or digit (safe in paths and URLs).
    name: String,
    /// The repository: a URL (https://, ssh://, git://, file://,
    /// user@host:path) without credentials in it, or a local path.
    repo: String,
    /// The branch followed. Default: main.
    branch: Option<String>,
    /// Instead of `branch`: follow the highest version tag matching this
    /// pattern (at most one `*`; semver order, a leading v allowed).
    tag: Option<String>,
    /// The directory of the repository the backend works in. Default: the
    /// repository's root.
    path: Option<String>,
    /// `full` (default): the whole repository is checked out (its objects
    /// shared with the other targets on it); `sparse`: only `path`,
    /// `extra_paths` and the repository's top-level files (git's sparse
    /// checkout, cone mode), for a backend that reads only its directory.
    #[schemars(extend("enum" = ["full", "sparse"]))]
    checkout: Option<String>,
    /// With `checkout = "sparse"`: more directories of the repository to
    /// check out beside `path` (a Terraform module, Ansible roles, shared
    /// files the backend reads).
    extra_paths: Option<Vec<String>>,
    /// The fallback tick, with jitter, for when a push notification is
    /// missed (a duration such as "10m"). Default: 5m.
    interval: Option<String>,
    /// Every backend operation is bounded by this; commands past it are
    /// killed and the run fails. Default: 30m.
    timeout: Option<String>,
    /// Credentials for the repository.
    git: Option<RawGit>,
    /// Notifiers (by name) told about this target. Default:
    /// `[defaults] notify`.
    notify: Option<Vec<String>>,
    /// The repository's web page, for commit links; derived from https://
    /// and ssh repository URLs when not set.
    web_url: Option<String>,
    /// What a tick may do: `auto` applies what git says; `approval` makes
    /// every change wait for a person to approve exactly its plan;
    /// `approve_destructive` only plans that delete or replace;
    /// `detect` plans every tick, applies nothing and reports drift.
    /// All but `auto` need a backend that can plan. Default: auto.
    #[schemars(extend("enum" = crate::deploy::Policy::NAMES))]
    policy: Option<String>,
    /// The `[[forges]]` entry (by name) commit statuses and previews go to.
    /// Default: `[defaults] forge`.
    forge: Option<String>,
    /// The repository's path on the forge (`owner/name`; GitLab: the
    /// project path) when `repo` does not say it.
    forge_repo: Option<String>,
    /// Plan pull requests into `branch` that touch `path` and comment the
    /// plan on them (needs a `forge`): `true`, or `"forks"` to plan those
    /// from forks too (planning runs the pull request's code). Default:
    /// false.
    #[serde(default)]
    #[schemars(schema_with = "previews_schema")]
    previews: Option<Value>,
    /// Apply only signed commits (docs/supply-chain.md). Default:
    /// `[defaults.verify]`.
    #[schemars(with = "Option<super::verify::RawVerify>")]
    verify: Option<Value>,
    /// SOPS-encrypted files decrypted in place for each run
    /// (docs/supply-chain.md).
    #[schemars(with = "Option<super::decrypt::RawDecrypt>")]
    decrypt: Option<Value>,
    /// Targets (by name, or a set's `name_prefix*`) this one converges
    /// after (docs/dependencies-and-sets.md).
    depends_on: Option<Vec<String>>,
    /// Other targets' outputs in this target's environment:
    /// `name = "<target>.outputs.<output>"` (terraform: a lowercase name
    /// is `TF_VAR_<name>`); the named target becomes a dependency.
    inputs: Option<BTreeMap<String, String>>,
    /// Health checks after every apply (docs/health.md). Default:
    /// `[defaults.health]`.
    #[schemars(with = "Option<super::health::RawHealth>")]
    health: Option<Value>,
    /// When work may start (docs/windows.md). Default: `[defaults] windows`.
    #[schemars(with = "Option<super::windows::WindowList>")]
    windows: Option<Value>,
}

/// `previews`: `true`, `false` or `"forks"` (`validate_previews` reads it).
fn previews_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "oneOf": [{ "type": "boolean" }, { "const": "forks" }] })
}

/// The `backend` key every target (and set) has: read apart from the
/// rest by [`BackendConfig::from_value`], so added to the schema here.
pub(super) fn with_backend(schema: &mut schemars::Schema) {
    let backend = crate::backend::json_schema();
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert("backend".into(), backend);
    }
    if let Some(req) = schema.get_mut("required").and_then(Value::as_array_mut) {
        req.push(Value::String("backend".into()));
    }
}

/// `[targets.git]`: credentials for the repository.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawGit {
    /// https: a file holding a token (or `env:NAME`), sent as the password.
    token_file: Option<String>,
    /// https: the user sent with `token_file`. Default: x-access-token.
    username: Option<String>,
    /// ssh: a private key.
    identity_file: Option<String>,
    /// ssh: the host keys (always checked). Default: the user's own
    /// known_hosts.
    known_hosts_file: Option<String>,
    /// https: extra CA roots (PEM) for a forge with a private CA, on top of
    /// the system's.
    ca_file: Option<String>,
}

pub(super) fn validate_target(
    mut raw: Value,
    label: &str,
    base: &Path,
    machine: bool,
    problems: &mut Vec<Problem>,
) -> Option<Target> {
    // The backend table is checked on its own so its problems name `backend.*`.
    let backend_raw = raw.as_object_mut().and_then(|o| o.remove("backend"));
    let backend = validate_backend(backend_raw, label, base, problems);
    let raw = read_table::<RawTarget>(raw, label, "", problems)?;
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
    let repo = validate_repo(&raw.repo, label, base, problems);
    let tag = validate_tag(raw.tag, raw.branch.is_some(), label, problems);
    let branch = raw.branch.unwrap_or_else(|| "main".into());
    if !valid_branch(&branch) {
        problems.push(problem(
            label,
            "branch",
            format!("`{branch}` is not a valid branch name"),
        ));
    }
    let rel = validate_path(raw.path, label, "path", problems);
    let sparse = validate_sparse(
        raw.checkout.as_deref(),
        raw.extra_paths,
        &rel,
        label,
        problems,
    );
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
    let git = validate_git(raw.git, label, base, problems);
    let web_url = validate_web_url(raw.web_url, &repo, label, problems);
    // What only this machine can tell, for `check`: looked at whatever else
    // is wrong with the target.
    if machine {
        check_git_here(&git, &repo, label, problems);
    }
    let mut backend = backend;
    let policy = validate_policy(raw.policy.as_deref(), backend.as_mut(), label, problems);
    let previews = validate_previews(
        raw.previews.as_ref(),
        tag.is_some(),
        backend.as_ref(),
        label,
        problems,
    );
    // With problems, the target is still returned, for `check` to look at
    // what it can (its files, its binary); `load` refuses the whole file.
    let backend = backend?;
    Some(Target {
        policy,
        set: None,
        name: raw.name,
        repo_key: super::normalize_repo(&repo),
        repo,
        branch,
        path: rel,
        sparse,
        interval,
        timeout,
        git,
        backend,
        notify: raw.notify.unwrap_or_else(|| vec![INHERIT.to_string()]),
        web_url,
        // Settled against `[[forges]]` and `[defaults] forge` once every
        // table is read (config::settle_forges).
        statuses: raw.forge.map(|forge| StatusTo {
            forge,
            repo: raw.forge_repo.clone().unwrap_or_default(),
        }),
        forge_repo: raw.forge_repo,
        previews,
        // `[defaults.verify]` for a target without its own: config::validate.
        verify: raw
            .verify
            .and_then(|v| super::verify::validate_verify(v, label, base, machine, problems)),
        tag,
        decrypt: raw
            .decrypt
            .and_then(|v| super::decrypt::validate_decrypt(v, label, base, machine, problems)),
        // Names checked against the other targets (and for cycles) once
        // every table is read: config::graph.
        depends_on: raw.depends_on.unwrap_or_default(),
        // `[defaults.health]` for a target without its own: finish_target.
        health: raw
            .health
            .and_then(|v| super::health::validate_health(v, label, base, machine, problems)),
        // `[defaults] windows` for a target without its own: finish_target.
        own_windows: raw
            .windows
            .and_then(|v| super::windows::validate_windows(v, label, problems)),
        windows: Default::default(),
        // Its group's or its set's, once those are read.
        rollout_of: None,
        inputs: raw
            .inputs
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(name, from): (String, String)| input(label, name, &from, problems))
            .collect(),
    })
}

/// `[targets.backend]`, checked on its own so its problems name
/// `backend.*`.
fn validate_backend(
    backend: Option<Value>,
    label: &str,
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Option<BackendConfig> {
    match backend {
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
    }
}

/// `repo`: a URL without credentials, or a path (made absolute).
fn validate_repo(repo: &str, label: &str, base: &Path, problems: &mut Vec<Problem>) -> String {
    let repo = repo.trim().to_string();
    if repo.is_empty() {
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
    }
}

/// `tag`: a pattern with at most one `*`, never beside `branch`.
fn validate_tag(
    tag: Option<String>,
    has_branch: bool,
    label: &str,
    problems: &mut Vec<Problem>,
) -> Option<String> {
    match tag {
        None => None,
        Some(t) => {
            if has_branch {
                problems.push(problem(
                    label,
                    "tag",
                    "set either `branch` (follow a branch) or `tag` (follow the highest version tag matching it), not both",
                ));
            }
            let bad = t.is_empty()
                || t.matches('*').count() > 1
                || t.starts_with('/')
                || t.ends_with('/')
                || t.contains("..")
                || t.chars()
                    .any(|c| c.is_whitespace() || c.is_control() || "~^:?[\\".contains(c));
            if bad {
                problems.push(problem(
                    label,
                    "tag",
                    format!(
                        "`{t}` is not a tag pattern: a tag name with at most one `*`, such as \"v*\""
                    ),
                ));
            }
            Some(t)
        }
    }
}

/// `path`: a subdirectory of the repository, normalised once, here:
/// `./sub//dir/` is `sub/dir`, `.` the root. Git (routing, checkouts) and
/// every message see only this spelling.
fn validate_path(
    path: Option<String>,
    label: &str,
    key: &str,
    problems: &mut Vec<Problem>,
) -> PathBuf {
    let path = path.unwrap_or_default();
    if Path::new(&path).is_absolute()
        || Path::new(&path)
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        problems.push(problem(
            label,
            key,
            format!("`{path}` must be a subdirectory of the repository (relative, no `..`)"),
        ));
    }
    Path::new(&path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect()
}

/// `checkout` and `extra_paths`: the directories a sparse checkout holds
/// (the target's `path` first), or none for a full one.
fn validate_sparse(
    checkout: Option<&str>,
    extra_paths: Option<Vec<String>>,
    path: &Path,
    label: &str,
    problems: &mut Vec<Problem>,
) -> Vec<PathBuf> {
    let sparse = match checkout {
        None | Some("full") => false,
        Some("sparse") => true,
        Some(other) => {
            problems.push(problem(
                label,
                "checkout",
                format!("`{other}` is not one of \"full\", \"sparse\""),
            ));
            false
        }
    };
    if !sparse {
        // (A `checkout` of another value is its own problem.)
        if extra_paths.is_some() && matches!(checkout, None | Some("full")) {
            problems.push(problem(
                label,
                "extra_paths",
                "only with checkout = \"sparse\" (a full checkout has every directory)",
            ));
        }
        return Vec::new();
    }
    if path.as_os_str().is_empty() {
        problems.push(problem(
            label,
            "checkout",
            "a sparse checkout of the repository's root is the whole repository: set `path`, or leave `checkout` out",
        ));
        return Vec::new();
    }
    let mut dirs = vec![path.to_path_buf()];
    for (i, extra) in extra_paths.unwrap_or_default().into_iter().enumerate() {
        let key = format!("extra_paths[{i}]");
        let dir = validate_path(Some(extra), label, &key, problems);
        if dir.as_os_str().is_empty() {
            problems.push(problem(
                label,
                &key,
                "names the repository's root: a sparse checkout of it is the whole repository",
            ));
        } else if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

/// `[targets.git]`: one way to authenticate, no empty file names.
fn validate_git(
    git: Option<RawGit>,
    label: &str,
    base: &Path,
    problems: &mut Vec<Problem>,
) -> GitAuth {
    match git {
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
    }
}

/// `web_url`: an http(s) URL, or derived from `repo`.
fn validate_web_url(
    web_url: Option<String>,
    repo: &str,
    label: &str,
    problems: &mut Vec<Problem>,
) -> Option<String> {
    match web_url {
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
        None => derive_web_url(repo),
    }
}

/// What only this machine can tell, for `check`: the git credentials'
/// files, and a local repository that exists.
fn check_git_here(git: &GitAuth, repo: &str, label: &str, problems: &mut Vec<Problem>) {
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
    let local = repo.strip_prefix("file://").unwrap_or(repo).to_string();
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

/// `policy`, against what the backend can do (and, for one that reviews
/// each unit on its own, as its units' default, which it takes).
fn validate_policy(
    policy: Option<&str>,
    backend: Option<&mut BackendConfig>,
    label: &str,
    problems: &mut Vec<Problem>,
) -> Policy {
    match (policy.map(|p| (p, Policy::parse(p))), backend) {
        (None, _) => Policy::Auto,
        (Some((_, Some(Policy::Auto))), _) => Policy::Auto,
        // A backend that reviews each unit on its own (Nomad's jobs) takes
        // the policy as its units' default (`Kind::set_unit_policy`); the
        // tick's own is `Target::tick_policy`'s.
        (Some((_, Some(policy))), Some(b)) if b.reviews_units() => {
            match b.set_unit_policy(policy) {
                Ok(()) => policy,
                Err(why) => {
                    problems.push(problem(label, "policy", why));
                    Policy::Auto
                }
            }
        }
        (Some((p, Some(_))), Some(b)) if !b.can_plan() => {
            problems.push(problem(
                label,
                "policy",
                format!(
                    "`{p}` needs a backend that can plan; this `{}` target cannot (exec and pi can with a `plan` command)",
                    b.kind()
                ),
            ));
            Policy::Auto
        }
        (Some((_, Some(p))), _) => p,
        (Some((other, None)), _) => {
            problems.push(problem(
                label,
                "policy",
                format!(
                    "`{other}` is not one of {}",
                    Policy::NAMES
                        .iter()
                        .map(|n| format!("\"{n}\""))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
            Policy::Auto
        }
    }
}

/// `previews`: on, off or forks too, for a branch-following target whose
/// backend can plan.
fn validate_previews(
    previews: Option<&Value>,
    has_tag: bool,
    backend: Option<&BackendConfig>,
    label: &str,
    problems: &mut Vec<Problem>,
) -> Previews {
    let previews = match previews {
        None | Some(Value::Bool(false)) => Previews::Off,
        Some(Value::Bool(true)) => Previews::SameRepository,
        Some(Value::String(s)) if s == "forks" => Previews::Forks,
        Some(other) => {
            problems.push(problem(
                label,
                "previews",
                format!(
                    "`{other}` is not one of true, false, \"forks\" (plan pull requests from forks too)"
                ),
            ));
            Previews::Off
        }
    };
    if previews != Previews::Off && has_tag {
        problems.push(problem(
            label,
            "previews",
            "previews plan pull requests into a branch; a target that follows tags has none",
        ));
    }
    if previews != Previews::Off
        && let Some(b) = backend
        && !b.can_plan()
    {
        problems.push(problem(
            label,
            "previews",
            format!(
                "previews need a backend that can plan; this `{}` target cannot (exec and pi can with a `plan` command)",
                b.kind()
            ),
        ));
    }
    previews
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
pub(super) fn url_credentials(url: &str) -> Option<&'static str> {
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

/// One `inputs` entry: `NAME = "<target>.outputs.<output>"`.
fn input(label: &str, name: String, from: &str, problems: &mut Vec<Problem>) -> Option<Input> {
    let key = format!("inputs.{name}");
    let mut chars = name.chars();
    let good_name = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !good_name {
        problems.push(problem(
            label,
            &key,
            "an input's name must be an environment variable name: letters, digits and '_', not starting with a digit",
        ));
        return None;
    }
    match from.split_once(".outputs.") {
        Some((target, output)) if !target.is_empty() && !output.is_empty() => Some(Input {
            name,
            target: target.to_string(),
            output: output.to_string(),
        }),
        _ => {
            problems.push(problem(
                label,
                &key,
                format!("`{from}` is not `<target>.outputs.<output>`"),
            ));
            None
        }
    }
}

impl Target {
    /// The commit-status context of this target's applies
    /// (`driftless/<target>`), or of its pull-request previews
    /// (`driftless/<target>/preview`). The one place a context is spelled.
    pub fn status_context(&self, preview: bool) -> String {
        if preview {
            format!("driftless/{}/preview", self.name)
        } else {
            format!("driftless/{}", self.name)
        }
    }

    /// The commit status this target leaves on `sha` for an apply, when it
    /// sends statuses: on its branch (none for a target that follows tags).
    pub fn commit_status(
        &self,
        sha: &str,
        state: crate::store::statuses::State,
        description: String,
    ) -> Option<crate::store::statuses::NewStatus> {
        let to = self.statuses.as_ref()?;
        Some(crate::store::statuses::NewStatus {
            forge: to.forge.clone(),
            repo: to.repo.clone(),
            sha: sha.to_string(),
            context: self.status_context(false),
            target: self.name.clone(),
            state,
            description,
            target_url: None,
            git_ref: self.tag.is_none().then(|| self.branch.clone()),
            supersedes_queued_before: None,
        })
    }

    /// The commit status of a preview of a pull request's head `sha`, on
    /// the ref that holds it (`head_ref`: GitLab's
    /// refs/merge-requests/N/head holds a fork's head too).
    pub fn preview_status(
        &self,
        sha: &str,
        head_ref: &str,
        state: crate::store::statuses::State,
        description: String,
    ) -> Option<crate::store::statuses::NewStatus> {
        let mut s = self.commit_status(sha, state, description)?;
        s.context = self.status_context(true);
        s.git_ref = Some(head_ref.to_string());
        Some(s)
    }
}
