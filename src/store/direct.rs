//! SQLite only: a second write connection, used by the group's writer
//! thread (`group`), on which a batch of writes (webhook deliveries and
//! their jobs, a worker's claims and finishes) runs as one blocking call —
//! `BEGIN IMMEDIATE`, the statements, `COMMIT`. Through sqlx each
//! statement is a hand-off to its SQLite thread and back; under a flood of
//! deliveries those hand-offs, not SQLite's work, were most of a batch's
//! time. It must never be called on a runtime's worker thread.
//!
//! The caller holds this process's turn to write (`write::Writer::turn`)
//! for as long as a job runs, so this connection never writes beside the
//! other one. A job that fails is rolled back; a connection that cannot
//! roll back is closed, and the next job opens another. This module knows
//! nothing of deliveries or jobs: it runs the job it is given.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, Transaction, TransactionBehavior};

/// The statements of one transaction, on the connection's thread. Its
/// errors are statements' (a [`Failure::Write`]); the transaction is begun
/// and committed around it.
pub type Job<T> = Box<dyn FnOnce(&Transaction<'_>) -> Result<T, sqlx::Error> + Send>;

/// Why a job's transaction did not commit.
#[derive(Debug)]
pub enum Failure {
    /// The connection could not be opened, or the transaction could not
    /// begin or commit.
    Transaction(sqlx::Error),
    /// A statement of the job failed: nothing of it is kept.
    Write(sqlx::Error),
}

/// The connection, opened by the first job. Cheap to clone.
#[derive(Clone)]
pub(super) struct Direct {
    path: PathBuf,
    /// Set up like every connection of the store.
    pragmas: &'static str,
    conn: Arc<Mutex<Option<Connection>>>,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direct").field("path", &self.path).finish()
    }
}

impl Direct {
    pub(super) fn new(path: PathBuf, pragmas: &'static str) -> Direct {
        Direct {
            path,
            pragmas,
            conn: Default::default(),
        }
    }

    /// Close the connection, if open (the next job opens another).
    pub(super) fn close(&self) -> Result<(), sqlx::Error> {
        let conn = match self.conn.lock() {
            Ok(mut slot) => slot.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        match conn {
            Some(conn) => conn.close().map_err(|(_, e)| failure(e)),
            None => Ok(()),
        }
    }

    /// Run `job` in a transaction of its own and return once it is
    /// committed (or not). This blocks the calling thread for the whole
    /// transaction, fsync included: only the group's writer thread calls
    /// it, never a runtime's worker. The caller must hold the turn to
    /// write until this returns.
    pub(super) fn run<T>(&self, job: Job<T>) -> Result<T, Failure> {
        // A job that panicked left the connection in a state nobody
        // knows: it is closed, and the next job opens another.
        let mut slot = self.conn.lock().unwrap_or_else(|poisoned| {
            self.conn.clear_poison();
            let mut slot = poisoned.into_inner();
            *slot = None;
            slot
        });
        transact(&self.path, self.pragmas, &mut slot, job)
    }
}

/// Open the connection if need be, then begin, run `job`, commit. Whatever
/// failed, the connection is left outside any transaction, or closed.
fn transact<T>(
    path: &Path,
    pragmas: &str,
    slot: &mut Option<Connection>,
    job: Job<T>,
) -> Result<T, Failure> {
    let conn = match slot {
        Some(conn) => conn,
        None => {
            let conn = Connection::open(path)
                .and_then(|c| c.execute_batch(pragmas).map(|()| c))
                .map_err(|e| Failure::Transaction(failure(e)))?;
            slot.insert(conn)
        }
    };
    let result = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
        .map_err(|e| Failure::Transaction(failure(e)))
        .and_then(|tx| {
            // Dropped on an error: rolled back.
            let v = job(&tx).map_err(Failure::Write)?;
            tx.commit().map_err(|e| Failure::Transaction(failure(e)))?;
            Ok(v)
        });
    if result.is_err() && !conn.is_autocommit() {
        // The rollback on drop failed: try once more, else close it.
        if conn.execute_batch("ROLLBACK").is_err() || !conn.is_autocommit() {
            *slot = None;
        }
    }
    result
}

/// Bind a statement's parameters by name (`$1`, `$2`…, as the statement
/// sqlx runs names them), those it does not name left out: one statement
/// text serves both connections, even where a variant of it uses only
/// some of them. Then `raw_execute` or `raw_query` runs it.
pub fn bind(
    stmt: &mut rusqlite::Statement<'_>,
    params: &[(&str, &dyn rusqlite::ToSql)],
) -> Result<(), sqlx::Error> {
    for (name, value) in params {
        if let Some(i) = stmt.parameter_index(name).map_err(failure)? {
            stmt.raw_bind_parameter(i, value).map_err(failure)?;
        }
    }
    Ok(())
}

/// rusqlite's error as sqlx's, SQLite's extended result code kept as the
/// code (so a full disk is still recognised as one).
pub fn failure(e: rusqlite::Error) -> sqlx::Error {
    match e {
        rusqlite::Error::SqliteFailure(f, message) => {
            sqlx::Error::Database(Box::new(SqliteError {
                code: f.extended_code,
                message: message.unwrap_or_else(|| f.to_string()),
            }))
        }
        other => sqlx::Error::Protocol(other.to_string()),
    }
}

/// A statement's failure on the direct connection, as sqlx reports one.
#[derive(Debug)]
struct SqliteError {
    code: i32,
    message: String,
}

impl std::fmt::Display for SqliteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "(code: {}) {}", self.code, self.message)
    }
}

impl std::error::Error for SqliteError {}

impl sqlx::error::DatabaseError for SqliteError {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<Cow<'_, str>> {
        Some(self.code.to_string().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        use sqlx::error::ErrorKind;
        // SQLite's extended codes for SQLITE_CONSTRAINT (19).
        match self.code {
            2067 | 1555 => ErrorKind::UniqueViolation,
            787 => ErrorKind::ForeignKeyViolation,
            1299 => ErrorKind::NotNullViolation,
            275 => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Failure, transact};

    /// A job that fails is rolled back and the connection kept for the
    /// next one (closing it would cost every following job a new open);
    /// the job's write is gone.
    #[test]
    fn a_failed_job_is_rolled_back_on_the_connection_it_keeps() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let mut slot = None;
        let made = transact(
            &path,
            "",
            &mut slot,
            Box::new(|tx| {
                tx.execute_batch("CREATE TABLE t (v INTEGER)")
                    .map_err(super::failure)
            }),
        );
        assert!(made.is_ok(), "{made:?}");
        let failed = transact(
            &path,
            "",
            &mut slot,
            Box::new(|tx| {
                tx.execute_batch("INSERT INTO t VALUES (1)")
                    .map_err(super::failure)?;
                Err::<(), _>(sqlx::Error::Protocol("the job gives up".into()))
            }),
        );
        assert!(matches!(failed, Err(Failure::Write(_))), "{failed:?}");
        let conn = slot.as_ref().expect("the connection is kept");
        assert!(conn.is_autocommit(), "left inside a transaction");
        let n: i64 = conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("count");
        assert_eq!(n, 0, "the failed job's write was kept");
    }
}
