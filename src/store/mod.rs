//! State in SQLite: the pool, embedded migrations, and the run log.
//!
//! WAL, `synchronous=FULL` (a job is on disk before a webhook gets its 2xx),
//! foreign keys on, a busy timeout so the daemon and the one-shot CLI can
//! share the file. Every error names the database file. Queries are checked
//! at run time (`sqlx::query`), not at compile time. This module stores what
//! it is told; it decides nothing about when to tick or what a result means.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sqlx::FromRow;
use sqlx::any::AnyPoolOptions;

mod changes;
pub mod db;
pub mod deployments;
pub mod direct;
mod group;
pub use group::{Batch, Locked, NOT_WRITTEN, Tx as BatchTx};
pub mod inline;
pub mod jobs;
pub mod limits;
pub mod outbox;
pub mod outputs;
pub mod previews;
pub mod rollouts;
pub mod run_output;
pub mod runs;
pub mod sets;
mod sqlite;
use sqlite::{COMMAND_LOG_LIMIT, Identity};
pub mod statuses;
pub mod targets;
#[doc(hidden)]
pub mod testing;
mod write;
pub(crate) use targets::candidates_on;
pub use targets::{Candidate, TargetState};
pub use write::WriteTx;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static PG_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// The key of the PostgreSQL advisory lock every write transaction takes
/// (`begin_write`): writes take turns across every instance sharing the
/// database, as SQLite's `BEGIN IMMEDIATE` makes them on one host.
const PG_WRITE_LOCK: i64 = 0x6472_6966_746c_0001;

/// The first key of the two-key advisory locks each instance holds on its
/// owner name for as long as it lives (`Store::hold_liveness`).
const PG_LIVENESS: i32 = 0x6472_6966;

/// The second key of `owner`'s liveness lock.
fn liveness_key(owner: &str) -> i32 {
    use sha2::Digest;
    let d = sha2::Sha256::digest(owner.as_bytes());
    i32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

/// Set up a new PostgreSQL session: an acknowledged request is committed
/// on disk, so never with `synchronous_commit = off`, whatever the
/// server's default says.
async fn pg_session(conn: &mut sqlx::AnyConnection) -> Result<(), sqlx::Error> {
    let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&mut *conn)
        .await?;
    if sync == "off" {
        sqlx::raw_sql("SET synchronous_commit = on")
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// An instance's liveness lock on PostgreSQL (`Store::hold_liveness`):
/// released when dropped, or when the process ends however it ends.
pub struct Liveness(#[allow(dead_code)] Option<db::Conn>);

/// What `[database]` gives to connect to PostgreSQL with.
#[derive(Clone, Default)]
pub struct PgOptions {
    /// `postgres://…`, as written.
    pub url: String,
    pub password: Option<String>,
    pub sslmode: Option<String>,
    pub ca_file: Option<PathBuf>,
}

/// Which database a [`Store`] is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
}

/// A state database error, naming the file and what was being done.
#[derive(Debug, thiserror::Error)]
#[error("state database {path}: {what} failed: {source}")]
pub struct StoreError {
    /// The database file, or a PostgreSQL URL without its password.
    pub path: PathBuf,
    pub what: &'static str,
    #[source]
    pub source: sqlx::Error,
}

/// The state database. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: db::Pool,
    /// A command's reads on SQLite (`inline::Reads`), which go through
    /// its connections instead of the pool; None in a daemon and on
    /// PostgreSQL.
    reads: Option<inline::Reads>,
    /// The one connection write transactions take turns on (`write`).
    /// Taking turns here rather than in SQLite's busy handler, whose
    /// back-off sleeps turn contention into latency spikes; other
    /// processes still meet the busy timeout.
    writer: write::Writer,
    kind: Kind,
    /// The file, or the PostgreSQL URL without its password.
    path: PathBuf,
    /// The file opened: a database deleted or replaced under a running
    /// process is caught before anything is written into a file nobody
    /// will read again. None on PostgreSQL.
    identity: Option<Identity>,
    /// Small writes that arrive together commit together (`group`).
    group: group::Group,
    /// How a helper process (a command's keeper) connects to the same
    /// PostgreSQL database: the URL with its password. None on SQLite.
    connect: Option<ConnectUrl>,
    /// SQLite's second write connection, on which the group's writer
    /// thread writes a batch in one blocking call (`direct`). None on
    /// PostgreSQL.
    direct: Option<direct::Direct>,
    /// Fires when a run begins, ends or keeps more output (`changes`).
    changes: changes::Changes,
}

/// A URL that may hold a password: never shown.
#[derive(Clone)]
pub struct ConnectUrl(String);

impl ConnectUrl {
    pub fn new(url: String) -> ConnectUrl {
        ConnectUrl(url)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ConnectUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectUrl(***)")
    }
}

impl StoreError {
    /// The disk is full (SQLITE_FULL) or failing to write (SQLITE_IOERR):
    /// worth trying again once space or the device comes back.
    pub fn is_disk_trouble(&self) -> bool {
        match &self.source {
            sqlx::Error::Database(d) => d.code().is_some_and(|c| {
                c.parse::<i64>()
                    .is_ok_and(|n| n & 0xff == 13 || n & 0xff == 10)
            }),
            sqlx::Error::Io(_) => true,
            _ => false,
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// RFC 3339 for a stored millisecond timestamp.
pub fn format_ms(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// What kind of operation a run was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Apply,
    Destroy,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "apply",
            Operation::Destroy => "destroy",
        }
    }
}

/// A run about to start: written before the backend is called.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    pub target: &'a str,
    pub job_id: Option<i64>,
    pub operation: Operation,
    pub trigger: &'a str,
    pub delivery_id: Option<&'a str>,
    pub requested_sha: Option<&'a str>,
    pub receiver: Option<&'a str>,
    /// The commit, when it is known before the run starts (a checkout
    /// already at the branch tip); else [`Store::set_run_sha`] records it.
    pub sha: Option<&'a str>,
}

/// One recorded run.
#[derive(Debug, Clone, FromRow, Serialize)]
pub struct Run {
    pub id: i64,
    pub target: String,
    pub job_id: Option<i64>,
    pub operation: String,
    pub trigger: String,
    pub delivery_id: Option<String>,
    pub requested_sha: Option<String>,
    pub sha: Option<String>,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub duration_ms: Option<i64>,
    pub result: Option<String>,
    pub message: Option<String>,
    pub output_tail: Option<String>,
    pub receiver: Option<String>,
    /// How many runs this row stands for: a streak of identical
    /// `no_change` runs is one row (`started_at` the first one's start,
    /// `finished_at` the newest one's end).
    pub repeats: i64,
}

/// A change to a target's recorded drift, written with its run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriftUpdate {
    /// A plan found this difference (a new one, or a different one).
    Set {
        hash: String,
        summary: String,
        since: i64,
    },
    /// A plan found none: the drift is over.
    Clear,
}

