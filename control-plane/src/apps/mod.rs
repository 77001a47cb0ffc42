//! Apps as code: users deploy a small Python or TypeScript program that defines named
//! actions with the official SDK's app framework, then invoke those actions by name.
//!
//! - A deployment's source (an uploaded ZIP, or a git repository) is built in an app
//!   sandbox (`runner`): its dependencies are installed from its manifest, then the
//!   service's loader (`boot/`) imports the entrypoint and records the apps and actions
//!   it defines. A successful build publishes one app version per app.
//! - An invocation runs one action in a sandbox of its own, over the deployment's files
//!   (read-only), with its environment variables and a short-lived API key scoped to the
//!   organization and the invocation; browsers the action creates end with it.
//!
//! Builds and actions never run on the host itself: without the VM sandbox, deployments
//! are refused.

mod build;
pub mod events;
pub mod invocations;
pub mod runner;
pub mod source;
pub mod views;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::{ServiceError, ServiceResult};
use crate::ids;
use crate::managed_auth::vault::Vault;
use crate::sessions::Sessions;
use crate::store::{DeploymentRecord, Store};
pub use invocations::{InvocationStatus, NewInvocation};
use runner::{AppRunner, Run, Stream};
use source::Language;

/// The one region apps report, as the SDK knows it.
pub const REGION: &str = "aws.us-east-1a";
/// Most builds one organization may run at once (each installs packages and runs the
/// app's code); 429 beyond.
const MAX_BUILDS_PER_ORGANIZATION: usize = 2;
/// The Python loader and build script, written into each run's directory.
const PYTHON_BOOT: &str = include_str!("boot/boot.py");
/// The Node.js loader, its module hooks (TypeScript) and build script.
const NODE_BOOT: &str = include_str!("boot/boot.mjs");
const NODE_HOOKS: &str = include_str!("boot/hooks.mjs");

/// What runs an app's loader, and the files it needs in the run directory.
fn loader(language: Language) -> (&'static str, Vec<(&'static str, Vec<u8>)>) {
    match language {
        Language::Python => {
            ("/app/.venv/bin/python", vec![("boot.py", PYTHON_BOOT.as_bytes().to_vec())])
        }
        Language::Node => (
            "node",
            vec![
                ("boot.mjs", NODE_BOOT.as_bytes().to_vec()),
                ("hooks.mjs", NODE_HOOKS.as_bytes().to_vec()),
            ],
        ),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeploymentStatus {
    Queued,
    InProgress,
    Running,
    Failed,
    Stopped,
}

impl DeploymentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::InProgress => "in_progress",
            Self::Running => "running",
            Self::Failed => "failed",
            Self::Stopped => "stopped",
        }
    }

    pub fn parse(text: &str) -> Self {
        match text {
            "queued" => Self::Queued,
            "in_progress" => Self::InProgress,
            "running" => Self::Running,
            "stopped" => Self::Stopped,
            _ => Self::Failed,
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, Self::Running | Self::Failed | Self::Stopped)
    }
}

/// A deployment's public settings (the store's `document`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentDocument {
    pub entrypoint_rel_path: String,
    pub version: String,
    /// The names of its environment variables; the values are sealed.
    pub env_var_names: Vec<String>,
    pub force: bool,
    pub source_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ref: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_checksum: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    /// What the build found: apps and their actions.
    #[serde(default)]
    pub apps: Vec<AppDefinition>,
}

impl DeploymentDocument {
    /// The document of a stored deployment (the default if it cannot be read).
    pub fn of(record: &DeploymentRecord) -> Self {
        serde_json::from_str(&record.document).unwrap_or_default()
    }
}

/// An invocation's payload, output and status reason (the store's `document`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct InvocationDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    /// When the invocation must end (its time limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<chrono::DateTime<chrono::Utc>>,
}

