//! The store's part for projects: each organization's projects, their limits, and what
//! counts against them. Which rows a request sees is `scope`'s part.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::StoreResult;
use super::database::record_of_row;
use super::database::{Row, params, sql};
use super::sql_store::SqlStore;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProjectRecord {
    pub id: String,
    pub org_id: String,
    pub name: String,
    /// `active` or `archived`.
    pub status: String,
    /// The project that holds what is made without one; it cannot be deleted.
    pub is_default: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Most browsers (on demand and pool reservations together); `None`: no cap.
    pub max_concurrent_sessions: Option<i64>,
    /// Most invocations running at once; `None`: no cap.
    pub max_concurrent_invocations: Option<i64>,
}

impl ProjectRecord {
    /// A new active project of `org_id` named `name`, without limits.
    pub fn new(org_id: &str, name: &str) -> Self {
        let now = Utc::now();
        Self {
            id: crate::ids::new_id("proj"),
            org_id: org_id.to_owned(),
            name: name.to_owned(),
            status: "active".into(),
            is_default: false,
            created_at: now,
            updated_at: now,
            max_concurrent_sessions: None,
            max_concurrent_invocations: None,
        }
    }
}

#[async_trait]
pub trait ProjectsStore: Send + Sync {
    /// Conflict when a live project of the organization has the name.
    async fn insert_project(&self, project: &ProjectRecord) -> StoreResult<()>;
    /// A live project of the organization, by id first, then by name.
    async fn project(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<ProjectRecord>>;
    /// A live project by its id alone (its organization known from elsewhere).
    async fn project_by_id(&self, id: &str) -> StoreResult<Option<ProjectRecord>>;
    /// The organization's live projects, oldest first.
    async fn list_projects(&self, org_id: &str) -> StoreResult<Vec<ProjectRecord>>;
    /// Writes name, status and limits; Conflict when the new name is taken.
    async fn update_project(&self, project: &ProjectRecord) -> StoreResult<bool>;
    /// Soft-deletes a project that holds nothing (see `project_in_use`).
    async fn delete_project(&self, id: &str, at: DateTime<Utc>) -> StoreResult<bool>;
    /// What still lives in the project, such as "2 browsers", if anything.
    async fn project_in_use(&self, id: &str) -> StoreResult<Option<String>>;
    /// The project's live browsers outside pools, and the browsers its pools reserve.
    async fn project_browsers(&self, id: &str) -> StoreResult<(i64, i64)>;
}

const PROJECT_COLUMNS: &str = "id, org_id, name, status, is_default, created_at, updated_at, \
     max_concurrent_sessions, max_concurrent_invocations";

fn project_from_row(row: &Row<'_>) -> StoreResult<ProjectRecord> {
    record_of_row!(
        row,
        ProjectRecord {
            id,
            org_id,
            name,
            status,
            is_default,
            created_at,
            updated_at,
            max_concurrent_sessions,
            max_concurrent_invocations,
        }
    )
}

/// What a project may not hold when it is deleted, in the order `IN_USE` counts them.
const IN_USE_LABELS: [&str; 9] = [
    "browsers",
    "browser pools",
    "profiles",
    "extensions",
    "proxies",
    "credentials or credential providers",
    "auth connections",
    "deployments",
    "telemetry destinations",
];
const IN_USE: &str = "SELECT \
    (SELECT COUNT(*) FROM browser_sessions WHERE project_id = $1 AND status <> 'ended'), \
    (SELECT COUNT(*) FROM browser_pools WHERE project_id = $1 AND deleted_at IS NULL), \
    (SELECT COUNT(*) FROM profiles WHERE project_id = $1), \
    (SELECT COUNT(*) FROM extensions WHERE project_id = $1), \
    (SELECT COUNT(*) FROM proxies WHERE project_id = $1 AND deleted_at IS NULL), \
    (SELECT COUNT(*) FROM secrets WHERE project_id = $1), \
    (SELECT COUNT(*) FROM auth_connections WHERE project_id = $1), \
    (SELECT COUNT(*) FROM deployments WHERE project_id = $1 \
        AND status IN ('queued', 'in_progress', 'running')), \
    (SELECT COUNT(*) FROM telemetry_destinations WHERE project_id = $1)";

#[async_trait]
impl ProjectsStore for SqlStore {
    async fn insert_project(&self, p: &ProjectRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO projects ({PROJECT_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        );
        self.database()
            .execute(
                statement,
                params![
                    p.id,
                    p.org_id,
                    p.name,
                    p.status,
                    p.is_default,
                    p.created_at,
                    p.updated_at,
                    p.max_concurrent_sessions,
                    p.max_concurrent_invocations
                ],
            )
            .await?;
        Ok(())
    }

    async fn project(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<ProjectRecord>> {
        let statement = sql!(
            "SELECT {PROJECT_COLUMNS} FROM projects WHERE org_id = $1 \
             AND deleted_at IS NULL AND (id = $2 OR name = $2) \
             ORDER BY CASE WHEN id = $2 THEN 0 ELSE 1 END LIMIT 1"
        );
        self.database().query_opt(statement, params![org_id, id_or_name], project_from_row).await
    }

    async fn project_by_id(&self, id: &str) -> StoreResult<Option<ProjectRecord>> {
        let statement =
            sql!("SELECT {PROJECT_COLUMNS} FROM projects WHERE id = $1 AND deleted_at IS NULL");
        self.database().query_opt(statement, params![id], project_from_row).await
    }

    async fn list_projects(&self, org_id: &str) -> StoreResult<Vec<ProjectRecord>> {
        let statement = sql!(
            "SELECT {PROJECT_COLUMNS} FROM projects WHERE org_id = $1 \
             AND deleted_at IS NULL ORDER BY created_at, id"
        );
        self.database().query(statement, params![org_id], project_from_row).await
    }

    async fn update_project(&self, p: &ProjectRecord) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE projects SET name = $2, status = $3, updated_at = $4, \
             max_concurrent_sessions = $5, max_concurrent_invocations = $6 \
             WHERE id = $1 AND deleted_at IS NULL"
        );
        let changed = self
            .database()
            .execute(
                statement,
                params![
                    p.id,
                    p.name,
                    p.status,
                    p.updated_at,
                    p.max_concurrent_sessions,
                    p.max_concurrent_invocations
                ],
            )
            .await?;
        Ok(changed == 1)
    }

