//! HTTP: webhook receivers, the JSON API, health and metrics endpoints, and
//! the server loop that enforces the limits (header read timeout, request
//! timeout, connection cap, body cap).
//!
//! Handlers verify, route, enqueue and answer. They never run git or a
//! backend, and never wait for a tick except when a caller asks to
//! (`?wait=`), and then only by watching the job in the database.

mod api;
mod caller;
mod follow;
mod page;
mod webhook;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, warn};

use caller::{ApiError, Caller};

use crate::app::{App, Health};
use crate::config::{ConfigError, ForgeKind, Problem};

/// A receiver ready to verify deliveries: its forge and its loaded secret.
#[derive(Clone)]
pub struct ReceiverKey {
    pub forge: ForgeKind,
    pub secret: Arc<Vec<u8>>,
}

/// Cloned for every request (axum's `State`): every field is shared.
#[derive(Clone)]
pub struct AppState {
    /// Shared rather than cloned: an `App` holds two stores, each with
    /// paths of its own, and a clone of each per delivery was 2-3 % of a
    /// flood's CPU.
    pub app: Arc<App>,
    /// Where this server listens (the page's links when `public_url` is
    /// not set).
    pub addr: std::net::SocketAddr,
    pub health: Arc<Health>,
    pub receivers: Arc<HashMap<String, ReceiverKey>>,
    /// Wakes idle workers when something was queued.
    pub wake: Arc<tokio::sync::Notify>,
    /// Signs the page's forms (CSRF tokens); random per process, so a
    /// form from before a restart is refused and the page reloaded.
    pub(crate) csrf_key: Arc<[u8; 32]>,
    /// Turns true when the daemon stops: streams close, so open readers
    /// do not hold the graceful shutdown (they reconnect elsewhere).
    pub closing: Arc<watch::Sender<bool>>,
    /// The runs followed now, each read once for all its followers.
    pub(crate) feeds: Arc<follow::Feeds>,
    /// The board the page's row streams share (`page::events`).
    pub(crate) boards: Arc<page::Boards>,
}

impl AppState {
    /// Load every receiver's secret; a receiver whose secret cannot be read
    /// stops start-up rather than accepting unsigned deliveries.
    pub fn new(
        app: App,
        addr: std::net::SocketAddr,
        health: Arc<Health>,
        wake: Arc<tokio::sync::Notify>,
    ) -> Result<AppState, ConfigError> {
        let mut receivers = HashMap::new();
        let mut problems = Vec::new();
        for r in &app.settings().receivers {
            match r.secret.load() {
                Ok(s) => {
                    receivers.insert(
                        r.name.clone(),
                        ReceiverKey {
                            forge: r.forge,
                            secret: Arc::new(s.into_bytes()),
                        },
                    );
                }
                Err(e) => problems.push(Problem {
                    section: format!("receivers[{}]", r.name),
                    key: "secret_file".into(),
                    message: e.to_string(),
                }),
            }
        }
        let mut csrf_key = [0u8; 32];
        if let Err(e) = getrandom::fill(&mut csrf_key) {
            problems.push(Problem {
                section: "server".into(),
                key: "page".into(),
                message: format!("no randomness for the page's CSRF key: {e}"),
            });
        }
        if !problems.is_empty() {
            return Err(ConfigError::Invalid {
                path: app.settings().source.clone(),
                problems,
            });
        }
        Ok(AppState {
            app: Arc::new(app),
            addr,
            health,
            receivers: Arc::new(receivers),
            wake,
            csrf_key: Arc::new(csrf_key),
            closing: Arc::new(watch::Sender::new(false)),
            feeds: Default::default(),
            boards: Default::default(),
        })
    }
}

pub fn router(state: AppState) -> Router {
    let server = &state.app.settings().server;
    let timeout = server.request_timeout;
    // Everything but a reconcile that may wait is bounded by request_timeout.
    let bounded = Router::new()
        .route("/", get(page::index))
        .route("/deployments/{id}/{verb}", post(page::decide))
        .route("/targets/{name}", get(page::target_page))
        .route("/runs/{id}", get(page::run_page))
        .route("/assets/page.js", get(page::script))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/hooks/{receiver}", post(webhook::receive))
        .route("/api/v1/targets", get(api::list_targets))
        .route("/api/v1/targets/{name}", get(api::get_target))
        .route("/api/v1/targets/{name}/runs", get(api::runs))
        .route("/api/v1/targets/{name}/pause", post(api::pause))
        .route("/api/v1/targets/{name}/resume", post(api::resume))
        .route("/api/v1/jobs/{id}", get(api::job))
        .route("/api/v1/rollouts", get(api::rollouts))
        .route("/api/v1/rollouts/{name}", get(api::rollout))
        .route("/api/v1/rollouts/{name}/resume", post(api::resume_rollout))
        .route("/api/v1/rollouts/{name}/abort", post(api::abort_rollout))
        .route("/api/v1/runs/{id}", get(api::run))
        .route("/api/v1/runs/{id}/output", get(api::run_output))
        .route("/api/v1/deployments", get(api::deployments))
        .route("/api/v1/deployments/{id}", get(api::deployment))
        .route("/api/v1/deployments/{id}/approve", post(api::approve))
        .route("/api/v1/deployments/{id}/reject", post(api::reject))
        .route(
            "/api/v1/targets/{name}/jobs/{job}/pause",
            post(api::pause_job),
        )
        .route(
            "/api/v1/targets/{name}/jobs/{job}/resume",
            post(api::resume_job),
        )
        .layer(middleware::from_fn_with_state(timeout, request_timeout));
    Router::new()
        // Streams: answered at once, then open until their end.
        .route("/events", get(page::board_events))
        .route("/runs/{id}/events", get(page::run_events))
        .route("/api/v1/targets/{name}/reconcile", post(api::reconcile))
        .route("/api/v1/targets/{name}/retry", post(api::retry))
        .merge(bounded)
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .layer(DefaultBodyLimit::max(server.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            server.max_body_bytes,
            body_cap,
        ))
        .with_state(state)
}

