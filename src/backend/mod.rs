//! Backends: how one kind of target is converged.
//!
//! The trait has three operations every backend has — `apply`, `destroy`,
//! `outputs` — the contract of an unattended target (see ARCHITECTURE.md for
//! why), and one optional capability for the policies that review before
//! applying: `plan` (what applying would change, changing nothing) with
//! `apply_plan` (exactly that plan, or a refusal when the world moved since).
//! Everything a backend needs is bound when [`build`] makes it from its
//! config and a [`Context`]. A backend never sees a trigger, a queue, git or a
//! notifier; it must not import `queue`, `tick`, `git` or `http`.
//!
//! Per-backend config is an enum made by the [`backends!`] registry
//! (`kind = "terraform"` picks the variant), each variant its backend's own
//! `Config` with `deny_unknown_fields`, implementing [`Kind`]. [`tool`] is
//! the plumbing the command-line backends share.

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

use crate::deploy::Policy;
use crate::model::CommitId;
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
    /// `Some(no change)` when `apply` would answer it at once, running
    /// nothing and asking nothing of anyone (a digest-mode backend whose
    /// inputs are those of the last successful apply); `None` (the
    /// default) when `apply` may do anything. The tick skips a sync for a
    /// run that ends here (`Reconciler::converge`).
    fn unchanged(&self) -> Option<Status> {
        None
    }
    /// Tear the target down.
    fn destroy(&self) -> BoxFuture<'_, Status>;
    /// What the target exposes (terraform outputs, the command's JSON, …).
    fn outputs(&self) -> BoxFuture<'_, Result<Outputs, BackendError>>;
    /// The outputs with sensitive values as they are, and the names of
    /// those that are sensitive (their values are secrets: they go to
    /// another target's `inputs` only, masked, never shown or recorded).
    /// By default `outputs`, none of them sensitive.
    fn revealed_outputs(&self) -> BoxFuture<'_, Result<(Outputs, Vec<String>), BackendError>> {
        Box::pin(async move { Ok((self.outputs().await?, Vec::new())) })
    }
    /// What applying now would change, changing nothing; `None` for a
    /// backend that cannot plan. The error is a message for people
    /// (redacted).
    fn plan(&self) -> Option<BoxFuture<'_, Result<Plan, String>>> {
        None
    }
    /// Apply exactly `plan` (one this backend's `plan` made at this
    /// commit), or fail, changing nothing, when the world moved since it
    /// was made; `None` for a backend that cannot plan.
    fn apply_plan<'a>(&'a self, _plan: &'a PlanToApply) -> Option<BoxFuture<'a, Status>> {
        None
    }
    /// Let go of a plan that will never be applied (superseded, rejected,
    /// or shown by `driftless plan` / `detect`): what it holds outside
    /// driftless (a CloudFormation change set) is deleted. `None`: nothing
    /// to let go of but its file, which the tick removes.
    fn discard_plan<'a>(
        &'a self,
        _plan: &'a PlanToApply,
    ) -> Option<BoxFuture<'a, Result<(), String>>> {
        None
    }
    /// After its health checks passed, tell the host the change may stay:
    /// the watchdog armed under [`Context::confirm_within`] is disarmed,
    /// over a new connection. `Err` says why it could not be (the host
    /// then undoes the change by itself); `None`: nothing armed.
    fn confirm(&self) -> Option<BoxFuture<'_, Result<(), String>>> {
        None
    }
    /// Run a health check only this backend can (one of
    /// [`Kind::own_checks`]): `Err` says what is unhealthy (redacted);
    /// `None` for a check it does not serve.
    fn health<'a>(
        &'a self,
        _check: &'a crate::health::OwnCheck,
    ) -> Option<BoxFuture<'a, Result<(), String>>> {
        None
    }
}

/// How a backend without a saved plan applies an approved one: it planned
/// again (`replanned`), and `apply` runs only if that plan has the hash that
/// was approved; otherwise nothing is applied and the run fails saying so.
pub async fn apply_if_unchanged(
    approved: &PlanToApply,
    replanned: Result<Plan, String>,
    apply: impl std::future::Future<Output = Status>,
) -> Status {
    match replanned {
        Err(e) => Status::failed(format!("cannot plan again before applying: {e}")),
        Ok(now) if now.hash != approved.hash => Status::failed(format!(
            "the plan changed since it was approved (now: {}); nothing applied",
            now.summary
        )),
        Ok(_) => apply.await,
    }
}

