//! SQLite only, for a one-shot command: a connection whose statements run
//! on the calling thread, behind sqlx's `Executor` so that every store
//! query serves it unchanged.
//!
//! Through sqlx's own SQLite driver each statement is handed to the
//! connection's thread and its rows handed back one by one: about 50 µs a
//! statement here against 3 µs run in place (docs/performance.md), and a
//! no-op `tick` runs about forty. A daemon keeps sqlx's threads (a
//! statement waiting on the busy timeout must not stall a runtime serving
//! webhooks); a command has nothing else to serve meanwhile.
//!
//! Statements run as sqlx's SQLite driver runs them: parameters bound by
//! their `$N` names (or in order), a text of several statements run one
//! after the other, every row read to the end, and the count of changed
//! rows SQLite's `changes()` reports. Values come back as that driver
//! hands them to sqlx's `Any` rows: integers as 64-bit, reals as doubles,
//! text, blobs, nulls — through fields of sqlx's `Any` types that sqlx
//! marks `#[doc(hidden)]`, so an upgrade of sqlx may need this file
//! changed (the build says so). This module runs what it is given; it
//! knows no table.

use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use rusqlite::Connection;
use rusqlite::fallible_iterator::FallibleIterator;
use rusqlite::types::ValueRef;
use sqlx::Either;
use sqlx::any::{
    Any, AnyArguments, AnyQueryResult, AnyRow, AnyStatement, AnyTypeInfo, AnyTypeInfoKind, AnyValue,
};
use sqlx_core::any::{AnyColumn, AnyValueKind};
use sqlx_core::ext::ustr::UStr;

use super::direct::failure;

/// One connection, run on the calling thread. Cheap to clone (the clones
/// share it).
#[derive(Clone)]
pub struct Inline {
    /// None once closed.
    conn: Arc<Mutex<Option<Connection>>>,
    /// Asked before every statement.
    check: Option<Check>,
}

impl std::fmt::Debug for Inline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inline").finish_non_exhaustive()
    }
}

/// What a statement text gave: each row, and after each statement its
/// count of changed rows — the items sqlx's `fetch_many` yields.
type Items = Vec<Either<AnyQueryResult, AnyRow>>;

/// Asked before every statement: the store's check that the file at its
/// path is still the one open.
type Check = Arc<dyn Fn() -> std::io::Result<()> + Send + Sync>;

/// `check` asked (a failure runs nothing), then the values of `args`.
fn checked_values(
    check: &Option<Check>,
    args: Option<AnyArguments>,
) -> Result<Vec<AnyValueKind>, sqlx::Error> {
    if let Some(check) = check {
        check().map_err(sqlx::Error::Io)?;
    }
    Ok(args.map(|a| a.values.0).unwrap_or_default())
}

impl Inline {
    /// Open the database at `path` and run `setup` (its pragmas) on it.
    /// Closing it leaves the write-ahead log as it is, even as the last
    /// connection out.
    pub fn open(path: &std::path::Path, setup: &str) -> Result<Inline, sqlx::Error> {
        let conn = Connection::open(path).map_err(failure)?;
        conn.execute_batch(setup).map_err(failure)?;
        // Room for every statement a command runs (rusqlite keeps 16).
        conn.set_prepared_statement_cache_capacity(64);
        // The last connection out leaves the write-ahead log as it is: the
        // store decides when a command folds it in (`Store::close`).
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .map_err(failure)?;
        Ok(Inline {
            conn: Arc::new(Mutex::new(Some(conn))),
            check: None,
        })
    }

    /// Ask `check` before every statement; one that fails runs nothing.
    pub fn checked(
        self,
        check: impl Fn() -> std::io::Result<()> + Send + Sync + 'static,
    ) -> Inline {
        Inline {
            check: Some(Arc::new(check)),
            ..self
        }
    }

    /// Inside a transaction (not in autocommit mode).
    pub fn is_in_transaction(&self) -> bool {
        self.with(|c| Ok(!c.is_autocommit())).unwrap_or(true)
    }

