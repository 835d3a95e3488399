//! The JSON API under `/api/v1`: bearer tokens with scopes, targets and their
//! runs, jobs, manual reconcile (optionally waiting for the result), pause
//! and resume. Every handler takes the [`Caller`] (401 before anything else)
//! and answers `Result<Json<T>, ApiError>` with a typed body; errors are
//! `{"error": "..."}`. A reconcile only queues a job; `?wait=` watches that
//! job in the database, it never runs anything here.

use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tracing::info;

use super::AppState;
use super::caller::{self, ApiError, ApiPath, ApiQuery, Caller};
use crate::auth::Verb;
use crate::model::Trigger;
use crate::queue::{JobStatus, Request};
use crate::status::{self, JobView, RunView, TargetStatus};
use crate::store::deployments::StoredPlan;

/// The longest a reconcile may be asked to wait.
const MAX_WAIT: Duration = Duration::from_secs(3600);
const WAIT_POLL: Duration = Duration::from_millis(100);

type Answer<T> = Result<Json<T>, ApiError>;

/// 404 unless `name` is a configured target.
fn known(s: &AppState, name: &str) -> Result<(), ApiError> {
    match s.app.settings().target(name) {
        Some(_) => Ok(()),
        None => Err(ApiError::not_found(format!("no target named `{name}`"))),
    }
}

/// A reconcile of `target` asked for by a person, queued (the register or
/// apply happens in a tick, never here).
fn request(target: &str, trigger: Trigger) -> Request {
    Request {
        target: target.to_string(),
        trigger,
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
    ApiPath(name): ApiPath<String>,
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
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<RunsQuery>,
) -> Answer<Vec<RunView>> {
    caller.require(Verb::Read, &name)?;
    known(&s, &name)?;
    let runs = s
        .app
        .store
        .history(&name, caller::limit(q.limit, 20, 1000)?)
        .await
        .map_err(ApiError::unavailable)?;
    Ok(Json(runs.iter().map(RunView::from).collect()))
}

/// Run `id` for a caller who may read its target.
async fn readable_run(
    s: &AppState,
    caller: &Caller,
    id: i64,
) -> Result<crate::store::Run, ApiError> {
    let run = s
        .app
        .store
        .run(id)
        .await
        .map_err(ApiError::unavailable)?
        .ok_or_else(|| ApiError::not_found(format!("no run {id}")))?;
    caller.require(Verb::Read, &run.target)?;
    Ok(run)
}

/// `GET /api/v1/runs/{id}`
pub(super) async fn run(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<i64>,
) -> Answer<RunView> {
    let run = readable_run(&s, &caller, id).await?;
    Ok(Json(RunView::from(&run)))
}

#[derive(Deserialize)]
pub(super) struct OutputQuery {
    after: Option<i64>,
    /// `1`: Server-Sent Events until the run ends (`http::follow`).
    follow: Option<String>,
}

/// A run's kept output (`tick::output`): what came after chunk `after`.
#[derive(Serialize)]
pub(super) struct OutputView {
    run: i64,
    target: String,
    /// The run's result; `null` while it goes.
    result: Option<String>,
    /// The output, redacted, in the order it came.
    output: String,
    /// The last chunk included: ask `?after=` this for what comes next.
    last: i64,
}

/// `GET /api/v1/runs/{id}/output?after=N[&follow=1]`; a follower's
/// `Last-Event-ID` (the last chunk it got) takes the place of `after`.
pub(super) async fn run_output(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<i64>,
    ApiQuery(q): ApiQuery<OutputQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let run = readable_run(&s, &caller, id).await?;
    let follow = flag("follow", q.follow.as_deref())?;
    let after = match last_event_id(&headers)? {
        Some(seen) if follow => seen,
        _ => q.after.unwrap_or(0),
    };
    if follow {
        let closing = s.closing.subscribe();
        return Ok(super::follow::output(
            &s.feeds,
            &s.app.store,
            (run.id, run.target),
            after,
            closing,
        )
        .into_response());
    }
    let chunks = s
        .app
        .store
        .run_output(id, after)
        .await
        .map_err(ApiError::unavailable)?;
    Ok(Json(OutputView {
        run: id,
        target: run.target,
        result: run.result,
        last: chunks.last().map_or(after, |c| c.seq),
        output: chunks.into_iter().map(|c| c.data).collect(),
    })
    .into_response())
}

/// A query parameter that is `1`/`true` or `0`/`false` (or absent).
fn flag(name: &str, value: Option<&str>) -> Result<bool, ApiError> {
    match value.map(str::trim) {
        None | Some("0" | "false") => Ok(false),
        Some("1" | "true") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "query parameter `{name}`: `1` or `0`, not `{other}`"
        ))),
    }
}

