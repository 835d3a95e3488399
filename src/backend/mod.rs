//! Backends: how one kind of target is converged.
//!
//! The trait has three operations — `apply`, `destroy`, `outputs` — and
//! nothing else: no plan, no refresh, no dry-run (see ARCHITECTURE.md for
//! why). Everything a backend needs is bound when [`build`] makes it from its
//! config and a [`Context`]. A backend never sees a trigger, a queue, git or a
//! notifier; it must not import `queue`, `tick`, `git` or `http`.
//!
//! Per-backend config is a tagged enum (`kind = "terraform"`), each variant
//! its own struct with `deny_unknown_fields`.

pub mod ansible;
pub mod cloudformation;
pub mod compose;
pub mod exec;
pub mod nomad;
pub mod pi;
pub mod pulumi;
pub mod terraform;
pub mod tool;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::redact::Redactor;

pub use crate::model::{ApplyResult, BoxFuture, Status};

/// A backend's outputs: a JSON object.
pub type Outputs = serde_json::Map<String, serde_json::Value>;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Command(String),
}

/// The protocol every backend satisfies.
pub trait Backend: Send + Sync {
    /// Converge the real world to the checkout. Idempotent: with nothing to
    /// do it reports `no_change` and changes nothing.
    fn apply(&self) -> BoxFuture<'_, Status>;
    /// Tear the target down.
    fn destroy(&self) -> BoxFuture<'_, Status>;
    /// What the target exposes (terraform outputs, the command's JSON, …).
    fn outputs(&self) -> BoxFuture<'_, Result<Outputs, BackendError>>;
}

/// What a backend is bound to when it is built.
#[derive(Debug, Clone)]
pub struct Context {
    /// The target's name (compose uses it as the default project name).
    pub name: String,
    /// The target's directory inside the checkout.
    pub workdir: PathBuf,
    /// The root of the repository's checkout (`workdir` is inside it):
    /// nothing a backend reads or writes on the repository's behalf may
    /// resolve outside it.
    pub checkout: PathBuf,
    /// A content hash of every tracked file under `workdir`.
    pub source_digest: String,
    /// The digest stored after the last successful apply, if any.
    pub last_digest: Option<String>,
    /// Every operation is bounded by this; commands are killed past it.
    pub timeout: Duration,
    /// Masks secrets in everything the backend reports.
    pub redactor: Redactor,
    /// The commit being applied (empty for `outputs`).
    pub commit: String,
    /// Durable records for backends that keep their own (nomad's
    /// deployments); `None` where there is no state database.
    pub ledger: Option<Arc<dyn nomad::Ledger>>,
}

impl Context {
    /// `rel` (relative to the target's path) as a path driftless or the
    /// backend may read or write: refused, naming `key` and where it leads,
    /// when a committed symlink takes it out of the checkout. A path that
    /// does not exist is returned as is (the backend says it is missing).
    pub fn inside(&self, key: &str, rel: &str) -> Result<PathBuf, String> {
        let path = self.workdir.join(rel);
        match crate::paths::leads_outside(&self.checkout, &path) {
            None => Ok(path),
            Some(to) => Err(format!(
                "`{key}` `{rel}` resolves to {}, outside the target's checkout (a committed symlink); refused",
                to.display()
            )),
        }
    }
}

/// The `[targets.backend]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum BackendConfig {
    Terraform(terraform::Config),
    Exec(exec::Config),
    Ansible(ansible::Config),
    Pi(pi::Config),
    Compose(compose::Config),
    Nomad(nomad::Config),
    Pulumi(pulumi::Config),
    Cloudformation(cloudformation::Config),
}

