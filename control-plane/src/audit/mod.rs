//! The audit log: who did what, when, from where, and whether it was allowed. Every
//! state-changing call (anything but `GET`/`HEAD`/`OPTIONS`) and every refused call of a
//! known organization (401 for its expired or deleted keys, 403) is recorded once, by the
//! HTTP layer (`crate::api::audit`) after the call is answered: with its route, the
//! action the route needs, the key that made it, the status and the outcome; never a
//! body, a header value (but the user agent) or a query string, where signed tokens
//! travel. Records are kept `retention` long (`--audit-log-retention-days`).

pub mod export;
pub mod s3;
pub mod view;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use tokio::sync::mpsc;

use crate::store::{AuditQuery, AuditRecord, Store};

/// How often old records are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// Records waiting to be written, at most; past it a record is dropped and logged (the
/// store is far behind: callers are not slowed down to wait for it).
const BACKLOG: usize = 10_000;

pub struct AuditLog {
    store: Arc<dyn Store>,
    retention: Duration,
    backlog: mpsc::Sender<AuditRecord>,
    /// Taken by `start`, whose writer drains the backlog in order.
    pending: Mutex<Option<mpsc::Receiver<AuditRecord>>>,
}

impl AuditLog {
    pub fn new(store: Arc<dyn Store>, retention: Duration) -> Self {
        let (backlog, pending) = mpsc::channel(BACKLOG);
        Self { store, retention, backlog, pending: Mutex::new(Some(pending)) }
    }

    /// Queues `record` for the writer; never waits (the call it records has been
    /// answered already).
    pub fn record(&self, record: AuditRecord) {
        if let Err(error) = self.backlog.try_send(record) {
            tracing::warn!(%error, "the audit log is too far behind: a record was dropped");
        }
    }

    pub async fn read(&self, query: &AuditQuery) -> crate::store::StoreResult<Vec<AuditRecord>> {
        self.store.audit_records(query).await
    }

    /// Starts the writer (one, so records are written in order without a task each)
    /// and prunes records past their retention every few minutes, forever.
    pub fn start(self: &Arc<Self>) {
        if let Some(mut pending) = self.pending.lock().ok().and_then(|mut slot| slot.take()) {
            let store = self.store.clone();
            tokio::spawn(async move {
                while let Some(record) = pending.recv().await {
                    if let Err(error) = store.insert_audit(&record).await {
                        tracing::warn!(%error, request_id = record.request_id, "an audit record could not be kept");
                    }
                }
            });
        }
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                let before = now_us() - this.retention.as_micros() as i64;
                if let Err(error) = this.store.prune_audit(before).await {
                    tracing::warn!(%error, "old audit records could not be pruned");
                }
                tokio::time::sleep(PRUNE_EVERY).await;
            }
        });
    }
}

pub fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// The opaque page token of the record a page ended with: the next page starts after it.
pub fn cursor_after(record: &AuditRecord) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(format!("v1:{}:{}", record.ts_us, record.id))
}

/// The `(ts_us, id)` a page token names, or `None` if it is not one of ours.
pub fn parse_cursor(token: &str) -> Option<(i64, String)> {
    let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let rest = text.strip_prefix("v1:")?;
    let (ts, id) = rest.split_once(':')?;
    Some((ts.parse().ok()?, id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_strangers_are_refused() {
        let record =
            AuditRecord { id: "aud_1".into(), ts_us: 1_800_000_000_000_000, ..Default::default() };
        assert_eq!(
            parse_cursor(&cursor_after(&record)),
            Some((1_800_000_000_000_000, "aud_1".into()))
        );
        assert_eq!(parse_cursor("not a cursor"), None);
        assert_eq!(parse_cursor(""), None);
    }
}
