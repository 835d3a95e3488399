//! `GET /api/v1/runs/{id}/output?follow=1`: a run's output as
//! Server-Sent Events — what was kept so far first, then each chunk as it
//! is written (`output` events, the chunk's number as the event id, so a
//! reader that reconnects with `Last-Event-ID` resumes after it without a
//! duplicate), then one `end` event with the run's result, and the stream
//! closes. The state database is the relay: the instance running the
//! command writes a chunk every 250 ms (`tick::output`), and a follower
//! on any instance reads it there — at once when this process wrote it
//! (`Store::output_changes`, `Store::run_changes`), else within [`PACE`]. Text is stored redacted; this
//! module only reads and frames it, and never holds a reader's connection
//! past the daemon's shutdown.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream};
use serde::Serialize;
use tokio::sync::watch;

use crate::store::{Run, Store};

/// How often a follower reads the database when nothing in this process
/// told it of a change (another instance's run, on PostgreSQL).
const PACE: Duration = Duration::from_secs(1);

/// The last event: how the run ended.
#[derive(Serialize)]
struct End<'a> {
    run: i64,
    target: &'a str,
    result: Option<&'a str>,
    message: Option<&'a str>,
    /// The run repeated the unchanged run before it and was folded into
    /// that row (`run`), as history keeps a streak.
    folded: bool,
}

struct Follow {
    store: Store,
    run: i64,
    target: String,
    /// The last chunk sent.
    cursor: i64,
    /// More output was kept.
    changes: watch::Receiver<u64>,
    /// A run began or ended.
    ends: watch::Receiver<u64>,
    closing: watch::Receiver<bool>,
    pending: std::collections::VecDeque<Event>,
    over: bool,
}

/// Follow run `run` of `target` (already checked readable) from after
/// chunk `after`.
pub(super) fn output(
    store: Store,
    (run, target): (i64, String),
    after: i64,
    closing: watch::Receiver<bool>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut changes = store.output_changes();
    changes.mark_unchanged();
    let mut ends = store.run_changes();
    ends.mark_unchanged();
    let follow = Follow {
        store,
        run,
        target,
        cursor: after,
        changes,
        ends,
        closing,
        pending: Default::default(),
        over: false,
    };
    let events = stream::unfold(follow, |mut f| async move {
        loop {
            if let Some(e) = f.pending.pop_front() {
                return Some((Ok(e), f));
            }
            if f.over || *f.closing.borrow() {
                return None;
            }
            f.read().await;
            if f.pending.is_empty() && !f.over {
                f.wait().await;
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

impl Follow {
    /// Queue what was written since the cursor, and the end once the run
    /// has one. The run is read before its output: a result recorded means
    /// every chunk was written before it (`RunOutput::finish`).
    async fn read(&mut self) {
        let run = match self.store.run(self.run).await {
            Ok(r) => r,
            Err(e) => return self.fail(&e),
        };
        let Some(run) = run else {
            return self.folded().await;
        };
        if let Err(e) = self.chunks(run.id).await {
            return self.fail(&e);
        }
        if run.result.is_some() {
            self.end(&run, false);
        }
    }

    async fn chunks(&mut self, run: i64) -> Result<(), crate::store::StoreError> {
        for c in self.store.run_output(run, self.cursor).await? {
            self.cursor = c.seq;
            self.pending.push_back(
                Event::default()
                    .event("output")
                    .id(c.seq.to_string())
                    .data(c.data),
            );
        }
        Ok(())
    }

    /// The run's row is gone while it was followed: it repeated the
    /// target's unchanged run before it and was folded into that row,
    /// output and all (`store::runs::fold`).
    async fn folded(&mut self) {
        let into = match self.store.history(&self.target, 5).await {
            Ok(runs) => runs
                .into_iter()
                .find(|r| r.id < self.run && r.result.as_deref() == Some("no_change")),
            Err(e) => return self.fail(&e),
        };
        let Some(into) = into else {
            self.over = true;
            return self.pending.push_back(
                Event::default()
                    .event("gone")
                    .data(format!("run {} is no longer recorded", self.run)),
            );
        };
        if let Err(e) = self.chunks(into.id).await {
            return self.fail(&e);
        }
        self.end(&into, true);
    }

    fn end(&mut self, run: &Run, folded: bool) {
        let end = End {
            run: run.id,
            target: &run.target,
            result: run.result.as_deref(),
            message: run.message.as_deref(),
            folded,
        };
        let event = Event::default().event("end").id(self.cursor.to_string());
        self.pending.push_back(
            event
                .json_data(end)
                .unwrap_or_else(|_| Event::default().event("end")),
        );
        self.over = true;
    }

    /// The database failed: say so, and close (the reader reconnects).
    fn fail(&mut self, e: &crate::store::StoreError) {
        tracing::warn!(run = self.run, error = %e, "cannot follow a run's output");
        self.pending
            .push_back(Event::default().event("error").data(e.to_string()));
        self.over = true;
    }

    async fn wait(&mut self) {
        if wait(
            &mut self.changes,
            Some(&mut self.ends),
            PACE,
            &mut self.closing,
        )
        .await
        {
            self.over = true;
        }
    }
}

/// Until either signal fires (this process wrote something), `pace`
/// passes, or the daemon stops. True when the stream must close: the
/// daemon stops, or nothing can tell it to any more.
pub(super) async fn wait(
    one: &mut watch::Receiver<u64>,
    other: Option<&mut watch::Receiver<u64>>,
    pace: Duration,
    closing: &mut watch::Receiver<bool>,
) -> bool {
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
        r = closing.changed() => return r.is_err() || *closing.borrow(),
    }
    *closing.borrow()
}
