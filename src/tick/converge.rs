//! One run of a target, step by step ([`Reconciler::converge`]): what
//! holds it back, the tip fetched, the run row begun, what refuses the tip
//! (a tag gone backwards, a signature, a rewind), the checkout moved, the
//! backend's context and secrets, the backend's part, the tag noted. Each
//! step hands the next what it needs or ends the run with the status that
//! says why. Recording the run is `tick::record`'s; planning ticks are
//! `tick::review`'s.

use super::*;
use crate::git::GitError;
use crate::queue::MAX_ATTEMPTS;

/// Who asked for a run and when it started, as its row records it.
struct Asked {
    op: Operation,
    job_id: Option<i64>,
    trigger: String,
    delivery: Option<String>,
    requested: Option<String>,
    receiver: Option<String>,
    started: std::time::Instant,
    started_ms: i64,
    /// [`crate::store::Store::deployments_made`] before the run began.
    deployments_made: u64,
}

impl Asked {
    fn of(job: Option<&Job>, op: Operation, deployments_made: u64) -> Asked {
        Asked {
            deployments_made,
            op,
            job_id: job.map(|j| j.id),
            trigger: job.map(Job::trigger_label).unwrap_or_else(|| "cli".into()),
            delivery: job.and_then(|j| j.delivery_ids.last().cloned()),
            requested: job.and_then(|j| j.requested_sha.clone()),
            receiver: job.and_then(|j| j.receiver.clone()),
            started: std::time::Instant::now(),
            started_ms: crate::store::now_ms(),
        }
    }

    /// The run's row, with its commit when that is known from the start.
    fn row<'a>(&'a self, target: &'a str, sha: Option<&'a str>) -> NewRun<'a> {
        NewRun {
            target,
            job_id: self.job_id,
            operation: self.op,
            trigger: &self.trigger,
            delivery_id: self.delivery.as_deref(),
            requested_sha: self.requested.as_deref(),
            receiver: self.receiver.as_deref(),
            sha,
        }
    }

    /// What the tick knows of run `id`, begun on state `prev`.
    fn run(&self, id: i64, prev: Option<TargetState>) -> RunInfo {
        RunInfo {
            id,
            op: self.op,
            trigger: self.trigger.clone(),
            delivery_id: self.delivery.clone(),
            started: self.started,
            started_ms: self.started_ms,
            deployments_made: self.deployments_made,
            prev,
            note: None,
            made_from: None,
            hold: None,
            probe: None,
            resumed_health: None,
            recheck_only: false,
            shown_inputs: Default::default(),
            output: None,
            start_synced: true,
        }
    }
}

/// The commit an apply fetched, and the tag it is for a target that
/// follows tags; nothing for destroy, which fetches as it checks out.
struct Tip {
    sha: Option<Result<String, GitError>>,
    followed: Option<TagTip>,
}

