//! The embedded default: one SQLite file, one connection used from blocking threads.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{
    AUTH_CONNECTION_COLUMNS, AgentLocation, ApiKeyRecord, AuthConnectionRecord, EXTENSION_COLUMNS,
    ExtensionRecord, Organization, PROFILE_COLUMNS, PROXY_COLUMNS, PoolLease, PoolRecord,
    ProfileRecord, ProxyCheck, ProxyRecord, REPLAY_COLUMNS, ReplayOutcome, ReplayRecord,
    ReplayStatus, SESSION_COLUMNS, SessionFilter, SessionProfile, SessionRecord, SessionStatus,
    Store, StoreError, StoreResult,
};

mod embedded {
    refinery::embed_migrations!("migrations/sqlite");
}

pub struct SqliteStore {
    connection: Arc<Mutex<Connection>>,
}

impl SqliteStore {
    pub async fn open(path: &Path) -> anyhow::Result<Self> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let path = path.to_owned();
        let connection = tokio::task::spawn_blocking(move || -> anyhow::Result<Connection> {
            let mut connection = Connection::open(&path)?;
            connection.pragma_update(None, "journal_mode", "WAL")?;
            // With WAL, NORMAL never corrupts the database; only a power loss (not a
            // crash of this process) can lose the last commits. Spares an fsync per write.
            connection.pragma_update(None, "synchronous", "NORMAL")?;
            connection.pragma_update(None, "foreign_keys", "ON")?;
            connection.busy_timeout(std::time::Duration::from_secs(5))?;
            embedded::migrations::runner().run(&mut connection)?;
            Ok(connection)
        })
        .await??;
        Ok(Self {
            connection: Arc::new(Mutex::new(connection)),
        })
    }

    async fn call<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> StoreResult<T> {
        let connection = self.connection.clone();
        tokio::task::spawn_blocking(move || {
            let mut connection = connection
                .lock()
                .map_err(|_| StoreError::Backend("SQLite connection lock poisoned".into()))?;
            work(&mut connection).map_err(map_error)
        })
        .await
        .map_err(|error| StoreError::Backend(error.to_string()))?
    }
}

fn map_error(error: rusqlite::Error) -> StoreError {
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

fn extension_from_row(row: &Row<'_>) -> rusqlite::Result<ExtensionRecord> {
    Ok(ExtensionRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        name: row.get(2)?,
        size_bytes: row.get(3)?,
        blob_key: row.get(4)?,
        created_at: row.get(5)?,
        last_used_at: row.get(6)?,
    })
}

fn replay_from_row(row: &Row<'_>) -> rusqlite::Result<ReplayRecord> {
    let status: String = row.get(5)?;
    let status = ReplayStatus::parse(&status).map_err(|error| {
        rusqlite::Error::FromSqlConversionFailure(5, rusqlite::types::Type::Text, error.into())
    })?;
    Ok(ReplayRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        session_id: row.get(2)?,
        framerate: row.get(3)?,
        max_duration_seconds: row.get(4)?,
        status,
        started_at: row.get(6)?,
        finished_at: row.get(7)?,
        size_bytes: row.get(8)?,
        blob_key: row.get(9)?,
        failure: row.get(10)?,
    })
}

fn session_from_row(row: &Row<'_>) -> rusqlite::Result<SessionRecord> {
    let status: String = row.get(10)?;
    let status = SessionStatus::parse(&status).map_err(|error| {
        rusqlite::Error::FromSqlConversionFailure(10, rusqlite::types::Type::Text, error.into())
    })?;
    let endpoint: Option<String> = row.get(14)?;
    let agent = match endpoint {
        Some(endpoint) => Some(AgentLocation {
            endpoint,
            secret: row.get::<_, Option<String>>(15)?.unwrap_or_default(),
            pid: row.get(16)?,
            vm_root: row.get::<_, Option<String>>(17)?.unwrap_or_default(),
        }),
        None => None,
    };
    Ok(SessionRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        persistent_id: row.get(2)?,
        headless: row.get(3)?,
        stealth: row.get(4)?,
        kiosk_mode: row.get(5)?,
        timeout_seconds: row.get(6)?,
        viewport_width: row.get(7)?,
        viewport_height: row.get(8)?,
        viewport_refresh_rate: row.get(9)?,
        status,
        created_at: row.get(11)?,
        ended_at: row.get(12)?,
        end_reason: row.get(13)?,
        agent,
        proxy_id: row.get(18)?,
        pool_id: row.get(19)?,
        pool_lease: row
            .get::<_, Option<String>>(20)?
            .map(|lease| PoolLease::parse(&lease))
            .transpose()
            .map_err(|error| {
                rusqlite::Error::FromSqlConversionFailure(
                    20,
                    rusqlite::types::Type::Text,
                    error.into(),
                )
            })?,
        profile: match row.get::<_, Option<String>>(21)? {
            Some(id) => Some(SessionProfile {
                id,
                save_changes: row.get::<_, Option<bool>>(22)?.unwrap_or(false),
            }),
            None => None,
        },
    })
}