/// A notification to put in the outbox with a run's result.
#[derive(Debug, Clone)]
pub struct NewNotification {
    pub uid: String,
    pub notifier: String,
    pub event: String,
    /// The JSON event document.
    pub document: String,
}

/// What a run's result changes for notifications, written in the same
/// transaction as the result.
#[derive(Debug, Clone, Default)]
pub struct Notice {
    pub failing_since: Option<i64>,
    pub last_notified_at: Option<i64>,
    pub last_notified_message: Option<String>,
    pub outbox: Vec<NewNotification>,
    /// Deployments (any backend's) whose notification (waiting, overdue,
    /// superseded) is in `outbox`.
    pub plans_told: Vec<(i64, deployments::Untold)>,
    /// A plan this run applied: it leaves `applying` for this state, with
    /// this message, in the run's transaction.
    pub plan_done: Option<(i64, deployments::PlanState, String)>,
    /// The target's drift, when this run changed it.
    pub drift: Option<DriftUpdate>,
    /// A commit this run found unhealthy, with why: not applied again
    /// until a newer commit arrives or a person retries.
    pub quarantine: Option<(String, String)>,
    /// The commit status this run leaves on its forge.
    pub statuses: Vec<statuses::NewStatus>,
}

impl Notice {
    /// Whether all it writes is the target's own row (what the owners
    /// were last told): no notification, plan, drift, quarantine or
    /// commit status. Such a run's end may be written on SQLite's write
    /// thread (`store::runs`).
    pub fn only_columns(&self) -> bool {
        self.outbox.is_empty()
            && self.plans_told.is_empty()
            && self.plan_done.is_none()
            && self.drift.is_none()
            && self.quarantine.is_none()
            && self.statuses.is_empty()
    }
}

/// What a process opens the store for: the daemon's many tasks at once,
/// or one command (a one-shot `tick`, `status`), which reads and writes
/// one thing at a time and exits when done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    Serve,
    Command,
}

