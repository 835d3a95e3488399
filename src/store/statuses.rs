//! The commit-status outbox (migration 0011): the newest state driftless
//! has for each (forge, repository, commit, context), and whether the forge
//! has it yet. A state is written with what caused it (a queued push, a
//! run's result, in the run's transaction); the sender claims a row, sends
//! its state and records the version it sent. Only the newest state of a
//! row is ever sent, so an older state retried late cannot overwrite a
//! newer one. This module sends nothing and decides no state.

use serde::Serialize;
use sqlx::FromRow;

use super::outbox::{ForgeOutbox, HasId};
use super::{Store, StoreError, now_ms};

/// The state of a status, in driftless's words (`notify::forge` gives
/// each forge its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Pending,
    Success,
    Failure,
    /// driftless could not finish (a timeout, an internal failure).
    Error,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Success => "success",
            State::Failure => "failure",
            State::Error => "error",
        }
    }

    /// The state `as_str` wrote, if it is one.
    pub fn parse(s: &str) -> Option<State> {
        [State::Pending, State::Success, State::Failure, State::Error]
            .into_iter()
            .find(|x| x.as_str() == s)
    }
}

super::db::text_enum!(State);

/// A state to record for a target's context on one commit.
#[derive(Debug, Clone)]
pub struct NewStatus {
    pub forge: String,
    pub repo: String,
    pub sha: String,
    pub context: String,
    pub target: String,
    pub state: State,
    pub description: String,
    pub target_url: Option<String>,
    /// The branch, or a pull request's head ref, the commit is on (GitLab's
    /// `ref`); none for a target that follows tags.
    pub git_ref: Option<String>,
    /// A run's status: the commits of this context still `pending`
    /// ("queued") since before this time (Unix ms) were pushed before the
    /// run fetched, so the commit it ran includes them; they become
    /// `success` "superseded by <sha>".
    pub supersedes_queued_before: Option<i64>,
}

/// A row of the status outbox.
#[derive(Debug, Clone, FromRow, Serialize)]
pub struct StatusRow {
    pub id: i64,
    pub forge: String,
    pub repo: String,
    pub sha: String,
    pub context: String,
    pub target: String,
    pub state: State,
    pub description: String,
    pub target_url: Option<String>,
    pub git_ref: Option<String>,
    pub version: i64,
    pub sent_version: i64,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub last_error: Option<String>,
    #[sqlx(try_from = "crate::store::db::Flag")]
    pub given_up: bool,
}

impl HasId for StatusRow {
    fn id(&self) -> i64 {
        self.id
    }
}

/// Statuses the forge has (or that were given up), last changed before
/// `$1`, at most `$2` of them (`store::runs`' pruning runs it in batches).
pub(super) const PRUNE_STATUSES: &str = "DELETE FROM forge_statuses WHERE id IN (
     SELECT id FROM forge_statuses
     WHERE (sent_version >= version OR given_up = 1) AND updated_at < $1
     LIMIT $2)";

const COLUMNS: &str = "id, forge, repo, sha, context, target, state, description, target_url, \
     git_ref, version, sent_version, attempts, next_attempt_at, last_error, given_up";

