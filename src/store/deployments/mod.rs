//! Every backend's deployments: a plan and what became of it, in the
//! `deployments` table (migrations 0010, 0022), with its append-only
//! `deployment_events`. A deployment of one unit of a target (a Nomad
//! job: `unit`, `unit_key`, `unit_label` and the backend's `detail` set)
//! is moved by its backend through [`crate::ledger::Ledger`], see
//! `store::deployments::units`; any other is the target's plan. One open
//! deployment per target (per unit for units) is a unique partial index,
//! not a lock; every state change names the state it leaves, so two
//! writers can never both move one. Listing, deciding and telling owners
//! are one path for every backend here. This module decides nothing about
//! a plan: the tick says what happens to it, a person (through the API)
//! approves or rejects it.

use serde::Serialize;
use sqlx::FromRow;

use crate::store::{Store, StoreError, now_ms};

pub mod units;

/// Why an approval or rejection was refused (the API answers 409/404).
#[derive(Debug, thiserror::Error)]
pub enum DecisionError {
    #[error("no deployment {0}")]
    NotFound(i64),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Append an event row (in the caller's transaction): every state a
/// deployment of any backend enters, and who moved it there.
pub(super) async fn event(
    tx: &mut crate::store::db::Tx,
    deployment: i64,
    target: &str,
    actor: &str,
    from: Option<&str>,
    to: &str,
    message: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO deployment_events (deployment_id, target, actor, from_state, to_state,
                                        message, at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(deployment)
    .bind(target)
    .bind(actor)
    .bind(from)
    .bind(to)
    .bind(message)
    .bind(now_ms())
    .execute(&mut **tx)
    .await
    .map(|_| ())
}

/// Note in a run's transaction that the owners of deployment `id` were
/// told what `told` says (its notification is in the same transaction).
pub(super) async fn mark_told(
    tx: &mut crate::store::db::Conn,
    id: i64,
    told: Untold,
    now: i64,
) -> Result<(), sqlx::Error> {
    let q = format!(
        "UPDATE deployments SET {} = $2 WHERE id = $1",
        told.column()
    );
    sqlx::query(sqlx::AssertSqlSafe(q))
        .bind(id)
        .bind(now)
        .execute(tx)
        .await
        .map(drop)
}

/// The plan `id` of `target` a run applied leaves `applying` for `state`
/// with `message`, in the run's transaction, and the move is an event.
pub(super) async fn finish_applying(
    tx: &mut crate::store::db::Tx,
    (id, target): (i64, &str),
    state: PlanState,
    message: &str,
    now: i64,
) -> Result<(), sqlx::Error> {
    let moved = sqlx::query(
        "UPDATE deployments SET state = $2, message = $3, artifact = NULL, updated_at = $4
         WHERE id = $1 AND state = 'applying'",
    )
    .bind(id)
    .bind(state)
    .bind(message)
    .bind(now)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if moved == 1 {
        event(
            tx,
            id,
            target,
            "driftless",
            Some("applying"),
            state.as_str(),
            Some(message),
        )
        .await?;
    }
    Ok(())
}

/// Has a person paused this unit of this target? (A paused unit's
/// deployment is neither approved nor promoted.)
async fn unit_paused(
    tx: &mut crate::store::db::Tx,
    target: &str,
    unit: &str,
) -> Result<bool, sqlx::Error> {
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM unit_pauses WHERE target = $1 AND unit = $2")
            .bind(target)
            .bind(unit)
            .fetch_one(&mut **tx)
            .await?;
    Ok(n > 0)
}

/// id, deployment, actor, from, to, message, at
type EventRow = (
    i64,
    i64,
    String,
    Option<String>,
    String,
    Option<String>,
    i64,
);

pub use crate::deploy::PlanState;

crate::store::db::text_enum!(PlanState);

/// A plan as the store keeps it (its diff already redacted).
#[derive(Debug, Clone, FromRow, Serialize)]
pub struct StoredPlan {
    pub id: i64,
    pub target: String,
    pub backend: String,
    #[serde(rename = "commit")]
    pub commit_sha: String,
    pub plan_hash: String,
    pub policy: String,
    pub summary: String,
    pub diff: String,
    #[sqlx(try_from = "crate::store::db::Flag")]
    pub destructive: bool,
    /// The file applying exactly this plan needs (never shown).
    #[serde(skip)]
    pub artifact: Option<String>,
    /// The backend's own hash of the plan (never shown: `plan_hash` is it
    /// keyed, see migration 0009); `None` for plans recorded before it.
    #[serde(skip)]
    pub backend_hash: Option<String>,
    pub state: PlanState,
    pub decided_by: Option<String>,
    pub decided_at: Option<i64>,
    pub message: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// The unit it is of, when it is one unit's (a Nomad job's); `None`
    /// for a target's plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// What people read of the unit, after the backend's name: "job
    /// default/web".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit_label: Option<String>,
    /// Where a person's approval takes a unit's deployment (the step its
    /// backend takes next); `None` for a target's plan (`Approved`).
    #[serde(skip)]
    pub on_approval: Option<PlanState>,
    /// The unit's backend's own fields, shown as they are (empty for a
    /// target's plan).
    #[sqlx(try_from = "Option<String>")]
    #[serde(flatten)]
    pub detail: UnitDetail,
    /// When it began to wait for promotion (Unix ms; migration 0021).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<i64>,
    /// When it had waited for promotion past the backend's bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overdue_at: Option<i64>,
    /// What the plan was made from beside its commit (the tick's JSON:
    /// inputs as recorded, digests; migration 0018); `None` for Nomad's
    /// and for plans recorded before it was kept.
    #[serde(skip)]
    pub made_from: Option<String>,
}

impl StoredPlan {
    /// What the deployment is of: the target, or a unit of it ("nomad
    /// job default/web of jobs").
    pub fn subject(&self) -> String {
        match &self.unit_label {
            Some(unit) => format!("{} {unit} of {}", self.backend, self.target),
            None => self.target.clone(),
        }
    }

    /// A string field of the unit's detail.
    pub fn detail_str(&self, key: &str) -> Option<&str> {
        self.detail.0.get(key).and_then(|v| v.as_str())
    }
}

/// A unit's backend fields (`ledger::Detail`), read from the `detail`
/// column's JSON object.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(transparent)]
pub struct UnitDetail(pub crate::ledger::Detail);

impl TryFrom<Option<String>> for UnitDetail {
    type Error = serde_json::Error;

    fn try_from(text: Option<String>) -> Result<Self, Self::Error> {
        match text {
            None => Ok(UnitDetail::default()),
            Some(t) => serde_json::from_str(&t).map(UnitDetail),
        }
    }
}

/// A plan about to be recorded.
#[derive(Debug, Clone)]
pub struct NewPlan<'a> {
    pub target: &'a str,
    pub backend: &'a str,
    pub commit_sha: &'a str,
    /// What people see and approve: `backend_hash` keyed.
    pub plan_hash: &'a str,
    pub backend_hash: &'a str,
    pub policy: &'a str,
    pub summary: &'a str,
    pub diff: &'a str,
    pub destructive: bool,
    pub artifact: Option<&'a str>,
    /// `PendingApproval`, or `Applying` with `decided_by` when a policy
    /// applies it unattended.
    pub state: PlanState,
    pub decided_by: Option<&'a str>,
    pub message: &'a str,
    /// What it is made from beside its commit (see [`StoredPlan::made_from`]).
    pub made_from: Option<&'a str>,
}

const COLUMNS: &str = "id, target, backend, commit_sha, plan_hash, policy, summary, diff, \
     destructive, artifact, state, decided_by, decided_at, message, created_at, updated_at, \
     backend_hash, made_from, waiting_since, overdue_at, unit, unit_label, on_approval, detail";

impl Store {
    /// Record a plan before it is shown or applied. Fails when the target
    /// already has an open plan (the unique index), which the tick closes
    /// first.
    pub async fn insert_plan(&self, p: &NewPlan<'_>) -> Result<StoredPlan, StoreError> {
        let what = "recording a plan";
        self.changes.deployment();
        let mut tx = self.begin_write(what).await?;
        let now = now_ms();
        let decided_at = p.decided_by.map(|_| now);
        let q = format!(
            "INSERT INTO deployments (target, backend, commit_sha, plan_hash, policy, summary,
                                diff, destructive, artifact, state, decided_by, decided_at,
                                message, created_at, updated_at, backend_hash, made_from)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $14, $15, $16)
             RETURNING {COLUMNS}"
        );
        let plan = sqlx::query_as::<_, StoredPlan>(sqlx::AssertSqlSafe(q))
            .bind(p.target)
            .bind(p.backend)
            .bind(p.commit_sha)
            .bind(p.plan_hash)
            .bind(p.policy)
            .bind(p.summary)
            .bind(p.diff)
            .bind(i64::from(p.destructive))
            .bind(p.artifact)
            .bind(p.state)
            .bind(p.decided_by)
            .bind(decided_at)
            .bind(p.message)
            .bind(now)
            .bind(p.backend_hash)
            .bind(p.made_from)
            .fetch_one(&mut *tx)
            .await
            .map_err(self.err(what))?;
        event(
            &mut tx,
            plan.id,
            p.target,
            p.decided_by.unwrap_or("driftless"),
            None,
            p.state.as_str(),
            Some(p.message),
        )
        .await
        .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))?;
        Ok(plan)
    }

    async fn plan_where(
        &self,
        filter: &'static str,
        target: &str,
    ) -> Result<Option<StoredPlan>, StoreError> {
        let q = format!(
            "SELECT {COLUMNS} FROM deployments WHERE unit_key IS NULL AND {filter}
             ORDER BY id DESC LIMIT 1"
        );
        sqlx::query_as::<_, StoredPlan>(sqlx::AssertSqlSafe(q))
            .bind(target)
            .fetch_optional(self.pool())
            .await
            .map_err(self.err("reading a plan"))
    }

    /// The target's open plan (pending, approved or being applied); never
    /// a unit's deployment, which its backend keeps itself.
    pub async fn open_plan(&self, target: &str) -> Result<Option<StoredPlan>, StoreError> {
        self.plan_where(
            "target = $1 AND state IN ('pending_approval', 'approved', 'applying')",
            target,
        )
        .await
    }

    /// The target's newest plan in any state (not a unit's).
    pub async fn latest_plan(&self, target: &str) -> Result<Option<StoredPlan>, StoreError> {
        self.plan_where("target = $1", target).await
    }

    /// Deployment `id` of any backend, if there is one.
    pub async fn plan_record(&self, id: i64) -> Result<Option<StoredPlan>, StoreError> {
        let q = format!("SELECT {COLUMNS} FROM deployments WHERE id = $1");
        sqlx::query_as::<_, StoredPlan>(sqlx::AssertSqlSafe(q))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(self.err("reading a plan"))
    }

    /// The newest deployments of every backend, newest first; only those
    /// in `state` when it is given.
    pub async fn plans(
        &self,
        state: Option<&str>,
        limit: i64,
    ) -> Result<Vec<StoredPlan>, StoreError> {
        let q = format!(
            "SELECT {COLUMNS} FROM deployments WHERE $1 IS NULL OR state = $1
             ORDER BY id DESC LIMIT $2"
        );
        sqlx::query_as::<_, StoredPlan>(sqlx::AssertSqlSafe(q))
            .bind(state)
            .bind(limit)
            .fetch_all(self.pool())
            .await
            .map_err(self.err("reading plans"))
    }

    /// Move plan `id` from `from` to `to` with a message; `false` when it
    /// was no longer in `from` (someone else moved it).
    pub async fn move_plan(
        &self,
        id: i64,
        from: PlanState,
        to: PlanState,
        message: &str,
    ) -> Result<bool, StoreError> {
        let what = "changing a plan's state";
        let mut tx = self.begin_write(what).await?;
        let target: Option<String> = sqlx::query_scalar(
            "UPDATE deployments SET state = $3, message = $4, updated_at = $5,
                    artifact = CASE WHEN $3 IN ('pending_approval', 'approved', 'applying')
                                    THEN artifact END
             WHERE id = $1 AND state = $2 RETURNING target",
        )
        .bind(id)
        .bind(from)
        .bind(to)
        .bind(message)
        .bind(now_ms())
        .fetch_optional(&mut *tx)
        .await
        .map_err(self.err(what))?;
        let Some(target) = target else {
            return Ok(false);
        };
        event(
            &mut tx,
            id,
            &target,
            "driftless",
            Some(from.as_str()),
            to.as_str(),
            Some(message),
        )
        .await
        .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))?;
        Ok(true)
    }

    /// Carry open plan `id` from commit `from_commit` to `to_commit`, which
    /// gives the target the same files (the tick checked the trees); `false`
    /// when it was moved meanwhile. The plan, its hash and its approval
    /// stay what they were: what is applied is still exactly what was
    /// approved.
    pub async fn carry_plan(
        &self,
        id: i64,
        state: PlanState,
        from_commit: &str,
        to_commit: &str,
        message: &str,
    ) -> Result<bool, StoreError> {
        let what = "carrying a plan to a newer commit";
        let mut tx = self.begin_write(what).await?;
        let target: Option<String> = sqlx::query_scalar(
            "UPDATE deployments SET commit_sha = $4, updated_at = $5
             WHERE id = $1 AND state = $2 AND commit_sha = $3 RETURNING target",
        )
        .bind(id)
        .bind(state)
        .bind(from_commit)
        .bind(to_commit)
        .bind(now_ms())
        .fetch_optional(&mut *tx)
        .await
        .map_err(self.err(what))?;
        let Some(target) = target else {
            return Ok(false);
        };
        event(
            &mut tx,
            id,
            &target,
            "driftless",
            Some(state.as_str()),
            state.as_str(),
            Some(message),
        )
        .await
        .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))?;
        Ok(true)
    }

    /// A person's decision on deployment `id`, whichever backend's: approve
    /// it (for exactly the plan `plan_hash` names) or reject it. Where it
    /// goes is `deploy::decide`'s to say (a `Conflict` saying why when it
    /// cannot); this writes it, with its event, only if the deployment is
    /// still in the state that was decided on. Nothing is applied here:
    /// the target's next tick does that.
    pub async fn decide_plan(
        &self,
        id: i64,
        plan_hash: Option<&str>,
        actor: &str,
        approve: bool,
    ) -> Result<StoredPlan, DecisionError> {
        let what = "recording a decision on a deployment";
        let mut tx = self.begin_write(what).await?;
        let q = format!("SELECT {COLUMNS} FROM deployments WHERE id = $1");
        let p = sqlx::query_as::<_, StoredPlan>(sqlx::AssertSqlSafe(q))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(self.err(what))?
            .ok_or(DecisionError::NotFound(id))?;
        let paused = match &p.unit {
            Some(unit) => unit_paused(&mut tx, &p.target, unit)
                .await
                .map_err(self.err(what))?,
            None => false,
        };
        let (to, message) = crate::deploy::decide(
            &crate::deploy::Decidable {
                id,
                target: &p.target,
                state: p.state,
                plan_hash: &p.plan_hash,
                message: p.message.as_deref(),
                unit: p.unit.as_deref(),
                unit_paused: paused,
                on_approval: p.on_approval.unwrap_or(PlanState::Approved),
            },
            plan_hash,
            approve,
        )
        .map_err(DecisionError::Conflict)?;
        let from = p.state;
        let now = now_ms();
        // A person's approval or rejection names who decided; a promotion
        // keeps the approval's.
        let decided = if from == PlanState::PendingApproval {
            ", decided_by = $4, decided_at = $5"
        } else {
            ""
        };
        let q = format!(
            "UPDATE deployments SET state = $2, message = $3{decided}, updated_at = $5
             WHERE id = $1 AND state = $6 RETURNING {COLUMNS}"
        );
        let p = sqlx::query_as::<_, StoredPlan>(sqlx::AssertSqlSafe(q))
            .bind(id)
            .bind(to)
            .bind(message)
            .bind(actor)
            .bind(now)
            .bind(from)
            .fetch_one(&mut *tx)
            .await
            .map_err(self.err(what))?;
        event(
            &mut tx,
            id,
            &p.target,
            actor,
            Some(from.as_str()),
            to.as_str(),
            Some(message),
        )
        .await
        .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))?;
        Ok(p)
    }

    /// A target's deployment events (every backend's), oldest first.
    pub async fn deployment_events(
        &self,
        target: &str,
    ) -> Result<Vec<serde_json::Value>, StoreError> {
        let rows: Vec<EventRow> = sqlx::query_as(
            "SELECT id, deployment_id, actor, from_state, to_state, message, at
                 FROM deployment_events WHERE target = $1 ORDER BY id",
        )
        .bind(target)
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading deployment events"))?;
        Ok(rows
            .into_iter()
            .map(|(id, dep, actor, from, to, message, at)| {
                serde_json::json!({
                    "id": id, "deployment": dep, "actor": actor, "from": from,
                    "to": to, "message": message, "at": crate::store::format_ms(at),
                })
            })
            .collect())
    }

    /// The installation's key `name` (32 random bytes, made on first use,
    /// kept only in this database).
    pub async fn key(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        let what = "reading a key";
        if let Some(k) = sqlx::query_scalar::<_, Vec<u8>>("SELECT value FROM keys WHERE name = $1")
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .map_err(self.err(what))?
        {
            return Ok(k);
        }
        let mut fresh = [0u8; 32];
        getrandom::fill(&mut fresh).map_err(|e| StoreError {
            path: self.path().to_path_buf(),
            what: "making a key",
            source: sqlx::Error::Io(std::io::Error::other(e.to_string())),
        })?;
        let mut tx = self.begin_write("making a key").await?;
        sqlx::query("INSERT INTO keys (name, value) VALUES ($1, $2) ON CONFLICT DO NOTHING")
            .bind(name)
            .bind(&fresh[..])
            .execute(&mut *tx)
            .await
            .map_err(self.err("making a key"))?;
        let k = sqlx::query_scalar::<_, Vec<u8>>("SELECT value FROM keys WHERE name = $1")
            .bind(name)
            .fetch_one(&mut *tx)
            .await
            .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err("making a key"))?;
        Ok(k)
    }

    /// A target's deployments (any backend's) whose owners were not told
    /// yet that they wait (for approval or for promotion), that they have
    /// waited for promotion past the bound, or that they were superseded
    /// after the owners heard of them; oldest first, each with what to tell.
    pub async fn untold_plans(
        &self,
        target: &str,
    ) -> Result<Vec<(StoredPlan, Untold)>, StoreError> {
        let q = format!(
            "SELECT {COLUMNS},
                    CASE WHEN state = 'superseded' THEN 'superseded'
                         WHEN notified_at IS NULL THEN 'waiting'
                         ELSE 'overdue' END AS untold
             FROM deployments
             WHERE target = $1 AND (
                   (state IN ('pending_approval', 'pending_promotion') AND notified_at IS NULL)
                OR (state = 'pending_promotion' AND overdue_at IS NOT NULL
                    AND overdue_notified_at IS NULL)
                OR (state = 'superseded' AND notified_at IS NOT NULL
                    AND superseded_notified_at IS NULL))
             ORDER BY id"
        );
        let rows = sqlx::query_as::<_, UntoldRow>(sqlx::AssertSqlSafe(q))
            .bind(target)
            .fetch_all(self.pool())
            .await
            .map_err(self.err("reading plans to tell the owners of"))?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let why = match r.untold.as_str() {
                    "superseded" => Untold::Superseded,
                    "overdue" => Untold::Overdue,
                    _ => Untold::Waiting,
                };
                (r.plan, why)
            })
            .collect())
    }
}

