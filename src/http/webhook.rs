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
use crate::queue::{Accepted, Intake};
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
        /// A pull request's targets whose preview is queued.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        previews: Vec<String>,
        /// Queued previews a closed pull request dropped.
        #[serde(skip_serializing_if = "is_zero")]
        dropped_previews: u64,
    },
}

/// Refused deliveries are said at most once every few seconds (a flood of
/// bad signatures must not become a flood of log lines); the metric counts
/// every one.
static REFUSALS: Quiet = Quiet::new();

struct Quiet {
    /// When it was last said (ms since the epoch).
    last: std::sync::atomic::AtomicI64,
    /// Refusals since then that were not said.
    unsaid: std::sync::atomic::AtomicU64,
}

impl Quiet {
    const EVERY_MS: i64 = 5_000;

    const fn new() -> Quiet {
        Quiet {
            last: std::sync::atomic::AtomicI64::new(i64::MIN),
            unsaid: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// `Some(n)`: say it now, with the `n` refusals not said since.
    fn say(&self) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let now = crate::store::now_ms();
        let last = self.last.load(Relaxed);
        if now.saturating_sub(last) >= Self::EVERY_MS
            && self
                .last
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            return Some(self.unsaid.swap(0, Relaxed));
        }
        self.unsaid.fetch_add(1, Relaxed);
        None
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
            if let Some(more) = REFUSALS.say() {
                warn!(receiver = %name, refused_since_last_said = more,
                      "webhook delivery refused: bad or missing signature");
            }
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
    let settings = app.settings();
    // What the delivery asks for, decided from the settings alone.
    let route::Asks {
        requests,
        pulls,
        statuses,
        sets_follow,
        outcome,
        ignored,
        deleted_branch,
    } = route::asks(&settings, &name, &delivery);
    for t in &deleted_branch {
        warn!(target = %t, receiver = %name,
              "the branch this target tracks was deleted; nothing is applied");
    }
    if let (Event::PullRequest(pr), Some(why)) = (&delivery.event, &ignored) {
        info!(receiver = %name, number = pr.number, reason = %why, "pull request not previewed");
    }
    let statuses_empty = statuses.is_empty();
    let intake = Intake {
        receiver: name.clone(),
        delivery_id: delivery.id.clone(),
        outcome: outcome.clone(),
        requests,
        pulls: pulls.clone(),
        statuses,
    };
    match app.queue.accept(intake).await {
        Err(e) => Err(unavailable(&s, &name, &e.to_string())),
        Ok(Accepted::Duplicate) => {
            metrics.delivery(&name, "duplicate");
            info!(receiver = %name, delivery = id.unwrap_or("-"), "duplicate delivery ignored");
            Ok((
                StatusCode::OK,
                Json(Delivered::Duplicate { duplicate: true }),
            ))
        }
        Ok(Accepted::Queued {
            jobs,
            paused,
            dropped_previews,
            new_job,
        }) => {
            if matches!(delivery.event, Event::Ping) {
                metrics.delivery(&name, "ping");
                return Ok((StatusCode::OK, Json(Delivered::Pong { pong: true })));
            }
            let previews: Vec<String> = pulls
                .iter()
                .filter(|p| !p.close)
                .flat_map(|p| p.targets.iter().cloned())
                .collect();
            metrics.delivery(
                &name,
                if jobs.is_empty() && previews.is_empty() && ignored.is_some() {
                    "ignored"
                } else {
                    "queued"
                },
            );
            if !statuses_empty {
                app.outbox_wake.notify_waiters();
            }
            if !sets_follow.is_empty() {
                app.sets_wake.notify_one();
            }
            info!(receiver = %name, delivery = id.unwrap_or("-"), %outcome, "webhook delivery accepted");
            // Wake the workers now rather than at their next poll, when
            // there is something new to claim: a request folded into a
            // queued job adds nothing to claim. The preview worker, when a
            // pull request was heard.
            if new_job {
                s.wake.notify_waiters();
            }
            if !pulls.is_empty() {
                app.previews_wake.notify_one();
            }
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
                    previews,
                    dropped_previews,
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
