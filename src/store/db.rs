//! The SQL connection types every store module writes against, and the
//! few value types that read the same from every database.
//!
//! Queries go through sqlx's `Any` driver so that one text serves the
//! embedded SQLite database and a shared PostgreSQL one: placeholders are
//! `$1`, `$2`, … (both accept them), flags are stored as integers, JSON as
//! text. What only one dialect can say is chosen where it is written
//! (`Store::kind`). This module converts values; it runs no query.

use sqlx::any::{AnyTypeInfo, AnyTypeInfoKind};
use sqlx::decode::Decode;
use sqlx::encode::{Encode, IsNull};
use sqlx::error::BoxDynError;
use sqlx::types::Type;

/// The database driver every query is written for.
pub type Db = sqlx::Any;
/// A pool of connections to the state database.
pub type Pool = sqlx::AnyPool;
/// A write transaction on the state database (the store's `write`).
pub type Tx = super::WriteTx;
/// One connection to the state database: sqlx's, or a one-shot command's
/// SQLite connection run on the calling thread (`inline`). Both are
/// executors for every query.
#[derive(Debug)]
pub enum Conn {
    Sqlx(sqlx::AnyConnection),
    Inline(super::inline::Inline),
}
/// A row read from the state database.
pub type Row = sqlx::any::AnyRow;

/// A flag read from a column or an expression: SQLite has no boolean type
/// (it answers 0 or 1), PostgreSQL may answer a boolean. Read it as
/// `#[sqlx(try_from = "Flag")] field: bool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag(pub bool);

impl From<Flag> for bool {
    fn from(f: Flag) -> bool {
        f.0
    }
}

impl Type<Db> for Flag {
    fn type_info() -> AnyTypeInfo {
        <i64 as Type<Db>>::type_info()
    }

    fn compatible(ty: &AnyTypeInfo) -> bool {
        ty.kind().is_integer() || ty.kind() == AnyTypeInfoKind::Bool
    }
}

impl<'r> Decode<'r, Db> for Flag {
    fn decode(value: <Db as sqlx::Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        match <bool as Decode<Db>>::decode(value.clone()) {
            Ok(b) => Ok(Flag(b)),
            Err(_) => <i64 as Decode<Db>>::decode(value).map(|n| Flag(n != 0)),
        }
    }
}

/// A JSON document kept in a text column, read as `T`. Read it as
/// `#[sqlx(try_from = "JsonText")] field: T` where `T: TryFrom<JsonText>`
/// (see [`json_field`]).
#[derive(Debug, Clone)]
pub struct JsonText(pub String);

impl Type<Db> for JsonText {
    fn type_info() -> AnyTypeInfo {
        <String as Type<Db>>::type_info()
    }

