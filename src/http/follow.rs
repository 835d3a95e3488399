//! `GET /api/v1/runs/{id}/output?follow=1`: a run's output as
//! Server-Sent Events — what was kept so far first, then each chunk as it
//! is written (`output` events, the chunk's number as the event id, so a
//! reader that reconnects with `Last-Event-ID` resumes after it without a
//! duplicate), then one `end` event with the run's result, and the stream
//! closes.
//!
//! The state database is the relay between instances: the instance running
//! the command writes a chunk every 250 ms (`tick::output`), and any
//! instance reads it there — at once when this process wrote it
//! (`Store::output_changes`, `Store::run_changes`), else within [`PACE`].
//! Within one process every follower of a run shares one [`Feed`]: one
//! task reads the run and its new chunks for all of them and keeps the
//! run's chunks in memory (at most the 4 MiB a run keeps) while anyone
//! follows it, so a hundred readers of one run cost one reader's queries.
//! Text is stored redacted; this module only reads and frames it, and
//! never holds a reader's connection past the daemon's shutdown.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream};
use serde::Serialize;
use tokio::sync::watch;

use crate::store::run_output::Chunk;
use crate::store::{Run, Store};

/// How often a run's feed reads the database when nothing in this process
/// told it of a change (another process's run: a one-shot tick, or
/// another instance on PostgreSQL).
const PACE: Duration = Duration::from_secs(1);

/// How a run ended, as the last event says it.
#[derive(Serialize, Clone, Debug)]
struct End {
    run: i64,
    target: String,
    result: Option<String>,
    message: Option<String>,
    /// The run repeated the unchanged run before it and was folded into
    /// that row (`run`), as history keeps a streak.
    folded: bool,
}

/// What a feed knows of its run so far.
#[derive(Default)]
struct Known {
    /// Every chunk of the run, in order.
    chunks: Vec<Chunk>,
    end: Option<End>,
    /// The run's row is gone and no streak row took it.
    gone: bool,
    /// The database failed.
    error: Option<String>,
}

/// One run's output as this process knows it, shared by its followers.
struct Feed {
    known: Mutex<Known>,
    /// Bumped whenever `known` grows.
    grew: watch::Sender<u64>,
}

/// Every run someone in this process follows now.
#[derive(Default)]
pub struct Feeds(Mutex<HashMap<i64, Weak<Feed>>>);

impl Feeds {
    /// The feed of run `run` of `target`, started if nobody follows it yet.
    fn get(&self, store: &Store, (run, target): (i64, String)) -> Arc<Feed> {
        let Ok(mut map) = self.0.lock() else {
            return Feed::start(store, run, target);
        };
        map.retain(|_, f| f.strong_count() > 0);
        if let Some(f) = map.get(&run).and_then(Weak::upgrade) {
            return f;
        }
        let f = Feed::start(store, run, target);
        map.insert(run, Arc::downgrade(&f));
        f
    }
}

impl Feed {
    /// A feed, and the task that reads for it until nobody follows or the
    /// run has ended.
    fn start(store: &Store, run: i64, target: String) -> Arc<Feed> {
        let feed = Arc::new(Feed {
            known: Mutex::new(Known::default()),
            grew: watch::Sender::new(0),
        });
        let weak = Arc::downgrade(&feed);
        let store = store.clone();
        tokio::spawn(async move {
            let mut output = store.output_changes();
            let mut runs = store.run_changes();
            let mut reader = Reader {
                store,
                run,
                target,
                cursor: 0,
            };
            // The feed ends with its followers, who close at shutdown.
            loop {
                let Some(feed) = weak.upgrade() else { return };
                let over = reader.read(&feed).await;
                feed.grew.send_modify(|n| *n = n.wrapping_add(1));
                drop(feed);
                if over {
                    return;
                }
                wait(&mut output, Some(&mut runs), PACE).await;
            }
        });
        feed
    }
}

/// What reads the database for one feed.
struct Reader {
    store: Store,
    run: i64,
    target: String,
    /// The last chunk read.
    cursor: i64,
}

impl Reader {
    /// Add what was written since the cursor, and the end once the run has
    /// one. The run is read before its output: a result recorded means
    /// every chunk was written before it (`RunOutput::finish`). True when
    /// nothing more will come.
    async fn read(&mut self, feed: &Feed) -> bool {
        let outcome = self.read_db().await;
        let Ok(mut known) = feed.known.lock() else {
            return true;
        };
        match outcome {
            Ok((chunks, end)) => {
                known.chunks.extend(chunks);
                match end {
                    Some(Some(end)) => known.end = Some(end),
                    Some(None) => known.gone = true,
                    None => return false,
                }
            }
            Err(e) => {
                tracing::warn!(run = self.run, error = %e, "cannot follow a run's output");
                known.error = Some(e.to_string());
            }
        }
        true
    }

