//! The pre and post hooks around a register: parameterized batch jobs
//! dispatched once per deployment (an idempotency token from its nonce),
//! waited for, and their outcome read. Never registers the job itself.

use super::*;

impl Nomad {
    /// The hooks `p` names must be parameterized jobs of this target's path,
    /// reconciled this tick, whose dispatch driftless can make: Nomad
    /// refuses meta keys the job does not declare, requires the ones in
    /// `meta_required`, and a payload when `payload = "required"`
    /// (nomad/job_endpoint.go, `validateDispatchRequest`); driftless sends
    /// none. Checked before anything is registered.
    pub(super) fn check_hooks(&self, p: &Parsed, hooks: &HookJobs) -> Result<(), String> {
        for (phase, hook) in [("pre", &p.pre_hook), ("post", &p.post_hook)] {
            let Some(hook) = hook else { continue };
            let Some(h) = hooks.get(hook) else {
                return Err(format!(
                    "{phase} hook `{hook}` is not a parameterized job in this target's path (files matching `{}`); a named hook is never skipped",
                    self.cfg.jobs
                ));
            };
            if !h.ok {
                return Err(format!(
                    "{phase} hook job `{hook}` could not be registered this tick (see its own line)"
                ));
            }
            if let Some(k) = h
                .meta_required
                .iter()
                .find(|k| !DISPATCH_META.contains(&k.as_str()))
            {
                return Err(format!(
                    "{phase} hook `{hook}` requires the dispatch meta key `{k}` (its parameterized block's meta_required), which driftless cannot fill: it can send {}",
                    DISPATCH_META.join(", ")
                ));
            }
            // validateDispatchRequest: "Payload is not provided but required
            // by parameterized job".
            if h.payload_required {
                return Err(format!(
                    "{phase} hook `{hook}` requires a dispatch payload (its parameterized block's payload = \"required\"), which driftless does not send: make it \"optional\" or \"forbidden\""
                ));
            }
        }
        Ok(())
    }

    /// Run the post hook of a registered, deployed job (state `post_hook`
    /// is on disk): `applied`, or `failed` (the run fails and notifies).
    pub(super) async fn finish_post_hook(
        &self,
        p: &Parsed,
        d: &Deployment,
        hook: &str,
        hooks: &HookJobs,
    ) -> Result<JobReport, JobReport> {
        let run = HookRun {
            id: d.id,
            nonce: d.hook_nonce.as_deref(),
            child: d.post_hook_child.as_deref(),
            state: "post_hook",
        };
        match self
            .run_hook(p, &run, hook, "post", hook_timeout(d), hooks)
            .await
        {
            Ok(how) => {
                self.set_state(
                    p,
                    d.id,
                    "post_hook",
                    "applied",
                    Some(format!("post hook `{hook}` {how}")),
                )
                .await?;
                Ok(JobReport {
                    result: JobResult::NoChange,
                    line: format!("{}: deployed; post hook `{hook}` {how}", p.key.job),
                })
            }
            Err(why) => Ok(self
                .fail_from(
                    p,
                    d.id,
                    "post_hook",
                    None,
                    format!("post hook failed after the register: {why}"),
                )
                .await?
                .report()),
        }
    }

