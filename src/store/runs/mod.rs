//! The `runs` table: a run recorded before its backend is called, its
//! result folded into its target's state with its job closed and its
//! owners' notifications queued, in one transaction; the history read
//! back; a streak of identical `no_change` runs kept as one row, and what
//! is older than `[history] keep` pruned in small batches (migration
//! 0013). A run's start and its end are group writes (`batch`): runs
//! starting or ending together share a commit.
//!
//! A run joins a streak when the target's run just before it is a
//! `no_change` apply of the same commit, trigger and message with no
//! delivery id, and nothing else happened with it (no notification, no
//! drift or plan change: the caller decides that). Pruning never takes a
//! run still going, a target's last run, or the run that last changed a
//! target, and takes at most [`BATCH`] rows a transaction, so a tick
//! waits for one small batch at most. This module decides nothing about
//! what a run means; it keeps and forgets rows.

use std::time::Duration;

use super::{NewRun, Notice, Operation, Run, Store, StoreError, TargetState, now_ms};
use crate::model::Status;

mod batch;

/// Rows one pruning transaction deletes at most.
pub const BATCH: i64 = 500;

/// Finished jobs no run names are kept this long at most (a job is a
/// request being watched; its run is the history).
const JOBS_KEEP: Duration = Duration::from_secs(24 * 3600);

type Tx = crate::store::db::Tx;

/// What one pruning pass deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub runs: u64,
    pub jobs: u64,
    pub notifications: u64,
    pub statuses: u64,
    /// Chunks of run output (`run_output`).
    pub output: u64,
}

/// Which streak a finished `no_change` run joins, told to
/// [`Store::finish_run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streak<'a> {
    /// None: the run keeps its own row.
    No,
    /// The row [`Store::streak`] found (for a caller that must know it
    /// first: its commit status links to it).
    Row(i64),
    /// Whatever row the target's run before this one is, looked for in the
    /// run's closing transaction (no read of its own): a `no_change`
    /// apply of `sha` asked for by `trigger`, with the run's message.
    Find {
        sha: Option<&'a str>,
        trigger: &'a str,
    },
}

/// The target's run just before `run_id` when it is a `no_change` apply of
/// `sha` by `trigger` with `message` and no delivery (the streak a run
/// joins), and the job it names.
const STREAK_ROW: &str = "SELECT id, job_id FROM runs
     WHERE id = (SELECT MAX(id) FROM runs WHERE target = $1 AND id < $2)
       AND result = 'no_change' AND operation = 'apply' AND sha IS NOT DISTINCT FROM $3
       AND trigger = $4 AND message IS NOT DISTINCT FROM $5 AND delivery_id IS NULL";

/// The job the streak row `$1` names.
const STREAK_JOB: &str = "SELECT job_id FROM runs WHERE id = $1";

/// The streak row `$1` takes the finished run `$2` (its end `$3`, output
/// tail `$4`, result `$5`, message `$6`), if both are `no_change` with the
/// same message.
const FOLD_INTO: &str = "UPDATE runs SET finished_at = $3,
        duration_ms = $3 - (SELECT started_at FROM runs WHERE id = $2),
        repeats = repeats + 1, output_tail = $4,
        job_id = (SELECT job_id FROM runs WHERE id = $2)
     WHERE id = $1 AND result = 'no_change' AND $5 = 'no_change' AND message IS NOT DISTINCT FROM $6";

const DELETE_RUN: &str = "DELETE FROM runs WHERE id = $1";

