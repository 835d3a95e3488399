//! The `nomad` backend: the job files in the target's path, reconciled to a
//! Nomad cluster through its HTTP API, under the invariants of
//! `seeds/nops-philosophy.md`:
//!
//! - Nomad parses the HCL (`/v1/jobs/parse`); driftless never does.
//! - Behaviour comes from the HCL in git (`meta { driftless_policy = … }`),
//!   never from the live job; invalid meta means policy `none` and an ERROR.
//! - Plan before every write; the diff and the plan's `JobModifyIndex` are
//!   persisted (through the [`Ledger`]) before anything is written to Nomad,
//!   and every register is a CAS on that index, so a manual change is never
//!   overwritten.
//! - Groups with an enabled `scaling` block keep their live count.
//! - One active deployment per job (a unique index behind the ledger).
//! - Nomad is never asked to stop or purge a job (but by `destroy` with
//!   `allow_destroy = true`); driftless never writes meta into a live job.
//! - Secrets are redacted from every diff before it is stored or shown.
//!
//! This module talks to Nomad and to the [`Ledger`] it is given; it never
//! imports the store, the queue, git or http.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{ApplyResult, Backend, BackendError, BoxFuture, Context, Outputs, Status};
pub use crate::ledger::{Ledger, LedgerError, Policy};
use crate::model::CommitId;
use crate::secret::SecretRef;
pub use ledger::{Change, Deployment, JobKey, Jobs, NewDeployment};

mod client;
mod config;
mod diff;
mod follow;
mod hooks;
mod job;
mod ledger;
mod record;
mod register;

use client::{Client, NomadError};
pub use config::Config;
use config::job_policy;
use config::{DEFAULT_PROMOTION_WAIT, parse_promotion_wait};
use diff::{diff_summary, redact_diff, redact_spec, spec_hash};
use follow::no_deployment_reason;
use hooks::{hook_timeout, random_hex};
use job::seg;

/// Meta keys driftless reads; any other `driftless_*` key is an error.
const KNOWN_META: &[&str] = &[
    "driftless_policy",
    "driftless_pre_hook",
    "driftless_post_hook",
    "driftless_hook_timeout",
];
/// The meta a hook's dispatch can carry. Nomad refuses a dispatch with any
/// key its parameterized job does not declare in `meta_required` or
/// `meta_optional` (nomad/job_endpoint.go, `validateDispatchRequest`), so
/// driftless sends only the ones the hook job declares.
pub const DISPATCH_META: &[&str] = &[
    "driftless_deployment",
    "driftless_job",
    "driftless_commit",
    "driftless_phase",
];
/// How long a hook may run unless `driftless_hook_timeout` says otherwise.
const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(300);

pub struct Nomad {
    cfg: Config,
    ctx: Context,
    client: Client,
    ledger: Jobs,
    cluster: String,
}

impl std::fmt::Debug for Nomad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nomad")
            .field("address", &self.cfg.address)
            .finish()
    }
}

/// What happened to one job in one apply.
#[derive(Debug)]
struct JobReport {
    result: JobResult,
    line: String,
}

/// Ordered by severity: the worst of a tick's outcomes is its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum JobResult {
    NoChange,
    Changed,
    Failed,
}

/// Where following an active deployment left it.
#[derive(Debug)]
enum Followed {
    /// Still active: waiting for Nomad, a hook or a person.
    Waiting(JobReport),
    /// Completed or failed.
    Settled(JobReport),
    /// Given up for a newer spec.
    Superseded(JobReport),
}

impl Followed {
    fn report(self) -> JobReport {
        match self {
            Followed::Waiting(o) | Followed::Settled(o) | Followed::Superseded(o) => o,
        }
    }
}

/// A job file, parsed by Nomad.
struct Parsed {
    file: String,
    key: JobKey,
    job: Value,
    policy: Policy,
    pre_hook: Option<String>,
    post_hook: Option<String>,
    hook_timeout: Duration,
}

/// A hook job as this apply reconciled it (parameterized jobs go first):
/// where it lives, whether its reconcile went well, and the meta keys its
/// `parameterized` block lets a dispatch carry.
#[derive(Debug, Clone)]
struct HookJob {
    key: JobKey,
    ok: bool,
    meta_required: Vec<String>,
    meta_optional: Vec<String>,
    /// Its `parameterized` block says `payload = "required"`: a dispatch
    /// without one is refused, and driftless sends none.
    payload_required: bool,
}

/// The hook jobs in the target's path, by job ID.
type HookJobs = BTreeMap<String, HookJob>;

