//! The `compose` backend: a Docker Compose project, v2 (`docker compose`) or
//! v1 (`docker-compose`), on the local engine or `host` (`DOCKER_HOST`,
//! including `ssh://user@host`).
//!
//! Compose has no diff, so "no change" is built here: the digest of the
//! fully rendered model (`compose config`) and the env files equals the one
//! stored at the last success *and* every service has a running container.
//! Otherwise `up -d --remove-orphans`; a service stopped or removed by hand
//! is drift, brought back and reported. This module knows nothing about git,
//! triggers or the queue.

use std::collections::BTreeSet;
use std::time::Instant;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{
    ApplyResult, Backend, BackendError, BoxFuture, Context, Outputs, Status, find_on_path,
};
use crate::process::{self, Spec};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Compose files, relative to the target's path (default: compose's own
    /// lookup, `compose.yaml` / `docker-compose.yml`).
    #[serde(default)]
    pub files: Vec<String>,
    /// The project name (default: the target's name, dots as dashes).
    pub project: Option<String>,
    #[serde(default)]
    pub env_files: Vec<String>,
    #[serde(default)]
    pub profiles: Vec<String>,
    /// `DOCKER_HOST` for the commands (e.g. `ssh://deploy@pi.lan`).
    pub host: Option<String>,
    /// `"docker compose"` (v2) or `"docker-compose"` (v1); detected when unset.
    pub command: Option<String>,
    /// `up --pull <policy>` (v2 only): `always`, `missing`, `never`.
    pub pull: Option<String>,
    /// `destroy` also removes the project's volumes.
    #[serde(default)]
    pub destroy_volumes: bool,
}

impl Config {
    pub(super) fn validate(&self) -> Result<(), String> {
        if let Some(c) = &self.command
            && c != "docker compose"
            && c != "docker-compose"
        {
            return Err(format!(
                "`command` `{c}` must be \"docker compose\" or \"docker-compose\""
            ));
        }
        if let Some(p) = &self.pull
            && !["always", "missing", "never"].contains(&p.as_str())
        {
            return Err(format!("`pull` `{p}` must be always, missing or never"));
        }
        if let Some(p) = &self.project
            && (p.is_empty()
                || !p
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_".contains(c)))
        {
            return Err(format!(
                "`project` `{p}` must be lowercase letters, digits, '-' or '_'"
            ));
        }
        for f in self.files.iter().chain(&self.env_files) {
            if f.split('/').any(|c| c == "..") {
                return Err(format!("`{f}` must be a path inside the target's path"));
            }
        }
        Ok(())
    }
}

pub struct Compose {
    cfg: Config,
    ctx: Context,
    /// The compose command as argv (`["docker", "compose"]` or `["docker-compose"]`).
    base: Vec<String>,
}

impl Compose {
    pub fn new(cfg: Config, ctx: Context) -> Result<Self, BackendError> {
        let base: Vec<String> = match cfg.command.as_deref() {
            Some("docker-compose") => vec!["docker-compose".into()],
            Some(_) => vec!["docker".into(), "compose".into()],
            None => detect(),
        };
        Ok(Compose { cfg, ctx, base })
    }

    fn project(&self) -> String {
        self.cfg
            .project
            .clone()
            .unwrap_or_else(|| self.ctx.name.replace('.', "-"))
    }

    fn spec(&self, args: &[&str], deadline: Instant) -> Spec {
        let mut argv = self.base.clone();
        argv.extend(["-p".into(), self.project()]);
        for f in &self.cfg.files {
            argv.extend(["-f".into(), f.clone()]);
        }
        for e in &self.cfg.env_files {
            argv.extend(["--env-file".into(), e.clone()]);
        }
        for p in &self.cfg.profiles {
            argv.extend(["--profile".into(), p.clone()]);
        }
        argv.extend(args.iter().map(|s| s.to_string()));
        self.raw(argv, deadline)
    }

    fn raw(&self, argv: Vec<String>, deadline: Instant) -> Spec {
        let mut spec = Spec::new(argv, &self.ctx.workdir);
        if let Some(h) = &self.cfg.host {
            spec.env.insert("DOCKER_HOST".into(), h.clone());
        }
        spec.deadline = Some(deadline);
        spec
    }

    async fn run(&self, spec: &Spec) -> Result<process::Output, String> {
        let out = process::run(spec, &self.ctx.redactor)
            .await
            .map_err(|e| self.ctx.redactor.redact(&e.to_string()))?;
        if out.success() {
            Ok(out)
        } else {
            let why = out.stderr_summary(5);
            Err(format!(
                "{}: {why}",
                process::describe_exit(spec, &out, Some(self.ctx.timeout))
            ))
        }
    }

