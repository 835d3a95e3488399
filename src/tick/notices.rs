//! Who hears about a run: the owners' event documents for a run's result
//! (failed, still failing, recovered, changed, drift), for a deployment —
//! Nomad's or any backend's plan — that waits for approval, and for a plan
//! a newer commit superseded. They go into the outbox in the run's
//! transaction (`store::Notice`); this module sends nothing itself.

use tracing::error;

use super::{Reconciler, RunInfo, TickError};
use crate::backend::Status;
use crate::config::Target;
use crate::model::short_sha;
use crate::notify::{self, EventDoc, FailureState};
use crate::store::deployments::{PlanState, Untold};
use crate::store::{NewNotification, Notice};

/// What one event says, besides the target and the run it comes from.
struct Told<'a> {
    event: notify::Event,
    sha: Option<&'a str>,
    /// Already bounded to `notify::MESSAGE_MAX`.
    message: &'a str,
    consecutive_failures: i64,
    failing_for_ms: Option<i64>,
    run_url: Option<String>,
}

impl Reconciler {
    /// One event for every notifier of the target that wants it, into
    /// `outbox`.
    fn tell(
        &self,
        target: &Target,
        run: &RunInfo,
        told: &Told<'_>,
        outbox: &mut Vec<NewNotification>,
    ) {
        let settings = self.app.settings();
        for name in &target.notify {
            let Some(cfg) = settings.notifiers.iter().find(|n| &n.name == name) else {
                continue;
            };
            if !cfg.wants(told.event) {
                continue;
            }
            let uid = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
            let doc = EventDoc {
                id: uid.clone(),
                event: told.event,
                target: target.name.clone(),
                backend: target.backend.kind().to_string(),
                sha: told.sha.map(str::to_string),
                short_sha: told.sha.map(|s| short_sha(s).to_string()),
                commit_url: told.sha.and_then(|s| target.commit_url(s)),
                trigger: run.trigger.clone(),
                delivery_id: run.delivery_id.clone(),
                started_at: crate::store::format_ms(run.started_ms),
                duration_ms: run.started.elapsed().as_millis() as i64,
                message: told.message.to_string(),
                consecutive_failures: told.consecutive_failures,
                failing_for_ms: told.failing_for_ms,
                run_id: Some(run.id),
                run_url: told.run_url.clone(),
            };
            match serde_json::to_string(&doc) {
                Ok(document) => outbox.push(NewNotification {
                    uid,
                    notifier: name.clone(),
                    event: told.event.as_str().to_string(),
                    document,
                }),
                Err(e) => error!(notifier = %name, error = %e, "cannot encode a notification"),
            }
        }
    }

    /// A `pending_approval` event for every deployment of this target (a
    /// plan; for Nomad, a job's) that waits and whose owners were not told
    /// yet (what changes and how to approve exactly it), and a `superseded`
    /// one for every deployment they were told of that a newer commit
    /// replaced. One indexed read per tick, whatever the policy (a target
    /// whose policy was `approval` may still have a plan waiting) — but
    /// none for a target that had no deployment on record when the run
    /// began, when this process made none since: its deployments are made
    /// only by its runs, and this is the one running (most targets of a
    /// large instance never make one).
    pub(super) async fn plan_notices(
        &self,
        target: &Target,
        run: &RunInfo,
        notice: &mut Notice,
    ) -> Result<(), TickError> {
        if run.prev.as_ref().is_some_and(|p| p.no_deployments)
            && self.app.store.deployments_made() == run.deployments_made
        {
            return Ok(());
        }
        let base = self.app.base_url();
        for (p, why) in self.app.store.untold_plans(&target.name).await? {
            let approve = format!(
                "driftless approve {id}\n\
                 or: curl -X POST -H \"Authorization: Bearer $TOKEN\" -d '{{\"plan_hash\":\"{hash}\"}}' {base}/api/v1/deployments/{id}/approve\n\
                 See it: {base}/api/v1/deployments/{id}",
                id = p.id,
                hash = p.plan_hash,
            );
            let (event, message) = match why {
                Untold::Superseded => (
                    notify::Event::Superseded,
                    format!(
                        "Deployment {} of {} ({} at commit {}) will not be applied: {}.",
                        p.id,
                        p.subject(),
                        p.summary,
                        short_sha(&p.commit_sha),
                        p.message.as_deref().unwrap_or("superseded")
                    ),
                ),
                _ if p.state == PlanState::PendingPromotion => (
                    notify::Event::PendingApproval,
                    format!(
                        "{} at commit {} {} (deployment {}): {}\n\n\
                         Promote it (the rest of the rollout follows): {approve}",
                        p.subject(),
                        short_sha(&p.commit_sha),
                        if why == Untold::Overdue {
                            "is still waiting for promotion, past its bound"
                        } else {
                            "waits for promotion: its canaries are placed"
                        },
                        p.id,
                        p.message.as_deref().unwrap_or("canaries placed"),
                    ),
                ),
                _ => (
                    notify::Event::PendingApproval,
                    format!(
                        "{} at commit {} waits for approval (deployment {}, policy {}): {}{}\n\n{}\n\n\
                         Approve exactly this plan: {approve}",
                        p.subject(),
                        short_sha(&p.commit_sha),
                        p.id,
                        p.policy,
                        p.summary,
                        if p.destructive {
                            " (destructive: deletes or replaces)"
                        } else {
                            ""
                        },
                        p.diff.clone(),
                    ),
                ),
            };
            let message = notify::bounded(&message, notify::MESSAGE_MAX);
            let told = Told {
                event,
                sha: Some(&p.commit_sha),
                message: &message,
                consecutive_failures: 0,
                failing_for_ms: None,
                run_url: Some(format!("{base}/api/v1/deployments/{}", p.id)),
            };
            self.tell(target, run, &told, &mut notice.outbox);
            notice.plans_told.push((p.id, why));
        }
        Ok(())
    }

