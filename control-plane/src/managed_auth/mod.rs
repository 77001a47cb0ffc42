//! Managed auth: auth connections keep a profile logged in to a site.
//!
//! Each connection has one workflow, a task that owns the connection's state while this
//! process runs. Its state (the `Document`) is written to the store at every change, so
//! a restarted control plane resumes it: a flow in progress continues (with the flow's
//! browser if it still lives, else a new one) and the health-check schedule is kept.
//!
//! - A login flow opens a browser with the profile at the login page, discovers the
//!   form's fields over CDP, waits for values (`submit`), fills and submits them, and
//!   decides from the page whether it worked (no password field left, landed inside the
//!   domain) or what the site said went wrong. On success the profile is saved and, if
//!   asked, the values (never one-time codes) are kept encrypted.
//! - A health check opens a browser with the profile at the last post-login page and
//!   decides whether it is still logged in. When it is not and values are saved, a
//!   REAUTH flow submits them by itself.
//!
//! This file holds `ManagedAuth`, which runs each connection's workflow and hands it the
//! API's commands. The stored shapes are in `document`, the workflow in `workflow`, the
//! page scripts in `page` and the encrypted values in `vault`.

mod document;
pub mod page;
pub mod timeline;
pub mod vault;
mod workflow;

pub use document::{
    AuthStatus, CredentialRef, Document, Flow, FlowStatus, FlowStep, FlowType, SettingsChange,
    in_domains, state_event,
};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::credentials::CredentialService;
use crate::error::{ServiceError, ServiceResult};
use crate::profiles::Profiles;
use crate::replays::Replays;
use crate::sessions::Sessions;
use crate::store::{AuthConnectionRecord, Store};
use vault::{Credentials, Vault};
use workflow::Workflow;

pub const DEFAULT_HEALTH_CHECK_INTERVAL: i64 = 3600;
pub const MAX_HEALTH_CHECK_INTERVAL: i64 = 86_400;
/// How long a login flow may wait for its user.
pub const FLOW_TTL: chrono::Duration = chrono::Duration::minutes(10);
/// How long an API call waits for a busy workflow (for example during a health check).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a delete waits for a canceled workflow to end its flow's browser.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

enum Command {
    Login {
        /// Records this flow's browser, or not, whatever the connection's default.
        record_session: Option<bool>,
        reply: oneshot::Sender<ServiceResult<()>>,
    },
    Submit {
        fields: Credentials,
        reply: oneshot::Sender<ServiceResult<()>>,
    },
    /// New settings, written by the workflow that owns the record.
    Update {
        change: SettingsChange,
        reply: oneshot::Sender<ServiceResult<()>>,
    },
}

struct Worker {
    commands: mpsc::Sender<Command>,
    events: broadcast::Sender<Value>,
    cancel: CancellationToken,
    /// Turns true when the workflow task has finished (and cleaned up).
    done: watch::Receiver<bool>,
}

/// The workflows of this process's auth connections.
pub struct ManagedAuth {
    pub vault: Arc<Vault>,
    /// Shortest health-check interval an organization may ask for.
    pub min_health_check_interval: i64,
    store: Arc<dyn Store>,
    sessions: Arc<Sessions>,
    profiles: Arc<Profiles>,
    credentials: Arc<CredentialService>,
    replays: Arc<Replays>,
    workers: Mutex<HashMap<String, Worker>>,
}

impl ManagedAuth {
    pub fn new(
        vault: Arc<Vault>, min_health_check_interval: i64, store: Arc<dyn Store>,
        sessions: Arc<Sessions>, profiles: Arc<Profiles>, credentials: Arc<CredentialService>,
        replays: Arc<Replays>,
    ) -> Self {
        Self {
            vault,
            min_health_check_interval,
            store,
            sessions,
            profiles,
            credentials,
            replays,
            workers: Mutex::default(),
        }
    }

    /// Resumes the workflow of every stored connection (at start).
    pub async fn resume_all(&self) -> anyhow::Result<()> {
        for record in self.store.list_auth_connections(None).await? {
            self.spawn(record);
        }
        Ok(())
    }

