//! What the command-line backends share: their `env` table resolved once,
//! with every value read from a reference registered as a secret; command
//! specs in the target's directory, bounded by a deadline; runs whose errors
//! pass through the redactor; and the "inputs unchanged" answer of the
//! digest-mode backends. It never decides what a tool's output means: that
//! is each backend's own file.

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
    let (env, secrets) = resolve_env_map(table).map_err(|e| BackendError::Config(e.to_string()))?;
    for s in secrets {
        ctx.redactor.add(s);
    }
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