/// One deployment's hook dispatch: its idempotency token comes from the
/// deployment's random nonce, and a child recorded by an earlier tick is
/// waited for instead of dispatching again.
struct HookRun<'a> {
    id: i64,
    nonce: Option<&'a str>,
    child: Option<&'a str>,
    /// The state the deployment is in while the hook runs.
    state: &'a str,
}

impl Nomad {
    /// The commit this apply converges to (empty when there is none, as
    /// for `outputs`, which records no deployment).
    fn commit(&self) -> &str {
        self.ctx.commit.as_ref().map_or("", CommitId::as_str)
    }

    fn commit_short(&self) -> &str {
        self.ctx.commit.as_ref().map_or("", CommitId::short)
    }

    pub fn new(cfg: Config, mut ctx: Context) -> Result<Self, BackendError> {
        let ledger = ctx.ledger.clone().ok_or_else(|| {
            BackendError::Config("the nomad backend needs the state database".into())
        })?;
        let client = Client::new(&cfg, &mut ctx)?;
        let cluster = match &cfg.region {
            Some(r) => format!("{}#{r}", client.address),
            None => client.address.clone(),
        };
        Ok(Nomad {
            cfg,
            ctx,
            client,
            ledger: Jobs(ledger),
            cluster,
        })
    }

    fn job_error(&self, file: &str, job: Option<&str>, msg: impl std::fmt::Display) -> JobReport {
        let what = match job {
            Some(j) => format!("{file} (job {j})"),
            None => file.to_string(),
        };
        let line = self.ctx.redactor.redact(&format!("{what}: {msg}"));
        tracing::error!(target_name = %self.ctx.name, "{line}");
        JobReport {
            result: JobResult::Failed,
            line,
        }
    }

    /// What registering git's jobs now would change, changing nothing
    /// (`driftless plan`): Nomad's parse and its plan dry-run with `Diff`
    /// per job file, against the live job's scaled counts, as `converge`
    /// plans before every register. Nothing is recorded in the ledger.
    async fn preview(&self) -> Result<super::Plan, String> {
        let files = self.job_files()?;
        if files.is_empty() {
            return Err(format!(
                "no job files matching `{}` in {}",
                self.cfg.jobs,
                self.ctx.workdir.display()
            ));
        }
        let mut lines = Vec::new();
        let mut items = Vec::new();
        let mut raw = Vec::new();
        let mut destructive = false;
        let (mut add, mut change) = (0, 0);
        let mut h = Sha256::new();
        h.update(b"driftless-nomad-plan-v1");
        for file in &files {
            let p = self.parse(file).await.map_err(|e| format!("{file}: {e}"))?;
            let key = &p.key;
            let live = self
                .live(key)
                .await
                .map_err(|e| format!("{file} (job {}): {e}", key.job))?;
            let spec = Self::with_live_counts(&p.job, live.as_ref());
            let plan = self
                .plan(key, &spec)
                .await
                .map_err(|e| format!("{file} (job {}): {e}", key.job))?;
            if plan.kind == "None" {
                continue;
            }
            let diff = redact_diff(&plan.diff, &self.ctx.redactor);
            // A task group removed from the job stops its allocations.
            let drops_group = diff["TaskGroups"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|g| g["Type"] == "Deleted");
            destructive |= drops_group;
            let sign = match plan.kind.as_str() {
                "Added" => {
                    add += 1;
                    "+"
                }
                _ => {
                    change += 1;
                    if drops_group { "-/+" } else { "~" }
                }
            };
            let address = format!("job {}/{}", key.namespace, key.job);
            let mut item = crate::plan::Change::new(
                address.clone(),
                "nomad_job",
                crate::plan::Action::of_sign(sign).unwrap_or(crate::plan::Action::Update),
            );
            item.after = redact_spec(&spec, &self.ctx.redactor);
            items.push(item);
            let mut said = json!({ "job": address, "file": file, "diff": diff,
                                    "annotations": plan.annotations });
            crate::plan::redact_json(&mut said, &self.ctx.redactor);
            raw.push(said);
            lines.push(format!(
                "{sign} job {}/{} ({file}, policy {}): {}",
                key.namespace,
                key.job,
                p.policy.as_str(),
                diff_summary(&plan.diff)
            ));
            h.update(format!("\0{}/{}\0{}\0", key.namespace, key.job, spec_hash(&spec)).as_bytes());
            h.update(diff.to_string().as_bytes());
        }
        Ok(super::Plan {
            changes: !lines.is_empty(),
            summary: format!("{add} job(s) to add, {change} to change"),
            diff: self.ctx.redactor.redact(&lines.join("\n")),
            destructive,
            hash: hex::encode(h.finalize()),
            artifact: None,
            items,
            raw: json!({ "jobs": raw }),
        })
    }

