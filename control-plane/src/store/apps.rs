//! The store's part for apps as code (`crate::apps`): deployments, the app versions they
//! publish, and invocations. Statuses are the apps module's words, kept as text.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::database::record_of_row;
use super::database::{Row, params, sql};
use super::sql_store::SqlStore;
use super::{StoreResult, scope};

/// A deployment: its status, its public settings as the apps module's JSON `document`,
/// and its environment variable values `sealed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeploymentRecord {
    pub id: String,
    pub org_id: String,
    pub status: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub document: String,
    pub sealed: Option<Vec<u8>>,
    /// Its project. `None` when inserting: the project of the request that makes it
    /// (`super::scope`), its organization's default project outside one.
    pub project_id: Option<String>,
}

/// An app a running deployment defines, at the deployment's version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppVersionRecord {
    pub id: String,
    pub org_id: String,
    pub app_name: String,
    pub version: String,
    pub deployment_id: String,
    /// JSON array of the action names.
    pub actions: String,
    pub created_at: DateTime<Utc>,
    /// Its project. `None` when inserting: the project of the request that makes it
    /// (`super::scope`), its organization's default project outside one.
    pub project_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvocationRecord {
    pub id: String,
    pub org_id: String,
    pub deployment_id: String,
    pub app_name: String,
    pub action_name: String,
    pub version: String,
    pub status: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Payload, output and status reason, as the apps module's JSON.
    pub document: String,
    /// Its project. `None` when inserting: the project of the request that makes it
    /// (`super::scope`), its organization's default project outside one.
    pub project_id: Option<String>,
}

/// Statuses of an invocation that has not finished.
const UNFINISHED_INVOCATION: &str = "status IN ('queued', 'running')";

#[async_trait]
pub trait AppsStore {
    async fn insert_deployment(&self, deployment: &DeploymentRecord) -> StoreResult<()>;
    async fn deployment(&self, org_id: &str, id: &str) -> StoreResult<Option<DeploymentRecord>>;
    /// Oldest first.
    async fn list_deployments(&self, org_id: &str) -> StoreResult<Vec<DeploymentRecord>>;
    /// Deployments of every organization in one of `statuses` (after a restart).
    async fn deployments_in(&self, statuses: &[&str]) -> StoreResult<Vec<DeploymentRecord>>;
    /// Replaces status, `updated_at` and document; false if it is gone.
    async fn update_deployment(&self, deployment: &DeploymentRecord) -> StoreResult<bool>;
    /// Deletes the deployment and the app versions it published; false if it is gone.
    async fn delete_deployment(&self, org_id: &str, id: &str) -> StoreResult<bool>;

    /// Fails with `Conflict` when the organization has that app at that version.
    async fn insert_app_version(&self, app: &AppVersionRecord) -> StoreResult<()>;
    async fn app_version(
        &self, org_id: &str, app_name: &str, version: &str,
    ) -> StoreResult<Option<AppVersionRecord>>;
    /// Oldest first.
    async fn list_app_versions(&self, org_id: &str) -> StoreResult<Vec<AppVersionRecord>>;
    /// Removes what a deployment published; answers how many.
    async fn delete_app_versions(&self, org_id: &str, deployment_id: &str) -> StoreResult<u64>;

    async fn insert_invocation(&self, invocation: &InvocationRecord) -> StoreResult<()>;
    async fn invocation(&self, org_id: &str, id: &str) -> StoreResult<Option<InvocationRecord>>;
    /// Newest first.
    async fn list_invocations(&self, org_id: &str) -> StoreResult<Vec<InvocationRecord>>;
    /// Unfinished invocations of every organization (after a restart).
    async fn unfinished_invocations(&self) -> StoreResult<Vec<InvocationRecord>>;
    /// Replaces status, `finished_at` and document if the stored invocation has not
    /// finished; false otherwise (it is gone, or finished already: the first end wins).
    async fn update_unfinished_invocation(
        &self, invocation: &InvocationRecord,
    ) -> StoreResult<bool>;
}

