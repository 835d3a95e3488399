//! The deployment vocabulary every backend shares: where a plan is in its
//! life ([`PlanState`]) and what a person's decision does to it
//! ([`decide`]). Plain types and pure functions: the store keeps the rows,
//! the tick and the backends move them, the API and the CLI show them.

use serde::Serialize;

/// What driftless may do with a target, or with one unit of it (a Nomad
/// job's `meta { driftless_policy }` overrides its target's): the one
/// policy every backend, the config, the API and the page share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Apply what git says.
    Auto,
    /// Every change waits for a person to approve exactly the plan they
    /// saw.
    Approval,
    /// Applied unattended unless the plan deletes or replaces something;
    /// then it waits like `approval`.
    ApproveDestructive,
    /// Plan on every tick and never apply: a difference is drift, recorded
    /// and told to the owners once. (A Nomad job's meta calls it `none`,
    /// "never write this job".)
    Detect,
}

impl Policy {
    pub const NAMES: &[&str] = &["auto", "approval", "approve_destructive", "detect"];

    pub fn parse(s: &str) -> Option<Policy> {
        Some(match s {
            "auto" => Policy::Auto,
            "approval" => Policy::Approval,
            "approve_destructive" => Policy::ApproveDestructive,
            "detect" => Policy::Detect,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Auto => "auto",
            Policy::Approval => "approval",
            Policy::ApproveDestructive => "approve_destructive",
            Policy::Detect => "detect",
        }
    }

    /// A change may wait for a person (`approval`, `approve_destructive`).
    pub fn reviews(self) -> bool {
        matches!(self, Policy::Approval | Policy::ApproveDestructive)
    }
}

/// Where a plan is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanState {
    /// Nomad: planned, about to be registered unattended.
    Detected,
    /// Shown; waits for a person to approve exactly it.
    PendingApproval,
    /// Approved; the next tick of the target applies it, if git still
    /// gives its commit.
    Approved,
    /// Nomad: its pre hook (a dispatched batch job) runs.
    PreHook,
    /// Being applied (written before the backend is called).
    Applying,
    /// Nomad: its canaries are placed and the rest waits for a person to
    /// promote it (approved through the same call as an approval).
    PendingPromotion,
    /// Nomad: a person promoted it; the next tick asks Nomad to.
    Promoting,
    /// Nomad: registered and rolled out; its post hook runs.
    PostHook,
    Applied,
    Failed,
    Rejected,
    /// A newer commit came first; it will never be applied.
    Superseded,
}

impl PlanState {
    pub fn as_str(self) -> &'static str {
        match self {
            PlanState::Detected => "detected",
            PlanState::PendingApproval => "pending_approval",
            PlanState::Approved => "approved",
            PlanState::PreHook => "pre_hook",
            PlanState::Applying => "applying",
            PlanState::PendingPromotion => "pending_promotion",
            PlanState::Promoting => "promoting",
            PlanState::PostHook => "post_hook",
            PlanState::Applied => "applied",
            PlanState::Failed => "failed",
            PlanState::Rejected => "rejected",
            PlanState::Superseded => "superseded",
        }
    }

    /// The state `as_str` wrote, if it is one.
    pub fn parse(s: &str) -> Option<PlanState> {
        use PlanState::*;
        [
            Detected,
            PendingApproval,
            Approved,
            PreHook,
            Applying,
            PendingPromotion,
            Promoting,
            PostHook,
            Applied,
            Failed,
            Rejected,
            Superseded,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }

    /// Not finished yet: the target's (the Nomad job's) one open
    /// deployment.
    pub fn is_open(self) -> bool {
        !matches!(
            self,
            PlanState::Applied | PlanState::Failed | PlanState::Rejected | PlanState::Superseded
        )
    }
}

/// What a person's decision is judged on: the deployment as read, in the
/// transaction that will write the decision.
#[derive(Debug, Clone)]
pub struct Decidable<'a> {
    pub id: i64,
    pub target: &'a str,
    pub state: PlanState,
    /// The hash of the plan it holds (keyed with the installation's key).
    pub plan_hash: &'a str,
    pub message: Option<&'a str>,
    /// Nomad: the job it is of.
    pub job: Option<&'a str>,
    /// Nomad: a pre hook runs before its register.
    pub pre_hook: bool,
    /// Nomad: the deployment its canaries belong to.
    pub nomad_deployment_id: Option<&'a str>,
    /// Nomad: a person paused its job (a paused job is never written to).
    pub job_paused: bool,
}

