//! The two database backends behind one small interface: run a statement with
//! parameters, read rows by column index. Everything above (the SQL text, the row
//! mappings) is written once in `sql.rs`; only connecting, migrating and moving values
//! in and out of each driver lives here.

use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use tokio::sync::mpsc;
use tokio_postgres::NoTls;
use tokio_postgres::types::{IsNull, Type, to_sql_checked};

use super::{StoreError, StoreResult};

/// `(name, SQL)` of each migration, its file `migrations/<name>.sql`.
macro_rules! migrations {
    ($($name:ident),+ $(,)?) => {
        [$((stringify!($name), include_str!(concat!("../../migrations/", stringify!($name), ".sql")))),+]
    };
}

/// The schema's migrations, in order, written once in PostgreSQL's dialect; SQLite runs
/// them with its own type names (`sqlite_schema`). A new migration is a new name here.
const MIGRATIONS: &[(&str, &str)] = &migrations![
    V1__initial,
    V2__extensions,
    V3__replays,
    V4__proxies_and_pools,
    V5__profiles_and_auth_connections,
    V6__pool_lease_ids,
    V7__vm_settings,
    V8__session_names,
    V9__replay_audio,
    V10__credentials,
    V11__apps,
    V12__leases,
    V13__session_owners,
    V14__telemetry,
    V15__api_key_policies,
    V16__audit_log,
    V17__organization_limits,
    V18__projects,
    V19__people,
    V20__audit_export_destinations,
    V21__signed_in_sessions,
];

/// PostgreSQL column types and the SQLite types that hold the same values as the
/// drivers write them (rusqlite stores timestamps as text and booleans as integers).
const SQLITE_TYPES: [(&str, &str); 4] =
    [("TIMESTAMPTZ", "TEXT"), ("BYTEA", "BLOB"), ("BOOLEAN", "INTEGER"), ("BIGINT", "INTEGER")];

/// A migration's DDL with SQLite's type names. The result is byte for byte the SQLite
/// text that databases created before the migrations were shared recorded (refinery
/// checks each applied migration's checksum).
fn sqlite_schema(postgres: &str) -> String {
    let mut sqlite = String::with_capacity(postgres.len());
    let mut rest = postgres;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphanumeric() || c == '_') {
        sqlite.push_str(&rest[..start]);
        rest = &rest[start..];
        let end =
            rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        let word = &rest[..end];
        let mapped = SQLITE_TYPES
            .iter()
            .find(|(postgres_type, _)| *postgres_type == word)
            .map_or(word, |(_, sqlite_type)| sqlite_type);
        sqlite.push_str(mapped);
        rest = &rest[end..];
    }
    sqlite.push_str(rest);
    sqlite
}

fn migration_runner(dialect: fn(&str) -> String) -> anyhow::Result<refinery::Runner> {
    migrations_runner(dialect, MIGRATIONS.len())
}

/// A runner of the first `count` migrations only: what an older release applied.
fn migrations_runner(
    dialect: fn(&str) -> String, count: usize,
) -> anyhow::Result<refinery::Runner> {
    let migrations = MIGRATIONS
        .iter()
        .take(count)
        .map(|(name, sql)| refinery::Migration::unapplied(name, &dialect(sql)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(refinery::Runner::new(&migrations))
}

/// Prepared statements SQLite keeps: more than the store has, so none is prepared twice.
const SQLITE_STATEMENT_CACHE: usize = 128;

/// PostgreSQL's row-lock clause. SQLite has no row locks, and needs none: its one
/// connection runs each statement alone.
const POSTGRES_ROW_LOCK: &str = " FOR UPDATE SKIP LOCKED";

/// One SQL statement, written in PostgreSQL's dialect (`$N` placeholders), with its
/// SQLite spelling (`?N`, no row locks) derived once. Made with the `sql!` macro.
pub struct Statement {
    postgres: String,
    sqlite: String,
}

impl Statement {
    pub fn new(postgres: String) -> Self {
        let sqlite = postgres.replace(POSTGRES_ROW_LOCK, "").replace('$', "?");
        Self { postgres, sqlite }
    }
}

/// A statement built once per call site, on first use: `sql!("SELECT … {COLUMNS} …")`.
macro_rules! sql {
    ($($format:tt)+) => {{
        static STATEMENT: std::sync::LazyLock<$crate::store::database::Statement> =
            std::sync::LazyLock::new(|| $crate::store::database::Statement::new(format!($($format)+)));
        &*STATEMENT
    }};
}
pub(crate) use sql;

/// A statement parameter, owned so that SQLite's blocking thread can take it.
#[derive(Clone, Debug)]
pub enum Value {
    Null,
    Text(String),
    Int(i64),
    Bool(bool),
    Time(DateTime<Utc>),
    Bytes(Vec<u8>),
}

/// Anything that can be a statement parameter; see the `params!` macro.
pub trait ToValue {
    fn to_value(&self) -> Value;
}

impl ToValue for str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_owned())
    }
}