/// Fold the finished run `run_id` into the streak `streak` says, in the
/// run's closing transaction: the streak row counts it, takes its end,
/// duration, output and job, and the run's own row goes, with the job the
/// streak named before (done, named by no run). Returns the id the run
/// now is: the streak's, or `run_id` when there is no (matching
/// `no_change`) streak row.
pub(super) async fn fold(
    tx: &mut Tx,
    target: &str,
    streak: Streak<'_>,
    run_id: i64,
    now: i64,
    status: &Status,
) -> Result<i64, sqlx::Error> {
    let found: Option<(i64, Option<i64>)> = match streak {
        Streak::No => None,
        Streak::Row(id) => sqlx::query_scalar(STREAK_JOB)
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?
            .map(|job| (id, job)),
        Streak::Find { sha, trigger } => {
            sqlx::query_as(STREAK_ROW)
                .bind(target)
                .bind(run_id)
                .bind(sha)
                .bind(trigger)
                .bind(&status.message)
                .fetch_optional(&mut **tx)
                .await?
        }
    };
    let Some((streak, older_job)) = found else {
        return Ok(run_id);
    };
    let folded = sqlx::query(FOLD_INTO)
        .bind(streak)
        .bind(run_id)
        .bind(now)
        .bind(&status.output_tail)
        .bind(status.result.as_str())
        .bind(&status.message)
        .execute(&mut **tx)
        .await?
        .rows_affected();
    if folded != 1 {
        return Ok(run_id);
    }
    super::run_output::fold(tx, run_id, streak).await?;
    sqlx::query(DELETE_RUN)
        .bind(run_id)
        .execute(&mut **tx)
        .await?;
    // The job of the streak's previous run is done and no run names it any
    // more: it goes now, so a streak keeps one job row, not one a tick.
    super::jobs::delete_if_unnamed(tx, older_job).await?;
    Ok(streak)
}

impl Store {
    /// The row a `no_change` run `run_id` of `target` would join: the
    /// target's run just before it, when that one is a `no_change` apply
    /// of `sha` asked for by `trigger`, with `message` and no delivery.
    pub async fn streak(
        &self,
        target: &str,
        run_id: i64,
        sha: Option<&str>,
        trigger: &str,
        message: &str,
    ) -> Result<Option<i64>, StoreError> {
        sqlx::query_as::<_, (i64, Option<i64>)>(STREAK_ROW)
            .bind(target)
            .bind(run_id)
            .bind(sha)
            .bind(trigger)
            .bind(message)
            .fetch_optional(&self.pool)
            .await
            .map(|row| row.map(|(id, _)| id))
            .map_err(self.err("reading a target's last run"))
    }