/// Record `s` in the caller's transaction. `only_first`: only when the
/// commit has no state for this context yet (a queued push says `pending`,
/// but never over a result already there). The same state, description
/// and link again is not a new version (an interval tick finding nothing
/// to do sends the forge nothing), unless the last one was given up.
pub(crate) async fn record(
    tx: &mut crate::store::db::Tx,
    s: &NewStatus,
    only_first: bool,
) -> Result<(), sqlx::Error> {
    let now = now_ms();
    let on_conflict = if only_first {
        "DO NOTHING"
    } else {
        "DO UPDATE SET state = excluded.state, description = excluded.description,
             target_url = excluded.target_url, target = excluded.target,
             git_ref = excluded.git_ref, version = forge_statuses.version + 1, attempts = 0,
             next_attempt_at = excluded.next_attempt_at, last_error = NULL, given_up = 0,
             updated_at = excluded.updated_at
         WHERE forge_statuses.state IS DISTINCT FROM excluded.state
            OR forge_statuses.description IS DISTINCT FROM excluded.description
            OR forge_statuses.target_url IS DISTINCT FROM excluded.target_url
            OR forge_statuses.given_up = 1"
    };
    let q = format!(
        "INSERT INTO forge_statuses (forge, repo, sha, context, target, state, description,
             target_url, git_ref, version, next_attempt_at, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $10, 1, $9, $9, $9)
         ON CONFLICT (forge, repo, sha, context) {on_conflict}"
    );
    sqlx::query(sqlx::AssertSqlSafe(q))
        .bind(&s.forge)
        .bind(&s.repo)
        .bind(&s.sha)
        .bind(&s.context)
        .bind(&s.target)
        .bind(s.state)
        .bind(&s.description)
        .bind(&s.target_url)
        .bind(now)
        .bind(&s.git_ref)
        .execute(&mut **tx)
        .await?;
    if let Some(before) = s.supersedes_queued_before {
        let short: String = s.sha.chars().take(12).collect();
        sqlx::query(
            "UPDATE forge_statuses SET state = 'success', description = $6,
                    version = version + 1, attempts = 0, next_attempt_at = $7,
                    last_error = NULL, given_up = 0, updated_at = $7
             WHERE forge = $1 AND repo = $2 AND context = $3 AND sha <> $4
               AND state = 'pending' AND description = 'queued' AND updated_at < $5",
        )
        .bind(&s.forge)
        .bind(&s.repo)
        .bind(&s.context)
        .bind(&s.sha)
        .bind(before)
        .bind(format!(
            "superseded by {short}, whose run covers this commit"
        ))
        .bind(now)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

impl Store {
    /// Record statuses on their own (a queued push): see [`record`].
    pub async fn record_statuses(
        &self,
        statuses: &[NewStatus],
        only_first: bool,
    ) -> Result<(), StoreError> {
        if statuses.is_empty() {
            return Ok(());
        }
        let what = "recording commit statuses";
        let mut tx = self.begin_write(what).await?;
        for s in statuses {
            record(&mut tx, s, only_first)
                .await
                .map_err(self.err(what))?;
        }
        tx.commit().await.map_err(self.err(what))
    }

    /// Claim up to 100 rows whose newest state the forge does not have yet
    /// and that are due: each is left alone by other senders for `claim_ms`.
    pub async fn claim_statuses(&self, claim_ms: i64) -> Result<Vec<StatusRow>, StoreError> {
        self.claim_due(
            ForgeOutbox::Status,
            COLUMNS,
            100,
            claim_ms,
            "claiming commit statuses",
        )
        .await
    }

    /// Row `id` was sent at `version`. A newer state recorded meanwhile
    /// stays due.
    pub async fn status_sent(&self, id: i64, version: i64) -> Result<(), StoreError> {
        self.write_one("recording a sent commit status", sqlx::query(
            "UPDATE forge_statuses SET sent_version = CASE WHEN sent_version > $2 THEN sent_version ELSE $2 END, attempts = 0,
                    last_error = NULL, next_attempt_at = $3, updated_at = $3
             WHERE id = $1",
        )
        .bind(id)
        .bind(version)
        .bind(now_ms()))
            .await
        .map(|_| ())
    }

    /// Sending row `id` at `version` failed: try again at `next`, or give
    /// up (`next` `None`). Only if no newer state came meanwhile (that one
    /// starts its own attempts).
    pub async fn status_failed(
        &self,
        id: i64,
        version: i64,
        error: &str,
        next: Option<i64>,
    ) -> Result<(), StoreError> {
        self.failed_at(
            ForgeOutbox::Status,
            (id, version),
            error,
            next,
            "recording a failed commit status",
        )
        .await
    }

    /// Statuses whose newest state the forge does not have yet (and,
    /// with `include_given_up`, those given up), oldest first.
    pub async fn unsent_statuses(
        &self,
        include_given_up: bool,
    ) -> Result<Vec<StatusRow>, StoreError> {
        self.unsent_in(
            ForgeOutbox::Status,
            COLUMNS,
            include_given_up,
            "reading commit statuses",
        )
        .await
    }

    /// A target's statuses, oldest first (for `driftless notify pending`
    /// and tests).
    pub async fn statuses_of(&self, target: &str) -> Result<Vec<StatusRow>, StoreError> {
        let q = format!("SELECT {COLUMNS} FROM forge_statuses WHERE target = $1 ORDER BY id");
        sqlx::query_as::<_, StatusRow>(sqlx::AssertSqlSafe(q))
            .bind(target)
            .fetch_all(self.pool())
            .await
            .map_err(self.err("reading commit statuses"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// With nothing due a claim only reads: it does not wait for the turn
    /// to write (each sender looks every few seconds, a one-shot command
    /// after its run). With something due it takes the turn and claims.
    #[tokio::test]
    async fn a_claim_with_nothing_due_takes_no_turn_to_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        for store in crate::store::testing::stores(dir.path()).await {
            let soon = Duration::from_secs(3);
            let held = store.begin_write("a long write").await.expect("tx");
            let claimed = tokio::time::timeout(soon, store.claim_statuses(60_000)).await;
            assert!(
                matches!(&claimed, Ok(Ok(rows)) if rows.is_empty()),
                "nothing due, yet the claim waited for the turn to write: {claimed:?}"
            );
            drop(held);

            let status = NewStatus {
                forge: "f".into(),
                repo: "me/infra".into(),
                sha: "a".repeat(40),
                context: "driftless/web".into(),
                target: "web".into(),
                state: State::Pending,
                description: "queued".into(),
                target_url: None,
                git_ref: Some("main".into()),
                supersedes_queued_before: None,
            };
            store
                .record_statuses(&[status], true)
                .await
                .expect("record");
            let held = store.begin_write("a long write").await.expect("tx");
            let waited = tokio::time::timeout(soon, store.claim_statuses(60_000)).await;
            assert!(
                waited.is_err(),
                "a due status was claimed without the turn to write"
            );
            drop(held);
            let rows = store.claim_statuses(60_000).await.expect("claim");
            assert_eq!(rows.len(), 1, "the due status is claimed");
            assert!(
                store
                    .claim_statuses(60_000)
                    .await
                    .expect("claim")
                    .is_empty(),
                "a claimed status is left alone for the claim's time"
            );
        }
    }
}
