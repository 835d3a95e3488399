//! The durable job queue: what should be reconciled, in the state database
//! (SQLite, or PostgreSQL shared by several instances).
//!
//! A request (interval, manual, webhook, cli) becomes a row before anyone is
//! told it was accepted. At most one *queued* job per target — a newer request
//! folds into it (its SHA wins, triggers and delivery ids are kept) — and at
//! most one *running* job per target, both enforced by unique indexes rather
//! than by a mutex. Workers claim a job with a lease and keep it alive with a
//! heartbeat; a job whose lease expired (its process died) goes back to the
//! queue and the run it left unfinished is marked `interrupted`. The queue
//! decides order, never what a backend does.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::FromRow;

use crate::model::{BoxFuture, Trigger};
use crate::store::Kind;
use crate::store::db::{JsonText, PG_NOW_MS, is_postgres, json_field};
use crate::store::previews::{self, PullEvent};
use crate::store::statuses::{self, NewStatus};
use crate::store::{Batch, BatchTx, Store, StoreError, direct, now_ms};

/// How long a claim lasts without a heartbeat.
pub const LEASE: Duration = Duration::from_secs(30);
/// A job whose runs driftless died during this many times is not run
/// again: its next claim records a failed run that says so, and owners are
/// told (`tick`), so a job that takes driftless down cannot do it forever
/// and is never closed without a word.
pub const MAX_ATTEMPTS: i64 = 5;

/// The message of a run left open when its process died; counted by
/// [`Queue::interruptions`].
pub const INTERRUPTED: &str =
    "driftless stopped during this run (the process died or was killed); the job was queued again";

/// A running job's claim, renewed by each process that must stop when it
/// is lost: the worker running the job and, on PostgreSQL, the keeper of
/// every command the job starts (`keeper`), which outlives a killed
/// instance for as long as its command does. Nothing in it is secret.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Lease {
    pub job: i64,
    pub owner: String,
    pub lease_ms: i64,
}

impl Lease {
    /// How long a renewal lasts.
    pub fn duration(&self) -> Duration {
        Duration::from_millis(self.lease_ms.max(0) as u64)
    }

    /// Extend the claim from now. `false` when the job is no longer this
    /// owner's — on PostgreSQL, also when the claim already ran out by the
    /// server's clock: its holders stopped before that (they stop a margin
    /// ahead of it by their own clocks), and another instance may be taking
    /// the job over.
    pub async fn renew(&self, conn: &mut crate::store::db::Conn) -> Result<bool, sqlx::Error> {
        let now = now_ms();
        let sql = if is_postgres(conn) {
            format!(
                "UPDATE jobs SET lease_until = {PG_NOW_MS} + $3, updated_at = $4
                 WHERE id = $1 AND state = 'running' AND lease_owner = $2
                   AND lease_until >= {PG_NOW_MS}"
            )
        } else {
            "UPDATE jobs SET lease_until = $4 + $3, updated_at = $4
             WHERE id = $1 AND state = 'running' AND lease_owner = $2"
                .to_string()
        };
        let r = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(self.job)
            .bind(&self.owner)
            .bind(self.lease_ms)
            .bind(now)
            .execute(conn)
            .await?;
        Ok(r.rows_affected() == 1)
    }
}

/// A request to reconcile one target.
#[derive(Debug, Clone)]
pub struct Request {
    pub target: String,
    pub trigger: Trigger,
    pub sha: Option<String>,
    pub delivery_id: Option<String>,
    /// The webhook receiver the request came through.
    pub receiver: Option<String>,
}

/// What became of a webhook delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// Its delivery id was seen before: nothing was queued.
    Duplicate,
    /// Recorded.
    Queued {
        /// The jobs (target, job id) now holding its requests.
        jobs: Vec<(String, i64)>,
        /// The targets among them that are paused: their jobs wait.
        paused: Vec<String>,
        /// Queued previews a closed pull request dropped.
        dropped_previews: u64,
        /// A request made a new job (rather than folding into a queued
        /// one) that no running job holds back: a worker has something
        /// new to claim.
        new_job: bool,
    },
}

/// A job `j` that may be claimed now (`$1` the time): queued, due, its
/// target not paused, none of its target's jobs running, no job of a
/// target it depends on (directly or not: `target_deps`) queued or
/// running — a chain converges in order, and waits across a restart, since
/// the jobs are rows. Each test is an
/// index lookup per queued job (a daemon with a thousand targets claims
/// without reading a thousand rows). Jobs of targets no longer configured
/// are closed when the daemon starts (`drop_unknown`), and one claimed all
/// the same is closed by the worker.
const RUNNABLE: &str = "j.state = 'queued' AND j.not_before <= $1
      AND NOT EXISTS (SELECT 1 FROM targets t WHERE t.name = j.target AND t.paused_at IS NOT NULL)
      AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.target = j.target AND r.state = 'running')
      AND NOT EXISTS (SELECT 1 FROM target_deps d WHERE d.target = j.target
            AND (EXISTS (SELECT 1 FROM jobs q WHERE q.target = d.ancestor AND q.state = 'queued')
              OR EXISTS (SELECT 1 FROM jobs q WHERE q.target = d.ancestor AND q.state = 'running')))";

json_field!(Vec<Trigger>, Vec<String>);

/// How long delivery ids are remembered for dedupe.
pub const DELIVERY_MEMORY: Duration = Duration::from_secs(7 * 24 * 3600);

#[derive(Debug, Clone, FromRow)]
struct JobRow {
    id: i64,
    target: String,
    #[sqlx(try_from = "JsonText")]
    triggers: Vec<Trigger>,
    requested_sha: Option<String>,
    #[sqlx(try_from = "JsonText")]
    delivery_ids: Vec<String>,
    attempts: i64,
    receiver: Option<String>,
}

/// A claimed job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: i64,
    pub target: String,
    /// In arrival order, each once.
    pub triggers: Vec<Trigger>,
    pub requested_sha: Option<String>,
    /// The deliveries folded into it, in arrival order: the first 99 and
    /// the newest (a burst of thousands folds into one job; the run names
    /// the newest).
    pub delivery_ids: Vec<String>,
    pub attempts: i64,
    pub receiver: Option<String>,
    /// When the statement that claimed it (and started its lease) was
    /// sent, by this process's monotonic clock: its lease runs out no
    /// sooner than a lease after this.
    pub leased_at: std::time::Instant,
}

impl Job {
    fn from_row(r: JobRow) -> Job {
        Job {
            leased_at: std::time::Instant::now(),
            id: r.id,
            target: r.target,
            triggers: r.triggers,
            requested_sha: r.requested_sha,
            delivery_ids: r.delivery_ids,
            attempts: r.attempts,
            receiver: r.receiver,
        }
    }

    /// The triggers as recorded on a run: `webhook,interval`.
    pub fn trigger_label(&self) -> String {
        if self.triggers.is_empty() {
            "unknown".into()
        } else {
            let names: Vec<&str> = self.triggers.iter().map(|t| t.as_str()).collect();
            names.join(",")
        }
    }

    /// Only the fallback interval asked for this job.
    pub fn interval_only(&self) -> bool {
        self.triggers.iter().all(|t| *t == Trigger::Interval)
    }

    /// Only pushes (and resumes) asked for this job: whether it has anything
    /// to do is decided by git, from the target's path at the commit last
    /// tried against the branch tip. The interval, the API and the CLI
    /// always run.
    pub fn routed_by_git(&self) -> bool {
        !self.triggers.is_empty()
            && self
                .triggers
                .iter()
                .all(|t| matches!(t, Trigger::Webhook | Trigger::Resume))
    }
}

/// A job marked running, as seen by someone checking whether its owner lives.
#[derive(Debug, Clone)]
pub struct RunningJob {
    pub id: i64,
    pub target: String,
    pub owner: String,
    /// Time since the job's row last changed (claim or heartbeat).
    pub quiet_for: Duration,
}

/// Counts of queued and running jobs for one target.
#[derive(Debug, Clone, Default, FromRow, Serialize)]
pub struct Activity {
    pub target: String,
    pub queued: i64,
    pub running: i64,
}

/// The queue, bound to one owner identity (this process).
#[derive(Clone, Debug)]
pub struct Queue {
    store: Store,
    owner: String,
    lease: Duration,
}

impl Queue {
    pub fn new(store: Store) -> Queue {
        let owner = format!("pid{}-{:08x}", std::process::id(), fastrand::u32(..));
        Queue {
            store,
            owner,
            lease: LEASE,
        }
    }

    /// The same queue, its claims lasting `lease` without a renewal
    /// (`[database] lease`).
    pub fn with_lease(mut self, lease: Duration) -> Queue {
        self.lease = lease;
        self
    }

    /// How long a claim lasts without a renewal.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// What a [`Lease`] holder renews this job's claim with.
    pub fn lease_of(&self, job_id: i64) -> Lease {
        Lease {
            job: job_id,
            owner: self.owner.clone(),
            lease_ms: self.lease.as_millis() as i64,
        }
    }