    async fn delete_project(&self, id: &str, at: DateTime<Utc>) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE projects SET deleted_at = $2 WHERE id = $1 AND deleted_at IS NULL \
             AND NOT is_default"
        );
        let changed = self.database().execute(statement, params![id, at]).await?;
        Ok(changed == 1)
    }

    async fn project_in_use(&self, id: &str) -> StoreResult<Option<String>> {
        let statement = sql!("{IN_USE}");
        let counts = self
            .database()
            .query_one(statement, params![id], |row| {
                (0..IN_USE_LABELS.len())
                    .map(|index| row.get::<i64>(index))
                    .collect::<StoreResult<Vec<i64>>>()
            })
            .await?;
        let held: Vec<String> = IN_USE_LABELS
            .iter()
            .zip(counts)
            .filter(|(_, count)| *count > 0)
            .map(|(label, count)| format!("{count} {label}"))
            .collect();
        Ok((!held.is_empty()).then(|| held.join(", ")))
    }

    async fn project_browsers(&self, id: &str) -> StoreResult<(i64, i64)> {
        let live: i64 = self
            .database()
            .query_one(
                sql!(
                    "SELECT COUNT(*) FROM browser_sessions WHERE project_id = $1 \
                     AND status <> 'ended' AND pool_id IS NULL"
                ),
                params![id],
                |row| row.get(0),
            )
            .await?;
        let reserved: i64 = self
            .database()
            .query_one(
                sql!(
                    "SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM browser_pools \
                     WHERE project_id = $1 AND deleted_at IS NULL"
                ),
                params![id],
                |row| row.get(0),
            )
            .await?;
        Ok((live, reserved))
    }
}
