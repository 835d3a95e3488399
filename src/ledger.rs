//! The Nomad deployment ledger's contract: what a job's deployment record
//! holds and the [`Ledger`] trait the nomad backend writes through. The
//! backend owns the deployment machinery, `store::deployments::nomad` owns the SQL (over
//! the `deployments` table every backend shares); this module is only the
//! types between them, so neither imports the other. No I/O.

pub use crate::deploy::Policy;
use crate::model::BoxFuture;

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
    /// When it began to wait for promotion (Unix ms).
    pub waiting_since: Option<i64>,
    /// When it had waited for promotion past the bound (Unix ms).
    pub overdue_at: Option<i64>,
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

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Another active deployment holds the job, or the row was not in the
    /// state the change expected.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Store(String),
}

/// Where Nomad deployments are kept (SQLite; see `store::deployments::nomad`). Every
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

/// A plan diff as one line per changed field: `group web › task server ›
/// Config › image: "nginx:1.25" → "nginx:1.27"` (values already redacted).
pub fn diff_lines(diff: &serde_json::Value) -> String {
    fn walk(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        let Some(m) = v.as_object() else { return };
        for f in m
            .get("Fields")
            .and_then(|f| f.as_array())
            .into_iter()
            .flatten()
        {
            let t = f["Type"].as_str().unwrap_or("");
            if t == "None" {
                continue;
            }
            let name = f["Name"].as_str().unwrap_or("?");
            let old = f["Old"].as_str().unwrap_or("");
            let new = f["New"].as_str().unwrap_or("");
            out.push(match t {
                "Added" => format!("+ {path}{name}: {new:?}"),
                "Deleted" => format!("- {path}{name}: {old:?}"),
                _ => format!("~ {path}{name}: {old:?} → {new:?}"),
            });
        }
        for (key, label) in [
            ("Objects", ""),
            ("TaskGroups", "group "),
            ("Tasks", "task "),
        ] {
            for o in m.get(key).and_then(|o| o.as_array()).into_iter().flatten() {
                let name = o["Name"].as_str().unwrap_or("?");
                walk(o, &format!("{path}{label}{name} › "), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(diff, "", &mut out);
    if out.len() > 300 {
        let more = out.len() - 300;
        out.truncate(300);
        out.push(format!(
            "… and {more} more (GET /api/v1/deployments/<id> has all of it)"
        ));
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::diff_lines;

    #[test]
    fn diffs_are_one_line_per_field() {
        let d = serde_json::json!({ "Type": "Edited", "Fields": [], "TaskGroups": [{ "Name": "web",
        "Fields": [{ "Type": "Edited", "Name": "Count", "Old": "2", "New": "3" }],
        "Tasks": [{ "Name": "server", "Fields": [
            { "Type": "Added", "Name": "Env[X]", "Old": "", "New": "[REDACTED]" }
        ], "Objects": [{ "Name": "Config", "Fields": [
            { "Type": "Edited", "Name": "image", "Old": "a:1", "New": "a:2" }
        ]}]}]}]});
        assert_eq!(
            diff_lines(&d),
            "~ group web › Count: \"2\" → \"3\"\n+ group web › task server › Env[X]: \"[REDACTED]\"\n~ group web › task server › Config › image: \"a:1\" → \"a:2\""
        );
    }
}
