//! Pull-request previews (migration 0012): the pull requests driftless
//! was told of, one preview job per (pull request, target) folded by head,
//! and the one comment per pull request as an outbox row (its newest body,
//! the version the forge has, the forge's id of the comment). An event is
//! recorded in the caller's transaction (the webhook's delivery); a result
//! is kept only for the head it was planned at, and only while the pull
//! request is open; the comment's body is rebuilt in the same transaction.
//! This module sends nothing, plans nothing and words nothing: the body is
//! the caller's (`render`).

use serde::Serialize;
use sqlx::FromRow;

use super::outbox::{ForgeOutbox, HasId};
use super::statuses::{self, NewStatus};
use super::{Store, StoreError, now_ms};

/// How long a closed pull request is remembered (a reopened one within it
/// keeps its comment id; after it, the marker finds the comment again).
pub const PULL_MEMORY: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// A pull request on a forge, as driftless keys it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullKey {
    /// The `[[forges]]` entry.
    pub forge: String,
    /// `owner/name` there (GitLab: the project path).
    pub repo: String,
    pub number: i64,
}

/// What a pull request event asks, for the targets it concerns on one
/// forge repository.
#[derive(Debug, Clone)]
pub struct PullEvent {
    pub key: PullKey,
    pub head_sha: String,
    pub head_ref: String,
    /// Targets to preview at this head (none for a close).
    pub targets: Vec<String>,
    /// Closed or merged: nothing more is planned, queued previews dropped.
    pub close: bool,
}

/// A pull request's row.
#[derive(Debug, Clone, FromRow, Serialize)]
pub struct PullRow {
    pub id: i64,
    pub forge: String,
    pub repo: String,
    pub number: i64,
    pub head_sha: String,
    #[sqlx(try_from = "crate::store::db::Flag")]
    pub open: bool,
    pub comment_id: Option<String>,
    pub body: Option<String>,
    pub version: i64,
    pub sent_version: i64,
    pub attempts: i64,
    pub last_error: Option<String>,
    #[sqlx(try_from = "crate::store::db::Flag")]
    pub given_up: bool,
}

const PULL_COLUMNS: &str = "id, forge, repo, number, head_sha, open, comment_id, body, version, \
     sent_version, attempts, last_error, given_up";

impl HasId for PullRow {
    fn id(&self) -> i64 {
        self.id
    }
}

/// A preview job and, once done, its result.
#[derive(Debug, Clone, FromRow, Serialize)]
pub struct PreviewRow {
    pub id: i64,
    pub pull_request: i64,
    pub target: String,
    pub head_sha: String,
    pub head_ref: String,
    /// `queued`, `running`, `planned`, `failed`, `unaffected`, `dropped`.
    pub state: String,
    #[sqlx(try_from = "crate::store::db::Flag")]
    pub changes: bool,
    #[sqlx(try_from = "crate::store::db::Flag")]
    pub destructive: bool,
    /// The plan's summary, or why it failed.
    pub summary: Option<String>,
    /// The plan's lines (redacted by the backend).
    pub diff: Option<String>,
}

const PREVIEW_COLUMNS: &str = "id, pull_request, target, head_sha, head_ref, state, changes, \
     destructive, summary, diff";

/// How a preview ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The pull request changes nothing under the target's path.
    Unaffected,
    Planned {
        changes: bool,
        destructive: bool,
        summary: String,
        diff: String,
    },
    Failed(String),
}

