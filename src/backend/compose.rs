//! The `compose` backend: a Docker Compose project, v2 (`docker compose`) or
//! v1 (`docker-compose`), on the local engine or `host` (`DOCKER_HOST`,
//! including `ssh://user@host`).
//!
//! Compose has no diff, so "no change" is built here: the rendered model
//! (`compose config`) and the env files, *and the target's tree* (a
//! bind-mounted file, a `configs:`/`secrets:` file or a build context can
//! change while the model does not), are what they were at the last success
//! *and* every service has a running container whose config hash label is
//! the one `config --hash` gives (not recreated by hand with other
//! settings). Otherwise `up -d
//! --remove-orphans` (with `--build` when the tree changed and a service
//! builds), then the services whose bind-mounted inputs changed are
//! recreated — compose never notices a file's new content — or all of them
//! when that cannot be told. A service stopped, removed or recreated with
//! other settings by hand is drift, brought back and reported.
//!
//! It can plan, by compose's own measure of what `up` would recreate: each
//! service's config hash (`config --hash '*'`) against the
//! `com.docker.compose.config-hash` label of its container, plus the
//! bind-mounted files that changed since the last apply, services without
//! a container (created), stopped ones (started) and containers of services
//! no longer in the model (removed). A recreation or a removal is
//! destructive. An approved plan is planned again and applied only if it is
//! the same. This module knows nothing about git, triggers or the queue.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{
    ApplyResult, Backend, BackendError, BoxFuture, Context, Outputs, Plan, PlanToApply, Status,
    find_on_path,
};
use crate::process::{self, Spec};

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "compose"`: a Docker Compose project.
pub struct Config {
    /// Compose files, relative to the target's path (default: compose's own
    /// lookup, `compose.yaml` / `docker-compose.yml`).
    #[serde(default)]
    pub files: Vec<String>,
    /// The project name (default: the target's name, dots as dashes).
    pub project: Option<String>,
    /// `--env-file`s, relative to the target's path.
    #[serde(default)]
    pub env_files: Vec<String>,
    /// `--profile`s to enable.
    #[serde(default)]
    pub profiles: Vec<String>,
    /// `DOCKER_HOST` for the commands (e.g. `ssh://deploy@pi.lan`).
    pub host: Option<String>,
    /// `"docker compose"` (v2) or `"docker-compose"` (v1); detected when unset.
    pub command: Option<String>,
    /// `up --pull <policy>` (v2 only): `always`, `missing`, `never`.
    #[schemars(extend("enum" = ["always", "missing", "never"]))]
    pub pull: Option<String>,
    /// `destroy` also removes the project's volumes. Default: false.
    #[serde(default)]
    pub destroy_volumes: bool,
}

