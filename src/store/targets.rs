//! The `targets` table: one row per target, what is known about it — the
//! commit last applied, the last result and run, failures in a row, what
//! its owners were last told, drift, pause and an accepted rewind. A run's
//! start and result are written here inside the run's transaction
//! (`store::runs`); nothing here decides what a result means.

use serde::Serialize;
use sqlx::FromRow;

use super::direct::{self, failure};
use super::{DriftUpdate, Kind, Notice, Operation, Store, StoreError, db, now_ms};
use crate::model::{ApplyResult, Status};

/// What is known about one target.
#[derive(Debug, Clone, Default, FromRow, Serialize)]
pub struct TargetState {
    pub name: String,
    pub backend: String,
    pub last_applied_sha: Option<String>,
    pub last_result: Option<String>,
    pub last_message: Option<String>,
    pub last_run_id: Option<i64>,
    pub last_run_at: Option<i64>,
    pub consecutive_failures: i64,
    pub backend_digest: Option<String>,
    pub paused_at: Option<i64>,
    pub paused_by: Option<String>,
    pub failing_since: Option<i64>,
    pub last_notified_at: Option<i64>,
    pub last_notified_message: Option<String>,
    /// What a `detect` plan last found different (see [`DriftUpdate`]).
    pub drift_hash: Option<String>,
    pub drift_summary: Option<String>,
    pub drift_since: Option<i64>,
    /// A branch tip that does not descend from the commit last applied,
    /// which a person accepted (`retry --accept-rewind`); cleared by the
    /// next successful apply.
    pub rewind_accepted: Option<String>,
    /// The last commit applied and found healthy (or applied with no
    /// health checks): what a rollback applies.
    pub healthy_sha: Option<String>,
    /// A commit found unhealthy, not applied again until a newer commit
    /// arrives or a person retries; and why.
    pub quarantined_sha: Option<String>,
    pub quarantine_reason: Option<String>,
    /// The run whose health checks have begun (its apply is done), and
    /// since when: a restart resumes them instead of applying again.
    pub health_run: Option<i64>,
    pub health_since: Option<i64>,
    /// True when the statement that notes a run's start found no
    /// deployment of the target on record (false where there are some, or
    /// where the row was read otherwise). Deployments of a target are made
    /// only by its runs, one at a time: with none at the start and none
    /// made by this process since ([`Store::deployments_made`]), a run
    /// has no plan to tell of.
    #[sqlx(default, try_from = "crate::store::db::Flag")]
    #[serde(skip)]
    pub no_deployments: bool,
}

/// A target the scheduler may queue (see [`Store::schedule_candidates`]).
#[derive(Debug, Clone, FromRow)]
pub struct Candidate {
    pub name: String,
    pub last_run_at: Option<i64>,
    #[sqlx(try_from = "crate::store::db::Flag")]
    pub paused: bool,
    /// A job of it is queued or running.
    #[sqlx(try_from = "crate::store::db::Flag")]
    pub active: bool,
}

/// [`Store::schedule_candidates`]'s query: the targets named in `$1`, a
/// JSON array.
fn candidates_sql(kind: Kind) -> &'static str {
    match kind {
        Kind::Postgres => {
            "SELECT t.name, t.last_run_at, t.paused_at IS NOT NULL AS paused,
                    (EXISTS (SELECT 1 FROM jobs j WHERE j.target = t.name AND j.state = 'queued')
                     OR EXISTS (SELECT 1 FROM jobs j WHERE j.target = t.name AND j.state = 'running'))
                        AS active
             FROM targets t WHERE t.name IN (SELECT jsonb_array_elements_text($1::jsonb))"
        }
        Kind::Sqlite => {
            "SELECT t.name, t.last_run_at, t.paused_at IS NOT NULL AS paused,
                    (EXISTS (SELECT 1 FROM jobs j WHERE j.target = t.name AND j.state = 'queued')
                     OR EXISTS (SELECT 1 FROM jobs j WHERE j.target = t.name AND j.state = 'running'))
                        AS active
             FROM targets t WHERE t.name IN (SELECT value FROM json_each($1))"
        }
    }
}

