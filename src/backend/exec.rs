//! The `exec` backend: the user's own commands, with idempotency built in.
//!
//! `apply` is skipped (`no_change`) when the digest of the target's files,
//! the command and its environment equals the digest stored at the last
//! successful apply. With `always = true` the command runs every tick and its
//! exit code says what happened:
//!
//! | exit code | result      |
//! |-----------|-------------|
//! | 0         | `changed`   |
//! | 3         | `no_change` |
//! | other     | `failed`    |
//!
//! With a `plan` argv the target can plan (and so run under `approval`,
//! `approve_destructive` or `detect`): its stdout is the plan, one line per
//! change (`+` create, `~` update, `-` delete, `-/+` replace; any other line
//! is a change that may be destructive), nothing on stdout (or exit 3)
//! meaning nothing to do.
//! The plan's hash covers the inputs' digest and that output; applying an
//! approved plan plans again first and applies only if the hash is the
//! same, else fails, changing nothing.
//!
//! Commands are argv vectors run in the target's directory; this module does
//! not know about git, triggers or the queue.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::tool;
use super::{
    ApplyResult, Backend, BackendError, BoxFuture, Context, Outputs, Plan, PlanToApply, Status,
};
use crate::process::{self, Spec};

/// The exit code with which an `exec` command says "nothing to do".
pub const NO_CHANGE_EXIT_CODE: i32 = 3;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "exec"`: commands of your own, run in the target's path.
pub struct Config {
    /// argv run by `apply`, in the target's path (not a shell string).
    pub apply: Vec<String>,
    /// argv run by `destroy` (without one, destroy fails with a clear message).
    pub destroy: Option<Vec<String>>,
    /// argv whose stdout is a JSON object: the target's outputs.
    pub outputs: Option<Vec<String>>,
    /// argv whose stdout is what `apply` would change, changing nothing
    /// (see the module doc).
    pub plan: Option<Vec<String>>,
    /// Extra environment; values `env:NAME` are read from driftless's own
    /// environment and masked in output.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Run `apply` every tick (exit 0 = changed, 3 = no_change) instead of
    /// only when the tracked files, the command or `env` changed. Default:
    /// false.
    #[serde(default)]
    pub always: bool,
}

impl super::Kind for Config {
    fn validate(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        for (key, argv) in [
            ("apply", Some(&self.apply)),
            ("destroy", self.destroy.as_ref()),
            ("outputs", self.outputs.as_ref()),
            ("plan", self.plan.as_ref()),
        ] {
            if let Some(argv) = argv
                && argv.first().is_none_or(|a| a.trim().is_empty())
            {
                p.push((
                    key.to_string(),
                    format!("`{key}` must be a non-empty argv list such as [\"./deploy.sh\", \"--prod\"]"),
                ));
            }
        }
        p
    }

    fn build(&self, ctx: Context) -> Result<Box<dyn super::Backend>, BackendError> {
        Ok(Box::new(Exec::new(self.clone(), ctx)?))
    }

    fn can_plan(&self) -> bool {
        self.plan.is_some()
    }
}

pub struct Exec {
    /// The `env` table, resolved at build.
    env: std::collections::BTreeMap<String, String>,
    cfg: Config,
    ctx: Context,
}

impl Exec {
    pub fn new(cfg: Config, mut ctx: Context) -> Result<Self, BackendError> {
        // Fail early, and register secret env values before anything runs.
        let env = tool::env(&cfg.env, &mut ctx)?;
        Ok(Exec { env, cfg, ctx })
    }

    /// Digest of the inputs: the tracked files, the command, the env as written.
    fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"driftless-exec-v1\0");
        h.update(self.ctx.source_digest.as_bytes());
        for a in &self.cfg.apply {
            h.update(b"\0argv\0");
            h.update(a.as_bytes());
        }
        for (k, v) in &self.cfg.env {
            h.update(b"\0env\0");
            h.update(k.as_bytes());
            h.update(b"=");
            h.update(v.as_bytes());
        }
        hex::encode(h.finalize())
    }

    /// Run `argv`; `shown`: its output is part of the run's (the apply,
    /// the destroy and the plan, never `outputs`, which is data).
    async fn run(&self, argv: &[String], shown: bool) -> Result<(Spec, process::Output), String> {
        let mut spec = Spec::new(argv.to_vec(), &self.ctx.workdir);
        spec.shown = shown;
        spec.env = self.env.clone();
        spec.deadline = Some(Instant::now() + self.ctx.timeout);
        let out = tool::run(&spec, &self.ctx.redactor).await?;
        Ok((spec, out))
    }

    /// Run the `plan` argv: what applying now would change.
    async fn plan(&self) -> Result<Plan, String> {
        let Some(argv) = &self.cfg.plan else {
            return Err("this exec target has no `plan` command configured".into());
        };
        let (spec, out) = self.run(argv, true).await?;
        let stdout = match out.code {
            _ if out.timed_out => {
                return Err(process::describe_exit(&spec, &out, Some(self.ctx.timeout)));
            }
            Some(0) => out.stdout.trim_end().to_string(),
            Some(NO_CHANGE_EXIT_CODE) => String::new(),
            _ => {
                let last = out.stderr_summary(1);
                let exit = process::describe_exit(&spec, &out, None);
                return Err(if last.is_empty() {
                    exit
                } else {
                    format!("{exit}: {last}")
                });
            }
        };
        Ok(tool::line_plan(
            "exec",
            &self.digest(),
            &stdout,
            &self.ctx.redactor,
        ))
    }

    async fn run_for_status(&self, argv: &[String], digest: Option<String>) -> Status {
        let (spec, out) = match self.run(argv, true).await {
            Ok(x) => x,
            Err(e) => return Status::failed(e),
        };
        let (result, message) = match out.code {
            _ if out.timed_out => (
                ApplyResult::Failed,
                process::describe_exit(&spec, &out, Some(self.ctx.timeout)),
            ),
            Some(0) => (
                ApplyResult::Changed,
                format!("`{}` succeeded", spec.display()),
            ),
            // Exit code 3 means "no change" only under `always = true`, as
            // the README says; in digest mode it is a failure like any
            // other (and a failure never stores its digest).
            Some(NO_CHANGE_EXIT_CODE) if self.cfg.always => (
                ApplyResult::NoChange,
                format!("`{}` reported no change", spec.display()),
            ),
            _ => {
                let last = out.stderr_summary(1);
                let exit = process::describe_exit(&spec, &out, None);
                let msg = if last.is_empty() {
                    exit
                } else {
                    format!("{exit}: {last}")
                };
                (ApplyResult::Failed, msg)
            }
        };
        Status {
            result,
            message,
            output_tail: out.tail,
            digest: if result == ApplyResult::Failed {
                None
            } else {
                digest
            },
        }
    }
}

impl Backend for Exec {
    fn apply(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            if let Some(same) = self.unchanged() {
                return same;
            }
            self.run_for_status(&self.cfg.apply, Some(self.digest()))
                .await
        })
    }

    fn unchanged(&self) -> Option<Status> {
        if self.cfg.always {
            return None;
        }
        tool::unchanged(&self.ctx, &self.digest())
    }

    fn plan(&self) -> Option<BoxFuture<'_, Result<Plan, String>>> {
        self.cfg
            .plan
            .is_some()
            .then(|| Box::pin(Exec::plan(self)) as BoxFuture<'_, Result<Plan, String>>)
    }

    fn apply_plan<'a>(&'a self, plan: &'a PlanToApply) -> Option<BoxFuture<'a, Status>> {
        self.cfg.plan.is_some().then(|| {
            Box::pin(async move {
                let replanned = Exec::plan(self).await;
                let apply = self.run_for_status(&self.cfg.apply, Some(self.digest()));
                super::apply_if_unchanged(plan, replanned, apply).await
            }) as BoxFuture<'a, Status>
        })
    }

    fn destroy(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            match &self.cfg.destroy {
                Some(argv) => self.run_for_status(argv, None).await,
                None => Status::failed("this exec target has no `destroy` command configured"),
            }
        })
    }

    fn outputs(&self) -> BoxFuture<'_, Result<Outputs, BackendError>> {
        Box::pin(async move {
            let Some(argv) = &self.cfg.outputs else {
                return Ok(Outputs::new());
            };
            let (spec, out) = self.run(argv, false).await.map_err(BackendError::Command)?;
            if !out.success() {
                return Err(BackendError::Command(format!(
                    "{}: {}",
                    process::describe_exit(&spec, &out, Some(self.ctx.timeout)),
                    out.stderr.trim()
                )));
            }
            match serde_json::from_str::<serde_json::Value>(&out.stdout) {
                Ok(serde_json::Value::Object(map)) => Ok(map),
                Ok(_) => Err(BackendError::Command(format!(
                    "`{}` must print a JSON object on stdout",
                    spec.display()
                ))),
                Err(e) => Err(BackendError::Command(format!(
                    "`{}` printed invalid JSON: {e}",
                    spec.display()
                ))),
            }
        })
    }
}
