//! The end of a run: its result recorded with everything it changes —
//! the target's state, its job, its owners' notifications, its commit
//! status, a plan's new state — in one transaction (`Store::finish_run`),
//! then the metrics, the log line and the dependents woken. What a result
//! means for the owners is `tick::notices`'; this module only assembles
//! and records it.

use super::*;
use crate::store::Notice;

impl Reconciler {
    pub(super) async fn finish(
        &self,
        target: &Target,
        run: &RunInfo,
        sha: Option<&str>,
        status: Status,
    ) -> Result<Ticked, TickError> {
        self.finish_with(target, run, sha, sha, status, Findings::default())
            .await
    }

    /// Record the run: `applied` is the commit the real world now matches
    /// (the target's last applied SHA), `seen` the one the run looked at
    /// (in the log and the owners' events); a `detect` run sees a commit
    /// and applies nothing, nor does one whose plan waits for a person.
    pub(super) async fn finish_with(
        &self,
        target: &Target,
        run: &RunInfo,
        applied: Option<&str>,
        seen: Option<&str>,
        status: Status,
        findings: Findings,
    ) -> Result<Ticked, TickError> {
        let sha = applied;
        // A run held at the healthy commit says so, whatever its backend
        // found to do there.
        let mut status = match &run.hold {
            Some(h) => health::held_status(h, status),
            None => status,
        };
        if let Some(note) = &run.note {
            status.message = if status.message.is_empty() {
                note.clone()
            } else {
                format!("{note}; {}", status.message)
            };
        }
        let Findings {
            drift,
            plan_done,
            waiting,
            quarantine,
        } = findings;
        let drift_event = match &drift {
            Some(DriftUpdate::Set { .. }) => Some(notify::Event::DriftDetected),
            Some(DriftUpdate::Clear) => Some(notify::Event::DriftResolved),
            None => None,
        };
        let mut notice = match run.op {
            Operation::Apply => Some(self.notice(target, run, seen, &status, drift_event)),
            // Tearing down is an operator's act, not news for the owners.
            Operation::Destroy => None,
        };
        if let Some(n) = notice.as_mut() {
            n.drift = drift;
            n.plan_done = plan_done;
            n.quarantine = quarantine.clone();
            self.plan_notices(target, run, n).await?;
        }
        // A run that found nothing to do, like the one before it, and has
        // nothing to tell: one row for the streak, not one per tick.
        // Looked for as the run is recorded, unless its commit status must
        // link to the streak's row before.
        let streak = match &notice {
            Some(n) if joins_a_streak(&status, run.delivery_id.as_deref(), waiting, n) => {
                if target.statuses.is_none() {
                    Streak::Find {
                        sha: seen,
                        trigger: &run.trigger,
                    }
                } else {
                    self.app
                        .store
                        .streak(&target.name, run.id, seen, &run.trigger, &status.message)
                        .await?
                        .map_or(Streak::No, Streak::Row)
                }
            }
            _ => Streak::No,
        };
        if let Some(n) = notice.as_mut() {
            let shown = match streak {
                Streak::Row(id) => id,
                _ => run.id,
            };
            n.statuses
                .extend(self.commit_status(target, run, shown, seen, &status, waiting));
        }
        let run_id = self
            .record_run(target, run, sha, &status, notice.as_ref(), streak)
            .await?;
        if notice.as_ref().is_some_and(|n| !n.outbox.is_empty()) {
            self.app.outbox_wake.notify_waiters();
        }
        self.app.metrics.tick(
            &target.name,
            status.result.as_str(),
            run.started.elapsed().as_secs_f64(),
        );
        if run.op == Operation::Apply && !waiting {
            self.wake_dependents(target, status.result).await;
        }
        if let Some((bad, _)) = &quarantine {
            self.queue_rollback(target, run, bad).await;
        }
        log_run(target, run, run_id, seen, &status);
        Ok(Ticked::Ran {
            run_id,
            result: status.result,
            sha: seen.map(str::to_string),
            message: status.message,
        })
    }