/// An approved plan, as [`Backend::apply_plan`] gets it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanToApply {
    /// The [`Plan::hash`] that was approved.
    pub hash: String,
    /// The [`Plan::artifact`] it was made with.
    pub artifact: Option<PathBuf>,
}

/// What applying now would change, as a backend that can plan reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Whether applying would change anything at all.
    pub changes: bool,
    /// One line for people: "1 to add, 0 to change, 1 to destroy".
    pub summary: String,
    /// One line per change: what and how (`+` create, `~` update, `-`
    /// delete, `-/+` replace), never a value (redacted all the same).
    pub diff: String,
    /// It deletes or replaces something.
    pub destructive: bool,
    /// A SHA-256 over everything applying it would do (the tool's own
    /// machine-readable plan, volatile fields left out): two plans with the
    /// same hash change the same things the same way.
    pub hash: String,
    /// What applying exactly this plan needs (terraform: the saved plan
    /// file, under [`Context::plans_dir`]).
    pub artifact: Option<PathBuf>,
    /// The normal form a policy reads ([`crate::plan::Change`]), redacted;
    /// empty: the diff's lines say it ([`crate::plan::changes_of_diff`]).
    pub items: Vec<crate::plan::Change>,
    /// The backend's own machine-readable plan, redacted (`Null`: none).
    pub raw: serde_json::Value,
}

impl Plan {
    /// A plan of `lines` (one per change, not yet redacted) counted as
    /// `(add, change, destroy)`: the summary every backend words alike.
    pub fn of_lines(
        lines: &[String],
        (add, change, destroy): (u64, u64, u64),
        destructive: bool,
        hash: String,
        redactor: &Redactor,
    ) -> Plan {
        Plan {
            changes: !lines.is_empty(),
            summary: format!("{add} to add, {change} to change, {destroy} to destroy"),
            diff: redactor.redact(&lines.join("\n")),
            destructive,
            hash,
            ..Plan::default()
        }
    }

