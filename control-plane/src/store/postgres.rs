//! PostgreSQL, for several control-plane replicas sharing one database.

use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::{NoTls, Row};

use super::{
    AUTH_CONNECTION_COLUMNS, AgentLocation, ApiKeyRecord, AuthConnectionRecord, EXTENSION_COLUMNS,
    ExtensionRecord, Organization, PROFILE_COLUMNS, PROXY_COLUMNS, PoolLease, PoolRecord,
    ProfileRecord, ProxyCheck, ProxyRecord, REPLAY_COLUMNS, ReplayOutcome, ReplayRecord,
    ReplayStatus, SESSION_COLUMNS, SessionFilter, SessionProfile, SessionRecord, SessionStatus,
    Store, StoreError, StoreResult,
};

mod embedded {
    refinery::embed_migrations!("migrations/postgres");
}

const POOL_SIZE: usize = 16;

pub struct PostgresStore {
    pool: Pool,
}

impl PostgresStore {
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let config = tokio_postgres::Config::from_str(url)?;
        {
            // Migrations run on a connection of their own, before the pool hands any out.
            let (mut client, connection) = config
                .connect(NoTls)
                .await
                .map_err(|error| anyhow::anyhow!("connecting to PostgreSQL failed: {error:?}"))?;
            let driver = tokio::spawn(connection);
            embedded::migrations::runner()
                .run_async(&mut client)
                .await?;
            drop(client);
            let _ = driver.await;
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager).max_size(POOL_SIZE).build()?;
        Ok(Self { pool })
    }

    async fn client(&self) -> StoreResult<deadpool_postgres::Object> {
        self.pool
            .get()
            .await
            .map_err(|error| StoreError::Backend(format!("PostgreSQL pool: {error:?}")))
    }
}

fn map_error(error: tokio_postgres::Error) -> StoreError {
    if error.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
        return StoreError::Conflict(format!("{error:?}"));
    }
    // tokio-postgres' Display says only "db error"; Debug carries the server's message.
    StoreError::Backend(format!("{error:?}"))
}

fn replay_from_row(row: &Row) -> StoreResult<ReplayRecord> {
    let get = |error: tokio_postgres::Error| map_error(error);
    let status: String = row.try_get(5).map_err(get)?;
    Ok(ReplayRecord {
        id: row.try_get(0).map_err(get)?,
        org_id: row.try_get(1).map_err(get)?,
        session_id: row.try_get(2).map_err(get)?,
        framerate: row.try_get(3).map_err(get)?,
        max_duration_seconds: row.try_get(4).map_err(get)?,
        status: ReplayStatus::parse(&status)?,
        started_at: row.try_get(6).map_err(get)?,
        finished_at: row.try_get(7).map_err(get)?,
        size_bytes: row.try_get(8).map_err(get)?,
        blob_key: row.try_get(9).map_err(get)?,
        failure: row.try_get(10).map_err(get)?,
    })
}

fn session_from_row(row: &Row) -> StoreResult<SessionRecord> {
    let get = |error: tokio_postgres::Error| map_error(error);
    let endpoint: Option<String> = row.try_get(14).map_err(get)?;
    let agent = match endpoint {
        Some(endpoint) => Some(AgentLocation {
            endpoint,
            secret: row
                .try_get::<_, Option<String>>(15)
                .map_err(get)?
                .unwrap_or_default(),
            pid: row.try_get(16).map_err(get)?,
            vm_root: row
                .try_get::<_, Option<String>>(17)
                .map_err(get)?
                .unwrap_or_default(),
        }),
        None => None,
    };
    Ok(SessionRecord {
        id: row.try_get(0).map_err(get)?,
        org_id: row.try_get(1).map_err(get)?,
        persistent_id: row.try_get(2).map_err(get)?,
        headless: row.try_get(3).map_err(get)?,
        stealth: row.try_get(4).map_err(get)?,
        kiosk_mode: row.try_get(5).map_err(get)?,
        timeout_seconds: row.try_get(6).map_err(get)?,
        viewport_width: row.try_get(7).map_err(get)?,
        viewport_height: row.try_get(8).map_err(get)?,
        viewport_refresh_rate: row.try_get(9).map_err(get)?,
        status: SessionStatus::parse(row.try_get(10).map_err(get)?)?,
        created_at: row.try_get(11).map_err(get)?,
        ended_at: row.try_get(12).map_err(get)?,
        end_reason: row.try_get(13).map_err(get)?,
        agent,
        proxy_id: row.try_get(18).map_err(get)?,
        pool_id: row.try_get(19).map_err(get)?,
        pool_lease: row
            .try_get::<_, Option<String>>(20)
            .map_err(get)?
            .map(|lease| PoolLease::parse(&lease))
            .transpose()?,
        profile: match row.try_get::<_, Option<String>>(21).map_err(get)? {
            Some(id) => Some(SessionProfile {
                id,
                save_changes: row
                    .try_get::<_, Option<bool>>(22)
                    .map_err(get)?
                    .unwrap_or(false),
            }),
            None => None,
        },
    })
}

