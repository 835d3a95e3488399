//! Policies at run time (`[[policies]]`): which targets are guarded, the
//! plan document a plan becomes, and what the policies make of it. A
//! target a policy covers is planned before every apply — an `auto`
//! target's tick goes through `tick::approval` too, applied unattended
//! unless a policy asks for a person — so what is evaluated is exactly
//! what is applied. A policy that cannot be read or evaluated refuses the
//! plan (fail closed). This module judges; recording and applying stay
//! `tick::approval`'s.

use super::{Reconciler, RunInfo};
use crate::backend::Plan;
use crate::config::{Policy, Target};
use crate::model::CommitId;
use crate::plan::Document;
use crate::policy::Outcome;

/// Whether a recorded plan is applied at once, and what its run and
/// deployment say of the policies.
pub(super) struct Decision {
    /// Applied without a person.
    pub unattended: bool,
    /// The findings that did not stop it, in words ("" when none).
    pub findings: String,
    /// The deployment's message.
    pub plan_msg: String,
}

/// What the policies make of a plan.
pub(super) enum Judged {
    /// Not denied: applied (or waiting) with these findings.
    Pass(Outcome),
    /// Denied, or the policies could not be evaluated: the message.
    Refused(String),
}

impl Reconciler {
    /// Whether a policy covers `target`.
    pub(super) fn guarded(&self, target: &Target) -> bool {
        !self.app.settings().policies_for(&target.name).is_empty()
    }

    /// Whether `target`'s applies go through a recorded plan
    /// (`tick::approval`): an approval policy, or an `auto` target a
    /// policy covers (but Nomad's, whose jobs keep their own plans: see
    /// [`Self::gate_units`]).
    pub(super) fn reviews(&self, target: &Target) -> bool {
        target.tick_policy().reviews()
            || (target.tick_policy() == Policy::Auto
                && !target.backend.reviews_units()
                && self.guarded(target))
    }

    /// The digest of the policy files that cover `target` as they are now
    /// (`None`: no policy covers it): a plan is made from it.
    pub(super) fn policies_digest(&self, target: &Target) -> Option<String> {
        let settings = self.app.settings();
        let specs = settings.policies_for(&target.name);
        (!specs.is_empty()).then(|| crate::policy::digest_of(&specs))
    }

    /// `plan` of `target` at `seen` as the document a policy reads
    /// (`applied`: the commit applied last; `inputs`: as shown).
    pub(super) async fn plan_document(
        &self,
        target: &Target,
        applied: Option<&str>,
        inputs: std::collections::BTreeMap<String, String>,
        seen: &CommitId,
        plan: &Plan,
    ) -> Document {
        let files_changed = match applied {
            Some(a) => self
                .git
                .files_between(&target.repo, a, seen.as_str())
                .await
                .ok(),
            None => None,
        };
        // Terraform's raw plan has them, where conftest's policies read.
        let resource_changes = plan.raw["resource_changes"].clone();
        Document {
            version: crate::plan::VERSION,
            target: target.name.clone(),
            backend: target.backend.kind().to_string(),
            commit: seen.as_str().to_string(),
            signer: target
                .verify
                .as_ref()
                .and_then(|_| self.git.signer(&target.name, seen.as_str())),
            files_changed,
            inputs,
            summary: plan.summary.clone(),
            destructive: plan.destructive,
            changes: plan.changes(),
            raw: plan.raw.clone(),
            resource_changes,
        }
    }

    /// Evaluate every policy covering `target` against `doc`: the
    /// findings, or why they could not be had.
    pub(super) async fn evaluate(
        &self,
        target: &Target,
        doc: &Document,
    ) -> Result<Outcome, String> {
        let specs: Vec<crate::policy::Spec> = self
            .app
            .settings()
            .policies_for(&target.name)
            .into_iter()
            .cloned()
            .collect();
        let input = serde_json::to_value(doc)
            .map_err(|e| format!("the plan document does not serialise: {e}"))?;
        let started = std::time::Instant::now();
        let n = specs.len();
        let out = tokio::task::spawn_blocking(move || {
            let refs: Vec<&crate::policy::Spec> = specs.iter().collect();
            crate::policy::evaluate_all(&refs, &input)
        })
        .await
        .map_err(|e| format!("the policy evaluation stopped: {e}"))?
        .map_err(|e| {
            format!("refused: {e} (a policy that cannot be evaluated refuses every plan)")
        });
        // bench/policy.sh reads this line.
        tracing::info!(target = %target.name, policies = n,
            micros = started.elapsed().as_micros() as u64, "policies evaluated");
        out
    }

