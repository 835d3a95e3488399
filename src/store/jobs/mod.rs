//! The `jobs`, `deliveries` and `target_deps` tables: every statement the
//! job queue runs. A request is a row before anyone is told it was
//! accepted; at most one *queued* job per target (a newer request folds
//! into it: its SHA wins, triggers and delivery ids are kept) and at most
//! one *running* job per target, both enforced by unique indexes rather
//! than by a mutex. A claim takes a lease that a heartbeat renews; a job
//! whose lease ran out goes back to the queue and the run it left open is
//! marked `interrupted`.
//!
//! Each statement stays beside the others it races, and beside it the
//! same statement as a job for SQLite's write thread (`store::direct`).
//! How long a lease lasts, how often a job may be interrupted and what an
//! interrupted run says are `queue`'s to decide, not this module's.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::FromRow;

use crate::model::Trigger;
use crate::store::Kind;
use crate::store::db::{JsonText, PG_NOW_MS, is_postgres, json_field};
use crate::store::{Store, StoreError, now_ms};

mod enqueue;
mod worker;
pub use enqueue::Intake;
use worker::{Claim, Finish};

/// The functions the write connection makes as it opens, on PostgreSQL
/// (`lock`: the advisory lock every write takes): the intake's, a
/// worker's claim's and its finish's (`Batch::locked`).
pub(crate) fn pg_functions(lock: i64) -> String {
    format!(
        "{};\n{}",
        enqueue::pg_functions(lock),
        worker::pg_functions(lock)
    )
}

fn json_text<T: Serialize>(v: &T) -> Result<String, sqlx::Error> {
    serde_json::to_string(v).map_err(|e| sqlx::Error::Encode(Box::new(e)))
}

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

/// The columns a claim returns of its job: a [`JobRow`].
const CLAIMED: &str = "id, target, triggers, requested_sha, delivery_ids, attempts, receiver";

/// The claim of the oldest runnable job at `$1` (now) by `$2` (the
/// owner) for `$3` (the lease, in milliseconds from `since`), which
/// returns it, leased ([`CLAIMED`]).
fn claim_sql(since: &str) -> String {
    format!(
        "UPDATE jobs SET state = 'running', lease_owner = $2, lease_until = {since} + $3,
                attempts = attempts + 1, updated_at = $1
         WHERE id = (SELECT j.id FROM jobs j WHERE {RUNNABLE} ORDER BY j.id LIMIT 1)
         RETURNING {CLAIMED}"
    )
}

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

/// The jobs table as one process writes it: its claims are `owner`'s and
/// last `lease` without a renewal.
#[derive(Clone, Debug)]
pub struct Jobs {
    store: Store,
    owner: String,
    lease: Duration,
}