fn profile_from_row(row: &Row) -> StoreResult<ProfileRecord> {
    Ok(ProfileRecord {
        id: row.try_get(0).map_err(map_error)?,
        org_id: row.try_get(1).map_err(map_error)?,
        name: row.try_get(2).map_err(map_error)?,
        created_at: row.try_get(3).map_err(map_error)?,
        updated_at: row.try_get(4).map_err(map_error)?,
        last_used_at: row.try_get(5).map_err(map_error)?,
        size_bytes: row.try_get(6).map_err(map_error)?,
    })
}

fn auth_connection_from_row(row: &Row) -> StoreResult<AuthConnectionRecord> {
    Ok(AuthConnectionRecord {
        id: row.try_get(0).map_err(map_error)?,
        org_id: row.try_get(1).map_err(map_error)?,
        domain: row.try_get(2).map_err(map_error)?,
        profile_name: row.try_get(3).map_err(map_error)?,
        created_at: row.try_get(4).map_err(map_error)?,
        document: row.try_get(5).map_err(map_error)?,
        credentials: row.try_get(6).map_err(map_error)?,
    })
}

fn json_column<T: serde::de::DeserializeOwned>(row: &Row, index: usize) -> StoreResult<T> {
    let text: String = row.try_get(index).map_err(map_error)?;
    serde_json::from_str(&text)
        .map_err(|error| StoreError::Backend(format!("column {index} is not JSON: {error}")))
}

const POOL_COLUMNS: &str = "id, org_id, name, size, config, created_at";

fn pool_from_row(row: &Row) -> StoreResult<PoolRecord> {
    let get = |error: tokio_postgres::Error| map_error(error);
    Ok(PoolRecord {
        id: row.try_get(0).map_err(get)?,
        org_id: row.try_get(1).map_err(get)?,
        name: row.try_get(2).map_err(get)?,
        size: row.try_get(3).map_err(get)?,
        config: json_column(row, 4)?,
        created_at: row.try_get(5).map_err(get)?,
    })
}

fn proxy_from_row(row: &Row) -> StoreResult<ProxyRecord> {
    let get = |error: tokio_postgres::Error| map_error(error);
    Ok(ProxyRecord {
        id: row.try_get(0).map_err(get)?,
        org_id: row.try_get(1).map_err(get)?,
        name: row.try_get(2).map_err(get)?,
        kind: row.try_get(3).map_err(get)?,
        protocol: row.try_get(4).map_err(get)?,
        bypass_hosts: json_column(row, 5)?,
        config: json_column(row, 6)?,
        status: row.try_get(7).map_err(get)?,
        last_checked: row.try_get(8).map_err(get)?,
        ip_address: row.try_get(9).map_err(get)?,
        check_error: row.try_get(10).map_err(get)?,
        created_at: row.try_get(11).map_err(get)?,
    })
}

