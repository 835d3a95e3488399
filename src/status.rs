//! What `driftless status --json` and `GET /api/v1/targets` show: one record
//! per configured target, from the state database. Read-only.

use std::collections::HashMap;

use serde::Serialize;

use crate::app::App;
use crate::model::Trigger;
use crate::queue::JobStatus;
use crate::store::{Run, StoreError, format_ms};

/// One target's status.
#[derive(Debug, Clone, Serialize)]
pub struct TargetStatus {
    pub name: String,
    pub backend: String,
    pub repo: String,
    pub branch: String,
    /// The tag pattern a target that follows tags follows (its `branch`
    /// then means nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    pub path: String,
    pub last_applied_sha: Option<String>,
    pub last_result: Option<String>,
    pub last_message: Option<String>,
    pub last_run_id: Option<i64>,
    pub last_run_at: Option<String>,
    pub consecutive_failures: i64,
    pub queued: bool,
    pub running: bool,
    pub paused: bool,
    pub paused_by: Option<String>,
    /// `auto` or `detect`.
    pub policy: &'static str,
    /// What a `detect` target's last plan found different from git (its
    /// summary and address-and-action lines), if anything.
    pub drift: Option<String>,
    pub drift_since: Option<String>,
    /// The targets it depends on (`depends_on`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// The targets it depends on, directly or through others, with a job
    /// queued or running: its own queued job waits for them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waiting_on: Vec<String>,
    /// The `name_prefix` of the `[[target_sets]]` entry that made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_set: Option<String>,
    /// A set's member whose directory is gone: since when (and the commit
    /// that removed it). Its runs and last applied state are kept; it is
    /// no longer applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orphaned_since: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orphaned_at_sha: Option<String>,
    /// An orphaned member its set destroyed (`destroy_removed`): when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destroyed_at: Option<String>,
    /// The last commit applied and found healthy (`[targets.health]`).
    pub healthy_sha: Option<String>,
    /// A commit found unhealthy and not applied again until a newer one
    /// arrives or a person retries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantined_sha: Option<String>,
    /// The quarantine in words: `held at 1a2b3c (healthy); tip 4d5e6f
    /// unhealthy: …`, or the unhealthy commit kept as applied
    /// (`on_unhealthy = "report"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
    /// Its change windows (`windows`), when it has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowStatus>,
}

/// A target's change windows now.
#[derive(Debug, Clone, Serialize)]
pub struct WindowStatus {
    /// Work may start now.
    pub open: bool,
    /// When that next changes (RFC 3339), if within a year.
    pub next_change: Option<String>,
    /// `open until Fri 16:00 CET`, `closed; opens Mon 08:00 CET`.
    pub state: String,
    /// A job is queued and waits for the window to open.
    pub waiting: bool,
    /// Every entry in words.
    pub windows: String,
}

/// `target`'s windows at the windows' clock, `queued` saying whether a
/// job of it is queued. `None` without windows.
pub fn window(target: &crate::config::Target, queued: bool) -> Option<WindowStatus> {
    let w = &target.windows;
    if w.is_empty() {
        return None;
    }
    let now = crate::window::now();
    let at = w.at(now);
    Some(WindowStatus {
        open: at.open,
        next_change: at.next_change.map(|t| t.to_string()),
        state: w.state_words(now),
        waiting: queued && !at.open,
        windows: w.words(),
    })
}

/// Every configured target, in configuration order (a set's members as
/// they are known now), then the sets' orphaned members.
pub async fn targets(app: &App) -> Result<Vec<TargetStatus>, StoreError> {
    listing(app, None).await
}

