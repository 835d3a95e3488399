//! A signal that this process wrote something a watcher of runs may want
//! to see: a run began or ended, or a run's output grew. Readers that
//! stream (`GET /api/v1/runs/{id}/output?follow=1`, the page's events)
//! wait on it instead of reading the database on a timer, and read the
//! database when it fires. Another instance's writes on PostgreSQL do not
//! fire it: those readers also read at a fixed pace. It carries no data
//! (the database stays the one place a reader learns what changed).

use std::sync::Arc;

use tokio::sync::watch;

/// Cheap to clone: every clone signals the same watchers.
#[derive(Clone, Debug)]
pub(super) struct Changes(Arc<watch::Sender<u64>>);

impl Default for Changes {
    fn default() -> Changes {
        Changes(Arc::new(watch::Sender::new(0)))
    }
}

impl Changes {
    /// Something was written.
    pub(super) fn fire(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub(super) fn watch(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

impl super::Store {
    /// Fires when this process began or finished a run, or kept more of a
    /// run's output (see the module's doc for what it does not see).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.watch()
    }
}
