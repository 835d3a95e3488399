//! Health gates at run time: which commit a target should be at
//! ([`aim`], the one function every tick goes through), the checks after
//! an apply ([`Reconciler::gate`], recorded before they begin so a restart
//! resumes them), what a run held at the healthy commit reports
//! ([`held_status`]), and the rollback queued after an unhealthy apply.
//! Running a check is `health`'s; recording the result is
//! `tick::record`'s.

use super::*;
use crate::health::{OnUnhealthy, Probe, Verdict};

/// Where a tick takes a target, given the tip it fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Aim {
    /// The tip, as git says.
    Tip,
    /// The tip was found unhealthy: the target is held at its last healthy
    /// commit (`on_unhealthy = "rollback"`).
    Held(Hold),
    /// The tip was found unhealthy and stays applied as it is (`report`,
    /// or nothing healthy to go back to): the backend does not run.
    Kept { tip: String, reason: String },
    /// A rollout in waves has not reached this target: it stays at the
    /// commit it has (`tick::rollout::staged`).
    Staged(super::rollout::Staged),
}

/// A run held at the healthy commit `at` while the tip is quarantined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Hold {
    pub at: String,
    pub tip: String,
    pub reason: String,
    /// The target is not at `at` yet: this run rolls it back.
    pub rolling_back: bool,
}

/// Which commit `target` should be at, the tip being `tip`: where it is
/// when this run only rechecks its health outside its change window
/// (`recheck_only`), or while its rollout in waves (`rollout`, the newest
/// of its unit) has not reached it; else the tip, unless that very commit was found unhealthy
/// (and no person asked to try it again, `retry`); then its last healthy
/// commit under `rollback`, or where it is otherwise.
pub(super) fn aim(
    target: &Target,
    tip: &str,
    state: Option<&TargetState>,
    retry: bool,
    rollout: Option<&crate::store::rollouts::RolloutRow>,
    recheck_only: bool,
) -> Aim {
    if recheck_only && let Some(at) = state.and_then(|s| s.last_applied_sha.clone()) {
        return Aim::Staged(super::rollout::Staged {
            note: format!(
                "outside its change window: nothing applied, health rechecked at {}",
                short_sha(&at)
            ),
            at,
        });
    }
    if let Some(staged) = super::rollout::staged(target, tip, rollout, state) {
        return Aim::Staged(staged);
    }
    let (Some(health), Some(s)) = (&target.health, state) else {
        return Aim::Tip;
    };
    if retry || s.quarantined_sha.as_deref() != Some(tip) {
        return Aim::Tip;
    }
    let reason = s
        .quarantine_reason
        .clone()
        .unwrap_or_else(|| "its health checks failed".into());
    match (health.on_unhealthy, s.healthy_sha.as_deref()) {
        (OnUnhealthy::Rollback, Some(good)) if good != tip => Aim::Held(Hold {
            at: good.to_string(),
            tip: tip.to_string(),
            reason,
            rolling_back: s.last_applied_sha.as_deref() != Some(good),
        }),
        _ => Aim::Kept {
            tip: tip.to_string(),
            reason,
        },
    }
}

/// What a run held at the healthy commit reports once its backend
/// succeeded: `rolled_back` for the run that went back, `held` for each
/// one after it. Any other result is its own.
pub(super) fn held_status(hold: &Hold, status: Status) -> Status {
    if !matches!(status.result, ApplyResult::Changed | ApplyResult::NoChange) {
        return status;
    }
    let (result, message) = if hold.rolling_back {
        (
            ApplyResult::RolledBack,
            format!(
                "rolled back to {} (the last healthy commit); tip {} unhealthy: {}",
                short_sha(&hold.at),
                short_sha(&hold.tip),
                hold.reason
            ),
        )
    } else {
        (
            ApplyResult::Held,
            crate::health::hold_words(&hold.at, &hold.tip, &hold.reason),
        )
    };
    Status {
        result,
        message,
        ..status
    }
}

/// How long ago an interrupted run began the health checks of `sha`,
/// the commit this apply is at and the last one applied: they resume, and
/// the commit is not applied again.
pub(super) fn resumed(
    target: &Target,
    op: Operation,
    state: Option<&TargetState>,
    sha: &CommitId,
) -> Option<Duration> {
    let s = state.filter(|s| {
        op == Operation::Apply
            && target.health.is_some()
            && s.health_run.is_some()
            && s.last_applied_sha.as_deref() == Some(sha.as_str())
    })?;
    let since = s.health_since?;
    Some(Duration::from_millis(
        (crate::store::now_ms() - since).max(0) as u64,
    ))
}

/// A gate's verdict on a run: its status, and the commit it found
/// unhealthy (quarantined with the run) with why.
pub(super) struct Gated {
    pub status: Status,
    pub quarantine: Option<(String, String)>,
}