/// [`targets`], or with `only` the configured target of that name alone
/// (its row read alone, no set's orphaned members).
async fn listing(app: &App, only: Option<&str>) -> Result<Vec<TargetStatus>, StoreError> {
    let (states, members) = match only {
        Some(name) => (
            app.store.target_state(name).await?.into_iter().collect(),
            Vec::new(),
        ),
        None => (
            app.store.target_states().await?,
            app.store.set_members().await?,
        ),
    };
    let activity = app.queue.activity().await?;
    let redactor = crate::redact::Redactor::new();
    let settings = app.settings();
    // Each looked up by name: a scan of the rows for every target took
    // most of a listing at 10,000 targets.
    let mut ancestors: HashMap<String, Vec<String>> = HashMap::new();
    for (of, on) in crate::config::graph::ancestors(&settings.targets) {
        ancestors.entry(of).or_default().push(on);
    }
    // One row a target (`activity` groups by target).
    let mut by_target = HashMap::with_capacity(activity.len());
    for a in &activity {
        by_target.entry(a.target.as_str()).or_insert(a);
    }
    let active = |name: &str| {
        by_target
            .get(name)
            .is_some_and(|a| a.queued > 0 || a.running > 0)
    };
    let mut by_name = HashMap::with_capacity(states.len());
    for s in &states {
        by_name.entry(s.name.as_str()).or_insert(s);
    }
    let state = |name: &str| by_name.get(name).copied();
    let mut out: Vec<TargetStatus> = settings
        .targets
        .iter()
        .filter(|t| only.is_none_or(|name| t.name == name))
        .map(|t| {
            let s = state(&t.name);
            let a = by_target.get(t.name.as_str()).copied();
            TargetStatus {
                backend: t.backend.kind().to_string(),
                repo: redactor.redact(&t.repo),
                branch: t.branch.clone(),
                tag: t.tag.clone(),
                path: t.path.to_string_lossy().into_owned(),
                queued: a.is_some_and(|a| a.queued > 0),
                running: a.is_some_and(|a| a.running > 0),
                policy: t.policy.as_str(),
                drift: s.and_then(|s| s.drift_summary.clone()),
                drift_since: s.and_then(|s| s.drift_since).map(format_ms),
                depends_on: t.depends_on.clone(),
                waiting_on: ancestors
                    .get(&t.name)
                    .into_iter()
                    .flatten()
                    .filter(|on| active(on))
                    .cloned()
                    .collect(),
                target_set: t.set.clone(),
                window: window(t, a.is_some_and(|a| a.queued > 0)),
                ..recorded(&t.name, s)
            }
        })
        .collect();
    // A member no longer made (its directory gone, or its set no longer
    // configured) is shown as orphaned, with what it last did.
    for m in members {
        if settings.target(&m.target).is_some() {
            continue;
        }
        let set = settings.target_set(&m.set).map(|s| &s.sample);
        let s = state(&m.target);
        out.push(TargetStatus {
            backend: s.map(|s| s.backend.clone()).unwrap_or_default(),
            repo: set.map(|t| redactor.redact(&t.repo)).unwrap_or_default(),
            branch: set.map(|t| t.branch.clone()).unwrap_or_default(),
            path: m.dir.clone(),
            policy: set.map(|t| t.policy.as_str()).unwrap_or("auto"),
            target_set: Some(m.set.clone()),
            // A row whose set is gone from the configuration is orphaned
            // with it, since the set was last seen (`added_at`).
            orphaned_since: Some(format_ms(m.orphaned_at.unwrap_or(m.added_at))),
            orphaned_at_sha: m.orphaned_sha.clone(),
            destroyed_at: m.destroyed_at.map(format_ms),
            ..recorded(&m.target, s)
        });
    }
    Ok(out)
}

