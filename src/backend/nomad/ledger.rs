//! Nomad's deployments as the backend reads them: a job's deployment
//! ([`Deployment`]) typed over the shared unit ledger
//! ([`crate::ledger::Ledger`]), whose `detail` holds what only Nomad needs
//! ([`Detail`]: the job's cluster and namespace, the index it was planned
//! against, what registering it gave, its hooks). [`Jobs`] is the ledger
//! as the rest of the backend calls it. No SQL here, no Nomad API calls.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::diff::diff_lines;
use super::now_ms;
use crate::ledger::{Ledger, LedgerError, NewUnit, PlanState, Policy, Unit, UnitChange};

/// The backend's name in the ledger.
const BACKEND: &str = "nomad";

/// Which job: cluster (address + region), namespace, id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct JobKey {
    pub cluster: String,
    pub namespace: String,
    pub job: String,
}

impl JobKey {
    /// The unit key: unique among Nomad's open deployments. None of the
    /// three may hold a newline (a cluster is a URL, Nomad refuses such
    /// namespaces and job ids).
    fn unit_key(&self) -> String {
        format!("{}\n{}\n{}", self.cluster, self.namespace, self.job)
    }
}

/// What only Nomad keeps of a deployment (the unit's `detail`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Detail {
    pub cluster: String,
    pub namespace: String,
    pub job: String,
    pub file: String,
    /// The live JobModifyIndex planned against (the CAS value).
    pub job_modify_index: i64,
    /// Nomad's plan diff, redacted, as JSON.
    pub plan_diff: String,
    pub registered_index: Option<i64>,
    pub eval_id: Option<String>,
    pub nomad_deployment_id: Option<String>,
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
}

/// A job's deployment as the backend reads it: the ledger's shared
/// fields, and Nomad's own ([`Detail`], read through this too:
/// `d.registered_index`).
#[derive(Debug, Clone)]
pub struct Deployment {
    pub id: i64,
    pub target: String,
    pub key: JobKey,
    pub commit_sha: String,
    pub spec_hash: String,
    pub policy: String,
    pub state: String,
    pub diff_summary: String,
    pub message: Option<String>,
    /// When it began to wait for promotion (Unix ms).
    pub waiting_since: Option<i64>,
    /// When it had waited for promotion past the bound (Unix ms).
    pub overdue_at: Option<i64>,
    /// When it was recorded (Unix ms).
    pub created_at: i64,
    pub detail: Detail,
}

impl std::ops::Deref for Deployment {
    type Target = Detail;

    fn deref(&self) -> &Detail {
        &self.detail
    }
}

impl Deployment {
    fn from_unit(u: Unit) -> Result<Deployment, LedgerError> {
        let detail: Detail = serde_json::from_value(serde_json::Value::Object(u.detail))
            .map_err(|e| LedgerError::Store(format!("deployment {}: its detail: {e}", u.id)))?;
        Ok(Deployment {
            id: u.id,
            target: u.target,
            key: JobKey {
                cluster: detail.cluster.clone(),
                namespace: detail.namespace.clone(),
                job: detail.job.clone(),
            },
            commit_sha: u.commit_sha,
            spec_hash: u.spec_hash,
            policy: u.policy,
            state: u.state,
            diff_summary: u.summary,
            message: u.message,
            waiting_since: u.waiting_since,
            overdue_at: u.overdue_at,
            created_at: u.created_at,
            detail,
        })
    }
}

/// A job's deployment about to be recorded.
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
    /// Nomad's plan diff, redacted, as JSON.
    pub diff: String,
    pub diff_summary: String,
    pub pre_hook: Option<String>,
    pub post_hook: Option<String>,
    pub hook_timeout_ms: Option<i64>,
    pub hook_nonce: String,
}

impl NewDeployment {
    /// Whether registering it stops something: a task group removed from
    /// the job (Nomad's plan diff says `"Type": "Deleted"`) stops its
    /// allocations.
    pub fn destructive(&self) -> bool {
        serde_json::from_str::<serde_json::Value>(&self.diff)
            .ok()
            .and_then(|v| v["TaskGroups"].as_array().cloned())
            .is_some_and(|groups| groups.iter().any(|g| g["Type"] == "Deleted"))
    }

