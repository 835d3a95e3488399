//! Signals that this process wrote something a watcher of runs may want
//! to see: a run began or ended (one signal), a run's output grew (the
//! other). Readers that
//! stream (`GET /api/v1/runs/{id}/output?follow=1`, the page's events)
//! wait on it instead of reading the database on a timer, and read the
//! database when it fires. Another instance's writes on PostgreSQL do not
//! fire it: those readers also read at a fixed pace. It carries no data
//! (the database stays the one place a reader learns what changed).
//!
//! Beside them, a count of the deployment rows this process made: a tick
//! whose target had none when its run began, and during which the count
//! did not move, made none, and has no plan to tell its owners of
//! (`tick::notices`) without reading for one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

/// Cheap to clone: every clone signals the same watchers.
#[derive(Clone, Debug)]
pub(super) struct Changes {
    /// A run began or ended.
    runs: Arc<watch::Sender<u64>>,
    /// A run's output grew.
    output: Arc<watch::Sender<u64>>,
    /// Deployment rows this process made (or tried to).
    deployments: Arc<AtomicU64>,
}

impl Default for Changes {
    fn default() -> Changes {
        Changes {
            runs: Arc::new(watch::Sender::new(0)),
            output: Arc::new(watch::Sender::new(0)),
            deployments: Arc::new(AtomicU64::new(0)),
        }
    }
}

fn bump(tx: &watch::Sender<u64>) {
    tx.send_modify(|n| *n = n.wrapping_add(1));
}

impl Changes {
    /// A run began or ended.
    pub(super) fn run(&self) {
        bump(&self.runs);
    }

    /// A run's output grew.
    pub(super) fn output(&self) {
        bump(&self.output);
    }

    /// A deployment row is about to be made: counted before the insert,
    /// so a reader that saw the count unmoved cannot have missed the row.
    pub(super) fn deployment(&self) {
        self.deployments.fetch_add(1, Ordering::SeqCst);
    }
}

impl super::Store {
    /// Fires when this process began or finished a run (see the module's
    /// doc for what it does not see).
    pub fn run_changes(&self) -> watch::Receiver<u64> {
        self.changes.runs.subscribe()
    }

    /// Fires when this process kept more of a run's output.
    pub fn output_changes(&self) -> watch::Receiver<u64> {
        self.changes.output.subscribe()
    }

    /// How many deployment rows this process has made (or tried to):
    /// unmoved between two reads, it made none in between.
    pub fn deployments_made(&self) -> u64 {
        self.changes.deployments.load(Ordering::SeqCst)
    }
}