/// A body announced larger than the cap is refused before a byte of it is
/// read (bodies without a length are cut off by `DefaultBodyLimit` as they
/// stream in).
async fn body_cap(State(max): State<usize>, req: Request, next: Next) -> Response {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match announced {
        Some(n) if n > max as u64 => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {max} bytes"),
        )
        .into_response(),
        _ => next.run(req).await,
    }
}

async fn request_timeout(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::unavailable("request timed out").into_response(),
    }
}

/// Ready when the state database takes a write and the workers can use it.
async fn readyz(State(s): State<AppState>) -> Response {
    if let Err(e) = s.app.store.probe_write().await {
        warn!(error = %e, "readiness probe failed");
        return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")).into_response();
    }
    if s.health.store_failing.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: the state database {} refused a write; see the log\n",
                s.app.store.path().display()
            ),
        )
            .into_response();
    }
    (StatusCode::OK, "ready\n").into_response()
}

async fn metrics(
    State(s): State<AppState>,
    caller: Result<Caller, ApiError>,
) -> Result<Response, ApiError> {
    let settings = &s.app.settings();
    if settings.server.metrics == crate::config::PageAccess::Token {
        match caller {
            Ok(c) if c.reads_anything() => {}
            Ok(_) => {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "this token has no read scope",
                ));
            }
            Err(_) => return Err(ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized")),
        }
    }
    let activity = s
        .app
        .queue
        .activity()
        .await
        .map_err(ApiError::unavailable)?;
    let last = s
        .app
        .store
        .last_successes()
        .await
        .map_err(ApiError::unavailable)?;
    let states = s
        .app
        .store
        .target_states()
        .await
        .map_err(ApiError::unavailable)?;
    // Every configured target: 0 when nothing waits for it, drift 0 unless
    // its last `detect` plan found some. Looked up by name: a scan of the
    // others for each target took most of a scrape at 10,000 targets.
    let mut waiting: HashMap<&str, i64> = HashMap::with_capacity(activity.len());
    for a in &activity {
        waiting.entry(a.target.as_str()).or_insert(a.queued);
    }
    let drift: HashSet<&str> = states
        .iter()
        .filter(|st| st.drift_hash.is_some())
        .map(|st| st.name.as_str())
        .collect();
    let (queued, drifting): (Vec<_>, Vec<_>) = settings
        .targets
        .iter()
        .map(|t| {
            let n = waiting.get(t.name.as_str()).copied().unwrap_or(0);
            let d = drift.contains(t.name.as_str());
            ((t.name.clone(), n), (t.name.clone(), d))
        })
        .unzip();
    let now = crate::store::now_ms();
    let paused: Vec<(String, i64)> = s
        .app
        .store
        .limits()
        .await
        .map_err(ApiError::unavailable)?
        .into_iter()
        .filter(|l| l.paused_until > now)
        .map(|l| (l.label, l.paused_until))
        .collect();
    let clock = crate::window::now();
    let windows: Vec<(String, bool, Option<i64>)> = settings
        .targets
        .iter()
        .filter(|t| !t.windows.is_empty())
        .map(|t| {
            let at = t.windows.at(clock);
            (
                t.name.clone(),
                at.open,
                at.next_change.map(|c| c.as_second()),
            )
        })
        .collect();
    Ok((
        // prometheus-client writes the OpenMetrics text format.
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.app
            .metrics
            .render(&queued, &last, &drifting, &paused, &windows),
    )
        .into_response())
}

async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Serve `app` on `listener` until `shutdown` turns true: at most
/// `max_connections` at once, headers within `header_read_timeout`; on
/// shutdown stop accepting and let open requests finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    settings: &crate::config::Server,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(settings.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout);
    loop {
        // Wait for a free slot before accepting: excess connections queue in
        // the kernel's backlog instead of being served half-way.
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stopped(&mut shutdown) => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stopped(&mut shutdown) => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    // Let requests in flight (a reconcile waiting on its job, say) finish.
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown())
        .await
        .is_err()
    {
        warn!("open connections did not finish within 30s of shutdown");
    }
}
