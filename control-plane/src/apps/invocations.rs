//! Invocations: one action of one app version, run in a sandbox of its own with the
//! deployment's files (read-only) and environment, and an API key that works only for
//! the organization and only while the invocation runs. Browsers it creates carry its id
//! and end with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::InvocationDocument;
use super::runner::{Ended, Run};
use super::{Apps, DeploymentStatus, Language, base_env, views};
use crate::error::{ServiceError, ServiceResult};
use crate::ids;
use crate::store::{InvocationRecord, SessionFilter, SessionRecord};

/// How long a synchronous invocation may run: the SDKs give up on a request after 60 s
/// (and retry it, which would run the action again), so it ends before.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(55);
/// `async_timeout_seconds`: its range and default.
pub const ASYNC_TIMEOUT_RANGE: (u64, u64) = (10, 3600);
const ASYNC_TIMEOUT_DEFAULT: u64 = 900;
/// Largest payload.
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;
/// Largest output kept; larger results fail the invocation.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// How long a caller is asked to wait when the organization runs its most invocations.
const RETRY_AFTER: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvocationStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
}

impl InvocationStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Self {
        match text {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "succeeded" => Self::Succeeded,
            _ => Self::Failed,
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

pub struct NewInvocation {
    pub app_name: String,
    pub action_name: String,
    pub version: String,
    pub payload: Option<String>,
    pub asynchronous: bool,
    pub async_timeout_seconds: Option<u64>,
}

/// What one action runs with.
struct ActionRun {
    env_vars: std::collections::BTreeMap<String, String>,
    /// Its API key.
    key: String,
    timeout: Duration,
    cancel: CancellationToken,
    cancel_reason: Arc<Mutex<Option<String>>>,
}

/// Invocations this process runs, by id.
pub(super) struct Running {
    max_per_organization: usize,
    entries: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    org_id: String,
    project_id: Option<String>,
    deployment_id: String,
    cancel: CancellationToken,
    /// Why it was cancelled, for its status reason.
    cancel_reason: Arc<Mutex<Option<String>>>,
}

impl Running {
    pub(super) fn new(max_per_organization: usize) -> Self {
        Self { max_per_organization, entries: Mutex::default() }
    }

    pub(super) fn cancel_of_deployment(&self, deployment_id: &str, reason: &str) {
        if let Ok(entries) = self.entries.lock() {
            for entry in entries.values().filter(|e| e.deployment_id == deployment_id) {
                if let Ok(mut why) = entry.cancel_reason.lock() {
                    why.get_or_insert_with(|| reason.to_owned());
                }
                entry.cancel.cancel();
            }
        }
    }

    fn cancel(&self, id: &str, reason: &str) {
        if let Ok(entries) = self.entries.lock()
            && let Some(entry) = entries.get(id)
        {
            if let Ok(mut why) = entry.cancel_reason.lock() {
                why.get_or_insert_with(|| reason.to_owned());
            }
            entry.cancel.cancel();
        }
    }
}

impl Apps {
    /// Starts an invocation. A synchronous one is answered when it has finished; an
    /// asynchronous one at once, `queued`. `issue_key` makes the action's API key for
    /// (invocation id, expiry).
    pub async fn invoke(
        self: &Arc<Self>, org_id: &str, new: NewInvocation,
        issue_key: impl Fn(&str, DateTime<Utc>) -> String,
    ) -> ServiceResult<InvocationRecord> {
        let runner = self.runner()?.clone();
        let mut problems = Vec::new();
        if let Some(payload) = &new.payload {
            if payload.len() > MAX_PAYLOAD_BYTES {
                problems.push(format!("payload is at most {} KiB", MAX_PAYLOAD_BYTES / 1024));
            } else if !payload.is_empty()
                && serde_json::from_str::<serde_json::Value>(payload).is_err()
            {
                problems.push("payload must be a JSON document, sent as a string".into());
            }
        }
        let (low, high) = ASYNC_TIMEOUT_RANGE;
        if let Some(seconds) = new.async_timeout_seconds
            && !(low..=high).contains(&seconds)
        {
            problems.push(format!("async_timeout_seconds must be between {low} and {high}"));
        }
        if !problems.is_empty() {
            return Err(ServiceError::Invalid(problems));
        }
        let app = self.store.app_version(org_id, &new.app_name, &new.version).await?.ok_or_else(
            || {
                ServiceError::NotFound(format!(
                    "app {} version {} not found",
                    new.app_name, new.version
                ))
            },
        )?;
        let actions: Vec<String> = serde_json::from_str(&app.actions).unwrap_or_default();
        if !actions.contains(&new.action_name) {
            return Err(ServiceError::NotFound(format!(
                "app {} version {} has no action {}",
                new.app_name, new.version, new.action_name
            )));
        }
        let deployment = self.deployment(org_id, &app.deployment_id).await?;
        if DeploymentStatus::parse(&deployment.status) != DeploymentStatus::Running {
            return Err(ServiceError::Conflict(format!(
                "deployment {} is not running",
                deployment.id
            )));
        }
        let env_vars = self.env_vars(&deployment)?;
        let document = super::DeploymentDocument::of(&deployment);
        let timeout = if new.asynchronous {
            Duration::from_secs(new.async_timeout_seconds.unwrap_or(ASYNC_TIMEOUT_DEFAULT))
        } else {
            SYNC_TIMEOUT
        };
        let now = Utc::now();
        let deadline = now + chrono::Duration::from_std(timeout).unwrap_or_default();
        let record = InvocationRecord {
            id: ids::new_id("inv"),
            org_id: org_id.to_owned(),
            deployment_id: deployment.id.clone(),
            project_id: deployment.project_id.clone(),
            app_name: new.app_name.clone(),
            action_name: new.action_name.clone(),
            version: new.version.clone(),
            status: InvocationStatus::Queued.as_str().into(),
            started_at: now,
            finished_at: None,
            document: serde_json::to_string(&InvocationDocument {
                payload: new.payload.clone(),
                deadline: Some(deadline),
                ..Default::default()
            })
            .map_err(ServiceError::internal)?,
        };
        // The project's own cap (`projects.limits`), if it has one.
        let project_cap = match &deployment.project_id {
            Some(project_id) => self
                .store
                .project_by_id(project_id)
                .await?
                .and_then(|project| project.max_concurrent_invocations)
                .map(|cap| (project_id.clone(), cap)),
            None => None,
        };
        // Counted and recorded under one lock: concurrent invocations never pass the limit.
        let (finished_tx, finished) = watch::channel(false);
        let cancel = CancellationToken::new();
        let cancel_reason = Arc::new(Mutex::new(None));
        {
            let mut entries = self
                .invocations
                .entries
                .lock()
                .map_err(|_| ServiceError::internal("invocation registry poisoned"))?;
            let running = entries.values().filter(|e| e.org_id == org_id).count();
            if running >= self.invocations.max_per_organization {
                return Err(ServiceError::LimitReached {
                    message: format!(
                        "this organization already runs {running} invocations, its most at once"
                    ),
                    retry_after: RETRY_AFTER,
                });
            }
            if let Some((project_id, cap)) = &project_cap {
                let in_project =
                    entries.values().filter(|e| e.project_id.as_ref() == Some(project_id)).count();
                if in_project as i64 >= *cap {
                    return Err(ServiceError::LimitReached {
                        message: format!(
                            "this project already runs {in_project} invocations: its \
                             max_concurrent_invocations is {cap}"
                        ),
                        retry_after: RETRY_AFTER,
                    });
                }
            }
            entries.insert(
                record.id.clone(),
                Entry {
                    org_id: org_id.to_owned(),
                    project_id: deployment.project_id.clone(),
                    deployment_id: deployment.id.clone(),
                    cancel: cancel.clone(),
                    cancel_reason: cancel_reason.clone(),
                },
            );
        }
        let key = issue_key(&record.id, deadline + chrono::Duration::minutes(1));
        // Recorded and started in a task of its own, which also gives the slot back: a
        // caller that goes away leaves no slot taken and no invocation queued forever.
        let (recorded_tx, recorded) = tokio::sync::oneshot::channel();
        let this = self.clone();
        let started = record.clone();
        tokio::spawn(async move {
            let mut record = started;
            match this.store.insert_invocation(&record).await {
                Ok(()) => {
                    let _ = recorded_tx.send(Ok(()));
                    this.events.push(&record.id, views::invocation_state_event(&record), false);
                    let action = ActionRun { env_vars, key, timeout, cancel, cancel_reason };
                    this.run_action(&runner, &mut record, &document, action).await;
                }
                Err(error) => {
                    let _ = recorded_tx.send(Err(error));
                }
            }
            if let Ok(mut entries) = this.invocations.entries.lock() {
                entries.remove(&record.id);
            }
            let _ = finished_tx.send(true);
        });
        match recorded.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(error.into()),
            Err(_) => return Err(ServiceError::internal("the invocation's task ended")),
        }
        if new.asynchronous {
            return Ok(record);
        }
        let mut finished = finished;
        let _ = finished.wait_for(|done| *done).await;
        self.invocation(org_id, &record.id).await
    }

    async fn run_action(
        &self, runner: &super::runner::AppRunner, record: &mut InvocationRecord,
        deployment: &super::DeploymentDocument, action: ActionRun,
    ) {
        let ActionRun { env_vars, key, timeout, cancel, cancel_reason } = action;
        // Its deployment may have been deleted since it was looked up (its running
        // invocations were cancelled then, but not this one, not yet registered).
        if !matches!(
            self.store.deployment(&record.org_id, &record.deployment_id).await,
            Ok(Some(_))
        ) {
            self.finish(
                record,
                InvocationStatus::Failed,
                None,
                Some("The invocation was ended: its deployment was deleted".into()),
            )
            .await;
            return;
        }
        record.status = InvocationStatus::Running.as_str().into();
        match self.store.update_unfinished_invocation(record).await {
            Ok(true) => self.events.push(&record.id, views::invocation_state_event(record), false),
            // Already ended (cancelled before it started).
            Ok(false) => return,
            Err(error) => {
                tracing::error!(invocation_id = %record.id, %error, "recording an invocation's start failed")
            }
        }
        let document = InvocationDocument::of(record);
        let mut env = base_env();
        env.extend(env_vars);
        env.push(("KERNEL_API_KEY".into(), key));
        env.push(("KERNEL_BASE_URL".into(), format!("http://127.0.0.1:{}", runner.api_port)));
        env.push(("KERNEL_INVOCATION_ID".into(), record.id.clone()));
        // The API is on the sandbox's own loopback; everything else goes through the
        // egress proxy.
        env.push(("NO_PROXY".into(), "localhost,127.0.0.1".into()));
        env.push(("no_proxy".into(), "localhost,127.0.0.1".into()));
        env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
        let language = Language::of(&deployment.entrypoint_rel_path).unwrap_or(Language::Python);
        let (program, mut files) = super::loader(language);
        files.push(("payload.json", document.payload.clone().unwrap_or_default().into_bytes()));
        let boot = match language {
            Language::Python => "/run/app/boot.py",
            Language::Node => "/run/app/boot.mjs",
        };
        let app_dir = Apps::deployment_dir(runner, &record.deployment_id).join("app");
        let run = Run {
            app_dir: &app_dir,
            app_writable: false,
            cache: None,
            program: (
                program,
                vec![
                    boot.into(),
                    "invoke".into(),
                    deployment.entrypoint_rel_path.clone().into(),
                    record.app_name.clone().into(),
                    record.action_name.clone().into(),
                ],
            ),
            env,
            files,
            timeout,
            cancel,
            allowed_hosts: None,
        };
        let outcome = self.run_logged(runner, &record.id, run).await;
        let (status, output, reason) = match (&outcome.ended, outcome.result) {
            (Ended::TimedOut, _) => (
                InvocationStatus::Failed,
                None,
                format!("The invocation timed out after {} seconds", timeout.as_secs()),
            ),
            (Ended::Cancelled, _) => (
                InvocationStatus::Failed,
                None,
                cancel_reason
                    .lock()
                    .ok()
                    .and_then(|why| why.clone())
                    .map(|why| format!("The invocation was ended: {why}"))
                    .unwrap_or_else(|| "The invocation was ended".into()),
            ),
            (Ended::OutOfMemory, _) => (
                InvocationStatus::Failed,
                None,
                format!(
                    "The action used more memory than its limit ({} MiB)",
                    super::runner::MEMORY_LIMIT_MIB
                ),
            ),
            (Ended::NotStarted(why), _) => {
                tracing::error!(invocation_id = %record.id, why, "an action's sandbox could not start");
                (InvocationStatus::Failed, None, "The action could not be started".into())
            }
            (Ended::Exited(_), Some(Ok(bytes))) => action_result(&bytes),
            (Ended::Exited(code), Some(Err(problem))) => (
                InvocationStatus::Failed,
                Some(problem),
                format!("The action's result could not be read (exit code {code})"),
            ),
            (Ended::Exited(code), None) => (
                InvocationStatus::Failed,
                None,
                format!("The action ended without a result (exit code {code})"),
            ),
        };
        self.finish(record, status, output, (status == InvocationStatus::Failed).then_some(reason))
            .await;
    }

    /// Records an invocation's end (unless it already ended: the first end wins), ends
    /// its browsers and closes its events.
    async fn finish(
        &self, record: &mut InvocationRecord, status: InvocationStatus, output: Option<String>,
        status_reason: Option<String>,
    ) -> bool {
        let mut document = InvocationDocument::of(record);
        document.output = output;
        document.status_reason = status_reason;
        record.status = status.as_str().into();
        record.finished_at = Some(Utc::now());
        record.document = serde_json::to_string(&document).unwrap_or_default();
        let ended = match self.store.update_unfinished_invocation(record).await {
            Ok(ended) => ended,
            Err(error) => {
                tracing::error!(invocation_id = %record.id, %error, "recording an invocation's end failed");
                false
            }
        };
        self.end_browsers(&record.org_id, &record.id, "its invocation ended").await;
        if ended {
            self.events.push(&record.id, views::invocation_state_event(record), true);
        }
        ended
    }

    pub async fn invocation(&self, org_id: &str, id: &str) -> ServiceResult<InvocationRecord> {
        self.store
            .invocation(org_id, id)
            .await?
            .ok_or_else(|| ServiceError::NotFound(format!("invocation {id} not found")))
    }

    /// Whether the invocation exists and has not finished (its API key works only then).
    pub async fn is_unfinished(&self, org_id: &str, id: &str) -> ServiceResult<bool> {
        Ok(self
            .store
            .invocation(org_id, id)
            .await?
            .is_some_and(|record| !InvocationStatus::parse(&record.status).is_final()))
    }

    /// `PATCH /invocations/{id}`: ends an invocation that has not finished, with the
    /// status (and output) given; its action is stopped and its browsers end.
    pub async fn set_invocation_status(
        &self, org_id: &str, id: &str, status: InvocationStatus, output: Option<String>,
    ) -> ServiceResult<InvocationRecord> {
        let mut record = self.invocation(org_id, id).await?;
        if InvocationStatus::parse(&record.status).is_final() {
            return Err(ServiceError::Conflict(format!(
                "invocation {id} has already finished ({})",
                record.status
            )));
        }
        if let Some(output) = &output
            && output.len() > MAX_OUTPUT_BYTES
        {
            return Err(ServiceError::invalid(format!(
                "output is at most {} MiB",
                MAX_OUTPUT_BYTES >> 20
            )));
        }
        let reason = (status == InvocationStatus::Failed)
            .then(|| "The invocation was marked failed".to_string());
        if !self.finish(&mut record, status, output, reason).await {
            return Err(ServiceError::Conflict(format!("invocation {id} has already finished")));
        }
        self.invocations.cancel(id, "its status was set");
        Ok(record)
    }

    /// The invocation's live browsers.
    pub async fn browsers_of(&self, org_id: &str, id: &str) -> ServiceResult<Vec<SessionRecord>> {
        self.invocation(org_id, id).await?;
        // An organization has at most a few hundred live browsers (its limits).
        let live = self.store.list_sessions(org_id, SessionFilter::Live, 10_000, 0).await?;
        Ok(live
            .into_iter()
            .filter(|session| session.vm_settings.invocation_id.as_deref() == Some(id))
            .collect())
    }

    /// Ends the invocation's browsers; answers how many.
    pub async fn end_browsers(&self, org_id: &str, id: &str, reason: &str) -> usize {
        match self.browsers_of(org_id, id).await {
            Ok(browsers) if !browsers.is_empty() => self.sessions.end_all(browsers, reason).await,
            Ok(_) => 0,
            Err(error) => {
                tracing::warn!(invocation_id = id, %error, "listing an invocation's browsers failed");
                0
            }
        }
    }

    /// A browser an action just created: if its invocation has ended meanwhile, the
    /// browser ends too, and the action is told so.
    pub async fn keep_only_while_running(
        &self, org_id: &str, invocation_id: &str, session: &SessionRecord,
    ) -> ServiceResult<()> {
        if self.is_unfinished(org_id, invocation_id).await? {
            return Ok(());
        }
        self.sessions.end(session, "its invocation ended").await?;
        Err(ServiceError::Conflict(format!("invocation {invocation_id} has ended")))
    }

    /// After a restart, invocations that were under way have lost their action.
    pub(super) async fn fail_unfinished_invocations(&self) -> anyhow::Result<()> {
        for mut record in self.store.unfinished_invocations().await? {
            self.finish(
                &mut record,
                InvocationStatus::Failed,
                None,
                Some("The service restarted while the invocation ran".into()),
            )
            .await;
        }
        Ok(())
    }
}

/// The status, output and reason from the loader's result file.
fn action_result(bytes: &[u8]) -> (InvocationStatus, Option<String>, String) {
    let Ok(result) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return (InvocationStatus::Failed, None, "The action's result could not be read".into());
    };
    if result["ok"] == true {
        let output = result["output"].as_str().unwrap_or("null").to_owned();
        if output.len() > MAX_OUTPUT_BYTES {
            return (
                InvocationStatus::Failed,
                None,
                format!("The action's output is larger than {} MiB", MAX_OUTPUT_BYTES >> 20),
            );
        }
        return (InvocationStatus::Succeeded, Some(output), String::new());
    }
    let error = result["error"].as_str().unwrap_or("unknown error");
    (
        InvocationStatus::Failed,
        Some(error.to_owned()),
        "The action raised an error: its traceback is in the output".into(),
    )
}