    fn unit(&self) -> Result<NewUnit, LedgerError> {
        let detail = Detail {
            cluster: self.key.cluster.clone(),
            namespace: self.key.namespace.clone(),
            job: self.key.job.clone(),
            file: self.file.clone(),
            job_modify_index: self.job_modify_index,
            plan_diff: self.diff.clone(),
            pre_hook: self.pre_hook.clone(),
            post_hook: self.post_hook.clone(),
            hook_timeout_ms: self.hook_timeout_ms,
            hook_nonce: Some(self.hook_nonce.clone()),
            ..Detail::default()
        };
        let shown = serde_json::from_str::<serde_json::Value>(&self.diff)
            .map(|v| diff_lines(&v))
            .unwrap_or_else(|_| self.diff.clone());
        Ok(NewUnit {
            backend: BACKEND,
            target: self.target.clone(),
            unit: self.key.job.clone(),
            unit_key: self.key.unit_key(),
            unit_label: format!("job {}/{}", self.key.namespace, self.key.job),
            commit_sha: self.commit_sha.clone(),
            spec_hash: self.spec_hash.clone(),
            policy: self.policy,
            state: self.state,
            // Approved, its job's next step: the pre hook, or the register.
            on_approval: if self.pre_hook.is_some() {
                PlanState::PreHook
            } else {
                PlanState::Applying
            },
            diff: shown,
            summary: self.diff_summary.clone(),
            destructive: self.destructive(),
            detail: to_map(&detail)?,
        })
    }
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
    /// It has waited for promotion past the bound: record when (once).
    pub overdue: bool,
}

impl Change {
    /// The unit ledger's change: the fields given, into `detail`. The
    /// register's answer also notes when it came.
    fn unit(self) -> UnitChange {
        let mut detail = crate::ledger::Detail::new();
        let mut set = |k: &str, v: serde_json::Value| {
            detail.insert(k.to_string(), v);
        };
        if let Some(v) = self.job_modify_index {
            set("job_modify_index", v.into());
        }
        if let Some(v) = self.registered_index {
            set("registered_index", v.into());
            set("registered_at", now_ms().into());
        }
        if let Some(v) = self.eval_id {
            set("eval_id", v.into());
        }
        if let Some(v) = self.nomad_deployment_id {
            set("nomad_deployment_id", v.into());
        }
        if let Some(v) = self.pre_hook_child {
            set("pre_hook_child", v.into());
        }
        if let Some(v) = self.post_hook_child {
            set("post_hook_child", v.into());
        }
        if let Some(v) = self.failed_at_index {
            set("failed_at_index", v.into());
        }
        UnitChange {
            actor: self.actor,
            message: self.message,
            overdue: self.overdue,
            detail,
        }
    }
}

fn to_map(d: &Detail) -> Result<crate::ledger::Detail, LedgerError> {
    match serde_json::to_value(d) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err(LedgerError::Store(
            "a deployment's detail is not an object".into(),
        )),
        Err(e) => Err(LedgerError::Store(format!("a deployment's detail: {e}"))),
    }
}

/// The unit ledger as the nomad backend calls it: by job.
#[derive(Debug, Clone)]
pub struct Jobs(pub Arc<dyn Ledger>);

impl Jobs {
    /// The job's active deployment, if any.
    pub async fn active(&self, key: &JobKey) -> Result<Option<Deployment>, LedgerError> {
        self.0
            .active(BACKEND, &key.unit_key())
            .await?
            .map(Deployment::from_unit)
            .transpose()
    }

    /// The job's newest deployment in any state.
    pub async fn latest(&self, key: &JobKey) -> Result<Option<Deployment>, LedgerError> {
        self.0
            .latest(BACKEND, &key.unit_key())
            .await?
            .map(Deployment::from_unit)
            .transpose()
    }

    /// Record a new deployment; `Conflict` when the job already has an
    /// active one.
    pub async fn insert(&self, d: &NewDeployment) -> Result<i64, LedgerError> {
        let unit = d.unit()?;
        self.0.insert(&unit).await.map_err(|e| match e {
            LedgerError::Conflict(_) => LedgerError::Conflict(format!(
                "job {}/{} already has an active deployment (one at a time, enforced by the database)",
                d.key.namespace, d.key.job
            )),
            e => e,
        })
    }

    /// Move deployment `id` from state `from` to `to`; `Conflict` when it
    /// is no longer in `from`.
    pub async fn transition(
        &self,
        id: i64,
        from: &str,
        to: &str,
        change: Change,
    ) -> Result<(), LedgerError> {
        self.0.transition(id, from, to, change.unit()).await
    }

    /// Has a person paused this job of this target?
    pub async fn is_paused(&self, target: &str, job: &str) -> Result<bool, LedgerError> {
        self.0.is_paused(target, job).await
    }

    /// Every job this target has had a deployment for, with its newest
    /// one, by namespace and job.
    pub async fn jobs_of(&self, target: &str) -> Result<Vec<Deployment>, LedgerError> {
        let mut all = self
            .0
            .units_of(BACKEND, target)
            .await?
            .into_iter()
            .map(Deployment::from_unit)
            .collect::<Result<Vec<_>, _>>()?;
        all.sort_by(|a, b| (&a.key.namespace, &a.key.job).cmp(&(&b.key.namespace, &b.key.job)));
        Ok(all)
    }
}