    /// Close the connection (a transaction left open is rolled back by the
    /// close), for every clone: a statement after it is refused.
    pub fn close(&self) -> Result<(), sqlx::Error> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner()).take();
        match conn {
            Some(conn) => conn.close().map_err(|(_, e)| failure(e)),
            None => Ok(()),
        }
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, sqlx::Error>,
    ) -> Result<T, sqlx::Error> {
        // A panic half-way through a statement leaves nothing SQLite would
        // not roll back or finish on the next one: the poison is ignored.
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        match conn.as_ref() {
            Some(conn) => f(conn),
            None => Err(sqlx::Error::PoolClosed),
        }
    }

    /// Run `sql` with `args`, every statement of it to its end.
    pub fn run(
        &self,
        sql: &str,
        args: Option<AnyArguments>,
        persistent: bool,
    ) -> Result<Items, sqlx::Error> {
        let values = checked_values(&self.check, args)?;
        self.with(|conn| run_on(conn, sql, &values, persistent))
    }
}

/// A command's reads. Each statement runs on the command's write
/// connection while no transaction is open there — it then reads the last
/// commit, as a connection of its own would — and otherwise on a
/// read-only connection of their own, opened the first time one is
/// needed: a connection's first statement reads the whole schema (about
/// 0.7 ms here), and a no-op tick never needs the second. Every statement
/// must be read-only, as on the daemon's pool (`query_only`). Cheap to
/// clone (the clones share both connections).
#[derive(Clone)]
pub struct Reads {
    /// The write connection's (a clone of the writer's `Inline`). Once
    /// the writer closed it, reads go to their own.
    writes: Inline,
    /// Their own connection: None until first needed.
    own: Arc<Mutex<Option<Inline>>>,
    /// Opens their own connection.
    open: Arc<dyn Fn() -> Result<Inline, sqlx::Error> + Send + Sync>,
    /// Set by `close`: nothing runs after it.
    closed: Arc<std::sync::atomic::AtomicBool>,
    /// Asked before every statement.
    check: Option<Check>,
}

impl std::fmt::Debug for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reads").finish_non_exhaustive()
    }
}

impl Reads {
    /// Reads through `writes` while no transaction is open on it, else
    /// through a connection `open` makes when first needed.
    pub fn new(
        writes: &Inline,
        open: impl Fn() -> Result<Inline, sqlx::Error> + Send + Sync + 'static,
    ) -> Reads {
        Reads {
            writes: writes.clone(),
            own: Default::default(),
            open: Arc::new(open),
            closed: Default::default(),
            check: None,
        }
    }

    /// Ask `check` before every statement; one that fails runs nothing.
    pub fn checked(self, check: impl Fn() -> std::io::Result<()> + Send + Sync + 'static) -> Reads {
        Reads {
            check: Some(Arc::new(check)),
            ..self
        }
    }

    /// Whether their own connection was opened.
    pub fn opened_own(&self) -> bool {
        self.own.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Close their own connection, if opened (the write connection is the
    /// writer's to close); a statement after it is refused.
    pub fn close(&self) -> Result<(), sqlx::Error> {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let own = self.own.lock().unwrap_or_else(|p| p.into_inner()).take();
        match own {
            Some(own) => own.close(),
            None => Ok(()),
        }
    }

    /// Run `sql` with `args`, every statement of it to its end, each
    /// refused unless it only reads.
    pub fn run(
        &self,
        sql: &str,
        args: Option<AnyArguments>,
        persistent: bool,
    ) -> Result<Items, sqlx::Error> {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(sqlx::Error::PoolClosed);
        }
        let values = checked_values(&self.check, args)?;
        {
            // Held while the statement runs: no transaction begins there
            // meanwhile.
            let writes = self.writes.conn.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(conn) = writes.as_ref()
                && conn.is_autocommit()
            {
                return read_on(conn, sql, &values, persistent, true);
            }
        }
        let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        let own = match own.as_mut() {
            Some(own) => own,
            None => own.insert((self.open)()?),
        };
        own.with(|conn| read_on(conn, sql, &values, persistent, false))
    }
}

/// Run `sql` with `values` on `conn` as a read: a statement that would
/// write is refused by SQLite's `query_only` (set for the statement when
/// `only_now`, else the connection's own setting), and one that leaves a
/// transaction open (`BEGIN`) is rolled back and refused.
fn read_on(
    conn: &Connection,
    sql: &str,
    values: &[AnyValueKind],
    persistent: bool,
    only_now: bool,
) -> Result<Items, sqlx::Error> {
    let query_only = |on: bool| {
        let pragma = match on {
            true => "PRAGMA query_only = ON",
            false => "PRAGMA query_only = OFF",
        };
        conn.prepare_cached(pragma)
            .and_then(|mut s| s.execute([]))
            .map_err(failure)
    };
    if only_now {
        query_only(true)?;
    }
    let read = run_on(conn, sql, values, persistent);
    let reset = match only_now {
        true => query_only(false).map(drop),
        false => Ok(()),
    };
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
        return Err(sqlx::Error::Protocol(
            "a read left a transaction open; it was rolled back".into(),
        ));
    }
    let items = read?;
    reset?;
    Ok(items)
}

