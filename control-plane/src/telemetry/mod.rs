//! Browser telemetry: what a browser did, live and afterwards.
//!
//! Events come from the VM (its agent's CDP monitor and crash watch, read by `pump`) and
//! from the control plane itself (API calls on the session, CDP and live-view clients
//! connecting and leaving, an out-of-memory end). Each is kept only when the session's
//! settings (`settings`) capture its category; kept events wait here briefly and are
//! written to the store in batches, where they get their `seq` and where every replica's
//! readers (`GET …/telemetry/events` and `…/stream`) find them, and are handed to the
//! session's OTLP destination (`export`), if any.

pub mod cdp_commands;
pub mod destinations;
pub mod event;
mod export;
pub mod har;
mod otlp;
mod pump;
pub mod settings;
mod spans;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};

pub use event::Event;
pub use export::Exporter;
pub use settings::{Category, TelemetrySettings};

use crate::agent::AgentClients;
use crate::egress::ProxyFailures;
use crate::replicas::Replica;
use crate::store::{NewTelemetryEvent, SessionRecord, Store};

/// Most events a session keeps; the oldest go first.
pub const KEEP_PER_SESSION: i64 = 50_000;
/// How long events are kept after they happened.
pub const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long the events of a session created with `storage.enabled: false` stay (for the
/// live stream to resume within): they are read through the stream and the export only.
pub const STREAM_WINDOW: Duration = Duration::from_secs(10 * 60);
/// Events of one session waiting for the store; more are dropped (a gap in `seq`).
const MAX_PENDING: usize = 20_000;
/// How often waiting events are written.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

struct Pending {
    org_id: String,
    settings: TelemetrySettings,
    events: Vec<Event>,
    /// Dropped before they were stored.
    skipped: i64,
}

pub struct Telemetry {
    store: Arc<dyn Store>,
    pending: Mutex<HashMap<String, Pending>>,
    flush_now: Notify,
    /// Bumped after each write, so that this process's readers look at once.
    written: watch::Sender<u64>,
    pumps: pump::Pumps,
    exporter: Arc<Exporter>,
    /// What the VMs' egress proxies refused, joined to the VMs' network events.
    proxy_failures: Arc<ProxyFailures>,
    /// The settings of the running sessions this replica serves, as the store last said
    /// (`None`: capture off): long-lived recorders (a CDP connection, a live view) hold
    /// the record of when they began, and record by these instead (`record_current`).
    current: Mutex<HashMap<String, Option<TelemetrySettings>>>,
}

impl Telemetry {
    pub fn new(
        store: Arc<dyn Store>, agents: Arc<AgentClients>, replica: Arc<Replica>,
        exporter: Arc<Exporter>, proxy_failures: Arc<ProxyFailures>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|this| Self {
            pumps: pump::Pumps::new(store.clone(), agents, replica, this.clone()),
            store,
            pending: Mutex::default(),
            flush_now: Notify::new(),
            written: watch::channel(0).0,
            exporter,
            proxy_failures,
            current: Mutex::default(),
        })
    }

    /// Starts writing events and reading the VMs' (sessions this replica serves).
    pub fn start(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move { this.flush_forever().await });
        self.pumps.start();
        let store = self.store.clone();
        tokio::spawn(async move {
            loop {
                let before = event::now_us() - RETENTION.as_micros() as i64;
                if let Err(error) = store.prune_telemetry(before).await {
                    tracing::warn!(%error, "old telemetry could not be pruned");
                }
                tokio::time::sleep(Duration::from_secs(600)).await;
            }
        });
    }

    /// Keeps `event` of `session` if its settings capture the event's category.
    /// Records an event of `session`, as it is now (a request's own record).
    pub fn record(&self, session: &SessionRecord, event: Event) {
        if let Some(settings) = &session.vm_settings.telemetry {
            self.record_for(&session.id, &session.org_id, settings, event, 0);
        }
    }

    /// Records an event of `session`, a record held since long (by a CDP connection, a
    /// live view): by the settings the store last gave for it where this replica serves
    /// it (at most a second old), else by the record's.
    pub fn record_current(&self, session: &SessionRecord, event: Event) {
        let current =
            self.current.lock().ok().and_then(|current| current.get(&session.id).cloned());
        let settings = match current {
            Some(settings) => settings,
            None => session.vm_settings.telemetry.clone(),
        };
        if let Some(settings) = settings {
            self.record_for(&session.id, &session.org_id, &settings, event, 0);
        }
    }

    /// The settings of the running sessions this replica serves, read from the store.
    fn set_current(&self, current: HashMap<String, Option<TelemetrySettings>>) {
        if let Ok(mut slot) = self.current.lock() {
            *slot = current;
        }
    }

    /// Starts capture in a new browser's VM before it is handed out, so that its first
    /// page is captured (the agent answers once its monitor is attached); the pump then
    /// reads the events.
    pub async fn prepare(&self, session: &SessionRecord, agents: &AgentClients) {
        let Some(settings) = &session.vm_settings.telemetry else {
            return;
        };
        let capture = pump::capture(settings);
        if !(settings.captures_cdp() || capture.screenshot) {
            return;
        }
        let Ok(agent) = agents.get(&session.id, session.agent.as_ref()) else {
            return;
        };
        let applied =
            tokio::time::timeout(Duration::from_secs(5), agent.set_telemetry(capture)).await;
        if !matches!(applied, Ok(Ok(()))) {
            tracing::warn!(session_id = %session.id, "telemetry capture started late");
        }
        self.pumps.poke();
    }

    /// Tells the VM-reading side that settings changed (here, or through another replica).
    pub fn settings_changed(&self) {
        self.pumps.poke();
    }

    fn record_for(
        &self, session_id: &str, org_id: &str, settings: &TelemetrySettings, event: Event,
        skipped: i64,
    ) {
        if !settings.captures(event.category) {
            return;
        }
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        let entry = pending.entry(session_id.to_owned()).or_insert_with(|| Pending {
            org_id: org_id.to_owned(),
            settings: settings.clone(),
            events: Vec::new(),
            skipped: 0,
        });
        if entry.settings != *settings {
            entry.settings = settings.clone();
        }
        entry.skipped += skipped;
        if entry.events.len() >= MAX_PENDING {
            entry.skipped += 1;
        } else {
            entry.events.push(event);
        }
        if entry.events.len() >= 512 {
            self.flush_now.notify_one();
        }
    }

    /// Wakes when events were written by this process (readers also poll the store for
    /// other replicas' writes).
    pub fn written(&self) -> watch::Receiver<u64> {
        self.written.subscribe()
    }

    async fn flush_forever(&self) {
        loop {
            tokio::select! {
                () = self.flush_now.notified() => {}
                () = tokio::time::sleep(FLUSH_EVERY) => {}
            }
            self.flush().await;
        }
    }

    /// Writes every waiting event.
    pub async fn flush(&self) {
        let batches: Vec<(String, Pending)> = match self.pending.lock() {
            Ok(mut pending) => pending.drain().collect(),
            Err(_) => return,
        };
        if batches.is_empty() {
            return;
        }
        for (session_id, batch) in batches {
            let rows: Vec<NewTelemetryEvent> = batch
                .events
                .iter()
                .map(|event| NewTelemetryEvent {
                    ts_us: event.ts_us,
                    category: event.category.as_str().to_owned(),
                    event_type: event.kind.clone(),
                    body: event.body().to_string(),
                })
                .collect();
            let stored = self
                .store
                .append_telemetry(
                    &session_id,
                    &batch.org_id,
                    &rows,
                    batch.skipped,
                    KEEP_PER_SESSION,
                )
                .await;
            let seqs = match stored {
                Ok(seqs) => seqs,
                Err(error) => {
                    tracing::warn!(%session_id, %error, events = rows.len(), "telemetry events were lost");
                    continue;
                }
            };
            if !batch.settings.storage {
                let before = event::now_us() - STREAM_WINDOW.as_micros() as i64;
                if let Err(error) = self.store.forget_telemetry(&session_id, before).await {
                    tracing::warn!(%session_id, %error, "telemetry past the stream window stays");
                }
            }
            if let Some(destination) = &batch.settings.destination {
                let events = seqs.into_iter().zip(batch.events).collect();
                self.exporter.submit(destination, &batch.org_id, &session_id, events);
            }
        }
        self.written.send_modify(|count| *count += 1);
    }
}