impl ToValue for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
}

impl ToValue for i64 {
    fn to_value(&self) -> Value {
        Value::Int(*self)
    }
}

impl ToValue for u32 {
    fn to_value(&self) -> Value {
        Value::Int(i64::from(*self))
    }
}

impl ToValue for bool {
    fn to_value(&self) -> Value {
        Value::Bool(*self)
    }
}

impl ToValue for DateTime<Utc> {
    fn to_value(&self) -> Value {
        Value::Time(*self)
    }
}

impl ToValue for Vec<u8> {
    fn to_value(&self) -> Value {
        Value::Bytes(self.clone())
    }
}

impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> Value {
        (**self).to_value()
    }
}

impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToValue::to_value)
    }
}

/// `params![a, b, …]`: the statement's parameters `$1, $2, …`, in order.
macro_rules! params {
    ($($value:expr),* $(,)?) => {
        vec![$($crate::store::database::ToValue::to_value(&$value)),*]
    };
}
pub(crate) use params;

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        match self {
            Self::Null => Ok(rusqlite::types::Null.into()),
            Self::Text(text) => text.to_sql(),
            Self::Int(int) => int.to_sql(),
            Self::Bool(flag) => flag.to_sql(),
            // rusqlite's own text form, which is what the existing databases hold.
            Self::Time(time) => time.to_sql(),
            Self::Bytes(bytes) => bytes.to_sql(),
        }
    }
}

