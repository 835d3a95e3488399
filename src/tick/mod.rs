//! One tick: lock → record → git sync → backend → record.
//!
//! Every way of starting work (interval, webhook, API, one-shot CLI) ends up
//! in [`Reconciler::run_job`]; nothing else calls a backend's `apply`,
//! `apply_plan` or `destroy`. The order is the contract: the target's lock
//! is held for the whole tick; the run row (target, trigger, delivery) is
//! written before git is touched and its commit before the backend is
//! called — if either write fails the tick stops there; a failed run never
//! moves the last applied SHA; a target that verifies signatures has its
//! commits checked before its checkout moves. `converge` holds one run's
//! steps, `review` those of the ticks that plan (detect, approvals,
//! `driftless plan`), `notices` who hears of a run.

mod approval;
mod converge;
mod depends;
mod forget;
mod guard;
mod health;
mod identity;
mod notices;
mod output;
mod preview;
mod record;
mod review;
mod rewind;
mod rollout;
mod sets;
mod window;

use converge::with_inputs;
pub use preview::Previewed;
pub use rewind::{REWIND_REFUSED, accept as accept_rewind};
pub use rollout::{
    Verdict, decide as decide_rollout, judged_at as rollout_judged_at, verdict as rollout_verdict,
};
pub use sets::{SetRefresh, list_sets};
pub use window::interval_waits;

use std::time::Duration;

use tracing::{debug, error, info, warn};

use crate::app::App;
use crate::backend::{self, ApplyResult, Context, Outputs, Plan, Status};
use crate::config::{Policy, Target};
use crate::decrypt;
use crate::git::{Git, Synced, TagTip, tag_version};
use crate::lock::{LockError, TargetLock};
use crate::model::short_sha;
use crate::model::{CommitId, Trigger};
use crate::notify;
use crate::queue::{Job, JobEnd};
use crate::store::deployments::PlanState;
use crate::store::runs::Streak;
use crate::store::{DriftUpdate, NewRun, Operation, StoreError, TargetState};

/// What a tick knows about the run it records.
struct RunInfo {
    id: i64,
    op: Operation,
    trigger: String,
    delivery_id: Option<String>,
    started: std::time::Instant,
    started_ms: i64,
    /// How many deployments this process had made before the run began
    /// (`Store::deployments_made`).
    deployments_made: u64,
    /// The target's state before this run (read under the target's lock).
    prev: Option<TargetState>,
    /// Said first in the run's message, whatever its result: the tip does
    /// not descend from the commit last applied (`tick::rewind`).
    note: Option<String>,
    /// What a plan this run makes is made from, beside its commit (the
    /// ticks that review plans; `tick::identity`).
    made_from: Option<identity::MadeFrom>,
    /// The tip is quarantined and this run holds the target at its
    /// healthy commit (`tick::health`).
    hold: Option<health::Hold>,
    /// What the target's health checks run with, from its backend's
    /// context.
    probe: Option<crate::health::Probe>,
    /// The health checks of the commit applied last were begun this long
    /// ago by a run that was interrupted: resumed, not applied again.
    resumed_health: Option<Duration>,
    /// Outside the target's change window this run only rechecks its
    /// health at the commit it has (`tick::window::rechecks_only`).
    recheck_only: bool,
    /// The target's inputs as a plan document shows them (a sensitive
    /// one masked), for the ticks that review plans.
    shown_inputs: std::collections::BTreeMap<String, String>,
    /// Where what its commands print is kept (`tick::output`).
    output: Option<output::RunOutput>,
    /// Its start is on disk. False for a run begun unsynced
    /// (`Store::begin_run_unsynced`) until its commit is recorded
    /// (`Reconciler::start_on_disk`), before its backend runs.
    start_synced: bool,
}

/// What a run found besides its status, written with it.
#[derive(Debug, Default)]
struct Findings {
    /// The target's drift, when a `detect` run changed it.
    drift: Option<DriftUpdate>,
    /// The plan the run applied and the state it leaves `applying` for.
    plan_done: Option<(i64, PlanState, String)>,
    /// A plan waits for a person (the commit status stays `pending`).
    waiting: bool,
    /// A commit the run found unhealthy, and why (`tick::health`).
    quarantine: Option<(String, String)>,
}

