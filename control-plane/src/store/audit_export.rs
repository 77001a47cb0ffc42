//! The store's part for delivering audit logs (`crate::audit::export`): each
//! organization's export destinations with how far delivery got, and the records after
//! that point, oldest first.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::AuditRecord;
use super::StoreResult;
use super::audit::{AUDIT_COLUMNS, audit_from_row};
use super::database::{Row, params, sql};
use super::sql_store::SqlStore;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportDestinationRecord {
    pub id: String,
    pub org_id: String,
    pub bucket: String,
    pub prefix: String,
    pub region: String,
    pub role_arn: String,
    pub kms_key_id: Option<String>,
    /// What our role must present to assume `role_arn` (`sts:ExternalId`).
    pub external_id: String,
    /// `active` or `paused`.
    pub status: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The last record delivered, `(ts_us, id)`: delivery goes on after it.
    pub cursor: (i64, String),
    pub consecutive_failures: i64,
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
    pub last_success_at: Option<DateTime<Utc>>,
    pub next_attempt_at: Option<DateTime<Utc>>,
}

#[async_trait]
pub trait AuditExportStore: Send + Sync {
    async fn insert_export_destination(
        &self, destination: &ExportDestinationRecord,
    ) -> StoreResult<()>;
    async fn export_destination(
        &self, org_id: &str, id: &str,
    ) -> StoreResult<Option<ExportDestinationRecord>>;
    /// The organization's destinations, oldest first; every organization's with `None`.
    async fn export_destinations(
        &self, org_id: Option<&str>,
    ) -> StoreResult<Vec<ExportDestinationRecord>>;
    /// Writes what the API changes (bucket, prefix, region, role, key, status, cursor).
    async fn update_export_destination(
        &self, destination: &ExportDestinationRecord,
    ) -> StoreResult<bool>;
    async fn delete_export_destination(&self, org_id: &str, id: &str) -> StoreResult<bool>;
    /// A delivery up to `cursor` succeeded at `at`. Only while the destination is still
    /// active and where delivery started (`from`): a pause or resume meanwhile wins.
    async fn export_delivered(
        &self, id: &str, from: &(i64, String), cursor: &(i64, String), at: DateTime<Utc>,
    ) -> StoreResult<()>;
    /// A delivery failed with `error`; the next attempt is not before `next_attempt_at`.
    async fn export_failed(
        &self, id: &str, error: &str, at: DateTime<Utc>, next_attempt_at: DateTime<Utc>,
    ) -> StoreResult<()>;
    /// The organization's records after `after`, older than `until_us`, oldest first.
    async fn audit_records_after(
        &self, org_id: &str, after: &(i64, String), until_us: i64, limit: i64,
    ) -> StoreResult<Vec<AuditRecord>>;
}

const DESTINATION_COLUMNS: &str = "id, org_id, bucket, prefix, region, role_arn, kms_key_id, \
     external_id, status, created_at, updated_at, cursor_ts_us, cursor_id, consecutive_failures, \
     last_error, last_error_at, last_success_at, next_attempt_at";

fn destination_from_row(row: &Row<'_>) -> StoreResult<ExportDestinationRecord> {
    Ok(ExportDestinationRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        bucket: row.get(2)?,
        prefix: row.get(3)?,
        region: row.get(4)?,
        role_arn: row.get(5)?,
        kms_key_id: row.get(6)?,
        external_id: row.get(7)?,
        status: row.get(8)?,
        created_at: row.get(9)?,
        updated_at: row.get(10)?,
        cursor: (row.get(11)?, row.get(12)?),
        consecutive_failures: row.get(13)?,
        last_error: row.get(14)?,
        last_error_at: row.get(15)?,
        last_success_at: row.get(16)?,
        next_attempt_at: row.get(17)?,
    })
}

