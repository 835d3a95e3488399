//! The JSON API under `/api/v1`: bearer tokens with scopes, targets and their
//! runs, jobs, manual reconcile (optionally waiting for the result), pause
//! and resume. Every handler takes the [`Caller`] (401 before anything else)
//! and answers `Result<Json<T>, ApiError>` with a typed body; errors are
//! `{"error": "..."}`. A reconcile only queues a job; `?wait=` watches that
//! job in the database, it never runs anything here.

use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tracing::info;

use super::AppState;
use super::caller::{ApiError, Caller};
use crate::auth::Verb;
use crate::model::Trigger;
use crate::queue::{JobStatus, Request};
use crate::status::{self, JobView, RunView, TargetStatus};

/// The longest a reconcile may be asked to wait.
const MAX_WAIT: Duration = Duration::from_secs(3600);
const WAIT_POLL: Duration = Duration::from_millis(100);

type Answer<T> = Result<Json<T>, ApiError>;

/// 404 unless `name` is a configured target.
fn known(s: &AppState, name: &str) -> Result<(), ApiError> {
    match s.app.settings.target(name) {
        Some(_) => Ok(()),
        None => Err(ApiError::not_found(format!("no target named `{name}`"))),
    }
}

/// A manual reconcile of `target`, queued (the register or apply happens
/// in a tick, never here).
fn manual(target: &str) -> Request {
    Request {
        target: target.to_string(),
        trigger: Trigger::Manual,
        sha: None,
        delivery_id: None,
        receiver: None,
    }
}

/// `GET /api/v1/targets`: the targets this token may read.
pub(super) async fn list_targets(
    State(s): State<AppState>,
    caller: Caller,
) -> Answer<Vec<TargetStatus>> {
    let all = status::targets(&s.app)
        .await
        .map_err(ApiError::unavailable)?;
    Ok(Json(
        all.into_iter()
            .filter(|t| caller.may(Verb::Read, &t.name))
            .collect(),
    ))
}