/// The `Last-Event-ID` a reconnecting Server-Sent Events reader sends.
pub(super) fn last_event_id(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    let Some(v) = headers.get("last-event-id") else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|v| v.trim().parse::<i64>().ok())
        .filter(|n| *n >= 0)
        .map(Some)
        .ok_or_else(|| {
            ApiError::bad_request(
                "header Last-Event-ID: expected the number of the last output chunk received",
            )
        })
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
    ApiPath(id): ApiPath<i64>,
) -> Answer<JobView> {
    readable_job(&s, &caller, id).await.map(Json)
}

#[derive(Deserialize)]
pub(super) struct ReconcileQuery {
    wait: Option<String>,
    /// `retry` only: `1` accepts the branch tip the newest run refused as
    /// not descending from the commit last applied (needs `approve`).
    accept_rewind: Option<String>,
    /// `reconcile` only: `1` starts it now even outside the target's
    /// change window (needs `override`); its run's trigger says so.
    override_window: Option<String>,
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
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<ReconcileQuery>,
) -> Result<(StatusCode, Json<Reconciled>), ApiError> {
    queue_and_watch(s, caller, name, q, Trigger::Manual).await
}

/// `POST /api/v1/targets/{name}/retry[?wait=60s]`: a reconcile that tries
/// again what failed or was rejected at the branch tip (a plan, a Nomad
/// spec) without a new push. Under an approval policy its new plan waits
/// for approval like any other.
pub(super) async fn retry(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<ReconcileQuery>,
) -> Result<(StatusCode, Json<Reconciled>), ApiError> {
    queue_and_watch(s, caller, name, q, Trigger::Retry).await
}

async fn queue_and_watch(
    s: AppState,
    caller: Caller,
    name: String,
    q: ReconcileQuery,
    trigger: Trigger,
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
    match q.accept_rewind.as_deref().map(str::trim) {
        None | Some("0" | "false") => {}
        Some("1" | "true") if trigger == Trigger::Retry => {
            caller.require(Verb::Approve, &name)?;
            crate::tick::accept_rewind(&s.app, &name, caller.name())
                .await
                .map_err(ApiError::unavailable)?
                .map_err(ApiError::conflict)?;
        }
        Some("1" | "true") => {
            return Err(ApiError::bad_request(
                "query parameter `accept_rewind`: only `retry` accepts a rewind",
            ));
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "query parameter `accept_rewind`: `1` or `0`, not `{other}`"
            )));
        }
    }
    let trigger = match q.override_window.as_deref().map(str::trim) {
        None | Some("0" | "false") => trigger,
        Some("1" | "true") if trigger == Trigger::Manual => {
            caller.require(Verb::Override, &name)?;
            Trigger::Override
        }
        Some("1" | "true") => {
            return Err(ApiError::bad_request(
                "query parameter `override_window`: only `reconcile` overrides a window",
            ));
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "query parameter `override_window`: `1` or `0`, not `{other}`"
            )));
        }
    };
    let job = s
        .app
        .queue
        .enqueue(&request(&name, trigger))
        .await
        .map_err(ApiError::unavailable)?;
    info!(target = %name, job, token = %caller.name(), trigger = trigger.as_str(), "reconcile queued");
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
        Some(j) => s.app.store.set_unit_paused(&name, j, by).await,
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
    ApiPath(name): ApiPath<String>,
) -> Answer<Paused> {
    set_paused(&s, &caller, name, None, true).await
}