    fn compatible(ty: &AnyTypeInfo) -> bool {
        <String as Type<Db>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Db> for JsonText {
    fn decode(value: <Db as sqlx::Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        <String as Decode<Db>>::decode(value).map(JsonText)
    }
}

/// Let a field of type `$ty` be read from a [`JsonText`] column.
macro_rules! json_field {
    ($($ty:ty),* $(,)?) => {$(
        impl TryFrom<$crate::store::db::JsonText> for $ty {
            type Error = serde_json::Error;
            fn try_from(t: $crate::store::db::JsonText) -> Result<Self, Self::Error> {
                serde_json::from_str(&t.0)
            }
        }
    )*};
}
pub(crate) use json_field;

/// A string enum kept in a text column: `as_str` writes it, `parse` (its
/// `FromStr`-like constructor) reads it back; an unknown word is an error
/// naming it.
macro_rules! text_enum {
    ($ty:ty) => {
        impl sqlx::types::Type<$crate::store::db::Db> for $ty {
            fn type_info() -> sqlx::any::AnyTypeInfo {
                <String as sqlx::types::Type<$crate::store::db::Db>>::type_info()
            }
            fn compatible(ty: &sqlx::any::AnyTypeInfo) -> bool {
                <String as sqlx::types::Type<$crate::store::db::Db>>::compatible(ty)
            }
        }
        impl<'q> sqlx::encode::Encode<'q, $crate::store::db::Db> for $ty {
            fn encode_by_ref(
                &self,
                buf: &mut <$crate::store::db::Db as sqlx::Database>::ArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                $crate::store::db::encode_text(self.as_str(), buf)
            }
        }
        impl<'r> sqlx::decode::Decode<'r, $crate::store::db::Db> for $ty {
            fn decode(
                value: <$crate::store::db::Db as sqlx::Database>::ValueRef<'r>,
            ) -> Result<Self, sqlx::error::BoxDynError> {
                let s = <String as sqlx::decode::Decode<$crate::store::db::Db>>::decode(value)?;
                <$ty>::parse(&s).ok_or_else(|| {
                    format!("unknown {} {s:?} in the database", stringify!($ty)).into()
                })
            }
        }
    };
}
pub(crate) use text_enum;

/// Encode a `'static` string (a [`text_enum`]'s word).
pub fn encode_text(
    s: &'static str,
    buf: &mut <Db as sqlx::Database>::ArgumentBuffer,
) -> Result<IsNull, BoxDynError> {
    <&str as Encode<Db>>::encode(s, buf)
}

/// One connection of its own to the database at `url`, outside any pool
/// (a keeper's, which must outlive its instance's pool).
pub async fn connect_keeper(url: &str) -> Result<Conn, sqlx::Error> {
    use sqlx::Connection;
    sqlx::any::install_default_drivers();
    sqlx::AnyConnection::connect(url).await.map(Conn::Sqlx)
}

/// Is `conn` a PostgreSQL connection (else SQLite)? For the statements
/// each dialect says its own way.
pub fn is_postgres(conn: &Conn) -> bool {
    conn.backend_name() == <sqlx::Postgres as sqlx::Database>::NAME
}

impl Conn {
    /// The database's name, as sqlx's drivers give it.
    pub fn backend_name(&self) -> &str {
        match self {
            Conn::Sqlx(c) => c.backend_name(),
            Conn::Inline(_) => <sqlx::Sqlite as sqlx::Database>::NAME,
        }
    }

    /// Inside a transaction.
    pub fn is_in_transaction(&self) -> bool {
        match self {
            Conn::Sqlx(c) => sqlx::Connection::is_in_transaction(c),
            Conn::Inline(c) => c.is_in_transaction(),
        }
    }

    /// Close it (a transaction left open is rolled back by the close).
    pub async fn close(self) -> Result<(), sqlx::Error> {
        match self {
            Conn::Sqlx(c) => sqlx::Connection::close(c).await,
            Conn::Inline(c) => c.close(),
        }
    }
}

/// Where a query reads from: the pool, or a one-shot command's SQLite
/// connections run on the calling thread (`Store::pool`, `inline::Reads`).
/// Used as an executor, as the pool is.
#[derive(Debug, Clone, Copy)]
pub enum Reader<'a> {
    Pool(&'a Pool),
    Inline(&'a super::inline::Reads),
}

/// Both executors pass each call on to the connection they hold.
macro_rules! delegate_executor {
    ($ty:ty, $self:ident => $($pat:pat => $conn:expr),+ $(,)?) => {
        impl<'c> sqlx::Executor<'c> for $ty {
            type Database = Db;

            fn fetch_many<'e, 'q: 'e, E>(
                $self,
                query: E,
            ) -> futures_util::stream::BoxStream<
                'e,
                Result<sqlx::Either<sqlx::any::AnyQueryResult, Row>, sqlx::Error>,
            >
            where
                'c: 'e,
                E: 'q + sqlx::Execute<'q, Db>,
            {
                match $self { $($pat => sqlx::Executor::fetch_many($conn, query)),+ }
            }

            fn fetch_optional<'e, 'q: 'e, E>(
                $self,
                query: E,
            ) -> futures_util::future::BoxFuture<'e, Result<Option<Row>, sqlx::Error>>
            where
                'c: 'e,
                E: 'q + sqlx::Execute<'q, Db>,
            {
                match $self { $($pat => sqlx::Executor::fetch_optional($conn, query)),+ }
            }

            fn prepare_with<'e>(
                $self,
                sql: sqlx::SqlStr,
                parameters: &'e [AnyTypeInfo],
            ) -> futures_util::future::BoxFuture<'e, Result<sqlx::any::AnyStatement, sqlx::Error>>
            where
                'c: 'e,
            {
                match $self { $($pat => sqlx::Executor::prepare_with($conn, sql, parameters)),+ }
            }

            fn describe<'e>(
                $self,
                sql: sqlx::SqlStr,
            ) -> futures_util::future::BoxFuture<'e, Result<sqlx::Describe<Db>, sqlx::Error>>
            where
                'c: 'e,
            {
                match $self { $($pat => sqlx::Executor::describe($conn, sql)),+ }
            }
        }
    };
}

delegate_executor!(&'c mut Conn, self => Conn::Sqlx(c) => c, Conn::Inline(c) => &*c);
delegate_executor!(Reader<'c>, self => Reader::Pool(p) => p, Reader::Inline(c) => c);

/// The PostgreSQL server's clock in milliseconds since the Unix epoch.
/// Job leases are written and judged by this one clock, so instances on
/// hosts whose clocks disagree still agree on when a lease ran out.
pub const PG_NOW_MS: &str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";
