//! A target's dependencies (`depends_on`) as a tick sees them: whether the
//! targets it depends on have converged (their last run `changed` or
//! `no_change`, no plan of theirs waiting for a person) — if not, the tick
//! records a `blocked` run naming the first that has not, and starts no
//! backend; and, when a target converges again, its dependents that it
//! blocked queued to run; a target's `inputs` read from the outputs
//! recorded for the targets they name (a sensitive one from the producer
//! itself, never from a record), and a producer's outputs kept after its
//! apply. The order a push's jobs are claimed in is the queue's
//! (`target_deps`); this module must not apply or destroy anything.

use std::collections::BTreeMap;

use tracing::{error, info};

use super::{Reconciler, TickError};
use crate::backend::Backend;
use crate::config::Target;
use crate::model::{ApplyResult, Trigger};
use crate::queue::Request;
use crate::store::deployments::PlanState;

/// How much of a dependency's own message a blocked run repeats.
const REASON_MAX: usize = 300;

/// A target's inputs, resolved: name → value, and the values that are
/// secrets (sensitive outputs), for the run's redactor.
#[derive(Debug, Default)]
pub(super) struct Inputs {
    pub values: BTreeMap<String, String>,
    pub secrets: Vec<String>,
    /// Name → the value as recorded (a sensitive one's keyed digest, not
    /// the value): what "no change" is decided by.
    pub recorded: BTreeMap<String, String>,
}

impl Reconciler {
    /// Why `target` may not run now, naming the dependency at fault, or
    /// `None` when every target it depends on has converged.
    pub(super) async fn blocked_by(&self, target: &Target) -> Result<Option<String>, TickError> {
        // A job of a dependency still queued or running goes first, as the
        // queue's claim order has it: a one-shot `tick` (a timer, a person)
        // keeps the order a daemon keeps, on the same state.
        let activity = self.app.queue.activity().await?;
        for dep in &target.depends_on {
            if let Some(a) = activity
                .iter()
                .find(|a| a.target == *dep && (a.queued > 0 || a.running > 0))
            {
                let what = if a.running > 0 { "running" } else { "queued" };
                return Ok(Some(format!(
                    "blocked by `{dep}`: a job of it is {what}, and it converges first"
                )));
            }
        }
        for dep in &target.depends_on {
            let state = self.app.store.target_state(dep).await?;
            let (result, message) = match &state {
                Some(s) => (s.last_result.as_deref(), s.last_message.as_deref()),
                None => (None, None),
            };
            let said = || first_line(message.unwrap_or(""));
            let why = match result {
                None => Some("it has not run yet".to_string()),
                // Its last run tore it down: nothing of it exists until
                // it is applied again.
                Some("changed" | "no_change")
                    if state.as_ref().is_some_and(|s| s.last_applied_sha.is_none())
                        && self.destroyed_last(state.as_ref()).await? =>
                {
                    Some(format!(
                        "it was destroyed (`driftless destroy {dep}`): nothing of it exists until it is applied again"
                    ))
                }
                Some("changed" | "no_change") => match self.app.store.open_plan(dep).await? {
                    Some(p) if p.state == PlanState::PendingApproval => {
                        Some("its plan waits for approval".to_string())
                    }
                    Some(p) if matches!(p.state, PlanState::Approved | PlanState::Applying) => {
                        Some("its approved plan is not applied yet".to_string())
                    }
                    _ => None,
                },
                Some("failed") => Some(format!("its last run failed: {}", said())),
                Some("blocked") => Some(format!("it is blocked itself: {}", said())),
                Some("unhealthy") => Some(format!("it is unhealthy: {}", said())),
                Some("rolled_back" | "held") => {
                    Some(format!("its tip was found unhealthy: {}", said()))
                }
                Some("interrupted") => Some("its last run was interrupted".to_string()),
                Some(other) => Some(format!("its last run ended `{other}`")),
            };
            if let Some(why) = why {
                return Ok(Some(format!("blocked by `{dep}`: {why}")));
            }
        }
        Ok(None)
    }

    /// Whether the last run of the target whose state is `state` was a
    /// destroy.
    async fn destroyed_last(
        &self,
        state: Option<&crate::store::TargetState>,
    ) -> Result<bool, TickError> {
        let Some(id) = state.and_then(|s| s.last_run_id) else {
            return Ok(false);
        };
        Ok(self
            .app
            .store
            .run(id)
            .await?
            .is_some_and(|r| r.operation == "destroy"))
    }

    /// After `target` converged: queue each target that depends on it and
    /// whose last run it (or a target it waits on) blocked. A target that
    /// is still blocked by another dependency records that when it runs.
    pub(super) async fn wake_dependents(&self, target: &Target, result: ApplyResult) {
        if !matches!(result, ApplyResult::Changed | ApplyResult::NoChange) {
            return;
        }
        for dep in self.app.settings().dependents(&target.name) {
            let blocked = match self.app.store.target_state(&dep.name).await {
                Ok(s) => s.is_some_and(|s| {
                    s.last_result.as_deref() == Some(ApplyResult::Blocked.as_str())
                }),
                Err(e) => {
                    error!(target = %dep.name, error = %e,
                        "cannot read whether a dependency blocked this target; its next interval tick will run it");
                    continue;
                }
            };
            if !blocked {
                continue;
            }
            match self.queue_dependent(&dep.name).await {
                Ok(job) => info!(target = %dep.name, job, dependency = %target.name,
                    "queued: a target it depends on converged again"),
                Err(e) => error!(target = %dep.name, error = %e,
                    "cannot queue a target its dependency unblocked; its next interval tick will run it"),
            }
        }
    }