    /// Where a lease is written and judged from: the local clock (`$n`, the
    /// time bound) on SQLite, the server's on PostgreSQL (`PG_NOW_MS`).
    fn clock(&self, bound: &'static str) -> &'static str {
        match self.store.kind() {
            Kind::Sqlite => bound,
            Kind::Postgres => PG_NOW_MS,
        }
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Add a request, folding it into the target's queued job if there is one.
    /// Returns the queued job's id. When this returns, the request is on disk.
    /// A target was resumed: queue a job that applies it if its branch
    /// moved while it was paused (git decides, as for a push; pushes that
    /// arrived meanwhile are already queued).
    pub async fn resumed(&self, target: &str) -> Result<i64, StoreError> {
        self.enqueue(&Request {
            target: target.to_string(),
            trigger: Trigger::Resume,
            sha: None,
            delivery_id: None,
            receiver: None,
        })
        .await
    }

    /// Committed with the other small writes waiting at the same moment
    /// (`Store::batched`: requests arriving together are one statement),
    /// before this returns.
    pub async fn enqueue(&self, req: &Request) -> Result<i64, StoreError> {
        let queued = self
            .store
            .batched("queueing a job", Requests(vec![req.clone()]))
            .await?;
        queued
            .first()
            .map(|q| q.id)
            .ok_or_else(|| self.store.err("queueing a job")(no_job(&req.target)))
    }

    /// Queue the interval ticks of the targets the scheduler found due,
    /// each with when its last run started as the scheduler read it, in
    /// one write. Each is checked again inside that write, where no other
    /// instance's write can land in between: it is queued only if nothing
    /// of it is queued or running, it is not paused, and its last run is
    /// still the one read (another instance may have queued, run and
    /// finished it since: then it is not due). The targets queued; all of
    /// them are on disk when this returns, or none.
    pub async fn enqueue_due(
        &self,
        due: Vec<(Request, Option<i64>)>,
    ) -> Result<Vec<String>, StoreError> {
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let kind = self.store.kind();
        let due = std::sync::Arc::new(due);
        self.store
            .grouped("queueing interval ticks", move |tx| {
                let due = due.clone();
                Box::pin(async move {
                    let names: Vec<String> = due.iter().map(|(r, _)| r.target.clone()).collect();
                    let now: HashMap<String, crate::store::Candidate> =
                        crate::store::candidates_on(tx, kind, &names)
                            .await?
                            .into_iter()
                            .map(|c| (c.name.clone(), c))
                            .collect();
                    let still: Vec<&Request> = due
                        .iter()
                        .filter(|(r, read)| {
                            now.get(&r.target)
                                .is_some_and(|c| !c.active && !c.paused && c.last_run_at == *read)
                        })
                        .map(|(r, _)| r)
                        .collect();
                    enqueue_many(tx, &still).await?;
                    Ok(still.iter().map(|r| r.target.clone()).collect())
                })
            })
            .await
    }

    /// Record a webhook delivery and queue its requests (a pull request's
    /// previews, the pushed commits' `pending` statuses), atomically:
    /// either the delivery id is new and all of it is on disk when this
    /// returns, or it was seen before and nothing is written. Deliveries
    /// arriving together share one commit and, mostly, one statement
    /// (`Store::batched`).
    pub async fn accept(&self, intake: Intake) -> Result<Accepted, StoreError> {
        self.store
            .batched("recording a webhook delivery", intake)
            .await
    }

    /// Forget delivery ids older than [`DELIVERY_MEMORY`].
    pub async fn prune_deliveries(&self) -> Result<u64, StoreError> {
        let cutoff = now_ms() - DELIVERY_MEMORY.as_millis() as i64;
        let r = self
            .store
            .write_one(
                "forgetting old deliveries",
                sqlx::query("DELETE FROM deliveries WHERE received_at < $1").bind(cutoff),
            )
            .await?;
        Ok(r.rows_affected())
    }

    /// A job by id: its state, outcome and run.
    pub async fn job(&self, id: i64) -> Result<Option<JobRecord>, StoreError> {
        sqlx::query_as::<_, JobRecord>(
            "SELECT id, target, state, triggers, requested_sha, delivery_ids, receiver, attempts,
                    run_id, outcome, created_at, updated_at
             FROM jobs WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self.store.pool())
        .await
        .map_err(self.store.err("reading a job"))
    }

    /// Claim the oldest runnable job (a target with a running job, or a
    /// paused one, is not runnable).
    pub async fn claim(&self) -> Result<Option<Job>, StoreError> {
        let now = now_ms();
        // Looked for first with a read, which waits for no writer: a worker
        // woken by a delivery whose job folded into one already running
        // (most of a burst) takes no write turn from the deliveries.
        let runnable: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT j.id FROM jobs j WHERE {RUNNABLE} LIMIT 1"
        )))
        .bind(now)
        .fetch_optional(self.store.pool())
        .await
        .map_err(self.store.err("looking for a job to claim"))?;
        if runnable.is_none() {
            return Ok(None);
        }
        let since = self.clock("$1");
        let sql: std::sync::Arc<str> = format!(
            "UPDATE jobs SET state = 'running', lease_owner = $2, lease_until = {since} + $3,
                    attempts = attempts + 1, updated_at = $1
             WHERE id = (SELECT j.id FROM jobs j WHERE {RUNNABLE} ORDER BY j.id LIMIT 1)
             RETURNING id, target, triggers, requested_sha, delivery_ids, attempts, receiver"
        )
        .into();
        // A grouped write: under a stream of deliveries the claim shares
        // their commit rather than taking a turn (and an fsync) of its own.
        // Answered after that commit, so the row is stored.
        let claim = Claim {
            sql,
            now,
            owner: self.owner.clone(),
            lease_ms: self.lease.as_millis() as i64,
        };
        let claimed = self.store.batched("claiming a job", claim).await?;
        Ok(claimed.map(|(r, sent)| Job {
            leased_at: sent,
            ..Job::from_row(r)
        }))
    }

    /// Create a job that is running from the start, for a one-shot `tick`
    /// that already holds the target's lock. `None` when another job for the
    /// target is marked running.
    ///
    /// A job queued for the target by its dependencies alone (trigger
    /// `dependency`: a producer's outputs changed, a blocking dependency
    /// recovered) is closed as part of this one: this run starts after it
    /// was queued, so it reads what that job was queued for — and without a
    /// daemon (`tick --all`) nothing else would ever take it. Jobs with
    /// any other trigger (a push's delivery, an API call) stay queued.
    pub async fn start_now(
        &self,
        target: &str,
        trigger: Trigger,
    ) -> Result<Option<Job>, StoreError> {
        let what = "starting a job";
        let now = now_ms();
        let mut tx = self.store.begin_write(what).await?;
        let pg = is_postgres(&tx);
        let since = self.clock("$5");
        let sent = std::time::Instant::now();
        let row = sqlx::query_as::<_, JobRow>(sqlx::AssertSqlSafe(if pg {
            format!(
                "INSERT INTO jobs (target, state, triggers, lease_owner, lease_until, attempts, created_at, updated_at)
                 VALUES ($1, 'running', jsonb_build_array($2::text)::text, $3, {since} + $4, 1, $5, $5)
                 ON CONFLICT DO NOTHING
                 RETURNING id, target, triggers, requested_sha, delivery_ids, attempts, receiver"
            )
        } else {
            format!(
                "INSERT INTO jobs (target, state, triggers, lease_owner, lease_until, attempts, created_at, updated_at)
                 VALUES ($1, 'running', json_array($2), $3, {since} + $4, 1, $5, $5)
                 ON CONFLICT DO NOTHING
                 RETURNING id, target, triggers, requested_sha, delivery_ids, attempts, receiver"
            )
        }))
        .bind(target)
        .bind(trigger.as_str())
        .bind(&self.owner)
        .bind(self.lease.as_millis() as i64)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(self.store.err(what))?;
        if let Some(r) = &row {
            sqlx::query(if pg {
                "UPDATE jobs SET state = 'done', outcome = $2, updated_at = $3
                 WHERE target = $1 AND state = 'queued'
                   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(jobs.triggers::jsonb) AS t(value)
                                   WHERE value != 'dependency')"
            } else {
                "UPDATE jobs SET state = 'done', outcome = $2, updated_at = $3
                 WHERE target = $1 AND state = 'queued'
                   AND NOT EXISTS (SELECT 1 FROM json_each(jobs.triggers) WHERE value != 'dependency')"
            })
            .bind(target)
            .bind(format!("folded into job {} (a one-shot tick)", r.id))
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(self.store.err(what))?;
        }
        tx.commit().await.map_err(self.store.err(what))?;
        Ok(row.map(|r| Job {
            leased_at: sent,
            ..Job::from_row(r)
        }))
    }

    /// Extend the lease. `false` when the job is no longer ours (on
    /// PostgreSQL, also when its lease already ran out: whoever held it has
    /// stopped by then, and another instance may be taking it over).
    pub async fn heartbeat(&self, job_id: i64) -> Result<bool, StoreError> {
        let what = "renewing a job lease";
        let mut tx = self.store.begin_write(what).await?;
        let ours = self
            .lease_of(job_id)
            .renew(&mut tx)
            .await
            .map_err(self.store.err(what))?;
        tx.commit().await.map_err(self.store.err(what))?;
        Ok(ours)
    }

    /// The job is over: `outcome` says how (`changed`, `failed`, `skipped: …`).
    pub async fn finish(
        &self,
        job_id: i64,
        run_id: Option<i64>,
        outcome: &str,
    ) -> Result<(), StoreError> {
        // Grouped, like the claim: it shares the commit of the writes
        // beside it.
        let finish = Finish {
            job_id,
            run_id,
            outcome: outcome.to_string(),
            now: now_ms(),
        };
        self.store.batched("finishing a job", finish).await
    }

    /// Put a running job back in the queue to run after `delay`, folding it
    /// into a newer queued job for the same target if one arrived meanwhile.
    pub async fn requeue(&self, job_id: i64, delay: Duration) -> Result<(), StoreError> {
        let what = "requeueing a job";
        let mut tx = self.store.begin_write(what).await?;
        // A job taken over meanwhile (its lease ran out) is not ours to move.
        let ours: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM jobs WHERE id = $1 AND state = 'running' AND lease_owner = $2",
        )
        .bind(job_id)
        .bind(&self.owner)
        .fetch_optional(&mut *tx)
        .await
        .map_err(self.store.err(what))?;
        if ours.is_none() {
            return Ok(());
        }
        interrupt_runs(
            &mut tx,
            job_id,
            "the tick stopped before recording a result (see the daemon log); the job was queued again",
        )
        .await
        .map_err(self.store.err(what))?;
        requeue_in(&mut tx, job_id, now_ms() + delay.as_millis() as i64)
            .await
            .map_err(self.store.err(what))?;
        tx.commit().await.map_err(self.store.err(what))?;
        Ok(())
    }

    /// Jobs whose lease expired go back to the queue (their process died);
    /// the runs they left open are marked `interrupted`. Returns the ids.
    /// On PostgreSQL, by the server's clock, checked again in the write
    /// transaction: a lease renewed meanwhile is left alone.
    pub async fn recover_expired(&self) -> Result<Vec<i64>, StoreError> {
        let what = "recovering interrupted jobs";
        let expired: Vec<i64> = match self.store.kind() {
            Kind::Sqlite => sqlx::query_scalar(
                "SELECT id FROM jobs WHERE state = 'running' AND lease_until < $1 ORDER BY id",
            )
            .bind(now_ms())
            .fetch_all(self.store.pool())
            .await
            .map_err(self.store.err(what))?,
            Kind::Postgres => sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT id FROM jobs WHERE state = 'running' AND lease_until < {PG_NOW_MS} ORDER BY id"
            )))
            .fetch_all(self.store.pool())
            .await
            .map_err(self.store.err(what))?,
        };
        self.recover_only(&expired, true).await
    }

    /// Every job marked running.
    pub async fn running(&self) -> Result<Vec<RunningJob>, StoreError> {
        let now = now_ms();
        let rows: Vec<(i64, String, Option<String>, i64)> = sqlx::query_as(
            "SELECT id, target, lease_owner, updated_at FROM jobs WHERE state = 'running' ORDER BY id",
        )
        .fetch_all(self.store.pool())
        .await
        .map_err(self.store.err("reading running jobs"))?;
        Ok(rows
            .into_iter()
            .map(|(id, target, owner, updated)| RunningJob {
                id,
                target,
                owner: owner.unwrap_or_default(),
                quiet_for: Duration::from_millis((now - updated).max(0) as u64),
            })
            .collect())
    }

    /// Put jobs that were running when their process died back in the queue
    /// and mark the runs they left open `interrupted`. Every one goes back:
    /// one interrupted [`MAX_ATTEMPTS`] times is ended by its next run, a
    /// failure that says why ([`Queue::interruptions`]).
    pub async fn recover(&self, ids: &[i64]) -> Result<(), StoreError> {
        self.recover_only(ids, false).await.map(drop)
    }

    /// [`Queue::recover`]; with `expired`, only the jobs whose lease has
    /// run out by the time the write transaction reads them (by the
    /// server's clock on PostgreSQL). Returns the ids recovered.
    async fn recover_only(&self, ids: &[i64], expired: bool) -> Result<Vec<i64>, StoreError> {
        let mut done = Vec::new();
        if ids.is_empty() {
            return Ok(done);
        }
        let what = "recovering interrupted jobs";
        let now = now_ms();
        let still = match (expired, self.store.kind()) {
            (false, _) => String::new(),
            (true, Kind::Sqlite) => "AND lease_until < $2".to_string(),
            (true, Kind::Postgres) => format!("AND lease_until < {PG_NOW_MS}"),
        };
        let bind_now = expired && self.store.kind() == Kind::Sqlite;
        let mut tx = self.store.begin_write(what).await?;
        for id in ids {
            let mut read = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT attempts FROM jobs WHERE id = $1 AND state = 'running' {still}"
            )))
            .bind(id);
            if bind_now {
                read = read.bind(now);
            }
            let attempts: Option<i64> = read
                .fetch_optional(&mut *tx)
                .await
                .map_err(self.store.err(what))?;
            if attempts.is_none() {
                continue;
            }
            done.push(*id);
            interrupt_runs(&mut tx, *id, INTERRUPTED)
                .await
                .map_err(self.store.err(what))?;
            requeue_in(&mut tx, *id, now)
                .await
                .map_err(self.store.err(what))?;
        }
        tx.commit().await.map_err(self.store.err(what))?;
        Ok(done)
    }

    /// How many of job `job_id`'s runs were left open by a process that
    /// died (marked [`INTERRUPTED`] by [`Queue::recover`]).
    pub async fn interruptions(&self, job_id: i64) -> Result<i64, StoreError> {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM runs WHERE job_id = $1 AND result = 'interrupted' AND message = $2",
        )
        .bind(job_id)
        .bind(INTERRUPTED)
        .fetch_one(self.store.pool())
        .await
        .map_err(self.store.err("counting a job's interrupted runs"))
    }

    /// Queued and running counts per target.
    pub async fn activity(&self) -> Result<Vec<Activity>, StoreError> {
        sqlx::query_as::<_, Activity>(
            "SELECT target,
                    COUNT(*) FILTER (WHERE state = 'queued') AS queued,
                    COUNT(*) FILTER (WHERE state = 'running') AS running
             FROM jobs WHERE state IN ('queued', 'running') GROUP BY target",
        )
        .fetch_all(self.store.pool())
        .await
        .map_err(self.store.err("reading the queue"))
    }

    /// Replace the dependency table with `pairs`, (target, a target it
    /// waits on directly or through others): the daemon's configuration
    /// as it starts.
    pub async fn set_dependencies(&self, pairs: &[(String, String)]) -> Result<(), StoreError> {
        let what = "recording the dependencies between targets";
        let rows = serde_json::to_string(pairs).unwrap_or_else(|_| "[]".into());
        let mut tx = self.store.begin_write(what).await?;
        sqlx::query("DELETE FROM target_deps")
            .execute(&mut *tx)
            .await
            .map_err(self.store.err(what))?;
        sqlx::query(if is_postgres(&tx) {
            "INSERT INTO target_deps (target, ancestor)
             SELECT value ->> 0, value ->> 1 FROM jsonb_array_elements($1::jsonb) AS d(value)"
        } else {
            "INSERT INTO target_deps (target, ancestor)
             SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each($1)"
        })
        .bind(rows)
        .execute(&mut *tx)
        .await
        .map_err(self.store.err(what))?;
        tx.commit().await.map_err(self.store.err(what))
    }

    /// Queued jobs for targets that are no longer configured are closed.
    pub async fn drop_unknown(&self, targets: &[String]) -> Result<u64, StoreError> {
        let names = serde_json::to_string(targets).unwrap_or_else(|_| "[]".into());
        let r = self.store.write_one("closing jobs of removed targets", sqlx::query(match self.store.kind() {
            Kind::Postgres => {
                "UPDATE jobs SET state = 'done', outcome = 'target no longer configured', updated_at = $2
                 WHERE state = 'queued' AND target NOT IN (SELECT jsonb_array_elements_text($1::jsonb))"
            }
            Kind::Sqlite => {
                "UPDATE jobs SET state = 'done', outcome = 'target no longer configured', updated_at = $2
                 WHERE state = 'queued' AND target NOT IN (SELECT value FROM json_each($1))"
            }
        })
        .bind(names)
        .bind(now_ms()))
            .await?;
        Ok(r.rows_affected())
    }
}

