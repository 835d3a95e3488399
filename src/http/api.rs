//! The JSON API under `/api/v1`: bearer tokens with scopes, targets and their
//! runs, jobs, manual reconcile (optionally waiting for the result), pause
//! and resume. Errors are `{"error": "..."}`. A reconcile only queues a job;
//! `?wait=` watches that job in the database, it never runs anything here.

use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use tracing::info;

use super::{AppState, error};
use crate::auth::{self, AuthError, Verb};
use crate::config::Token;
use crate::queue::{Request, Trigger};
use crate::status;

/// The longest a reconcile may be asked to wait.
const MAX_WAIT: Duration = Duration::from_secs(3600);
const WAIT_POLL: Duration = Duration::from_millis(100);

/// The `Authorization` header's value, if it is text.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

/// An API error: a status and the message for `{"error": ...}`.
pub(super) struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error(self.0, self.1)
    }
}

fn check<'a>(
    s: &'a AppState,
    headers: &HeaderMap,
    verb: Verb,
    target: &str,
) -> Result<&'a Token, ApiError> {
    let h = bearer(headers);
    auth::authorize(&s.app.settings.tokens, h, verb, target).map_err(|e| match e {
        AuthError::Unauthorized => ApiError(StatusCode::UNAUTHORIZED, e.to_string()),
        AuthError::Forbidden { .. } => ApiError(StatusCode::FORBIDDEN, e.to_string()),
    })
}

/// The token the request presents, or 401.
fn authenticated<'a>(s: &'a AppState, headers: &HeaderMap) -> Result<&'a Token, ApiError> {
    auth::authenticate(&s.app.settings.tokens, bearer(headers))
        .map_err(|e| ApiError(StatusCode::UNAUTHORIZED, e.to_string()))
}

/// Deployment `id`, after authenticating (401 before saying whether it
/// exists; 404 if it does not).
async fn deployment_for(
    s: &AppState,
    headers: &HeaderMap,
    id: i64,
) -> Result<crate::store::nomad::Deployment, ApiError> {
    authenticated(s, headers)?;
    match s.app.store.nomad_deployment(id).await {
        Ok(Some(d)) => Ok(d),
        Ok(None) => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no deployment {id}"),
        )),
        Err(e) => Err(internal(e)),
    }
}

fn known(s: &AppState, name: &str) -> Result<(), ApiError> {
    match s.app.settings.target(name) {
        Some(_) => Ok(()),
        None => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no target named `{name}`"),
        )),
    }
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}

