//! The unit ledger's contract: what a deployment of one unit of a target
//! (a Nomad job; later a host of a wave) holds, and the [`Ledger`] trait a
//! backend that deploys units writes through. The backend owns its
//! deployment machinery and the meaning of its [`Unit::detail`];
//! `store::deployments::units` owns the SQL (over the `deployments` table
//! every backend shares). This module is only the types between them, so
//! neither imports the other. No I/O.

pub use crate::deploy::{PlanState, Policy};
use crate::model::BoxFuture;

/// The backend's own fields of a deployment: a JSON object only it reads
/// and writes (the API shows it as it is).
pub type Detail = serde_json::Map<String, serde_json::Value>;

/// A deployment of one unit as the ledger keeps it.
#[derive(Debug, Clone)]
pub struct Unit {
    pub id: i64,
    pub target: String,
    /// The unit's name within its target (what a pause names).
    pub unit: String,
    /// Unique among the backend's open deployments.
    pub unit_key: String,
    pub commit_sha: String,
    pub spec_hash: String,
    pub policy: String,
    pub state: String,
    /// What people read of the change.
    pub diff: String,
    pub summary: String,
    pub message: Option<String>,
    /// When it began to wait for promotion (Unix ms).
    pub waiting_since: Option<i64>,
    /// When it had waited for promotion past the bound (Unix ms).
    pub overdue_at: Option<i64>,
    /// When it was recorded (Unix ms).
    pub created_at: i64,
    pub detail: Detail,
}

/// A deployment of one unit about to be recorded.
#[derive(Debug, Clone)]
pub struct NewUnit {
    pub backend: &'static str,
    pub target: String,
    pub unit: String,
    pub unit_key: String,
    /// What people read, after the backend's name: "job default/web".
    pub unit_label: String,
    pub commit_sha: String,
    pub spec_hash: String,
    pub policy: Policy,
    pub state: &'static str,
    /// Where a person's approval takes it: the step the backend takes
    /// next (Nomad: `PreHook` when the job has a pre hook, else `Applying`).
    pub on_approval: PlanState,
    pub diff: String,
    pub summary: String,
    /// Applying it deletes or replaces something.
    pub destructive: bool,
    pub detail: Detail,
}

/// What a state change may set along with the state. Every change is
/// also an append-only event row, attributed to `actor` (default
/// `driftless`).
#[derive(Debug, Clone, Default)]
pub struct UnitChange {
    pub actor: Option<String>,
    pub message: Option<String>,
    /// It has waited for promotion past the bound: record when (once).
    pub overdue: bool,
    /// Detail fields to set (the others stay as they are).
    pub detail: Detail,
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Another open deployment holds the unit, or the row was not in the
    /// state the change expected.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Store(String),
}

/// Where deployments of units are kept (see `store::deployments::units`).
/// Every write is durable when its future returns Ok.
pub trait Ledger: Send + Sync + std::fmt::Debug {
    /// The unit's open deployment, if any.
    fn active<'a>(
        &'a self,
        backend: &'static str,
        unit_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Unit>, LedgerError>>;
    /// The unit's newest deployment in any state.
    fn latest<'a>(
        &'a self,
        backend: &'static str,
        unit_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Unit>, LedgerError>>;
    /// Record a new deployment; `Conflict` when the unit already has an
    /// open one.
    fn insert<'a>(&'a self, d: &'a NewUnit) -> BoxFuture<'a, Result<i64, LedgerError>>;
    /// Move deployment `id` from state `from` to `to`; `Conflict` when it is
    /// no longer in `from` (or another change came between).
    fn transition<'a>(
        &'a self,
        id: i64,
        from: &'a str,
        to: &'a str,
        change: UnitChange,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;
    /// Has a person paused this unit of this target?
    fn is_paused<'a>(
        &'a self,
        target: &'a str,
        unit: &'a str,
    ) -> BoxFuture<'a, Result<bool, LedgerError>>;
    /// Every unit of this backend this target has had a deployment for,
    /// with its newest one, by unit name.
    fn units_of<'a>(
        &'a self,
        backend: &'static str,
        target: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Unit>, LedgerError>>;
}
