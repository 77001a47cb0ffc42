//! Delivering each organization's audit log to its export destinations (S3 buckets,
//! `s3`), in order, at least once, without ever slowing the API down.
//!
//! One replica delivers (the `audit-export` duty). For each active destination it takes
//! the records after the destination's cursor that are older than `delay` (a record is
//! written just after its call is answered, and a call may take a while: the delay lets
//! slow ones land before the cursor passes their time), groups them by UTC hour, and
//! writes each group as one gzipped JSON Lines object named after the rows it holds, so
//! that a retried delivery rewrites the same object. The cursor moves only after an
//! object is written; a failure is recorded (`last_error`, `consecutive_failures`) and
//! retried with exponential backoff, up to `MAX_BACKOFF`.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};

use super::s3::{DeliveryError, S3Writer};
use super::view;
use crate::replicas::Replica;
use crate::store::{AuditRecord, ExportDestinationRecord, Store};

/// How often the deliverer looks for new records.
const TICK: Duration = Duration::from_secs(2);
/// Most records one delivery takes (then the next tick takes more).
const BATCH: i64 = 1000;
/// Longest wait between attempts of a failing destination.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

pub struct AuditExport {
    store: Arc<dyn Store>,
    writer: S3Writer,
    /// How old a record must be before it is delivered.
    delay: Duration,
}

/// The answer of a destination's test, in the SDK's stages.
pub struct TestResult {
    pub stage: &'static str,
    pub error: Option<(&'static str, String)>,
}

impl AuditExport {
    pub fn new(store: Arc<dyn Store>, writer: S3Writer, delay: Duration) -> Self {
        Self { store, writer, delay }
    }

    pub fn principal_arn(&self) -> &str {
        self.writer.principal_arn()
    }

