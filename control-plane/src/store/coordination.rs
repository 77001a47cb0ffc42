//! The store's part in coordinating control-plane replicas that share one database:
//! locks that serialize a decision across replicas, and leases that name which replica
//! runs a piece of background work.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::mpsc;

use super::StoreResult;
pub use super::database::ExclusiveLock;
use super::database::{params, sql};
use super::rows::count_from_row;
use super::sql_store::SqlStore;

/// How long an admission waits for another replica's: admissions take milliseconds.
const ADMISSION_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[async_trait]
pub trait CoordinationStore {
    /// Serializes admission decisions about one organization (count its browsers, then
    /// insert one) across every replica, until the lock is released.
    async fn lock_admission(&self, org_id: &str) -> StoreResult<ExclusiveLock>;

    /// Serializes decisions to start one more browser VM anywhere in the deployment
    /// (count every live VM, then insert one) across every replica. Taken after an
    /// organization's lock, never before it.
    async fn lock_host_admission(&self) -> StoreResult<ExclusiveLock>;

    /// Browser VMs live in the deployment: sessions not ended, of every organization,
    /// pools' and standby browsers included.
    async fn live_vm_count(&self) -> StoreResult<u64>;

    /// The database's clock, which times leases (replicas' own clocks may differ).
    async fn clock(&self) -> StoreResult<DateTime<Utc>>;

    /// Takes or renews the lease `name` for `holder` until `expires_at`; true if `holder`
    /// holds it now. A lease another holder let expire (`now` past its end) is taken.
    async fn hold_lease(
        &self, name: &str, holder: &str, now: DateTime<Utc>, expires_at: DateTime<Utc>,
    ) -> StoreResult<bool>;

    /// Gives the lease up, if `holder` has it (another replica may take it at once).
    async fn release_lease(&self, name: &str, holder: &str) -> StoreResult<()>;

    /// Who holds the lease `name` and until when, expired or not.
    async fn lease(&self, name: &str) -> StoreResult<Option<(String, DateTime<Utc>)>>;

    /// Records where the replica `id` answers the others.
    async fn register_replica(&self, id: &str, address: &str, at: DateTime<Utc>)
    -> StoreResult<()>;

    /// Where the replica `id` answers, if it registered.
    async fn replica_address(&self, id: &str) -> StoreResult<Option<String>>;

    /// Holders of the unexpired leases whose name starts with `prefix`.
    async fn lease_holders(&self, prefix: &str, now: DateTime<Utc>) -> StoreResult<Vec<String>>;

    /// Sends `payload` to every listener of `channel`, in every replica.
    async fn notify(&self, channel: &str, payload: &str) -> StoreResult<()>;

    /// What is sent to `channel` from now on; `None` where one process has the store
    /// (SQLite): it then tells itself.
    fn listen(&self, channel: &str) -> Option<mpsc::UnboundedReceiver<String>>;

    /// Makes `to` the owner of the live session if `from` still is; true if it did. Of
    /// replicas racing to adopt a session, one wins.
    async fn claim_session(&self, id: &str, from: Option<&str>, to: &str) -> StoreResult<bool>;

    /// The replica that serves the live session `id`.
    async fn session_owner(&self, id: &str) -> StoreResult<Option<String>>;

    /// Records that the session was used at `at` (kept if it was used later already).
    async fn record_activity(&self, id: &str, at: DateTime<Utc>) -> StoreResult<()>;

    /// When each live session was last used through any replica (`None`: not since it
    /// started).
    async fn session_activity(&self) -> StoreResult<Vec<(String, Option<DateTime<Utc>>)>>;
}

#[async_trait]
impl CoordinationStore for SqlStore {
    async fn lock_admission(&self, org_id: &str) -> StoreResult<ExclusiveLock> {
        self.database().exclusive(&format!("admission of {org_id}"), ADMISSION_WAIT).await
    }

    async fn lock_host_admission(&self) -> StoreResult<ExclusiveLock> {
        // Not of the form "admission of …": no organization's lock has this key.
        self.database().exclusive("host admission", ADMISSION_WAIT).await
    }