#[async_trait]
impl AuditExportStore for SqlStore {
    async fn insert_export_destination(&self, d: &ExportDestinationRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO audit_export_destinations ({DESTINATION_COLUMNS}) VALUES ($1, \
             $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)"
        );
        self.database()
            .execute(
                statement,
                params![
                    d.id,
                    d.org_id,
                    d.bucket,
                    d.prefix,
                    d.region,
                    d.role_arn,
                    d.kms_key_id,
                    d.external_id,
                    d.status,
                    d.created_at,
                    d.updated_at,
                    d.cursor.0,
                    d.cursor.1,
                    d.consecutive_failures,
                    d.last_error,
                    d.last_error_at,
                    d.last_success_at,
                    d.next_attempt_at
                ],
            )
            .await?;
        Ok(())
    }

    async fn export_destination(
        &self, org_id: &str, id: &str,
    ) -> StoreResult<Option<ExportDestinationRecord>> {
        let statement = sql!(
            "SELECT {DESTINATION_COLUMNS} FROM audit_export_destinations \
             WHERE org_id = $1 AND id = $2"
        );
        self.database().query_opt(statement, params![org_id, id], destination_from_row).await
    }

    async fn export_destinations(
        &self, org_id: Option<&str>,
    ) -> StoreResult<Vec<ExportDestinationRecord>> {
        let statement = sql!(
            "SELECT {DESTINATION_COLUMNS} FROM audit_export_destinations \
             WHERE CAST($1 AS TEXT) IS NULL OR org_id = $1 ORDER BY created_at, id"
        );
        self.database().query(statement, params![org_id], destination_from_row).await
    }

    async fn update_export_destination(&self, d: &ExportDestinationRecord) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE audit_export_destinations SET bucket = $3, prefix = $4, region = $5, \
             role_arn = $6, kms_key_id = $7, status = $8, updated_at = $9, \
             cursor_ts_us = $10, cursor_id = $11, consecutive_failures = $12, \
             next_attempt_at = $13 WHERE org_id = $1 AND id = $2"
        );
        let changed = self
            .database()
            .execute(
                statement,
                params![
                    d.org_id,
                    d.id,
                    d.bucket,
                    d.prefix,
                    d.region,
                    d.role_arn,
                    d.kms_key_id,
                    d.status,
                    d.updated_at,
                    d.cursor.0,
                    d.cursor.1,
                    d.consecutive_failures,
                    d.next_attempt_at
                ],
            )
            .await?;
        Ok(changed == 1)
    }

    async fn delete_export_destination(&self, org_id: &str, id: &str) -> StoreResult<bool> {
        let statement = sql!("DELETE FROM audit_export_destinations WHERE org_id = $1 AND id = $2");
        let deleted = self.database().execute(statement, params![org_id, id]).await?;
        Ok(deleted == 1)
    }

    async fn export_delivered(
        &self, id: &str, from: &(i64, String), cursor: &(i64, String), at: DateTime<Utc>,
    ) -> StoreResult<()> {
        let statement = sql!(
            "UPDATE audit_export_destinations SET cursor_ts_us = $2, cursor_id = $3, \
             consecutive_failures = 0, last_success_at = $4, next_attempt_at = NULL \
             WHERE id = $1 AND status = 'active' AND cursor_ts_us = $5 AND cursor_id = $6"
        );
        self.database()
            .execute(statement, params![id, cursor.0, cursor.1, at, from.0, from.1])
            .await?;
        Ok(())
    }

    async fn export_failed(
        &self, id: &str, error: &str, at: DateTime<Utc>, next_attempt_at: DateTime<Utc>,
    ) -> StoreResult<()> {
        let statement = sql!(
            "UPDATE audit_export_destinations SET consecutive_failures = \
             consecutive_failures + 1, last_error = $2, last_error_at = $3, \
             next_attempt_at = $4 WHERE id = $1"
        );
        self.database().execute(statement, params![id, error, at, next_attempt_at]).await?;
        Ok(())
    }

    async fn audit_records_after(
        &self, org_id: &str, after: &(i64, String), until_us: i64, limit: i64,
    ) -> StoreResult<Vec<AuditRecord>> {
        let statement = sql!(
            "SELECT {AUDIT_COLUMNS} FROM audit_log WHERE org_id = $1 \
             AND (ts_us > $2 OR (ts_us = $2 AND id > $3)) AND ts_us < $4 \
             ORDER BY ts_us, id LIMIT $5"
        );
        self.database()
            .query(statement, params![org_id, after.0, after.1, until_us, limit], audit_from_row)
            .await
    }
}