/// What the owners of a deployment are to be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Untold {
    /// That it waits for a person (approval or promotion).
    Waiting,
    /// That it still waits for promotion, past the backend's bound.
    Overdue,
    /// That a newer commit replaced it.
    Superseded,
}

impl Untold {
    /// The column recording that they were told.
    pub(super) fn column(self) -> &'static str {
        match self {
            Untold::Waiting => "notified_at",
            Untold::Overdue => "overdue_notified_at",
            Untold::Superseded => "superseded_notified_at",
        }
    }
}

#[derive(FromRow)]
struct UntoldRow {
    #[sqlx(flatten)]
    plan: StoredPlan,
    untold: String,
}

/// A plan of `target` at `commit` waiting for approval, for tests.
#[cfg(test)]
pub(crate) fn new_plan<'a>(target: &'a str, commit: &'a str) -> NewPlan<'a> {
    NewPlan {
        target,
        backend: "terraform",
        commit_sha: commit,
        plan_hash: "h",
        backend_hash: "b",
        policy: "approval",
        summary: "1 to add",
        diff: "+ a",
        destructive: false,
        artifact: None,
        state: PlanState::PendingApproval,
        decided_by: None,
        message: "waits",
        made_from: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Ledger, NewUnit, Policy};

    /// "deployment N" names one thing: plans and Nomad deployments are rows
    /// of one table, listed and decided one way; a target has at most one
    /// open plan and a Nomad job one open deployment, whatever the caller
    /// does; and every state change is an event.
    #[tokio::test]
    async fn plans_and_nomad_deployments_are_one_ledger_and_a_target_has_one_open_plan() {
        let dir = tempfile::tempdir().expect("tempdir");
        for store in crate::store::testing::stores(dir.path()).await {
            let nomad = |job: &str| NewUnit {
                backend: "nomad",
                target: "jobs".into(),
                unit: job.into(),
                unit_key: format!("c\ndefault\n{job}"),
                unit_label: format!("job default/{job}"),
                commit_sha: "c1".into(),
                spec_hash: "s".into(),
                policy: Policy::Auto,
                state: "detected",
                on_approval: PlanState::Applying,
                diff: "".into(),
                summary: "".into(),
                destructive: false,
                detail: serde_json::json!({ "job": job, "pre_hook": null })
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            };
            let a = store.insert(&nomad("web")).await.expect("nomad");
            let b = store
                .insert_plan(&new_plan("net", "c1"))
                .await
                .expect("plan")
                .id;
            let c = store.insert(&nomad("api")).await.expect("nomad");
            store
                .move_plan(
                    b,
                    PlanState::PendingApproval,
                    PlanState::Superseded,
                    "newer",
                )
                .await
                .expect("move");
            let d = store
                .insert_plan(&new_plan("net", "c2"))
                .await
                .expect("plan")
                .id;
            assert!(a < b && b < c && c < d, "{a} {b} {c} {d}");
            let listed: Vec<(i64, String)> = store
                .plans(None, 10)
                .await
                .expect("list")
                .into_iter()
                .map(|p| (p.id, p.backend))
                .collect();
            assert_eq!(
                listed,
                [
                    (d, "terraform"),
                    (c, "nomad"),
                    (b, "terraform"),
                    (a, "nomad")
                ]
                .map(|(i, b)| (i, b.to_string()))
            );
            let web = store
                .plan_record(a)
                .await
                .expect("read")
                .expect("nomad row");
            assert_eq!(
                (web.unit.as_deref(), web.state, web.plan_hash.as_str()),
                (Some("web"), PlanState::Detected, "s")
            );
            assert_eq!(
                (web.detail_str("job"), web.subject().as_str()),
                (Some("web"), "nomad job default/web of jobs")
            );
            assert!(
                store.insert(&nomad("web")).await.is_err(),
                "two open for one job"
            );
            assert!(store.open_plan("jobs").await.expect("open").is_none());

            let second = store.insert_plan(&new_plan("net", "c3")).await;
            assert!(second.is_err(), "two open plans for one target");
            assert_eq!(
                store.open_plan("net").await.expect("open").map(|p| p.id),
                Some(d)
            );
            // A decision names the state it leaves: only once.
            store
                .decide_plan(d, Some("h"), "token:ops", true)
                .await
                .expect("approve");
            let twice = store.decide_plan(d, Some("h"), "token:ops", true).await;
            assert!(
                matches!(twice, Err(DecisionError::Conflict(ref m)) if m.contains("is `approved`")),
                "{twice:?}"
            );
            // A unit's approval takes it where its backend said, unless a
            // person paused the unit.
            let waits = store
                .insert(&NewUnit {
                    state: "pending_approval",
                    on_approval: PlanState::PreHook,
                    ..nomad("db")
                })
                .await
                .expect("unit");
            store
                .set_unit_paused("jobs", "db", Some("token:ops"))
                .await
                .expect("pause");
            let paused = store.decide_plan(waits, None, "token:ops", true).await;
            assert!(
                matches!(paused, Err(DecisionError::Conflict(ref m)) if m.contains("`db` of target `jobs` is paused")),
                "{paused:?}"
            );
            store
                .set_unit_paused("jobs", "db", None)
                .await
                .expect("resume");
            let approved = store
                .decide_plan(waits, None, "token:ops", true)
                .await
                .expect("approve");
            assert_eq!(
                (approved.state, approved.decided_by.as_deref()),
                (PlanState::PreHook, Some("token:ops"))
            );
            let said: Vec<(i64, String, String)> = store
                .deployment_events("net")
                .await
                .expect("events")
                .iter()
                .map(|e| {
                    (
                        e["deployment"].as_i64().unwrap_or(0),
                        e["actor"].as_str().unwrap_or("").to_string(),
                        e["to"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
            assert_eq!(
                said,
                [
                    (b, "driftless", "pending_approval"),
                    (b, "driftless", "superseded"),
                    (d, "driftless", "pending_approval"),
                    (d, "token:ops", "approved"),
                ]
                .map(|(i, a, t)| (i, a.to_string(), t.to_string()))
            );
        }
    }
}
