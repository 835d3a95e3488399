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
use crate::model::Trigger;
use crate::queue::{Queue, Request};
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

/// When a target is due (Unix ms): `interval` plus this cycle's jitter
/// after its last run started, or at once if it never ran.
pub fn due_at(interval: Duration, jitter: Duration, last_run_at: Option<i64>, now: i64) -> i64 {
    match last_run_at {
        Some(last) => last + (interval + jitter).as_millis() as i64,
        None => now,
    }
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
    /// forget old delivery ids, long-closed pull requests and the history
    /// older than `[history] keep`.
    pub async fn once(&mut self) -> Result<usize, StoreError> {
        if self.last_prune.is_none_or(|t| t.elapsed() > PRUNE_EVERY) {
            self.queue.prune_deliveries().await?;
            self.queue.store().prune_pull_requests().await?;
            let pruned = self
                .queue
                .store()
                .prune_history(self.settings.history.keep)
                .await?;
            if pruned != Default::default() {
                info!(
                    runs = pruned.runs,
                    jobs = pruned.jobs,
                    notifications = pruned.notifications,
                    statuses = pruned.statuses,
                    "pruned history older than [history] keep"
                );
            }
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
            let j = *self
                .jitter
                .entry(t.name.clone())
                .or_insert_with(|| jitter(t.interval));
            let due = due_at(t.interval, j, states.get(&t.name).copied().flatten(), now);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_a_tenth_of_the_interval_and_a_minute() {
        for (interval, max) in [
            (Duration::from_secs(1), Duration::from_millis(100)),
            (Duration::from_secs(300), Duration::from_secs(30)),
            (Duration::from_secs(3600), Duration::from_secs(60)),
        ] {
            let samples: Vec<Duration> = (0..2000).map(|_| jitter(interval)).collect();
            assert!(samples.iter().all(|j| *j <= max), "{interval:?}");
            // It spreads: not always the same value.
            assert!(samples.iter().any(|j| *j != samples[0]), "{interval:?}");
        }
        assert_eq!(jitter(Duration::from_millis(5)), Duration::ZERO);
    }

    #[test]
    fn a_target_is_due_an_interval_and_its_jitter_after_its_last_run() {
        let i = Duration::from_secs(60);
        let j = Duration::from_secs(3);
        assert_eq!(due_at(i, j, None, 1_000), 1_000, "never run: at once");
        assert_eq!(due_at(i, j, Some(10_000), 20_000), 73_000);
    }

    async fn setup(toml: &str) -> (tempfile::TempDir, Scheduler, Queue) {
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = crate::config::from_toml_str(
            &format!("state_dir = \"{}\"\n{toml}", dir.path().display()),
            std::path::Path::new("t.toml"),
            dir.path(),
        )
        .expect("settings");
        let store = crate::store::Store::open(&settings.database_path())
            .await
            .expect("store");
        let names: Vec<(&str, &str)> = settings
            .targets
            .iter()
            .map(|t| (t.name.as_str(), "exec"))
            .collect();
        store.register_targets(&names).await.expect("register");
        let queue = Queue::new(store);
        let sched = Scheduler::new(Arc::new(settings), queue.clone(), Default::default());
        (dir, sched, queue)
    }

    #[tokio::test]
    async fn paused_and_busy_targets_are_skipped_and_due_ones_queued_once() {
        let toml = ["a", "b", "c"]
            .iter()
            .map(|n| {
                format!(
                    "[[targets]]\nname = \"{n}\"\nrepo = \"https://h/o/r\"\ninterval = \"1h\"\n[targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n"
                )
            })
            .collect::<String>();
        let (_dir, mut sched, queue) = setup(&toml).await;
        queue
            .store()
            .set_paused("b", Some("test"))
            .await
            .expect("pause");
        // Never run: a and c are due at once; b is paused.
        assert_eq!(sched.once().await.expect("once"), 2);
        let queued: Vec<String> = queue
            .activity()
            .await
            .expect("activity")
            .into_iter()
            .filter(|a| a.queued > 0)
            .map(|a| a.target)
            .collect();
        assert_eq!(queued, ["a", "c"]);
        // Already queued: not queued again.
        assert_eq!(sched.once().await.expect("once"), 0);
    }
}