    /// The digest of the rendered model and the env files.
    async fn digest(&self, deadline: Instant) -> Result<(String, BTreeSet<String>), String> {
        let rendered = self.run(&self.spec(&["config"], deadline)).await?;
        let services = self
            .run(&self.spec(&["config", "--services"], deadline))
            .await?;
        let mut h = Sha256::new();
        h.update(b"driftless-compose-v1\0");
        h.update(rendered.stdout.as_bytes());
        for e in &self.cfg.env_files {
            h.update(b"\0env\0");
            h.update(std::fs::read(self.ctx.workdir.join(e)).unwrap_or_default());
        }
        h.update(format!("{}|{:?}|{:?}", self.project(), self.cfg.host, self.cfg.pull).as_bytes());
        let services = services
            .stdout
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect();
        Ok((hex::encode(h.finalize()), services))
    }

    /// Services with at least one running container.
    async fn running(&self, deadline: Instant) -> Result<BTreeSet<String>, String> {
        let out = self
            .run(&self.spec(
                &["ps", "--services", "--filter", "status=running"],
                deadline,
            ))
            .await?;
        Ok(out
            .stdout
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect())
    }
}

/// `docker compose` when the v2 plugin answers, else `docker-compose`.
fn detect() -> Vec<String> {
    let v2 = std::process::Command::new("docker")
        .args(["compose", "version"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if v2 || find_on_path("docker-compose").is_none() {
        vec!["docker".into(), "compose".into()]
    } else {
        vec!["docker-compose".into()]
    }
}

impl Backend for Compose {
    fn apply(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            let deadline = Instant::now() + self.ctx.timeout;
            let (digest, services) = match self.digest(deadline).await {
                Ok(d) => d,
                Err(e) => return Status::failed(format!("compose config failed: {e}")),
            };
            let running = match self.running(deadline).await {
                Ok(r) => r,
                Err(e) => return Status::failed(format!("compose ps failed: {e}")),
            };
            let missing: Vec<&String> = services.iter().filter(|s| !running.contains(*s)).collect();
            let unchanged = self.ctx.last_digest.as_deref() == Some(digest.as_str());
            if unchanged && missing.is_empty() {
                return Status {
                    result: ApplyResult::NoChange,
                    message: format!(
                        "model unchanged and all {} service(s) running",
                        services.len()
                    ),
                    output_tail: String::new(),
                    digest: Some(digest),
                };
            }
            let mut args = vec!["up", "-d", "--remove-orphans"];
            if let Some(p) = &self.cfg.pull {
                args.extend(["--pull", p.as_str()]);
            }
            match self.run(&self.spec(&args, deadline)).await {
                Ok(out) => Status {
                    result: ApplyResult::Changed,
                    message: if unchanged {
                        format!(
                            "drift: service(s) {} were not running; brought back",
                            missing
                                .iter()
                                .map(|s| s.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    } else {
                        format!("up -d: {} service(s) converged", services.len())
                    },
                    output_tail: out.tail,
                    digest: Some(digest),
                },
                Err(e) => Status::failed(format!("compose up failed: {e}")),
            }
        })
    }

    fn destroy(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            let mut args = vec!["down", "--remove-orphans"];
            if self.cfg.destroy_volumes {
                args.push("--volumes");
            }
            match self
                .run(&self.spec(&args, Instant::now() + self.ctx.timeout))
                .await
            {
                Ok(out) => Status {
                    result: ApplyResult::Changed,
                    message: if self.cfg.destroy_volumes {
                        "project removed with its volumes".into()
                    } else {
                        "project removed (volumes kept)".into()
                    },
                    output_tail: out.tail,
                    digest: None,
                },
                Err(e) => Status::failed(format!("compose down failed: {e}")),
            }
        })
    }

    fn outputs(&self) -> BoxFuture<'_, Result<Outputs, BackendError>> {
        Box::pin(async move {
            let deadline = Instant::now() + self.ctx.timeout;
            let ids = self
                .run(&self.spec(&["ps", "-a", "-q"], deadline))
                .await
                .map_err(BackendError::Command)?;
            let ids: Vec<String> = ids.stdout.split_whitespace().map(str::to_string).collect();
            if ids.is_empty() {
                return Ok(Outputs::new());
            }
            let mut argv = vec!["docker".to_string(), "inspect".to_string()];
            argv.extend(ids);
            let out = self
                .run(&self.raw(argv, deadline))
                .await
                .map_err(BackendError::Command)?;
            let all: Vec<serde_json::Value> = serde_json::from_str(&out.stdout)
                .map_err(|e| BackendError::Command(format!("docker inspect: {e}")))?;
            let mut o = Outputs::new();
            for c in all {
                let service = c["Config"]["Labels"]["com.docker.compose.service"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                if service.is_empty() {
                    continue;
                }
                o.insert(
                    service,
                    serde_json::json!({
                        "name": c["Name"].as_str().map(|n| n.trim_start_matches('/')),
                        "state": c["State"]["Status"],
                        "image": c["Config"]["Image"],
                    }),
                );
            }
            Ok(o)
        })
    }
}
