//! The outboxes: rows something outside must be told of, each claimed
//! before it is sent, then marked sent, retried at a later time, deferred
//! past a rate limit (its attempts untouched) or given up. Three kinds
//! share this one protocol ([`Outbox`]): notifications (this module's
//! table, `notifications`), commit statuses (`store::statuses`' rows) and
//! pull-request comments (`store::previews`' rows).
//!
//! A forge outbox row has a `version` (its newest content) and the
//! `sent_version` the forge has; a newer version recorded while an older
//! one is being sent stays due. A notification is sent once: `pending`,
//! then `sent` or `given_up`. What to send and when to give up is
//! `notify::outbox`'s to decide, not this module's.

use serde::Serialize;
use sqlx::FromRow;

use super::{NewNotification, Store, StoreError, now_ms};

/// Which outbox a row is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outbox {
    /// `forge_statuses` (`store::statuses`).
    Status,
    /// `pull_requests`' comment (`store::previews`).
    Comment,
    /// `notifications`.
    Notification,
}

impl Outbox {
    fn table(self) -> &'static str {
        match self {
            Outbox::Status => "forge_statuses",
            Outbox::Comment => "pull_requests",
            Outbox::Notification => "notifications",
        }
    }
}

/// A forge outbox: versioned rows (commit statuses, pull-request comments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ForgeOutbox {
    Status,
    Comment,
}

impl ForgeOutbox {
    fn table(self) -> &'static str {
        match self {
            ForgeOutbox::Status => Outbox::Status.table(),
            ForgeOutbox::Comment => Outbox::Comment.table(),
        }
    }
}

/// A forge outbox row's id (for ordering what was claimed).
pub(super) trait HasId {
    fn id(&self) -> i64;
}

/// A notification's row.
#[derive(Debug, Clone, FromRow, Serialize)]
pub struct Notification {
    pub id: i64,
    pub uid: String,
    pub notifier: String,
    pub target: String,
    pub run_id: Option<i64>,
    pub event: String,
    #[serde(skip)]
    pub document: String,
    pub state: String,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub sent_at: Option<i64>,
}

const NOTIFICATION_COLUMNS: &str = "id, uid, notifier, target, run_id, event, document, state, \
     attempts, next_attempt_at, last_error, created_at, sent_at";

/// Sent or given-up notifications created before `$1`, at most `$2` of
/// them (`store::runs`' pruning runs it in batches).
pub(super) const PRUNE_NOTIFICATIONS: &str = "DELETE FROM notifications WHERE id IN (
     SELECT id FROM notifications WHERE state IN ('sent', 'given_up')
       AND created_at < $1 LIMIT $2)";