impl InvocationDocument {
    /// The document of a stored invocation (the default if it cannot be read).
    pub fn of(record: &crate::store::InvocationRecord) -> Self {
        serde_json::from_str(&record.document).unwrap_or_default()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppDefinition {
    pub name: String,
    pub actions: Vec<String>,
}

/// Where a new deployment's code comes from.
pub enum NewSource {
    /// An uploaded ZIP, already on disk, with its SHA-256.
    Upload {
        archive: PathBuf,
        checksum: String,
    },
    Git(GitSource),
}

/// A git repository's ref (branch, tag or commit), and the folder of it to deploy.
pub struct GitSource {
    pub url: String,
    pub git_ref: String,
    pub path: Option<String>,
    /// Sent as a GitHub token; used for the fetch only, never kept.
    pub token: Option<String>,
}

pub struct NewDeployment {
    pub source: NewSource,
    pub entrypoint_rel_path: String,
    pub version: String,
    pub env_vars: BTreeMap<String, String>,
    pub force: bool,
}

/// Environment variable names the service sets itself.
const RESERVED_ENV_VARS: &[&str] = &[
    "KERNEL_API_KEY",
    "KERNEL_BASE_URL",
    "KERNEL_INVOCATION_ID",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "PATH",
    "HOME",
];
const MAX_ENV_VARS: usize = 100;
const MAX_ENV_VALUE_BYTES: usize = 32 * 1024;

/// Checks a deployment's version and environment variables; one message per problem.
pub fn check_settings(version: &str, env_vars: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    if !is_label(version) {
        problems.push(format!(
            "version must be 1 to 64 letters, digits, `.`, `_` or `-`, got {version:?}"
        ));
    }
    if env_vars.len() > MAX_ENV_VARS {
        problems.push(format!("env_vars holds at most {MAX_ENV_VARS} variables"));
    }
    for (name, value) in env_vars {
        let valid_name = !name.is_empty()
            && name.len() <= 128
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            problems.push(format!(
                "env_vars: {name:?} is not a variable name (letters, digits and `_`, not starting with a digit)"
            ));
        } else if RESERVED_ENV_VARS.contains(&name.to_ascii_uppercase().as_str()) {
            problems.push(format!("env_vars: {name} is set by the service"));
        }
        if value.len() > MAX_ENV_VALUE_BYTES || value.contains('\0') {
            problems.push(format!(
                "env_vars.{name}: at most {} KiB, without NUL characters",
                MAX_ENV_VALUE_BYTES / 1024
            ));
        }
    }
    problems
}

/// Checks a git source: its URL, ref and folder reach git as they are.
fn check_git_source(source: &GitSource) -> Vec<String> {
    let mut problems = Vec::new();
    let url_ok = (source.url.starts_with("https://") || source.url.starts_with("http://"))
        && source.url.len() <= 2048
        && url::Url::parse(&source.url).is_ok()
        && !source.url.chars().any(char::is_whitespace);
    if !url_ok {
        problems.push("source.url must be an http(s) URL of a git repository".to_owned());
    } else if build::carries_credentials(&source.url) {
        // It would be kept and shown with the deployment.
        problems.push(
            "source.url must not carry credentials: give a token as source.auth.token".to_owned(),
        );
    }
    let ref_ok = !source.git_ref.is_empty()
        && source.git_ref.len() <= 255
        && !source.git_ref.starts_with('-')
        && !source.git_ref.contains("..")
        && source
            .git_ref
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'));
    if !ref_ok {
        problems.push(format!(
            "source.ref must be a branch, tag or commit name, got {:?}",
            source.git_ref
        ));
    }
    if let Some(path) = &source.path
        && let Err(problem) = source::check_relative_path("source.path", path)
    {
        problems.push(problem);
    }
    problems
}

/// App names, versions and action names: 1 to 64 of `[A-Za-z0-9._-]`.
pub fn is_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 64
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The service.
pub struct Apps {
    store: Arc<dyn Store>,
    vault: Arc<Vault>,
    sessions: Arc<Sessions>,
    runner: Option<Arc<AppRunner>>,
    pub events: events::EventLogs,
    /// Builds under way, by deployment id: their organization, and what stops them.
    builds: Mutex<HashMap<String, (String, CancellationToken)>>,
    invocations: invocations::Running,
}

impl Apps {
    pub fn new(
        store: Arc<dyn Store>, vault: Arc<Vault>, sessions: Arc<Sessions>,
        runner: Option<AppRunner>, max_running_invocations: usize,
    ) -> Self {
        Self {
            store,
            vault,
            sessions,
            runner: runner.map(Arc::new),
            events: events::EventLogs::default(),
            builds: Mutex::default(),
            invocations: invocations::Running::new(max_running_invocations),
        }
    }

    fn runner(&self) -> ServiceResult<&Arc<AppRunner>> {
        self.runner.as_ref().ok_or_else(|| {
            ServiceError::Unavailable(
                "apps run only in the VM sandbox, and this server runs without it \
                 (--isolation none)"
                    .into(),
            )
        })
    }

    /// Where uploads wait for their deployment, and where deployments live.
    pub fn upload_dir(&self) -> ServiceResult<PathBuf> {
        Ok(self.runner()?.apps_dir.join("uploads"))
    }

    fn deployment_dir(runner: &AppRunner, id: &str) -> PathBuf {
        runner.apps_dir.join("deployments").join(id)
    }

