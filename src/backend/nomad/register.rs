//! One job's reconcile: continue or supersede its active deployment, plan
//! the spec git gives, record it before anything is written, then register
//! it with CAS on the planned index; and settle one that never got a
//! Nomad deployment.

use super::*;

impl Nomad {
    /// Reconcile one job. Errors from the ledger stop the whole apply
    /// (`Err`): the state could not be persisted.
    pub(super) async fn reconcile(
        &self,
        p: &Parsed,
        hooks: &HookJobs,
    ) -> Result<JobReport, JobReport> {
        let key = &p.key;
        let fail = |msg: String| Ok(self.job_error(&p.file, Some(&key.job), msg));

        // An active deployment first: follow it, or let a newer spec
        // supersede it.
        let mut active = self
            .ledger
            .active(key)
            .await
            .map_err(|e| self.ledger_err(p, e))?;
        let mut live = match self.live(key).await {
            Ok(l) => l,
            Err(e) => return fail(e.to_string()),
        };
        let mut spec = Self::with_live_counts(&p.job, live.as_ref());
        let mut hash = spec_hash(&spec);
        // Only this target's deployments are ours to continue: the target's
        // lock says no other tick of it is running, so an `applying` one of
        // ours was left by a tick that died. Another target's may be
        // mid-register right now.
        if let Some(d) = active.as_ref().filter(|d| d.target != self.ctx.name) {
            return fail(format!(
                "not registered: target `{}` has an active deployment ({}, {}) of this job; one job must be managed by one target",
                d.target, d.id, d.state
            ));
        }
        // What happened this tick to a deployment of an older spec, before
        // the current commit is planned.
        let mut earlier = None;
        if let Some(d) = active.clone() {
            match d.state.as_str() {
                "applying" | "pre_hook" | "post_hook" | "pending_promotion" | "promoting" => {
                    let newer = d.spec_hash != hash;
                    match self.follow(p, &d, live.as_ref(), hooks, newer).await? {
                        Followed::Waiting(o) => return Ok(o),
                        Followed::Settled(o) if !newer => return Ok(o),
                        // The older deployment is done with: plan the
                        // current commit in this same tick, against the
                        // live job as it is now (an auto-revert moves it).
                        Followed::Settled(o) | Followed::Superseded(o) => {
                            earlier = Some(o);
                            active = None;
                            live = match self.live(key).await {
                                Ok(l) => l,
                                Err(e) => return fail(e.to_string()),
                            };
                            spec = Self::with_live_counts(&p.job, live.as_ref());
                            hash = spec_hash(&spec);
                        }
                    }
                }
                "detected" | "pending_approval" if d.spec_hash == hash => {
                    // Same spec still waiting (approval), or a tick that died
                    // between recording and registering: handled below after
                    // a fresh plan.
                }
                "detected" | "pending_approval" => {
                    self.ledger
                        .transition(
                            d.id,
                            &d.state,
                            "superseded",
                            Change {
                                message: Some(self.superseded_by(&d)),
                                ..Change::default()
                            },
                        )
                        .await
                        .map_err(|e| self.ledger_err(p, e))?;
                    active = None;
                }
                other => {
                    return fail(format!(
                        "deployment {} is in state `{other}`, which this version of driftless cannot continue",
                        d.id
                    ));
                }
            }
        }
        let o = self
            .plan_and_register(p, hooks, active.as_ref(), &spec, &hash)
            .await?;
        Ok(match earlier {
            Some(e) => JobReport {
                result: e.result.max(o.result),
                line: format!("{}; {}", e.line, o.line),
            },
            None => o,
        })
    }

