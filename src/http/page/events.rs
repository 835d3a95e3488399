//! The page's live parts, as Server-Sent Events: `GET /events` (one stream
//! of row changes for the dashboard, or `?target=NAME` for one target's
//! page) and `GET /runs/{id}/events` (a run's output for the page, as
//! `http::follow` streams it). Each stream shows only what its viewer may
//! read, exactly as the page does. A row is sent when what it shows
//! changed: at once when this process began or ended a run
//! (`Store::run_changes`), else within [`PACE`] (a job queued, a plan decided,
//! another instance's run). One task reads the board for every open page
//! of this process ([`Boards`]); each stream filters it for its viewer.
//! Reads only.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::rows;
use super::target::{readable_run, reader};
use super::{AppState, Caller, viewer};
use crate::auth::Verb;
use crate::http::caller::ApiError;

/// How often the rows are read again when nothing in this process said
/// that something changed.
const PACE: Duration = Duration::from_secs(2);

#[derive(Deserialize)]
pub(crate) struct EventsQuery {
    target: Option<String>,
    after: Option<i64>,
}

/// One row, as the dashboard shows it.
#[derive(Serialize)]
struct RowEvent<'a> {
    name: &'a str,
    /// Its group's id (`failing`, `running`, …).
    group: &'a str,
    html: &'a str,
    /// The run going now, if any.
    run: Option<i64>,
}

/// The board as last read, with each running target's run: what every
/// row stream of this process renders from.
struct Snapshot {
    board: Result<super::Board, String>,
    running: HashMap<String, i64>,
}

/// One board, read for every row stream of this process at once.
struct BoardFeed {
    latest: Mutex<Option<Arc<Snapshot>>>,
    grew: watch::Sender<u64>,
}

/// The board feed while any page watches it.
#[derive(Default)]
pub struct Boards(Mutex<Weak<BoardFeed>>);

impl Boards {
    fn get(&self, s: &AppState) -> Arc<BoardFeed> {
        let Ok(mut current) = self.0.lock() else {
            return BoardFeed::start(s);
        };
        if let Some(f) = current.upgrade() {
            return f;
        }
        let f = BoardFeed::start(s);
        *current = Arc::downgrade(&f);
        f
    }
}

impl BoardFeed {
    /// The feed, and the task that reads the board for it — every target
    /// and plan, filtered by each stream for its viewer — at each run's
    /// start and end here and every [`PACE`], until nobody watches.
    fn start(s: &AppState) -> Arc<BoardFeed> {
        let feed = Arc::new(BoardFeed {
            latest: Mutex::new(None),
            grew: watch::Sender::new(0),
        });
        let weak = Arc::downgrade(&feed);
        let s = s.clone();
        tokio::spawn(async move {
            let mut changes = s.app.store.run_changes();
            loop {
                let snapshot = Arc::new(read_board(&s).await);
                let Some(feed) = weak.upgrade() else { return };
                if let Ok(mut latest) = feed.latest.lock() {
                    *latest = Some(snapshot);
                }
                feed.grew.send_modify(|n| *n = n.wrapping_add(1));
                drop(feed);
                crate::http::follow::wait(&mut changes, None, PACE).await;
            }
        });
        feed
    }
}

/// Every target and plan, and the run going now of each running target.
async fn read_board(s: &AppState) -> Snapshot {
    let board = match super::board(s, None).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the page's rows");
            return Snapshot {
                board: Err(e.to_string()),
                running: HashMap::new(),
            };
        }
    };
    let mut running = HashMap::new();
    for t in board.targets.iter().filter(|t| t.running) {
        if let Ok(r) = s.app.store.history(&t.name, 1).await
            && let Some(r) = r.first().filter(|r| r.result.is_none())
        {
            running.insert(t.name.clone(), r.id);
        }
    }
    Snapshot {
        board: Ok(board),
        running,
    }
}

