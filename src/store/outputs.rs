//! The outputs a target's last successful apply left (migration 0015), for
//! the targets that take them as `inputs`: recorded after the apply, read
//! when a consumer runs. This module decides nothing about when to record
//! or what a missing output means.

use super::{Store, StoreError, now_ms};

/// A JSON object of outputs, as a backend reports them.
pub type Outputs = serde_json::Map<String, serde_json::Value>;

impl Store {
    /// Keep `outputs` as `target`'s, left by run `run_id`; whether they
    /// differ from the ones recorded before (none recorded: they do).
    pub async fn record_outputs(
        &self,
        target: &str,
        run_id: i64,
        outputs: &Outputs,
    ) -> Result<bool, StoreError> {
        let what = "recording a target's outputs";
        let json = serde_json::Value::Object(outputs.clone()).to_string();
        let mut tx = self.begin_write(what).await?;
        let before: Option<String> =
            sqlx::query_scalar("SELECT outputs FROM target_outputs WHERE target = $1")
                .bind(target)
                .fetch_optional(&mut *tx)
                .await
                .map_err(self.err(what))?;
        sqlx::query(
            "INSERT INTO target_outputs (target, run_id, outputs, recorded_at)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (target) DO UPDATE SET run_id = $2, outputs = $3, recorded_at = $4",
        )
        .bind(target)
        .bind(run_id)
        .bind(&json)
        .bind(now_ms())
        .execute(&mut *tx)
        .await
        .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))?;
        let same = before
            .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
            .is_some_and(|b| b == serde_json::Value::Object(outputs.clone()));
        Ok(!same)
    }

    /// Forget `target`'s recorded outputs (it was destroyed).
    pub async fn forget_outputs(&self, target: &str) -> Result<(), StoreError> {
        let q = sqlx::query("DELETE FROM target_outputs WHERE target = $1").bind(target);
        self.write_one("forgetting a destroyed target's outputs", q)
            .await
            .map(drop)
    }

    /// The outputs recorded for `target`, if any.
    pub async fn outputs_of(&self, target: &str) -> Result<Option<Outputs>, StoreError> {
        let what = "reading a target's recorded outputs";
        let row: Option<String> =
            sqlx::query_scalar("SELECT outputs FROM target_outputs WHERE target = $1")
                .bind(target)
                .fetch_optional(self.pool())
                .await
                .map_err(self.err(what))?;
        Ok(row.and_then(|r| match serde_json::from_str(&r) {
            Ok(serde_json::Value::Object(m)) => Some(m),
            _ => None,
        }))
    }
}
