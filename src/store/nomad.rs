//! Nomad deployments in SQLite: the [`Ledger`] the nomad backend writes
//! through. One active deployment per job is the unique partial index of
//! migration 0004, not a lock; a state change names the state it expects to
//! leave, so two writers can never both move one deployment.

use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::{Store, WriteTx, now_ms};
use crate::backend::BoxFuture;
use crate::backend::nomad::{Change, Deployment, JobKey, Ledger, LedgerError, NewDeployment};

const COLUMNS: &str = "id, target, cluster, namespace, job, file, commit_sha, spec_hash, policy, \
     state, job_modify_index, diff, diff_summary, registered_index, eval_id, \
     nomad_deployment_id, message";

fn row(r: &SqliteRow) -> Result<Deployment, sqlx::Error> {
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
    })
}

impl Store {
    fn ledger_err(&self, what: &'static str) -> impl FnOnce(sqlx::Error) -> LedgerError + '_ {
        move |e| LedgerError::Store(self.err(what)(e).to_string())
    }

    async fn one_deployment(
        &self,
        key: &JobKey,
        active_only: bool,
    ) -> Result<Option<Deployment>, LedgerError> {
        let active = if active_only {
            "AND state IN ('detected', 'pending_approval', 'pre_hook', 'applying', 'post_hook')"
        } else {
            ""
        };
        let q = format!(
            "SELECT {COLUMNS} FROM nomad_deployments
             WHERE cluster = ?1 AND namespace = ?2 AND job = ?3 {active}
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

    /// Deployments, newest first; only active ones with `active_only`.
    pub async fn nomad_deployments(
        &self,
        active_only: bool,
        limit: i64,
    ) -> Result<Vec<Deployment>, LedgerError> {
        let active = if active_only {
            "WHERE state IN ('detected', 'pending_approval', 'pre_hook', 'applying', 'post_hook')"
        } else {
            ""
        };
        let q =
            format!("SELECT {COLUMNS} FROM nomad_deployments {active} ORDER BY id DESC LIMIT ?1");
        let rows = sqlx::query(sqlx::AssertSqlSafe(q))
            .bind(limit)
            .fetch_all(self.pool())
            .await
            .map_err(self.ledger_err("listing Nomad deployments"))?;
        rows.iter()
            .map(row)
            .collect::<Result<_, _>>()
            .map_err(self.ledger_err("listing Nomad deployments"))
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
            let WriteTx { mut tx, _turn } = self
                .begin_write(what)
                .await
                .map_err(|e| LedgerError::Store(e.to_string()))?;
            let now = now_ms();
            let r = sqlx::query_scalar::<_, i64>(
                "INSERT INTO nomad_deployments (target, cluster, namespace, job, file, commit_sha,
                     spec_hash, policy, state, job_modify_index, diff, diff_summary, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13)
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
            let WriteTx { mut tx, _turn } = self
                .begin_write(what)
                .await
                .map_err(|e| LedgerError::Store(e.to_string()))?;
            let r = sqlx::query(
                "UPDATE nomad_deployments SET state = ?3,
                     message = COALESCE(?4, message),
                     job_modify_index = COALESCE(?5, job_modify_index),
                     registered_index = COALESCE(?6, registered_index),
                     eval_id = COALESCE(?7, eval_id),
                     nomad_deployment_id = COALESCE(?8, nomad_deployment_id),
                     updated_at = ?9
                 WHERE id = ?1 AND state = ?2",
            )
            .bind(id)
            .bind(from)
            .bind(to)
            .bind(change.message)
            .bind(change.job_modify_index)
            .bind(change.registered_index)
            .bind(change.eval_id)
            .bind(change.nomad_deployment_id)
            .bind(now_ms())
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
            tx.commit().await.map_err(self.ledger_err(what))?;
            Ok(())
        })
    }

    fn jobs_of<'a>(
        &'a self,
        target: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Deployment>, LedgerError>> {
        Box::pin(async move {
            let q = format!(
                "SELECT {COLUMNS} FROM nomad_deployments WHERE id IN (
                     SELECT MAX(id) FROM nomad_deployments WHERE target = ?1
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