    /// The normal form: the backend's own, or its diff's lines.
    pub fn changes(&self) -> Vec<crate::plan::Change> {
        if self.items.is_empty() {
            crate::plan::changes_of_diff(&self.diff)
        } else {
            self.items.clone()
        }
    }
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
    /// The commit being applied (none for `outputs`).
    pub commit: Option<CommitId>,
    /// Durable records for backends that keep their own (nomad's
    /// deployments); `None` where there is no state database.
    pub ledger: Option<Arc<dyn crate::ledger::Ledger>>,
    /// Where this target's plan artifacts are written
    /// (`<state_dir>/plans/<target>`; it may not exist yet).
    pub plans_dir: PathBuf,
    /// A person asked to try again what failed at this commit
    /// (`driftless retry`): a backend that holds back a spec that failed
    /// (nomad) tries it once more.
    pub retry: bool,
    /// This plan is a pull request's preview, in a checkout of its own;
    /// here is the target's live working directory. A preview plans
    /// without taking the tool's state lock and never writes state
    /// (terraform reads the live directory's local state, a copy; pi
    /// stages beside the live tree under another name).
    pub preview: Option<PathBuf>,
    /// Other targets' outputs this target takes (`inputs`): name → value,
    /// in the environment of every command (terraform: `TF_VAR_<name>`
    /// for a lowercase name).
    pub inputs: std::collections::BTreeMap<String, String>,
    /// A change that can cut the controller off from its host (pi) arms a
    /// watchdog there that undoes it unless [`Backend::confirm`] reaches
    /// the host within this (`[targets.health] confirm_within`, under
    /// `on_unhealthy = "rollback"`); `None`: no watchdog.
    pub confirm_within: Option<std::time::Duration>,
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

/// What each backend's `Config` provides. A backend is its own file (a
/// `Config` implementing this, and the `Backend` it builds) plus one line in
/// [`backends!`] below.
pub trait Kind: std::fmt::Debug + Send + Sync {
    /// Every problem in the table, each as `(key, message)`.
    fn validate(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Resolve paths to files on the controller (ssh keys, CA files)
    /// against `base`, the config file's directory.
    fn resolve_paths(&mut self, _base: &Path) {}
    /// The files in the repository that driftless or the backend reads or
    /// writes on the repository's behalf, by key, relative to the target's
    /// path (files found by a pattern, like Nomad's jobs, are checked where
    /// they are found).
    fn repo_files(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Problems only visible on this machine (a missing binary), as
    /// `(key, message)`, for `driftless check`.
    fn check_environment(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// The backend for one operation.
    fn build(&self, ctx: Context) -> Result<Box<dyn Backend>, BackendError>;
    /// Whether the backend it builds answers [`Backend::plan`] (a policy
    /// other than `auto` needs it).
    fn can_plan(&self) -> bool {
        false
    }
    /// Whether it reviews each unit of its target on its own (a Nomad
    /// job: recorded in the unit ledger, held for approval, followed until
    /// it settles): the target's `policy` is then its units' default,
    /// which [`Kind::set_unit_policy`] takes, and the tick itself applies
    /// (`config::Target::tick_policy`).
    fn reviews_units(&self) -> bool {
        false
    }
    /// Take `policy` as the default of every unit (a unit may say
    /// otherwise, as a Nomad job's meta does); `Err` says why it cannot
    /// be, naming the key at fault. Called only when
    /// [`Kind::reviews_units`].
    fn set_unit_policy(&mut self, _policy: Policy) -> Result<(), String> {
        Ok(())
    }
    /// The health checks of its own it runs ([`Backend::health`]), by
    /// key: compose's `services`, pi's `on_host`.
    fn own_checks(&self) -> &'static [&'static str] {
        &[]
    }
    /// Whether a change it makes can cut the controller off from what it
    /// changes, so that it arms a watchdog there to undo it unless
    /// confirmed ([`Context::confirm_within`], [`Backend::confirm`]): pi.
    fn arms_watchdog(&self) -> bool {
        false
    }
}

/// The registry: one line per backend, `Variant(module) = "kind"`. It
/// makes the `[targets.backend]` enum, the `kind` names, and the dispatch.
macro_rules! backends {
    ($($variant:ident($module:ident) = $kind:literal),* $(,)?) => {
        /// The `[targets.backend]` table.
        #[derive(Debug, Clone)]
        pub enum BackendConfig {
            $($variant($module::Config),)*
        }

        /// Every `kind`, in the registry's order.
        pub const KINDS: &[&str] = &[$($kind),*];

        /// The `[targets.backend]` table's JSON Schema: `kind` is one of
        /// [`KINDS`], and picks its backend's `Config` (an `if`/`then` per
        /// kind, so a validator names the key at fault rather than every
        /// kind it is not). Subschemas are inlined: it stands alone.
        pub fn json_schema() -> serde_json::Value {
            let mut generator = schemars::generate::SchemaSettings::draft07()
                .with(|s| s.inline_subschemas = true)
                .into_generator();
            let kinds = vec![$(crate::schema::kind_branch(
                $kind,
                <$module::Config as schemars::JsonSchema>::json_schema(&mut generator).to_value(),
            )),*];
            serde_json::json!({
                "description": "How the target is converged: `kind` picks the backend, the other keys are its own (docs/backends.md).",
                "type": "object",
                "properties": { "kind": { "description": "The backend.", "enum": KINDS } },
                "required": ["kind"],
                "allOf": kinds,
            })
        }

        impl BackendConfig {
            fn read(kind: &str, v: serde_json::Value) -> Option<Result<Self, Vec<crate::schema::KeyProblem>>> {
                match kind {
                    $($kind => Some(crate::schema::read(v).map(BackendConfig::$variant)),)*
                    _ => None,
                }
            }

            pub fn kind(&self) -> &'static str {
                match self {
                    $(BackendConfig::$variant(_) => $kind,)*
                }
            }

            fn inner(&self) -> &dyn Kind {
                match self {
                    $(BackendConfig::$variant(c) => c,)*
                }
            }

            fn inner_mut(&mut self) -> &mut dyn Kind {
                match self {
                    $(BackendConfig::$variant(c) => c,)*
                }
            }
        }
    };
}

backends! {
    Terraform(terraform) = "terraform",
    Exec(exec) = "exec",
    Ansible(ansible) = "ansible",
    Pi(pi) = "pi",
    Compose(compose) = "compose",
    Nomad(nomad) = "nomad",
    Pulumi(pulumi) = "pulumi",
    Cloudformation(cloudformation) = "cloudformation",
}

impl BackendConfig {
    /// Parse the table, naming every problem with its key (`kind` picks
    /// the struct, whose fields are read with their paths; then the
    /// backend's own checks, every one). Paths to files in the repository
    /// stay relative to the target's path; paths to files on the controller
    /// (ssh keys) are resolved against `base`, the config file's directory.
    pub fn from_value(
        mut v: serde_json::Value,
        base: &Path,
    ) -> Result<Self, Vec<crate::schema::KeyProblem>> {
        let kinds = KINDS.join(", ");
        let kind = match v.as_object_mut().map(|o| o.remove("kind")) {
            None => return Err(vec![("(table)".into(), "must be a table".into())]),
            Some(None) => return Err(vec![("kind".into(), format!("missing: one of {kinds}"))]),
            Some(Some(serde_json::Value::String(k))) => k,
            Some(Some(other)) => {
                return Err(vec![(
                    "kind".into(),
                    format!("{other} is not one of {kinds}"),
                )]);
            }
        };
        let mut cfg = match Self::read(&kind, v) {
            Some(r) => r?,
            None => {
                return Err(vec![(
                    "kind".into(),
                    format!("unknown variant `{kind}`, expected one of {kinds}"),
                )]);
            }
        };
        let problems = cfg.inner().validate();
        if !problems.is_empty() {
            return Err(problems);
        }
        cfg.inner_mut().resolve_paths(base);
        Ok(cfg)
    }

