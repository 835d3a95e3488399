//! The `run_output` table (migration 0025): a run's whole output as it
//! came, in chunks of complete, already-redacted lines, for
//! `GET /api/v1/runs/{id}/output` and `driftless logs` — on PostgreSQL any
//! instance reads what another's run wrote. A chunk is appended, read in
//! order, moved to a streak's row when its run folds into one, and pruned
//! once its run is gone. This module neither redacts nor bounds output
//! (`tick::output` does both before anything reaches it).

use super::{Store, StoreError, now_ms};

/// One piece of a run's output.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Chunk {
    /// 1, 2, … within the run.
    pub seq: i64,
    /// When it was written (ms since the epoch).
    pub at: i64,
    pub data: String,
}

/// Output whose run is gone and that is older than the cutoff (`$1`), a
/// batch (`$2`) at a time (`Store::prune_history`).
pub(super) const PRUNE_OUTPUT: &str = "DELETE FROM run_output WHERE (run_id, seq) IN (
     SELECT run_id, seq FROM run_output o WHERE o.at < $1
       AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = o.run_id) LIMIT $2)";

/// [`fold`]'s statements: the output of run `$1` (the streak's) dropped,
/// then run `$1`'s (the newest's) given to run `$2` (the streak's).
pub(super) const FOLD: [&str; 2] = [
    "DELETE FROM run_output WHERE run_id = $1",
    "UPDATE run_output SET run_id = $2 WHERE run_id = $1",
];

/// [`fold`] on SQLite's write thread (`store::direct`).
pub(super) fn fold_direct(
    tx: &rusqlite::Transaction<'_>,
    from: i64,
    into: i64,
) -> Result<(), sqlx::Error> {
    use super::direct::failure;
    tx.prepare_cached(FOLD[0])
        .and_then(|mut s| s.execute(rusqlite::named_params! { "$1": into }))
        .map_err(failure)?;
    tx.prepare_cached(FOLD[1])
        .and_then(|mut s| s.execute(rusqlite::named_params! { "$1": from, "$2": into }))
        .map_err(failure)?;
    Ok(())
}

/// Run `from` folded into the streak row `into` (`runs::fold`): the
/// streak keeps the newest run's output, as it keeps its tail.
pub(super) async fn fold(tx: &mut super::db::Tx, from: i64, into: i64) -> Result<(), sqlx::Error> {
    sqlx::query(FOLD[0]).bind(into).execute(&mut **tx).await?;
    sqlx::query(FOLD[1])
        .bind(from)
        .bind(into)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

impl Store {
    /// Append chunk `seq` of run `run_id`'s output.
    pub async fn append_output(&self, run_id: i64, seq: i64, data: &str) -> Result<(), StoreError> {
        self.write_one(
            "keeping a run's output",
            sqlx::query("INSERT INTO run_output (run_id, seq, at, data) VALUES ($1, $2, $3, $4)")
                .bind(run_id)
                .bind(seq)
                .bind(now_ms())
                .bind(data),
        )
        .await?;
        self.changes.output();
        Ok(())
    }

    /// Run `run_id`'s output chunks after chunk `after` (0: from the
    /// start), in order.
    pub async fn run_output(&self, run_id: i64, after: i64) -> Result<Vec<Chunk>, StoreError> {
        sqlx::query_as::<_, Chunk>(
            "SELECT seq, at, data FROM run_output WHERE run_id = $1 AND seq > $2 ORDER BY seq",
        )
        .bind(run_id)
        .bind(after)
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading a run's output"))
    }
}
