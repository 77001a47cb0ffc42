//! The store's part for who may call the API (`crate::access`): API keys, and each
//! organization's default project, which scopes policies' resources.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::database::{Row, params, sql};
use super::sql_store::SqlStore;
use super::{StoreError, StoreResult};
use crate::access::policy::Policy;

/// Who made a key: a person, another key, or the server's command line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedBy {
    pub id: String,
    pub email: String,
    pub name: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub id: String,
    pub org_id: String,
    pub secret_hash: Vec<u8>,
    pub created_at: DateTime<Utc>,
    pub name: String,
    /// `None`: the key may act in every project of its organization.
    pub project_id: Option<String>,
    /// `None`: the key may do anything (in its project, if it has one).
    pub policy: Option<Policy>,
    pub expires_at: Option<DateTime<Utc>>,
    pub deleted_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    /// `None` for keys made before keys recorded their maker.
    pub created_by: Option<CreatedBy>,
    /// The secret's last characters, shown in the masked key.
    pub secret_tail: String,
}

const API_KEY_COLUMNS: &str = "id, org_id, secret_hash, created_at, name, project_id, policy, \
     expires_at, deleted_at, last_used_at, created_by, secret_tail";

fn api_key_from_row(row: &Row<'_>) -> StoreResult<ApiKeyRecord> {
    let json_or_none = |index: usize| -> StoreResult<Option<String>> { row.get(index) };
    let policy = json_or_none(6)?
        .map(|text| serde_json::from_str(&text))
        .transpose()
        .map_err(|error| StoreError::Backend(format!("an API key's policy: {error}")))?;
    let created_by = json_or_none(10)?
        .map(|text| serde_json::from_str(&text))
        .transpose()
        .map_err(|error| StoreError::Backend(format!("an API key's maker: {error}")))?;
    Ok(ApiKeyRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        secret_hash: row.get(2)?,
        created_at: row.get(3)?,
        name: row.get(4)?,
        project_id: row.get(5)?,
        policy,
        expires_at: row.get(7)?,
        deleted_at: row.get(8)?,
        last_used_at: row.get(9)?,
        created_by,
        secret_tail: row.get(11)?,
    })
}

#[async_trait]
pub trait AccessStore {
    async fn insert_api_key(&self, key: &ApiKeyRecord) -> StoreResult<()>;
    /// By id, deleted or not.
    async fn api_key(&self, id: &str) -> StoreResult<Option<ApiKeyRecord>>;
    /// Every key of the organization, deleted ones included, oldest first.
    async fn api_keys(&self, org_id: &str) -> StoreResult<Vec<ApiKeyRecord>>;
    async fn api_key_count(&self) -> StoreResult<u64>;
    /// False if the organization has no such live key.
    async fn rename_api_key(&self, org_id: &str, id: &str, name: &str) -> StoreResult<bool>;
    /// Soft-deletes a live key; false if the organization has no such live key.
    async fn delete_api_key(&self, org_id: &str, id: &str, at: DateTime<Utc>) -> StoreResult<bool>;
    /// Stores `rotated` and moves `old_id`'s end to `old_expires_at`: false (and
    /// `rotated` not kept) if `old_id` is no longer a live key.
    async fn rotate_api_key(
        &self, old_id: &str, old_expires_at: DateTime<Utc>, rotated: &ApiKeyRecord,
    ) -> StoreResult<bool>;
    async fn touch_api_key(&self, id: &str, at: DateTime<Utc>) -> StoreResult<()>;
    /// The organization's default project's id, made on first use.
    async fn default_project_id(&self, org_id: &str) -> StoreResult<String>;
    /// The organization's default project's cap on its concurrent browsers
    /// (`default_project_max_concurrent_sessions`), if it has one.
    async fn concurrency_cap(&self, org_id: &str) -> StoreResult<Option<i64>>;
    async fn set_concurrency_cap(&self, org_id: &str, cap: Option<i64>) -> StoreResult<()>;
}

