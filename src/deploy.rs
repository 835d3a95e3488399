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
    /// A unit's (a Nomad job's): planned, about to be applied unattended.
    Detected,
    /// Shown; waits for a person to approve exactly it.
    PendingApproval,
    /// Approved; the next tick of the target applies it, if git still
    /// gives its commit.
    Approved,
    /// A unit's pre hook runs (Nomad's: a dispatched batch job).
    PreHook,
    /// Being applied (written before the backend is called).
    Applying,
    /// Its canaries are placed and the rest waits for a person to
    /// promote it (approved through the same call as an approval).
    PendingPromotion,
    /// A person promoted it; the next tick asks its backend to go on.
    Promoting,
    /// A unit's: applied and rolled out; its post hook runs.
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

    /// Every state, in the order of a deployment's life.
    pub const ALL: [PlanState; 12] = {
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
    };

    /// The state `as_str` wrote, if it is one.
    pub fn parse(s: &str) -> Option<PlanState> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Not finished yet: the target's (the unit's) one open
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
    /// What it says: waiting for promotion, what its backend said of its
    /// rollout and how to take that back.
    pub message: Option<&'a str>,
    /// The unit it is of (a Nomad job), when it is one unit's.
    pub unit: Option<&'a str>,
    /// A person paused that unit (a paused unit is never written to).
    pub unit_paused: bool,
    /// Where an approval takes it: `Approved` for a target's plan, the
    /// step its backend takes next for a unit's (Nomad: `PreHook` or
    /// `Applying`).
    pub on_approval: PlanState,
}

/// Where a person's decision takes deployment `d`: `approve` it for
/// exactly the plan `plan_hash` names (any plan when `None`), or reject it.
/// The new state and what it says, or why the decision cannot be taken.
///
/// - A deployment waiting for approval becomes `rejected`, or what its
///   `on_approval` says: `approved` for a target's plan (the next tick
///   applies exactly it if git still gives its commit), the step its
///   backend takes next for a unit's (a Nomad job's `pre_hook` or
///   `applying`).
/// - One waiting for promotion (its canaries placed) becomes `promoting`.
///   Refusing a promotion is not something driftless can do: the rollout
///   runs where it runs, and the answer quotes what the deployment says
///   of it (its backend says there how to take it back).
/// - A paused unit's deployment is neither approved nor promoted, another
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
             driftless does not take a rollout back: {}",
            d.message.unwrap_or("push a revert")
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
    if let Some(unit) = d.unit
        && d.unit_paused
    {
        return Err(format!(
            "`{unit}` of target `{}` is paused; resume it first",
            d.target
        ));
    }
    Ok(match (promotion, d.on_approval) {
        (true, _) => (
            PlanState::Promoting,
            "promoted; the next tick asks for the rest of the rollout",
        ),
        (false, PlanState::Approved) => (
            PlanState::Approved,
            "approved; the next tick applies exactly this plan if git still gives its commit",
        ),
        (false, PlanState::PreHook) => (
            PlanState::PreHook,
            "approved; the next tick runs its pre hook, then applies it",
        ),
        (false, next) => (next, "approved; the next tick applies it"),
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
            unit: None,
            unit_paused: false,
            on_approval: PlanState::Approved,
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
            unit: Some("api"),
            on_approval: PlanState::Applying,
            ..d.clone()
        };
        assert_eq!(
            decide(&job, None, true).map(|x| x.0),
            Ok(PlanState::Applying)
        );
        let hooked = Decidable {
            on_approval: PlanState::PreHook,
            ..job.clone()
        };
        assert_eq!(
            decide(&hooked, None, true).map(|x| x.0),
            Ok(PlanState::PreHook)
        );
        let paused = Decidable {
            unit_paused: true,
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

        let p = Decidable {
            message: Some("canaries placed; to take it back: `nomad deployment fail d-1`"),
            ..pending(PlanState::PendingPromotion)
        };
        assert_eq!(
            decide(&p, Some("h1"), true).map(|x| x.0),
            Ok(PlanState::Promoting)
        );
        let no = decide(&p, None, false).expect_err("refused");
        assert!(
            no.contains("does not take a rollout back: canaries placed")
                && no.contains("nomad deployment fail d-1"),
            "{no}"
        );
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