    async fn live_vm_count(&self) -> StoreResult<u64> {
        let statement = sql!("SELECT COUNT(*) FROM browser_sessions WHERE status <> 'ended'");
        let count = self.database().query_one(statement, params![], count_from_row).await?;
        Ok(count as u64)
    }

    async fn clock(&self) -> StoreResult<DateTime<Utc>> {
        self.database().now().await
    }

    async fn hold_lease(
        &self, name: &str, holder: &str, now: DateTime<Utc>, expires_at: DateTime<Utc>,
    ) -> StoreResult<bool> {
        let statement = sql!(
            "INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
             expires_at = excluded.expires_at \
             WHERE leases.holder = excluded.holder OR leases.expires_at < $4"
        );
        let changed =
            self.database().execute(statement, params![name, holder, expires_at, now]).await?;
        Ok(changed == 1)
    }

    async fn release_lease(&self, name: &str, holder: &str) -> StoreResult<()> {
        let statement = sql!("DELETE FROM leases WHERE name = $1 AND holder = $2");
        self.database().execute(statement, params![name, holder]).await?;
        Ok(())
    }

    async fn lease(&self, name: &str) -> StoreResult<Option<(String, DateTime<Utc>)>> {
        let statement = sql!("SELECT holder, expires_at FROM leases WHERE name = $1");
        self.database()
            .query_opt(statement, params![name], |row| Ok((row.get(0)?, row.get(1)?)))
            .await
    }

    async fn register_replica(
        &self, id: &str, address: &str, at: DateTime<Utc>,
    ) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO replicas (id, address, joined_at) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO UPDATE SET address = excluded.address, \
             joined_at = excluded.joined_at"
        );
        self.database().execute(statement, params![id, address, at]).await?;
        Ok(())
    }

    async fn replica_address(&self, id: &str) -> StoreResult<Option<String>> {
        let statement = sql!("SELECT address FROM replicas WHERE id = $1");
        self.database().query_opt(statement, params![id], |row| row.get(0)).await
    }

    async fn lease_holders(&self, prefix: &str, now: DateTime<Utc>) -> StoreResult<Vec<String>> {
        // A prefix match without LIKE's wildcards.
        let statement = sql!(
            "SELECT holder FROM leases WHERE substr(name, 1, length($1)) = $1 \
             AND expires_at > $2"
        );
        self.database().query(statement, params![prefix, now], |row| row.get(0)).await
    }

    async fn notify(&self, channel: &str, payload: &str) -> StoreResult<()> {
        self.database().notify(channel, payload).await
    }

    fn listen(&self, channel: &str) -> Option<mpsc::UnboundedReceiver<String>> {
        self.database().listen(channel)
    }

    async fn claim_session(&self, id: &str, from: Option<&str>, to: &str) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE browser_sessions SET owner = $3 WHERE id = $1 AND status <> 'ended' \
             AND (owner = $2 OR (owner IS NULL AND $2 IS NULL))"
        );
        let changed = self.database().execute(statement, params![id, from, to]).await?;
        Ok(changed == 1)
    }

    async fn session_owner(&self, id: &str) -> StoreResult<Option<String>> {
        let owner: Option<Option<String>> = self
            .database()
            .query_opt(
                sql!("SELECT owner FROM browser_sessions WHERE id = $1 AND status <> 'ended'"),
                params![id],
                |row| row.get(0),
            )
            .await?;
        Ok(owner.flatten())
    }

    async fn record_activity(&self, id: &str, at: DateTime<Utc>) -> StoreResult<()> {
        let statement = sql!(
            "UPDATE browser_sessions SET last_active_at = $2 WHERE id = $1 \
             AND (last_active_at IS NULL OR last_active_at < $2)"
        );
        self.database().execute(statement, params![id, at]).await?;
        Ok(())
    }

    async fn session_activity(&self) -> StoreResult<Vec<(String, Option<DateTime<Utc>>)>> {
        let statement =
            sql!("SELECT id, last_active_at FROM browser_sessions WHERE status <> 'ended'");
        self.database().query(statement, params![], |row| Ok((row.get(0)?, row.get(1)?))).await
    }
}
