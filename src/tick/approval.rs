//! An `approval` or `approve_destructive` target's tick: what its open
//! plan makes of the tick (wait, carry, supersede, apply once approved),
//! and a new plan recorded before anyone sees it. A step of the one tick in
//! `tick`: it never bypasses its lock, run row or result recording, and
//! never applies a plan nobody approved (but one that deletes or replaces
//! nothing under `approve_destructive`).

use std::path::Path;

use tracing::info;

use super::guard::Decision;
use super::review::{Again, made_from_changes, shown_path};
use super::{Findings, Reconciler, RunInfo, TickError, Ticked};
use crate::backend::{self, ApplyResult, Plan, Status};
use crate::config::{Policy, Target};
use crate::model::{CommitId, short_sha};
use crate::notify;
use crate::store::deployments::{NewPlan, PlanState, StoredPlan};

impl Reconciler {
    /// An `approval` or `approve_destructive` target's tick. The target's
    /// open plan decides ([`Self::open_plan_decides`]): one made at an
    /// older commit is superseded (and a new plan made); one still waiting
    /// keeps waiting; an approved one is applied — exactly it, by the
    /// backend's `apply_plan` — because git still gives its commit. Without
    /// an open plan, a plan is made and recorded before anyone sees it
    /// ([`Self::plan_and_ask`]). A plan rejected or failed at this commit
    /// holds the target until a new commit or `driftless retry`. Waiting
    /// never moves the last applied commit.
    pub(super) async fn review(
        &self,
        target: &Target,
        run: &RunInfo,
        seen: &CommitId,
        backend: Box<dyn backend::Backend>,
        retry: bool,
    ) -> Result<Ticked, TickError> {
        let applied = run.prev.as_ref().and_then(|s| s.last_applied_sha.clone());
        let next = self
            .open_plan_decides(target, run, seen, backend.as_ref(), retry)
            .await?;
        match next {
            // The run ends here, the last applied commit unchanged.
            Next::End { status, waiting } => {
                self.finish_with(
                    target,
                    run,
                    applied.as_deref(),
                    Some(seen.as_str()),
                    status,
                    Findings {
                        waiting,
                        ..Findings::default()
                    },
                )
                .await
            }
            Next::Apply(open, note) => {
                self.apply_recorded(target, run, seen, backend, *open, note)
                    .await
            }
            Next::Plan {
                replanned,
                not_applied,
            } => {
                self.plan_and_ask(target, run, seen, backend, replanned, not_applied)
                    .await
            }
        }
    }

    /// What the target's open plan (or, without one, its last plan) makes
    /// of this tick.
    async fn open_plan_decides(
        &self,
        target: &Target,
        run: &RunInfo,
        seen: &CommitId,
        backend: &dyn backend::Backend,
        retry: bool,
    ) -> Result<Next, TickError> {
        let store = &self.app.store;
        if let Some(open) = store.open_plan(&target.name).await? {
            return self.settle_open(target, run, seen, backend, open).await;
        }
        if !retry
            && let Some(last) = store.latest_plan(&target.name).await?
            && matches!(last.state, PlanState::Rejected | PlanState::Failed)
            // An `auto` target (reviewed because a policy covers it) holds
            // on a plan its policies refused, and retries any other failure
            // at its next tick as an unguarded one does.
            && (target.policy != Policy::Auto || last.decided_by.as_deref() == Some(POLICY))
            && made_from_changes(run, &last).is_empty()
            && self.same_inputs(target, &last.commit_sha, seen).await
        {
            let msg = format!(
                "deployment {} at {} was {}{}: nothing is applied until a new commit or `driftless retry {}`",
                last.id,
                seen.short(),
                last.state.as_str(),
                match (last.state, &last.decided_by, &last.message) {
                    (PlanState::Rejected, Some(by), _) => format!(" by {by}"),
                    (PlanState::Failed, _, Some(m)) => format!(" ({m})"),
                    _ => String::new(),
                },
                target.name
            );
            self.discard_stored(target, backend, &last).await;
            self.prune_plans(target, None);
            let status = if last.state == PlanState::Failed {
                Status::failed(msg)
            } else {
                quiet(msg)
            };
            return Ok(Next::stay(status));
        }
        Ok(Next::Plan {
            replanned: None,
            not_applied: None,
        })
    }

