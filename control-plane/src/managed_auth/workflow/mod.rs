//! One connection's workflow: the task that owns its state, takes the API's commands,
//! runs the flow's steps and health checks at their time, and writes every change.
//! The login steps are in `login`, the health check in `health`, the browser in `browser`.

mod browser;
mod health;
mod login;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::page::DiscoveredField;
use super::vault::{Credentials, Vault};
use super::{
    Command, Document, FLOW_TTL, Flow, FlowStatus, FlowStep, FlowType, ManagedAuth, in_domains,
    state_event,
};
use crate::credentials::CredentialService;
use crate::error::ServiceError;
use crate::profiles::Profiles;
use crate::replays::Replays;
use crate::sessions::Sessions;
use crate::store::{AuthConnectionRecord, Store};
use browser::FlowBrowser;

/// How long a page may take to load and settle.
const PAGE_SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

enum Operation {
    Discover,
    Submit(Vec<(DiscoveredField, String)>),
    HealthCheck,
    Expire,
    /// Look whether a person logged in through the live view.
    Watch,
}

/// How often the page of a flow waiting for input is looked at.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// How an operation of the workflow ended.
enum Outcome {
    Done,
    Canceled,
}

pub(super) struct Workflow {
    store: Arc<dyn Store>,
    sessions: Arc<Sessions>,
    profiles: Arc<Profiles>,
    vault: Arc<Vault>,
    credentials: Arc<CredentialService>,
    replays: Arc<Replays>,
    record: AuthConnectionRecord,
    document: Document,
    events: broadcast::Sender<Value>,
    cancel: CancellationToken,
    browser: Option<FlowBrowser>,
    /// Values submitted during the current flow, kept (in memory only) until it succeeds.
    submitted: Credentials,
}

impl Workflow {
    /// The workflow of `record`, sharing `auth`'s services.
    pub(super) fn new(
        auth: &ManagedAuth, record: AuthConnectionRecord, document: Document,
        events: broadcast::Sender<Value>, cancel: CancellationToken,
    ) -> Self {
        Self {
            store: auth.store.clone(),
            sessions: auth.sessions.clone(),
            profiles: auth.profiles.clone(),
            vault: auth.vault.clone(),
            credentials: auth.credentials.clone(),
            replays: auth.replays.clone(),
            record,
            document,
            events,
            cancel,
            browser: None,
            submitted: Credentials::new(),
        }
    }

    fn id(&self) -> &str {
        &self.record.id
    }

    /// What saved values are bound to: this connection of this organization.
    fn vault_owner(&self) -> String {
        format!("{}/{}", self.record.org_id, self.record.id)
    }

