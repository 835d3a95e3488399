//! Rollouts in waves at run time. [`staged`] says whether a member is held
//! at the commit it has because the rollout has not reached its wave (it
//! is called by `tick::health::aim`, the one decision of which commit a
//! target should be at). [`Reconciler::advance_rollouts`] drives each
//! rollout: it starts one for a new branch tip (superseding the one
//! before), writes each wave before its jobs are queued, waits for every
//! member of the wave to be applied and healthy and for `pause`, halts on
//! a failed, blocked or unhealthy member (telling the owners once, with a
//! commit status), and ends when the last wave is through. Which member
//! is in which wave is `rollout`'s; the rows are `store::rollouts`'.

use super::*;
use crate::config::RolloutUnit;
use crate::store::rollouts::{RolloutRow, RolloutState};
use crate::store::statuses::State;

/// A member the rollout holds back: kept at `at`, the commit it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Staged {
    pub at: String,
    /// Said first in its run's message.
    pub note: String,
}

/// Whether rollout `row` (the newest of `target.rollout_of`) holds
/// `target` at the commit it has rather than `tip`: when no rollout of
/// `tip` has started yet, or when it has not reached the target's wave. A
/// target that never applied anything, or is already at `tip`, or was no
/// member when the rollout started, is not held.
pub(super) fn staged(
    target: &Target,
    tip: &str,
    row: Option<&RolloutRow>,
    state: Option<&TargetState>,
) -> Option<Staged> {
    let unit = target.rollout_of.as_deref()?;
    let at = state?.last_applied_sha.clone()?;
    if at == tip {
        return None;
    }
    let note = match row.filter(|r| r.sha == tip) {
        None => format!(
            "the rollout `{unit}` of {} has not started yet: kept at {}",
            short_sha(tip),
            short_sha(&at)
        ),
        Some(r) => {
            let wave = r
                .members
                .iter()
                .find(|(m, _)| *m == target.name)
                .map(|(_, w)| *w)?;
            if wave <= r.wave || r.state == RolloutState::Done {
                return None;
            }
            format!(
                "the rollout `{unit}` of {} is at wave {} ({}); this target is in wave {wave}: kept at {}",
                short_sha(tip),
                r.wave,
                r.state.as_str(),
                short_sha(&at)
            )
        }
    };
    Some(Staged { at, note })
}

/// Where a member of the wave in progress is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Applied at the rollout's commit, and healthy (or it has no checks).
    Done,
    /// Failed, blocked or unhealthy since the wave started: why.
    Failed(String),
    /// Queued, running, paused, waiting for approval or for its window.
    Waiting,
}

/// Where member `t` (`None`: gone from the configuration), its state
/// `s`, is in the wave in progress of rollout `r`. `judged_at`: when the
/// run whose result `s` holds (`last_run_id`) started. A failure or a
/// quarantine counts only from a run started since the wave did: one
/// from before is stale — a resumed wave's retry is still to run, or
/// running (its start moves `last_run_at`, not the result) — and the
/// member is waiting.
pub fn verdict(
    t: Option<&Target>,
    s: Option<&TargetState>,
    r: &RolloutRow,
    judged_at: Option<i64>,
) -> Verdict {
    // A member gone from the configuration (its directory removed) holds
    // nobody back.
    let Some(t) = t else { return Verdict::Done };
    let Some(s) = s else {
        return Verdict::Waiting;
    };
    let at = s.last_applied_sha.as_deref() == Some(r.sha.as_str());
    let result = s.last_result.as_deref().unwrap_or("");
    let since = judged_at.is_some_and(|ran| ran >= r.wave_started_at);
    if since && s.quarantined_sha.as_deref() == Some(r.sha.as_str()) {
        return Verdict::Failed(format!(
            "`{}` is unhealthy: {}",
            t.name,
            s.quarantine_reason
                .as_deref()
                .unwrap_or("its health checks failed")
        ));
    }
    let healthy = t.health.is_none() || s.healthy_sha.as_deref() == Some(r.sha.as_str());
    if at && healthy && matches!(result, "changed" | "no_change") {
        return Verdict::Done;
    }
    if since
        && matches!(
            result,
            "failed" | "blocked" | "unhealthy" | "rolled_back" | "held"
        )
    {
        return Verdict::Failed(format!(
            "`{}` {result}: {}",
            t.name,
            s.last_message.as_deref().unwrap_or("")
        ));
    }
    Verdict::Waiting
}

impl Reconciler {
    /// One look at every rollout in waves, each on its own: one's failure
    /// (a fetch, say) is logged and the others go on.
    pub async fn advance_rollouts(&self) {
        let settings = self.app.settings();
        for unit in settings.rollout_units() {
            if let Err(e) = self.advance(&unit).await {
                error!(rollout = unit.name, error = %e, "cannot move the rollout on; it is looked at again shortly");
            }
        }
    }