    async fn converge(&self) -> Status {
        let deadline = Instant::now() + self.ctx.timeout;
        let files = match self.job_files() {
            Ok(f) => f,
            Err(e) => return Status::failed(e),
        };
        if files.is_empty() {
            return Status::failed(format!(
                "no job files matching `{}` in {}",
                self.cfg.jobs,
                self.ctx.workdir.display()
            ));
        }
        let mut outcomes = Vec::new();
        let mut seen = BTreeSet::new();
        let mut parsed = Vec::new();
        for file in &files {
            match self.parse(file).await {
                Ok(p) => {
                    seen.insert(p.key.clone());
                    parsed.push(p);
                }
                Err(e) => outcomes.push(self.job_error(file, None, e)),
            }
        }
        // Parameterized jobs (hooks) first: a job's pre hook must be
        // registered before it is dispatched.
        parsed.sort_by_key(|p| p.job["ParameterizedJob"].is_null());
        let mut hooks = HookJobs::new();
        for p in &parsed {
            if Instant::now() > deadline {
                outcomes.push(self.job_error(
                    &p.file,
                    Some(&p.key.job),
                    "not reached before the target's timeout",
                ));
                continue;
            }
            match self.reconcile(p, &hooks).await {
                Ok(o) => {
                    if !p.job["ParameterizedJob"].is_null() {
                        let keys = |k: &str| -> Vec<String> {
                            p.job["ParameterizedJob"][k]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(|v| v.as_str().map(str::to_string))
                                .collect()
                        };
                        hooks.insert(
                            p.key.job.clone(),
                            HookJob {
                                key: p.key.clone(),
                                ok: o.result != JobResult::Failed,
                                meta_required: keys("MetaRequired"),
                                meta_optional: keys("MetaOptional"),
                                payload_required: p.job["ParameterizedJob"]["Payload"]
                                    == "required",
                            },
                        );
                    }
                    outcomes.push(o);
                }
                Err(o) => {
                    // The state could not be persisted: stop here.
                    outcomes.push(o);
                    break;
                }
            }
        }
        // Orphans: jobs this target deployed that git no longer has.
        match self.ledger.jobs_of(&self.ctx.name).await {
            Ok(known) => {
                let orphans: Vec<String> = known
                    .iter()
                    .filter(|d| d.key.cluster == self.cluster && !seen.contains(&d.key))
                    .map(|d| format!("{}/{}", d.key.namespace, d.key.job))
                    .collect();
                if !orphans.is_empty() {
                    outcomes.push(JobReport {
                        result: JobResult::NoChange,
                        line: format!(
                            "orphaned (removed from git, left running; driftless never stops jobs): {}",
                            orphans.join(", ")
                        ),
                    });
                }
            }
            Err(e) => outcomes.push(JobReport {
                result: JobResult::Failed,
                line: format!("cannot list this target's deployments: {e}"),
            }),
        }
        let result = if outcomes.iter().any(|o| o.result == JobResult::Failed) {
            ApplyResult::Failed
        } else if outcomes.iter().any(|o| o.result == JobResult::Changed) {
            ApplyResult::Changed
        } else {
            ApplyResult::NoChange
        };
        let lines: Vec<&str> = outcomes.iter().map(|o| o.line.as_str()).collect();
        Status {
            result,
            message: self.ctx.redactor.redact(&lines.join("; ")),
            output_tail: self.ctx.redactor.redact(&lines.join("\n")),
            digest: None,
        }
    }