/// Insert or fold `req` into the target's queued job; returns the job id.
/// What a webhook delivery writes: see [`Queue::accept`].
#[derive(Debug, Clone)]
pub struct Intake {
    pub receiver: String,
    pub delivery_id: Option<String>,
    /// What became of it, for the delivery log.
    pub outcome: String,
    pub requests: Vec<Request>,
    pub pulls: Vec<PullEvent>,
    /// Each only where the commit has no state for the context yet.
    pub statuses: Vec<NewStatus>,
}

impl Batch for Intake {
    type Out = Accepted;

    /// Every delivery of the batch in one insert (those whose id was seen
    /// before, or earlier in the batch, are duplicates), then every
    /// request of the new ones in one more (`enqueue_many`); previews and
    /// statuses, which few deliveries carry, a statement each.
    fn run<'t>(
        tx: &'t mut BatchTx,
        all: Vec<&'t Intake>,
    ) -> BoxFuture<'t, Result<Vec<Accepted>, sqlx::Error>> {
        Box::pin(async move {
            let new: HashSet<(String, String)> = match delivery_rows(&all)? {
                None => HashSet::new(),
                Some(rows) => sqlx::query_as::<_, (String, String)>(if is_postgres(tx) {
                    DELIVERIES_PG
                } else {
                    DELIVERIES_SQLITE
                })
                .bind(rows)
                .bind(now_ms())
                .fetch_all(&mut **tx)
                .await?
                .into_iter()
                .collect(),
            };
            let taken = taken(&all, new);
            let jobs = enqueue_many(tx, &taken_requests(&all, &taken)).await?;
            let mut out = accepted(&all, &taken, &jobs)?;
            for (i, a) in all.iter().zip(&mut out) {
                let Accepted::Queued {
                    dropped_previews, ..
                } = a
                else {
                    continue;
                };
                for p in &i.pulls {
                    *dropped_previews += previews::record_event(tx, p).await?;
                }
                for s in &i.statuses {
                    statuses::record(tx, s, true).await?;
                }
            }
            Ok(out)
        })
    }

    /// The same two statements on SQLite's write thread, for a batch with
    /// no pull request events or statuses.
    fn direct(all: Vec<&Intake>) -> Option<direct::Job<Vec<Accepted>>> {
        if all
            .iter()
            .any(|i| !i.pulls.is_empty() || !i.statuses.is_empty())
        {
            return None;
        }
        let all: Vec<Intake> = all.into_iter().cloned().collect();
        Some(Box::new(move |tx| {
            let all: Vec<&Intake> = all.iter().collect();
            let new: HashSet<(String, String)> = match delivery_rows(&all)? {
                None => HashSet::new(),
                Some(rows) => {
                    let mut stmt = tx
                        .prepare_cached(DELIVERIES_SQLITE)
                        .map_err(direct::failure)?;
                    stmt.query_map(
                        rusqlite::named_params! { "$1": rows, "$2": now_ms() },
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .and_then(|rows| rows.collect::<Result<HashSet<_>, _>>())
                    .map_err(direct::failure)?
                }
            };
            let taken = taken(&all, new);
            let jobs = enqueue_direct(tx, &taken_requests(&all, &taken))?;
            accepted(&all, &taken, &jobs)
        }))
    }
}