/// What the database records of target `name` (its `targets` row), the
/// rest of the record empty.
fn recorded(name: &str, s: Option<&crate::store::TargetState>) -> TargetStatus {
    TargetStatus {
        name: name.to_string(),
        backend: String::new(),
        repo: String::new(),
        branch: String::new(),
        tag: None,
        path: String::new(),
        last_applied_sha: s.and_then(|s| s.last_applied_sha.clone()),
        last_result: s.and_then(|s| s.last_result.clone()),
        last_message: s.and_then(|s| s.last_message.clone()),
        last_run_id: s.and_then(|s| s.last_run_id),
        last_run_at: s.and_then(|s| s.last_run_at).map(format_ms),
        consecutive_failures: s.map(|s| s.consecutive_failures).unwrap_or(0),
        queued: false,
        running: false,
        paused: s.is_some_and(|s| s.paused_at.is_some()),
        paused_by: s.and_then(|s| s.paused_by.clone()),
        policy: "auto",
        drift: None,
        drift_since: None,
        depends_on: Vec::new(),
        waiting_on: Vec::new(),
        target_set: None,
        orphaned_since: None,
        orphaned_at_sha: None,
        destroyed_at: None,
        healthy_sha: s.and_then(|s| s.healthy_sha.clone()),
        quarantined_sha: s.and_then(|s| s.quarantined_sha.clone()),
        hold: s.and_then(hold),
        window: None,
    }
}

/// A quarantine in words, if one holds: where the target is held while
/// its tip is not applied.
pub fn hold(s: &crate::store::TargetState) -> Option<String> {
    let bad = s.quarantined_sha.as_deref()?;
    let why = s
        .quarantine_reason
        .as_deref()
        .unwrap_or("its health checks failed");
    let at = match (s.last_applied_sha.as_deref(), s.healthy_sha.as_deref()) {
        (Some(at), Some(good)) if at == good => good,
        _ => bad,
    };
    Some(crate::health::hold_words(at, bad, why))
}

/// One target's status: a configured target's from its own row, a set's
/// orphaned member's from the whole listing; None for neither.
pub async fn target(app: &App, name: &str) -> Result<Option<TargetStatus>, StoreError> {
    if app.settings().target(name).is_some() {
        return Ok(listing(app, Some(name)).await?.into_iter().next());
    }
    Ok(targets(app).await?.into_iter().find(|t| t.name == name))
}

/// A run as the CLI's `history --json` and the API show it.
#[derive(Debug, Clone, Serialize)]
pub struct RunView {
    pub id: i64,
    pub target: String,
    pub job: Option<i64>,
    pub operation: String,
    pub trigger: String,
    pub receiver: Option<String>,
    pub delivery_id: Option<String>,
    pub requested_sha: Option<String>,
    pub sha: Option<String>,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub duration_ms: Option<i64>,
    pub result: Option<String>,
    pub message: Option<String>,
    pub output_tail: Option<String>,
    /// How many runs this row stands for: identical `no_change` runs one
    /// after another are one row, from the first one's start to the last
    /// one's end.
    pub repeats: i64,
}

impl From<&Run> for RunView {
    fn from(r: &Run) -> RunView {
        RunView {
            id: r.id,
            target: r.target.clone(),
            job: r.job_id,
            operation: r.operation.clone(),
            trigger: r.trigger.clone(),
            receiver: r.receiver.clone(),
            delivery_id: r.delivery_id.clone(),
            requested_sha: r.requested_sha.clone(),
            sha: r.sha.clone(),
            started_at: format_ms(r.started_at),
            finished_at: r.finished_at.map(format_ms),
            duration_ms: r.duration_ms,
            result: r.result.clone(),
            message: r.message.clone(),
            output_tail: r.output_tail.clone(),
            repeats: r.repeats,
        }
    }
}

/// A job as `GET /api/v1/jobs/{id}` shows it, with its run once it has one.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub id: i64,
    pub target: String,
    pub state: JobStatus,
    pub triggers: Vec<Trigger>,
    pub requested_sha: Option<String>,
    pub delivery_ids: Vec<String>,
    pub receiver: Option<String>,
    pub attempts: i64,
    pub outcome: Option<String>,
    /// For a job folded into another: the job that carries on.
    pub merged_into: Option<i64>,
    pub run: Option<RunView>,
}

