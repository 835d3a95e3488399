//! Opening the SQLite database: the file made private, migrations taken
//! in turns, the daemon's pool of read connections and its write
//! connection, a command's `inline` connections (its reads' own opened
//! when first needed), the write-ahead log a command leaves behind, and
//! its sync. What is read and written there is the other modules'
//! business.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sqlx::any::AnyPoolOptions;

use super::{Kind, MIGRATOR, Store, StoreError, Usage, db, direct, inline, write};

/// The (device, inode) of the database file opened.
#[derive(Clone, Debug)]
pub(super) struct Identity {
    path: PathBuf,
    dev_ino: (u64, u64),
    /// Said once: the file at `path` is not the one open.
    logged: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Identity {
    pub(super) fn check(&self) -> Result<(), std::io::Error> {
        use std::os::unix::fs::MetadataExt;
        let now = std::fs::metadata(&self.path).map(|m| (m.dev(), m.ino()));
        if now.as_ref().is_ok_and(|id| *id == self.dev_ino) {
            return Ok(());
        }
        let how = if now.is_err() {
            "deleted"
        } else {
            "replaced by another file"
        };
        if !self.logged.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::error!(path = %self.path.display(),
                "the state database was {how} while driftless had it open; nothing is acknowledged \
                 or written until driftless is restarted on the right file");
        }
        Err(std::io::Error::other(format!(
            "the file was {how} while driftless had it open; restart driftless"
        )))
    }
}

/// Set on every SQLite connection: WAL, `synchronous=FULL` (a job is on
/// disk before a webhook gets its 2xx), foreign keys, and how long to wait
/// for another process's write. A macro so that `READ_ONLY` is built from
/// the same text.
macro_rules! pragmas {
    () => {
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
         PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 15000;"
    };
}
const PRAGMAS: &str = pragmas!();

/// The write-ahead log a command leaves behind for the next process
/// (`Store::close`): a no-op tick adds about 80 KB to it, and the next
/// process to open the database reads all of it first.
pub(super) const COMMAND_LOG_LIMIT: u64 = 512 * 1024;

/// `PRAGMAS`, for a connection that only reads.
const READ_ONLY: &str = concat!(pragmas!(), " PRAGMA query_only = ON;");

/// A connection through sqlx to the SQLite database at `url`, set up.
async fn sqlite_connection(url: &str) -> Result<sqlx::AnyConnection, sqlx::Error> {
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(url).await?;
    sqlx::raw_sql(PRAGMAS).execute(&mut conn).await?;
    Ok(conn)
}

/// A connection through sqlx to the SQLite database at `url` (the file at
/// `path`), migrated; processes starting at once take turns
/// (`migration_turn`). A failure says what was being done.
async fn migrated_connection(
    path: &Path,
    url: &str,
) -> Result<sqlx::AnyConnection, (&'static str, sqlx::Error)> {
    let turn = migration_turn(path)
        .await
        .map_err(|e| ("locking its directory to migrate it", e.into()))?;
    let mut conn = sqlite_connection(url).await.map_err(|e| ("opening", e))?;
    MIGRATOR
        .run(&mut conn)
        .await
        .map_err(|e| ("migrating", e.into()))?;
    drop(turn);
    Ok(conn)
}

/// An `inline` connection to the database at `path`, set up with `setup`;
/// SQLITE_BUSY while another process switches a brand-new database to
/// WAL is retried for a few seconds, as the daemon's pool does.
async fn open_inline_retrying(path: &Path, setup: &str) -> Result<inline::Inline, sqlx::Error> {
    let mut attempt = 0;
    loop {
        match inline::Inline::open(path, setup) {
            Err(e) if attempt < 30 && is_busy(&e) => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50 + 10 * attempt)).await;
            }
            opened => break opened,
        }
    }
}

/// Whether the database holds exactly this binary's migrations, each
/// applied whole: then sqlx's migrator, which would find nothing to do,
/// is not run. Anything else (a missing table, a migration missing,
/// failed, changed or unknown to this binary) is left to the migrator,
/// which applies or refuses it.
pub(super) fn migrated(conn: &inline::Inline) -> Result<bool, sqlx::Error> {
    use sqlx::Row;
    let exists = conn.run(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
        None,
        true,
    )?;
    if !exists.iter().any(|i| i.is_right()) {
        return Ok(false);
    }
    let mut applied = std::collections::BTreeMap::new();
    for item in conn.run(
        "SELECT version, checksum, success FROM _sqlx_migrations",
        None,
        true,
    )? {
        if let sqlx::Either::Right(row) = item {
            let version: i64 = row.try_get(0)?;
            let checksum: Vec<u8> = row.try_get(1)?;
            let success: db::Flag = row.try_get(2)?;
            applied.insert(version, (checksum, success.0));
        }
    }
    let known: std::collections::BTreeMap<i64, (Vec<u8>, bool)> = MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| (m.version, (m.checksum.to_vec(), true)))
        .collect();
    Ok(applied == known)
}

