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
use tracing::{debug, error, info, warn};

use crate::config::Live;
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
    /// The settings in force, read again each pass: `[[target_sets]]`
    /// members come and go.
    live: Live,
    queue: Queue,
    wake: Arc<Notify>,
    jitter: HashMap<String, Duration>,
    /// When each target last ran, as last read (a lower bound).
    last_run: Option<HashMap<String, Option<i64>>>,
    /// When each target of the settings in force is due by those readings.
    dues: Option<Dues>,
    last_prune: Option<std::time::Instant>,
}

/// When each target is due (Unix ms; [`NEVER_RAN`] for at once), in the
/// order of the `targets` of the settings it was made for, and whether the
/// target has change windows: what a pass compares, one number a target,
/// without looking a name up or reading a target's settings (at 10,000
/// targets a pass that did both took 1.6 µs a target, most of it waiting
/// on memory). Made again when other settings come into force; kept up to
/// date as readings and jitters change.
struct Dues {
    settings: Arc<crate::config::Settings>,
    at: Vec<i64>,
    windowed: Vec<bool>,
}

/// A target that never ran is due at once.
const NEVER_RAN: i64 = i64::MIN;

impl Dues {
    fn new(
        settings: Arc<crate::config::Settings>,
        jitter: &mut HashMap<String, Duration>,
        known: &HashMap<String, Option<i64>>,
    ) -> Dues {
        let (mut at, mut windowed) = (Vec::new(), Vec::new());
        for t in &settings.targets {
            // Looked up before it is made: no name copied a target a pass.
            let j = match jitter.get(&t.name) {
                Some(j) => *j,
                None => *jitter
                    .entry(t.name.clone())
                    .or_insert_with(|| self::jitter(t.interval)),
            };
            at.push(due_from(
                t.interval,
                j,
                known.get(&t.name).copied().flatten(),
            ));
            windowed.push(!t.windows.is_empty());
        }
        Dues {
            settings,
            at,
            windowed,
        }
    }
}

/// [`due_at`] without the clock: [`NEVER_RAN`] for a target that never ran.
fn due_from(interval: Duration, jitter: Duration, last_run_at: Option<i64>) -> i64 {
    match last_run_at {
        Some(last) => due_at(interval, jitter, Some(last), 0),
        None => NEVER_RAN,
    }
}