fn extension_from_row(row: &Row) -> StoreResult<ExtensionRecord> {
    Ok(ExtensionRecord {
        id: row.try_get(0).map_err(map_error)?,
        org_id: row.try_get(1).map_err(map_error)?,
        name: row.try_get(2).map_err(map_error)?,
        size_bytes: row.try_get(3).map_err(map_error)?,
        blob_key: row.try_get(4).map_err(map_error)?,
        created_at: row.try_get(5).map_err(map_error)?,
        last_used_at: row.try_get(6).map_err(map_error)?,
    })
}

fn sessions_from_rows(rows: Vec<Row>) -> StoreResult<Vec<SessionRecord>> {
    rows.iter().map(session_from_row).collect()
}

#[async_trait]
impl Store for PostgresStore {
    async fn ensure_organization(&self, name: &str) -> StoreResult<Organization> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO organizations (id, name, created_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO NOTHING",
                &[&crate::ids::new_id("org"), &name, &Utc::now()],
            )
            .await
            .map_err(map_error)?;
        let row = client
            .query_one(
                "SELECT id, name, created_at FROM organizations WHERE name = $1",
                &[&name],
            )
            .await
            .map_err(map_error)?;
        Ok(Organization {
            id: row.try_get(0).map_err(map_error)?,
            name: row.try_get(1).map_err(map_error)?,
            created_at: row.try_get(2).map_err(map_error)?,
        })
    }

    async fn insert_api_key(&self, key: &ApiKeyRecord) -> StoreResult<()> {
        self.client()
            .await?
            .execute(
                "INSERT INTO api_keys (id, org_id, secret_hash, created_at) VALUES ($1, $2, $3, $4)",
                &[&key.id, &key.org_id, &key.secret_hash, &key.created_at],
            )
            .await
            .map_err(map_error)?;
        Ok(())
    }

    async fn api_key(&self, id: &str) -> StoreResult<Option<ApiKeyRecord>> {
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT id, org_id, secret_hash, created_at FROM api_keys WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(map_error)?;
        row.map(|row| {
            Ok(ApiKeyRecord {
                id: row.try_get(0).map_err(map_error)?,
                org_id: row.try_get(1).map_err(map_error)?,
                secret_hash: row.try_get(2).map_err(map_error)?,
                created_at: row.try_get(3).map_err(map_error)?,
            })
        })
        .transpose()
    }

    async fn api_key_count(&self) -> StoreResult<u64> {
        let row = self
            .client()
            .await?
            .query_one("SELECT COUNT(*) FROM api_keys", &[])
            .await
            .map_err(map_error)?;
        Ok(row.try_get::<_, i64>(0).map_err(map_error)? as u64)
    }

    async fn setting_or_insert(&self, key: &str, value: &str) -> StoreResult<String> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
                &[&key, &value],
            )
            .await
            .map_err(map_error)?;
        let row = client
            .query_one("SELECT value FROM settings WHERE key = $1", &[&key])
            .await
            .map_err(map_error)?;
        row.try_get(0).map_err(map_error)
    }

    async fn insert_session(&self, s: &SessionRecord) -> StoreResult<()> {
        let agent = s.agent.as_ref();
        let status = s.status.as_str();
        let endpoint = agent.map(|a| a.endpoint.clone());
        let secret = agent.map(|a| a.secret.clone());
        let pid = agent.and_then(|a| a.pid);
        let vm_root = agent.map(|a| a.vm_root.clone());
        let pool_lease = s.pool_lease.map(PoolLease::as_str);
        let profile_id = s.profile.as_ref().map(|p| p.id.clone());
        let profile_save_changes = s.profile.as_ref().map(|p| p.save_changes);
        self.client()
            .await?
            .execute(
                &format!(
                    "INSERT INTO browser_sessions ({SESSION_COLUMNS}) VALUES \
                     ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
                     $19, $20, $21, $22, $23)"
                ),
                &[
                    &s.id,
                    &s.org_id,
                    &s.persistent_id,
                    &s.headless,
                    &s.stealth,
                    &s.kiosk_mode,
                    &s.timeout_seconds,
                    &s.viewport_width,
                    &s.viewport_height,
                    &s.viewport_refresh_rate,
                    &status,
                    &s.created_at,
                    &s.ended_at,
                    &s.end_reason,
                    &endpoint,
                    &secret,
                    &pid,
                    &vm_root,
                    &s.proxy_id,
                    &s.pool_id,
                    &pool_lease,
                    &profile_id,
                    &profile_save_changes,
                ],
            )
            .await
            .map_err(map_error)?;
        Ok(())
    }

    async fn session(&self, org_id: &str, id: &str) -> StoreResult<Option<SessionRecord>> {
        let row = self
            .client()
            .await?
            .query_opt(
                &format!(
                    "SELECT {SESSION_COLUMNS} FROM browser_sessions WHERE org_id = $1 AND id = $2"
                ),
                &[&org_id, &id],
            )
            .await
            .map_err(map_error)?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn live_session_by_persistent_id(
        &self,
        org_id: &str,
        persistent_id: &str,
    ) -> StoreResult<Option<SessionRecord>> {
        let row = self
            .client()
            .await?
            .query_opt(
                &format!(
                    "SELECT {SESSION_COLUMNS} FROM browser_sessions \
                     WHERE org_id = $1 AND persistent_id = $2 AND status <> 'ended'"
                ),
                &[&org_id, &persistent_id],
            )
            .await
            .map_err(map_error)?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn list_sessions(
        &self,
        org_id: &str,
        filter: SessionFilter,
        limit: u32,
        offset: u32,
    ) -> StoreResult<Vec<SessionRecord>> {
        let condition = filter.sql_condition();
        let rows = self
            .client()
            .await?
            .query(
                &format!(
                    "SELECT {SESSION_COLUMNS} FROM browser_sessions WHERE org_id = $1 {condition} \
                     ORDER BY created_at DESC, id DESC LIMIT $2 OFFSET $3"
                ),
                &[&org_id, &i64::from(limit), &i64::from(offset)],
            )
            .await
            .map_err(map_error)?;
        sessions_from_rows(rows)
    }

    async fn live_sessions(&self) -> StoreResult<Vec<SessionRecord>> {
        let rows = self
            .client()
            .await?
            .query(
                &format!(
                    "SELECT {SESSION_COLUMNS} FROM browser_sessions WHERE status <> 'ended' \
                     ORDER BY created_at"
                ),
                &[],
            )
            .await
            .map_err(map_error)?;
        sessions_from_rows(rows)
    }

    async fn set_session_running(&self, id: &str, agent: &AgentLocation) -> StoreResult<bool> {
        let changed = self
            .client()
            .await?
            .execute(
                "UPDATE browser_sessions SET status = 'running', agent_endpoint = $2, \
                 agent_secret = $3, agent_pid = $4, vm_root = $5 \
                 WHERE id = $1 AND status <> 'ended'",
                &[
                    &id,
                    &agent.endpoint,
                    &agent.secret,
                    &agent.pid,
                    &agent.vm_root,
                ],
            )
            .await
            .map_err(map_error)?;
        Ok(changed == 1)
    }

    async fn end_session(&self, id: &str, at: DateTime<Utc>, reason: &str) -> StoreResult<bool> {
        let changed = self
            .client()
            .await?
            .execute(
                "UPDATE browser_sessions SET status = 'ended', ended_at = $2, end_reason = $3 \
                 WHERE id = $1 AND status <> 'ended'",
                &[&id, &at, &reason],
            )
            .await
            .map_err(map_error)?;
        Ok(changed == 1)
    }

    async fn insert_extension(&self, e: &ExtensionRecord) -> StoreResult<()> {
        self.client()
            .await?
            .execute(
                &format!("INSERT INTO extensions ({EXTENSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"),
                &[&e.id, &e.org_id, &e.name, &e.size_bytes, &e.blob_key, &e.created_at, &e.last_used_at],
            )
            .await
            .map_err(map_error)?;
        Ok(())
    }

    async fn extension(
        &self,
        org_id: &str,
        id_or_name: &str,
    ) -> StoreResult<Option<ExtensionRecord>> {
        let client = self.client().await?;
        for column in ["id", "name"] {
            let row = client
                .query_opt(
                    &format!("SELECT {EXTENSION_COLUMNS} FROM extensions WHERE org_id = $1 AND {column} = $2"),
                    &[&org_id, &id_or_name],
                )
                .await
                .map_err(map_error)?;
            if let Some(row) = row {
                return extension_from_row(&row).map(Some);
            }
        }
        Ok(None)
    }

    async fn list_extensions(&self, org_id: &str) -> StoreResult<Vec<ExtensionRecord>> {
        let rows = self
            .client()
            .await?
            .query(
                &format!("SELECT {EXTENSION_COLUMNS} FROM extensions WHERE org_id = $1 ORDER BY created_at, id"),
                &[&org_id],
            )
            .await
            .map_err(map_error)?;
        rows.iter().map(extension_from_row).collect()
    }

    async fn delete_extension(&self, org_id: &str, id: &str) -> StoreResult<bool> {
        let deleted = self
            .client()
            .await?
            .execute(
                "DELETE FROM extensions WHERE org_id = $1 AND id = $2",
                &[&org_id, &id],
            )
            .await
            .map_err(map_error)?;
        Ok(deleted == 1)
    }

    async fn mark_extensions_used(&self, ids: &[String], at: DateTime<Utc>) -> StoreResult<()> {
        self.client()
            .await?
            .execute(
                "UPDATE extensions SET last_used_at = $2 WHERE id = ANY($1)",
                &[&ids, &at],
            )
            .await
            .map_err(map_error)?;
        Ok(())
    }

    async fn insert_profile(&self, p: &ProfileRecord) -> StoreResult<()> {
        self.client()
            .await?
            .execute(
                &format!(
                    "INSERT INTO profiles ({PROFILE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"
                ),
                &[
                    &p.id,
                    &p.org_id,
                    &p.name,
                    &p.created_at,
                    &p.updated_at,
                    &p.last_used_at,
                    &p.size_bytes,
                ],
            )
            .await
            .map_err(map_error)?;
        Ok(())
    }

    async fn profile(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<ProfileRecord>> {
        let client = self.client().await?;
        for column in ["id", "name"] {
            let row = client
                .query_opt(
                    &format!(
                        "SELECT {PROFILE_COLUMNS} FROM profiles WHERE org_id = $1 AND {column} = $2"
                    ),
                    &[&org_id, &id_or_name],
                )
                .await
                .map_err(map_error)?;
            if let Some(row) = row {
                return profile_from_row(&row).map(Some);
            }
        }
        Ok(None)
    }

    async fn list_profiles(&self, org_id: &str) -> StoreResult<Vec<ProfileRecord>> {
        let rows = self
            .client()
            .await?
            .query(
                &format!("SELECT {PROFILE_COLUMNS} FROM profiles WHERE org_id = $1 ORDER BY created_at, id"),
                &[&org_id],
            )
            .await
            .map_err(map_error)?;
        rows.iter().map(profile_from_row).collect()
    }

    async fn delete_profile(&self, org_id: &str, id: &str) -> StoreResult<bool> {
        let deleted = self
            .client()
            .await?
            .execute(
                "DELETE FROM profiles WHERE org_id = $1 AND id = $2",
                &[&org_id, &id],
            )
            .await
            .map_err(map_error)?;
        Ok(deleted == 1)
    }

    async fn profile_saved(
        &self,
        id: &str,
        at: DateTime<Utc>,
        size_bytes: i64,
    ) -> StoreResult<bool> {
        let updated = self
            .client()
            .await?
            .execute(
                "UPDATE profiles SET updated_at = $2, size_bytes = $3 WHERE id = $1",
                &[&id, &at, &size_bytes],
            )
            .await
            .map_err(map_error)?;
        Ok(updated == 1)
    }

    async fn mark_profile_used(&self, id: &str, at: DateTime<Utc>) -> StoreResult<()> {
        self.client()
            .await?
            .execute(
                "UPDATE profiles SET last_used_at = $2 WHERE id = $1",
                &[&id, &at],
            )
            .await
            .map_err(map_error)?;
        Ok(())
    }

    async fn insert_auth_connection(&self, c: &AuthConnectionRecord) -> StoreResult<()> {
        self.client()
            .await?
            .execute(
                &format!("INSERT INTO auth_connections ({AUTH_CONNECTION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"),
                &[&c.id, &c.org_id, &c.domain, &c.profile_name, &c.created_at, &c.document, &c.credentials],
            )
            .await
            .map_err(map_error)?;
        Ok(())
    }

    async fn auth_connection(
        &self,
        org_id: &str,
        id: &str,
    ) -> StoreResult<Option<AuthConnectionRecord>> {
        let row = self
            .client()
            .await?
            .query_opt(
                &format!("SELECT {AUTH_CONNECTION_COLUMNS} FROM auth_connections WHERE org_id = $1 AND id = $2"),
                &[&org_id, &id],
            )
            .await
            .map_err(map_error)?;
        row.as_ref().map(auth_connection_from_row).transpose()
    }

    async fn list_auth_connections(
        &self,
        org_id: Option<&str>,
    ) -> StoreResult<Vec<AuthConnectionRecord>> {
        let rows = self
            .client()
            .await?
            .query(
                &format!(
                    "SELECT {AUTH_CONNECTION_COLUMNS} FROM auth_connections \
                     WHERE $1::TEXT IS NULL OR org_id = $1 ORDER BY created_at, id"
                ),
                &[&org_id],
            )
            .await
            .map_err(map_error)?;
        rows.iter().map(auth_connection_from_row).collect()
    }

    async fn update_auth_connection(&self, c: &AuthConnectionRecord) -> StoreResult<bool> {
        let updated = self
            .client()
            .await?
            .execute(
                "UPDATE auth_connections SET document = $2, credentials = $3 WHERE id = $1",
                &[&c.id, &c.document, &c.credentials],
            )
            .await
            .map_err(map_error)?;
        Ok(updated == 1)
    }

    async fn delete_auth_connection(&self, org_id: &str, id: &str) -> StoreResult<bool> {
        let deleted = self
            .client()
            .await?
            .execute(
                "DELETE FROM auth_connections WHERE org_id = $1 AND id = $2",
                &[&org_id, &id],
            )
            .await
            .map_err(map_error)?;
        Ok(deleted == 1)
    }

    async fn insert_replay(&self, r: &ReplayRecord) -> StoreResult<()> {
        self.client()
            .await?
            .execute(
                &format!("INSERT INTO replays ({REPLAY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"),
                &[
                    &r.id, &r.org_id, &r.session_id, &r.framerate, &r.max_duration_seconds,
                    &r.status.as_str(), &r.started_at, &r.finished_at, &r.size_bytes, &r.blob_key, &r.failure,
                ],
            )
            .await
            .map_err(map_error)?;
        Ok(())
    }

    async fn replay(
        &self,
        org_id: &str,
        session_id: &str,
        id: &str,
    ) -> StoreResult<Option<ReplayRecord>> {
        let row = self
            .client()
            .await?
            .query_opt(
                &format!("SELECT {REPLAY_COLUMNS} FROM replays WHERE org_id = $1 AND session_id = $2 AND id = $3"),
                &[&org_id, &session_id, &id],
            )
            .await
            .map_err(map_error)?;
        row.as_ref().map(replay_from_row).transpose()
    }

    async fn list_replays(&self, org_id: &str, session_id: &str) -> StoreResult<Vec<ReplayRecord>> {
        let rows = self
            .client()
            .await?
            .query(
                &format!(
                    "SELECT {REPLAY_COLUMNS} FROM replays WHERE org_id = $1 AND session_id = $2 \
                     ORDER BY started_at, id"
                ),
                &[&org_id, &session_id],
            )
            .await
            .map_err(map_error)?;
        rows.iter().map(replay_from_row).collect()
    }

    async fn unfinished_replays(&self) -> StoreResult<Vec<ReplayRecord>> {
        let rows = self
            .client()
            .await?
            .query(
                &format!(
                    "SELECT {REPLAY_COLUMNS} FROM replays WHERE status IN ('recording', 'stopping') \
                     ORDER BY started_at, id"
                ),
                &[],
            )
            .await
            .map_err(map_error)?;
        rows.iter().map(replay_from_row).collect()
    }

    async fn begin_replay_stop(&self, id: &str) -> StoreResult<bool> {
        let changed = self
            .client()
            .await?
            .execute(
                "UPDATE replays SET status = 'stopping' WHERE id = $1 AND status = 'recording'",
                &[&id],
            )
            .await
            .map_err(map_error)?;
        Ok(changed == 1)
    }

    async fn finish_replay(
        &self,
        id: &str,
        at: DateTime<Utc>,
        outcome: &ReplayOutcome,
    ) -> StoreResult<bool> {
        let (status, size_bytes, blob_key, failure) = outcome.columns();
        let status = status.as_str();
        let changed = self
            .client()
            .await?
            .execute(
                "UPDATE replays SET status = $2, finished_at = $3, size_bytes = $4, blob_key = $5, \
                 failure = $6 WHERE id = $1 AND status = 'stopping'",
                &[&id, &status, &at, &size_bytes, &blob_key, &failure],
            )
            .await
            .map_err(map_error)?;
        Ok(changed == 1)
    }

    async fn insert_proxy(&self, p: &ProxyRecord) -> StoreResult<()> {
        let bypass_hosts = serde_json::to_string(&p.bypass_hosts).unwrap_or_default();
        let config = p.config.to_string();
        self.client()
            .await?
            .execute(
                &format!("INSERT INTO proxies ({PROXY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"),
                &[
                    &p.id, &p.org_id, &p.name, &p.kind, &p.protocol, &bypass_hosts, &config,
                    &p.status, &p.last_checked, &p.ip_address, &p.check_error, &p.created_at,
                ],
            )
            .await
            .map_err(map_error)?;
        Ok(())
    }

    async fn proxy(&self, org_id: &str, id: &str) -> StoreResult<Option<ProxyRecord>> {
        let row = self
            .client()
            .await?
            .query_opt(
                &format!("SELECT {PROXY_COLUMNS} FROM proxies WHERE org_id = $1 AND id = $2 AND deleted_at IS NULL"),
                &[&org_id, &id],
            )
            .await
            .map_err(map_error)?;
        row.as_ref().map(proxy_from_row).transpose()
    }

    async fn list_proxies(&self, org_id: &str) -> StoreResult<Vec<ProxyRecord>> {
        let rows = self
            .client()
            .await?
            .query(
                &format!("SELECT {PROXY_COLUMNS} FROM proxies WHERE org_id = $1 AND deleted_at IS NULL ORDER BY created_at, id"),
                &[&org_id],
            )
            .await
            .map_err(map_error)?;
        rows.iter().map(proxy_from_row).collect()
    }

    async fn delete_proxy(&self, org_id: &str, id: &str, at: DateTime<Utc>) -> StoreResult<bool> {
        let changed = self
            .client()
            .await?
            .execute(
                "UPDATE proxies SET deleted_at = $3 WHERE org_id = $1 AND id = $2 AND deleted_at IS NULL",
                &[&org_id, &id, &at],
            )
            .await
            .map_err(map_error)?;
        Ok(changed == 1)
    }

    async fn record_proxy_check(&self, id: &str, check: &ProxyCheck) -> StoreResult<()> {
        self.client()
            .await?
            .execute(
                "UPDATE proxies SET status = $2, last_checked = $3, ip_address = $4, check_error = $5 WHERE id = $1",
                &[&id, &check.status, &check.at, &check.ip_address, &check.error],
            )
            .await
            .map_err(map_error)?;
        Ok(())
    }

    async fn insert_pool(&self, p: &PoolRecord) -> StoreResult<()> {
        let config = p.config.to_string();
        self.client()
            .await?
            .execute(
                &format!(
                    "INSERT INTO browser_pools ({POOL_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"
                ),
                &[&p.id, &p.org_id, &p.name, &p.size, &config, &p.created_at],
            )
            .await
            .map_err(map_error)?;
        Ok(())
    }

    async fn pool(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<PoolRecord>> {
        let client = self.client().await?;
        for column in ["id", "name"] {
            let row = client
                .query_opt(
                    &format!("SELECT {POOL_COLUMNS} FROM browser_pools WHERE org_id = $1 AND {column} = $2 AND deleted_at IS NULL"),
                    &[&org_id, &id_or_name],
                )
                .await
                .map_err(map_error)?;
            if let Some(row) = row {
                return pool_from_row(&row).map(Some);
            }
        }
        Ok(None)
    }

    async fn list_pools(&self, org_id: Option<&str>) -> StoreResult<Vec<PoolRecord>> {
        let rows = self
            .client()
            .await?
            .query(
                &format!(
                    "SELECT {POOL_COLUMNS} FROM browser_pools WHERE deleted_at IS NULL \
                     AND ($1::TEXT IS NULL OR org_id = $1) ORDER BY created_at, id"
                ),
                &[&org_id],
            )
            .await
            .map_err(map_error)?;
        rows.iter().map(pool_from_row).collect()
    }

    async fn update_pool(&self, p: &PoolRecord) -> StoreResult<()> {
        let config = p.config.to_string();
        self.client()
            .await?
            .execute(
                "UPDATE browser_pools SET name = $2, size = $3, config = $4 WHERE id = $1 AND deleted_at IS NULL",
                &[&p.id, &p.name, &p.size, &config],
            )
            .await
            .map_err(map_error)?;
        Ok(())
    }

    async fn delete_pool(&self, id: &str, at: DateTime<Utc>) -> StoreResult<bool> {
        let changed = self
            .client()
            .await?
            .execute(
                "UPDATE browser_pools SET deleted_at = $2 WHERE id = $1 AND deleted_at IS NULL",
                &[&id, &at],
            )
            .await
            .map_err(map_error)?;
        Ok(changed == 1)
    }

    async fn pool_members(&self, pool_id: &str) -> StoreResult<Vec<SessionRecord>> {
        let rows = self
            .client()
            .await?
            .query(
                &format!(
                    "SELECT {SESSION_COLUMNS} FROM browser_sessions WHERE pool_id = $1 AND status <> 'ended' \
                     ORDER BY created_at, id"
                ),
                &[&pool_id],
            )
            .await
            .map_err(map_error)?;
        rows.iter().map(session_from_row).collect()
    }

    async fn lease_pool_browser(&self, pool_id: &str) -> StoreResult<Option<SessionRecord>> {
        // SKIP LOCKED: concurrent acquirers (on any replica) each take a different row
        // instead of waiting for, and then re-checking, the same one.
        let row = self
            .client()
            .await?
            .query_opt(
                &format!(
                    "UPDATE browser_sessions SET pool_lease = 'leased' WHERE id = (\
                     SELECT id FROM browser_sessions WHERE pool_id = $1 AND pool_lease = 'idle' \
                     AND status = 'running' ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) \
                     RETURNING {SESSION_COLUMNS}"
                ),
                &[&pool_id],
            )
            .await
            .map_err(map_error)?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn set_pool_lease(
        &self,
        session_id: &str,
        from: PoolLease,
        to: PoolLease,
    ) -> StoreResult<bool> {
        let changed = self
            .client()
            .await?
            .execute(
                "UPDATE browser_sessions SET pool_lease = $3 WHERE id = $1 AND pool_lease = $2 \
                 AND status <> 'ended'",
                &[&session_id, &from.as_str(), &to.as_str()],
            )
            .await
            .map_err(map_error)?;
        Ok(changed == 1)
    }
}
