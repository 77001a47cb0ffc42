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

pub mod events;
pub mod invocations;
pub mod runner;
pub mod source;
pub mod views;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::{ServiceError, ServiceResult};
use crate::ids;
use crate::managed_auth::vault::Vault;
use crate::sessions::Sessions;
use crate::store::{AppVersionRecord, DeploymentRecord, Store};
pub use invocations::{InvocationStatus, NewInvocation};
use runner::{AppRunner, Ended, Run, Stream};
use source::Language;

/// The one region apps report, as the SDK knows it.
pub const REGION: &str = "aws.us-east-1a";
/// Most builds one organization may run at once (each installs packages and runs the
/// app's code); 429 beyond.
const MAX_BUILDS_PER_ORGANIZATION: usize = 2;
/// How long a build may take, dependencies included.
const BUILD_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The Python loader and build script, written into each run's directory.
const PYTHON_BOOT: &str = include_str!("boot/boot.py");
const PYTHON_BUILD: &str = include_str!("boot/build-python.sh");
/// The Node.js loader, its module hooks (TypeScript) and build script.
const NODE_BOOT: &str = include_str!("boot/boot.mjs");
const NODE_HOOKS: &str = include_str!("boot/hooks.mjs");
const NODE_BUILD: &str = include_str!("boot/build-node.sh");
/// Fetches a git source.
const GIT_FETCH: &str = include_str!("boot/fetch-git.sh");
/// How long fetching a repository may take.
const GIT_FETCH_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// What runs an app's loader, and the files it needs in the run directory.
fn loader(language: Language) -> (&'static str, Vec<(&'static str, Vec<u8>)>) {
    match language {
        Language::Python => (
            "/app/.venv/bin/python",
            vec![("boot.py", PYTHON_BOOT.as_bytes().to_vec())],
        ),
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
    } else if carries_credentials(&source.url) {
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
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
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
        store: Arc<dyn Store>,
        vault: Arc<Vault>,
        sessions: Arc<Sessions>,
        runner: Option<AppRunner>,
        max_running_invocations: usize,
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
        self: &Arc<Self>,
        org_id: &str,
        new: NewDeployment,
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
        let started = crate::error::run_to_completion(async move {
            let id = id.clone();
            let outcome = this
                .clone()
                .start_build(runner, &org_id, new, &id, cancel)
                .await;
            if outcome.is_err()
                && let Ok(mut builds) = this.builds.lock()
            {
                builds.remove(&id);
            }
            outcome
        })
        .await?;
        Ok(started)
    }

    /// Unpacks an upload, records the deployment and starts its build.
    async fn start_build(
        self: Arc<Self>,
        runner: Arc<AppRunner>,
        org_id: &str,
        new: NewDeployment,
        id: &str,
        cancel: CancellationToken,
    ) -> ServiceResult<DeploymentRecord> {
        let now = Utc::now();
        let mut document = DeploymentDocument {
            entrypoint_rel_path: new.entrypoint_rel_path.clone(),
            version: new.version.clone(),
            env_var_names: new.env_vars.keys().cloned().collect(),
            force: new.force,
            ..Default::default()
        };
        let dir = Self::deployment_dir(&runner, id);
        match &new.source {
            NewSource::Upload { archive, checksum } => {
                document.source_type = "file".into();
                document.source_checksum = Some(checksum.clone());
                let (archive, dir) = (archive.clone(), dir.clone());
                let entrypoint = new.entrypoint_rel_path.clone();
                tokio::task::spawn_blocking(move || unpack_upload(&archive, &dir, &entrypoint))
                    .await
                    .map_err(ServiceError::internal)??;
            }
            NewSource::Git(source) => {
                document.source_type = "github".into();
                document.source_url = Some(source.url.clone());
                document.source_ref = Some(source.git_ref.clone());
                document.source_path = source.path.clone();
                runner::traversable_dir(&dir).map_err(ServiceError::internal)?;
                std::fs::create_dir(dir.join("app")).map_err(ServiceError::internal)?;
            }
        }
        let sealed = self.vault.seal(&new.env_vars, id);
        let record = DeploymentRecord {
            id: id.to_owned(),
            org_id: org_id.to_owned(),
            status: DeploymentStatus::Queued.as_str().into(),
            created_at: now,
            updated_at: now,
            document: serde_json::to_string(&document).unwrap_or_default(),
            sealed: sealed.ok(),
        };
        let inserted = match record.sealed {
            Some(_) => self
                .store
                .insert_deployment(&record)
                .await
                .map_err(Into::into),
            None => Err(ServiceError::internal(
                "sealing environment variables failed",
            )),
        };
        if let Err(error) = inserted {
            let _ = tokio::fs::remove_dir_all(&dir).await;
            return Err(error);
        }
        self.events
            .push(id, views::deployment_state_event(&record), false);
        let git = match new.source {
            NewSource::Git(source) => Some(source),
            NewSource::Upload { .. } => None,
        };
        tokio::spawn(
            self.clone()
                .build(runner, record.clone(), document, git, cancel),
        );
        Ok(record)
    }

    /// Builds a deployment to its end: `running` with its apps published, or `failed`
    /// with a reason (the installer's or loader's own words are in its events).
    async fn build(
        self: Arc<Self>,
        runner: Arc<AppRunner>,
        mut record: DeploymentRecord,
        mut document: DeploymentDocument,
        git: Option<GitSource>,
        cancel: CancellationToken,
    ) {
        let id = record.id.clone();
        self.set_deployment_status(&mut record, &document, DeploymentStatus::InProgress)
            .await;
        let outcome = self
            .build_steps(&runner, &record, &mut document, git, cancel)
            .await;
        let published = match outcome {
            Ok(()) => self.publish(&record, &document).await,
            Err(reason) => Err(reason),
        };
        if let Ok(mut builds) = self.builds.lock() {
            builds.remove(&id);
        }
        let status = match published {
            Ok(published) => {
                for (app, definition) in published.iter().zip(&document.apps) {
                    self.events.push(
                        &id,
                        views::app_version_summary_event(app, definition),
                        false,
                    );
                }
                DeploymentStatus::Running
            }
            Err(reason) => {
                document.status_reason = Some(reason);
                DeploymentStatus::Failed
            }
        };
        self.set_deployment_status(&mut record, &document, status)
            .await;
    }

    async fn set_deployment_status(
        &self,
        record: &mut DeploymentRecord,
        document: &DeploymentDocument,
        status: DeploymentStatus,
    ) {
        record.status = status.as_str().into();
        record.updated_at = Utc::now();
        record.document = serde_json::to_string(document).unwrap_or_default();
        match self.store.update_deployment(record).await {
            Ok(true) => {}
            // Deleted while it was built: what it may have published goes too, and
            // nothing more is told.
            Ok(false) => {
                let _ = self
                    .store
                    .delete_app_versions(&record.org_id, &record.id)
                    .await;
                self.events.forget(&record.id);
                return;
            }
            Err(error) => {
                tracing::error!(deployment_id = %record.id, %error, "recording a deployment's status failed");
            }
        }
        self.events.push(
            &record.id,
            views::deployment_state_event(record),
            status.is_final(),
        );
    }

    async fn build_steps(
        &self,
        runner: &AppRunner,
        record: &DeploymentRecord,
        document: &mut DeploymentDocument,
        git: Option<GitSource>,
        cancel: CancellationToken,
    ) -> Result<(), String> {
        let dir = Self::deployment_dir(runner, &record.id);
        let app_dir = dir.join("app");
        let owner = runner.vm_user().map(|user| (user.uid, user.gid));
        let cache = runner.apps_dir.join("cache").join(&record.org_id);
        runner::traversable_dir(&cache).map_err(|error| format!("internal error: {error}"))?;
        if let Some(owner) = owner {
            let tree = app_dir.clone();
            tokio::task::spawn_blocking(move || source::chown_tree(&tree, owner))
                .await
                .map_err(|error| error.to_string())
                .and_then(|chowned| chowned.map_err(|error| error.to_string()))
                .map_err(|error| format!("internal error: {error}"))?;
            std::os::unix::fs::lchown(&cache, Some(owner.0), Some(owner.1))
                .map_err(|error| format!("internal error: {error}"))?;
        }
        if let Some(source) = git {
            let (commit, checksum) = self
                .fetch_git(runner, record, &app_dir, &source, &cancel)
                .await?;
            document.source_checksum = Some(checksum);
            tracing::info!(deployment_id = %record.id, commit, "fetched a git source");
            if !is_plain_file(&app_dir, &document.entrypoint_rel_path) {
                return Err(format!(
                    "the repository has no file {} at {}",
                    document.entrypoint_rel_path, source.git_ref
                ));
            }
        }
        let language = Language::of(&document.entrypoint_rel_path)
            .ok_or("the entrypoint's language is not supported")?;
        let (_, mut files) = loader(language);
        let build = match language {
            Language::Python => PYTHON_BUILD,
            Language::Node => NODE_BUILD,
        };
        files.push(("build.sh", build.as_bytes().to_vec()));
        let script = "/run/app/build.sh";
        let mut env = base_env();
        env.push(("PIP_CACHE_DIR".into(), "/run/cache/pip".into()));
        env.push(("npm_config_cache".into(), "/run/cache/npm".into()));
        env.push(("npm_config_update_notifier".into(), "false".into()));
        // Apps commonly make their client when loaded; it needs a key to be made, not
        // one that works.
        env.push(("KERNEL_API_KEY".into(), "build-time-placeholder".into()));
        env.extend(package_manager_env());
        let outcome = self
            .run_logged(
                runner,
                &record.id,
                Run {
                    app_dir: &app_dir,
                    app_writable: true,
                    cache: Some(&cache),
                    program: (
                        "/bin/sh",
                        vec![script.into(), document.entrypoint_rel_path.clone().into()],
                    ),
                    env,
                    files,
                    timeout: BUILD_TIMEOUT,
                    cancel,
                    allowed_hosts: None,
                },
            )
            .await;
        match outcome.ended {
            Ended::Exited(0) => {}
            Ended::Exited(code) => {
                return Err(format!(
                    "the build failed (exit code {code}): its output is in the deployment's events"
                ));
            }
            Ended::TimedOut => {
                return Err(format!(
                    "the build took longer than {} minutes",
                    BUILD_TIMEOUT.as_secs() / 60
                ));
            }
            Ended::Cancelled => return Err("the deployment was deleted".into()),
            Ended::OutOfMemory => {
                return Err(format!(
                    "the build used more memory than its limit ({} MiB)",
                    runner::MEMORY_LIMIT_MIB
                ));
            }
            Ended::NotStarted(why) => {
                tracing::error!(deployment_id = %record.id, why, "an app build could not start");
                return Err("internal error: the build's sandbox could not start".into());
            }
        }
        let described: serde_json::Value = match outcome.result {
            Some(Ok(bytes)) => serde_json::from_slice(&bytes)
                .map_err(|_| "the loader's answer is not JSON".to_string())?,
            Some(Err(problem)) => return Err(problem),
            None => return Err("loading the entrypoint gave no answer".into()),
        };
        if described["ok"] != true {
            let error = described["error"].as_str().unwrap_or("unknown error");
            self.events.push(&record.id, views::log_event(error), false);
            return Err(format!(
                "loading {} failed: {}",
                document.entrypoint_rel_path,
                last_line(error)
            ));
        }
        let apps: Vec<AppDefinition> = serde_json::from_value(described["apps"].clone())
            .map_err(|_| "the loader's answer has no apps".to_string())?;
        if apps.is_empty() {
            return Err(format!(
                "{} defines no app: create one with the SDK's app framework (kernel.App(\"name\"))",
                document.entrypoint_rel_path
            ));
        }
        for app in &apps {
            if !is_label(&app.name) {
                return Err(format!(
                    "app name {:?}: 1 to 64 letters, digits, `.`, `_` or `-`",
                    app.name
                ));
            }
            if let Some(action) = app.actions.iter().find(|action| !is_label(action)) {
                return Err(format!(
                    "action name {action:?}: 1 to 64 letters, digits, `.`, `_` or `-`"
                ));
            }
        }
        document.apps = apps;
        Ok(())
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

    /// Fetches a git source into the (empty) app directory, in a sandbox whose only way
    /// out is the egress proxy; answers the commit and a checksum of its files.
    async fn fetch_git(
        &self,
        runner: &AppRunner,
        record: &DeploymentRecord,
        app_dir: &Path,
        source: &GitSource,
        cancel: &CancellationToken,
    ) -> Result<(String, String), String> {
        let mut env = base_env();
        env.extend(package_manager_env());
        env.push(("SOURCE_URL".into(), source.url.clone()));
        env.push(("SOURCE_REF".into(), source.git_ref.clone()));
        env.push((
            "SOURCE_PATH".into(),
            source.path.clone().unwrap_or_default(),
        ));
        env.push(("GIT_TERMINAL_PROMPT".into(), "0".into()));
        if let Some(token) = &source.token {
            // In git's configuration from the environment: never on a command line.
            let basic =
                base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{token}"));
            env.push(("GIT_CONFIG_COUNT".into(), "1".into()));
            env.push(("GIT_CONFIG_KEY_0".into(), "http.extraHeader".into()));
            env.push((
                "GIT_CONFIG_VALUE_0".into(),
                format!("Authorization: Basic {basic}"),
            ));
        }
        let outcome = self
            .run_logged(
                runner,
                &record.id,
                Run {
                    app_dir,
                    app_writable: true,
                    cache: None,
                    program: ("/bin/sh", vec!["/run/app/fetch.sh".into()]),
                    env,
                    files: vec![("fetch.sh", GIT_FETCH.as_bytes().to_vec())],
                    timeout: GIT_FETCH_TIMEOUT,
                    cancel: cancel.clone(),
                    allowed_hosts: None,
                },
            )
            .await;
        match (outcome.ended, outcome.result) {
            (Ended::Exited(0), Some(Ok(bytes))) => {
                let result: serde_json::Value =
                    serde_json::from_slice(&bytes).map_err(|_| "fetching gave no answer")?;
                let text = |name: &str| result[name].as_str().unwrap_or_default().to_owned();
                Ok((text("commit"), text("checksum")))
            }
            (Ended::Cancelled, _) => Err("the deployment was deleted".into()),
            (Ended::TimedOut, _) => Err(format!(
                "fetching the repository took longer than {} minutes",
                GIT_FETCH_TIMEOUT.as_secs() / 60
            )),
            _ => Err(format!(
                "fetching {} at {} failed: git's words are in the deployment's events",
                source.url, source.git_ref
            )),
        }
    }

    /// Publishes the deployment's apps at its version. Another deployment's app at the
    /// same version is replaced (and that deployment stopped) only with `force`.
    async fn publish(
        &self,
        record: &DeploymentRecord,
        document: &DeploymentDocument,
    ) -> Result<Vec<AppVersionRecord>, String> {
        let internal = |error: crate::store::StoreError| {
            tracing::error!(deployment_id = %record.id, %error, "publishing apps failed");
            "internal error while publishing the apps".to_string()
        };
        for app in &document.apps {
            let existing = self
                .store
                .app_version(&record.org_id, &app.name, &document.version)
                .await
                .map_err(internal)?;
            if let Some(existing) = existing {
                if !document.force {
                    return Err(format!(
                        "app {} version {} is already deployed ({}): deploy with force to replace it",
                        app.name, document.version, existing.deployment_id
                    ));
                }
                self.stop_deployment(&record.org_id, &existing.deployment_id)
                    .await;
            }
        }
        let now = Utc::now();
        let mut published = Vec::new();
        for app in &document.apps {
            let version = AppVersionRecord {
                id: ids::new_id("app"),
                org_id: record.org_id.clone(),
                app_name: app.name.clone(),
                version: document.version.clone(),
                deployment_id: record.id.clone(),
                actions: serde_json::to_string(&app.actions).unwrap_or_default(),
                created_at: now,
            };
            if let Err(error) = self.store.insert_app_version(&version).await {
                let _ = self
                    .store
                    .delete_app_versions(&record.org_id, &record.id)
                    .await;
                return match error {
                    crate::store::StoreError::Conflict(_) => Err(format!(
                        "app {} version {} was deployed by another deployment meanwhile",
                        app.name, document.version
                    )),
                    other => Err(internal(other)),
                };
            }
            published.push(version);
        }
        Ok(published)
    }

    /// Stops a running deployment that another replaced: its apps are unpublished and its
    /// running invocations end.
    async fn stop_deployment(&self, org_id: &str, deployment_id: &str) {
        let _ = self.store.delete_app_versions(org_id, deployment_id).await;
        self.invocations
            .cancel_of_deployment(deployment_id, "its deployment was replaced");
        if let Ok(Some(mut record)) = self.store.deployment(org_id, deployment_id).await {
            let document: DeploymentDocument =
                serde_json::from_str(&record.document).unwrap_or_default();
            record.status = DeploymentStatus::Stopped.as_str().into();
            record.updated_at = Utc::now();
            let mut document = document;
            document.status_reason =
                Some("replaced by a newer deployment of the same app version".into());
            record.document = serde_json::to_string(&document).unwrap_or_default();
            let _ = self.store.update_deployment(&record).await;
        }
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
        if let Some((_, cancel)) = self
            .builds
            .lock()
            .ok()
            .and_then(|mut builds| builds.remove(&record.id))
        {
            cancel.cancel();
        }
        self.invocations
            .cancel_of_deployment(&record.id, "its deployment was deleted");
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
            Some(sealed) => self
                .vault
                .open_sealed(sealed, &record.id)
                .map_err(ServiceError::Internal),
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
        for mut record in self
            .store
            .deployments_in(&["queued", "in_progress"])
            .await?
        {
            let mut document: DeploymentDocument =
                serde_json::from_str(&record.document).unwrap_or_default();
            document.status_reason =
                Some("the service restarted during the build: deploy again".into());
            self.set_deployment_status(&mut record, &document, DeploymentStatus::Failed)
                .await;
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

/// The operator's package manager settings (a private index, a CA bundle), passed to
/// builds as they are in this service's environment. App code runs in builds (a
/// `setup.py`, the entrypoint being loaded), so an index URL that carries credentials is
/// not passed (and the operator is told once).
fn package_manager_env() -> Vec<(String, String)> {
    const PASSED: &[&str] = &[
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "PIP_TRUSTED_HOST",
        "PIP_CERT",
        "PIP_DEFAULT_TIMEOUT",
        "NPM_CONFIG_REGISTRY",
        "npm_config_registry",
        "NPM_CONFIG_CAFILE",
        "npm_config_cafile",
        "NODE_EXTRA_CA_CERTS",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "GIT_SSL_CAINFO",
    ];
    static WARNED: std::sync::Once = std::sync::Once::new();
    PASSED
        .iter()
        .filter_map(|name| {
            let value = std::env::var(name).ok()?;
            if carries_credentials(&value) {
                WARNED.call_once(|| {
                    tracing::warn!(
                        variable = name,
                        "a package index URL with credentials is not passed to app builds \
                         (app code runs there): give the index's credentials another way"
                    );
                });
                return None;
            }
            Some((name.to_string(), value))
        })
        .collect()
}

/// Whether a setting holds a URL with a user name or password in it.
fn carries_credentials(value: &str) -> bool {
    value.split_whitespace().any(|part| {
        url::Url::parse(part)
            .is_ok_and(|url| !url.username().is_empty() || url.password().is_some())
    })
}

/// Unpacks an uploaded archive into `<dir>/app` (the archive is removed); the
/// deployment's directory is removed again when the archive is refused.
fn unpack_upload(archive: &Path, dir: &Path, entrypoint: &str) -> ServiceResult<()> {
    let app = dir.join("app");
    runner::traversable_dir(dir).map_err(ServiceError::internal)?;
    std::fs::create_dir(&app).map_err(ServiceError::internal)?;
    let unpacked = std::fs::File::open(archive)
        .map_err(|error| error.to_string())
        .and_then(|file| source::unpack_zip(std::io::BufReader::new(file), &app));
    let _ = std::fs::remove_file(archive);
    let problem = match unpacked {
        Err(problem) => Some(format!("file: {problem}")),
        Ok(()) if !is_plain_file(&app, entrypoint) => Some(format!(
            "entrypoint_rel_path: the archive has no file {entrypoint}"
        )),
        Ok(()) => None,
    };
    match problem {
        Some(problem) => {
            let _ = std::fs::remove_dir_all(dir);
            Err(ServiceError::invalid(problem))
        }
        None => Ok(()),
    }
}

/// `relative` in `base` is a regular file reached through no link (this process is not
/// sandboxed: it must not follow what an app's files point at).
fn is_plain_file(base: &Path, relative: &str) -> bool {
    let mut path = base.to_owned();
    let components: Vec<_> = Path::new(relative).components().collect();
    for (index, component) in components.iter().enumerate() {
        path.push(component);
        let Ok(metadata) = std::fs::symlink_metadata(&path) else {
            return false;
        };
        let last = index + 1 == components.len();
        if metadata.file_type().is_symlink() || (last && !metadata.is_file()) {
            return false;
        }
    }
    !components.is_empty()
}

/// The last non-empty line of a traceback: the exception itself.
fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .unwrap_or(text)
        .trim()
}