    async fn outputs_inner(&self) -> Result<Outputs, BackendError> {
        let mut out = Outputs::new();
        let mut jobs = serde_json::Map::new();
        let mut seen = BTreeSet::new();
        for file in self.job_files().map_err(BackendError::Command)? {
            let parsed = match self.parse(&file).await {
                Ok(p) => p,
                Err(e) => {
                    jobs.insert(
                        file.clone(),
                        json!({ "error": self.ctx.redactor.redact(&e) }),
                    );
                    continue;
                }
            };
            seen.insert(parsed.key.clone());
            let key = &parsed.key;
            let live = self
                .live(key)
                .await
                .map_err(|e| BackendError::Command(e.to_string()))?;
            let active = self
                .ledger
                .active(key)
                .await
                .map_err(|e| BackendError::Command(e.to_string()))?;
            let latest = self
                .ledger
                .latest(key)
                .await
                .map_err(|e| BackendError::Command(e.to_string()))?;
            let spec = Self::with_live_counts(&parsed.job, live.as_ref());
            let plan = self
                .plan(key, &spec)
                .await
                .map_err(|e| BackendError::Command(e.to_string()))?;
            let dep = |d: &Deployment| {
                json!({
                    "id": d.id,
                    "state": d.state,
                    "commit": d.commit_sha,
                    "spec_hash": d.spec_hash,
                    "job_modify_index": d.job_modify_index,
                    "summary": d.diff_summary,
                    "diff": serde_json::from_str::<Value>(&d.plan_diff).unwrap_or(Value::Null),
                    "message": d.message,
                })
            };
            jobs.insert(
                key.job.clone(),
                json!({
                    "file": parsed.file,
                    "namespace": key.namespace,
                    "policy": parsed.policy.as_str(),
                    "live_version": live.as_ref().map(|l| l["Version"].clone()),
                    "job_modify_index": live.as_ref().map(|l| l["JobModifyIndex"].clone()),
                    "drift": if plan.kind == "None" { Value::Null } else {
                        json!({ "summary": diff_summary(&plan.diff), "diff": redact_diff(&plan.diff, &self.ctx.redactor) })
                    },
                    "active_deployment": active.as_ref().map(dep),
                    "last_deployment": latest.as_ref().map(dep),
                }),
            );
        }
        let orphans: Vec<Value> = self
            .ledger
            .jobs_of(&self.ctx.name)
            .await
            .map_err(|e| BackendError::Command(e.to_string()))?
            .into_iter()
            .filter(|d| d.key.cluster == self.cluster && !seen.contains(&d.key))
            .map(|d| json!(format!("{}/{}", d.key.namespace, d.key.job)))
            .collect();
        out.insert("jobs".into(), Value::Object(jobs));
        out.insert("orphans".into(), Value::Array(orphans));
        Ok(out)
    }

    async fn destroy_inner(&self) -> Status {
        if !self.cfg.allow_destroy {
            return Status::failed(
                "refused: driftless never stops Nomad jobs (set `allow_destroy = true` in the target's backend to let `destroy` deregister them, without purge)",
            );
        }
        let files = match self.job_files() {
            Ok(f) => f,
            Err(e) => return Status::failed(e),
        };
        let mut lines = Vec::new();
        let mut failed = false;
        for file in files {
            let parsed = match self.parse(&file).await {
                Ok(p) => p,
                Err(e) => {
                    failed = true;
                    lines.push(format!("{file}: {e}"));
                    continue;
                }
            };
            let key = &parsed.key;
            match self
                .client
                .call(
                    reqwest::Method::DELETE,
                    &format!("/v1/job/{}", seg(&key.job)),
                    Some(&key.namespace),
                    &[("purge", "false")],
                    None,
                    true,
                )
                .await
            {
                Ok(Some(_)) => lines.push(format!("{}: deregistered (not purged)", key.job)),
                Ok(None) => lines.push(format!("{}: not registered", key.job)),
                Err(e) => {
                    failed = true;
                    lines.push(format!("{}: {e}", key.job));
                }
            }
        }
        Status {
            result: if failed {
                ApplyResult::Failed
            } else {
                ApplyResult::Changed
            },
            message: self.ctx.redactor.redact(&lines.join("; ")),
            output_tail: String::new(),
            digest: None,
        }
    }
}

impl Backend for Nomad {
    /// Read-only, for `driftless plan`: Nomad's policies and approvals are
    /// per job (`meta { driftless_policy }`) and stay in its own ledger, so
    /// there is no `apply_plan`.
    fn plan(&self) -> Option<BoxFuture<'_, Result<super::Plan, String>>> {
        Some(Box::pin(self.preview()))
    }

    fn apply(&self) -> BoxFuture<'_, Status> {
        Box::pin(self.converge())
    }

    fn destroy(&self) -> BoxFuture<'_, Status> {
        Box::pin(self.destroy_inner())
    }

    fn outputs(&self) -> BoxFuture<'_, Result<Outputs, BackendError>> {
        Box::pin(self.outputs_inner())
    }
}

struct Plan {
    index: i64,
    diff: Value,
    kind: String,
    /// Nomad's `Annotations` (`DesiredTGUpdates` per group: place,
    /// destructive updates, stops, canaries).
    annotations: Value,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse() {
        assert_eq!(job_policy("auto"), Some(Policy::Auto));
        assert_eq!(job_policy("approval"), Some(Policy::Approval));
        assert_eq!(job_policy("none"), Some(Policy::Detect));
        assert_eq!(job_policy("detect"), Some(Policy::Detect));
        assert_eq!(job_policy("approve_destructive"), None);
        assert_eq!(job_policy("Auto"), None);
    }
}
