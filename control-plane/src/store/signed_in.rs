//! The store's part for signed-in sessions (`crate::people::sessions`): each session's
//! organization and principal, found by the SHA-256 of the secret its cookie holds.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::StoreResult;
use super::database::record_of_row;
use super::database::{Row, params, sql};
use super::sql_store::SqlStore;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedInRecord {
    pub secret_hash: String,
    pub org_id: String,
    /// Who signed in, as JSON (`crate::people::sessions::Principal`).
    pub principal: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

#[async_trait]
pub trait SignedInStore: Send + Sync {
    /// Keeps a new session, and forgets the expired ones.
    async fn insert_signed_in(&self, session: &SignedInRecord) -> StoreResult<()>;
    /// The session whose secret hashes to `secret_hash`, unless it expired before `now`.
    async fn signed_in(
        &self, secret_hash: &str, now: DateTime<Utc>,
    ) -> StoreResult<Option<SignedInRecord>>;
    /// Ends the session; whether there was one.
    async fn delete_signed_in(&self, secret_hash: &str) -> StoreResult<bool>;
}

const COLUMNS: &str = "secret_hash, org_id, principal, created_at, expires_at";

fn from_row(row: &Row<'_>) -> StoreResult<SignedInRecord> {
    record_of_row!(row, SignedInRecord { secret_hash, org_id, principal, created_at, expires_at })
}

#[async_trait]
impl SignedInStore for SqlStore {
    async fn insert_signed_in(&self, s: &SignedInRecord) -> StoreResult<()> {
        let statement = sql!("DELETE FROM signed_in_sessions WHERE expires_at < $1");
        self.database().execute(statement, params![s.created_at]).await?;
        let statement =
            sql!("INSERT INTO signed_in_sessions ({COLUMNS}) VALUES ($1, $2, $3, $4, $5)");
        self.database()
            .execute(
                statement,
                params![s.secret_hash, s.org_id, s.principal, s.created_at, s.expires_at],
            )
            .await?;
        Ok(())
    }

    async fn signed_in(
        &self, secret_hash: &str, now: DateTime<Utc>,
    ) -> StoreResult<Option<SignedInRecord>> {
        let statement = sql!(
            "SELECT {COLUMNS} FROM signed_in_sessions \
             WHERE secret_hash = $1 AND expires_at > $2"
        );
        self.database().query_opt(statement, params![secret_hash, now], from_row).await
    }

    async fn delete_signed_in(&self, secret_hash: &str) -> StoreResult<bool> {
        let statement = sql!("DELETE FROM signed_in_sessions WHERE secret_hash = $1");
        let deleted = self.database().execute(statement, params![secret_hash]).await?;
        Ok(deleted > 0)
    }
}
