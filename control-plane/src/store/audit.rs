//! The store's part for the audit log (`crate::audit`): one row per recorded call,
//! read newest first within a time range, pruned by age.

use async_trait::async_trait;

use super::StoreResult;
use super::database::record_of_row;
use super::database::{Row, params, sql};
use super::sql_store::SqlStore;

/// One recorded call. Times are microseconds since the epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditRecord {
    pub id: String,
    pub org_id: String,
    pub ts_us: i64,
    pub method: String,
    /// Without its query string.
    pub path: String,
    /// The matched route pattern (`/browsers/{id}`), or the path when none matched.
    pub route: String,
    pub status: i64,
    pub duration_ms: i64,
    pub client_ip: String,
    pub user_agent: String,
    pub domain: String,
    /// `api_key`, `invocation_key` or `session_token`.
    pub auth_strategy: String,
    /// The key whose rights the call had, if any.
    pub api_key_id: String,
    /// The person who signed in (their provider's subject) and their email, if a person
    /// called.
    pub user_id: String,
    pub email: String,
    /// The action the route needs (`browsers:use`) and on what.
    pub action: String,
    pub resource: String,
    /// `allowed`, `denied` (401, 403) or `failed` (another error).
    pub outcome: String,
    pub request_id: String,
}

/// Which records to read: `[since_us, until_us)`, older than the cursor if any, newest
/// first. Empty filters match everything.
#[derive(Clone, Debug, Default)]
pub struct AuditQuery {
    pub org_id: String,
    pub since_us: i64,
    pub until_us: i64,
    /// The last record of the previous page: `(ts_us, id)`.
    pub before: Option<(i64, String)>,
    pub method: String,
    /// Methods to leave out.
    pub exclude_methods: Vec<String>,
    pub auth_strategy: String,
    /// Free text in the path, key id, client address or status (case-insensitive).
    pub search: String,
    /// Key ids matched as well as `search`.
    pub search_key_ids: Vec<String>,
    pub limit: i64,
}

pub(super) const AUDIT_COLUMNS: &str = "id, org_id, ts_us, method, path, route, status, duration_ms, \
     client_ip, user_agent, domain, auth_strategy, api_key_id, action, resource, outcome, \
     request_id, user_id, email";

pub(super) fn audit_from_row(row: &Row<'_>) -> StoreResult<AuditRecord> {
    record_of_row!(
        row,
        AuditRecord {
            id,
            org_id,
            ts_us,
            method,
            path,
            route,
            status,
            duration_ms,
            client_ip,
            user_agent,
            domain,
            auth_strategy,
            api_key_id,
            action,
            resource,
            outcome,
            request_id,
            user_id,
            email,
        }
    )
}

#[async_trait]
pub trait AuditStore {
    async fn insert_audit(&self, record: &AuditRecord) -> StoreResult<()>;
    async fn audit_records(&self, query: &AuditQuery) -> StoreResult<Vec<AuditRecord>>;
    /// Forgets every record older than `before_us`; answers how many.
    async fn prune_audit(&self, before_us: i64) -> StoreResult<u64>;
}

/// `,a,b,` for a `LIKE '%,' || column || ',%'` test; empty for no filter.
fn list_filter(values: &[String]) -> String {
    if values.is_empty() { String::new() } else { format!(",{},", values.join(",")) }
}

/// `%text%` for a case-insensitive `LIKE … ESCAPE '\'`; empty for no filter.
fn contains_pattern(text: &str) -> String {
    if text.is_empty() {
        return String::new();
    }
    let mut pattern = String::from("%");
    for c in text.to_lowercase().chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

#[async_trait]
impl AuditStore for SqlStore {
    async fn insert_audit(&self, r: &AuditRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO audit_log ({AUDIT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, \
             $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)"
        );
        self.database()
            .execute(
                statement,
                params![
                    r.id,
                    r.org_id,
                    r.ts_us,
                    r.method,
                    r.path,
                    r.route,
                    r.status,
                    r.duration_ms,
                    r.client_ip,
                    r.user_agent,
                    r.domain,
                    r.auth_strategy,
                    r.api_key_id,
                    r.action,
                    r.resource,
                    r.outcome,
                    r.request_id,
                    r.user_id,
                    r.email,
                ],
            )
            .await?;
        Ok(())
    }

    async fn audit_records(&self, q: &AuditQuery) -> StoreResult<Vec<AuditRecord>> {
        let (before_us, before_id) = q.before.clone().unwrap_or((i64::MAX, String::new()));
        let statement = sql!(
            "SELECT {AUDIT_COLUMNS} FROM audit_log WHERE org_id = $1 \
             AND ts_us >= $2 AND ts_us < $3 \
             AND (ts_us < $4 OR (ts_us = $4 AND $5 <> '' AND id < $5)) \
             AND ($6 = '' OR method = $6) \
             AND ($7 = '' OR $7 NOT LIKE '%,' || method || ',%') \
             AND ($8 = '' OR auth_strategy = $8) \
             AND (($9 = '' AND $10 = '') \
             OR ($9 <> '' AND (lower(path) LIKE $9 ESCAPE '\\' \
             OR lower(api_key_id) LIKE $9 ESCAPE '\\' \
             OR lower(client_ip) LIKE $9 ESCAPE '\\' \
             OR CAST(status AS TEXT) LIKE $9 ESCAPE '\\')) \
             OR ($10 <> '' AND $10 LIKE '%,' || lower(api_key_id) || ',%')) \
             ORDER BY ts_us DESC, id DESC LIMIT $11"
        );
        self.database()
            .query(
                statement,
                params![
                    q.org_id,
                    q.since_us,
                    q.until_us,
                    before_us,
                    before_id,
                    q.method,
                    list_filter(&q.exclude_methods),
                    q.auth_strategy,
                    contains_pattern(&q.search),
                    list_filter(&q.search_key_ids),
                    q.limit,
                ],
                audit_from_row,
            )
            .await
    }

    async fn prune_audit(&self, before_us: i64) -> StoreResult<u64> {
        let statement = sql!("DELETE FROM audit_log WHERE ts_us < $1");
        let pruned = self.database().execute(statement, params![before_us]).await?;
        Ok(pruned)
    }
}
