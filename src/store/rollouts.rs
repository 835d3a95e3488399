//! The `rollouts` table (migration 0024 / postgres 0009): each rollout in
//! waves of a `[[target_sets]]` or `[[groups]]` entry, one row per commit,
//! the newest row of a name in force. Every move is a compare-and-set on
//! the row as it was read, so instances on one PostgreSQL database never
//! start a wave twice. This module decides nothing about when a wave is
//! over; that is `tick::rollout`'s.

use serde::Serialize;
use sqlx::FromRow;

use super::{Store, StoreError, now_ms};

/// Where a rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    Running,
    /// A member of the current wave failed: later waves wait for a person.
    Halted,
    Done,
    /// A newer commit started a rollout of its own.
    Superseded,
    /// A person stopped it; later waves stay where they are.
    Aborted,
}

impl RolloutState {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Running => "running",
            RolloutState::Halted => "halted",
            RolloutState::Done => "done",
            RolloutState::Superseded => "superseded",
            RolloutState::Aborted => "aborted",
        }
    }

    fn parse(s: &str) -> RolloutState {
        match s {
            "running" => RolloutState::Running,
            "halted" => RolloutState::Halted,
            "done" => RolloutState::Done,
            "superseded" => RolloutState::Superseded,
            _ => RolloutState::Aborted,
        }
    }
}

/// One rollout, as recorded.
#[derive(Debug, Clone, Serialize)]
pub struct RolloutRow {
    pub name: String,
    pub seq: i64,
    pub sha: String,
    pub state: RolloutState,
    /// The wave in progress (or halted at), 1-based.
    pub wave: i64,
    /// Each member and its wave, fixed when the rollout started.
    pub members: Vec<(String, i64)>,
    /// Unix ms.
    pub wave_started_at: i64,
    /// When every member of the wave was applied and healthy (the pause
    /// runs from then).
    pub wave_done_at: Option<i64>,
    pub reason: Option<String>,
    pub decided_by: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(FromRow)]
struct Raw {
    name: String,
    seq: i64,
    sha: String,
    state: String,
    wave: i64,
    members: String,
    wave_started_at: i64,
    wave_done_at: Option<i64>,
    reason: Option<String>,
    decided_by: Option<String>,
    created_at: i64,
    updated_at: i64,
}