    /// Delivers forever, while this replica holds the duty.
    pub fn start(self: &Arc<Self>, replica: &Arc<Replica>) {
        let this = self.clone();
        let mut duty = replica.duty(crate::replicas::AUDIT_EXPORT);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            loop {
                tick.tick().await;
                duty.held().await;
                let destinations = match this.store.export_destinations(None).await {
                    Ok(destinations) => destinations,
                    Err(error) => {
                        tracing::warn!(%error, "audit export could not list its destinations");
                        continue;
                    }
                };
                let now = Utc::now();
                for destination in destinations {
                    let due = destination.status == "active"
                        && destination.next_attempt_at.is_none_or(|at| at <= now);
                    if due {
                        this.deliver(&destination).await;
                    }
                }
            }
        });
    }

    /// One delivery to `destination`: what is due, or nothing.
    async fn deliver(&self, destination: &ExportDestinationRecord) {
        let until_us = Utc::now().timestamp_micros() - self.delay.as_micros() as i64;
        let records = match self
            .store
            .audit_records_after(&destination.org_id, &destination.cursor, until_us, BATCH)
            .await
        {
            Ok(records) if records.is_empty() => return,
            Ok(records) => records,
            Err(error) => {
                tracing::warn!(%error, destination = %destination.id, "audit export could not read records");
                return;
            }
        };
        match self.write(destination, &records).await {
            Ok(cursor) => {
                if let Err(error) = self
                    .store
                    .export_delivered(&destination.id, &destination.cursor, &cursor, Utc::now())
                    .await
                {
                    tracing::warn!(%error, destination = %destination.id, "audit export could not record its progress");
                }
            }
            Err((delivered, error)) => {
                // What was written stays written: the cursor moves past it.
                if let Some(cursor) = delivered {
                    let _ = self
                        .store
                        .export_delivered(&destination.id, &destination.cursor, &cursor, Utc::now())
                        .await;
                }
                let failures = destination.consecutive_failures.clamp(0, 16) as u32;
                let backoff = Duration::from_secs(1u64 << failures).min(MAX_BACKOFF);
                let now = Utc::now();
                tracing::info!(destination = %destination.id, error = error.message(), "audit export failed; retrying later");
                let next = now + chrono::Duration::from_std(backoff).unwrap_or_default();
                if let Err(error) =
                    self.store.export_failed(&destination.id, error.message(), now, next).await
                {
                    tracing::warn!(%error, "audit export could not record a failure");
                }
            }
        }
    }

    /// Writes `records` (oldest first) as one object per UTC hour; answers the cursor of
    /// the last record written, or how far it got and why it stopped.
    async fn write(
        &self, destination: &ExportDestinationRecord, records: &[AuditRecord],
    ) -> Result<(i64, String), (Option<(i64, String)>, DeliveryError)> {
        let credentials = self.assume(destination).await.map_err(|error| (None, error))?;
        let mut delivered: Option<(i64, String)> = None;
        for group in records.chunk_by(|a, b| hour_of(a.ts_us) == hour_of(b.ts_us)) {
            let (Some(first), Some(last)) = (group.first(), group.last()) else {
                continue;
            };
            let body = gzipped_lines(group).map_err(|error| {
                (delivered.clone(), DeliveryError::PutObject(error.to_string()))
            })?;
            let key = object_key(destination, first, last);
            self.put(destination, &credentials, &key, body)
                .await
                .map_err(|error| (delivered.clone(), error))?;
            delivered = Some((last.ts_us, last.id.clone()));
        }
        delivered.ok_or((None, DeliveryError::PutObject("nothing to write".into())))
    }

    /// The destination's role, assumed with its external id.
    async fn assume(
        &self, destination: &ExportDestinationRecord,
    ) -> Result<aws_credential_types::Credentials, DeliveryError> {
        self.writer
            .assume_role(&destination.region, &destination.role_arn, &destination.external_id)
            .await
    }

    /// Writes `body` as `key` into the destination's bucket, with its KMS key if any.
    async fn put(
        &self, destination: &ExportDestinationRecord,
        credentials: &aws_credential_types::Credentials, key: &str, body: Vec<u8>,
    ) -> Result<(), DeliveryError> {
        self.writer
            .put_object(
                credentials,
                &destination.region,
                &destination.bucket,
                key,
                body,
                destination.kms_key_id.as_deref(),
            )
            .await
    }

    /// Checks a destination end to end: the role can be assumed, and an object written.
    pub async fn test(&self, destination: &ExportDestinationRecord) -> TestResult {
        let credentials = match self.assume(destination).await {
            Ok(credentials) => credentials,
            Err(error) => {
                return TestResult {
                    stage: "assume_role",
                    error: Some(("assume_role_failed", error.message().to_owned())),
                };
            }
        };
        let key = format!(
            "{}destination_id={}/_test/{}.txt",
            prefix_of(destination),
            destination.id,
            Utc::now().timestamp_micros()
        );
        let body = b"a test object of this server's audit-log export\n".to_vec();
        match self.put(destination, &credentials, &key, body).await {
            Ok(()) => TestResult { stage: "complete", error: None },
            Err(error) => TestResult {
                stage: "put_object",
                error: Some(("put_object_failed", error.message().to_owned())),
            },
        }
    }
}

fn hour_of(ts_us: i64) -> i64 {
    ts_us.div_euclid(3_600_000_000)
}

fn prefix_of(destination: &ExportDestinationRecord) -> String {
    let prefix = destination.prefix.trim_matches('/');
    if prefix.is_empty() { String::new() } else { format!("{prefix}/") }
}

/// `<prefix>/destination_id=<id>/org_id=<org>/date=<YYYY-MM-DD>/hour=<HH>/<window>-<chunk>.jsonl.gz`:
/// the window is the first record's time, the chunk the last record's id, so the name is
/// the rows'.
fn object_key(
    destination: &ExportDestinationRecord, first: &AuditRecord, last: &AuditRecord,
) -> String {
    let hour: DateTime<Utc> = Utc.timestamp_micros(first.ts_us).single().unwrap_or_default();
    format!(
        "{}destination_id={}/org_id={}/date={}/hour={}/{}-{}.jsonl.gz",
        prefix_of(destination),
        destination.id,
        destination.org_id,
        hour.format("%Y-%m-%d"),
        hour.format("%H"),
        first.ts_us,
        last.id
    )
}

fn gzipped_lines(records: &[AuditRecord]) -> std::io::Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for record in records {
        serde_json::to_writer(&mut encoder, &view::entry(record))?;
        encoder.write_all(b"\n")?;
    }
    encoder.finish()
}