    /// The open plan `open` at commit `seen`: failed if a tick died
    /// applying it, carried to `seen` when its files are the same,
    /// superseded when they or what else it was made from changed, waiting
    /// while it waits, applied once approved.
    async fn settle_open(
        &self,
        target: &Target,
        run: &RunInfo,
        seen: &CommitId,
        backend: &dyn backend::Backend,
        mut open: StoredPlan,
    ) -> Result<Next, TickError> {
        let store = &self.app.store;
        if open.state == PlanState::Applying {
            // A tick died while the backend applied it.
            let msg = format!(
                "deployment {} (plan at {}) was being applied when driftless stopped; what it \
                 changed is unknown: look at the target, then `driftless retry {}`",
                open.id,
                short_sha(&open.commit_sha),
                target.name
            );
            store
                .move_plan(open.id, PlanState::Applying, PlanState::Failed, &msg)
                .await?;
            self.prune_plans(target, None);
            return Ok(Next::stay(Status::failed(msg)));
        }
        // What it was made from beside its commit (inputs, decrypted
        // files, the backend table): a change supersedes it as a new
        // commit does, and it says which.
        let changed = made_from_changes(run, &open);
        // A newer commit that changes nothing under the target's path
        // (another directory of a monorepo) gives the same files: the
        // plan is carried to it, not made again and asked again.
        let same_tree = open.commit_sha == seen.as_str()
            || self.same_inputs(target, &open.commit_sha, seen).await;
        if open.commit_sha != seen.as_str() && same_tree && changed.is_empty() {
            let msg = format!(
                "carried to commit {}: nothing under `{}` changed since {}",
                seen.short(),
                shown_path(target),
                short_sha(&open.commit_sha)
            );
            if store
                .carry_plan(open.id, open.state, &open.commit_sha, seen.as_str(), &msg)
                .await?
            {
                info!(target = %target.name, deployment = open.id, commit = %seen.short(),
                      "a commit that leaves the target's files alone carries its plan");
                open.commit_sha = seen.as_str().to_string();
            }
        }
        if open.commit_sha != seen.as_str() || !changed.is_empty() {
            return self
                .supersede_open(target, seen, backend, &open, same_tree, &changed)
                .await;
        }
        if open.state == PlanState::PendingApproval {
            self.prune_plans(target, open.artifact.as_deref());
            let msg = format!(
                "deployment {} waits for approval: {} at {}",
                open.id,
                open.summary,
                seen.short()
            );
            return Ok(Next::wait(msg));
        }
        self.approved_open(target, backend, open).await
    }

    /// The open plan superseded: the files under its path changed with
    /// the commit, or what else it was made from did (`changed`).
    async fn supersede_open(
        &self,
        target: &Target,
        seen: &CommitId,
        backend: &dyn backend::Backend,
        open: &StoredPlan,
        same_tree: bool,
        changed: &[String],
    ) -> Result<Next, TickError> {
        // Why, in words.
        let mut why = Vec::new();
        if !same_tree {
            why.push(format!("commit {} changed its files", seen.short()));
        }
        why.extend(changed.iter().cloned());
        let msg = if same_tree {
            format!("superseded: {}", why.join("; "))
        } else {
            format!(
                "superseded by commit {}{}",
                seen.short(),
                changed.iter().map(|c| format!("; {c}")).collect::<String>()
            )
        };
        self.app
            .store
            .move_plan(open.id, open.state, PlanState::Superseded, &msg)
            .await?;
        info!(target = %target.name, deployment = open.id, commit = %seen.short(),
              why = %msg, "a plan that waited is superseded");
        // The new plan's run says why an approved one was not applied.
        let not_applied = (open.state == PlanState::Approved).then(|| {
            format!(
                "deployment {} was approved but not applied: {}",
                open.id,
                why.join("; ")
            )
        });
        self.discard_stored(target, backend, open).await;
        self.prune_plans(target, None);
        Ok(Next::Plan {
            replanned: None,
            not_applied,
        })
    }

