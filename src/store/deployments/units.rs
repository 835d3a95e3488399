//! Deployments of one unit of a target (a Nomad job today): the
//! [`Ledger`] a backend that deploys units writes through, over the
//! `deployments` table every backend's deployments live in
//! (`store::deployments` lists, decides and tells them, units included).
//! The backend's own fields are its `detail` JSON, read and written here
//! as an object and never looked into. One open deployment per unit is
//! the unique partial index of migration 0022, not a lock; a change names
//! the state it expects to leave and the detail it read, so two writers
//! can never both move one deployment. Pauses of units are here too.

use sqlx::Row;

use crate::ledger::{Detail, Ledger, LedgerError, NewUnit, Unit, UnitChange};
use crate::model::BoxFuture;
use crate::store::{Store, StoreError, now_ms};

const COLUMNS: &str = "id, target, unit, unit_key, commit_sha, plan_hash, policy, state, diff, \
     summary, message, waiting_since, overdue_at, created_at, detail";

/// The states in which a unit's deployment is still open, as an SQL list
/// (`PlanState::is_open`; the unique index of migration 0022 lists the
/// same).
fn open_states() -> String {
    crate::deploy::PlanState::ALL
        .into_iter()
        .filter(|s| s.is_open())
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn detail_of(id: i64, text: Option<&str>) -> Result<Detail, sqlx::Error> {
    let text = text.unwrap_or("{}");
    serde_json::from_str(text).map_err(|e| sqlx::Error::ColumnDecode {
        index: "detail".into(),
        source: format!("deployment {id}: {e}").into(),
    })
}

fn row(r: &crate::store::db::Row) -> Result<Unit, sqlx::Error> {
    let id = r.try_get("id")?;
    let detail: Option<String> = r.try_get("detail")?;
    Ok(Unit {
        id,
        target: r.try_get("target")?,
        unit: r.try_get("unit")?,
        unit_key: r.try_get("unit_key")?,
        commit_sha: r.try_get("commit_sha")?,
        spec_hash: r.try_get("plan_hash")?,
        policy: r.try_get("policy")?,
        state: r.try_get("state")?,
        diff: r.try_get("diff")?,
        summary: r.try_get("summary")?,
        message: r.try_get("message")?,
        waiting_since: r.try_get("waiting_since")?,
        overdue_at: r.try_get("overdue_at")?,
        created_at: r.try_get("created_at")?,
        detail: detail_of(id, detail.as_deref())?,
    })
}

impl Store {
    /// Pause (`by` set) or resume a unit of a target (a Nomad job). Returns
    /// whether it changed anything.
    pub async fn set_unit_paused(
        &self,
        target: &str,
        unit: &str,
        by: Option<&str>,
    ) -> Result<bool, StoreError> {
        let q = match by {
            Some(by) => sqlx::query(
                "INSERT INTO unit_pauses (target, unit, paused_by, paused_at)
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            )
            .bind(target)
            .bind(unit)
            .bind(by)
            .bind(now_ms()),
            None => sqlx::query("DELETE FROM unit_pauses WHERE target = $1 AND unit = $2")
                .bind(target)
                .bind(unit),
        };
        let r = self.write_one("pausing a unit", q).await?;
        Ok(r.rows_affected() > 0)
    }

    fn ledger_err(&self, what: &'static str) -> impl FnOnce(sqlx::Error) -> LedgerError + '_ {
        move |e| LedgerError::Store(self.err(what)(e).to_string())
    }

    async fn one_unit(
        &self,
        backend: &str,
        unit_key: &str,
        open_only: bool,
    ) -> Result<Option<Unit>, LedgerError> {
        let open = if open_only {
            format!("AND state IN ({})", open_states())
        } else {
            String::new()
        };
        let q = format!(
            "SELECT {COLUMNS} FROM deployments
             WHERE backend = $1 AND unit_key = $2 {open}
             ORDER BY id DESC LIMIT 1"
        );
        let what = "reading a unit's deployment";
        let r = sqlx::query(sqlx::AssertSqlSafe(q))
            .bind(backend)
            .bind(unit_key)
            .fetch_optional(self.pool())
            .await
            .map_err(self.ledger_err(what))?;
        r.as_ref()
            .map(row)
            .transpose()
            .map_err(self.ledger_err(what))
    }
}

impl Ledger for Store {
    fn active<'a>(
        &'a self,
        backend: &'static str,
        unit_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Unit>, LedgerError>> {
        Box::pin(self.one_unit(backend, unit_key, true))
    }

    fn latest<'a>(
        &'a self,
        backend: &'static str,
        unit_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Unit>, LedgerError>> {
        Box::pin(self.one_unit(backend, unit_key, false))
    }

    fn insert<'a>(&'a self, d: &'a NewUnit) -> BoxFuture<'a, Result<i64, LedgerError>> {
        Box::pin(async move {
            let what = "recording a unit's deployment";
            self.changes.deployment();
            let mut tx = self
                .begin_write(what)
                .await
                .map_err(|e| LedgerError::Store(e.to_string()))?;
            let now = now_ms();
            let detail = serde_json::Value::Object(d.detail.clone()).to_string();
            let r = sqlx::query_scalar::<_, i64>(
                "INSERT INTO deployments (backend, target, unit, unit_key, unit_label, commit_sha,
                     plan_hash, policy, state, diff, summary, destructive, detail, created_at,
                     updated_at, on_approval)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $14, $15)
                 RETURNING id",
            )
            .bind(d.backend)
            .bind(&d.target)
            .bind(&d.unit)
            .bind(&d.unit_key)
            .bind(&d.unit_label)
            .bind(&d.commit_sha)
            .bind(&d.spec_hash)
            .bind(d.policy.as_str())
            .bind(d.state)
            .bind(&d.diff)
            .bind(&d.summary)
            .bind(i64::from(d.destructive))
            .bind(&detail)
            .bind(now)
            .bind(d.on_approval)
            .fetch_one(&mut *tx)
            .await;
            let id = match r {
                Ok(id) => id,
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    return Err(LedgerError::Conflict(format!(
                        "{} already has an open deployment (one at a time, enforced by the database)",
                        d.unit_label
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
                Some(&d.summary),
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
        change: UnitChange,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let what = "changing a unit's deployment";
            let mut tx = self
                .begin_write(what)
                .await
                .map_err(|e| LedgerError::Store(e.to_string()))?;
            let read: Option<(String, Option<String>)> = sqlx::query_as(
                "SELECT target, detail FROM deployments
                 WHERE id = $1 AND state = $2 AND unit_key IS NOT NULL",
            )
            .bind(id)
            .bind(from)
            .fetch_optional(&mut *tx)
            .await
            .map_err(self.ledger_err(what))?;
            let Some((target, before)) = read else {
                return Err(LedgerError::Conflict(format!(
                    "deployment {id} is no longer `{from}` (another process moved it)"
                )));
            };
            let mut detail = detail_of(id, before.as_deref()).map_err(self.ledger_err(what))?;
            detail.extend(change.detail);
            let after = serde_json::Value::Object(detail).to_string();
            // The detail read is part of the condition: a change that came
            // between the read and this write (another instance's, on
            // PostgreSQL) is a conflict, never overwritten.
            let r = sqlx::query(
                "UPDATE deployments SET state = $3,
                     message = COALESCE($4, message),
                     detail = $5,
                     updated_at = $6,
                     -- waiting for promotion: since when (kept across a
                     -- refused promotion), and the owners are told anew
                     waiting_since = CASE WHEN $3 = 'pending_promotion'
                         THEN COALESCE(waiting_since, $6) ELSE waiting_since END,
                     notified_at = CASE WHEN $3 = 'pending_promotion' AND $2 <> 'pending_promotion'
                         THEN NULL ELSE notified_at END,
                     overdue_at = CASE WHEN $7 THEN COALESCE(overdue_at, $6) ELSE overdue_at END
                 WHERE id = $1 AND state = $2 AND detail = $8",
            )
            .bind(id)
            .bind(from)
            .bind(to)
            .bind(change.message.as_deref())
            .bind(&after)
            .bind(now_ms())
            .bind(change.overdue)
            .bind(before.as_deref())
            .execute(&mut *tx)
            .await;
            let r = match r {
                Ok(r) => r,
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    return Err(LedgerError::Conflict(format!(
                        "deployment {id}: its unit already has another open deployment"
                    )));
                }
                Err(e) => return Err(self.ledger_err(what)(e)),
            };
            if r.rows_affected() != 1 {
                return Err(LedgerError::Conflict(format!(
                    "deployment {id} is no longer `{from}` (another process moved it)"
                )));
            }
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
        unit: &'a str,
    ) -> BoxFuture<'a, Result<bool, LedgerError>> {
        Box::pin(async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM unit_pauses WHERE target = $1 AND unit = $2",
            )
            .bind(target)
            .bind(unit)
            .fetch_one(self.pool())
            .await
            .map_err(self.ledger_err("reading a unit's pause"))?;
            Ok(n > 0)
        })
    }

    fn units_of<'a>(
        &'a self,
        backend: &'static str,
        target: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Unit>, LedgerError>> {
        Box::pin(async move {
            let q = format!(
                "SELECT {COLUMNS} FROM deployments WHERE id IN (
                     SELECT MAX(id) FROM deployments
                     WHERE backend = $1 AND target = $2 AND unit_key IS NOT NULL
                     GROUP BY unit_key)
                 ORDER BY unit, id"
            );
            let what = "listing a target's units";
            let rows = sqlx::query(sqlx::AssertSqlSafe(q))
                .bind(backend)
                .bind(target)
                .fetch_all(self.pool())
                .await
                .map_err(self.ledger_err(what))?;
            rows.iter()
                .map(row)
                .collect::<Result<_, _>>()
                .map_err(self.ledger_err(what))
        })
    }
}
