//! The store's part for browser telemetry (`crate::telemetry`): each session's events in
//! `seq` order, and the organizations' OTLP destinations.
//!
//! A session's events may be written by any replica (API calls are recorded where they
//! are served), so appending takes the session's database-wide lock: `seq` values are
//! drawn from the session's counter and committed in their order, and a reader that
//! resumes after `seq` N never misses one committed later with a smaller `seq`.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::database::record_of_row;
use super::database::{Row, Statement, Value, params, sql};
use super::sql_store::SqlStore;
use super::{StoreResult, scope};

/// How long an append waits for another replica appending to the same session.
const APPEND_WAIT: Duration = Duration::from_secs(10);

/// An event to store; `body` is the SDK's event object as JSON.
#[derive(Clone, Debug)]
pub struct NewTelemetryEvent {
    pub ts_us: i64,
    pub category: String,
    pub event_type: String,
    pub body: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TelemetryRow {
    pub seq: i64,
    pub ts_us: i64,
    pub body: String,
}

/// Which events to read: `seq` in `[from_seq, to_seq)`, time in `[since_us, until_us)`,
/// of the categories and types listed (empty: any), oldest or newest first.
#[derive(Clone, Debug)]
pub struct TelemetryQuery {
    pub session_id: String,
    pub from_seq: i64,
    pub to_seq: i64,
    pub since_us: i64,
    pub until_us: i64,
    pub categories: Vec<String>,
    pub types: Vec<String>,
    pub newest_first: bool,
    pub limit: i64,
}

impl TelemetryQuery {
    /// Every event of the session, oldest first, `limit` at a time.
    pub fn all(session_id: &str, limit: i64) -> Self {
        Self {
            session_id: session_id.to_owned(),
            from_seq: 0,
            to_seq: i64::MAX,
            since_us: 0,
            until_us: i64::MAX,
            categories: Vec::new(),
            types: Vec::new(),
            newest_first: false,
            limit,
        }
    }
}

/// An OTLP destination; `sealed_headers` holds the header map (names and values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DestinationRecord {
    pub id: String,
    pub org_id: String,
    pub name: String,
    pub description: Option<String>,
    pub endpoint: String,
    /// JSON array of the header names (canonical), readable without the key.
    pub header_names: String,
    pub sealed_headers: Option<Vec<u8>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub consecutive_failures: i64,
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
    pub last_export_at: Option<DateTime<Utc>>,
}

#[async_trait]
pub trait TelemetryStore {
    /// Stores the events of one session after `skipped` events that were dropped before
    /// they got here (their `seq` values stay unused, a visible gap); answers the `seq`
    /// of each event. Keeps at most `keep` events of the session (the oldest go).
    async fn append_telemetry(
        &self, session_id: &str, org_id: &str, events: &[NewTelemetryEvent], skipped: i64,
        keep: i64,
    ) -> StoreResult<Vec<i64>>;

    async fn telemetry_events(&self, query: &TelemetryQuery) -> StoreResult<Vec<TelemetryRow>>;

    /// Forgets every event older than `before_us`; answers how many.
    async fn prune_telemetry(&self, before_us: i64) -> StoreResult<u64>;
    /// Forgets the session's events older than `before_us`.
    async fn forget_telemetry(&self, session_id: &str, before_us: i64) -> StoreResult<u64>;

    async fn insert_destination(&self, destination: &DestinationRecord) -> StoreResult<()>;
    /// The organization's destination by id or name.
    async fn destination(&self, org_id: &str, key: &str) -> StoreResult<Option<DestinationRecord>>;
    async fn list_destinations(&self, org_id: &str) -> StoreResult<Vec<DestinationRecord>>;
    /// Replaces name, description, endpoint and headers.
    async fn update_destination(&self, destination: &DestinationRecord) -> StoreResult<bool>;
    async fn delete_destination(&self, org_id: &str, id: &str) -> StoreResult<bool>;
    /// Records one delivery's outcome: `error` is a sanitized class, `None` a success.
    async fn record_export(
        &self, id: &str, at: DateTime<Utc>, error: Option<&str>,
    ) -> StoreResult<()>;
}

const DESTINATION_COLUMNS: &str = "id, org_id, name, description, endpoint, header_names, \
     sealed_headers, created_at, updated_at, consecutive_failures, last_error, last_error_at, \
     last_export_at";

