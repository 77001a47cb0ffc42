//! The core `Store` over SQL, for both backends: every statement is written here once, in
//! PostgreSQL's dialect (see `database::Statement` for SQLite's spelling); rows become
//! records in `rows.rs`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::database::{params, sql};
use super::rows::*;
use super::scope;
use super::sql_store::{ID_FIRST, SqlStore};
use super::{
    AgentLocation, AuthConnectionRecord, ExtensionRecord, Organization, PoolLease, ProfileRecord,
    ProxyCheck, ProxyRecord, SecretKind, SecretRecord, SessionFilter, SessionRecord, Store,
    StoreResult,
};

#[async_trait]
impl Store for SqlStore {
    async fn ensure_organization(&self, name: &str) -> StoreResult<Organization> {
        let now = Utc::now();
        let statement = sql!(
            "INSERT INTO organizations (id, name, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO NOTHING"
        );
        self.database().execute(statement, params![crate::ids::new_id("org"), name, now]).await?;
        let statement = sql!("SELECT id, name, created_at FROM organizations WHERE name = $1");
        let organization =
            self.database().query_one(statement, params![name], organization_from_row).await?;
        // Everything made without a project lands in this one.
        super::AccessStore::default_project_id(self, &organization.id).await?;
        Ok(organization)
    }

    async fn setting_or_insert(&self, key: &str, value: &str) -> StoreResult<String> {
        let statement =
            sql!("INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING");
        self.database().execute(statement, params![key, value]).await?;
        let statement = sql!("SELECT value FROM settings WHERE key = $1");
        self.database().query_one(statement, params![key], text_from_row).await
    }