/// Slack on top of a target's `timeout` before the tick gives up on a
/// backend that did not return (its commands are killed at `timeout`).
const BACKSTOP: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum TickError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Lock(LockError),
    #[error("target `{0}` is not in the configuration")]
    UnknownTarget(String),
    #[error("target `{target}` has no checkout yet: run `driftless tick {target}` first")]
    NoCheckout { target: String },
    #[error("target `{target}`: {message}")]
    Backend { target: String, message: String },
    #[error("target `{target}`: the tick stopped: {why}")]
    LeaseLost { target: String, why: String },
    /// A person's request that cannot be done as asked (nothing was).
    #[error("target `{target}`: {why}")]
    Refused { target: String, why: String },
    #[error("{set}: {source}")]
    Set {
        set: String,
        source: crate::git::GitError,
    },
}

/// How a tick ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ticked {
    /// A run was recorded with this result.
    Ran {
        run_id: i64,
        result: ApplyResult,
        sha: Option<String>,
        message: String,
    },
    /// Another tick holds the target's lock; nothing was done.
    Busy,
    /// The target is paused; nothing was done.
    Paused,
    /// Outside the target's change window: nothing was done, the job
    /// waits (`again`, then it looks again).
    Waiting { reason: String, again: Duration },
    /// A push that changed nothing under the target's path: the job was
    /// closed without a run, saying why.
    Unaffected { reason: String },
}

/// What [`Reconciler::plan_now`] found (made once per `driftless plan`,
/// never held in numbers: its size does not matter).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Planned {
    /// What applying the branch tip, `commit`, would change.
    Plan {
        commit: CommitId,
        plan: Plan,
        /// The plan as the policies read it.
        document: Box<crate::plan::Document>,
        /// What the policies covering the target make of it (`None`: no
        /// policy covers it; `Err`: they could not be evaluated).
        policies: Option<Result<crate::policy::Outcome, String>>,
    },
    /// This target's backend cannot plan.
    CannotPlan { backend: &'static str },
    /// Another tick holds the target's lock.
    Busy,
}

/// The one thing that converges targets: the [`App`] plus the git caches
/// and checkouts, which nothing else holds. Cheap to clone.
#[derive(Clone)]
pub struct Reconciler {
    app: App,
    git: Git,
    /// Refreshes of `[[target_sets]]` take turns (`tick::sets`), and
    /// remember which refused directories each set's owners were told of.
    sets_turn: std::sync::Arc<tokio::sync::Mutex<sets::Told>>,
}

impl Reconciler {
    pub fn new(app: App) -> Reconciler {
        Reconciler {
            git: Git::new(&app.settings().state_dir),
            app,
            sets_turn: Default::default(),
        }
    }

    /// The shared state (settings, store, queue, metrics): no git.
    pub fn app(&self) -> &App {
        &self.app
    }

    pub fn target(&self, name: &str) -> Result<Target, TickError> {
        self.app
            .target(name)
            .ok_or_else(|| TickError::UnknownTarget(name.to_string()))
    }

    /// Run a claimed job: apply the target at its branch tip. When it ran,
    /// the job is marked done before the target's lock is released. When the
    /// target is locked elsewhere, `Busy` is returned and the job is left to
    /// the caller.
    pub async fn run_job(&self, job: &Job) -> Result<Ticked, TickError> {
        // Boxed: the tick's future is large, and debug builds copy it.
        self.with_lease(job, Box::pin(self.run_claimed(job))).await
    }