/// `GET /api/v1/targets/{name}`
pub(super) async fn get_target(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Answer<TargetStatus> {
    caller.require(Verb::Read, &name)?;
    match status::target(&s.app, &name).await {
        Ok(Some(t)) => Ok(Json(t)),
        Ok(None) => Err(ApiError::not_found(format!("no target named `{name}`"))),
        Err(e) => Err(ApiError::unavailable(e)),
    }
}

#[derive(Deserialize)]
pub(super) struct RunsQuery {
    limit: Option<i64>,
}

/// `GET /api/v1/targets/{name}/runs?limit=N`
pub(super) async fn runs(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(q): Query<RunsQuery>,
) -> Answer<Vec<RunView>> {
    caller.require(Verb::Read, &name)?;
    known(&s, &name)?;
    let runs = s
        .app
        .store
        .history(&name, q.limit.unwrap_or(20).clamp(1, 1000))
        .await
        .map_err(ApiError::unavailable)?;
    Ok(Json(runs.iter().map(RunView::from).collect()))
}

/// `GET /api/v1/runs/{id}`
pub(super) async fn run(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Answer<RunView> {
    let run = s
        .app
        .store
        .run(id)
        .await
        .map_err(ApiError::unavailable)?
        .ok_or_else(|| ApiError::not_found(format!("no run {id}")))?;
    caller.require(Verb::Read, &run.target)?;
    Ok(Json(RunView::from(&run)))
}

/// Job `id` for a caller who may read its target.
async fn readable_job(s: &AppState, caller: &Caller, id: i64) -> Result<JobView, ApiError> {
    let job = status::job(&s.app, id)
        .await
        .map_err(ApiError::unavailable)?
        .ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    caller.require(Verb::Read, &job.target)?;
    Ok(job)
}

/// `GET /api/v1/jobs/{id}`
pub(super) async fn job(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Answer<JobView> {
    readable_job(&s, &caller, id).await.map(Json)
}

#[derive(Deserialize)]
pub(super) struct ReconcileQuery {
    wait: Option<String>,
}

/// What `POST .../reconcile` answers.
#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum Reconciled {
    /// 202: queued; follow it at `/api/v1/jobs/{job}`.
    Queued { job: i64 },
    /// 200: the job is done (`?wait=` and it finished in time).
    Done(Box<JobView>),
    /// 202: waited `waited` and the job is not done yet.
    StillWaiting {
        job: i64,
        state: JobStatus,
        waited: String,
    },
}

/// `POST /api/v1/targets/{name}/reconcile[?wait=60s]`
pub(super) async fn reconcile(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(q): Query<ReconcileQuery>,
) -> Result<(StatusCode, Json<Reconciled>), ApiError> {
    caller.require(Verb::Reconcile, &name)?;
    known(&s, &name)?;
    let wait = match q
        .wait
        .as_deref()
        .map(|w| humantime::parse_duration(w.trim()))
    {
        None => None,
        Some(Ok(d)) if d <= MAX_WAIT => Some(d),
        Some(Ok(_)) => return Err(ApiError::bad_request("`wait` may be at most 1h")),
        Some(Err(e)) => {
            return Err(ApiError::bad_request(format!(
                "`wait` must be a duration such as 60s or 5m ({e})"
            )));
        }
    };
    let state = s
        .app
        .store
        .target_state(&name)
        .await
        .map_err(ApiError::unavailable)?;
    if let Some(st) = state.filter(|st| st.paused_at.is_some()) {
        return Err(ApiError::conflict(format!(
            "target `{name}` is paused (by {}); resume it first",
            st.paused_by.as_deref().unwrap_or("?")
        )));
    }
    let job = s
        .app
        .queue
        .enqueue(&manual(&name))
        .await
        .map_err(ApiError::unavailable)?;
    info!(target = %name, job, token = %caller.name(), "manual reconcile queued");
    s.wake.notify_waiters();
    let Some(wait) = wait else {
        return Ok((StatusCode::ACCEPTED, Json(Reconciled::Queued { job })));
    };
    // Watch the job (following it if it is folded into another) until done.
    let deadline = Instant::now() + wait;
    let mut id = job;
    loop {
        let state = s
            .app
            .queue
            .job(id)
            .await
            .map_err(ApiError::unavailable)?
            .ok_or_else(|| ApiError::not_found(format!("job {id} disappeared")))?;
        if let Some(next) = state.merged_into() {
            id = next;
            continue;
        }
        if state.state == JobStatus::Done {
            // Its reconciler may see the result without a read scope.
            let done = status::job(&s.app, id)
                .await
                .map_err(ApiError::unavailable)?
                .ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
            return Ok((StatusCode::OK, Json(Reconciled::Done(Box::new(done)))));
        }
        if Instant::now() >= deadline {
            let waited = humantime::format_duration(wait).to_string();
            return Ok((
                StatusCode::ACCEPTED,
                Json(Reconciled::StillWaiting {
                    job: id,
                    state: state.state,
                    waited,
                }),
            ));
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

/// What pause and resume answer.
#[derive(Serialize)]
pub(super) struct Paused {
    target: String,
    /// The Nomad job, when one job of the target was paused or resumed.
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<String>,
    paused: bool,
    /// False when it already was in that state.
    changed: bool,
}

/// Pause or resume a target, or one Nomad job of it (`job`).
async fn set_paused(
    s: &AppState,
    caller: &Caller,
    name: String,
    job: Option<String>,
    pause: bool,
) -> Answer<Paused> {
    caller.require(Verb::Pause, &name)?;
    known(s, &name)?;
    let by = format!("token:{}", caller.name());
    let by = pause.then_some(by.as_str());
    let changed = match &job {
        None => match s.app.store.set_paused(&name, by).await {
            // Resumed: apply what the branch got meanwhile.
            Ok(true) if !pause => s.app.queue.resumed(&name).await.map(|_| true),
            other => other,
        },
        Some(j) => s.app.store.set_job_paused(&name, j, by).await,
    }
    .map_err(ApiError::unavailable)?;
    info!(target = %name, job = ?job, token = %caller.name(), paused = pause, changed, "pause state set");
    if !pause {
        // Jobs held while paused may run now.
        s.wake.notify_waiters();
    }
    Ok(Json(Paused {
        target: name,
        job,
        paused: pause,
        changed,
    }))
}

/// `POST /api/v1/targets/{name}/pause`
pub(super) async fn pause(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Answer<Paused> {
    set_paused(&s, &caller, name, None, true).await
}

/// `POST /api/v1/targets/{name}/resume`
pub(super) async fn resume(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Answer<Paused> {
    set_paused(&s, &caller, name, None, false).await
}

/// `POST /api/v1/targets/{name}/jobs/{job}/pause` (scope `pause:<target>`).
pub(super) async fn pause_job(
    State(s): State<AppState>,
    caller: Caller,
    Path((name, job)): Path<(String, String)>,
) -> Answer<Paused> {
    set_paused(&s, &caller, name, Some(job), true).await
}

/// `POST /api/v1/targets/{name}/jobs/{job}/resume`
pub(super) async fn resume_job(
    State(s): State<AppState>,
    caller: Caller,
    Path((name, job)): Path<(String, String)>,
) -> Answer<Paused> {
    set_paused(&s, &caller, name, Some(job), false).await
}

// ------------------------------------------------------ Nomad deployments

#[derive(Deserialize)]
pub(super) struct DeploymentsQuery {
    state: Option<String>,
    limit: Option<i64>,
}

/// `GET /api/v1/deployments[?state=pending_approval]`: the deployments of
/// targets this token may read, newest first.
pub(super) async fn deployments(
    State(s): State<AppState>,
    caller: Caller,
    Query(q): Query<DeploymentsQuery>,
) -> Answer<Vec<serde_json::Value>> {
    let all = s
        .app
        .store
        .nomad_deployments(false, q.limit.unwrap_or(200).clamp(1, 1000))
        .await
        .map_err(ApiError::unavailable)?;
    Ok(Json(
        all.iter()
            .filter(|d| q.state.as_deref().is_none_or(|st| d.state == st))
            .filter(|d| caller.may(Verb::Read, &d.target))
            .map(crate::store::nomad::deployment_json)
            .collect(),
    ))
}

/// Deployment `id` (404 if there is none; the caller is authenticated
/// before anyone learns whether it exists).
async fn deployment_by_id(
    s: &AppState,
    id: i64,
) -> Result<crate::store::nomad::Deployment, ApiError> {
    s.app
        .store
        .nomad_deployment(id)
        .await
        .map_err(ApiError::unavailable)?
        .ok_or_else(|| ApiError::not_found(format!("no deployment {id}")))
}

/// `GET /api/v1/deployments/{id}` (the diff included, redacted).
pub(super) async fn deployment(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Answer<serde_json::Value> {
    let d = deployment_by_id(&s, id).await?;
    caller.require(Verb::Read, &d.target)?;
    Ok(Json(crate::store::nomad::deployment_json(&d)))
}

#[derive(Deserialize)]
struct Approval {
    spec_hash: String,
}

/// Approve (with the body's `spec_hash`) or reject deployment `id`.
async fn approve_or_reject(
    s: AppState,
    caller: Caller,
    id: i64,
    body: axum::body::Bytes,
    approve: bool,
) -> Answer<serde_json::Value> {
    let d = deployment_by_id(&s, id).await?;
    caller.require(Verb::Approve, &d.target)?;
    let actor = format!("token:{}", caller.name());
    let result = if approve {
        let Ok(Approval { spec_hash }) = serde_json::from_slice::<Approval>(&body) else {
            return Err(ApiError::bad_request(
                "the body must be JSON with the `spec_hash` of the deployment you looked at",
            ));
        };
        s.app.store.approve_nomad(id, &spec_hash, &actor).await
    } else {
        s.app.store.reject_nomad(id, &actor).await
    };
    use crate::store::nomad::DecisionError;
    let d = result.map_err(|e| match e {
        DecisionError::NotFound(_) => ApiError::not_found(format!("no deployment {id}")),
        DecisionError::Conflict(why) => ApiError::conflict(why),
        DecisionError::Store(e) => ApiError::unavailable(e),
    })?;
    info!(deployment = id, target = %d.target, job = %d.key.job, token = %caller.name(), approved = approve, "deployment decided");
    if approve {
        // The register happens in a tick, never here.
        s.app
            .queue
            .enqueue(&manual(&d.target))
            .await
            .map_err(ApiError::unavailable)?;
        s.wake.notify_waiters();
    }
    Ok(Json(crate::store::nomad::deployment_json(&d)))
}

/// `POST /api/v1/deployments/{id}/approve` with `{"spec_hash": "..."}`
/// (scope `approve:<target>`).
pub(super) async fn approve(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    body: axum::body::Bytes,
) -> Answer<serde_json::Value> {
    approve_or_reject(s, caller, id, body, true).await
}

/// `POST /api/v1/deployments/{id}/reject` (scope `approve:<target>`).
pub(super) async fn reject(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    body: axum::body::Bytes,
) -> Answer<serde_json::Value> {
    approve_or_reject(s, caller, id, body, false).await
}