fn destination_from_row(row: &Row<'_>) -> StoreResult<DestinationRecord> {
    record_of_row!(
        row,
        DestinationRecord {
            id,
            org_id,
            name,
            description,
            endpoint,
            header_names,
            sealed_headers,
            created_at,
            updated_at,
            consecutive_failures,
            last_error,
            last_error_at,
            last_export_at,
        }
    )
}

fn telemetry_from_row(row: &Row<'_>) -> StoreResult<TelemetryRow> {
    Ok(TelemetryRow { seq: row.get(0)?, ts_us: row.get(1)?, body: row.get(2)? })
}

fn seq_from_row(row: &Row<'_>) -> StoreResult<i64> {
    row.get(0)
}

/// Events written by one statement (`INSERT_MANY`); the rest of a batch one by one.
const INSERT_CHUNK: usize = 64;

/// One statement inserting `INSERT_CHUNK` events: one round trip instead of 64.
static INSERT_MANY: std::sync::LazyLock<Statement> = std::sync::LazyLock::new(|| {
    let rows: Vec<String> = (0..INSERT_CHUNK)
        .map(|row| {
            let first = row * 7 + 1;
            let placeholders: Vec<String> = (first..first + 7).map(|n| format!("${n}")).collect();
            format!("({})", placeholders.join(", "))
        })
        .collect();
    Statement::new(format!(
        "INSERT INTO telemetry_events (session_id, seq, org_id, ts_us, category, event_type, body) \
         VALUES {}",
        rows.join(", ")
    ))
});

fn event_params(session_id: &str, org_id: &str, seq: i64, event: &NewTelemetryEvent) -> Vec<Value> {
    params![session_id, seq, org_id, event.ts_us, event.category, event.event_type, event.body]
}

/// `,a,b,` for a list filter (`''`: no filter), matched with `LIKE '%,' || x || ',%'`.
fn list_filter(values: &[String]) -> String {
    if values.is_empty() { String::new() } else { format!(",{},", values.join(",")) }
}

/// The events of `telemetry_events`' query: its session, sequence and time ranges, and
/// category and type lists (`,a,b,` or empty for all).
const EVENTS_MATCHING: &str = "SELECT seq, ts_us, body FROM telemetry_events WHERE session_id = $1 \
     AND seq >= $2 AND seq < $3 AND ts_us >= $4 AND ts_us < $5 \
     AND ($6 = '' OR $6 LIKE '%,' || category || ',%') \
     AND ($7 = '' OR $7 LIKE '%,' || event_type || ',%')";

