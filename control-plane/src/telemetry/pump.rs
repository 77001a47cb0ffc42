//! Reading each VM's telemetry: for every running session this replica serves whose
//! settings capture anything, one task tells the agent which CDP categories to capture
//! and reads its events (`TelemetryEvents`), checking each (`Event::from_vm`) before it is
//! kept. The set of pumps follows the store (poked at once by changes made here, and
//! looked at every second for changes made through other replicas and adoptions).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use browser_agent_proto::v1::TelemetryCapture;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::settings::{Category, TelemetrySettings};
use super::{Event, Telemetry};
use crate::agent::AgentClients;
use crate::replicas::Replica;
use crate::store::{AgentLocation, SessionRecord, SessionStatus, Store};

/// How often the set of pumps is compared with the store.
const RESYNC: Duration = Duration::from_secs(1);
/// Pause before reading a VM's events again after its stream failed.
const RETRY: Duration = Duration::from_secs(1);

struct Pump {
    settings: watch::Sender<TelemetrySettings>,
    task: JoinHandle<()>,
}

pub struct Pumps {
    store: Arc<dyn Store>,
    agents: Arc<AgentClients>,
    replica: Arc<Replica>,
    telemetry: Weak<Telemetry>,
    running: Mutex<HashMap<String, Pump>>,
    poked: Arc<Notify>,
}

pub(super) fn capture(settings: &TelemetrySettings) -> TelemetryCapture {
    TelemetryCapture {
        console: settings.captures(Category::Console),
        network: settings.captures(Category::Network),
        page: settings.captures(Category::Page),
        interaction: settings.captures(Category::Interaction),
        screenshot: settings.captures(Category::Screenshot),
    }
}

impl Pumps {
    pub fn new(
        store: Arc<dyn Store>, agents: Arc<AgentClients>, replica: Arc<Replica>,
        telemetry: Weak<Telemetry>,
    ) -> Self {
        Self {
            store,
            agents,
            replica,
            telemetry,
            running: Mutex::default(),
            poked: Arc::new(Notify::new()),
        }
    }

    pub fn poke(&self) {
        self.poked.notify_one();
    }

    pub fn start(&self) {
        let (store, replica, telemetry, poked) =
            (self.store.clone(), self.replica.clone(), self.telemetry.clone(), self.poked.clone());
        tokio::spawn(async move {
            loop {
                let Some(this) = telemetry.upgrade() else {
                    return;
                };
                match store.live_sessions().await {
                    Ok(live) => this.pumps.resync(&live, &replica),
                    Err(error) => tracing::warn!(%error, "telemetry: live sessions unreadable"),
                }
                drop(this);
                tokio::select! {
                    () = poked.notified() => {}
                    () = tokio::time::sleep(RESYNC) => {}
                }
            }
        });
    }

    /// Starts, updates and stops pumps to match the live sessions.
    fn resync(&self, live: &[SessionRecord], replica: &Replica) {
        let Ok(mut running) = self.running.lock() else {
            return;
        };
        let current = live
            .iter()
            .filter(|session| session.status == SessionStatus::Running && replica.owns(session))
            .map(|session| (session.id.clone(), session.vm_settings.telemetry.clone()))
            .collect();
        if let Some(telemetry) = self.telemetry.upgrade() {
            telemetry.set_current(current);
        }
        let mut wanted = HashMap::new();
        for session in live {
            let Some(settings) = &session.vm_settings.telemetry else {
                continue;
            };
            if session.status != SessionStatus::Running
                || !replica.owns(session)
                || !settings.active()
            {
                continue;
            }
            if let Some(location) = &session.agent {
                wanted.insert(session.id.clone(), (session, location, settings));
            }
        }
        running.retain(|id, pump| {
            let keep = wanted.contains_key(id) && !pump.task.is_finished();
            if !keep {
                pump.task.abort();
                if let Some(telemetry) = self.telemetry.upgrade() {
                    telemetry.exporter.session_ended(id);
                }
            }
            keep
        });
        for (id, (session, location, settings)) in wanted {
            match running.get(&id) {
                Some(pump) => {
                    pump.settings.send_if_modified(|current| {
                        let changed = current != settings;
                        if changed {
                            *current = settings.clone();
                        }
                        changed
                    });
                }
                None => {
                    let (sender, receiver) = watch::channel(settings.clone());
                    let task = tokio::spawn(pump(
                        self.telemetry.clone(),
                        self.agents.clone(),
                        session.id.clone(),
                        session.org_id.clone(),
                        location.clone(),
                        receiver,
                    ));
                    running.insert(id, Pump { settings: sender, task });
                }
            }
        }
    }
}

/// Reads one VM's events until the pump is stopped.
async fn pump(
    telemetry: Weak<Telemetry>, agents: Arc<AgentClients>, session_id: String, org_id: String,
    location: AgentLocation, mut settings: watch::Receiver<TelemetrySettings>,
) {
    let mut last_seq = 0u64;
    loop {
        let agent = match agents.get(&session_id, Some(&location)) {
            Ok(agent) => agent,
            Err(_) => return,
        };
        let current = settings.borrow_and_update().clone();
        let opened = async {
            agent.set_telemetry(capture(&current)).await?;
            agent.telemetry_events().await
        };
        let mut stream = match opened.await {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%session_id, %error, "the VM's telemetry is not readable yet");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        loop {
            tokio::select! {
                changed = settings.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let current = settings.borrow_and_update().clone();
                    if agent.set_telemetry(capture(&current)).await.is_err() {
                        break;
                    }
                }
                record = stream.message() => {
                    let Ok(Some(record)) = record else {
                        break;
                    };
                    if record.seq <= last_seq {
                        continue;
                    }
                    let skipped = (record.seq - last_seq - 1) as i64;
                    last_seq = record.seq;
                    let Some(telemetry) = telemetry.upgrade() else {
                        return;
                    };
                    let event = Event::from_vm(
                        &record.r#type,
                        record.ts_us,
                        &record.data_json,
                        &record.source_event,
                        record.truncated,
                    );
                    match event {
                        Some(event) => {
                            let settings = settings.borrow();
                            let proxy_error = super::event::proxy_error(
                                &event,
                                &telemetry.proxy_failures,
                                &session_id,
                            );
                            telemetry.record_for(&session_id, &org_id, &settings, event, skipped);
                            if let Some(proxy_error) = proxy_error {
                                telemetry.record_for(&session_id, &org_id, &settings, proxy_error, 0);
                            }
                        }
                        None => tracing::debug!(%session_id, kind = %record.r#type, "a VM's telemetry record was refused"),
                    }
                }
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}