    /// Plan `spec` (git's job with the live scaled counts); when it differs
    /// and the policy allows, record the deployment, then run the pre hook
    /// and register. `reuse` is an active deployment of this very spec.
    pub(super) async fn plan_and_register(
        &self,
        p: &Parsed,
        hooks: &HookJobs,
        reuse: Option<&Deployment>,
        spec: &Value,
        hash: &str,
    ) -> Result<JobReport, JobReport> {
        let key = &p.key;
        let fail = |msg: String| Ok(self.job_error(&p.file, Some(&key.job), msg));
        let reuse = reuse.filter(|d| d.spec_hash == hash);
        // Plan before every write.
        let plan = match self.plan(key, spec).await {
            Ok(pl) => pl,
            Err(e) => return fail(e.to_string()),
        };
        if plan.kind == "None" {
            if let Some(d) = reuse {
                self.set_state(
                    p,
                    d.id,
                    &d.state,
                    "superseded",
                    Some("the live job already matches git".into()),
                )
                .await?;
            }
            return Ok(JobReport {
                result: JobResult::NoChange,
                line: format!("{}: no change", key.job),
            });
        }
        let diff = redact_diff(&plan.diff, &self.ctx.redactor);
        let summary = diff_summary(&plan.diff);

        if let Some(report) = self.held_back(p, hash, &plan, &summary).await? {
            return Ok(report);
        }
        // Persist before acting.
        let (id, nonce) = match self
            .record_deployment(p, reuse, hash, &plan, &diff, &summary)
            .await?
        {
            Ok(recorded) => recorded,
            Err(report) => return Ok(report),
        };
        let state = if p.policy == Policy::Approval {
            "pending_approval"
        } else {
            "detected"
        };
        // A hook Nomad would refuse to dispatch fails the deployment before
        // anything is registered (or anyone is asked to approve it).
        if let Err(why) = self.check_hooks(p, hooks) {
            return Ok(self
                .fail_from(p, id, state, None, format!("{why}; nothing registered"))
                .await?
                .report());
        }
        if p.policy == Policy::Approval {
            let line = format!(
                "{}: waiting for approval (deployment {id}): {summary}",
                key.job
            );
            return Ok(JobReport {
                result: JobResult::NoChange,
                line,
            });
        }
        // Each state is on disk before the action it leads to.
        if let Some(hook) = &p.pre_hook {
            self.set_state(p, id, "detected", "pre_hook", None).await?;
            let run = HookRun {
                id,
                nonce: nonce.as_deref(),
                child: None,
                state: "pre_hook",
            };
            if let Err(why) = self
                .run_hook(p, &run, hook, "pre", p.hook_timeout, hooks)
                .await
            {
                return Ok(self
                    .fail_from(
                        p,
                        id,
                        "pre_hook",
                        None,
                        format!("pre hook failed; nothing registered: {why}"),
                    )
                    .await?
                    .report());
            }
            self.set_state(p, id, "pre_hook", "applying", None).await?;
        } else {
            self.set_state(p, id, "detected", "applying", None).await?;
        }
        Ok(self
            .apply_registered(p, id, spec, plan, &summary, hooks)
            .await?
            .report())
    }

    /// Why a planned change is not registered this tick, if it is not: the
    /// job is paused by a person, its policy is `none` (drift reported), or
    /// this very spec failed at this live index (no apply loop: after an
    /// auto-revert, the revert's; it waits for a new commit, a change to the
    /// live job or `driftless retry`).
    async fn held_back(
        &self,
        p: &Parsed,
        hash: &str,
        plan: &Plan,
        summary: &str,
    ) -> Result<Option<JobReport>, JobReport> {
        let key = &p.key;
        if self.paused(p).await? {
            let line = format!(
                "{}: paused by a person; drift not registered: {summary}",
                key.job
            );
            return Ok(Some(JobReport {
                result: JobResult::NoChange,
                line,
            }));
        }
        if p.policy == Policy::Detect {
            let line = format!("{}: drift not applied (policy none): {summary}", key.job);
            tracing::warn!(target_name = %self.ctx.name, job = %key.job, "{line}");
            return Ok(Some(JobReport {
                result: JobResult::NoChange,
                line,
            }));
        }

        // No apply loop: a spec that failed at this live index (after an
        // auto-revert, the revert's) waits for a new commit or a change to
        // the live job.
        if let Some(last) = self
            .ledger
            .latest(key)
            .await
            .map_err(|e| self.ledger_err(p, e))?
            && last.state == "failed"
            && last.spec_hash == hash
            && last.failed_at_index.unwrap_or(last.job_modify_index) == plan.index
            && !self.ctx.retry
        {
            return Ok(Some(self.job_error(&p.file, Some(&key.job), format!(
                "not retried: this spec failed at JobModifyIndex {} (deployment {}: {}); push a new commit, change the live job or run `driftless retry {}` to try again",
                plan.index,
                last.id,
                last.message.as_deref().unwrap_or("failed"),
                self.ctx.name
            ))));
        }
        Ok(None)
    }

