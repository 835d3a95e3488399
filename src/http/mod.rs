//! HTTP: health endpoints now; webhooks and the API build on this router.
//!
//! Handlers verify, route, enqueue and answer. They never run git or a
//! backend, and never wait for a tick (forges give up after 5–10 s).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::daemon::Health;
use crate::tick::Engine;

#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub health: Arc<Health>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Ready when the state database answers and the workers can use the queue.
async fn readyz(State(s): State<AppState>) -> (StatusCode, String) {
    if let Err(e) = s.engine.store.ping().await {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n"));
    }
    if s.health.store_failing.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: the state database {} refused a write; see the log\n",
                s.engine.store.path().display()
            ),
        );
    }
    (StatusCode::OK, "ready\n".into())
}