impl Store {
    /// Open (creating if needed) the database at `path` and migrate it,
    /// for the daemon (`Usage::Serve`).
    pub async fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_for(path, Usage::Serve).await
    }

    /// Connect to the PostgreSQL database at `url` (a `postgres://` URL,
    /// its password included if it needs one) and migrate it. Several
    /// instances may start at once: sqlx takes an advisory lock while it
    /// migrates, and the later ones find the migrations applied. Errors
    /// name the URL without its password.
    pub async fn open_postgres(url: &str) -> Result<Store, StoreError> {
        Self::open_postgres_shown(url, crate::redact::url_without_password(url)).await
    }

    /// As [`Store::open_postgres`], named `shown` in errors.
    async fn open_postgres_shown(url: &str, shown: String) -> Result<Store, StoreError> {
        let shown = PathBuf::from(shown);
        let err = |what, source| StoreError {
            path: shown.clone(),
            what,
            source,
        };
        sqlx::any::install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(8)
            .after_connect(|conn, _meta| Box::pin(pg_session(conn)))
            .before_acquire(|conn, _meta| {
                Box::pin(async move { Ok(!sqlx::Connection::is_in_transaction(conn)) })
            })
            .connect(url)
            .await
            .map_err(|e| err("connecting", e))?;
        PG_MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| err("migrating", e.into()))?;
        let connect = url.to_string();
        let open: write::Open = Arc::new(move || {
            let url = connect.clone();
            Box::pin(async move {
                let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&url).await?;
                pg_session(&mut conn).await?;
                // The write connection's own functions (`Batch::locked`).
                // Without them (no TEMP privilege) batches are written the
                // usual way: slower, not wrong.
                let functions = jobs::pg_functions(PG_WRITE_LOCK);
                if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(functions))
                    .execute(&mut conn)
                    .await
                {
                    tracing::warn!(error = %e,
                        "cannot make the write connection's temporary functions on PostgreSQL; \
                         webhook deliveries are written in four round trips a batch instead of one");
                }
                Ok(db::Conn::Sqlx(conn))
            })
        });
        let begin = format!("BEGIN; SELECT pg_advisory_xact_lock({PG_WRITE_LOCK})");
        Ok(Store {
            pool,
            reads: None,
            writer: write::Writer::new(open, begin),
            kind: Kind::Postgres,
            path: shown,
            identity: None,
            group: Default::default(),
            connect: Some(ConnectUrl(url.to_string())),
            direct: None,
            changes: Default::default(),
        })
    }

    /// Connect to PostgreSQL as `[database]` says: the password and TLS
    /// settings go into the connection, not into anything shown.
    pub async fn open_postgres_with(opts: &PgOptions) -> Result<Store, StoreError> {
        use sqlx::ConnectOptions;
        use sqlx::postgres::{PgConnectOptions, PgSslMode};
        let err = |what, source| StoreError {
            path: PathBuf::from(crate::redact::url_without_password(&opts.url)),
            what,
            source,
        };
        let mut pg =
            PgConnectOptions::from_str(&opts.url).map_err(|e| err("reading its url", e))?;
        if let Some(password) = &opts.password {
            pg = pg.password(password);
        }
        if let Some(mode) = &opts.sslmode {
            let mode = PgSslMode::from_str(mode).map_err(|e| err("reading its sslmode", e))?;
            pg = pg.ssl_mode(mode);
        }
        if let Some(ca) = &opts.ca_file {
            pg = pg.ssl_root_cert(ca);
        }
        // sqlx's `to_url_lossy` writes a certificate file (`sslrootcert`,
        // the client's `sslcert` and `sslkey`) as `file: <path>` — its
        // `CertificateInput`'s Display — which its own URL parser then
        // reads back as a file of that name ("No such file or directory"):
        // the URL given to the `Any` driver names the path itself.
        let mut url = pg.to_url_lossy();
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let v = match (k.as_ref(), v.strip_prefix("file: ")) {
                    ("sslrootcert" | "sslcert" | "sslkey", Some(path)) => path.to_string(),
                    _ => v.into_owned(),
                };
                (k.into_owned(), v)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
        // Named by the URL as written (no password), not the one built.
        Store::open_postgres_shown(url.as_str(), crate::redact::url_without_password(&opts.url))
            .await
    }

    /// Say, for as long as the returned guard lives, that the process
    /// owning `owner`'s claims is alive: on PostgreSQL a session advisory
    /// lock on a connection of the guard's own, which the server drops
    /// when the process dies (or that connection does — then its previews
    /// may be planned again elsewhere; previews never apply). Nothing on
    /// SQLite, where one daemon serves a state directory.
    pub async fn hold_liveness(&self, owner: &str) -> Result<Liveness, StoreError> {
        if self.kind == Kind::Sqlite {
            return Ok(Liveness(None));
        }
        let what = "holding this instance's liveness lock";
        let mut conn = self.pool.acquire().await.map_err(self.err(what))?.detach();
        sqlx::query("SELECT pg_advisory_lock($1, $2)")
            .bind(PG_LIVENESS)
            .bind(liveness_key(owner))
            .execute(&mut conn)
            .await
            .map_err(self.err(what))?;
        Ok(Liveness(Some(db::Conn::Sqlx(conn))))
    }

    /// Whether the process owning `owner`'s claims holds its liveness lock
    /// (PostgreSQL; always true on SQLite).
    pub async fn is_alive(&self, owner: &str) -> Result<bool, StoreError> {
        if self.kind == Kind::Sqlite {
            return Ok(true);
        }
        let what = "looking for an instance's liveness lock";
        let mut conn = self.pool.acquire().await.map_err(self.err(what))?;
        let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
            .bind(PG_LIVENESS)
            .bind(liveness_key(owner))
            .fetch_one(&mut *conn)
            .await
            .map_err(self.err(what))?;
        if free {
            sqlx::query("SELECT pg_advisory_unlock($1, $2)")
                .bind(PG_LIVENESS)
                .bind(liveness_key(owner))
                .execute(&mut *conn)
                .await
                .map_err(self.err(what))?;
        }
        Ok(!free)
    }

    /// How a helper process connects to this PostgreSQL database (None on
    /// SQLite).
    pub fn connect_url(&self) -> Option<&ConnectUrl> {
        self.connect.as_ref()
    }

    /// Which database this is.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Is the file at the database's path still the one this process has
    /// open? Deleted or replaced (a restore, an `rm`), every write would go
    /// into an unlinked file and be lost at the next start: refused, with
    /// an ERROR naming the path (once). The pool asks before handing out
    /// any connection.
    pub fn check_identity(&self) -> Result<(), StoreError> {
        let Some(identity) = &self.identity else {
            return Ok(());
        };
        identity.check().map_err(|e| StoreError {
            path: self.path.clone(),
            what: "checking it is still the file opened",
            source: sqlx::Error::Io(e),
        })
    }

    /// Begin a write transaction, after this process's earlier writers
    /// and any other process's: SQLite's `BEGIN IMMEDIATE`, or on
    /// PostgreSQL a transaction that first takes the advisory lock every
    /// writer takes (held until it commits or rolls back). Either way the
    /// reads a write transaction makes see no other writer's work until it
    /// ends.
    pub async fn begin_write(&self, what: &'static str) -> Result<WriteTx, StoreError> {
        self.check_identity()?;
        self.writer.begin().await.map_err(self.err(what))
    }

    /// As [`Store::begin_write`], for writes a power cut may lose without
    /// harm because a synced commit follows before anything depends on
    /// them (a one-shot tick's claim of its job: nothing has run yet, and
    /// its run's start is synced). A command's SQLite store does not sync
    /// its commit; elsewhere it is an ordinary write transaction.
    pub async fn begin_write_unsynced(&self, what: &'static str) -> Result<WriteTx, StoreError> {
        self.check_identity()?;
        self.writer.begin_unsynced().await.map_err(self.err(what))
    }

    /// Run one statement as a write transaction of its own, taking its
    /// turn with every other write. Never on the pool: there a write
    /// meets the write connection in SQLite's busy handler, whose back-off
    /// sleeps lost every race to a steady stream of deliveries (finishing
    /// a job took over a second under a flood).
    pub async fn write_one<'q, A>(
        &self,
        what: &'static str,
        q: sqlx::query::Query<'q, db::Db, A>,
    ) -> Result<sqlx::any::AnyQueryResult, StoreError>
    where
        A: sqlx::IntoArguments<db::Db> + 'q,
    {
        let mut tx = self.begin_write(what).await?;
        let r = q.execute(&mut *tx).await.map_err(self.err(what))?;
        tx.commit().await.map_err(self.err(what))?;
        Ok(r)
    }

    /// What reads go through: the pool, or a command's SQLite connection.
    pub fn pool(&self) -> db::Reader<'_> {
        match &self.reads {
            Some(reads) => db::Reader::Inline(reads),
            None => db::Reader::Pool(&self.pool),
        }
    }

    /// The pool of connections itself (PostgreSQL's session-level work,
    /// and tests that hold connections).
    pub fn connections(&self) -> &db::Pool {
        &self.pool
    }

    /// Close every connection, once a command is done with the store (no
    /// clone of it may be used after). On SQLite a command leaves the
    /// write-ahead log for the next process while it is under
    /// `COMMAND_LOG_LIMIT`, and otherwise folds it into the database and
    /// empties it first: the next process to open the database reads the
    /// whole log before its first statement (a process that just exits
    /// with its connections open leaves a log that grows to 4 MB), while
    /// folding it in costs two `fsync`s and a new log's first write a
    /// third. Nothing is lost either way: only committed writes are in the
    /// log. A failure to close or fold is no news (the next open
    /// recovers, a later close folds), said at DEBUG.
    pub async fn close(&self) {
        if self.reads.is_some() && self.log_size() > COMMAND_LOG_LIMIT {
            let folded = self
                .writer
                .autocommit(|c| {
                    Box::pin(async move {
                        sqlx::raw_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                            .execute(c)
                            .await
                            .map(drop)
                    })
                })
                .await;
            if let Err(error) = folded {
                tracing::debug!(%error, "folding the write-ahead log into the database");
            }
        }
        self.pool.close().await;
        if let Some(reads) = &self.reads
            && let Err(error) = reads.close()
        {
            tracing::debug!(%error, "closing the read connection");
        }
        if let Err(error) = self.writer.close().await {
            tracing::debug!(%error, "closing the write connection");
        }
        if let Some(direct) = &self.direct
            && let Err(error) = direct.close()
        {
            tracing::debug!(%error, "closing the direct write connection");
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn err(&self, what: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError + '_ {
        move |source| StoreError {
            path: self.path.clone(),
            what,
            source,
        }
    }

    /// A real write, to tell whether the database takes writes (/readyz).
    pub async fn probe_write(&self) -> Result<(), StoreError> {
        let q = sqlx::query(
            "INSERT INTO health (id, probed_at) VALUES (1, $1)
             ON CONFLICT (id) DO UPDATE SET probed_at = excluded.probed_at",
        )
        .bind(now_ms());
        self.write_one("writing a health probe", q).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::sqlite::migrated;
    use super::*;

    /// `PRAGMA synchronous` inside `tx`.
    async fn sync(tx: &mut WriteTx) -> i64 {
        sqlx::query_scalar::<_, i64>("PRAGMA synchronous")
            .fetch_one(&mut **tx)
            .await
            .expect("pragma")
    }

    /// A write begun unsynced commits without a sync on a command's
    /// SQLite store, and the next write is synced again; on a daemon's
    /// store it is an ordinary, synced write.
    #[tokio::test]
    async fn an_unsynced_write_leaves_the_next_one_synced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("driftless.db");
        for (usage, lax) in [(Usage::Command, 1), (Usage::Serve, 2)] {
            let store = Store::open_for(&path, usage).await.expect("open");
            let mut tx = store.begin_write_unsynced("test").await.expect("begin");
            assert_eq!(sync(&mut tx).await, lax, "{usage:?}: unsynced");
            tx.commit().await.expect("commit");
            let mut tx = store.begin_write("test").await.expect("begin");
            assert_eq!(sync(&mut tx).await, 2, "{usage:?}: the write after");
            tx.commit().await.expect("commit");
            // And after one dropped half-way.
            let tx = store.begin_write_unsynced("test").await.expect("begin");
            drop(tx);
            let mut tx = store.begin_write("test").await.expect("begin");
            assert_eq!(sync(&mut tx).await, 2, "{usage:?}: after a dropped one");
            tx.commit().await.expect("commit");
            store.close().await;
        }
    }

    /// A command's store (`open_inline`) skips sqlx's migrator only when
    /// the database holds exactly this binary's migrations: a new one is
    /// migrated, reads and writes go through, and one whose applied
    /// migration differs from the binary's is refused — by the migrator,
    /// as a daemon's open refuses it — rather than opened.
    #[tokio::test]
    async fn a_commands_store_leaves_any_doubt_about_migrations_to_the_migrator() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("driftless.db");
        let store = Store::open_for(&path, Usage::Command)
            .await
            .expect("a new database, migrated");
        store
            .write_one(
                "test",
                sqlx::query("INSERT INTO health (id, probed_at) VALUES (1, 7)"),
            )
            .await
            .expect("a write");
        let read: i64 = sqlx::query_scalar("SELECT probed_at FROM health WHERE id = 1")
            .fetch_one(store.pool())
            .await
            .expect("a read");
        assert_eq!(read, 7);
        store.close().await;
        let setup = "PRAGMA busy_timeout = 5000;";
        let conn = inline::Inline::open(&path, setup).expect("open");
        assert!(
            migrated(&conn).expect("check"),
            "a migrated database not recognised"
        );
        conn.run(
            "UPDATE _sqlx_migrations SET checksum = x'00' \
             WHERE version = (SELECT MAX(version) FROM _sqlx_migrations)",
            None,
            false,
        )
        .expect("tamper");
        assert!(
            !migrated(&conn).expect("check"),
            "a changed migration passed"
        );
        conn.close().expect("close");
        let refused = Store::open_for(&path, Usage::Command)
            .await
            .expect_err("a changed migration");
        assert_eq!(refused.what, "migrating", "{refused}");
        let daemon = Store::open(&path).await.expect_err("a changed migration");
        assert_eq!(daemon.what, refused.what);
    }

    /// Processes that open one new database at once (a daemon and a
    /// timer's tick, two ticks) all get it migrated, none fails on a table
    /// another made or on the switch to WAL another is making. Opens in one process take the lock as separate
    /// processes do (an OS lock is per open file).
    #[test]
    fn opens_at_once_of_a_new_database_all_migrate_it() {
        for _ in 0..3 {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("driftless.db");
            std::thread::scope(|scope| {
                // Daemons and commands (`tick` from a timer) alike.
                let opens: Vec<_> = [Usage::Serve, Usage::Command]
                    .into_iter()
                    .cycle()
                    .take(6)
                    .map(|usage| {
                        let path = &path;
                        scope.spawn(move || {
                            let rt = tokio::runtime::Builder::new_current_thread()
                                .enable_all()
                                .build()
                                .expect("runtime");
                            rt.block_on(Store::open_for(path, usage)).map(drop)
                        })
                    })
                    .collect();
                for open in opens {
                    if let Err(e) = open.join().expect("thread") {
                        panic!("{e}: {:?}", e.source);
                    }
                }
            });
        }
    }

    /// A database from before the one deployments table (migration 0010)
    /// keeps every deployment: Nomad's and the plans, their ids, events
    /// and decisions; Nomad's `completed` reads `applied`; and new ids go
    /// on after the old shared sequence, so "deployment N" never names two.
    #[tokio::test]
    async fn two_deployment_tables_become_one_and_lose_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("driftless.db");
        let old = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .foreign_keys(true);
        let pool = sqlx::SqlitePool::connect_with(old)
            .await
            .expect("old database");
        let before: Vec<_> = MIGRATOR
            .iter()
            .filter(|m| m.version < 10)
            .cloned()
            .collect();
        assert_eq!(before.len(), 9);
        sqlx::migrate::Migrator::with_migrations(before)
            .run(&pool)
            .await
            .expect("migrations 1-9");
        sqlx::raw_sql(
            "INSERT INTO nomad_deployments (id, target, cluster, namespace, job, file, commit_sha,
                 spec_hash, policy, state, job_modify_index, diff, diff_summary, created_at,
                 updated_at, notified_at)
             VALUES (1, 'jobs', 'c', 'default', 'web', 'web.nomad.hcl', 'c1', 's1', 'approval',
                 'completed', 7, '{\"TaskGroups\":[{\"Name\":\"old\",\"Type\":\"Deleted\"}]}',
                 'group old removed', 10, 20, 15);
             INSERT INTO nomad_events (deployment_id, target, actor, from_state, to_state, at)
             VALUES (1, 'jobs', 'driftless', NULL, 'pending_approval', 10),
                    (1, 'jobs', 'token:ops', 'pending_approval', 'applying', 12),
                    (1, 'jobs', 'driftless', 'applying', 'completed', 20);
             UPDATE sqlite_sequence SET seq = 5 WHERE name = 'nomad_deployments';
             INSERT INTO plans (id, target, backend, commit_sha, plan_hash, policy, summary, diff,
                 destructive, state, created_at, updated_at, backend_hash)
             VALUES (3, 'net', 'terraform', 'c2', 'h', 'approval', '1 to add', '+ a', 0,
                 'pending_approval', 30, 30, 'b');",
        )
        .execute(&pool)
        .await
        .expect("old rows");
        pool.close().await;

        let store = Store::open(&path).await.expect("migrated");
        let all = store.plans(None, 10).await.expect("list");
        let rows: Vec<_> = all
            .iter()
            .map(|p| {
                (
                    p.id,
                    p.backend.as_str(),
                    p.state,
                    p.destructive,
                    p.decided_by.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                (
                    3,
                    "terraform",
                    deployments::PlanState::PendingApproval,
                    false,
                    None
                ),
                (
                    1,
                    "nomad",
                    deployments::PlanState::Applied,
                    true,
                    Some("token:ops")
                ),
            ]
        );
        assert_eq!(all[1].plan_hash, "s1");
        // Nomad's columns are its unit's now (migration 0022): the job is
        // the unit, the rest its detail, found by the unit key.
        assert_eq!(
            (all[1].unit.as_deref(), all[1].subject().as_str()),
            (Some("web"), "nomad job default/web of jobs")
        );
        assert_eq!(
            (
                all[1].detail_str("file"),
                all[1]
                    .detail
                    .0
                    .get("job_modify_index")
                    .and_then(|v| v.as_i64()),
                all[1]
                    .detail_str("plan_diff")
                    .map(|d| d.contains("Deleted")),
            ),
            (Some("web.nomad.hcl"), Some(7), Some(true))
        );
        let unit = crate::ledger::Ledger::latest(&store, "nomad", "c\ndefault\nweb")
            .await
            .expect("by unit key")
            .expect("the job's deployment");
        assert_eq!((unit.id, unit.unit.as_str()), (1, "web"));
        assert_eq!(all[1].on_approval, Some(deployments::PlanState::Applying));
        let to: Vec<String> = store
            .deployment_events("jobs")
            .await
            .expect("events")
            .iter()
            .map(|e| e["to"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(to, ["pending_approval", "applying", "applied"]);
        // The plan is still the target's open one, and decidable.
        assert_eq!(
            store.open_plan("net").await.expect("open").map(|p| p.id),
            Some(3)
        );
        store
            .decide_plan(3, Some("h"), "token:ops", false)
            .await
            .expect("reject");
        let next = store
            .insert_plan(&deployments::NewPlan {
                target: "net",
                backend: "terraform",
                commit_sha: "c3",
                plan_hash: "h2",
                backend_hash: "b2",
                policy: "approval",
                summary: "1 to add",
                diff: "+ b",
                destructive: false,
                artifact: None,
                state: deployments::PlanState::PendingApproval,
                decided_by: None,
                message: "waits",
                made_from: None,
            })
            .await
            .expect("a new plan");
        assert_eq!(next.id, 6, "ids go on after the shared sequence");
    }

    /// kill -9 cannot tell FULL from NORMAL (the OS still has the data);
    /// a power cut can. Every connection the pool hands out, not just the
    /// first, must run with synchronous=FULL, in WAL, with foreign keys.
    /// `PRAGMA synchronous`, `journal_mode` and `foreign_keys` through `c`
    /// (a connection, or, by reference, a pool or a command's reads).
    macro_rules! durability {
        ($c:expr) => {{
            let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one($c)
                .await
                .expect("pragma");
            let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
                .fetch_one($c)
                .await
                .expect("pragma");
            let fk: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
                .fetch_one($c)
                .await
                .expect("pragma");
            (sync, journal, fk)
        }};
    }

    #[tokio::test]
    async fn every_pooled_connection_is_durable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("state/driftless.db"))
            .await
            .expect("open");
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(store.connections().acquire().await.expect("connection"));
        }
        for c in held.iter_mut() {
            assert_eq!(durability!(&mut **c), (2, "wal".into(), 1));
        }
        // And the connection every write transaction runs on.
        let mut write = store.begin_write("test").await.expect("a write");
        assert_eq!(durability!(&mut *write), (2, "wal".into(), 1));
        write.commit().await.expect("commit");
        // And a command's, read and write, which run in place (`inline`).
        let command = Store::open_for(&dir.path().join("state/driftless.db"), Usage::Command)
            .await
            .expect("open for a command");
        assert_eq!(durability!(command.pool()), (2, "wal".into(), 1));
        let mut write = command.begin_write("test").await.expect("a write");
        assert_eq!(durability!(&mut *write), (2, "wal".into(), 1));
        drop(write);
        // And the group's direct connection, where webhook deliveries and
        // their jobs are committed before their 2xx.
        let direct = store
            .direct
            .clone()
            .expect("SQLite has a direct connection");
        let (sync, journal, fk) = tokio::task::spawn_blocking(move || {
            direct.run(Box::new(|tx| {
                let one = |q: &str| -> Result<String, sqlx::Error> {
                    tx.query_row(q, [], |r| {
                        r.get::<_, i64>(0)
                            .map(|v| v.to_string())
                            .or_else(|_| r.get::<_, String>(0))
                    })
                    .map_err(direct::failure)
                };
                Ok((
                    one("PRAGMA synchronous")?,
                    one("PRAGMA journal_mode")?,
                    one("PRAGMA foreign_keys")?,
                ))
            }))
        })
        .await
        .expect("the direct connection's thread")
        .map_err(|e| format!("{e:?}"))
        .expect("a transaction on the direct connection");
        assert_eq!(
            (sync.as_str(), journal.as_str(), fk.as_str()),
            ("2", "wal", "1"),
            "the direct connection"
        );
    }

    /// Every place in the source that opens a database connection, by
    /// file, and how many times: a connection opened anywhere else (or
    /// once more here) may write without the pragmas above, so it must be
    /// looked at and added to the test above before this list.
    #[test]
    fn no_connection_is_opened_outside_the_known_places() {
        const OPENERS: [&str; 4] = [
            "Connection::open(",
            "::connect(",
            "connect_with(",
            "PoolOptions::new()",
        ];
        // (file, count): PostgreSQL's pool and write connection; SQLite's
        // pool and write connection (which the migrator uses too) and a
        // command's pool that never connects; the direct connection;
        // a command's SQLite connections (`inline`); the keeper's
        // PostgreSQL lease connection (`db::connect`: it only renews a
        // lease); the throwaway PostgreSQL clusters of the tests.
        let known: &[(&str, usize)] = &[
            ("src/store/mod.rs", 2),
            ("src/store/sqlite.rs", 3),
            ("src/store/direct.rs", 1),
            ("src/store/inline.rs", 1),
            ("src/store/db.rs", 1),
            ("src/store/testing.rs", 2),
        ];
        let mut found = Vec::new();
        let mut stack = vec![std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).expect("src").flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                // Only the code before a file's unit tests.
                let code = text.split("#[cfg(test)]").next().unwrap_or("");
                // A TCP connection (a health check's) is no database's.
                let code = code.replace("TcpStream::connect(", "");
                let n: usize = OPENERS.iter().map(|o| code.matches(o).count()).sum();
                if n > 0 {
                    let rel = p
                        .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                        .expect("under the crate")
                        .display()
                        .to_string();
                    found.push((rel, n));
                }
            }
        }
        found.sort();
        let mut known: Vec<(String, usize)> =
            known.iter().map(|(f, n)| (f.to_string(), *n)).collect();
        known.sort();
        assert_eq!(found, known);
    }

    /// On PostgreSQL too, a Nomad deployment recorded before the unit
    /// ledger (migration 0007) becomes its job's unit with nothing lost:
    /// its job columns are its detail, it is found by its unit key, and a
    /// job's pause is its unit's.
    #[tokio::test]
    async fn a_nomad_deployment_on_postgres_becomes_a_unit_and_loses_nothing() {
        use crate::ledger::Ledger;
        let url = testing::database().await;
        sqlx::any::install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("connect");
        let before: Vec<_> = PG_MIGRATOR
            .iter()
            .filter(|m| m.version < 7)
            .cloned()
            .collect();
        assert_eq!(before.len(), 6);
        sqlx::migrate::Migrator::with_migrations(before)
            .run(&pool)
            .await
            .expect("migrations 1-6");
        sqlx::raw_sql(
            "INSERT INTO deployments (target, backend, commit_sha, plan_hash, policy, state,
                 summary, diff, destructive, created_at, updated_at, cluster, namespace, job,
                 file, job_modify_index, nomad_deployment_id, pre_hook, hook_nonce)
             VALUES ('jobs', 'nomad', 'c1', 's1', 'approval', 'pending_promotion', 'edited',
                 '{\"TaskGroups\":[]}', 0, 10, 20, 'http://n:4646', 'default', 'web',
                 'web.nomad.hcl', 7, 'd-1', 'migrate', 'n1');
             INSERT INTO deployments (target, backend, commit_sha, plan_hash, policy, state,
                 summary, diff, destructive, created_at, updated_at)
             VALUES ('net', 'terraform', 'c2', 'h', 'approval', 'pending_approval', '1 to add',
                 '+ a', 0, 30, 30);
             INSERT INTO nomad_job_pauses (target, job, paused_by, paused_at)
             VALUES ('jobs', 'web', 'token:ops', 40);",
        )
        .execute(&pool)
        .await
        .expect("old rows");
        pool.close().await;

        let store = Store::open_postgres(&url).await.expect("migrated");
        let open = store
            .active("nomad", "http://n:4646\ndefault\nweb")
            .await
            .expect("by unit key")
            .expect("the job's open deployment");
        assert_eq!(
            (open.unit.as_str(), open.state.as_str(), open.diff.as_str()),
            ("web", "pending_promotion", "{\"TaskGroups\":[]}")
        );
        let d = &open.detail;
        assert_eq!(
            (
                d["file"].as_str(),
                d["job_modify_index"].as_i64(),
                d["nomad_deployment_id"].as_str(),
                d["pre_hook"].as_str(),
                d["hook_nonce"].as_str(),
                d["plan_diff"].as_str(),
            ),
            (
                Some("web.nomad.hcl"),
                Some(7),
                Some("d-1"),
                Some("migrate"),
                Some("n1"),
                Some("{\"TaskGroups\":[]}")
            )
        );
        assert!(store.is_paused("jobs", "web").await.expect("pause"));
        let listed = store.plans(None, 10).await.expect("list");
        assert_eq!(
            listed
                .iter()
                .map(|p| (p.backend.as_str(), p.unit.as_deref(), p.subject()))
                .collect::<Vec<_>>(),
            [
                ("terraform", None, "net".to_string()),
                (
                    "nomad",
                    Some("web"),
                    "nomad job default/web of jobs".to_string()
                )
            ]
        );
        // Approved, the job's deployment runs its pre hook next.
        assert_eq!(listed[1].on_approval, Some(deployments::PlanState::PreHook));
        // The target's plan is still its open one; the job's is not a plan.
        assert!(store.open_plan("jobs").await.expect("open").is_none());
        assert!(store.open_plan("net").await.expect("open").is_some());
    }
}
