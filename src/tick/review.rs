//! The ticks that plan: `driftless plan` (`plan_now`), a `detect`
//! target's tick (plan, record drift, apply nothing), and the steps an
//! `approval` / `approve_destructive` target's tick (`tick::approval`)
//! shares with them: making, applying and discarding a recorded plan
//! (applied — exactly it, through `Backend::apply_plan` — only once a
//! person approved it and git still gives its commit). These are
//! steps of the one tick in `tick`; they never bypass its lock, run row or
//! result recording, and never apply a plan nobody approved (but a plan
//! that deletes or replaces nothing under `approve_destructive`).

use tracing::{info, warn};

use super::{BACKSTOP, Findings, Planned, Reconciler, RunInfo, TickError, Ticked};
use crate::backend::{self, ApplyResult, Plan, PlanToApply, Status};
use crate::config::Target;
use crate::lock::{LockError, TargetLock};
use crate::model::CommitId;
use crate::notify;
use crate::store::DriftUpdate;
use crate::store::deployments::{PlanState, StoredPlan};

impl Reconciler {
    /// A `detect` target's tick: plan, never apply. A difference is drift,
    /// recorded with its summary; the owners hear of a new or different
    /// drift once (`drift_detected`) and of its end once
    /// (`drift_resolved`). The last applied commit does not move.
    pub(super) async fn detect(
        &self,
        target: &Target,
        run: &RunInfo,
        seen: &CommitId,
        backend: Box<dyn backend::Backend>,
    ) -> Result<Ticked, TickError> {
        let prev = run.prev.as_ref();
        let applied = prev.and_then(|s| s.last_applied_sha.clone());
        let prev_hash = prev.and_then(|s| s.drift_hash.clone());
        let planned = self.plan_with(target, backend.as_ref()).await;
        if let Ok(p) = &planned {
            self.discard(target, backend.as_ref(), &p.hash, p.artifact.as_deref())
                .await;
        }
        let plan = planned.and_then(|p| {
            match &p.artifact {
                Some(a) => std::fs::remove_file(a)
                    .map_err(|e| format!("cannot remove the plan file {}: {e}", a.display())),
                None => Ok(()),
            }
            .map(|()| p)
        });
        let (status, drift) = match plan {
            Err(e) => (Status::failed(format!("cannot plan: {e}")), None),
            Ok(p) if p.changes => {
                let status = Status {
                    result: ApplyResult::NoChange,
                    message: format!(
                        "drift at {}: {}{} (policy detect: nothing applied)",
                        seen.short(),
                        p.summary,
                        if p.destructive { ", destructive" } else { "" }
                    ),
                    output_tail: p.diff.clone(),
                    digest: None,
                };
                let drift =
                    (prev_hash.as_deref() != Some(p.hash.as_str())).then(|| DriftUpdate::Set {
                        hash: p.hash.clone(),
                        summary: format!("{}\n{}", p.summary, p.diff),
                        since: prev
                            .and_then(|s| s.drift_since)
                            .unwrap_or_else(crate::store::now_ms),
                    });
                (status, drift)
            }
            Ok(_) => {
                let status = Status {
                    result: ApplyResult::NoChange,
                    message: format!("no drift: the real world matches {}", seen.short()),
                    output_tail: String::new(),
                    digest: None,
                };
                (status, prev_hash.is_some().then_some(DriftUpdate::Clear))
            }
        };
        self.finish_with(
            target,
            run,
            applied.as_deref(),
            Some(seen.as_str()),
            status,
            Findings {
                drift,
                ..Findings::default()
            },
        )
        .await
    }

    /// The plan hash people see: the backend's hash, keyed with this
    /// installation's key (migration 0009), so it tells nothing about the
    /// plan document it was made from.
    pub(super) async fn shown_hash(&self, backend_hash: &str) -> Result<String, TickError> {
        use hmac::{Hmac, Mac};
        let key = self.app.store.key("plan_hash").await?;
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(&key)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(backend_hash.as_bytes());
        Ok(hex::encode(mac.finalize().into_bytes()))
    }

    /// The backend's plan, bounded by the target's timeout.
    pub(super) async fn plan_with(
        &self,
        target: &Target,
        backend: &dyn backend::Backend,
    ) -> Result<Plan, String> {
        match backend.plan() {
            None => Err(format!("the {} backend cannot plan", target.backend.kind())),
            Some(fut) => match tokio::time::timeout(target.timeout + BACKSTOP, fut).await {
                Ok(p) => p.map_err(|e| format!("{e}{}", target.sparse_hint())),
                Err(_) => Err(format!(
                    "the backend did not finish planning within the target's timeout ({})",
                    humantime::format_duration(target.timeout)
                )),
            },
        }
    }