    /// Records a deployment and starts its build; answers it `queued`.
    pub async fn deploy(
        self: &Arc<Self>, org_id: &str, new: NewDeployment,
    ) -> ServiceResult<DeploymentRecord> {
        let runner = self.runner()?.clone();
        let mut problems = check_settings(&new.version, &new.env_vars);
        if let Err(problem) =
            source::check_relative_path("entrypoint_rel_path", &new.entrypoint_rel_path)
        {
            problems.push(problem);
        } else if Language::of(&new.entrypoint_rel_path).is_none() {
            problems.push(format!(
                "entrypoint_rel_path must name a Python (.py) or JavaScript/TypeScript \
                 (.js, .mjs, .cjs, .ts, .mts) file, got {:?}",
                new.entrypoint_rel_path
            ));
        }
        if let NewSource::Git(source) = &new.source {
            problems.extend(check_git_source(source));
        }
        if !problems.is_empty() {
            return Err(ServiceError::Invalid(problems));
        }
        let id = ids::new_id("dep");
        // The organization's build slot is taken before anything is written, and given
        // back on every way out but a started build.
        let cancel = CancellationToken::new();
        {
            let mut builds = self
                .builds
                .lock()
                .map_err(|_| ServiceError::internal("build registry poisoned"))?;
            let running = builds.values().filter(|(org, _)| org == org_id).count();
            if running >= MAX_BUILDS_PER_ORGANIZATION {
                return Err(ServiceError::LimitReached {
                    message: format!(
                        "this organization already builds {running} deployments, its most at once"
                    ),
                    retry_after: Duration::from_secs(10),
                });
            }
            builds.insert(id.clone(), (org_id.to_owned(), cancel.clone()));
        }
        // In a task of its own: a caller that goes away leaves nothing half-made.
        let this = self.clone();
        let org_id = org_id.to_owned();
        crate::error::run_to_completion(async move {
            let outcome = this.clone().start_build(runner, &org_id, new, &id, cancel).await;
            if outcome.is_err()
                && let Ok(mut builds) = this.builds.lock()
            {
                builds.remove(&id);
            }
            outcome
        })
        .await
    }

    /// Runs `run`, passing its output to the log of `log_id`.
    async fn run_logged(&self, runner: &AppRunner, log_id: &str, run: Run<'_>) -> runner::Outcome {
        let (lines, mut received) = mpsc::channel::<(Stream, String)>(256);
        let events = &self.events;
        let forward = async {
            while let Some((_, line)) = received.recv().await {
                events.push(log_id, views::log_event(&line), false);
            }
        };
        let (outcome, ()) = tokio::join!(runner.run(run, lines), forward);
        outcome
    }

    pub async fn deployment(&self, org_id: &str, id: &str) -> ServiceResult<DeploymentRecord> {
        self.store
            .deployment(org_id, id)
            .await?
            .ok_or_else(|| ServiceError::NotFound(format!("deployment {id} not found")))
    }

    /// Deletes a deployment: its build stops, its running invocations end (failed), its
    /// apps are unpublished and its files removed.
    pub async fn delete_deployment(&self, org_id: &str, id: &str) -> ServiceResult<()> {
        let record = self.deployment(org_id, id).await?;
        if let Some((_, cancel)) =
            self.builds.lock().ok().and_then(|mut builds| builds.remove(&record.id))
        {
            cancel.cancel();
        }
        self.invocations.cancel_of_deployment(&record.id, "its deployment was deleted");
        self.store.delete_deployment(org_id, &record.id).await?;
        self.events.forget(&record.id);
        if let Some(runner) = &self.runner {
            let dir = Self::deployment_dir(runner, &record.id);
            // Files of a build that is still stopping are removed once it has.
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let _ = tokio::fs::remove_dir_all(dir).await;
            });
        }
        Ok(())
    }

    /// A deployment's environment variables, values included (for its actions only).
    fn env_vars(&self, record: &DeploymentRecord) -> ServiceResult<BTreeMap<String, String>> {
        match &record.sealed {
            Some(sealed) => {
                self.vault.open_sealed(sealed, &record.id).map_err(ServiceError::Internal)
            }
            None => Ok(BTreeMap::new()),
        }
    }

    /// After a restart: builds and invocations that were under way have lost their
    /// process; they fail with a reason.
    pub async fn resume(&self) -> anyhow::Result<()> {
        // Runs and uploads of the previous process: their sandboxes died with it.
        if let Some(runner) = &self.runner {
            for leftover in ["runs", "uploads"] {
                let _ = tokio::fs::remove_dir_all(runner.apps_dir.join(leftover)).await;
            }
        }
        for mut record in self.store.deployments_in(&["queued", "in_progress"]).await? {
            let mut document = DeploymentDocument::of(&record);
            document.status_reason =
                Some("the service restarted during the build: deploy again".into());
            self.set_deployment_status(&mut record, &document, DeploymentStatus::Failed).await;
        }
        self.fail_unfinished_invocations().await
    }
}

/// The environment every app process starts with.
fn base_env() -> Vec<(String, String)> {
    vec![
        (
            "PATH".into(),
            "/app/.venv/bin:/app/node_modules/.bin:/usr/local/bin:/usr/bin:/bin".into(),
        ),
        ("HOME".into(), "/tmp/home".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("PYTHONUNBUFFERED".into(), "1".into()),
    ]
}
