//! `POST /hooks/{receiver}`: verify, route, record, answer.
//!
//! The delivery and the jobs it queues are committed in one transaction
//! before the 2xx goes out; a delivery id seen before queues nothing. A
//! failure to record is a 503, never a 2xx. No git, no backend, no waiting.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Serialize;
use tracing::{error, info, warn};

use super::AppState;
use super::caller::ApiError;
use crate::forge::{self, Event, HookError};
use crate::model::Trigger;
use crate::queue::{Accepted, Request};
use crate::route;

/// What a delivery is answered with.
#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum Delivered {
    /// 200: this delivery id was seen before; nothing was queued.
    Duplicate { duplicate: bool },
    /// 200: the forge's ping.
    Pong { pong: bool },
    /// 202: recorded, with the jobs it queued (none when it was ignored,
    /// and then why).
    Accepted {
        queued: Vec<QueuedJob>,
        #[serde(skip_serializing_if = "Option::is_none")]
        ignored: Option<String>,
        /// Targets among `queued` that are paused: their jobs wait.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        paused: Vec<String>,
    },
}

#[derive(Serialize)]
pub(super) struct QueuedJob {
    target: String,
    job: i64,
}

pub(super) async fn receive(
    State(s): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<Delivered>), ApiError> {
    let Some(key) = s.receivers.get(&name) else {
        return Err(ApiError::not_found(format!("no receiver named `{name}`")));
    };
    let metrics = &s.app.metrics;
    let delivery = match forge::receive(key.forge, &key.secret, &headers, &body) {
        Ok(d) => d,
        Err(HookError::Unauthorized) => {
            metrics.delivery(&name, "unauthorized");
            warn!(receiver = %name, "webhook delivery refused: bad or missing signature");
            return Err(ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized"));
        }
        Err(HookError::BadPayload(why)) => {
            metrics.delivery(&name, "bad_request");
            warn!(receiver = %name, reason = %why, "webhook delivery refused: bad payload");
            return Err(ApiError::bad_request(why));
        }
    };
    let id = delivery.id.as_deref();
    let app = &s.app;

    // What to queue, and what to answer if nothing.
    let mut requests = Vec::new();
    let mut paused = Vec::new();
    let (outcome, ignored): (String, Option<String>) = match &delivery.event {
        Event::Ping => ("ping".into(), None),
        Event::Ignored(why) => (format!("ignored: {why}"), Some(why.clone())),
        Event::Push(push) => {
            let tracking = route::route(&app.settings, push);
            if push.deleted {
                for t in &tracking {
                    warn!(target = %t.name, branch = %push.branch, receiver = %name,
                          "the branch this target tracks was deleted; nothing is applied");
                }
                let why = format!("branch `{}` was deleted", push.branch);
                (format!("ignored: {why}"), Some(why))
            } else {
                let paused_now = match app.store.paused().await {
                    Ok(p) => p,
                    Err(e) => return Err(unavailable(&s, &name, &e.to_string())),
                };
                // Every target tracking the branch gets a job; git decides
                // after the fetch whether the push changed its path. A
                // paused target's job waits in the queue until it resumes.
                for t in &tracking {
                    if paused_now.contains(&t.name) {
                        paused.push(t.name.clone());
                    }
                    requests.push(Request {
                        target: t.name.clone(),
                        trigger: Trigger::Webhook,
                        sha: Some(push.after.clone()),
                        delivery_id: delivery.id.clone(),
                        receiver: Some(name.clone()),
                    });
                }
                if !requests.is_empty() {
                    (format!("queued {} job(s)", requests.len()), None)
                } else {
                    let why = format!(
                        "no target tracks branch `{}` of {}",
                        push.branch,
                        push.repo_urls.join(", ")
                    );
                    (format!("ignored: {why}"), Some(why))
                }
            }
        }
    };

    match app.queue.accept(&name, id, &outcome, &requests).await {
        Err(e) => Err(unavailable(&s, &name, &e.to_string())),
        Ok(Accepted::Duplicate) => {
            metrics.delivery(&name, "duplicate");
            info!(receiver = %name, delivery = id.unwrap_or("-"), "duplicate delivery ignored");
            Ok((
                StatusCode::OK,
                Json(Delivered::Duplicate { duplicate: true }),
            ))
        }
        Ok(Accepted::Queued(jobs)) => {
            if matches!(delivery.event, Event::Ping) {
                metrics.delivery(&name, "ping");
                return Ok((StatusCode::OK, Json(Delivered::Pong { pong: true })));
            }
            metrics.delivery(&name, if jobs.is_empty() { "ignored" } else { "queued" });
            // The push is durable: its commit is `pending` on the forge of
            // every target that sends statuses (unless it has a result
            // there already: a delivery sent again).
            let pending: Vec<_> = requests
                .iter()
                .filter_map(|r| {
                    let t = app.target(&r.target)?;
                    let to = t.statuses.as_ref()?;
                    Some(crate::store::statuses::NewStatus {
                        forge: to.forge.clone(),
                        repo: to.repo.clone(),
                        sha: r.sha.clone()?,
                        context: format!("driftless/{}", t.name),
                        target: t.name.clone(),
                        state: crate::store::statuses::State::Pending,
                        description: "queued".into(),
                        target_url: None,
                        supersedes_queued_before: None,
                    })
                })
                .collect();
            if let Err(e) = app.store.record_statuses(&pending, true).await {
                error!(receiver = %name, error = %e, "the push is queued, but its pending commit statuses could not be recorded");
            }
            info!(receiver = %name, delivery = id.unwrap_or("-"), %outcome, "webhook delivery accepted");
            // Wake the workers now rather than at their next poll.
            s.wake.notify_waiters();
            let queued = jobs
                .into_iter()
                .map(|(target, job)| QueuedJob { target, job })
                .collect();
            Ok((
                StatusCode::ACCEPTED,
                Json(Delivered::Accepted {
                    queued,
                    ignored,
                    paused,
                }),
            ))
        }
    }
}

/// The delivery could not be recorded: say so with a 503 so the forge
/// retries, and never claim it was accepted.
fn unavailable(s: &AppState, receiver: &str, why: &str) -> ApiError {
    s.app.metrics.delivery(receiver, "unavailable");
    error!(receiver = %receiver, error = %why, "cannot record a webhook delivery");
    ApiError::unavailable("the delivery could not be recorded; please retry")
}