    /// See [`Kind::repo_files`].
    pub fn repo_files(&self) -> Vec<(String, String)> {
        self.inner().repo_files()
    }

    /// Every file of [`repo_files`](Self::repo_files) stays in the checkout.
    pub fn check_repo_files(&self, ctx: &Context) -> Result<(), String> {
        for (key, rel) in self.repo_files() {
            ctx.inside(&key, &rel)?;
        }
        Ok(())
    }

    /// See [`Kind::check_environment`].
    pub fn check_environment(&self) -> Vec<(String, String)> {
        self.inner().check_environment()
    }

    /// See [`Kind::can_plan`].
    pub fn can_plan(&self) -> bool {
        self.inner().can_plan()
    }

    /// See [`Kind::reviews_units`].
    pub fn reviews_units(&self) -> bool {
        self.inner().reviews_units()
    }

    /// See [`Kind::arms_watchdog`].
    pub fn arms_watchdog(&self) -> bool {
        self.inner().arms_watchdog()
    }

    /// See [`Kind::own_checks`].
    pub fn own_checks(&self) -> &'static [&'static str] {
        self.inner().own_checks()
    }

    /// See [`Kind::set_unit_policy`].
    pub fn set_unit_policy(&mut self, policy: Policy) -> Result<(), String> {
        self.inner_mut().set_unit_policy(policy)
    }
}

/// Build the backend for one operation: refused when a file it would read
/// or write on the repository's behalf leads out of the checkout.
pub fn build(cfg: &BackendConfig, ctx: Context) -> Result<Box<dyn Backend>, BackendError> {
    cfg.check_repo_files(&ctx).map_err(BackendError::Config)?;
    cfg.inner().build(ctx)
}

/// `(key, file)` for each file of a list-valued key.
fn keyed(key: &str, files: &[String]) -> Vec<(String, String)> {
    files.iter().map(|f| (key.to_string(), f.clone())).collect()
}

/// `binary` missing from the PATH, as a `check` problem.
fn binary_on_path(binary: &str) -> Vec<(String, String)> {
    match find_on_path(binary) {
        Some(_) => vec![],
        None => vec![("binary".into(), format!("`{binary}` is not on the PATH"))],
    }
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