impl Reconciler {
    /// After the backend's part of run `run` at `sha`: with health checks,
    /// a change is `changed` only once they pass, else `unhealthy`; a run
    /// that applied nothing is checked too under `recheck` (and is never
    /// quarantined for it). The health phase is on record before it
    /// begins: the commit applied, and since when it is checked.
    pub(super) async fn gate(
        &self,
        target: &Target,
        run: &RunInfo,
        sha: &str,
        status: Status,
        backend: &dyn backend::Backend,
    ) -> Result<Gated, TickError> {
        let pass = |status| {
            Ok(Gated {
                status,
                quarantine: None,
            })
        };
        let Some(health) = &target.health else {
            return pass(status);
        };
        if run.op != Operation::Apply {
            return pass(status);
        }
        let already = match (status.result, run.resumed_health) {
            (ApplyResult::Changed, Some(since)) => since,
            (ApplyResult::Changed, None) => {
                self.app
                    .store
                    .begin_health(&target.name, run.id, sha, status.digest.as_deref())
                    .await?;
                Duration::ZERO
            }
            // Nothing applied: checked only under `recheck`, or when the
            // commit in place is the quarantined one (a person's retry of
            // it), at once. Unchecked, that retry's `no_change` would lift
            // the quarantine as healthy.
            (ApplyResult::NoChange, _) if health.recheck || retries_quarantined(run, sha) => {
                health.grace
            }
            _ => return pass(status),
        };
        let applied = status.result == ApplyResult::Changed;
        let mut probe = run.probe.clone().unwrap_or_default();
        if health.checks.iter().any(|c| !c.outputs_named().is_empty()) {
            match backend.revealed_outputs().await {
                Ok((outputs, sensitive)) => {
                    for name in &sensitive {
                        if let Some(v) = outputs.get(name) {
                            probe.redactor.add(match v {
                                serde_json::Value::String(s) => s.clone(),
                                other => other.to_string(),
                            });
                        }
                    }
                    probe.outputs = outputs;
                }
                Err(e) => {
                    let reason = probe.redactor.redact(&format!(
                        "its outputs, which its health checks name, cannot be read: {e}"
                    ));
                    return Ok(self.unhealthy(target, run, sha, status, applied, reason));
                }
            }
        }
        match crate::health::watch(health, &probe, &ByBackend(backend), already).await {
            Verdict::Healthy { after, rounds } => {
                debug!(target = %target.name, rounds, after = ?after, "healthy");
                // A watchdog armed on the host waits for this, over a
                // new connection; unconfirmed, the host undoes the change.
                if applied
                    && let Some(confirm) = backend.confirm()
                    && let Err(e) = confirm.await
                {
                    let reason = probe.redactor.redact(&format!(
                        "healthy, but the change could not be confirmed to the host, which \
                         undoes it by itself: {e}"
                    ));
                    return Ok(self.unhealthy(target, run, sha, status, applied, reason));
                }
                let mut status = status;
                if applied {
                    status.message = format!(
                        "{} (healthy after {})",
                        status.message,
                        humantime::format_duration(Duration::from_secs(after.as_secs()))
                    );
                }
                pass(status)
            }
            Verdict::Unhealthy { reason, .. } => {
                Ok(self.unhealthy(target, run, sha, status, applied, reason))
            }
        }
    }

    /// Run `run`'s status once its checks failed for `reason`: the commit
    /// it applied is quarantined, unless the run was held at the healthy
    /// commit or applied nothing (a recheck).
    fn unhealthy(
        &self,
        target: &Target,
        run: &RunInfo,
        sha: &str,
        status: Status,
        applied: bool,
        reason: String,
    ) -> Gated {
        let message = match (&run.hold, applied) {
            (Some(h), _) => format!(
                "rolled back to {} (the last healthy commit), but it is unhealthy too: {reason}",
                short_sha(&h.at)
            ),
            (None, false) => {
                format!(
                    "unhealthy at {} (nothing was applied): {reason}",
                    short_sha(sha)
                )
            }
            (None, true) if rolls_back(target) && rollback_to(run, sha).is_none() => format!(
                "applied but unhealthy: {reason} (no earlier healthy commit to roll back to)"
            ),
            (None, true) => format!("applied but unhealthy: {reason}"),
        };
        Gated {
            status: Status {
                result: ApplyResult::Unhealthy,
                message,
                ..status
            },
            quarantine: (run.hold.is_none() && (applied || retries_quarantined(run, sha)))
                .then(|| (sha.to_string(), reason)),
        }
    }

    /// After run `run` quarantined `bad`: under `rollback`, a job that
    /// applies the last healthy commit again (through [`aim`], like any
    /// tick), when there is one.
    pub(super) async fn queue_rollback(&self, target: &Target, run: &RunInfo, bad: &str) {
        if !rolls_back(target) || rollback_to(run, bad).is_none() {
            return;
        }
        let req = crate::queue::Request {
            target: target.name.clone(),
            trigger: Trigger::Rollback,
            sha: None,
            delivery_id: None,
            receiver: None,
        };
        match self.app.queue.enqueue(&req).await {
            Ok(job) => {
                info!(target = %target.name, job, "queued the rollback to the last healthy commit")
            }
            Err(e) => error!(target = %target.name, error = %e,
                "cannot queue the rollback; the next tick rolls back (the quarantine holds)"),
        }
    }
}