    /// Starts the workflow of a connection.
    pub fn spawn(&self, record: AuthConnectionRecord) {
        let (commands, commands_rx) = mpsc::channel(8);
        let (events, _) = broadcast::channel(64);
        let cancel = CancellationToken::new();
        let (done_tx, done) = watch::channel(false);
        let Ok(document) = Document::parse(&record) else {
            tracing::error!(connection_id = %record.id, "unreadable auth connection; not resuming it");
            return;
        };
        let id = record.id.clone();
        let workflow = Workflow::new(self, record, document, events.clone(), cancel.clone());
        if let Ok(mut workers) = self.workers.lock() {
            workers.insert(id, Worker { commands, events, cancel, done });
        }
        tokio::spawn(async move {
            workflow.run(commands_rx).await;
            let _ = done_tx.send(true);
        });
    }

    fn worker<T>(&self, id: &str, f: impl FnOnce(&Worker) -> T) -> Option<T> {
        self.workers.lock().ok()?.get(id).map(f)
    }

    pub fn subscribe(&self, id: &str) -> Option<broadcast::Receiver<Value>> {
        self.worker(id, |worker| worker.events.subscribe())
    }

    async fn command(
        &self, id: &str, make: impl FnOnce(oneshot::Sender<ServiceResult<()>>) -> Command,
    ) -> ServiceResult<()> {
        let sender = self
            .worker(id, |worker| worker.commands.clone())
            .ok_or_else(|| ServiceError::NotFound(format!("auth connection {id} not found")))?;
        let (reply, answer) = oneshot::channel();
        sender
            .send(make(reply))
            .await
            .map_err(|_| ServiceError::NotFound(format!("auth connection {id} not found")))?;
        match tokio::time::timeout(COMMAND_TIMEOUT, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ServiceError::NotFound(format!("auth connection {id} not found"))),
            Err(_) => Err(ServiceError::Timeout(
                "the auth connection is busy (a health check is running); retry".into(),
            )),
        }
    }

    /// Starts a login flow; answers once it is recorded (DISCOVERING).
    /// The first of the organization's connections that logs in with the stored
    /// credential `id` (named `name`).
    pub async fn connection_using_credential(
        &self, org_id: &str, id: &str, name: &str,
    ) -> ServiceResult<Option<String>> {
        self.connection_with(org_id, |credential| match &credential.credential_id {
            Some(credential_id) => credential_id == id,
            None => credential.name.as_deref().is_some_and(|named| named == id || named == name),
        })
        .await
    }

    /// The first of the organization's connections that logs in with an item of the
    /// credential provider `id` (named `name`).
    pub async fn connection_using_provider(
        &self, org_id: &str, id: &str, name: &str,
    ) -> ServiceResult<Option<String>> {
        self.connection_with(org_id, |credential| match &credential.provider_id {
            Some(provider_id) => provider_id == id,
            None => {
                credential.provider.as_deref().is_some_and(|named| named == id || named == name)
            }
        })
        .await
    }

    async fn connection_with(
        &self, org_id: &str, uses: impl Fn(&CredentialRef) -> bool,
    ) -> ServiceResult<Option<String>> {
        for record in self.store.list_auth_connections(Some(org_id)).await? {
            let found = Document::parse(&record)
                .is_ok_and(|document| document.credential.as_ref().is_some_and(&uses));
            if found {
                return Ok(Some(record.id));
            }
        }
        Ok(None)
    }

    pub async fn login(&self, id: &str, record_session: Option<bool>) -> ServiceResult<()> {
        self.command(id, |reply| Command::Login { record_session, reply }).await
    }

    /// Hands values to the flow waiting for input; answers once they are accepted.
    pub async fn submit(&self, id: &str, fields: Credentials) -> ServiceResult<()> {
        self.command(id, |reply| Command::Submit { fields, reply }).await
    }

    /// Changes the connection's settings; answers once they are stored. A flow in
    /// progress goes on; what it has not used yet (its next page, its browser's next
    /// start), and every later flow and health check, follow the new settings.
    pub async fn update(&self, id: &str, change: SettingsChange) -> ServiceResult<()> {
        self.command(id, |reply| Command::Update { change, reply }).await
    }

    /// Terminates the workflow (the record is already deleted): a flow in progress is
    /// canceled and its browser ended. Waits for that.
    pub async fn stop(&self, id: &str) {
        let Some(worker) = self.workers.lock().ok().and_then(|mut w| w.remove(id)) else {
            return;
        };
        worker.cancel.cancel();
        let mut done = worker.done;
        let _ = tokio::time::timeout(STOP_TIMEOUT, done.wait_for(|done| *done)).await;
    }
}