    /// The deployment recorded before anything is written to Nomad (or
    /// `reuse`, an active one of this very spec): its id and hook nonce.
    /// `Err` when the job already has another active deployment.
    async fn record_deployment(
        &self,
        p: &Parsed,
        reuse: Option<&Deployment>,
        hash: &str,
        plan: &Plan,
        diff: &Value,
        summary: &str,
    ) -> Result<Result<(i64, Option<String>), JobReport>, JobReport> {
        Ok(Ok(match reuse {
            Some(d) => (d.id, d.hook_nonce.clone()),
            None => {
                let nonce = random_hex(8);
                let new = NewDeployment {
                    target: self.ctx.name.clone(),
                    key: p.key.clone(),
                    file: p.file.clone(),
                    commit_sha: self.commit().to_string(),
                    spec_hash: hash.to_string(),
                    policy: p.policy,
                    state: if p.policy == Policy::Approval {
                        "pending_approval"
                    } else {
                        "detected"
                    },
                    job_modify_index: plan.index,
                    diff: diff.to_string(),
                    diff_summary: summary.to_string(),
                    pre_hook: p.pre_hook.clone(),
                    post_hook: p.post_hook.clone(),
                    hook_timeout_ms: Some(p.hook_timeout.as_millis() as i64),
                    hook_nonce: nonce.clone(),
                };
                match self.ledger.insert(&new).await {
                    Ok(id) => (id, Some(nonce)),
                    Err(LedgerError::Conflict(why)) => {
                        return Ok(Err(self.job_error(
                            &p.file,
                            Some(&p.key.job),
                            format!("not registered: {why}"),
                        )));
                    }
                    Err(e) => return Err(self.ledger_err(p, e)),
                }
            }
        }))
    }

    /// Register `spec` with CAS on `plan.index` (state `applying` is on
    /// disk). A CAS conflict is retried once at the new index only when a
    /// fresh plan shows the same diff.
    pub(super) async fn apply_registered(
        &self,
        p: &Parsed,
        id: i64,
        spec: &Value,
        plan: Plan,
        summary: &str,
        hooks: &HookJobs,
    ) -> Result<Followed, JobReport> {
        let key = &p.key;
        let mut index = plan.index;
        let mut spec = spec.clone();
        let mut retried = false;
        loop {
            match self.register(key, &spec, index).await {
                Ok(resp) => {
                    let registered = resp["JobModifyIndex"].as_i64();
                    self.ledger
                        .transition(
                            id,
                            "applying",
                            "applying",
                            Change {
                                registered_index: registered,
                                eval_id: resp["EvalID"]
                                    .as_str()
                                    .filter(|s| !s.is_empty())
                                    .map(str::to_string),
                                job_modify_index: Some(index),
                                message: Some("registered; following Nomad's deployment".into()),
                                ..Change::default()
                            },
                        )
                        .await
                        .map_err(|e| self.ledger_err(p, e))?;
                    let line = format!("{}: registered ({summary})", key.job);
                    // Nomad starts no deployment for some jobs: settle those
                    // at once, saying why.
                    if let Some(reason) = no_deployment_reason(&spec) {
                        let d = self.reload(p, id).await?;
                        let msg = format!("registered; Nomad runs no deployment for it: {reason}");
                        let o = self.succeed(p, &d, msg, None, hooks).await?;
                        return Ok(Followed::Settled(JobReport {
                            result: if o.result == JobResult::Failed {
                                JobResult::Failed
                            } else {
                                JobResult::Changed
                            },
                            line: format!("{line}; {}", o.line),
                        }));
                    }
                    return Ok(Followed::Waiting(JobReport {
                        result: JobResult::Changed,
                        line,
                    }));
                }
                Err(e) if e.is_cas_conflict() && !retried => {
                    retried = true;
                    // The live job moved between the plan and the register.
                    let live = match self.live(key).await {
                        Ok(l) => l,
                        Err(e2) => return self.fail_deployment(p, id, index, e2.to_string()).await,
                    };
                    let fresh_spec = Self::with_live_counts(&p.job, live.as_ref());
                    let fresh = match self.plan(key, &fresh_spec).await {
                        Ok(f) => f,
                        Err(e2) => return self.fail_deployment(p, id, index, e2.to_string()).await,
                    };
                    if fresh.diff == plan.diff {
                        tracing::info!(
                            target_name = %self.ctx.name,
                            job = %key.job,
                            from = index,
                            to = fresh.index,
                            "the live job moved but a fresh plan shows the same diff; registering at the new index"
                        );
                        index = fresh.index;
                        spec = fresh_spec;
                        continue;
                    }
                    return self
                        .fail_deployment(
                            p,
                            id,
                            index,
                            format!("job modified outside driftless (Nomad refused the register: {e}); the manual change stands"),
                        )
                        .await;
                }
                Err(e) if e.is_cas_conflict() => {
                    return self
                        .fail_deployment(
                            p,
                            id,
                            index,
                            format!("job modified outside driftless (Nomad refused the register: {e}); the manual change stands"),
                        )
                        .await;
                }
                Err(e) => return self.fail_deployment(p, id, index, e.to_string()).await,
            }
        }
    }