/// Whether an unhealthy apply of `target` is rolled back.
/// Run `run` tries `sha`, the commit in place, which is quarantined: a
/// person's retry (nothing else aims at a quarantined tip).
fn retries_quarantined(run: &RunInfo, sha: &str) -> bool {
    run.hold.is_none()
        && run
            .prev
            .as_ref()
            .is_some_and(|p| p.quarantined_sha.as_deref() == Some(sha))
}

fn rolls_back(target: &Target) -> bool {
    target
        .health
        .as_ref()
        .is_some_and(|h| h.on_unhealthy == OnUnhealthy::Rollback)
}

/// The commit a rollback from `bad` would apply: the last healthy one
/// before run `run`, if there is one and it is not `bad` itself.
fn rollback_to<'a>(run: &'a RunInfo, bad: &str) -> Option<&'a str> {
    run.prev
        .as_ref()
        .and_then(|s| s.healthy_sha.as_deref())
        .filter(|h| *h != bad)
}

/// The target's backend, for the checks only it can run.
struct ByBackend<'a>(&'a dyn backend::Backend);

impl crate::health::Own for ByBackend<'_> {
    fn check<'a>(
        &'a self,
        check: &'a crate::health::OwnCheck,
    ) -> crate::model::BoxFuture<'a, Result<(), String>> {
        match self.0.health(check) {
            Some(fut) => fut,
            // `check` refuses a check the backend does not serve.
            None => {
                Box::pin(async move { Err(format!("this backend cannot check `{}`", check.key())) })
            }
        }
    }
}

/// What a health check runs with, from the backend's context: its
/// directory, inputs and redactor.
pub(super) fn probe_of(ctx: &Context) -> Probe {
    Probe {
        workdir: ctx.workdir.clone(),
        env: ctx.inputs.clone(),
        outputs: Default::default(),
        redactor: ctx.redactor.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one function that says where a target goes: the tip, unless
    /// that very commit is quarantined and nobody retries; then the
    /// healthy commit under rollback, else where it is.
    #[test]
    fn aim_holds_only_a_quarantined_tip_and_retry_or_a_newer_commit_lifts_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[[targets]]\nname = \"t\"\nrepo = \"/srv/r\"\n\
             [targets.health]\non_unhealthy = \"rollback\"\n\
             [[targets.health.checks]]\ntcp = \"127.0.0.1:9\"\n\
             [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n",
        )
        .expect("write");
        let settings = crate::config::load(&file).expect("valid");
        let mut t = settings.targets[0].clone();
        let state = |applied: &str, healthy: Option<&str>, bad: Option<&str>| TargetState {
            name: "t".into(),
            backend: "exec".into(),
            last_applied_sha: Some(applied.into()),
            last_result: None,
            last_message: None,
            last_run_id: None,
            last_run_at: None,
            consecutive_failures: 0,
            backend_digest: None,
            paused_at: None,
            paused_by: None,
            failing_since: None,
            last_notified_at: None,
            last_notified_message: None,
            drift_hash: None,
            drift_summary: None,
            drift_since: None,
            rewind_accepted: None,
            healthy_sha: healthy.map(str::to_string),
            quarantined_sha: bad.map(str::to_string),
            quarantine_reason: Some("502".into()),
            health_run: None,
            health_since: None,
            no_deployments: false,
        };
        let s = state("bbb", Some("aaa"), Some("bbb"));
        let held = Aim::Held(Hold {
            at: "aaa".into(),
            tip: "bbb".into(),
            reason: "502".into(),
            rolling_back: true,
        });
        assert_eq!(aim(&t, "bbb", Some(&s), false, None, false), held);
        assert_eq!(
            aim(&t, "bbb", Some(&s), true, None, false),
            Aim::Tip,
            "retry"
        );
        assert_eq!(
            aim(&t, "ccc", Some(&s), false, None, false),
            Aim::Tip,
            "a newer commit"
        );
        let back = state("aaa", Some("aaa"), Some("bbb"));
        assert!(
            matches!(aim(&t, "bbb", Some(&back), false, None, false), Aim::Held(h) if !h.rolling_back)
        );
        let never = state("bbb", None, Some("bbb"));
        assert!(matches!(
            aim(&t, "bbb", Some(&never), false, None, false),
            Aim::Kept { .. }
        ));
        if let Some(h) = t.health.as_mut() {
            h.on_unhealthy = OnUnhealthy::Report;
        }
        assert!(matches!(
            aim(&t, "bbb", Some(&s), false, None, false),
            Aim::Kept { .. }
        ));
        t.health = None;
        assert_eq!(
            aim(&t, "bbb", Some(&s), false, None, false),
            Aim::Tip,
            "no checks, no hold"
        );
    }
}