impl Reconciler {
    /// One run of `op` on `target`, recorded: the steps below in their
    /// order, each ending the run with its reason when it must.
    pub(super) async fn converge(
        &self,
        target: &Target,
        job: Option<&Job>,
        op: Operation,
        since: std::time::Instant,
    ) -> Result<Ticked, TickError> {
        let asked = Asked::of(job, op, self.app.store.deployments_made());
        // Before anything else: what a run killed mid-way left decrypted.
        let note = self.app.settings().decrypted_note(&target.name);
        let leftovers = decrypt::remove_leftovers(&note);
        let inputs = match self.held_back(target, job, op).await? {
            Ok(inputs) => inputs,
            Err(status) => {
                return self
                    .end_held_back(target, &asked, leftovers.err(), status)
                    .await;
            }
        };
        // An apply fetches first (only the cache changes, as for routing) and
        // looks whether the checkout is already at the tip (read-only): then
        // the run row carries its commit from the start, one write fewer
        // for a tick with nothing to do. Nothing in the checkout moves
        // before the row exists either way.
        let tip = self.fetch_tip(target, op, since).await;
        let already = match &tip.sha {
            Some(Ok(sha)) if self.git.is_at(&target.name, sha).await => Some(sha.clone()),
            _ => None,
        };
        let (mut run, state) = self.begin(target, &asked, already.as_deref()).await?;
        let run_id = run.id;
        run.output = output::begin(&self.app.store, &target.name, run_id);
        run.recheck_only = job.is_some_and(|j| window::rechecks_only(target, j));
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
        if let Some((why, about_tip)) = self.refused(target, &tip, state.as_ref(), &mut run).await {
            return self
                .end_refused(target, &run, &tip, already.is_some(), why, about_tip)
                .await;
        }
        let retry = job.is_some_and(|j| j.triggers.contains(&Trigger::Retry));
        let mut tip = tip;
        let known = match self
            .aimed(
                target,
                op,
                &mut tip,
                state.as_ref(),
                retry,
                &mut run,
                already.as_deref(),
            )
            .await?
        {
            Ok(known) => known,
            Err(kept) => return Ok(kept),
        };
        let Tip {
            sha: fetched,
            followed,
        } = tip;
        let synced = match self
            .sync(target, op, fetched, known, state.as_ref(), since)
            .await
        {
            Ok(s) => s,
            Err(e) => return self.finish(target, &run, None, Status::failed(e)).await,
        };
        if let Some(req) = &asked.requested
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
            run.start_synced = true;
        }
        run.resumed_health = health::resumed(target, op, state.as_ref(), &synced.sha);
        let ctx = self.context(target, &synced, state.and_then(|s| s.backend_digest), retry);
        let (mut ctx, opened) = match self
            .prepare(target, &mut run, &synced, ctx, inputs, op)
            .await?
        {
            Ok(ready) => ready,
            Err(status) => {
                return self
                    .finish(target, &run, Some(synced.sha.as_str()), status)
                    .await;
            }
        };
        run.probe = Some(health::probe_of(&ctx));
        // A rollback to the healthy commit arms no watchdog: undoing it
        // would bring back the unhealthy one.
        if run.hold.is_none() {
            ctx.confirm_within = target.health.as_ref().and_then(|h| h.confirm_within);
        }
        let ticked = self
            .run_backend(target, &run, &synced, ctx, op, retry)
            .await;
        if let (Some(t), Ok(Ticked::Ran { result, .. })) = (&followed, &ticked)
            && matches!(result, ApplyResult::Changed | ApplyResult::NoChange)
        {
            self.note_followed_tag(target, t);
        }
        if let Some(o) = opened
            && let Err(e) = o.close()
        {
            error!(target = %target.name, error = %e, "decrypted files are left in the checkout");
        }
        ticked
    }

    /// The run's row, begun. A run whose checkout is already at the tip
    /// (`already`) may end with nothing done: its start need not wait for
    /// the disk (`start_on_disk`).
    async fn begin(
        &self,
        target: &Target,
        asked: &Asked,
        already: Option<&str>,
    ) -> Result<(RunInfo, Option<TargetState>), TickError> {
        let row = asked.row(&target.name, already);
        let (id, state, start_synced) = match already {
            Some(_) => self.app.store.begin_run_unsynced(&row).await?,
            None => {
                let (id, state) = self.app.store.begin_run_with_state(&row).await?;
                (id, state, true)
            }
        };
        let mut run = asked.run(id, state.clone());
        run.start_synced = start_synced;
        Ok((run, state))
    }

    /// A run held back before anything is fetched, recorded: the commit a
    /// push asked for hears why it was not applied.
    async fn end_held_back(
        &self,
        target: &Target,
        asked: &Asked,
        leftovers: Option<decrypt::DecryptError>,
        status: Status,
    ) -> Result<Ticked, TickError> {
        let (run_id, state) = self
            .app
            .store
            .begin_run_with_state(&asked.row(&target.name, None))
            .await?;
        if let Some(e) = leftovers {
            error!(target = %target.name, error = %e,
                "cannot remove decrypted files a run killed mid-way left behind");
        }
        self.finish_with(
            target,
            &asked.run(run_id, state),
            None,
            asked.requested.as_deref(),
            status,
            Findings::default(),
        )
        .await
    }

    /// A run whose tip was refused (`Self::refused`), recorded with the
    /// tip it looked at when the refusal is about the tip.
    async fn end_refused(
        &self,
        target: &Target,
        run: &RunInfo,
        tip: &Tip,
        known: bool,
        why: String,
        about_tip: bool,
    ) -> Result<Ticked, TickError> {
        let sha = match &tip.sha {
            Some(Ok(sha)) => Some(sha.as_str()),
            _ => None,
        };
        if !known && let Some(sha) = sha {
            self.app.store.set_run_sha(run.id, sha).await?;
        }
        let seen = sha.filter(|_| about_tip);
        let status = Status::failed(why);
        self.finish_with(target, run, None, seen, status, Findings::default())
            .await
    }

    /// Where the run takes the target (`tick::health::aim`): the tip, or
    /// the healthy commit while the tip is quarantined under `rollback`
    /// (`tip` and `run.hold` say so; `Ok` tells whether the checkout is
    /// already there). A tip kept as applied ends the run here, held,
    /// without its backend (`Err`, the run recorded).
    #[allow(clippy::too_many_arguments)]
    async fn aimed(
        &self,
        target: &Target,
        op: Operation,
        tip: &mut Tip,
        state: Option<&TargetState>,
        retry: bool,
        run: &mut RunInfo,
        already: Option<&str>,
    ) -> Result<Result<bool, Ticked>, TickError> {
        let known = already.is_some();
        let Some(Ok(sha)) = &tip.sha else {
            return Ok(Ok(known));
        };
        if op != Operation::Apply {
            return Ok(Ok(known));
        }
        let rollout = match &target.rollout_of {
            Some(unit) => self.app.store.rollout(unit).await?,
            None => None,
        };
        match health::aim(
            target,
            sha,
            state,
            retry,
            rollout.as_ref(),
            run.recheck_only,
        ) {
            health::Aim::Tip => Ok(Ok(known)),
            health::Aim::Staged(s) => {
                let known = self.git.is_at(&target.name, &s.at).await;
                tip.sha = Some(Ok(s.at));
                run.note = Some(match run.note.take() {
                    Some(n) => format!("{n}; {}", s.note),
                    None => s.note,
                });
                Ok(Ok(known))
            }
            health::Aim::Kept { tip: bad, reason } => {
                if already.is_none() {
                    self.app.store.set_run_sha(run.id, &bad).await?;
                }
                let status = Status {
                    result: ApplyResult::Held,
                    message: crate::health::hold_words(&bad, &bad, &reason),
                    output_tail: String::new(),
                    digest: None,
                };
                let seen = Some(bad.as_str());
                self.finish_with(target, run, None, seen, status, Findings::default())
                    .await
                    .map(Err)
            }
            health::Aim::Held(h) => {
                let known = self.git.is_at(&target.name, &h.at).await;
                tip.sha = Some(Ok(h.at.clone()));
                run.hold = Some(h);
                Ok(Ok(known))
            }
        }
    }

    /// What holds a run back before anything is fetched: a job driftless
    /// died during again and again, a dependency that has not converged
    /// (the run says which), an input that cannot be read (the run names
    /// it). `Err` is the run's status; `Ok` the target's inputs.
    async fn held_back(
        &self,
        target: &Target,
        job: Option<&Job>,
        op: Operation,
    ) -> Result<Result<depends::Inputs, Status>, TickError> {
        // A job driftless died during again and again is not run again by
        // itself (the claim count is a cheap first look: each interrupted
        // run was a claim).
        if let Some(j) = job
            && j.attempts > MAX_ATTEMPTS
        {
            let n = self.app.queue.interruptions(j.id).await?;
            if n >= MAX_ATTEMPTS {
                return Ok(Err(Status::failed(format!(
                    "not run: driftless was stopped (it died or was killed) during each of this \
                     job's last {n} runs, so it is not run again by itself — a job that brings \
                     driftless down must not do it forever. The daemon's log around those \
                     `interrupted` runs says why; `driftless retry {}` or a new push runs the \
                     target again",
                    target.name
                ))));
            }
        }
        if op == Operation::Apply
            && !target.depends_on.is_empty()
            && let Some(why) = self.blocked_by(target).await?
        {
            return Ok(Err(Status {
                result: ApplyResult::Blocked,
                message: why,
                output_tail: String::new(),
                digest: None,
            }));
        }
        if target.inputs.is_empty() {
            return Ok(Ok(depends::Inputs::default()));
        }
        Ok(self.resolve_inputs(target).await?.map_err(Status::failed))
    }

    /// The commit an apply would converge to: the branch tip, or the
    /// highest tag matching the target's pattern.
    async fn fetch_tip(&self, target: &Target, op: Operation, since: std::time::Instant) -> Tip {
        match (op, &target.tag) {
            (Operation::Destroy, _) => Tip {
                sha: None,
                followed: None,
            },
            (Operation::Apply, None) => Tip {
                sha: Some(
                    self.git
                        .fetch_since(&target.repo, &target.branch, &target.git, since)
                        .await,
                ),
                followed: None,
            },
            (Operation::Apply, Some(pattern)) => {
                match self
                    .git
                    .fetch_tag(&target.repo, pattern, &target.git, since)
                    .await
                {
                    Ok(t) => Tip {
                        sha: Some(Ok(t.commit.clone())),
                        followed: Some(t),
                    },
                    Err(e) => Tip {
                        sha: Some(Err(e)),
                        followed: None,
                    },
                }
            }
        }
    }

    /// Why the fetched tip may not be checked out, if it may not:
    /// [`Self::refusal`]'s reasons (`true`: the run's status is about the
    /// tip), or a checkout that belongs to another repository, path or
    /// backend kind (`false`).
    async fn refused(
        &self,
        target: &Target,
        tip: &Tip,
        state: Option<&TargetState>,
        run: &mut RunInfo,
    ) -> Option<(String, bool)> {
        if let Some(Ok(sha)) = &tip.sha
            && let Some(why) = self
                .refusal(target, tip.followed.as_ref(), sha, state, run)
                .await
        {
            return Some((why, true));
        }
        // A checkout belongs to one repository, path and backend kind.
        self.own_checkout(target).err().map(|why| (why, false))
    }

    /// Before the checkout moves or a backend runs: a followed tag must not
    /// go backwards (and be signed, with `verify`); a verifying target's
    /// commits are checked in the cache; a branch tip that does not descend
    /// from the commit last applied is refused under `verify` until
    /// accepted (`tick::rewind`, whose note the run keeps). `Some` says why
    /// the tip is refused: the run fails, the last applied commit stays.
    async fn refusal(
        &self,
        target: &Target,
        followed: Option<&TagTip>,
        sha: &str,
        state: Option<&TargetState>,
        run: &mut RunInfo,
    ) -> Option<String> {
        if let Some(t) = followed {
            return self.tag_may_apply(target, t).await.err();
        }
        let last = state.and_then(|s| s.last_applied_sha.as_deref());
        if let Some(v) = &target.verify
            && let Err(e) = self
                .git
                .verify(&target.name, &target.repo, sha, last, v)
                .await
        {
            return Some(e.to_string());
        }
        match self.rewind(target, sha, state).await {
            Ok(note) => {
                run.note = note;
                None
            }
            Err(why) => Some(why),
        }
    }

    /// The checkout moved: an apply to the tip it fetched (`known`: the
    /// checkout is already there); a destroy to what was last applied, or
    /// the tip when nothing was. `Err` says why not.
    async fn sync(
        &self,
        target: &Target,
        op: Operation,
        fetched: Option<Result<String, GitError>>,
        known: bool,
        state: Option<&TargetState>,
        since: std::time::Instant,
    ) -> Result<Synced, String> {
        let synced = match (op, fetched) {
            (Operation::Apply, Some(Ok(sha))) => {
                self.git.checkout_known(target.source(), &sha, known).await
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
                            .and_then(|s| s.last_applied_sha.clone())
                            .unwrap_or(tip);
                        self.git.checkout(target.source(), &sha).await
                    }
                    Err(e) => Err(e),
                }
            }
        };
        let synced = synced.map_err(|e| e.to_string())?;
        self.note_checkout(target)?;
        Ok(synced)
    }

    /// The backend's context made whole: the target's inputs, what a
    /// reviewed plan is made from, and its SOPS files decrypted for the
    /// backend alone (encrypted again after it, whatever it did), every
    /// value masked. `Err` is the run's status.
    async fn prepare(
        &self,
        target: &Target,
        run: &mut RunInfo,
        synced: &Synced,
        mut ctx: Context,
        inputs: depends::Inputs,
        op: Operation,
    ) -> Result<Result<(Context, Option<decrypt::Opened>), Status>, TickError> {
        let reviews = op == Operation::Apply && self.reviews(target);
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
                policies: self.policies_digest(target),
            });
        }
        let values = inputs.values.clone();
        with_inputs(&mut ctx, inputs);
        if reviews || self.guarded(target) {
            run.shown_inputs = values
                .into_iter()
                .map(|(k, v)| (k, ctx.redactor.redact(&v)))
                .collect();
        }
        let Some(sops) = &target.decrypt else {
            return Ok(Ok((ctx, None)));
        };
        let note = self.app.settings().decrypted_note(&target.name);
        match decrypt::open(&synced.workdir, &note, sops).await {
            Ok(o) => {
                for v in &o.secrets {
                    ctx.redactor.add(v.clone());
                }
                if let (Some(m), Some(key)) = (run.made_from.as_mut(), &key) {
                    // Keyed: a digest of secrets is not kept bare.
                    m.decrypted = Some(identity::keyed(key, &o.secrets));
                }
                Ok(Ok((ctx, Some(o))))
            }
            Err(e) => Ok(Err(Status::failed(ctx.redactor.redact(&e.to_string())))),
        }
    }

    /// The tag now applied, noted: a lower one later is refused.
    fn note_followed_tag(&self, target: &Target, t: &TagTip) {
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

    /// Whether the tag a target follows may be applied: not below the tag
    /// applied last (a deleted or lowered tag), and signed by a listed key
    /// when the target verifies. `Err` says why not.
    pub(super) async fn tag_may_apply(&self, target: &Target, t: &TagTip) -> Result<(), String> {
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

    /// A run begun unsynced (`Store::begin_run_unsynced`) put on disk
    /// before its backend does anything: a power cut then leaves the run
    /// on record (interrupted), never an apply without one.
    async fn start_on_disk(&self, run: &RunInfo) -> Result<(), TickError> {
        if !run.start_synced {
            self.app.store.sync_log("recording a run").await?;
        }
        Ok(())
    }

    /// The backend's part of a tick: review, detect, or apply/destroy, then
    /// the run recorded.
    pub(super) async fn run_backend(
        &self,
        target: &Target,
        run: &RunInfo,
        synced: &Synced,
        ctx: Context,
        op: Operation,
        retry: bool,
    ) -> Result<Ticked, TickError> {
        let plain = op == Operation::Apply
            && !run.recheck_only
            && !self.reviews(target)
            && target.tick_policy() != Policy::Detect;
        if !plain {
            self.start_on_disk(run).await?;
        }
        if run.recheck_only {
            return self.recheck_only(target, run, synced, ctx).await;
        }
        if op == Operation::Apply && self.reviews(target) {
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
        let b = match backend::build(&target.backend, ctx) {
            Err(e) => {
                return self
                    .finish(
                        target,
                        run,
                        Some(synced.sha.as_str()),
                        Status::failed(e.to_string()),
                    )
                    .await;
            }
            Ok(b) => b,
        };
        // Only a backend that answers at once that nothing changed runs
        // with its start not on disk: its end, synced, records it. A target
        // with health checks syncs first whatever its backend says: its
        // checks may run, and confirm a change to its host.
        if target.health.is_some() || run.resumed_health.is_some() || b.unchanged().is_none() {
            self.start_on_disk(run).await?;
        }
        // Nomad's jobs keep their own plans: under a policy its plan is
        // judged first, and only what passes is registered.
        let mut findings = String::new();
        if op == Operation::Apply && target.backend.reviews_units() && self.guarded(target) {
            match self.gate_units(target, run, &synced.sha, b.as_ref()).await {
                Ok(f) => findings = f,
                Err(status) => return self.finish(target, run, None, status).await,
            }
        }
        let status = applied(target, run, op, b.as_ref()).await;
        let status = match findings.is_empty() {
            true => status,
            false => Status {
                message: format!("{}; {findings}", status.message),
                ..status
            },
        };
        // Outputs others take: recorded with the run that left them.
        // Applied but unreadable fails the run (it runs again).
        let status = match status.result {
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
        };
        let gated = self
            .gate(target, run, synced.sha.as_str(), status, b.as_ref())
            .await?;
        let sha = Some(synced.sha.as_str());
        let findings = Findings {
            quarantine: gated.quarantine,
            ..Findings::default()
        };
        self.finish_with(target, run, sha, sha, gated.status, findings)
            .await
    }

    /// Outside its change window: the target's health checked at the
    /// commit it has, its backend not applying anything.
    async fn recheck_only(
        &self,
        target: &Target,
        run: &RunInfo,
        synced: &Synced,
        ctx: Context,
    ) -> Result<Ticked, TickError> {
        let sha = Some(synced.sha.as_str());
        let b = match backend::build(&target.backend, ctx) {
            Err(e) => {
                return self
                    .finish(target, run, sha, Status::failed(e.to_string()))
                    .await;
            }
            Ok(b) => b,
        };
        let status = Status {
            result: ApplyResult::NoChange,
            message: "its health checks passed".into(),
            output_tail: String::new(),
            digest: None,
        };
        let gated = self
            .gate(target, run, synced.sha.as_str(), status, b.as_ref())
            .await?;
        let findings = Findings {
            quarantine: gated.quarantine,
            ..Findings::default()
        };
        self.finish_with(target, run, sha, sha, gated.status, findings)
            .await
    }

    /// What the backend is bound to for one operation on `synced`.
    pub(super) fn context(
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
            confirm_within: None,
        }
    }
}

/// Hand `inputs` to the backend (its secrets to the redactor), and make
/// them as recorded (a sensitive one's keyed digest, never its value) part
/// of the digest that decides "no change": a changed input is a change.
pub(super) fn with_inputs(ctx: &mut Context, inputs: depends::Inputs) {
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

/// What the backend's apply or destroy did, bounded by the target's
/// timeout; for a run that resumes the health checks of an interrupted
/// one, that run's apply, without applying again.
async fn applied(
    target: &Target,
    run: &RunInfo,
    op: Operation,
    b: &dyn backend::Backend,
) -> Status {
    if run.resumed_health.is_some() {
        return Status {
            result: ApplyResult::Changed,
            message: format!(
                "applied by run {}, whose health checks driftless was stopped during; resumed",
                run.prev
                    .as_ref()
                    .and_then(|s| s.health_run)
                    .unwrap_or_default()
            ),
            output_tail: String::new(),
            digest: None,
        };
    }
    let fut = match op {
        Operation::Apply => b.apply(),
        Operation::Destroy => b.destroy(),
    };
    match tokio::time::timeout(target.timeout + BACKSTOP, fut).await {
        Ok(s) if s.result == ApplyResult::Failed => Status {
            message: format!("{}{}", s.message, target.sparse_hint()),
            ..s
        },
        Ok(s) => s,
        Err(_) => Status::failed(format!(
            "the backend did not return within the target's timeout ({})",
            humantime::format_duration(target.timeout)
        )),
    }
}