    async fn run_claimed(&self, job: &Job) -> Result<Ticked, TickError> {
        let target = self.target(&job.target)?;
        // Outside its window the job waits queued; nothing is fetched. An
        // interval tick of a target that rechecks its health only does that.
        if let Some(shut) = window::shut(&target, &job.triggers)
            && !window::rechecks_only(&target, job)
        {
            info!(target = %target.name, job = job.id, reason = %shut.words, "job waits for its change window");
            return Ok(Ticked::Waiting {
                reason: shut.words,
                again: shut.again,
            });
        }
        // Which fetch of the repository this job may use: one started since
        // the job began (its requests all came before), or for the interval
        // alone one started within the last interval (one fetch a round
        // serves every target on the repository).
        let now = std::time::Instant::now();
        let since = if job.interval_only() {
            now.checked_sub(target.interval).unwrap_or(now)
        } else {
            now
        };
        // A set's member whose directory the branch no longer has is not
        // applied: its job ends, then its set is listed again, which
        // orphans (or destroys) it. Before the lock, and after the job
        // ends: a destroy takes both.
        if let Some((prefix, reason)) = self.member_gone(&target, since).await {
            info!(target = %target.name, job = job.id, %reason, "target set member's directory is gone");
            self.app.queue.end(job.id, JobEnd::Skipped(&reason)).await?;
            if let Err(e) = self.refresh_set(&prefix, since, true).await {
                error!(target = %target.name, error = %e, "cannot list the member's target set again; it is tried at the set's next refresh");
            }
            return Ok(Ticked::Unaffected { reason });
        }
        let lock = match TargetLock::try_acquire(&self.app.settings().locks_dir(), &target.name) {
            Ok(l) => l,
            Err(LockError::Busy { .. }) => return Ok(Ticked::Busy),
            Err(e) => return Err(TickError::Lock(e)),
        };
        if job.routed_by_git()
            && let Some(reason) = self.unaffected(&target, since).await?
        {
            info!(target = %target.name, job = job.id, %reason, "push does not affect the target");
            // Its commit was `pending` on the forge since it was queued.
            if let Some(done) = job.requested_sha.as_deref().and_then(|sha| {
                target.commit_status(
                    sha,
                    crate::store::statuses::State::Success,
                    format!("nothing to apply: {reason}"),
                )
            }) {
                self.app.store.record_statuses(&[done], false).await?;
            }
            self.app
                .queue
                .end(job.id, JobEnd::Unaffected(&reason))
                .await?;
            drop(lock);
            return Ok(Ticked::Unaffected { reason });
        }
        self.run_locked(&target, job, Operation::Apply, lock, since)
            .await
    }

    /// Whether a push leaves the target as it was, decided by git (a
    /// payload's file lists miss force pushes, renames, truncated and empty
    /// lists): the tree of the target's path at the commit its last apply
    /// tried, against the branch tip just fetched. Read-only — the fetch
    /// fills the shared cache, no checkout moves, no run is recorded. When
    /// git cannot tell (no run yet, a failed fetch, a commit gone from the
    /// cache), the job runs and records whatever happens.
    async fn unaffected(
        &self,
        target: &Target,
        since: std::time::Instant,
    ) -> Result<Option<String>, TickError> {
        // A tag push always runs: which tag is followed is the tick's call.
        // A target with inputs may have to run for them alone.
        if target.tag.is_some() || !target.inputs.is_empty() {
            return Ok(None);
        }
        let Some(base) = self.app.store.last_attempted_sha(&target.name).await? else {
            return Ok(None);
        };
        let Ok(tip) = self
            .git
            .fetch_since(&target.repo, &target.branch, &target.git, since)
            .await
        else {
            return Ok(None);
        };
        let short = |s: &str| short_sha(s).to_string();
        if tip == base {
            return Ok(Some(format!(
                "the branch tip {} was already applied",
                short(&tip)
            )));
        }
        let between = self
            .git
            .path_between(&target.repo, &target.path, &base, &tip)
            .await;
        Ok(match between {
            crate::git::PathBetween::Same => Some(format!(
                "nothing under `{}` changed between {} and {}",
                review::shown_path(target),
                short(&base),
                short(&tip)
            )),
            _ => None,
        })
    }

    /// A one-shot tick (CLI): take the lock, record a running `cli` job, run.
    pub async fn tick_now(&self, name: &str, op: Operation) -> Result<Ticked, TickError> {
        self.tick_now_as(name, op, Trigger::Cli).await
    }