/// `POST /api/v1/targets/{name}/resume`
pub(super) async fn resume(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Answer<Paused> {
    set_paused(&s, &caller, name, None, false).await
}

/// `POST /api/v1/targets/{name}/jobs/{job}/pause` (scope `pause:<target>`).
pub(super) async fn pause_job(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((name, job)): ApiPath<(String, String)>,
) -> Answer<Paused> {
    set_paused(&s, &caller, name, Some(job), true).await
}

/// `POST /api/v1/targets/{name}/jobs/{job}/resume`
pub(super) async fn resume_job(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((name, job)): ApiPath<(String, String)>,
) -> Answer<Paused> {
    set_paused(&s, &caller, name, Some(job), false).await
}

// --------------------------------------------------------------- rollouts

/// `GET /api/v1/rollouts`: the rollouts in waves the token may read
/// (`read:<set or group name>`), each once it has started.
pub(super) async fn rollouts(
    State(s): State<AppState>,
    caller: Caller,
) -> Answer<Vec<status::RolloutView>> {
    let all = status::rollouts(&s.app)
        .await
        .map_err(ApiError::unavailable)?;
    Ok(Json(
        all.into_iter()
            .filter_map(|(name, v)| v.filter(|_| caller.may(Verb::Read, &name)))
            .collect(),
    ))
}

/// `GET /api/v1/rollouts/{name}`
pub(super) async fn rollout(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Answer<status::RolloutView> {
    caller.require(Verb::Read, &name)?;
    let all = status::rollouts(&s.app)
        .await
        .map_err(ApiError::unavailable)?;
    match all.into_iter().find(|(n, _)| *n == name) {
        Some((_, Some(v))) => Ok(Json(v)),
        Some((_, None)) => Err(ApiError::not_found(format!(
            "rollout `{name}` has not started yet"
        ))),
        None => Err(ApiError::not_found(format!(
            "no [[target_sets]] or [[groups]] entry named `{name}` has a rollout"
        ))),
    }
}

/// `POST /api/v1/rollouts/{name}/resume` (scope `approve:<name>`): the
/// halted wave is tried again.
pub(super) async fn resume_rollout(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Answer<status::RolloutView> {
    decide_rollout(s, caller, name, true).await
}

/// `POST /api/v1/rollouts/{name}/abort` (scope `approve:<name>`).
pub(super) async fn abort_rollout(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Answer<status::RolloutView> {
    decide_rollout(s, caller, name, false).await
}

async fn decide_rollout(
    s: AppState,
    caller: Caller,
    name: String,
    resume: bool,
) -> Answer<status::RolloutView> {
    caller.require(Verb::Approve, &name)?;
    if s.app.settings().rollout_unit(&name).is_none() {
        return Err(ApiError::not_found(format!(
            "no [[target_sets]] or [[groups]] entry named `{name}` has a rollout"
        )));
    }
    crate::tick::decide_rollout(&s.app, &name, resume, caller.name())
        .await
        .map_err(ApiError::unavailable)?
        .map_err(ApiError::conflict)?;
    info!(rollout = %name, token = %caller.name(), resume, "rollout decided");
    s.wake.notify_waiters();
    rollout(State(s), caller, ApiPath(name)).await
}

// ------------------------------------------------------------ deployments
//
// Every backend's deployments in one list, from one table
// (`store::deployments`): a Nomad deployment is one job's, any other the
// target's plan. `{id}` names one of them.

#[derive(Deserialize)]
pub(super) struct DeploymentsQuery {
    state: Option<String>,
    limit: Option<i64>,
}

/// A deployment as the API shows it: the fields every backend's has
/// (`backend`, `plan_hash`, `summary`, `destructive`, `diff`,
/// `created_at`, ...), and for a Nomad job's its job fields, its diff as
/// Nomad's JSON and `spec_hash` (the name its `plan_hash` had first).
fn plan_json(p: &StoredPlan) -> serde_json::Value {
    let mut v = serde_json::to_value(p).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "created_at".into(),
            crate::store::format_ms(p.created_at).into(),
        );
        o.insert(
            "updated_at".into(),
            crate::store::format_ms(p.updated_at).into(),
        );
        if let Some(at) = p.decided_at {
            o.insert("decided_at".into(), crate::store::format_ms(at).into());
        }
        // A unit's deployment: its backend's machine diff (`plan_diff`
        // in its detail, JSON) is the `diff` the API shows, and its
        // `plan_hash` is also its `spec_hash` (the name it had first).
        if p.unit.is_some() {
            o.insert("spec_hash".into(), p.plan_hash.clone().into());
            if let Some(diff) = o
                .remove("plan_diff")
                .and_then(|d| d.as_str().and_then(|t| serde_json::from_str(t).ok()))
            {
                o.insert("diff".into(), diff);
            }
        }
    }
    v
}

/// `GET /api/v1/deployments[?state=pending_approval]`: the deployments of
/// targets this token may read, every backend's, newest first.
pub(super) async fn deployments(
    State(s): State<AppState>,
    caller: Caller,
    ApiQuery(q): ApiQuery<DeploymentsQuery>,
) -> Answer<Vec<serde_json::Value>> {
    let limit = caller::limit(q.limit, 200, 1000)?;
    let all = s
        .app
        .store
        .plans(q.state.as_deref(), limit)
        .await
        .map_err(ApiError::unavailable)?;
    Ok(Json(
        all.iter()
            .filter(|p| caller.may(Verb::Read, &p.target))
            .map(plan_json)
            .collect(),
    ))
}

/// Deployment `id` (404 if there is none; the caller is authenticated
/// before anyone learns whether it exists).
async fn deployment_by_id(s: &AppState, id: i64) -> Result<StoredPlan, ApiError> {
    s.app
        .store
        .plan_record(id)
        .await
        .map_err(ApiError::unavailable)?
        .ok_or_else(|| ApiError::not_found(format!("no deployment {id}")))
}

/// `GET /api/v1/deployments/{id}` (the diff included, redacted).
pub(super) async fn deployment(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<i64>,
) -> Answer<serde_json::Value> {
    let d = deployment_by_id(&s, id).await?;
    caller.require(Verb::Read, &d.target)?;
    Ok(Json(plan_json(&d)))
}

/// What an approval names: the plan looked at (`spec_hash` is the name
/// Nomad deployments had first; either is accepted for either).
#[derive(Deserialize)]
struct Approval {
    plan_hash: Option<String>,
    spec_hash: Option<String>,
}

/// Approve (for the body's `plan_hash`) or reject deployment `id`.
async fn approve_or_reject(
    s: AppState,
    caller: Caller,
    id: i64,
    body: axum::body::Bytes,
    approve: bool,
) -> Answer<serde_json::Value> {
    let hash = if approve {
        match serde_json::from_slice::<Approval>(&body) {
            Ok(Approval {
                plan_hash: Some(h), ..
            })
            | Ok(Approval {
                plan_hash: None,
                spec_hash: Some(h),
            }) => Some(h),
            _ => {
                return Err(ApiError::bad_request(
                    "the body must be JSON with the `plan_hash` of the deployment you looked at",
                ));
            }
        }
    } else {
        None
    };
    Ok(Json(decide(&s, &caller, id, hash, approve).await?.json))
}

/// A decision recorded: the deployment's target, new state and JSON.
pub(super) struct Decided {
    pub target: String,
    pub state: String,
    pub json: serde_json::Value,
}

/// A person's decision on deployment `id` (the API's and the page's):
/// approve it for exactly the plan `hash` names, or reject it (`hash`
/// `None`). Nothing is applied here: the decision is recorded and the
/// target's tick queued.
pub(super) async fn decide(
    s: &AppState,
    caller: &Caller,
    id: i64,
    hash: Option<String>,
    approve: bool,
) -> Result<Decided, ApiError> {
    let found = deployment_by_id(s, id).await?;
    caller.require(Verb::Approve, &found.target)?;
    let actor = format!("token:{}", caller.name());
    let hash = if approve {
        Some(hash.ok_or_else(|| {
            ApiError::bad_request("an approval names the `plan_hash` of the plan looked at")
        })?)
    } else {
        None
    };
    use crate::store::deployments::DecisionError;
    let decided = s
        .app
        .store
        .decide_plan(id, hash.as_deref(), &actor, approve)
        .await
        .map_err(|e| match e {
            DecisionError::NotFound(_) => ApiError::not_found(format!("no deployment {id}")),
            DecisionError::Conflict(why) => ApiError::conflict(why),
            DecisionError::Store(e) => ApiError::unavailable(e),
        })?;
    info!(deployment = id, target = %decided.target, token = %caller.name(), approved = approve, "deployment decided");
    // The apply (or, for a rejected plan, the removal of its plan file)
    // happens in a tick, never here.
    s.app
        .queue
        .enqueue(&request(&decided.target, Trigger::Manual))
        .await
        .map_err(ApiError::unavailable)?;
    s.wake.notify_waiters();
    Ok(Decided {
        target: decided.target.clone(),
        state: decided.state.as_str().to_string(),
        json: plan_json(&decided),
    })
}

/// `POST /api/v1/deployments/{id}/approve` with `{"plan_hash": "..."}`
/// (scope `approve:<target>`).
pub(super) async fn approve(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<i64>,
    body: axum::body::Bytes,
) -> Answer<serde_json::Value> {
    approve_or_reject(s, caller, id, body, true).await
}

/// `POST /api/v1/deployments/{id}/reject` (scope `approve:<target>`).
pub(super) async fn reject(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<i64>,
    body: axum::body::Bytes,
) -> Answer<serde_json::Value> {
    approve_or_reject(s, caller, id, body, false).await
}
