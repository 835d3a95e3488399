//! `driftless serve`: the worker pool, the scheduler and the HTTP listener.
//!
//! Workers claim jobs from the queue and hand them to the tick; a job whose
//! target is locked elsewhere stays queued (or, if only the interval asked for
//! it, is skipped). On SIGTERM/SIGINT the daemon stops claiming, lets running
//! ticks finish for a grace period and exits; a tick cut short is requeued by
//! the next start (its lease expires). This module wires parts together; it
//! holds no reconcile logic of its own.

use crate::queue::{BUSY_RETRY, ERROR_RETRY, JobEnd};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tracing::{error, info, warn};

use crate::app::Health;
use crate::http;
use crate::queue::Job;
use crate::scheduler::Scheduler;
use crate::tick::{Previewed, Reconciler, Ticked};

/// When the queue is empty, how often a worker looks again (a notification
/// usually wakes it sooner).
const IDLE_POLL: Duration = Duration::from_millis(500);
/// How often the daemon looks for jobs left running by a dead process.
const REAP_PERIOD: Duration = Duration::from_secs(2);
/// How long such a job must have gone without a heartbeat.
const REAP_QUIET: Duration = Duration::from_secs(5);
/// How long running ticks get to finish on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("cannot listen on {addr}: {reason}")]
    Listen { addr: String, reason: String },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Lock(#[from] crate::lock::LockError),
}

/// Run the daemon on `[server] listen` until a shutdown signal.
pub async fn serve(rec: Reconciler) -> Result<(), DaemonError> {
    let daemon = Daemon::bind(rec).await?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        info!("shutdown requested: finishing running ticks");
        let _ = tx.send(true);
    });
    daemon.run_until(rx).await
}

/// A daemon ready to run: its state directory taken (one daemon per
/// directory, until it stops), jobs of vanished targets closed, jobs a dead
/// process left running requeued, and its listener bound.
pub struct Daemon {
    rec: Reconciler,
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    state: http::AppState,
    health: Arc<Health>,
    wake: Arc<Notify>,
    _serving: crate::lock::ServeLock,
    /// On PostgreSQL: other instances see this one alive (its previews).
    _alive: crate::store::Liveness,
}