    /// A one-shot tick asked for by `trigger` (`cli`, or `retry`: try again
    /// what failed or was rejected at the branch tip).
    pub async fn tick_now_as(
        &self,
        name: &str,
        op: Operation,
        trigger: Trigger,
    ) -> Result<Ticked, TickError> {
        let target = self.target(name)?;
        // Outside its window a one-shot tick applies nothing and says when
        // it opens (`--override-window` asks with trigger `override`); a
        // set's member whose directory went waits to be destroyed. A
        // person's `destroy` is a deliberate act.
        let persons_destroy = op == Operation::Destroy && trigger == Trigger::Cli;
        if !persons_destroy && let Some(shut) = window::shut(&target, &[trigger]) {
            return Ok(Ticked::Waiting {
                reason: shut.words,
                again: shut.again,
            });
        }
        // A paused target is not applied; destroying it is a deliberate act.
        if op == Operation::Apply
            && self
                .app
                .store
                .target_state(name)
                .await?
                .is_some_and(|s| s.paused_at.is_some())
        {
            return Ok(Ticked::Paused);
        }
        let lock = match TargetLock::try_acquire(&self.app.settings().locks_dir(), name) {
            Ok(l) => l,
            Err(LockError::Busy { .. }) => return Ok(Ticked::Busy),
            Err(e) => return Err(TickError::Lock(e)),
        };
        // A daemon worker may have marked a job running just before failing
        // to take the lock we hold; it puts the job back within moments.
        // A job still marked running after that, while we hold the lock,
        // was left by a process that died (a killed one-shot tick): its run
        // is marked interrupted and the job folded into ours.
        let mut job = None;
        for attempt in 0..30 {
            job = self.app.queue.start_now(name, trigger).await?;
            if job.is_some() {
                break;
            }
            if attempt == 10 && self.app.store.kind() == crate::store::Kind::Postgres {
                // Another host's job is dead only once its lease ran out.
                let dead = self.app.queue.recover_expired().await?;
                if !dead.is_empty() {
                    tracing::warn!(target_name = name, jobs = ?dead, "recovered jobs whose lease ran out");
                }
            } else if attempt == 10 {
                let dead: Vec<i64> = self
                    .app
                    .queue
                    .running()
                    .await?
                    .into_iter()
                    .filter(|j| {
                        j.target == name
                            && j.owner != self.app.queue.owner()
                            && j.quiet_for >= Duration::from_secs(1)
                    })
                    .map(|j| j.id)
                    .collect();
                if !dead.is_empty() {
                    self.app.queue.recover(&dead).await?;
                    tracing::warn!(target_name = name, jobs = ?dead, "recovered jobs left running by a process that died");
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let Some(job) = job else {
            return Ok(Ticked::Busy);
        };
        self.with_lease(
            &job,
            Box::pin(self.run_locked(&target, &job, op, lock, std::time::Instant::now())),
        )
        .await
    }

    /// Run `work`, a job's whole tick, while keeping the job's lease alive.
    /// On PostgreSQL the lease is what keeps other instances off the
    /// target: when it could run out before it is renewed (the database
    /// is unreachable, or the job was taken over), `work` is dropped — its
    /// commands' process groups killed with it — and the tick fails.
    async fn with_lease<F>(&self, job: &Job, work: F) -> Result<Ticked, TickError>
    where
        F: std::future::Future<Output = Result<Ticked, TickError>>,
    {
        // From the claim on, for the whole job (a first clone may be slow):
        // renewed every third of the lease; on PostgreSQL a deadline a
        // tenth ahead of the lease's end, counted from each renewal's send.
        let pg = self.app.store.kind() == crate::store::Kind::Postgres;
        let (lost_tx, lost) = tokio::sync::oneshot::channel::<String>();
        let heartbeat = {
            let queue = self.app.queue.clone();
            let id = job.id;
            let lease = queue.lease();
            let margin = lease / 10;
            let leased_at = tokio::time::Instant::from_std(job.leased_at);
            tokio::spawn(async move {
                let mut deadline = leased_at + lease - margin;
                let mut next = leased_at + lease / 3;
                loop {
                    tokio::time::sleep_until(if pg { next.min(deadline) } else { next }).await;
                    let now = tokio::time::Instant::now();
                    if pg && now >= deadline {
                        let _ = lost_tx.send("its lease could not be renewed in time".into());
                        return;
                    }
                    let renewal = queue.heartbeat(id);
                    let renewed = if pg {
                        match tokio::time::timeout(deadline - now, renewal).await {
                            Ok(r) => r,
                            Err(_) => {
                                let _ =
                                    lost_tx.send("its lease could not be renewed in time".into());
                                return;
                            }
                        }
                    } else {
                        renewal.await
                    };
                    match renewed {
                        Ok(true) => {
                            deadline = now + lease - margin;
                            next = now + lease / 3;
                        }
                        Ok(false) => {
                            error!(job = id, "lost the lease of a running job");
                            // On SQLite the target's file lock, held by the
                            // tick and its commands, keeps applies apart.
                            if pg {
                                let _ = lost_tx.send("its lease was taken over".into());
                            }
                            return;
                        }
                        Err(e) => {
                            warn!(job = id, error = %e, "cannot renew job lease");
                            next = tokio::time::Instant::now() + lease / 15;
                        }
                    }
                }
            })
        };
        let outcome = tokio::select! {
            outcome = work => outcome,
            Ok(why) = lost => {
                error!(target = %job.target, job = job.id, %why, "tick stopped: another instance may take the job over");
                Err(TickError::LeaseLost { target: job.target.clone(), why })
            }
        };
        heartbeat.abort();
        outcome
    }

    /// Converge under the held lock; the run's record closes the job, still
    /// under the lock, so nobody sees the job running with the target
    /// unlocked.
    async fn run_locked(
        &self,
        target: &Target,
        job: &Job,
        op: Operation,
        lock: TargetLock,
        since: std::time::Instant,
    ) -> Result<Ticked, TickError> {
        let wrapper = self
            .app
            .store
            .connect_url()
            .map(|url| crate::keeper::wrapper(url, self.app.queue.lease_of(job.id)));
        // Commands inherit the lock: if driftless dies mid-apply, the target
        // stays locked until the orphaned command is done — on this host.
        // On PostgreSQL each also goes through a keeper that renews the
        // job's lease for as long as it lives (`keeper`): for every host.
        // What the run's commands print is kept as it comes (`tick::output`).
        let slot = output::Slot::default();
        let converge = crate::process::with_inherited_fd(
            lock.as_raw_fd(),
            crate::process::with_wrapper(
                wrapper,
                crate::process::with_output(
                    slot.sink(),
                    // Boxed: the run's future is large, and a worker thread's
                    // stack is not (a debug build overflowed it).
                    slot.clone()
                        .scope(Box::pin(self.converge(target, Some(job), op, since))),
                ),
            ),
        );
        let outcome = converge.await;
        // A run that was recorded closed its job in the same transaction
        // (`Store::finish_run`): a full disk after it cannot make it run
        // again.
        drop(lock);
        outcome
    }

    /// The target's outputs, read from its current checkout.
    pub async fn outputs(&self, name: &str) -> Result<Outputs, TickError> {
        let err = |e: backend::BackendError| TickError::Backend {
            target: name.to_string(),
            message: e.to_string(),
        };
        self.output_reader(name).await?.outputs().await.map_err(err)
    }

    /// The target's backend on its current checkout, for reading outputs.
    async fn output_reader(&self, name: &str) -> Result<Box<dyn backend::Backend>, TickError> {
        let target = self.target(name)?;
        let checkout = self.git.checkout_dir(name);
        if self.git.checked_out(name).await.is_none() {
            return Err(TickError::NoCheckout {
                target: name.to_string(),
            });
        }
        let state = self.app.store.target_state(name).await?;
        let ctx = Context {
            name: target.name.clone(),
            workdir: checkout.join(&target.path),
            checkout: checkout.clone(),
            source_digest: String::new(),
            last_digest: state.and_then(|s| s.backend_digest),
            timeout: target.timeout,
            redactor: Git::redactor(&target.git),
            commit: None,
            ledger: Some(std::sync::Arc::new(self.app.store.clone())),
            plans_dir: self.app.settings().plans_dir(&target.name),
            retry: false,
            preview: None,
            inputs: Default::default(),
            confirm_within: None,
        };
        let err = |e: backend::BackendError| TickError::Backend {
            target: name.to_string(),
            message: e.to_string(),
        };
        backend::build(&target.backend, ctx).map_err(err)
    }
}