    /// One look at one rollout: start it for a new tip, or move its wave on.
    async fn advance(&self, unit: &RolloutUnit<'_>) -> Result<(), TickError> {
        let Some(first) = unit.members.first() else {
            return Ok(());
        };
        // A fetch started within the members' interval serves (a push's
        // jobs fetch at once).
        let now = std::time::Instant::now();
        let since = now.checked_sub(first.interval).unwrap_or(now);
        let tip = self
            .git
            .fetch_since(&first.repo, &first.branch, &first.git, since)
            .await
            .map_err(|e| TickError::Set {
                set: format!("rollout `{}`", unit.name),
                source: e,
            })?;
        let row = self.app.store.rollout(unit.name).await?;
        match row {
            Some(r) if r.sha == tip => {
                if r.state == RolloutState::Running {
                    self.move_wave(unit, first, &r).await?;
                }
                Ok(())
            }
            prev => self.start(unit, first, prev.as_ref(), &tip).await,
        }
    }

    /// Start rolling `tip` out, the members and their waves fixed now.
    async fn start(
        &self,
        unit: &RolloutUnit<'_>,
        first: &Target,
        prev: Option<&RolloutRow>,
        tip: &str,
    ) -> Result<(), TickError> {
        let names: Vec<String> = unit.members.iter().map(|t| t.name.clone()).collect();
        let members: Vec<(String, i64)> = unit
            .rollout
            .assign(&names)
            .into_iter()
            .map(|(m, w)| (m, w as i64))
            .collect();
        let Some(wave) = members.iter().map(|(_, w)| *w).min() else {
            return Ok(());
        };
        if !self
            .app
            .store
            .start_rollout(unit.name, prev, tip, &members, wave)
            .await?
        {
            return Ok(());
        }
        info!(rollout = unit.name, sha = %short_sha(tip), members = members.len(), "rollout started");
        self.wave_started(unit, first, tip, &members, wave).await
    }

    /// Wave `wave` of rolling `sha` out is on record: queue its members,
    /// and say so on the forge.
    async fn wave_started(
        &self,
        unit: &RolloutUnit<'_>,
        first: &Target,
        sha: &str,
        members: &[(String, i64)],
        wave: i64,
    ) -> Result<(), TickError> {
        let waves = crate::rollout::nonempty_waves(
            &members
                .iter()
                .map(|(m, w)| (m.clone(), *w as usize))
                .collect::<Vec<_>>(),
        );
        let of = waves.len();
        let at = waves
            .iter()
            .position(|w| *w as i64 == wave)
            .map_or(0, |i| i + 1);
        let reached = members.iter().filter(|(_, w)| *w <= wave).count();
        for (m, _) in members.iter().filter(|(_, w)| *w == wave) {
            self.app.queue.enqueue(&rollout_request(m)).await?;
        }
        info!(rollout = unit.name, wave, "rollout wave started");
        self.say(
            unit,
            first,
            sha,
            State::Pending,
            format!("wave {at} of {of}: {reached} of {} targets", members.len()),
        )
        .await
    }

    /// The wave in progress of running rollout `r`: halt on a failure, go
    /// on once every member is through and the pause has passed, queue a
    /// member whose job was lost (a restart between the wave's row and its
    /// jobs).
    async fn move_wave(
        &self,
        unit: &RolloutUnit<'_>,
        first: &Target,
        r: &RolloutRow,
    ) -> Result<(), TickError> {
        let settings = self.app.settings();
        let in_wave: Vec<&String> = r
            .members
            .iter()
            .filter(|(_, w)| *w == r.wave)
            .map(|(m, _)| m)
            .collect();
        let mut verdicts = Vec::new();
        for m in &in_wave {
            let s = self.app.store.target_state(m).await?;
            let judged_at = judged_at(&self.app.store, s.as_ref()).await?;
            let v = verdict(settings.target(m), s.as_ref(), r, judged_at);
            verdicts.push((*m, s, v));
        }
        if let Some(why) = verdicts.iter().find_map(|(_, _, v)| match v {
            Verdict::Failed(why) => Some(why.clone()),
            _ => None,
        }) {
            let reason = format!("halted at wave {}: {why}", r.wave);
            let key = (unit.name, r.seq, r.wave);
            if self
                .app
                .store
                .rollout_state(
                    key,
                    RolloutState::Running,
                    RolloutState::Halted,
                    &reason,
                    None,
                )
                .await?
            {
                warn!(rollout = unit.name, %reason, "rollout halted");
                let message = format!(
                    "rollout of {} {reason}; later waves stay where they are (`driftless rollout resume {}` tries this wave again)",
                    short_sha(&r.sha),
                    unit.name
                );
                self.tell_about(
                    &format!("rollout `{}`", unit.name),
                    first,
                    &r.sha,
                    Trigger::Rollout,
                    &message,
                )
                .await?;
                self.say(unit, first, &r.sha, State::Failure, reason)
                    .await?;
            }
            return Ok(());
        }
        if verdicts.iter().all(|(_, _, v)| *v == Verdict::Done) {
            return self.wave_through(unit, first, r).await;
        }
        // A member not tried since its wave started and with no job: its
        // job was lost (the daemon died after the wave's row was written).
        let active = self.app.queue.activity().await?;
        for (m, s, v) in &verdicts {
            let tried = s
                .as_ref()
                .and_then(|s| s.last_run_at)
                .is_some_and(|t| t >= r.wave_started_at);
            let queued = active
                .iter()
                .any(|a| &a.target == *m && (a.queued > 0 || a.running > 0));
            if *v == Verdict::Waiting && !tried && !queued {
                self.app.queue.enqueue(&rollout_request(m)).await?;
            }
        }
        Ok(())
    }