#[async_trait]
impl AccessStore for SqlStore {
    async fn insert_api_key(&self, key: &ApiKeyRecord) -> StoreResult<()> {
        let policy = key.policy.as_ref().map(json_text);
        let created_by = key.created_by.as_ref().map(json_text);
        let statement = sql!(
            "INSERT INTO api_keys ({API_KEY_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        );
        self.database()
            .execute(
                statement,
                params![
                    key.id,
                    key.org_id,
                    key.secret_hash,
                    key.created_at,
                    key.name,
                    key.project_id,
                    policy,
                    key.expires_at,
                    key.deleted_at,
                    key.last_used_at,
                    created_by,
                    key.secret_tail,
                ],
            )
            .await?;
        Ok(())
    }

    async fn api_key(&self, id: &str) -> StoreResult<Option<ApiKeyRecord>> {
        let statement = sql!("SELECT {API_KEY_COLUMNS} FROM api_keys WHERE id = $1");
        self.database().query_opt(statement, params![id], api_key_from_row).await
    }

    async fn api_keys(&self, org_id: &str) -> StoreResult<Vec<ApiKeyRecord>> {
        let statement = sql!(
            "SELECT {API_KEY_COLUMNS} FROM api_keys WHERE org_id = $1 \
             ORDER BY created_at, id"
        );
        self.database().query(statement, params![org_id], api_key_from_row).await
    }

    async fn api_key_count(&self) -> StoreResult<u64> {
        let statement = sql!("SELECT COUNT(*) FROM api_keys");
        let count =
            self.database().query_one(statement, params![], |row| row.get::<i64>(0)).await?;
        Ok(count as u64)
    }

    async fn rename_api_key(&self, org_id: &str, id: &str, name: &str) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE api_keys SET name = $3 \
             WHERE org_id = $1 AND id = $2 AND deleted_at IS NULL"
        );
        let changed = self.database().execute(statement, params![org_id, id, name]).await?;
        Ok(changed == 1)
    }

    async fn delete_api_key(&self, org_id: &str, id: &str, at: DateTime<Utc>) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE api_keys SET deleted_at = $3 \
             WHERE org_id = $1 AND id = $2 AND deleted_at IS NULL"
        );
        let changed = self.database().execute(statement, params![org_id, id, at]).await?;
        Ok(changed == 1)
    }

    async fn rotate_api_key(
        &self, old_id: &str, old_expires_at: DateTime<Utc>, rotated: &ApiKeyRecord,
    ) -> StoreResult<bool> {
        // The new key first: if the old one cannot be moved (deleted meanwhile), the new
        // one goes again, its secret never shown; a crash in between leaves an unused key.
        self.insert_api_key(rotated).await?;
        let statement = sql!(
            "UPDATE api_keys SET expires_at = $2 \
             WHERE id = $1 AND deleted_at IS NULL"
        );
        let changed = self.database().execute(statement, params![old_id, old_expires_at]).await?;
        if changed != 1 {
            let statement = sql!("DELETE FROM api_keys WHERE id = $1");
            self.database().execute(statement, params![rotated.id]).await?;
            return Ok(false);
        }
        Ok(true)
    }

    async fn touch_api_key(&self, id: &str, at: DateTime<Utc>) -> StoreResult<()> {
        let statement = sql!("UPDATE api_keys SET last_used_at = $2 WHERE id = $1");
        self.database().execute(statement, params![id, at]).await?;
        Ok(())
    }

    async fn default_project_id(&self, org_id: &str) -> StoreResult<String> {
        let now = Utc::now();
        let find = || async {
            let statement = sql!("SELECT id FROM projects WHERE org_id = $1 AND is_default");
            self.database().query_opt(statement, params![org_id], |row| row.get::<String>(0)).await
        };
        if let Some(id) = find().await? {
            return Ok(id);
        }
        // Two replicas may both get here: the unique index keeps one default.
        let statement = sql!(
            "INSERT INTO projects (id, org_id, name, status, is_default, created_at, \
             updated_at) VALUES ($1, $2, 'default', 'active', TRUE, $3, $3) \
             ON CONFLICT DO NOTHING"
        );
        self.database()
            .execute(statement, params![crate::ids::new_id("proj"), org_id, now])
            .await?;
        find()
            .await?
            .ok_or_else(|| StoreError::Backend("no default project after making one".into()))
    }

    async fn concurrency_cap(&self, org_id: &str) -> StoreResult<Option<i64>> {
        let statement = sql!(
            "SELECT max_concurrent_sessions FROM projects \
             WHERE org_id = $1 AND is_default"
        );
        let cap = self
            .database()
            .query_opt(statement, params![org_id], |row| row.get::<Option<i64>>(0))
            .await?;
        Ok(cap.flatten())
    }

    async fn set_concurrency_cap(&self, org_id: &str, cap: Option<i64>) -> StoreResult<()> {
        let statement = sql!(
            "UPDATE projects SET max_concurrent_sessions = $2 \
             WHERE org_id = $1 AND is_default"
        );
        self.database().execute(statement, params![org_id, cap]).await?;
        Ok(())
    }
}

fn json_text<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