impl BackendConfig {
    /// Parse the table, naming every problem with its key (`kind` picks
    /// the struct, whose fields are read with their paths). Paths to files
    /// in the repository stay relative to the target's path; paths to files
    /// on the controller (ssh keys) are resolved against `base`, the config
    /// file's directory.
    pub fn from_value(
        mut v: serde_json::Value,
        base: &Path,
    ) -> Result<Self, Vec<crate::schema::KeyProblem>> {
        const KINDS: &str = "terraform, exec, ansible, pi, compose, nomad, pulumi, cloudformation";
        let kind = match v.as_object_mut().map(|o| o.remove("kind")) {
            None => return Err(vec![("(table)".into(), "must be a table".into())]),
            Some(None) => return Err(vec![("kind".into(), format!("missing: one of {KINDS}"))]),
            Some(Some(serde_json::Value::String(k))) => k,
            Some(Some(other)) => {
                return Err(vec![(
                    "kind".into(),
                    format!("{other} is not one of {KINDS}"),
                )]);
            }
        };
        use crate::schema::read;
        let mut cfg = match kind.as_str() {
            "terraform" => BackendConfig::Terraform(read(v)?),
            "exec" => BackendConfig::Exec(read(v)?),
            "ansible" => BackendConfig::Ansible(read(v)?),
            "pi" => BackendConfig::Pi(read(v)?),
            "compose" => BackendConfig::Compose(read(v)?),
            "nomad" => BackendConfig::Nomad(read(v)?),
            "pulumi" => BackendConfig::Pulumi(read(v)?),
            "cloudformation" => BackendConfig::Cloudformation(read(v)?),
            other => {
                return Err(vec![(
                    "kind".into(),
                    format!("unknown variant `{other}`, expected one of {KINDS}"),
                )]);
            }
        };
        // A backend's own checks say "`key` …": that is the key at fault.
        cfg.validate().map_err(|msg| {
            let key = msg
                .split('`')
                .nth(1)
                .filter(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
                .unwrap_or("(table)")
                .to_string();
            vec![(key, msg)]
        })?;
        match &mut cfg {
            BackendConfig::Pi(c) => c.resolve_paths(base),
            BackendConfig::Nomad(c) => c.resolve_paths(base),
            _ => {}
        }
        Ok(cfg)
    }

    pub fn kind(&self) -> &'static str {
        match self {
            BackendConfig::Terraform(_) => "terraform",
            BackendConfig::Exec(_) => "exec",
            BackendConfig::Ansible(_) => "ansible",
            BackendConfig::Pi(_) => "pi",
            BackendConfig::Compose(_) => "compose",
            BackendConfig::Nomad(_) => "nomad",
            BackendConfig::Pulumi(_) => "pulumi",
            BackendConfig::Cloudformation(_) => "cloudformation",
        }
    }

    fn validate(&self) -> Result<(), String> {
        match self {
            BackendConfig::Terraform(c) => c.validate(),
            BackendConfig::Exec(c) => c.validate(),
            BackendConfig::Ansible(c) => c.validate(),
            BackendConfig::Pi(c) => c.validate(),
            BackendConfig::Compose(c) => c.validate(),
            BackendConfig::Nomad(c) => c.validate(),
            BackendConfig::Pulumi(c) => c.validate(),
            BackendConfig::Cloudformation(c) => c.validate(),
        }
    }

    /// The files in the repository that driftless or the backend reads or
    /// writes on the repository's behalf, by key, relative to the target's
    /// path (files found by a pattern, like Nomad's jobs, are checked where
    /// they are found).
    pub fn repo_files(&self) -> Vec<(String, String)> {
        let each = |key: &str, files: &[String]| -> Vec<(String, String)> {
            files.iter().map(|f| (key.to_string(), f.clone())).collect()
        };
        match self {
            BackendConfig::Terraform(c) => {
                let mut v = each("var_files", &c.var_files);
                v.push((
                    "(terraform's working directory)".into(),
                    ".terraform".into(),
                ));
                v.push((
                    "(driftless's init marker)".into(),
                    terraform::INIT_MARKER.into(),
                ));
                v
            }
            BackendConfig::Cloudformation(c) => {
                let mut v = vec![("template".to_string(), c.template.clone())];
                v.extend(
                    c.parameters_file
                        .iter()
                        .map(|f| ("parameters_file".to_string(), f.clone())),
                );
                v
            }
            BackendConfig::Compose(c) => {
                let mut v = each("files", &c.files);
                v.extend(each("env_files", &c.env_files));
                if c.files.is_empty() {
                    // compose's own lookup
                    for f in [
                        "compose.yaml",
                        "compose.yml",
                        "docker-compose.yml",
                        "docker-compose.yaml",
                    ] {
                        v.push(("(compose file)".into(), f.into()));
                    }
                }
                v
            }
            BackendConfig::Ansible(c) => {
                let mut v = vec![("playbook".to_string(), c.playbook.clone())];
                v.extend(
                    c.inventory
                        .iter()
                        .map(|f| ("inventory".to_string(), f.clone())),
                );
                v.extend(each("extra_vars_files", &c.extra_vars_files));
                v.extend(
                    c.destroy_playbook
                        .iter()
                        .map(|f| ("destroy_playbook".to_string(), f.clone())),
                );
                v.push((
                    "(driftless's recap file)".into(),
                    ansible::RECAP_FILE.into(),
                ));
                v
            }
            BackendConfig::Pulumi(c) => {
                let mut v = Vec::new();
                v.extend(
                    c.work_dir
                        .iter()
                        .map(|f| ("work_dir".to_string(), f.clone())),
                );
                if let Some(f) = &c.config_file {
                    let base = c.work_dir.clone().unwrap_or_default();
                    v.push((
                        "config_file".to_string(),
                        format!("{base}/{f}").trim_start_matches('/').to_string(),
                    ));
                }
                v
            }
            BackendConfig::Exec(_) | BackendConfig::Pi(_) | BackendConfig::Nomad(_) => Vec::new(),
        }
    }

