//! Exporting sessions' events to their OTLP destination: OTLP/HTTP with protobuf bodies
//! (`POST {endpoint}/v1/logs`), one log record per event with the organization, session
//! and browser as resource attributes, and spans for what has a duration (`spans`,
//! `POST {endpoint}/v1/traces`). Each destination has a queue and a worker of its
//! own, so a slow or failing collector delays only its own deliveries: the queue is
//! bounded and a batch that finds it full is dropped (and counted as a failure), never
//! waited for. Deliveries are retried with backoff, and each outcome is recorded on the
//! destination (`consecutive_failures`, `last_error`, …) as a sanitized class, never
//! the collector's answer. The collector's address must pass the egress policy, like
//! any address a browser reaches, and the connection goes to the address checked.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use tokio::sync::mpsc;

use super::Event;
use super::otlp::{attribute, int, scope, text};
use super::spans::{self, OpenNavigations};
use crate::egress::EgressPolicy;
use crate::managed_auth::vault::Vault;
use crate::store::Store;

/// Batches waiting per destination; more are dropped.
const QUEUE_BATCHES: usize = 64;
/// Events sent in one request at most.
const MAX_EVENTS_PER_REQUEST: usize = 1000;
/// Tries per delivery, and the pause before each retry (doubled each time).
const ATTEMPTS: u32 = 4;
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A destination's worker ends after this long without batches.
const IDLE: Duration = Duration::from_secs(120);

struct Batch {
    org_id: String,
    session_id: String,
    events: Vec<(i64, Event)>,
}

pub struct Exporter {
    store: Arc<dyn Store>,
    vault: Arc<Vault>,
    egress: Arc<EgressPolicy>,
    queues: Mutex<HashMap<String, mpsc::Sender<Batch>>>,
    navigations: OpenNavigations,
}

/// Why a delivery failed, as a destination shows it.
#[derive(Debug)]
struct Failure(&'static str);

impl Exporter {
    pub fn new(store: Arc<dyn Store>, vault: Arc<Vault>, egress: Arc<EgressPolicy>) -> Arc<Self> {
        Arc::new(Self {
            store,
            vault,
            egress,
            queues: Mutex::default(),
            navigations: OpenNavigations::default(),
        })
    }

    /// Forgets what waits of an ended session (navigations that never loaded).
    pub fn session_ended(&self, session_id: &str) {
        self.navigations.forget(session_id);
    }

    /// Queues a session's stored events (with their `seq`) for its destination.
    pub fn submit(
        self: &Arc<Self>, destination_id: &str, org_id: &str, session_id: &str,
        events: Vec<(i64, Event)>,
    ) {
        if events.is_empty() {
            return;
        }
        let batch = Batch { org_id: org_id.to_owned(), session_id: session_id.to_owned(), events };
        let Ok(mut queues) = self.queues.lock() else {
            return;
        };
        let queue = queues
            .entry(destination_id.to_owned())
            .or_insert_with(|| self.spawn_worker(destination_id));
        let batch = match queue.try_send(batch) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.recorded(destination_id, Some("queue_full"));
                return;
            }
            Err(mpsc::error::TrySendError::Closed(batch)) => batch,
        };
        // The worker ended (idle): a new one takes the batch.
        let queue = self.spawn_worker(destination_id);
        let _ = queue.try_send(batch);
        queues.insert(destination_id.to_owned(), queue);
    }

    fn spawn_worker(self: &Arc<Self>, destination_id: &str) -> mpsc::Sender<Batch> {
        let (sender, mut batches) = mpsc::channel::<Batch>(QUEUE_BATCHES);
        let (this, id) = (self.clone(), destination_id.to_owned());
        tokio::spawn(async move {
            while let Ok(Some(batch)) = tokio::time::timeout(IDLE, batches.recv()).await {
                this.deliver_with_retries(&id, batch).await;
            }
        });
        sender
    }

    fn recorded(self: &Arc<Self>, destination_id: &str, error: Option<&'static str>) {
        let (store, id) = (self.store.clone(), destination_id.to_owned());
        tokio::spawn(async move {
            if let Err(store_error) = store.record_export(&id, Utc::now(), error).await {
                tracing::warn!(destination_id = %id, error = %store_error, "an export outcome was not recorded");
            }
        });
    }

    async fn deliver_with_retries(self: &Arc<Self>, destination_id: &str, batch: Batch) {
        let (org_id, session_id) = (&batch.org_id, &batch.session_id);
        for chunk in batch.events.chunks(MAX_EVENTS_PER_REQUEST) {
            // Logs and spans are sent (and retried) apart: spans a collector refuses
            // never send the logs again.
            let spans = self.navigations.spans(session_id, chunk);
            let mut requests =
                vec![("logs", logs_request(org_id, session_id, chunk).encode_to_vec())];
            if !spans.is_empty() {
                let traces = spans::traces_request(resource(org_id, session_id), spans);
                requests.push(("traces", traces.encode_to_vec()));
            }
            for (signal, body) in requests {
                let mut backoff = FIRST_BACKOFF;
                let mut outcome = Err(Failure("not_sent"));
                for attempt in 1..=ATTEMPTS {
                    outcome = self.deliver(destination_id, org_id, signal, &body).await;
                    match &outcome {
                        Ok(()) | Err(Failure("destination_deleted")) => break,
                        Err(_) if attempt < ATTEMPTS => {
                            tokio::time::sleep(backoff).await;
                            backoff *= 2;
                        }
                        Err(_) => {}
                    }
                }
                match outcome {
                    Err(Failure("destination_deleted")) => return,
                    Ok(()) => self.recorded(destination_id, None),
                    Err(Failure(class)) => {
                        tracing::info!(
                            destination_id,
                            class,
                            signal,
                            events = chunk.len(),
                            "OTLP export failed"
                        );
                        self.recorded(destination_id, Some(class));
                    }
                }
            }
        }
    }

    /// One request to the destination's `/v1/{signal}`.
    async fn deliver(
        &self, destination_id: &str, org_id: &str, signal: &str, body: &[u8],
    ) -> Result<(), Failure> {
        let destination = self
            .store
            .destination(org_id, destination_id)
            .await
            .map_err(|_| Failure("store_unavailable"))?
            .ok_or(Failure("destination_deleted"))?;
        let headers: BTreeMap<String, String> = match &destination.sealed_headers {
            Some(sealed) => self
                .vault
                .open_sealed(sealed, &destination.id)
                .map_err(|_| Failure("headers_unreadable"))?,
            None => BTreeMap::new(),
        };
        let endpoint = destination.endpoint.trim_end_matches('/');
        let url = url::Url::parse(&format!("{endpoint}/v1/{signal}"))
            .map_err(|_| Failure("invalid_endpoint"))?;
        let host = url.host_str().ok_or(Failure("invalid_endpoint"))?.to_owned();
        let port = url.port_or_known_default().ok_or(Failure("invalid_endpoint"))?;
        // `host_str` keeps an IPv6 address in brackets, as `resolve` wants it.
        let host_port = format!("{host}:{port}");
        let address =
            self.egress.resolve(&host_port).await.map_err(|_| Failure("endpoint_not_allowed"))?;
        let client = reqwest::Client::builder()
            .resolve(host.trim_start_matches('[').trim_end_matches(']'), address)
            .redirect(reqwest::redirect::Policy::none())
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|_| Failure("client_unavailable"))?;
        post(&client, url, &headers, body.to_vec()).await
    }
}

