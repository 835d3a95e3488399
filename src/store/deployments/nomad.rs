//! Nomad deployments in SQLite: the [`Ledger`] the nomad backend writes
//! through, over the `deployments` table every backend's deployments live
//! in (`store::deployments` lists, decides and tells them, Nomad's included).
//! Here are only the job-level reads and writes of Nomad's deployment
//! machinery, and the job pauses. One active deployment per job is the
//! unique partial index of migration 0010, not a lock; a state change
//! names the state it expects to leave, so two writers can never both move
//! one deployment.

use sqlx::Row;

pub use crate::ledger::Deployment;
use crate::ledger::{Change, JobKey, Ledger, LedgerError, NewDeployment};
use crate::model::BoxFuture;
use crate::store::{Store, StoreError, now_ms};

const COLUMNS: &str = "id, target, cluster, namespace, job, file, commit_sha, \
     plan_hash AS spec_hash, policy, state, job_modify_index, diff, summary AS diff_summary, \
     registered_index, eval_id, \
     nomad_deployment_id, message, pre_hook, post_hook, hook_timeout_ms, hook_nonce, \
     pre_hook_child, post_hook_child, registered_at, failed_at_index, waiting_since, overdue_at, \
     created_at";

fn row(r: &crate::store::db::Row) -> Result<Deployment, sqlx::Error> {
    Ok(Deployment {
        id: r.try_get("id")?,
        target: r.try_get("target")?,
        key: JobKey {
            cluster: r.try_get("cluster")?,
            namespace: r.try_get("namespace")?,
            job: r.try_get("job")?,
        },
        file: r.try_get("file")?,
        commit_sha: r.try_get("commit_sha")?,
        spec_hash: r.try_get("spec_hash")?,
        policy: r.try_get("policy")?,
        state: r.try_get("state")?,
        job_modify_index: r.try_get("job_modify_index")?,
        diff: r.try_get("diff")?,
        diff_summary: r.try_get("diff_summary")?,
        registered_index: r.try_get("registered_index")?,
        eval_id: r.try_get("eval_id")?,
        nomad_deployment_id: r.try_get("nomad_deployment_id")?,
        message: r.try_get("message")?,
        pre_hook: r.try_get("pre_hook")?,
        post_hook: r.try_get("post_hook")?,
        hook_timeout_ms: r.try_get("hook_timeout_ms")?,
        hook_nonce: r.try_get("hook_nonce")?,
        pre_hook_child: r.try_get("pre_hook_child")?,
        post_hook_child: r.try_get("post_hook_child")?,
        registered_at: r.try_get("registered_at")?,
        failed_at_index: r.try_get("failed_at_index")?,
        waiting_since: r.try_get("waiting_since")?,
        overdue_at: r.try_get("overdue_at")?,
        created_at: r.try_get("created_at")?,
    })
}

impl Store {
    /// Pause (`by` set) or resume a job of a target. Returns whether it
    /// changed anything.
    pub async fn set_job_paused(
        &self,
        target: &str,
        job: &str,
        by: Option<&str>,
    ) -> Result<bool, StoreError> {
        let q = match by {
            Some(by) => sqlx::query(
                "INSERT INTO nomad_job_pauses (target, job, paused_by, paused_at)
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            )
            .bind(target)
            .bind(job)
            .bind(by)
            .bind(now_ms()),
            None => sqlx::query("DELETE FROM nomad_job_pauses WHERE target = $1 AND job = $2")
                .bind(target)
                .bind(job),
        };
        let r = self.write_one("pausing a job", q).await?;
        Ok(r.rows_affected() > 0)
    }