impl Daemon {
    /// Bind `[server] listen`, then [`Daemon::build`].
    pub async fn bind(rec: Reconciler) -> Result<Daemon, DaemonError> {
        let listen = rec.app().settings().server.listen;
        let listener =
            tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|e| DaemonError::Listen {
                    addr: listen.to_string(),
                    reason: e.to_string(),
                })?;
        Daemon::build(rec, listener).await
    }

    /// A daemon serving on `listener`, which may be bound to port 0 (ask
    /// [`Daemon::port`] which one it got).
    pub async fn build(
        rec: Reconciler,
        listener: tokio::net::TcpListener,
    ) -> Result<Daemon, DaemonError> {
        let settings = rec.app().settings().clone();
        let mut serving = crate::lock::ServeLock::try_acquire(&settings.state_dir)?;
        let addr = listener.local_addr().map_err(|e| DaemonError::Listen {
            addr: settings.server.listen.to_string(),
            reason: e.to_string(),
        })?;
        serving
            .record_addr(addr)
            .map_err(|e| crate::lock::LockError::Io {
                path: settings.state_dir.join("serve.lock"),
                reason: e.to_string(),
            })?;
        let names = target_names(&rec);
        let dropped = rec.app().queue.drop_unknown(&names).await?;
        if dropped > 0 {
            warn!(
                jobs = dropped,
                "closed queued jobs of targets no longer in the configuration"
            );
        }
        // The order jobs are claimed in: each target after the targets it
        // depends on, as this configuration says.
        rec.app()
            .queue
            .set_dependencies(&crate::config::graph::ancestors(&settings.targets))
            .await?;
        recover_dead_jobs(&rec, Duration::ZERO).await?;
        // Only a serving daemon plans previews, and only one serves this
        // state directory: a preview left running is a dead process's (on
        // PostgreSQL, one whose instance holds no liveness lock).
        let alive = rec
            .app()
            .store
            .hold_liveness(rec.app().queue.owner())
            .await?;
        let previews = rec.app().store.requeue_previews().await?;
        if previews > 0 {
            warn!(
                previews,
                "requeued pull request previews a stopped daemon left unfinished"
            );
        }
        let health = Arc::new(Health::default());
        let wake = Arc::new(Notify::new());
        let state = http::AppState::new(rec.app().clone(), addr, health.clone(), wake.clone())?;
        Ok(Daemon {
            rec,
            listener,
            addr,
            state,
            health,
            wake,
            _serving: serving,
            _alive: alive,
        })
    }

    /// The address the daemon serves on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Serve, schedule and work until `shutdown` turns true; then stop
    /// claiming, give running ticks [`SHUTDOWN_GRACE`] and return.
    pub async fn run_until(self, shutdown: watch::Receiver<bool>) -> Result<(), DaemonError> {
        let Daemon {
            rec,
            listener,
            addr,
            state,
            health,
            wake,
            _serving,
            _alive,
        } = self;
        let settings = rec.app().settings().clone();
        info!(%addr, targets = settings.targets.len(), workers = settings.server.workers,
              state_dir = %settings.state_dir.display(), "driftless serving");
        if settings.server.page == crate::config::PageAccess::Token
            && !settings.tokens.iter().any(crate::auth::reads_anything)
        {
            warn!(
                "no [[tokens]] entry has a read scope, so nobody can open the page at /: \
                 add one (`driftless token new NAME`, scopes = [\"read\"]) or set \
                 [server] page = \"open\" on a private listener"
            );
        }

        let closing = state.closing.clone();
        let router = http::router(state);
        let server_settings = settings.server.clone();
        let http_shutdown = shutdown.clone();
        let server = tokio::spawn(async move {
            http::serve(listener, router, &server_settings, http_shutdown).await;
        });

        let scheduler = tokio::spawn(
            Scheduler::new(
                rec.app().live.clone(),
                rec.app().queue.clone(),
                wake.clone(),
            )
            .run(shutdown.clone()),
        );
        tokio::spawn(reaper(rec.clone(), wake.clone(), shutdown.clone()));
        tokio::spawn(set_refresher(rec.clone(), wake.clone(), shutdown.clone()));
        tokio::spawn(roller(rec.clone(), wake.clone(), shutdown.clone()));
        match crate::notify::outbox::Sender::new(
            &settings.notifiers,
            &settings.forges,
            rec.app().store.clone(),
        ) {
            Ok(sender) => {
                tokio::spawn(sender.run(rec.app().outbox_wake.clone(), shutdown.clone()));
            }
            // Notifications are the one soft failure: say so loudly, keep going.
            Err(e) => error!(error = %e, "notifications cannot be sent"),
        }
        let mut workers = Vec::new();
        for n in 0..settings.server.workers {
            workers.push(tokio::spawn(worker(
                n,
                rec.clone(),
                wake.clone(),
                health.clone(),
                shutdown.clone(),
            )));
        }

        let previewer = tokio::spawn(previewer(rec.clone(), shutdown.clone()));

        let mut done = shutdown.clone();
        let _ = done.wait_for(|s| *s).await;
        closing.send_replace(true);
        let _ = scheduler.await;
        workers.push(previewer);
        let all = futures_join(workers);
        if tokio::time::timeout(SHUTDOWN_GRACE, all).await.is_err() {
            warn!(
                "running ticks did not finish within {}s; their jobs are requeued at the next start",
                SHUTDOWN_GRACE.as_secs()
            );
        }
        let _ = server.await;
        info!("driftless stopped");
        Ok(())
    }
}

fn target_names(rec: &Reconciler) -> Vec<String> {
    rec.app()
        .settings()
        .targets
        .iter()
        .map(|t| t.name.clone())
        .collect()
}

/// `[[target_sets]]`: every set's directories listed at start (the
/// members the database listed are used until then), again when a push
/// reaches a set's branch (`App::sets_wake`) and at least once per set's
/// interval (sharing that round's fetch with its members). The workers are
/// woken when a member was added (it has a job queued).
async fn set_refresher(rec: Reconciler, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    let settings = rec.app().settings();
    let Some(period) = settings.target_sets.iter().map(|s| s.sample.interval).min() else {
        return;
    };
    let mut since = std::time::Instant::now();
    loop {
        if rec.refresh_sets(since, true).await > 0 {
            wake.notify_waiters();
        }
        let pushed = tokio::select! {
            _ = rec.app().sets_wake.notified() => true,
            _ = tokio::time::sleep(period) => false,
            _ = shutdown.changed() => return,
        };
        let now = std::time::Instant::now();
        since = if pushed {
            now
        } else {
            now.checked_sub(period).unwrap_or(now)
        };
    }
}