    /// Whether git gives the target the same files at commit `planned` as
    /// at `seen`: the same commit, or the same tree under the target's path
    /// (what `unaffected` decides for a push). `false` when git cannot
    /// tell (a commit gone from the cache after a force push).
    pub(super) async fn same_inputs(
        &self,
        target: &Target,
        planned: &str,
        seen: &CommitId,
    ) -> bool {
        self.git
            .path_between(&target.repo, &target.path, planned, seen.as_str())
            .await
            == crate::git::PathBetween::Same
    }

    /// Apply a recorded plan now in state `applying`; the run's result
    /// moves it to `applied` or `failed` in the run's transaction.
    pub(super) async fn apply_recorded(
        &self,
        target: &Target,
        run: &RunInfo,
        seen: &CommitId,
        backend: Box<dyn backend::Backend>,
        plan: StoredPlan,
        note: Option<String>,
    ) -> Result<Ticked, TickError> {
        let to_apply = PlanToApply {
            hash: plan
                .backend_hash
                .clone()
                .unwrap_or_else(|| plan.plan_hash.clone()),
            artifact: plan.artifact.as_ref().map(std::path::PathBuf::from),
        };
        let mut status = match backend.apply_plan(&to_apply) {
            None => Status::failed(format!(
                "the {} backend cannot apply a plan",
                target.backend.kind()
            )),
            Some(fut) => match tokio::time::timeout(target.timeout + BACKSTOP, fut).await {
                Ok(s) => s,
                Err(_) => Status::failed(format!(
                    "the backend did not return within the target's timeout ({})",
                    humantime::format_duration(target.timeout)
                )),
            },
        };
        if status.result == ApplyResult::Failed {
            self.discard_stored(target, backend.as_ref(), &plan).await;
        }
        self.prune_plans(target, None);
        let by = plan.decided_by.as_deref().unwrap_or("?");
        let state = if status.result == ApplyResult::Failed {
            PlanState::Failed
        } else {
            PlanState::Applied
        };
        // Outputs others take, as after an unattended apply. The plan was
        // applied either way; a failure to keep them is said in the run.
        if state == PlanState::Applied
            && self.consumed(target)
            && let Err(e) = self
                .keep_outputs(target, run.id, status.result, backend.as_ref())
                .await
        {
            tracing::error!(target = %target.name, error = %e, "cannot keep the outputs other targets take");
            status.message = format!(
                "{}; but its outputs, which other targets take, could not be kept: {e}",
                status.message
            );
        }
        // An approved plan applied is health-gated as any apply.
        let mut quarantine = None;
        if state == PlanState::Applied {
            let gated = self
                .gate(target, run, seen.as_str(), status, backend.as_ref())
                .await?;
            quarantine = gated.quarantine;
            status = gated.status;
        }
        // driftless decides only where no person is asked: say so, not
        // "approved" (a person approves).
        let decided = if by == "driftless" {
            "applied unattended".to_string()
        } else {
            format!("approved by {by}")
        };
        status.message = format!(
            "deployment {} ({} at {}, {decided}){}: {}",
            plan.id,
            plan.summary,
            seen.short(),
            note.map(|n| format!(", {n}")).unwrap_or_default(),
            status.message
        );
        let done = (
            plan.id,
            state,
            notify::bounded(&status.message, notify::MESSAGE_MAX),
        );
        let applied = match state {
            PlanState::Applied => Some(seen.as_str()),
            _ => run
                .prev
                .as_ref()
                .and_then(|s| s.last_applied_sha.as_deref()),
        };
        self.finish_with(
            target,
            run,
            applied,
            Some(seen.as_str()),
            status,
            Findings {
                plan_done: Some(done),
                quarantine,
                ..Findings::default()
            },
        )
        .await
    }