/// Inserts the deliveries of a batch (`$1`, a JSON array of [receiver,
/// delivery id, outcome]) received at `$2`; returns the new ones.
const DELIVERIES_PG: &str = "INSERT INTO deliveries (receiver, delivery_id, received_at, outcome)
     SELECT d.value ->> 0, d.value ->> 1, $2, d.value ->> 2
     FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS d(value, key)
     ORDER BY d.key
     ON CONFLICT DO NOTHING
     RETURNING receiver, delivery_id";
const DELIVERIES_SQLITE: &str =
    "INSERT INTO deliveries (receiver, delivery_id, received_at, outcome)
     SELECT d.value ->> 0, d.value ->> 1, $2, d.value ->> 2
     FROM json_each($1) AS d WHERE true ORDER BY d.key
     ON CONFLICT DO NOTHING
     RETURNING receiver, delivery_id";

/// The deliveries of `all` that have an id, as the `$1` of `DELIVERIES_*`;
/// None if none has.
fn delivery_rows(all: &[&Intake]) -> Result<Option<String>, sqlx::Error> {
    let ids: Vec<(&str, &str, &str)> = all
        .iter()
        .filter_map(|i| {
            Some((
                i.receiver.as_str(),
                i.delivery_id.as_deref()?,
                i.outcome.as_str(),
            ))
        })
        .collect();
    if ids.is_empty() {
        return Ok(None);
    }
    json_text(&ids).map(Some)
}

/// A delivery is taken once: by the first of the batch with its id (`new`:
/// the ids the insert wrote). One without an id is always taken.
fn taken(all: &[&Intake], mut new: HashSet<(String, String)>) -> Vec<bool> {
    all.iter()
        .map(|i| match &i.delivery_id {
            None => true,
            Some(id) => new.remove(&(i.receiver.clone(), id.clone())),
        })
        .collect()
}

/// The requests of the deliveries taken, in order.
fn taken_requests<'a>(all: &[&'a Intake], taken: &[bool]) -> Vec<&'a Request> {
    all.iter()
        .zip(taken)
        .filter(|(_, t)| **t)
        .flat_map(|(i, _)| i.requests.iter())
        .collect()
}

/// What each delivery of `all` hears, from the jobs its requests are in
/// (previews dropped are counted by the caller).
fn accepted(
    all: &[&Intake],
    taken: &[bool],
    jobs: &[Queued],
) -> Result<Vec<Accepted>, sqlx::Error> {
    let jobs: HashMap<&str, &Queued> = jobs.iter().map(|q| (q.target.as_str(), q)).collect();
    let mut out = Vec::with_capacity(all.len());
    for (i, taken) in all.iter().zip(taken) {
        if !taken {
            out.push(Accepted::Duplicate);
            continue;
        }
        let (mut queued, mut paused, mut new_job) = (Vec::new(), Vec::new(), false);
        for req in &i.requests {
            let q = jobs
                .get(req.target.as_str())
                .ok_or_else(|| no_job(&req.target))?;
            new_job |= q.fresh;
            if q.paused {
                paused.push(req.target.clone());
            }
            queued.push((req.target.clone(), q.id));
        }
        out.push(Accepted::Queued {
            jobs: queued,
            paused,
            dropped_previews: 0,
            new_job,
        });
    }
    Ok(out)
}

/// A worker's claim of the next runnable job: `sql` (`$1` now, `$2` the
/// owner, `$3` the lease) returns it, leased.
struct Claim {
    sql: std::sync::Arc<str>,
    now: i64,
    owner: String,
    lease_ms: i64,
}

/// A claimed job, and when its lease was taken.
type Claimed = Option<(JobRow, std::time::Instant)>;

impl Batch for Claim {
    type Out = Claimed;

    /// A statement each, in order: each claim takes the job the ones
    /// before it left.
    fn run<'t>(
        tx: &'t mut BatchTx,
        all: Vec<&'t Claim>,
    ) -> BoxFuture<'t, Result<Vec<Claimed>, sqlx::Error>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(all.len());
            for c in all {
                let sent = std::time::Instant::now();
                let row = sqlx::query_as::<_, JobRow>(sqlx::AssertSqlSafe(c.sql.clone()))
                    .bind(c.now)
                    .bind(&c.owner)
                    .bind(c.lease_ms)
                    .fetch_optional(&mut **tx)
                    .await?;
                out.push(row.map(|r| (r, sent)));
            }
            Ok(out)
        })
    }

    fn direct(all: Vec<&Claim>) -> Option<direct::Job<Vec<Claimed>>> {
        let all: Vec<Claim> = all
            .into_iter()
            .map(|c| Claim {
                sql: c.sql.clone(),
                owner: c.owner.clone(),
                ..*c
            })
            .collect();
        Some(Box::new(move |tx| {
            let mut out = Vec::with_capacity(all.len());
            for c in &all {
                let sent = std::time::Instant::now();
                let mut stmt = tx.prepare_cached(&c.sql).map_err(direct::failure)?;
                let mut rows = stmt
                    .query(rusqlite::named_params! { "$1": c.now, "$2": c.owner, "$3": c.lease_ms })
                    .map_err(direct::failure)?;
                let row = match rows.next().map_err(direct::failure)? {
                    None => None,
                    Some(r) => Some(job_row(r).map_err(direct::failure)?),
                };
                // Stepped to its end, so the update is done.
                while rows.next().map_err(direct::failure)?.is_some() {}
                out.push(row.map(|r| (r, sent)));
            }
            Ok(out)
        }))
    }
}

/// A [`JobRow`] from SQLite's write thread (the columns `RETURNING id,
/// target, triggers, requested_sha, delivery_ids, attempts, receiver`).
fn job_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<JobRow> {
    fn json<T: serde::de::DeserializeOwned>(
        r: &rusqlite::Row<'_>,
        i: usize,
    ) -> rusqlite::Result<T> {
        let text: String = r.get(i)?;
        serde_json::from_str(&text).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
        })
    }
    Ok(JobRow {
        id: r.get(0)?,
        target: r.get(1)?,
        triggers: json(r, 2)?,
        requested_sha: r.get(3)?,
        delivery_ids: json(r, 4)?,
        attempts: r.get(5)?,
        receiver: r.get(6)?,
    })
}

/// A job is over: `outcome` says how, `run_id` the run it made if any.
struct Finish {
    job_id: i64,
    run_id: Option<i64>,
    outcome: String,
    now: i64,
}

const FINISH: &str =
    "UPDATE jobs SET state = 'done', run_id = $2, outcome = $3, lease_owner = NULL,
         lease_until = NULL, updated_at = $4
     WHERE id = $1";