fn profile_from_row(row: &Row<'_>) -> rusqlite::Result<ProfileRecord> {
    Ok(ProfileRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        name: row.get(2)?,
        created_at: row.get(3)?,
        updated_at: row.get(4)?,
        last_used_at: row.get(5)?,
        size_bytes: row.get(6)?,
    })
}

fn auth_connection_from_row(row: &Row<'_>) -> rusqlite::Result<AuthConnectionRecord> {
    Ok(AuthConnectionRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        domain: row.get(2)?,
        profile_name: row.get(3)?,
        created_at: row.get(4)?,
        document: row.get(5)?,
        credentials: row.get(6)?,
    })
}

fn json_column<T: serde::de::DeserializeOwned>(row: &Row<'_>, index: usize) -> rusqlite::Result<T> {
    let text: String = row.get(index)?;
    serde_json::from_str(&text).map_err(|error| {
        rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Text, error.into())
    })
}

const POOL_COLUMNS: &str = "id, org_id, name, size, config, created_at";

fn pool_from_row(row: &Row<'_>) -> rusqlite::Result<PoolRecord> {
    Ok(PoolRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        name: row.get(2)?,
        size: row.get(3)?,
        config: json_column(row, 4)?,
        created_at: row.get(5)?,
    })
}

fn proxy_from_row(row: &Row<'_>) -> rusqlite::Result<ProxyRecord> {
    Ok(ProxyRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        name: row.get(2)?,
        kind: row.get(3)?,
        protocol: row.get(4)?,
        bypass_hosts: json_column(row, 5)?,
        config: json_column(row, 6)?,
        status: row.get(7)?,
        last_checked: row.get(8)?,
        ip_address: row.get(9)?,
        check_error: row.get(10)?,
        created_at: row.get(11)?,
    })
}

#[async_trait]
impl Store for SqliteStore {
    async fn ensure_organization(&self, name: &str) -> StoreResult<Organization> {
        let name = name.to_owned();
        self.call(move |connection| {
            connection.execute(
                "INSERT INTO organizations (id, name, created_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (name) DO NOTHING",
                params![crate::ids::new_id("org"), name, Utc::now()],
            )?;
            connection.query_row(
                "SELECT id, name, created_at FROM organizations WHERE name = ?1",
                params![name],
                |row| {
                    Ok(Organization {
                        id: row.get(0)?,
                        name: row.get(1)?,
                        created_at: row.get(2)?,
                    })
                },
            )
        })
        .await
    }

    async fn insert_api_key(&self, key: &ApiKeyRecord) -> StoreResult<()> {
        let key = key.clone();
        self.call(move |connection| {
            connection.execute(
                "INSERT INTO api_keys (id, org_id, secret_hash, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![key.id, key.org_id, key.secret_hash, key.created_at],
            )?;
            Ok(())
        })
        .await
    }

    async fn api_key(&self, id: &str) -> StoreResult<Option<ApiKeyRecord>> {
        let id = id.to_owned();
        self.call(move |connection| {
            connection
                .query_row(
                    "SELECT id, org_id, secret_hash, created_at FROM api_keys WHERE id = ?1",
                    params![id],
                    |row| {
                        Ok(ApiKeyRecord {
                            id: row.get(0)?,
                            org_id: row.get(1)?,
                            secret_hash: row.get(2)?,
                            created_at: row.get(3)?,
                        })
                    },
                )
                .optional()
        })
        .await
    }

    async fn api_key_count(&self) -> StoreResult<u64> {
        self.call(|connection| {
            connection.query_row("SELECT COUNT(*) FROM api_keys", [], |row| {
                row.get::<_, i64>(0)
            })
        })
        .await
        .map(|count| count as u64)
    }

