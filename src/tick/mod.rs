//! One tick: lock → record → git sync → backend → record.
//!
//! Every way of starting work (interval, webhook, API, one-shot CLI) ends up
//! in [`Reconciler::run_job`]; nothing else calls a backend's `apply`,
//! `apply_plan` or `destroy`. The order is the contract: the target's lock
//! is held for the whole tick; the run row (target, trigger, delivery) is
//! written before git is touched and its commit before the backend is
//! called — if either write fails the tick stops there; a failed run never
//! moves the last applied SHA; a target that verifies signatures has its
//! commits checked before its checkout moves. `review` holds the steps of the ticks that
//! plan (detect, approvals, `driftless plan`), `notices` who hears of a run.

mod depends;
mod forget;
mod identity;
mod notices;
mod preview;
mod record;
mod review;
mod rewind;
mod sets;

pub use preview::Previewed;
pub use rewind::{REWIND_REFUSED, accept as accept_rewind};
pub use sets::{SetRefresh, list_sets};

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
    /// The target's state before this run (read under the target's lock).
    prev: Option<TargetState>,
    /// Said first in the run's message, whatever its result: the tip does
    /// not descend from the commit last applied (`tick::rewind`).
    note: Option<String>,
    /// What a plan this run makes is made from, beside its commit (the
    /// ticks that review plans; `tick::identity`).
    made_from: Option<identity::MadeFrom>,
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
    /// A push that changed nothing under the target's path: the job was
    /// closed without a run, saying why.
    Unaffected { reason: String },
}

