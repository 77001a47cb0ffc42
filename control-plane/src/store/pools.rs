//! The store's part for browser pools: each pool's configuration and the lease state of
//! its browsers (one atomic update per lease, `FOR UPDATE SKIP LOCKED` on PostgreSQL), and
//! the claim of a standby browser.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::database::{params, sql};
use super::rows::{POOL_COLUMNS, SESSION_COLUMNS, pool_from_row, session_from_row};
use super::sql_store::{ID_FIRST, SqlStore};
use super::{PoolLease, PoolRecord, SessionRecord, StoreResult, scope};

#[async_trait]
pub trait PoolsStore: Send + Sync {
    /// Fails with `Conflict` when the organization has a pool of that name.
    async fn insert_pool(&self, pool: &PoolRecord) -> StoreResult<()>;
    /// A pool that is not deleted, by id first, then by name.
    async fn pool(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<PoolRecord>>;
    /// The organization's pools, oldest first; every organization's with `None`.
    async fn list_pools(&self, org_id: Option<&str>) -> StoreResult<Vec<PoolRecord>>;
    /// Replaces name, size and config; `Conflict` on a taken name.
    async fn update_pool(&self, pool: &PoolRecord) -> StoreResult<()>;
    async fn delete_pool(&self, id: &str, at: DateTime<Utc>) -> StoreResult<bool>;
    /// Live (starting or running) browsers of a pool, oldest first.
    async fn pool_members(&self, pool_id: &str) -> StoreResult<Vec<SessionRecord>>;
    /// Leases one idle running browser of the pool, atomically: no browser is leased
    /// twice, also with concurrent callers (and replicas: `FOR UPDATE SKIP LOCKED`).
    /// The lease is recorded as `lease_id`.
    async fn lease_pool_browser(
        &self, pool_id: &str, lease_id: &str,
    ) -> StoreResult<Option<SessionRecord>>;
    /// Takes one idle running browser of a standby pool for a new session, atomically
    /// (as `lease_pool_browser`): the row becomes `session`'s (organization, settings,
    /// labels, creation time) and leaves the pool; its id, agent and owner stay. Browsers
    /// `owner` serves come first; others only with `any_owner`. Fails with `Conflict` as
    /// `insert_session` would (a live name or persistent id taken).
    async fn claim_standby_browser(
        &self, pool_id: &str, owner: &str, any_owner: bool, session: &SessionRecord,
    ) -> StoreResult<Option<SessionRecord>>;
    /// Moves a pool browser from one lease state to another; false if it was not in
    /// `from` (or is not live).
    async fn set_pool_lease(
        &self, session_id: &str, from: PoolLease, to: PoolLease,
    ) -> StoreResult<bool>;
}

#[async_trait]
impl PoolsStore for SqlStore {
    async fn insert_pool(&self, p: &PoolRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO browser_pools ({POOL_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, \
             COALESCE($7, (SELECT id FROM projects WHERE org_id = $2 AND is_default)))"
        );
        self.database()
            .execute(
                statement,
                params![
                    p.id,
                    p.org_id,
                    p.name,
                    p.size,
                    p.config.to_string(),
                    p.created_at,
                    p.project_id.clone().or_else(scope::current)
                ],
            )
            .await?;
        Ok(())
    }