/// Run `sql` with `values` on `conn`, every statement of it to its end.
fn run_on(
    conn: &Connection,
    sql: &str,
    values: &[AnyValueKind],
    persistent: bool,
) -> Result<Items, sqlx::Error> {
    let mut items = Items::new();
    // One statement (sqlx's `query`): prepared once, kept. A text of
    // several (`raw_sql`), or one this cannot prepare at once (its second
    // statement needs what its first makes): each statement prepared and
    // run in turn, as sqlx's driver does.
    let cached = match persistent {
        true => conn.prepare_cached(sql).ok(),
        false => None,
    };
    match cached {
        Some(mut stmt) => {
            step(conn, &mut stmt, values, 0, &mut items)?;
        }
        None => {
            let mut batch = rusqlite::Batch::new(conn, sql);
            let mut used = 0;
            while let Some(mut stmt) = batch.next().map_err(failure)? {
                used += step(conn, &mut stmt, values, used, &mut items)?;
            }
        }
    }
    Ok(items)
}

/// Bind, run and read one statement into `items`; the count of
/// positional arguments it took (sqlx's SQLite driver's rule: `$N` and
/// `?N` name their argument, a bare `?` takes the next one).
fn step(
    conn: &Connection,
    stmt: &mut rusqlite::Statement<'_>,
    values: &[AnyValueKind],
    offset: usize,
    items: &mut Items,
) -> Result<usize, sqlx::Error> {
    stmt.clear_bindings();
    let mut next = offset;
    for i in 1..=stmt.parameter_count() {
        let n = match stmt.parameter_name(i) {
            Some(name) => {
                let digits = name.strip_prefix(['$', '?']).unwrap_or(name);
                digits.parse::<usize>().map_err(|_| {
                    sqlx::Error::Protocol(format!(
                        "parameters with non-integer names are not supported: {name}"
                    ))
                })?
            }
            None => {
                next += 1;
                next
            }
        };
        // As SQLite does, and sqlx's driver with it: a parameter without
        // an argument is NULL.
        let Some(value) = n.checked_sub(1).and_then(|k| values.get(k)) else {
            break;
        };
        bind(stmt, i, value)?;
    }
    let names: Vec<UStr> = stmt.column_names().into_iter().map(UStr::new).collect();
    let index: Arc<sqlx_core::HashMap<UStr, usize>> = Arc::new(
        names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect(),
    );
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next().map_err(failure)? {
        let mut columns = Vec::with_capacity(names.len());
        let mut values = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            let kind = value_of(row.get_ref(i).map_err(failure)?, i)?;
            columns.push(AnyColumn {
                ordinal: i,
                name: name.clone(),
                type_info: AnyTypeInfo {
                    kind: type_of(&kind),
                },
            });
            values.push(AnyValue { kind });
        }
        items.push(Either::Right(AnyRow {
            column_names: index.clone(),
            columns,
            values,
        }));
    }
    items.push(Either::Left(AnyQueryResult {
        rows_affected: conn.changes(),
        last_insert_id: None,
    }));
    Ok(next - offset)
}

fn bind(stmt: &mut rusqlite::Statement<'_>, i: usize, v: &AnyValueKind) -> Result<(), sqlx::Error> {
    use rusqlite::types::Value;
    let value = match v {
        AnyValueKind::Null(_) => Value::Null,
        AnyValueKind::Bool(b) => Value::Integer(i64::from(*b)),
        AnyValueKind::SmallInt(n) => Value::Integer(i64::from(*n)),
        AnyValueKind::Integer(n) => Value::Integer(i64::from(*n)),
        AnyValueKind::BigInt(n) => Value::Integer(*n),
        AnyValueKind::Real(r) => Value::Real(f64::from(*r)),
        AnyValueKind::Double(d) => Value::Real(*d),
        AnyValueKind::Text(t) => Value::Text(t.to_string()),
        AnyValueKind::TextSlice(t) => Value::Text(t.to_string()),
        AnyValueKind::Blob(b) => Value::Blob(b.to_vec()),
        other => {
            return Err(sqlx::Error::Protocol(format!(
                "an argument of a kind SQLite cannot take: {other:?}"
            )));
        }
    };
    stmt.raw_bind_parameter(i, value).map_err(failure)
}

