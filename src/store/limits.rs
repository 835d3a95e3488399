//! Rate limits of the services driftless sends to (migration 0020 /
//! postgres 0005): one row per destination — an API host and the
//! credential used there, as `notify::limit` names it — that answered with
//! a rate limit, saying until when nothing may be sent to it. Every
//! instance reads the same rows, so a pause holds across instances and
//! restarts. This module decides no wait and sends nothing.

use serde::Serialize;
use sqlx::FromRow;

use super::{Store, StoreError, now_ms};

/// A destination that is, or was, rate-limited.
#[derive(Debug, Clone, FromRow, Serialize)]
pub struct Limit {
    pub destination: String,
    /// Who it is, in words (`forge \`github\` (api.github.com)`).
    pub label: String,
    /// Unix ms.
    pub paused_until: i64,
    /// Limits in a row that named no time.
    pub strikes: i64,
    /// What the service answered.
    pub reason: String,
}

const COLUMNS: &str = "destination, label, paused_until, strikes, reason";

impl Store {
    /// The limit recorded for `destination`, expired or not.
    pub async fn limit_of(&self, destination: &str) -> Result<Option<Limit>, StoreError> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM destination_limits WHERE destination = $1"
        )))
        .bind(destination)
        .fetch_optional(self.pool())
        .await
        .map_err(self.err("reading a destination's rate limit"))
    }

    /// Every limit recorded, the latest pause first.
    pub async fn limits(&self) -> Result<Vec<Limit>, StoreError> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM destination_limits ORDER BY paused_until DESC"
        )))
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading rate limits"))
    }

    /// `destination` answered with a rate limit: pause it for `wait` when
    /// the service named one, else for `first` doubled per limit in a row
    /// that named none; never past `most`. A pause already further away
    /// is kept. Returns the row as written.
    pub async fn limit(
        &self,
        destination: &str,
        label: &str,
        wait_ms: Option<i64>,
        (first_ms, most_ms): (i64, i64),
        reason: &str,
    ) -> Result<Limit, StoreError> {
        let what = "recording a rate limit";
        let now = now_ms();
        let mut tx = self.begin_write(what).await?;
        let strikes: Option<i64> =
            sqlx::query_scalar("SELECT strikes FROM destination_limits WHERE destination = $1")
                .bind(destination)
                .fetch_optional(&mut *tx)
                .await
                .map_err(self.err(what))?;
        let strikes = strikes.unwrap_or(0);
        let (wait, strikes) = match wait_ms {
            Some(w) => (w.max(0), strikes),
            None => (
                first_ms.saturating_mul(1_i64 << strikes.clamp(0, 20)),
                strikes + 1,
            ),
        };
        let until = now + wait.min(most_ms);
        let row: Limit = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "INSERT INTO destination_limits (destination, label, paused_until, strikes, reason, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (destination) DO UPDATE SET label = excluded.label,
                 paused_until = CASE WHEN destination_limits.paused_until > excluded.paused_until
                                     THEN destination_limits.paused_until ELSE excluded.paused_until END,
                 strikes = excluded.strikes, reason = excluded.reason, updated_at = excluded.updated_at
             RETURNING {COLUMNS}"
        )))
        .bind(destination)
        .bind(label)
        .bind(until)
        .bind(strikes)
        .bind(reason)
        .bind(now)
        .fetch_one(&mut *tx)
        .await
        .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))?;
        Ok(row)
    }

    /// A send to `destination` went through: its limit is over.
    pub async fn unlimit(&self, destination: &str) -> Result<(), StoreError> {
        self.write_one(
            "clearing a rate limit",
            sqlx::query("DELETE FROM destination_limits WHERE destination = $1").bind(destination),
        )
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {

    /// A limit that names its time is kept to it (never past the most); one
    /// that names none pauses for the first wait, doubling per limit in a
    /// row; a later, nearer limit does not shorten a pause; a success
    /// clears it. On SQLite and PostgreSQL.
    #[tokio::test]
    async fn limits_pause_double_and_clear() {
        let dir = tempfile::tempdir().expect("tempdir");
        for store in crate::store::testing::stores(dir.path()).await {
            const S: i64 = 1000;
            let policy = (60 * S, 3600 * S);
            let t0 = crate::store::now_ms();
            let l = store
                .limit("h/abc", "forge `f`", Some(120 * S), policy, "403 spent")
                .await
                .expect("limit");
            assert!(
                (t0 + 119 * S..t0 + 122 * S).contains(&l.paused_until),
                "{l:?}"
            );
            assert_eq!(l.strikes, 0);
            let l = store
                .limit("h/abc", "forge `f`", Some(5 * S), policy, "again")
                .await
                .expect("limit");
            assert!(l.paused_until >= t0 + 119 * S, "shortened: {l:?}");
            let l = store
                .limit("h/abc", "forge `f`", Some(99_999 * S), policy, "long")
                .await
                .expect("limit");
            assert!(l.paused_until <= crate::store::now_ms() + 3600 * S, "{l:?}");
            store.unlimit("h/abc").await.expect("clear");
            assert!(store.limit_of("h/abc").await.expect("read").is_none());
            let mut waits = Vec::new();
            for _ in 0..3 {
                let before = crate::store::now_ms();
                let l = store
                    .limit("h/x", "notifier `n`", None, policy, "429")
                    .await
                    .expect("limit");
                waits.push((l.paused_until - before + S / 2) / S / 60);
                // Expire it, so the next one is not kept behind it.
                store
                    .write_one(
                        "expiring",
                        sqlx::query("UPDATE destination_limits SET paused_until = 0"),
                    )
                    .await
                    .expect("expire");
            }
            assert_eq!(waits, [1, 2, 4]);
            assert_eq!(store.limits().await.expect("all").len(), 1);
        }
    }
}
