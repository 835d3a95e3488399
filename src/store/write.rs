//! The one connection this process writes through, and its transactions.
//!
//! Write transactions take turns on a connection of their own, held here
//! rather than in a pool: a pool tests a connection with a round trip to
//! its database as it hands it out and again as it takes it back, and
//! every write waits on the write before it, so those round trips were on
//! the path of every webhook delivery. A transaction begins with the lock
//! every writer takes (SQLite's `BEGIN IMMEDIATE`; on PostgreSQL, `BEGIN`
//! and the advisory write lock in one round trip) and is committed; one
//! dropped uncommitted, whose commit failed, or whose caller went away
//! half-way is rolled back before anything else runs on the connection. A
//! connection that cannot begin or roll back is closed (closing it rolls
//! back whatever it held) and the next write opens a new one. This module
//! runs no statement beyond those, and the one-statement transactions
//! (`Writer::autocommit`) it is handed.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};

use super::db::Conn;
use crate::model::BoxFuture;

/// Opens a new write connection, set up like the pool's.
pub(super) type Open = Arc<dyn Fn() -> BoxFuture<'static, Result<Conn, sqlx::Error>> + Send + Sync>;

/// The write connection and the turn to use it. Cheap to clone.
#[derive(Clone)]
pub(super) struct Writer {
    /// None until the first write, and after a connection was closed.
    slot: Arc<Mutex<Option<Conn>>>,
    /// A transaction was dropped without a commit: roll it back before
    /// anything else runs on the connection.
    unfinished: Arc<AtomicBool>,
    open: Open,
    /// What begins a write transaction.
    begin: Arc<str>,
    /// What begins one whose commit need not be synced to disk
    /// (`Writer::begin_unsynced`), where the connection can say so and
    /// `begin` says again that commits are synced; else `begin`.
    unsynced: Arc<str>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("begin", &self.begin)
            .finish()
    }
}

/// A write transaction, holding this process's turn to write: use it as a
/// connection, then [`WriteTx::commit`]. Dropped uncommitted, it is rolled
/// back before the next write begins (at once, by a task, when dropped
/// inside the runtime).
pub struct WriteTx {
    conn: OwnedMappedMutexGuard<Option<Conn>, Conn>,
    writer: Writer,
    committed: bool,
}

impl Writer {
    pub(super) fn new(open: Open, begin: String) -> Writer {
        Writer {
            slot: Default::default(),
            unfinished: Default::default(),
            open,
            unsynced: begin.clone().into(),
            begin: begin.into(),
        }
    }

    /// As this writer, with `unsynced` to begin a transaction whose commit
    /// need not be synced. Its `begin` must set commits synced again, so
    /// that no other transaction runs unsynced after it.
    pub(super) fn with_unsynced(self, unsynced: &str) -> Writer {
        Writer {
            unsynced: unsynced.into(),
            ..self
        }
    }

    /// As [`Writer::new`], its first connection `conn`, already open (the
    /// one the store was migrated on: one connection fewer to open, and
    /// its schema read once).
    pub(super) fn seeded(open: Open, begin: String, conn: Conn) -> Writer {
        Writer {
            slot: Arc::new(Mutex::new(Some(conn))),
            ..Writer::new(open, begin)
        }
    }

    /// Wait for this process's turn, then close the connection (a
    /// transaction left unfinished on it is rolled back by the close).
    /// The next write, if any, opens another.
    pub(super) async fn close(&self) -> Result<(), sqlx::Error> {
        let conn = self.slot.lock().await.take();
        self.unfinished.store(false, Ordering::SeqCst);
        match conn {
            Some(conn) => conn.close().await,
            None => Ok(()),
        }
    }

    /// Wait for this process's turn, then begin a write transaction. A
    /// connection found broken as the transaction begins (the database
    /// server restarted since the last write) is replaced, once.
    pub(super) async fn begin(&self) -> Result<WriteTx, sqlx::Error> {
        self.begin_as(self.begin.clone()).await
    }

    /// As [`Writer::begin`], for a transaction a power cut may lose
    /// without harm, because a synced commit follows before anything
    /// depends on it (SQLite's log is synced whole: that commit's sync
    /// takes this one's writes to disk with it). Its commit is not synced
    /// where the store can say so (a command's SQLite store); elsewhere it
    /// is an ordinary transaction.
    pub(super) async fn begin_unsynced(&self) -> Result<WriteTx, sqlx::Error> {
        self.begin_as(self.unsynced.clone()).await
    }

    /// Whether [`Writer::begin_unsynced`] begins a transaction whose
    /// commit is not synced (else every commit is).
    pub(super) fn can_skip_syncs(&self) -> bool {
        self.unsynced != self.begin
    }