#[async_trait]
impl TelemetryStore for SqlStore {
    async fn append_telemetry(
        &self, session_id: &str, org_id: &str, events: &[NewTelemetryEvent], skipped: i64,
        keep: i64,
    ) -> StoreResult<Vec<i64>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let count = events.len() as i64 + skipped;
        let lock =
            self.database().exclusive(&format!("telemetry of {session_id}"), APPEND_WAIT).await?;
        let appended = async {
            let statement = sql!(
                "UPDATE browser_sessions SET telemetry_seq = COALESCE(telemetry_seq, 0) + $2 \
                 WHERE id = $1 RETURNING telemetry_seq"
            );
            let last = self
                .database()
                .query_one(statement, params![session_id, count], seq_from_row)
                .await?;
            let first = last - events.len() as i64 + 1;
            let seqs: Vec<i64> = (first..=last).collect();
            let rows: Vec<(i64, &NewTelemetryEvent)> = seqs.iter().copied().zip(events).collect();
            for chunk in rows.chunks(INSERT_CHUNK) {
                if chunk.len() == INSERT_CHUNK {
                    let params = chunk
                        .iter()
                        .flat_map(|(seq, event)| event_params(session_id, org_id, *seq, event))
                        .collect();
                    self.database().execute(&INSERT_MANY, params).await?;
                    continue;
                }
                for (seq, event) in chunk {
                    let statement = sql!(
                        "INSERT INTO telemetry_events \
                         (session_id, seq, org_id, ts_us, category, event_type, body) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7)"
                    );
                    self.database()
                        .execute(statement, event_params(session_id, org_id, *seq, event))
                        .await?;
                }
            }
            if last > keep {
                let statement =
                    sql!("DELETE FROM telemetry_events WHERE session_id = $1 AND seq <= $2");
                self.database().execute(statement, params![session_id, last - keep]).await?;
            }
            Ok(seqs)
        }
        .await;
        lock.release().await;
        appended
    }

    async fn telemetry_events(&self, q: &TelemetryQuery) -> StoreResult<Vec<TelemetryRow>> {
        let params = params![
            q.session_id,
            q.from_seq,
            q.to_seq,
            q.since_us,
            q.until_us,
            list_filter(&q.categories),
            list_filter(&q.types),
            q.limit
        ];
        let statement = if q.newest_first {
            sql!("{EVENTS_MATCHING} ORDER BY seq DESC LIMIT $8")
        } else {
            sql!("{EVENTS_MATCHING} ORDER BY seq ASC LIMIT $8")
        };
        self.database().query(statement, params, telemetry_from_row).await
    }

    async fn prune_telemetry(&self, before_us: i64) -> StoreResult<u64> {
        let statement = sql!("DELETE FROM telemetry_events WHERE ts_us < $1");
        self.database().execute(statement, params![before_us]).await
    }

    async fn forget_telemetry(&self, session_id: &str, before_us: i64) -> StoreResult<u64> {
        let statement = sql!("DELETE FROM telemetry_events WHERE session_id = $1 AND ts_us < $2");
        self.database().execute(statement, params![session_id, before_us]).await
    }

    async fn insert_destination(&self, d: &DestinationRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO telemetry_destinations ({DESTINATION_COLUMNS}, project_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
             COALESCE($14, (SELECT id FROM projects WHERE org_id = $2 AND is_default)))"
        );
        self.database()
            .execute(
                statement,
                params![
                    d.id,
                    d.org_id,
                    d.name,
                    d.description,
                    d.endpoint,
                    d.header_names,
                    d.sealed_headers,
                    d.created_at,
                    d.updated_at,
                    d.consecutive_failures,
                    d.last_error,
                    d.last_error_at,
                    d.last_export_at,
                    scope::current()
                ],
            )
            .await?;
        Ok(())
    }

    async fn destination(&self, org_id: &str, key: &str) -> StoreResult<Option<DestinationRecord>> {
        let statement = sql!(
            "SELECT {DESTINATION_COLUMNS} FROM telemetry_destinations \
             WHERE org_id = $1 AND (id = $2 OR name = $2) AND (CAST($3 AS TEXT) IS NULL OR project_id = $3)"
        );
        self.database()
            .query_opt(statement, params![org_id, key, scope::current()], destination_from_row)
            .await
    }

    async fn list_destinations(&self, org_id: &str) -> StoreResult<Vec<DestinationRecord>> {
        let statement = sql!(
            "SELECT {DESTINATION_COLUMNS} FROM telemetry_destinations \
             WHERE org_id = $1 AND (CAST($2 AS TEXT) IS NULL OR project_id = $2) ORDER BY created_at, id"
        );
        self.database()
            .query(statement, params![org_id, scope::current()], destination_from_row)
            .await
    }

    async fn update_destination(&self, d: &DestinationRecord) -> StoreResult<bool> {
        let statement = sql!(
            "UPDATE telemetry_destinations SET name = $3, description = $4, endpoint = $5, \
             header_names = $6, sealed_headers = $7, updated_at = $8 \
             WHERE org_id = $1 AND id = $2"
        );
        let changed = self
            .database()
            .execute(
                statement,
                params![
                    d.org_id,
                    d.id,
                    d.name,
                    d.description,
                    d.endpoint,
                    d.header_names,
                    d.sealed_headers,
                    d.updated_at
                ],
            )
            .await?;
        Ok(changed > 0)
    }

    async fn delete_destination(&self, org_id: &str, id: &str) -> StoreResult<bool> {
        let statement = sql!(
            "DELETE FROM telemetry_destinations WHERE org_id = $1 AND id = $2 \
             AND (CAST($3 AS TEXT) IS NULL OR project_id = $3)"
        );
        let changed =
            self.database().execute(statement, params![org_id, id, scope::current()]).await?;
        Ok(changed > 0)
    }

    async fn record_export(
        &self, id: &str, at: DateTime<Utc>, error: Option<&str>,
    ) -> StoreResult<()> {
        match error {
            None => {
                let statement = sql!(
                    "UPDATE telemetry_destinations SET consecutive_failures = 0, \
                     last_export_at = $2 WHERE id = $1"
                );
                self.database().execute(statement, params![id, at]).await?
            }
            Some(error) => {
                let statement = sql!(
                    "UPDATE telemetry_destinations SET consecutive_failures = \
                     consecutive_failures + 1, last_error = $3, last_error_at = $2 \
                     WHERE id = $1"
                );
                self.database().execute(statement, params![id, at, error]).await?
            }
        };
        Ok(())
    }
}