impl super::Kind for Config {
    fn own_checks(&self) -> &'static [&'static str] {
        &["services"]
    }

    fn validate(&self) -> Vec<(String, String)> {
        let mut p: Vec<(String, String)> = Vec::new();
        if let Some(c) = &self.command
            && c != "docker compose"
            && c != "docker-compose"
        {
            p.push((
                "command".into(),
                format!("`command` `{c}` must be \"docker compose\" or \"docker-compose\""),
            ));
        }
        if let Some(v) = &self.pull
            && !["always", "missing", "never"].contains(&v.as_str())
        {
            p.push((
                "pull".into(),
                format!("`pull` `{v}` must be always, missing or never"),
            ));
        }
        if let Some(v) = &self.project
            && (v.is_empty()
                || !v
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_".contains(c)))
        {
            p.push((
                "project".into(),
                format!("`project` `{v}` must be lowercase letters, digits, '-' or '_'"),
            ));
        }
        for (key, list) in [("files", &self.files), ("env_files", &self.env_files)] {
            for f in list {
                if f.split('/').any(|c| c == "..") {
                    p.push((
                        key.into(),
                        format!("`{key}` entry `{f}` must be a path inside the target's path"),
                    ));
                }
            }
        }
        p
    }

    fn repo_files(&self) -> Vec<(String, String)> {
        let mut v = super::keyed("files", &self.files);
        v.extend(super::keyed("env_files", &self.env_files));
        if self.files.is_empty() {
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

    fn check_environment(&self) -> Vec<(String, String)> {
        if super::find_on_path("docker").is_some()
            || super::find_on_path("docker-compose").is_some()
        {
            vec![]
        } else {
            vec![(
                "command".into(),
                "neither `docker` nor `docker-compose` is on the PATH".into(),
            )]
        }
    }

    fn build(&self, ctx: Context) -> Result<Box<dyn super::Backend>, BackendError> {
        Ok(Box::new(Compose::new(self.clone(), ctx)?))
    }

    fn can_plan(&self) -> bool {
        true
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
        // Other targets' outputs (`inputs`), for interpolation.
        spec.env.extend(self.ctx.inputs.clone());
        if let Some(h) = &self.cfg.host {
            spec.env.insert("DOCKER_HOST".into(), h.clone());
        }
        spec.deadline = Some(deadline);
        spec
    }

    async fn run(&self, spec: &Spec) -> Result<process::Output, String> {
        let out = super::tool::run(spec, &self.ctx.redactor).await?;
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

    /// The digest of the rendered model and the env files, the services,
    /// and whether any service is built from a context.
    async fn digest(&self, deadline: Instant) -> Result<(String, BTreeSet<String>, bool), String> {
        let rendered = self.run(&self.spec(&["config"], deadline)).await?;
        let builds = rendered
            .stdout
            .lines()
            .any(|l| l.trim_start().starts_with("build:"));
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
        Ok((hex::encode(h.finalize()), services, builds))
    }

    /// Per service, the content hash of every bind-mounted file or
    /// directory from the checkout (compose mounts `configs:` and `secrets:`
    /// files that way too), read from the project's containers: the paths
    /// relative to the checkout.
    async fn inputs(&self, deadline: Instant) -> Result<Inputs, String> {
        let all = self.containers(deadline).await?;
        let mut out = Inputs::new();
        let root = self
            .ctx
            .checkout
            .canonicalize()
            .unwrap_or_else(|_| self.ctx.checkout.clone());
        for c in all {
            let Some(service) = c["Config"]["Labels"]["com.docker.compose.service"].as_str() else {
                continue;
            };
            let entry = out.entry(service.to_string()).or_default();
            for m in c["Mounts"].as_array().into_iter().flatten() {
                if m["Type"] != "bind" {
                    continue;
                }
                let Some(source) = m["Source"].as_str() else {
                    continue;
                };
                let source = Path::new(source);
                let source = source
                    .canonicalize()
                    .unwrap_or_else(|_| source.to_path_buf());
                let Ok(rel) = source.strip_prefix(&root) else {
                    continue;
                };
                entry.insert(rel.display().to_string(), content_hash(&source));
            }
        }
        Ok(out)
    }

    /// `services = true`: every service of the project has containers,
    /// each running (or a one-shot that exited 0 and is not restarted),
    /// and healthy where a HEALTHCHECK (the image's or the service's)
    /// says, as dockerd reports it. `Err` names each container that is not.
    async fn services_health(&self) -> Result<(), String> {
        let deadline = Instant::now() + self.ctx.timeout.min(std::time::Duration::from_secs(60));
        // Both start docker-compose (~0.8 s each here): side by side.
        let services = self.spec(&["config", "--services"], deadline);
        let (listed, all) = tokio::try_join!(self.run(&services), self.containers(deadline))?;
        let mut bad = Vec::new();
        for service in listed
            .stdout
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
        {
            let mine: Vec<&serde_json::Value> = all
                .iter()
                .filter(|c| c["Config"]["Labels"]["com.docker.compose.service"] == service)
                .collect();
            if mine.is_empty() {
                bad.push(format!("service {service} has no container"));
            }
            for c in mine {
                let name = c["Name"]
                    .as_str()
                    .unwrap_or(service)
                    .trim_start_matches('/');
                let state = c["State"]["Status"].as_str().unwrap_or("unknown");
                let health = c["State"]["Health"]["Status"].as_str();
                let one_shot = state == "exited"
                    && c["State"]["ExitCode"] == 0
                    && matches!(
                        c["HostConfig"]["RestartPolicy"]["Name"].as_str(),
                        None | Some("" | "no")
                    );
                match (state, health) {
                    ("running", None | Some("healthy")) => {}
                    _ if one_shot => {}
                    ("running", Some(h)) => bad.push(format!("{name} is {h}")),
                    ("exited", _) => bad.push(format!(
                        "{name} exited with code {}",
                        c["State"]["ExitCode"]
                    )),
                    (s, _) => bad.push(format!("{name} is {s}")),
                }
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(self.ctx.redactor.redact(&bad.join("; ")))
        }
    }

    /// `docker inspect` of every container of the project (none: empty).
    async fn containers(&self, deadline: Instant) -> Result<Vec<serde_json::Value>, String> {
        let ids = self.run(&self.spec(&["ps", "-a", "-q"], deadline)).await?;
        let ids: Vec<String> = ids.stdout.split_whitespace().map(str::to_string).collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut argv = vec!["docker".to_string(), "inspect".to_string()];
        argv.extend(ids);
        let inspected = self.run(&self.raw(argv, deadline)).await?;
        serde_json::from_str(&inspected.stdout)
            .map_err(|e| format!("docker inspect printed no JSON: {e}"))
    }

    /// Per service, compose's hash of its configuration (`config --hash`),
    /// the value compose labels its containers with.
    async fn config_hashes(&self, deadline: Instant) -> Result<BTreeMap<String, String>, String> {
        let out = self
            .run(&self.spec(&["config", "--hash", "*"], deadline))
            .await?;
        Ok(out
            .stdout
            .lines()
            .filter_map(|l| {
                let (svc, hash) = l.trim().split_once(char::is_whitespace)?;
                Some((svc.to_string(), hash.trim().to_string()))
            })
            .collect())
    }

    /// Per service with a container, the config hash its container carries.
    async fn container_hashes(
        &self,
        deadline: Instant,
    ) -> Result<BTreeMap<String, String>, String> {
        let mut out = BTreeMap::new();
        for c in self.containers(deadline).await? {
            let labels = &c["Config"]["Labels"];
            if let Some(svc) = labels["com.docker.compose.service"].as_str() {
                let hash = labels["com.docker.compose.config-hash"]
                    .as_str()
                    .unwrap_or("");
                out.insert(svc.to_string(), hash.to_string());
            }
        }
        Ok(out)
    }

    /// Services whose container carries another config hash than git's
    /// model gives them (recreated by hand with other settings): `up`
    /// recreates them, so a stored digest that says nothing changed must
    /// not skip it.
    async fn hand_changed(&self, deadline: Instant) -> Result<Vec<String>, String> {
        let wanted = self.config_hashes(deadline).await?;
        let have = self.container_hashes(deadline).await?;
        Ok(have
            .into_iter()
            .filter(|(svc, h)| wanted.get(svc).is_some_and(|w| w != h))
            .map(|(svc, _)| svc)
            .collect())
    }

    /// What `up` would do now, by service.
    async fn plan_inner(&self) -> Result<Plan, String> {
        let deadline = Instant::now() + self.ctx.timeout;
        let (model, services, builds) = self
            .digest(deadline)
            .await
            .map_err(|e| format!("compose config failed: {e}"))?;
        let wanted = self.config_hashes(deadline).await?;
        let have = self.container_hashes(deadline).await?;
        let running = self.running(deadline).await?;
        let inputs = self.inputs(deadline).await?;
        let prev: Option<Applied> = self
            .ctx
            .last_digest
            .as_deref()
            .and_then(|d| serde_json::from_str(d).ok());
        let tree_changed = prev
            .as_ref()
            .is_none_or(|p| p.tree != self.ctx.source_digest);
        let mut lines = Vec::new();
        let (mut add, mut change, mut destroy) = (0, 0, 0);
        for svc in &services {
            let files_changed: Vec<&String> = match &prev {
                Some(p) => inputs
                    .get(svc)
                    .into_iter()
                    .flatten()
                    .filter(|(f, h)| p.inputs.get(svc).and_then(|w| w.get(*f)) != Some(h))
                    .map(|(f, _)| f)
                    .collect(),
                None => Vec::new(),
            };
            let line = match (have.get(svc), wanted.get(svc)) {
                (None, _) => {
                    add += 1;
                    format!("+ {svc} (create)")
                }
                (Some(h), Some(w)) if h != w => {
                    add += 1;
                    destroy += 1;
                    format!("-/+ {svc} (recreate: its configuration changed)")
                }
                _ if !files_changed.is_empty() => {
                    add += 1;
                    destroy += 1;
                    let files: Vec<&str> = files_changed.iter().map(|f| f.as_str()).collect();
                    format!("-/+ {svc} (recreate: {} changed)", files.join(", "))
                }
                _ if !running.contains(svc) => {
                    change += 1;
                    format!("~ {svc} (start: not running)")
                }
                _ => continue,
            };
            lines.push(line);
        }
        if builds && tree_changed && have.keys().any(|s| services.contains(s)) {
            change += 1;
            lines.push(
                "-/+ services built from the checkout (rebuilt, recreated if their image changed)"
                    .into(),
            );
            destroy += 1;
        }
        for svc in have.keys().filter(|s| !services.contains(*s)) {
            destroy += 1;
            lines.push(format!("- {svc} (remove: no longer in the model)"));
        }
        let mut h = Sha256::new();
        h.update(b"driftless-compose-plan-v1\0");
        h.update(model.as_bytes());
        for (svc, hash) in &wanted {
            h.update(format!("\0{svc}={hash}").as_bytes());
        }
        for l in &lines {
            h.update(b"\0");
            h.update(l.as_bytes());
        }
        let plan = Plan::of_lines(
            &lines,
            (add, change, destroy),
            destroy > 0,
            hex::encode(h.finalize()),
            &self.ctx.redactor,
        );
        let items = if plan.changes {
            self.plan_items(&plan.diff, &services, deadline).await?
        } else {
            Vec::new()
        };
        Ok(Plan { items, ..plan })
    }

    /// The plan's lines in the normal form a policy reads: a service's
    /// line carries the service as compose's model gives it (`config`,
    /// redacted) as `after`.
    async fn plan_items(
        &self,
        diff: &str,
        services: &BTreeSet<String>,
        deadline: Instant,
    ) -> Result<Vec<crate::plan::Change>, String> {
        // YAML, as v1 and v2 both print it.
        let out = self
            .run(&self.spec(&["config"], deadline))
            .await
            .map_err(|e| format!("compose config failed: {e}"))?;
        let model = crate::plan::yaml_to_json(&out.stdout)
            .map_err(|e| format!("`compose config` printed a model that does not read: {e}"))?;
        let mut items = crate::plan::changes_of_diff(diff);
        for c in &mut items {
            if services.contains(&c.address) || c.action == crate::plan::Action::Delete {
                c.kind = "compose_service".into();
            }
            if services.contains(&c.address) {
                c.after = model["services"][c.address.as_str()].clone();
                mask_environment(&mut c.after);
                crate::plan::redact_json(&mut c.after, &self.ctx.redactor);
            }
        }
        Ok(items)
    }

    /// Converge the project. `force` (an approved plan said something
    /// changes): `up` runs even when the stored digest says nothing did —
    /// the plan read the containers, the digest only remembers them.
    async fn converge(&self, force: bool) -> Status {
        let deadline = Instant::now() + self.ctx.timeout;
        let (model, services, builds) = match self.digest(deadline).await {
            Ok(d) => d,
            Err(e) => return Status::failed(format!("compose config failed: {e}")),
        };
        let running = match self.running(deadline).await {
            Ok(r) => r,
            Err(e) => return Status::failed(format!("compose ps failed: {e}")),
        };
        let before = match self.inputs(deadline).await {
            Ok(i) => i,
            Err(e) => {
                return Status::failed(format!("reading the containers' mounts failed: {e}"));
            }
        };
        let missing: Vec<&String> = services.iter().filter(|s| !running.contains(*s)).collect();
        let hand_changed = match self.hand_changed(deadline).await {
            Ok(h) => h,
            Err(e) => {
                return Status::failed(format!(
                    "reading the containers' configuration hashes failed: {e}"
                ));
            }
        };
        let last = self.ctx.last_digest.as_deref();
        let prev: Option<Applied> = last.and_then(|d| serde_json::from_str(d).ok());
        let tree = self.ctx.source_digest.clone();
        let now = Applied {
            model: model.clone(),
            tree: tree.clone(),
            inputs: before.clone(),
        };
        if !force && prev.as_ref() == Some(&now) && missing.is_empty() && hand_changed.is_empty() {
            return Status {
                result: ApplyResult::NoChange,
                message: format!(
                    "model and files unchanged and all {} service(s) running",
                    services.len()
                ),
                output_tail: String::new(),
                digest: Some(now.to_digest()),
            };
        }
        // Which services' bind-mounted inputs changed since the last
        // apply; all of those with inputs when the last apply's are not
        // known (a digest from an older driftless).
        let (recreate, why) = to_recreate(prev.as_ref(), last, &before);
        let tree_changed = prev.as_ref().is_none_or(|p| p.tree != tree);
        // Only files no service mounts or builds from changed.
        if !force
            && prev.as_ref().is_some_and(|p| p.model == model)
            && recreate.is_empty()
            && missing.is_empty()
            && hand_changed.is_empty()
            && !builds
        {
            return Status {
                result: ApplyResult::NoChange,
                message: format!(
                    "model unchanged, no file a service mounts changed, all {} service(s) running",
                    services.len()
                ),
                output_tail: String::new(),
                digest: Some(now.to_digest()),
            };
        }
        let tail = match self.up(builds && tree_changed, &recreate, deadline).await {
            Ok(tail) => tail,
            Err(e) => return Status::failed(e),
        };
        // What the containers mount now (a new service has new ones).
        let after = match self.inputs(deadline).await {
            Ok(i) => i,
            Err(e) => {
                return Status::failed(format!("reading the containers' mounts failed: {e}"));
            }
        };
        let unchanged = prev
            .as_ref()
            .is_some_and(|p| p.model == model && p.tree == tree);
        let mut drift = Vec::new();
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
            drift.push(format!("service(s) {} were not running", names.join(", ")));
        }
        if !hand_changed.is_empty() {
            drift.push(format!(
                "service(s) {} had another configuration than git's",
                hand_changed.join(", ")
            ));
        }
        let mut message = if unchanged && !drift.is_empty() {
            format!("drift: {}; brought back", drift.join(", "))
        } else {
            format!("up -d: {} service(s) converged", services.len())
        };
        if builds && tree_changed {
            message.push_str("; images rebuilt where their context changed");
        }
        if !recreate.is_empty() {
            message.push_str(&format!("; recreated {}: {why}", recreate.join(", ")));
        }
        Status {
            result: ApplyResult::Changed,
            message,
            output_tail: crate::redact::tail(&tail, process::TAIL_BYTES),
            digest: Some(
                Applied {
                    model,
                    tree,
                    inputs: after,
                }
                .to_digest(),
            ),
        }
    }

    /// `up -d --remove-orphans` (with `--build` when `build`, and the
    /// configured `--pull`), then a forced recreate of `recreate`, whose
    /// bind-mounted inputs changed. The output's tail, or what failed.
    async fn up(
        &self,
        build: bool,
        recreate: &[String],
        deadline: Instant,
    ) -> Result<String, String> {
        let mut args = vec!["up", "-d", "--remove-orphans"];
        if build {
            args.push("--build");
        }
        if let Some(p) = &self.cfg.pull {
            args.extend(["--pull", p.as_str()]);
        }
        let mut tail = String::new();
        match self.run(&self.spec(&args, deadline).shown()).await {
            Ok(out) => tail.push_str(&out.tail),
            Err(e) => return Err(format!("compose up failed: {e}")),
        }
        if !recreate.is_empty() {
            let mut args = vec!["up", "-d", "--no-deps", "--force-recreate"];
            args.extend(recreate.iter().map(String::as_str));
            match self.run(&self.spec(&args, deadline).shown()).await {
                Ok(out) => tail.push_str(&out.tail),
                Err(e) => {
                    return Err(format!(
                        "compose up --force-recreate {} failed: {e}",
                        recreate.join(" ")
                    ));
                }
            }
        }
        Ok(tail)
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

/// Per service: bind-mounted path (relative to the checkout) → content hash.
type Inputs = BTreeMap<String, BTreeMap<String, String>>;

/// Which services' bind-mounted inputs changed since the last apply
/// (`prev`), and why in words; all of those with inputs when the last
/// apply's are not known (a digest `last` from an older driftless).
fn to_recreate(
    prev: Option<&Applied>,
    last: Option<&str>,
    before: &Inputs,
) -> (Vec<String>, String) {
    match (prev, last) {
        (Some(p), _) => {
            let mut names = Vec::new();
            let mut files = BTreeSet::new();
            for (svc, now_files) in before {
                let was = p.inputs.get(svc);
                let changed: Vec<&String> = now_files
                    .iter()
                    .filter(|(f, h)| was.and_then(|w| w.get(*f)) != Some(h))
                    .map(|(f, _)| f)
                    .collect();
                if !changed.is_empty() {
                    names.push(svc.clone());
                    files.extend(changed.into_iter().cloned());
                }
            }
            let why = files.into_iter().collect::<Vec<_>>().join(", ");
            (names, format!("{why} changed"))
        }
        // A digest stored by an older driftless (not this JSON).
        (None, Some(_)) => (
            before
                .iter()
                .filter(|(_, f)| !f.is_empty())
                .map(|(s, _)| s.clone())
                .collect(),
            "the files of the previous apply are not known".to_string(),
        ),
        _ => (Vec::new(), String::new()),
    }
}

/// What an apply leaves behind for the next one to compare with (stored as
/// the target's digest, JSON).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Applied {
    model: String,
    tree: String,
    inputs: Inputs,
}

impl Applied {
    fn to_digest(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A file's bytes, or a directory's names and bytes (recursively, sorted),
/// or a symlink's target, hashed.
fn content_hash(path: &Path) -> String {
    fn walk(h: &mut Sha256, path: &Path) {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                h.update(b"\0link\0");
                if let Ok(t) = std::fs::read_link(path) {
                    h.update(t.to_string_lossy().as_bytes());
                }
            }
            Ok(m) if m.is_dir() => {
                let mut names: Vec<_> = std::fs::read_dir(path)
                    .map(|d| d.flatten().map(|e| e.file_name()).collect())
                    .unwrap_or_default();
                names.sort();
                for n in names {
                    if n == ".git" {
                        continue;
                    }
                    h.update(b"\0entry\0");
                    h.update(n.to_string_lossy().as_bytes());
                    walk(h, &path.join(&n));
                }
            }
            Ok(_) => {
                h.update(b"\0file\0");
                h.update(std::fs::read(path).unwrap_or_default());
            }
            Err(_) => h.update(b"\0missing\0"),
        }
    }
    let mut h = Sha256::new();
    walk(&mut h, path);
    hex::encode(h.finalize())
}

/// A service as compose's model gives it, with the values of its
/// `environment` and its build's `args` masked (their names kept): either
/// may carry a secret the redactor was never told of, as Nomad's `Env`
/// may. The map form `config` prints and the `KEY=value` list form alike.
fn mask_environment(service: &mut serde_json::Value) {
    use serde_json::Value;
    let mask = |v: &mut Value| match v {
        Value::Object(m) => m.values_mut().for_each(crate::plan::mask_values),
        Value::Array(a) => {
            for item in a {
                if let Some((k, _)) = item.as_str().and_then(|s| s.split_once('=')) {
                    *item = Value::String(format!("{k}={}", crate::redact::MASK));
                }
            }
        }
        _ => {}
    };
    if let Some(env) = service.get_mut("environment") {
        mask(env);
    }
    if let Some(args) = service.get_mut("build").and_then(|b| b.get_mut("args")) {
        mask(args);
    }
}

impl Backend for Compose {
    fn apply(&self) -> BoxFuture<'_, Status> {
        Box::pin(self.converge(false))
    }

    fn health<'a>(
        &'a self,
        check: &'a crate::health::OwnCheck,
    ) -> Option<BoxFuture<'a, Result<(), String>>> {
        match check {
            crate::health::OwnCheck::Services => Some(Box::pin(self.services_health())),
            crate::health::OwnCheck::OnHost(_) => None,
        }
    }

    fn plan(&self) -> Option<BoxFuture<'_, Result<Plan, String>>> {
        Some(Box::pin(self.plan_inner()))
    }

    fn apply_plan<'a>(&'a self, plan: &'a PlanToApply) -> Option<BoxFuture<'a, Status>> {
        Some(Box::pin(async move {
            super::apply_if_unchanged(plan, self.plan_inner().await, self.converge(true)).await
        }))
    }

    fn destroy(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            let mut args = vec!["down", "--remove-orphans"];
            if self.cfg.destroy_volumes {
                args.push("--volumes");
            }
            match self
                .run(&self.spec(&args, Instant::now() + self.ctx.timeout).shown())
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
            let all = self
                .containers(deadline)
                .await
                .map_err(BackendError::Command)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_services_environment_and_build_args_are_masked_names_kept() {
        let mut svc = serde_json::json!({
            "image": "busybox:1",
            "environment": {"DB_URL": "postgres://u:hunter2@db/x", "EMPTY": "", "UNSET": null},
            "build": {"context": ".", "args": ["TOKEN=abc123", "PLAIN"]},
        });
        mask_environment(&mut svc);
        assert_eq!(
            svc,
            serde_json::json!({
                "image": "busybox:1",
                "environment": {"DB_URL": "[REDACTED]", "EMPTY": "", "UNSET": null},
                "build": {"context": ".", "args": ["TOKEN=[REDACTED]", "PLAIN"]},
            })
        );
    }
}