/// How often rollouts in waves are looked at.
const ROLLOUT_PERIOD: Duration = Duration::from_secs(1);

/// Rollouts in waves, moved on every [`ROLLOUT_PERIOD`] while any is
/// configured (read again each time: a reload may add one). The workers
/// are woken after each look: a wave may have queued jobs.
async fn roller(rec: Reconciler, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    loop {
        if !rec.app().settings().rollout_units().is_empty() {
            rec.advance_rollouts().await;
            wake.notify_waiters();
        }
        tokio::select! {
            _ = tokio::time::sleep(ROLLOUT_PERIOD) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// A job marked running whose target lock nobody holds belongs to a process
/// that died: requeue it now rather than waiting for its lease to expire. A
/// held lock means its process (or a command it left behind) is still at
/// work: leave the job alone. Jobs of this process are never touched, and a
/// job must have been quiet for `min_quiet` (live owners heartbeat), which
/// covers the instants between marking a job running and taking the lock.
///
/// On PostgreSQL, other instances' jobs run on other hosts, where a free
/// file lock here says nothing: a job is dead there only once its lease
/// has run out by the server's clock (its keepers stop its commands before
/// that).
async fn recover_dead_jobs(engine: &Reconciler, min_quiet: Duration) -> Result<bool, DaemonError> {
    if engine.app().store.kind() == crate::store::Kind::Postgres {
        let dead = engine.app().queue.recover_expired().await?;
        if !dead.is_empty() {
            warn!(jobs = ?dead, "requeued jobs whose lease ran out (their instance died or lost the database)");
        }
        return Ok(!dead.is_empty());
    }
    let locks = engine.app().settings().locks_dir();
    let mut dead = Vec::new();
    for job in engine.app().queue.running().await? {
        if job.owner == engine.app().queue.owner() || job.quiet_for < min_quiet {
            continue;
        }
        if crate::lock::TargetLock::try_acquire(&locks, &job.target).is_ok() {
            dead.push(job.id);
        }
    }
    if dead.is_empty() {
        return Ok(false);
    }
    engine.app().queue.recover(&dead).await?;
    warn!(jobs = ?dead, "requeued jobs whose process died mid-tick");
    Ok(true)
}

/// Every few seconds, look for jobs left running by a dead process.
async fn reaper(engine: Reconciler, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    loop {
        nap(REAP_PERIOD, &mut shutdown).await;
        if *shutdown.borrow() {
            return;
        }
        match recover_dead_jobs(&engine, REAP_QUIET).await {
            Ok(true) => wake.notify_waiters(),
            Ok(false) => {}
            Err(e) => error!(error = %e, "cannot look for interrupted jobs"),
        }
        // On PostgreSQL other instances die while this one lives: their
        // previews are taken over here.
        if engine.app().store.kind() == crate::store::Kind::Postgres {
            match engine.app().store.requeue_previews().await {
                Ok(0) => {}
                Ok(n) => {
                    warn!(
                        previews = n,
                        "requeued pull request previews an instance that is gone left unfinished"
                    );
                    engine.app().previews_wake.notify_one();
                }
                Err(e) => error!(error = %e, "cannot look for interrupted previews"),
            }
        }
    }
}

/// Sleep `d`, or less when shutdown is asked.
async fn nap(d: Duration, shutdown: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = shutdown.changed() => {}
    }
}

async fn futures_join(handles: Vec<tokio::task::JoinHandle<()>>) {
    for h in handles {
        let _ = h.await;
    }
}

async fn worker(
    n: usize,
    engine: Reconciler,
    wake: Arc<Notify>,
    health: Arc<Health>,
    mut shutdown: watch::Receiver<bool>,
) {
    // The target this worker ran last, when it is looking again right
    // after: a job may be queued for it that idle workers passed over
    // while it ran (a delivery wakes none for a job behind a running one).
    let mut just_ran: Option<String> = None;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let queue = &engine.app().queue;
        let claimed = if just_ran.is_some() {
            queue.claim_next().await
        } else {
            queue.claim().await
        };
        match claimed {
            Ok(Some(job)) => {
                health.store_failing.store(false, Ordering::Relaxed);
                // Taking another target's job, this worker leaves the one
                // behind its last to another worker: wake one for it.
                if just_ran.take().is_some_and(|t| t != job.target) {
                    wake.notify_one();
                }
                process(n, &engine, &job, &health).await;
                just_ran = Some(job.target.clone());
            }
            Ok(None) => {
                just_ran = None;
                health.store_failing.store(false, Ordering::Relaxed);
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep(IDLE_POLL) => {}
                    _ = shutdown.changed() => {}
                }
            }
            Err(e) => {
                if just_ran.take().is_some() {
                    wake.notify_one();
                }
                health.store_failing.store(true, Ordering::Relaxed);
                error!(worker = n, error = %e, "cannot claim a job");
                nap(ERROR_RETRY, &mut shutdown).await;
            }
        }
    }
}