    /// An approved plan whose file `file` is not on this host (another
    /// instance made it, or the file was lost): the plan is made again
    /// here. The same hash means the same changes the same way, so the new
    /// plan's file is applied in its place; a different one supersedes the
    /// approval, and the new plan waits for a person (it is never applied
    /// on the strength of an approval given to another plan).
    pub(super) async fn plan_again(
        &self,
        target: &Target,
        backend: &dyn backend::Backend,
        open: &StoredPlan,
        file: &str,
    ) -> Result<Again, TickError> {
        let approved = open.backend_hash.as_deref().unwrap_or(&open.plan_hash);
        let plan = match self.plan_with(target, backend).await {
            Ok(p) => p,
            Err(e) => {
                self.prune_plans(target, None);
                return Ok(Again::Stop(Status::failed(format!(
                    "deployment {} is approved, but its plan file {file} is not on this host and                      planning it again here failed: {e}; nothing applied, it stays approved",
                    open.id
                ))));
            }
        };
        if plan.hash == approved {
            info!(target = %target.name, deployment = open.id, file,
                  "the approved plan's file is not here; the plan made again is the same");
            let said = format!(
                "made again on this host (its plan file {file} is not here) and found the same"
            );
            let artifact = plan.artifact.as_ref().map(|a| a.display().to_string());
            return Ok(Again::Same(artifact, said));
        }
        let msg = format!(
            "not applied: its plan file {file} is not on this host, and the plan made again here              differs from the approved one (the state or the real world moved since); the new              plan waits for approval"
        );
        if !self
            .app
            .store
            .move_plan(open.id, PlanState::Approved, PlanState::Superseded, &msg)
            .await?
        {
            self.discard(target, backend, &plan.hash, plan.artifact.as_deref())
                .await;
            self.prune_plans(target, None);
            return Ok(Again::Stop(Status {
                result: ApplyResult::NoChange,
                message: format!(
                    "deployment {} changed state meanwhile; nothing applied",
                    open.id
                ),
                output_tail: String::new(),
                digest: None,
            }));
        }
        warn!(target = %target.name, deployment = open.id, file,
              "the approved plan's file is not here and the plan made again differs: nothing applied");
        Ok(Again::Differs(plan))
    }

    /// Let go of a plan that will not be applied: what the backend holds
    /// for it elsewhere (a CloudFormation change set) is deleted, while its
    /// file says it is still held. A failure is a WARN naming the target:
    /// the plan is never applied either way.
    pub(super) async fn discard(
        &self,
        target: &Target,
        backend: &dyn backend::Backend,
        hash: &str,
        artifact: Option<&std::path::Path>,
    ) {
        let Some(file) = artifact.filter(|a| a.exists()) else {
            return;
        };
        let plan = PlanToApply {
            hash: hash.to_string(),
            artifact: Some(file.to_path_buf()),
        };
        let Some(fut) = backend.discard_plan(&plan) else {
            return;
        };
        match tokio::time::timeout(target.timeout + BACKSTOP, fut).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                warn!(target = %target.name, error = %e, "cannot let go of a plan that will not be applied")
            }
            Err(_) => {
                warn!(target = %target.name, "letting go of a plan that will not be applied timed out")
            }
        }
    }

    pub(super) async fn discard_stored(
        &self,
        target: &Target,
        backend: &dyn backend::Backend,
        plan: &StoredPlan,
    ) {
        let artifact = plan.artifact.as_ref().map(std::path::PathBuf::from);
        self.discard(target, backend, &plan.plan_hash, artifact.as_deref())
            .await;
    }

    /// Remove every plan file of the target but `keep` (the open plan's):
    /// applied, rejected, superseded and abandoned plans leave nothing
    /// that could be applied later.
    pub(super) fn prune_plans(&self, target: &Target, keep: Option<&str>) {
        let dir = self.app.settings().plans_dir(&target.name);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                warn!(target = %target.name, dir = %dir.display(), error = %e, "cannot list plan files");
                return;
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if keep.is_some_and(|k| std::path::Path::new(k) == path) {
                continue;
            }
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                warn!(target = %target.name, file = %path.display(), error = %e, "cannot remove a plan file");
            }
        }
    }

    /// Plan a target now (`driftless plan`): under its lock, at its branch
    /// tip; nothing is applied and no run is recorded. The plan's artifact
    /// is removed before this returns (nothing can apply it later yet).
    pub async fn plan_now(&self, name: &str) -> Result<Planned, TickError> {
        let target = self.target(name)?;
        let _lock = match TargetLock::try_acquire(&self.app.settings().locks_dir(), name) {
            Ok(l) => l,
            Err(LockError::Busy { .. }) => return Ok(Planned::Busy),
            Err(e) => return Err(TickError::Lock(e)),
        };
        let err = |message: String| TickError::Backend {
            target: name.to_string(),
            message,
        };
        let state = self.app.store.target_state(name).await?;
        let applied = state.as_ref().and_then(|s| s.last_applied_sha.clone());
        // What a tick would refuse is not planned either: a plan runs the
        // repository's code.
        let tip = match &target.tag {
            None => self
                .git
                .fetch(&target.repo, &target.branch, &target.git)
                .await
                .map_err(|e| err(e.to_string()))?,
            Some(pattern) => {
                let t = self
                    .git
                    .fetch_tag(
                        &target.repo,
                        pattern,
                        &target.git,
                        std::time::Instant::now(),
                    )
                    .await
                    .map_err(|e| err(e.to_string()))?;
                self.tag_may_apply(&target, &t).await.map_err(err)?;
                t.commit
            }
        };
        if target.tag.is_none()
            && let Some(v) = &target.verify
        {
            let last = state.as_ref().and_then(|s| s.last_applied_sha.as_deref());
            self.git
                .verify(&target.name, &target.repo, tip.as_str(), last, v)
                .await
                .map_err(|e| err(e.to_string()))?;
        }
        self.own_checkout(&target).map_err(err)?;
        let synced = self
            .git
            .checkout(target.source(), &tip)
            .await
            .map_err(|e| err(e.to_string()))?;
        self.note_checkout(&target).map_err(err)?;
        let mut ctx = self.context(
            &target,
            &synced,
            state.and_then(|s| s.backend_digest),
            false,
        );
        let mut shown = std::collections::BTreeMap::new();
        if !target.inputs.is_empty() {
            let inputs = self.resolve_inputs(&target).await?.map_err(err)?;
            let values = inputs.values.clone();
            super::with_inputs(&mut ctx, inputs);
            shown = values
                .into_iter()
                .map(|(k, v)| (k, ctx.redactor.redact(&v)))
                .collect();
        }
        // As for an apply: decrypted for the plan alone.
        let note = self.app.settings().decrypted_note(name);
        crate::decrypt::remove_leftovers(&note).map_err(|e| err(e.to_string()))?;
        let opened = match &target.decrypt {
            None => None,
            Some(sops) => {
                let o = crate::decrypt::open(&synced.workdir, &note, sops)
                    .await
                    .map_err(|e| err(ctx.redactor.redact(&e.to_string())))?;
                for v in &o.secrets {
                    ctx.redactor.add(v.clone());
                }
                Some(o)
            }
        };
        let planned = match backend::build(&target.backend, ctx) {
            Ok(b) => Ok(self.plan_and_let_go(&target, b.as_ref()).await),
            Err(e) => Err(err(e.to_string())),
        };
        if let Some(o) = opened {
            o.close().map_err(|e| err(e.to_string()))?;
        }
        let Some(plan) = planned? else {
            return Ok(Planned::CannotPlan {
                backend: target.backend.kind(),
            });
        };
        let mut plan = plan.map_err(err)?;
        plan.hash = self.shown_hash(&plan.hash).await?;
        let document = self
            .plan_document(&target, applied.as_deref(), shown, &synced.sha, &plan)
            .await;
        let policies = match self.guarded(&target) {
            true => Some(self.evaluate(&target, &document).await),
            false => None,
        };
        Ok(Planned::Plan {
            commit: synced.sha,
            plan,
            document: Box::new(document),
            policies,
        })
    }
}