/// A column's value as sqlx's SQLite driver gives it to an `Any` row.
fn value_of(v: ValueRef<'_>, column: usize) -> Result<AnyValueKind, sqlx::Error> {
    Ok(match v {
        ValueRef::Null => AnyValueKind::Null(AnyTypeInfoKind::Null),
        ValueRef::Integer(n) => AnyValueKind::BigInt(n),
        ValueRef::Real(r) => AnyValueKind::Double(r),
        ValueRef::Text(t) => {
            AnyValueKind::Text(Arc::new(String::from_utf8(t.to_vec()).map_err(|e| {
                sqlx::Error::ColumnDecode {
                    index: column.to_string(),
                    source: Box::new(e),
                }
            })?))
        }
        ValueRef::Blob(b) => AnyValueKind::Blob(Arc::new(b.to_vec())),
    })
}

fn type_of(kind: &AnyValueKind) -> AnyTypeInfoKind {
    match kind {
        AnyValueKind::BigInt(_) => AnyTypeInfoKind::BigInt,
        AnyValueKind::Double(_) => AnyTypeInfoKind::Double,
        AnyValueKind::Text(_) => AnyTypeInfoKind::Text,
        AnyValueKind::Blob(_) => AnyTypeInfoKind::Blob,
        _ => AnyTypeInfoKind::Null,
    }
}

/// The statements of a query: its text, its arguments and whether it
/// keeps its prepared statement, or why its arguments could not be
/// encoded.
fn taken<'q, E: sqlx::Execute<'q, Any>>(
    mut query: E,
) -> Result<(sqlx::SqlStr, Option<AnyArguments>, bool), sqlx::Error> {
    let args = query.take_arguments().map_err(sqlx::Error::Encode)?;
    let persistent = query.persistent();
    Ok((query.sql(), args, persistent))
}

/// Both run statements in place behind sqlx's `Executor`.
macro_rules! in_place_executor {
    ($($ty:ty),+) => {$(
        impl<'c> sqlx::Executor<'c> for &'c $ty {
            type Database = Any;

            fn fetch_many<'e, 'q: 'e, E>(
                self,
                query: E,
            ) -> BoxStream<'e, Result<Either<AnyQueryResult, AnyRow>, sqlx::Error>>
            where
                'c: 'e,
                E: 'q + sqlx::Execute<'q, Any>,
            {
                let items = taken(query).and_then(|(sql, args, keep)| self.run(sql.as_str(), args, keep));
                match items {
                    Ok(items) => Box::pin(futures_util::stream::iter(items.into_iter().map(Ok))),
                    Err(e) => Box::pin(futures_util::stream::iter([Err(e)])),
                }
            }

            fn fetch_optional<'e, 'q: 'e, E>(
                self,
                query: E,
            ) -> BoxFuture<'e, Result<Option<AnyRow>, sqlx::Error>>
            where
                'c: 'e,
                E: 'q + sqlx::Execute<'q, Any>,
            {
                // Every statement run to its end (an UPDATE … RETURNING changes
                // every row it matches), the first row kept.
                let first = taken(query)
                    .and_then(|(sql, args, keep)| self.run(sql.as_str(), args, keep))
                    .map(|items| {
                        items.into_iter().find_map(|i| match i {
                            Either::Right(row) => Some(row),
                            Either::Left(_) => None,
                        })
                    });
                Box::pin(std::future::ready(first))
            }

            fn prepare_with<'e>(
                self,
                _sql: sqlx::SqlStr,
                _parameters: &'e [AnyTypeInfo],
            ) -> BoxFuture<'e, Result<AnyStatement, sqlx::Error>>
            where
                'c: 'e,
            {
                Box::pin(std::future::ready(Err(sqlx::Error::Protocol(
                    "statements are not prepared ahead on a command's SQLite connection".into(),
                ))))
            }

            fn describe<'e>(
                self,
                _sql: sqlx::SqlStr,
            ) -> BoxFuture<'e, Result<sqlx::Describe<Any>, sqlx::Error>>
            where
                'c: 'e,
            {
                Box::pin(std::future::ready(Err(sqlx::Error::Protocol(
                    "statements are not described on a command's SQLite connection".into(),
                ))))
            }
        }
    )+};
}
in_place_executor!(Inline, Reads);

