//! Following a registered job's Nomad deployment until it settles:
//! canaries waiting for promotion, a person's promotion, success, failure
//! and auto-revert. Reads Nomad; writes only through the ledger and
//! `promote`.

use super::*;

impl Nomad {
    /// How long a deployment may wait for promotion before its owners hear
    /// it is overdue.
    pub(super) fn promotion_wait(&self) -> Duration {
        self.cfg
            .promotion_wait
            .as_deref()
            .and_then(|w| parse_promotion_wait(w).ok())
            .unwrap_or(DEFAULT_PROMOTION_WAIT)
    }

    /// Our Nomad deployment of the registered version is `running`: when
    /// its canaries wait for a manual promotion, the deployment record says
    /// so (`pending_promotion`) and waits for a person; a person's
    /// promotion (`promoting`) is sent to Nomad here, in the tick, never in
    /// the API call. Nomad's own rules (nomad/structs/deployment.go,
    /// `RequiresPromotion` and `HasAutoPromote`): a group with
    /// `DesiredCanaries > 0` and not `Promoted` holds the rollout; when
    /// every such group has `auto_promote`, Nomad promotes it itself once
    /// the canaries are healthy, and nobody is asked. Waiting past
    /// `promotion_wait` tells the owners once; it never fails the
    /// deployment (the progress deadline is Nomad's: the deployment watcher
    /// fails a canary deployment at its deadline only when its canaries are
    /// not healthy, `deploymentWatcher.shouldFail`).
    pub(super) async fn canaries(
        &self,
        p: &Parsed,
        d: &Deployment,
        dep: &Value,
    ) -> Result<Followed, JobReport> {
        let key = &p.key;
        let dep_id = dep["ID"].as_str().unwrap_or("?").to_string();
        let waiting = canary_groups(dep);
        let needs = !waiting.is_empty();
        let auto = needs && waiting.iter().all(|g| g.auto_promote);
        let shown = waiting
            .iter()
            .map(|g| {
                format!(
                    "{}: {} of {} canaries healthy",
                    g.name, g.healthy, g.desired
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let running = |line: String| {
            Ok(Followed::Waiting(JobReport {
                result: JobResult::NoChange,
                line: format!("{}: {line}", key.job),
            }))
        };
        let change = |message: String| Change {
            message: Some(message),
            nomad_deployment_id: Some(dep_id.clone()),
            ..Change::default()
        };
        match d.state.as_str() {
            "applying" if needs && !auto => {
                let msg = format!(
                    "Nomad deployment {dep_id} runs its canaries ({shown}) and requires promotion"
                );
                self.ledger
                    .transition(
                        d.id,
                        "applying",
                        "pending_promotion",
                        change(format!("{msg}; {}", take_back(&dep_id))),
                    )
                    .await
                    .map_err(|e| self.ledger_err(p, e))?;
                running(format!(
                    "{msg}: deployment {} waits for a person (driftless approve {})",
                    d.id, d.id
                ))
            }
            "applying" if auto => running(format!(
                "Nomad deployment {dep_id} running, pending automatic promotion ({shown})"
            )),
            "pending_promotion" | "promoting" if !needs => {
                // Promoted in Nomad (its UI or CLI, or by us before a tick
                // died): the rollout goes on.
                let msg = format!("Nomad deployment {dep_id} was promoted; rolling out the rest");
                self.ledger
                    .transition(d.id, &d.state, "applying", change(msg.clone()))
                    .await
                    .map_err(|e| self.ledger_err(p, e))?;
                running(msg)
            }
            "pending_promotion" => {
                let since = d.waiting_since.unwrap_or(d.created_at);
                let waited = Duration::from_millis((now_ms() - since).max(0) as u64);
                let bound = self.promotion_wait();
                let waited_s = humantime::format_duration(Duration::from_secs(waited.as_secs()));
                if waited > bound && d.overdue_at.is_none() {
                    let msg = format!(
                        "Nomad deployment {dep_id} has waited for promotion for {waited_s}, past \
                         promotion_wait ({}); canaries: {shown}",
                        humantime::format_duration(bound)
                    );
                    self.ledger
                        .transition(
                            d.id,
                            "pending_promotion",
                            "pending_promotion",
                            Change {
                                overdue: true,
                                ..change(format!("{msg}; {}", take_back(&dep_id)))
                            },
                        )
                        .await
                        .map_err(|e| self.ledger_err(p, e))?;
                }
                running(format!(
                    "waiting for promotion for {waited_s}: Nomad deployment {dep_id} ({shown}); \
                     promote it: driftless approve {}",
                    d.id
                ))
            }
            "promoting" => self.promote_now(p, d, &dep_id, &shown).await,
            _ => running(format!("Nomad deployment {dep_id} running")),
        }
    }

    /// A person promoted the deployment: ask Nomad to promote its
    /// canaries. Unreachable: asked again next tick; refused (a token
    /// without the capability, say): it waits for promotion again, saying
    /// why.
    async fn promote_now(
        &self,
        p: &Parsed,
        d: &Deployment,
        dep_id: &str,
        shown: &str,
    ) -> Result<Followed, JobReport> {
        let key = &p.key;
        let change = |message: String| Change {
            message: Some(message),
            nomad_deployment_id: Some(dep_id.to_string()),
            ..Change::default()
        };
        match self.promote(key, dep_id).await {
            Ok(()) => {
                let msg =
                    format!("Nomad deployment {dep_id} promoted ({shown}); rolling out the rest");
                self.ledger
                    .transition(d.id, "promoting", "applying", change(msg.clone()))
                    .await
                    .map_err(|e| self.ledger_err(p, e))?;
                Ok(Followed::Waiting(JobReport {
                    result: JobResult::NoChange,
                    line: format!("{}: {msg}", key.job),
                }))
            }
            Err(e @ NomadError::Unreachable { .. }) => {
                // Asked again next tick.
                Ok(Followed::Waiting(self.job_error(
                    &p.file,
                    Some(&key.job),
                    format!("promoting deployment {}: {e}", d.id),
                )))
            }
            Err(e) => {
                let why = match &e {
                    NomadError::Status { status: 403, .. } => format!(
                        "Nomad refused to promote deployment {dep_id}: driftless's token needs \
                         the `submit-job` or `promote-deployment` capability in namespace `{}` ({e})",
                        key.namespace
                    ),
                    _ => format!("Nomad refused to promote deployment {dep_id}: {e}"),
                };
                let why = self.ctx.redactor.redact(&why);
                self.ledger
                    .transition(
                        d.id,
                        "promoting",
                        "pending_promotion",
                        change(format!("{why}; {}", take_back(dep_id))),
                    )
                    .await
                    .map_err(|e| self.ledger_err(p, e))?;
                Ok(Followed::Waiting(self.job_error(
                    &p.file,
                    Some(&key.job),
                    format!("{why}; deployment {} waits for promotion again", d.id),
                )))
            }
        }
    }

    /// `PUT /v1/deployment/promote/:id` with `All` (api/deployments.go,
    /// `PromoteAll`; command/agent/deployment_endpoint.go,
    /// `deploymentPromote`): Nomad promotes every group's canaries, or
    /// answers why not (500 with "Task group … has 0/1 healthy
    /// allocations", state_store.go `UpdateDeploymentPromotion`; 403
    /// without `submit-job` or `promote-deployment`).
    pub(super) async fn promote(&self, key: &JobKey, dep_id: &str) -> Result<(), NomadError> {
        self.client
            .call(
                reqwest::Method::PUT,
                &format!("/v1/deployment/promote/{}", seg(dep_id)),
                Some(&key.namespace),
                &[],
                Some(&json!({ "DeploymentID": dep_id, "All": true })),
                false,
            )
            .await
            .map(|_| ())
    }

    /// An active deployment past `detected`: finish what it started (its
    /// pre hook, its register), then follow Nomad's deployment of exactly
    /// the version it registered. With `newer` (git now gives another
    /// spec), whatever is still waiting — its hooks, its register, Nomad —
    /// is superseded instead of waited for; one Nomad already finished is
    /// settled first.
    pub(super) async fn follow(
        &self,
        p: &Parsed,
        d: &Deployment,
        live: Option<&Value>,
        hooks: &HookJobs,
        newer: bool,
    ) -> Result<Followed, JobReport> {
        let key = &p.key;
        let rolling = matches!(
            d.state.as_str(),
            "applying" | "pending_promotion" | "promoting"
        );
        if newer && (!rolling || d.registered_index.is_none()) {
            let why = match d.state.as_str() {
                "pre_hook" => {
                    "before its pre hook finished (nothing was registered for it)".to_string()
                }
                "post_hook" => {
                    "while its post hook ran (the instance already dispatched is not waited for)"
                        .to_string()
                }
                _ => "before it was registered".to_string(),
            };
            return self
                .supersede(p, d, format!("{} {why}", self.superseded_by(d)))
                .await;
        }
        if d.state == "post_hook" {
            // A tick died while the post hook ran: wait for the instance it
            // dispatched (recorded), or find it by its idempotency token.
            let Some(hook) = d.post_hook.clone() else {
                return self
                    .fail_from(
                        p,
                        d.id,
                        "post_hook",
                        None,
                        "post_hook state without a post hook".into(),
                    )
                    .await;
            };
            return Ok(Followed::Settled(
                self.finish_post_hook(p, d, &hook, hooks).await?,
            ));
        }
        let mut d = d.clone();
        if d.state == "pre_hook" {
            if let Some(stop) = self.resume_pre_hook(p, &d, live, hooks).await? {
                return Ok(stop);
            }
            d.state = "applying".into();
        }
        let d = &d;
        let Some(registered) = d.registered_index else {
            return self.settle_unregistered(p, d, live, hooks).await;
        };
        let deployments = match self.nomad_deployments(key).await {
            Ok(v) => v,
            Err(e) => {
                return Ok(Followed::Waiting(self.job_error(
                    &p.file,
                    Some(&key.job),
                    e,
                )));
            }
        };
        // Ours is the one for the job version we registered: Nomad's
        // `JobSpecModifyIndex` (its `JobModifyIndex` is the job's
        // ModifyIndex, which moves without a new spec). After an
        // auto-revert, the latest deployment is the revert's, not ours.
        let ours = deployments
            .iter()
            .find(|x| x["JobSpecModifyIndex"].as_i64() == Some(registered));
        if let Some(dep) = ours {
            return self.follow_ours(p, d, dep, registered, newer, hooks).await;
        }
        self.without_deployment(p, d, live, registered, newer, hooks)
            .await
    }

    /// A deployment in `pre_hook`, approved with a pre hook or left by a
    /// tick that died while it ran: the spec is the recorded one; the
    /// live job must not have moved; then the hook is run (or found) and
    /// the deployment moves to `applying`. `Some` when it stops here.
    async fn resume_pre_hook(
        &self,
        p: &Parsed,
        d: &Deployment,
        live: Option<&Value>,
        hooks: &HookJobs,
    ) -> Result<Option<Followed>, JobReport> {
        let key = &p.key;
        // Approved with a pre hook, or a tick died while it ran: the spec
        // is the recorded one (`newer` is false); make sure the live job
        // has not moved, then run (or find) the hook, then register.
        if self.paused(p).await? {
            return Ok(Some(Followed::Waiting(JobReport {
                result: JobResult::NoChange,
                line: format!("{}: paused by a person; deployment {} waits", key.job, d.id),
            })));
        }
        let live_index = live.and_then(|l| l["JobModifyIndex"].as_i64()).unwrap_or(0);
        if live_index != d.job_modify_index {
            return self
                .fail_from(
                    p,
                    d.id,
                    "pre_hook",
                    None,
                    "job modified outside driftless since its plan; the live job stands".into(),
                )
                .await
                .map(Some);
        }
        if let Err(why) = self.check_hooks(p, hooks) {
            return self
                .fail_from(
                    p,
                    d.id,
                    "pre_hook",
                    None,
                    format!("{why}; nothing registered"),
                )
                .await
                .map(Some);
        }
        let Some(hook) = d.pre_hook.clone() else {
            return self
                .fail_from(
                    p,
                    d.id,
                    "pre_hook",
                    None,
                    "pre_hook state without a pre hook".into(),
                )
                .await
                .map(Some);
        };
        let run = HookRun {
            id: d.id,
            nonce: d.hook_nonce.as_deref(),
            child: d.pre_hook_child.as_deref(),
            state: "pre_hook",
        };
        if let Err(why) = self
            .run_hook(p, &run, &hook, "pre", hook_timeout(d), hooks)
            .await
        {
            return self
                .fail_from(
                    p,
                    d.id,
                    "pre_hook",
                    None,
                    format!("pre hook failed; nothing registered: {why}"),
                )
                .await
                .map(Some);
        }
        self.set_state(p, d.id, "pre_hook", "applying", None)
            .await?;
        Ok(None)
    }

    /// Nomad's deployment `dep` of the version this one registered:
    /// successful, failed (at the live index, after an auto-revert the
    /// revert's), superseded by a newer spec, or waiting (its canaries).
    async fn follow_ours(
        &self,
        p: &Parsed,
        d: &Deployment,
        dep: &Value,
        registered: i64,
        newer: bool,
        hooks: &HookJobs,
    ) -> Result<Followed, JobReport> {
        let key = &p.key;
        let status = dep["Status"].as_str().unwrap_or("");
        let why = dep["StatusDescription"].as_str().unwrap_or("");
        let dep_id = dep["ID"].as_str().unwrap_or("?").to_string();
        match status {
            "successful" => Ok(Followed::Settled(
                self.succeed(
                    p,
                    d,
                    format!("Nomad deployment {dep_id} successful"),
                    Some(dep_id),
                    hooks,
                )
                .await?,
            )),
            "failed" | "cancelled" => {
                // The live index now: after an auto-revert it is the
                // revert's, where this spec must not be registered again.
                let at = match self.live(key).await {
                    Ok(l) => l.and_then(|l| l["JobModifyIndex"].as_i64()),
                    Err(_) => None,
                };
                let msg = self.ctx.redactor.redact(&format!(
                    "Nomad deployment {dep_id} {status}: {why}"
                ));
                self.ledger
                    .transition(
                        d.id,
                        &d.state,
                        "failed",
                        Change {
                            message: Some(msg.clone()),
                            nomad_deployment_id: Some(dep_id),
                            failed_at_index: Some(at.unwrap_or(registered)),
                            ..Change::default()
                        },
                    )
                    .await
                    .map_err(|e| self.ledger_err(p, e))?;
                Ok(Followed::Settled(self.job_error(
                    &p.file,
                    Some(&key.job),
                    msg,
                )))
            }
            other if newer => {
                self.supersede(
                    p,
                    d,
                    format!(
                        "{} while Nomad deployment {dep_id} was {other} (Nomad cancels it for the newer version)",
                        self.superseded_by(d)
                    ),
                )
                .await
            }
            "running" => self.canaries(p, d, dep).await,
            other => Ok(Followed::Waiting(JobReport {
                result: JobResult::NoChange,
                line: format!("{}: Nomad deployment {dep_id} {other}", key.job),
            })),
        }
    }

    /// No Nomad deployment for the registered version (yet): the live job
    /// moved (failed), Nomad never starts one for this job (settled), or
    /// its evaluation says why not.
    async fn without_deployment(
        &self,
        p: &Parsed,
        d: &Deployment,
        live: Option<&Value>,
        registered: i64,
        newer: bool,
        hooks: &HookJobs,
    ) -> Result<Followed, JobReport> {
        let key = &p.key;
        // No deployment for our version (yet).
        let live_index = live.and_then(|l| l["JobModifyIndex"].as_i64());
        if live_index != Some(registered) {
            let now = match live_index {
                Some(i) => format!("its JobModifyIndex is {i}, ours was {registered}"),
                None => "it is no longer registered".into(),
            };
            return self
                .fail_from(
                    p,
                    d.id,
                    &d.state,
                    live_index,
                    format!("job modified outside driftless after the register, before Nomad started a deployment for it ({now}); the live job stands"),
                )
                .await;
        }
        if let Some(reason) = live.and_then(no_deployment_reason) {
            let msg = format!("registered; Nomad runs no deployment for it: {reason}");
            return Ok(Followed::Settled(
                self.succeed(p, d, msg, None, hooks).await?,
            ));
        }
        let Some(eval_id) = d.eval_id.as_deref() else {
            let msg =
                "registered; Nomad created no evaluation and no deployment for it".to_string();
            return Ok(Followed::Settled(
                self.succeed(p, d, msg, None, hooks).await?,
            ));
        };
        let eval = match self
            .client
            .call(
                reqwest::Method::GET,
                &format!("/v1/evaluation/{}", seg(eval_id)),
                Some(&key.namespace),
                &[],
                None,
                true,
            )
            .await
        {
            Ok(e) => e,
            Err(e) => {
                return Ok(Followed::Waiting(self.job_error(
                    &p.file,
                    Some(&key.job),
                    e,
                )));
            }
        };
        let Some(eval) = eval else {
            let msg = format!(
                "registered; Nomad started no deployment and no longer has its evaluation {eval_id}"
            );
            return Ok(Followed::Settled(
                self.succeed(p, d, msg, None, hooks).await?,
            ));
        };
        self.after_evaluation(p, d, &eval, eval_id, registered, newer, hooks)
            .await
    }

    /// The registered version's evaluation `eval_id`, read: complete (a
    /// deployment made meanwhile, or nothing to roll out), failed, or still
    /// pending (failed past the target's timeout, superseded by a newer
    /// spec, or waited for).
    #[allow(clippy::too_many_arguments)]
    async fn after_evaluation(
        &self,
        p: &Parsed,
        d: &Deployment,
        eval: &Value,
        eval_id: &str,
        registered: i64,
        newer: bool,
        hooks: &HookJobs,
    ) -> Result<Followed, JobReport> {
        let key = &p.key;
        let status = eval["Status"].as_str().unwrap_or("unknown");
        match status {
            "complete" => {
                // The scheduler submits the plan, with its deployment, before
                // it marks the evaluation complete (scheduler/generic_sched.go,
                // GenericScheduler.Process: `process` submits the plan, then
                // `setStatus(.., EvalStatusComplete, ..)` updates the eval):
                // the deployments read before the evaluation may have missed
                // one made in between. Read after it, they cannot.
                match self.nomad_deployments(key).await {
                    Ok(v) => {
                        if let Some(dep) = v
                            .iter()
                            .find(|x| x["JobSpecModifyIndex"].as_i64() == Some(registered))
                        {
                            let dep_id = dep["ID"].as_str().unwrap_or("?");
                            let status = dep["Status"].as_str().unwrap_or("");
                            return Ok(Followed::Waiting(JobReport {
                                result: JobResult::NoChange,
                                line: format!("{}: Nomad deployment {dep_id} {status}", key.job),
                            }));
                        }
                    }
                    Err(e) => {
                        return Ok(Followed::Waiting(self.job_error(
                            &p.file,
                            Some(&key.job),
                            e,
                        )));
                    }
                }
                let msg = format!(
                    "registered; Nomad's evaluation {eval_id} completed without a deployment (nothing to roll out)"
                );
                Ok(Followed::Settled(
                    self.succeed(p, d, msg, None, hooks).await?,
                ))
            }
            "failed" | "canceled" | "cancelled" => {
                let why = eval["StatusDescription"].as_str().unwrap_or("");
                self.fail_from(
                    p,
                    d.id,
                    &d.state,
                    Some(registered),
                    format!("Nomad's evaluation {eval_id} {status}: {why}"),
                )
                .await
            }
            other => {
                let waited = d
                    .registered_at
                    .map(|at| Duration::from_millis((now_ms() - at).max(0) as u64))
                    .unwrap_or_default();
                if waited > self.ctx.timeout {
                    return self
                        .fail_from(
                            p,
                            d.id,
                            &d.state,
                            Some(registered),
                            format!(
                                "Nomad started no deployment within {} of the register; its evaluation {eval_id} is {other}",
                                humantime::format_duration(self.ctx.timeout)
                            ),
                        )
                        .await;
                }
                if newer {
                    return self
                        .supersede(
                            p,
                            d,
                            format!(
                                "{} while Nomad's evaluation {eval_id} was {other}",
                                self.superseded_by(d)
                            ),
                        )
                        .await;
                }
                Ok(Followed::Waiting(JobReport {
                    result: JobResult::NoChange,
                    line: format!(
                        "{}: registered, waiting for Nomad: evaluation {eval_id} is {other}",
                        key.job
                    ),
                }))
            }
        }
    }
}

/// Why Nomad starts no deployment for a registered job, if it never will
/// (scheduler/reconciler/reconcile_cluster.go, `createDeployment`: only
/// service jobs, only groups with a non-empty update strategy and a count
/// above 0; parameterized and periodic jobs run nothing themselves). System
/// jobs are left to the evaluation: Nomad 1.11 gives them deployments.
pub(super) fn no_deployment_reason(job: &Value) -> Option<String> {
    if !job["ParameterizedJob"].is_null() {
        return Some("a parameterized job runs only when dispatched".into());
    }
    if !job["Periodic"].is_null() {
        return Some("a periodic job runs on its schedule".into());
    }
    let kind = job["Type"].as_str().unwrap_or("service");
    if kind == "batch" || kind == "sysbatch" {
        return Some(format!("Nomad runs no deployments for {kind} jobs"));
    }
    if kind != "service" {
        return None;
    }
    let groups: Vec<&Value> = job["TaskGroups"].as_array().into_iter().flatten().collect();
    let count = |g: &Value| g["Count"].as_i64().unwrap_or(1);
    if groups.iter().all(|g| count(g) == 0) {
        return Some("every group's count is 0".into());
    }
    let updates = |g: &Value| g["Update"]["MaxParallel"].as_i64().unwrap_or(0) > 0;
    if !groups.iter().any(|g| count(g) > 0 && updates(g)) {
        return Some(
            "no group has an update strategy (no `update` block, or max_parallel = 0)".into(),
        );
    }
    None
}

/// A task group of a Nomad deployment whose canaries hold the rollout.
pub(super) struct CanaryGroup {
    name: String,
    desired: i64,
    healthy: i64,
    auto_promote: bool,
}

/// The groups of a running Nomad deployment that wait for promotion
/// (nomad/structs/deployment.go, `RequiresPromotion`: `DesiredCanaries > 0`
/// and not `Promoted`); none when the deployment is not running.
pub(super) fn canary_groups(dep: &Value) -> Vec<CanaryGroup> {
    if dep["Status"] != "running" {
        return Vec::new();
    }
    let mut out: Vec<CanaryGroup> = dep["TaskGroups"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, g)| {
            g["DesiredCanaries"].as_i64().unwrap_or(0) > 0 && g["Promoted"] != Value::Bool(true)
        })
        .map(|(name, g)| CanaryGroup {
            name: name.clone(),
            desired: g["DesiredCanaries"].as_i64().unwrap_or(0),
            // Before promotion every healthy allocation of the deployment
            // is a canary (only canaries are placed).
            healthy: g["HealthyAllocs"].as_i64().unwrap_or(0),
            auto_promote: g["AutoPromote"] == Value::Bool(true),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// What a deployment waiting for promotion says of taking it back, which
/// a person's rejection quotes (`deploy::decide`): driftless does not take
/// canaries back; Nomad does.
fn take_back(dep_id: &str) -> String {
    format!(
        "to take it back, fail the Nomad deployment (`nomad deployment fail {dep_id}`; an \
         `auto_revert` group rolls back) or push a revert"
    )
}