/// One OTLP/HTTP request.
async fn post(
    client: &reqwest::Client, url: url::Url, headers: &BTreeMap<String, String>, body: Vec<u8>,
) -> Result<(), Failure> {
    let mut request =
        client.post(url).header(reqwest::header::CONTENT_TYPE, "application/x-protobuf").body(body);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = request.send().await.map_err(|error| {
        if error.is_timeout() { Failure("timeout") } else { Failure("connection_failed") }
    })?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    Err(Failure(match status.as_u16() {
        401 | 403 => "unauthorized",
        404 => "not_found",
        413 => "payload_too_large",
        429 => "rate_limited",
        400..=499 => "rejected",
        _ => "server_error",
    }))
}

/// What every record and span is about: the organization, session and browser.
fn resource(org_id: &str, session_id: &str) -> Resource {
    Resource {
        attributes: vec![
            attribute("service.name", text("kernel-browser")),
            attribute("kernel.organization.id", text(org_id)),
            attribute("session.id", text(session_id)),
            attribute("kernel.browser.id", text(session_id)),
        ],
        ..Resource::default()
    }
}

/// Severity of an event: errors for console errors, crashes and failures.
fn severity(kind: &str) -> (i32, &'static str) {
    if kind == "console_error"
        || kind.ends_with("crashed")
        || kind.ends_with("failed")
        || kind == "system_oom_kill"
    {
        (17, "ERROR")
    } else {
        (9, "INFO")
    }
}

/// The OTLP request for one session's events.
pub fn logs_request(
    org_id: &str, session_id: &str, events: &[(i64, Event)],
) -> ExportLogsServiceRequest {
    let observed = Utc::now().timestamp_nanos_opt().unwrap_or_default() as u64;
    let log_records = events
        .iter()
        .map(|(seq, event)| {
            let (severity_number, severity_text) = severity(&event.kind);
            LogRecord {
                time_unix_nano: (event.ts_us.max(0) as u64) * 1000,
                observed_time_unix_nano: observed,
                severity_number,
                severity_text: severity_text.to_owned(),
                body: text(&event.body().to_string()),
                event_name: event.kind.clone(),
                attributes: vec![
                    attribute("event.name", text(&event.kind)),
                    attribute("kernel.telemetry.category", text(event.category.as_str())),
                    attribute("kernel.telemetry.seq", int(*seq)),
                ],
                ..LogRecord::default()
            }
        })
        .collect();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(resource(org_id, session_id)),
            scope_logs: vec![ScopeLogs {
                scope: Some(scope()),
                log_records,
                ..ScopeLogs::default()
            }],
            ..ResourceLogs::default()
        }],
    }
}