    /// Every file of [`repo_files`](Self::repo_files) stays in the checkout.
    pub fn check_repo_files(&self, ctx: &Context) -> Result<(), String> {
        for (key, rel) in self.repo_files() {
            ctx.inside(&key, &rel)?;
        }
        Ok(())
    }

    /// Problems only visible on this machine (a missing binary), as
    /// `(key, message)`, for `driftless check`.
    pub fn check_environment(&self) -> Vec<(String, String)> {
        let binary = match self {
            BackendConfig::Terraform(c) => &c.binary,
            BackendConfig::Ansible(c) => &c.binary,
            BackendConfig::Pulumi(c) => &c.binary,
            BackendConfig::Exec(_) | BackendConfig::Cloudformation(_) => return vec![],
            BackendConfig::Nomad(c) => return c.check_environment(),
            BackendConfig::Compose(_) => {
                return if find_on_path("docker").is_some()
                    || find_on_path("docker-compose").is_some()
                {
                    vec![]
                } else {
                    vec![(
                        "command".into(),
                        "neither `docker` nor `docker-compose` is on the PATH".into(),
                    )]
                };
            }
            BackendConfig::Pi(c) => {
                let mut p = Vec::new();
                if find_on_path("ssh").is_none() {
                    p.push(("host".into(), "`ssh` is not on the PATH".into()));
                }
                for (key, f) in [
                    ("identity_file", &c.identity_file),
                    ("known_hosts_file", &c.known_hosts_file),
                ] {
                    if let Some(f) = f.as_ref().filter(|f| !f.is_file()) {
                        p.push((
                            key.to_string(),
                            format!("{} is not a readable file", f.display()),
                        ));
                    }
                }
                return p;
            }
        };
        match find_on_path(binary) {
            Some(_) => vec![],
            None => vec![("binary".into(), format!("`{binary}` is not on the PATH"))],
        }
    }
}

/// Build the backend for one operation: refused when a file it would read
/// or write on the repository's behalf leads out of the checkout.
pub fn build(cfg: &BackendConfig, ctx: Context) -> Result<Box<dyn Backend>, BackendError> {
    cfg.check_repo_files(&ctx).map_err(BackendError::Config)?;
    Ok(match cfg {
        BackendConfig::Terraform(c) => Box::new(terraform::Terraform::new(c.clone(), ctx)?),
        BackendConfig::Exec(c) => Box::new(exec::Exec::new(c.clone(), ctx)?),
        BackendConfig::Ansible(c) => Box::new(ansible::Ansible::new(c.clone(), ctx)?),
        BackendConfig::Pi(c) => Box::new(pi::Pi::new(c.clone(), ctx)?),
        BackendConfig::Compose(c) => Box::new(compose::Compose::new(c.clone(), ctx)?),
        BackendConfig::Nomad(c) => Box::new(nomad::Nomad::new(c.clone(), ctx)?),
        BackendConfig::Pulumi(c) => Box::new(pulumi::Pulumi::new(c.clone(), ctx)?),
        BackendConfig::Cloudformation(c) => cloudformation::build(c.clone(), ctx)?,
    })
}

/// Where `program` would be found, like `which`.
pub fn find_on_path(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return p.is_file().then_some(p);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}
