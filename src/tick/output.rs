//! A run's whole output, kept as it comes (issue 48): every command the run
//! starts that is `Spec::shown` (a backend's own work, never a command that
//! prints data) writes its lines here (`process::with_output`, redacted by
//! the command's own redactor), bounded at [`OUTPUT_MAX`] a run with a note
//! where it was cut, and written to the store a chunk at a time — every
//! [`FLUSH_EVERY`] while the run goes, and the rest before its result is
//! recorded. This module keeps output; it decides nothing about the run,
//! and a failure to keep output is logged, never the run's failure.

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use crate::process::OutputSink;
use crate::store::Store;

/// The most of one run's output kept.
pub(crate) const OUTPUT_MAX: usize = 4 * 1024 * 1024;
/// How often a running run's new output is written.
const FLUSH_EVERY: Duration = Duration::from_millis(250);

tokio::task_local! {
    /// The run this task's commands write to, once it has begun.
    static CURRENT: Slot;
}

/// Where a run's output goes once the run has a row: set by [`begin`].
#[derive(Clone, Default)]
pub(super) struct Slot(Arc<OnceLock<RunOutput>>);

impl Slot {
    /// What the task's commands write to: the run, once begun; nothing
    /// before (the fetch that comes first belongs to no run yet).
    pub(super) fn sink(&self) -> OutputSink {
        let slot = self.0.clone();
        Arc::new(move |text: &str| {
            if let Some(out) = slot.get() {
                out.push(text);
            }
        })
    }

    /// Run `fut` with this slot as the one [`begin`] fills.
    pub(super) async fn scope<F: std::future::Future>(self, fut: F) -> F::Output {
        CURRENT.scope(self, fut).await
    }
}

/// Run `run_id` of `target` has begun: what its commands print from now on
/// is kept. `None` outside a [`Slot::scope`].
pub(super) fn begin(store: &Store, target: &str, run_id: i64) -> Option<RunOutput> {
    let out = RunOutput::new(store.clone(), target, run_id);
    CURRENT
        .try_with(|slot| slot.0.set(out.clone()).is_ok())
        .ok()
        .filter(|set| *set)
        .map(|_| out)
}

/// One run's output on its way to the store. Cheap to clone.
#[derive(Clone)]
pub(super) struct RunOutput(Arc<Inner>);

struct Inner {
    store: Store,
    target: String,
    run_id: i64,
    buf: Mutex<Buf>,
    /// One writer at a time, so chunks keep their order.
    writing: tokio::sync::Mutex<()>,
    /// The writer that runs while the run goes has been started (at the
    /// first output: a run that starts no command starts no task).
    writer: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Buf {
    pending: String,
    seq: i64,
    kept: usize,
    cut: bool,
}

impl RunOutput {
    fn new(store: Store, target: &str, run_id: i64) -> RunOutput {
        RunOutput(Arc::new(Inner {
            store,
            target: target.to_string(),
            run_id,
            buf: Mutex::new(Buf::default()),
            writing: tokio::sync::Mutex::new(()),
            writer: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// Write what comes every [`FLUSH_EVERY`] while the run goes, until
    /// nobody holds the run's output.
    fn start_writer(&self) {
        let weak: Weak<Inner> = Arc::downgrade(&self.0);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(FLUSH_EVERY).await;
                match weak.upgrade() {
                    Some(inner) => RunOutput(inner).write().await,
                    None => return,
                }
            }
        });
    }

    /// Keep `text` (complete lines), up to [`OUTPUT_MAX`] a run.
    fn push(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        if !self
            .0
            .writer
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            self.start_writer();
        }
        let Ok(mut b) = self.0.buf.lock() else {
            return;
        };
        if b.cut {
            return;
        }
        let room = OUTPUT_MAX.saturating_sub(b.kept);
        if text.len() <= room {
            b.pending.push_str(text);
            b.kept += text.len();
            return;
        }
        // Cut at the last whole line that fits (a character boundary at
        // least), and say so.
        let mut end = text[..room.min(text.len())]
            .rfind('\n')
            .map_or(0, |i| i + 1);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        b.pending.push_str(&text[..end]);
        b.pending.push_str(&format!(
            "[driftless: output cut at {} MiB; the rest of this run's output is not kept]\n",
            OUTPUT_MAX / (1024 * 1024)
        ));
        b.kept = OUTPUT_MAX;
        b.cut = true;
    }

    /// Write what came since the last write, as the next chunk.
    async fn write(&self) {
        let _turn = self.0.writing.lock().await;
        let (seq, text) = {
            let Ok(mut b) = self.0.buf.lock() else {
                return;
            };
            if b.pending.is_empty() {
                return;
            }
            b.seq += 1;
            (b.seq, std::mem::take(&mut b.pending))
        };
        if let Err(e) = self.0.store.append_output(self.0.run_id, seq, &text).await {
            tracing::error!(target = %self.0.target, run = self.0.run_id, error = %e,
                "cannot keep a part of the run's output; the run goes on");
        }
    }

    /// The run is about to be recorded: everything it printed is written
    /// first.
    pub(super) async fn finish(&self) {
        self.write().await;
    }
}