/// [`Store::schedule_candidates`] read again on `conn`, inside a write
/// (where no other instance's write can land between it and the write).
pub(crate) async fn candidates_on(
    conn: &mut db::Conn,
    kind: Kind,
    names: &[String],
) -> Result<Vec<Candidate>, sqlx::Error> {
    let names = serde_json::to_string(names).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    sqlx::query_as::<_, Candidate>(candidates_sql(kind))
        .bind(names)
        .fetch_all(conn)
        .await
}

/// The `targets` columns a [`TargetState`] is read from.
const TARGET_STATE: &str = "name, backend, last_applied_sha, last_result, last_message, \
     last_run_id, last_run_at, consecutive_failures, backend_digest, paused_at, paused_by, \
     failing_since, last_notified_at, last_notified_message, drift_hash, drift_summary, drift_since, \
     rewind_accepted, healthy_sha, quarantined_sha, quarantine_reason, health_run, health_since";

/// A target's row, made or given its backend: `register_targets`, and a
/// target set's new members (`store::sets`).
const UPSERT_TARGET: &str = "INSERT INTO targets (name, backend, updated_at) VALUES ($1, $2, $3)
     ON CONFLICT (name) DO UPDATE SET backend = excluded.backend";

/// Make `name`'s row, or give it `backend`, in the caller's transaction.
pub(super) async fn upsert(
    tx: &mut db::Conn,
    name: &str,
    backend: &str,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(UPSERT_TARGET)
        .bind(name)
        .bind(backend)
        .bind(now)
        .execute(tx)
        .await
        .map(drop)
}

/// A run of `$1` starts at `$2`: the target's state as that leaves it.
fn run_start_sql() -> String {
    format!(
        "UPDATE targets SET last_run_at = $2, updated_at = $2 WHERE name = $1
         RETURNING {TARGET_STATE},
                   NOT EXISTS (SELECT 1 FROM deployments d WHERE d.target = $1) AS no_deployments"
    )
}

/// Note in the run's transaction that a run of `target` starts now: the
/// target's state as that leaves it.
pub(super) async fn note_run_start(
    tx: &mut db::Conn,
    target: &str,
    now: i64,
) -> Result<Option<TargetState>, sqlx::Error> {
    sqlx::query_as::<_, TargetState>(sqlx::AssertSqlSafe(run_start_sql()))
        .bind(target)
        .bind(now)
        .fetch_optional(tx)
        .await
}

/// [`note_run_start`] on SQLite's write thread (`store::direct`).
pub(super) fn note_run_start_direct(
    tx: &rusqlite::Transaction<'_>,
    target: &str,
    now: i64,
) -> Result<Option<TargetState>, sqlx::Error> {
    let mut stmt = tx.prepare_cached(&run_start_sql()).map_err(failure)?;
    direct::bind(&mut stmt, &[("$1", &target), ("$2", &now)])?;
    let mut rows = stmt.raw_query();
    let state = match rows.next().map_err(failure)? {
        Some(r) => Some(TargetState {
            no_deployments: r.get("no_deployments").map_err(failure)?,
            ..TargetState::of_row(r).map_err(failure)?
        }),
        None => None,
    };
    // Stepped to its end, so the update is done.
    while rows.next().map_err(failure)?.is_some() {}
    Ok(state)
}

impl TargetState {
    /// The [`TARGET_STATE`] columns of a row read on SQLite's write thread.
    fn of_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TargetState> {
        Ok(TargetState {
            name: r.get("name")?,
            backend: r.get("backend")?,
            last_applied_sha: r.get("last_applied_sha")?,
            last_result: r.get("last_result")?,
            last_message: r.get("last_message")?,
            last_run_id: r.get("last_run_id")?,
            last_run_at: r.get("last_run_at")?,
            consecutive_failures: r.get("consecutive_failures")?,
            backend_digest: r.get("backend_digest")?,
            paused_at: r.get("paused_at")?,
            paused_by: r.get("paused_by")?,
            failing_since: r.get("failing_since")?,
            last_notified_at: r.get("last_notified_at")?,
            last_notified_message: r.get("last_notified_message")?,
            drift_hash: r.get("drift_hash")?,
            drift_summary: r.get("drift_summary")?,
            drift_since: r.get("drift_since")?,
            rewind_accepted: r.get("rewind_accepted")?,
            healthy_sha: r.get("healthy_sha")?,
            quarantined_sha: r.get("quarantined_sha")?,
            quarantine_reason: r.get("quarantine_reason")?,
            health_run: r.get("health_run")?,
            health_since: r.get("health_since")?,
            no_deployments: false,
        })
    }
}