impl Batch for Finish {
    type Out = ();

    fn run<'t>(
        tx: &'t mut BatchTx,
        all: Vec<&'t Finish>,
    ) -> BoxFuture<'t, Result<Vec<()>, sqlx::Error>> {
        Box::pin(async move {
            for f in &all {
                sqlx::query(FINISH)
                    .bind(f.job_id)
                    .bind(f.run_id)
                    .bind(&f.outcome)
                    .bind(f.now)
                    .execute(&mut **tx)
                    .await?;
            }
            Ok(vec![(); all.len()])
        })
    }

    fn direct(all: Vec<&Finish>) -> Option<direct::Job<Vec<()>>> {
        let all: Vec<(i64, Option<i64>, String, i64)> = all
            .into_iter()
            .map(|f| (f.job_id, f.run_id, f.outcome.clone(), f.now))
            .collect();
        Some(Box::new(move |tx| {
            let mut stmt = tx.prepare_cached(FINISH).map_err(direct::failure)?;
            for f in &all {
                stmt.execute(
                    rusqlite::named_params! { "$1": f.0, "$2": f.1, "$3": f.2, "$4": f.3 },
                )
                .map_err(direct::failure)?;
            }
            Ok(vec![(); all.len()])
        }))
    }
}

/// Requests queued by one caller (an API call, the scheduler's pass).
struct Requests(Vec<Request>);

impl Batch for Requests {
    type Out = Vec<Queued>;

    /// Every request of every caller in one statement; each caller hears
    /// of the jobs its own requests are in, in its order.
    fn run<'t>(
        tx: &'t mut BatchTx,
        all: Vec<&'t Requests>,
    ) -> BoxFuture<'t, Result<Vec<Vec<Queued>>, sqlx::Error>> {
        Box::pin(async move {
            let reqs: Vec<&Request> = all.iter().flat_map(|r| r.0.iter()).collect();
            let jobs = enqueue_many(tx, &reqs).await?;
            each_callers(&all, &jobs)
        })
    }

    /// The same statement on SQLite's write thread.
    fn direct(all: Vec<&Requests>) -> Option<direct::Job<Vec<Vec<Queued>>>> {
        let all: Vec<Requests> = all.into_iter().map(|r| Requests(r.0.clone())).collect();
        Some(Box::new(move |tx| {
            let all: Vec<&Requests> = all.iter().collect();
            let reqs: Vec<&Request> = all.iter().flat_map(|r| r.0.iter()).collect();
            let jobs = enqueue_direct(tx, &reqs)?;
            each_callers(&all, &jobs)
        }))
    }
}

/// The jobs each caller's requests are in, in its order.
fn each_callers(all: &[&Requests], jobs: &[Queued]) -> Result<Vec<Vec<Queued>>, sqlx::Error> {
    let jobs: HashMap<&str, &Queued> = jobs.iter().map(|q| (q.target.as_str(), q)).collect();
    all.iter()
        .map(|r| {
            r.0.iter()
                .map(|req| {
                    jobs.get(req.target.as_str())
                        .map(|q| (*q).clone())
                        .ok_or_else(|| no_job(&req.target))
                })
                .collect()
        })
        .collect()
}

/// The job a request is in now.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Queued {
    target: String,
    id: i64,
    /// A new job rather than a fold into a queued one (a fold within the
    /// same millisecond may say new: only a worker wakes for nothing), and
    /// no job of its target running: a worker can take it now. One behind
    /// a running job is taken when that one ends, by its worker, which
    /// looks again at once; waking another for it would only send that
    /// one to the database for nothing (under a flood of pushes to one
    /// target, three reads a job).
    #[sqlx(try_from = "crate::store::db::Flag")]
    fresh: bool,
    /// Its target is paused (read in the same statement): the job waits.
    #[sqlx(try_from = "crate::store::db::Flag")]
    paused: bool,
}

/// A request whose job the upsert did not return (it returns one row a
/// request): the write fails, naming the target.
fn no_job(target: &str) -> sqlx::Error {
    sqlx::Error::Protocol(format!(
        "queueing a job for target `{target}` returned no job row"
    ))
}

fn json_text<T: Serialize>(v: &T) -> Result<String, sqlx::Error> {
    serde_json::to_string(v).map_err(|e| sqlx::Error::Encode(Box::new(e)))
}

/// Queue `reqs` in order, in one statement, each folded into its target's
/// queued job if there is one (an earlier request of the same statement
/// made it, or it was there): the job each target's requests are in now,
/// one row per target in no particular order.
///
/// Each target's requests are folded here first, as the upsert would fold
/// them one after another (triggers each once, in order; the newest sha
/// and receiver given; delivery ids in order, at most 100: the first 99
/// and the newest), and the statement folds each target's one row into
/// its queued job the same way. One row per target: PostgreSQL will not
/// let one `INSERT … ON CONFLICT DO UPDATE` touch a row twice, and on
/// SQLite a burst of deliveries for one target costs one fold of its
/// job's lists instead of one per delivery.
async fn enqueue_many(
    conn: &mut crate::store::db::Conn,
    reqs: &[&Request],
) -> Result<Vec<Queued>, sqlx::Error> {
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    let sql = if is_postgres(conn) {
        ENQUEUE_PG
    } else {
        ENQUEUE_SQLITE
    };
    upsert_jobs(conn, sql, &fold_requests(reqs)).await
}

/// [`enqueue_many`] on SQLite's write thread.
fn enqueue_direct(
    tx: &rusqlite::Transaction<'_>,
    reqs: &[&Request],
) -> Result<Vec<Queued>, sqlx::Error> {
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    let rows = json_text(&fold_requests(reqs))?;
    let mut stmt = tx
        .prepare_cached(&format!("{ENQUEUE_SQLITE} {RETURNING_QUEUED}"))
        .map_err(direct::failure)?;
    stmt.query_map(
        rusqlite::named_params! { "$1": rows, "$2": now_ms() },
        |r| {
            Ok(Queued {
                target: r.get(0)?,
                id: r.get(1)?,
                fresh: r.get(2)?,
                paused: r.get(3)?,
            })
        },
    )
    .and_then(|rows| rows.collect())
    .map_err(direct::failure)
}

/// `reqs` folded into one row per target, in the order each target first
/// came: the `$1` of `ENQUEUE_*`.
fn fold_requests(reqs: &[&Request]) -> Vec<serde_json::Value> {
    struct Fold<'r> {
        target: &'r str,
        triggers: Vec<&'static str>,
        sha: Option<&'r str>,
        deliveries: Vec<&'r str>,
        receiver: Option<&'r str>,
    }
    let mut folds: Vec<Fold<'_>> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for r in reqs {
        let i = *at.entry(r.target.as_str()).or_insert_with(|| {
            folds.push(Fold {
                target: &r.target,
                triggers: Vec::new(),
                sha: None,
                deliveries: Vec::new(),
                receiver: None,
            });
            folds.len() - 1
        });
        let f = &mut folds[i];
        if !f.triggers.contains(&r.trigger.as_str()) {
            f.triggers.push(r.trigger.as_str());
        }
        f.sha = r.sha.as_deref().or(f.sha);
        f.receiver = r.receiver.as_deref().or(f.receiver);
        if let Some(d) = &r.delivery_id {
            f.deliveries.push(d);
        }
    }
    folds
        .into_iter()
        .map(|mut f| {
            if f.deliveries.len() > DELIVERY_IDS_KEPT {
                let newest = f.deliveries[f.deliveries.len() - 1];
                f.deliveries.truncate(DELIVERY_IDS_KEPT - 1);
                f.deliveries.push(newest);
            }
            serde_json::json!([f.target, f.triggers, f.sha, f.deliveries, f.receiver])
        })
        .collect()
}

/// Upserts `$1`'s rows ([target, triggers, sha, delivery ids, receiver])
/// into their targets' queued jobs at `$2`.
const ENQUEUE_PG: &str = "INSERT INTO jobs (target, state, triggers, requested_sha, delivery_ids, receiver, created_at, updated_at)
         SELECT r ->> 0, 'queued', (r -> 1)::text, r ->> 2, (r -> 3)::text, r ->> 4, $2, $2
         FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS x(r, n) WHERE true ORDER BY n
         ON CONFLICT (target) WHERE state = 'queued' DO UPDATE SET
             triggers = (jobs.triggers::jsonb || COALESCE(
                 (SELECT jsonb_agg(t ORDER BY o)
                  FROM jsonb_array_elements(excluded.triggers::jsonb) WITH ORDINALITY AS n(t, o)
                  WHERE NOT jobs.triggers::jsonb @> jsonb_build_array(t)),
                 '[]'::jsonb))::text,
             requested_sha = COALESCE(excluded.requested_sha, jobs.requested_sha),
             delivery_ids = (SELECT CASE WHEN jsonb_array_length(c) <= 100 THEN c
                                        ELSE (SELECT jsonb_agg(e ORDER BY o)
                                              FROM jsonb_array_elements(c) WITH ORDINALITY AS k(e, o)
                                              WHERE o < 100 OR o = jsonb_array_length(c)) END
                             FROM (SELECT jobs.delivery_ids::jsonb || excluded.delivery_ids::jsonb
                                          AS c) AS both_ids)::text,
             receiver = COALESCE(excluded.receiver, jobs.receiver),
             updated_at = excluded.updated_at";