/// Record `e` in the caller's transaction: the pull request's newest head
/// and each target's preview queued at it (a row already there, whatever
/// its state, is queued again at this head); or, for a close, the pull
/// request closed and its queued previews dropped. Returns how many
/// previews were dropped.
pub(crate) async fn record_event(
    tx: &mut crate::store::db::Tx,
    e: &PullEvent,
) -> Result<u64, sqlx::Error> {
    let now = now_ms();
    if e.close {
        let id: Option<i64> = sqlx::query_scalar(
            "UPDATE pull_requests SET open = 0, updated_at = $4
             WHERE forge = $1 AND repo = $2 AND number = $3 RETURNING id",
        )
        .bind(&e.key.forge)
        .bind(&e.key.repo)
        .bind(e.key.number)
        .bind(now)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(id) = id else { return Ok(0) };
        let r = sqlx::query(
            "UPDATE previews SET state = 'dropped', finished_at = $2
             WHERE pull_request = $1 AND state = 'queued'",
        )
        .bind(id)
        .bind(now)
        .execute(&mut **tx)
        .await?;
        return Ok(r.rows_affected());
    }
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO pull_requests (forge, repo, number, head_sha, open, created_at, updated_at)
         VALUES ($1, $2, $3, $4, 1, $5, $5)
         ON CONFLICT (forge, repo, number)
         DO UPDATE SET head_sha = excluded.head_sha, open = 1, updated_at = excluded.updated_at
         RETURNING id",
    )
    .bind(&e.key.forge)
    .bind(&e.key.repo)
    .bind(e.key.number)
    .bind(&e.head_sha)
    .bind(now)
    .fetch_one(&mut **tx)
    .await?;
    for t in &e.targets {
        sqlx::query(
            "INSERT INTO previews (pull_request, target, head_sha, head_ref, state, queued_at)
             VALUES ($1, $2, $3, $4, 'queued', $5)
             ON CONFLICT (pull_request, target)
             DO UPDATE SET head_sha = excluded.head_sha, head_ref = excluded.head_ref,
                           state = 'queued', queued_at = excluded.queued_at, owner = NULL,
                           started_at = NULL, finished_at = NULL",
        )
        .bind(id)
        .bind(t)
        .bind(&e.head_sha)
        .bind(&e.head_ref)
        .bind(now)
        .execute(&mut **tx)
        .await?;
    }
    Ok(0)
}

/// The previews waiting to be planned, of pull requests still open (`p`).
const QUEUED_PREVIEWS: &str = "previews p JOIN pull_requests r ON r.id = p.pull_request
     WHERE p.state = 'queued' AND r.open = 1";

/// A claimed preview with its pull request.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub preview: PreviewRow,
    pub pull: PullRow,
}