#[cfg(test)]
mod tests {
    use sqlx::Row;

    use super::{Inline, Reads};

    /// A table of every kind of value the store keeps, on a file that
    /// sqlx's SQLite driver and an inline connection both open.
    async fn both() -> (tempfile::TempDir, sqlx::AnyPool, Inline) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.db");
        let inline = Inline::open(&path, "PRAGMA journal_mode = WAL;").expect("open");
        inline
            .run(
                "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT UNIQUE, n INTEGER, \
                 r REAL, b BLOB, flag INTEGER NOT NULL DEFAULT 0);
                 INSERT INTO t (name, n, r, b, flag) VALUES ('a', 1, 0.5, x'00ff', 1);
                 INSERT INTO t (name, n, r, b) VALUES ('b', NULL, NULL, NULL);",
                None,
                false,
            )
            .expect("schema");
        sqlx::any::install_default_drivers();
        let pool = sqlx::any::AnyPoolOptions::new()
            .max_connections(1)
            .connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("pool");
        (dir, pool, inline)
    }

    /// Every row of `sql` with `name` bound as `$2` and `n` as `$1` (named
    /// out of order, and `$2` twice), as text, through one executor.
    async fn rows<'c, E: sqlx::Executor<'c, Database = sqlx::Any>>(
        e: E,
        sql: &'static str,
    ) -> Vec<String> {
        sqlx::query(sql)
            .bind(1_i64)
            .bind("a")
            .fetch_all(e)
            .await
            .expect("query")
            .iter()
            .map(|row| {
                let id: i64 = row.get("id");
                let name: Option<String> = row.get("name");
                let n: Option<i64> = row.get("n");
                let r: Option<f64> = row.get("r");
                let b: Option<Vec<u8>> = row.get("b");
                let flag: crate::store::db::Flag = row.get("flag");
                format!("{id} {name:?} {n:?} {r:?} {b:?} {}", flag.0)
            })
            .collect()
    }

    /// Rows read in place are the rows sqlx's own driver reads: every
    /// kind of value, nulls, parameters bound by their `$N` names.
    #[tokio::test]
    async fn rows_read_in_place_are_the_rows_sqlx_reads() {
        let (_d, pool, inline) = both().await;
        for sql in [
            "SELECT * FROM t ORDER BY id",
            "SELECT * FROM t WHERE name = $2 OR n = $1 OR name = $2 ORDER BY id",
            "SELECT * FROM t WHERE name <> $2",
        ] {
            let theirs = rows(&pool, sql).await;
            let ours = rows(&inline, sql).await;
            assert!(!theirs.is_empty(), "{sql}: no rows to compare");
            assert_eq!(ours, theirs, "{sql}");
        }
    }

    /// Writes count their rows as sqlx's driver counts them; a text of
    /// several statements runs whole; `fetch_optional` of an UPDATE …
    /// RETURNING changes every row it matches.
    #[tokio::test]
    async fn writes_run_and_count_as_through_sqlx() {
        let (_d, pool, inline) = both().await;
        let q = "UPDATE t SET n = COALESCE(n, 0) + 1";
        let theirs = sqlx::query(q).execute(&pool).await.expect("sqlx");
        let ours = sqlx::query(q).execute(&inline).await.expect("inline");
        assert_eq!(ours.rows_affected(), 2);
        assert_eq!(ours.rows_affected(), theirs.rows_affected());
        sqlx::raw_sql(
            "UPDATE t SET r = 2.0 WHERE name = 'a'; UPDATE t SET r = 3.0 WHERE name = 'b'",
        )
        .execute(&inline)
        .await
        .expect("two statements");
        let first = sqlx::query("UPDATE t SET n = n * 10 RETURNING name")
            .fetch_optional(&inline)
            .await
            .expect("returning")
            .expect("a row");
        assert!(["a", "b"].contains(&first.get::<String, _>("name").as_str()));
        let all: Vec<(String, i64, f64)> = sqlx::query_as("SELECT name, n, r FROM t ORDER BY name")
            .fetch_all(&pool)
            .await
            .expect("read back");
        assert_eq!(
            all,
            vec![("a".into(), 30, 2.0), ("b".into(), 20, 3.0)],
            "what the inline writes left"
        );
    }

    /// A refused statement is the error sqlx's driver gives: a database
    /// error with SQLite's extended code, a unique violation known as one.
    #[tokio::test]
    async fn a_refused_statement_is_the_error_sqlx_gives() {
        let (_d, pool, inline) = both().await;
        let q = "INSERT INTO t (name) VALUES ('a')";
        let theirs = sqlx::query(q)
            .execute(&pool)
            .await
            .expect_err("sqlx refuses");
        let ours = sqlx::query(q)
            .execute(&inline)
            .await
            .expect_err("inline refuses");
        let (sqlx::Error::Database(t), sqlx::Error::Database(o)) = (&theirs, &ours) else {
            panic!("not database errors: {theirs:?} / {ours:?}");
        };
        assert_eq!(o.code(), t.code());
        assert!(o.is_unique_violation(), "{ours}");
        assert_eq!(ours.to_string(), theirs.to_string());
    }

    /// The check is asked before every statement, and one that fails runs
    /// nothing; a closed connection refuses every statement, for every
    /// clone.
    #[tokio::test]
    async fn a_failed_check_or_a_close_runs_nothing() {
        let (_d, pool, inline) = both().await;
        let checked = inline
            .clone()
            .checked(|| Err(std::io::Error::other("the file was replaced")));
        let refused = sqlx::query("DELETE FROM t").execute(&checked).await;
        assert!(matches!(refused, Err(sqlx::Error::Io(_))), "{refused:?}");
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
            .fetch_one(&pool)
            .await
            .expect("count");
        assert_eq!(left, 2, "the refused statement ran");
        let other = inline.clone();
        inline.close().expect("close");
        let after = sqlx::query("SELECT 1").execute(&other).await;
        assert!(matches!(after, Err(sqlx::Error::PoolClosed)), "{after:?}");
    }

    /// A command's reads run on its write connection while no transaction
    /// is open there, and see its last commit; during one they run on a
    /// read-only connection of their own, opened then, which does not see
    /// the transaction's writes. Neither lets a statement write, nor
    /// leaves a transaction open.
    #[tokio::test]
    async fn reads_take_the_write_connection_while_it_is_free() {
        let (d, _pool, writes) = both().await;
        let path = d.path().join("t.db");
        let opens = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let reads = {
            let opens = opens.clone();
            Reads::new(&writes, move || {
                opens.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Inline::open(&path, "PRAGMA query_only = ON;")
            })
        };
        let count = || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM t")
                .fetch_one(&reads)
                .await
                .expect("count")
        };
        assert_eq!(count().await, 2);
        writes
            .run("INSERT INTO t (name) VALUES ('c')", None, false)
            .expect("insert");
        assert_eq!(count().await, 3, "the last commit");
        assert!(
            !reads.opened_own(),
            "opened a connection while the writer's was free"
        );
        writes
            .run(
                "BEGIN IMMEDIATE; INSERT INTO t (name) VALUES ('d')",
                None,
                false,
            )
            .expect("begin");
        assert_eq!(count().await, 3, "read the open transaction's write");
        assert!(reads.opened_own());
        writes.run("COMMIT", None, false).expect("commit");
        assert_eq!(count().await, 4);
        assert_eq!(opens.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Writes are refused on either connection, before they run; a
        // `BEGIN` is rolled back.
        for open in [false, true] {
            if open {
                writes.run("BEGIN", None, false).expect("begin");
            }
            let refused = sqlx::query("DELETE FROM t").execute(&reads).await;
            assert!(
                refused
                    .as_ref()
                    .is_err_and(|e| e.to_string().contains("readonly")),
                "{refused:?}"
            );
            if open {
                writes.run("ROLLBACK", None, false).expect("rollback");
            }
        }
        let begun = sqlx::raw_sql("BEGIN").execute(&reads).await;
        assert!(begun.is_err(), "{begun:?}");
        assert!(
            !writes.is_in_transaction(),
            "a read left a transaction open"
        );
        assert_eq!(count().await, 4, "a refused write ran");
        reads.close().expect("close");
        let after = sqlx::query("SELECT 1").execute(&reads).await;
        assert!(matches!(after, Err(sqlx::Error::PoolClosed)), "{after:?}");
        assert_eq!(
            writes.run("SELECT 1", None, false).map(|i| i.len()).ok(),
            Some(2),
            "closing the reads closed the write connection"
        );
    }
}