    async fn insert_session(&self, s: &SessionRecord) -> StoreResult<()> {
        let agent = s.agent.as_ref();
        let statement = sql!(
            "INSERT INTO browser_sessions ({SESSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, \
             $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, \
             $22, $23, $24, $25, $26, $27, COALESCE($28, (SELECT id FROM projects WHERE org_id = $2 AND is_default)))"
        );
        self.database()
            .execute(
                statement,
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
                    agent.map(|a| &a.endpoint),
                    agent.map(|a| &a.secret),
                    agent.and_then(|a| a.pid),
                    agent.map(|a| &a.vm_root),
                    s.proxy_id,
                    s.pool_id,
                    s.pool_lease.map(PoolLease::as_str),
                    s.profile.as_ref().map(|p| &p.id),
                    s.profile.as_ref().map(|p| p.save_changes),
                    s.pool_lease_id,
                    serde_json::to_string(&s.vm_settings).ok(),
                    s.name,
                    s.owner,
                    s.project_id.clone().or_else(scope::current),
                ],
            )
            .await?;
        Ok(())
    }

    async fn session(&self, org_id: &str, id: &str) -> StoreResult<Option<SessionRecord>> {
        // By id first, then by the name of a live session.
        let statement = sql!(
            "SELECT {SESSION_COLUMNS} FROM browser_sessions WHERE org_id = $1 AND \
             (id = $2 OR (name = $2 AND status <> 'ended')) AND (CAST($3 AS TEXT) IS NULL OR project_id = $3) \
             ORDER BY CASE WHEN id = $2 THEN 0 ELSE 1 END LIMIT 1"
        );
        self.database()
            .query_opt(statement, params![org_id, id, scope::current()], session_from_row)
            .await
    }

    async fn live_session_by_persistent_id(
        &self, org_id: &str, persistent_id: &str,
    ) -> StoreResult<Option<SessionRecord>> {
        let statement = sql!(
            "SELECT {SESSION_COLUMNS} FROM browser_sessions \
             WHERE org_id = $1 AND persistent_id = $2 AND status <> 'ended' \
             AND (CAST($3 AS TEXT) IS NULL OR project_id = $3)"
        );
        self.database()
            .query_opt(
                statement,
                params![org_id, persistent_id, scope::current()],
                session_from_row,
            )
            .await
    }

    async fn list_sessions(
        &self, org_id: &str, filter: SessionFilter, limit: u32, offset: u32,
    ) -> StoreResult<Vec<SessionRecord>> {
        const PAGE: &str = "ORDER BY created_at DESC, id DESC LIMIT $3 OFFSET $4";
        const SCOPED: &str = "(CAST($5 AS TEXT) IS NULL OR project_id = $5)";
        // `$2` picks the filter, so that one statement serves all three.
        let statement = sql!(
            "SELECT {SESSION_COLUMNS} FROM browser_sessions WHERE org_id = $1 AND \
             ($2 = 'all' OR ($2 = 'ended') = (status = 'ended')) AND {SCOPED} {PAGE}"
        );
        let filter = match filter {
            SessionFilter::Live => "live",
            SessionFilter::Ended => "ended",
            SessionFilter::All => "all",
        };
        self.database()
            .query(
                statement,
                params![org_id, filter, limit, offset, scope::current()],
                session_from_row,
            )
            .await
    }

    async fn live_browser_count(&self, org_id: &str) -> StoreResult<u64> {
        let statement = sql!(
            "SELECT COUNT(*) FROM browser_sessions WHERE org_id = $1 \
             AND status <> 'ended' AND pool_id IS NULL"
        );
        let count = self.database().query_one(statement, params![org_id], count_from_row).await?;
        Ok(count as u64)
    }

    async fn live_sessions(&self) -> StoreResult<Vec<SessionRecord>> {
        let statement = sql!(
            "SELECT {SESSION_COLUMNS} FROM browser_sessions WHERE status <> 'ended' \
             ORDER BY created_at"
        );
        self.database().query(statement, params![], session_from_row).await
    }

    async fn set_session_running(&self, id: &str, agent: &AgentLocation) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE browser_sessions SET status = 'running', agent_endpoint = $2, \
             agent_secret = $3, agent_pid = $4, vm_root = $5 \
             WHERE id = $1 AND status <> 'ended'"
        );
        let changed = self
            .database()
            .execute(statement, params![id, agent.endpoint, agent.secret, agent.pid, agent.vm_root])
            .await?;
        Ok(changed == 1)
    }

    async fn end_session(&self, id: &str, at: DateTime<Utc>, reason: &str) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE browser_sessions SET status = 'ended', ended_at = $2, end_reason = $3 \
             WHERE id = $1 AND status <> 'ended'"
        );
        let changed = self.database().execute(statement, params![id, at, reason]).await?;
        Ok(changed == 1)
    }

    async fn set_session_settings(
        &self, id: &str, name: Option<&str>, proxy_id: Option<&str>, settings: &super::VmSettings,
    ) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE browser_sessions SET vm_settings = $2, name = $3, proxy_id = $4 \
             WHERE id = $1 AND status <> 'ended'"
        );
        let changed = self
            .database()
            .execute(statement, params![id, serde_json::to_string(settings).ok(), name, proxy_id])
            .await?;
        Ok(changed == 1)
    }

    async fn set_session_profile(
        &self, id: &str, profile: &super::SessionProfile,
    ) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE browser_sessions SET profile_id = $2, profile_save_changes = $3 \
             WHERE id = $1 AND status <> 'ended' AND profile_id IS NULL"
        );
        let changed = self
            .database()
            .execute(statement, params![id, profile.id, profile.save_changes])
            .await?;
        Ok(changed == 1)
    }

    async fn set_session_viewport(
        &self, id: &str, width: i64, height: i64, refresh_rate: Option<i64>,
    ) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE browser_sessions SET viewport_width = $2, viewport_height = $3, \
             viewport_refresh_rate = $4 WHERE id = $1 AND status <> 'ended'"
        );
        let changed =
            self.database().execute(statement, params![id, width, height, refresh_rate]).await?;
        Ok(changed == 1)
    }

    async fn insert_extension(&self, e: &ExtensionRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO extensions ({EXTENSION_COLUMNS}, project_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, COALESCE($8, (SELECT id FROM projects WHERE org_id = $2 AND is_default)))"
        );
        self.database()
            .execute(
                statement,
                params![
                    e.id,
                    e.org_id,
                    e.name,
                    e.size_bytes,
                    e.blob_key,
                    e.created_at,
                    e.last_used_at,
                    scope::current()
                ],
            )
            .await?;
        Ok(())
    }

    async fn extension(
        &self, org_id: &str, id_or_name: &str,
    ) -> StoreResult<Option<ExtensionRecord>> {
        let statement = sql!(
            "SELECT {EXTENSION_COLUMNS} FROM extensions WHERE org_id = $1 \
             AND (CAST($3 AS TEXT) IS NULL OR project_id = $3) AND {ID_FIRST}"
        );
        self.database()
            .query_opt(statement, params![org_id, id_or_name, scope::current()], extension_from_row)
            .await
    }

    async fn list_extensions(&self, org_id: &str) -> StoreResult<Vec<ExtensionRecord>> {
        let statement = sql!(
            "SELECT {EXTENSION_COLUMNS} FROM extensions WHERE org_id = $1 \
             AND (CAST($2 AS TEXT) IS NULL OR project_id = $2) ORDER BY created_at, id"
        );
        self.database()
            .query(statement, params![org_id, scope::current()], extension_from_row)
            .await
    }

    async fn delete_extension(&self, org_id: &str, id: &str) -> StoreResult<bool> {
        let statement = sql!(
            "DELETE FROM extensions WHERE org_id = $1 AND id = $2 AND (CAST($3 AS TEXT) IS NULL OR project_id = $3)"
        );
        let deleted =
            self.database().execute(statement, params![org_id, id, scope::current()]).await?;
        Ok(deleted == 1)
    }

    async fn mark_extensions_used(&self, ids: &[String], at: DateTime<Utc>) -> StoreResult<()> {
        // A browser loads at most a few dozen extensions: one statement each is cheap.
        for id in ids {
            let statement = sql!("UPDATE extensions SET last_used_at = $2 WHERE id = $1");
            self.database().execute(statement, params![id, at]).await?;
        }
        Ok(())
    }

    async fn insert_proxy(&self, p: &ProxyRecord) -> StoreResult<()> {
        let bypass_hosts = serde_json::to_string(&p.bypass_hosts).unwrap_or_default();
        let statement = sql!(
            "INSERT INTO proxies ({PROXY_COLUMNS}, project_id) VALUES ($1, $2, $3, $4, $5, \
             $6, $7, $8, $9, $10, $11, $12, COALESCE($13, (SELECT id FROM projects WHERE org_id = $2 AND is_default)))"
        );
        self.database()
            .execute(
                statement,
                params![
                    p.id,
                    p.org_id,
                    p.name,
                    p.kind,
                    p.protocol,
                    bypass_hosts,
                    p.config.to_string(),
                    p.status,
                    p.last_checked,
                    p.ip_address,
                    p.check_error,
                    p.created_at,
                    scope::current()
                ],
            )
            .await?;
        Ok(())
    }

    async fn proxy(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<ProxyRecord>> {
        // Names are not unique: a name must match exactly one proxy.
        let statement = sql!(
            "SELECT {PROXY_COLUMNS} FROM proxies WHERE org_id = $1 AND deleted_at IS NULL \
             AND (CAST($3 AS TEXT) IS NULL OR project_id = $3) AND (id = $2 OR name = $2) \
             ORDER BY CASE WHEN id = $2 THEN 0 ELSE 1 END LIMIT 2"
        );
        let mut found = self
            .database()
            .query(statement, params![org_id, id_or_name, scope::current()], proxy_from_row)
            .await?;
        match found.as_slice() {
            [first, ..] if first.id == id_or_name => Ok(found.into_iter().next()),
            [_, _] => Err(super::StoreError::Conflict(format!(
                "several proxies are named {id_or_name:?}; use the id"
            ))),
            _ => Ok(found.pop()),
        }
    }

    async fn rename_proxy(&self, org_id: &str, id: &str, name: &str) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE proxies SET name = $3 WHERE org_id = $1 AND id = $2 \
             AND deleted_at IS NULL"
        );
        let changed = self.database().execute(statement, params![org_id, id, name]).await?;
        Ok(changed == 1)
    }

    async fn list_proxies(&self, org_id: &str) -> StoreResult<Vec<ProxyRecord>> {
        let statement = sql!(
            "SELECT {PROXY_COLUMNS} FROM proxies WHERE org_id = $1 AND deleted_at IS NULL \
             AND (CAST($2 AS TEXT) IS NULL OR project_id = $2) ORDER BY created_at, id"
        );
        self.database().query(statement, params![org_id, scope::current()], proxy_from_row).await
    }

    async fn delete_proxy(&self, org_id: &str, id: &str, at: DateTime<Utc>) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE proxies SET deleted_at = $3 WHERE org_id = $1 AND id = $2 \
             AND deleted_at IS NULL"
        );
        let changed = self.database().execute(statement, params![org_id, id, at]).await?;
        Ok(changed == 1)
    }

    async fn record_proxy_check(&self, id: &str, check: &ProxyCheck) -> StoreResult<()> {
        let statement = sql!(
            "UPDATE proxies SET status = $2, last_checked = $3, ip_address = $4, \
             check_error = $5 WHERE id = $1"
        );
        self.database()
            .execute(statement, params![id, check.status, check.at, check.ip_address, check.error])
            .await?;
        Ok(())
    }

    async fn insert_profile(&self, p: &ProfileRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO profiles ({PROFILE_COLUMNS}, project_id) VALUES ($1, $2, $3, $4, $5, \
             $6, $7, COALESCE($8, (SELECT id FROM projects WHERE org_id = $2 AND is_default)))"
        );
        self.database()
            .execute(
                statement,
                params![
                    p.id,
                    p.org_id,
                    p.name,
                    p.created_at,
                    p.updated_at,
                    p.last_used_at,
                    p.size_bytes,
                    scope::current()
                ],
            )
            .await?;
        Ok(())
    }

    async fn profile(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<ProfileRecord>> {
        let statement = sql!(
            "SELECT {PROFILE_COLUMNS} FROM profiles WHERE org_id = $1 \
             AND (CAST($3 AS TEXT) IS NULL OR project_id = $3) AND {ID_FIRST}"
        );
        self.database()
            .query_opt(statement, params![org_id, id_or_name, scope::current()], profile_from_row)
            .await
    }

    async fn rename_profile(&self, org_id: &str, id: &str, name: &str) -> StoreResult<bool> {
        let statement = sql!("UPDATE profiles SET name = $3 WHERE org_id = $1 AND id = $2");
        let changed = self.database().execute(statement, params![org_id, id, name]).await?;
        Ok(changed == 1)
    }

    async fn list_profiles(&self, org_id: &str) -> StoreResult<Vec<ProfileRecord>> {
        let statement = sql!(
            "SELECT {PROFILE_COLUMNS} FROM profiles WHERE org_id = $1 \
             AND (CAST($2 AS TEXT) IS NULL OR project_id = $2) ORDER BY created_at, id"
        );
        self.database().query(statement, params![org_id, scope::current()], profile_from_row).await
    }

    async fn delete_profile(&self, org_id: &str, id: &str) -> StoreResult<bool> {
        let statement = sql!(
            "DELETE FROM profiles WHERE org_id = $1 AND id = $2 AND (CAST($3 AS TEXT) IS NULL OR project_id = $3)"
        );
        let deleted =
            self.database().execute(statement, params![org_id, id, scope::current()]).await?;
        Ok(deleted == 1)
    }

    async fn profile_saved(
        &self, id: &str, at: DateTime<Utc>, size_bytes: i64,
    ) -> StoreResult<bool> {
        let statement = sql!("UPDATE profiles SET updated_at = $2, size_bytes = $3 WHERE id = $1");
        let updated = self.database().execute(statement, params![id, at, size_bytes]).await?;
        Ok(updated == 1)
    }

    async fn mark_profile_used(&self, id: &str, at: DateTime<Utc>) -> StoreResult<()> {
        let statement = sql!("UPDATE profiles SET last_used_at = $2 WHERE id = $1");
        self.database().execute(statement, params![id, at]).await?;
        Ok(())
    }

    async fn insert_auth_connection(&self, c: &AuthConnectionRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO auth_connections ({AUTH_CONNECTION_COLUMNS}, project_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, COALESCE($8, (SELECT id FROM projects WHERE org_id = $2 AND is_default)))"
        );
        self.database()
            .execute(
                statement,
                params![
                    c.id,
                    c.org_id,
                    c.domain,
                    c.profile_name,
                    c.created_at,
                    c.document,
                    c.credentials,
                    scope::current()
                ],
            )
            .await?;
        Ok(())
    }

    async fn auth_connection(
        &self, org_id: &str, id: &str,
    ) -> StoreResult<Option<AuthConnectionRecord>> {
        let statement = sql!(
            "SELECT {AUTH_CONNECTION_COLUMNS} FROM auth_connections \
             WHERE org_id = $1 AND id = $2 AND (CAST($3 AS TEXT) IS NULL OR project_id = $3)"
        );
        self.database()
            .query_opt(statement, params![org_id, id, scope::current()], auth_connection_from_row)
            .await
    }

    async fn list_auth_connections(
        &self, org_id: Option<&str>,
    ) -> StoreResult<Vec<AuthConnectionRecord>> {
        let statement = sql!(
            "SELECT {AUTH_CONNECTION_COLUMNS} FROM auth_connections \
             WHERE (CAST($1 AS TEXT) IS NULL OR org_id = $1) AND (CAST($2 AS TEXT) IS NULL OR project_id = $2) \
             ORDER BY created_at, id"
        );
        self.database()
            .query(statement, params![org_id, scope::current()], auth_connection_from_row)
            .await
    }

    async fn update_auth_connection(&self, c: &AuthConnectionRecord) -> StoreResult<bool> {
        let statement =
            sql!("UPDATE auth_connections SET document = $2, credentials = $3 WHERE id = $1");
        let updated =
            self.database().execute(statement, params![c.id, c.document, c.credentials]).await?;
        Ok(updated == 1)
    }

    async fn delete_auth_connection(&self, org_id: &str, id: &str) -> StoreResult<bool> {
        let statement = sql!(
            "DELETE FROM auth_connections WHERE org_id = $1 AND id = $2 AND (CAST($3 AS TEXT) IS NULL OR project_id = $3)"
        );
        let deleted =
            self.database().execute(statement, params![org_id, id, scope::current()]).await?;
        Ok(deleted == 1)
    }

    async fn insert_secret(&self, s: &SecretRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO secrets ({SECRET_COLUMNS}, project_id) VALUES ($1, $2, $3, $4, $5, \
             $6, $7, $8, COALESCE($9, (SELECT id FROM projects WHERE org_id = $2 AND is_default)))"
        );
        self.database()
            .execute(
                statement,
                params![
                    s.id,
                    s.org_id,
                    s.kind.as_str(),
                    s.name,
                    s.created_at,
                    s.updated_at,
                    s.document,
                    s.sealed,
                    scope::current()
                ],
            )
            .await?;
        Ok(())
    }

    async fn secret(
        &self, org_id: &str, kind: SecretKind, id_or_name: &str,
    ) -> StoreResult<Option<SecretRecord>> {
        let statement = sql!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE org_id = $1 AND kind = $3 \
             AND (CAST($4 AS TEXT) IS NULL OR project_id = $4) AND {ID_FIRST}"
        );
        self.database()
            .query_opt(
                statement,
                params![org_id, id_or_name, kind.as_str(), scope::current()],
                secret_from_row,
            )
            .await
    }

    async fn list_secrets(&self, org_id: &str, kind: SecretKind) -> StoreResult<Vec<SecretRecord>> {
        let statement = sql!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE org_id = $1 AND kind = $2 \
             AND (CAST($3 AS TEXT) IS NULL OR project_id = $3) ORDER BY created_at, id"
        );
        self.database()
            .query(statement, params![org_id, kind.as_str(), scope::current()], secret_from_row)
            .await
    }

    async fn update_secret(&self, s: &SecretRecord, read_at: DateTime<Utc>) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE secrets SET name = $4, updated_at = $5, document = $6, sealed = $7 \
             WHERE org_id = $1 AND kind = $2 AND id = $3 AND updated_at = $8"
        );
        let updated = self
            .database()
            .execute(
                statement,
                params![
                    s.org_id,
                    s.kind.as_str(),
                    s.id,
                    s.name,
                    s.updated_at,
                    s.document,
                    s.sealed,
                    read_at
                ],
            )
            .await?;
        Ok(updated == 1)
    }

    async fn delete_secret(&self, org_id: &str, kind: SecretKind, id: &str) -> StoreResult<bool> {
        let statement = sql!(
            "DELETE FROM secrets WHERE org_id = $1 AND kind = $2 AND id = $3 \
             AND (CAST($4 AS TEXT) IS NULL OR project_id = $4)"
        );
        let deleted = self
            .database()
            .execute(statement, params![org_id, kind.as_str(), id, scope::current()])
            .await?;
        Ok(deleted == 1)
    }
}