    /// Every member of the wave in progress is through: start the pause,
    /// then the next wave with members, or end the rollout.
    async fn wave_through(
        &self,
        unit: &RolloutUnit<'_>,
        first: &Target,
        r: &RolloutRow,
    ) -> Result<(), TickError> {
        let store = &self.app.store;
        let next = r
            .members
            .iter()
            .map(|(_, w)| *w)
            .filter(|w| *w > r.wave)
            .min();
        let Some(next) = next else {
            let reason = format!("rolled out to {} targets", r.members.len());
            if store
                .rollout_state(
                    (unit.name, r.seq, r.wave),
                    RolloutState::Running,
                    RolloutState::Done,
                    &reason,
                    None,
                )
                .await?
            {
                info!(rollout = unit.name, sha = %short_sha(&r.sha), "rollout done");
                self.say(unit, first, &r.sha, State::Success, reason)
                    .await?;
            }
            return Ok(());
        };
        let Some(done_at) = r.wave_done_at else {
            store.rollout_wave_done(unit.name, r.seq, r.wave).await?;
            return Ok(());
        };
        let paused = crate::store::now_ms() - done_at;
        if paused < unit.rollout.pause.as_millis() as i64 {
            return Ok(());
        }
        if store
            .rollout_next_wave(unit.name, r.seq, r.wave, next)
            .await?
        {
            self.wave_started(unit, first, &r.sha, &r.members, next)
                .await?;
        }
        Ok(())
    }

    /// The rollout's commit status (`driftless/rollout/<name>`), where its
    /// members' statuses go.
    async fn say(
        &self,
        unit: &RolloutUnit<'_>,
        first: &Target,
        sha: &str,
        state: State,
        description: String,
    ) -> Result<(), TickError> {
        if let Some(mut s) = first.commit_status(sha, state, description) {
            s.context = format!("driftless/rollout/{}", unit.name);
            s.target = unit.name.to_string();
            self.app.store.record_statuses(&[s], false).await?;
            self.app.outbox_wake.notify_waiters();
        }
        Ok(())
    }
}

/// When the run whose result `s` holds started ([`verdict`]'s
/// `judged_at`).
pub async fn judged_at(
    store: &crate::store::Store,
    s: Option<&TargetState>,
) -> Result<Option<i64>, StoreError> {
    match s.and_then(|s| s.last_run_id) {
        Some(id) => store.run_started_at(id).await,
        None => Ok(None),
    }
}

/// The job a wave queues for one of its members.
fn rollout_request(target: &str) -> crate::queue::Request {
    crate::queue::Request {
        target: target.to_string(),
        trigger: Trigger::Rollout,
        sha: None,
        delivery_id: None,
        receiver: None,
    }
}