    pub(super) async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        // A flow already expired is finished by the loop below.
        if self.document.flow_in_progress().is_some_and(|flow| flow.expires_at > Utc::now()) {
            tracing::info!(connection_id = %self.id(), "resuming a login flow");
            if let Outcome::Canceled = self.cancellable(Operation::Discover).await {
                return self.canceled().await;
            }
        }
        loop {
            let deadline = match self.document.flow_in_progress() {
                Some(flow) => flow.expires_at,
                None if self.document.health_checks => self.document.next_health_check_at,
                // Nothing is due; a command wakes the loop.
                None => Utc::now() + chrono::Duration::days(1),
            };
            let wait = (deadline - Utc::now()).to_std().unwrap_or_default();
            let cancel = self.cancel.clone();
            let awaiting_input = self.browser.is_some()
                && self
                    .document
                    .flow_in_progress()
                    .is_some_and(|flow| flow.step == FlowStep::AwaitingInput);
            let operation = tokio::select! {
                biased;
                () = cancel.cancelled() => return self.canceled().await,
                command = commands.recv() => match command {
                    None => return,
                    Some(command) => self.accept(command).await,
                },
                () = tokio::time::sleep(wait) => {
                    if self.document.flow_in_progress().is_some() {
                        Some(Operation::Expire)
                    } else if self.document.health_checks {
                        Some(Operation::HealthCheck)
                    } else {
                        None
                    }
                }
                () = tokio::time::sleep(WATCH_INTERVAL), if awaiting_input => Some(Operation::Watch),
            };
            if let Some(operation) = operation
                && let Outcome::Canceled = self.cancellable(operation).await
            {
                return self.canceled().await;
            }
        }
    }

    /// Runs an operation to its end (never dropped halfway: a browser being started or
    /// ended must not be left behind), then says whether the connection was deleted
    /// meanwhile. Operations are bounded (page loads, launches), so a delete waits seconds.
    async fn cancellable(&mut self, operation: Operation) -> Outcome {
        self.perform(operation).await;
        if self.cancel.is_cancelled() { Outcome::Canceled } else { Outcome::Done }
    }

    async fn perform(&mut self, operation: Operation) {
        match operation {
            Operation::Discover => self.discover().await,
            Operation::Submit(values) => self.submit(values).await,
            Operation::HealthCheck => self.health_check().await,
            Operation::Watch => self.watch_page().await,
            Operation::Expire => {
                self.finish_flow(
                    FlowStatus::Expired,
                    Some(("flow_expired", "the login flow expired before it completed")),
                )
                .await
            }
        }
    }

    /// Answers a command; returns the operation it starts.
    async fn accept(&mut self, command: Command) -> Option<Operation> {
        // A caller that gave up waiting (COMMAND_TIMEOUT) was told it failed.
        let abandoned = match &command {
            Command::Login { reply, .. }
            | Command::Submit { reply, .. }
            | Command::Update { reply, .. } => reply.is_closed(),
        };
        if abandoned {
            return None;
        }
        match command {
            Command::Login { record_session, reply } => {
                if self.document.flow_in_progress().is_some() {
                    let _ = reply.send(Err(ServiceError::Conflict(
                        "a login flow is already in progress for this connection".into(),
                    )));
                    return None;
                }
                self.begin_flow(FlowType::Login).await;
                if let Some(flow) = self.flow_mut() {
                    flow.record_session = record_session;
                }
                let _ = reply.send(Ok(()));
                Some(Operation::Discover)
            }
            Command::Update { change, reply } => {
                change.apply(&mut self.document, Utc::now());
                self.save_quietly().await;
                let _ = reply.send(Ok(()));
                None
            }
            Command::Submit { fields, reply } => match self.check_submission(&fields) {
                Ok(values) => {
                    let _ = reply.send(Ok(()));
                    Some(Operation::Submit(values))
                }
                Err(error) => {
                    let _ = reply.send(Err(error));
                    None
                }
            },
        }
    }

    async fn begin_flow(&mut self, flow_type: FlowType) {
        self.submitted.clear();
        self.document.flow = Some(Flow {
            id: crate::ids::new_id("flow"),
            started_at: Some(Utc::now()),
            replay_id: None,
            record_session: None,
            flow_type,
            status: FlowStatus::InProgress,
            step: FlowStep::Discovering,
            expires_at: Utc::now() + FLOW_TTL,
            discovered_fields: None,
            website_error: None,
            error_code: None,
            error_message: None,
            session_id: None,
            awaiting_url: None,
            auto_submitted: false,
            auto_steps: 0,
            auto_filled: Vec::new(),
        });
        self.save().await;
    }

    /// Writes the document and tells the followers.
    async fn save(&mut self) {
        self.save_quietly().await;
        if let Some(event) = state_event(&self.document, None) {
            let _ = self.events.send(event);
        }
    }

    /// Writes the document without an event (no flow changed).
    async fn save_quietly(&mut self) {
        self.document.record_flow();
        match serde_json::to_string(&self.document) {
            Ok(document) => self.record.document = document,
            Err(error) => tracing::error!(%error, "serializing an auth connection failed"),
        }
        self.write().await;
    }

    /// Stores the record. A record gone from the store (deleted while this workflow did
    /// not hear of it: a delete racing the creation, another replica) stops the workflow.
    async fn write(&self) {
        match self.store.update_auth_connection(&self.record).await {
            Ok(true) => {}
            Ok(false) => self.cancel.cancel(),
            Err(error) => {
                tracing::error!(connection_id = %self.id(), %error, "saving an auth connection failed")
            }
        }
    }

    fn flow_mut(&mut self) -> Option<&mut Flow> {
        self.document.flow.as_mut()
    }

    async fn fail(&mut self, code: &str, message: &str) {
        tracing::warn!(connection_id = %self.id(), code, message, "login flow failed");
        self.finish_flow(FlowStatus::Failed, Some((code, message))).await;
    }

    /// Ends the flow (failed or expired) and its browser.
    async fn finish_flow(&mut self, status: FlowStatus, error: Option<(&str, &str)>) {
        self.end_flow_browser().await;
        self.submitted.clear();
        if let Some(flow) = self.flow_mut() {
            flow.status = status;
            if let Some((code, message)) = error {
                flow.error_code = Some(code.to_owned());
                flow.error_message = Some(message.to_owned());
            }
        }
        self.save().await;
    }

    /// The connection was deleted: the followers learn that the flow was canceled, and
    /// the flow's browser ends. Nothing is written (the record is gone).
    async fn canceled(mut self) {
        self.end_flow_browser().await;
        if let Some(flow) = self.document.flow.as_mut().filter(|flow| flow.in_progress()) {
            flow.status = FlowStatus::Canceled;
            if let Some(event) = state_event(&self.document, None) {
                let _ = self.events.send(event);
            }
        }
        tracing::info!(connection_id = %self.record.id, "auth connection deleted; workflow stopped");
    }

    fn login_target(&self) -> String {
        self.document
            .login_url
            .clone()
            .unwrap_or_else(|| format!("https://{}/", self.record.domain))
    }

    fn inside(&self, url: &str) -> bool {
        in_domains(url, &self.record.domain, &self.document.allowed_domains)
    }
}