const DEPLOYMENT_COLUMNS: &str =
    "id, org_id, status, created_at, updated_at, document, sealed, project_id";
const APP_VERSION_COLUMNS: &str =
    "id, org_id, app_name, version, deployment_id, actions, created_at, project_id";
const INVOCATION_COLUMNS: &str = "id, org_id, deployment_id, app_name, action_name, version, \
     status, started_at, finished_at, document, project_id";

fn deployment_from_row(row: &Row<'_>) -> StoreResult<DeploymentRecord> {
    record_of_row!(
        row,
        DeploymentRecord {
            id,
            org_id,
            status,
            created_at,
            updated_at,
            document,
            sealed,
            project_id,
        }
    )
}

fn app_version_from_row(row: &Row<'_>) -> StoreResult<AppVersionRecord> {
    record_of_row!(
        row,
        AppVersionRecord {
            id,
            org_id,
            app_name,
            version,
            deployment_id,
            actions,
            created_at,
            project_id,
        }
    )
}

fn invocation_from_row(row: &Row<'_>) -> StoreResult<InvocationRecord> {
    record_of_row!(
        row,
        InvocationRecord {
            id,
            org_id,
            deployment_id,
            app_name,
            action_name,
            version,
            status,
            started_at,
            finished_at,
            document,
            project_id,
        }
    )
}

#[async_trait]
impl AppsStore for SqlStore {
    async fn insert_deployment(&self, d: &DeploymentRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO deployments ({DEPLOYMENT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, \
             $6, $7, COALESCE($8, (SELECT id FROM projects WHERE org_id = $2 AND is_default)))"
        );
        self.database()
            .execute(
                statement,
                params![
                    d.id,
                    d.org_id,
                    d.status,
                    d.created_at,
                    d.updated_at,
                    d.document,
                    d.sealed,
                    d.project_id.clone().or_else(scope::current)
                ],
            )
            .await?;
        Ok(())
    }

    async fn deployment(&self, org_id: &str, id: &str) -> StoreResult<Option<DeploymentRecord>> {
        let statement = sql!(
            "SELECT {DEPLOYMENT_COLUMNS} FROM deployments WHERE org_id = $1 AND id = $2 \
             AND (CAST($3 AS TEXT) IS NULL OR project_id = $3)"
        );
        self.database()
            .query_opt(statement, params![org_id, id, scope::current()], deployment_from_row)
            .await
    }

    async fn list_deployments(&self, org_id: &str) -> StoreResult<Vec<DeploymentRecord>> {
        let statement = sql!(
            "SELECT {DEPLOYMENT_COLUMNS} FROM deployments WHERE org_id = $1 \
             AND (CAST($2 AS TEXT) IS NULL OR project_id = $2) ORDER BY created_at, id"
        );
        self.database()
            .query(statement, params![org_id, scope::current()], deployment_from_row)
            .await
    }

    async fn deployments_in(&self, statuses: &[&str]) -> StoreResult<Vec<DeploymentRecord>> {
        let statement =
            sql!("SELECT {DEPLOYMENT_COLUMNS} FROM deployments ORDER BY created_at, id");
        let all = self.database().query(statement, params![], deployment_from_row).await?;
        Ok(all.into_iter().filter(|d| statuses.contains(&d.status.as_str())).collect())
    }