/// The statement folding a run's `result` of `operation` into its
/// target's row (`$1`), and, with a notice, what the owners were told
/// (`$8` says whether the notice's columns are written): `$2` message,
/// `$3` run, `$4` now, `$5` result, `$6` commit, `$7` backend digest,
/// `$9`–`$11` the notice's columns. Not every variant names every
/// parameter.
fn result_sql(result: ApplyResult, operation: Operation) -> String {
    const TOLD: &str = "failing_since = CASE WHEN $8 THEN $9 ELSE failing_since END,
             last_notified_at = CASE WHEN $8 THEN $10 ELSE last_notified_at END,
             last_notified_message = CASE WHEN $8 THEN $11 ELSE last_notified_message END";
    let set = match (result, operation) {
        // Failed or blocked: the last applied commit stays.
        (ApplyResult::Failed | ApplyResult::Blocked, _) => {
            "last_result = $5, last_message = $2, last_run_id = $3,
             consecutive_failures = consecutive_failures + 1, health_run = NULL,
             health_since = NULL, updated_at = $4"
        }
        // Applied and healthy (or with nothing to check): the commit is
        // the one a rollback would apply, and no quarantine holds.
        (ApplyResult::Changed | ApplyResult::NoChange, Operation::Apply) => {
            "last_result = $5, last_message = $2, last_run_id = $3,
             consecutive_failures = 0, last_applied_sha = $6, rewind_accepted = NULL,
             backend_digest = COALESCE($7, backend_digest), healthy_sha = $6,
             quarantined_sha = NULL, quarantine_reason = NULL, health_run = NULL,
             health_since = NULL, updated_at = $4"
        }
        // Applied, but not where git says or not well there (unhealthy,
        // rolled back, held at the healthy commit): what was applied
        // stays recorded, and it counts as a failure.
        (_, Operation::Apply) => {
            "last_result = $5, last_message = $2, last_run_id = $3,
             consecutive_failures = consecutive_failures + 1,
             last_applied_sha = COALESCE($6, last_applied_sha), rewind_accepted = NULL,
             backend_digest = COALESCE($7, backend_digest), health_run = NULL,
             health_since = NULL, updated_at = $4"
        }
        (_, Operation::Destroy) => {
            "last_result = $5, last_message = $2, last_run_id = $3,
             consecutive_failures = 0, last_applied_sha = NULL, rewind_accepted = NULL,
             backend_digest = NULL, healthy_sha = NULL, quarantined_sha = NULL,
             quarantine_reason = NULL, health_run = NULL, health_since = NULL, updated_at = $4"
        }
    };
    format!("UPDATE targets SET {set}, {TOLD} WHERE name = $1")
}