/// SQLITE_BUSY or SQLITE_LOCKED.
fn is_busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => matches!(d.code().as_deref(), Some("5" | "6" | "517" | "262")),
        _ => false,
    }
}

/// The `sqlite://` URL of the database file at `path`, every byte but the
/// unreserved ones percent-encoded (sqlx decodes the path back).
fn sqlite_url(path: &Path) -> String {
    use std::fmt::Write;
    use std::os::unix::ffi::OsStrExt;
    let mut url = String::from("sqlite://");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            url.push(b as char);
        } else {
            let _ = write!(url, "%{b:02X}");
        }
    }
    url.push_str("?mode=rwc");
    url
}

/// The database file and its directory, made private whatever the umask
/// (the directory 0700, the file 0600; SQLite gives its -wal and -shm
/// files the same mode). A state directory that holds git caches or
/// checkouts but no database is refused: it was deleted.
fn create_private(path: &Path) -> Result<(), (&'static str, sqlx::Error)> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| ("creating its directory", e.into()))?;
    }
    if !path.exists() {
        // A state directory already in use (git caches, checkouts) with
        // no database: the database was deleted. Starting over with an
        // empty one would forget every run, job and deployment.
        if let Some(dir) = path.parent()
            && (dir.join("git").exists() || dir.join("checkouts").exists())
        {
            return Err((
                "finding it (the state directory holds git caches and checkouts, but no database: \
                 it was deleted or moved; restore it, or remove the state directory to start afresh)",
                sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::NotFound)),
            ));
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map(drop)
            .or_else(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| ("creating it", e.into()))?;
    }
    Ok(())
}

/// A turn at migrating the database at `path`: an OS lock on the
/// directory that holds it, held until dropped. Two processes opening one
/// new or older database at once (a daemon and a timer's one-shot tick,
/// two ticks) would otherwise both apply a migration, and the second's
/// `CREATE TABLE` fail: SQLite's migrations take no lock of their own
/// (PostgreSQL's take an advisory lock). Waits while another process
/// migrates; the kernel drops the lock if its holder dies. Neither the
/// database file (an open and close of it here would drop SQLite's own
/// POSIX locks in this process) nor a lock file (one made by root running
/// the CLI first would shut the service's user out) is used.
async fn migration_turn(path: &Path) -> std::io::Result<std::fs::File> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&dir)?;
        file.lock()?;
        Ok(file)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// The pool of read-only connections to the database at `url`, each
/// checked against `identity` before it is handed out. A brand-new
/// database is switched to WAL on the first connection, which takes an
/// exclusive lock SQLite does not wait for: a second process opening it at
/// that instant gets SQLITE_BUSY at once. That is retried for a few
/// seconds rather than fail a tick for it.
async fn read_pool(url: &str, identity: &Identity) -> Result<db::Pool, sqlx::Error> {
    let mut attempt = 0;
    loop {
        let id = identity.clone();
        match AnyPoolOptions::new()
            .max_connections(8)
            // And read only: every write takes its turn on the
            // write connection (`Store::write_one`), so one that
            // does not is refused here, in every test, rather
            // than left to lose races in SQLite's busy handler.
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    sqlx::raw_sql(PRAGMAS).execute(&mut *conn).await?;
                    sqlx::raw_sql("PRAGMA query_only = ON")
                        .execute(conn)
                        .await
                        .map(drop)
                })
            })
            // A commit that failed (a full disk) can leave a pooled
            // connection marked inside a transaction, and every later
            // write on it fails ("begin_with at non-zero transaction
            // depth"). Such a connection is closed, not reused. And no
            // connection is handed out once the file at the path is not
            // the one open.
            .before_acquire(move |conn, _meta| {
                let id = id.clone();
                Box::pin(async move {
                    id.check().map_err(sqlx::Error::Io)?;
                    Ok(!sqlx::Connection::is_in_transaction(conn))
                })
            })
            .connect(url)
            .await
        {
            Ok(p) => break Ok(p),
            Err(e) if attempt < 30 && is_busy(&e) => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50 + 10 * attempt)).await;
            }
            Err(e) => break Err(e),
        }
    }
}