    /// The values of `target`'s inputs, from the outputs recorded for the
    /// targets they name; `Err` names the input and what is missing.
    pub(super) async fn resolve_inputs(
        &self,
        target: &Target,
    ) -> Result<Result<Inputs, String>, TickError> {
        let mut values = BTreeMap::new();
        let mut secrets = Vec::new();
        let mut recorded = BTreeMap::new();
        for i in &target.inputs {
            let Some(outputs) = self.app.store.outputs_of(&i.target).await? else {
                return Ok(Err(format!(
                    "input `{}`: `{}` has no recorded outputs yet (they are recorded when it applies)",
                    i.name, i.target
                )));
            };
            if let Some(v) = outputs.get(&i.output) {
                recorded.insert(i.name.clone(), v.to_string());
            }
            let value = match outputs.get(&i.output) {
                None => {
                    let has: Vec<&str> = outputs.keys().map(String::as_str).collect();
                    return Ok(Err(format!(
                        "input `{}`: `{}` has no output `{}` (its outputs: {})",
                        i.name,
                        i.target,
                        i.output,
                        if has.is_empty() {
                            "none".to_string()
                        } else {
                            has.join(", ")
                        }
                    )));
                }
                // Sensitive: not on record; read from the producer now,
                // and masked wherever the taker's run shows it.
                Some(serde_json::Value::Object(m)) if m.contains_key(SENSITIVE_MARK) => {
                    let read = match self.output_reader(&i.target).await {
                        Ok(b) => b.revealed_outputs().await.map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    let v = match read {
                        Ok((live, _)) => live.get(&i.output).cloned(),
                        Err(e) => {
                            return Ok(Err(format!(
                                "input `{}`: cannot read the sensitive output `{}` of `{}`: {e}",
                                i.name, i.output, i.target
                            )));
                        }
                    };
                    let Some(v) = v else {
                        return Ok(Err(format!(
                            "input `{}`: `{}` has no output `{}` any more",
                            i.name, i.target, i.output
                        )));
                    };
                    let v = match v {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    secrets.push(v.clone());
                    v
                }
                Some(serde_json::Value::String(v)) => v.clone(),
                Some(other) => other.to_string(),
            };
            values.insert(i.name.clone(), value);
        }
        Ok(Ok(Inputs {
            values,
            secrets,
            recorded,
        }))
    }

    /// Queue `name` because a target it depends on converged or changed
    /// its outputs.
    async fn queue_dependent(&self, name: &str) -> Result<i64, crate::store::StoreError> {
        self.app
            .queue
            .enqueue(&Request {
                target: name.to_string(),
                trigger: Trigger::Dependency,
                sha: None,
                delivery_id: None,
                receiver: None,
            })
            .await
    }

    /// Whether some target takes inputs from `target`.
    pub(super) fn consumed(&self, target: &Target) -> bool {
        self.app.settings().consumed(&target.name)
    }

    /// After a successful apply of a target others take inputs from: read
    /// its outputs (after a change, or when none are on record) and
    /// record them with run `run_id`; when they changed,
    /// queue each target that takes them (a changed input is a change).
    /// `Err` says why they could not be read or kept.
    pub(super) async fn keep_outputs(
        &self,
        target: &Target,
        run_id: i64,
        result: ApplyResult,
        backend: &dyn Backend,
    ) -> Result<(), String> {
        // Nothing changed and the outputs are on record: nothing to read
        // (a no-op tick starts no command for them).
        if result == ApplyResult::NoChange
            && self
                .app
                .store
                .outputs_of(&target.name)
                .await
                .map_err(|e| e.to_string())?
                .is_some()
        {
            return Ok(());
        }
        let (mut outputs, sensitive) = backend
            .revealed_outputs()
            .await
            .map_err(|e| e.to_string())?;
        // A sensitive value is not kept: only a keyed digest of it, which
        // says whether it changed. A taker reads the value itself.
        if !sensitive.is_empty() {
            use hmac::{Hmac, Mac};
            let key = self
                .app
                .store
                .key("outputs")
                .await
                .map_err(|e| e.to_string())?;
            for name in &sensitive {
                if let Some(v) = outputs.get_mut(name) {
                    let mut mac =
                        Hmac::<sha2::Sha256>::new_from_slice(&key).map_err(|e| e.to_string())?;
                    mac.update(v.to_string().as_bytes());
                    *v = serde_json::json!({ SENSITIVE_MARK: hex::encode(mac.finalize().into_bytes()) });
                }
            }
        }
        let changed = self
            .app
            .store
            .record_outputs(&target.name, run_id, &outputs)
            .await
            .map_err(|e| e.to_string())?;
        if !changed {
            return Ok(());
        }
        for t in &self.app.settings().targets {
            if !t.inputs.iter().any(|i| i.target == target.name) {
                continue;
            }
            let job = self
                .queue_dependent(&t.name)
                .await
                .map_err(|e| format!("cannot queue `{}`, which takes its outputs: {e}", t.name))?;
            info!(target = %t.name, job, producer = %target.name, "queued: outputs it takes changed");
        }
        Ok(())
    }
}

/// The key of the object recorded in place of a sensitive output's value
/// (its keyed digest).
const SENSITIVE_MARK: &str = "driftless_sensitive_digest";

fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("").trim();
    match line.char_indices().nth(REASON_MAX) {
        Some((i, _)) => format!("{} […]", &line[..i]),
        None => line.to_string(),
    }
}
