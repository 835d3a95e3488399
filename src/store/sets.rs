//! The members of `[[target_sets]]` (migration 0016): which target each
//! set made from which directory, at which commit, and which are orphaned
//! (their directory gone) or destroyed. `record_members` writes a set's
//! new membership, with the new members' `targets` rows, in one
//! transaction; `record_notifications` puts what a set's owners are told
//! (directories refused) in the outbox. This module decides nothing about
//! membership: the tick's `sets` module compares directories and says what
//! changed.

use super::{Store, StoreError, now_ms};

/// One row of `set_members`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SetMember {
    pub target: String,
    /// The set's `name_prefix`.
    #[sqlx(rename = "target_set")]
    pub set: String,
    pub dir: String,
    /// The commit at which its directory was found.
    pub added_sha: String,
    pub added_at: i64,
    /// The commit at which its directory was found gone.
    pub orphaned_sha: Option<String>,
    pub orphaned_at: Option<i64>,
    pub destroyed_at: Option<i64>,
}

/// One set's membership change at one commit.
#[derive(Debug, Default)]
pub struct MembershipChange<'a> {
    /// (target, directory, backend kind) of each member found.
    pub added: Vec<(&'a str, &'a str, &'a str)>,
    /// Members whose directory is gone.
    pub orphaned: Vec<&'a str>,
    /// Orphaned members whose destroy succeeded.
    pub destroyed: Vec<&'a str>,
}

impl Store {
    /// Every member any set ever made, orphaned or not, by name.
    pub async fn set_members(&self) -> Result<Vec<SetMember>, StoreError> {
        let what = "reading the members of target sets";
        sqlx::query_as::<_, SetMember>(
            "SELECT target, target_set, dir, added_sha, added_at, orphaned_sha, orphaned_at, destroyed_at
             FROM set_members ORDER BY target",
        )
        .fetch_all(self.pool())
        .await
        .map_err(self.err(what))
    }

    /// Record `set`'s change at commit `sha`: members added (a member
    /// orphaned before is a member again; a target row is made for each),
    /// orphaned, destroyed.
    pub async fn record_members(
        &self,
        set: &str,
        sha: &str,
        change: &MembershipChange<'_>,
    ) -> Result<(), StoreError> {
        let what = "recording the members of a target set";
        let now = now_ms();
        let mut tx = self.begin_write(what).await?;
        for (target, dir, backend) in &change.added {
            sqlx::query(
                "INSERT INTO set_members (target, target_set, dir, added_sha, added_at)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (target) DO UPDATE SET target_set = $2, dir = $3, added_sha = $4,
                     added_at = $5, orphaned_sha = NULL, orphaned_at = NULL, destroyed_at = NULL",
            )
            .bind(target)
            .bind(set)
            .bind(dir)
            .bind(sha)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(self.err(what))?;
            super::targets::upsert(&mut tx, target, backend, now)
                .await
                .map_err(self.err(what))?;
        }
        for target in &change.orphaned {
            sqlx::query(
                "UPDATE set_members SET orphaned_sha = $2, orphaned_at = $3
                 WHERE target = $1 AND orphaned_at IS NULL",
            )
            .bind(target)
            .bind(sha)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(self.err(what))?;
        }
        for target in &change.destroyed {
            sqlx::query("UPDATE set_members SET destroyed_at = $2 WHERE target = $1")
                .bind(target)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(self.err(what))?;
        }
        tx.commit().await.map_err(self.err(what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn members_are_added_orphaned_destroyed_and_added_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        for store in crate::store::testing::stores(dir.path()).await {
            let add = MembershipChange {
                added: vec![
                    ("s-web", "stacks/web", "compose"),
                    ("s-db", "stacks/db", "compose"),
                ],
                ..Default::default()
            };
            store.record_members("s-", "aaa", &add).await.expect("add");
            let gone = MembershipChange {
                orphaned: vec!["s-web"],
                destroyed: vec!["s-web"],
                ..Default::default()
            };
            store
                .record_members("s-", "bbb", &gone)
                .await
                .expect("orphan");
            let rows = store.set_members().await.expect("rows");
            assert_eq!(rows.len(), 2);
            assert_eq!(rows[0].target, "s-db");
            assert_eq!(rows[0].orphaned_at, None);
            assert_eq!(rows[1].orphaned_sha.as_deref(), Some("bbb"));
            assert!(rows[1].destroyed_at.is_some());
            // Its target row was made with it.
            assert!(store.target_state("s-web").await.expect("state").is_some());
            let back = MembershipChange {
                added: vec![("s-web", "stacks/web", "compose")],
                ..Default::default()
            };
            store
                .record_members("s-", "ccc", &back)
                .await
                .expect("again");
            let rows = store.set_members().await.expect("rows");
            assert_eq!(rows[1].added_sha, "ccc");
            assert_eq!((rows[1].orphaned_at, rows[1].destroyed_at), (None, None));
        }
    }
}