impl tokio_postgres::types::ToSql for Value {
    fn to_sql(
        &self, ty: &Type, out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        // Checked: a value of the wrong type for its column is an error, not bad bytes.
        match self {
            Self::Null => Ok(IsNull::Yes),
            Self::Text(text) => text.to_sql_checked(ty, out),
            Self::Int(int) => int.to_sql_checked(ty, out),
            Self::Bool(flag) => flag.to_sql_checked(ty, out),
            Self::Time(time) => time.to_sql_checked(ty, out),
            Self::Bytes(bytes) => bytes.to_sql_checked(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// A column type both drivers can read.
pub trait Column: rusqlite::types::FromSql + for<'a> tokio_postgres::types::FromSql<'a> {}

impl<T> Column for T where T: rusqlite::types::FromSql + for<'a> tokio_postgres::types::FromSql<'a> {}

/// A result row of either backend.
pub enum Row<'a> {
    Sqlite(&'a rusqlite::Row<'a>),
    Postgres(&'a tokio_postgres::Row),
}

/// `Ok($record { first: row.get(0)?, second: row.get(1)?, … })`: a record whose fields
/// are the row's columns, in the order of its query's column list.
macro_rules! record_of_row {
    ($row:expr, $record:ident { $($field:ident),+ $(,)? }) => {{
        let row = $row;
        let mut column = 0;
        let mut next = || {
            column += 1;
            column - 1
        };
        Ok($record { $($field: row.get(next())?),+ })
    }};
}
pub(crate) use record_of_row;

impl Row<'_> {
    pub fn get<T: Column>(&self, index: usize) -> StoreResult<T> {
        match self {
            Self::Sqlite(row) => row.get(index).map_err(sqlite_error),
            Self::Postgres(row) => row.try_get(index).map_err(postgres_error),
        }
    }

    /// A TEXT column holding JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self, index: usize) -> StoreResult<T> {
        let text: String = self.get(index)?;
        serde_json::from_str(&text)
            .map_err(|error| StoreError::Backend(format!("column {index} is not JSON: {error}")))
    }
}

/// How a row becomes a record.
pub type Mapper<T> = fn(&Row<'_>) -> StoreResult<T>;

pub enum Database {
    /// One connection, used from blocking threads.
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    /// The pool, and how to open a connection of its own (listening for notifications).
    Postgres(Pool, Box<tokio_postgres::Config>),
}

/// Test support for upgrades: leaves the database at `database_url` (SQLite when not
/// PostgreSQL's) as a release that knew only the first `migrations` migrations would,
/// holding what `statements` (PostgreSQL's dialect, that release's schema) wrote.
pub async fn build_old_database(
    database_url: &str, migrations: usize, statements: &str,
) -> anyhow::Result<()> {
    if database_url.starts_with("postgres://") || database_url.starts_with("postgresql://") {
        let (mut client, connection) = tokio_postgres::connect(database_url, NoTls).await?;
        let driver = tokio::spawn(connection);
        migrations_runner(str::to_owned, migrations)?.run_async(&mut client).await?;
        client.batch_execute(statements).await?;
        drop(client);
        let _ = driver.await;
        return Ok(());
    }
    let path = database_url.strip_prefix("sqlite://").unwrap_or(database_url).to_owned();
    let statements = sqlite_schema(statements);
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut connection = rusqlite::Connection::open(&path)?;
        migrations_runner(sqlite_schema, migrations)?.run(&mut connection)?;
        connection.execute_batch(&statements)?;
        Ok(())
    })
    .await?
}

impl Database {
    /// Opens (creating if needed) the SQLite file and applies pending migrations.
    pub async fn open_sqlite(path: &Path) -> anyhow::Result<Self> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let path = path.to_owned();
        let connection = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let mut connection = rusqlite::Connection::open(&path)?;
            connection.pragma_update(None, "journal_mode", "WAL")?;
            // With WAL, NORMAL never corrupts the database; only a power loss (not a
            // crash of this process) can lose the last commits. Spares an fsync per write.
            connection.pragma_update(None, "synchronous", "NORMAL")?;
            connection.pragma_update(None, "foreign_keys", "ON")?;
            connection.busy_timeout(std::time::Duration::from_secs(5))?;
            connection.set_prepared_statement_cache_capacity(SQLITE_STATEMENT_CACHE);
            migration_runner(sqlite_schema)?.run(&mut connection)?;
            Ok(connection)
        })
        .await??;
        Ok(Self::Sqlite(Arc::new(Mutex::new(connection))))
    }

    /// Connects to PostgreSQL and applies pending migrations.
    pub async fn connect_postgres(url: &str) -> anyhow::Result<Self> {
        let mut config = tokio_postgres::Config::from_str(url)?;
        // A connection whose peer vanished (a failover, a half-open link) is noticed
        // within a minute: the LISTEN connection carries replicas' signals.
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(20))
            .keepalives_interval(Duration::from_secs(10))
            .keepalives_retries(3);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        {
            // Migrations run on a connection of their own, before the pool hands any out.
            let (mut client, connection) = config
                .connect(NoTls)
                .await
                .map_err(|error| anyhow::anyhow!("connecting to PostgreSQL failed: {error:?}"))?;
            let driver = tokio::spawn(connection);
            migration_runner(str::to_owned)?.run_async(&mut client).await?;
            drop(client);
            let _ = driver.await;
        }
        let pool = super::postgres_pool::open(&config)?;
        Ok(Self::Postgres(pool, Box::new(config)))
    }

    /// Holds the database-wide lock named `key` until the returned guard is released or
    /// dropped, waiting (at most `wait`) for another holder, of any process, to let it go
    /// first. SQLite's file serves one process, which serializes its own callers: no lock
    /// is taken there.
    pub async fn exclusive(&self, key: &str, wait: Duration) -> StoreResult<ExclusiveLock> {
        let Self::Postgres(pool, _) = self else {
            return Ok(ExclusiveLock { client: None });
        };
        let client = pool.get().await.map_err(pool_error)?;
        let digest = <sha2::Sha256 as sha2::Digest>::digest(key.as_bytes());
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        let id = i64::from_be_bytes(id);
        // Tried, not waited for on the server: a caller that gives up leaves no request
        // behind that could take the lock later.
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let taken: bool = client
                .query_one("SELECT pg_try_advisory_lock($1)", &[&id])
                .await
                .map_err(postgres_error)?
                .try_get(0)
                .map_err(postgres_error)?;
            if taken {
                return Ok(ExclusiveLock { client: Some(client) });
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Busy(format!(
                    "{key} stayed locked by another replica for {wait:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The database's clock: leases are timed by it, whatever the replicas' clocks say.
    pub async fn now(&self) -> StoreResult<DateTime<Utc>> {
        let Self::Postgres(pool, _) = self else {
            return Ok(Utc::now());
        };
        let client = pool.get().await.map_err(pool_error)?;
        client
            .query_one("SELECT now()", &[])
            .await
            .map_err(postgres_error)?
            .try_get(0)
            .map_err(postgres_error)
    }

    /// Sends `payload` to every listener of `channel` (every replica's, this one's too).
    /// SQLite's file serves one process: nothing to send there.
    pub async fn notify(&self, channel: &str, payload: &str) -> StoreResult<()> {
        let Self::Postgres(pool, _) = self else {
            return Ok(());
        };
        let client = pool.get().await.map_err(pool_error)?;
        client
            .execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
            .await
            .map_err(postgres_error)?;
        Ok(())
    }

    /// The payloads sent to `channel` from now on, by any replica; `None` for SQLite. A
    /// lost connection is opened again (what was sent meanwhile is lost).
    pub fn listen(&self, channel: &str) -> Option<mpsc::UnboundedReceiver<String>> {
        let Self::Postgres(_, config) = self else {
            return None;
        };
        let (payloads, received) = mpsc::unbounded_channel();
        let (config, listen) = ((**config).clone(), format!("LISTEN \"{channel}\""));
        tokio::spawn(async move {
            while !payloads.is_closed() {
                match config.connect(NoTls).await {
                    Ok((client, connection)) => {
                        forward_notifications(&client, connection, &listen, &payloads).await;
                    }
                    Err(error) => {
                        tracing::warn!(error = ?error, "could not listen for other replicas' notices")
                    }
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
        Some(received)
    }

    /// Runs a statement; returns how many rows it changed.
    pub async fn execute(
        &self, statement: &'static Statement, params: Vec<Value>,
    ) -> StoreResult<u64> {
        super::statements::sent();
        match self {
            Self::Sqlite(connection) => {
                sqlite_call(connection, statement, move |prepared| {
                    let changed = prepared
                        .execute(rusqlite::params_from_iter(params.iter()))
                        .map_err(sqlite_error)?;
                    Ok(changed as u64)
                })
                .await
            }
            Self::Postgres(pool, _) => {
                let (client, prepared) = postgres_prepared(pool, statement).await?;
                client.execute(&prepared, &postgres_params(&params)).await.map_err(postgres_error)
            }
        }
    }

    /// Runs a query; maps every row.
    pub async fn query<T: Send + 'static>(
        &self, statement: &'static Statement, params: Vec<Value>, map: Mapper<T>,
    ) -> StoreResult<Vec<T>> {
        super::statements::sent();
        match self {
            Self::Sqlite(connection) => {
                sqlite_call(connection, statement, move |prepared| {
                    let mut rows = prepared
                        .query(rusqlite::params_from_iter(params.iter()))
                        .map_err(sqlite_error)?;
                    let mut records = Vec::new();
                    while let Some(row) = rows.next().map_err(sqlite_error)? {
                        records.push(map(&Row::Sqlite(row))?);
                    }
                    Ok(records)
                })
                .await
            }
            Self::Postgres(pool, _) => {
                let (client, prepared) = postgres_prepared(pool, statement).await?;
                let rows = client
                    .query(&prepared, &postgres_params(&params))
                    .await
                    .map_err(postgres_error)?;
                rows.iter().map(|row| map(&Row::Postgres(row))).collect()
            }
        }
    }

    /// Runs a query that answers at most one row.
    pub async fn query_opt<T: Send + 'static>(
        &self, statement: &'static Statement, params: Vec<Value>, map: Mapper<T>,
    ) -> StoreResult<Option<T>> {
        let mut records = self.query(statement, params, map).await?;
        if records.len() > 1 {
            return Err(StoreError::Backend(format!(
                "a statement meant to answer one row answered {}",
                records.len()
            )));
        }
        Ok(records.pop())
    }

    /// Runs a query that answers exactly one row.
    pub async fn query_one<T: Send + 'static>(
        &self, statement: &'static Statement, params: Vec<Value>, map: Mapper<T>,
    ) -> StoreResult<T> {
        self.query_opt(statement, params, map).await?.ok_or_else(|| {
            StoreError::Backend("a statement meant to answer one row answered none".into())
        })
    }
}

/// Runs `work` with the statement prepared on SQLite's connection, on a blocking thread.
async fn sqlite_call<T: Send + 'static>(
    connection: &Arc<Mutex<rusqlite::Connection>>, statement: &'static Statement,
    work: impl FnOnce(&mut rusqlite::CachedStatement<'_>) -> StoreResult<T> + Send + 'static,
) -> StoreResult<T> {
    let connection = connection.clone();
    tokio::task::spawn_blocking(move || {
        let connection = connection
            .lock()
            .map_err(|_| StoreError::Backend("SQLite connection lock poisoned".into()))?;
        let mut prepared = connection.prepare_cached(&statement.sqlite).map_err(sqlite_error)?;
        work(&mut prepared)
    })
    .await
    .map_err(|error| StoreError::Backend(error.to_string()))?
}

/// A pooled PostgreSQL connection with the statement prepared on it.
async fn postgres_prepared(
    pool: &Pool, statement: &'static Statement,
) -> StoreResult<(deadpool_postgres::Object, tokio_postgres::Statement)> {
    let client = pool.get().await.map_err(pool_error)?;
    let prepared = client.prepare_cached(&statement.postgres).await.map_err(postgres_error)?;
    Ok((client, prepared))
}

/// Listens on one connection until it is lost (or nobody receives any more).
async fn forward_notifications<S, T>(
    client: &tokio_postgres::Client, mut connection: tokio_postgres::Connection<S, T>,
    listen: &str, payloads: &mpsc::UnboundedSender<String>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Polling for messages is what drives the connection, the LISTEN below included.
    let (messages, mut received) = mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut stream = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = futures::StreamExt::next(&mut stream).await {
            if let tokio_postgres::AsyncMessage::Notification(notice) = message
                && messages.send(notice.payload().to_owned()).is_err()
            {
                break;
            }
        }
    });
    match client.batch_execute(listen).await {
        Ok(()) => {
            while let Some(payload) = received.recv().await {
                if payloads.send(payload).is_err() {
                    break;
                }
            }
        }
        Err(error) => tracing::warn!(error = ?error, "LISTEN failed"),
    }
    driver.abort();
}

fn pool_error(error: deadpool_postgres::PoolError) -> StoreError {
    StoreError::Backend(format!("PostgreSQL pool: {error:?}"))
}

fn postgres_params(params: &[Value]) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
    params.iter().map(|value| value as &(dyn tokio_postgres::types::ToSql + Sync)).collect()
}

fn sqlite_error(error: rusqlite::Error) -> StoreError {
    match &error {
        // Only uniqueness is a conflict; other constraint failures are bugs, as on PostgreSQL.
        rusqlite::Error::SqliteFailure(failure, _)
            if failure.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                || failure.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY =>
        {
            StoreError::Conflict(error.to_string())
        }
        _ => StoreError::Backend(error.to_string()),
    }
}

/// A lock of [`Database::exclusive`]. Release it with [`ExclusiveLock::release`]; a
/// guard merely dropped (its task cancelled) takes its connection out of the pool and
/// closes it, and the server releases the lock when that session ends.
#[must_use = "the lock is released when this is dropped"]
pub struct ExclusiveLock {
    client: Option<deadpool_postgres::Object>,
}

impl ExclusiveLock {
    pub async fn release(mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if client.execute("SELECT pg_advisory_unlock_all()", &[]).await.is_err() {
            // Not back to the pool with a lock still held.
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

impl Drop for ExclusiveLock {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

fn postgres_error(error: tokio_postgres::Error) -> StoreError {
    if error.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
        return StoreError::Conflict(format!("{error:?}"));
    }
    // tokio-postgres' Display says only "db error"; Debug carries the server's message.
    StoreError::Backend(format!("{error:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_schema_renames_whole_type_names_only() {
        assert_eq!(
            sqlite_schema("created_at TIMESTAMPTZ NOT NULL,\n  big BIGINT, BIGINTS bytea_x BYTEA)"),
            "created_at TEXT NOT NULL,\n  big INTEGER, BIGINTS bytea_x BLOB)"
        );
    }
}