struct Rows {
    s: AppState,
    feed: Arc<BoardFeed>,
    viewer: Option<Caller>,
    only: Option<String>,
    /// What each row showed when last sent.
    shown: HashMap<String, String>,
}

/// `GET /events[?target=NAME]`
pub(crate) async fn board_events(
    State(s): State<AppState>,
    caller: Result<Caller, ApiError>,
    Query(q): Query<EventsQuery>,
) -> Response {
    let settings = s.app.settings();
    let viewer = match &q.target {
        Some(t) => match reader(&settings, caller, t) {
            Ok(v) => v,
            Err(r) => return *r,
        },
        None => match viewer(&settings, caller) {
            Ok(v) => v,
            Err(r) => return *r,
        },
    };
    let feed = s.boards.get(&s);
    let grew = feed.grew.subscribe();
    let closing = s.closing.subscribe();
    let rows = Rows {
        s,
        feed,
        viewer,
        only: q.target,
        shown: HashMap::new(),
    };
    crate::http::follow::events(rows, grew, closing).into_response()
}

impl crate::http::follow::Source for Rows {
    /// Queue a `row` event for every row this viewer may read whose content
    /// changed since the last one sent, a `gone` for every row no longer
    /// shown.
    fn take(&mut self, out: &mut VecDeque<Event>) -> bool {
        let snapshot = match self.feed.latest.lock() {
            Ok(l) => l.clone(),
            Err(_) => None,
        };
        // Not read yet: the feed's first read wakes this stream.
        let Some(snapshot) = snapshot else {
            return false;
        };
        let board = match &snapshot.board {
            Ok(b) => b,
            Err(e) => {
                out.push_back(Event::default().event("error").data(e));
                return true;
            }
        };
        let settings = self.s.app.settings();
        let viewer = self.viewer.clone();
        let readable = move |t: &str| viewer.as_ref().is_none_or(|c| c.may(Verb::Read, t));
        let cx = rows::Ctx {
            settings: &settings,
            now_ms: crate::store::now_ms(),
            may_read: &readable,
            awaiting: &board.awaiting,
        };
        let mut seen = Vec::new();
        for t in &board.targets {
            if self.only.as_ref().is_some_and(|o| *o != t.name) || !readable(&t.name) {
                continue;
            }
            seen.push(t.name.clone());
            let run = snapshot.running.get(&t.name).copied();
            let awaits = board.awaiting.contains(&t.name);
            let key = format!(
                "{}|{awaits}|{run:?}",
                serde_json::to_string(t).unwrap_or_default()
            );
            if self.shown.get(&t.name) == Some(&key) {
                continue;
            }
            let (group, _, _) = rows::state(t, awaits);
            let html = rows::row(t, &cx);
            let data = RowEvent {
                name: &t.name,
                group: group.id(),
                html: &html,
                run,
            };
            if let Ok(e) = Event::default().event("row").json_data(&data) {
                out.push_back(e);
            }
            self.shown.insert(t.name.clone(), key);
        }
        let gone: Vec<String> = self
            .shown
            .keys()
            .filter(|n| !seen.contains(n))
            .cloned()
            .collect();
        for name in gone {
            self.shown.remove(&name);
            if let Ok(e) = Event::default()
                .event("gone")
                .json_data(serde_json::json!({ "name": name }))
            {
                out.push_back(e);
            }
        }
        false
    }
}

/// `GET /runs/{id}/events[?after=N]`: the run's output for the page.
pub(crate) async fn run_events(
    State(s): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(id): Path<i64>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Response {
    let run = match readable_run(&s, caller, id).await {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let after = match crate::http::api::last_event_id(&headers) {
        Ok(Some(seen)) => seen,
        Ok(None) => q.after.unwrap_or(0),
        Err(e) => return e.into_response(),
    };
    crate::http::follow::output(
        &s.feeds,
        &s.app.store,
        (run.id, run.target),
        after,
        s.closing.subscribe(),
    )
    .into_response()
}