/// `GET /api/v1/targets`: the targets this token may read.
pub(super) async fn list_targets(State(s): State<AppState>, headers: HeaderMap) -> Response {
    let token = match authenticated(&s, &headers) {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    match status::targets(&s.app).await {
        Ok(all) => {
            let visible: Vec<_> = all
                .into_iter()
                .filter(|t| auth::allows(token, Verb::Read, &t.name))
                .collect();
            axum::Json(visible).into_response()
        }
        Err(e) => internal(e).into_response(),
    }
}

/// `GET /api/v1/targets/{name}`
pub(super) async fn get_target(
    State(s): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = check(&s, &headers, Verb::Read, &name) {
        return r.into_response();
    }
    match status::target(&s.app, &name).await {
        Ok(Some(t)) => axum::Json(t).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no target named `{name}`")),
        Err(e) => internal(e).into_response(),
    }
}

#[derive(Deserialize)]
pub(super) struct RunsQuery {
    limit: Option<i64>,
}

/// `GET /api/v1/targets/{name}/runs?limit=N`
pub(super) async fn runs(
    State(s): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<RunsQuery>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = check(&s, &headers, Verb::Read, &name).and_then(|_| known(&s, &name)) {
        return r.into_response();
    }
    match s
        .app
        .store
        .history(&name, q.limit.unwrap_or(20).clamp(1, 1000))
        .await
    {
        Ok(runs) => {
            axum::Json(runs.iter().map(status::run_json).collect::<Vec<_>>()).into_response()
        }
        Err(e) => internal(e).into_response(),
    }
}

async fn job_json(s: &AppState, id: i64) -> Result<Option<serde_json::Value>, ApiError> {
    let Some(job) = s.app.queue.job(id).await.map_err(internal)? else {
        return Ok(None);
    };
    let run = match job.run_id {
        Some(r) => s
            .app
            .store
            .run(r)
            .await
            .map_err(internal)?
            .map(|r| status::run_json(&r)),
        None => None,
    };
    Ok(Some(json!({
        "id": job.id,
        "target": job.target,
        "state": job.state,
        "triggers": job.trigger_list(),
        "requested_sha": job.requested_sha,
        "delivery_ids": job.delivery_list(),
        "receiver": job.receiver,
        "attempts": job.attempts,
        "outcome": job.outcome,
        "merged_into": job.merged_into(),
        "run": run,
    })))
}

/// `GET /api/v1/runs/{id}`
pub(super) async fn run(
    State(s): State<AppState>,
    Path(id): Path<i64>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = authenticated(&s, &headers) {
        return r.into_response();
    }
    let run = match s.app.store.run(id).await {
        Ok(Some(r)) => r,
        Ok(None) => return error(StatusCode::NOT_FOUND, format!("no run {id}")),
        Err(e) => return internal(e).into_response(),
    };
    if let Err(r) = check(&s, &headers, Verb::Read, &run.target) {
        return r.into_response();
    }
    axum::Json(status::run_json(&run)).into_response()
}

/// `GET /api/v1/jobs/{id}`
pub(super) async fn job(
    State(s): State<AppState>,
    Path(id): Path<i64>,
    headers: HeaderMap,
) -> Response {
    // Authenticate before saying whether the job exists.
    if let Err(r) = authenticated(&s, &headers) {
        return r.into_response();
    }
    let target = match s.app.queue.job(id).await {
        Ok(Some(j)) => j.target,
        Ok(None) => return error(StatusCode::NOT_FOUND, format!("no job {id}")),
        Err(e) => return internal(e).into_response(),
    };
    if let Err(r) = check(&s, &headers, Verb::Read, &target) {
        return r.into_response();
    }
    match job_json(&s, id).await {
        Ok(Some(j)) => axum::Json(j).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no job {id}")),
        Err(r) => r.into_response(),
    }
}

#[derive(Deserialize)]
pub(super) struct ReconcileQuery {
    wait: Option<String>,
}

/// `POST /api/v1/targets/{name}/reconcile[?wait=60s]`
pub(super) async fn reconcile(
    State(s): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<ReconcileQuery>,
    headers: HeaderMap,
) -> Response {
    let token = match check(&s, &headers, Verb::Reconcile, &name) {
        Ok(t) => t.name.clone(),
        Err(r) => return r.into_response(),
    };
    if let Err(r) = known(&s, &name) {
        return r.into_response();
    }
    let wait = match q
        .wait
        .as_deref()
        .map(|w| humantime::parse_duration(w.trim()))
    {
        None => None,
        Some(Ok(d)) if d <= MAX_WAIT => Some(d),
        Some(Ok(_)) => return error(StatusCode::BAD_REQUEST, "`wait` may be at most 1h"),
        Some(Err(e)) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("`wait` must be a duration such as 60s or 5m ({e})"),
            );
        }
    };
    match s.app.store.target_state(&name).await {
        Ok(Some(st)) if st.paused_at.is_some() => {
            return error(
                StatusCode::CONFLICT,
                format!(
                    "target `{name}` is paused (by {}); resume it first",
                    st.paused_by.as_deref().unwrap_or("?")
                ),
            );
        }
        Ok(_) => {}
        Err(e) => return internal(e).into_response(),
    }
    let job = match s
        .app
        .queue
        .enqueue(&Request {
            target: name.clone(),
            trigger: Trigger::Manual,
            sha: None,
            delivery_id: None,
            receiver: None,
        })
        .await
    {
        Ok(j) => j,
        Err(e) => return internal(e).into_response(),
    };
    info!(target = %name, job, token = %token, "manual reconcile queued");
    s.wake.notify_waiters();
    let Some(wait) = wait else {
        return (StatusCode::ACCEPTED, axum::Json(json!({ "job": job }))).into_response();
    };
    // Watch the job (following it if it is folded into another) until done.
    let deadline = Instant::now() + wait;
    let mut id = job;
    loop {
        let state = match s.app.queue.job(id).await {
            Ok(Some(j)) => j,
            Ok(None) => return error(StatusCode::NOT_FOUND, format!("job {id} disappeared")),
            Err(e) => return internal(e).into_response(),
        };
        if let Some(next) = state.merged_into() {
            id = next;
            continue;
        }
        if state.state == "done" {
            return match job_json(&s, id).await {
                Ok(Some(j)) => (StatusCode::OK, axum::Json(j)).into_response(),
                Ok(None) => error(StatusCode::NOT_FOUND, format!("no job {id}")),
                Err(r) => r.into_response(),
            };
        }
        if Instant::now() >= deadline {
            return (
                StatusCode::ACCEPTED,
                axum::Json(json!({ "job": id, "state": state.state, "waited": humantime::format_duration(wait).to_string() })),
            )
                .into_response();
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

/// Pause or resume a target, or one Nomad job of it (`job`).
async fn set_paused(
    s: AppState,
    name: String,
    job: Option<String>,
    headers: HeaderMap,
    pause: bool,
) -> Response {
    let token = match check(&s, &headers, Verb::Pause, &name) {
        Ok(t) => t.name.clone(),
        Err(r) => return r.into_response(),
    };
    if let Err(r) = known(&s, &name) {
        return r.into_response();
    }
    let by = format!("token:{token}");
    let by = pause.then_some(by.as_str());
    let changed = match &job {
        None => match s.app.store.set_paused(&name, by).await {
            // Resumed: apply what the branch got meanwhile.
            Ok(true) if !pause => s.app.queue.resumed(&name).await.map(|_| true),
            other => other,
        },
        Some(j) => s.app.store.set_job_paused(&name, j, by).await,
    };
    match changed {
        Ok(changed) => {
            info!(target = %name, job = ?job, token = %token, paused = pause, changed, "pause state set");
            let mut body = json!({ "target": name, "paused": pause, "changed": changed });
            if let Some(j) = job {
                body["job"] = json!(j);
            }
            axum::Json(body).into_response()
        }
        Err(e) => internal(e).into_response(),
    }
}

/// `POST /api/v1/targets/{name}/pause`
pub(super) async fn pause(
    State(s): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    set_paused(s, name, None, headers, true).await
}

/// `POST /api/v1/targets/{name}/resume`
pub(super) async fn resume(
    State(s): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let r = set_paused(s.clone(), name, None, headers, false).await;
    // Jobs held while paused may run now.
    s.wake.notify_waiters();
    r
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
    Query(q): Query<DeploymentsQuery>,
    headers: HeaderMap,
) -> Response {
    let token = match authenticated(&s, &headers) {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    let all = match s
        .app
        .store
        .nomad_deployments(false, q.limit.unwrap_or(200).clamp(1, 1000))
        .await
    {
        Ok(d) => d,
        Err(e) => return internal(e).into_response(),
    };
    let list: Vec<serde_json::Value> = all
        .iter()
        .filter(|d| q.state.as_deref().is_none_or(|st| d.state == st))
        .filter(|d| auth::allows(token, Verb::Read, &d.target))
        .map(crate::store::nomad::deployment_json)
        .collect();
    axum::Json(list).into_response()
}

/// `GET /api/v1/deployments/{id}` (the diff included, redacted).
pub(super) async fn deployment(
    State(s): State<AppState>,
    Path(id): Path<i64>,
    headers: HeaderMap,
) -> Response {
    let d = match deployment_for(&s, &headers, id).await {
        Ok(d) => d,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check(&s, &headers, Verb::Read, &d.target) {
        return r.into_response();
    }
    axum::Json(crate::store::nomad::deployment_json(&d)).into_response()
}

async fn decide(
    s: AppState,
    id: i64,
    headers: HeaderMap,
    body: axum::body::Bytes,
    approve: bool,
) -> Response {
    let d = match deployment_for(&s, &headers, id).await {
        Ok(d) => d,
        Err(r) => return r.into_response(),
    };
    let token = match check(&s, &headers, Verb::Approve, &d.target) {
        Ok(t) => t.name.clone(),
        Err(r) => return r.into_response(),
    };
    let actor = format!("token:{token}");
    let result = if approve {
        let hash = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["spec_hash"].as_str().map(str::to_string));
        let Some(hash) = hash else {
            return error(
                StatusCode::BAD_REQUEST,
                "the body must be JSON with the `spec_hash` of the deployment you looked at",
            );
        };
        s.app.store.approve_nomad(id, &hash, &actor).await
    } else {
        s.app.store.reject_nomad(id, &actor).await
    };
    use crate::store::nomad::DecisionError;
    match result {
        Ok(d) => {
            info!(deployment = id, target = %d.target, job = %d.key.job, token = %token, approved = approve, "deployment decided");
            if approve {
                // The register happens in a tick, never here.
                if let Err(e) = s
                    .app
                    .queue
                    .enqueue(&Request {
                        target: d.target.clone(),
                        trigger: Trigger::Manual,
                        sha: None,
                        delivery_id: None,
                        receiver: None,
                    })
                    .await
                {
                    return internal(e).into_response();
                }
                s.wake.notify_waiters();
            }
            axum::Json(crate::store::nomad::deployment_json(&d)).into_response()
        }
        Err(DecisionError::NotFound(_)) => {
            error(StatusCode::NOT_FOUND, format!("no deployment {id}"))
        }
        Err(DecisionError::Conflict(why)) => error(StatusCode::CONFLICT, why),
        Err(DecisionError::Store(e)) => internal(e).into_response(),
    }
}

/// `POST /api/v1/deployments/{id}/approve` with `{"spec_hash": "..."}`
/// (scope `approve:<target>`).
pub(super) async fn approve(
    State(s): State<AppState>,
    Path(id): Path<i64>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    decide(s, id, headers, body, true).await
}

/// `POST /api/v1/deployments/{id}/reject` (scope `approve:<target>`).
pub(super) async fn reject(
    State(s): State<AppState>,
    Path(id): Path<i64>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    decide(s, id, headers, body, false).await
}

/// `POST /api/v1/targets/{name}/jobs/{job}/pause` (scope `pause:<target>`).
pub(super) async fn pause_job(
    State(s): State<AppState>,
    Path((name, job)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    set_paused(s, name, Some(job), headers, true).await
}

/// `POST /api/v1/targets/{name}/jobs/{job}/resume`
pub(super) async fn resume_job(
    State(s): State<AppState>,
    Path((name, job)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    set_paused(s, name, Some(job), headers, false).await
}