    async fn begin_as(&self, begin: Arc<str>) -> Result<WriteTx, sqlx::Error> {
        let mut slot = self.slot.clone().lock_owned().await;
        self.settle(&mut slot).await;
        let mut fresh = false;
        loop {
            let conn = match slot.as_mut() {
                Some(conn) => conn,
                None => {
                    fresh = true;
                    slot.insert((self.open)().await?)
                }
            };
            // Armed until the transaction is handed over: a caller that
            // goes away while it begins leaves it to be rolled back.
            let abandoned = Abandoned(Some(self));
            let begun = sqlx::raw_sql(sqlx::AssertSqlSafe(begin.clone()))
                .execute(&mut *conn)
                .await;
            abandoned.disarm();
            match begun {
                Ok(_) => break,
                Err(e) => {
                    // Whatever state it is in, it is not used again.
                    *slot = None;
                    if fresh || !connection_lost(&e) {
                        return Err(e);
                    }
                }
            }
        }
        let conn = OwnedMutexGuard::try_map(slot, Option::as_mut)
            .map_err(|_| sqlx::Error::WorkerCrashed)?;
        Ok(WriteTx {
            conn,
            writer: self.clone(),
            committed: false,
        })
    }

    /// Run `f` on the write connection in this process's turn, outside any
    /// transaction: one statement that is a transaction of its own and
    /// takes the write lock itself (PostgreSQL's locked batches,
    /// `store::group`). A connection lost on the way is closed; the next
    /// write opens another.
    pub(super) async fn autocommit<T>(
        &self,
        f: impl for<'c> FnOnce(&'c mut Conn) -> BoxFuture<'c, Result<T, sqlx::Error>>,
    ) -> Result<T, sqlx::Error> {
        let mut slot = self.slot.clone().lock_owned().await;
        self.settle(&mut slot).await;
        let conn = match slot.as_mut() {
            Some(conn) => conn,
            None => slot.insert((self.open)().await?),
        };
        let r = f(conn).await;
        if let Err(e) = &r
            && connection_lost(e)
        {
            *slot = None;
        }
        r
    }

    /// Wait for this process's turn to write, beginning nothing here: for
    /// a transaction made on another connection (SQLite's `direct`), which
    /// must not overlap one of this connection's. The turn is held until
    /// the guard is dropped.
    pub(super) async fn turn(&self) -> OwnedMutexGuard<Option<Conn>> {
        let mut slot = self.slot.clone().lock_owned().await;
        self.settle(&mut slot).await;
        slot
    }

    /// A transaction was left open: roll it back as soon as the turn is
    /// free (by a task), or, outside the runtime (the process is ending),
    /// before the next write if there is one.
    fn settle_soon(&self) {
        self.unfinished.store(true, Ordering::SeqCst);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let writer = self.clone();
            rt.spawn(async move {
                let mut slot = writer.slot.clone().lock_owned().await;
                writer.settle(&mut slot).await;
            });
        }
    }

    /// Roll back the transaction a dropped [`WriteTx`] left open, if any;
    /// a connection that cannot is closed.
    async fn settle(&self, slot: &mut Option<Conn>) {
        if !self.unfinished.swap(false, Ordering::SeqCst) {
            return;
        }
        if let Some(conn) = slot.as_mut()
            && sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.is_err()
        {
            *slot = None;
        }
    }
}

impl WriteTx {
    /// Commit. A commit that fails is rolled back like a dropped
    /// transaction (or its connection closed), and the error returned.
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("COMMIT").execute(&mut *self.conn).await?;
        self.committed = true;
        Ok(())
    }
}

impl Deref for WriteTx {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut Conn {
        &mut self.conn
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // The turn is given up as this returns; the next to take it (a
        // writer, or the task) rolls back first.
        self.writer.settle_soon();
    }
}

/// A `BEGIN` on its way: if the caller goes away before its answer, the
/// transaction it may have opened is rolled back.
struct Abandoned<'w>(Option<&'w Writer>);

impl Abandoned<'_> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if let Some(writer) = self.0 {
            writer.settle_soon();
        }
    }
}

