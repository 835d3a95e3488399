//! The Nomad deployment ledger's contract: what a deployment record holds
//! and the [`Ledger`] trait the nomad backend writes through. The backend
//! owns the deployment machinery, `store::nomad` owns the SQL; this module
//! is only the types between them, so neither imports the other. No I/O.

use crate::model::BoxFuture;

/// What driftless may do with a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Register what git says, after a plan, with CAS.
    Auto,
    /// Wait for a person to approve the planned diff.
    Approval,
    /// Only report drift.
    None,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "auto" => Some(Policy::Auto),
            "approval" => Some(Policy::Approval),
            "none" => Some(Policy::None),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Auto => "auto",
            Policy::Approval => "approval",
            Policy::None => "none",
        }
    }
}

/// Which job: cluster (address + region), namespace, id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct JobKey {
    pub cluster: String,
    pub namespace: String,
    pub job: String,
}

/// A deployment as the ledger keeps it.
#[derive(Debug, Clone)]
pub struct Deployment {
    pub id: i64,
    pub target: String,
    pub key: JobKey,
    pub file: String,
    pub commit_sha: String,
    pub spec_hash: String,
    pub policy: String,
    pub state: String,
    pub job_modify_index: i64,
    pub diff: String,
    pub diff_summary: String,
    pub registered_index: Option<i64>,
    pub eval_id: Option<String>,
    pub nomad_deployment_id: Option<String>,
    pub message: Option<String>,
    pub pre_hook: Option<String>,
    pub post_hook: Option<String>,
    pub hook_timeout_ms: Option<i64>,
    /// Random, part of the hooks' idempotency tokens (`None` for
    /// deployments recorded by an older driftless).
    pub hook_nonce: Option<String>,
    /// The child jobs the hooks' dispatches created.
    pub pre_hook_child: Option<String>,
    pub post_hook_child: Option<String>,
    /// When the register was answered (Unix ms).
    pub registered_at: Option<i64>,
    /// A failed deployment: the live JobModifyIndex when it failed.
    pub failed_at_index: Option<i64>,
    /// When it was recorded (Unix ms).
    pub created_at: i64,
}

/// A deployment about to be recorded.
#[derive(Debug, Clone)]
pub struct NewDeployment {
    pub target: String,
    pub key: JobKey,
    pub file: String,
    pub commit_sha: String,
    pub spec_hash: String,
    pub policy: Policy,
    pub state: &'static str,
    pub job_modify_index: i64,
    pub diff: String,
    pub diff_summary: String,
    pub pre_hook: Option<String>,
    pub post_hook: Option<String>,
    pub hook_timeout_ms: Option<i64>,
    pub hook_nonce: String,
}

/// Fields a state change may set along with the state. Every change is
/// also an append-only event row, attributed to `actor` (default
/// `driftless`).
#[derive(Debug, Clone, Default)]
pub struct Change {
    pub actor: Option<String>,
    pub message: Option<String>,
    pub job_modify_index: Option<i64>,
    pub registered_index: Option<i64>,
    pub eval_id: Option<String>,
    pub nomad_deployment_id: Option<String>,
    pub pre_hook_child: Option<String>,
    pub post_hook_child: Option<String>,
    pub failed_at_index: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Another active deployment holds the job, or the row was not in the
    /// state the change expected.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Store(String),
}

/// Where Nomad deployments are kept (SQLite; see `store::nomad`). Every
/// write is durable when its future returns Ok.
pub trait Ledger: Send + Sync + std::fmt::Debug {
    /// The job's active deployment, if any.
    fn active<'a>(
        &'a self,
        key: &'a JobKey,
    ) -> BoxFuture<'a, Result<Option<Deployment>, LedgerError>>;
    /// The job's newest deployment in any state.
    fn latest<'a>(
        &'a self,
        key: &'a JobKey,
    ) -> BoxFuture<'a, Result<Option<Deployment>, LedgerError>>;
    /// Record a new deployment; `Conflict` when the job already has an
    /// active one.
    fn insert<'a>(&'a self, d: &'a NewDeployment) -> BoxFuture<'a, Result<i64, LedgerError>>;
    /// Move deployment `id` from state `from` to `to`; `Conflict` when it is
    /// no longer in `from`.
    fn transition<'a>(
        &'a self,
        id: i64,
        from: &'a str,
        to: &'a str,
        change: Change,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;
    /// Has a person paused this job of this target?
    fn is_paused<'a>(
        &'a self,
        target: &'a str,
        job: &'a str,
    ) -> BoxFuture<'a, Result<bool, LedgerError>>;
    /// Every job this target has had a deployment for, with its newest one.
    fn jobs_of<'a>(
        &'a self,
        target: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Deployment>, LedgerError>>;
}
