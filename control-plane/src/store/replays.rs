//! The store's part for replays: each recording of a browser's display, from its start
//! to its video (or the reason it was lost).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::database::{params, sql};
use super::rows::{REPLAY_COLUMNS, replay_from_row};
use super::sql_store::SqlStore;
use super::{ReplayOutcome, ReplayRecord, StoreResult};

#[async_trait]
pub trait ReplaysStore: Send + Sync {
    async fn insert_replay(&self, replay: &ReplayRecord) -> StoreResult<()>;
    async fn replay(
        &self, org_id: &str, session_id: &str, id: &str,
    ) -> StoreResult<Option<ReplayRecord>>;
    /// Oldest first.
    async fn list_replays(&self, org_id: &str, session_id: &str) -> StoreResult<Vec<ReplayRecord>>;
    /// Recording or stopping replays of every organization (after a restart).
    async fn unfinished_replays(&self) -> StoreResult<Vec<ReplayRecord>>;
    /// Moves a recording replay to `stopping`; returns false if it was not recording, so
    /// exactly one caller finalizes it.
    async fn begin_replay_stop(&self, id: &str) -> StoreResult<bool>;
    /// Records how a stopping replay ended; returns false (changing nothing) if it was
    /// not stopping.
    async fn finish_replay(
        &self, id: &str, at: DateTime<Utc>, outcome: &ReplayOutcome,
    ) -> StoreResult<bool>;
}

#[async_trait]
impl ReplaysStore for SqlStore {
    async fn insert_replay(&self, r: &ReplayRecord) -> StoreResult<()> {
        let statement = sql!(
            "INSERT INTO replays ({REPLAY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, \
             $8, $9, $10, $11, $12)"
        );
        self.database()
            .execute(
                statement,
                params![
                    r.id,
                    r.org_id,
                    r.session_id,
                    r.framerate,
                    r.max_duration_seconds,
                    r.status.as_str(),
                    r.started_at,
                    r.finished_at,
                    r.size_bytes,
                    r.blob_key,
                    r.failure,
                    r.record_audio
                ],
            )
            .await?;
        Ok(())
    }

    async fn replay(
        &self, org_id: &str, session_id: &str, id: &str,
    ) -> StoreResult<Option<ReplayRecord>> {
        let statement = sql!(
            "SELECT {REPLAY_COLUMNS} FROM replays \
             WHERE org_id = $1 AND session_id = $2 AND id = $3"
        );
        self.database().query_opt(statement, params![org_id, session_id, id], replay_from_row).await
    }

    async fn list_replays(&self, org_id: &str, session_id: &str) -> StoreResult<Vec<ReplayRecord>> {
        let statement = sql!(
            "SELECT {REPLAY_COLUMNS} FROM replays WHERE org_id = $1 AND session_id = $2 \
             ORDER BY started_at, id"
        );
        self.database().query(statement, params![org_id, session_id], replay_from_row).await
    }

    async fn unfinished_replays(&self) -> StoreResult<Vec<ReplayRecord>> {
        let statement = sql!(
            "SELECT {REPLAY_COLUMNS} FROM replays WHERE status IN ('recording', 'stopping') \
             ORDER BY started_at, id"
        );
        self.database().query(statement, params![], replay_from_row).await
    }

    async fn begin_replay_stop(&self, id: &str) -> StoreResult<bool> {
        let statement =
            sql!("UPDATE replays SET status = 'stopping' WHERE id = $1 AND status = 'recording'");
        let changed = self.database().execute(statement, params![id]).await?;
        Ok(changed == 1)
    }

    async fn finish_replay(
        &self, id: &str, at: DateTime<Utc>, outcome: &ReplayOutcome,
    ) -> StoreResult<bool> {
        let (status, size_bytes, blob_key, failure) = outcome.columns();
        let statement = sql!(
            "UPDATE replays SET status = $2, finished_at = $3, size_bytes = $4, \
             blob_key = $5, failure = $6 WHERE id = $1 AND status = 'stopping'"
        );
        let changed = self
            .database()
            .execute(statement, params![id, status.as_str(), at, size_bytes, blob_key, failure])
            .await?;
        Ok(changed == 1)
    }
}