/// The connection is gone rather than the statement refused: the socket
/// closed, or the server ended the session (SQLSTATE class 08, connection
/// exception; 57P, an operator's shutdown or restart).
pub(super) fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::store::{Store, testing};

    async fn insert_delivery(tx: &mut crate::store::WriteTx, id: &str) {
        sqlx::query(
            "INSERT INTO deliveries (receiver, delivery_id, received_at, outcome)
             VALUES ('r', $1, 0, 'ok')",
        )
        .bind(id)
        .execute(&mut **tx)
        .await
        .expect("insert");
    }

    /// Two stores on one SQLite file, as two processes have, and two on one
    /// PostgreSQL database, as two instances have.
    async fn two_of_each(dir: &std::path::Path) -> [(Store, Store); 2] {
        let path = dir.join("driftless.db");
        let url = testing::database().await;
        [
            (
                Store::open(&path).await.expect("sqlite"),
                Store::open(&path).await.expect("sqlite, again"),
            ),
            (
                Store::open_postgres(&url).await.expect("postgres"),
                Store::open_postgres(&url).await.expect("postgres, again"),
            ),
        ]
    }

    async fn deliveries(store: &Store) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM deliveries")
            .fetch_one(store.pool())
            .await
            .expect("count")
    }

    /// What counts as a lost connection (worth one more try on a new
    /// one) and what is a refusal to report as it is.
    #[test]
    fn only_a_broken_connection_counts_as_lost() {
        use super::connection_lost;
        assert!(connection_lost(&sqlx::Error::Io(std::io::Error::other(
            "reset"
        ))));
        assert!(connection_lost(&sqlx::Error::Protocol("eof".into())));
        assert!(connection_lost(&sqlx::Error::WorkerCrashed));
        assert!(!connection_lost(&sqlx::Error::RowNotFound));
        assert!(!connection_lost(&sqlx::Error::PoolTimedOut));
    }

    /// A transaction that began and was committed leaves nothing to roll
    /// back: the next write reuses the connection as it is.
    #[tokio::test]
    async fn a_committed_transaction_leaves_nothing_to_roll_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("driftless.db"))
            .await
            .expect("sqlite");
        for _ in 0..2 {
            let tx = store.begin_write("test").await.expect("begin");
            tx.commit().await.expect("commit");
            assert!(
                !store
                    .writer
                    .unfinished
                    .load(std::sync::atomic::Ordering::SeqCst),
                "a committed transaction was marked to be rolled back"
            );
        }
    }

    /// A write transaction dropped without a commit (an error returned
    /// half-way) is rolled back at once: another process, or another
    /// instance on the same PostgreSQL database, writes straight after,
    /// without waiting for this one's next write, and sees nothing of it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transaction_dropped_uncommitted_is_rolled_back_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pairs = two_of_each(dir.path()).await;
        for (one, other) in pairs {
            let mut tx = one.begin_write("test").await.expect("begin");
            insert_delivery(&mut tx, "dropped").await;
            drop(tx);
            // SQLite's busy timeout, or the advisory lock, would hold the
            // other writer far longer than this if the lock were kept.
            let tx = tokio::time::timeout(Duration::from_secs(3), other.begin_write("test"))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{}: the dropped transaction kept the lock",
                        one.path().display()
                    )
                })
                .expect("begin");
            tx.commit().await.expect("commit");
            assert_eq!(deliveries(&other).await, 0, "{}", one.path().display());
            // And the first one writes on.
            let tx = one.begin_write("test").await.expect("begin again");
            tx.commit().await.expect("commit");
        }
    }

    /// A caller that goes away while its transaction begins (a client
    /// hung up) leaves nothing open: the next writer, here or in another
    /// process, writes at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transaction_whose_caller_went_away_as_it_began_is_rolled_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pairs = two_of_each(dir.path()).await;
        for (one, other) in pairs {
            let shown = one.path().display().to_string();
            // Several rounds: a poll that does not get as far as sending
            // BEGIN (a busy runtime) abandons nothing, and one round alone
            // once let a broken rollback pass (cargo-mutants).
            for round in 0..5 {
                // The connection is open: the next begin goes straight to BEGIN.
                let tx = one.begin_write("test").await.expect("begin");
                tx.commit().await.expect("commit");
                let mut begun = Box::pin(one.begin_write("test"));
                // Polled once (BEGIN sent, its answer not yet read), then dropped.
                tokio::select! {
                    biased;
                    _ = &mut begun => {}
                    _ = std::future::ready(()) => {}
                }
                drop(begun);
                let tx = tokio::time::timeout(Duration::from_secs(3), other.begin_write("test"))
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{shown}, round {round}: the abandoned BEGIN kept the lock")
                    })
                    .expect("begin");
                tx.commit().await.expect("commit");
                let mut tx = one
                    .begin_write("test")
                    .await
                    .unwrap_or_else(|e| panic!("{shown}, round {round}: {e}"));
                insert_delivery(&mut tx, &format!("after {round}")).await;
                tx.commit().await.expect("commit");
            }
            assert_eq!(deliveries(&one).await, 5, "{shown}");
        }
    }

    /// The database server ended the write connection's session between
    /// two writes (a restart, an administrator): the next write opens a
    /// new connection and succeeds rather than failing once.
    #[tokio::test]
    async fn a_write_connection_the_server_closed_is_replaced() {
        let url = testing::database().await;
        let store = Store::open_postgres(&url).await.expect("postgres");
        let tx = store.begin_write("test").await.expect("begin");
        tx.commit().await.expect("commit");
        let name = url
            .split('?')
            .next()
            .and_then(|s| s.rsplit('/').next())
            .expect("a database name");
        let ended: i64 = {
            use sqlx::Connection;
            let admin_url = url.replace(&format!("/{name}?"), "/postgres?");
            let mut admin = sqlx::AnyConnection::connect(&admin_url)
                .await
                .expect("connect");
            // OFFSET 0: the sessions are chosen before any is ended.
            sqlx::query_scalar(
                "SELECT count(*) FROM (SELECT pid FROM pg_stat_activity WHERE datname = $1 OFFSET 0) s
                 WHERE pg_terminate_backend(s.pid)",
            )
            .bind(name)
            .fetch_one(&mut admin)
            .await
            .expect("terminate")
        };
        assert!(ended >= 1, "no session of {name} to end");
        let mut tx = store
            .begin_write("test")
            .await
            .expect("a write after the session ended");
        insert_delivery(&mut tx, "after").await;
        tx.commit().await.expect("commit");
        assert_eq!(deliveries(&store).await, 1);
    }
}
