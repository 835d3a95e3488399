//! The `pi` backend: an SSH host (a Raspberry Pi on the LAN, say).
//!
//! `apply` skips when the digest of the target's files and settings is
//! unchanged; otherwise it ships the exact tree the controller checked out
//! to `remote_dir` (a tar stream over ssh, swapped in whole so files deleted
//! in git disappear), then runs the action: `docker compose up -d
//! --remove-orphans` in `remote_dir`, `systemctl restart` of `units`, or
//! `command`. Host keys are always checked (`StrictHostKeyChecking=yes`,
//! `BatchMode=yes`). Every part of a remote shell command is quoted; nothing
//! from a payload reaches it.
//!
//! With a `plan` argv it can plan: the new tree is shipped beside the live
//! one (`<remote_dir>.driftless-plan`, `.driftless-preview` for a pull
//! request's preview, removed afterwards) and the argv runs
//! there on the host with `DRIFTLESS_LIVE_DIR` naming `remote_dir`; its
//! stdout is the plan, as exec's (`tool::line_plan`). An approved plan is
//! planned again and deployed only if it is the same. This module knows
//! nothing about git or triggers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{
    ApplyResult, Backend, BackendError, BoxFuture, Context, Outputs, Plan, PlanToApply, Status,
};
use crate::process::{self, Spec};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
/// What deploying the tree does on the host.
pub enum Action {
    Compose,
    Systemd,
    Command,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "pi"`: a host over SSH (a Raspberry Pi): the target's tree
/// copied there, then compose, systemd units or a command.
pub struct Config {
    /// The host's name or address.
    pub host: String,
    /// The SSH port. Default: 22.
    pub port: Option<u16>,
    /// The user logged in as.
    pub user: String,
    /// The private key. Default: ssh's own.
    pub identity_file: Option<PathBuf>,
    /// Host keys are always checked; without this file, the user's own
    /// known_hosts is used.
    pub known_hosts_file: Option<PathBuf>,
    /// An absolute directory on the host that receives the target's tree.
    pub remote_dir: String,
    /// `compose`: `docker compose up` in `remote_dir`; `systemd`: restart
    /// `units`; `command`: run `command`.
    pub action: Action,
    /// `systemd`: the units to restart.
    #[serde(default)]
    pub units: Vec<String>,
    /// `command`: the argv run in `remote_dir`.
    pub command: Option<Vec<String>>,
    /// `command`: argv printing a JSON object, for `outputs`.
    pub outputs: Option<Vec<String>>,
    /// `command`: argv run by `destroy`.
    pub destroy: Option<Vec<String>>,
    /// Any action: argv run on the host in a copy of the new tree, printing
    /// what deploying it would change (see the module doc).
    pub plan: Option<Vec<String>>,
    /// Prefix `systemctl` and `docker compose` with `sudo -n`. Default:
    /// false.
    #[serde(default)]
    pub sudo: bool,
    /// How compose is invoked on the host. Default: ["docker", "compose"].
    #[serde(default = "default_compose")]
    pub compose_command: Vec<String>,
}

fn default_compose() -> Vec<String> {
    vec!["docker".into(), "compose".into()]
}

impl super::Kind for Config {
    fn validate(&self) -> Vec<(String, String)> {
        let mut p: Vec<(String, String)> = Vec::new();
        if self.host.trim().is_empty() || self.host.starts_with('-') {
            p.push(("host".into(), "`host` must name the host".into()));
        }
        if self.user.trim().is_empty() || self.user.starts_with('-') {
            p.push(("user".into(), "`user` must name the remote user".into()));
        }
        if !self.remote_dir.starts_with('/') || self.remote_dir.trim_end_matches('/').is_empty() {
            p.push((
                "remote_dir".into(),
                format!(
                    "`remote_dir` `{}` must be an absolute directory other than /",
                    self.remote_dir
                ),
            ));
        }
        if self
            .plan
            .as_ref()
            .is_some_and(|a| a.first().is_none_or(|x| x.trim().is_empty()))
        {
            p.push((
                "plan".into(),
                "`plan` must be a non-empty argv list such as [\"./plan.sh\"]".into(),
            ));
        }
        match self.action {
            Action::Systemd if self.units.is_empty() => {
                p.push(("units".into(), "action `systemd` needs `units`".into()));
            }
            Action::Command if self.command.as_ref().is_none_or(|c| c.is_empty()) => {
                p.push((
                    "command".into(),
                    "action `command` needs `command` (an argv list)".into(),
                ));
            }
            _ => {}
        }
        p
    }

    fn check_environment(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        if super::find_on_path("ssh").is_none() {
            p.push(("host".into(), "`ssh` is not on the PATH".into()));
        }
        for (key, f) in [
            ("identity_file", &self.identity_file),
            ("known_hosts_file", &self.known_hosts_file),
        ] {
            if let Some(f) = f.as_ref().filter(|f| !f.is_file()) {
                p.push((
                    key.to_string(),
                    format!("{} is not a readable file", f.display()),
                ));
            }
        }
        p
    }

    fn can_plan(&self) -> bool {
        self.plan.is_some()
    }

    fn own_checks(&self) -> &'static [&'static str] {
        &["on_host"]
    }

    fn arms_watchdog(&self) -> bool {
        true
    }

    fn build(&self, ctx: Context) -> Result<Box<dyn super::Backend>, BackendError> {
        Ok(Box::new(Pi::new(self.clone(), ctx)?))
    }

    /// Relative key and known_hosts paths are relative to the config file.
    fn resolve_paths(&mut self, base: &Path) {
        for p in [&mut self.identity_file, &mut self.known_hosts_file]
            .into_iter()
            .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }
}

/// Quote for a POSIX shell.
fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

pub struct Pi {
    cfg: Config,
    ctx: Context,
}

impl Pi {
    pub fn new(cfg: Config, ctx: Context) -> Result<Self, BackendError> {
        Ok(Pi { cfg, ctx })
    }

    fn dest(&self) -> String {
        format!(
            "{}@{}:{}",
            self.cfg.user,
            self.cfg.host,
            self.cfg.port.unwrap_or(22)
        )
    }

    fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"driftless-pi-v1\0");
        h.update(self.ctx.source_digest.as_bytes());
        h.update(format!("{:?}", self.cfg).as_bytes());
        hex::encode(h.finalize())
    }

    fn sudo(&self) -> &'static str {
        if self.cfg.sudo { "sudo -n " } else { "" }
    }

    /// `ssh … user@host -- <remote>`, with host keys checked.
    fn ssh(&self, remote: &str, deadline: Instant, stdin: Option<Arc<Vec<u8>>>) -> Spec {
        let mut argv: Vec<String> = vec![
            "ssh".into(),
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            "StrictHostKeyChecking=yes".into(),
            "-o".into(),
            "ConnectTimeout=20".into(),
            "-p".into(),
            self.cfg.port.unwrap_or(22).to_string(),
        ];
        if let Some(k) = &self.cfg.identity_file {
            argv.extend([
                "-o".into(),
                "IdentitiesOnly=yes".into(),
                "-i".into(),
                k.display().to_string(),
            ]);
        }
        if let Some(kh) = &self.cfg.known_hosts_file {
            argv.extend(["-o".into(), format!("UserKnownHostsFile={}", kh.display())]);
        }
        argv.extend([
            "-l".into(),
            self.cfg.user.clone(),
            self.cfg.host.clone(),
            "--".into(),
            remote.into(),
        ]);
        let mut spec = Spec::new(argv, &self.ctx.workdir);
        spec.deadline = Some(deadline);
        spec.stdin = stdin;
        spec
    }

    async fn run(&self, spec: &Spec) -> Result<process::Output, String> {
        let out = super::tool::run(spec, &self.ctx.redactor).await?;
        if out.success() {
            return Ok(out);
        }
        let said = out.stderr_summary(5);
        let what = if out.timed_out {
            format!(
                "timed out after {}",
                humantime::format_duration(self.ctx.timeout)
            )
        } else if out.code == Some(255) {
            format!("ssh to {} failed", self.dest())
        } else {
            format!(
                "the remote command on {} exited with {}",
                self.dest(),
                out.code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "a signal".into())
            )
        };
        Err(if said.is_empty() {
            what
        } else {
            format!("{what}: {said}")
        })
    }

    /// The target's tree (without `.git`) as a tar stream.
    fn archive(&self) -> Result<Vec<u8>, String> {
        let mut b = tar::Builder::new(Vec::new());
        b.follow_symlinks(false);
        b.mode(tar::HeaderMode::Deterministic);
        fn walk(b: &mut tar::Builder<Vec<u8>>, root: &Path, dir: &Path) -> std::io::Result<()> {
            let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
            entries.sort_by_key(|e| e.file_name());
            for e in entries {
                let path = e.path();
                if e.file_name() == ".git" {
                    continue;
                }
                let rel = path.strip_prefix(root).unwrap_or(&path);
                let ft = e.file_type()?;
                b.append_path_with_name(&path, rel)?;
                if ft.is_dir() {
                    walk(b, root, &path)?;
                }
            }
            Ok(())
        }
        walk(&mut b, &self.ctx.workdir, &self.ctx.workdir)
            .and_then(|()| b.into_inner())
            .map_err(|e| format!("cannot pack {}: {e}", self.ctx.workdir.display()))
    }

    fn action_command(&self) -> String {
        let dir = q(&self.cfg.remote_dir);
        match self.cfg.action {
            Action::Compose => format!(
                "cd {dir} && {}{} up -d --remove-orphans",
                self.runner(true),
                argv_string(&self.cfg.compose_command)
            ),
            Action::Systemd => format!(
                "{}systemctl restart {}",
                self.sudo(),
                argv_string(&self.cfg.units)
            ),
            Action::Command => format!(
                "cd {dir} && {}{}",
                self.runner(false),
                argv_string(self.cfg.command.as_deref().unwrap_or_default())
            ),
        }
    }

    /// What runs a command that takes the target's `inputs`: with none,
    /// `sudo -n ` (when `sudo` and `elevated`) or nothing; with some, a
    /// shell (under sudo, when elevated) that first reads `export NAME='…'`
    /// lines from its stdin ([`Pi::inputs_script`]) and then execs the
    /// command — so the values reach it even through sudo, which resets
    /// the environment, and never stand on a command line the host's
    /// process list shows.
    fn runner(&self, elevated: bool) -> String {
        let sudo = if elevated { self.sudo() } else { "" };
        if self.ctx.inputs.is_empty() {
            sudo.to_string()
        } else {
            format!("{sudo}sh -c {} sh ", q("eval \"$(cat)\" && exec \"$@\""))
        }
    }

    /// The target's `inputs` as shell assignments, for the stdin of a
    /// command [`Pi::runner`] runs; `None` without inputs.
    fn inputs_script(&self) -> Option<Arc<Vec<u8>>> {
        if self.ctx.inputs.is_empty() {
            return None;
        }
        let mut s = String::new();
        for (name, value) in &self.ctx.inputs {
            s.push_str(&format!("export {name}={}\n", q(value)));
        }
        Some(Arc::new(s.into_bytes()))
    }
}

/// Kill a watchdog's process group, if one is armed (`$d` set).
const DISARM: &str = "if [ -f \"$d.driftless-watchdog.pid\" ]; then \
     kill -- -\"$(cat \"$d.driftless-watchdog.pid\")\" 2>/dev/null || true; \
     rm -f \"$d.driftless-watchdog.pid\"; fi";

fn argv_string(argv: &[String]) -> String {
    argv.iter().map(|a| q(a)).collect::<Vec<_>>().join(" ")
}

impl Pi {
    /// Ship the tree and run the action (no digest check).
    async fn deploy(&self) -> Status {
        let digest = self.digest();
        let deadline = Instant::now() + self.ctx.timeout;
        let tar = match self.archive() {
            Ok(t) => t,
            Err(e) => return Status::failed(e),
        };
        // Unpack beside the directory, then swap it in whole; under a
        // watchdog the tree before stays beside it until confirmed.
        let ship = match self.ctx.confirm_within {
            None => format!(
                "set -e; d={d}; rm -rf \"$d.driftless-new\"; mkdir -p \"$d.driftless-new\"; \
                 tar -x -f - -C \"$d.driftless-new\"; \
                 if [ -e \"$d\" ]; then rm -rf \"$d.driftless-old\"; mv \"$d\" \"$d.driftless-old\"; fi; \
                 mv \"$d.driftless-new\" \"$d\"; rm -rf \"$d.driftless-old\"",
                d = q(self.cfg.remote_dir.trim_end_matches('/'))
            ),
            Some(within) => self.ship_under_watchdog(within),
        };
        let mut tail = String::new();
        match self
            .run(&self.ssh(&ship, deadline, Some(Arc::new(tar))).shown())
            .await
        {
            Ok(out) => tail.push_str(&out.tail),
            Err(e) => {
                return Status::failed(format!(
                    "shipping the tree to {}: {e}",
                    self.cfg.remote_dir
                ));
            }
        }
        let stdin = match self.cfg.action {
            Action::Systemd => None,
            _ => self.inputs_script(),
        };
        match self
            .run(&self.ssh(&self.action_command(), deadline, stdin).shown())
            .await
        {
            Ok(out) => {
                tail.push_str(&out.tail);
                Status {
                    result: ApplyResult::Changed,
                    message: format!(
                        "shipped to {}:{} and ran the {:?} action",
                        self.cfg.host, self.cfg.remote_dir, self.cfg.action
                    )
                    .to_lowercase(),
                    output_tail: crate::redact::tail(&tail, process::TAIL_BYTES),
                    digest: Some(digest),
                }
            }
            Err(e) => Status {
                result: ApplyResult::Failed,
                message: e,
                output_tail: crate::redact::tail(&tail, process::TAIL_BYTES),
                digest: None,
            },
        }
    }

    /// The ship script under a watchdog (`confirm_within`): a watchdog
    /// left by an earlier change is disarmed; the tree before is kept as
    /// `<remote_dir>.driftless-prev`; then a detached process of its own
    /// session (`setsid`), its id in `<remote_dir>.driftless-watchdog.pid`,
    /// waits `within` and, unless [`Backend::confirm`] killed it first,
    /// puts the tree before back (the new one moves to
    /// `.driftless-undone`) and runs the action again there — without the
    /// target's inputs, which are never written on the host.
    fn ship_under_watchdog(&self, within: std::time::Duration) -> String {
        let undo = format!(
            "sleep {secs}; d=\"$0\"; if [ -d \"$d.driftless-prev\" ]; then \
             rm -rf \"$d.driftless-undone\"; mv \"$d\" \"$d.driftless-undone\"; \
             mv \"$d.driftless-prev\" \"$d\"; {action}; fi; rm -f \"$d.driftless-watchdog.pid\"",
            secs = within.as_secs().max(1),
            action = self.action_command(),
        );
        format!(
            "set -e; d={d}; {disarm}; rm -rf \"$d.driftless-new\"; mkdir -p \"$d.driftless-new\"; \
             tar -x -f - -C \"$d.driftless-new\"; rm -rf \"$d.driftless-prev\"; \
             if [ -e \"$d\" ]; then mv \"$d\" \"$d.driftless-prev\"; fi; \
             mv \"$d.driftless-new\" \"$d\"; \
             setsid sh -c {undo} \"$d\" </dev/null >\"$d.driftless-watchdog.log\" 2>&1 & \
             echo $! > \"$d.driftless-watchdog.pid\"",
            d = q(self.cfg.remote_dir.trim_end_matches('/')),
            disarm = DISARM,
            undo = q(&undo),
        )
    }

    /// Ship the new tree beside the live one and run the `plan` argv there.
    async fn plan_inner(&self) -> Result<Plan, String> {
        let Some(argv) = &self.cfg.plan else {
            return Err("this pi target has no `plan` command configured".into());
        };
        let deadline = Instant::now() + self.ctx.timeout;
        let tar = self.archive()?;
        let live = self.cfg.remote_dir.trim_end_matches('/');
        // A preview runs beside an apply's plan, never in its staging tree.
        let staging = if self.ctx.preview.is_some() {
            format!("{live}.driftless-preview")
        } else {
            format!("{live}.driftless-plan")
        };
        let ship = format!(
            "set -e; d={d}; rm -rf \"$d\"; mkdir -p \"$d\"; tar -x -f - -C \"$d\"",
            d = q(&staging)
        );
        self.run(&self.ssh(&ship, deadline, Some(Arc::new(tar))))
            .await
            .map_err(|e| format!("shipping the tree to {staging} for the plan: {e}"))?;
        let remote = format!(
            "cd {s} && DRIFTLESS_LIVE_DIR={l} {run}{argv}; rc=$?; rm -rf {s}; exit $rc",
            s = q(&staging),
            l = q(live),
            run = self.runner(false),
            argv = argv_string(argv)
        );
        let spec = self.ssh(&remote, deadline, self.inputs_script());
        let out = super::tool::run(&spec, &self.ctx.redactor).await?;
        let stdout = match out.code {
            _ if out.timed_out => {
                return Err(format!(
                    "the plan command on {} timed out after {}",
                    self.dest(),
                    humantime::format_duration(self.ctx.timeout)
                ));
            }
            Some(0) => out.stdout.trim_end().to_string(),
            Some(super::exec::NO_CHANGE_EXIT_CODE) => String::new(),
            Some(255) => {
                return Err(format!(
                    "ssh to {} failed: {}",
                    self.dest(),
                    out.stderr_summary(5)
                ));
            }
            code => {
                return Err(format!(
                    "the plan command on {} exited with {}: {}",
                    self.dest(),
                    code.map(|c| c.to_string())
                        .unwrap_or_else(|| "a signal".into()),
                    out.stderr_summary(5)
                ));
            }
        };
        Ok(super::tool::line_plan(
            "pi",
            &self.digest(),
            &stdout,
            &self.ctx.redactor,
        ))
    }
}

impl Backend for Pi {
    fn apply(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            if let Some(same) = self.unchanged() {
                return same;
            }
            self.deploy().await
        })
    }

    fn unchanged(&self) -> Option<Status> {
        super::tool::unchanged(&self.ctx, &self.digest())
    }

    fn plan(&self) -> Option<BoxFuture<'_, Result<Plan, String>>> {
        self.cfg
            .plan
            .is_some()
            .then(|| Box::pin(self.plan_inner()) as BoxFuture<'_, Result<Plan, String>>)
    }

    fn apply_plan<'a>(&'a self, plan: &'a PlanToApply) -> Option<BoxFuture<'a, Status>> {
        self.cfg.plan.is_some().then(|| {
            Box::pin(async move {
                super::apply_if_unchanged(plan, self.plan_inner().await, self.deploy()).await
            }) as BoxFuture<'a, Status>
        })
    }

    fn destroy(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            let dir = q(&self.cfg.remote_dir);
            let remote = match self.cfg.action {
                Action::Compose => format!(
                    "cd {dir} && {}{} down --remove-orphans",
                    self.runner(true),
                    argv_string(&self.cfg.compose_command)
                ),
                Action::Systemd => format!(
                    "{}systemctl stop {}",
                    self.sudo(),
                    argv_string(&self.cfg.units)
                ),
                Action::Command => match &self.cfg.destroy {
                    Some(argv) => {
                        format!("cd {dir} && {}{}", self.runner(false), argv_string(argv))
                    }
                    None => {
                        return Status::failed(
                            "this pi target has no `destroy` command configured",
                        );
                    }
                },
            };
            let stdin = match self.cfg.action {
                Action::Systemd => None,
                _ => self.inputs_script(),
            };
            match self
                .run(
                    &self
                        .ssh(&remote, Instant::now() + self.ctx.timeout, stdin)
                        .shown(),
                )
                .await
            {
                Ok(out) => Status {
                    result: ApplyResult::Changed,
                    message: format!("ran the destroy step on {}", self.cfg.host),
                    output_tail: out.tail,
                    digest: None,
                },
                Err(e) => Status::failed(e),
            }
        })
    }

    fn confirm(&self) -> Option<BoxFuture<'_, Result<(), String>>> {
        self.ctx.confirm_within?;
        Some(Box::pin(async move {
            // Too late once the watchdog has undone the change (it
            // removes its pid file when done).
            let remote = format!(
                "d={d}; if [ ! -f \"$d.driftless-watchdog.pid\" ]; then \
                 echo 'the watchdog already undid the change' >&2; exit 3; fi; {DISARM}; \
                 rm -rf \"$d.driftless-prev\"",
                d = q(self.cfg.remote_dir.trim_end_matches('/')),
            );
            let deadline =
                Instant::now() + self.ctx.timeout.min(std::time::Duration::from_secs(60));
            self.run(&self.ssh(&remote, deadline, None)).await.map(drop)
        }))
    }

    fn health<'a>(
        &'a self,
        check: &'a crate::health::OwnCheck,
    ) -> Option<BoxFuture<'a, Result<(), String>>> {
        let crate::health::OwnCheck::OnHost(argv) = check else {
            return None;
        };
        // Every ssh here is a connection of its own: a change that cut
        // the host off fails this check.
        Some(Box::pin(async move {
            let remote = format!("cd {} && {}", q(&self.cfg.remote_dir), argv_string(argv));
            let deadline =
                Instant::now() + self.ctx.timeout.min(std::time::Duration::from_secs(60));
            self.run(&self.ssh(&remote, deadline, None)).await.map(drop)
        }))
    }

    fn outputs(&self) -> BoxFuture<'_, Result<Outputs, BackendError>> {
        Box::pin(async move {
            let deadline = Instant::now() + self.ctx.timeout;
            let dir = q(&self.cfg.remote_dir);
            match self.cfg.action {
                Action::Systemd => {
                    // is-active exits non-zero when a unit is not active: read the lines anyway.
                    let remote = format!(
                        "systemctl is-active {} || true",
                        argv_string(&self.cfg.units)
                    );
                    let out = self
                        .run(&self.ssh(&remote, deadline, None))
                        .await
                        .map_err(BackendError::Command)?;
                    Ok(self
                        .cfg
                        .units
                        .iter()
                        .zip(out.stdout.lines())
                        .map(|(u, s)| (u.clone(), serde_json::Value::String(s.trim().to_string())))
                        .collect())
                }
                Action::Compose => {
                    // Works with compose v1 and v2 alike: every service, then
                    // the running ones.
                    let compose =
                        format!("{}{}", self.sudo(), argv_string(&self.cfg.compose_command));
                    let remote = format!(
                        "cd {dir} && {compose} config --services && echo --- && {compose} ps --services --filter status=running"
                    );
                    let out = self
                        .run(&self.ssh(&remote, deadline, None))
                        .await
                        .map_err(BackendError::Command)?;
                    let (all, running) = out.stdout.split_once("---").unwrap_or((&out.stdout, ""));
                    let running: Vec<&str> = running.lines().map(str::trim).collect();
                    Ok(all
                        .lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .map(|svc| {
                            let state = if running.contains(&svc) {
                                "running"
                            } else {
                                "not running"
                            };
                            (svc.to_string(), serde_json::json!({ "state": state }))
                        })
                        .collect())
                }
                Action::Command => {
                    let Some(argv) = &self.cfg.outputs else {
                        return Ok(Outputs::new());
                    };
                    let remote = format!("cd {dir} && {}", argv_string(argv));
                    let out = self
                        .run(&self.ssh(&remote, deadline, None))
                        .await
                        .map_err(BackendError::Command)?;
                    match serde_json::from_str(&out.stdout) {
                        Ok(serde_json::Value::Object(m)) => Ok(m),
                        _ => Err(BackendError::Command(
                            "the outputs command must print a JSON object".into(),
                        )),
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes_and_spaces() {
        assert_eq!(q("a b"), "'a b'");
        assert_eq!(q("it's"), r"'it'\''s'");
        assert_eq!(
            argv_string(&["sh".into(), "-c".into(), "echo \"$1\"".into()]),
            r#"'sh' '-c' 'echo "$1"'"#
        );
    }
}