impl Scheduler {
    pub fn new(live: Live, queue: Queue, wake: Arc<Notify>) -> Self {
        Scheduler {
            live,
            queue,
            wake,
            jitter: HashMap::new(),
            last_run: None,
            dues: None,
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
        let settings = self.live.get();
        if self.last_prune.is_none_or(|t| t.elapsed() > PRUNE_EVERY) {
            self.queue.prune_deliveries().await?;
            self.queue.store().prune_pull_requests().await?;
            let pruned = self
                .queue
                .store()
                .prune_history(settings.history.keep)
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
        // Who may be due, from the last run times read before: those only
        // move forward, so a target due by them may be due, and one not due
        // by them is not. Only the candidates are read again (a thousand
        // targets cost a thousand comparisons a second, not a thousand rows).
        let now = now_ms();
        if self.last_run.is_none() {
            self.last_run = Some(
                self.queue
                    .store()
                    .last_run_times()
                    .await?
                    .into_iter()
                    .collect(),
            );
        }
        let known = self.last_run.get_or_insert_with(HashMap::new);
        if !self
            .dues
            .as_ref()
            .is_some_and(|d| Arc::ptr_eq(&d.settings, &settings))
        {
            self.dues = Some(Dues::new(settings.clone(), &mut self.jitter, known));
        }
        let Some(dues) = self.dues.as_mut() else {
            return Ok(0);
        };
        // In the order of the list, and where each is in it by name.
        let (mut order, mut candidates) = (Vec::new(), HashMap::new());
        for (i, due) in dues.at.iter().enumerate() {
            // Outside its change window the fallback interval does not
            // apply (a push's job waits queued instead); `tick::window`
            // says which targets' intervals go on.
            if now >= *due
                && let Some(t) = settings.targets.get(i)
                && !(dues.windowed[i] && crate::tick::interval_waits(t))
            {
                order.push(t.name.to_string());
                candidates.insert(t.name.as_str(), i);
            }
        }
        if candidates.is_empty() {
            return Ok(0);
        }
        // Every target due in this pass is queued in one write (one
        // transaction, one fsync), not one each.
        let (mut due, mut intervals) = (Vec::new(), HashMap::new());
        for c in self.queue.store().schedule_candidates(&order).await? {
            known.insert(c.name.clone(), c.last_run_at);
            let Some(&i) = candidates.get(c.name.as_str()) else {
                continue;
            };
            let Some(t) = settings.targets.get(i) else {
                continue;
            };
            let j = self.jitter.get(&t.name).copied().unwrap_or_default();
            dues.at[i] = due_from(t.interval, j, c.last_run_at);
            if c.active || c.paused {
                continue;
            }
            if now >= due_at(t.interval, j, c.last_run_at, now) {
                let req = Request {
                    target: t.name.clone(),
                    trigger: Trigger::Interval,
                    sha: None,
                    delivery_id: None,
                    receiver: None,
                };
                due.push((req, c.last_run_at));
                intervals.insert(t.name.clone(), (t.interval, i));
            }
        }
        // Checked again in the write itself: another instance may have run
        // a target since it was read.
        let queued = self.queue.enqueue_due(due).await?;
        for name in &queued {
            debug!(target = %name, "interval tick queued");
            if let Some(&(interval, i)) = intervals.get(name) {
                let j = jitter(interval);
                self.jitter.insert(name.clone(), j);
                dues.at[i] = due_from(interval, j, Some(now));
            }
            // Not due again before it has run (its run moves this on).
            known.insert(name.clone(), Some(now));
        }
        let queued = queued.len();
        // One worker woken per job queued (waking them all for one job made
        // every idle worker look for it: most of a quiet daemon's reads).
        // A job no woken worker takes waits for a worker's next look.
        for _ in 0..queued.min(settings.server.workers.max(1)) {
            self.wake.notify_one();
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

    /// The targets with a job queued.
    async fn queued(queue: &Queue) -> Vec<String> {
        queue
            .activity()
            .await
            .expect("activity")
            .into_iter()
            .filter(|a| a.queued > 0)
            .map(|a| a.target)
            .collect()
    }

    fn settings_in(dir: &std::path::Path, toml: &str) -> crate::config::Settings {
        crate::config::from_toml_str(
            &format!("state_dir = \"{}\"\n{toml}", dir.display()),
            std::path::Path::new("t.toml"),
            dir,
        )
        .expect("settings")
    }

    fn exec_targets(names: &[&str]) -> String {
        names
            .iter()
            .map(|n| {
                format!(
                    "[[targets]]\nname = \"{n}\"\nrepo = \"https://h/o/r\"\ninterval = \"1h\"\n[targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n"
                )
            })
            .collect()
    }

    async fn setup(toml: &str) -> (tempfile::TempDir, Scheduler, Queue) {
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = settings_in(dir.path(), toml);
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
        let sched = Scheduler::new(Live::new(settings), queue.clone(), Default::default());
        (dir, sched, queue)
    }

    #[tokio::test]
    async fn paused_and_busy_targets_are_skipped_and_due_ones_queued_once() {
        let toml = exec_targets(&["a", "b", "c"]);
        let (_dir, mut sched, queue) = setup(&toml).await;
        queue
            .store()
            .set_paused("b", Some("test"))
            .await
            .expect("pause");
        // Never run: a and c are due at once; b is paused.
        assert_eq!(sched.once().await.expect("once"), 2);
        let queued = queued(&queue).await;
        assert_eq!(queued, ["a", "c"]);
        // Already queued: not queued again.
        assert_eq!(sched.once().await.expect("once"), 0);
    }

    /// Outside its change window a target's fallback interval does not
    /// apply: only the target whose window is open is queued, and a
    /// `detect` target (its ticks only plan) whatever its window.
    #[tokio::test]
    async fn a_target_outside_its_window_gets_no_interval_tick() {
        let toml = [("shut", "deny", ""), ("open", "allow", ""), ("watch", "deny", "policy = \"detect\"")]
            .iter()
            .map(|(n, which, policy)| {
                format!(
                    "[[targets]]\nname = \"{n}\"\nrepo = \"https://h/o/r\"\ninterval = \"1h\"\n{policy}\n\
                     windows = [{{ {which} = \"Mon-Sun 00:00-24:00 UTC\" }}]\n\
                     [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\nplan = [\"true\"]\n"
                )
            })
            .collect::<String>();
        let (_dir, mut sched, queue) = setup(&toml).await;
        assert_eq!(sched.once().await.expect("once"), 2);
        let queued = queued(&queue).await;
        assert_eq!(queued, ["open", "watch"]);
    }

    /// The scheduler remembers when targets last ran and reads again only
    /// those that may be due: a target that ran since (a push, the API) is
    /// not queued on an old reading.
    #[tokio::test]
    async fn a_target_that_ran_since_the_last_reading_is_not_queued() {
        let (_dir, mut sched, queue) = setup(&exec_targets(&["a"])).await;
        let two_hours_ago = now_ms() - 2 * 3600 * 1000;
        let q = sqlx::query("UPDATE targets SET last_run_at = $1").bind(two_hours_ago);
        queue.store().write_one("test", q).await.expect("update");
        // A push's job is queued: not queued again, but the reading (two
        // hours ago) is remembered.
        let job = queue
            .enqueue(&Request {
                target: "a".into(),
                trigger: Trigger::Webhook,
                sha: None,
                delivery_id: None,
                receiver: None,
            })
            .await
            .expect("enqueue");
        assert_eq!(sched.once().await.expect("once"), 0);
        // It ran now.
        let q = sqlx::query("UPDATE jobs SET state = 'done' WHERE id = $1").bind(job);
        queue.store().write_one("test", q).await.expect("done");
        let q = sqlx::query("UPDATE targets SET last_run_at = $1").bind(now_ms());
        queue.store().write_one("test", q).await.expect("update");
        assert_eq!(
            sched.once().await.expect("once"),
            0,
            "queued on an old reading"
        );
        // A scheduler starting afresh reads it again, and finds it not due.
        let (settings, q) = (sched.live.clone(), queue.clone());
        let mut fresh = Scheduler::new(settings, q, Default::default());
        assert_eq!(fresh.once().await.expect("once"), 0);
    }

    /// Other settings in force (a set's member came): each target keeps
    /// its own reading wherever it now stands in the list, and the new
    /// one is due at once.
    #[tokio::test]
    async fn settings_that_change_are_scheduled_as_they_stand() {
        let (dir, mut sched, queue) = setup(&exec_targets(&["a"])).await;
        assert_eq!(sched.once().await.expect("once"), 1);
        // `a` ran just now.
        let q = sqlx::query("UPDATE jobs SET state = 'done'");
        queue.store().write_one("test", q).await.expect("done");
        let q = sqlx::query("UPDATE targets SET last_run_at = $1").bind(now_ms());
        queue.store().write_one("test", q).await.expect("update");
        assert_eq!(sched.once().await.expect("once"), 0);
        // `b` comes first in the new list.
        let names: Vec<(&str, &str)> = vec![("b", "exec")];
        queue
            .store()
            .register_targets(&names)
            .await
            .expect("register");
        sched
            .live
            .replace(settings_in(dir.path(), &exec_targets(&["b", "a"])));
        assert_eq!(sched.once().await.expect("once"), 1);
        assert_eq!(queued(&queue).await, ["b"]);
        assert_eq!(sched.once().await.expect("once"), 0, "b queued once");
        // Gone from the settings: `b`, done and due again at once by its
        // reading (it never ran), is not queued.
        let q = sqlx::query("UPDATE jobs SET state = 'done'");
        queue.store().write_one("test", q).await.expect("done");
        sched
            .live
            .replace(settings_in(dir.path(), &exec_targets(&["a"])));
        assert_eq!(sched.once().await.expect("once"), 0);
        assert!(queued(&queue).await.is_empty());
    }
}