impl Jobs {
    pub fn new(store: Store, owner: String, lease: Duration) -> Jobs {
        Jobs {
            store,
            owner,
            lease,
        }
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
    /// paused one, is not runnable); with `look_first`, only after a read
    /// found one.
    pub async fn claim(&self, look_first: bool) -> Result<Option<Job>, StoreError> {
        let now = now_ms();
        // Looked for first with a read, which waits for no writer: a worker
        // woken by a delivery whose job folded into one already running
        // (most of a burst) takes no write turn from the deliveries.
        if look_first {
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
        }
        let sql: std::sync::Arc<str> = claim_sql(self.clock("$1")).into();
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
    /// A job queued for the target by driftless alone (trigger
    /// `dependency`: a producer's outputs changed, a blocking dependency
    /// recovered; `rollback`: the tip was found unhealthy) is closed as
    /// part of this one: this run starts after it was queued, so it does
    /// what that job was queued for (a rollback, and a rollout's wave, go
    /// through the same `tick::health::aim`) — and without a daemon (`tick --all`) nothing
    /// else would ever take it. Jobs with any other trigger (a push's
    /// delivery, an API call) stay queued.
    pub async fn start_now(
        &self,
        target: &str,
        trigger: Trigger,
    ) -> Result<Option<Job>, StoreError> {
        let what = "starting a job";
        let now = now_ms();
        // Not synced: lost to a power cut, the claim took nothing (its
        // run has not begun), and the run's start, synced, takes it to
        // disk first.
        let mut tx = self.store.begin_write_unsynced(what).await?;
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
                                   WHERE value NOT IN ('dependency', 'rollback', 'rollout'))"
            } else {
                "UPDATE jobs SET state = 'done', outcome = $2, updated_at = $3
                 WHERE target = $1 AND state = 'queued'
                   AND NOT EXISTS (SELECT 1 FROM json_each(jobs.triggers)
                                   WHERE value NOT IN ('dependency', 'rollback', 'rollout'))"
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
    /// into a newer queued job for the same target if one arrived meanwhile;
    /// the run it left open ends `interrupted` with `message`.
    pub async fn requeue(
        &self,
        job_id: i64,
        delay: Duration,
        message: &str,
    ) -> Result<(), StoreError> {
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
        crate::store::runs::interrupt_runs(&mut tx, job_id, message)
            .await
            .map_err(self.store.err(what))?;
        requeue_in(&mut tx, job_id, now_ms() + delay.as_millis() as i64)
            .await
            .map_err(self.store.err(what))?;
        tx.commit().await.map_err(self.store.err(what))?;
        Ok(())
    }

    /// Put a running job back in the queue, unrun, to be claimed again
    /// after `delay` (its target's change window is shut): no run was
    /// begun, and its claim does not count as an attempt. Folded into a
    /// newer queued job for the same target if one arrived meanwhile.
    pub async fn defer(&self, job_id: i64, delay: Duration) -> Result<(), StoreError> {
        let what = "putting a job back to wait for its window";
        let mut tx = self.store.begin_write(what).await?;
        let ours = sqlx::query(
            "UPDATE jobs SET attempts = attempts - 1
             WHERE id = $1 AND state = 'running' AND lease_owner = $2 AND attempts > 0",
        )
        .bind(job_id)
        .bind(&self.owner)
        .execute(&mut *tx)
        .await
        .map_err(self.store.err(what))?;
        if ours.rows_affected() == 0 {
            return Ok(());
        }
        requeue_in(&mut tx, job_id, now_ms() + delay.as_millis() as i64)
            .await
            .map_err(self.store.err(what))?;
        tx.commit().await.map_err(self.store.err(what))?;
        Ok(())
    }

    /// Jobs whose lease expired go back to the queue (their process died);
    /// the runs they left open are marked `interrupted` with `message`.
    /// Returns the ids. On PostgreSQL, by the server's clock, checked again
    /// in the write transaction: a lease renewed meanwhile is left alone.
    pub async fn recover_expired(&self, message: &str) -> Result<Vec<i64>, StoreError> {
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
        self.recover_only(&expired, true, message).await
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
    /// and mark the runs they left open `interrupted` with `message`.
    pub async fn recover(&self, ids: &[i64], message: &str) -> Result<(), StoreError> {
        self.recover_only(ids, false, message).await.map(drop)
    }

    /// [`Jobs::recover`]; with `expired`, only the jobs whose lease has
    /// run out by the time the write transaction reads them (by the
    /// server's clock on PostgreSQL). Returns the ids recovered.
    async fn recover_only(
        &self,
        ids: &[i64],
        expired: bool,
        message: &str,
    ) -> Result<Vec<i64>, StoreError> {
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
            crate::store::runs::interrupt_runs(&mut tx, *id, message)
                .await
                .map_err(self.store.err(what))?;
            requeue_in(&mut tx, *id, now)
                .await
                .map_err(self.store.err(what))?;
        }
        tx.commit().await.map_err(self.store.err(what))?;
        Ok(done)
    }

    /// How many of job `job_id`'s runs ended `interrupted` with `message`.
    pub async fn interruptions(&self, job_id: i64, message: &str) -> Result<i64, StoreError> {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM runs WHERE job_id = $1 AND result = 'interrupted' AND message = $2",
        )
        .bind(job_id)
        .bind(message)
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

/// The job of run `$1` done with outcome `$2` at `$3`, if it is running
/// ([`close_with_run`]).
pub(in crate::store) const CLOSE_WITH_RUN: &str =
    "UPDATE jobs SET state = 'done', run_id = $1, outcome = $2, lease_owner = NULL,
            lease_until = NULL, updated_at = $3
     WHERE id = (SELECT job_id FROM runs WHERE id = $1) AND state = 'running'";

/// Close the job of run `run_id` as that run ended (`outcome`), in the
/// run's transaction: a job whose run is recorded is never run again.
pub(in crate::store) async fn close_with_run(
    tx: &mut crate::store::db::Conn,
    run_id: i64,
    outcome: &str,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(CLOSE_WITH_RUN)
        .bind(run_id)
        .bind(outcome)
        .bind(now)
        .execute(tx)
        .await
        .map(drop)
}

/// Job `$1` deleted if it is done and no run names it
/// ([`delete_if_unnamed`]).
pub(in crate::store) const DELETE_IF_UNNAMED: &str =
    "DELETE FROM jobs WHERE id = $1 AND state = 'done'
       AND NOT EXISTS (SELECT 1 FROM runs WHERE job_id = $1)";

/// Delete job `id` if it is done and no run names it (a streak's older
/// job, once the streak's row names the newer one).
pub(in crate::store) async fn delete_if_unnamed(
    tx: &mut crate::store::db::Conn,
    id: Option<i64>,
) -> Result<(), sqlx::Error> {
    sqlx::query(DELETE_IF_UNNAMED)
        .bind(id)
        .execute(tx)
        .await
        .map(drop)
}

/// Done jobs no run names, last changed before `$1`, at most `$2` of them
/// (`store::runs`' pruning runs it in batches).
pub(in crate::store) const PRUNE_JOBS: &str = "DELETE FROM jobs WHERE id IN (
     SELECT id FROM jobs WHERE state = 'done' AND updated_at < $1
       AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.job_id = jobs.id)
     LIMIT $2)";

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