impl Store {
    /// Open (creating if needed) the database at `path` and migrate it,
    /// for `usage`. For one command, SQLite is read through one
    /// connection and written through one, each running its statements
    /// on the calling thread (`open_inline`).
    pub async fn open_for(path: &Path, usage: Usage) -> Result<Store, StoreError> {
        let err = |what, source| StoreError {
            path: path.to_path_buf(),
            what,
            source,
        };
        create_private(path).map_err(|(what, e)| err(what, e))?;
        let url = sqlite_url(path);
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).map_err(|e| err("reading its metadata", e.into()))?;
        let identity = Identity {
            path: path.to_path_buf(),
            dev_ino: (meta.dev(), meta.ino()),
            logged: Default::default(),
        };
        sqlx::any::install_default_drivers();
        if usage == Usage::Command {
            return Store::open_inline(path, &url, identity).await;
        }
        let pool = read_pool(&url, &identity)
            .await
            .map_err(|e| err("opening", e))?;
        // Write transactions take turns (`writer`) on one connection of
        // their own: its page cache stays warm, where a write on any of
        // the pool's connections would make the next one read every page
        // again (SQLite drops a connection's cache when another wrote).
        let open: write::Open = {
            let url = url.clone();
            Arc::new(move || {
                let url = url.clone();
                Box::pin(async move { sqlite_connection(&url).await.map(db::Conn::Sqlx) })
            })
        };
        // Migrated on the writer's connection, which is kept: the pool's
        // only read.
        let conn = migrated_connection(path, &url)
            .await
            .map_err(|(what, e)| err(what, e))?;
        Ok(Store {
            pool,
            reads: None,
            writer: write::Writer::seeded(open, "BEGIN IMMEDIATE".into(), db::Conn::Sqlx(conn)),
            kind: Kind::Sqlite,
            path: path.to_path_buf(),
            identity: Some(identity),
            group: Default::default(),
            connect: None,
            direct: Some(direct::Direct::new(path.to_path_buf(), PRAGMAS)),
            changes: Default::default(),
        })
    }

    /// A command's store on SQLite (`Usage::Command`): one connection to
    /// read through and one to write through, each running its statements
    /// on the calling thread (`inline`), and no write connection of the
    /// group's own (`direct`). Migrated through sqlx only when the
    /// database lacks one of this binary's migrations.
    async fn open_inline(path: &Path, url: &str, identity: Identity) -> Result<Store, StoreError> {
        let err = |what, source| StoreError {
            path: path.to_path_buf(),
            what,
            source,
        };
        let writes = open_inline_retrying(path, PRAGMAS)
            .await
            .map_err(|e| err("opening", e))?;
        if !migrated(&writes).map_err(|e| err("reading its migrations", e))? {
            let conn = migrated_connection(path, url)
                .await
                .map_err(|(what, e)| err(what, e))?;
            sqlx::Connection::close(conn)
                .await
                .map_err(|e| err("closing the migration's connection", e))?;
        }
        // Reads run on the write connection while it is outside a
        // transaction, else on a read-only connection of their own (as the
        // daemon's pool: every write takes its turn on the write
        // connection), opened when first needed: the database is in WAL
        // by then, so no open waits on another process switching it.
        let reads = {
            let path = path.to_path_buf();
            inline::Reads::new(&writes, move || inline::Inline::open(&path, READ_ONLY))
        };
        let id = identity.clone();
        let reads = reads.checked(move || id.check());
        let open: write::Open = {
            let path = path.to_path_buf();
            Arc::new(move || {
                let opened = inline::Inline::open(&path, PRAGMAS).map(db::Conn::Inline);
                Box::pin(std::future::ready(opened))
            })
        };
        Ok(Store {
            // Never connected: a command's reads go through `reads`.
            pool: AnyPoolOptions::new()
                .max_connections(1)
                .connect_lazy(url)
                .map_err(|e| err("opening", e))?,
            reads: Some(reads),
            // Every transaction says whether its commit is synced: FULL,
            // unless begun unsynced (`begin_write_unsynced`), whose setting
            // lasts only until the next begins. SQLite takes the setting
            // only outside a transaction.
            writer: write::Writer::seeded(
                open,
                "PRAGMA synchronous = FULL; BEGIN IMMEDIATE".into(),
                db::Conn::Inline(writes),
            )
            .with_unsynced("PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE"),
            kind: Kind::Sqlite,
            path: path.to_path_buf(),
            identity: Some(identity),
            group: Default::default(),
            connect: None,
            direct: None,
            changes: Default::default(),
        })
    }

    /// Take every commit so far to disk: on a command's SQLite store,
    /// whose commits may be unsynced (`Store::begin_write_unsynced`), its
    /// write-ahead log and the directory that holds it are synced, as
    /// SQLite syncs them for a synced commit (its writes reach the file
    /// as they are made, with no buffer of its own, so a sync of the file
    /// takes them all). Elsewhere every commit is synced already.
    pub async fn sync_log(&self, what: &'static str) -> Result<(), StoreError> {
        if !self.writer.can_skip_syncs() {
            return Ok(());
        }
        let mut log = self.path.clone().into_os_string();
        log.push("-wal");
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // Said with the file that could not be synced.
        let sync = |file: &Path| {
            std::fs::File::open(file)
                .and_then(|f| f.sync_all())
                .map_err(|e| {
                    std::io::Error::new(e.kind(), format!("syncing {}: {e}", file.display()))
                })
        };
        sync(Path::new(&log))
            .and_then(|()| sync(&dir))
            .map_err(|e| StoreError {
                path: self.path.clone(),
                what,
                source: sqlx::Error::Io(e),
            })
    }

    /// The size of SQLite's write-ahead log (0 when there is none).
    pub(super) fn log_size(&self) -> u64 {
        let mut log = self.path.clone().into_os_string();
        log.push("-wal");
        std::fs::metadata(log).map(|m| m.len()).unwrap_or(0)
    }
}
