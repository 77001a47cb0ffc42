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

pub mod page;
pub mod vault;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::error::{ServiceError, ServiceResult};
use crate::profiles::Profiles;
use crate::sessions::{BrowserConfig, CdpConnectionGuard, ProfileReference, Sessions};
use crate::store::{AuthConnectionRecord, SessionRecord, Store};
use page::{Assessment, DiscoveredField, Page};
use vault::{Credentials, Vault};

pub const DEFAULT_HEALTH_CHECK_INTERVAL: i64 = 3600;
pub const MAX_HEALTH_CHECK_INTERVAL: i64 = 86_400;
/// How long a login flow may wait for its user.
pub const FLOW_TTL: chrono::Duration = chrono::Duration::minutes(10);
/// How long a page may take to load and settle.
const PAGE_SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long an API call waits for a busy workflow (for example during a health check).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a submission may take to leave the login page.
const SUBMIT_NAVIGATION_WAIT: Duration = Duration::from_secs(10);

/// A URL without its query and fragment (which may carry a form's values), for messages.
fn strip_query(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            parsed.set_query(None);
            parsed.set_fragment(None);
            parsed.to_string()
        }
        Err(_) => String::new(),
    }
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AuthStatus {
    Authenticated,
    NeedsAuth,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FlowType {
    Login,
    Reauth,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FlowStatus {
    InProgress,
    Success,
    Failed,
    Expired,
    Canceled,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FlowStep {
    Discovering,
    AwaitingInput,
    Submitting,
    Completed,
}

/// A connection's settings and durable workflow state (the store's `document`).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Document {
    pub profile_id: String,
    pub login_url: Option<String>,
    pub allowed_domains: Vec<String>,
    pub health_check_interval: i64,
    pub proxy_id: Option<String>,
    pub save_credentials: bool,
    pub status: AuthStatus,
    pub last_auth_at: Option<DateTime<Utc>>,
    pub post_login_url: Option<String>,
    pub next_health_check_at: DateTime<Utc>,
    /// The most recent login flow.
    pub flow: Option<Flow>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Flow {
    pub flow_type: FlowType,
    pub status: FlowStatus,
    pub step: FlowStep,
    pub expires_at: DateTime<Utc>,
    pub discovered_fields: Option<Vec<DiscoveredField>>,
    pub website_error: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    /// The flow's browser session.
    pub session_id: Option<String>,
    /// Saved values were submitted by the flow itself already (tried once only).
    #[serde(default)]
    pub auto_submitted: bool,
}

impl Flow {
    pub fn in_progress(&self) -> bool {
        self.status == FlowStatus::InProgress
    }
}

impl Document {
    pub fn parse(record: &AuthConnectionRecord) -> ServiceResult<Self> {
        serde_json::from_str(&record.document).map_err(|error| {
            ServiceError::internal(format!("auth connection {}: {error}", record.id))
        })
    }

    pub fn flow_in_progress(&self) -> Option<&Flow> {
        self.flow.as_ref().filter(|flow| flow.in_progress())
    }
}

/// The `managed_auth_state` event of the connection's current flow.
pub fn state_event(document: &Document, hosted_url: Option<String>) -> Option<Value> {
    let flow = document.flow.as_ref()?;
    let mut event = json!({
        "event": "managed_auth_state",
        "timestamp": Utc::now(),
        "flow_type": flow.flow_type,
        "flow_status": flow.status,
        "flow_step": flow.step,
    });
    let optional = [
        (
            "discovered_fields",
            serde_json::to_value(&flow.discovered_fields).ok(),
        ),
        ("website_error", flow.website_error.clone().map(Value::from)),
        ("error_code", flow.error_code.clone().map(Value::from)),
        ("error_message", flow.error_message.clone().map(Value::from)),
        (
            "hosted_url",
            hosted_url.filter(|_| flow.in_progress()).map(Value::from),
        ),
        (
            "post_login_url",
            (flow.status == FlowStatus::Success)
                .then(|| document.post_login_url.clone())
                .flatten()
                .map(Value::from),
        ),
    ];
    for (key, value) in optional {
        if let Some(value) = value.filter(|v| !v.is_null()) {
            event[key] = value;
        }
    }
    Some(event)
}

/// Whether `url` lies inside the connection's domain or one of its allowed domains.
/// A domain may name a port (`127.0.0.1:8080`) and allowed domains may start with `*.`.
pub fn in_domains(url: &str, domain: &str, allowed: &[String]) -> bool {
    let Ok(url) = url::Url::parse(url) else {
        return false;
    };
    let (Some(host), port) = (url.host_str(), url.port_or_known_default()) else {
        return false;
    };
    std::iter::once(domain)
        .chain(allowed.iter().map(String::as_str))
        .any(|candidate| {
            let candidate = candidate.strip_prefix("*.").unwrap_or(candidate);
            let Ok(parsed) = url::Url::parse(&format!("http://{candidate}/")) else {
                return false;
            };
            let Some(expected) = parsed.host_str() else {
                return false;
            };
            let host_matches = host == expected || host.ends_with(&format!(".{expected}"));
            let port_matches = parsed.port().is_none() || parsed.port() == port;
            host_matches && port_matches
        })
}

enum Command {
    Login {
        reply: oneshot::Sender<ServiceResult<()>>,
    },
    Submit {
        fields: Credentials,
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
    workers: Mutex<HashMap<String, Worker>>,
}

impl ManagedAuth {
    pub fn new(
        vault: Vault,
        min_health_check_interval: i64,
        store: Arc<dyn Store>,
        sessions: Arc<Sessions>,
        profiles: Arc<Profiles>,
    ) -> Self {
        Self {
            vault: Arc::new(vault),
            min_health_check_interval,
            store,
            sessions,
            profiles,
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
        let workflow = Workflow {
            store: self.store.clone(),
            sessions: self.sessions.clone(),
            profiles: self.profiles.clone(),
            vault: self.vault.clone(),
            record,
            document,
            events: events.clone(),
            cancel: cancel.clone(),
            browser: None,
            submitted: Credentials::new(),
        };
        let id = workflow.record.id.clone();
        if let Ok(mut workers) = self.workers.lock() {
            workers.insert(
                id,
                Worker {
                    commands,
                    events,
                    cancel,
                    done,
                },
            );
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
        &self,
        id: &str,
        make: impl FnOnce(oneshot::Sender<ServiceResult<()>>) -> Command,
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
            Ok(Err(_)) => Err(ServiceError::NotFound(format!(
                "auth connection {id} not found"
            ))),
            Err(_) => Err(ServiceError::Timeout(
                "the auth connection is busy (a health check is running); retry".into(),
            )),
        }
    }

    /// Starts a login flow; answers once it is recorded (DISCOVERING).
    pub async fn login(&self, id: &str) -> ServiceResult<()> {
        self.command(id, |reply| Command::Login { reply }).await
    }

    /// Hands values to the flow waiting for input; answers once they are accepted.
    pub async fn submit(&self, id: &str, fields: Credentials) -> ServiceResult<()> {
        self.command(id, |reply| Command::Submit { fields, reply })
            .await
    }

    /// Terminates the workflow (the record is already deleted): a flow in progress is
    /// canceled and its browser ended. Waits for that.
    pub async fn stop(&self, id: &str) {
        let Some(worker) = self.workers.lock().ok().and_then(|mut w| w.remove(id)) else {
            return;
        };
        worker.cancel.cancel();
        let mut done = worker.done;
        let _ = tokio::time::timeout(Duration::from_secs(60), done.wait_for(|done| *done)).await;
    }
}

/// The browser of a flow or health check, driven over CDP.
struct FlowBrowser {
    session: SessionRecord,
    page: Page,
    /// Counts as an open CDP connection, so the inactivity timeout spares the browser.
    _in_use: CdpConnectionGuard,
}

/// How an operation of the workflow ended.
enum Outcome {
    Done,
    Canceled,
}

struct Workflow {
    store: Arc<dyn Store>,
    sessions: Arc<Sessions>,
    profiles: Arc<Profiles>,
    vault: Arc<Vault>,
    record: AuthConnectionRecord,
    document: Document,
    events: broadcast::Sender<Value>,
    cancel: CancellationToken,
    browser: Option<FlowBrowser>,
    /// Values submitted during the current flow, kept (in memory only) until it succeeds.
    submitted: Credentials,
}

impl Workflow {
    fn id(&self) -> &str {
        &self.record.id
    }

    /// What saved values are bound to: this connection of this organization.
    fn vault_owner(&self) -> String {
        format!("{}/{}", self.record.org_id, self.record.id)
    }

    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        // A flow already expired is finished by the loop below.
        if self
            .document
            .flow_in_progress()
            .is_some_and(|flow| flow.expires_at > Utc::now())
        {
            tracing::info!(connection_id = %self.id(), "resuming a login flow");
            if let Outcome::Canceled = self.cancellable(Operation::Discover).await {
                return self.canceled().await;
            }
        }
        loop {
            let deadline = match self.document.flow_in_progress() {
                Some(flow) => flow.expires_at,
                None => self.document.next_health_check_at,
            };
            let wait = (deadline - Utc::now()).to_std().unwrap_or_default();
            let cancel = self.cancel.clone();
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
                    } else {
                        Some(Operation::HealthCheck)
                    }
                }
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
        if self.cancel.is_cancelled() {
            Outcome::Canceled
        } else {
            Outcome::Done
        }
    }

    async fn perform(&mut self, operation: Operation) {
        match operation {
            Operation::Discover => self.discover().await,
            Operation::Submit(values) => self.submit(values).await,
            Operation::HealthCheck => self.health_check().await,
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
            Command::Login { reply } | Command::Submit { reply, .. } => reply.is_closed(),
        };
        if abandoned {
            return None;
        }
        match command {
            Command::Login { reply } => {
                if self.document.flow_in_progress().is_some() {
                    let _ = reply.send(Err(ServiceError::Conflict(
                        "a login flow is already in progress for this connection".into(),
                    )));
                    return None;
                }
                self.begin_flow(FlowType::Login).await;
                let _ = reply.send(Ok(()));
                Some(Operation::Discover)
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

    /// The discovered fields paired with the submitted values, or why not.
    fn check_submission(
        &self,
        fields: &Credentials,
    ) -> ServiceResult<Vec<(DiscoveredField, String)>> {
        let Some(flow) = self.document.flow_in_progress() else {
            return Err(ServiceError::Conflict(
                "no login flow is in progress; start one with login".into(),
            ));
        };
        if flow.expires_at <= Utc::now() {
            return Err(ServiceError::Conflict("the login flow has expired".into()));
        }
        if flow.step != FlowStep::AwaitingInput {
            return Err(ServiceError::Conflict(format!(
                "the login flow is not waiting for input (step {:?})",
                flow.step
            )));
        }
        let discovered = flow.discovered_fields.clone().unwrap_or_default();
        let mut problems = Vec::new();
        for name in fields.keys() {
            if !discovered.iter().any(|field| &field.name == name) {
                problems.push(format!("fields.{name}: not a field of this login form"));
            }
        }
        for field in &discovered {
            if (field.required || field.kind == "password") && !fields.contains_key(&field.name) {
                problems.push(format!("fields.{}: required", field.name));
            }
        }
        if !problems.is_empty() {
            return Err(ServiceError::Invalid(problems));
        }
        Ok(discovered
            .into_iter()
            .filter_map(|field| {
                fields
                    .get(&field.name)
                    .map(|value| (field.clone(), value.clone()))
            })
            .collect())
    }

    async fn begin_flow(&mut self, flow_type: FlowType) {
        self.submitted.clear();
        self.document.flow = Some(Flow {
            flow_type,
            status: FlowStatus::InProgress,
            step: FlowStep::Discovering,
            expires_at: Utc::now() + FLOW_TTL,
            discovered_fields: None,
            website_error: None,
            error_code: None,
            error_message: None,
            session_id: None,
            auto_submitted: false,
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

    fn flow_mut(&mut self) -> Option<&mut Flow> {
        self.document.flow.as_mut()
    }

    /// Opens (or, after a restart, re-attaches to) the flow's browser and finds the login
    /// form: then waits for input, or submits saved values, or finishes.
    async fn discover(&mut self) {
        if let Some(flow) = self.flow_mut() {
            flow.step = FlowStep::Discovering;
            flow.discovered_fields = None;
        }
        self.save().await;
        let reused = self.flow_mut().and_then(|flow| flow.session_id.clone());
        if let Err(error) = self.open_browser(reused.as_deref()).await {
            return self.fail("browser_failed", &format!("{error:#}")).await;
        }
        if let Some(session_id) = self.browser.as_ref().map(|b| b.session.id.clone())
            && let Some(flow) = self.flow_mut()
        {
            flow.session_id = Some(session_id);
        }
        let target = self.login_target();
        let assessment = match self.load(&target).await {
            Ok(assessment) => assessment,
            Err(error) => return self.fail("navigation_failed", &format!("{error:#}")).await,
        };
        let assessment = if assessment.fields.is_empty() && self.document.login_url.is_none() {
            match self.follow_login_link().await {
                Ok(Some(found)) => found,
                Ok(None) => assessment,
                Err(error) => return self.fail("navigation_failed", &format!("{error:#}")).await,
            }
        } else {
            assessment
        };
        if assessment.fields.is_empty() {
            if self.inside(&assessment.url) {
                // The profile is logged in already.
                return self.succeed(assessment.url).await;
            }
            return self
                .fail(
                    "login_form_not_found",
                    &format!("no login form on {}", strip_query(&assessment.url)),
                )
                .await;
        }
        Box::pin(self.await_input(&assessment.url, assessment.fields, None)).await;
    }

    async fn follow_login_link(&mut self) -> anyhow::Result<Option<Assessment>> {
        let Some(browser) = &self.browser else {
            return Ok(None);
        };
        if !browser.page.follow_login_link().await? {
            return Ok(None);
        }
        Ok(Some(browser.page.settled(PAGE_SETTLE_TIMEOUT).await?))
    }

    /// AWAITING_INPUT with these fields; a REAUTH flow submits saved values itself once.
    async fn await_input(
        &mut self,
        url: &str,
        fields: Vec<DiscoveredField>,
        website_error: Option<String>,
    ) {
        // A form outside the domain and allowed domains is never filled.
        if !self.inside(url) {
            let message = format!(
                "the login form is outside the allowed domains, at {}",
                strip_query(url)
            );
            return self.fail("left_allowed_domains", &message).await;
        }
        if let Some(flow) = self.flow_mut() {
            flow.step = FlowStep::AwaitingInput;
            flow.discovered_fields = Some(fields.clone());
            flow.website_error = website_error;
        }
        self.save().await;
        let automatic = self
            .document
            .flow_in_progress()
            .is_some_and(|flow| flow.flow_type == FlowType::Reauth && !flow.auto_submitted);
        if !automatic {
            return;
        }
        let saved = self.saved_credentials();
        let all_known = fields
            .iter()
            .all(|field| !field.is_one_time() && saved.contains_key(&field.name));
        if all_known {
            if let Some(flow) = self.flow_mut() {
                flow.auto_submitted = true;
            }
            let values = fields
                .into_iter()
                .filter_map(|field| {
                    saved
                        .get(&field.name)
                        .map(|value| (field.clone(), value.clone()))
                })
                .collect();
            Box::pin(self.submit(values)).await;
        }
    }

    fn saved_credentials(&self) -> Credentials {
        match &self.record.credentials {
            Some(sealed) => self.vault.open_sealed(sealed, &self.vault_owner()).unwrap_or_else(|error| {
                tracing::warn!(connection_id = %self.id(), %error, "saved credentials unusable");
                Credentials::new()
            }),
            None => Credentials::new(),
        }
    }

    /// Fills and submits the values, then reads the page: success, a site error (wait
    /// for input again), or a next step of the login (more fields).
    async fn submit(&mut self, values: Vec<(DiscoveredField, String)>) {
        if let Some(flow) = self.flow_mut() {
            flow.step = FlowStep::Submitting;
            flow.website_error = None;
        }
        self.save().await;
        for (field, value) in &values {
            if !field.is_one_time() {
                self.submitted.insert(field.name.clone(), value.clone());
            }
        }
        let Some(browser) = &self.browser else {
            return self
                .fail("browser_failed", "the flow's browser is gone")
                .await;
        };
        let before = browser.page.assess().await.map(|a| a.url);
        if let Err(error) = browser.page.fill_and_submit(&values).await {
            return self.fail("submit_failed", &format!("{error:#}")).await;
        }
        // Judge the result only once the submission has left the page (or, for a page
        // that answers without navigating, after a while).
        browser
            .page
            .wait_for_new_document(SUBMIT_NAVIGATION_WAIT)
            .await;
        let assessment = match browser.page.settled(PAGE_SETTLE_TIMEOUT).await {
            Ok(assessment) => assessment,
            Err(error) => return self.fail("navigation_failed", &format!("{error:#}")).await,
        };
        tracing::debug!(connection_id = %self.id(), from = ?before, to = %assessment.url, "submitted");
        if let Some(error) = assessment.error.clone() {
            let fields = if assessment.fields.is_empty() {
                values.into_iter().map(|(field, _)| field).collect()
            } else {
                assessment.fields
            };
            return Box::pin(self.await_input(&assessment.url, fields, Some(error))).await;
        }
        if assessment.password_field || assessment.fields.iter().any(DiscoveredField::is_one_time) {
            return Box::pin(self.await_input(&assessment.url, assessment.fields, None)).await;
        }
        if self.inside(&assessment.url) {
            return self.succeed(assessment.url).await;
        }
        if !assessment.fields.is_empty() {
            return Box::pin(self.await_input(&assessment.url, assessment.fields, None)).await;
        }
        self.fail(
            "left_allowed_domains",
            &format!(
                "the login ended outside the allowed domains, at {}",
                strip_query(&assessment.url)
            ),
        )
        .await
    }

    /// Logged in: save the profile (and the values), finish the flow.
    async fn succeed(&mut self, landed_at: String) {
        let Some(browser) = self.browser.take() else {
            return self
                .fail("browser_failed", "the flow's browser is gone")
                .await;
        };
        let saved = match self.sessions.agent(&browser.session) {
            Ok(agent) => {
                self.profiles
                    .save_from(&self.document.profile_id, &agent)
                    .await
            }
            Err(error) => Err(anyhow::anyhow!("{error}")),
        };
        self.end_browser(browser).await;
        if let Err(error) = saved {
            return self
                .fail(
                    "profile_save_failed",
                    &format!("the profile could not be saved: {error:#}"),
                )
                .await;
        }
        if self.document.save_credentials && !self.submitted.is_empty() {
            let mut credentials = self.saved_credentials();
            credentials.extend(std::mem::take(&mut self.submitted));
            match self.vault.seal(&credentials, &self.vault_owner()) {
                Ok(sealed) => self.record.credentials = Some(sealed),
                Err(error) => {
                    tracing::error!(connection_id = %self.id(), %error, "could not seal credentials")
                }
            }
        }
        self.submitted.clear();
        let now = Utc::now();
        self.document.status = AuthStatus::Authenticated;
        self.document.last_auth_at = Some(now);
        self.document.post_login_url = Some(landed_at);
        self.document.next_health_check_at =
            now + chrono::Duration::seconds(self.document.health_check_interval);
        if let Some(flow) = self.flow_mut() {
            flow.status = FlowStatus::Success;
            flow.step = FlowStep::Completed;
            flow.discovered_fields = None;
            flow.website_error = None;
        }
        self.save().await;
        tracing::info!(connection_id = %self.id(), "login flow succeeded");
    }

    async fn fail(&mut self, code: &str, message: &str) {
        tracing::warn!(connection_id = %self.id(), code, message, "login flow failed");
        self.finish_flow(FlowStatus::Failed, Some((code, message)))
            .await;
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
        if let Some(flow) = self
            .document
            .flow
            .as_mut()
            .filter(|flow| flow.in_progress())
        {
            flow.status = FlowStatus::Canceled;
            if let Some(event) = state_event(&self.document, None) {
                let _ = self.events.send(event);
            }
        }
        tracing::info!(connection_id = %self.record.id, "auth connection deleted; workflow stopped");
    }

    /// Opens the health check's browser at the last post-login page and decides.
    async fn health_check(&mut self) {
        let interval = chrono::Duration::seconds(self.document.health_check_interval);
        self.document.next_health_check_at = Utc::now() + interval;
        let result = async {
            self.open_browser(None).await?;
            let target = self
                .document
                .post_login_url
                .clone()
                .unwrap_or_else(|| self.login_target());
            self.load(&target).await
        }
        .await;
        if let Some(browser) = self.browser.take() {
            self.end_browser(browser).await;
        }
        let assessment = match result {
            Ok(assessment) => assessment,
            Err(error) => {
                tracing::warn!(connection_id = %self.id(), error = format!("{error:#}"), "health check could not run");
                self.save_quietly().await;
                return;
            }
        };
        let logged_in = !assessment.password_field && self.inside(&assessment.url);
        self.document.status = if logged_in {
            AuthStatus::Authenticated
        } else {
            AuthStatus::NeedsAuth
        };
        tracing::info!(connection_id = %self.id(), logged_in, "health check");
        self.save_quietly().await;
        if !logged_in && self.record.credentials.is_some() {
            self.begin_flow(FlowType::Reauth).await;
            Box::pin(self.discover()).await;
        }
    }

    /// Writes the document without an event (no flow changed).
    async fn save_quietly(&mut self) {
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

    fn login_target(&self) -> String {
        self.document
            .login_url
            .clone()
            .unwrap_or_else(|| format!("https://{}/", self.record.domain))
    }

    fn inside(&self, url: &str) -> bool {
        in_domains(url, &self.record.domain, &self.document.allowed_domains)
    }

    async fn load(&self, url: &str) -> anyhow::Result<Assessment> {
        let browser = self
            .browser
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no browser"))?;
        browser.page.navigate(url).await?;
        browser.page.settled(PAGE_SETTLE_TIMEOUT).await
    }

    /// A headless browser with the connection's profile (never saving by itself), or
    /// the flow's browser that survived a restart.
    async fn open_browser(&mut self, reuse: Option<&str>) -> anyhow::Result<()> {
        if self.browser.is_some() {
            return Ok(());
        }
        let org_id = self.record.org_id.clone();
        let reused = match reuse {
            Some(session_id) => self.sessions.live(&org_id, session_id).await.ok(),
            None => None,
        };
        let session = match reused {
            Some(session) => session,
            None => {
                let config = BrowserConfig {
                    headless: Some(true),
                    timeout_seconds: Some(FLOW_TTL.num_seconds() + 60),
                    proxy_id: self.document.proxy_id.clone(),
                    profile: Some(ProfileReference {
                        id: Some(self.document.profile_id.clone()),
                        name: None,
                        save_changes: Some(false),
                    }),
                    ..Default::default()
                };
                let spec = self
                    .sessions
                    .spec(&org_id, &config, None, Vec::new())
                    .await?;
                self.sessions.create(&org_id, spec).await?
            }
        };
        let in_use = self.sessions.cdp_connection_opened(&session.id);
        let agent = self.sessions.agent(&session)?;
        let page = match Page::attach(&agent).await {
            Ok(page) => page,
            Err(error) => {
                let _ = self
                    .sessions
                    .end(&session, "managed auth could not drive it")
                    .await;
                return Err(error);
            }
        };
        self.browser = Some(FlowBrowser {
            session,
            page,
            _in_use: in_use,
        });
        Ok(())
    }

    async fn end_browser(&self, browser: FlowBrowser) {
        let FlowBrowser { session, .. } = browser;
        if let Err(error) = self
            .sessions
            .end(&session, "managed auth is done with it")
            .await
        {
            tracing::warn!(%error, "ending a managed-auth browser failed");
        }
    }

    /// Ends the flow's browser: the one this workflow drives, or the session the flow
    /// recorded (after a restart, before it was re-attached).
    async fn end_flow_browser(&mut self) {
        if let Some(browser) = self.browser.take() {
            self.end_browser(browser).await;
        } else if let Some(session_id) = self.flow_mut().and_then(|flow| flow.session_id.clone()) {
            self.end_session(&session_id).await;
        }
    }

    async fn end_session(&self, session_id: &str) {
        if let Ok(session) = self.sessions.live(&self.record.org_id, session_id).await {
            let _ = self
                .sessions
                .end(&session, "managed auth is done with it")
                .await;
        }
    }
}

enum Operation {
    Discover,
    Submit(Vec<(DiscoveredField, String)>),
    HealthCheck,
    Expire,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_match_hosts_subdomains_ports_and_wildcards() {
        let allowed = vec!["*.okta.com".to_owned(), "login.example.net".to_owned()];
        for inside in [
            "https://example.com/home",
            "https://www.example.com/",
            "https://corp.okta.com/x",
            "https://login.example.net/",
        ] {
            assert!(in_domains(inside, "example.com", &allowed), "{inside}");
        }
        for outside in [
            "https://example.org/",
            "https://notexample.com/",
            "about:blank",
            "nonsense",
        ] {
            assert!(!in_domains(outside, "example.com", &allowed), "{outside}");
        }
        assert!(in_domains("http://127.0.0.1:8080/", "127.0.0.1:8080", &[]));
        assert!(!in_domains("http://127.0.0.1:9090/", "127.0.0.1:8080", &[]));
    }
}