    /// New chunks, and `Some(end)` once the run is over (`Some(None)`: its
    /// row is gone).
    #[allow(clippy::type_complexity)]
    async fn read_db(
        &mut self,
    ) -> Result<(Vec<Chunk>, Option<Option<End>>), crate::store::StoreError> {
        let (run, folded) = match self.store.run(self.run).await? {
            Some(r) => (r, false),
            // Folded into the unchanged run before it, output and all
            // (`store::runs::fold`).
            None => match self.store.folded_into(&self.target, self.run).await? {
                Some(into) => (into, true),
                None => return Ok((Vec::new(), Some(None))),
            },
        };
        let chunks = self.store.run_output(run.id, self.cursor).await?;
        if let Some(c) = chunks.last() {
            self.cursor = c.seq;
        }
        let end = run.result.is_some().then(|| Some(end_of(&run, folded)));
        Ok((chunks, end))
    }
}

fn end_of(run: &Run, folded: bool) -> End {
    End {
        run: run.id,
        target: run.target.clone(),
        result: run.result.clone(),
        message: run.message.clone(),
        folded,
    }
}

/// What a stream sends: given the events queue, add what is new since the
/// last call; true when nothing more will come (the stream then closes
/// once the queue is sent).
pub(super) trait Source: Send + 'static {
    fn take(&mut self, out: &mut VecDeque<Event>) -> bool;
}

/// `source` as Server-Sent Events: what it has at once, then more each
/// time `grew` fires, until it says it is over or the daemon stops
/// (`closing`).
pub(super) fn events<S: Source>(
    source: S,
    grew: watch::Receiver<u64>,
    closing: watch::Receiver<bool>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<S>> {
    struct Driver<S> {
        source: S,
        grew: watch::Receiver<u64>,
        closing: watch::Receiver<bool>,
        pending: VecDeque<Event>,
        over: bool,
    }
    let driver = Driver {
        source,
        grew,
        closing,
        pending: VecDeque::new(),
        over: false,
    };
    let stream = stream::unfold(driver, |mut d| async move {
        loop {
            if let Some(e) = d.pending.pop_front() {
                return Some((Ok(e), d));
            }
            if d.over || *d.closing.borrow() {
                return None;
            }
            // Seen before reading: a change from here on wakes the wait.
            d.grew.mark_unchanged();
            d.over = d.source.take(&mut d.pending);
            if d.pending.is_empty() && !d.over {
                tokio::select! {
                    r = d.grew.changed() => d.over = r.is_err(),
                    _ = d.closing.changed() => {}
                }
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// One reader's place in a feed.
struct Follow {
    feed: Arc<Feed>,
    /// The last chunk sent.
    cursor: i64,
}

/// Follow run `run` of `target` (already checked readable) from after
/// chunk `after`.
pub(super) fn output(
    feeds: &Feeds,
    store: &Store,
    run: (i64, String),
    after: i64,
    closing: watch::Receiver<bool>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<>> {
    let feed = feeds.get(store, run);
    let grew = feed.grew.subscribe();
    events(
        Follow {
            feed,
            cursor: after,
        },
        grew,
        closing,
    )
}

impl Source for Follow {
    /// What the feed holds past the cursor, and its end.
    fn take(&mut self, out: &mut VecDeque<Event>) -> bool {
        let Ok(known) = self.feed.known.lock() else {
            return true;
        };
        let from = self.cursor;
        for c in known.chunks.iter().filter(|c| c.seq > from) {
            self.cursor = c.seq;
            out.push_back(
                Event::default()
                    .event("output")
                    .id(c.seq.to_string())
                    .data(&c.data),
            );
        }
        if let Some(e) = &known.error {
            out.push_back(Event::default().event("error").data(e));
        } else if let Some(end) = &known.end {
            let event = Event::default().event("end").id(self.cursor.to_string());
            out.push_back(
                event
                    .json_data(end)
                    .unwrap_or_else(|_| Event::default().event("end")),
            );
        } else if known.gone {
            out.push_back(
                Event::default()
                    .event("gone")
                    .data("this run is no longer recorded"),
            );
        } else {
            return false;
        }
        true
    }
}

/// Until either signal fires (this process wrote something) or `pace`
/// passes. A signal whose sender is gone waits `pace` instead.
pub(super) async fn wait(
    one: &mut watch::Receiver<u64>,
    other: Option<&mut watch::Receiver<u64>>,
    pace: Duration,
) {
    let other = async {
        match other {
            Some(rx) => rx.changed().await.is_ok(),
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = one.changed() => {
            if r.is_err() {
                tokio::time::sleep(pace).await;
            }
        }
        fired = other => {
            if !fired {
                tokio::time::sleep(pace).await;
            }
        }
        _ = tokio::time::sleep(pace) => {}
    }
}