impl Raw {
    /// The row, its members read from their JSON (written only by
    /// `start_rollout`: one that does not read is an error, never an empty
    /// list that would hold nobody back).
    fn row(self) -> Result<RolloutRow, sqlx::Error> {
        let members =
            serde_json::from_str(&self.members).map_err(|e| sqlx::Error::ColumnDecode {
                index: "members".into(),
                source: Box::new(e),
            })?;
        Ok(RolloutRow {
            members,
            name: self.name,
            seq: self.seq,
            sha: self.sha,
            state: RolloutState::parse(&self.state),
            wave: self.wave,
            wave_started_at: self.wave_started_at,
            wave_done_at: self.wave_done_at,
            reason: self.reason,
            decided_by: self.decided_by,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

const COLUMNS: &str = "name, seq, sha, state, wave, members, wave_started_at, wave_done_at,
     reason, decided_by, created_at, updated_at";

impl Store {
    /// The rollout in force for `name` (its newest), if any.
    pub async fn rollout(&self, name: &str) -> Result<Option<RolloutRow>, StoreError> {
        let raw: Option<Raw> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM rollouts WHERE name = $1 ORDER BY seq DESC LIMIT 1"
        )))
        .bind(name)
        .fetch_optional(self.pool())
        .await
        .map_err(self.err("reading a rollout"))?;
        raw.map(Raw::row)
            .transpose()
            .map_err(self.err("reading a rollout"))
    }

    /// The last `limit` rollouts of `name`, newest first.
    pub async fn rollout_history(
        &self,
        name: &str,
        limit: i64,
    ) -> Result<Vec<RolloutRow>, StoreError> {
        let raw: Vec<Raw> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM rollouts WHERE name = $1 ORDER BY seq DESC LIMIT $2"
        )))
        .bind(name)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading rollouts"))?;
        raw.into_iter()
            .map(Raw::row)
            .collect::<Result<_, _>>()
            .map_err(self.err("reading rollouts"))
    }

    /// Start rolling `sha` out to `members` at wave `first`, after `prev`
    /// (the newest row read: it is superseded if still going). `false`
    /// when another instance started one first.
    pub async fn start_rollout(
        &self,
        name: &str,
        prev: Option<&RolloutRow>,
        sha: &str,
        members: &[(String, i64)],
        first: i64,
    ) -> Result<bool, StoreError> {
        let what = "starting a rollout";
        let now = now_ms();
        let members = serde_json::to_string(members)
            .map_err(|e| self.err(what)(sqlx::Error::Encode(Box::new(e))))?;
        let mut tx = self.begin_write(what).await?;
        if let Some(p) = prev {
            sqlx::query(
                "UPDATE rollouts SET state = 'superseded', updated_at = $3
                 WHERE name = $1 AND seq = $2 AND state IN ('running', 'halted')",
            )
            .bind(name)
            .bind(p.seq)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(self.err(what))?;
        }
        let started = sqlx::query(
            "INSERT INTO rollouts (name, seq, sha, state, wave, members, wave_started_at,
                                   created_at, updated_at)
             VALUES ($1, $2, $3, 'running', $4, $5, $6, $6, $6)
             ON CONFLICT (name, seq) DO NOTHING",
        )
        .bind(name)
        .bind(prev.map_or(1, |p| p.seq + 1))
        .bind(sha)
        .bind(first)
        .bind(&members)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(self.err(what))?
        .rows_affected()
            == 1;
        if started {
            tx.commit().await.map_err(self.err(what))?;
        }
        Ok(started)
    }

    /// Every member of wave `wave` of rollout `seq` is applied and healthy
    /// (now): its pause begins. `false` when the row moved meanwhile.
    pub async fn rollout_wave_done(
        &self,
        name: &str,
        seq: i64,
        wave: i64,
    ) -> Result<bool, StoreError> {
        self.move_rollout(
            "UPDATE rollouts SET wave_done_at = $4, updated_at = $4
             WHERE name = $1 AND seq = $2 AND wave = $3 AND state = 'running'
               AND wave_done_at IS NULL",
            (name, seq, wave),
            None,
        )
        .await
    }

    /// Rollout `seq` moves from wave `from` to wave `to`, written before
    /// that wave's jobs are queued. `false` when the row moved meanwhile.
    pub async fn rollout_next_wave(
        &self,
        name: &str,
        seq: i64,
        from: i64,
        to: i64,
    ) -> Result<bool, StoreError> {
        self.move_rollout(
            "UPDATE rollouts SET wave = $5, wave_started_at = $4, wave_done_at = NULL,
                    updated_at = $4
             WHERE name = $1 AND seq = $2 AND wave = $3 AND state = 'running'",
            (name, seq, from),
            Some(to),
        )
        .await
    }

    /// Rollout `seq`, at wave `wave` in state `from`, goes to state `to`
    /// (with why, and who when a person moved it); on to `running` its
    /// wave starts again. `false` when the row moved meanwhile.
    pub async fn rollout_state(
        &self,
        (name, seq, wave): (&str, i64, i64),
        from: RolloutState,
        to: RolloutState,
        reason: &str,
        by: Option<&str>,
    ) -> Result<bool, StoreError> {
        let what = "moving a rollout";
        let now = now_ms();
        let mut tx = self.begin_write(what).await?;
        let moved = sqlx::query(
            "UPDATE rollouts SET state = $5, reason = $6, decided_by = COALESCE($7, decided_by),
                    wave_started_at = CASE WHEN $5 = 'running' THEN $8 ELSE wave_started_at END,
                    wave_done_at = CASE WHEN $5 = 'running' THEN NULL ELSE wave_done_at END,
                    updated_at = $8
             WHERE name = $1 AND seq = $2 AND wave = $3 AND state = $4",
        )
        .bind(name)
        .bind(seq)
        .bind(wave)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(reason)
        .bind(by)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(self.err(what))?
        .rows_affected()
            == 1;
        tx.commit().await.map_err(self.err(what))?;
        Ok(moved)
    }

    async fn move_rollout(
        &self,
        sql: &'static str,
        (name, seq, wave): (&str, i64, i64),
        to: Option<i64>,
    ) -> Result<bool, StoreError> {
        let what = "moving a rollout";
        let mut tx = self.begin_write(what).await?;
        let mut q = sqlx::query(sql)
            .bind(name)
            .bind(seq)
            .bind(wave)
            .bind(now_ms());
        if let Some(t) = to {
            q = q.bind(t);
        }
        let moved = q
            .execute(&mut *tx)
            .await
            .map_err(self.err(what))?
            .rows_affected()
            == 1;
        tx.commit().await.map_err(self.err(what))?;
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two starts after the same row: one wins. A members column that does
    /// not read is an error, not a rollout of nobody.
    #[tokio::test]
    async fn one_start_wins_and_unreadable_members_are_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("d.db")).await.expect("store");
        let members = [("a".to_string(), 1), ("b".to_string(), 2)];
        assert!(
            store
                .start_rollout("fleet", None, "s1", &members, 1)
                .await
                .expect("start")
        );
        assert!(
            !store
                .start_rollout("fleet", None, "s1", &members, 1)
                .await
                .expect("again")
        );
        let r = store.rollout("fleet").await.expect("read").expect("a row");
        assert_eq!((r.seq, r.wave, r.state), (1, 1, RolloutState::Running));
        assert_eq!(r.members, members);
        assert!(
            store
                .rollout_next_wave("fleet", 1, 1, 2)
                .await
                .expect("next")
        );
        assert!(
            !store
                .rollout_next_wave("fleet", 1, 1, 2)
                .await
                .expect("twice")
        );
        assert!(
            store
                .start_rollout("fleet", Some(&r), "s2", &members, 1)
                .await
                .expect("newer")
        );
        let old = store.rollout_history("fleet", 10).await.expect("history");
        assert_eq!(old[1].state, RolloutState::Superseded);
        let mut tx = store.begin_write("corrupting").await.expect("write");
        sqlx::query("UPDATE rollouts SET members = 'not json' WHERE seq = 2")
            .execute(&mut *tx)
            .await
            .expect("corrupt");
        tx.commit().await.expect("commit");
        let e = store.rollout("fleet").await.expect_err("unreadable");
        assert!(e.to_string().contains("reading a rollout"), "{e}");
    }
}