    /// An approved plan, applied now if nobody moved it meanwhile. One made
    /// by another instance (or whose file is lost) is planned again here
    /// and applied only when the same plan; a different one waits for
    /// approval in its place.
    async fn approved_open(
        &self,
        target: &Target,
        backend: &dyn backend::Backend,
        mut open: StoredPlan,
    ) -> Result<Next, TickError> {
        let mut note = None;
        let mine = self.app.settings().plans_dir(&target.name);
        if let Some(file) = open
            .artifact
            .clone()
            .filter(|a| !(Path::new(a).starts_with(&mine) && Path::new(a).exists()))
        {
            match self.plan_again(target, backend, &open, &file).await? {
                Again::Same(new_file, said) => {
                    open.artifact = new_file;
                    note = Some(said);
                }
                Again::Differs(plan) => {
                    return Ok(Next::Plan {
                        replanned: Some((open.id, plan)),
                        not_applied: None,
                    });
                }
                Again::Stop(status) => return Ok(Next::stay(status)),
            }
        }
        let msg = format!(
            "applying exactly the plan approved by {}",
            open.decided_by.as_deref().unwrap_or("?")
        );
        if !self
            .app
            .store
            .move_plan(open.id, PlanState::Approved, PlanState::Applying, &msg)
            .await?
        {
            let msg = format!(
                "deployment {} changed state meanwhile; nothing applied",
                open.id
            );
            return Ok(Next::stay(quiet(msg)));
        }
        Ok(Next::Apply(Box::new(open), note))
    }

    /// A new plan (or `replanned`, one already made again in place of an
    /// approved deployment), recorded before anyone sees it: with changes
    /// it waits for a person or, under `approve_destructive`, is applied at
    /// once when it neither deletes nor replaces anything; without, the
    /// real world matches the commit.
    async fn plan_and_ask(
        &self,
        target: &Target,
        run: &RunInfo,
        seen: &CommitId,
        backend: Box<dyn backend::Backend>,
        replanned: Option<(i64, Plan)>,
        not_applied: Option<String>,
    ) -> Result<Ticked, TickError> {
        let store = &self.app.store;
        let applied = run.prev.as_ref().and_then(|s| s.last_applied_sha.clone());
        // `matches`: the real world matches `seen`, now the commit applied.
        let end = |status: Status, matches: bool, waiting: bool| {
            self.finish_with(
                target,
                run,
                if matches {
                    Some(seen.as_str())
                } else {
                    applied.as_deref()
                },
                Some(seen.as_str()),
                status,
                Findings {
                    waiting,
                    ..Findings::default()
                },
            )
        };
        let superseded = replanned.as_ref().map(|(id, _)| *id);
        let planned = match replanned {
            Some((_, p)) => Ok(p),
            None => self.plan_with(target, backend.as_ref()).await,
        };
        let plan = match planned {
            Ok(p) => p,
            Err(e) => {
                self.prune_plans(target, None);
                return end(Status::failed(format!("cannot plan: {e}")), false, false).await;
            }
        };
        if !plan.changes {
            self.prune_plans(target, None);
            let msg = format!(
                "{}no changes: the real world matches {}",
                not_applied
                    .as_ref()
                    .map(|n| format!("{n}; "))
                    .unwrap_or_default(),
                seen.short()
            );
            return end(quiet(msg), true, false).await;
        }
        // The policies covering the target judge the plan before anyone
        // sees it: a denial (or a policy that cannot be evaluated)
        // applies nothing.
        let Decision {
            unattended,
            findings,
            plan_msg,
        } = match self.decide(target, run, seen, &plan).await {
            Ok(d) => d,
            Err(why) => return self.refuse(target, run, seen, backend, &plan, why).await,
        };
        let made_from = run.made_from.as_ref().map(|m| m.stored());
        let artifact = plan.artifact.as_ref().map(|a| a.display().to_string());
        let shown = self.shown_hash(&plan.hash).await?;
        let new = NewPlan {
            artifact: artifact.as_deref(),
            state: if unattended {
                PlanState::Applying
            } else {
                PlanState::PendingApproval
            },
            decided_by: unattended.then_some("driftless"),
            ..plan_row(target, seen, &shown, &plan, made_from.as_deref(), &plan_msg)
        };
        let stored = match store.insert_plan(&new).await {
            Ok(p) => p,
            Err(e) => {
                self.prune_plans(target, None);
                return Err(e.into());
            }
        };
        if unattended {
            let note = (!findings.is_empty()).then(|| findings.clone());
            return self
                .apply_recorded(target, run, seen, backend, stored, note)
                .await;
        }
        info!(target = %target.name, deployment = stored.id, commit = %seen.short(),
              summary = %stored.summary, destructive = stored.destructive, "a plan waits for approval");
        let msg = format!(
            "{}{}deployment {} waits for approval: {}{} at {}{}",
            not_applied.map(|n| format!("{n}; ")).unwrap_or_default(),
            superseded
                .map(|id| format!(
                    "deployment {id} was not applied: the plan made again on this host, where \
                     its plan file is not, differs from the approved one; "
                ))
                .unwrap_or_default(),
            stored.id,
            stored.summary,
            if stored.destructive {
                " (destructive)"
            } else {
                ""
            },
            seen.short(),
            if findings.is_empty() {
                String::new()
            } else {
                format!("; {findings}")
            }
        );
        end(quiet(msg), false, true).await
    }