    async fn pool(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<PoolRecord>> {
        let statement = sql!(
            "SELECT {POOL_COLUMNS} FROM browser_pools WHERE org_id = $1 \
             AND deleted_at IS NULL AND (CAST($3 AS TEXT) IS NULL OR project_id = $3) AND {ID_FIRST}"
        );
        self.database()
            .query_opt(statement, params![org_id, id_or_name, scope::current()], pool_from_row)
            .await
    }

    async fn list_pools(&self, org_id: Option<&str>) -> StoreResult<Vec<PoolRecord>> {
        let statement = sql!(
            "SELECT {POOL_COLUMNS} FROM browser_pools WHERE deleted_at IS NULL \
             AND (CAST($1 AS TEXT) IS NULL OR org_id = $1) AND (CAST($2 AS TEXT) IS NULL OR project_id = $2) \
             ORDER BY created_at, id"
        );
        self.database().query(statement, params![org_id, scope::current()], pool_from_row).await
    }

    async fn update_pool(&self, p: &PoolRecord) -> StoreResult<()> {
        let statement = sql!(
            "UPDATE browser_pools SET name = $2, size = $3, config = $4 \
             WHERE id = $1 AND deleted_at IS NULL"
        );
        self.database()
            .execute(statement, params![p.id, p.name, p.size, p.config.to_string()])
            .await?;
        Ok(())
    }

    async fn delete_pool(&self, id: &str, at: DateTime<Utc>) -> StoreResult<bool> {
        let statement =
            sql!("UPDATE browser_pools SET deleted_at = $2 WHERE id = $1 AND deleted_at IS NULL");
        let changed = self.database().execute(statement, params![id, at]).await?;
        Ok(changed == 1)
    }

    async fn pool_members(&self, pool_id: &str) -> StoreResult<Vec<SessionRecord>> {
        let statement = sql!(
            "SELECT {SESSION_COLUMNS} FROM browser_sessions WHERE pool_id = $1 \
             AND status <> 'ended' ORDER BY created_at, id"
        );
        self.database().query(statement, params![pool_id], session_from_row).await
    }

    async fn lease_pool_browser(
        &self, pool_id: &str, lease_id: &str,
    ) -> StoreResult<Option<SessionRecord>> {
        // SKIP LOCKED: concurrent acquirers (on any replica) each take a different row
        // instead of waiting for, and then re-checking, the same one.
        let statement = sql!(
            "UPDATE browser_sessions SET pool_lease = 'leased', pool_lease_id = $2, \
             last_active_at = $3 WHERE id = (\
             SELECT id FROM browser_sessions WHERE pool_id = $1 AND pool_lease = 'idle' \
             AND status = 'running' ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING {SESSION_COLUMNS}"
        );
        // A lease is use: no replica's reaper may count its idle time before.
        let used_at = Utc::now();
        self.database()
            .query_opt(statement, params![pool_id, lease_id, used_at], session_from_row)
            .await
    }

    async fn claim_standby_browser(
        &self, pool_id: &str, owner: &str, any_owner: bool, s: &SessionRecord,
    ) -> StoreResult<Option<SessionRecord>> {
        let statement = sql!(
            "UPDATE browser_sessions SET org_id = $4, persistent_id = $5, \
             timeout_seconds = $6, viewport_width = $7, viewport_height = $8, \
             viewport_refresh_rate = $9, created_at = $10, last_active_at = $10, \
             proxy_id = $11, vm_settings = $12, name = $13, pool_id = NULL, \
             project_id = COALESCE($14, (SELECT id FROM projects WHERE org_id = $4 \
             AND is_default)), \
             pool_lease = NULL, pool_lease_id = NULL WHERE id = (\
             SELECT id FROM browser_sessions WHERE pool_id = $1 AND pool_lease = 'idle' \
             AND status = 'running' AND (owner = $2 OR $3) \
             ORDER BY COALESCE(owner = $2, FALSE) DESC, created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING {SESSION_COLUMNS}"
        );
        self.database()
            .query_opt(
                statement,
                params![
                    pool_id,
                    owner,
                    any_owner,
                    s.org_id,
                    s.persistent_id,
                    s.timeout_seconds,
                    s.viewport_width,
                    s.viewport_height,
                    s.viewport_refresh_rate,
                    s.created_at,
                    s.proxy_id,
                    serde_json::to_string(&s.vm_settings).ok(),
                    s.name,
                    s.project_id.clone().or_else(scope::current)
                ],
                session_from_row,
            )
            .await
    }

    async fn set_pool_lease(
        &self, session_id: &str, from: PoolLease, to: PoolLease,
    ) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE browser_sessions SET pool_lease = $3 WHERE id = $1 AND pool_lease = $2 \
             AND status <> 'ended'"
        );
        let changed = self
            .database()
            .execute(statement, params![session_id, from.as_str(), to.as_str()])
            .await?;
        Ok(changed == 1)
    }
}