    /// Dispatch the parameterized job `hook` (reconciled this tick, from
    /// this target's path) for deployment `run.id` and wait for the child
    /// job's final outcome. The idempotency token makes a repeated dispatch
    /// (after a crash) find the instance already running instead of
    /// starting another, as long as Nomad has not garbage-collected it; the
    /// child is recorded as soon as it exists, so a resumed tick waits for
    /// exactly that instance and says so when it is gone.
    /// `Ok` says how it succeeded.
    pub(super) async fn run_hook(
        &self,
        p: &Parsed,
        run: &HookRun<'_>,
        hook: &str,
        phase: &str,
        timeout: Duration,
        hooks: &HookJobs,
    ) -> Result<String, String> {
        let Some(h) = hooks.get(hook) else {
            return Err(format!(
                "hook `{hook}` is not a parameterized job in this target's path (files matching `{}`); a named hook is never skipped",
                self.cfg.jobs
            ));
        };
        if !h.ok {
            return Err(format!(
                "hook job `{hook}` could not be registered this tick (see its own line)"
            ));
        }
        let ns = &h.key.namespace;
        let child = match run.child {
            Some(child) => {
                let found = self
                    .client
                    .call(
                        reqwest::Method::GET,
                        &format!("/v1/job/{}", seg(child)),
                        Some(ns),
                        &[],
                        None,
                        true,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                if found.is_none() {
                    let msg = format!(
                        "hook `{hook}` instance {child}, dispatched before driftless was interrupted, is gone (Nomad garbage-collected it), so whether it succeeded is unknown; it is not dispatched again"
                    );
                    tracing::warn!(target_name = %self.ctx.name, job = %p.key.job, hook, phase, "{msg}");
                    return Err(msg);
                }
                child.to_string()
            }
            None => self.dispatch(p, run, h, hook, phase).await?,
        };
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(200);
        loop {
            let job = self
                .client
                .get(&format!("/v1/job/{}", seg(&child)), ns)
                .await
                .map_err(|e| e.to_string())?;
            let status = job["Status"].as_str().unwrap_or("unknown").to_string();
            if status == "dead" {
                return self.hook_outcome(hook, &child, ns).await;
            }
            if Instant::now() + pause > deadline {
                return Err(format!(
                    "hook `{hook}` ({child}) did not finish within {}; it is {status}",
                    humantime::format_duration(timeout)
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// Dispatch the hook with the meta keys its job declares, and record the
    /// child before waiting for it.
    pub(super) async fn dispatch(
        &self,
        p: &Parsed,
        run: &HookRun<'_>,
        h: &HookJob,
        hook: &str,
        phase: &str,
    ) -> Result<String, String> {
        let token = match run.nonce {
            Some(n) => format!("driftless-{n}-{}-{phase}", run.id),
            None => format!("driftless-{}-{phase}", run.id),
        };
        let values = [
            ("driftless_deployment", run.id.to_string()),
            ("driftless_job", p.key.job.clone()),
            ("driftless_commit", self.commit().to_string()),
            ("driftless_phase", phase.to_string()),
        ];
        let meta: serde_json::Map<String, Value> = values
            .into_iter()
            .filter(|(k, _)| {
                h.meta_required
                    .iter()
                    .chain(&h.meta_optional)
                    .any(|m| m == k)
            })
            .map(|(k, v)| (k.to_string(), Value::String(v)))
            .collect();
        let body = json!({ "Meta": meta, "IdempotencyToken": token });
        let resp = self
            .client
            .call(
                reqwest::Method::POST,
                &format!("/v1/job/{}/dispatch", seg(hook)),
                Some(&h.key.namespace),
                &[("idempotency_token", &token)],
                Some(&body),
                false,
            )
            .await
            .map_err(|e| e.to_string())?
            .unwrap_or(Value::Null);
        let child = resp["DispatchedJobID"]
            .as_str()
            .ok_or_else(|| format!("Nomad's dispatch of `{hook}` returned no DispatchedJobID"))?
            .to_string();
        tracing::info!(target_name = %self.ctx.name, job = %p.key.job, hook, phase, dispatched = %child, "hook dispatched");
        let (pre, post) = if phase == "pre" {
            (Some(child.clone()), None)
        } else {
            (None, Some(child.clone()))
        };
        self.ledger
            .transition(
                run.id,
                run.state,
                run.state,
                Change {
                    message: Some(format!("{phase} hook `{hook}` dispatched: {child}")),
                    pre_hook_child: pre,
                    post_hook_child: post,
                    ..Change::default()
                },
            )
            .await
            .map_err(|e| format!("cannot record the dispatch of {child}: {e}"))?;
        Ok(child)
    }

    /// A dead child job, judged by its final allocations: Nomad reschedules
    /// a failed allocation of a batch job, linking the new one through
    /// `NextAllocation`, so only allocations nothing replaced say how it
    /// ended.
    pub(super) async fn hook_outcome(
        &self,
        hook: &str,
        child: &str,
        ns: &str,
    ) -> Result<String, String> {
        let allocs = self
            .client
            .get(&format!("/v1/job/{}/allocations", seg(child)), ns)
            .await
            .map_err(|e| e.to_string())?;
        let allocs = allocs.as_array().cloned().unwrap_or_default();
        let replaced = |a: &Value| a["NextAllocation"].as_str().is_some_and(|n| !n.is_empty());
        let status = |a: &Value| a["ClientStatus"].as_str().unwrap_or("unknown").to_string();
        let finals: Vec<&Value> = allocs.iter().filter(|a| !replaced(a)).collect();
        let retried = allocs
            .iter()
            .filter(|a| replaced(a) && matches!(status(a).as_str(), "failed" | "lost"))
            .count();
        if finals.is_empty() {
            return Err(format!(
                "hook `{hook}` ({child}) ended without running an allocation"
            ));
        }
        let bad: Vec<String> = finals
            .iter()
            .map(|a| status(a))
            .filter(|s| s != "complete")
            .collect();
        let after = match retried {
            0 => String::new(),
            1 => " after 1 failed allocation Nomad rescheduled".into(),
            n => format!(" after {n} failed allocations Nomad rescheduled"),
        };
        if !bad.is_empty() {
            return Err(format!(
                "hook `{hook}` ({child}) ended without success: {} of its {} final allocations {}{after}",
                bad.len(),
                finals.len(),
                bad.join(", ")
            ));
        }
        Ok(format!("succeeded{after}"))
    }
}

pub(super) fn hook_timeout(d: &Deployment) -> Duration {
    d.hook_timeout_ms
        .map(|ms| Duration::from_millis(ms.max(0) as u64))
        .unwrap_or(DEFAULT_HOOK_TIMEOUT)
}

/// `n` random bytes as hex.
pub(super) fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    // getrandom fails only without an OS entropy source; a time-based
    // value still keeps tokens apart across state databases.
    if getrandom::fill(&mut b).is_err() {
        let t = now_ms().to_le_bytes();
        for (i, x) in b.iter_mut().enumerate() {
            *x = t[i % t.len()] ^ (i as u8);
        }
    }
    hex::encode(b)
}