    /// Whether `plan` (with changes) is applied without a person: the
    /// target's policy (`auto`; `approve_destructive` when it deletes or
    /// replaces nothing), unless a policy asks for one. `Err`: the
    /// policies refused it, and why.
    pub(super) async fn decide(
        &self,
        target: &Target,
        run: &RunInfo,
        seen: &CommitId,
        plan: &Plan,
    ) -> Result<Decision, String> {
        let outcome = if self.guarded(target) {
            match self.judge(target, run, seen, plan).await {
                Judged::Pass(o) => o,
                Judged::Refused(why) => return Err(why),
            }
        } else {
            Outcome::default()
        };
        let findings = said(&outcome);
        let unattended = outcome.require_approval.is_empty()
            && match target.policy {
                Policy::ApproveDestructive => !plan.destructive,
                Policy::Auto => true,
                _ => false,
            };
        let why = match target.policy {
            Policy::Auto => "no policy asks for a person: applied unattended (policy auto)",
            _ => {
                "neither deletes nor replaces anything: applied unattended (policy approve_destructive)"
            }
        };
        let plan_msg = match (unattended, findings.is_empty()) {
            (true, true) => why.to_string(),
            (true, false) => format!("{why}; {findings}"),
            (false, true) => "waits for approval".to_string(),
            (false, false) => format!("waits for approval; {findings}"),
        };
        Ok(Decision {
            unattended,
            findings,
            plan_msg,
        })
    }

    /// Evaluate every policy covering `target` against its plan.
    pub(super) async fn judge(
        &self,
        target: &Target,
        run: &RunInfo,
        seen: &CommitId,
        plan: &Plan,
    ) -> Judged {
        let applied = run
            .prev
            .as_ref()
            .and_then(|s| s.last_applied_sha.as_deref());
        let doc = self
            .plan_document(target, applied, run.shown_inputs.clone(), seen, plan)
            .await;
        match self.evaluate(target, &doc).await {
            Err(e) => Judged::Refused(e),
            Ok(o) if !o.deny.is_empty() => {
                let why: Vec<String> = o
                    .deny
                    .iter()
                    .map(|f| format!("denied by policy `{}`: {}", f.policy, f.message))
                    .collect();
                Judged::Refused(why.join("; "))
            }
            Ok(o) => Judged::Pass(o),
        }
    }
}

impl Reconciler {
    /// A Nomad target under a policy: its plan (every job's dry run) is
    /// judged before anything is registered. `Ok`: the findings to add to
    /// the run's message; `Err`: the failed status (denied, not
    /// evaluable, or a policy asking for approval, which Nomad takes per
    /// job: `meta { driftless_policy = "approval" }`).
    pub(super) async fn gate_units(
        &self,
        target: &Target,
        run: &RunInfo,
        seen: &CommitId,
        backend: &dyn crate::backend::Backend,
    ) -> Result<String, crate::model::Status> {
        use crate::model::Status;
        let plan = self.plan_with(target, backend).await.map_err(|e| {
            Status::failed(format!("cannot plan before the policies judge it: {e}"))
        })?;
        if !plan.changes {
            return Ok(String::new());
        }
        match self.judge(target, run, seen, &plan).await {
            Judged::Refused(why) => Err(Status::failed(format!(
                "{why}; nothing registered ({} at {})",
                plan.summary,
                seen.short()
            ))),
            Judged::Pass(o) if !o.require_approval.is_empty() => Err(Status::failed(format!(
                "{}; this backend's approvals are per unit (a job's `driftless_policy` meta): nothing registered",
                said(&o)
            ))),
            Judged::Pass(o) => Ok(said(&o)),
        }
    }
}

/// The findings that do not stop a plan, in words for a run's message
/// (empty when there are none).
pub(super) fn said(o: &Outcome) -> String {
    let mut parts = Vec::new();
    for f in &o.require_approval {
        parts.push(format!(
            "policy `{}` requires approval: {}",
            f.policy, f.message
        ));
    }
    for f in &o.warn {
        parts.push(format!("policy `{}` warns: {}", f.policy, f.message));
    }
    parts.join("; ")
}