/// `n` numbers the job's list and then the new one, from 0. The general
/// fold (a union of `json_each`s, ordered through temporary b-trees) was a
/// third of SQLite's write thread's time under a flood of deliveries, so
/// the common cases take shortcuts that give the same arrays: triggers
/// already there stay as they are; delivery ids are appended as text while
/// they fit, and past the 100th only the newest changes. The columns hold
/// only what `->` and the json functions wrote (minified arrays), so their
/// text can be joined.
const ENQUEUE_SQLITE: &str = "INSERT INTO jobs (target, state, triggers, requested_sha, delivery_ids, receiver, created_at, updated_at)
         SELECT r.value ->> 0, 'queued', r.value -> 1, r.value ->> 2, r.value -> 3, r.value ->> 4, $2, $2
         FROM json_each($1) AS r WHERE true ORDER BY r.key
         ON CONFLICT (target) WHERE state = 'queued' DO UPDATE SET
             triggers = CASE WHEN excluded.triggers = jobs.triggers THEN jobs.triggers
                 ELSE (SELECT json_group_array(value ORDER BY n) FROM (
                     SELECT value, key AS n FROM json_each(jobs.triggers)
                     UNION ALL
                     SELECT value, json_array_length(jobs.triggers) + key FROM json_each(excluded.triggers)
                     WHERE value NOT IN (SELECT value FROM json_each(jobs.triggers)))) END,
             requested_sha = COALESCE(excluded.requested_sha, jobs.requested_sha),
             delivery_ids = CASE
                 WHEN excluded.delivery_ids = '[]' THEN jobs.delivery_ids
                 WHEN jobs.delivery_ids = '[]' THEN excluded.delivery_ids
                 WHEN json_array_length(jobs.delivery_ids) + json_array_length(excluded.delivery_ids) <= 100
                     THEN json(substr(jobs.delivery_ids, 1, length(jobs.delivery_ids) - 1)
                               || ',' || substr(excluded.delivery_ids, 2))
                 WHEN json_array_length(jobs.delivery_ids) = 100
                     THEN json_replace(jobs.delivery_ids, '$[99]', excluded.delivery_ids -> '$[#-1]')
                 ELSE (SELECT json_group_array(value ORDER BY n) FROM (
                     SELECT value, n, count(*) OVER () AS total FROM (
                         SELECT value, key AS n FROM json_each(jobs.delivery_ids)
                         UNION ALL
                         SELECT value, json_array_length(jobs.delivery_ids) + key
                         FROM json_each(excluded.delivery_ids)))
                     WHERE n < 99 OR n = total - 1) END,
             receiver = COALESCE(excluded.receiver, jobs.receiver),
             updated_at = excluded.updated_at";

/// What an `ENQUEUE_*` upsert returns of each job: a [`Queued`].
const RETURNING_QUEUED: &str = "RETURNING target, id,
     created_at = updated_at
       AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.target = jobs.target AND r.state = 'running')
       AS fresh,
     EXISTS (SELECT 1 FROM targets WHERE name = jobs.target AND paused_at IS NOT NULL) AS paused";

/// A jobs upsert `sql` of `rows` (a JSON array, `$1`) at now (`$2`), each
/// row's job returned as a [`Queued`].
async fn upsert_jobs(
    conn: &mut crate::store::db::Conn,
    sql: &str,
    rows: &[serde_json::Value],
) -> Result<Vec<Queued>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("{sql} {RETURNING_QUEUED}")))
        .bind(json_text(&rows)?)
        .bind(now_ms())
        .fetch_all(conn)
        .await
}

/// The most delivery ids a job keeps: the first 99 and the newest.
const DELIVERY_IDS_KEPT: usize = 100;

/// Where a job is in its life: queued, then running (claimed by a worker),
/// then done (run, folded into another job, or given up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    Queued,
    Running,
    Done,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Done => "done",
        }
    }

    /// The state `as_str` wrote, if it is one.
    pub fn parse(s: &str) -> Option<JobStatus> {
        [JobStatus::Queued, JobStatus::Running, JobStatus::Done]
            .into_iter()
            .find(|x| x.as_str() == s)
    }
}

crate::store::db::text_enum!(JobStatus);