    async fn setting_or_insert(&self, key: &str, value: &str) -> StoreResult<String> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.call(move |connection| {
            connection.execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
                params![key, value],
            )?;
            connection.query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![key],
                |row| row.get(0),
            )
        })
        .await
    }

    async fn insert_session(&self, session: &SessionRecord) -> StoreResult<()> {
        let s = session.clone();
        self.call(move |connection| {
            let agent = s.agent.as_ref();
            connection.execute(
                &format!(
                    "INSERT INTO browser_sessions ({SESSION_COLUMNS}) VALUES \
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, \
                 ?19, ?20, ?21, ?22, ?23)"
                ),
                params![
                    s.id,
                    s.org_id,
                    s.persistent_id,
                    s.headless,
                    s.stealth,
                    s.kiosk_mode,
                    s.timeout_seconds,
                    s.viewport_width,
                    s.viewport_height,
                    s.viewport_refresh_rate,
                    s.status.as_str(),
                    s.created_at,
                    s.ended_at,
                    s.end_reason,
                    agent.map(|a| a.endpoint.clone()),
                    agent.map(|a| a.secret.clone()),
                    agent.and_then(|a| a.pid),
                    agent.map(|a| a.vm_root.clone()),
                    s.proxy_id,
                    s.pool_id,
                    s.pool_lease.map(PoolLease::as_str),
                    s.profile.as_ref().map(|p| p.id.clone()),
                    s.profile.as_ref().map(|p| p.save_changes),
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn session(&self, org_id: &str, id: &str) -> StoreResult<Option<SessionRecord>> {
        let (org_id, id) = (org_id.to_owned(), id.to_owned());
        self.call(move |connection| {
            connection
                .query_row(
                    &format!(
                        "SELECT {SESSION_COLUMNS} FROM browser_sessions WHERE org_id = ?1 AND id = ?2"
                    ),
                    params![org_id, id],
                    session_from_row,
                )
                .optional()
        })
        .await
    }

    async fn live_session_by_persistent_id(
        &self,
        org_id: &str,
        persistent_id: &str,
    ) -> StoreResult<Option<SessionRecord>> {
        let (org_id, persistent_id) = (org_id.to_owned(), persistent_id.to_owned());
        self.call(move |connection| {
            connection
                .query_row(
                    &format!(
                        "SELECT {SESSION_COLUMNS} FROM browser_sessions \
                         WHERE org_id = ?1 AND persistent_id = ?2 AND status <> 'ended'"
                    ),
                    params![org_id, persistent_id],
                    session_from_row,
                )
                .optional()
        })
        .await
    }

    async fn list_sessions(
        &self,
        org_id: &str,
        filter: SessionFilter,
        limit: u32,
        offset: u32,
    ) -> StoreResult<Vec<SessionRecord>> {
        let org_id = org_id.to_owned();
        let condition = filter.sql_condition();
        self.call(move |connection| {
            let mut statement = connection.prepare(&format!(
                "SELECT {SESSION_COLUMNS} FROM browser_sessions WHERE org_id = ?1 {condition} \
                 ORDER BY created_at DESC, id DESC LIMIT ?2 OFFSET ?3"
            ))?;
            let rows = statement.query_map(params![org_id, limit, offset], session_from_row)?;
            rows.collect()
        })
        .await
    }

    async fn live_sessions(&self) -> StoreResult<Vec<SessionRecord>> {
        self.call(|connection| {
            let mut statement = connection.prepare(&format!(
                "SELECT {SESSION_COLUMNS} FROM browser_sessions WHERE status <> 'ended' \
                 ORDER BY created_at"
            ))?;
            let rows = statement.query_map([], session_from_row)?;
            rows.collect()
        })
        .await
    }

    async fn set_session_running(&self, id: &str, agent: &AgentLocation) -> StoreResult<bool> {
        let (id, agent) = (id.to_owned(), agent.clone());
        self.call(move |connection| {
            let changed = connection.execute(
                "UPDATE browser_sessions SET status = 'running', agent_endpoint = ?2, \
                 agent_secret = ?3, agent_pid = ?4, vm_root = ?5 \
                 WHERE id = ?1 AND status <> 'ended'",
                params![id, agent.endpoint, agent.secret, agent.pid, agent.vm_root],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    async fn end_session(&self, id: &str, at: DateTime<Utc>, reason: &str) -> StoreResult<bool> {
        let (id, reason) = (id.to_owned(), reason.to_owned());
        self.call(move |connection| {
            let changed = connection.execute(
                "UPDATE browser_sessions SET status = 'ended', ended_at = ?2, end_reason = ?3 \
                 WHERE id = ?1 AND status <> 'ended'",
                params![id, at, reason],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    async fn insert_extension(&self, e: &ExtensionRecord) -> StoreResult<()> {
        let e = e.clone();
        self.call(move |connection| {
            connection.execute(
                &format!("INSERT INTO extensions ({EXTENSION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                params![e.id, e.org_id, e.name, e.size_bytes, e.blob_key, e.created_at, e.last_used_at],
            )?;
            Ok(())
        })
        .await
    }

    async fn extension(
        &self,
        org_id: &str,
        id_or_name: &str,
    ) -> StoreResult<Option<ExtensionRecord>> {
        let (org_id, key) = (org_id.to_owned(), id_or_name.to_owned());
        self.call(move |connection| {
            let by = |column: &str| {
                connection
                    .query_row(
                        &format!("SELECT {EXTENSION_COLUMNS} FROM extensions WHERE org_id = ?1 AND {column} = ?2"),
                        params![org_id, key],
                        extension_from_row,
                    )
                    .optional()
            };
            match by("id")? {
                Some(found) => Ok(Some(found)),
                None => by("name"),
            }
        })
        .await
    }

    async fn list_extensions(&self, org_id: &str) -> StoreResult<Vec<ExtensionRecord>> {
        let org_id = org_id.to_owned();
        self.call(move |connection| {
            let mut statement = connection.prepare(&format!(
                "SELECT {EXTENSION_COLUMNS} FROM extensions WHERE org_id = ?1 ORDER BY created_at, id"
            ))?;
            let rows = statement.query_map(params![org_id], extension_from_row)?;
            rows.collect()
        })
        .await
    }

    async fn delete_extension(&self, org_id: &str, id: &str) -> StoreResult<bool> {
        let (org_id, id) = (org_id.to_owned(), id.to_owned());
        self.call(move |connection| {
            let deleted = connection.execute(
                "DELETE FROM extensions WHERE org_id = ?1 AND id = ?2",
                params![org_id, id],
            )?;
            Ok(deleted == 1)
        })
        .await
    }

    async fn mark_extensions_used(&self, ids: &[String], at: DateTime<Utc>) -> StoreResult<()> {
        let ids = ids.to_vec();
        self.call(move |connection| {
            let transaction = connection.transaction()?;
            for id in &ids {
                transaction.execute(
                    "UPDATE extensions SET last_used_at = ?2 WHERE id = ?1",
                    params![id, at],
                )?;
            }
            transaction.commit()
        })
        .await
    }

    async fn insert_profile(&self, p: &ProfileRecord) -> StoreResult<()> {
        let p = p.clone();
        self.call(move |connection| {
            connection.execute(
                &format!(
                    "INSERT INTO profiles ({PROFILE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
                ),
                params![
                    p.id,
                    p.org_id,
                    p.name,
                    p.created_at,
                    p.updated_at,
                    p.last_used_at,
                    p.size_bytes
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn profile(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<ProfileRecord>> {
        let (org_id, key) = (org_id.to_owned(), id_or_name.to_owned());
        self.call(move |connection| {
            let by = |column: &str| {
                connection
                    .query_row(
                        &format!("SELECT {PROFILE_COLUMNS} FROM profiles WHERE org_id = ?1 AND {column} = ?2"),
                        params![org_id, key],
                        profile_from_row,
                    )
                    .optional()
            };
            match by("id")? {
                Some(found) => Ok(Some(found)),
                None => by("name"),
            }
        })
        .await
    }

    async fn list_profiles(&self, org_id: &str) -> StoreResult<Vec<ProfileRecord>> {
        let org_id = org_id.to_owned();
        self.call(move |connection| {
            let mut statement = connection.prepare(&format!(
                "SELECT {PROFILE_COLUMNS} FROM profiles WHERE org_id = ?1 ORDER BY created_at, id"
            ))?;
            let rows = statement.query_map(params![org_id], profile_from_row)?;
            rows.collect()
        })
        .await
    }

    async fn delete_profile(&self, org_id: &str, id: &str) -> StoreResult<bool> {
        let (org_id, id) = (org_id.to_owned(), id.to_owned());
        self.call(move |connection| {
            let deleted = connection.execute(
                "DELETE FROM profiles WHERE org_id = ?1 AND id = ?2",
                params![org_id, id],
            )?;
            Ok(deleted == 1)
        })
        .await
    }

    async fn profile_saved(
        &self,
        id: &str,
        at: DateTime<Utc>,
        size_bytes: i64,
    ) -> StoreResult<bool> {
        let id = id.to_owned();
        self.call(move |connection| {
            let updated = connection.execute(
                "UPDATE profiles SET updated_at = ?2, size_bytes = ?3 WHERE id = ?1",
                params![id, at, size_bytes],
            )?;
            Ok(updated == 1)
        })
        .await
    }

    async fn mark_profile_used(&self, id: &str, at: DateTime<Utc>) -> StoreResult<()> {
        let id = id.to_owned();
        self.call(move |connection| {
            connection.execute(
                "UPDATE profiles SET last_used_at = ?2 WHERE id = ?1",
                params![id, at],
            )?;
            Ok(())
        })
        .await
    }

    async fn insert_auth_connection(&self, c: &AuthConnectionRecord) -> StoreResult<()> {
        let c = c.clone();
        self.call(move |connection| {
            connection.execute(
                &format!("INSERT INTO auth_connections ({AUTH_CONNECTION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                params![c.id, c.org_id, c.domain, c.profile_name, c.created_at, c.document, c.credentials],
            )?;
            Ok(())
        })
        .await
    }

    async fn auth_connection(
        &self,
        org_id: &str,
        id: &str,
    ) -> StoreResult<Option<AuthConnectionRecord>> {
        let (org_id, id) = (org_id.to_owned(), id.to_owned());
        self.call(move |connection| {
            connection
                .query_row(
                    &format!("SELECT {AUTH_CONNECTION_COLUMNS} FROM auth_connections WHERE org_id = ?1 AND id = ?2"),
                    params![org_id, id],
                    auth_connection_from_row,
                )
                .optional()
        })
        .await
    }

    async fn list_auth_connections(
        &self,
        org_id: Option<&str>,
    ) -> StoreResult<Vec<AuthConnectionRecord>> {
        let org_id = org_id.map(str::to_owned);
        self.call(move |connection| {
            let mut statement = connection.prepare(&format!(
                "SELECT {AUTH_CONNECTION_COLUMNS} FROM auth_connections \
                 WHERE ?1 IS NULL OR org_id = ?1 ORDER BY created_at, id"
            ))?;
            let rows = statement.query_map(params![org_id], auth_connection_from_row)?;
            rows.collect()
        })
        .await
    }

    async fn update_auth_connection(&self, c: &AuthConnectionRecord) -> StoreResult<bool> {
        let c = c.clone();
        self.call(move |connection| {
            let updated = connection.execute(
                "UPDATE auth_connections SET document = ?2, credentials = ?3 WHERE id = ?1",
                params![c.id, c.document, c.credentials],
            )?;
            Ok(updated == 1)
        })
        .await
    }

    async fn delete_auth_connection(&self, org_id: &str, id: &str) -> StoreResult<bool> {
        let (org_id, id) = (org_id.to_owned(), id.to_owned());
        self.call(move |connection| {
            let deleted = connection.execute(
                "DELETE FROM auth_connections WHERE org_id = ?1 AND id = ?2",
                params![org_id, id],
            )?;
            Ok(deleted == 1)
        })
        .await
    }

    async fn insert_replay(&self, r: &ReplayRecord) -> StoreResult<()> {
        let r = r.clone();
        self.call(move |connection| {
            connection.execute(
                &format!("INSERT INTO replays ({REPLAY_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"),
                params![
                    r.id, r.org_id, r.session_id, r.framerate, r.max_duration_seconds,
                    r.status.as_str(), r.started_at, r.finished_at, r.size_bytes, r.blob_key, r.failure
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn replay(
        &self,
        org_id: &str,
        session_id: &str,
        id: &str,
    ) -> StoreResult<Option<ReplayRecord>> {
        let (org_id, session_id, id) = (org_id.to_owned(), session_id.to_owned(), id.to_owned());
        self.call(move |connection| {
            connection
                .query_row(
                    &format!("SELECT {REPLAY_COLUMNS} FROM replays WHERE org_id = ?1 AND session_id = ?2 AND id = ?3"),
                    params![org_id, session_id, id],
                    replay_from_row,
                )
                .optional()
        })
        .await
    }

    async fn list_replays(&self, org_id: &str, session_id: &str) -> StoreResult<Vec<ReplayRecord>> {
        let (org_id, session_id) = (org_id.to_owned(), session_id.to_owned());
        self.call(move |connection| {
            let mut statement = connection.prepare(&format!(
                "SELECT {REPLAY_COLUMNS} FROM replays WHERE org_id = ?1 AND session_id = ?2 \
                 ORDER BY started_at, id"
            ))?;
            let rows = statement.query_map(params![org_id, session_id], replay_from_row)?;
            rows.collect()
        })
        .await
    }

    async fn unfinished_replays(&self) -> StoreResult<Vec<ReplayRecord>> {
        self.call(move |connection| {
            let mut statement = connection.prepare(&format!(
                "SELECT {REPLAY_COLUMNS} FROM replays WHERE status IN ('recording', 'stopping') \
                 ORDER BY started_at, id"
            ))?;
            let rows = statement.query_map([], replay_from_row)?;
            rows.collect()
        })
        .await
    }

    async fn begin_replay_stop(&self, id: &str) -> StoreResult<bool> {
        let id = id.to_owned();
        self.call(move |connection| {
            let changed = connection.execute(
                "UPDATE replays SET status = 'stopping' WHERE id = ?1 AND status = 'recording'",
                params![id],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    async fn finish_replay(
        &self,
        id: &str,
        at: DateTime<Utc>,
        outcome: &ReplayOutcome,
    ) -> StoreResult<bool> {
        let (id, outcome) = (id.to_owned(), outcome.clone());
        self.call(move |connection| {
            let (status, size_bytes, blob_key, failure) = outcome.columns();
            let status = status.as_str();
            let changed = connection.execute(
                "UPDATE replays SET status = ?2, finished_at = ?3, size_bytes = ?4, blob_key = ?5, \
                 failure = ?6 WHERE id = ?1 AND status = 'stopping'",
                params![id, status, at, size_bytes, blob_key, failure],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    async fn insert_proxy(&self, p: &ProxyRecord) -> StoreResult<()> {
        let p = p.clone();
        self.call(move |connection| {
            connection.execute(
                &format!("INSERT INTO proxies ({PROXY_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"),
                params![
                    p.id, p.org_id, p.name, p.kind, p.protocol,
                    serde_json::to_string(&p.bypass_hosts).unwrap_or_default(),
                    p.config.to_string(), p.status, p.last_checked, p.ip_address, p.check_error, p.created_at
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn proxy(&self, org_id: &str, id: &str) -> StoreResult<Option<ProxyRecord>> {
        let (org_id, id) = (org_id.to_owned(), id.to_owned());
        self.call(move |connection| {
            connection
                .query_row(
                    &format!("SELECT {PROXY_COLUMNS} FROM proxies WHERE org_id = ?1 AND id = ?2 AND deleted_at IS NULL"),
                    params![org_id, id],
                    proxy_from_row,
                )
                .optional()
        })
        .await
    }

    async fn list_proxies(&self, org_id: &str) -> StoreResult<Vec<ProxyRecord>> {
        let org_id = org_id.to_owned();
        self.call(move |connection| {
            let mut statement = connection.prepare(&format!(
                "SELECT {PROXY_COLUMNS} FROM proxies WHERE org_id = ?1 AND deleted_at IS NULL ORDER BY created_at, id"
            ))?;
            let rows = statement.query_map(params![org_id], proxy_from_row)?;
            rows.collect()
        })
        .await
    }

    async fn delete_proxy(&self, org_id: &str, id: &str, at: DateTime<Utc>) -> StoreResult<bool> {
        let (org_id, id) = (org_id.to_owned(), id.to_owned());
        self.call(move |connection| {
            let changed = connection.execute(
                "UPDATE proxies SET deleted_at = ?3 WHERE org_id = ?1 AND id = ?2 AND deleted_at IS NULL",
                params![org_id, id, at],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    async fn record_proxy_check(&self, id: &str, check: &ProxyCheck) -> StoreResult<()> {
        let (id, check) = (id.to_owned(), check.clone());
        self.call(move |connection| {
            connection.execute(
                "UPDATE proxies SET status = ?2, last_checked = ?3, ip_address = ?4, check_error = ?5 WHERE id = ?1",
                params![id, check.status, check.at, check.ip_address, check.error],
            )?;
            Ok(())
        })
        .await
    }

    async fn insert_pool(&self, p: &PoolRecord) -> StoreResult<()> {
        let p = p.clone();
        self.call(move |connection| {
            connection.execute(
                &format!(
                    "INSERT INTO browser_pools ({POOL_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
                ),
                params![
                    p.id,
                    p.org_id,
                    p.name,
                    p.size,
                    p.config.to_string(),
                    p.created_at
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn pool(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<PoolRecord>> {
        let (org_id, key) = (org_id.to_owned(), id_or_name.to_owned());
        self.call(move |connection| {
            let by = |column: &str| {
                connection
                    .query_row(
                        &format!("SELECT {POOL_COLUMNS} FROM browser_pools WHERE org_id = ?1 AND {column} = ?2 AND deleted_at IS NULL"),
                        params![org_id, key],
                        pool_from_row,
                    )
                    .optional()
            };
            match by("id")? {
                Some(found) => Ok(Some(found)),
                None => by("name"),
            }
        })
        .await
    }

    async fn list_pools(&self, org_id: Option<&str>) -> StoreResult<Vec<PoolRecord>> {
        let org_id = org_id.map(str::to_owned);
        self.call(move |connection| {
            let mut statement = connection.prepare(&format!(
                "SELECT {POOL_COLUMNS} FROM browser_pools WHERE deleted_at IS NULL \
                 AND (?1 IS NULL OR org_id = ?1) ORDER BY created_at, id"
            ))?;
            let rows = statement.query_map(params![org_id], pool_from_row)?;
            rows.collect()
        })
        .await
    }

    async fn update_pool(&self, p: &PoolRecord) -> StoreResult<()> {
        let p = p.clone();
        self.call(move |connection| {
            connection.execute(
                "UPDATE browser_pools SET name = ?2, size = ?3, config = ?4 WHERE id = ?1 AND deleted_at IS NULL",
                params![p.id, p.name, p.size, p.config.to_string()],
            )?;
            Ok(())
        })
        .await
    }

    async fn delete_pool(&self, id: &str, at: DateTime<Utc>) -> StoreResult<bool> {
        let id = id.to_owned();
        self.call(move |connection| {
            let changed = connection.execute(
                "UPDATE browser_pools SET deleted_at = ?2 WHERE id = ?1 AND deleted_at IS NULL",
                params![id, at],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    async fn pool_members(&self, pool_id: &str) -> StoreResult<Vec<SessionRecord>> {
        let pool_id = pool_id.to_owned();
        self.call(move |connection| {
            let mut statement = connection.prepare(&format!(
                "SELECT {SESSION_COLUMNS} FROM browser_sessions WHERE pool_id = ?1 AND status <> 'ended' \
                 ORDER BY created_at, id"
            ))?;
            let rows = statement.query_map(params![pool_id], session_from_row)?;
            rows.collect()
        })
        .await
    }

    async fn lease_pool_browser(&self, pool_id: &str) -> StoreResult<Option<SessionRecord>> {
        let pool_id = pool_id.to_owned();
        // One connection behind a mutex: the statement runs alone.
        self.call(move |connection| {
            connection
                .query_row(
                    &format!(
                        "UPDATE browser_sessions SET pool_lease = 'leased' WHERE id = (\
                         SELECT id FROM browser_sessions WHERE pool_id = ?1 AND pool_lease = 'idle' \
                         AND status = 'running' ORDER BY created_at, id LIMIT 1) \
                         RETURNING {SESSION_COLUMNS}"
                    ),
                    params![pool_id],
                    session_from_row,
                )
                .optional()
        })
        .await
    }

    async fn set_pool_lease(
        &self,
        session_id: &str,
        from: PoolLease,
        to: PoolLease,
    ) -> StoreResult<bool> {
        let session_id = session_id.to_owned();
        self.call(move |connection| {
            let changed = connection.execute(
                "UPDATE browser_sessions SET pool_lease = ?3 WHERE id = ?1 AND pool_lease = ?2 \
                 AND status <> 'ended'",
                params![session_id, from.as_str(), to.as_str()],
            )?;
            Ok(changed == 1)
        })
        .await
    }
}