/// Fold run `run_id`'s result (`operation` at `sha`) into `target`'s
/// state, in the run's transaction: a failed or blocked run never moves
/// the last applied commit. With a notice, also what the owners were told
/// and the drift the run found or ended.
pub(super) async fn record_result(
    tx: &mut db::Conn,
    target: &str,
    (run_id, operation, sha): (i64, Operation, Option<&str>),
    status: &Status,
    notice: Option<&Notice>,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(sqlx::AssertSqlSafe(result_sql(status.result, operation)))
        .bind(target)
        .bind(&status.message)
        .bind(run_id)
        .bind(now)
        .bind(status.result.as_str())
        .bind(sha)
        .bind(&status.digest)
        .bind(notice.is_some())
        .bind(notice.and_then(|n| n.failing_since))
        .bind(notice.and_then(|n| n.last_notified_at))
        .bind(notice.and_then(|n| n.last_notified_message.as_deref()))
        .execute(&mut *tx)
        .await?;
    if let Some((sha, reason)) = notice.and_then(|n| n.quarantine.as_ref()) {
        sqlx::query(
            "UPDATE targets SET quarantined_sha = $2, quarantine_reason = $3 WHERE name = $1",
        )
        .bind(target)
        .bind(sha)
        .bind(reason)
        .execute(&mut *tx)
        .await?;
    }
    if let Some(d) = notice.and_then(|n| n.drift.as_ref()) {
        let (hash, summary, since) = match d {
            DriftUpdate::Set {
                hash,
                summary,
                since,
            } => (Some(hash.as_str()), Some(summary.as_str()), Some(*since)),
            DriftUpdate::Clear => (None, None, None),
        };
        sqlx::query(
            "UPDATE targets SET drift_hash = $2, drift_summary = $3, drift_since = $4
             WHERE name = $1",
        )
        .bind(target)
        .bind(hash)
        .bind(summary)
        .bind(since)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// [`record_result`] on SQLite's write thread (`store::direct`), for a
/// run whose notice holds nothing but the target's own columns
/// ([`Notice::only_columns`]): anything more is refused, not dropped.
pub(super) fn record_result_direct(
    tx: &rusqlite::Transaction<'_>,
    target: &str,
    (run_id, operation, sha): (i64, Operation, Option<&str>),
    status: &Status,
    notice: Option<&Notice>,
    now: i64,
) -> Result<(), sqlx::Error> {
    if notice.is_some_and(|n| !n.only_columns()) {
        return Err(sqlx::Error::Protocol(format!(
            "the result of run {run_id} of target `{target}` carries more than its target's row \
             and cannot be written on SQLite's write thread"
        )));
    }
    let mut stmt = tx
        .prepare_cached(&result_sql(status.result, operation))
        .map_err(failure)?;
    direct::bind(
        &mut stmt,
        &[
            ("$1", &target),
            ("$2", &status.message),
            ("$3", &run_id),
            ("$4", &now),
            ("$5", &status.result.as_str()),
            ("$6", &sha),
            ("$7", &status.digest),
            ("$8", &notice.is_some()),
            ("$9", &notice.and_then(|n| n.failing_since)),
            ("$10", &notice.and_then(|n| n.last_notified_at)),
            (
                "$11",
                &notice.and_then(|n| n.last_notified_message.as_deref()),
            ),
        ],
    )?;
    stmt.raw_execute().map(drop).map_err(failure)
}

impl Store {
    /// Make sure every configured target has a row (and the right backend).
    /// Only what is missing or changed is written, in one transaction: a
    /// CLI command (or a one-shot tick) over a thousand targets neither
    /// writes a thousand rows nor waits for a thousand commits.
    pub async fn register_targets(&self, targets: &[(&str, &str)]) -> Result<(), StoreError> {
        let what = "registering targets";
        let known: std::collections::HashMap<String, String> =
            sqlx::query_as::<_, (String, String)>("SELECT name, backend FROM targets")
                .fetch_all(self.pool())
                .await
                .map_err(self.err(what))?
                .into_iter()
                .collect();
        let missing: Vec<&(&str, &str)> = targets
            .iter()
            .filter(|(name, backend)| known.get(*name).map(String::as_str) != Some(*backend))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let mut tx = self.begin_write(what).await?;
        for (name, backend) in missing {
            sqlx::query(UPSERT_TARGET)
                .bind(name)
                .bind(backend)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(self.err(what))?;
        }
        tx.commit().await.map_err(self.err(what))
    }

    /// Run `run_id` applied `sha` (leaving `digest`) and its health
    /// checks begin: recorded before the first check, so a restart
    /// resumes them and never applies again because of the kill.
    pub async fn begin_health(
        &self,
        target: &str,
        run_id: i64,
        sha: &str,
        digest: Option<&str>,
    ) -> Result<(), StoreError> {
        let q = sqlx::query(
            "UPDATE targets SET last_applied_sha = $2, backend_digest = COALESCE($3, backend_digest),
                 health_run = $4, health_since = $5, updated_at = $5 WHERE name = $1",
        )
        .bind(target)
        .bind(sha)
        .bind(digest)
        .bind(run_id)
        .bind(now_ms());
        self.write_one("recording that health checks begin", q)
            .await
            .map(drop)
    }

    pub async fn target_state(&self, name: &str) -> Result<Option<TargetState>, StoreError> {
        sqlx::query_as::<_, TargetState>(sqlx::AssertSqlSafe(format!(
            "SELECT {TARGET_STATE} FROM targets WHERE name = $1"
        )))
        .bind(name)
        .fetch_optional(self.pool())
        .await
        .map_err(self.err("reading target state"))
    }

    pub async fn target_states(&self) -> Result<Vec<TargetState>, StoreError> {
        sqlx::query_as::<_, TargetState>(sqlx::AssertSqlSafe(format!(
            "SELECT {TARGET_STATE} FROM targets ORDER BY name"
        )))
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading target state"))
    }

    /// When each target's last run started (the scheduler's once-a-second
    /// read: two columns, not the whole state).
    pub async fn last_run_times(&self) -> Result<Vec<(String, Option<i64>)>, StoreError> {
        sqlx::query_as("SELECT name, last_run_at FROM targets")
            .fetch_all(self.pool())
            .await
            .map_err(self.err("reading when targets last ran"))
    }

    /// What the scheduler needs of the targets that may be due: when each
    /// last ran, whether it is paused, and whether a job of it is queued or
    /// running.
    pub async fn schedule_candidates(
        &self,
        names: &[String],
    ) -> Result<Vec<Candidate>, StoreError> {
        let names = serde_json::to_string(names).unwrap_or_else(|_| "[]".into());
        sqlx::query_as::<_, Candidate>(candidates_sql(self.kind()))
            .bind(names)
            .fetch_all(self.pool())
            .await
            .map_err(self.err("reading which targets are due"))
    }

    /// Pause (`by` = who) or resume (`None`) a target. Returns whether the
    /// state changed.
    pub async fn set_paused(&self, target: &str, by: Option<&str>) -> Result<bool, StoreError> {
        let q = match by {
            Some(who) => sqlx::query(
                "UPDATE targets SET paused_at = $2, paused_by = $3, updated_at = $2
                 WHERE name = $1 AND paused_at IS NULL",
            )
            .bind(target)
            .bind(now_ms())
            .bind(who),
            None => sqlx::query(
                "UPDATE targets SET paused_at = NULL, paused_by = NULL, updated_at = $2
                 WHERE name = $1 AND paused_at IS NOT NULL",
            )
            .bind(target)
            .bind(now_ms()),
        };
        let r = self.write_one("pausing or resuming a target", q).await?;
        Ok(r.rows_affected() == 1)
    }

    /// Forget what `target` applied (`driftless forget`): its last applied
    /// commit, digest and accepted rewind; its runs stay.
    pub async fn forget_target(&self, target: &str) -> Result<(), StoreError> {
        let q = sqlx::query(
            "UPDATE targets SET last_applied_sha = NULL, backend_digest = NULL,
                    rewind_accepted = NULL, updated_at = $2
             WHERE name = $1",
        )
        .bind(target)
        .bind(now_ms());
        self.write_one("forgetting what a target applied", q)
            .await
            .map(drop)
    }

    /// A person accepts that `target` may apply `sha`, a branch tip that
    /// does not descend from the commit it last applied. Returns whether
    /// the target has a row to note it on.
    pub async fn accept_rewind(&self, target: &str, sha: &str) -> Result<bool, StoreError> {
        let q =
            sqlx::query("UPDATE targets SET rewind_accepted = $2, updated_at = $3 WHERE name = $1")
                .bind(target)
                .bind(sha)
                .bind(now_ms());
        let r = self.write_one("accepting a rewind", q).await?;
        Ok(r.rows_affected() == 1)
    }

    /// The names of paused targets.
    pub async fn paused(&self) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar("SELECT name FROM targets WHERE paused_at IS NOT NULL ORDER BY name")
            .fetch_all(self.pool())
            .await
            .map_err(self.err("reading paused targets"))
    }
}