    /// A registered deployment that Nomad finished (or runs none for):
    /// `applied`, after its post hook if it has one (state `post_hook` is
    /// on disk before the hook is dispatched).
    pub(super) async fn succeed(
        &self,
        p: &Parsed,
        d: &Deployment,
        msg: String,
        nomad_deployment_id: Option<String>,
        hooks: &HookJobs,
    ) -> Result<JobReport, JobReport> {
        let to = if d.post_hook.is_some() {
            "post_hook"
        } else {
            "applied"
        };
        self.ledger
            .transition(
                d.id,
                &d.state,
                to,
                Change {
                    message: Some(msg.clone()),
                    nomad_deployment_id,
                    ..Change::default()
                },
            )
            .await
            .map_err(|e| self.ledger_err(p, e))?;
        match &d.post_hook {
            Some(hook) => {
                let d = Deployment {
                    state: "post_hook".into(),
                    ..d.clone()
                };
                self.finish_post_hook(p, &d, hook, hooks).await
            }
            None => Ok(JobReport {
                result: JobResult::NoChange,
                line: format!("{}: {msg}", p.key.job),
            }),
        }
    }

    /// An `applying` deployment whose register is not known to have
    /// happened: approved by a person and not registered yet, or a tick
    /// died between recording `applying` and the register's answer. CAS
    /// makes this safe to settle: if the live index is still the one we
    /// planned against, the register never happened (re-plan and register
    /// exactly the recorded spec); otherwise, if the live job is ours, it
    /// did.
    pub(super) async fn settle_unregistered(
        &self,
        p: &Parsed,
        d: &Deployment,
        live: Option<&Value>,
        hooks: &HookJobs,
    ) -> Result<Followed, JobReport> {
        let key = &p.key;
        if self.paused(p).await? {
            return Ok(Followed::Waiting(JobReport {
                result: JobResult::NoChange,
                line: format!(
                    "{}: paused by a person; deployment {} waits, not registered",
                    key.job, d.id
                ),
            }));
        }
        let live_index = live.and_then(|l| l["JobModifyIndex"].as_i64()).unwrap_or(0);
        let spec = Self::with_live_counts(&p.job, live);
        if live_index == d.job_modify_index {
            if let Err(why) = self.check_hooks(p, hooks) {
                return self
                    .fail_from(
                        p,
                        d.id,
                        "applying",
                        None,
                        format!("{why}; nothing registered"),
                    )
                    .await;
            }
            let plan = match self.plan(key, &spec).await {
                Ok(pl) => pl,
                Err(e) => {
                    return Ok(Followed::Waiting(self.job_error(
                        &p.file,
                        Some(&key.job),
                        e,
                    )));
                }
            };
            if plan.kind == "None" {
                self.set_state(
                    p,
                    d.id,
                    "applying",
                    "applied",
                    Some("the live job already matches".into()),
                )
                .await?;
                return Ok(Followed::Settled(JobReport {
                    result: JobResult::NoChange,
                    line: format!("{}: no change", key.job),
                }));
            }
            let summary = diff_summary(&plan.diff);
            return self
                .apply_registered(p, d.id, &spec, plan, &summary, hooks)
                .await;
        }
        let plan = match self.plan(key, &spec).await {
            Ok(pl) => pl,
            Err(e) => {
                return Ok(Followed::Waiting(self.job_error(
                    &p.file,
                    Some(&key.job),
                    e,
                )));
            }
        };
        if plan.kind == "None" {
            self.ledger
                .transition(
                    d.id,
                    "applying",
                    "applying",
                    Change {
                        registered_index: Some(live_index),
                        message: Some(
                            "registered (confirmed after a restart); following Nomad's deployment"
                                .into(),
                        ),
                        ..Change::default()
                    },
                )
                .await
                .map_err(|e| self.ledger_err(p, e))?;
            return Ok(Followed::Waiting(JobReport {
                result: JobResult::Changed,
                line: format!("{}: registered (confirmed after a restart)", key.job),
            }));
        }
        self.fail_deployment(
            p,
            d.id,
            live_index,
            "job modified outside driftless since its plan; the live job stands".into(),
        )
        .await
    }
}