    async fn update_deployment(&self, d: &DeploymentRecord) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE deployments SET status = $3, updated_at = $4, document = $5 \
             WHERE org_id = $1 AND id = $2"
        );
        let updated = self
            .database()
            .execute(statement, params![d.org_id, d.id, d.status, d.updated_at, d.document])
            .await?;
        Ok(updated == 1)
    }

    async fn delete_deployment(&self, org_id: &str, id: &str) -> StoreResult<bool> {
        self.delete_app_versions(org_id, id).await?;
        let statement = sql!("DELETE FROM deployments WHERE org_id = $1 AND id = $2");
        let deleted = self.database().execute(statement, params![org_id, id]).await?;
        Ok(deleted == 1)
    }

    async fn insert_app_version(&self, a: &AppVersionRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO app_versions ({APP_VERSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, \
             $6, $7, COALESCE($8, (SELECT id FROM projects WHERE org_id = $2 AND is_default)))"
        );
        self.database()
            .execute(
                statement,
                params![
                    a.id,
                    a.org_id,
                    a.app_name,
                    a.version,
                    a.deployment_id,
                    a.actions,
                    a.created_at,
                    a.project_id.clone().or_else(scope::current)
                ],
            )
            .await?;
        Ok(())
    }

    async fn app_version(
        &self, org_id: &str, app_name: &str, version: &str,
    ) -> StoreResult<Option<AppVersionRecord>> {
        let statement = sql!(
            "SELECT {APP_VERSION_COLUMNS} FROM app_versions \
             WHERE org_id = $1 AND app_name = $2 AND version = $3 AND (CAST($4 AS TEXT) IS NULL OR project_id = $4)"
        );
        self.database()
            .query_opt(
                statement,
                params![org_id, app_name, version, scope::current()],
                app_version_from_row,
            )
            .await
    }

    async fn list_app_versions(&self, org_id: &str) -> StoreResult<Vec<AppVersionRecord>> {
        let statement = sql!(
            "SELECT {APP_VERSION_COLUMNS} FROM app_versions WHERE org_id = $1 \
             AND (CAST($2 AS TEXT) IS NULL OR project_id = $2) ORDER BY created_at, id"
        );
        self.database()
            .query(statement, params![org_id, scope::current()], app_version_from_row)
            .await
    }

    async fn delete_app_versions(&self, org_id: &str, deployment_id: &str) -> StoreResult<u64> {
        let statement = sql!("DELETE FROM app_versions WHERE org_id = $1 AND deployment_id = $2");
        self.database().execute(statement, params![org_id, deployment_id]).await
    }

    async fn insert_invocation(&self, i: &InvocationRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO invocations ({INVOCATION_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, COALESCE($11, (SELECT id FROM projects WHERE org_id = $2 AND is_default)))"
        );
        self.database()
            .execute(
                statement,
                params![
                    i.id,
                    i.org_id,
                    i.deployment_id,
                    i.app_name,
                    i.action_name,
                    i.version,
                    i.status,
                    i.started_at,
                    i.finished_at,
                    i.document,
                    i.project_id.clone().or_else(scope::current)
                ],
            )
            .await?;
        Ok(())
    }

    async fn invocation(&self, org_id: &str, id: &str) -> StoreResult<Option<InvocationRecord>> {
        let statement = sql!(
            "SELECT {INVOCATION_COLUMNS} FROM invocations WHERE org_id = $1 AND id = $2 \
             AND (CAST($3 AS TEXT) IS NULL OR project_id = $3)"
        );
        self.database()
            .query_opt(statement, params![org_id, id, scope::current()], invocation_from_row)
            .await
    }

    async fn list_invocations(&self, org_id: &str) -> StoreResult<Vec<InvocationRecord>> {
        let statement = sql!(
            "SELECT {INVOCATION_COLUMNS} FROM invocations WHERE org_id = $1 \
             AND (CAST($2 AS TEXT) IS NULL OR project_id = $2) ORDER BY started_at DESC, id DESC"
        );
        self.database()
            .query(statement, params![org_id, scope::current()], invocation_from_row)
            .await
    }

    async fn unfinished_invocations(&self) -> StoreResult<Vec<InvocationRecord>> {
        let statement =
            sql!("SELECT {INVOCATION_COLUMNS} FROM invocations WHERE {UNFINISHED_INVOCATION}");
        self.database().query(statement, params![], invocation_from_row).await
    }

    async fn update_unfinished_invocation(&self, i: &InvocationRecord) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE invocations SET status = $3, finished_at = $4, document = $5 \
             WHERE org_id = $1 AND id = $2 AND {UNFINISHED_INVOCATION}"
        );
        let updated = self
            .database()
            .execute(statement, params![i.org_id, i.id, i.status, i.finished_at, i.document])
            .await?;
        Ok(updated == 1)
    }
}