/// What [`Reconciler::plan_now`] found.
#[derive(Debug)]
pub enum Planned {
    /// What applying the branch tip, `commit`, would change.
    Plan { commit: CommitId, plan: Plan },
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
        let converge = crate::process::with_inherited_fd(
            lock.as_raw_fd(),
            crate::process::with_wrapper(wrapper, self.converge(target, Some(job), op, since)),
        );
        let outcome = converge.await;
        // A run that was recorded closed its job in the same transaction
        // (`Store::finish_run`): a full disk after it cannot make it run
        // again.
        drop(lock);
        outcome
    }

    async fn converge(
        &self,
        target: &Target,
        job: Option<&Job>,
        op: Operation,
        since: std::time::Instant,
    ) -> Result<Ticked, TickError> {
        let trigger = job.map(Job::trigger_label).unwrap_or_else(|| "cli".into());
        let delivery = job.and_then(|j| j.delivery_ids.last().cloned());
        let requested = job.and_then(|j| j.requested_sha.clone());
        let receiver = job.and_then(|j| j.receiver.clone());
        let started = std::time::Instant::now();
        let started_ms = crate::store::now_ms();
        // Before anything else: what a run killed mid-way left decrypted.
        let note = self.app.settings().decrypted_note(&target.name);
        let leftovers = decrypt::remove_leftovers(&note);
        // A target whose dependencies have not converged runs nothing: the
        // run says which one holds it back. Nor does one whose inputs
        // cannot be read (the run names the input).
        let run_row = NewRun {
            target: &target.name,
            job_id: job.map(|j| j.id),
            operation: op,
            trigger: &trigger,
            delivery_id: delivery.as_deref(),
            requested_sha: requested.as_deref(),
            receiver: receiver.as_deref(),
            sha: None,
        };
        let mut early = None;
        // A job driftless died during again and again is not run again by
        // itself (the claim count is a cheap first look: each interrupted
        // run was a claim).
        if let Some(j) = job
            && j.attempts > crate::queue::MAX_ATTEMPTS
        {
            let n = self.app.queue.interruptions(j.id).await?;
            if n >= crate::queue::MAX_ATTEMPTS {
                early = Some(Status::failed(format!(
                    "not run: driftless was stopped (it died or was killed) during each of this \
                     job's last {n} runs, so it is not run again by itself — a job that brings \
                     driftless down must not do it forever. The daemon's log around those \
                     `interrupted` runs says why; `driftless retry {}` or a new push runs the \
                     target again",
                    target.name
                )));
            }
        }
        if early.is_none()
            && op == Operation::Apply
            && !target.depends_on.is_empty()
            && let Some(why) = self.blocked_by(target).await?
        {
            early = Some(Status {
                result: ApplyResult::Blocked,
                message: why,
                output_tail: String::new(),
                digest: None,
            });
        }
        let mut inputs = depends::Inputs::default();
        if early.is_none() && !target.inputs.is_empty() {
            match self.resolve_inputs(target).await? {
                Ok(v) => inputs = v,
                Err(why) => early = Some(Status::failed(why)),
            }
        }
        if let Some(status) = early {
            let (run_id, state) = self.app.store.begin_run_with_state(&run_row).await?;
            let run = RunInfo {
                id: run_id,
                op,
                trigger,
                delivery_id: delivery,
                started,
                started_ms,
                prev: state,
                note: None,
                made_from: None,
            };
            if let Err(e) = &leftovers {
                error!(target = %target.name, error = %e,
                    "cannot remove decrypted files a run killed mid-way left behind");
            }
            // The commit a push asked for hears why it was not applied.
            return self
                .finish_with(
                    target,
                    &run,
                    None,
                    requested.as_deref(),
                    status,
                    Findings::default(),
                )
                .await;
        }
        // An apply fetches first (only the cache changes, as for routing) and
        // looks whether the checkout is already at the tip (read-only): then
        // the run row carries its commit from the start, one write fewer
        // for a tick with nothing to do. Nothing in the checkout moves
        // before the row exists either way.
        let mut followed: Option<TagTip> = None;
        let tip = match (op, &target.tag) {
            (Operation::Apply, None) => Some(
                self.git
                    .fetch_since(&target.repo, &target.branch, &target.git, since)
                    .await,
            ),
            // A target that follows tags: the highest version matching.
            (Operation::Apply, Some(pattern)) => Some(
                self.git
                    .fetch_tag(&target.repo, pattern, &target.git, since)
                    .await
                    .map(|t| {
                        let commit = t.commit.clone();
                        followed = Some(t);
                        commit
                    }),
            ),
            (Operation::Destroy, _) => None,
        };
        let already = match &tip {
            Some(Ok(sha)) if self.git.is_at(&target.name, sha).await => Some(sha.clone()),
            _ => None,
        };
        let (run_id, state) = self
            .app
            .store
            .begin_run_with_state(&NewRun {
                sha: already.as_deref(),
                ..run_row
            })
            .await?;
        let mut run = RunInfo {
            id: run_id,
            op,
            trigger: trigger.clone(),
            delivery_id: delivery.clone(),
            started,
            started_ms,
            prev: state.clone(),
            note: None,
            made_from: None,
        };
        match leftovers {
            Ok(0) => {}
            Ok(n) => warn!(target = %target.name, files = n,
                "removed decrypted files a run killed mid-way left behind"),
            Err(e) => {
                return self
                    .finish(target, &run, None, Status::failed(e.to_string()))
                    .await;
            }
        }

        // Before the checkout moves or a backend runs: a followed tag must
        // not go backwards (and be signed, with `verify`); a verifying
        // target's commits are checked in the cache; a branch tip that does
        // not descend from the commit last applied is refused under
        // `verify` until accepted (`tick::rewind`). A refusal fails the
        // run; the last applied commit stays.
        let refusal = match (&followed, &tip, &target.verify) {
            (Some(t), Some(Ok(_)), _) => self.tag_may_apply(target, t).await.err(),
            (None, Some(Ok(sha)), v) if op == Operation::Apply => {
                let last = state.as_ref().and_then(|s| s.last_applied_sha.as_deref());
                let unsigned = match v {
                    Some(v) => self
                        .git
                        .verify(&target.name, &target.repo, sha.as_str(), last, v)
                        .await
                        .err()
                        .map(|e| e.to_string()),
                    None => None,
                };
                match unsigned {
                    Some(why) => Some(why),
                    None => match self.rewind(target, sha.as_str(), state.as_ref()).await {
                        Ok(note) => {
                            run.note = note;
                            None
                        }
                        Err(why) => Some(why),
                    },
                }
            }
            _ => None,
        };
        if let (Some(why), Some(Ok(sha))) = (refusal, &tip) {
            if already.is_none() {
                self.app.store.set_run_sha(run_id, sha.as_str()).await?;
            }
            return self
                .finish_with(
                    target,
                    &run,
                    None,
                    Some(sha.as_str()),
                    Status::failed(why),
                    Findings::default(),
                )
                .await;
        }

        // A checkout belongs to one repository, path and backend kind.
        if let Err(why) = self.own_checkout(target) {
            if let (None, Some(Ok(sha))) = (&already, &tip) {
                self.app.store.set_run_sha(run_id, sha.as_str()).await?;
            }
            return self.finish(target, &run, None, Status::failed(why)).await;
        }
        // git: the branch tip for apply; for destroy, what was last applied.
        let synced = match (op, tip) {
            (Operation::Apply, Some(Ok(sha))) => {
                self.git
                    .checkout_known(target.source(), &sha, already.is_some())
                    .await
            }
            (Operation::Apply, Some(Err(e))) => Err(e),
            _ => {
                let fetched = match &target.tag {
                    None => {
                        self.git
                            .fetch(&target.repo, &target.branch, &target.git)
                            .await
                    }
                    Some(pattern) => self
                        .git
                        .fetch_tag(&target.repo, pattern, &target.git, since)
                        .await
                        .map(|t| t.commit),
                };
                match fetched {
                    Ok(tip) => {
                        let sha = state
                            .as_ref()
                            .and_then(|s| s.last_applied_sha.clone())
                            .unwrap_or(tip);
                        self.git.checkout(target.source(), &sha).await
                    }
                    Err(e) => Err(e),
                }
            }
        };
        let synced = match synced.map_err(|e| e.to_string()).and_then(|s| {
            self.note_checkout(target)?;
            Ok(s)
        }) {
            Ok(s) => s,
            Err(e) => {
                let status = Status::failed(e);
                return self.finish(target, &run, None, status).await;
            }
        };
        if let Some(req) = &requested
            && !synced.sha.as_str().starts_with(req.as_str())
        {
            info!(target = %target.name, requested = %req, tip = %synced.sha,
                      "the branch tip differs from the requested commit; applying the tip");
        }
        // The commit is on record before the backend is called.
        if already.as_deref() != Some(synced.sha.as_str()) {
            self.app
                .store
                .set_run_sha(run_id, synced.sha.as_str())
                .await?;
        }

        let retry = job.is_some_and(|j| j.triggers.contains(&Trigger::Retry));
        let mut ctx = self.context(target, &synced, state.and_then(|s| s.backend_digest), retry);
        let reviews = op == Operation::Apply && target.tick_policy().reviews();
        // The key a digest of decrypted values is kept under, read before
        // anything is decrypted (a failure then leaves no plaintext).
        let key = match (reviews, &target.decrypt) {
            (true, Some(_)) => Some(self.app.store.key("plan_hash").await?),
            _ => None,
        };
        if reviews {
            run.made_from = Some(identity::MadeFrom {
                inputs: inputs.recorded.clone(),
                decrypted: None,
                backend: identity::backend_digest(&target.backend),
            });
        }
        with_inputs(&mut ctx, inputs);
        // SOPS files: decrypted for the backend alone, encrypted again after
        // it, whatever it did; every value masked in what it reports.
        let opened = match &target.decrypt {
            None => None,
            Some(sops) => match decrypt::open(&synced.workdir, &note, sops).await {
                Ok(o) => {
                    for v in &o.secrets {
                        ctx.redactor.add(v.clone());
                    }
                    if let (Some(m), Some(key)) = (run.made_from.as_mut(), &key) {
                        // Keyed: a digest of secrets is not kept bare.
                        m.decrypted = Some(identity::keyed(key, &o.secrets));
                    }
                    Some(o)
                }
                Err(e) => {
                    let status = Status::failed(ctx.redactor.redact(&e.to_string()));
                    return self
                        .finish(target, &run, Some(synced.sha.as_str()), status)
                        .await;
                }
            },
        };
        let ticked = self
            .run_backend(target, &run, &synced, ctx, op, retry)
            .await;
        // The tag now applied: a lower one later is refused.
        if let (Some(t), Ok(Ticked::Ran { result, .. })) = (&followed, &ticked)
            && matches!(result, ApplyResult::Changed | ApplyResult::NoChange)
        {
            let note = self.app.settings().followed_tag_note(&target.name);
            let noted = note
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::write(&note, format!("{}\n", t.name)));
            if let Err(e) = noted {
                error!(target = %target.name, file = %note.display(), error = %e,
                    "cannot note the tag applied; a lower tag would not be refused");
            }
        }
        if let Some(o) = opened
            && let Err(e) = o.close()
        {
            error!(target = %target.name, error = %e, "decrypted files are left in the checkout");
        }
        ticked
    }

    /// Whether the tag a target follows may be applied: not below the tag
    /// applied last (a deleted or lowered tag), and signed by a listed key
    /// when the target verifies. `Err` says why not.
    async fn tag_may_apply(&self, target: &Target, t: &TagTip) -> Result<(), String> {
        let note = self.app.settings().followed_tag_note(&target.name);
        let last = match std::fs::read_to_string(&note) {
            Ok(s) => Some(s.trim().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("cannot read {}: {e}", note.display())),
        };
        if let Some(last) = last.filter(|l| *l != t.name)
            && let (Some(now), Some(before)) = (tag_version(&t.name), tag_version(&last))
            && now < before
        {
            return Err(format!(
                "the tag moved backwards: the highest tag matching `{}` is now {}, below {} applied last \
                 (deleted, or lowered); not applied",
                target.tag.as_deref().unwrap_or(""),
                t.name,
                last
            ));
        }
        debug!(target = %target.name, tag = %t.name, commit = %short_sha(&t.commit), "following tag");
        match &target.verify {
            Some(v) => self
                .git
                .verify_tag(&target.name, &target.repo, t, v)
                .await
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// The backend's part of a tick: review, detect, or apply/destroy, then
    /// the run recorded.
    async fn run_backend(
        &self,
        target: &Target,
        run: &RunInfo,
        synced: &Synced,
        ctx: Context,
        op: Operation,
        retry: bool,
    ) -> Result<Ticked, TickError> {
        if op == Operation::Apply && target.tick_policy().reviews() {
            return match backend::build(&target.backend, ctx) {
                Err(e) => {
                    self.finish(target, run, None, Status::failed(e.to_string()))
                        .await
                }
                Ok(b) => self.review(target, run, &synced.sha, b, retry).await,
            };
        }
        if op == Operation::Apply && target.tick_policy() == Policy::Detect {
            return match backend::build(&target.backend, ctx) {
                Err(e) => {
                    self.finish(target, run, None, Status::failed(e.to_string()))
                        .await
                }
                Ok(b) => self.detect(target, run, &synced.sha, b).await,
            };
        }
        let status = match backend::build(&target.backend, ctx) {
            Err(e) => Status::failed(e.to_string()),
            Ok(b) => {
                let fut = match op {
                    Operation::Apply => b.apply(),
                    Operation::Destroy => b.destroy(),
                };
                let status = match tokio::time::timeout(target.timeout + BACKSTOP, fut).await {
                    Ok(s) => s,
                    Err(_) => Status::failed(format!(
                        "the backend did not return within the target's timeout ({})",
                        humantime::format_duration(target.timeout)
                    )),
                };
                // Outputs others take: recorded with the run that left them.
                // Applied but unreadable fails the run (it runs again).
                match status.result {
                    ApplyResult::Changed | ApplyResult::NoChange
                        if op == Operation::Apply && self.consumed(target) =>
                    {
                        match self
                            .keep_outputs(target, run.id, status.result, b.as_ref())
                            .await
                        {
                            Ok(()) => status,
                            Err(e) => Status::failed(format!(
                                "{}; but its outputs, which other targets take, could not be kept: {e}",
                                status.message
                            )),
                        }
                    }
                    // A destroyed target's outputs describe nothing that
                    // exists: forgotten, so no input reads them.
                    ApplyResult::Changed | ApplyResult::NoChange if op == Operation::Destroy => {
                        self.app.store.forget_outputs(&target.name).await?;
                        status
                    }
                    _ => status,
                }
            }
        };
        self.finish(target, run, Some(synced.sha.as_str()), status)
            .await
    }

    /// What the backend is bound to for one operation on `synced`.
    fn context(
        &self,
        target: &Target,
        synced: &Synced,
        last_digest: Option<String>,
        retry: bool,
    ) -> Context {
        Context {
            name: target.name.clone(),
            workdir: synced.workdir.clone(),
            checkout: synced.checkout.clone(),
            source_digest: synced.source_digest.clone(),
            last_digest,
            timeout: target.timeout,
            redactor: Git::redactor(&target.git),
            commit: Some(synced.sha.clone()),
            ledger: Some(std::sync::Arc::new(self.app.store.clone())),
            plans_dir: self.app.settings().plans_dir(&target.name),
            retry,
            preview: None,
            inputs: Default::default(),
        }
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
        };
        let err = |e: backend::BackendError| TickError::Backend {
            target: name.to_string(),
            message: e.to_string(),
        };
        backend::build(&target.backend, ctx).map_err(err)
    }
}

/// Hand `inputs` to the backend (its secrets to the redactor), and make
/// them as recorded (a sensitive one's keyed digest, never its value) part
/// of the digest that decides "no change": a changed input is a change.
fn with_inputs(ctx: &mut Context, inputs: depends::Inputs) {
    let depends::Inputs {
        values: inputs,
        secrets,
        recorded,
    } = inputs;
    for s in secrets {
        ctx.redactor.add(s);
    }
    if inputs.is_empty() {
        return;
    }
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(ctx.source_digest.as_bytes());
    for (k, v) in &recorded {
        h.update([0]);
        h.update(k.as_bytes());
        h.update([0]);
        h.update(v.as_bytes());
    }
    ctx.source_digest = hex::encode(h.finalize());
    ctx.inputs = inputs;
}
