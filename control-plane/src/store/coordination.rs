//! The store's part in coordinating control-plane replicas that share one database:
//! locks that serialize a decision across replicas, and leases that name which replica
//! runs a piece of background work.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::StoreResult;
pub use super::database::ExclusiveLock;
use super::database::{params, sql};
use super::sql::SqlStore;

#[async_trait]
pub trait CoordinationStore {
    /// Serializes admission decisions about one organization (count its browsers, then
    /// insert one) across every replica, until the lock is released.
    async fn lock_admission(&self, org_id: &str) -> StoreResult<ExclusiveLock>;

    /// Takes or renews the lease `name` for `holder` until `expires_at`; true if `holder`
    /// holds it now. A lease another holder let expire (`now` past its end) is taken.
    async fn hold_lease(
        &self,
        name: &str,
        holder: &str,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> StoreResult<bool>;

    /// Gives the lease up, if `holder` has it (another replica may take it at once).
    async fn release_lease(&self, name: &str, holder: &str) -> StoreResult<()>;

    /// Who holds the lease `name` and until when, expired or not.
    async fn lease(&self, name: &str) -> StoreResult<Option<(String, DateTime<Utc>)>>;
}

#[async_trait]
impl CoordinationStore for SqlStore {
    async fn lock_admission(&self, org_id: &str) -> StoreResult<ExclusiveLock> {
        self.database()
            .exclusive(&format!("admission of {org_id}"))
            .await
    }

    async fn hold_lease(
        &self,
        name: &str,
        holder: &str,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> StoreResult<bool> {
        let changed = self
            .database()
            .execute(
                sql!(
                    "INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
                     expires_at = excluded.expires_at \
                     WHERE leases.holder = excluded.holder OR leases.expires_at < $4"
                ),
                params![name, holder, expires_at, now],
            )
            .await?;
        Ok(changed == 1)
    }

    async fn release_lease(&self, name: &str, holder: &str) -> StoreResult<()> {
        self.database()
            .execute(
                sql!("DELETE FROM leases WHERE name = $1 AND holder = $2"),
                params![name, holder],
            )
            .await?;
        Ok(())
    }

    async fn lease(&self, name: &str) -> StoreResult<Option<(String, DateTime<Utc>)>> {
        self.database()
            .query_opt(
                sql!("SELECT holder, expires_at FROM leases WHERE name = $1"),
                params![name],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .await
    }
}