impl Reconciler {
    /// Plan with `b` within the target's timeout, then let go of the plan:
    /// what the backend holds for it is discarded and its file removed
    /// (nothing can apply it later). `None`: the backend cannot plan.
    pub(super) async fn plan_and_let_go(
        &self,
        target: &Target,
        b: &dyn backend::Backend,
    ) -> Option<Result<Plan, String>> {
        let fut = b.plan()?;
        let plan = match tokio::time::timeout(target.timeout + BACKSTOP, fut).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Some(Err(e)),
            Err(_) => {
                return Some(Err(format!(
                    "the backend did not finish planning within the target's timeout ({})",
                    humantime::format_duration(target.timeout)
                )));
            }
        };
        self.discard(target, b, &plan.hash, plan.artifact.as_deref())
            .await;
        if let Some(a) = &plan.artifact
            && let Err(e) = std::fs::remove_file(a)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Some(Err(format!(
                "cannot remove the plan file {}: {e}",
                a.display()
            )));
        }
        Some(Ok(plan))
    }
}

/// What [`Reconciler::plan_again`] found.
pub(super) enum Again {
    /// The same plan: apply this file (if the backend keeps one), saying so.
    Same(Option<String>, String),
    /// Another plan; the approved one is superseded.
    Differs(Plan),
    /// Nothing more this tick: the run ends with this status.
    Stop(Status),
}

/// The target's path as a person reads it (`.` for the repository root).
pub(super) fn shown_path(target: &Target) -> String {
    if target.path.as_os_str().is_empty() {
        ".".to_string()
    } else {
        target.path.display().to_string()
    }
}

/// What changed in what `plan` was made from, beside its commit, for the
/// run that looks at it (`tick::identity`); empty when nothing did, or
/// when this run does not review plans.
pub(super) fn made_from_changes(run: &RunInfo, plan: &StoredPlan) -> Vec<String> {
    match &run.made_from {
        Some(now) => now.changes_since(plan.made_from.as_deref()),
        None => Vec::new(),
    }
}