/// A person resumes (`resume`: the halted wave is tried again, its failed
/// members retried) or aborts (`abort`: later waves stay where they are
/// until a newer commit) rollout `name`. `Err` says why not.
pub async fn decide(
    app: &App,
    name: &str,
    resume: bool,
    by: &str,
) -> Result<Result<RolloutRow, String>, StoreError> {
    let Some(r) = app.store.rollout(name).await? else {
        return Ok(Err(format!("rollout `{name}` has not started")));
    };
    let (from, to, reason) = match (resume, r.state) {
        (true, RolloutState::Halted) => (
            RolloutState::Halted,
            RolloutState::Running,
            format!("resumed by {by}"),
        ),
        (false, RolloutState::Running | RolloutState::Halted) => (
            r.state,
            RolloutState::Aborted,
            format!("aborted by {by} at wave {}", r.wave),
        ),
        (_, s) => {
            return Ok(Err(format!(
                "rollout `{name}` of {} is {}: only a halted rollout resumes, and a running or halted one aborts",
                short_sha(&r.sha),
                s.as_str()
            )));
        }
    };
    if !app
        .store
        .rollout_state((name, r.seq, r.wave), from, to, &reason, Some(by))
        .await?
    {
        return Ok(Err(format!("rollout `{name}` moved meanwhile: look again")));
    }
    if resume {
        // The halted wave's members run again; a retry tries a commit
        // found unhealthy once more.
        for (m, _) in r.members.iter().filter(|(_, w)| *w == r.wave) {
            app.queue
                .enqueue(&crate::queue::Request {
                    trigger: Trigger::Retry,
                    ..rollout_request(m)
                })
                .await?;
        }
    }
    Ok(app
        .store
        .rollout(name)
        .await?
        .ok_or_else(|| format!("rollout `{name}` is gone")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(wave: i64, state: RolloutState) -> RolloutRow {
        RolloutRow {
            name: "fleet".into(),
            seq: 1,
            sha: "b".repeat(40),
            state,
            wave,
            members: vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 3)],
            wave_started_at: 0,
            wave_done_at: None,
            reason: None,
            decided_by: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    /// Exec target `name`, the one member of rollout `fleet` (waves [1]).
    fn member_of_fleet(name: &str) -> Target {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            format!(
                "[[targets]]\nname = \"{name}\"\nrepo = \"/srv/r\"\n\
                 [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n\
                 [[groups]]\nname = \"fleet\"\ntargets = [\"{name}\"]\nrollout = {{ waves = [1] }}\n"
            ),
        )
        .expect("write");
        let settings = crate::config::load(&file).expect("valid");
        settings.targets[0].clone()
    }

    /// A resumed wave starts again at the resume: the member's quarantine
    /// and failed result from before it are stale until its retry has run
    /// (the retry's start alone moves `last_run_at`, not the result).
    #[test]
    fn a_failure_counts_only_from_a_run_started_since_the_wave() {
        let t = &member_of_fleet("a");
        let r = RolloutRow {
            wave_started_at: 1_000,
            ..row(1, RolloutState::Running)
        };
        let unhealthy = TargetState {
            name: "a".into(),
            last_applied_sha: Some(r.sha.clone()),
            last_result: Some("unhealthy".into()),
            last_message: Some("502".into()),
            last_run_id: Some(7),
            // The retry has started; its result is not in yet.
            last_run_at: Some(1_500),
            quarantined_sha: Some(r.sha.clone()),
            quarantine_reason: Some("502".into()),
            ..Default::default()
        };
        assert_eq!(
            verdict(Some(t), Some(&unhealthy), &r, Some(900)),
            Verdict::Waiting
        );
        assert_eq!(
            verdict(Some(t), Some(&unhealthy), &r, None),
            Verdict::Waiting
        );
        assert_eq!(
            verdict(Some(t), Some(&unhealthy), &r, Some(1_500)),
            Verdict::Failed("`a` is unhealthy: 502".into())
        );
        let failed = TargetState {
            quarantined_sha: None,
            last_result: Some("failed".into()),
            ..unhealthy.clone()
        };
        assert_eq!(
            verdict(Some(t), Some(&failed), &r, Some(900)),
            Verdict::Waiting
        );
        assert_eq!(
            verdict(Some(t), Some(&failed), &r, Some(1_000)),
            Verdict::Failed("`a` failed: 502".into())
        );
    }

    #[test]
    fn a_member_is_held_until_its_wave_and_only_when_it_has_a_commit() {
        let mut t = member_of_fleet("b");
        assert_eq!(t.rollout_of.as_deref(), Some("fleet"));
        let named = || TargetState {
            name: "b".into(),
            ..Default::default()
        };
        let state = TargetState {
            last_applied_sha: Some("a".repeat(40)),
            ..named()
        };
        let tip = "b".repeat(40);
        let held = staged(&t, &tip, Some(&row(1, RolloutState::Running)), Some(&state))
            .expect("held in wave 1");
        assert_eq!(held.at, "a".repeat(40));
        assert!(
            held.note
                .contains("wave 1 (running); this target is in wave 2"),
            "{}",
            held.note
        );
        assert!(staged(&t, &tip, Some(&row(2, RolloutState::Running)), Some(&state)).is_none());
        assert!(staged(&t, &tip, Some(&row(1, RolloutState::Halted)), Some(&state)).is_some());
        // A rollout of another commit: this tip's has not started.
        let other = RolloutRow {
            sha: "c".repeat(40),
            ..row(3, RolloutState::Done)
        };
        assert!(staged(&t, &tip, Some(&other), Some(&state)).is_some());
        assert!(staged(&t, &tip, None, Some(&state)).is_some());
        // Never applied: nothing to hold it at.
        assert!(staged(&t, &tip, None, Some(&named())).is_none());
        // Not in a rollout at all.
        t.rollout_of = None;
        assert!(staged(&t, &tip, None, Some(&state)).is_none());
    }
}