impl Store {
    /// Claim the oldest queued preview of an open pull request for `owner`.
    pub async fn claim_preview(&self, owner: &str) -> Result<Option<Claimed>, StoreError> {
        let what = "claiming a preview";
        // Looked for first with a read, which waits for no writer: the
        // preview worker also looks at every idle poll, and mostly finds
        // nothing to take.
        let queued: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT p.id FROM {QUEUED_PREVIEWS} LIMIT 1"
        )))
        .fetch_optional(self.pool())
        .await
        .map_err(self.err("looking for a preview to claim"))?;
        if queued.is_none() {
            return Ok(None);
        }
        let mut tx = self.begin_write(what).await?;
        let q = format!(
            "UPDATE previews SET state = 'running', owner = $1, started_at = $2
             WHERE id = (SELECT p.id FROM {QUEUED_PREVIEWS} ORDER BY p.queued_at, p.id LIMIT 1)
             RETURNING {PREVIEW_COLUMNS}"
        );
        let Some(preview) = sqlx::query_as::<_, PreviewRow>(sqlx::AssertSqlSafe(q))
            .bind(owner)
            .bind(now_ms())
            .fetch_optional(&mut *tx)
            .await
            .map_err(self.err(what))?
        else {
            return Ok(None);
        };
        let q = format!("SELECT {PULL_COLUMNS} FROM pull_requests WHERE id = $1");
        let pull = sqlx::query_as::<_, PullRow>(sqlx::AssertSqlSafe(q))
            .bind(preview.pull_request)
            .fetch_one(&mut *tx)
            .await
            .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))?;
        Ok(Some(Claimed { preview, pull }))
    }

    /// Previews left `running` by a process that is gone go back to the
    /// queue. On SQLite (called when the daemon starts: it is the only one
    /// planning previews for this state directory) every running one. On
    /// PostgreSQL, where other instances plan previews too, only those of
    /// an owner that holds no liveness lock (`Store::hold_liveness`): its
    /// process is gone.
    pub async fn requeue_previews(&self) -> Result<u64, StoreError> {
        let what = "requeueing interrupted previews";
        if self.kind() == super::Kind::Sqlite {
            return self
                .write_one(
                    what,
                    sqlx::query(
                        "UPDATE previews SET state = 'queued', owner = NULL, started_at = NULL
                 WHERE state = 'running'",
                    ),
                )
                .await
                .map(|r| r.rows_affected());
        }
        let owners: Vec<Option<String>> =
            sqlx::query_scalar("SELECT DISTINCT owner FROM previews WHERE state = 'running'")
                .fetch_all(self.pool())
                .await
                .map_err(self.err(what))?;
        let mut requeued = 0;
        for owner in owners {
            if let Some(o) = &owner
                && self.is_alive(o).await?
            {
                continue;
            }
            requeued += self
                .write_one(
                    what,
                    sqlx::query(
                        "UPDATE previews SET state = 'queued', owner = NULL, started_at = NULL
                 WHERE state = 'running' AND owner IS NOT DISTINCT FROM $1",
                    )
                    .bind(owner),
                )
                .await?
                .rows_affected();
        }
        Ok(requeued)
    }

    /// Preview `id` claimed at `head_sha` ended with `outcome`. Kept only
    /// if it is still the preview of that head and its pull request is
    /// still open (else a newer head or a close came meanwhile: `false`,
    /// nothing written). With it, in one transaction: `statuses` (the
    /// preview's commit status) and the pull request's comment, rebuilt by
    /// `render` from every preview of its current head (`None`: nothing
    /// to say, no comment yet). A body that changed is due to be sent.
    pub async fn finish_preview(
        &self,
        id: i64,
        head_sha: &str,
        outcome: &Outcome,
        statuses_: &[NewStatus],
        render: impl Fn(&PullRow, &[PreviewRow]) -> Option<String>,
    ) -> Result<bool, StoreError> {
        let what = "recording a preview";
        let now = now_ms();
        let mut tx = self.begin_write(what).await?;
        let (state, changes, destructive, summary, diff) = match outcome {
            Outcome::Unaffected => ("unaffected", false, false, None, None),
            Outcome::Planned {
                changes,
                destructive,
                summary,
                diff,
            } => (
                "planned",
                *changes,
                *destructive,
                Some(summary.as_str()),
                Some(diff.as_str()),
            ),
            Outcome::Failed(why) => ("failed", false, false, Some(why.as_str()), None),
        };
        let pull: Option<i64> = sqlx::query_scalar(
            "UPDATE previews SET state = $3, changes = $4, destructive = $5, summary = $6,
                    diff = $7, finished_at = $8
             WHERE id = $1 AND head_sha = $2 AND state = 'running'
               AND EXISTS (SELECT 1 FROM pull_requests r
                           WHERE r.id = previews.pull_request AND r.open = 1
                             AND r.head_sha = previews.head_sha)
             RETURNING pull_request",
        )
        .bind(id)
        .bind(head_sha)
        .bind(state)
        .bind(i64::from(changes))
        .bind(i64::from(destructive))
        .bind(summary)
        .bind(diff)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(self.err(what))?;
        let Some(pull) = pull else {
            return Ok(false);
        };
        for s in statuses_ {
            statuses::record(&mut tx, s, false)
                .await
                .map_err(self.err(what))?;
        }
        let q = format!("SELECT {PULL_COLUMNS} FROM pull_requests WHERE id = $1");
        let row = sqlx::query_as::<_, PullRow>(sqlx::AssertSqlSafe(q))
            .bind(pull)
            .fetch_one(&mut *tx)
            .await
            .map_err(self.err(what))?;
        let q = format!(
            "SELECT {PREVIEW_COLUMNS} FROM previews
             WHERE pull_request = $1 AND head_sha = $2 ORDER BY target"
        );
        let previews = sqlx::query_as::<_, PreviewRow>(sqlx::AssertSqlSafe(q))
            .bind(pull)
            .bind(&row.head_sha)
            .fetch_all(&mut *tx)
            .await
            .map_err(self.err(what))?;
        let body = render(&row, &previews);
        if body.is_some() && body != row.body {
            sqlx::query(
                "UPDATE pull_requests SET body = $2, version = version + 1, attempts = 0,
                        next_attempt_at = $3, last_error = NULL, given_up = 0, updated_at = $3
                 WHERE id = $1",
            )
            .bind(pull)
            .bind(&body)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(self.err(what))?;
        }
        tx.commit().await.map_err(self.err(what))?;
        Ok(true)
    }

    /// A claimed preview that could not start (its checkout was busy):
    /// queued again as it was.
    pub async fn requeue_preview(&self, id: i64) -> Result<(), StoreError> {
        self.write_one(
            "queueing a preview again",
            sqlx::query(
                "UPDATE previews SET state = 'queued', owner = NULL, started_at = NULL
             WHERE id = $1 AND state = 'running'",
            )
            .bind(id),
        )
        .await
        .map(|_| ())
    }

    /// A preview that will not be planned (its target is gone or no
    /// longer previews): dropped, nothing else changes.
    pub async fn drop_preview(&self, id: i64) -> Result<(), StoreError> {
        self.write_one(
            "dropping a preview",
            sqlx::query(
                "UPDATE previews SET state = 'dropped', finished_at = $2
             WHERE id = $1 AND state = 'running'",
            )
            .bind(id)
            .bind(now_ms()),
        )
        .await
        .map(|_| ())
    }

    /// Claim up to 20 pull requests whose comment the forge does not have
    /// in its newest version and that are due; each is left alone by other
    /// senders for `claim_ms`.
    pub async fn claim_comments(&self, claim_ms: i64) -> Result<Vec<PullRow>, StoreError> {
        self.claim_due(
            ForgeOutbox::Comment,
            PULL_COLUMNS,
            20,
            claim_ms,
            "claiming pull request comments",
        )
        .await
    }

    /// The comment of pull request `id` is on the forge at `version`, as
    /// the forge's comment `comment_id`.
    pub async fn comment_sent(
        &self,
        id: i64,
        version: i64,
        comment_id: &str,
    ) -> Result<(), StoreError> {
        self.write_one("recording a sent pull request comment", sqlx::query(
            "UPDATE pull_requests SET sent_version = CASE WHEN sent_version > $2 THEN sent_version ELSE $2 END, comment_id = $3,
                    attempts = 0, last_error = NULL, next_attempt_at = $4, updated_at = $4
             WHERE id = $1",
        )
        .bind(id)
        .bind(version)
        .bind(comment_id)
        .bind(now_ms()))
            .await
        .map(|_| ())
    }

    /// Sending the comment of `id` at `version` failed: again at `next`,
    /// or given up (`None`); only if no newer body came meanwhile.
    pub async fn comment_failed(
        &self,
        id: i64,
        version: i64,
        error: &str,
        next: Option<i64>,
    ) -> Result<(), StoreError> {
        self.failed_at(
            ForgeOutbox::Comment,
            (id, version),
            error,
            next,
            "recording a failed pull request comment",
        )
        .await
    }

    /// Pull requests whose comment the forge does not have in its newest
    /// version (and, with `include_given_up`, those given up), oldest first.
    pub async fn unsent_comments(
        &self,
        include_given_up: bool,
    ) -> Result<Vec<PullRow>, StoreError> {
        self.unsent_in(
            ForgeOutbox::Comment,
            PULL_COLUMNS,
            include_given_up,
            "reading pull request comments",
        )
        .await
    }

    /// Forget pull requests closed longer than `PULL_MEMORY` ago whose
    /// comment the forge has (and their previews). Returns how many.
    pub async fn prune_pull_requests(&self) -> Result<u64, StoreError> {
        let what = "forgetting closed pull requests";
        let cutoff = now_ms() - PULL_MEMORY.as_millis() as i64;
        let mut tx = self.begin_write(what).await?;
        let old = "SELECT id FROM pull_requests
                   WHERE open = 0 AND updated_at < $1 AND (sent_version >= version OR given_up = 1)";
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM previews WHERE pull_request IN ({old})"
        )))
        .bind(cutoff)
        .execute(&mut *tx)
        .await
        .map_err(self.err(what))?;
        let r = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM pull_requests WHERE id IN ({old})"
        )))
        .bind(cutoff)
        .execute(&mut *tx)
        .await
        .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))?;
        Ok(r.rows_affected())
    }

    /// Every pull request with its previews, newest first (for `driftless
    /// notify pending` and tests).
    pub async fn pull_requests(&self) -> Result<Vec<(PullRow, Vec<PreviewRow>)>, StoreError> {
        let what = "reading pull requests";
        let q = format!("SELECT {PULL_COLUMNS} FROM pull_requests ORDER BY id DESC");
        let pulls = sqlx::query_as::<_, PullRow>(sqlx::AssertSqlSafe(q))
            .fetch_all(self.pool())
            .await
            .map_err(self.err(what))?;
        let mut out = Vec::new();
        for p in pulls {
            let q = format!(
                "SELECT {PREVIEW_COLUMNS} FROM previews WHERE pull_request = $1 ORDER BY target"
            );
            let previews = sqlx::query_as::<_, PreviewRow>(sqlx::AssertSqlSafe(q))
                .bind(p.id)
                .fetch_all(self.pool())
                .await
                .map_err(self.err(what))?;
            out.push((p, previews));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(number: i64, head: &str, targets: &[&str], close: bool) -> PullEvent {
        PullEvent {
            key: PullKey {
                forge: "f".into(),
                repo: "me/infra".into(),
                number,
            },
            head_sha: head.into(),
            head_ref: format!("refs/pull/{number}/head"),
            targets: targets.iter().map(|t| t.to_string()).collect(),
            close,
        }
    }

    async fn record(store: &Store, e: &PullEvent) -> u64 {
        let mut tx = store.begin_write("test").await.expect("tx");
        let n = record_event(&mut tx, e).await.expect("record");
        tx.commit().await.expect("commit");
        n
    }

    /// A preview's result is kept only for the head it was planned at;
    /// a close drops what is queued; closed pull requests are forgotten
    /// after PULL_MEMORY, never while their comment is unsent.
    #[tokio::test]
    async fn results_belong_to_their_head_and_closed_pull_requests_are_forgotten() {
        let dir = tempfile::tempdir().expect("tempdir");
        for store in crate::store::testing::stores(dir.path()).await {
            let planned = Outcome::Planned {
                changes: true,
                destructive: false,
                summary: "1 to add".into(),
                diff: "+ x".into(),
            };
            let body = |_: &PullRow, p: &[PreviewRow]| Some(format!("{} preview(s)", p.len()));
            record(&store, &event(1, "aaaa", &["web"], false)).await;
            let job = store
                .claim_preview("me")
                .await
                .expect("claim")
                .expect("a job");
            // A newer head arrives while the older one is planned.
            record(&store, &event(1, "bbbb", &["web"], false)).await;
            let kept = store
                .finish_preview(job.preview.id, "aaaa", &planned, &[], body)
                .await
                .expect("finish");
            assert!(!kept, "a result for an older head was kept");
            let job = store
                .claim_preview("me")
                .await
                .expect("claim")
                .expect("the newer head");
            assert_eq!(job.preview.head_sha, "bbbb");
            assert!(
                store
                    .finish_preview(job.preview.id, "bbbb", &planned, &[], body)
                    .await
                    .expect("finish")
            );
            let pulls = store.pull_requests().await.expect("read");
            assert_eq!(pulls[0].0.body.as_deref(), Some("1 preview(s)"));
            assert_eq!((pulls[0].0.version, pulls[0].0.sent_version), (1, 0));

            // Queued, then closed: dropped, never claimed.
            record(&store, &event(2, "cccc", &["web"], false)).await;
            assert_eq!(record(&store, &event(2, "cccc", &[], true)).await, 1);
            assert!(store.claim_preview("me").await.expect("claim").is_none());

            // Closed long ago: forgotten once its comment is sent.
            let q = sqlx::query("UPDATE pull_requests SET open = 0, updated_at = 0");
            store.write_one("test", q).await.expect("age");
            assert_eq!(
                store.prune_pull_requests().await.expect("prune"),
                1,
                "#2 only: #1's comment is unsent"
            );
            store
                .comment_sent(pulls[0].0.id, 1, "99")
                .await
                .expect("sent");
            let q = sqlx::query("UPDATE pull_requests SET updated_at = 0");
            store.write_one("test", q).await.expect("age");
            assert_eq!(store.prune_pull_requests().await.expect("prune"), 1);
            assert!(store.pull_requests().await.expect("read").is_empty());
        }
    }

    /// On PostgreSQL a preview is taken from its owner only once the owner
    /// is gone (its liveness lock released); on SQLite, where the daemon
    /// starting is the only one, at once.
    #[tokio::test]
    async fn a_running_preview_stays_with_a_live_owner() {
        let dir = tempfile::tempdir().expect("tempdir");
        for store in crate::store::testing::stores(dir.path()).await {
            record(&store, &event(1, "aaaa", &["web"], false)).await;
            let alive = store.hold_liveness("other").await.expect("liveness");
            let job = store.claim_preview("other").await.expect("claim");
            assert!(job.is_some());
            let pg = store.kind() == crate::store::Kind::Postgres;
            let requeued = store.requeue_previews().await.expect("requeue");
            assert_eq!(requeued, if pg { 0 } else { 1 }, "{:?}", store.kind());
            if pg {
                assert!(store.is_alive("other").await.expect("alive"));
                drop(alive);
                // The server releases the lock when the connection closes.
                let mut gone = false;
                for _ in 0..50 {
                    if !store.is_alive("other").await.expect("alive") {
                        gone = true;
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                assert!(gone, "the liveness lock outlived its guard");
                assert_eq!(store.requeue_previews().await.expect("requeue"), 1);
            }
        }
    }
}