/// Where a person's decision takes deployment `d`: `approve` it for
/// exactly the plan `plan_hash` names (any plan when `None`), or reject it.
/// The new state and what it says, or why the decision cannot be taken.
///
/// - A deployment waiting for approval becomes `approved` (the next tick
///   applies exactly its plan if git still gives its commit), or `rejected`.
///   A Nomad job's goes straight to the step its job takes next: `pre_hook`
///   or `applying`.
/// - One waiting for promotion (its canaries placed) becomes `promoting`.
///   Refusing a promotion is not something driftless can do: the canaries
///   run in the cluster, and the answer says what does.
/// - A paused job's deployment is neither approved nor promoted, another
///   hash is a stale plan, and any other state is not waiting for anyone.
pub fn decide(
    d: &Decidable<'_>,
    plan_hash: Option<&str>,
    approve: bool,
) -> Result<(PlanState, &'static str), String> {
    let id = d.id;
    match d.state {
        PlanState::PendingApproval | PlanState::PendingPromotion => {}
        PlanState::Superseded => {
            return Err(format!(
                "deployment {id} of target `{}` was superseded ({}); look at its new plan",
                d.target,
                d.message.unwrap_or("by a newer commit")
            ));
        }
        s => {
            return Err(format!(
                "deployment {id} is `{}`, not pending approval",
                s.as_str()
            ));
        }
    }
    let promotion = d.state == PlanState::PendingPromotion;
    if promotion && !approve {
        return Err(format!(
            "deployment {id} is rolled out to its canaries and waits for promotion; \
             driftless does not take canaries back: fail the Nomad deployment \
             (`nomad deployment fail {}`; an `auto_revert` group rolls back) or push a revert",
            d.nomad_deployment_id.unwrap_or("<id>")
        ));
    }
    if let Some(h) = plan_hash
        && h != d.plan_hash
    {
        return Err(format!(
            "stale plan: deployment {id} is for plan {}, not {h}; look at it again",
            d.plan_hash
        ));
    }
    if !approve {
        return Ok((PlanState::Rejected, "rejected"));
    }
    if let Some(job) = d.job
        && d.job_paused
    {
        return Err(format!(
            "job `{job}` of target `{}` is paused; resume it first",
            d.target
        ));
    }
    Ok(match (promotion, d.job, d.pre_hook) {
        (true, _, _) => (
            PlanState::Promoting,
            "promoted; the next tick asks Nomad to promote its canaries",
        ),
        (false, None, _) => (
            PlanState::Approved,
            "approved; the next tick applies exactly this plan if git still gives its commit",
        ),
        (false, Some(_), true) => (
            PlanState::PreHook,
            "approved; the next tick runs its pre hook, then registers it",
        ),
        (false, Some(_), false) => (PlanState::Applying, "approved; the next tick registers it"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(state: PlanState) -> Decidable<'static> {
        Decidable {
            id: 7,
            target: "web",
            state,
            plan_hash: "h1",
            message: None,
            job: None,
            pre_hook: false,
            nomad_deployment_id: Some("d-1"),
            job_paused: false,
        }
    }

    /// Every state a decision can meet, approve or reject, and where each
    /// goes (or that it is refused).
    #[test]
    fn each_state_and_decision_goes_where_it_should() {
        let d = pending(PlanState::PendingApproval);
        assert_eq!(
            decide(&d, Some("h1"), true).map(|x| x.0),
            Ok(PlanState::Approved)
        );
        assert_eq!(
            decide(&d, None, false).map(|x| x.0),
            Ok(PlanState::Rejected)
        );
        let stale = decide(&d, Some("h2"), true).expect_err("stale");
        assert!(
            stale.contains("stale plan") && stale.contains("h1"),
            "{stale}"
        );
        let job = Decidable {
            job: Some("api"),
            ..d.clone()
        };
        assert_eq!(
            decide(&job, None, true).map(|x| x.0),
            Ok(PlanState::Applying)
        );
        let hooked = Decidable {
            pre_hook: true,
            ..job.clone()
        };
        assert_eq!(
            decide(&hooked, None, true).map(|x| x.0),
            Ok(PlanState::PreHook)
        );
        let paused = Decidable {
            job_paused: true,
            ..job.clone()
        };
        assert!(
            decide(&paused, None, true)
                .expect_err("paused")
                .contains("is paused")
        );
        // A paused job's deployment may still be rejected.
        assert_eq!(
            decide(&paused, None, false).map(|x| x.0),
            Ok(PlanState::Rejected)
        );

        let p = pending(PlanState::PendingPromotion);
        assert_eq!(
            decide(&p, Some("h1"), true).map(|x| x.0),
            Ok(PlanState::Promoting)
        );
        let no = decide(&p, None, false).expect_err("refused");
        assert!(no.contains("nomad deployment fail d-1"), "{no}");
        assert!(
            decide(&p, Some("h2"), true)
                .expect_err("stale")
                .contains("stale plan")
        );

        let s = Decidable {
            message: Some("superseded by abc1234"),
            ..pending(PlanState::Superseded)
        };
        assert!(
            decide(&s, None, true)
                .expect_err("superseded")
                .contains("abc1234")
        );
        for state in [PlanState::Approved, PlanState::Applied, PlanState::Applying] {
            let e = decide(&pending(state), None, true).expect_err("not pending");
            assert!(e.contains("not pending approval"), "{e}");
        }
    }
}