/// Job `id`, if there is one.
pub async fn job(app: &App, id: i64) -> Result<Option<JobView>, StoreError> {
    let Some(job) = app.queue.job(id).await? else {
        return Ok(None);
    };
    let run = match job.run_id {
        Some(r) => app.store.run(r).await?.as_ref().map(RunView::from),
        None => None,
    };
    Ok(Some(JobView {
        merged_into: job.merged_into(),
        id: job.id,
        target: job.target,
        state: job.state,
        triggers: job.triggers,
        requested_sha: job.requested_sha,
        delivery_ids: job.delivery_ids,
        receiver: job.receiver,
        attempts: job.attempts,
        outcome: job.outcome,
        run,
    }))
}

/// A rollout in waves as `driftless rollout status` and the API show it.
#[derive(Debug, Clone, Serialize)]
pub struct RolloutView {
    pub name: String,
    /// The commit rolled out.
    pub sha: String,
    /// `running`, `halted`, `done`, `superseded`, `aborted`.
    pub state: &'static str,
    /// The wave in progress (or halted at), and of how many with members.
    pub wave: usize,
    pub waves: usize,
    pub pause: String,
    pub reason: Option<String>,
    pub decided_by: Option<String>,
    pub started_at: String,
    pub wave_started_at: String,
    /// When every member of the wave in progress was through: the pause
    /// runs from then.
    pub wave_done_at: Option<String>,
    pub members: Vec<RolloutMember>,
}

/// One member of a rollout.
#[derive(Debug, Clone, Serialize)]
pub struct RolloutMember {
    pub target: String,
    pub wave: usize,
    /// `done` (an earlier wave, or applied and healthy), `failed`,
    /// `waiting` (the wave in progress), `held` (a later wave: it stays at
    /// the commit it has).
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// Every rollout in waves configured, with the newest row of each (`None`
/// before its first look).
pub async fn rollouts(app: &App) -> Result<Vec<(String, Option<RolloutView>)>, StoreError> {
    let settings = app.settings();
    let states = app.store.target_states().await?;
    let mut out = Vec::new();
    for unit in settings.rollout_units() {
        let Some(r) = app.store.rollout(unit.name).await? else {
            out.push((unit.name.to_string(), None));
            continue;
        };
        let waves: Vec<usize> = crate::rollout::nonempty_waves(
            &r.members
                .iter()
                .map(|(m, w)| (m.clone(), *w as usize))
                .collect::<Vec<_>>(),
        );
        let mut members = Vec::with_capacity(r.members.len());
        for (m, w) in &r.members {
            let (state, why) =
                if *w < r.wave || r.state == crate::store::rollouts::RolloutState::Done {
                    ("done", None)
                } else if *w > r.wave {
                    ("held", None)
                } else {
                    let s = states.iter().find(|s| &s.name == m);
                    let judged_at = crate::tick::rollout_judged_at(&app.store, s).await?;
                    match crate::tick::rollout_verdict(settings.target(m), s, &r, judged_at) {
                        crate::tick::Verdict::Done => ("done", None),
                        crate::tick::Verdict::Failed(why) => ("failed", Some(why)),
                        crate::tick::Verdict::Waiting => ("waiting", None),
                    }
                };
            members.push(RolloutMember {
                target: m.clone(),
                wave: waves
                    .iter()
                    .position(|x| *x as i64 == *w)
                    .map_or(0, |i| i + 1),
                state,
                why,
            });
        }
        out.push((
            unit.name.to_string(),
            Some(RolloutView {
                name: r.name.clone(),
                sha: r.sha.clone(),
                state: r.state.as_str(),
                wave: waves
                    .iter()
                    .position(|x| *x as i64 == r.wave)
                    .map_or(0, |i| i + 1),
                waves: waves.len(),
                pause: humantime::format_duration(unit.rollout.pause).to_string(),
                reason: r.reason.clone(),
                decided_by: r.decided_by.clone(),
                started_at: format_ms(r.created_at),
                wave_started_at: format_ms(r.wave_started_at),
                wave_done_at: r.wave_done_at.map(format_ms),
                members,
            }),
        ));
    }
    Ok(out)
}