/// The one preview worker: pull request previews, one at a time, beside
/// the apply workers and never holding a target's apply lock (a preview
/// neither waits for an apply nor blocks one).
async fn previewer(engine: Reconciler, mut shutdown: watch::Receiver<bool>) {
    let store = engine.app().store.clone();
    let wake = engine.app().previews_wake.clone();
    loop {
        if *shutdown.borrow() {
            return;
        }
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match store.claim_preview(engine.app().queue.owner()).await {
            Ok(Some(job)) => match engine.preview(&job).await {
                Ok(Previewed::Done) => {}
                Ok(Previewed::Busy) => {
                    info!(target = %job.preview.target, "preview checkout busy: preview queued again");
                    if let Err(e) = store.requeue_preview(job.preview.id).await {
                        error!(error = %e, "cannot queue a preview again");
                    }
                    nap(BUSY_RETRY, &mut shutdown).await;
                }
                Err(e) => {
                    error!(target = %job.preview.target, number = job.pull.number, error = %e,
                           "preview stopped; it is planned again at the next start");
                    nap(ERROR_RETRY, &mut shutdown).await;
                }
            },
            Ok(None) => {
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep(IDLE_POLL) => {}
                    _ = shutdown.changed() => {}
                }
            }
            Err(e) => {
                error!(error = %e, "cannot claim a preview");
                nap(ERROR_RETRY, &mut shutdown).await;
            }
        }
    }
}

async fn process(n: usize, engine: &Reconciler, job: &Job, health: &Health) {
    let q = &engine.app().queue;
    if engine.app().target(&job.target).is_none() {
        warn!(target = %job.target, job = job.id, "a job of a target no longer configured: closed");
        if let Err(e) = q.end(job.id, JobEnd::Unknown).await {
            health.store_failing.store(true, Ordering::Relaxed);
            error!(worker = n, job = job.id, error = %e, "cannot close the job");
        }
        return;
    }
    let end = match engine.run_job(job).await {
        // The tick closed the job itself.
        Ok(Ticked::Ran { .. } | Ticked::Unaffected { .. }) => None,
        Ok(Ticked::Paused) => Some(JobEnd::Paused),
        Ok(Ticked::Waiting { again, .. }) => Some(JobEnd::Waiting(again)),
        Ok(Ticked::Busy) => {
            info!(target = %job.target, interval_only = job.interval_only(),
                  "target busy elsewhere: an interval tick is skipped, anything else stays queued");
            Some(JobEnd::Busy {
                interval_only: job.interval_only(),
            })
        }
        Err(e) => {
            error!(worker = n, target = %job.target, job = job.id, error = %e, "tick stopped");
            Some(JobEnd::Stopped)
        }
    };
    let result = match end {
        Some(end) => q.end(job.id, end).await,
        None => Ok(()),
    };
    if let Err(e) = result {
        health.store_failing.store(true, Ordering::Relaxed);
        error!(worker = n, target = %job.target, job = job.id, error = %e,
               "cannot record the job's end; its lease will expire and it will run again");
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the daemon");
                let _ = ctrl_c.await;
            }
        }
    }
}