    /// Decide who hears about this run, and build their event documents.
    pub(super) fn notice(
        &self,
        target: &Target,
        run: &RunInfo,
        sha: Option<&str>,
        status: &Status,
        drift_event: Option<notify::Event>,
    ) -> Notice {
        let prev = run
            .prev
            .as_ref()
            .map(|s| FailureState {
                consecutive_failures: s.consecutive_failures,
                failing_since: s.failing_since,
                last_notified_at: s.last_notified_at,
                last_notified_message: s.last_notified_message.clone(),
            })
            .unwrap_or_default();
        let message = notify::bounded(&status.message, notify::MESSAGE_MAX);
        let now = crate::store::now_ms();
        let d = notify::notification_for(
            &prev,
            status.result,
            &message,
            now,
            self.app.settings().defaults.repeat_after,
        );
        let run_url = self
            .app
            .settings()
            .server
            .public_url
            .as_ref()
            .map(|u| format!("{u}/api/v1/runs/{}", run.id));
        let mut outbox = Vec::new();
        for event in d.event.into_iter().chain(drift_event) {
            let told = Told {
                event,
                sha,
                message: &message,
                consecutive_failures: if event == notify::Event::Recovered {
                    prev.consecutive_failures
                } else {
                    d.state.consecutive_failures
                },
                failing_for_ms: d.failing_for_ms,
                run_url: run_url.clone(),
            };
            self.tell(target, run, &told, &mut outbox);
        }
        Notice {
            failing_since: d.state.failing_since,
            last_notified_at: d.state.last_notified_at,
            last_notified_message: d.state.last_notified_message,
            outbox,
            plans_told: Vec::new(),
            plan_done: None,
            drift: None,
            quarantine: None,
            statuses: Vec::new(),
        }
    }

    /// The commit status a run leaves on the target's forge, for the
    /// commit it applied or tried (`seen`): `success`, `failure`, `error`
    /// for a failure that took the whole of the target's `timeout` (the
    /// backend was stopped, not refused), or `pending` while a plan waits
    /// for approval; linked to the run's row, `shown_run` (the streak it
    /// joins, if it joins one).
    pub(super) fn commit_status(
        &self,
        target: &Target,
        run: &RunInfo,
        shown_run: i64,
        seen: Option<&str>,
        status: &Status,
        waiting: bool,
    ) -> Option<crate::store::statuses::NewStatus> {
        use crate::store::statuses::{NewStatus, State};
        target.statuses.as_ref()?;
        use crate::model::ApplyResult;
        let (state, description) = match (waiting, status.result) {
            // The healthy commit it applied again keeps the status its
            // first apply left; the unhealthy tip has its own.
            (false, ApplyResult::RolledBack | ApplyResult::Held) => return None,
            (true, _) => (
                State::Pending,
                format!("waiting for approval: {}", status.message),
            ),
            (false, crate::model::ApplyResult::Failed)
                if run.started.elapsed() >= target.timeout =>
            {
                (State::Error, format!("timed out: {}", status.message))
            }
            (false, r) if r.is_failure() => (State::Failure, status.message.clone()),
            (false, _) => (State::Success, status.message.clone()),
        };
        Some(NewStatus {
            supersedes_queued_before: Some(run.started_ms),
            target_url: self
                .app
                .settings()
                .server
                .public_url
                .as_ref()
                .map(|u| format!("{}/api/v1/runs/{}", u.trim_end_matches('/'), shown_run)),
            ..target.commit_status(seen?, state, description)?
        })
    }
}