    fn ledger_err(&self, what: &'static str) -> impl FnOnce(sqlx::Error) -> LedgerError + '_ {
        move |e| LedgerError::Store(self.err(what)(e).to_string())
    }

    async fn one_deployment(
        &self,
        key: &JobKey,
        active_only: bool,
    ) -> Result<Option<Deployment>, LedgerError> {
        let active = if active_only {
            "AND state IN ('detected', 'pending_approval', 'pre_hook', 'applying', \
             'pending_promotion', 'promoting', 'post_hook')"
        } else {
            ""
        };
        let q = format!(
            "SELECT {COLUMNS} FROM deployments
             WHERE backend = 'nomad' AND cluster = $1 AND namespace = $2 AND job = $3 {active}
             ORDER BY id DESC LIMIT 1"
        );
        let r = sqlx::query(sqlx::AssertSqlSafe(q))
            .bind(&key.cluster)
            .bind(&key.namespace)
            .bind(&key.job)
            .fetch_optional(self.pool())
            .await
            .map_err(self.ledger_err("reading a Nomad deployment"))?;
        r.as_ref()
            .map(row)
            .transpose()
            .map_err(self.ledger_err("reading a Nomad deployment"))
    }
}

impl Ledger for Store {
    fn active<'a>(
        &'a self,
        key: &'a JobKey,
    ) -> BoxFuture<'a, Result<Option<Deployment>, LedgerError>> {
        Box::pin(self.one_deployment(key, true))
    }

    fn latest<'a>(
        &'a self,
        key: &'a JobKey,
    ) -> BoxFuture<'a, Result<Option<Deployment>, LedgerError>> {
        Box::pin(self.one_deployment(key, false))
    }

    fn insert<'a>(&'a self, d: &'a NewDeployment) -> BoxFuture<'a, Result<i64, LedgerError>> {
        Box::pin(async move {
            let what = "recording a Nomad deployment";
            let mut tx = self
                .begin_write(what)
                .await
                .map_err(|e| LedgerError::Store(e.to_string()))?;
            let now = now_ms();
            let r = sqlx::query_scalar::<_, i64>(
                "INSERT INTO deployments (backend, target, cluster, namespace, job, file, commit_sha,
                     plan_hash, policy, state, job_modify_index, diff, summary, created_at, updated_at,
                     pre_hook, post_hook, hook_timeout_ms, hook_nonce, destructive)
                 VALUES ('nomad', $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14,
                         $15, $16, $17, $18)
                 RETURNING id",
            )
            .bind(&d.target)
            .bind(&d.key.cluster)
            .bind(&d.key.namespace)
            .bind(&d.key.job)
            .bind(&d.file)
            .bind(&d.commit_sha)
            .bind(&d.spec_hash)
            .bind(d.policy.as_str())
            .bind(d.state)
            .bind(d.job_modify_index)
            .bind(&d.diff)
            .bind(&d.diff_summary)
            .bind(now)
            .bind(&d.pre_hook)
            .bind(&d.post_hook)
            .bind(d.hook_timeout_ms)
            .bind(&d.hook_nonce)
            .bind(i64::from(d.destructive()))
            .fetch_one(&mut *tx)
            .await;
            let id = match r {
                Ok(id) => id,
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    return Err(LedgerError::Conflict(format!(
                        "job {}/{} already has an active deployment (one at a time, enforced by the database)",
                        d.key.namespace, d.key.job
                    )));
                }
                Err(e) => return Err(self.ledger_err(what)(e)),
            };
            super::event(
                &mut tx,
                id,
                &d.target,
                "driftless",
                None,
                d.state,
                Some(&d.diff_summary),
            )
            .await
            .map_err(self.ledger_err(what))?;
            tx.commit().await.map_err(self.ledger_err(what))?;
            Ok(id)
        })
    }

    fn transition<'a>(
        &'a self,
        id: i64,
        from: &'a str,
        to: &'a str,
        change: Change,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let what = "changing a Nomad deployment's state";
            let mut tx = self
                .begin_write(what)
                .await
                .map_err(|e| LedgerError::Store(e.to_string()))?;
            let r = sqlx::query(
                "UPDATE deployments SET state = $3,
                     message = COALESCE($4, message),
                     job_modify_index = COALESCE($5, job_modify_index),
                     registered_index = COALESCE($6, registered_index),
                     eval_id = COALESCE($7, eval_id),
                     nomad_deployment_id = COALESCE($8, nomad_deployment_id),
                     updated_at = $9,
                     pre_hook_child = COALESCE($10, pre_hook_child),
                     post_hook_child = COALESCE($11, post_hook_child),
                     registered_at = CASE WHEN $6 IS NULL THEN registered_at ELSE $9 END,
                     failed_at_index = COALESCE($12, failed_at_index),
                     -- waiting for promotion: since when (kept across a
                     -- refused promotion), and the owners are told anew
                     waiting_since = CASE WHEN $3 = 'pending_promotion'
                         THEN COALESCE(waiting_since, $9) ELSE waiting_since END,
                     notified_at = CASE WHEN $3 = 'pending_promotion' AND $2 <> 'pending_promotion'
                         THEN NULL ELSE notified_at END,
                     overdue_at = CASE WHEN $13 THEN COALESCE(overdue_at, $9) ELSE overdue_at END
                 WHERE id = $1 AND state = $2 AND backend = 'nomad'",
            )
            .bind(id)
            .bind(from)
            .bind(to)
            .bind(change.message.as_deref())
            .bind(change.job_modify_index)
            .bind(change.registered_index)
            .bind(change.eval_id)
            .bind(change.nomad_deployment_id)
            .bind(now_ms())
            .bind(change.pre_hook_child)
            .bind(change.post_hook_child)
            .bind(change.failed_at_index)
            .bind(change.overdue)
            .execute(&mut *tx)
            .await;
            let r = match r {
                Ok(r) => r,
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    return Err(LedgerError::Conflict(format!(
                        "deployment {id}: the job already has another active deployment"
                    )));
                }
                Err(e) => return Err(self.ledger_err(what)(e)),
            };
            if r.rows_affected() != 1 {
                return Err(LedgerError::Conflict(format!(
                    "deployment {id} is no longer `{from}` (another process moved it)"
                )));
            }
            let target: String = sqlx::query_scalar("SELECT target FROM deployments WHERE id = $1")
                .bind(id)
                .fetch_one(&mut *tx)
                .await
                .map_err(self.ledger_err(what))?;
            super::event(
                &mut tx,
                id,
                &target,
                change.actor.as_deref().unwrap_or("driftless"),
                Some(from),
                to,
                change.message.as_deref(),
            )
            .await
            .map_err(self.ledger_err(what))?;
            tx.commit().await.map_err(self.ledger_err(what))?;
            Ok(())
        })
    }

    fn is_paused<'a>(
        &'a self,
        target: &'a str,
        job: &'a str,
    ) -> BoxFuture<'a, Result<bool, LedgerError>> {
        Box::pin(async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM nomad_job_pauses WHERE target = $1 AND job = $2",
            )
            .bind(target)
            .bind(job)
            .fetch_one(self.pool())
            .await
            .map_err(self.ledger_err("reading a job's pause"))?;
            Ok(n > 0)
        })
    }

    fn jobs_of<'a>(
        &'a self,
        target: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Deployment>, LedgerError>> {
        Box::pin(async move {
            let q = format!(
                "SELECT {COLUMNS} FROM deployments WHERE id IN (
                     SELECT MAX(id) FROM deployments WHERE backend = 'nomad' AND target = $1
                     GROUP BY cluster, namespace, job)
                 ORDER BY namespace, job"
            );
            let rows = sqlx::query(sqlx::AssertSqlSafe(q))
                .bind(target)
                .fetch_all(self.pool())
                .await
                .map_err(self.ledger_err("listing a target's Nomad jobs"))?;
            rows.iter()
                .map(row)
                .collect::<Result<_, _>>()
                .map_err(self.ledger_err("listing a target's Nomad jobs"))
        })
    }
}