/// A job's row, whatever its state.
#[derive(Debug, Clone, FromRow)]
pub struct JobRecord {
    pub id: i64,
    pub target: String,
    pub state: JobStatus,
    #[sqlx(try_from = "JsonText")]
    pub triggers: Vec<Trigger>,
    pub requested_sha: Option<String>,
    #[sqlx(try_from = "JsonText")]
    pub delivery_ids: Vec<String>,
    pub receiver: Option<String>,
    pub attempts: i64,
    pub run_id: Option<i64>,
    pub outcome: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl JobRecord {
    /// For a job folded into another: the id of the job that carries on.
    pub fn merged_into(&self) -> Option<i64> {
        self.outcome
            .as_deref()
            .and_then(|o| o.strip_prefix("merged into job "))
            .and_then(|n| n.parse().ok())
    }
}

/// Close the runs job `id` left open, as `interrupted` with `message`.
async fn interrupt_runs(
    tx: &mut crate::store::db::Tx,
    id: i64,
    message: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE runs SET result = 'interrupted', finished_at = $2, duration_ms = $2 - started_at,
                message = $3
         WHERE job_id = $1 AND result IS NULL",
    )
    .bind(id)
    .bind(now_ms())
    .bind(message)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Move running job `id` back to queued (not before `not_before`), merging
/// with an existing queued job of the same target. Runs inside a transaction.
async fn requeue_in(
    tx: &mut crate::store::db::Tx,
    id: i64,
    not_before: i64,
) -> Result<(), sqlx::Error> {
    let now = now_ms();
    let queued: Option<i64> = sqlx::query_scalar(
        "SELECT q.id FROM jobs q JOIN jobs r ON r.target = q.target
         WHERE r.id = $1 AND q.state = 'queued'",
    )
    .bind(id)
    .fetch_optional(&mut **tx)
    .await?;
    match queued {
        None => {
            sqlx::query(
                "UPDATE jobs SET state = 'queued', not_before = $2, lease_owner = NULL,
                        lease_until = NULL, updated_at = $3 WHERE id = $1",
            )
            .bind(id)
            .bind(not_before)
            .bind(now)
            .execute(&mut **tx)
            .await?;
        }
        Some(q) => {
            // The queued job is newer: its SHA wins; the old job's triggers
            // and deliveries are kept, old ones first.
            let rows: Vec<JobRow> = sqlx::query_as(
                "SELECT id, target, triggers, requested_sha, delivery_ids, attempts, receiver
                 FROM jobs WHERE id IN ($1, $2)",
            )
            .bind(id)
            .bind(q)
            .fetch_all(&mut **tx)
            .await?;
            let (Some(old), Some(new)) = (
                rows.iter().find(|r| r.id == id).cloned().map(Job::from_row),
                rows.iter().find(|r| r.id == q).cloned().map(Job::from_row),
            ) else {
                return Err(sqlx::Error::RowNotFound);
            };
            let mut triggers = old.triggers.clone();
            for t in new.triggers {
                if !triggers.contains(&t) {
                    triggers.push(t);
                }
            }
            let mut deliveries = old.delivery_ids.clone();
            deliveries.extend(new.delivery_ids);
            sqlx::query(
                "UPDATE jobs SET triggers = $2, delivery_ids = $3, requested_sha = $4, updated_at = $5,
                        receiver = $6
                 WHERE id = $1",
            )
            .bind(q)
            .bind(json_text(&triggers)?)
            .bind(json_text(&deliveries)?)
            .bind(new.requested_sha.or(old.requested_sha))
            .bind(now)
            .bind(new.receiver.or(old.receiver))
            .execute(&mut **tx)
            .await?;
            sqlx::query(
                "UPDATE jobs SET state = 'done', outcome = $2, lease_owner = NULL,
                        lease_until = NULL, updated_at = $3 WHERE id = $1",
            )
            .bind(id)
            .bind(format!("merged into job {q}"))
            .bind(now)
            .execute(&mut **tx)
            .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue on SQLite, and one on PostgreSQL: each test runs on both.
    async fn queues() -> Vec<(std::sync::Arc<tempfile::TempDir>, Queue)> {
        let dir = std::sync::Arc::new(tempfile::tempdir().expect("tempdir"));
        crate::store::testing::stores(dir.path())
            .await
            .into_iter()
            .map(|s| (dir.clone(), Queue::new(s)))
            .collect()
    }

    fn req(target: &str, trigger: Trigger, sha: Option<&str>, delivery: Option<&str>) -> Request {
        Request {
            target: target.into(),
            trigger,
            sha: sha.map(Into::into),
            delivery_id: delivery.map(Into::into),
            receiver: None,
        }
    }

    #[tokio::test]
    async fn requests_fold_into_one_queued_job() {
        for (_d, q) in queues().await {
            let a = q
                .enqueue(&req("web", Trigger::Webhook, Some("aaa"), Some("d1")))
                .await
                .expect("enqueue");
            let b = q
                .enqueue(&req("web", Trigger::Interval, None, None))
                .await
                .expect("enqueue");
            let c = q
                .enqueue(&req("web", Trigger::Webhook, Some("bbb"), Some("d2")))
                .await
                .expect("enqueue");
            assert_eq!(a, b);
            assert_eq!(b, c);
            let job = q.claim().await.expect("claim").expect("a job");
            assert_eq!(job.triggers, vec![Trigger::Webhook, Trigger::Interval]);
            assert_eq!(job.requested_sha.as_deref(), Some("bbb"));
            assert_eq!(job.delivery_ids, vec!["d1", "d2"]);
            // running: the target is not claimable again, but a new request queues
            assert_eq!(q.claim().await.expect("claim"), None);
            let d = q
                .enqueue(&req("web", Trigger::Manual, None, None))
                .await
                .expect("enqueue");
            assert_ne!(d, job.id);
            // A job queued without a delivery takes the first one's id.
            let e = q
                .enqueue(&req("web", Trigger::Webhook, Some("ccc"), Some("d3")))
                .await
                .expect("enqueue");
            assert_eq!(d, e);
            assert_eq!(q.claim().await.expect("claim"), None);
            q.finish(job.id, None, "changed").await.expect("finish");
            let next = q.claim().await.expect("claim").expect("the next job");
            assert_eq!(next.id, d);
            assert_eq!(next.triggers, vec![Trigger::Manual, Trigger::Webhook]);
            assert_eq!(next.delivery_ids, vec!["d3"]);
        }
    }

    fn intake(delivery: &str, reqs: Vec<Request>) -> Intake {
        Intake {
            receiver: "github".into(),
            delivery_id: Some(delivery.into()),
            outcome: "queued".into(),
            requests: reqs,
            pulls: Vec::new(),
            statuses: Vec::new(),
        }
    }

    /// Requests written in one statement fold into a target's job exactly
    /// as the same requests written one after another do: triggers each
    /// once in order, the newest sha and receiver, the first 99 delivery
    /// ids and the newest. (On PostgreSQL a batch is folded per target
    /// before its one upsert.)
    #[tokio::test]
    async fn requests_written_together_fold_as_one_after_another() {
        for (_d, q) in queues().await {
            let reqs = |target: &str| -> Vec<Request> {
                (0..300)
                    .map(|i| Request {
                        target: target.into(),
                        trigger: match i % 7 {
                            3 => Trigger::Interval,
                            5 => Trigger::Manual,
                            _ => Trigger::Webhook,
                        },
                        sha: (i % 7 != 3).then(|| format!("sha{i}")),
                        delivery_id: (i % 7 < 3).then(|| format!("d{i}")),
                        receiver: (i % 11 == 0).then(|| format!("r{i}")),
                    })
                    .collect()
            };
            // With a queued job for each first (its first requests), or
            // none; then the rest: one at a time for `seq`, in one
            // statement for `bat`.
            for head in [20, 0] {
                let (seq_t, bat_t) = (format!("seq{head}"), format!("bat{head}"));
                for r in reqs(&seq_t).iter().chain(&reqs(&bat_t)[..head]) {
                    q.enqueue(r).await.expect("enqueue");
                }
                let bat = Requests(reqs(&bat_t)[head..].to_vec());
                let mut tx = q.store().begin_write("test").await.expect("begin");
                Requests::run(&mut tx, vec![&bat]).await.expect("batch");
                tx.commit().await.expect("commit");
                let mut jobs = [
                    q.claim().await.expect("claim").expect("a job"),
                    q.claim().await.expect("claim").expect("a job"),
                ];
                assert!(q.claim().await.expect("claim").is_none());
                jobs.sort_by(|a, b| a.target.cmp(&b.target));
                let [bat, seq] = [&jobs[0], &jobs[1]];
                let kind = (q.store().kind(), head);
                assert_eq!(seq.triggers, bat.triggers, "{kind:?}");
                assert_eq!(seq.requested_sha, bat.requested_sha, "{kind:?}");
                assert_eq!(seq.receiver, bat.receiver, "{kind:?}");
                assert_eq!(seq.delivery_ids, bat.delivery_ids, "{kind:?}");
                assert_eq!(seq.delivery_ids.len(), 100, "{kind:?}");
                assert_eq!(
                    seq.triggers,
                    [Trigger::Webhook, Trigger::Interval, Trigger::Manual]
                );
                assert_eq!(seq.requested_sha.as_deref(), Some("sha299"));
                assert_eq!(seq.receiver.as_deref(), Some("r297"));
                assert_eq!(seq.delivery_ids.last().map(String::as_str), Some("d296"));
            }
        }
    }

    /// A delivery wakes a worker only for a job one can take now: one
    /// queued behind its target's running job is left to that job's
    /// worker, which looks again when it ends.
    #[tokio::test]
    async fn a_job_behind_a_running_one_wakes_no_worker() {
        for (_d, q) in queues().await {
            let push =
                |d: &str| intake(d, vec![req("web", Trigger::Webhook, Some("aaa"), Some(d))]);
            let woke = |a: Accepted| match a {
                Accepted::Queued { new_job, .. } => new_job,
                Accepted::Duplicate => panic!("taken as a duplicate"),
            };
            assert!(woke(q.accept(push("d1")).await.expect("accept")));
            // Folded into the queued job: nothing new.
            assert!(!woke(q.accept(push("d2")).await.expect("accept")));
            let job = q.claim().await.expect("claim").expect("a job");
            assert!(!woke(q.accept(push("d3")).await.expect("accept")));
            q.finish(job.id, None, "changed").await.expect("finish");
            let next = q.claim().await.expect("claim").expect("the job behind");
            assert_eq!(next.delivery_ids, vec!["d3"]);
            q.finish(next.id, None, "no_change").await.expect("finish");
            assert!(woke(q.accept(push("d4")).await.expect("accept")));
        }
    }

    /// Deliveries written together: the first of the batch with an id is
    /// taken, a later one and one seen before are duplicates, and the
    /// requests fold in the order the deliveries came.
    #[tokio::test]
    async fn deliveries_written_together_are_taken_once_in_order() {
        for (_d, q) in queues().await {
            let push = |d: &str, t: &str, sha: &str| {
                intake(d, vec![req(t, Trigger::Webhook, Some(sha), Some(d))])
            };
            assert!(matches!(
                q.accept(push("d0", "api", "000")).await.expect("accept"),
                Accepted::Queued { new_job: true, .. }
            ));
            let batch = [
                push("d1", "web", "aaa"),
                push("d0", "web", "xxx"), // seen before
                intake(
                    "d2",
                    vec![
                        req("web", Trigger::Webhook, Some("bbb"), Some("d2")),
                        req("api", Trigger::Webhook, Some("bbb"), Some("d2")),
                    ],
                ),
                push("d1", "web", "yyy"), // earlier in this batch
                push("d3", "web", "ccc"),
            ];
            let mut tx = q.store().begin_write("test").await.expect("begin");
            let out = Intake::run(&mut tx, batch.iter().collect())
                .await
                .expect("batch");
            tx.commit().await.expect("commit");
            assert_eq!(out.len(), 5);
            assert_eq!(out[1], Accepted::Duplicate);
            assert_eq!(out[3], Accepted::Duplicate);
            let jobs = |a: &Accepted| match a {
                Accepted::Queued { jobs, .. } => jobs.clone(),
                Accepted::Duplicate => panic!("a duplicate"),
            };
            let web = jobs(&out[0])[0].1;
            assert_eq!(jobs(&out[4]), vec![("web".to_string(), web)]);
            let api = jobs(&out[2]);
            assert_eq!(api[0], ("web".to_string(), web));
            assert_ne!(api[1].1, web);
            let first = q.claim().await.expect("claim").expect("api's job");
            assert_eq!(first.target, "api");
            assert_eq!(first.delivery_ids, vec!["d0", "d2"]);
            let job = q.claim().await.expect("claim").expect("web's job");
            assert_eq!(job.id, web);
            assert_eq!(job.requested_sha.as_deref(), Some("ccc"));
            assert_eq!(job.delivery_ids, vec!["d1", "d2", "d3"]);
            let kept: Vec<String> =
                sqlx::query_scalar("SELECT delivery_id FROM deliveries ORDER BY delivery_id")
                    .fetch_all(q.store().pool())
                    .await
                    .expect("deliveries");
            assert_eq!(kept, vec!["d0", "d1", "d2", "d3"]);
        }
    }

    /// Many deliveries at once (batched by the writer as they come): each
    /// id taken exactly once, every request in its target's one job.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deliveries_arriving_together_are_each_taken_once() {
        for (_d, q) in queues().await {
            let mut all = Vec::new();
            for n in 0..200 {
                let q = q.clone();
                let id = format!("d{}", n % 150);
                let target = format!("t{}", n % 7);
                all.push(tokio::spawn(async move {
                    q.accept(intake(
                        &id,
                        vec![req(&target, Trigger::Webhook, Some("abc"), Some(&id))],
                    ))
                    .await
                    .map(|a| (id, a))
                }));
            }
            let mut taken = std::collections::BTreeSet::new();
            for h in all {
                let (id, a) = h.await.expect("task").expect("accept");
                if a != Accepted::Duplicate {
                    assert!(taken.insert(id.clone()), "{id} taken twice");
                }
            }
            assert_eq!(taken.len(), 150);
            let mut ids = 0;
            while let Some(job) = q.claim().await.expect("claim") {
                ids += job.delivery_ids.len();
            }
            assert_eq!(ids, 150);
        }
    }

    #[tokio::test]
    async fn requeue_merges_into_a_newer_queued_job() {
        for (_d, q) in queues().await {
            q.enqueue(&req("web", Trigger::Webhook, Some("old"), Some("d1")))
                .await
                .expect("enqueue");
            let running = q.claim().await.expect("claim").expect("job");
            let newer = q
                .enqueue(&req("web", Trigger::Interval, None, None))
                .await
                .expect("enqueue");
            q.requeue(running.id, Duration::ZERO)
                .await
                .expect("requeue");
            let job = q.claim().await.expect("claim").expect("job");
            assert_eq!(job.id, newer);
            assert_eq!(job.triggers, vec![Trigger::Webhook, Trigger::Interval]);
            assert_eq!(job.delivery_ids, vec!["d1"]);
            assert_eq!(job.requested_sha.as_deref(), Some("old"));
        }
    }

    /// A manual apply of `web` begun for job `job`: its run id.
    /// The queue's store, with the target `web` (an exec target) known.
    async fn with_web(q: &Queue) -> Store {
        let store = q.store().clone();
        store
            .register_targets(&[("web", "exec")])
            .await
            .expect("register");
        store
    }

    async fn begin_manual_run(store: &Store, job: i64) -> i64 {
        store
            .begin_run(&crate::store::NewRun {
                target: "web",
                job_id: Some(job),
                operation: crate::store::Operation::Apply,
                trigger: "manual",
                delivery_id: None,
                requested_sha: None,
                receiver: None,
                sha: None,
            })
            .await
            .expect("run")
    }

    #[tokio::test]
    async fn expired_leases_are_recovered_and_runs_interrupted() {
        for (_d, q) in queues().await {
            q.enqueue(&req("web", Trigger::Manual, None, None))
                .await
                .expect("enqueue");
            let job = q.claim().await.expect("claim").expect("job");
            let store = with_web(&q).await;
            let run = begin_manual_run(&store, job.id).await;
            // not expired yet
            assert!(q.recover_expired().await.expect("recover").is_empty());
            let expire = sqlx::query("UPDATE jobs SET lease_until = 0 WHERE id = $1").bind(job.id);
            store.write_one("test", expire).await.expect("expire");
            assert_eq!(q.recover_expired().await.expect("recover"), vec![job.id]);
            let r = store.run(run).await.expect("read").expect("run row");
            assert_eq!(r.result.as_deref(), Some("interrupted"));
            let again = q.claim().await.expect("claim").expect("requeued");
            assert_eq!(again.id, job.id);
            assert_eq!(again.attempts, 2);
            assert_eq!(q.interruptions(job.id).await.expect("count"), 1);
            // Every interrupted job goes back, however often: the tick,
            // not the queue, ends one interrupted MAX_ATTEMPTS times.
            for n in 2..=MAX_ATTEMPTS + 1 {
                begin_manual_run(&store, job.id).await;
                q.recover(&[job.id]).await.expect("recover");
                assert_eq!(q.interruptions(job.id).await.expect("count"), n);
                let back = q.claim().await.expect("claim").expect("requeued again");
                assert_eq!(back.id, job.id);
            }
            // A run stopped another way (a tick error) is not counted.
            begin_manual_run(&store, job.id).await;
            q.requeue(job.id, std::time::Duration::ZERO)
                .await
                .expect("requeue");
            assert_eq!(
                q.interruptions(job.id).await.expect("count"),
                MAX_ATTEMPTS + 1
            );
            let back = q
                .claim()
                .await
                .expect("claim")
                .expect("requeued by the tick");
            assert_eq!(back.id, job.id);
            // someone else's heartbeat cannot keep it
            let other = Queue::new(store);
            assert!(!other.heartbeat(job.id).await.expect("hb"));
            assert!(q.heartbeat(job.id).await.expect("hb"));
            // A requeue with a delay is not claimed before it.
            q.requeue(job.id, std::time::Duration::from_secs(60))
                .await
                .expect("requeue");
            assert!(q.claim().await.expect("claim").is_none(), "claimed early");
            let not_before: i64 = sqlx::query_scalar("SELECT not_before FROM jobs WHERE id = $1")
                .bind(job.id)
                .fetch_one(q.store.pool())
                .await
                .expect("read");
            let now = crate::store::now_ms();
            assert!(
                (now + 55_000..=now + 60_000).contains(&not_before),
                "{not_before} vs {now}"
            );
        }
    }

    /// A worker whose job was taken over (its lease ran out, another
    /// process recovered and claimed it) records its run when it ends but
    /// does not close the job the other process now runs.
    #[tokio::test]
    async fn a_run_whose_job_was_taken_over_leaves_the_job_alone() {
        for (_d, q) in queues().await {
            let store = with_web(&q).await;
            q.enqueue(&req("web", Trigger::Manual, None, None))
                .await
                .expect("enqueue");
            let job = q.claim().await.expect("claim").expect("job");
            let run = begin_manual_run(&store, job.id).await;
            let expire = sqlx::query("UPDATE jobs SET lease_until = 0 WHERE id = $1").bind(job.id);
            store.write_one("test", expire).await.expect("expire");
            let other = Queue::new(store.clone());
            assert_eq!(
                other.recover_expired().await.expect("recover"),
                vec![job.id]
            );
            let taken = other.claim().await.expect("claim").expect("taken over");
            assert_eq!(taken.id, job.id);
            store
                .finish_run(
                    run,
                    "web",
                    crate::store::Operation::Apply,
                    Some("abc"),
                    &crate::model::Status {
                        result: crate::model::ApplyResult::Changed,
                        message: "applied".into(),
                        output_tail: String::new(),
                        digest: None,
                    },
                    None,
                    crate::store::history::Streak::No,
                )
                .await
                .expect("finish");
            let row = q.job(job.id).await.expect("read").expect("job row");
            assert_eq!(row.state.as_str(), "running", "{:?}", store.kind());
            assert!(
                other.heartbeat(job.id).await.expect("hb"),
                "{:?}",
                store.kind()
            );
            let runs: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM runs WHERE result = 'changed'")
                    .fetch_one(store.pool())
                    .await
                    .expect("runs");
            assert_eq!(runs, 1, "the run was not recorded as it ended");
        }
    }

    /// The scheduler's due targets are checked again inside the write that
    /// queues them: a target another instance queued, ran and finished
    /// after the scheduler read it gets no second interval tick.
    #[tokio::test]
    async fn an_interval_tick_is_not_queued_for_a_target_run_since_it_was_read() {
        for (_d, q) in queues().await {
            let store = with_web(&q).await;
            let read = |store: Store| async move {
                let c = store
                    .schedule_candidates(&["web".to_string()])
                    .await
                    .expect("candidates");
                assert_eq!(c.len(), 1);
                assert!(!c[0].active && !c[0].paused);
                c[0].last_run_at
            };
            let before = read(store.clone()).await;
            // Meanwhile another instance runs the target's interval tick.
            q.enqueue(&req("web", Trigger::Interval, None, None))
                .await
                .expect("enqueue");
            let job = q.claim().await.expect("claim").expect("job");
            let run = begin_manual_run(&store, job.id).await;
            q.finish(job.id, Some(run), "no_change")
                .await
                .expect("finish");
            let interval = || req("web", Trigger::Interval, None, None);
            let queued = q
                .enqueue_due(vec![(interval(), before)])
                .await
                .expect("enqueue_due");
            assert!(queued.is_empty(), "{:?}: {queued:?}", store.kind());
            assert!(
                q.claim().await.expect("claim").is_none(),
                "{:?}",
                store.kind()
            );
            // Read again, it is due by what it reads.
            let after = read(store.clone()).await;
            assert_ne!(after, before);
            let queued = q
                .enqueue_due(vec![(interval(), after)])
                .await
                .expect("enqueue_due");
            assert_eq!(queued, ["web"], "{:?}", store.kind());
            // Queued once: a second look finds it active.
            let queued = q
                .enqueue_due(vec![(interval(), after)])
                .await
                .expect("enqueue_due");
            assert!(queued.is_empty(), "{:?}: {queued:?}", store.kind());
        }
    }

    #[tokio::test]
    async fn start_now_refuses_a_second_running_job() {
        for (_d, q) in queues().await {
            let a = q.start_now("web", Trigger::Cli).await.expect("start");
            assert!(a.is_some());
            let b = q.start_now("web", Trigger::Cli).await.expect("start");
            assert!(b.is_none());
        }
    }
}