    /// The run's end written with all it changes (`Store::finish_run`).
    /// The backend is done: its result is not thrown away because the
    /// disk is full right now. It is kept, the job (and the target's lock)
    /// held, and written when space returns. The run's row, or the
    /// streak's it joined.
    async fn record_run(
        &self,
        target: &Target,
        run: &RunInfo,
        sha: Option<&str>,
        status: &Status,
        notice: Option<&crate::store::Notice>,
        streak: Streak<'_>,
    ) -> Result<i64, TickError> {
        // Its output first: a reader who sees the result has it all, and a
        // run that folds into a streak takes its output with it.
        if let Some(out) = &run.output {
            out.finish().await;
        }
        let mut pause = Duration::from_secs(1);
        loop {
            match self
                .app
                .store
                .finish_run(run.id, &target.name, run.op, sha, status, notice, streak)
                .await
            {
                Ok(kept) => return Ok(kept),
                Err(e) if e.is_disk_trouble() && self.app.store.check_identity().is_ok() => {
                    error!(target = %target.name, run = run.id, error = %e, retry_in = ?pause,
                           "cannot record the finished run; keeping its result and trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(30));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The run in the log: failures and blocks as WARN, changes as INFO, a
/// run that found nothing to do at DEBUG (it is in the history).
fn log_run(target: &Target, run: &RunInfo, run_id: i64, seen: Option<&str>, status: &Status) {
    let short = seen.map(short_sha).unwrap_or("-");
    match status.result {
        ApplyResult::Failed => warn!(target = %target.name, run = run_id, sha = short,
            operation = run.op.as_str(), message = %status.message, "run failed"),
        ApplyResult::Blocked => warn!(target = %target.name, run = run_id,
            operation = run.op.as_str(), message = %status.message, "run blocked"),
        ApplyResult::Unhealthy | ApplyResult::RolledBack | ApplyResult::Held => warn!(
            target = %target.name, run = run_id, sha = short, operation = run.op.as_str(),
            result = status.result.as_str(), message = %status.message, "run not healthy"),
        // A run that found nothing to do is in the history; the log
        // (INFO) says what changed, RUST_LOG=debug every run.
        ApplyResult::NoChange => debug!(target = %target.name, run = run_id, sha = short,
            operation = run.op.as_str(), result = "no_change", message = %status.message, "run finished"),
        r => info!(target = %target.name, run = run_id, sha = short,
            operation = run.op.as_str(), result = r.as_str(), message = %status.message, "run finished"),
    }
}

/// Whether a finished run may join the streak before it (one history row
/// for many runs): it found nothing to do and has nothing to tell — no
/// delivery of its own to answer for, no plan waiting for a person, no
/// notification, no plan's owners told or plan ended, no drift changed.
/// (The store joins it only to a `no_change` row of the same commit,
/// trigger and message.)
fn joins_a_streak(status: &Status, delivery: Option<&str>, waiting: bool, n: &Notice) -> bool {
    status.result == ApplyResult::NoChange
        && delivery.is_none()
        && !waiting
        && n.outbox.is_empty()
        && n.plans_told.is_empty()
        && n.plan_done.is_none()
        && n.drift.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::deployments::{PlanState, Untold};

    /// Only a run that found nothing to do and tells nobody anything joins
    /// a streak; each thing it might tell keeps it a row of its own.
    #[test]
    fn only_a_run_with_nothing_to_tell_joins_a_streak() {
        let quiet = Status {
            result: ApplyResult::NoChange,
            message: "nothing to do".into(),
            output_tail: String::new(),
            digest: None,
        };
        let none = Notice::default();
        assert!(joins_a_streak(&quiet, None, false, &none));
        for result in [ApplyResult::Changed, ApplyResult::Failed] {
            let s = Status {
                result,
                ..quiet.clone()
            };
            assert!(!joins_a_streak(&s, None, false, &none), "{result:?}");
        }
        assert!(
            !joins_a_streak(&quiet, Some("d-1"), false, &none),
            "a delivery"
        );
        assert!(!joins_a_streak(&quiet, None, true, &none), "waiting");
        let told = [
            Notice {
                outbox: vec![crate::store::NewNotification {
                    uid: "u".into(),
                    notifier: "ops".into(),
                    event: "recovered".into(),
                    document: "{}".into(),
                }],
                ..Notice::default()
            },
            Notice {
                plans_told: vec![(3, Untold::Waiting)],
                ..Notice::default()
            },
            Notice {
                plan_done: Some((3, PlanState::Applied, "applied".into())),
                ..Notice::default()
            },
            Notice {
                drift: Some(crate::store::DriftUpdate::Clear),
                ..Notice::default()
            },
        ];
        for n in &told {
            assert!(!joins_a_streak(&quiet, None, false, n), "{n:?}");
        }
    }
}
