//! What the command-line backends share: their `env` table resolved once,
//! with every value read from a reference registered as a secret; command
//! specs in the target's directory, bounded by a deadline; runs whose errors
//! pass through the redactor; the "inputs unchanged" answer of the
//! digest-mode backends; and [`line_plan`], the one-line-per-change
//! convention of the users' own `plan` commands (exec, pi). It never decides
//! what a tool's output means: that is each backend's own file.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use super::{ApplyResult, BackendError, Context, Status};
use crate::process::{self, Output, Spec};
use crate::redact::Redactor;
use crate::secret::resolve_env_map;

/// The message of a digest-mode "no change".
pub const UNCHANGED: &str = "inputs unchanged since the last successful apply";

/// A backend's `env` table with `env:NAME` references read from driftless's
/// environment now (a missing one fails the build, naming it); each value
/// read is registered with the context's redactor before anything runs.
pub fn env(
    table: &BTreeMap<String, String>,
    ctx: &mut Context,
) -> Result<BTreeMap<String, String>, BackendError> {
    let (mut env, secrets) =
        resolve_env_map(table).map_err(|e| BackendError::Config(e.to_string()))?;
    for s in secrets {
        ctx.redactor.add(s);
    }
    // Other targets' outputs (`inputs`), beside the configured ones.
    env.extend(ctx.inputs.clone());
    Ok(env)
}

/// One command-line tool: the argv every call starts with, the directory
/// it runs in, its environment.
#[derive(Debug, Clone)]
pub struct Tool {
    pub argv0: Vec<String>,
    pub dir: PathBuf,
    pub env: BTreeMap<String, String>,
}

impl Tool {
    /// `argv0` followed by `args`, in the tool's directory with its
    /// environment, killed at `deadline`.
    pub fn spec(&self, args: &[&str], deadline: Instant) -> Spec {
        let mut argv = self.argv0.clone();
        argv.extend(args.iter().map(|s| s.to_string()));
        let mut spec = Spec::new(argv, &self.dir);
        spec.env = self.env.clone();
        spec.deadline = Some(deadline);
        spec
    }
}

/// Run `spec`; a command that could not be started or watched is an error
/// whose text has been through the redactor. (A command that ran and failed
/// is an `Ok` with its exit status: what that means is the backend's call.)
pub async fn run(spec: &Spec, redactor: &Redactor) -> Result<Output, String> {
    process::run(spec, redactor)
        .await
        .map_err(|e| redactor.redact(&e.to_string()))
}

/// In digest mode: `Some(no change)` when `digest` is the one stored after
/// the last successful apply.
pub fn unchanged(ctx: &Context, digest: &str) -> Option<Status> {
    (ctx.last_digest.as_deref() == Some(digest)).then(|| Status {
        result: ApplyResult::NoChange,
        message: UNCHANGED.into(),
        output_tail: String::new(),
        digest: Some(digest.to_string()),
    })
}

/// The most of a plan command's output kept as its diff.
const PLAN_MAX_BYTES: usize = 64 * 1024;

/// A plan from a user's `plan` command (exec, pi): its stdout, one line per
/// change — `+` create, `~` update, `-` delete, `-/+` replace; a line
/// without one of these might delete something, so it counts as
/// destructive — hashed (redacted) with the inputs' `digest` under `kind`'s
/// tag.
pub fn line_plan(kind: &str, digest: &str, stdout: &str, redactor: &Redactor) -> super::Plan {
    use sha2::{Digest as _, Sha256};
    // Redacted before it is cut, so no piece of a secret is left at the cut.
    let diff = crate::redact::tail(&redactor.redact(stdout), PLAN_MAX_BYTES);
    let lines: Vec<&str> = diff.lines().filter(|l| !l.trim().is_empty()).collect();
    let (mut add, mut change, mut destroy, mut other) = (0, 0, 0, 0);
    for l in &lines {
        match l.split_whitespace().next() {
            Some("+") => add += 1,
            Some("~") => change += 1,
            Some("-") => destroy += 1,
            Some("-/+") => {
                add += 1;
                destroy += 1;
            }
            _ => other += 1,
        }
    }
    let mut summary = format!("{add} to add, {change} to change, {destroy} to destroy");
    if other > 0 {
        summary.push_str(&format!(", {other} other line(s)"));
    }
    let mut h = Sha256::new();
    h.update(format!("driftless-{kind}-plan-v1\0").as_bytes());
    h.update(digest.as_bytes());
    h.update(b"\0");
    // The redacted text: a hash over a secret would let anyone who sees
    // it test guesses of that secret.
    h.update(diff.as_bytes());
    super::Plan {
        changes: !lines.is_empty(),
        summary,
        diff: lines.join("\n"),
        destructive: destroy > 0 || other > 0,
        hash: hex::encode(h.finalize()),
        ..super::Plan::default()
    }
}