/// Put `outbox` in the notifications outbox, about `target` (a target,
/// or a set) and the run `run_id` if any, in the caller's transaction.
pub(super) async fn queue_notifications(
    tx: &mut super::db::Conn,
    target: &str,
    run_id: Option<i64>,
    outbox: &[NewNotification],
    now: i64,
) -> Result<(), sqlx::Error> {
    for o in outbox {
        sqlx::query(
            "INSERT INTO notifications (uid, notifier, target, run_id, event, document,
                                        state, next_attempt_at, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $7)",
        )
        .bind(&o.uid)
        .bind(&o.notifier)
        .bind(target)
        .bind(run_id)
        .bind(&o.event)
        .bind(&o.document)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

impl Store {
    /// Pending (and, with `include_given_up`, given-up) notifications,
    /// oldest first.
    pub async fn notifications(
        &self,
        include_given_up: bool,
    ) -> Result<Vec<Notification>, StoreError> {
        sqlx::query_as::<_, Notification>(sqlx::AssertSqlSafe(format!(
            "SELECT {NOTIFICATION_COLUMNS} FROM notifications
             WHERE state = 'pending' OR ($1 AND state = 'given_up')
             ORDER BY id"
        )))
        .bind(include_given_up)
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading the notification outbox"))
    }

    /// Every notification about `target`, oldest first (for tests and
    /// audits).
    pub async fn notifications_of(&self, target: &str) -> Result<Vec<Notification>, StoreError> {
        sqlx::query_as::<_, Notification>(sqlx::AssertSqlSafe(format!(
            "SELECT {NOTIFICATION_COLUMNS} FROM notifications WHERE target = $1 ORDER BY id"
        )))
        .bind(target)
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading the notification outbox"))
    }

    /// Put notifications about `about` (a set, not a run) in the outbox.
    pub async fn record_notifications(
        &self,
        about: &str,
        outbox: &[NewNotification],
    ) -> Result<(), StoreError> {
        let what = "recording notifications";
        let mut tx = self.begin_write(what).await?;
        queue_notifications(&mut tx, about, None, outbox, now_ms())
            .await
            .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))
    }

    /// Up to 100 due notifications, oldest first: each id with the
    /// `next_attempt_at` read, which [`Store::claim_notification`] takes.
    pub async fn due_notifications(&self) -> Result<Vec<(i64, i64)>, StoreError> {
        sqlx::query_as(
            "SELECT id, next_attempt_at FROM notifications
             WHERE state = 'pending' AND next_attempt_at <= $1 ORDER BY id LIMIT 100",
        )
        .bind(now_ms())
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading the notification outbox"))
    }

    /// Claim notification `id`, left alone by other senders for
    /// `claim_ms`: only one sender moves its `next_attempt_at` from `seen`
    /// (what it read). Committed before it returns: a claim whose commit
    /// failed must not be sent as if it held. `None`: another sender has it.
    pub async fn claim_notification(
        &self,
        (id, seen): (i64, i64),
        claim_ms: i64,
    ) -> Result<Option<Notification>, StoreError> {
        let what = "claiming a notification";
        let mut tx = self.begin_write(what).await?;
        let row = sqlx::query_as::<_, Notification>(sqlx::AssertSqlSafe(format!(
            "UPDATE notifications SET next_attempt_at = $3
             WHERE id = $1 AND state = 'pending' AND next_attempt_at = $2
             RETURNING {NOTIFICATION_COLUMNS}"
        )))
        .bind(id)
        .bind(seen)
        .bind(now_ms() + claim_ms)
        .fetch_optional(&mut *tx)
        .await
        .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))?;
        Ok(row)
    }

    /// Notification `id` was sent.
    pub async fn notification_sent(&self, id: i64) -> Result<(), StoreError> {
        let q = sqlx::query(
            "UPDATE notifications SET state = 'sent', sent_at = $2, attempts = attempts + 1,
                    last_error = NULL WHERE id = $1",
        )
        .bind(id)
        .bind(now_ms());
        self.write_one("recording a sent notification", q)
            .await
            .map(drop)
    }

    /// Sending notification `id` failed for the `attempts`-th time: try
    /// again at `next`, or give it up (`None`).
    pub async fn notification_failed(
        &self,
        id: i64,
        attempts: i64,
        error: &str,
        next: Option<i64>,
    ) -> Result<(), StoreError> {
        let q = sqlx::query(
            "UPDATE notifications SET attempts = $2, last_error = $3,
                    next_attempt_at = COALESCE($4, next_attempt_at),
                    state = CASE WHEN $4 IS NULL THEN 'given_up' ELSE state END
             WHERE id = $1",
        )
        .bind(id)
        .bind(attempts)
        .bind(error)
        .bind(next);
        self.write_one("recording a failed notification", q)
            .await
            .map(drop)
    }

    /// A forge outbox's claim: up to `limit` rows whose newest version the
    /// forge does not have and that are due, each left alone for
    /// `claim_ms`, oldest first.
    pub(super) async fn claim_due<R>(
        &self,
        outbox: ForgeOutbox,
        columns: &'static str,
        limit: u32,
        claim_ms: i64,
        what: &'static str,
    ) -> Result<Vec<R>, StoreError>
    where
        R: for<'r> FromRow<'r, crate::store::db::Row> + Send + Unpin + HasId,
    {
        let table = outbox.table();
        let now = now_ms();
        const DUE: &str = "sent_version < version AND given_up = 0 AND next_attempt_at <= $1";
        // Mostly nothing is due (each sender looks every few seconds, and a
        // one-shot command after its run): one read says so, without the
        // turn to write, a transaction and its commit. A row that becomes
        // due just after is claimed at the next look.
        let any: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM {table} WHERE {DUE} LIMIT 1"
        )))
        .bind(now)
        .fetch_optional(self.pool())
        .await
        .map_err(self.err(what))?;
        if any.is_none() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin_write(what).await?;
        let q = format!(
            "UPDATE {table} SET next_attempt_at = $2
             WHERE id IN (SELECT id FROM {table} WHERE {DUE} ORDER BY id LIMIT {limit})
             RETURNING {columns}"
        );
        let mut rows = sqlx::query_as::<_, R>(sqlx::AssertSqlSafe(q))
            .bind(now)
            .bind(now + claim_ms)
            .fetch_all(&mut *tx)
            .await
            .map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))?;
        rows.sort_by_key(|r| r.id());
        Ok(rows)
    }

    /// A forge outbox's failure: sending row `id` at `version` failed; try
    /// again at `next`, or give up (`None`). Only if no newer version came
    /// meanwhile (that one starts its own attempts).
    pub(super) async fn failed_at(
        &self,
        outbox: ForgeOutbox,
        (id, version): (i64, i64),
        error: &str,
        next: Option<i64>,
        what: &'static str,
    ) -> Result<(), StoreError> {
        let table = outbox.table();
        let q = format!(
            "UPDATE {table} SET attempts = attempts + 1, last_error = $3,
                    next_attempt_at = COALESCE($4, next_attempt_at),
                    given_up = CASE WHEN $4 IS NULL THEN 1 ELSE 0 END, updated_at = $5
             WHERE id = $1 AND version = $2"
        );
        self.write_one(
            what,
            sqlx::query(sqlx::AssertSqlSafe(q))
                .bind(id)
                .bind(version)
                .bind(error)
                .bind(next)
                .bind(now_ms()),
        )
        .await
        .map(|_| ())
    }

    /// A forge outbox's rows the forge does not have in their newest
    /// version (and, with `include_given_up`, those given up), oldest first.
    pub(super) async fn unsent_in<R>(
        &self,
        outbox: ForgeOutbox,
        columns: &'static str,
        include_given_up: bool,
        what: &'static str,
    ) -> Result<Vec<R>, StoreError>
    where
        R: for<'r> FromRow<'r, crate::store::db::Row> + Send + Unpin,
    {
        let table = outbox.table();
        let q = format!(
            "SELECT {columns} FROM {table}
             WHERE sent_version < version AND (given_up = 0 OR $1) ORDER BY id"
        );
        sqlx::query_as::<_, R>(sqlx::AssertSqlSafe(q))
            .bind(include_given_up)
            .fetch_all(self.pool())
            .await
            .map_err(self.err(what))
    }

    /// Move row `id` of `outbox` to `at`, its attempts untouched: a rate
    /// limit is not a failed attempt.
    pub async fn defer(
        &self,
        outbox: Outbox,
        id: i64,
        at: i64,
        why: &str,
    ) -> Result<(), StoreError> {
        let t = outbox.table();
        let extra = if outbox == Outbox::Notification {
            ""
        } else {
            ", updated_at = $4"
        };
        let q =
            format!("UPDATE {t} SET next_attempt_at = $2, last_error = $3{extra} WHERE id = $1");
        let mut q = sqlx::query(sqlx::AssertSqlSafe(q))
            .bind(id)
            .bind(at)
            .bind(why);
        if outbox != Outbox::Notification {
            q = q.bind(now_ms());
        }
        self.write_one("deferring a send past a rate limit", q)
            .await
            .map(drop)
    }
}