    /// Forget what is older than `keep`: finished runs (but each target's
    /// last run and the run that last changed it), finished jobs no run
    /// names (after a day at most), sent or given-up notifications and
    /// commit statuses. A batch a transaction, the writer let go between
    /// batches.
    pub async fn prune_history(&self, keep: Duration) -> Result<Pruned, StoreError> {
        let now = now_ms();
        let cutoff = now.saturating_sub(keep.as_millis() as i64);
        let jobs_cutoff = now.saturating_sub(keep.min(JOBS_KEEP).as_millis() as i64);
        // Read once: the runs no pass may take.
        let kept: Vec<Option<i64>> = sqlx::query_scalar(
            "SELECT last_run_id FROM targets
             UNION ALL
             SELECT (SELECT id FROM runs r WHERE r.target = t.name AND r.result = 'changed'
                     ORDER BY id DESC LIMIT 1) FROM targets t",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(self.err("reading the runs history keeps"))?;
        let kept = serde_json::to_string(&kept.into_iter().flatten().collect::<Vec<i64>>())
            .unwrap_or_else(|_| "[]".into());
        let runs = self
            .prune_batches(
                match self.kind {
                    super::Kind::Postgres => {
                        "DELETE FROM runs WHERE id IN (
                             SELECT id FROM runs WHERE finished_at < $1
                               AND id NOT IN (SELECT jsonb_array_elements_text($3::jsonb)::bigint)
                             LIMIT $2)"
                    }
                    super::Kind::Sqlite => {
                        "DELETE FROM runs WHERE id IN (
                             SELECT id FROM runs WHERE finished_at < $1
                               AND id NOT IN (SELECT value FROM json_each($3)) LIMIT $2)"
                    }
                },
                cutoff,
                Some(&kept),
            )
            .await?;
        let jobs = self
            .prune_batches(super::jobs::PRUNE_JOBS, jobs_cutoff, None)
            .await?;
        let notifications = self
            .prune_batches(super::outbox::PRUNE_NOTIFICATIONS, cutoff, None)
            .await?;
        let statuses = self
            .prune_batches(super::statuses::PRUNE_STATUSES, cutoff, None)
            .await?;
        // After the runs: a run's output goes once its run has.
        let output = self
            .prune_batches(super::run_output::PRUNE_OUTPUT, cutoff, None)
            .await?;
        Ok(Pruned {
            runs,
            jobs,
            notifications,
            statuses,
            output,
        })
    }

    /// Run `delete` (binding $1 the cutoff, $2 `extra`, $3 the batch size)
    /// until a batch takes less than a full one.
    async fn prune_batches(
        &self,
        delete: &'static str,
        cutoff: i64,
        extra: Option<&str>,
    ) -> Result<u64, StoreError> {
        let what = "pruning the history";
        let mut total = 0;
        loop {
            let mut tx = self.begin_write(what).await?;
            // `$1` the cutoff, `$2` the batch, `$3` the extra list if any
            // (PostgreSQL refuses a value for a parameter a statement
            // does not name).
            let mut q = sqlx::query(delete).bind(cutoff).bind(BATCH);
            if let Some(extra) = extra {
                q = q.bind(extra);
            }
            let n = q
                .execute(&mut *tx)
                .await
                .map_err(self.err(what))?
                .rows_affected();
            tx.commit().await.map_err(self.err(what))?;
            total += n;
            if n < BATCH as u64 {
                return Ok(total);
            }
            // Let the ticks waiting to write go first.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Store {
    /// Record the start of a run; the backend may be called only after this.
    pub async fn begin_run(&self, run: &NewRun<'_>) -> Result<i64, StoreError> {
        Ok(self.begin_run_with_state(run).await?.0)
    }

    /// [`Store::begin_run`], returning the target's state as the run's
    /// start left it, read in the same statement that notes the start.
    pub async fn begin_run_with_state(
        &self,
        run: &NewRun<'_>,
    ) -> Result<(i64, Option<TargetState>), StoreError> {
        let start = batch::Start::of(run, now_ms());
        let begun = self.batched("recording a run", start).await?;
        self.changes.run();
        Ok(begun)
    }

    /// As [`Store::begin_run_with_state`], for a run that may end without
    /// doing anything (its checkout already at the tip): on a command's
    /// SQLite store the start is committed without a sync, and the answer
    /// says so (`false`, else `true`: synced). Before such a run does what
    /// a power cut must not leave unrecorded — its backend runs —,
    /// [`Store::sync_log`] takes its start to disk; a run that ends
    /// without that is recorded by its end, which is synced (SQLite's log
    /// is synced whole).
    pub async fn begin_run_unsynced(
        &self,
        run: &NewRun<'_>,
    ) -> Result<(i64, Option<TargetState>, bool), StoreError> {
        if !self.writer.can_skip_syncs() {
            let (id, state) = self.begin_run_with_state(run).await?;
            return Ok((id, state, true));
        }
        let what = "recording a run";
        let start = batch::Start::of(run, now_ms());
        let mut tx = self.begin_write_unsynced(what).await?;
        let begun = <batch::Start as super::group::Batch>::run(&mut tx, vec![&start])
            .await
            .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))?;
        self.changes.run();
        let (id, state) = begun.into_iter().next().ok_or_else(|| self.lost(what))?;
        Ok((id, state, false))
    }

    /// Record which commit the run is about to apply (synced: a run begun
    /// unsynced is on disk after it, when the commit differs — SQLite
    /// writes nothing for an update that changes nothing).
    pub async fn set_run_sha(&self, run_id: i64, sha: &str) -> Result<(), StoreError> {
        let q = sqlx::query("UPDATE runs SET sha = $2 WHERE id = $1")
            .bind(run_id)
            .bind(sha);
        self.write_one("recording the run's commit", q).await?;
        Ok(())
    }

    /// Complete a run and fold its result into the target's state, closing
    /// the run's job. A failed run never moves the last applied SHA. With
    /// `streak` (a `no_change` row [`Store::streak`] found for it, or to
    /// be looked for), the run
    /// is folded into that row instead of kept as one of its own. Returns
    /// the id of the row the run now is.
    #[allow(clippy::too_many_arguments)]
    pub async fn finish_run(
        &self,
        run_id: i64,
        target: &str,
        operation: Operation,
        sha: Option<&str>,
        status: &Status,
        notice: Option<&Notice>,
        streak: Streak<'_>,
    ) -> Result<i64, StoreError> {
        let end = batch::End {
            run_id,
            target: target.to_string(),
            operation,
            sha: sha.map(str::to_string),
            status: status.clone(),
            notice: notice.cloned(),
            streak: streak.into(),
            now: now_ms(),
        };
        let kept = self.batched("recording a run's result", end).await?;
        self.changes.run();
        Ok(kept)
    }

    /// The newest runs of a target, newest first.
    pub async fn history(&self, target: &str, limit: i64) -> Result<Vec<Run>, StoreError> {
        sqlx::query_as::<_, Run>(
            "SELECT id, target, job_id, operation, trigger, delivery_id, requested_sha, sha,
                    started_at, finished_at, duration_ms, result, message, output_tail, receiver,
                    repeats
             FROM runs WHERE target = $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(target)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading run history"))
    }

    /// The row run `id` of `target` was folded into when it repeated the
    /// unchanged run before it (`fold`: a no-change streak keeps one row,
    /// older than the run): `None` if there is none.
    pub async fn folded_into(&self, target: &str, id: i64) -> Result<Option<Run>, StoreError> {
        Ok(self
            .history(target, 5)
            .await?
            .into_iter()
            .find(|r| r.id < id && r.result.as_deref() == Some("no_change")))
    }

    /// When run `id` started (ms): `None` if there is no such run.
    pub async fn run_started_at(&self, id: i64) -> Result<Option<i64>, StoreError> {
        sqlx::query_scalar("SELECT started_at FROM runs WHERE id = $1")
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(self.err("reading when a run started"))
    }

    pub async fn run(&self, id: i64) -> Result<Option<Run>, StoreError> {
        sqlx::query_as::<_, Run>(
            "SELECT id, target, job_id, operation, trigger, delivery_id, requested_sha, sha,
                    started_at, finished_at, duration_ms, result, message, output_tail, receiver,
                    repeats
             FROM runs WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .map_err(self.err("reading a run"))
    }

    /// When each target last finished a successful run (ms), for metrics.
    pub async fn last_successes(&self) -> Result<Vec<(String, i64)>, StoreError> {
        sqlx::query_as(
            "SELECT target, MAX(finished_at) FROM runs
             WHERE result IN ('changed', 'no_change') AND finished_at IS NOT NULL
             GROUP BY target ORDER BY target",
        )
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading the last successful runs"))
    }

    /// The commit of the target's newest apply that reached its backend and
    /// ended (changed, no change or failed; not one interrupted or stopped
    /// by git): what a push is compared against.
    pub async fn last_attempted_sha(&self, target: &str) -> Result<Option<String>, StoreError> {
        sqlx::query_scalar(
            "SELECT sha FROM runs WHERE target = $1 AND operation = 'apply' AND sha IS NOT NULL
                 AND result IN ('changed', 'no_change', 'failed')
             ORDER BY id DESC LIMIT 1",
        )
        .bind(target)
        .fetch_optional(self.pool())
        .await
        .map_err(self.err("reading a target's last run"))
    }
}

/// Close the runs job `id` left open, as `interrupted` with `message`.
pub(super) async fn interrupt_runs(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ApplyResult;
    use crate::store::{NewRun, Notice, Operation};

    /// A store on SQLite, one on PostgreSQL and one on SQLite writing
    /// through sqlx only (a run's start and end as PostgreSQL writes
    /// them), `web` registered in each.
    async fn stores() -> Vec<(std::sync::Arc<tempfile::TempDir>, Store)> {
        let dir = std::sync::Arc::new(tempfile::tempdir().expect("tempdir"));
        let mut out = Vec::new();
        let mut all = crate::store::testing::stores(dir.path()).await;
        all.push(crate::store::testing::sqlite_through_sqlx(dir.path()).await);
        for store in all {
            store
                .register_targets(&[("web", "exec")])
                .await
                .expect("register");
            out.push((dir.clone(), store));
        }
        out
    }

    fn status(result: ApplyResult, message: &str) -> Status {
        Status {
            result,
            message: message.into(),
            output_tail: String::new(),
            digest: None,
        }
    }

    /// A run of `web` with no job, its commit not yet known.
    fn new_run(trigger: &str) -> NewRun<'_> {
        NewRun {
            target: "web",
            job_id: None,
            operation: Operation::Apply,
            trigger,
            delivery_id: None,
            requested_sha: None,
            receiver: None,
            sha: None,
        }
    }

    /// One run of `web` at `sha`, finished with `result`, folded into a
    /// streak when it may be; returns the id it ends up as.
    async fn run(store: &Store, sha: &str, trigger: &str, result: ApplyResult) -> i64 {
        run_printing(store, sha, trigger, result, "").await
    }

    /// [`run`], its commands having printed `printed` (kept as its output).
    async fn run_printing(
        store: &Store,
        sha: &str,
        trigger: &str,
        result: ApplyResult,
        printed: &str,
    ) -> i64 {
        let id = store.begin_run(&new_run(trigger)).await.expect("begin");
        store.set_run_sha(id, sha).await.expect("sha");
        if !printed.is_empty() {
            store.append_output(id, 1, printed).await.expect("output");
        }
        let message = format!("{} at {sha}", result.as_str());
        // Interval runs look for their streak as they are recorded (as
        // the ticks of a target without commit statuses do), the others
        // before (as those with them do): both must fold alike.
        let streak = match result {
            ApplyResult::NoChange if trigger == "interval" => Streak::Find {
                sha: Some(sha),
                trigger,
            },
            ApplyResult::NoChange => store
                .streak("web", id, Some(sha), trigger, &message)
                .await
                .expect("streak")
                .map_or(Streak::No, Streak::Row),
            _ => Streak::No,
        };
        store
            .finish_run(
                id,
                "web",
                Operation::Apply,
                Some(sha),
                &status(result, &message),
                None,
                streak,
            )
            .await
            .expect("finish")
    }

    /// A run's start says whether its target has any deployment on record
    /// (a tick whose target has none, and that made none, reads for no
    /// plan to tell of); a plan made counts in `deployments_made`, and a
    /// row read otherwise never claims to have none.
    #[tokio::test]
    async fn a_runs_start_says_whether_its_target_has_deployments() {
        for (_dir, store) in stores().await {
            let (_, state) = store
                .begin_run_with_state(&new_run("interval"))
                .await
                .expect("begin");
            assert!(state.expect("web's row").no_deployments);
            let before = store.deployments_made();
            store
                .insert_plan(&crate::store::deployments::new_plan("web", "aaa"))
                .await
                .expect("plan");
            assert_eq!(store.deployments_made(), before + 1);
            let (_, state) = store
                .begin_run_with_state(&new_run("interval"))
                .await
                .expect("begin");
            assert!(!state.expect("web's row").no_deployments);
            let read = store.target_state("web").await.expect("read");
            assert!(!read.expect("web's row").no_deployments);
        }
    }

    #[tokio::test]
    async fn a_streak_of_identical_no_change_runs_is_one_row() {
        for (_dir, store) in stores().await {
            let changed = run(&store, "a", "interval", ApplyResult::Changed).await;
            let first = run(&store, "a", "interval", ApplyResult::NoChange).await;
            assert_ne!(first, changed, "a no_change after a change starts a streak");
            for _ in 0..5 {
                assert_eq!(
                    run(&store, "a", "interval", ApplyResult::NoChange).await,
                    first
                );
            }
            // Another trigger, another commit, a failure: rows of their own.
            let cli = run(&store, "a", "cli", ApplyResult::NoChange).await;
            assert_ne!(cli, first);
            let other = run(&store, "b", "cli", ApplyResult::NoChange).await;
            assert_ne!(other, cli);
            let failed = run(&store, "b", "cli", ApplyResult::Failed).await;
            let after = run(&store, "b", "cli", ApplyResult::NoChange).await;
            assert_ne!(after, other, "a failure in between ends the streak");
            assert_eq!(run(&store, "b", "cli", ApplyResult::NoChange).await, after);
            let rows = store.history("web", 100).await.expect("history");
            let repeats: Vec<(i64, i64)> = rows.iter().map(|r| (r.id, r.repeats)).collect();
            assert_eq!(
                repeats,
                [
                    (after, 2),
                    (failed, 1),
                    (other, 1),
                    (cli, 1),
                    (first, 6),
                    (changed, 1)
                ]
            );
            let streak = rows.iter().find(|r| r.id == first).expect("streak row");
            assert!(streak.finished_at >= Some(streak.started_at));
            let state = store
                .target_state("web")
                .await
                .expect("state")
                .expect("row");
            assert_eq!(state.last_run_id, Some(after));
        }
    }

    /// A streak keeps one job row: the job of the run it folded before
    /// goes with the next fold.
    #[tokio::test]
    async fn a_streak_keeps_one_job_row() {
        for (_dir, store) in stores().await {
            for result in [
                ApplyResult::Changed,
                ApplyResult::NoChange,
                ApplyResult::NoChange,
                ApplyResult::NoChange,
            ] {
                let mut tx = store.begin_write("test").await.expect("begin");
                let job: i64 = sqlx::query_scalar(
                    "INSERT INTO jobs (target, state, triggers, created_at, updated_at)
                 VALUES ('web', 'running', '[\"interval\"]', 0, 0) RETURNING id",
                )
                .fetch_one(&mut *tx)
                .await
                .expect("job");
                tx.commit().await.expect("commit");
                let id = store
                    .begin_run(&NewRun {
                        target: "web",
                        job_id: Some(job),
                        operation: Operation::Apply,
                        trigger: "interval",
                        delivery_id: None,
                        requested_sha: None,
                        receiver: None,
                        sha: Some("a"),
                    })
                    .await
                    .expect("begin");
                let message = format!("{} at a", result.as_str());
                let streak = store
                    .streak("web", id, Some("a"), "interval", &message)
                    .await
                    .expect("streak")
                    .map_or(Streak::No, Streak::Row);
                store
                    .finish_run(
                        id,
                        "web",
                        Operation::Apply,
                        Some("a"),
                        &status(result, &message),
                        None,
                        streak,
                    )
                    .await
                    .expect("finish");
            }
            let jobs: Vec<(i64, String)> = sqlx::query_as("SELECT id, state FROM jobs ORDER BY id")
                .fetch_all(store.pool())
                .await
                .expect("jobs");
            assert_eq!(
                jobs,
                [(1, "done".to_string()), (4, "done".to_string())],
                "the changed run's job and the streak's newest"
            );
        }
    }

    /// A run's output is its streak's once it folds into one (the newest
    /// run's, as the tail), and goes when its run is pruned.
    #[tokio::test]
    async fn a_runs_output_follows_it_into_its_streak_and_goes_with_it() {
        for (_dir, store) in stores().await {
            let text = |id| {
                let store = store.clone();
                async move {
                    let chunks = store.run_output(id, 0).await.expect("output");
                    chunks.into_iter().map(|c| c.data).collect::<String>()
                }
            };
            let first = run_printing(&store, "a", "interval", ApplyResult::NoChange, "one\n").await;
            let streak =
                run_printing(&store, "a", "interval", ApplyResult::NoChange, "two\n").await;
            assert_eq!(streak, first, "the second run folds into the first's row");
            assert_eq!(text(first).await, "two\n");
            let changed = run_printing(&store, "b", "cli", ApplyResult::Changed, "three\n").await;
            assert_eq!(text(changed).await, "three\n");
            run(&store, "c", "cli", ApplyResult::Changed).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            let pruned = store
                .prune_history(Duration::from_millis(1))
                .await
                .expect("prune");
            assert_eq!((pruned.runs, pruned.output), (2, 2), "{pruned:?}");
            assert_eq!(text(first).await, "");
            assert_eq!(text(changed).await, "");
        }
    }

    #[tokio::test]
    async fn pruning_keeps_the_last_run_and_the_last_change_of_each_target() {
        for (_dir, store) in stores().await {
            let changed = run(&store, "a", "cli", ApplyResult::Changed).await;
            let failed = run(&store, "a", "cli", ApplyResult::Failed).await;
            let older_change = run(&store, "b", "cli", ApplyResult::Changed).await;
            let last_change = run(&store, "c", "cli", ApplyResult::Changed).await;
            let last = run(&store, "c", "interval", ApplyResult::NoChange).await;
            // A run still going is never pruned.
            let going = store.begin_run(&new_run("cli")).await.expect("begin");
            tokio::time::sleep(Duration::from_millis(20)).await;
            let pruned = store
                .prune_history(Duration::from_millis(1))
                .await
                .expect("prune");
            assert_eq!(pruned.runs, 3, "{pruned:?}");
            let ids: Vec<i64> = store
                .history("web", 100)
                .await
                .expect("history")
                .iter()
                .map(|r| r.id)
                .collect();
            assert_eq!(ids, [going, last, last_change]);
            for gone in [changed, failed, older_change] {
                assert!(store.run(gone).await.expect("read").is_none());
            }
            // Nothing old enough: nothing goes.
            let pruned = store
                .prune_history(Duration::from_secs(3600))
                .await
                .expect("prune");
            assert_eq!(pruned, Pruned::default());
        }
    }

    /// What the rows of `runs`, `jobs` and `targets` say, timestamps the
    /// store makes left out, for comparing two stores.
    async fn rows(store: &Store) -> Vec<String> {
        // One JSON array a row (SQLite's json_array).
        let read = |sql: &'static str| sqlx::query_scalar::<_, String>(sql).fetch_all(store.pool());
        let runs = read(
            "SELECT json_array(id, job_id, operation, trigger, sha, result, message, repeats,
                               output_tail) FROM runs ORDER BY id",
        )
        .await
        .expect("runs");
        let jobs = read(
            "SELECT json_array(id, state, run_id, outcome, lease_owner) FROM jobs ORDER BY id",
        )
        .await
        .expect("jobs");
        let mut state = store
            .target_state("web")
            .await
            .expect("state")
            .expect("row");
        state.last_run_at = None;
        let mut out = runs;
        out.extend(jobs);
        out.push(format!("{state:?}"));
        out
    }

    /// A run's start and end written on SQLite's write thread leave the
    /// rows the same statements leave written through sqlx: a change with
    /// what the owners were told, a streak found as it is recorded and
    /// one found before, a failure, a destroy whose job was taken from it.
    #[tokio::test]
    async fn the_write_thread_writes_a_run_as_sqlx_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let direct = Store::open(&dir.path().join("direct.db"))
            .await
            .expect("store");
        let through_sqlx = crate::store::testing::sqlite_through_sqlx(dir.path()).await;
        let mut seen = Vec::new();
        for store in [direct, through_sqlx] {
            store
                .register_targets(&[("web", "exec")])
                .await
                .expect("register");
            // The rows after each step.
            let mut after = Vec::new();
            let steps: [(ApplyResult, &str, Operation, bool); 7] = [
                (ApplyResult::Changed, "interval", Operation::Apply, false),
                (ApplyResult::NoChange, "interval", Operation::Apply, false),
                (ApplyResult::NoChange, "interval", Operation::Apply, false),
                (ApplyResult::NoChange, "cli", Operation::Apply, false),
                (ApplyResult::Failed, "cli", Operation::Apply, false),
                (ApplyResult::Changed, "cli", Operation::Apply, false),
                (ApplyResult::Changed, "cli", Operation::Destroy, true),
            ];
            for (n, (result, trigger, op, taken)) in steps.into_iter().enumerate() {
                let mut tx = store.begin_write("test").await.expect("begin");
                let job: i64 = sqlx::query_scalar(
                    "INSERT INTO jobs (target, state, triggers, created_at, updated_at, lease_owner)
                     VALUES ('web', 'running', '[]', 0, 0, 'me') RETURNING id",
                )
                .fetch_one(&mut *tx)
                .await
                .expect("job");
                tx.commit().await.expect("commit");
                let (id, _) = store
                    .begin_run_with_state(&NewRun {
                        target: "web",
                        job_id: Some(job),
                        operation: op,
                        trigger,
                        delivery_id: None,
                        requested_sha: Some("ab"),
                        receiver: Some("here"),
                        sha: Some("abc"),
                    })
                    .await
                    .expect("begin");
                if taken {
                    let mut tx = store.begin_write("test").await.expect("begin");
                    sqlx::query("UPDATE runs SET result = 'interrupted' WHERE id = $1")
                        .bind(id)
                        .execute(&mut *tx)
                        .await
                        .expect("interrupt");
                    tx.commit().await.expect("commit");
                }
                let message = format!("{} by {trigger}", result.as_str());
                let streak = match (result, trigger) {
                    (ApplyResult::NoChange, "interval") => Streak::Find {
                        sha: Some("abc"),
                        trigger,
                    },
                    (ApplyResult::NoChange, _) => Streak::Row(id - 1),
                    _ => Streak::No,
                };
                let notice = Notice {
                    failing_since: Some(n as i64 * 10),
                    last_notified_at: Some(n as i64 * 10 + 1),
                    last_notified_message: Some(format!("told {n}")),
                    ..Notice::default()
                };
                let mut s = status(result, &message);
                s.output_tail = format!("tail {n}");
                s.digest = Some(format!("digest {n}"));
                store
                    .finish_run(id, "web", op, Some("abc"), &s, Some(&notice), streak)
                    .await
                    .expect("finish");
                after.push(rows(&store).await);
            }
            seen.push(after);
        }
        assert_eq!(seen[0], seen[1], "direct (left) and through sqlx (right)");
        assert_eq!(seen[0].len(), 7);
    }
}
