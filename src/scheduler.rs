//! The fallback interval scheduler, with jitter.
//!
//! A target with nothing queued or running, whose last run started more than
//! `interval` (plus a per-cycle jitter of up to a tenth of the interval, at
//! most a minute) ago, gets an `interval` job. It also sweeps expired leases
//! back into the queue. It only enqueues: it never runs a tick itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tracing::{error, info, warn};

use crate::config::Settings;
use crate::queue::{Queue, Request, Trigger};
use crate::store::{StoreError, now_ms};

/// How often the scheduler looks.
const PERIOD: Duration = Duration::from_secs(1);
/// How often delivery ids older than a week are forgotten.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// A random delay in `[0, min(interval/10, 60s)]` so targets with the same
/// interval do not all fire at once.
pub fn jitter(interval: Duration) -> Duration {
    let max = (interval / 10).min(Duration::from_secs(60));
    let ms = max.as_millis() as u64;
    Duration::from_millis(if ms == 0 { 0 } else { fastrand::u64(0..=ms) })
}

pub struct Scheduler {
    settings: Arc<Settings>,
    queue: Queue,
    wake: Arc<Notify>,
    jitter: HashMap<String, Duration>,
    last_prune: Option<std::time::Instant>,
}

impl Scheduler {
    pub fn new(settings: Arc<Settings>, queue: Queue, wake: Arc<Notify>) -> Self {
        Scheduler {
            settings,
            queue,
            wake,
            jitter: HashMap::new(),
            last_prune: None,
        }
    }

    /// Loop until `shutdown` turns true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.once().await {
                error!(error = %e, "scheduler cannot read or write the queue");
            }
            tokio::select! {
                _ = tokio::time::sleep(PERIOD) => {}
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }

    /// One pass: recover expired leases, enqueue due targets, now and then
    /// forget old delivery ids.
    pub async fn once(&mut self) -> Result<usize, StoreError> {
        if self.last_prune.is_none_or(|t| t.elapsed() > PRUNE_EVERY) {
            self.queue.prune_deliveries().await?;
            self.last_prune = Some(std::time::Instant::now());
        }
        let recovered = self.queue.recover_expired().await?;
        if !recovered.is_empty() {
            warn!(jobs = ?recovered, "requeued jobs whose process died mid-tick");
            self.wake.notify_waiters();
        }
        let active: std::collections::HashSet<String> = self
            .queue
            .activity()
            .await?
            .into_iter()
            .map(|a| a.target)
            .collect();
        let states: HashMap<String, Option<i64>> = self
            .queue
            .store()
            .target_states()
            .await?
            .into_iter()
            .map(|s| (s.name, s.last_run_at))
            .collect();
        let paused: std::collections::HashSet<String> =
            self.queue.store().paused().await?.into_iter().collect();
        let now = now_ms();
        let mut queued = 0;
        for t in &self.settings.targets {
            if active.contains(&t.name) || paused.contains(&t.name) {
                continue;
            }
            // Never-run targets are due at once.
            let due = match states.get(&t.name).copied().flatten() {
                Some(last) => {
                    let j = *self
                        .jitter
                        .entry(t.name.clone())
                        .or_insert_with(|| jitter(t.interval));
                    last + (t.interval + j).as_millis() as i64
                }
                None => now,
            };
            if now >= due {
                self.queue
                    .enqueue(&Request {
                        target: t.name.clone(),
                        trigger: Trigger::Interval,
                        sha: None,
                        delivery_id: None,
                        receiver: None,
                    })
                    .await?;
                info!(target = %t.name, "interval tick queued");
                self.jitter.insert(t.name.clone(), jitter(t.interval));
                queued += 1;
            }
        }
        if queued > 0 {
            self.wake.notify_waiters();
        }
        Ok(queued)
    }
}