    /// A plan the policies refused (`why`): recorded as failed, so the
    /// target holds at this commit until a new one, a change of what the
    /// plan is made from (the policies among it) or `driftless retry`;
    /// what it holds outside driftless let go of; the run failed.
    async fn refuse(
        &self,
        target: &Target,
        run: &RunInfo,
        seen: &CommitId,
        backend: Box<dyn backend::Backend>,
        plan: &Plan,
        why: String,
    ) -> Result<Ticked, TickError> {
        let applied = run.prev.as_ref().and_then(|s| s.last_applied_sha.clone());
        let made_from = run.made_from.as_ref().map(|m| m.stored());
        let shown = self.shown_hash(&plan.hash).await?;
        let why = notify::bounded(&why, notify::MESSAGE_MAX);
        let new = NewPlan {
            state: PlanState::Failed,
            decided_by: Some(POLICY),
            ..plan_row(target, seen, &shown, plan, made_from.as_deref(), &why)
        };
        self.discard(
            target,
            backend.as_ref(),
            &plan.hash,
            plan.artifact.as_deref(),
        )
        .await;
        self.prune_plans(target, None);
        let stored = self.app.store.insert_plan(&new).await?;
        tracing::warn!(target = %target.name, deployment = stored.id, commit = %seen.short(),
              why = %why, "a plan is refused by policy");
        let status = Status {
            result: ApplyResult::Failed,
            message: format!(
                "deployment {} ({} at {}): {why}; nothing applied",
                stored.id,
                plan.summary,
                seen.short()
            ),
            output_tail: plan.diff.clone(),
            digest: None,
        };
        self.finish_with(
            target,
            run,
            applied.as_deref(),
            Some(seen.as_str()),
            status,
            Findings::default(),
        )
        .await
    }
}

/// Who decided a plan the policies refused.
const POLICY: &str = "policy";

/// Where the target's plans leave a reviewing tick.
enum Next {
    /// The run ends with this status, the last applied commit unchanged
    /// (`waiting`: a plan waits for a person).
    End { status: Status, waiting: bool },
    /// This approved plan, now `applying`, is applied (with a note for the
    /// run's message).
    Apply(Box<StoredPlan>, Option<String>),
    /// A plan is made (`replanned`: already made again, in place of this
    /// approved deployment; `not_applied`: why an approved one was not
    /// applied).
    Plan {
        replanned: Option<(i64, Plan)>,
        not_applied: Option<String>,
    },
}

impl Next {
    fn stay(status: Status) -> Next {
        Next::End {
            status,
            waiting: false,
        }
    }

    fn wait(message: String) -> Next {
        Next::End {
            status: quiet(message),
            waiting: true,
        }
    }
}

/// A run that changed nothing, saying `message`.
fn quiet(message: String) -> Status {
    Status {
        result: ApplyResult::NoChange,
        message,
        output_tail: String::new(),
        digest: None,
    }
}

/// The row of `plan`, made at `seen` for `target`, as it waits for a person
/// (no plan file, no decision); callers set what differs.
fn plan_row<'a>(
    target: &'a Target,
    seen: &'a CommitId,
    shown: &'a str,
    plan: &'a Plan,
    made_from: Option<&'a str>,
    message: &'a str,
) -> NewPlan<'a> {
    NewPlan {
        target: &target.name,
        backend: target.backend.kind(),
        commit_sha: seen.as_str(),
        plan_hash: shown,
        backend_hash: &plan.hash,
        policy: target.policy.as_str(),
        summary: &plan.summary,
        diff: &plan.diff,
        destructive: plan.destructive,
        artifact: None,
        state: PlanState::PendingApproval,
        decided_by: None,
        message,
        made_from,
    }
}
